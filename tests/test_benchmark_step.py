"""Smoke test of python -m benchmarks step (needs PyTorch for its eager baseline)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python -m benchmarks runs here
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")

# Run in a subprocess: importing the command defines absl flags, which must not clash with other commands'.
_PARAM_COUNTS = """
import json, sys
import jax
from gradjax import models
from benchmarks import step as benchmark_step
from benchmarks import torch_ports
counts = {}
for name in sys.argv[1:]:
  variables = jax.eval_shape(lambda key: models.create(name, key).variables, jax.random.key(0))
  torch_model = torch_ports.build_torch_model(name, (32, 32, 3), 10)
  counts[name] = [benchmark_step.count_params(variables["params"]),
                  sum(p.numel() for p in torch_model.parameters())]
print(json.dumps(counts))
"""


def _run(*args):
  return subprocess.run([sys.executable, "-m", "benchmarks", "step", *args], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_torch_ports_have_the_zoo_parameter_counts():
  names = ["lenet_zhu", "lenet5", "convnet-16", "mlp", "resnet8", "resnet20-4"]
  result = subprocess.run([sys.executable, "-c", _PARAM_COUNTS, *names], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  counts = json.loads(result.stdout.strip().splitlines()[-1])
  for name in names:
    assert counts[name][0] == counts[name][1], name
  assert counts["lenet_zhu"][0] == 15826  # 912 + 2 * 3612 + 7690


@pytest.mark.slow
def test_runs_both_frameworks_and_writes_json(tmp_path):
  output = tmp_path / "bench.json"
  result = _run("--models=lenet_zhu", "--repeats=2", "--warmup=1", f"--output={output}")
  assert result.returncode == 0, result.stderr
  assert "| lenet_zhu | 1 | torch |" in result.stdout
  report = json.loads(output.read_text())
  assert report["environment"]["torch"] and report["environment"]["device_kind"]
  assert report["config"]["models"] == ["lenet_zhu"]
  jax_row, torch_row = report["results"]
  assert (jax_row["framework"], torch_row["framework"]) == ("jax", "torch")
  assert jax_row["num_params"] == torch_row["num_params"] == 15826
  assert jax_row["compile_s"]["match"] > 0 and torch_row["compile_s"] is None
  for row in (jax_row, torch_row):
    assert row["plain"]["n"] == row["match"]["n"] == 2
    assert 0 < row["plain"]["q25_ms"] <= row["plain"]["median_ms"] <= row["plain"]["q75_ms"]
    assert row["match_over_plain"] == pytest.approx(row["match"]["median_ms"] / row["plain"]["median_ms"])
  assert torch_row["torch_over_jax_match"] == pytest.approx(
      torch_row["match"]["median_ms"] / jax_row["match"]["median_ms"])


def test_unknown_model_is_a_one_line_usage_error():
  result = _run("--models=lenet_zhu,not_a_model", "--torch=off")
  assert result.returncode == 2
  assert "not_a_model" in result.stderr and len(result.stderr.strip().splitlines()) == 1
