"""gradjax.integrations.audit without a federation: which attacks ``auto`` picks from a capture's metadata, and an
audit of a capture written as AuditStrategy writes one (a gradjax client's update in PyTorch layout)."""

import collections
import os
import json
import shutil
import time
import types

import jax
import numpy as np
import pytest
import scipy.optimize
import skimage.metrics

from gradjax import auto, clients, data, fidelity, interop, malicious, models, verdict
from gradjax.integrations import audit
from gradjax.run import config, pipeline
from conftest import assert_one_line_error


def test_settings_are_the_configuration_the_audit_reads():
  """An audit's settings are sections of :mod:`gradjax.run.config` (the captured files' defaults:
  the model from the captures, no ground truth), set through the options it reads; an option it
  would not read is refused, not kept and ignored; the JSON form reads back to equal settings."""
  plain = audit.Settings()
  assert plain.attacks == (auto.AUTO,) and plain == audit.settings()
  assert plain.model.name is None and plain.data.dataset is None
  assert plain.attack == config.Config().attack and plain.defense == config.Config().defense
  chosen = audit.settings(("dlg",), {"data.dataset": "cifar10", "attack.iterations": 300,
                                     "defense.dp_sgd_max_norm": 0.5, "seed": 3})
  assert (chosen.data.dataset, chosen.attack.iterations, chosen.seed) == ("cifar10", 300, 3)
  assert chosen.defense.dp_sgd_max_norm == 0.5 and chosen.model.name is None
  assert audit.from_json(json.loads(json.dumps(chosen.to_json()))) == chosen
  # NumPy's numbers are read as Python's: the settings travel as JSON.
  numpy = audit.settings(("dlg",), {"data.dataset": "cifar10", "attack.iterations": np.int64(300),
                                    "defense.dp_sgd_max_norm": np.float32(0.5), "seed": np.int32(3)})
  assert numpy == chosen and json.loads(json.dumps(numpy.to_json())) == chosen.to_json()
  with pytest.raises(ValueError, match="defense.spec"):
    audit.settings(options={"defense.spec": "prune:0.9"})  # a defense is the capture's to declare
  with pytest.raises(ValueError, match="attack.restarts"):
    audit.settings(options={"attack.restarts": "many"})  # the option's type
  for path, value in (("attack.iterations", 0), ("attack.restarts", 0),
                      ("execution.clients_per_run", -1), ("data.normalization", "cifar100x"),
                      ("defense.dp_sgd_delta", float("nan"))):
    with pytest.raises(ValueError, match=value if isinstance(value, str) else path.split(".")[1]):
      audit.settings(options={path: value})  # named by its path or its short flag
  with pytest.raises(TypeError, match="audit.settings"):  # attacks where the settings go
    audit.attack_captures([], ("idlg",))


def matched_psnr(truth, rec):
  """The mean PSNR (scikit-image's, capped at 100 dB as gradjax reports it) of ``rec``'s images
  against ``truth``'s under the pairing that maximises it (SciPy's assignment): a batch attack
  returns its images in an order of its own."""
  return matched_scores(truth, rec)[0]


def matched_scores(truth, rec, by="psnr"):
  """(PSNR, SSIM): :func:`matched_psnr` and the mean SSIM (scikit-image's) under the same pairing;
  ``by="mse"``: the pairing of least total squared error, as the README says gradjax pairs them (the
  two agree where the images are recovered; not at a few iterations)."""
  truth, rec = np.asarray(truth, np.float64), np.clip(np.asarray(rec, np.float64), 0, 1)
  with np.errstate(divide="ignore"):
    table = np.array([[min(skimage.metrics.peak_signal_noise_ratio(t, r, data_range=1), 100.0)
                       for r in rec] for t in truth])
  cost = -table if by == "psnr" else np.array([[np.mean((t - r) ** 2) for r in rec] for t in truth])
  rows, cols = scipy.optimize.linear_sum_assignment(cost)
  ssim = [skimage.metrics.structural_similarity(truth[i], rec[j], data_range=1, channel_axis=-1)
          for i, j in zip(rows, cols)]
  return float(table[rows, cols].mean()), float(np.mean(ssim))


@pytest.mark.parametrize("metadata, model, attacks", [
    ({"num_samples": 1, "local_lr": "0.1"}, "lenet_zhu", ("idlg",)),
    ({"num_samples": 8, "local_lr": "0.1"}, "lenet_zhu", ("inverting_gradients_batch",)),
    ({"num_samples": 8, "local_lr": "0.1", "model": "mlp-1024"}, None,
     ("exclusive_neurons", "cocktail_party", "inverting_gradients_batch")),
    ({"num_samples": 1, "local_lr": "0.1"}, "mlp", ("exclusive_neurons", "idlg")),
    ({"num_samples": 8, "local_lr": "0.1", "act": "sigmoid"}, "mlp-64",
     ("cocktail_party", "inverting_gradients_batch")),
    ({"num_samples": 8, "local_lr": "0.1", "act": "sigmoid"}, "mlp-8", ("inverting_gradients_batch",)),
    ({"num_samples": 8, "kind": "gradient"}, "lenet_zhu", ("inverting_gradients_batch",)),
    ({"num_samples": 8, "local_lr": "0.1", "local_batch_size": 4}, "mlp-64",
     ("inverting_gradients_fedavg", "dlm_plus")),
    ({"num_samples": 8}, "mlp-64", ("dlm_plus",)),
    ({"num_samples": 1, "kind": "gradient", "act": "relu"}, "lenet_zhu", ("rgap", "inverting_gradients_batch")),
    ({"num_samples": 1, "kind": "gradient", "act": "relu"}, "lenet5", ("rgap", "inverting_gradients_batch")),
    ({"num_samples": 2, "kind": "gradient", "act": "relu"}, "lenet_zhu", ("inverting_gradients_batch",)),
    ({"num_samples": 1, "kind": "gradient"}, "convnet-16", ("inverting_gradients_batch",)),
    ({"num_samples": 8, "local_lr": "0.1"}, "convnet", ("inverting_gradients_batch",)),
])
def test_auto_picks_by_the_update_and_the_model(metadata, model, attacks):
  assert auto.for_metadata(metadata, model) == attacks


@pytest.mark.slow
def test_auto_sets_the_convnets_total_variation_unless_the_user_did(monkeypatch):
  """On Geiping et al.'s ConvNet auto runs Inverting Gradients with TV 5 (experiments/studies/batches),
  records it with the attack it tried, and keeps a TV weight the user gave (what it runs then is
  read from the configuration it hands the pipeline, not run)."""
  assert auto.settings("inverting_gradients_batch", "convnet-16") == {"attack.priors": "tv:5"}
  assert auto.settings("inverting_gradients_batch", "lenet_zhu") == {}
  assert auto.settings("idlg", "convnet") == {}
  cfg = config.from_options({
      "attack.preset": "auto", "model.name": "convnet-4", "attack.iterations": 2,
      "data.batch_size": 2, "output.lpips": "none"
  })
  results, _ = pipeline.run(cfg)
  assert results["config"]["attack"]["priors"] == "tv:5"
  assert results["auto"]["tried"][0]["settings"] == {"attack.priors": "tv:5"}
  steps = []

  def fake_run(step, callback=None, batch=None, deadline=None, target_psnr=None):
    steps.append(step)
    return {"residual": None, "verdict": {"status": "inconclusive", "reason": ""}, "psnr": None,
            "wall_time_s": 1.0, "iterations": step.attack.iterations,
            "attack": {"iterations": step.attack.iterations}}, {}

  monkeypatch.setattr(pipeline, "run", fake_run)
  results, _ = pipeline._run_auto(config.replace(cfg, {"attack.priors": "tv:0.1"}), None, None)
  assert [config.get(s, "attack.priors") for s in steps] == ["tv:0.1"] * len(steps)
  assert results["auto"]["tried"][0]["settings"] == {}


