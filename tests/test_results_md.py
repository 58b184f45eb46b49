"""experiments/results_legacy.md is what experiments/results_md.py makes of the committed outputs,
and its renderers print what a hand-written result file says."""

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def results_md():
  spec = importlib.util.spec_from_file_location(
      "results_md", os.path.join(ROOT, "experiments", "results_md.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_committed_results_md_is_generated_from_the_outputs(results_md):
  with open(os.path.join(ROOT, results_md.LEGACY)) as f:
    committed = f.read()
  assert committed == results_md.render(), (
      f"{results_md.LEGACY} is stale: run python experiments/results_md.py and commit it")


def _write(folder, name, payload):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, name), "w") as f:
    json.dump(payload, f)


def test_sweep_row_and_provenance_from_a_hand_written_output(results_md, tmp_path, monkeypatch):
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  stats = lambda mean, median, std: {"mean": mean, "median": median, "std": std}
  _write(tmp_path / results_md.RESULTS / "run", "results.json", {
      "summary": {"experiments": 4, "successes": 3, "psnr": stats(31.256, 30.5, 2.004),
                  "ssim": stats(0.9125, 0.9, 0.01), "label_accuracy": stats(0.75, 1.0, 0.4),
                  "wall_time_s": stats(3.0, 2.54, 1.0), "total_time_s": 150.0},
      "rows": [], "command": "gradjax sweep --count=4", "device": "CPU (X)",
      "cores": 1, "jax": "1.2", "flax": "0.3", "optax": "0.4", "date": "2026-01-02"})
  table = results_md.sweep_rows([("mine", "run")], paper={"mine": "29.0"}).splitlines()
  assert table[2] == "| mine | 4 | 3 / 4 | 31.26 ± 2.00 | 30.50 | 0.912 | 75 % | 2.5 s | 29.0 |"
  assert results_md.provenance("run") == (
      "Run: `gradjax sweep --count=4`; CPU (X), 1 core; jax 1.2; flax 0.3; optax 0.4; "
      "2026-01-02; wall time 2.5 min.")
  # An output written before the programs kept their command line: the section's record of it.
  _write(tmp_path / results_md.RESULTS / "old", "metrics.json", {"wall_time_s": 7200.0})
  assert results_md.provenance("old", "python x.py") == (
      "Run: `python x.py`; device not recorded (written before the programs kept it); "
      "wall time 2.0 h.")
  # A run continued from saved states: its time spans processes, its device line is the last one's.
  _write(tmp_path / results_md.RESULTS / "resumed", "metrics.json",
         {"wall_time_s": 7200.0, "resumed": True, "command": "python r.py --resume", "device": "CPU (X)",
          "cores": 2})
  assert results_md.provenance("resumed") == (
      "Run: `python r.py --resume`; CPU (X), 2 cores; wall time 2.0 h over several processes "
      "(`--resume`; the device, cores and date are the last's).")
  assert results_md.load("absent") is None


def test_program_table_keeps_the_body_and_captions_the_title(results_md, tmp_path, monkeypatch):
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  folder = tmp_path / results_md.RESULTS / "t"
  os.makedirs(folder)
  (folder / "results.md").write_text("# A title\n\n| a |\n|---|\n| 1 |\n\n## Part\n")
  assert results_md.program_table("t") == "*A title*\n\n| a |\n|---|\n| 1 |\n\n### Part"


def test_command_rebuilt_from_a_recorded_configuration(results_md):
  """Fields at Config's defaults are left out; the rest become their flags (learning_rate is --lr)."""
  config = {"attack": "dlg", "model": "lenet_zhu", "learning_rate": 0.5, "box": True,
            "dataset": "cifar10", "one_sample_per_step": False}
  assert results_md.command_from_config(config) == (
      "gradjax reconstruct --dataset=cifar10 --lr=0.5 --box --noone_sample_per_step")


