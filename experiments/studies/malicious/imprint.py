"""A malicious server's imprint block (Robbing the Fed, Fowl et al. 2022; gradjax.malicious) in front
of DLG's LeNet: examples recovered exactly against batch size, bins and aggregated clients.

  python experiments/studies/malicious/imprint.py --data_dir=../shared/data

The server measures the mean brightness and places its k thresholds at the quantiles of that
statistic over CIFAR-10 training images 0-1999 (data it holds); the clients hold CIFAR-10 test
images from 500 on, consecutive, a fresh LeNet per row (U(-0.5, 0.5), sigmoid). FedSGD: each
client's gradient of its mean cross entropy, summed over the clients (what secure aggregation gives
the server); FedAvg: one client's W_0 − W_E after local SGD at 0.01. An example counts as recovered
exactly when some read-out is within PSNR 60 dB of it (NumPy, data range 1); the expected share is
(k/(k+1))^N for N examples in k + 1 equally likely cells (the lowest, below c_0, gives nothing).
The ``layer_*`` rows hide the imprint in the first layer of an MLP of 1024 units
(``malicious.imprint_layer``: its shapes are the declared model's); the ``*_gain*`` rows attack FedAvg
clients with the block shrunk (``malicious.imprint(gain=...)``); the ``sparse_*`` rows send the sparse
block (``structure="sparse"``: a hard-tanh unit per bin), whose read-out survives local steps.
``--rows=sparse`` reruns only the rows so named, keeping the others. Writes runs/imprint/table.md and
table.json; then the client-side check (``malicious.inspect``) on every malicious model built here
and on honest ones (fresh zoo draws, five seeds each, and the trained checkpoints committed in other
studies), with its time per model, and on the imprint of the first layer with noise orthogonal to
each unit (3, 6, 20 % of its norm) and honest models whose zeroed head took one step on six of ten
classes: runs/imprint/detection.md and detection.json.

``--parts=paper`` (runs/imprint/paper.md, paper.json): the paper's own setting beside its figure. The
authors' README reports an average PSNR of 70.94 dB for a batch of 64 ImageNet images through an
imprint of 128 bins in front of a ResNet-18 (their Figure 1). Here the same block, bins and batch in
front of the zoo's ResNet-18 (CIFAR stem, train-mode BatchNorm), on CIFAR-10 (32 px) and LFW (80 px,
the server's thresholds from LFW photos 2000-3999), scored as the authors' report scores a batch:
the read-outs clipped to [0, 1], filled up to the batch size with the server's mean colour, assigned
one to one to the true images (here by least squared error, there by LPIPS), and the per-image PSNR
averaged.
"""

import argparse
import json
import os
import time

import jax
import numpy as np
import scipy.optimize

from gradjax import checkpoint, clients, data, malicious, models

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "imprint")
FIRST = 500

def _tag(value):
  """A row name's number without a dot (0.01 -> "1e-2", 1.0 -> "1e+0"): the studies' paths split on dots."""
  return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e+")