def _sent_back(tmp_path, info, metadata):
  """A capture folder under ``tmp_path/audit`` of a lenet_zhu client that sent back the weights it
  received (``info``: capture.json's facts, round and client among them)."""
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10)
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  folder = tmp_path / "audit" / f"round_{info['round']}" / f"client_{info['client']}"
  folder.parent.mkdir(parents=True)
  audit.write_capture(folder, str(weights), interop.params_to_torch(model.variables["params"], mapping),
                      info, metadata)


def test_a_zero_update_is_one_row_with_its_verdict(tmp_path):
  """A client that sent back the weights it received: one row, no error, ``no_leak_found`` with
  ``zero_update``; no attack runs (the capture needs no ground truth)."""
  _sent_back(tmp_path, {"round": 2, "client": "4"}, {"num_samples": 8, "local_lr": 0.1,
                                                     "model": "lenet_zhu"})
  rows = audit.audit(tmp_path / "audit", audit.settings(options={"attack.iterations": 3,
                                                                 "output.lpips": "none"}),
                     log=lambda s: None)
  assert len(rows) == 1 and rows[0].get("error") is None and rows[0]["zero_update"], rows
  assert rows[0]["verdict"] == "no_leak_found" and audit.failed_rows(rows) == []
  # Asked to score, a capture without its examples' indices says so (it would score nothing, silently).
  lines = []
  audit.audit(tmp_path / "audit", audit.settings(options={"data.dataset": "skimage",
                                                          "attack.iterations": 3,
                                                          "output.lpips": "none"}),
              log=lines.append)
  assert any("round 2 client 4: not scored" in line and "data_indices" in line for line in lines), lines


def test_a_local_training_stated_in_capture_json_alone_is_said(tmp_path):
  """A capture written by hand whose capture.json's config states the local training but whose
  metadata do not: the audit says that it reads the metadata alone (it attacked as an unknown
  schedule, silently)."""
  _sent_back(tmp_path, {"round": 1, "client": "2", "config": {"lr": 0.1, "local-epochs": 2}},
             {"num_samples": 2, "model": "lenet_zhu"})
  lines = []
  audit.audit(tmp_path / "audit", audit.settings(options={"attack.iterations": 3,
                                                          "output.lpips": "none"}),
              log=lines.append)
  said = [line for line in lines if "capture.json's config states" in line]
  assert len(said) == 1 and "local_lr=0.1" in said[0] and "local_epochs=2" in said[0], lines


@pytest.mark.slow
def test_an_mlp_client_at_batch_16_leaks_every_image(photos, tmp_path):
  """One local step of an mlp-1024 client on 16 photos, captured as the recorder does: ``auto`` runs
  the closed form first, which recovers every image and label (scored against the photos)."""
  model = models.create("mlp-1024", jax.random.key(3), num_classes=10)
  y = np.arange(16) % 10
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, photos, y, local)
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  new = jax.tree.map(lambda w, u: np.asarray(w - u), model.variables["params"], obs.gradient)
  meta = {k: v for k, v in interop.observation_metadata(obs, model).items() if k not in ("layout", "kind")}
  folder = tmp_path / "audit" / "round_1" / "client_7"
  folder.parent.mkdir(parents=True)
  audit.write_capture(folder, str(weights), interop.params_to_torch(new, mapping),
                      {"round": 1, "client": "7", "data_indices": list(range(16))}, meta)
  rows = audit.audit(tmp_path / "audit", audit.settings(options={"data.dataset": "skimage",
                                                                 "data.image_size": 32,
                                                                 "attack.iterations": 3,
                                                                 "output.lpips": "none"}),
                     log=lambda s: None)
  assert [r["attack"] for r in rows] == ["exclusive_neurons", "cocktail_party",
                                         "inverting_gradients_batch"]
  first = rows[0]
  assert first.get("error") is None and first["verdict"] == "leak" and first["psnr"] > 60, first
  assert first["label_accuracy"] == 1.0 and first["num_samples"] == 16
  metrics = json.loads((tmp_path / "audit" / first["run"] / "metrics.json").read_text())
  assert metrics["findings"]["images"]["recognisable"] == 16
  assert metrics["verdict"]["leaks"] == ["images", "labels"]
  # Every row's scores from its saved images (scikit-image, SciPy's pairing) and labels (multisets),
  # the inexact Inverting Gradients row (3 iterations) among them; and the index holds the rows.
  for row in rows:
    rec = np.load(tmp_path / "audit" / row["run"] / "reconstruction.npy")
    psnr, ssim = matched_scores(photos, rec, by="mse")
    assert (row["psnr"], row["ssim"]) == (pytest.approx(psnr, rel=1e-6), pytest.approx(ssim, rel=1e-5))
    kept = json.loads((tmp_path / "audit" / row["run"] / "metrics.json").read_text())
    found = collections.Counter(kept["labels_reconstructed"]) & collections.Counter(y.tolist())
    assert row["label_accuracy"] == pytest.approx(sum(found.values()) / 16)
  assert rows[-1]["psnr"] < 30  # the inexact one
  index = json.loads((tmp_path / "audit" / "index.json").read_text())
  assert [(r["psnr"], r["ssim"], r["label_accuracy"]) for r in index["rows"]] == [
      (r["psnr"], r["ssim"], r["label_accuracy"]) for r in rows]


@pytest.mark.slow
def test_a_malicious_servers_imprint_is_read_out_and_a_refusing_client_is_not_a_failure(photos, tmp_path):
  """A server that hid an imprint of 32 bins (thresholds from photos 8-15, which it holds) in the
  first layer of mlp-64: the audit runs the ``imprint`` read-out before the honest attacks on the
  update of the client that trained (one SGD step on photos 0-3), which gives back every example
  alone in its bin exactly (PSNR against the photos, by NumPy); the client whose gate refused the
  model is a ``refused`` row and in the round's ``refused``, not a failure."""
  model = models.create("mlp-64", jax.random.key(3), num_classes=10)
  thresholds = malicious.imprint_thresholds(photos[8:].reshape(8, -1).mean(1), 32)
  evil = malicious.imprint_layer(model, thresholds)
  x, y = photos[:4], np.arange(4)
  obs = clients.fedavg(evil.apply_fn, evil.variables, x, y, clients.LocalTraining(learning_rate=0.1))
  mapping = interop.zoo_mapping(evil)
  round_dir = tmp_path / "audit" / "round_001"
  round_dir.mkdir(parents=True)
  weights = str(round_dir / audit.WEIGHTS)
  audit.write_round_weights(weights, interop.variables_to_torch(evil.variables, mapping), {"model": "mlp-64"})
  after = jax.tree.map(lambda w, u: np.asarray(w - u), evil.variables["params"], obs.gradient)
  meta = {"model": "mlp-64", "num_samples": 4, "local_lr": 0.1, "local_epochs": 1, "input_shape": "32,32,3"}
  audit.write_capture(round_dir / "client_7", weights, interop.params_to_torch(after, mapping),
                      {"round": 1, "client": "7", "data_indices": [0, 1, 2, 3]}, meta)
  refusal = f"the client failed: {audit.MODEL_REFUSED}: ['Dense_0']['kernel']: 32 of its 64 units measure one direction"
  audit.write_capture(round_dir / "client_8", weights, None, {"round": 1, "client": "8", "error": refusal}, meta)
  audit.write_round_summary(round_dir, 1, 2, {8: refusal})
  rows = audit.audit(tmp_path / "audit", audit.settings(options={"data.dataset": "skimage",
                                                                 "data.image_size": 32,
                                                                 "attack.iterations": 3,
                                                                 "output.lpips": "none"}),
                     log=lambda s: None)
  assert audit.failed_rows(rows) == [], rows
  assert [r["attack"] for r in rows if r["client"] == "7"][0] == "imprint"
  assert [(r.get("refused"), r["attack"]) for r in rows if r["client"] == "8"] == [(True, None)]
  read = next(r for r in rows if r["attack"] == "imprint")
  rec = np.load(tmp_path / "audit" / read["run"] / "reconstruction.npy").astype(np.float64)
  psnr = [10 * np.log10(1 / np.mean((r - t) ** 2)) for r, t in zip(rec, x.astype(np.float64))]
  bins = np.searchsorted(thresholds, x.reshape(4, -1).astype(np.float64).mean(1))
  alone = [k for k in range(4) if bins[k] > 0 and list(bins).count(bins[k]) == 1]
  assert alone and all(psnr[k] > 60 for k in alone), (psnr, bins)
  assert read["verdict"] == "leak" and read["loss"] is None  # a read-out of ratios: no objective
  assert read["label_accuracy"] is None  # labels not read are not scored as wrong ones
  index = json.loads((tmp_path / "audit" / "index.json").read_text())
  assert index["rounds"][0]["refused"] == ["8"] and index["rounds"][0]["failed"] == []
  # Without the ground truth: inconclusive, saying why (no labels read, so no update recomputed),
  # not that the read-out failed to match the update.
  blind = audit.audit(tmp_path / "audit", audit.settings(("imprint",), {"attack.iterations": 3,
                                                                        "output.lpips": "none"}),
                      log=lambda s: None)
  row = next(r for r in blind if r["client"] == "7")
  assert row["verdict"] == "inconclusive" and "reads no labels" in row["reason"], row["reason"]
  assert "did not match" not in row["reason"]


