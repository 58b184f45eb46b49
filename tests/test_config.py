"""The nested configuration schema (gradjax.run.config) and the packaged configuration files."""

import dataclasses
import importlib.util
import re

import pytest

from gradjax import configs
from gradjax.run import config


def test_every_option_has_one_place_in_the_schema():
  """Each option is one field of one section (or the top-level seed), named by one dotted path; the
  short flags name options of the schema, one each."""
  paths = config.paths()
  sections = [f.name for f in dataclasses.fields(config.Config) if f.name != "seed"]
  assert [p for p in paths if "." not in p] == ["seed"]
  assert sorted({p.partition(".")[0] for p in paths if "." in p}) == sorted(sections)
  assert len(paths) == sum(
      len(dataclasses.fields(getattr(config.Config(), s))) for s in sections) + 1
  assert sorted(config.ALIASES.values()) == sorted({*config.ALIASES.values()} & {*paths})
  assert config.alias("attack.preset") == "attack" and config.alias("attack.learning_rate") is None
  assert config.flag("attack.iterations") == "--iterations"
  assert config.flag("client.local_lr") == "--config.client.local_lr"
  cfg = config.from_options({"attack.iterations": 7, "client.local_lr": 0.5, "seed": 2})
  assert (cfg.attack.iterations, cfg.client.local_lr, cfg.seed) == (7, 0.5, 2)
  assert config.get(cfg, "client.local_lr") == 0.5 and config.options(cfg)["attack.iterations"] == 7
  assert config.replace(cfg, {"data.index": 3}).data.index == 3 and cfg.data.index == 0
  with pytest.raises(ValueError, match="must be positive"):
    config.replace(cfg, {"client.local_lr": -1.0})


def test_a_results_record_reads_back_nested_or_flat():
  """A run records its options nested (config.record); config.recorded reads that, and the flat
  record of results written before the schema was nested (short names as keys)."""
  cfg = config.from_options({"attack.preset": "idlg", "model.name": "convnet-8", "training.lr": 0.3,
                             "attack.learning_rate": 0.1, "data.index": 4})
  rec = config.record(cfg)
  assert rec["attack"]["preset"] == "idlg" and rec["model"]["name"] == "convnet-8"
  assert config.recorded(rec) == config.options(cfg)
  flat = {"attack": "idlg", "model": "convnet-8", "train_lr": 0.3, "learning_rate": 0.1, "index": 4,
          "gone": 1}
  assert config.recorded(flat) == {"attack.preset": "idlg", "model.name": "convnet-8",
                                   "training.lr": 0.3, "attack.learning_rate": 0.1,
                                   "data.index": 4}


def test_options_renamed_since_a_run_read_under_their_new_names(tmp_path):
  """A run folder's config.py, a results record (nested or flat) and a sweep written before
  attack.labels became attack.label_source, attack.layer_weights attack.depth_rule and
  attack.objective attack.matched read back as the same configuration under the new names."""
  old = tmp_path / "config.py"
  old.write_text("from gradjax.run import config\n\n\ndef get_config():\n  c = config.defaults()\n"
                 "  c.attack.labels = 'known'\n  c.attack.layer_weights = 'linear'\n"
                 "  c.attack.objective = 'dlm'\n  return c\n")
  spec = importlib.util.spec_from_file_location("old_run_config", old)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = config.from_dict(module.get_config())
  assert (cfg.attack.label_source, cfg.attack.depth_rule, cfg.attack.matched) == ("known", "linear", "dlm")
  assert config.given(module.get_config())["attack.matched"] == "dlm"
  assert config.recorded({"attack": {"labels": "idlg", "layer_weights": "exp"}}) == {
      "attack.label_source": "idlg", "attack.depth_rule": "exp"}
  assert config.recorded({"labels": "llg", "layer_weights": "inverse"}) == {
      "attack.label_source": "llg", "attack.depth_rule": "inverse"}
  assert config.recorded({"attack.labels": "joint"}) == {"attack.label_source": "joint"}
  with pytest.raises(ValueError, match="unknown configuration option attack.label"):
    config.from_dict({"attack": {"label": "known"}})


def test_defaults_build_the_default_config():
  assert config.from_dict(config.defaults()) == config.Config()
  assert config.from_dict({}) == config.Config()  # options left out keep their defaults


def test_a_written_config_reads_back_as_the_same_config():
  cfg = config.from_options({
      "attack.preset": "inverting_gradients", "model.name": "resnet20-4", "attack.iterations": 7,
      "data.image_size": 16, "attack.learning_rate": 0.25, "attack.box": True,
      "attack.priors": "tv:1e-4", "execution.halving_keep": 0.3,
      "data.normalization": "0.5,0.5,0.5/0.25,0.25,0.25", "seed": 3, "data.index": 2})
  namespace = {}
  exec(config.to_python(cfg, comment="a comment\nover two lines"), namespace)
  assert config.from_dict(namespace["get_config"]()) == cfg


def test_an_unknown_option_is_named():
  with pytest.raises(ValueError, match=r"attack\.iterationz"):
    config.from_dict({"attack": {"iterationz": 3}})
  with pytest.raises(ValueError, match=r"optimiser\.lr"):
    config.from_dict({"optimiser": {"lr": 3}})