def test_split_runs_are_pooled_over_their_images(results_md, tmp_path, monkeypatch):
  """Images 0-1 and 2-3 run apart: one row with the statistics of all four (NumPy by hand: PSNR
  20, 30, 40, 10 -> mean 25, population std sqrt(125), median 25; 2 of 4 at >= 30 dB)."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  row = lambda psnr, ssim, acc, t: {"psnr": psnr, "ssim": ssim, "label_accuracy": acc, "wall_time_s": t}
  for rel, rows in (("a", [row(20.0, 0.5, 1.0, 2.0), row(30.0, 0.7, 1.0, 4.0)]),
                    ("b", [row(40.0, 0.9, 0.0, 6.0), row(10.0, 0.1, 1.0, 8.0)])):
    _write(tmp_path / results_md.RESULTS / rel, "results.json",
           {"rows": rows, "summary": {"psnr_threshold": 30.0}})
  table = results_md.sweep_rows([("both", ("a", "b"))]).splitlines()
  assert table[2] == (f"| both | 4 | 2 / 4 | 25.00 ± {np.sqrt(125.0):.2f} | 25.00 | 0.550 | 75 % | "
                      "5.0 s |")


def test_hfginv_note_pairs_the_batches(results_md, tmp_path, monkeypatch):
  """Three batches, by hand: PSNR differences +1, −0.5, +2 (mean 0.833, population std
  sqrt(((1/6)² + (4/3)² + (7/6)²) / 3) = 1.027), SSIM +0.1, +0.1, −0.1, LPIPS −0.1, +0.2, −0.2."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  row = lambda b, p, s, l: {"batch": b, "psnr": p, "ssim": s, "lpips": l}
  _write(tmp_path / results_md.RESULTS / "ablation", "results.json", {"ablation_rows": {
      "bn": [row(0, 10.0, 0.2, 0.5), row(1, 11.0, 0.2, 0.4), row(2, 9.0, 0.4, 0.7)],
      "hfginv": [row(2, 11.0, 0.3, 0.5), row(0, 11.0, 0.3, 0.4), row(1, 10.5, 0.3, 0.6)]}})
  note = results_md.hfginv_note("ablation")
  diff = np.array([1.0, -0.5, 2.0])
  assert f"PSNR +0.83 ± {diff.std():.2f} dB (higher on 2 of 3)" in note and f"{diff.std():.2f}" == "1.03"
  assert "SSIM +0.033 (higher on 2 of 3)" in note and "LPIPS -0.033 (lower on 2 of 3)" in note
  assert note.endswith("HFGInv beats the GradInversion baseline on PSNR.")
  assert results_md.hfginv_note("absent") == ""


