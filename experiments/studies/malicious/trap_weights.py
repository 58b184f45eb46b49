"""Trap weights (after Boenisch et al., EuroS&P 2023; gradjax.malicious.trap_weights) in the first
layer of an MLP of 1024 units: examples recovered exactly by gradjax.analytic.exclusive_neurons,
against batch size and input normalisation, beside the honest model's rows of the batches study.

  python experiments/studies/malicious/trap_weights.py --data_dir=../shared/data

Each unit keeps a fresh Gaussian direction; its bias is set so that a share 1/N of the server's own
images (CIFAR-10 training images 0-1999, as the client's model reads them: in [0, 1] or normalised
with CIFAR-10's statistics) activate it. Clients: CIFAR-10 test images from 500 on, one batch per
row, FedSGD, a fresh MLP draw per row. Recovered exactly: a recovered input within PSNR 60 dB of the
example (in [0, 1], after undoing the normalisation). The client-side check (malicious.inspect) is
recorded per row. Writes runs/trap_weights/table.md and table.json.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from gradjax import analytic, clients, data, malicious, models

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "trap_weights")
sys.path.insert(0, HERE)
from imprint import FIRST, psnr_to_nearest  # noqa: E402

ROWS = [(f"{norm}_b{b}", norm, b) for norm in ("none", "cifar10") for b in (32, 64, 128)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  public = data.load("cifar10_train", data_dir=args.data_dir, indices=range(2000)).x
  stats = data.normalization("cifar10")
  mean, std = np.asarray(stats.mean, np.float32), np.asarray(stats.std, np.float32)
  records = {}
  for i, (row, norm, batch) in enumerate(ROWS):
    images = data.load("cifar10", data_dir=args.data_dir, indices=range(FIRST, FIRST + batch))
    seen = (lambda x: (x - mean) / std) if norm == "cifar10" else (lambda x: x)
    model = models.create("mlp-1024", jax.random.key(i), input_shape=images.x.shape[1:])
    sent = malicious.trap_weights(model, seen(public), 1 / batch, jax.random.key(100 + i))
    observation = clients.fedsgd(sent.apply_fn, sent.variables, seen(images.x), images.y)
    start = time.perf_counter()
    found = analytic.exclusive_neurons(observation, sent.apply_fn, images.x.shape[1:])
    seconds = time.perf_counter() - start
    inputs = np.asarray(found.inputs) * (std if norm == "cifar10" else 1) + (mean if norm == "cifar10" else 0)
    psnr = psnr_to_nearest(images.x, inputs)
    exact = int(np.sum(psnr >= 60))
    records[row] = {"normalisation": norm, "batch": batch, "exact": exact, "share": exact / batch,
                    "found": int(len(found.inputs)), "seconds": seconds,
                    "flagged": bool(malicious.inspect(sent.variables, model.variables))}
    print(row, exact, "/", batch, flush=True)
  os.makedirs(RUNS, exist_ok=True)
  with open(os.path.join(RUNS, "table.json"), "w") as f:
    json.dump(records, f, indent=1)
  lines = ["| inputs | batch | exact (PSNR >= 60 dB) | share | found | s | flagged by inspect |",
           "|---|---|---|---|---|---|---|"]
  for r in records.values():
    lines.append(f"| {'[0, 1]' if r['normalisation'] == 'none' else 'normalised'} | {r['batch']} | "
                 f"{r['exact']} / {r['batch']} | {r['share']:.2f} | {r['found']} | {r['seconds']:.1f} | "
                 f"{'yes' if r['flagged'] else 'no'} |")
  with open(os.path.join(RUNS, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