def test_options_set_in_the_library_are_checked_for_their_types_and_text_takes_its_defaults():
  """from_options / replace refuse a value of another type than the option's (a count given as
  text, a bool or a fraction), as a configuration file's are; a text experiment without a model or
  a corpus reads the command line's text defaults (before: "reads a corpus, not 'skimage'")."""
  for path, value in (("attack.iterations", "five"), ("attack.iterations", True),
                      ("attack.iterations", 2.5), ("seed", "abc"), ("data.batch_size", None)):
    with pytest.raises(ValueError, match=re.escape(path)):
      config.from_options({path: value})
  text = config.from_options({"data.modality": "text"})
  assert (text.model.name, text.data.dataset) == ("transformer", "pydoc")
  assert text.training.train_count is None and text.training.test_count is None
  assert config.from_options({"data.modality": "text", "model.name": "gpt"}).model.name == "gpt"


def test_placeholders_take_a_value_of_their_type():
  c = config.defaults()
  c.data.image_size = 32
  c.attack.learning_rate = 0.5
  cfg = config.from_dict(c)
  assert (cfg.data.image_size, cfg.attack.learning_rate) == (32, 0.5)
  with pytest.raises(TypeError):
    c.data.image_size = "big"


@pytest.mark.parametrize("name", configs.NAMES)
def test_each_packaged_config_is_a_valid_experiment(name):
  spec = importlib.util.spec_from_file_location(name, configs.path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = config.from_dict(module.get_config())
  # a protocol of its preset (or of a program that runs no attack, or every default)
  assert name.startswith(
      cfg.attack.preset) or name in ("batch_labels", "batch_table", "train", "defaults")
  if name == "defaults":
    assert cfg == config.Config()
  config.check(cfg)  # names resolve: preset, model, dataset
  assert module.__doc__  # says where its settings come from


@pytest.mark.parametrize("sweep", [
    [{"data.index": i} for i in range(0, 100)],            # written as config.sweep(..., range(0, 100))
    [{"data.index": i} for i in (0, 2, 4, 6, 8)],          # range(0, 9, 2)
    [{"data.index": i} for i in (0, 1, 5)],                # uneven: one item per line
    [{"data.index": i, "attack.restarts": 1} for i in (0, 1, 2)],
    [{"defense.spec": d} for d in (None, "prune:0.2")]])
def test_a_written_sweep_reads_back_as_the_same_items(sweep):
  import types
  module = types.ModuleType("written")
  exec(config.to_python(config.Config(), sweep=sweep), module.__dict__)
  assert module.get_sweep() == sweep


def test_a_recipe_is_its_options_over_the_defaults():
  """config.overridden: the defaults with dotted options set (what a study's config.py returns);
  an option the schema lacks is refused by name."""
  c = config.overridden({"attack.preset": "sapag", "data.image_size": 32, "model.num_classes": 100})
  cfg = config.from_dict(c)
  assert (cfg.attack.preset, cfg.data.image_size, cfg.model.num_classes) == ("sapag", 32, 100)
  assert cfg.attack.iterations == config.Config().attack.iterations
  assert cfg.data.dataset == config.Config().data.dataset
  with pytest.raises(ValueError, match="'attack.nope'"):
    config.overridden({"attack.nope": 1})
  get_config, get_sweep = config.recipes({"attack.preset": "idlg"}, {
      "a": ("sweep", range(2, 4), {"attack.iterations": 7}), "b": ("reconstruct", None, {})})
  assert (config.from_dict(get_config("a")).attack.preset,
          config.from_dict(get_config("a")).attack.iterations) == ("idlg", 7)
  assert get_sweep("a") == [{"data.index": 2}, {"data.index": 3}] and get_sweep("b") is None
  with pytest.raises(ValueError, match="variant 'c'; choose one of a, b"):
    get_sweep("c")


def test_the_gate_section_reads_its_rounds_and_refuses_what_it_does_not_read():
  """The Flower gate's rounds: a list, every K-th, all, none; a malformed spec and an option of
  another section are refused when the sections are built."""
  rounds = range(1, 10)
  built = lambda spec: config.sections({"gate.rounds": spec}, ("gate",))["gate"]
  assert [r for r in rounds if built("every:3").audits(r)] == [3, 6, 9]
  assert [r for r in rounds if built("2, 5").audits(r)] == [2, 5]
  assert [r for r in rounds if built(None).audits(r)] == list(rounds)
  assert [r for r in rounds if built("").audits(r)] == []
  for bad in ("every:0", "every:x", "two"):
    with pytest.raises(ValueError, match="gate.rounds"):
      built(bad)
  with pytest.raises(ValueError, match="time_budget_s"):
    config.sections({"gate.time_budget_s": 0.0}, ("gate",))
  with pytest.raises(ValueError, match="training.epochs is not an option here"):
    config.sections({"training.epochs": 3}, ("gate", "attack"))
  assert config.sections({"attack.restarts": 4}, ("attack",))["attack"].restarts == 4
  for path, value in (("gate.threshold_db", "ten"), ("attack.iterations", "10"), ("attack.restarts", 2.5)):
    with pytest.raises(ValueError, match=rf"{path} takes"):  # a value of another type, not read as one
      config.sections({path: value}, ("gate", "attack"))


def test_iterate_last_counts_only_the_final_iterate():
  """--config.attack.iterate=last: track_from is the budget, whatever sets it; 'best' tracks all."""
  for options, want in (({"attack.iterate": "last", "attack.iterations": 40}, 40),
                        ({"attack.iterate": "last", "attack.preset": "dlg"}, 2000),
                        ({"attack.iterate": "best", "attack.iterations": 40}, 0)):
    assert config.get_attack(config.from_options(options)).track_from == want
  with pytest.raises(ValueError, match="iterate"):
    config.get_attack(config.from_options({"attack.iterate": "worst"}))


def test_sweep_items_are_checked_for_their_options_types():
  import numpy as np
  cfg = config.from_options({})
  assert type(config.with_options(cfg, {"data.index": np.int64(3)}).data.index) is int
  assert config.with_options(cfg, {"attack.learning_rate": 1}).attack.learning_rate == 1
  for item, message in (({"data.index": 1.5}, "data.index takes int, got 1.5"),
                        ({"data.index": True}, "data.index takes int, got True"),
                        ({"attack.box": 1}, "attack.box takes bool or None, got 1"),
                        ({"data.dataset": 3}, "data.dataset takes str"),
                        ({}, "an empty sweep item")):
    with pytest.raises(ValueError, match=re.escape(message)):
      config.with_options(cfg, item)


def test_the_fingerprint_reads_a_presets_own_count_as_unset():
  """``--iterations`` given as the preset's own count (the preset built at it is the preset) is
  fingerprinted as unset, so a run saved either way continues the other way; another count, or a
  count given to ``auto`` (whose ``--budget`` keeps a count given and times one unset), is not."""
  from gradjax import presets
  plain = config.from_options({"attack.preset": "inverting_gradients"})
  own = presets.get_preset("inverting_gradients")().iterations
  assert presets.get_preset("inverting_gradients")(iterations=own) == presets.get_preset("inverting_gradients")()
  spelt = config.replace(plain, {"attack.iterations": own})
  assert config.fingerprint(spelt) == config.fingerprint(plain)
  assert config.fingerprint(spelt)["attack.iterations"] is None
  assert config.fingerprint(config.replace(plain, {"attack.iterations": own - 1}))["attack.iterations"] == own - 1
  budget = config.replace(spelt, {"attack.preset": "auto", "attack.budget": 60.0})
  assert config.fingerprint(budget)["attack.iterations"] == own
  saved = {**config.fingerprint(plain), "attack.iterations": own}  # as an earlier gradjax saved it
  assert config.canonical(saved) == config.fingerprint(plain)


def test_a_permutation_search_of_joint_labels_is_refused_from_the_flags():
  """--config.attack.permutations with an attack that optimises its labels jointly: refused by the
  configuration's check (before a folder is claimed or data loaded), naming the label source."""
  with pytest.raises(ValueError, match="optimises them jointly"):
    config.check(config.from_options({"attack.permutations": 4}), files=False)
  config.check(config.from_options({"attack.permutations": 4, "attack.label_source": "known"}),
               files=False)


def test_a_permutation_search_of_labels_shared_in_order_is_refused():
  """A FedAvg client that shares its labels in order says which step each was in: nothing to search
  (the search once kept a wrong order at exit 0); shared as a multiset, the search runs."""
  fedavg = {"client.name": "fedavg", "client.local_batch_size": 2, "data.batch_size": 4,
            "attack.preset": "inverting_gradients_fedavg", "attack.permutations": 6}
  with pytest.raises(ValueError, match="shares its labels in order"):
    config.check(config.from_options(fedavg), files=False)
  config.check(config.from_options({**fedavg, "client.shared_labels": "multiset"}), files=False)


def test_a_replay_of_a_fedsgd_client_is_refused_from_the_flags():
  """The replay objective needs the client's local training: against a FedSGD client it is refused
  by the configuration's check, before anything compiles, naming --client=fedavg."""
  for options in ({"attack.preset": "inverting_gradients_fedavg"}, {"attack.matched": "replay"}):
    with pytest.raises(ValueError, match="--client=fedavg"):
      config.check(config.from_options(options), files=False)
  config.check(config.from_options({"attack.preset": "inverting_gradients_fedavg",
                                    "client.name": "fedavg"}), files=False)


def test_dp_sgd_in_training_mode_is_refused_only_with_batchnorm():
  """A DP-SGD client in training mode: refused for a model with BatchNorm (its batch statistics mix
  the examples), accepted for one without (training mode changes nothing there)."""
  options = {"client.train_mode": True, "defense.dp_sgd_max_norm": 1.0}
  config.check(config.from_options({**options, "model.name": "mlp-64"}))
  for name in ("convnet-4", "resnet20-4"):
    with pytest.raises(ValueError, match="training mode"):
      config.check(config.from_options({**options, "model.name": name}))