def test_batch_labels_table_and_hfginv_note_count_by_hand(results_md, tmp_path, monkeypatch):
  """Two runs of batch_table.py by hand. Protocol run: HFGInv exact on batches 0 and 1, batch 2 with
  the classes right and the counts wrong ({1, 2} both ways); 2 of 3 exact is most. Second run: batch 0
  exact, batch 1 misses class 3, batch 2 has the counts wrong; 1 of 3."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  row = lambda b, got, truth: {"batch": b, "labels": got, "truth": truth, "exact": got == truth,
                               "accuracy": 1.0}
  truths = ([0, 0, 1], [2, 3, 3], [1, 1, 2])
  runs = {"p": ([0, 0, 1], [2, 3, 3], [1, 2, 2]), "q": ([0, 0, 1], [2, 2, 2], [1, 2, 2])}
  for rel, got in runs.items():
    _write(tmp_path / results_md.RESULTS / rel, "results.json", {
        "aux": 40 if rel == "p" else 300,
        "labels": [{"method": "llg", "exact": 1, "batches": 3, "accuracy_mean": 0.5},
                   {"method": "hfginv", "exact": sum(g == t for g, t in zip(got, truths)), "batches": 3,
                    "accuracy_mean": 0.25}],
        "label_rows": {"hfginv": [row(b, g, t) for b, (g, t) in enumerate(zip(got, truths))]}})
  runs = (("p", "protocol"), ("q", "other"), ("absent", "none"))
  table = results_md.batch_labels_table(runs).splitlines()
  assert table[2] == "| head | auxiliary images | llg | hfginv |"
  assert table[4:] == ["| protocol | 40 | 1/3 (0.500) | 2/3 (0.250) |",
                       "| other | 300 | 1/3 (0.500) | 1/3 (0.250) |"]
  note = results_md.hfginv_labels_note(runs)
  assert note.startswith("On HFGInv's protocol its counts are exact on 2 of 3 batches (most of them).")
  assert "| protocol | 40 | 2 | 1 | 0 |" in note and "| other | 300 | 1 | 1 | 1 |" in note
  assert results_md.batch_labels_table((("absent", "none"),)) is None
  assert results_md.hfginv_labels_note((("absent", "none"),)) == ""


def test_restarts_note_compares_the_floor_with_the_target(results_md, tmp_path, monkeypatch):
  """By hand: one restart 1.0 ms per iteration, its step 0.5 ms (2.00×); R=64 at a 100 GFLOP/s peak,
  10 MFLOP per evaluation: 6.4 ms, plus the pairs' 12.0 ms floor = 18.4 ms > 16 × 1.0 ms; the
  16 ms budget asks 64 × 10 MFLOP of 40 GFLOP/s."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  _write(tmp_path / results_md.RESULTS / "bench", "benchmark.json", {
      "restarts": [{"strategy": "sequential", "restarts": 1, "ms_per_iteration": 1.0}],
      "profile": {"peak_flops": 1e11, "flops_per_evaluation": 1e7, "history": 100,
                  "rows": [{"restarts": 1, "step_ms": 0.5, "history_mb": 2.0, "floor_ms": 0.2},
                           {"restarts": 64, "step_ms": 30.0, "history_mb": 150.0, "floor_ms": 12.0}]}})
  note = results_md.restarts_note("bench")
  assert "takes 1.00 ms against 0.50 ms for its matching step alone (2.00×)" in note
  assert "take 6.4 ms" in note and "18.4 ms per iteration at the least" in note and "16.0 ms." in note
  assert "cannot cost 16× one" in note
  # 64 × 10 MFLOP in 16 ms: 40 GFLOP/s, 40 % of the peak; the best rate is R=64's 64e7 / 30 ms.
  assert ("asks the 64 evaluations for 40.0 GFLOP/s (40% of the peak), 1.9× the best rate the "
          "objective reaches here (21.3 GFLOP/s, at R=64)") in note
  assert "cannot" not in results_md.restarts_note("bench", target=20.0)
  assert results_md.restarts_note("absent") == ""


def test_speed_note_reads_the_largest_batch(results_md, tmp_path, monkeypatch):
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  step = lambda m, b, t, o: {"model": m, "batch_size": b, "torch_over_jax": t, "other_over_default": o}
  ops = lambda moved, total: {"categories": {"data movement": moved}, "ops_ms": total}
  _write(tmp_path / results_md.RESULTS / "steps", "benchmark.json", {
      "steps": [step("convnet", 1, 0.5, 1.0), step("convnet", 8, 1.04, 1.26), step("lenet_zhu", 8, 2.0, 1.0)],
      "ops": [{"model": "convnet", "batch_size": 8, "jax": ops(3.0, 100.0), "torch": ops(1.0, 100.0)}]})
  note = results_md.speed_note("steps")
  assert note.startswith("Batch 8,") and "convnet 1.04× (1.26× faster than im2col)." in note
  assert "lenet_zhu" not in note and "convnet 3% against 1%" in note