# (row, batch per client, bins, clients, local training (epochs, mini-batch[, learning rate,
# momentum]; 0.01 and 0 unless given) or None for FedSGD, the block's gain: malicious.imprint's,
# 1 the full-size block[, the block's structure: cumulative unless given])
ROWS = ([(f"b{b}_k{k}", b, k, 1, None, 1.0) for b in (8, 16, 32, 64, 128, 256)
         for k in (128, 256, 512, 1024)]
        + [(f"c4_b{b}_k{k}", b, k, 4, None, 1.0) for b in (16, 64) for k in (512, 1024)]
        + [(f"fedavg_e{e}_mb{m}_b64_k512", 64, 512, 1, (e, m), 1.0) for e, m in ((1, 16), (1, 64), (2, 64))]
        + [(f"layer_b{b}_k512", b, 512, 1, None, 1.0) for b in (64, 128)]
        # A FedAvg client against a block shrunk so that its float32 update keeps the digits.
        + [(f"fedavg_e{e}_mb{m}_b64_k512_gain{g:g}", 64, 512, 1, (e, m), g)
           for e, m in ((1, 64), (2, 64), (1, 32), (1, 16), (2, 16), (1, 8)) for g in (1e-1, 1e-2, 1e-3)]
        # The sparse block (hard-tanh units, one bin each): FedSGD, then FedAvg clients of several
        # local steps, learning rates and momentum, larger batches and four clients summed.
        + [("sparse_b64_k512_gain1e-3", 64, 512, 1, None, 1e-3, "sparse")]
        + [(f"sparse_fedavg_e{e}_mb{m}_lr{_tag(lr)}{'_momentum' if mom else ''}_b64_k512_gain{_tag(g)}", 64,
            512, 1, (e, m, lr, mom), g, "sparse")
           for e, m, lr, mom, g in ((1, 64, 0.01, 0, 1e-3), (1, 16, 0.01, 0, 1e-3), (1, 8, 0.01, 0, 1e-3),
                                    (5, 8, 0.01, 0, 1e-3), (1, 16, 0.1, 0, 1e-3), (5, 8, 0.1, 0, 1e-3),
                                    (5, 8, 0.1, 0.9, 1e-3), (1, 16, 0.01, 0, 1.0), (1, 16, 0.01, 0, 1e-1),
                                    (1, 16, 0.01, 0, 1e-2), (1, 16, 0.01, 0, 1e-4))]
        + [(f"sparse_fedavg_e1_mb{m}_lr1e-1_b{b}_k1024_gain1e-3", b, 1024, 1, (1, m, 0.1, 0), 1e-3, "sparse")
           for b, m in ((128, 16), (256, 32))]
        + [("sparse_fedavg_c4_e1_mb16_lr1e-1_b64_k1024_gain1e-3", 64, 1024, 4, (1, 16, 0.1, 0), 1e-3, "sparse")])
ZOO = ("lenet_zhu", "lenet5", "convnet-16", "mlp-1024", "resnet20", "resnet20-4")
TRAINED = ("experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz",
           "experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz",
           "experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_1.npz")
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def psnr_to_nearest(truth, readouts):
  """(N,) PSNR (dB, data range 1) of each true image to its nearest read-out (inf if identical)."""
  if len(readouts) == 0:
    return np.full(len(truth), -np.inf)
  t = truth.reshape(len(truth), -1).astype(np.float64)
  r = readouts.reshape(len(readouts), -1).astype(np.float64)
  mse = ((t ** 2).sum(1)[:, None] - 2 * t @ r.T + (r ** 2).sum(1)[None]) / t.shape[1]
  with np.errstate(divide="ignore"):
    return -10 * np.log10(np.maximum(mse.min(axis=1), 0))


def run(row, batch, bins, n_clients, local, gain, structure, statistic, data_dir, key):
  images = data.load("cifar10", data_dir=data_dir, indices=range(FIRST, FIRST + batch * n_clients))
  sparse = structure == "sparse"
  thresholds = malicious.imprint_thresholds(statistic, bins + 1 if sparse else bins)
  if row.startswith("layer_"):  # the imprint inside an MLP's first layer
    model = models.create("mlp-1024", key, input_shape=images.x.shape[1:])
    evil, read = malicious.imprint_layer(model, thresholds), dict(layer="Dense_0", units=bins)
  else:
    model = models.create("lenet_zhu", key, input_shape=images.x.shape[1:])
    evil, read = malicious.imprint(model, thresholds, structure=structure, gain=gain), {}
  if local is not None:
    epochs, mini_batch, lr, momentum = (*local, 0.01, 0.0)[:4]
  start = time.perf_counter()
  total = None
  for c in range(n_clients):
    x, y = images.x[c * batch:(c + 1) * batch], images.y[c * batch:(c + 1) * batch]
    if local is None:
      update = clients.fedsgd(evil.apply_fn, evil.variables, x, y).gradient
    else:
      update = clients.fedavg(evil.apply_fn, evil.variables, x, y,
                              clients.LocalTraining(epochs, mini_batch, lr, momentum)).gradient
    total = update if total is None else jax.tree.map(lambda a, b: a + b, total, update)
  total = jax.block_until_ready(total)  # the clients' work done before the read-out is timed
  client_s = time.perf_counter() - start
  start = time.perf_counter()
  rec = malicious.imprint_recover(total, images.x.shape[1:], structure=structure, **read)
  attack_s = time.perf_counter() - start
  psnr = psnr_to_nearest(images.x, rec.x)
  n = batch * n_clients
  exact = int(np.sum(psnr >= 60))
  if local is None:
    client = "FedSGD"
  else:
    client = f"FedAvg {epochs} epoch(s), mini-batches of {mini_batch}"
    if (lr, momentum) != (0.01, 0.0):
      client += f", lr {lr:g}" + (f", momentum {momentum:g}" if momentum else "")
  if row.startswith("layer_"):
    client += " (imprint in mlp-1024's first layer)"
  if sparse:
    client += ", sparse block"
  if gain != 1.0:
    client += f", block's gain {gain:g}"
  expected = (bins / (bins + 2) * ((bins + 1) / (bins + 2)) ** (n - 1) if sparse
              else (bins / (bins + 1)) ** n)
  return {"row": row, "batch": batch, "bins": bins, "clients": n_clients, "client": client, "gain": gain,
          "structure": structure, "examples": n, "exact": exact, "share": exact / n,
          "expected_share": expected, "above_30db": int(np.sum(psnr >= 30)), "readouts": int(len(rec.x)),
          "median_psnr": float(np.median(np.minimum(psnr, 200))), "attack_s": attack_s,
          "client_s": client_s}


