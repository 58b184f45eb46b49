"""gradjax defense-sweep: the utility column (a model trained under each defense) and the
privacy/utility plot, through the program's functions and end to end."""

import importlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from gradjax import data, models, training
from gradjax.run import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def sweep():
  """The program as a module (defines its absl flags once per process)."""
  return importlib.import_module("gradjax.cli.defense_sweep")


@pytest.fixture(scope="module")
def blobs():
  """A linearly separable 3-class problem on 4x4 gray images: 240 training and 120 test images."""
  rng = np.random.default_rng(0)
  y = rng.integers(0, 3, 360)
  x = rng.normal(0, 0.3, (360, 4, 4, 1)).astype(np.float32)
  for c in range(3):
    x[y == c, c, :, 0] += 2.0
  return training.split(data.Dataset(x, y, 3, "blobs"), 240, 120)


@pytest.mark.slow
def test_utility_is_the_accuracy_of_the_defended_training(sweep, blobs):
  cfg = config.UtilityConfig(model="mlp-16", epochs=2, batch_size=16, lr=0.1, momentum=0.9)
  none = sweep.utility("none", blobs, cfg, seed=0)
  assert none["accuracy"] > 0.95 and not none["diverged"] and len(none["train_loss"]) == 2
  # The same as training by hand from the documented model and key.
  key = jax.random.key(0)
  model = models.create("mlp-16", key, input_shape=(4, 4, 1), num_classes=3)
  variables, _ = training.train_fedsgd(model.apply_fn, model.variables, blobs.train.x, blobs.train.y,
                                       key=jax.random.fold_in(key, 1), epochs=2, batch_size=16,
                                       learning_rate=0.1, momentum=0.9)
  assert none["accuracy"] == training.evaluate(model.apply_fn, variables, blobs.test.x, blobs.test.y)
  # A zero-strength defense changes nothing; clipping every update to norm 1e-6 leaves the model as
  # it was. (Noise is a poor destroyer here: with large weights the gradients grow with the noise.)
  same = sweep.utility("prune:0.0", blobs, cfg)
  assert same["accuracy"] == none["accuracy"] and same["train_loss"] == none["train_loss"]
  frozen = sweep.utility("clip:1e-6", blobs, cfg)
  initial = training.evaluate(model.apply_fn, model.variables, blobs.test.x, blobs.test.y)
  assert frozen["accuracy"] == initial < 0.7
  with pytest.raises(ValueError, match="unknown defense"):
    sweep.utility("blur:3", blobs, cfg)


def test_check_utility(sweep, blobs):
  sweep.check_utility(blobs, config.UtilityConfig(model="mlp"))
  for cfg, message in [(config.UtilityConfig(model="alexnet"), "unknown model"),
                       (config.UtilityConfig(batch_size=241), "batch size"),
                       (config.UtilityConfig(momentum=1.0), "momentum")]:
    with pytest.raises(ValueError, match=message):
      sweep.check_utility(blobs, cfg)


def _table(psnr, accuracy=None):
  rows = [{"defense": f"d{i}", "summary": {"psnr": {"mean": p}}} for i, p in enumerate(psnr)]
  if accuracy is not None:
    for row, a in zip(rows, accuracy):
      row["utility"] = {"accuracy": a}
  return rows


SVG = {"s": "http://www.w3.org/2000/svg"}


def _panels(document):
  """The nested panels of the plot: (bar heights read against the y tick labels, bar hatching,
  dashed lines' y values) for the bars; (x, y) of each point for the scatter."""
  import xml.etree.ElementTree as ET
  out = []
  for panel in ET.fromstring(document).findall("s:svg", SVG):
    ticks = [(float("".join(t.itertext())), float(t.get("y")) - 3.5)
             for t in panel.findall("s:text", SVG) if t.get("class") == "ytick"]
    (v0, y0), (v1, y1) = ticks[0], ticks[-1]
    value = lambda y: v0 + (v1 - v0) * (y - y0) / (y1 - y0)  # noqa: E731
    bars = [r for r in panel.findall("s:rect", SVG) if "bar" in (r.get("class") or "")]
    if bars:
      out.append(([value(float(b.get("y"))) for b in bars], ["hatched" in b.get("class") for b in bars],
                  [value(float(l.get("y1"))) for l in panel.findall("s:line", SVG)
                   if l.get("class") == "threshold"]))
    else:
      xt = [(float("".join(t.itertext())), float(t.get("x")))
            for t in panel.findall("s:text", SVG) if t.get("class") == "xtick"]
      (u0, x0), (u1, x1) = xt[0], xt[-1]
      out.append([(u0 + (u1 - u0) * (float(c.get("cx")) - x0) / (x1 - x0), value(float(c.get("cy"))))
                  for c in panel.findall("s:circle", SVG)])
  return out