def test_loops_note_divides_by_hand(results_md, tmp_path, monkeypatch):
  """By hand: xla 40 ms in the loop against 2 ms at the top (20.0×), split 4 ms in the loop (10.0×
  less); DLG 6 against 3 (2.0×), split 2 (3.0× less); a model without an xla row is left out."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  row = lambda m, c, st, sl, dt, dl: {"model": m, "conv": c, "sgd_top_ms": st, "sgd_loop_ms": sl,
                                      "sgd_loop_over_top": sl / st, "dlg_top_ms": dt, "dlg_loop_ms": dl,
                                      "dlg_loop_over_top": dl / dt}
  _write(tmp_path / results_md.RESULTS / "loops", "benchmark.json", {"loops": [
      row("resnet20", "xla", 2.0, 40.0, 3.0, 6.0), row("resnet20", "split", 2.0, 4.0, 3.0, 2.0),
      row("lenet_zhu", "split", 1.0, 1.0, 1.0, 1.0)]})
  note = results_md.loops_note("loops")
  assert note.startswith("Inside a loop, a step with XLA's own convolutions takes this many times its top-level time: "
                         "resnet20 20.0× (SGD step) and 2.0× (DLG evaluation), and in the loop split is 10.0× "
                         "and 3.0× faster. ")
  assert "lenet_zhu" not in note and results_md.loops_note("absent") == ""


def test_training_record_names_the_recipe_and_thins_long_histories(results_md, tmp_path, monkeypatch):
  """A 30-epoch run with Nesterov, a step decay and augmentation: every option named, the accuracy
  listed every 10 epochs; a 2-epoch run without them lists each epoch and names none."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  config = {"model": "lenet_zhu", "dataset": "cifar10_train", "train_count": 50000, "epochs": 30,
            "batch_size": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True,
            "lr_milestones": ["11", "22"], "lr_gamma": 0.1, "augment": True, "normalization": "cifar10",
            "test_dataset": "cifar10", "test_count": 1017}
  history = [{"epoch": e, "accuracy": e / 100} for e in range(31)]
  _write(tmp_path / results_md.RESULTS / "long", "results.json", {"config": config, "history": history})
  assert results_md.training_record("long") == (
      "lenet_zhu on cifar10_train (50000 images, inputs normalised by the CIFAR-10 mean and std), 30 "
      "epochs of batch 128, SGD lr 0.1 Nesterov momentum 0.9 weight decay 0.0005, lr ×0.1 after epochs "
      "11, 22, random crops and flips: test accuracy 30.0 % on cifar10 test images 0–1016 (every 10 "
      "epochs: 10.0 %, 20.0 %, 30.0 %).")
  plain = {**config, "epochs": 2, "nesterov": False, "lr_milestones": [], "augment": False,
           "weight_decay": 0.0, "normalization": "none"}
  _write(tmp_path / results_md.RESULTS / "short", "results.json",
         {"config": plain, "history": history[:3]})
  assert results_md.training_record("short") == (
      "lenet_zhu on cifar10_train (50000 images), 2 epochs of batch 128, SGD lr 0.1 momentum 0.9: test "
      "accuracy 2.0 % on cifar10 test images 0–1016 (per epoch: 1.0 %, 2.0 %).")


def _sapag_rows(rel_dir, rows, threshold=30.0):
  """A sweep output of ``rows`` (index, psnr, and optional fields) with its summary by NumPy."""
  psnr = [r["psnr"] for r in rows]
  stat = lambda v: {"mean": float(np.mean(v)), "median": float(np.median(v)), "std": float(np.std(v))}
  full = [{"ssim": 0.5, "label_accuracy": 1.0, "wall_time_s": 1.0, **r} for r in rows]
  _write(rel_dir, "results.json", {"rows": full, "summary": {
      "experiments": len(rows), "successes": sum(p >= threshold for p in psnr), "psnr": stat(psnr),
      "ssim": stat([0.5] * len(rows)), "label_accuracy": stat([1.0] * len(rows)),
      "wall_time_s": stat([1.0] * len(rows)), "psnr_threshold": threshold}})


