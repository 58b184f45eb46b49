"""The client's check for trap weights (gradjax.malicious.inspect with the client's examples): false
alarms on honest MLPs and detections of trap weights, by batch size and input normalisation.

  python experiments/studies/malicious/trap_check.py --data_dir=../shared/data

A trap sets each first-layer unit's bias so that a share 1/N of the server's images fire it
(gradjax.malicious.trap_weights, tuned for batches of N); the check flags a layer reading the input
whose biases hold its units' thresholds out beyond malicious.TRAP_SHARE of its pre-activations' scale
(malicious.bias_share) while they fire for less than half the client's examples: the gate refuses
it. A layer not flagged whose units fire for fewer than malicious.TRAP_RATE of them on average
(malicious.rarely_firing) has its update audited instead. Honest
models: fresh draws of mlp-256 and mlp-1024 under each initialisation of the zoo (uniform, Xavier
normal, Flax's default), and the same MLPs trained here (FedSGD, 3 epochs over CIFAR-10 training
images 2000-11999, batches of 64, lr 0.05; not written to disk) and, where PyTorch is installed,
the Flower example's PyTorch MLP (examples/flower_audit, PyTorch's initialisation) after the
example's local training (SGD at lr 0.1, batches of 1, one epoch over 16 CIFAR-10 training images
2000-2015) and after a gentler one (lr 0.01, five epochs over 64), inputs in [0, 1] as the example
trains. Traps: rates 1/8 to 1/128 on a
fresh MLP of each width, tuned on CIFAR-10 training images 0-1999 (the server's). Clients: batches
of 1, 8, 32 and 128 CIFAR-10 test images drawn from 500-1016, in [0, 1] or normalised with CIFAR-10's
statistics (model, server's images and client alike), 20 batches per cell. Writes
runs/trap_check/table.md (flagged and audited per cell, the ranges of the mean activation rate
and the bias share, ms per check)
and table.json.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import jax
import numpy as np

from gradjax import data, malicious, models, training

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "trap_check")
FIRST = 500
BATCHES = 20
SIZES = (1, 8, 32, 128)
WIDTHS = ("mlp-256", "mlp-1024")
TRAP_BATCHES = (8, 32, 128)


def _pytorch_mlps(data_dir):
  """(row, "honest_pytorch", variables) of the Flower example's PyTorch MLPs after local training, read
  as a client receives them; none without PyTorch."""
  if importlib.util.find_spec("torch") is None:
    return []
  sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples", "flower_audit"))
  from flower_audit import task

  from gradjax import interop
  senders = []
  for width in WIDTHS:
    for lr, epochs, n in ((0.1, 1, 16), (0.01, 5, 64)):
      net = task.build(width, 0)
      x, y = task.load("cifar10_train", data_dir, list(range(2000, 2000 + n)))
      task.train(net, x, y, epochs=epochs, batch_size=1, lr=lr)
      sent = {k: v.detach().numpy() for k, v in net.state_dict().items()}
      like = models.create(width, jax.random.key(0), input_shape=(32, 32, 3))
      variables = interop.variables_from_torch(sent, interop.zoo_mapping(like), like.variables, width)
      senders.append((f"honest {width} PyTorch, lr {lr}, {epochs} epoch(s) over {n}", "honest_pytorch",
                      variables))
  return senders


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  stats = data.normalization("cifar10")
  mean, std = np.asarray(stats.mean, np.float32), np.asarray(stats.std, np.float32)
  public = data.load("cifar10_train", data_dir=args.data_dir, indices=range(2000))
  train = data.load("cifar10_train", data_dir=args.data_dir, indices=range(2000, 12000))
  clients = data.load("cifar10", data_dir=args.data_dir, indices=range(FIRST, 1017))  # all after 500
  rng = np.random.default_rng(0)
  records = {}
  for norm in ("none", "cifar10"):
    seen = (lambda x: (x - mean) / std) if norm == "cifar10" else (lambda x: np.asarray(x, np.float32))
    batches = {n: [seen(clients.x[rng.choice(len(clients.x), n, replace=False)]) for _ in range(BATCHES)]
               for n in SIZES}
    senders = []  # (row, variables)
    for width in WIDTHS:
      for init in models.INITS:
        fresh = models.create(width, jax.random.key(len(senders)), input_shape=(32, 32, 3), init=init)
        senders.append((f"honest {width} {init}", "honest", fresh.variables))
      fresh = models.create(width, jax.random.key(99), input_shape=(32, 32, 3))
      trained, _ = training.train_fedsgd(fresh.apply_fn, fresh.variables, seen(train.x), train.y,
                                         key=jax.random.key(1), epochs=3, batch_size=64,
                                         learning_rate=0.05)
      senders.append((f"honest {width} trained", "honest", trained))
      for n in TRAP_BATCHES:
        trap = malicious.trap_weights(fresh, seen(public.x), 1 / n, jax.random.key(100 + n))
        senders.append((f"trap {width} 1/{n}", "trap", trap.variables))
    if norm == "none":
      senders += _pytorch_mlps(args.data_dir)
    for name, kind, variables in senders:
      for n in SIZES:
        flagged, audited, rates, shares, ms = 0, 0, [], [], []
        for x in batches[n]:
          start = time.perf_counter()
          found = malicious.inspect(variables, inputs=x)
          rare = {} if found else malicious.rarely_firing(variables, x)
          ms.append(1e3 * (time.perf_counter() - start))
          flagged += bool(found)
          audited += bool(rare)
          rates.append(min(malicious.activation_rate(variables, x).values()))
          shares.append(max(malicious.bias_share(variables, x).values()))
        row = f"{name} | {'[0, 1]' if norm == 'none' else 'normalised'} | {n}"
        records[row] = {"model": name, "kind": kind, "inputs": norm, "batch": n, "flagged": flagged,
                        "audited": audited, "batches": BATCHES, "rate_min": float(np.min(rates)),
                        "rate_max": float(np.max(rates)), "share_min": float(np.min(shares)),
                        "share_max": float(np.max(shares)), "ms": float(np.median(ms))}
        print(row, flagged, audited, f"{np.min(rates):.3f}-{np.max(rates):.3f}",
              f"{np.min(shares):.3f}-{np.max(shares):.3f}", flush=True)
  os.makedirs(RUNS, exist_ok=True)
  totals = {}
  for kind in ("honest", "honest_pytorch", "trap"):
    rows = [r for r in records.values() if r["kind"] == kind]
    if not rows:  # no PyTorch
      continue
    flagged, checks = sum(r["flagged"] for r in rows), sum(r["batches"] for r in rows)
    audited = sum(r["audited"] for r in rows)
    totals[kind] = {"flagged": flagged, "audited": audited, "checks": checks, "share": flagged / checks}
  with open(os.path.join(RUNS, "table.json"), "w") as f:
    json.dump({"trap_rate": malicious.TRAP_RATE, "trap_share": malicious.TRAP_SHARE, "totals": totals,
               "rows": records}, f, indent=1)
  lines = [f"Of {BATCHES} client batches per row: flagged by inspect (bias share above "
           f"{malicious.TRAP_SHARE} with units firing for less than half the examples: refused), and "
           f"otherwise audited (mean activation rate below {malicious.TRAP_RATE}: the update audited)", "",
           "| sent model | inputs | batch | flagged | audited | mean activation rate (range) | bias share "
           "(range) | ms |", "|---|---|---|---|---|---|---|---|"]
  for row, r in records.items():
    lines.append(f"| {row} | {r['flagged']} / {r['batches']} | {r['audited']} / {r['batches']} | "
                 f"{r['rate_min']:.3f}-{r['rate_max']:.3f} | {r['share_min']:.3f}-{r['share_max']:.3f} "
                 f"| {r['ms']:.1f} |")
  for kind, t in totals.items():
    lines.append(f"| all {kind} | | | {t['flagged']} / {t['checks']} | {t['audited']} / {t['checks']} | | | |")
  with open(os.path.join(RUNS, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