@pytest.mark.slow
def test_reconstruct_auto_stops_at_the_first_match_and_keeps_the_best(photos):
  """--attack=auto on a simulated client: an mlp-1024 batch is matched by the closed form, so nothing
  else runs; through a sigmoid layer the closed form recovers nothing, the next attack runs and the
  one with the lower residual is kept; the verdict names what was tried."""
  cfg = config.from_options({
      "attack.preset": "auto", "model.name": "mlp-1024", "data.batch_size": 8,
      "attack.iterations": 5, "output.lpips": "none"
  })
  results, images = pipeline.run(cfg)
  assert [t["attack"] for t in results["auto"]["tried"]] == ["exclusive_neurons"]
  assert results["auto"]["chosen"] == "exclusive_neurons" and results["verdict"]["status"] == "leak"
  assert results["verdict"]["tried"] == ["exclusive_neurons"] and results["psnr"] > 60
  assert results["psnr"] == pytest.approx(matched_psnr(photos[:8], images["reconstruction"]), rel=1e-6)

  # Inputs centred by the client: no unit is exclusive at batch 16, the closed form matches nothing,
  # the Cocktail Party Attack after it does (every image, to float32 rounding) and ends the search.
  assert pipeline.auto_attacks(
      config.from_options({
          "attack.preset": "auto", "model.name": "mlp-64", "model.act": "sigmoid",
          "data.batch_size": 2
      })) == ("cocktail_party", "inverting_gradients_batch")
  centred = {"attack.preset": "auto", "model.name": "mlp-1024", "data.batch_size": 16,
             "attack.iterations": 5, "output.lpips": "none",
             "data.normalization": "0.45,0.45,0.45/0.25,0.25,0.25"}
  results, images = pipeline.run(config.from_options(centred))
  tried = results["auto"]["tried"]
  assert [t["attack"] for t in tried] == ["exclusive_neurons", "cocktail_party"]
  assert tried[0]["residual"] > 0.5 and results["verdict"]["tried"] == [t["attack"] for t in tried]
  assert results["auto"]["chosen"] == "cocktail_party" and results["psnr"] > 60
  assert results["psnr"] == pytest.approx(matched_psnr(photos, images["reconstruction"]), rel=1e-6)
  assert results["wall_time_s"] >= sum(t["wall_time_s"] for t in tried)

  # A 32-unit sigmoid layer: ICA's examples leave some of the update unexplained (no match), the
  # batch attack runs after it and the lower residual is kept (ICA's: measured 30.0 dB).
  results, _ = pipeline.run(config.from_options({**centred, "model.name": "mlp-32",
                                                 "model.act": "sigmoid"}))
  tried = results["auto"]["tried"]
  assert [t["attack"] for t in tried] == ["cocktail_party", "inverting_gradients_batch"]
  assert results["auto"]["chosen"] == min(tried, key=lambda t: t["residual"])["attack"]
  assert results["auto"]["chosen"] == "cocktail_party" and results["psnr"] > 25
  assert results["wall_time_s"] >= sum(t["wall_time_s"] for t in tried)


def test_budget_restarts_fit_the_halving_plan():
  """Restarts a budget buys: R restarts under 3 rounds of halving (keep 1/2) cost Σ count·steps of
  the plan, by hand: R = 8 of 300 steps runs (8 + 4 + 2)·100 steps = 14/3 single runs."""
  assert pipeline.budget_restarts(14.0, 3.0, 300) == 8       # 8: 14.0 s; 9: (9 + 5 + 3)/3·3 = 17 s
  assert pipeline.budget_restarts(5.0, 3.0, 300) == 2        # 2: (2 + 1 + 1)/3·3 = 4 s; 3: 6 s
  assert pipeline.budget_restarts(3.9, 3.0, 300) == 0        # not even two
  assert pipeline.budget_restarts(1e9, 3.0, 300) == pipeline.BUDGET_MAX_RESTARTS


def test_budget_iterations_fit_the_time_left():
  """Iterations a budget buys at a measured time per iteration: floor(seconds / per iteration),
  capped at the preset's, never under the probe's."""
  assert pipeline.budget_iterations(100.0, 0.3, 2000) == 333      # 333 · 0.3 = 99.9 s
  assert pipeline.budget_iterations(1e4, 0.3, 2000) == 2000       # the preset's budget fits
  assert pipeline.budget_iterations(-5.0, 0.3, 2000) == pipeline.PROBE_ITERATIONS
  assert pipeline.budget_iterations(0.5, 0.3, 2000) == pipeline.PROBE_ITERATIONS


def test_auto_fits_the_presets_iterations_into_its_budget(monkeypatch):
  """--budget without --iterations: two probes time the attack, which then runs the iterations that
  fit in the time left, not the preset's 2000. On a clock the test drives: each run costs 0.5 s
  around its attack, 0.125 s an iteration, and the first 20 s of compilation; the probes (4
  iterations each) take 21 + 1 s, so 100 − 22 − 0.5 s buy 620 iterations, and nothing is left
  for restarts."""
  clock, runs, deadlines = [0.0], [], []

  def fake_run(step, callback=None, batch=None, deadline=None, target_psnr=None):
    deadlines.append(deadline)
    attack_s = step.attack.iterations * 0.125 + 20.0 * (not runs)
    clock[0] += 0.5 + attack_s
    runs.append(step)
    if callback is not None:
      callback(types.SimpleNamespace(its_per_s=8.0, alive=1))
    return {"residual": None, "verdict": {"status": "inconclusive", "reason": ""}, "psnr": None,
            "wall_time_s": attack_s, "iterations": step.attack.iterations,
            "attack": {"iterations": step.attack.iterations}}, {}

  monkeypatch.setattr(pipeline, "run", fake_run)
  monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
  results, _ = pipeline._run_auto(
      config.from_options({"attack.preset": "auto", "data.batch_size": 2, "attack.budget": 100.0}),
      None, None)
  assert [r.attack.iterations for r in runs] == [pipeline.PROBE_ITERATIONS] * 2 + [620]
  # One-step chunks in the probes, then chunks of 10 s at most; the run's deadline leaves the 0.5 s
  # a run spends after its attack.
  assert [r.execution.chunk for r in runs] == [1, 1, 80] and deadlines == [None, None, 99.5]
  probe, = results["auto"]["probes"]
  assert (probe["fitted_iterations"], probe["preset_iterations"]) == (620, 2000)
  assert results["auto"]["tried"][0]["iterations"] == 620 and results["wall_time_s"] == 100.0


