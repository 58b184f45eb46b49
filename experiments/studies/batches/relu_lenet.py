"""The batches study's ReLU rows: DLG's LeNet with ReLU (every weight U(-0.5, 0.5), a fresh model per
image) at batch 1, CIFAR-10 test images in [0, 1]: R-GAP's recursion (``--attack=rgap``,
gradjax.rgap) beside iDLG and Inverting Gradients with head features (``inverting_gradients_batch``,
2000 iterations), the attacks ``auto`` chose there before.

  python experiments/studies/batches/relu_lenet.py            # runs what is missing, writes the table
  python experiments/studies/batches/relu_lenet.py --table    # the table from the runs there
  python experiments/studies/batches/relu_lenet.py --rows=rgap_dev,rgap_unseen   # some rows only

Each row is a ``gradjax sweep`` (its command in the run's results.json) into
``runs/relu_lenet/<row>/``; ``table.md`` and ``table.json`` give per row the mean and median PSNR,
the images recognisable by the verdict's rule, the leak verdicts, the labels and the seconds per
image. R-GAP's TV weight (0.03) was chosen on images 0-2 (τ 0.01-0.1 within 1 dB there); images
500.. are unseen.
"""

import os

import numpy as np

import sweeps

RUNS = os.path.join(sweeps.HERE, "runs", "relu_lenet")

# (row, attack, first image, images, further flags)
ROWS = [("rgap_dev", "rgap", 0, 10, ()), ("rgap_unseen", "rgap", 500, 10, ()),
        ("idlg_unseen", "idlg", 500, 10, ()), ("igb_unseen", "inverting_gradients_batch", 500, 10, ()),
        # The optimisation attacks on the model rounded over the first half of the budget, then on
        # the model itself (--config.attack.smoothing=0.5, gradjax.objectives.Smoothing).
        ("idlg_smooth_unseen", "idlg", 500, 10, ("--config.attack.smoothing=0.5",)),
        ("igb_smooth_unseen", "inverting_gradients_batch", 500, 10, ("--config.attack.smoothing=0.5",))]


def run(row, attack, start, count, extra, data_dir):
  flags = [f"--attack={attack}", "--model=lenet_zhu", "--config.model.act=relu", "--dataset=cifar10",
           "--batch_size=1", f"--start={start}", f"--count={count}"]
  sweeps.sweep(os.path.join(RUNS, row),
               flags + (["--iterations=2000"] if attack == "idlg" else []) + list(extra), data_dir)


def table() -> tuple[str, dict]:
  """The table (markdown) and its numbers by row."""
  numbers = {}
  lines = ["| attack | images | PSNR mean (dB) | median | min | recognisable (verdict's rule) | "
           "leak verdicts | labels | s per image |", "|---|---|---|---|---|---|---|---|---|"]
  for row, attack, start, count, extra in ROWS:
    rows = sweeps.rows(RUNS, row)
    if rows is None:
      continue
    psnr = np.array([p for r in rows for p in r["psnr_per_image"]])
    counted = [sweeps.recount(r) for r in rows]
    seen = sum(c[0] for c in counted)
    leaks = sum(c[1] for c in counted)
    labels = sum(r["label_accuracy"] for r in rows)
    seconds = float(np.mean([r["wall_time_s"] for r in rows]))
    numbers[row] = {"psnr_mean": float(psnr.mean()), "psnr_median": float(np.median(psnr)),
                    "psnr_min": float(psnr.min()), "recognisable": int(seen), "images": int(psnr.size),
                    "leaks": int(leaks), "labels": float(labels), "seconds_per_image": seconds}
    images = f"{rows[0]['index']}..{rows[-1]['index']}"  # a skipped experiment leaves a gap
    name = attack + ("".join(f", {e[2:]}" for e in extra))
    lines.append(f"| {name} | {images} | {psnr.mean():.2f} | "
                 f"{np.median(psnr):.2f} | {psnr.min():.2f} | {seen} / {psnr.size} | {leaks} / {len(rows)} | "
                 f"{labels:.0f} / {len(rows)} | {seconds:.1f} |")
  return "\n".join(lines) + "\n", numbers


if __name__ == "__main__":
  sweeps.main(__doc__, RUNS, ROWS, run, table)
