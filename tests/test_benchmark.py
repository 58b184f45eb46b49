"""Smoke test of experiments/benchmark.py without PyTorch: every section runs and its ratios are the
quotients of the times it reports."""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_sections_write_consistent_tables(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "benchmark.py"), "--torch=off",
       "--models=lenet_zhu", "--batch_sizes=1,2", "--repeats=2", "--warmup=0", "--ttq_images=1",
       "--ttq_psnr=8", "--ttq_max_seconds=30", "--ig_model=convnet-4", "--ig_iterations=2",
       "--restart_counts=1,2", "--restart_iterations=5", "--linesearch_iterations=5",
       "--linesearch_caps=3", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "benchmark.json").read_text())
  assert [(r["model"], r["batch_size"]) for r in result["steps"]] == [("lenet_zhu", 1), ("lenet_zhu", 2)]
  for r in result["steps"]:
    np.testing.assert_allclose(r["match_over_plain"], r["jax_match_ms"] / r["jax_plain_ms"], rtol=1e-12)
    np.testing.assert_allclose(r["other_over_default"], r["other_conv_match_ms"] / r["jax_match_ms"], rtol=1e-12)
    assert {r["conv"], r["other_conv"]} == {"xla", "im2col"}
    assert r["compiled_bytes"] > 0 and r["compile_match_s"] > 0
  ttq = result["ttq"]["dlg"][0]["jax"]
  assert ttq["reached"] and ttq["psnr"] >= 8 and ttq["iterations"] % 10 == 0
  runs = {(r["strategy"], r["restarts"]): r for r in result["restarts"]}
  assert set(runs) == {(s, n) for s in ("sequential", "vmap", "map") for n in (1, 2)}
  for s in ("sequential", "vmap", "map"):
    np.testing.assert_allclose(runs[s, 2]["over_one"], runs[s, 2]["seconds"] / runs[s, 1]["seconds"])
  assert [r["cap"] for r in result["linesearch"]] == [3]
  for r in result["linesearch"]:
    # L-BFGS evaluates at least once per iteration; the vmapped loop pays the per-iteration maximum.
    assert 1 <= r["mean_evaluations"] <= r["mean_max_evaluations"] <= r["cap"] + 1
    np.testing.assert_allclose(r["efficiency"], r["mean_evaluations"] / r["mean_max_evaluations"])
    assert r["restarts"] == 2 and 0 <= r["reached"] <= 2 and r["vmap_s"] > 0 and r["sequential_s"] > 0
  text = (tmp_path / "benchmark.md").read_text()
  assert "## One step" in text and "## L-BFGS line search under vmap" in text