def test_auto_skips_an_attack_that_refuses_the_update(monkeypatch):
  """An attack whose conditions the update does not meet (a ValueError) is skipped: the next one
  runs, and the results and the verdict name the refusal; where every attack refuses, one error
  names each."""
  ran = []

  def fake_run(step, callback=None, batch=None, deadline=None, target_psnr=None):
    if step.attack.preset == "exclusive_neurons":
      raise ValueError("the examples are coupled")
    ran.append(step.attack.preset)
    return {"residual": None, "verdict": {"status": "inconclusive", "reason": "r"}, "psnr": None,
            "wall_time_s": 1.0, "iterations": 5, "attack": {"iterations": 5}}, {}

  monkeypatch.setattr(pipeline, "run", fake_run)
  cfg = config.from_options({"attack.preset": "auto", "model.name": "mlp-64", "data.batch_size": 1,
                             "attack.iterations": 5})
  assert pipeline.auto_attacks(cfg) == ("exclusive_neurons", "idlg")
  results, _ = pipeline._run_auto(cfg, None, None)
  assert ran == ["idlg"] and results["auto"]["chosen"] == "idlg"
  assert results["auto"]["refused"] == [{"attack": "exclusive_neurons",
                                         "reason": "the examples are coupled"}]
  assert results["verdict"]["tried"] == ["idlg"]
  assert "exclusive_neurons" in results["verdict"]["reason"]
  monkeypatch.setattr(pipeline, "run", lambda *a, **k: (_ for _ in ()).throw(ValueError("no")))
  with pytest.raises(ValueError, match="exclusive_neurons: no; idlg: no"):
    pipeline._run_auto(cfg, None, None)
  # What is the update's (nothing to attack) or the user's (an option no attack takes) ends the run.
  zero = fidelity.ZeroUpdate("the update is 0")
  monkeypatch.setattr(pipeline, "run", lambda *a, **k: (_ for _ in ()).throw(zero))
  with pytest.raises(fidelity.ZeroUpdate):
    pipeline._run_auto(cfg, None, None)
  monkeypatch.setattr(pipeline, "run", fake_run)
  with pytest.raises(ValueError, match="gamma sets DLM's scale"):
    pipeline._run_auto(config.replace(cfg, {"attack.gamma": "init=100"}), None, None)


def test_a_deadline_ends_the_run_at_its_next_chunk():
  """pipeline.Trace's monitor: a run under a deadline stops at the first chunk past it."""
  assert pipeline.Trace(deadline=time.perf_counter() - 1.0).monitor(None)
  assert not pipeline.Trace(deadline=time.perf_counter() + 1e6).monitor(None)
  assert not pipeline.Trace().monitor(None)


@pytest.mark.slow
def test_auto_spends_its_budget_on_restarts_of_the_best_attack(monkeypatch):
  """--budget: after each candidate ran once, the time left buys restarts of the one that matched
  best; its run is kept only if it matches the update better; the verdict names both runs. (At
  most 4 restarts here, where the budget could buy 64.)"""
  monkeypatch.setattr(pipeline, "BUDGET_MAX_RESTARTS", 4)
  with pytest.raises(ValueError, match="--attack=auto"):
    config.from_options({"attack.preset": "dlg", "attack.budget": 10.0})
  cfg = config.from_options({
      "attack.preset": "auto", "data.batch_size": 2, "attack.iterations": 200,
      "output.lpips": "none", "attack.budget": 60.0
  })
  results, _ = pipeline.run(cfg)
  tried = results["auto"]["tried"]
  assert [t["attack"] for t in tried] == ["inverting_gradients_batch"] * 2
  assert tried[0]["restarts"] == 1 and tried[1]["restarts"] >= 2
  kept = min(tried, key=lambda t: t["residual"])
  assert results["auto"]["restarts"] == kept["restarts"] and results["restarts"] == kept["restarts"]
  assert results["wall_time_s"] <= 60.0 * 1.2 and results["verdict"]["tried"] == [t["attack"] for t in tried]


@pytest.mark.slow
def test_clients_that_do_not_fit_on_the_device_are_attacked_in_halves(monkeypatch):
  """pipeline.run_clients: a solver run of several clients that the device has no memory for is
  split in halves until it fits; another error of the run is raised; every experiment gets its
  results, with how many shared its run, and each one's own scores."""
  from gradjax import attacks
  real, sizes = attacks.reconstruct_clients, []

  def small_device(attack, apply_fn, observations, keys, **kw):
    sizes.append(len(observations))
    if len(observations) > 2:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9.1G")
    return real(attack, apply_fn, observations, keys, **kw)

  monkeypatch.setattr(attacks, "reconstruct_clients", small_device)
  cfgs = [config.from_options({"attack.preset": "idlg", "attack.iterations": 2, "data.index": i,
                               "data.image_size": 16, "output.lpips": "none",
                               "execution.clients_per_run": 5}) for i in range(5)]
  outcomes = pipeline.run_clients(cfgs)
  assert sizes == [5, 2, 3, 1, 2]
  assert [results["clients_together"] for results, _ in outcomes] == [2, 2, 1, 2, 2]
  truth = [results["psnr"] for results, _ in outcomes]
  assert len(set(truth)) == 5  # five images, five scores

  def broken(*args, **kw):
    raise RuntimeError("INTERNAL: something else")

  monkeypatch.setattr(attacks, "reconstruct_clients", broken)
  with pytest.raises(RuntimeError, match="something else"):
    pipeline.run_clients(cfgs[:2])


@pytest.mark.slow
def test_a_target_psnr_ends_the_attack_once_reached():
  """pipeline.run with ``target_psnr``: DLG on the README's photo stops at the first chunk whose best
  iterate reaches it (scored by NumPy's PSNR on the reconstruction it reports), far short of its
  budget; run_clients with two images vmapped stops once both reached it."""
  cfg = config.from_options({"attack.iterations": 2000, "execution.chunk": 25, "output.lpips": "none",
                             "data.image_size": 16})
  results, images = pipeline.run(cfg, target_psnr=25.0)
  mse = np.mean((images["reconstruction"].astype(np.float64) - images["ground_truth"]) ** 2)
  assert -10 * np.log10(mse) >= 25.0 and results["iterations"] < 2000
  assert results["target_psnr"] == {"psnr": 25.0, "reached": True}
  assert results["history"][-1]["psnr"] >= 25.0 > results["history"][-2].get("psnr", 0.0)
  together = [config.replace(cfg, {"data.index": i, "execution.clients_per_run": 2,
                                   "execution.strategy": "vmap"}) for i in (0, 1)]
  for results, _ in pipeline.run_clients(together, target_psnr=25.0):
    assert results["target_psnr"]["reached"] and results["iterations"] < 2000
    assert results["clients_together"] == 2


def _round_one(tmp_path):
  """A recorded round 1 of DLG's LeNet to fill with captures: (the sent weights' file, the update
  of a client that moved every weight by -1e-3, in PyTorch's names; the round's folder; metadata of
  one example)."""
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10)
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  after = jax.tree.map(lambda w: np.asarray(w) - 1e-3, model.variables["params"])
  round_dir = tmp_path / "audit" / "round_1"
  round_dir.mkdir(parents=True)
  return weights, interop.params_to_torch(after, mapping), round_dir, {
      "num_samples": 1, "local_lr": 0.1, "model": "lenet_zhu"}


