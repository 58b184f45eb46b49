"""The Cocktail Party Attack (``--attack=cocktail_party``, gradjax.cocktail) against batch size, the
inputs' centring and the activation, beside exclusive neurons (gradjax.analytic) on the same updates.

  python experiments/studies/cocktail_party/separate.py

Clients: FedSGD on CIFAR-10 test images, consecutive batches from image 500 on (unseen: no setting
was chosen on them) and from image 0 on (development: the refinement's settings were chosen there), a
fresh model per row (``mlp-H`` drawn with Flax's default init, seed 0; ReLU unless the row says).
Inputs in [0, 1] (``none``) or normalised with CIFAR-10's constants (``cifar10``: centred). Each
example found is matched one to one to a true image by PSNR (NumPy, data range 1, images clipped
to [0, 1]; SciPy's assignment); an example counts as recognisable at 20 dB and as recovered at
30 dB. ``unmixed``: the same attack with no refinement round (FastICA's estimates scaled by their
bias coordinate). ``exclusive``: what :func:`gradjax.analytic.exclusive_neurons` recovers of the
same update (at 30 dB or more). Writes runs/separate/table.md and table.json.
"""

import argparse
import json
import os
import time

import jax
import numpy as np
import scipy.optimize

from gradjax import analytic, clients, cocktail, data, defenses, models

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "separate")


