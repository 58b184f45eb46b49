"""Batches through a ReLU dense layer: gradjax's exclusive_neurons (gradjax.analytic) against an
untrained MLP (flatten - Dense(W) - ReLU - Dense(10), Flax's default init, a fresh model per
batch) on CIFAR-10 test images, inputs in [0, 1] or normalised with CIFAR-10's statistics.

  python experiments/studies/batches/exclusive_neurons.py            # runs what is missing, writes the table
  python experiments/studies/batches/exclusive_neurons.py --table    # the table from the runs there

Each row is a ``gradjax sweep`` of this folder's ``mlp.py`` (its command is in the run's
results.json) into ``runs/exclusive_neurons/<row>/``; the table, ``runs/exclusive_neurons/table.md`` (its numbers in ``table.json``),
gives per row the batches, the images recovered (PSNR >= 30 dB after the optimal assignment), the
labels recovered, the verdicts and the seconds per batch. Each run keeps results.json (per batch: the
per-image scores, the separation's rank, rounds and residual), results.md, psnr.svg and, for the rows
in FIGURES, reconstructions.png. Rows: the development images 0-499 (where
the acceptance tolerance was chosen, on images 0-127) and the unseen images from 500 on.
"""

import os

import sweeps

RUNS = os.path.join(sweeps.HERE, "runs", "exclusive_neurons")
# The rows whose reconstructions.png is kept (the others' are a few MB together and say the same).
FIGURES = ("mlp1024_none_b32_unseen", "mlp1024_cifar10_b16_unseen", "mlp1024_none_b128_unseen")
CONFIG = os.path.join("experiments", "studies", "batches", "mlp.py")

# (row, width, normalisation, batch size, first image, batches)
ROWS = [(f"mlp{w}_{norm}_b{b}_{part}", w, norm, b, start, count)
        for w, norm in ((1024, "none"), (1024, "cifar10"), (256, "none"))
        for b, dev, unseen in ((8, 5, 5), (16, 5, 5), (32, 5, 3), (64, 5, 1), (128, 3, 1))
        for part, start, count in (("dev", 0, dev), ("unseen", 500, unseen))
        if not (w == 256 and b == 128)]


def run(row, width, norm, batch, start, count, data_dir):
  sweeps.sweep(os.path.join(RUNS, row), [f"--config={CONFIG}", f"--config.model.name=mlp-{width}",
                                         f"--normalization={norm}", f"--batch_size={batch}",
                                         f"--start={start}", f"--count={count}"], data_dir,
               ("reconstructions.png",) if row in FIGURES else ())


def table() -> tuple[str, dict]:
  """The table (markdown) and its numbers by row ({row: {recovered, images, share, ...}})."""
  numbers = {}
  lines = ["| width | normalisation | batch | images | batches | recovered (PSNR >= 30 dB) | PSNR min (dB) "
           "| labels | verdict leak | rounds, median | s per batch |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for row, width, norm, batch, start, count in ROWS:
    rows = sweeps.rows(RUNS, row)
    if rows is None:
      continue
    psnr = [p for r in rows for p in r["psnr_per_image"]]
    found = sum(p >= 30 for p in psnr)
    labels = sum(r["label_accuracy"] * batch for r in rows)
    leaks = sum((r.get("verdict") or {}).get("status") == "leak" for r in rows)
    rounds = sorted(r["iterations"] for r in rows)[len(rows) // 2]
    seconds = sum(r["wall_time_s"] for r in rows) / len(rows)
    last = start + batch * len(rows) - 1
    numbers[row] = {"recovered": int(found), "images": len(psnr), "share": found / len(psnr),
                    "labels": int(round(labels)), "leaks": int(leaks), "batches": len(rows),
                    "seconds_per_batch": seconds}
    lines.append(f"| {width} | {norm} | {batch} | {start}..{last} | {len(rows)} | {found} / {len(psnr)} | "
                 f"{min(psnr):.1f} | {labels:.0f} / {len(psnr)} | {leaks} / {len(rows)} | {rounds} | "
                 f"{seconds:.1f} |")
  return "\n".join(lines) + "\n", numbers


if __name__ == "__main__":
  sweeps.main(__doc__, RUNS, ROWS, run, table)