@pytest.mark.slow
def test_a_capture_declaring_defense_none_is_attacked_plainly_by_an_adapted_audit(tmp_path):
  """``defense: "none"`` (a valid spec) declares no defense: an audit with ``attack.adaptive``
  attacks the capture as it is (before, every such row was the error "no defense to adapt to")."""
  weights, update, round_dir, meta = _round_one(tmp_path)
  audit.write_capture(round_dir / "client_1", str(weights), update, {"round": 1, "client": "1"},
                      {**meta, "defense": "none"})
  rows = audit.audit(tmp_path / "audit", audit.settings(("idlg",), {
      "attack.iterations": 2, "output.lpips": "none", "attack.adaptive": True}), log=lambda s: None)
  assert [r.get("error") for r in rows] == [None] and rows[0]["verdict"] in verdict.STATUSES, rows
  results = json.loads((tmp_path / "audit" / rows[0]["run"] / "metrics.json").read_text())
  assert results["adaptation"] is None and results["attack"]["objective"] == "gradient"


def test_a_signal_stops_the_audit_between_captures_and_a_second_one_at_once(tmp_path, monkeypatch):
  """The first signal (``stop``) ends the audit before the next capture; a second Ctrl-C
  (``KeyboardInterrupt`` in an attack once ``stop`` reports the first) at once: both raise
  :class:`audit.Stopped` with the rows of the captures finished, which a resume reads back from
  their ``rows.json``, attacking only the rest. A ``KeyboardInterrupt`` with no signal reported
  before it (no handler of the audit's saw one) stays a ``KeyboardInterrupt``."""
  import signal
  weights, update, round_dir, meta = _round_one(tmp_path)
  for client in "123":
    audit.write_capture(round_dir / f"client_{client}", str(weights), update,
                        {"round": 1, "client": client}, meta)
  found = audit.captures(tmp_path / "audit")
  attacked = []

  def attack_round(block, settings, log, interrupt_at=None):
    if interrupt_at is not None and block[0].client == interrupt_at:
      raise KeyboardInterrupt
    attacked.extend(c.client for c in block)
    return [[{"round": c.round, "client": c.client, "attack": "idlg", "psnr": 1.0}] for c in block]

  settings = audit.settings(("idlg",), {"execution.clients_per_run": 1})  # a block per capture
  row = lambda client: {"round": 1, "client": client, "attack": "idlg", "psnr": 1.0}
  monkeypatch.setattr(audit, "attack_round", lambda b, s, log: attack_round(b, s, log, "2"))
  with pytest.raises(KeyboardInterrupt):
    audit.attack_captures(found, settings, log=lambda s: None)
  asked = iter([None, None, signal.SIGINT])  # the first Ctrl-C arrives during the second capture
  with pytest.raises(audit.Stopped) as stopped:
    audit.attack_captures(found, settings, log=lambda s: None, stop=lambda: next(asked))
  assert (stopped.value.rows, stopped.value.done, stopped.value.total) == ([row("1")], 1, 3)
  assert stopped.value.signum == signal.SIGINT and attacked == ["1", "1"]
  attacked.clear()
  asked = iter([None, None, signal.SIGTERM])  # the signal arrives during the second capture
  monkeypatch.setattr(audit, "attack_round", attack_round)
  with pytest.raises(audit.Stopped) as stopped:
    audit.attack_captures(found, settings, log=lambda s: None, resume=True, stop=lambda: next(asked))
  assert (stopped.value.rows, stopped.value.done, stopped.value.signum) == (
      [row("1"), row("2")], 2, signal.SIGTERM)
  assert attacked == ["2"]  # the first capture read back from its rows.json
  assert audit.attack_captures(found, settings, log=lambda s: None, resume=True) == [
      row("1"), row("2"), row("3")] and attacked == ["2", "3"]


def test_files_an_audit_reads_back_never_end_it_and_an_unread_index_is_kept(tmp_path, monkeypatch):
  """An ``index.json`` or a ``rows.json`` nested too deep, index rows of other types or past a
  float's range, a capture counting more examples than 32-bit integers hold, a recorded error over
  several lines, a run folder that cannot be written: each is read as unreadable or is that
  client's one-line error row; the earlier index that is not read back is kept beside the new one."""
  weights, update, round_dir, meta = _round_one(tmp_path)
  for client, extra in (("1", {}), ("2", {"num_samples": 3_000_000_000})):
    audit.write_capture(round_dir / f"client_{client}", str(weights), update,
                        {"round": 1, "client": client}, {**meta, **extra})
  (round_dir / "client_3").mkdir()
  (round_dir / "client_3" / audit.CAPTURE).write_text(json.dumps(
      {"round": 1, "client": "3", "error": "<class 'ClientAppException'>:<'\nException | boom'>"}))
  deep = "[" * 100_000 + "]" * 100_000
  (tmp_path / "audit" / "index.json").write_text(deep)
  (round_dir / "client_1" / audit.ROWS).write_text(deep)
  settings = audit.settings(options={"attack.iterations": 2, "output.lpips": "none"})
  rows = audit.audit(tmp_path / "audit", settings, log=lambda s: None, resume=True)
  by_client = {r["client"]: r for r in rows}
  assert by_client["1"].get("error") is None and by_client["1"]["verdict"]
  assert by_client["2"]["error"].endswith("num_samples 3000000000 is past a 32-bit integer's range")
  assert by_client["3"]["error"] == "<class 'ClientAppException'>:<' Exception | boom'>"
  table = (tmp_path / "audit" / "index.md").read_text()
  assert "Exception \\| boom'> |" in table
  assert sum(line.startswith("|") for line in table.splitlines()) == 2 + len(rows)  # head, rule, rows
  assert (tmp_path / "audit" / "index.json.unread").read_text() == deep  # the unreadable one, kept
  # An index whose rows hold a score past a float's range or NaN: those rows are left out, and the
  # file they were in is kept; the rows of other rounds are merged as before.
  earlier = json.loads((tmp_path / "audit" / "index.json").read_text())
  other = [{**earlier["rows"][0], "round": 7, "psnr": 10 ** 400}, {**earlier["rows"][0], "round": 8},
           {**earlier["rows"][0], "round": 9, "psnr": float("nan")}]
  (tmp_path / "audit" / "index.json").write_text(json.dumps({**earlier, "rows": earlier["rows"] + other}))
  kept = (tmp_path / "audit" / "index.json").read_text()
  # A run folder that cannot be written: that attack's row says why; the audit goes on.
  monkeypatch.setattr(audit, "unique_dir", lambda path: (_ for _ in ()).throw(
      ValueError(f"cannot make the folder {path}: Read-only file system")))
  rows = audit.audit(tmp_path / "audit", settings, rounds=[1], log=lambda s: None)
  folder = tmp_path / "audit" / "round_1" / "client_1" / "idlg"
  assert rows[0] == {"round": 1, "client": "1", "attack": "idlg",
                     "error": f"cannot make the folder {folder}: Read-only file system"}, rows[0]
  assert [(r["round"], r["client"]) for r in rows] == [(1, "1"), (1, "2"), (1, "3"), (8, "1")]
  assert json.loads((tmp_path / "audit" / "index.json").read_text())["rows"] == rows
  assert (tmp_path / "audit" / "index.json.unread-1").read_text() == kept


