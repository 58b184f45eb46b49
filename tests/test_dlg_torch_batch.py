"""experiments/studies/dlg_batch/dlg_torch_batch.py: DLG's reference loop in PyTorch eager on gradjax's batches."""

import collections
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import skimage.metrics
from conftest import assert_one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_dlg_torch_batch_scores_its_reconstructions(tmp_path):
  """DLG's reference loop in PyTorch on two CIFAR-10 batches of 2 (a subprocess: torch stays out of
  this one): PSNR and label rows against scikit-image on the saved reconstructions, the convergence
  step consistent with the final objective, and bad flags refused."""
  from gradjax import data
  if data.default_data_dir() is None:
    pytest.skip("needs ../shared/data (CIFAR-10)")
  script = os.path.join(ROOT, "experiments", "studies", "dlg_batch", "dlg_torch_batch.py")
  proc = subprocess.run([sys.executable, script, "--batch_sizes=2", "--count=2", "--steps=3",
                         "--tol=1e-30", f"--output_dir={tmp_path}"], capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "results.json").read_text())
  recs = np.load(tmp_path / "reconstructions.npz")
  images = data.load("cifar10", indices=range(4))
  rows = result["rows"]["2"]
  assert [r["index"] for r in rows] == [0, 2]
  for r in rows:
    x, rec = images.x[r["index"]:r["index"] + 2].astype(np.float64), recs[f"2_{r['index']}"]
    # Order-matched PSNR: the better of the two pairings by MSE, each image's PSNR averaged.
    pairings = [(0, 1), (1, 0)]
    best = min(pairings, key=lambda p: sum(np.mean((rec[p[j]] - x[j]) ** 2) for j in range(2)))
    want = np.mean([skimage.metrics.peak_signal_noise_ratio(x[j], rec[best[j]].astype(np.float64),
                                                            data_range=1) for j in range(2)])
    assert r["psnr"] == pytest.approx(want, rel=1e-5)
    assert r["converged_step"] is None and r["steps"] == 3 and r["loss"] > 1e-30
    assert r["evaluations"] >= 3 and r["logit_gap"] < 1e-5
    # The labels read off the dummy label logits, against the batch's as multisets.
    overlap = collections.Counter(r["labels"]) & collections.Counter(
        images.y[r["index"]:r["index"] + 2].tolist())
    assert r["label_accuracy"] == sum(overlap.values()) / 2
  assert "| 2 | 0 / 2 | – (of 3) |" in (tmp_path / "results.md").read_text()
  bad = subprocess.run([sys.executable, script, "--batch_sizes=0", f"--output_dir={tmp_path / 'bad'}"],
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0 and "must be positive" in bad.stderr


def test_help_lists_exactly_the_flags_it_reads():
  """--help names this program's flags, --seed among them, and none of the benchmark harness's
  (whose PyTorch ports it imports) nor --resume, which it does not do."""
  script = os.path.join(ROOT, "experiments", "studies", "dlg_batch", "dlg_torch_batch.py")
  proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", proc.stdout, re.M))
  assert listed == {"batch_sizes", "count", "data_dir", "start", "steps", "tol", "seed", "output_dir",
                    "overwrite"}
  for flag in ("--repeats=3", "--resume"):
    bad = subprocess.run([sys.executable, script, flag], capture_output=True, text=True, timeout=120)
    assert_one_line_error(bad, "Unknown command line flag")