def test_sapag_budget_note_pairs_images_and_counts_how_runs_ended(results_md, tmp_path, monkeypatch):
  """Three images at 2000 iterations (PSNR 40, 36, 5: mean 27, population std sqrt(((13² + 9² + 22²) / 3)
  = 15.25, median 36, 2 of 3 >= 30) against 500 iterations split over two folders (20, 25, 6): gains
  +20, +11, −1, mean +10.00, higher on 2. Ended: one at objective 0, one at the budget, one diverged;
  evaluations 900, 5000, 300 -> median 900."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  base = tmp_path / results_md.RESULTS
  (long,), (short_a, short_b) = results_md._runs(results_md.SAPAG_PRESET), results_md._runs(results_md.SAPAG_500)
  _sapag_rows(base / long, [
      {"index": 2, "psnr": 5.0, "iterations": 300, "loss": 0.9, "restarts_diverged": 1, "evaluations": 300},
      {"index": 0, "psnr": 40.0, "iterations": 800, "loss": 0.0, "restarts_diverged": 0, "evaluations": 900},
      {"index": 1, "psnr": 36.0, "iterations": 2000, "loss": 1e-6, "restarts_diverged": 0,
       "evaluations": 5000}])
  _sapag_rows(base / short_a, [{"index": 0, "psnr": 20.0}, {"index": 1, "psnr": 25.0}])
  _sapag_rows(base / short_b, [{"index": 2, "psnr": 6.0}])
  note = results_md.sapag_budget_note()
  std = np.sqrt((13 ** 2 + 9 ** 2 + 22 ** 2) / 3)
  assert f"reaches 27.00 ± {std:.2f} dB (median 36.00, 2 of 3 images ≥ 30 dB), below the paper's" in note
  assert "500 iterations give 17.00 dB on the same images; it is higher on 2 of 3 images, by +10.00 dB" in note
  assert "1 ended with the objective at 0 in float32" in note
  assert "1 used the whole budget and 1 diverged" in note and "a median of 900 objective evaluations" in note


def test_sapag_other_note_compares_on_the_images_both_ran(results_md, tmp_path, monkeypatch):
  """MNIST Xavier: the preset there runs without the box, at 2000 iterations on images 0–2 (PSNR 50,
  10, 46), DLG on 0–1 and 5 (90, 20, 70): the pair is images 0–1, medians 30 and 55, DLG higher, 1 of
  2 DLG images >= 30; its 500-iteration runs (with the box) count in no gain. LFW Xavier: SAPAG only
  at 500 iterations (35 on image 0) against DLG 31: SAPAG higher, and at or above the paper's 30.72.
  CIFAR-100 uniform, with the box: 2000 iterations 40, 30 against 500's 20, 32 (gains +20, −2: mean
  +9.00, higher on 1); DLG 10, 50: medians 35 and 30, SAPAG higher, below the paper's 55.91."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  base = tmp_path / results_md.RESULTS
  mnist = results_md._sapag_other_folders("xavier", "mnist", ("0-9",))
  lfw = results_md._sapag_other_folders("xavier", "lfw", ("0-9",))
  cifar = results_md._sapag_other_folders("uniform", "cifar100", ("0-9",))
  _sapag_rows(base / mnist["2000_nobox"][0], [{"index": 0, "psnr": 50.0}, {"index": 1, "psnr": 10.0},
                                              {"index": 2, "psnr": 46.0}])
  _sapag_rows(base / mnist["2000"][0], [{"index": 0, "psnr": 1.0}, {"index": 1, "psnr": 1.0}])
  _sapag_rows(base / mnist["500"][0], [{"index": 0, "psnr": 20.0}, {"index": 1, "psnr": 12.0}])
  _sapag_rows(base / mnist["dlg"][0], [{"index": 0, "psnr": 90.0}, {"index": 1, "psnr": 20.0},
                                       {"index": 5, "psnr": 70.0}])
  _sapag_rows(base / lfw["500"][0], [{"index": 0, "psnr": 35.0}])
  _sapag_rows(base / lfw["dlg"][0], [{"index": 0, "psnr": 31.0}])
  _sapag_rows(base / cifar["2000"][0], [{"index": 0, "psnr": 40.0}, {"index": 1, "psnr": 30.0}])
  _sapag_rows(base / cifar["500"][0], [{"index": 0, "psnr": 20.0}, {"index": 1, "psnr": 32.0}])
  _sapag_rows(base / cifar["dlg"][0], [{"index": 0, "psnr": 10.0}, {"index": 1, "psnr": 50.0}])
  note = results_md.sapag_other_note()
  assert ("MNIST, Xavier normal 30.00 / 55.00 dB (2 images, SAPAG without the box); LFW, Xavier normal "
          "35.00 / 31.00 dB (1 image, SAPAG at 500 iterations); CIFAR-100, uniform 35.00 / 30.00 dB "
          "(2 images)") in note
  assert "higher on 2 of 3 dataset and init pairs" in note and "paper's SAPAG figure on 1 of 3" in note
  assert "MNIST, Xavier normal: 1 of 2 images ≥ 30 dB; LFW, Xavier normal: 1 of 1 images" in note
  assert "2000 iterations against 500 change SAPAG by +9.00 dB on average over these 2 images (higher on 1)" in note
  table = results_md.sapag_other_table()
  assert "| MNIST, Xavier normal: SAPAG, 2000 iterations (the preset, --nobox) | 3 |" in table
  assert "| CIFAR-100, uniform: SAPAG, 2000 iterations (the preset) | 2 |" in table