def test_settings_and_metadata_are_checked_when_given():
  """A str or dict in the attacks' place, an unknown attack or dataset; metadata of other types, an
  unknown model or a malformed shape: refused when given, not as every row's error later."""
  with pytest.raises(TypeError, match="audit.settings"):
    audit.settings("idlg")
  with pytest.raises(TypeError, match="audit.settings"):
    audit.settings({"data.dataset": "skimage"})
  for attacks in (("idlgg",), ("auto", "dlg"), ("dlg", "dlg"), ()):
    with pytest.raises(ValueError, match="attacks"):
      audit.settings(attacks)
  with pytest.raises(ValueError, match="data.dataset='cifar1O'"):
    audit.settings(options={"data.dataset": "cifar1O"})
  for options in ({"data.image_size": 32}, {"data.image_size": 2, "data.dataset": "skimage"},
                  {"seed": 1.5}):
    with pytest.raises(ValueError, match="image_size|seed"):
      audit.settings(options=options)
  assert audit.settings(options={"data.image_size": 3, "data.dataset": "tfds:mnist"}).data.image_size == 3
  # The attacks count examples in 32-bit integers: the largest is read, one more refused.
  assert interop.metadata_num_samples({"num_samples": str(2**31 - 1)}) == 2**31 - 1
  with pytest.raises(ValueError, match="past a 32-bit"):
    interop.metadata_num_samples({"num_samples": str(2**31)})
  assert audit.static_metadata({"local_epochs": np.int64(2), "input_shape": [np.int32(28), 28, 1],
                                "model": "mlp"}, "here") == {
      "local_epochs": 2, "input_shape": [28, 28, 1], "model": "mlp"}
  with pytest.raises(TypeError, match="metadata\\['train'\\]"):
    audit.static_metadata({"train": {"mode": 1}}, "here")
  with pytest.raises(ValueError, match="lenet_zhuu"):
    audit.static_metadata({"model": "lenet_zhuu"}, "here")
  for shape in ("32x32x3", [32, 32], [32, 0, 3]):
    with pytest.raises(ValueError, match="input_shape"):
      audit.static_metadata({"input_shape": shape}, "here")


def test_malformed_records_are_rows_and_an_earlier_audits_runs_are_kept(tmp_path):
  """A ``capture.json`` whose fields have other types than the recorder writes, or a client folder
  without one, is that client's failed row, not the end of the audit; ``rows.json`` rows of other
  types are attacked again; a second audit writes its run beside the first one's, never over it."""
  weights, update, round_dir, meta = _round_one(tmp_path)
  for client in ("1", "2", "3", "5"):
    audit.write_capture(round_dir / f"client_{client}", str(weights), update,
                        {"round": 1, "client": client}, {**meta, "num_samples": "abc"} if client == "3" else meta)
  (round_dir / "client_2" / audit.CAPTURE).write_text(json.dumps({"error": 5, "metadata": meta}))
  (round_dir / "client_4").mkdir()  # no capture.json
  # capture.json's metadata (which choose the attacks) against the update file's (which they read).
  (round_dir / "client_5" / audit.CAPTURE).write_text(json.dumps({"metadata": {**meta, "num_samples": 10**8}}))
  settings = audit.settings(("idlg",), {"attack.iterations": 2, "output.lpips": "none"})
  rows = audit.audit(tmp_path / "audit", settings, log=lambda s: None)
  by_client = {r["client"]: r for r in rows}
  assert by_client["1"].get("error") is None and by_client["1"]["run"].endswith("client_1/idlg")
  assert "'error' must be a string" in by_client["2"]["error"]
  assert by_client["4"]["error"] == "no capture.json in the capture folder"
  assert by_client["5"]["error"] == ("capture.json's metadata disagree with observation.safetensors's: "
                                     "num_samples is '100000000' in the one, '1' in the other")
  first = (tmp_path / "audit" / by_client["1"]["run"] / "metrics.json").read_bytes()
  # Auto reads the metadata: a count that is not a number is the capture's error.
  auto_rows = audit.attack_round([c for c in audit.captures(tmp_path / "audit") if c.client == "3"],
                                 audit.settings(options={"attack.iterations": 2,
                                                         "output.lpips": "none"}),
                                 log=lambda s: None)[0]
  assert len(auto_rows) == 1 and "metadata do not describe an update" in auto_rows[0]["error"], auto_rows
  # A defense the client declares that does not parse: the capture's one row, whatever the attacks.
  audit.write_capture(round_dir / "client_6", str(weights), update, {"round": 1, "client": "6"},
                      {**meta, "defense": "prune:abc"})
  bad_defense = audit.attack_round([c for c in audit.captures(tmp_path / "audit") if c.client == "6"],
                                   audit.settings(("idlg", "dlg"), {"attack.iterations": 2}),
                                   log=lambda s: None)[0]
  assert [(r["attack"], r["error"].split(": prune ratio")[0]) for r in bad_defense] == [
      (None, "capture.json: metadata 'defense': bad defense 'prune:abc'")], bad_defense
  shutil.rmtree(round_dir / "client_6")
  # Another client's rows copied into this client's rows.json: not read back as this client's.
  captures = {c.client: c for c in audit.captures(tmp_path / "audit")}
  copied = json.loads((round_dir / "client_1" / audit.ROWS).read_text())
  assert audit.kept_rows(captures["1"], settings) == copied["rows"]
  # The flat record an audit before 2026-12-07 wrote: read back when it says the same settings.
  flat = {"attacks": ["idlg"], "model": None, "dataset": None, "data_dir": None, "image_size": None,
          "normalization": None, "iterations": 2, "restarts": 1, "seed": 0, "lpips": "none",
          "rename": None, "force": False, "adaptive": False, "clients_per_run": None,
          "dp_sgd_max_norm": None, "dp_sgd_noise_multiplier": 0.0, "dp_sgd_sampling_rate": 1.0,
          "dp_sgd_steps": 1, "dp_sgd_delta": 1e-5, "dp_sgd_poisson": False,
          "dp_sgd_expected_batch_size": None}
  for record, kept in ((flat, copied["rows"]), ({**flat, "iterations": 3}, None),
                       ({**flat, "defense": "prune:0.5"}, None)):
    (round_dir / "client_1" / audit.ROWS).write_text(json.dumps({**copied, "settings": record}))
    assert audit.kept_rows(captures["1"], settings) == kept
  (round_dir / "client_5" / audit.ROWS).write_text(json.dumps(copied))
  assert audit.kept_rows(captures["5"], settings) is None
  # Rows of other types in rows.json: attacked again on --resume, not read back.
  (round_dir / "client_1" / audit.ROWS).write_text(json.dumps(
      {"settings": settings.to_json(), "rows": [{}]}))
  again = audit.audit(tmp_path / "audit", settings, log=lambda s: None, resume=True)
  run = next(r for r in again if r["client"] == "1")["run"]
  assert run.endswith("client_1/idlg-1"), run
  assert (tmp_path / "audit" / by_client["1"]["run"] / "metrics.json").read_bytes() == first
  index = json.loads((tmp_path / "audit" / "index.json").read_text())
  assert next(r for r in index["rows"] if r["client"] == "1")["run"] == run
  # Scoring images of another shape than the captures declare: refused before any attack.
  from test_cli import run_in_one_process
  (round_dir / "client_1" / audit.CAPTURE).write_text(json.dumps({"metadata": {**meta, "input_shape": [32, 32, 3]}}))
  sweep = tmp_path / "sweep.py"
  sweep.write_text("from gradjax.run import config\n\ndef get_config():\n  return config.defaults()\n\n"
                   "def get_sweep():\n  return config.sweep('data.index', range(2))\n")
  command = ["gradjax", "audit", f"--audit_dir={tmp_path / 'audit'}", "--attacks=idlg"]
  proc, swept, unsized = run_in_one_process([
      ([*command, "--dataset=skimage", "--image_size=16"], tmp_path),
      ([*command, f"--config={sweep}"], tmp_path),  # a sweep the audit would not run
      ([*command, "--image_size=32"], tmp_path)])  # sizes nothing without --dataset
  assert_one_line_error(proc, "(16, 16, 3) images")
  assert "(32, 32, 3)" in proc.stderr
  assert_one_line_error(swept, "declares a sweep")
  assert_one_line_error(unsized, "data.image_size=32")


