"""How low LPIPS goes for images that have nothing to do with each other, by image size: whether
LPIPS <= 0.2 (the verdict's threshold) or <= 0.3 (the issue's bar) is evidence of a recognisable
reconstruction.

  python experiments/studies/batches/lpips_chance.py --data_dir=../shared/data

LPIPS with AlexNet's features (gradjax.lpips, the lpips extra's weights), images in [0, 1]:
* CIFAR-10 test images 500-563 at 32 px, each against 7 others (the batch rolled by 1..7): unrelated
  pairs; and each against its own mean colour, its Gaussian blur (sigma 2 and 3 pixels) and its mean
  colour plus white noise of standard deviation 0.2, with the PSNR of each.
* The 16 scikit-image photos resized to 32, 48, 64, 96 and 128 px, each against the 15 others.
Writes runs/lpips_chance/table.md and table.json.
"""

import argparse
import os

import numpy as np
from scipy import ndimage

from gradjax import data, lpips

import sweeps

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "lpips_chance")


def _row(name, d, psnr=None):
  return {"pairs": name, "n": int(d.size), "median": float(np.median(d)), "min": float(d.min()),
          "at_most_0_2": float(np.mean(d <= 0.2)), "at_most_0_3": float(np.mean(d <= 0.3)),
          "psnr_mean": None if psnr is None else float(np.mean(psnr))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  metric = lpips.load("alex")
  rows = []
  x = data.load("cifar10", data_dir=args.data_dir, indices=range(500, 564)).x.astype(np.float32)
  others = np.concatenate([lpips.distance(metric, np.roll(x, k, axis=0), x) for k in range(1, 8)])
  rows.append(_row("CIFAR-10 500-563, 32 px: another test image", others))
  psnr = lambda y: -10 * np.log10(np.mean((y - x) ** 2, axis=(1, 2, 3)))
  mean = np.broadcast_to(x.mean(axis=(1, 2), keepdims=True), x.shape).astype(np.float32)
  noise = np.clip(mean + 0.2 * np.random.default_rng(0).standard_normal(x.shape), 0, 1).astype(np.float32)
  candidates = {"its mean colour": mean, "its mean colour + noise (sd 0.2)": noise}
  for sigma in (2, 3):
    candidates[f"its blur (sigma {sigma} px)"] = np.stack(
        [ndimage.gaussian_filter(im, sigma=(sigma, sigma, 0)) for im in x]).astype(np.float32)
  for name, y in candidates.items():
    rows.append(_row(f"CIFAR-10 500-563, 32 px: {name}", lpips.distance(metric, y, x), psnr(y)))
  for side in (32, 48, 64, 96, 128):
    p = data.load("skimage", indices=range(16), image_size=(side, side)).x.astype(np.float32)
    d = np.concatenate([lpips.distance(metric, np.roll(p, k, axis=0), p) for k in range(1, 16)])
    rows.append(_row(f"scikit-image photos, {side} px: another photo", d))
  lines = ["| pairs | n | LPIPS median | min | share <= 0.2 | share <= 0.3 | PSNR mean (dB) |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    psnr_text = "–" if r["psnr_mean"] is None else f"{r['psnr_mean']:.1f}"
    lines.append(f"| {r['pairs']} | {r['n']} | {r['median']:.3f} | {r['min']:.3f} | {r['at_most_0_2']:.2f} | "
                 f"{r['at_most_0_3']:.2f} | {psnr_text} |")
  print("\n".join(lines))
  sweeps.write_table(RUNS, "\n".join(lines) + "\n", {"rows": rows})


if __name__ == "__main__":
  main()
