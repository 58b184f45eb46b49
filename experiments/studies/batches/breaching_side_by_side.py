"""Side by side with breaching 0.1.2's Inverting Gradients attacker on the batches study's LeNet rows.

The same batches (CIFAR-10 test images 900.. and 500.., batch 4 and 8, five each), the same model
weights (each batch's fresh DLG LeNet, as ``gradjax sweep`` draws it, exported in PyTorch layout by
gradjax.interop), labels known, the same budget (2000 iterations) and TV weight (0.2, breaching's
default), one thread. Three steps, the second in an environment with breaching and torch (gradjax
itself never imports them):

  python experiments/studies/batches/breaching_side_by_side.py export     # gradjax: runs/breaching/inputs/*.npz
  /path/to/breaching-env/bin/python experiments/studies/batches/breaching_side_by_side.py attack
  python experiments/studies/batches/breaching_side_by_side.py table      # gradjax scores both: table.md

``attack`` writes each batch's reconstruction and seconds to ``runs/breaching/outputs/``; ``table``
scores them with gradjax.metrics (per-image PSNR after the optimal assignment, as the sweeps do) beside
the head_features runs of the same batches.
"""

import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "breaching")
BATCHES = [(b, start + k * b) for b in (4, 8) for start in (900, 500) for k in range(5)]
ITERATIONS, TV = 2000, 0.2


def export():
  import jax
  from gradjax import data, interop, models
  from gradjax.run import config, pipeline
  os.makedirs(os.path.join(RUNS, "inputs"), exist_ok=True)
  for b, index in BATCHES:
    key_model = pipeline.experiment_keys(0, index)[0]  # the sweep's model of this batch (seed 0)
    batch = data.load("cifar10", indices=range(index, index + b))
    model = models.create("lenet_zhu", key_model, input_shape=batch.x.shape[1:], num_classes=10)
    weights = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
    np.savez(os.path.join(RUNS, "inputs", f"b{b}_{index}.npz"), x=batch.x, y=batch.y,
             **{f"w:{k}": v for k, v in weights.items()})
  del config, jax


def attack():
  import torch
  sys.path.insert(0, os.path.dirname(HERE))
  import breaching_lenet
  torch.set_num_threads(1)
  cfg = breaching_lenet.attack_config(ITERATIONS, TV)
  os.makedirs(os.path.join(RUNS, "outputs"), exist_ok=True)
  for path in sorted(glob.glob(os.path.join(RUNS, "inputs", "*.npz"))):
    out = os.path.join(RUNS, "outputs", os.path.basename(path))
    if os.path.exists(out):
      continue
    saved = np.load(path)
    x = torch.as_tensor(saved["x"]).permute(0, 3, 1, 2).contiguous()
    y = torch.as_tensor(saved["y"]).long()
    rec, seconds = breaching_lenet.reconstruct(breaching_lenet.lenet_zhu(saved), x, y, cfg)
    np.savez(out, x=rec.permute(0, 2, 3, 1).numpy(), seconds=seconds,
             versions=json.dumps({"breaching": "0.1.2", "torch": torch.__version__}))
    print(f"{os.path.basename(path)}: {seconds:.1f} s", flush=True)


def table():
  from gradjax import metrics
  rows, numbers = [], {}
  for b in (4, 8):
    for start in (900, 500):
      ours = json.load(open(os.path.join(HERE, "runs", "head_features", f"b{b}_{start}_hf", "results.json")))
      plain = json.load(open(os.path.join(HERE, "runs", "head_features", f"b{b}_{start}_plain", "results.json")))
      theirs, seconds = [], []
      for k in range(5):
        index = start + k * b
        got = np.load(os.path.join(RUNS, "outputs", f"b{b}_{index}.npz"))
        truth = np.load(os.path.join(RUNS, "inputs", f"b{b}_{index}.npz"))["x"]
        theirs += metrics.score(np.clip(got["x"], 0, 1), truth)["psnr_per_image"]
        seconds.append(float(got["seconds"]))
      mean = lambda rs: float(np.mean([p for r in rs for p in r["psnr_per_image"]]))
      row = {"breaching": float(np.mean(theirs)), "gradjax_plain": mean(plain["rows"]),
             "gradjax_head_features": mean(ours["rows"]),
             "breaching_s": float(np.mean(seconds)),
             "gradjax_head_features_s": float(np.mean([r["wall_time_s"] for r in ours["rows"]]))}
      numbers[f"b{b}_{start}"] = row
      rows.append(f"| {b} | {start}..{start + 5 * b - 1} | {row['breaching']:.2f} ({row['breaching_s']:.1f} s) | "
                  f"{row['gradjax_plain']:.2f} | {row['gradjax_head_features']:.2f} "
                  f"({row['gradjax_head_features_s']:.1f} s) | "
                  f"{row['gradjax_head_features'] - row['breaching']:+.2f} |")
  text = ("| batch | images | breaching IG, PSNR (s per batch) | gradjax IG | gradjax IG + head features "
          "(s per batch) | gain over breaching (dB) |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  with open(os.path.join(RUNS, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(numbers, fh, indent=1)
  print(text)


if __name__ == "__main__":
  {"export": export, "attack": attack, "table": table}[sys.argv[1]]()