def _spec(name, model_name, act, norm_name, b, first, batches=None, **kw):
  return dict(name=name, model_name=model_name, act=act, norm_name=norm_name, b=b, first=first,
              batches=batches or max(1, 64 // b), **kw)


ROWS = ([_spec(f"b{b}_{n}", "mlp-1024", "relu", n, b, 500, batches=(64 if b < 64 else 256) // b)
         for n in ("none", "cifar10") for b in (8, 16, 32, 64, 128)]
        # Development: the refinement's step and share of units kept (the defaults, then others).
        + [_spec(f"dev_b{b}_cifar10{'_' * bool(o)}{'_'.join(f'{k}{v}' for k, v in o.items())}",
                 "mlp-1024", "relu", "cifar10", b, 0, batches=4, options=o)
           for b in (16, 64) for o in ({}, {"step": 0.3}, {"step": 0.5}, {"step": 1.0},
                                       {"keep": 0.25}, {"keep": 0.75}, {"keep": 1.0})]
        # Development: FastICA restarts, where a start decides (inputs in [0, 1]), and the
        # refinement's larger steps there.
        + [_spec(f"dev_b64_none{'_' * bool(o)}{'_'.join(f'{k}{v}' for k, v in o.items())}",
                 "mlp-1024", "relu", "none", 64, 0, batches=4, options=o)
           for o in ({}, {"restarts": 1}, {"step": 0.3}, {"step": 0.5})]
        # The development rows' best step (0.3) on the unseen batches of 64.
        + [_spec(f"b64_{n}_step0.3", "mlp-1024", "relu", n, 64, 500, batches=4, options={"step": 0.3})
           for n in ("none", "cifar10")]
        + [_spec("b16_cifar10_mlp-256", "mlp-256", "relu", "cifar10", 16, 500),
           _spec("b16_cifar10_mlp-256_sigmoid", "mlp-256", "sigmoid", "cifar10", 16, 500),
           _spec("b16_cifar10_mlp-32_sigmoid", "mlp-32", "sigmoid", "cifar10", 16, 500)]
        # Defenses on the update (gradjax.defenses): Gaussian noise of a variance, pruning.
        + [_spec(f"b16_cifar10_{d.replace(':', '')}", "mlp-1024", "relu", "cifar10", 16, 500, defense=d)
           for d in ("gaussian:1e-8", "gaussian:1e-6", "gaussian:1e-4", "prune:0.5", "prune:0.9")])


def _psnr_matched(found, truth):
  """Per true image, the PSNR of the found example assigned to it (one to one)."""
  f = found.reshape(len(found), -1)[:, None]
  t = truth.reshape(len(truth), -1)[None]
  table = 10 * np.log10(1.0 / np.maximum(np.mean((f - t) ** 2, axis=-1), 1e-30))  # (found, true)
  rows, cols = scipy.optimize.linear_sum_assignment(-table)
  out = np.full(len(truth), 0.0)
  out[cols] = table[rows, cols]
  return out, rows, cols


def _row(name, model_name, act, norm_name, b, first, batches, defense="none", options=None):
  norm = data.normalization(norm_name)
  lo, hi = (np.asarray(data.normalize(np.full((1, 1, 1, 3), v, np.float32), norm)).ravel()
            for v in (0.0, 1.0))
  psnrs, unmixed, labels, exclusive, residuals, rounds, restarts, seconds = [], [], [], [], [], [], [], []
  for i in range(batches):
    batch = data.load("cifar10", indices=range(first + i * b, first + (i + 1) * b))
    x = np.asarray(data.normalize(batch.x, norm), np.float32)
    model = models.create(model_name, jax.random.key(0), input_shape=x.shape[1:], num_classes=10,
                          act=act)
    obs = clients.fedsgd(model.apply_fn, model.variables, x, batch.y, share_labels=True)
    if defense != "none":
      obs = defenses.parse(defense).apply(obs, jax.random.key(i))
    truth = np.asarray(batch.x, np.float64)

    def images(found):
      return np.clip(np.asarray(data.denormalize(np.asarray(found, np.float32), norm), np.float64), 0, 1)

    start = time.perf_counter()
    found = cocktail.separate(obs, model.apply_fn, x.shape[1:], bounds=(lo, hi), **(options or {}))
    seconds.append(time.perf_counter() - start)
    p, rows, cols = _psnr_matched(images(found.inputs), truth)
    psnrs.extend(p)
    labels.extend(found.labels[rows] == np.asarray(batch.y)[cols])
    residuals.append(found.residual)
    rounds.append(found.rounds)
    restarts.append(found.restarts)
    first_guess = cocktail.separate(obs, model.apply_fn, x.shape[1:], rounds=0, restarts=1,
                                    bounds=(lo, hi))
    unmixed.extend(_psnr_matched(images(first_guess.inputs), truth)[0])
    if act == "relu":
      sep = analytic.exclusive_neurons(obs, model.apply_fn, x.shape[1:])
      got = (_psnr_matched(images(sep.inputs), truth)[0] if len(sep.inputs) else np.zeros(b))
      exclusive.append(float(np.mean(got >= 30)))
  psnrs, unmixed = np.asarray(psnrs), np.asarray(unmixed)
  return dict(
      row=name, model=model_name, act=act, normalization=norm_name, batch=b, defense=defense,
      options=options,
      images=f"{first}-{first + batches * b - 1}", batches=batches,
      psnr_mean=float(psnrs.mean()), psnr_median=float(np.median(psnrs)), psnr_min=float(psnrs.min()),
      recognisable=float(np.mean(psnrs >= 20)), recovered=float(np.mean(psnrs >= 30)),
      label_accuracy=float(np.mean(labels)), unmixed_psnr_median=float(np.median(unmixed)),
      residual_median=float(np.median(residuals)), round_median=float(np.median(rounds)),
      restarts_mean=float(np.mean(restarts)),
      exclusive_recovered=float(np.mean(exclusive)) if exclusive else None,
      seconds_per_batch=float(np.mean(seconds)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", default="", help="comma-separated row names (default: every row)")
  args = parser.parse_args()
  wanted = [r for r in args.rows.split(",") if r]
  unknown = sorted(set(wanted) - {spec["name"] for spec in ROWS})
  if unknown:
    parser.error(f"no rows {', '.join(unknown)}")
  os.makedirs(RUNS, exist_ok=True)
  for spec in ROWS:
    if wanted and spec["name"] not in wanted:
      continue
    row = _row(**spec)
    print(json.dumps(row), flush=True)
    _write(spec["name"], row)  # each row as it ends: runs on disjoint rows can share the table


def _write(name, row):
  path = os.path.join(RUNS, "table.json")
  table = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as fh:
      table = json.load(fh)
  table[name] = row
  table = {spec["name"]: table[spec["name"]] for spec in ROWS if spec["name"] in table}
  with open(path, "w", encoding="utf-8") as fh:
    json.dump(table, fh, indent=2)
    fh.write("\n")
  columns = ["row", "images", "batches", "psnr_mean", "psnr_median", "psnr_min", "recognisable",
             "recovered", "label_accuracy", "unmixed_psnr_median", "exclusive_recovered",
             "residual_median", "round_median", "restarts_mean", "seconds_per_batch"]
  lines = ["`python experiments/studies/cocktail_party/separate.py`, "
           f"jax {jax.__version__}, {jax.devices()[0].platform}", "",
           "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in table.values():
    lines.append("| " + " | ".join(
        "–" if r.get(c) is None else f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
        for c in columns) + " |")
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as fh:
    fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
