"""The DP-SGD study's table: DLG against a DP-SGD client (each example's gradient clipped to C = 1
over all parameters, then N(0, σ²C²) on the sum) on DLG's LeNet (U(-0.5, 0.5), a fresh model per
image) at batch 1, CIFAR-10 test images 500-515 in [0, 1], 2000 L-BFGS iterations; for each noise
multiplier σ the plain attack and the one adapted to the client (``--config.attack.adaptive=True``:
its dummy gradient clipped as the client's, the layers weighed by their signal share under the
noise), beside the client's (ε, δ = 1e-5) for the one update attacked and for an epoch of DP-SGD
training on CIFAR-10's 50 000 images at batch 256 (gradjax.privacy).

  python experiments/studies/dp_sgd/noise.py            # runs what is missing, writes the table
  python experiments/studies/dp_sgd/noise.py --table    # the table from the runs there
  python experiments/studies/dp_sgd/noise.py --rows=none,clip_plain   # some rows only

Each row is a ``gradjax sweep`` (its command in the run's results.json) into ``runs/noise/<row>/``;
``table.md`` and ``table.json`` give per row the mean and median PSNR, the images recognisable by the
verdict's rule, the leak verdicts and the seconds per image. No setting was chosen on these images.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "batches"))
import sweeps  # noqa: E402  (the batches study's sweep runner and verdict recount)

from gradjax import privacy  # noqa: E402

RUNS = os.path.join(HERE, "runs", "noise")
MAX_NORM, START, COUNT, DELTA = 1.0, 500, 16, 1e-5
EPOCH = (256 / 50_000, 50_000 // 256)  # (sampling rate, steps) of one epoch at batch 256
SIGMAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)



def tag(sigma: float) -> str:
  """A noise multiplier as a row name takes it, without a dot (study.json's paths split at dots):
  1e-4, 1."""
  return f"{sigma:.0e}".replace("e-0", "e-").replace("e+00", "")


# (row, noise multiplier or None for no DP-SGD, adapted)
ROWS = [("none", None, False), ("clip_plain", 0.0, False), ("clip_adaptive", 0.0, True)] + [
    (f"sigma_{tag(s)}_{'adaptive' if a else 'plain'}", s, a) for s in SIGMAS for a in (False, True)]


def run(row, sigma, adapted, data_dir):
  flags = ["--attack=dlg", "--model=lenet_zhu", "--dataset=cifar10", "--batch_size=1",
           f"--start={START}", f"--count={COUNT}", "--iterations=2000"]
  if sigma is not None:
    flags += [f"--config.defense.dp_sgd_max_norm={MAX_NORM:g}",
              f"--config.defense.dp_sgd_noise_multiplier={sigma:g}"]
  if adapted:
    flags.append("--config.attack.adaptive=True")
  sweeps.sweep(os.path.join(RUNS, row), flags, data_dir)


def epsilons(sigma: float | None) -> tuple[float, float]:
  """(ε of the one update, ε of an epoch at batch 256), δ = 1e-5; inf without noise."""
  if not sigma:
    return float("inf"), float("inf")
  return (privacy.epsilon(1.0, sigma, 1, DELTA).epsilon,
          privacy.epsilon(EPOCH[0], sigma, EPOCH[1], DELTA).epsilon)


def table() -> tuple[str, dict]:
  """The table (markdown) and its numbers by row."""
  numbers = {}
  lines = ["| DP-SGD (C = 1) | attack | ε, this update | ε, an epoch at batch 256 | PSNR mean (dB) | "
           "median | recognisable (verdict's rule) | leak verdicts | s per image |",
           "|---|---|---|---|---|---|---|---|---|"]
  for row, sigma, adapted in ROWS:
    rows = sweeps.rows(RUNS, row)
    if rows is None:
      continue
    psnr = np.array([p for r in rows for p in r["psnr_per_image"]])
    counted = [sweeps.recount(r) for r in rows]
    seen, leaks = sum(c[0] for c in counted), sum(c[1] for c in counted)
    seconds = float(np.mean([r["wall_time_s"] for r in rows]))
    one, epoch = epsilons(sigma)
    finite = lambda e: None if e == float("inf") else e  # None: no noise, no guarantee
    numbers[row] = {"noise_multiplier": sigma, "adaptive": adapted, "epsilon_update": finite(one),
                    "epsilon_epoch": finite(epoch), "psnr_mean": float(psnr.mean()),
                    "psnr_median": float(np.median(psnr)), "recognisable": int(seen),
                    "images": int(psnr.size), "leaks": int(leaks), "seconds_per_image": seconds}
    dp = "none" if sigma is None else "clipping only" if sigma == 0 else f"σ = {sigma:g}"
    cell = lambda e: "∞" if e == float("inf") else f"{e:.3g}"
    lines.append(f"| {dp} | {'adapted' if adapted else 'plain'} | {cell(one)} | {cell(epoch)} | "
                 f"{psnr.mean():.2f} | {np.median(psnr):.2f} | {seen} / {psnr.size} | "
                 f"{leaks} / {len(rows)} | {seconds:.1f} |")
  return "\n".join(lines) + "\n", numbers


if __name__ == "__main__":
  sweeps.main(__doc__, RUNS, ROWS, run, table)
