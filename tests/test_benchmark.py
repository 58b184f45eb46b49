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
def test_the_cpu_suite_records_its_command_device_and_measurements(tmp_path):
  """The CPU suite's sections behind the README's and the studies' claims (one step against its
  plain forward-backward, op profile, convolutions, time to quality, time to a first result), at
  tiny sizes, PyTorch off: the command, the device and the versions are recorded, and every section
  wrote rows measured by the program (the other sections, loops, restarts, profile and linesearch,
  share their machinery and are run by hand before a study quotes them)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks", "suite", "--torch=off", "--sections=steps,ops,convs,ttq,startup",
       "--models=lenet_zhu", "--batch_sizes=1", "--repeats=2", "--warmup=0", "--ttq_images=1",
       "--ttq_psnr=8", "--ttq_max_seconds=30", "--conv_shapes=1:8:3:4:3:1,1:16:16:4:3:1",
       "--startup_runs=1", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "benchmark.json").read_text())
  sections = ("steps", "ops", "convs", "ttq", "startup")
  assert set(result["section_seconds"]) == set(sections) and all(result[s] for s in sections)
  env_record = result["environment"]
  assert "benchmarks suite" in result["command"] and env_record["platform"] == "cpu"
  assert env_record["jax"] and env_record["cpu_model"] and env_record.get("torch") is None
  assert all(r["jax_match_ms"] > 0 and r["jax_plain_ms"] > 0 for r in result["steps"])
  assert [(r["shape"], r["mixed_takes"]) for r in result["convs"]] == [("1:8:3:4:3:1", "im2col"),
                                                                       ("1:16:16:4:3:1", "split")]
  ttq = result["ttq"]["dlg"][0]["jax"]
  assert ttq["reached"] and ttq["psnr"] >= 8
  startup = result["startup"]
  assert all(0 < a < p for a, p in zip(startup["attack_s"], startup["process_s"]))
  assert startup["psnr"] > 30


@pytest.mark.slow
def test_accelerator_suite_quick(tmp_path):
  """``--suite=gpu --quick`` runs on CPU the parts that have not yet run on an accelerator in full
  (``fedavg``, ``batch``, ``convnet``; the others ran on an H100 and an H200, and are rerun
  ``--quick`` before a device is used) and writes consistent tables; a second call keeps the parts
  already written."""
  from gradjax import data
  names = ["fedavg"]
  if data.default_data_dir() is not None:  # the batch and convnet parts attack CIFAR-10 test images
    names += ["batch", "convnet"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "benchmarks", "suite", "--suite=gpu", "--quick",
         "--torch=off", f"--output_dir={tmp_path}"]
  proc = subprocess.run(cmd + [f"--parts={','.join(names)}"], capture_output=True, text=True, env=env,
                        timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  parts = {p: json.loads((tmp_path / f"gpu_{p}.json").read_text()) for p in names}
  assert all(d["quick"] and d["rows"] for d in parts.values())
  assert parts["fedavg"]["rows"][0]["candidates"] == 6  # 4 distinct labels in 2 steps of 2
  if "batch" in parts:  # the rows are batch_table.py's, read back from its own items
    items = [json.loads((tmp_path / "batch" / "items" / f"{key}_0.json").read_text()) for key in ("bn", "hfginv")]
    assert [r["variant"] for r in parts["batch"]["rows"]] == ["+ BN prior (gradinversion)", "+ schedule (hfginv)"]
    for row, item in zip(parts["batch"]["rows"], items):
      assert row["psnr_mean"] == pytest.approx(item["psnr"]) and row["iterations"] == 3
  if "convnet" in parts:  # the row is the sweep's own results.json, read back
    sweep = json.loads((tmp_path / "convnet_4" / "results.json").read_text())
    row, = parts["convnet"]["rows"]
    assert row["model"] == "convnet-4" and row["images"] == 2
    assert row["psnr_mean"] == pytest.approx(np.mean(sweep["rows"][0]["psnr_per_image"]))
  text = (tmp_path / "gpu.md").read_text()
  assert all(f"## {p}" in text for p in parts)
  again = subprocess.run(cmd + ["--parts=fedavg"], capture_output=True, text=True, env=env, timeout=300,
                         cwd=ROOT)
  assert again.returncode == 0 and "fedavg: kept" in again.stdout
