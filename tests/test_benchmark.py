"""The benchmark programs (python -m benchmarks), PyTorch off: every section and part runs and
records what it measured."""

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
def test_every_benchmark_section_runs_and_records_what_it_measured(tmp_path):
  """Every CPU section at tiny sizes (PyTorch off): each writes its rows and its seconds, the command
  and the device are recorded, and the measurements obey what they measure (positive times; R
  vmapped restarts do R restarts' XLA work; a vmapped L-BFGS pays its slowest restart's line search;
  a process's attack is part of its time)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks", "suite", "--torch=off",
       "--models=lenet_zhu", "--batch_sizes=1", "--repeats=2", "--warmup=0", "--ttq_images=1",
       "--ttq_psnr=8", "--ttq_max_seconds=30", "--ig_model=convnet-4", "--ig_iterations=2",
       "--restart_counts=1,2", "--restart_iterations=5", "--linesearch_iterations=5",
       "--linesearch_caps=3", "--conv_shapes=1:8:3:4:3:1,1:16:16:4:3:1", "--startup_runs=1",
       "--loop_models=lenet_zhu", "--loop_batch_size=2", "--loop_steps=2",
       f"--output_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "benchmark.json").read_text())
  sections = ("steps", "ops", "convs", "loops", "ttq", "restarts", "profile", "linesearch", "startup")
  assert set(result["section_seconds"]) == set(sections) and all(result[s] for s in sections)
  env_record = result["environment"]
  assert "benchmarks suite" in result["command"] and env_record["platform"] == "cpu"
  assert env_record["jax"] and env_record["cpu_model"] and env_record.get("torch") is None
  assert all(r["jax_match_ms"] > 0 and r["jax_plain_ms"] > 0 for r in result["steps"])
  assert all(r["jax"]["matmul_flops"] > 0 for r in result["ops"])
  assert [(r["shape"], r["mixed_takes"]) for r in result["convs"]] == [("1:8:3:4:3:1", "im2col"),
                                                                       ("1:16:16:4:3:1", "split")]
  ttq = result["ttq"]["dlg"][0]["jax"]
  assert ttq["reached"] and ttq["psnr"] >= 8
  runs = {(r["strategy"], r["restarts"]): r for r in result["restarts"]}
  assert set(runs) == {(s, n) for s in ("sequential", "vmap", "map") for n in (1, 2)}
  for r in result["profile"]["rows"]:
    np.testing.assert_allclose(r["flops_over_one"], r["restarts"], rtol=0.05)
  for r in result["linesearch"]:
    assert 1 <= r["mean_evaluations"] <= r["mean_max_evaluations"] <= r["cap"] + 1
  startup = result["startup"]
  assert all(0 < a < p for a, p in zip(startup["attack_s"], startup["process_s"]))
  assert startup["psnr"] > 30


@pytest.mark.slow
def test_accelerator_suite_quick(tmp_path):
  """``--suite=gpu --quick`` runs every part on CPU and writes consistent tables; a second call keeps
  the parts already written."""
  from gradjax import data
  names = ["dlg64", "precision", "ig", "fedavg"]  # steps and restarts: the CPU sections' functions
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
  one, many = parts["dlg64"]["rows"]
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
