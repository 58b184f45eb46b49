"""Smoke test of the benchmark suite (python -m benchmarks suite) without PyTorch: every section runs and its ratios are the
quotients of the times it reports."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_benchmark_harness_lists_its_programs_and_refuses_others():
  """python -m benchmarks (from the clone's root): its programs, an unknown one in one line, exit 2."""
  import benchmarks
  harness = [sys.executable, "-m", "benchmarks"]
  listed = subprocess.run([*harness, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert listed.returncode == 0 and all(name in listed.stdout for name in benchmarks.PROGRAMS)
  bad = subprocess.run([*harness, "suit"], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
      f"error: unknown command 'suit'; choose one of {', '.join(benchmarks.PROGRAMS)}"]


@pytest.mark.slow
def test_benchmark_sections_write_consistent_tables(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks", "suite", "--torch=off",
       "--models=lenet_zhu", "--batch_sizes=1,2", "--repeats=2", "--warmup=0", "--ttq_images=1",
       "--ttq_psnr=8", "--ttq_max_seconds=30", "--ig_model=convnet-4", "--ig_iterations=2",
       "--restart_counts=1,2", "--restart_iterations=5", "--linesearch_iterations=5",
       "--linesearch_caps=3", "--conv_shapes=1:8:3:4:3:1,1:16:16:4:3:1", "--startup_runs=1",
       "--loop_models=lenet_zhu", "--loop_batch_size=2", "--loop_steps=2",
       f"--output_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "benchmark.json").read_text())
  assert [(r["model"], r["batch_size"]) for r in result["steps"]] == [("lenet_zhu", 1), ("lenet_zhu", 2)]
  for r in result["steps"]:
    np.testing.assert_allclose(r["match_over_plain"], r["jax_match_ms"] / r["jax_plain_ms"], rtol=1e-12)
    np.testing.assert_allclose(r["other_over_default"], r["other_conv_match_ms"] / r["jax_match_ms"], rtol=1e-12)
    assert (r["conv"], r["other_conv"]) == ("mixed", "im2col")
    assert r["compiled_bytes"] > 0 and r["compile_match_s"] > 0
  assert [(r["model"], r["batch_size"]) for r in result["ops"]] == [("lenet_zhu", 1), ("lenet_zhu", 2)]
  for r in result["ops"]:
    ops = r["jax"]
    np.testing.assert_allclose(sum(ops["categories"].values()), ops["ops_ms"], rtol=1e-9)
    assert ops["categories"]["matmul"] > 0 and ops["matmul_flops"] > 0
    np.testing.assert_allclose(ops["matmul_gflops"],
                               ops["matmul_flops"] / ops["categories"]["matmul"] / 1e6, rtol=1e-9)
  # im2col on lenet_zhu: per conv layer one patches x kernel product (2·N·Ho·Wo·(kh·kw·C)·O FLOPs
  # forward), all counted from the HLO; batch 2 has twice batch 1's products.
  np.testing.assert_allclose(result["ops"][1]["jax"]["matmul_flops"],
                             2 * result["ops"][0]["jax"]["matmul_flops"], rtol=0.05)
  assert [(r["shape"], r["mixed_takes"]) for r in result["convs"]] == [("1:8:3:4:3:1", "im2col"),
                                                                       ("1:16:16:4:3:1", "split")]
  for r in result["convs"]:
    np.testing.assert_allclose(r["split_over_im2col"], r["split_ms"] / r["im2col_ms"], rtol=1e-12)
  assert [(r["model"], r["conv"]) for r in result["loops"]] == [("lenet_zhu", c) for c in ("xla", "split", "mixed")]
  for r in result["loops"]:
    for kind in ("sgd", "dlg"):
      np.testing.assert_allclose(r[f"{kind}_loop_over_top"], r[f"{kind}_loop_ms"] / r[f"{kind}_top_ms"], rtol=1e-12)
  ttq = result["ttq"]["dlg"][0]["jax"]
  assert ttq["reached"] and ttq["psnr"] >= 8 and ttq["iterations"] % 10 == 0
  runs = {(r["strategy"], r["restarts"]): r for r in result["restarts"]}
  assert set(runs) == {(s, n) for s in ("sequential", "vmap", "map") for n in (1, 2)}
  for s in ("sequential", "vmap", "map"):
    np.testing.assert_allclose(runs[s, 2]["over_one"], runs[s, 2]["seconds"] / runs[s, 1]["seconds"])
  profile = result["profile"]
  flops = profile["flops_per_evaluation"]
  for s in ("sequential", "vmap", "map"):
    for n in (1, 2):
      r = runs[s, n]
      np.testing.assert_allclose(r["gflops"], r["evaluations"] * flops / r["seconds"] / 1e9, rtol=1e-9)
  assert [r["restarts"] for r in profile["rows"]] == [1, 2] and profile["history"] == 100
  for r in profile["rows"]:
    # 2 m n float32 values per restart, n = 32·32·3 + 10 dummy values; two passes at the bandwidth.
    np.testing.assert_allclose(r["history_mb"], r["restarts"] * 2 * 100 * 3082 * 4 / 2**20)
    np.testing.assert_allclose(r["floor_ms"], 2e3 * r["history_mb"] * 2**20 / profile["bandwidth"])
    np.testing.assert_allclose(r["gflops"], r["flops_over_one"] * flops / r["step_ms"] / 1e6, rtol=1e-9)
    np.testing.assert_allclose(r["peak_fraction"], 1e9 * r["gflops"] / profile["peak_flops"], rtol=1e-9)
    # The vmapped program does R restarts' work (XLA's count, up to its bookkeeping).
    np.testing.assert_allclose(r["flops_over_one"], r["restarts"], rtol=0.05)
    assert r["step_ms"] > 0 and r["lbfgs_ms"] > 0
  assert [r["cap"] for r in result["linesearch"]] == [3]
  for r in result["linesearch"]:
    # L-BFGS evaluates at least once per iteration; the vmapped loop pays the per-iteration maximum.
    assert 1 <= r["mean_evaluations"] <= r["mean_max_evaluations"] <= r["cap"] + 1
    np.testing.assert_allclose(r["efficiency"], r["mean_evaluations"] / r["mean_max_evaluations"])
    assert r["restarts"] == 2 and 0 <= r["reached"] <= 2 and r["vmap_s"] > 0 and r["sequential_s"] > 0
  startup = result["startup"]
  # One run on an empty cache, one on the cache it filled; the attack is part of each process.
  assert len(startup["process_s"]) == len(startup["attack_s"]) == 2
  assert all(0 < a < p for a, p in zip(startup["attack_s"], startup["process_s"]))
  assert startup["psnr"] > 30 and startup["cores"] >= 1
  text = (tmp_path / "benchmark.md").read_text()
  assert f"| warm | 1 | {startup['process_s'][1]:.2f} |" in text
  assert "## One step" in text and "## L-BFGS line search under vmap" in text
  assert "## Where a vmapped DLG iteration goes" in text and "## Top level against inside a loop" in text


@pytest.mark.slow
def test_accelerator_suite_quick(tmp_path):
  """``--suite=gpu --quick`` runs every part on CPU and writes consistent tables; a second call keeps
  the parts already written."""
  from gradjax import data
  names = ["steps", "restarts", "dlg64", "precision", "ig", "fedavg"]
  if data.default_data_dir() is not None:  # the batch part attacks CIFAR-10 test images
    names.append("batch")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "benchmarks", "suite", "--suite=gpu", "--quick",
         "--torch=off", f"--output_dir={tmp_path}"]
  proc = subprocess.run(cmd + [f"--parts={','.join(names)}"], capture_output=True, text=True, env=env,
                        timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  parts = {p: json.loads((tmp_path / f"gpu_{p}.json").read_text()) for p in names}
  assert all(d["quick"] and d["rows"] for d in parts.values())
  for r in parts["steps"]["rows"]:
    np.testing.assert_allclose(r["match_over_plain"], r["match_ms"] / r["plain_ms"], rtol=1e-12)
  runs = {(r["strategy"], r["restarts"]): r for r in parts["restarts"]["rows"]}
  np.testing.assert_allclose(runs["sequential", 2]["over_one"],
                             runs["sequential", 2]["seconds"] / runs["sequential", 1]["seconds"])
  one, many = parts["dlg64"]["rows"]
  np.testing.assert_allclose(many["time_over_one"], many["wall_time_s"] / one["wall_time_s"])
  # The best of 2 restarts (restart 0 is the single run's start) is no worse than restart 0 alone.
  assert many["loss"] <= one["loss"]
  assert parts["fedavg"]["rows"][0]["candidates"] == 6  # 4 distinct labels in 2 steps of 2
  if "batch" in parts:  # the rows are batch_table.py's, read back from its own items
    items = [json.loads((tmp_path / "batch" / "items" / f"{key}_0.json").read_text()) for key in ("bn", "hfginv")]
    assert [r["variant"] for r in parts["batch"]["rows"]] == ["+ BN prior (gradinversion)", "+ schedule (hfginv)"]
    for row, item in zip(parts["batch"]["rows"], items):
      assert row["psnr_mean"] == pytest.approx(item["psnr"]) and row["iterations"] == 3
  text = (tmp_path / "gpu.md").read_text()
  assert all(f"## {p}" in text for p in parts)
  again = subprocess.run(cmd + ["--parts=ig"], capture_output=True, text=True, env=env, timeout=300,
                         cwd=ROOT)
  assert again.returncode == 0 and "ig: kept" in again.stdout
