"""Batches on DLG's LeNet with and without head features: Inverting Gradients with TV 0.2 (``lenet.py``)
and the same attack pulling each image's head input towards its label's row of the head's gradient
(``--head_features=100``, gradjax.analytic.head_inputs), CIFAR-10 test images, labels known, one
core, 2000 iterations, a fresh model per batch.

  python experiments/studies/batches/head_features.py            # runs what is missing, writes the table
  python experiments/studies/batches/head_features.py --table    # the table from the runs there

The weight 100 was chosen on images 0-39 (batch 4, ten batches: mean PSNR 14.48 dB without, 16.93 /
17.43 / 17.16 with 30 / 100 / 300). Rows: images 900.. (the issue's comparison with breaching 0.1.2,
which reports 17.8 dB at batch 4 and 15.1 at batch 8 there) and the unseen images 500-599, each at
batch 4 and 8, with and without. Each row is a ``gradjax sweep`` into ``runs/head_features/<row>/``;
``table.md`` and ``table.json`` give per row the mean and median per-image PSNR, the images
recognisable by the verdict's rule, the leak verdicts and the seconds per batch.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
RUNS = os.path.join(HERE, "runs", "head_features")
CONFIG = os.path.join("experiments", "studies", "batches", "lenet.py")
WEIGHT = 100.0

# (row, batch size, first image, batches, head-feature weight)
ROWS = [(f"b{b}_{start}_{'hf' if w else 'plain'}", b, start, count, w)
        for b, count in ((4, 5), (8, 5)) for start in (900, 500) for w in (0.0, WEIGHT)]


def run(row, batch, start, count, weight, data_dir):
  out = os.path.join(RUNS, row)
  if os.path.exists(os.path.join(out, "results.json")):
    return
  command = ["gradjax", "sweep", f"--config={CONFIG}", f"--head_features={weight:g}",
             f"--batch_size={batch}", f"--start={start}", f"--count={count}",
             f"--output_dir={os.path.relpath(out, ROOT)}"]
  if data_dir:
    command.append(f"--data_dir={data_dir}")
  print(" ".join(command), flush=True)
  subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  os.remove(os.path.join(out, "config.py"))  # the command is in results.json
  shutil.rmtree(os.path.join(out, "items"))  # per-experiment arrays and histories


def table() -> tuple[str, dict]:
  """The table (markdown) and its numbers by row."""
  numbers = {}
  lines = ["| batch | images | head features | PSNR per image, mean (dB) | median | SSIM, mean | "
           "recognisable (verdict's rule) | leak verdicts | s per batch |",
           "|---|---|---|---|---|---|---|---|---|"]
  for row, batch, start, count, weight in ROWS:
    path = os.path.join(RUNS, row, "results.json")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as fh:
      rows = json.load(fh)["rows"]
    psnr = np.array([p for r in rows for p in r["psnr_per_image"]])
    ssim = np.array([s for r in rows for s in r["ssim_per_image"]])
    seen = sum(r["findings"]["images"]["recognisable"] for r in rows)
    leaks = sum(r["verdict"]["status"] == "leak" for r in rows)
    seconds = float(np.mean([r["wall_time_s"] for r in rows]))
    numbers[row] = {"psnr_mean": float(psnr.mean()), "psnr_median": float(np.median(psnr)),
                    "ssim_mean": float(ssim.mean()), "recognisable": int(seen), "images": int(psnr.size),
                    "leaks": int(leaks), "batches": len(rows), "seconds_per_batch": seconds}
    lines.append(f"| {batch} | {start}..{start + batch * len(rows) - 1} | {weight:g} | {psnr.mean():.2f} | "
                 f"{np.median(psnr):.2f} | {ssim.mean():.3f} | {seen} / {psnr.size} | {leaks} / {len(rows)} | "
                 f"{seconds:.1f} |")
  return "\n".join(lines) + "\n", numbers


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", action="store_true", help="only write the table from the runs there")
  parser.add_argument("--data_dir", default=None, help="where the CIFAR-10 files are (gradjax's default)")
  args = parser.parse_args()
  if not args.table:
    for spec in ROWS:
      run(*spec, args.data_dir)
  os.makedirs(RUNS, exist_ok=True)
  text, numbers = table()
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  with open(os.path.join(RUNS, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(numbers, fh, indent=1)
  print(f"wrote {os.path.relpath(os.path.join(RUNS, 'table.md'), ROOT)}")


if __name__ == "__main__":
  sys.exit(main())