def test_a_malformed_round_summary_is_left_out_of_the_membership(tmp_path):
  """round.json files another writer (or an edit) left malformed are left out, each with a warning,
  where the audit's index had ended in a traceback; a good one beside them is read."""
  for r, summary in enumerate([{"clients_sent": 2, "failures": {}, "duplicates": 5},
                               {"clients_sent": 2, "failures": {"9": 5}},
                               {"clients_sent": "x", "failures": {}},
                               {"clients_sent": 2, "failures": {}, "nodes": "ab"},
                               {"clients_sent": 3, "failures": {"4": "no reply"}, "nodes": ["4", "5", "6"]}],
                              start=1):
    (tmp_path / f"round_{r:03d}").mkdir()
    (tmp_path / f"round_{r:03d}" / "round.json").write_text(json.dumps(summary))
  rows = audit.membership(tmp_path)
  assert [(r["round"], r["clients_sent"], r["failed"], r["nodes"]) for r in rows] == [
      (5, 3, ["4"], ["4", "5", "6"])]


@pytest.mark.slow
def test_an_audit_of_dp_sgd_clients_adapts_to_their_clipping_and_reports_their_budget(photos, tmp_path):
  """A federation whose clients ran DP-SGD (one client's capture: a local step clipped per example,
  no noise),
  audited with the options that say so: its run matches clipped examples (adapted), recomputes the
  clipping in its residual, skips the fidelity check it cannot pass, and reports the clients' (ε, δ)
  (gradjax.privacy's, tested against its references there)."""
  from gradjax import privacy
  model = models.create("lenet_zhu", jax.random.key(5), num_classes=10)
  x, y = photos[3:5], np.array([1, 6])
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, x, y, local, dp_sgd=clients.DPSGD(0.5))
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  new = jax.tree.map(lambda w, u: np.asarray(w - u), model.variables["params"], obs.gradient)
  folder = tmp_path / "audit" / "round_1" / "client_0"
  folder.parent.mkdir(parents=True)
  meta = {k: v for k, v in interop.observation_metadata(obs, model).items() if k not in ("layout", "kind")}
  audit.write_capture(folder, str(weights), interop.params_to_torch(new, mapping),
                      {"round": 1, "client": "0", "data_indices": [3, 4]}, meta)
  settings = audit.settings(("dlg",), {"data.dataset": "skimage", "data.image_size": 32,
                                       "attack.iterations": 2, "output.lpips": "none",
                                       "attack.adaptive": True, "defense.dp_sgd_max_norm": 0.5,
                                       "defense.dp_sgd_noise_multiplier": 1.3,
                                       "defense.dp_sgd_sampling_rate": 0.01,
                                       "defense.dp_sgd_steps": 100})
  rows = audit.audit(tmp_path / "audit", settings, log=lambda s: None)
  assert len(rows) == 1 and rows[0].get("error") is None, rows
  metrics = json.loads((tmp_path / "audit" / rows[0]["run"] / "metrics.json").read_text())
  assert metrics["attack"]["objective"] == "clipped_gradient" and metrics["checks"]["fidelity"]["ok"] is None
  assert metrics["privacy"]["epsilon"] == privacy.epsilon(0.01, 1.3, 100, 1e-5).epsilon
  index = json.loads((tmp_path / "audit" / "index.json").read_text())
  assert index["settings"]["options"]["defense.dp_sgd_max_norm"] == 0.5


@pytest.mark.slow
def test_each_client_declares_its_own_dp_sgd(tmp_path):
  """A round where one client declares its DP-SGD in its capture's metadata (a Flower client's
  declarations) and the other ran none, audited with no DP-SGD option: the first is attacked
  adapted to its own clipping, with its own (ε, δ) in its run and the index's ε column
  (gradjax.privacy's, tested against its references there); the second plainly, its capture
  passing the fidelity check, its ε cell empty."""
  from gradjax import privacy
  model = models.create("lenet_zhu", jax.random.key(5), num_classes=10)
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "round_weights.safetensors"
  interop.save_weights(weights, model, mapping)
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  # (The update is drawn without noise; the attack reads what the client declares.)
  declared = {"dp_sgd_max_norm": 0.5, "dp_sgd_noise_multiplier": 1.3, "dp_sgd_sampling_rate": 0.02,
              "dp_sgd_steps": 50}
  for client, indices, dp_sgd in (("0", [3, 4], clients.DPSGD(0.5)), ("1", [5, 6], None)):
    truth = data.load("skimage", indices=indices, image_size=(32, 32))
    obs = clients.fedavg(model.apply_fn, model.variables, truth.x, truth.y, local, dp_sgd=dp_sgd)
    new = jax.tree.map(lambda w, u: np.asarray(w - u), model.variables["params"], obs.gradient)
    folder = tmp_path / "audit" / "round_1" / f"client_{client}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in interop.observation_metadata(obs, model).items()
            if k not in ("layout", "kind")}
    audit.write_capture(folder, str(weights), interop.params_to_torch(new, mapping),
                        {"round": 1, "client": client, "data_indices": indices},
                        {**meta, **(declared if dp_sgd else {})})
  # DLM+ cannot model the clipping: it runs unadapted beside the adapted DLG, not as an error.
  settings = audit.settings(("dlg", "dlm_plus"), {"data.dataset": "skimage",
                                                  "data.image_size": 32, "attack.iterations": 2,
                                                  "output.lpips": "none", "attack.adaptive": True})
  rows = audit.audit(tmp_path / "audit", settings, log=lambda s: None)
  assert not any(r.get("error") for r in rows), rows
  assert [(r["client"], r["attack"]) for r in rows] == [
      ("0", "dlg"), ("0", "dlm_plus"), ("1", "dlg"), ("1", "dlm_plus")]
  dlm_plus = json.loads((tmp_path / "audit" / rows[1]["run"] / "metrics.json").read_text())
  assert dlm_plus["adaptation"] is None and dlm_plus["privacy"]["max_norm"] == 0.5
  first, second = (json.loads((tmp_path / "audit" / r["run"] / "metrics.json").read_text())
                   for r in rows[::2])
  assert first["attack"]["objective"] == "clipped_gradient" and first["checks"]["fidelity"]["ok"] is None
  eps = privacy.epsilon(0.02, 1.3, 50, 1e-5).epsilon
  assert first["privacy"]["max_norm"] == 0.5 and first["privacy"]["epsilon"] == eps
  # The noise's variance in the update, (ησC/B)² for one local step, weighs the layers.
  assert first["attack"]["distance"] == f"euclidean|gaussian:{(0.1 * 1.3 * 0.5 / 2) ** 2:.8g}"
  assert second["attack"]["objective"] == "gradient" and second["checks"]["fidelity"]["ok"] is True
  assert second["privacy"] is None
  lines = (tmp_path / "audit" / "index.md").read_text().splitlines()
  assert "| DP-SGD ε |" in lines[2]
  assert lines[4].split(" | ")[-2] == f"{eps:.3g} (δ 1e-05)" and lines[6].split(" | ")[-2] == "–"
  page = (tmp_path / "audit" / "index.html").read_text()
  assert "<th>DP-SGD ε</th>" in page and f"<td>{eps:.3g} (δ 1e-05)</td>" in page and "<td>–</td>" in page
  assert audit.read_index(tmp_path / "audit")[0]["privacy"]["epsilon"] == eps  # read back as valid
  # A client whose declared bound is no number: its row says so; the audit goes on.
  audit.write_capture(tmp_path / "audit" / "round_1" / "client_2", str(weights),
                      interop.params_to_torch(new, mapping), {"round": 1, "client": "2"},
                      {**meta, "dp_sgd_max_norm": [0.5, 1.0]})
  settings = audit.settings(("dlg",), {"data.dataset": "skimage", "data.image_size": 32,
                                       "attack.iterations": 2, "output.lpips": "none",
                                       "attack.adaptive": True})
  rows = audit.audit(tmp_path / "audit", settings, rounds=[1], log=lambda s: None)
  assert [r["client"] for r in rows] == ["0", "1", "2"] and rows[1].get("error") is None
  assert "metadata 'dp_sgd_max_norm' must be a finite number, got '0.5,1.0'" in rows[2]["error"]


