"""Does max pooling defeat gradient matching on Geiping et al.'s ConvNet? The same untrained ConvNet-16
(one draw per image, the same weights for both poolings) with its two 3x3 max-pools, and with
average pools in their place (``ConvNet(pool="avg")``), each client sending the FedSGD gradient of
one CIFAR-10 test image in [0, 1] (evaluation mode); iDLG (Euclidean, the label read off the head's
gradient, 2000 iterations, ``presets.idlg``) with L-BFGS at a fixed step (``lbfgs_fixed``, as the
Euclidean rows of ig_table1; the line-search L-BFGS takes minutes an image here) attacks each.

  python experiments/studies/batches/pooling.py --data_dir=../shared/data

Per image: PSNR after the attack and the relative residual of the reconstruction's gradient
(``verdict.residual``: 0 when the attack matched the update). Images 0-3 (development: where the
question came up) and 500-503 (unseen). Writes runs/pooling/table.md and table.json.
"""

import argparse
import dataclasses
import os
import time

import jax
import numpy as np

from gradjax import attacks, clients, data, metrics, models, optimizers, presets, verdict

import sweeps

ATTACK = dataclasses.replace(presets.idlg(), optimizer=optimizers.Named("lbfgs_fixed", 1.0))

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "pooling")
IMAGES = (0, 1, 2, 3, 500, 501, 502, 503)


def attack(pool: str, index: int, batch) -> dict:
  module = models.get_module("convnet-16", num_classes=10).clone(pool=pool)
  key = jax.random.fold_in(jax.random.key(0), index)
  variables = module.init(key, np.zeros((1, 32, 32, 3), np.float32), train=False)
  apply_fn = models.make_apply_fn(module)
  observation = clients.fedsgd(apply_fn, variables, batch.x, batch.y)
  start = time.perf_counter()
  rec = attacks.reconstruct(ATTACK, apply_fn, observation, jax.random.key(1), input_shape=(32, 32, 3),
                            bounds=(0.0, 1.0))
  seconds = time.perf_counter() - start
  scores = metrics.score(rec.x, batch.x, rec.labels, batch.y)
  residual = verdict.residual(apply_fn, observation, {"x": rec.x}, rec.labels)
  return {"pool": pool, "index": index, "psnr": float(scores["psnr"]),
          "residual": float(residual.relative_error), "cosine": float(residual.cosine), "seconds": seconds}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  rows = []
  for index in IMAGES:
    batch = data.load("cifar10", data_dir=args.data_dir, indices=[index])
    for pool in ("max", "avg"):
      rows.append(attack(pool, index, batch))
      print(rows[-1], flush=True)
  lines = ["| images | pooling | PSNR per image (dB) | mean | relative residual, median | s per image |",
           "|---|---|---|---|---|---|"]
  summary = {}
  for images, name in (((0, 1, 2, 3), "0..3"), ((500, 501, 502, 503), "500..503")):
    for pool in ("max", "avg"):
      mine = [r for r in rows if r["pool"] == pool and r["index"] in images]
      psnr = [r["psnr"] for r in mine]
      residual = float(np.median([r["residual"] for r in mine]))
      summary[f"{pool}_{name}"] = {"psnr_mean": float(np.mean(psnr)), "residual_median": residual}
      lines.append(f"| {name} | {pool} | {', '.join(f'{p:.1f}' for p in psnr)} | {np.mean(psnr):.2f} | "
                   f"{residual:.3f} | {np.mean([r['seconds'] for r in mine]):.0f} |")
  print("\n".join(lines))
  sweeps.write_table(RUNS, "\n".join(lines) + "\n", {"rows": rows, "summary": summary, "jax": jax.__version__})


if __name__ == "__main__":
  main()