# (row, dataset at its own size, the server's images, ResNet-18's classes): batch 64, 128 bins. (At
# 224 px the zoo's ResNet-18, a CIFAR stem without downsampling, needs 42 GB for a batch of 64 in
# training mode: not run here.)
PAPER_FIGURE = 70.94  # dB, average PSNR, ImageNet batch of 64, 128 bins, ResNet-18 (the authors' README)
PAPER_ROWS = (("paper_cifar10", "cifar10", ("cifar10_train", range(2000)), 10),
              ("paper_lfw", "lfw", ("lfw", range(2000, 4000)), 1000))


def authors_average_psnr(truth, readouts, fill):
  """Mean over the N true images of the PSNR (dB, data range 1) to the read-out assigned to each,
  one to one by least squared error after the read-outs are clipped to [0, 1] and filled up to N
  with ``fill`` (C,); the largest per-image PSNR is returned with it (inf where an error is 0)."""
  n = len(truth)
  r = np.clip(readouts.reshape(len(readouts), -1).astype(np.float64), 0, 1)[:n]
  filler = np.broadcast_to(np.asarray(fill, np.float64), truth.shape[1:]).reshape(1, -1)
  r = np.concatenate([r, np.repeat(filler, n - len(r), axis=0)])
  t = truth.reshape(n, -1).astype(np.float64)
  # The assignment from the expanded squares (N x N at once); the assigned pairs' errors directly,
  # since the expansion cancels to about 1e-16 of |t|^2, near an exact read-out's own error.
  mse = (t ** 2).sum(1)[:, None] - 2 * t @ r.T + (r ** 2).sum(1)[None]
  rows, cols = scipy.optimize.linear_sum_assignment(mse)
  with np.errstate(divide="ignore"):
    psnr = -10 * np.log10(((t[rows] - r[cols]) ** 2).mean(axis=1))
  return float(psnr.mean()), float(psnr.max())


def paper_setting(data_dir):
  """The paper's bins and batch in front of ResNet-18: one record per PAPER_ROWS entry."""
  records = []
  for i, (row, name, server, classes) in enumerate(PAPER_ROWS):
    public = data.load(server[0], data_dir=data_dir, indices=server[1])
    statistic = public.x.reshape(len(public.x), -1).astype(np.float64).mean(axis=1)
    images = data.load(name, data_dir=data_dir, indices=range(FIRST, FIRST + 64))
    labels = images.y % classes
    model = models.create("resnet18", jax.random.key(100 + i), input_shape=images.x.shape[1:],
                          num_classes=classes)
    evil = malicious.imprint(model, malicious.imprint_thresholds(statistic, 128))
    update = jax.block_until_ready(
        clients.fedsgd(evil.apply_fn, evil.variables, images.x, labels, train=True).gradient)
    start = time.perf_counter()
    rec = malicious.imprint_recover(update, images.x.shape[1:])
    attack_s = time.perf_counter() - start
    psnr = psnr_to_nearest(images.x, rec.x)
    mean, largest = authors_average_psnr(images.x, rec.x, public.x.mean(axis=(0, 1, 2)))
    records.append({"row": row, "dataset": name, "side": images.x.shape[1], "batch": 64, "bins": 128,
                    "exact": int(np.sum(psnr >= 60)), "expected_share": (128 / 129) ** 64,
                    "readouts": int(len(rec.x)), "average_psnr": mean, "largest_psnr": largest,
                    "paper_average_psnr": PAPER_FIGURE, "attack_s": attack_s})
    print(row, records[-1]["exact"], "/ 64, average PSNR", round(mean, 2), flush=True)
  return records