def test_privacy_utility_plot(sweep):
  ((heights, hatched, thresholds),) = _panels(
      sweep.privacy_utility_plot(_table([20.0, 40.0]), 30.0, "dlg"))
  assert heights == pytest.approx([20.0, 40.0], abs=0.01) and hatched == [False, False]
  assert thresholds == pytest.approx([30.0], abs=0.01)
  bars, points = _panels(sweep.privacy_utility_plot(_table([20.0, 40.0], [0.9, None]), 30.0, "dlg"))
  assert bars[0] == pytest.approx([20.0, 40.0], abs=0.01)
  # One point per defense with a utility (None: the utility run diverged), at (PSNR, accuracy).
  assert len(points) == 1 and points[0] == pytest.approx((20.0, 0.9), abs=0.01)


def run_sweep(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "gradjax", "defense-sweep", *args],
                        capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_program_with_utility(tmp_path):
  proc = run_sweep("--defenses=none;clip:1e-6", "--count=1", "--iterations=5", "--image_size=16",
                   "--utility", "--config.utility.model=mlp",
                   "--config.utility.dataset=lfw_subset", "--config.utility.data_seed=0",
                   "--config.utility.train_count=150", "--config.utility.test_count=50",
                   "--config.utility.epochs=2", f"--output_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((tmp_path / "results.json").read_text())
  acc = [row["utility"]["accuracy"] for row in result["table"]]
  assert acc[0] > 0.8 and acc[1] < 0.7
  assert result["utility_config"]["dataset"] == "lfw_subset"
  md = (tmp_path / "results.md").read_text()
  assert "utility acc. |" in md and f"| {acc[0]:.3f} |" in md
  bars, points = _panels((tmp_path / "privacy_utility.svg").read_text())  # two panels
  assert len(bars[0]) == 2 and len(points) == 2
  bad = run_sweep("--defenses=none", "--count=1", "--utility",
                  "--config.utility.model=alexnet", "--config.utility.dataset=lfw_subset",
                  "--config.utility.train_count=100", "--config.utility.test_count=50", f"--output_dir={tmp_path / 'bad'}")
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert bad.returncode == 2 and len(errors) == 1 and "unknown model" in errors[0], bad.stderr[-2000:]
  bad = run_sweep("--defenses=none", "--count=1", "--config.defense.dp_sgd_max_norm=1",
                  f"--output_dir={tmp_path / 'dp'}")
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert bad.returncode == 2 and len(errors) == 1 and "DP-SGD under every row" in errors[0], bad.stderr[-2000:]


def test_the_plot_shows_each_defense_s_stronger_attack(sweep):
  table = _table([20.0, 40.0, 10.0])
  table[0]["adaptive"] = {"summary": {"psnr": {"mean": 25.0}}}  # stronger than the plain attack
  table[1]["adaptive"] = {"summary": {"psnr": {"mean": 35.0}}}  # weaker
  assert [sweep.stronger(r) for r in table] == ["adaptive", "plain", "plain"]
  ((heights, hatched, _),) = _panels(sweep.privacy_utility_plot(table, 30.0, "dlg"))
  assert heights == pytest.approx([25.0, 40.0, 10.0], abs=0.01) and hatched == [True, False, False]


@pytest.mark.slow
def test_program_with_the_adaptive_attack(tmp_path):
  """--config.attack.adaptive=True: every defense's row attacked plainly and adapted to it on the same images; the
  adapted attack's PSNR recomputed from its saved reconstruction (scikit-image); each row's and
  variant's PSNR, SSIM and recognisable images recomputed from the saved images (scikit-image, the
  verdict's rule written out), its verdicts by status counted from the items; the header names the
  attack's budget."""
  import skimage.metrics
  proc = run_sweep("--defenses=none;prune:0.5", "--count=2", "--iterations=200", "--image_size=16",
                   "--config.attack.adaptive=True", "--lpips=none", f"--output_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  none, pruned = json.loads((tmp_path / "results.json").read_text())["table"]
  assert "adaptive" not in none and none["stronger"] == "plain"
  item = json.loads((tmp_path / "items" / "prune_0.5_adaptive_0.json").read_text())
  assert item["attack"]["name"] == "dlg+adaptive" and item["attack"]["distance"] == "euclidean|prune:0.5"
  assert item["adaptation"] and item["config"]["attack"]["adaptive"] and item["config"]["defense"][
      "spec"] == "prune:0.5"
  plain = json.loads((tmp_path / "items" / "prune_0.5_0.json").read_text())
  assert plain["adaptation"] is None and plain["attack"]["name"] == "dlg"
  saved = np.load(tmp_path / "items" / "prune_0.5_adaptive_0.npz")
  want = skimage.metrics.peak_signal_noise_ratio(saved["ground_truth"].astype(np.float64),
                                                 saved["reconstruction"].astype(np.float64),
                                                 data_range=1.0)
  assert pruned["adaptive"]["psnr_per_image"][0] == pytest.approx(want, abs=1e-3)
  want_stronger = ("adaptive" if pruned["adaptive"]["summary"]["psnr"]["mean"]
                   > pruned["summary"]["psnr"]["mean"] else "plain")
  assert pruned["stronger"] == want_stronger
  table = (tmp_path / "results.md").read_text()
  assert "adaptive PSNR (dB)" in table and table.startswith("# dlg (200 iterations, 1 restart)")
  # The configuration it wrote runs it again, adapted rows included.
  assert json.loads((tmp_path / "results.json").read_text())["config"]["attack"]["adaptive"] is True
  assert "c.attack.adaptive = True" in (tmp_path / "config.py").read_text()
  found = []  # (recognisable, images) of every row and variant
  for row in (none, pruned):
    cells = []
    for variant, summary in (("", row["summary"]), ("_adaptive", (row.get("adaptive") or {}).get("summary"))):
      if summary is None:
        continue
      psnr, ssim, recognisable, statuses = [], [], 0, []
      for i in range(2):
        name = f"{row['defense'].replace(':', '_')}{variant}_{i}"
        saved = np.load(tmp_path / "items" / f"{name}.npz")
        gt, rec = saved["ground_truth"].astype(np.float64), saved["reconstruction"].astype(np.float64)
        for g, r in zip(gt, rec):
          p = skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1.0)
          q = skimage.metrics.structural_similarity(g, r, data_range=1.0, channel_axis=-1)
          flat = skimage.metrics.peak_signal_noise_ratio(g, np.broadcast_to(g.mean((0, 1)), g.shape),
                                                         data_range=1.0)
          psnr.append(p), ssim.append(q)
          recognisable += p >= flat + 1 and (p >= 20 or q >= 0.5)
        statuses.append(json.loads((tmp_path / "items" / f"{name}.json").read_text())["verdict"]["status"])
      assert summary["psnr"]["mean"] == pytest.approx(np.mean(psnr), abs=1e-3)
      assert summary["psnr"]["std"] == pytest.approx(np.std(psnr), abs=1e-3)
      assert summary["ssim"]["mean"] == pytest.approx(np.mean(ssim), abs=1e-4)
      counts = [statuses.count(s) for s in ("leak", "no_leak_found", "inconclusive")]
      assert (summary["recognisable"], summary["images"]) == (recognisable, 2)
      assert [summary["leaks"], summary["no_leak_found"], summary["inconclusive"]] == counts
      found.append((recognisable, 2))
      cells += [f"{np.mean(psnr):.2f} ± {np.std(psnr):.2f}",
                f"{recognisable}/2 | {counts[0]} / {counts[1]} / {counts[2]} of 2"]
    assert all(cell in table for cell in cells), (cells, table)
  recognised, images = map(sum, zip(*found))
  assert 0 < recognised < images  # some images recognisable and some not: the counts mean something
  bad = subprocess.run([sys.executable, "-m", "gradjax", "reconstruct", "--config.attack.adaptive=True",
                        f"--output_dir={tmp_path / 'bad'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert bad.returncode == 2 and len(errors) == 1 and "--config.attack.adaptive=True adapts the attack" in errors[0]