def test_sapag_note_counts_what_the_longer_budgets_change(results_md, tmp_path, monkeypatch):
  """DLG fixed-step at 500 steps: images 0–2 at 40, 5, 6 dB; at 10 000: 41, 35, 6.5 dB, so image 1
  reaches 30 dB late and image 2 stalls (objective 0.04 then 0.03). SAPAG at 10 000 fixed steps:
  image 0 diverged, 1 of 2 >= 30 dB. The annealed kernel's median (8, 12 -> 10) against 500
  iterations' (20, 30 -> 25)."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  base = tmp_path / results_md.RESULTS
  runs = results_md._runs
  _sapag_rows(base / runs(results_md.SAPAG_PRESET)[0], [{"index": 0, "psnr": 45.0}])
  _sapag_rows(base / runs(results_md.SAPAG_500)[0], [{"index": 0, "psnr": 20.0}, {"index": 1, "psnr": 30.0}])
  _sapag_rows(base / runs("SAPAG, line search, kernel annealed from n_l σ_l² to σ_l²")[0],
              [{"index": 0, "psnr": 8.0}, {"index": 1, "psnr": 12.0}])
  _sapag_rows(base / runs("SAPAG, fixed step, 10 000 iterations")[0], [
      {"index": 0, "psnr": 5.0, "restarts_diverged": 1}, {"index": 1, "psnr": 31.0, "restarts_diverged": 0}])
  _sapag_rows(base / runs("DLG, line-search L-BFGS")[0], [{"index": 0, "psnr": 80.0}])
  _sapag_rows(base / runs("DLG, fixed-step L-BFGS")[0], [
      {"index": 0, "psnr": 40.0, "loss": 1e-11}, {"index": 1, "psnr": 5.0, "loss": 0.05},
      {"index": 2, "psnr": 6.0, "loss": 0.04}])
  _sapag_rows(base / runs("DLG, fixed step, 10 000 iterations")[0], [
      {"index": 2, "psnr": 6.5, "loss": 0.03}, {"index": 0, "psnr": 41.0, "loss": 1e-11},
      {"index": 1, "psnr": 35.0, "loss": 1e-11}])
  note = results_md.sapag_note()
  assert "The best SAPAG reading by median is \"" + results_md.SAPAG_PRESET + "\" (45.00 dB" in note
  assert "(10 000 fixed steps), it diverges on 1 of 2 images and reaches ≥ 30 dB on 1." in note
  assert ("has a median of 35.00 dB (2 of 3 images ≥ 30 dB; paper 3.75): 1 of the images under 30 dB at "
          "500 steps reaches it by 10 000, and the 1 that stay under it stall, their objective at a median of "
          "0.04 after 500 steps and 0.03 after 10 000.") in note
  assert "gives a median of 10.00 dB against 25.00 dB with the per-entry width throughout." in note


def test_sapag_box_note_compares_the_same_images(results_md, tmp_path, monkeypatch):
  """MNIST Xavier: without the box (the preset there) images 0–2 at 50, 40, 20 dB (image 2 absent with
  the box); with it images 0, 1, 15 at 10, 12, 11: on images 0–1, 45.00 (median 45.00, 2 of 2 >= 30)
  against 11.00 (median 11.00). DLG with the box: 80, 90 -> median 85.00, 2 of 2."""
  monkeypatch.setattr(results_md, "ROOT", str(tmp_path))
  base = tmp_path / results_md.RESULTS
  free = results_md._sapag_other_folders("xavier", "mnist", ("0-9", "10-19"))["2000_nobox"]
  _sapag_rows(base / free[0], [{"index": 0, "psnr": 50.0}, {"index": 1, "psnr": 40.0},
                               {"index": 2, "psnr": 20.0}])
  boxed = results_md.SAPAG_BOX[0][1]
  _sapag_rows(base / boxed[0], [{"index": 0, "psnr": 10.0}, {"index": 1, "psnr": 12.0}])
  _sapag_rows(base / boxed[1], [{"index": 15, "psnr": 11.0}])
  _sapag_rows(base / results_md.SAPAG_BOX[2][1][0], [{"index": 0, "psnr": 80.0}, {"index": 1, "psnr": 90.0}])
  note = results_md.sapag_box_note()
  assert ("MNIST, Xavier normal: 45.00 dB (median 45.00, 2 of 2 images ≥ 30 dB; paper 45.60) without the "
          "box against 11.00 dB (median 11.00) with it.") in note
  assert "DLG with the same box still converges (median 85.00 dB, 2 of 2 images ≥ 30 dB)" in note
  assert "MNIST, uniform" not in note  # no run without the box there
  # MNIST uniform: no box 60 dB on image 0; with it only at 500 iterations, 12 dB.
  _sapag_rows(base / results_md._sapag_other_folders("uniform", "mnist", ("0-9",))["2000_nobox"][0],
              [{"index": 0, "psnr": 60.0}])
  _sapag_rows(base / results_md._sapag_other_folders("uniform", "mnist", ("0-9",))["500"][0],
              [{"index": 0, "psnr": 12.0}])
  assert ("MNIST, uniform: 60.00 dB (median 60.00, 1 of 1 images ≥ 30 dB; paper 78.23) without the box "
          "against 12.00 dB (median 12.00) with it at 500 iterations.") in results_md.sapag_box_note()
  # With the box at 2000 iterations (15 dB), that run replaces the 500-iteration one.
  _sapag_rows(base / results_md.SAPAG_BOX[1][1][0], [{"index": 0, "psnr": 15.0}])
  assert ("MNIST, uniform: 60.00 dB (median 60.00, 1 of 1 images ≥ 30 dB; paper 78.23) without the box "
          "against 15.00 dB (median 15.00) with it.") in results_md.sapag_box_note()
  assert "On CIFAR-100" not in note  # not run there yet
  # CIFAR-100 images 0–2: with the box (the preset) 40, 30, 10; without 20, 35, 5 (image 3 without
  # only): medians 30 and 20, higher with the box on 2 of 3.
  _sapag_rows(base / results_md._runs(results_md.SAPAG_PRESET)[0],
              [{"index": 0, "psnr": 40.0}, {"index": 1, "psnr": 30.0}, {"index": 2, "psnr": 10.0}])
  _sapag_rows(base / results_md._runs("SAPAG, line search, 2000 iterations, no box")[0],
              [{"index": 0, "psnr": 20.0}, {"index": 1, "psnr": 35.0}, {"index": 2, "psnr": 5.0},
               {"index": 3, "psnr": 50.0}])
  assert ("On CIFAR-100 (images 0–2) the box helps instead: median 30.00 dB with it, 20.00 dB without, "
          "higher with it on 2 of 3 images; so the preset keeps the box") in results_md.sapag_box_note()
  assert results_md.sapag_box_table().count("\n| MNIST") == 3
