"""Where a trained decoder's gradient still separates the true next token: the span checks of
gradjax.dager measured on the trained `gpt` (the `gpt_trained` rows of spans.py), per layer.

  python experiments/studies/text/trained_probe.py --data_dir=../shared/data --trained=<epoch_1.npz>

The checkpoint is the one spans.py's docstring makes (one epoch of FedSGD on WikiText-2's validation
split, not kept). For the first batch of B sentences of 32 tokens (B = 1 and 8, the spans.py rows'
sentences) and the client's FedSGD gradient, in float64 from the float32 gradient:
- the first block's stacked query/key/value gradient: its singular values at n = B·T and n + 1 over
  the largest, the rank the largest ratio reads, and the largest relative distance of the n true
  first-block inputs to the span of its top n directions;
- at every position t >= 1 of the batch's first sentence, with the true prefix: the relative
  distance to the top-n span of (a) the second block's input (its query/key/value gradient) and
  (b) the first block's feed-forward input (its ``ffn_0`` kernel gradient), for the true token and
  for 600 wrong tokens drawn once (seed 0), the nearest of them kept. A position separates when the
  true token is ten times nearer than the nearest wrong one.
Writes runs/trained_probe/table.md and table.json.
"""

import argparse
import json
import os
import sys

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gradjax import clients, corpus

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spans  # noqa: E402  (the spans.py rows' sentences and trained model)

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "trained_probe")
LENGTH = 32
WRONG = 600
CHECKS = {"second block's input": ("block_1/norm_0", ("block_1", "attention")),
          "first block's feed-forward input": ("block_0/norm_1", ("block_0", "ffn_0"))}


def _columns(gradient, path):
  """(d, m) float64: a dense kernel's gradient, or an attention block's stacked q/k/v kernels."""
  node = gradient["params"] if "params" in gradient else gradient
  for key in path:
    node = node[key]
  if "kernel" in node:
    return np.asarray(node["kernel"], np.float64)
  return np.concatenate([np.asarray(node[p]["kernel"], np.float64).reshape(node[p]["kernel"].shape[0], -1)
                         for p in ("query", "key", "value")], axis=1)


class _Captured(Exception):
  """Ends a forward pass once the wanted output is read."""


def _captured(model, ids, name):
  """The output (N, T, d) of the module at ``name`` (a LayerNorm: the input of what follows it); the
  forward pass stops there."""
  out = {}

  def interceptor(next_fun, args, kwargs, context):
    y = next_fun(*args, **kwargs)
    if "/".join(context.module.scope.path) == name:
      out["y"] = np.asarray(y, np.float64)
      raise _Captured
    return y

  try:
    with nn.intercept_methods(interceptor):
      model.apply_fn(model.variables, jnp.asarray(ids))
  except _Captured:
    pass
  return out["y"]


def _distance(basis, z):
  return np.linalg.norm(z - (z @ basis) @ basis.T, axis=-1) / np.linalg.norm(z, axis=-1)


def probe(data_dir, trained, batch):
  _, ids, model, vocabulary = next(spans._gpt_batches(data_dir, LENGTH, batch, 1, trained=trained))
  x, y = corpus.language_model_pairs(ids, vocabulary.eos)
  gradient = clients.fedsgd(model.apply_fn, model.variables, x, y).gradient
  n = batch * LENGTH
  u, s, _ = np.linalg.svd(_columns(gradient, ("block_0", "attention")), full_matrices=False)
  inputs = _captured(model, x, "block_0/norm_0").reshape(n, -1)
  record = {"batch": batch, "n": n, "sigma_n": float(s[n - 1] / s[0]), "sigma_n1": float(s[n] / s[0]),
            "ratio_rank": int(np.argmax(s[:-1] / s[1:])) + 1,
            "first_inputs_worst": float(_distance(u[:, :n], inputs).max()), "checks": {}}
  vocab = int(model.variables["params"]["embed"]["embedding"].shape[0])
  wrong = np.random.default_rng(0).choice(vocab, WRONG, replace=False)
  for check, (name, path) in CHECKS.items():
    basis = np.linalg.svd(_columns(gradient, path), full_matrices=False)[0][:, :n]
    true, nearest = [], []
    for t in range(1, LENGTH):
      candidates = np.repeat(x[:1, :t + 1], WRONG + 1, axis=0)
      candidates[1:, t] = np.where(wrong == x[0, t], (wrong + 1) % vocab, wrong)
      d = _distance(basis, _captured(model, candidates, name)[:, t])
      true.append(float(d[0]))
      nearest.append(float(d[1:].min()))
    true, nearest = np.array(true), np.array(nearest)
    record["checks"][check] = {
        "true": true.tolist(), "nearest_wrong": nearest.tolist(),
        "separated": int(np.sum(10 * true < nearest)), "positions": LENGTH - 1,
        "true_median": float(np.median(true)), "nearest_wrong_median": float(np.median(nearest))}
    print(batch, check, record["checks"][check]["separated"], "of", LENGTH - 1, flush=True)
  return record


def table(records):
  lines = ["| batch | σ_n/σ_1 | σ_(n+1)/σ_1 | largest-ratio rank (n) | worst first-block input δ | check "
           "(rank n) | positions separated | true δ (median) | nearest wrong δ (median) |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    for check, c in r["checks"].items():
      lines.append(f"| {r['batch']} | {r['sigma_n']:.1e} | {r['sigma_n1']:.1e} | {r['ratio_rank']} "
                   f"({r['n']}) | {r['first_inputs_worst']:.1e} | {check} | {c['separated']} / "
                   f"{c['positions']} | {c['true_median']:.1e} | {c['nearest_wrong_median']:.1e} |")
  return "\n".join(lines) + "\n"


def main():
  options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  options.add_argument("--data_dir", default=None)
  options.add_argument("--trained", required=True, help="the gpt_trained checkpoint (spans.py)")
  options.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
  args = options.parse_args()
  os.makedirs(RUNS, exist_ok=True)
  records = []
  for b in args.batches.split(","):  # written after each batch size
    records.append(probe(args.data_dir, args.trained, int(b)))
    with open(os.path.join(RUNS, "table.json"), "w") as f:
      json.dump(records, f, indent=1)
    with open(os.path.join(RUNS, "table.md"), "w") as f:
      f.write(table(records))
  print(table(records))
  return 0


if __name__ == "__main__":
  sys.exit(main())
