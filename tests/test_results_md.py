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


def _sapag_rows(rel_dir, rows, threshold=30.0):
  """A sweep output of ``rows`` (index, psnr, and optional fields) with its summary by NumPy."""
  psnr = [r["psnr"] for r in rows]
  stat = lambda v: {"mean": float(np.mean(v)), "median": float(np.median(v)), "std": float(np.std(v))}
  full = [{"ssim": 0.5, "label_accuracy": 1.0, "wall_time_s": 1.0, **r} for r in rows]
  _write(rel_dir, "results.json", {"rows": full, "summary": {
      "experiments": len(rows), "successes": sum(p >= threshold for p in psnr), "psnr": stat(psnr),
      "ssim": stat([0.5] * len(rows)), "label_accuracy": stat([1.0] * len(rows)),
      "wall_time_s": stat([1.0] * len(rows)), "psnr_threshold": threshold}})