@pytest.mark.slow
def test_an_unwritable_index_or_a_too_deep_capture_json_is_said_in_one_line(tmp_path):
  """An audit folder whose index.json is a folder: one line, exit 2, before any capture is attacked
  (it crashed after them all). A capture.json nested past Python's recursion limit: that client's
  error row (a RecursionError ended the audit)."""
  import subprocess
  import sys
  weights, update, round_dir, meta = _round_one(tmp_path)
  for client in ("1", "2"):
    audit.write_capture(round_dir / f"client_{client}", str(weights), update,
                        {"round": 1, "client": client}, meta)
  (round_dir / "client_2" / audit.CAPTURE).write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
  (tmp_path / "audit" / "index.json").mkdir()
  proc = subprocess.run([sys.executable, "-m", "gradjax", "audit", f"--audit_dir={tmp_path / 'audit'}",
                         "--attacks=idlg", "--iterations=2", "--lpips=none"],
                        capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "index.json is a folder where the audit writes its index" in errors[0]
  assert not (round_dir / "client_1" / "idlg").exists()
  (tmp_path / "audit" / "index.json").rmdir()
  rows = audit.audit(tmp_path / "audit", audit.settings(("idlg",), {"attack.iterations": 2,
                                                                    "output.lpips": "none"}),
                     log=lambda s: None)
  by_client = {r["client"]: r for r in rows}
  assert by_client["2"]["error"] == f"unreadable {audit.CAPTURE}: RecursionError"
  assert by_client["1"].get("error") is None


def test_a_unique_folder_is_taken_once(tmp_path):
  """unique_dir creates and takes its folder: the same path asked for again (another run started at
  once), or a folder of an earlier run, or a file of that name, gives the next free one; an empty
  folder is taken, and only once. Run in several threads at once, every call gets its own folder."""
  from concurrent import futures
  path = tmp_path / "audit"
  first = audit.unique_dir(path)
  assert first == str(path) and os.listdir(first) == [audit.OWNER]
  assert audit.unique_dir(path) == f"{path}-1"
  (tmp_path / "empty").mkdir()
  assert audit.unique_dir(tmp_path / "empty") == str(tmp_path / "empty")
  assert audit.unique_dir(tmp_path / "empty") == f"{tmp_path / 'empty'}-1"
  (tmp_path / "file").write_text("not a folder")
  assert audit.unique_dir(tmp_path / "file") == f"{tmp_path / 'file'}-1"
  with futures.ThreadPoolExecutor(8) as pool:
    taken = list(pool.map(lambda _: audit.unique_dir(tmp_path / "race"), range(16)))
  assert len(set(taken)) == 16
  with pytest.raises(ValueError, match="cannot make the folder"):  # under a file: one line, no loop
    audit.unique_dir(tmp_path / "file" / "audit")


@pytest.mark.slow
def test_a_runs_model_input_reproduces_its_residual(photos, tmp_path):
  """A capture attacked without its ground truth: model_input.npy (the data as the model read them,
  unclipped, in the slots' order) with labels_by_slot gives back the residual metrics.json reports,
  where reconstruction.npy (clipped to [0, 1]) need not; local_training is the capture's."""
  from gradjax import verdict
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10)
  obs = clients.fedavg(model.apply_fn, model.variables, photos[:1], np.array([4]),
                       clients.LocalTraining(learning_rate=0.1))
  weights, _, round_dir, meta = _round_one(tmp_path)
  interop.save_weights(weights, model, interop.zoo_mapping(model))
  after = jax.tree.map(lambda w, u: np.asarray(w - u), model.variables["params"], obs.gradient)
  audit.write_capture(round_dir / "client_1", str(weights),
                      interop.params_to_torch(after, interop.zoo_mapping(model)),
                      {"round": 1, "client": "1"}, {**meta, "image_size": None})
  rows = audit.audit(tmp_path / "audit", audit.settings(("idlg",), {"attack.iterations": 20,
                                                                    "output.lpips": "none"}),
                     log=lambda s: None)
  run = tmp_path / "audit" / rows[0]["run"]
  results = json.loads((run / "metrics.json").read_text())
  assert results["local_training"] == {"epochs": 1, "batch_size": None, "learning_rate": 0.1,
                                       "momentum": 0.0}
  imported = interop.load(str(round_dir / "client_1" / audit.WEIGHTS),
                          str(round_dir / "client_1" / audit.OBSERVATION))
  x = np.load(run / "model_input.npy")
  again = verdict.residual(imported.model.apply_fn, clients.update_as_gradient(imported.observation),
                           {"x": x}, np.asarray(results["labels_by_slot"]))
  assert again.relative_error == pytest.approx(results["residual"]["relative_error"], rel=1e-5)


def test_an_audit_again_that_changes_a_verdict_says_so():
  """Rows of an audit again replace the earlier index's for the same round, client and attack; a
  changed verdict is one line naming both budgets and the earlier run; an unchanged one, none."""
  earlier = [{"round": 1, "client": "7", "attack": "idlg", "verdict": "leak", "iterations": 6000,
              "run": "round_1/client_7/idlg"},
             {"round": 2, "client": "7", "attack": "idlg", "verdict": "leak", "iterations": 6000}]
  new = [{"round": 1, "client": "7", "attack": "idlg", "verdict": "inconclusive", "iterations": 200},
         {"round": 2, "client": "7", "attack": "idlg", "verdict": "leak", "iterations": 200}]
  lines = audit.replaced_verdicts(earlier, new)
  assert len(lines) == 1 and lines[0].startswith("round 1 client 7 idlg: leak (6000 iterations) "
                                                 "replaced by inconclusive (200 iterations)")
  assert "round_1/client_7/idlg" in lines[0]
  assert [r["iterations"] for r in audit.merged_rows(earlier, new)] == [200, 200]
  # An earlier attack the new audit did not run: its row leaves the index, and that is said too.
  dropped = audit.replaced_verdicts(earlier + [{"round": 1, "client": "7", "attack": "dlg",
                                                "verdict": "leak", "iterations": 2000}], new)
  assert len(dropped) == 2 and dropped[1].startswith("round 1 client 7 dlg: leak (2000 iterations) "
                                                     "left out of the index")


def test_two_folders_of_one_round_are_refused(tmp_path):
  """round_1 beside round_001 (a recording renamed by hand, or two recorders): both would be round
  1, their clients' rows told apart only by their run paths; refused, naming both."""
  for name in ("round_1", "round_001"):
    (tmp_path / name / "client_1").mkdir(parents=True)
    (tmp_path / name / "client_1" / audit.CAPTURE).write_text("{}")
  with pytest.raises(ValueError, match="round_001 and round_1"):
    audit.captures(tmp_path)
