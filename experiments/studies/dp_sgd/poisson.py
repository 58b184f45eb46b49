"""The DP-SGD study's Poisson table: how far a FedAvg client's update under Poisson sampling (Opacus'
default: each local step draws each example at rate q and divides by qn) lies from what a server
can replay without the draws, the steps' expectation over them (every step the clipped mean over all
n examples: ``gradjax.objectives.Replay(sampling_rate=q)``), at the client's own data.

Inverting Gradients' FedAvg setting at a width one core can afford (``convnet-16``, Flax's default
init, a fresh draw per client; CIFAR-10 normalised; local learning rate 1e-4, no momentum), four
clients of four CIFAR-10 test images each (500-515), DP-SGD's clipping at C = half the median of
the client's examples' gradient norms at the sent weights (some clipped, some not), no noise; local
mini-batches of B = 2 or 1 (q = B/n, as Opacus sets it), one or five epochs. For each client and
setting, 16 draws (keys 0-15): the update W_0 − W_T of the client's draws against the expected replay's, as the verdict
compares them (``gradjax.verdict.residual``'s relative error at the best common scale, and the
cosine). A replay attack cannot match the update closer than this at the client's own images.

  python experiments/studies/dp_sgd/poisson.py --data_dir=../shared/data   # runs/poisson/table.{md,json}
"""

import argparse
import json
import os
import time

import jax
import numpy as np

from gradjax import clients, data, fidelity, models

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "poisson")
START, CLIENTS, N, DRAWS, LR, MODEL = 500, 4, 4, 16, 1e-4, "convnet-16"
SETTINGS = [(2, 1), (2, 5), (1, 1), (1, 5)]  # (local batch B, epochs E)


def bound(model, x, y) -> float:
  """C: half the median of the client's examples' gradient norms at the sent weights."""
  norms = []
  for i in range(x.shape[0]):
    g = clients.fedsgd(model.apply_fn, model.variables, x[i:i + 1], y[i:i + 1]).gradient
    norms.append(float(np.sqrt(sum(np.sum(np.asarray(a, np.float64) ** 2) for a in jax.tree.leaves(g)))))
  return 0.5 * float(np.median(norms))


def update(model, x, y, local, dp_sgd, **kwargs):
  new = clients.local_sgd(model.apply_fn, model.variables, x, y, local, dp_sgd=dp_sgd, **kwargs)
  return jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                      model.variables["params"], new)


def compare(u, c):
  """(relative error at the best common scale α* = ⟨u, c⟩/‖u‖², cosine): the verdict's reading."""
  unscaled = fidelity.compare(u, c)
  alpha = unscaled.cosine * unscaled.scale
  scaled = fidelity.compare(jax.tree.map(lambda a: alpha * a, u), c)
  return scaled.relative_error, unscaled.cosine


def measure(data_dir: str) -> dict:
  norm = data.normalization("cifar10")
  batch = data.load("cifar10", data_dir=data_dir, indices=list(range(START, START + CLIENTS * N)))
  x_all = np.asarray(data.normalize(batch.x, norm), np.float32)
  out = {}
  for b, epochs in SETTINGS:
    local = clients.LocalTraining(epochs=epochs, batch_size=b, learning_rate=LR)
    q = b / N
    errors, cosines, empty, started = [], [], 0, time.time()
    for k in range(CLIENTS):
      model = models.create(MODEL, jax.random.key(k), input_shape=(32, 32, 3))
      x, y = x_all[k * N:(k + 1) * N], batch.y[k * N:(k + 1) * N]
      dp = clients.DPSGD(bound(model, x, y), 0.0, q)
      steps = local.steps(N)
      expected = update(model, x, y, local, dp, draws=clients.expected_draws(local, N, q))
      for r in range(DRAWS):
        key = jax.random.key(r)
        empty += int(np.sum(~clients.drawn(dp, key, N, steps).any(axis=1)))
        e, cos = compare(expected, update(model, x, y, local, dp, key=key))
        errors.append(e)
        cosines.append(cos)
    out[f"b{b}_e{epochs}"] = {
        "local_batch": b, "epochs": epochs, "sampling_rate": q, "steps": local.steps(N),
        "draws": len(errors), "relative_error_mean": float(np.mean(errors)),
        "relative_error_median": float(np.median(errors)),
        "relative_error_min": float(np.min(errors)), "relative_error_max": float(np.max(errors)),
        "cosine_mean": float(np.mean(cosines)), "empty_steps": empty,
        "seconds": time.time() - started}
    print(f"B = {b}, {epochs} epochs: {time.time() - started:.0f} s", flush=True)
  return out


def table(numbers: dict) -> str:
  lines = ["| local batch B | epochs | q | steps | draws | relative error, mean | median | min | max | "
           "cosine, mean | empty steps |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in numbers.values():
    lines.append(f"| {row['local_batch']} | {row['epochs']} | {row['sampling_rate']:g} | {row['steps']} | "
                 f"{row['draws']} | {row['relative_error_mean']:.3f} | {row['relative_error_median']:.3f} | "
                 f"{row['relative_error_min']:.3f} | {row['relative_error_max']:.3f} | "
                 f"{row['cosine_mean']:.3f} | {row['empty_steps']} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None, help="the folder holding cifar10/ (../shared/data)")
  args = parser.parse_args()
  os.makedirs(RUNS, exist_ok=True)
  numbers = measure(args.data_dir)
  numbers["provenance"] = {"command": "python experiments/studies/dp_sgd/poisson.py"
                           + (f" --data_dir={args.data_dir}" if args.data_dir else ""),
                           "jax": jax.__version__, "device": str(jax.devices()[0]),
                           "date": time.strftime("%Y-%m-%d", time.gmtime())}
  with open(os.path.join(RUNS, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(numbers, fh, indent=1)
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(table({k: v for k, v in numbers.items() if k != "provenance"}))
  print(table({k: v for k, v in numbers.items() if k != "provenance"}))


if __name__ == "__main__":
  main()
