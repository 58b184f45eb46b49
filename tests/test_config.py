"""The nested configuration schema (gradjax.run.config) and the packaged configuration files."""

import dataclasses
import importlib.util

import pytest

from gradjax import configs
from gradjax.run import config


def test_every_option_has_one_place_in_the_schema():
  names = [f.name for f in dataclasses.fields(config.Config)]
  placed = [*config.TOP, *(n for section in config.SECTIONS.values() for n in section)]
  assert sorted(placed) == sorted(names)  # each field once, none left out
  paths = config.paths()
  assert len(set(paths.values())) == len(paths)  # one option, one path
  assert paths["attack"] == "attack.preset" and paths["iterations"] == "attack.iterations"


def test_defaults_build_the_default_config():
  assert config.from_dict(config.defaults()) == config.Config()
  assert config.from_dict({}) == config.Config()  # options left out keep their defaults


def test_a_written_config_reads_back_as_the_same_config():
  cfg = config.Config(attack="inverting_gradients", model="resnet20-4", iterations=7, image_size=16,
                      learning_rate=0.25, box=True, priors="tv:1e-4", halving_keep=0.3,
                      normalization="0.5,0.5,0.5/0.25,0.25,0.25", seed=3, index=2)
  namespace = {}
  exec(config.to_python(cfg, comment="a comment\nover two lines"), namespace)
  assert config.from_dict(namespace["get_config"]()) == cfg


def test_an_unknown_option_is_named():
  with pytest.raises(ValueError, match=r"attack\.iterationz"):
    config.from_dict({"attack": {"iterationz": 3}})
  with pytest.raises(ValueError, match=r"optimiser\.lr"):
    config.from_dict({"optimiser": {"lr": 3}})


def test_placeholders_take_a_value_of_their_type():
  c = config.defaults()
  c.data.image_size = 32
  c.attack.learning_rate = 0.5
  cfg = config.from_dict(c)
  assert (cfg.image_size, cfg.learning_rate) == (32, 0.5)
  with pytest.raises(TypeError):
    c.data.image_size = "big"


@pytest.mark.parametrize("name", configs.NAMES)
def test_each_packaged_config_is_a_valid_experiment(name):
  spec = importlib.util.spec_from_file_location(name, configs.path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = config.from_dict(module.get_config())
  # a protocol of its preset (or of a program that runs no attack, or every default)
  assert name.startswith(cfg.attack) or name in ("batch_labels", "batch_table", "train", "defaults")
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
  assert (cfg.attack, cfg.image_size, cfg.num_classes) == ("sapag", 32, 100)
  assert cfg.iterations == config.Config().iterations and cfg.dataset == config.Config().dataset
  with pytest.raises(ValueError, match="'attack.nope'"):
    config.overridden({"attack.nope": 1})
  get_config, get_sweep = config.recipes({"attack.preset": "idlg"}, {
      "a": ("sweep", range(2, 4), {"attack.iterations": 7}), "b": ("reconstruct", None, {})})
  assert (config.from_dict(get_config("a")).attack, config.from_dict(get_config("a")).iterations) == ("idlg", 7)
  assert get_sweep("a") == [{"data.index": 2}, {"data.index": 3}] and get_sweep("b") is None
  with pytest.raises(ValueError, match="variant 'c'; choose one of a, b"):
    get_sweep("c")