def paper_table(records):
  lines = ["| data | batch | bins | exact (PSNR >= 60 dB) | expected | read-outs | average PSNR (dB), "
           "the authors' statistic | largest | the paper (ImageNet 224 px) |", "|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    lines.append(f"| {r['dataset']} {r['side']} px, ResNet-18 | {r['batch']} | {r['bins']} | {r['exact']} / "
                 f"{r['batch']} | {r['expected_share'] * r['batch']:.1f} | {r['readouts']} | "
                 f"{r['average_psnr']:.2f} | {r['largest_psnr']:.1f} | {r['paper_average_psnr']:.2f} |")
  return "\n".join(lines) + "\n"


def table(records):
  lines = ["| client | clients x batch | bins | exact (PSNR >= 60 dB) | share | expected share | >= 30 dB "
           "| read-outs | read-out s |", "|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    lines.append(f"| {r['client']} | {r['clients']} x {r['batch']} | {r['bins']} | {r['exact']} / "
                 f"{r['examples']} | {r['share']:.2f} | {r['expected_share']:.2f} | {r['above_30db']} | "
                 f"{r['readouts']} | {r['attack_s']:.3f} |")
  return "\n".join(lines) + "\n"


def _inspected(kind, name, variables, declared):
  malicious.inspect(variables, declared)  # the first call converts the arrays
  start = time.perf_counter()
  found = malicious.inspect(variables, declared)
  return {"kind": kind, "model": name, "flagged": bool(found), "reasons": [f.reason for f in found],
          "ms": 1e3 * (time.perf_counter() - start)}


def detection():
  """malicious.inspect on honest and malicious models: one record each."""
  records = []
  thresholds = np.linspace(0.2, 0.8, 512)
  for name in ZOO:
    for seed in range(5):
      honest = models.create(name, jax.random.key(seed), input_shape=(32, 32, 3))
      records.append(_inspected("honest, fresh", name, honest.variables, honest.variables))
    records.append(_inspected("imprint block in front", name,
                              malicious.imprint(honest, thresholds).variables, honest.variables))
    records.append(_inspected("sparse imprint block in front", name, malicious.imprint(
        honest, np.linspace(0.2, 0.8, 513), structure="sparse", gain=1e-3).variables, honest.variables))
    if name.startswith("mlp"):
      records.append(_inspected("imprint in the first layer", name,
                                malicious.imprint_layer(honest, thresholds).variables, honest.variables))
  for path in TRAINED:
    model = checkpoint.load_model(os.path.join(ROOT, path))
    records.append(_inspected("honest, trained", path, model.variables, None))
  # What the check misses: an imprint whose units carry noise orthogonal to their direction.
  honest = models.create("mlp-1024", jax.random.key(0), input_shape=(32, 32, 3))
  layer = malicious.imprint_layer(honest, thresholds)
  for noise in (0.03, 0.06, 0.2):
    records.append(_inspected(f"imprint in the first layer, {noise:.0%} orthogonal noise per unit",
                              "mlp-1024", _perturbed(layer.variables, noise), honest.variables))
  # What it must pass: a zero-initialised head after a step on six of ten classes.
  for name in ("lenet_zhu", "mlp-256", "resnet20"):
    model = models.create(name, jax.random.key(0), input_shape=(32, 32, 3))
    records.append(_inspected("honest, zero head, one step on 6 of 10 classes", name,
                              _zero_head_step(model), model.variables))
  return records


def _perturbed(variables, noise):
  """``variables`` with every unit of the first dense layer moved by noise orthogonal to it, of
  ``noise`` times its norm (NumPy, seed 0)."""
  kernel = np.asarray(variables["params"]["Dense_0"]["kernel"], np.float64)
  rng = np.random.default_rng(0)
  n = rng.normal(size=kernel.shape)
  n -= kernel * (np.sum(n * kernel, axis=0) / np.maximum(np.sum(kernel * kernel, axis=0), 1e-30))
  n *= noise * np.linalg.norm(kernel, axis=0) / np.maximum(np.linalg.norm(n, axis=0), 1e-30)
  params = {**variables["params"], "Dense_0": {**variables["params"]["Dense_0"],
                                               "kernel": (kernel + n).astype(np.float32)}}
  return {**variables, "params": params}


def _zero_head_step(model):
  """``model``'s variables with its head zeroed, after one SGD step (lr 0.1) on 8 random images of
  classes 0-5 (the other four classes' head units then stay parallel)."""
  head = {k: np.zeros_like(v) for k, v in model.variables["params"]["head"].items()}
  variables = {**model.variables, "params": {**model.variables["params"], "head": head}}
  x = np.random.default_rng(0).uniform(size=(8, 32, 32, 3)).astype(np.float32)
  y = np.array([0, 1, 2, 3, 4, 5, 0, 1])
  update = clients.fedavg(model.apply_fn, variables, x, y, clients.LocalTraining(learning_rate=0.1),
                          train=False).gradient
  params = jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u), variables["params"], update)
  return {**variables, "params": params}


def detection_table(records):
  lines = ["| model | kind | models | flagged | ms (largest) |", "|---|---|---|---|---|"]
  groups = {}
  for r in records:
    groups.setdefault((r["model"], r["kind"]), []).append(r)
  for (name, kind), rs in groups.items():
    lines.append(f"| {name} | {kind} | {len(rs)} | {sum(r['flagged'] for r in rs)} | "
                 f"{max(r['ms'] for r in rs):.1f} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--parts", default="rows,detection,paper",
                      help="comma-separated: rows (table.md), detection (detection.md), paper (paper.md)")
  parser.add_argument("--rows", default="",
                      help="comma-separated prefixes: run only the table's rows whose names start with "
                           "one, keeping the others from runs/imprint/table.json")
  args = parser.parse_args()
  parts = set(args.parts.split(","))
  if not parts <= {"rows", "detection", "paper"}:
    parser.error(f"unknown parts {sorted(parts - {'rows', 'detection', 'paper'})}")
  if args.rows and "rows" not in parts:
    parser.error("--rows selects rows of the table: add rows to --parts")
  os.makedirs(RUNS, exist_ok=True)
  if "paper" in parts:
    found = paper_setting(args.data_dir)
    _write("paper", {r["row"]: r for r in found}, paper_table(found))
  if "rows" in parts:
    _rows(args.data_dir, [r for r in args.rows.split(",") if r])
  if "detection" in parts:
    found = detection()
    _write("detection", found, detection_table(found))


def _write(name, records, markdown):
  with open(os.path.join(RUNS, f"{name}.json"), "w") as f:
    json.dump(records, f, indent=1)
  with open(os.path.join(RUNS, f"{name}.md"), "w") as f:
    f.write(markdown)
  print(markdown)


def _rows(data_dir, only=None):
  """The table's rows (``only``: the names starting with one of these prefixes, the others kept from
  the committed table.json)."""
  public = data.load("cifar10_train", data_dir=data_dir, indices=range(2000))
  statistic = public.x.reshape(len(public.x), -1).astype(np.float64).mean(axis=1)
  path = os.path.join(RUNS, "table.json")
  kept = {}
  if only and os.path.exists(path):
    with open(path) as f:
      kept = json.load(f)
  records = []
  for i, (row, batch, bins, n_clients, local, gain, *structure) in enumerate(ROWS):
    if only and not row.startswith(tuple(only)):
      if row in kept:
        records.append(kept[row])
      continue
    # A row's model is drawn from its position: rows appended later leave the earlier ones as they were.
    record = run(row, batch, bins, n_clients, local, gain, (structure or ["cumulative"])[0], statistic,
                 data_dir, jax.random.key(i))
    print(row, record["exact"], "/", record["examples"], flush=True)
    records.append(record)
  _write("table", {r["row"]: r for r in records}, table(records))


if __name__ == "__main__":
  main()
