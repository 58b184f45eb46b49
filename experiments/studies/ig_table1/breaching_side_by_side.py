"""Inverting Gradients' Table 1 LeNet rows side by side with breaching 0.1.2, on images nobody tuned on.

The same images (CIFAR-10 test 500..519, the unseen range of ../shared/PROTOCOLS.md), the same two
models the study's rows attack (the untrained LeNet(Zhu) of ``runs/train_lenet_zhu_cifar10_normalized/
epoch_0.npz`` and the recipe-trained one of ``runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz``,
exported in PyTorch layout by gradjax.interop), inputs normalised by the CIFAR-10 mean and std, labels
known, the paper's budget and weights: 4800 iterations of signed Adam lr 0.1 with the step decay, 1 −
cosine over all parameters, TV 1e-4, one restart, the box. breaching's TV is the mean over pixels and
channels of |dx| + |dy| times its scale, which is gradjax's mean |dx| + mean |dy| up to the border, so
the scale is the same 1e-4. One thread; the attacker is ../breaching_lenet.py, shared with batches/.
Three steps, the second in an environment with breaching and torch (gradjax itself never imports
them):

  python experiments/studies/ig_table1/breaching_side_by_side.py export      # runs/breaching/inputs
  /path/to/breaching-env/bin/python experiments/studies/ig_table1/breaching_side_by_side.py attack
  python experiments/studies/ig_table1/breaching_side_by_side.py table       # runs/breaching/table.md

``table`` scores breaching's reconstructions with gradjax.metrics beside gradjax's own sweeps of the same
images and models (``runs/ig_lenet_zhu_normalized_epoch0_cifar10_500-599`` and
``runs/ig_lenet_zhu_recipe_epoch120_cifar10_500-599``).
"""

import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "breaching")
IMAGES = range(500, 520)
ITERATIONS, TV = 4800, 1e-4
MODELS = {  # row name: (checkpoint, gradjax's sweep of the same model on 500-599)
    "untrained": ("runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz",
                  "runs/ig_lenet_zhu_normalized_epoch0_cifar10_500-599"),
    "trained": ("runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz",
                "runs/ig_lenet_zhu_recipe_epoch120_cifar10_500-599"),
}


def export():
  from gradjax import checkpoint, data, interop
  os.makedirs(os.path.join(RUNS, "inputs"), exist_ok=True)
  norm = data.normalization("cifar10")
  batch = data.load("cifar10", indices=list(IMAGES))
  for name, (path, _) in MODELS.items():
    model = checkpoint.load_model(os.path.join(HERE, path))
    weights = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
    np.savez(os.path.join(RUNS, "inputs", f"{name}.npz"), x=batch.x, y=batch.y, index=np.array(list(IMAGES)),
             mean=np.array(norm.mean), std=np.array(norm.std), **{f"w:{k}": v for k, v in weights.items()})


def attack():
  import torch
  sys.path.insert(0, os.path.dirname(HERE))
  import breaching_lenet
  torch.set_num_threads(1)
  cfg = breaching_lenet.attack_config(ITERATIONS, TV)
  os.makedirs(os.path.join(RUNS, "outputs"), exist_ok=True)
  for path in sorted(glob.glob(os.path.join(RUNS, "inputs", "*.npz"))):
    saved = np.load(path)
    name = os.path.basename(path)[:-4]
    mean, std = (torch.as_tensor(saved[k], dtype=torch.float).view(1, 3, 1, 1) for k in ("mean", "std"))
    model = breaching_lenet.lenet_zhu(saved)
    for j, index in enumerate(saved["index"]):
      out = os.path.join(RUNS, "outputs", f"{name}_{index}.npz")
      if os.path.exists(out):
        continue
      x = (torch.as_tensor(saved["x"][j:j + 1]).permute(0, 3, 1, 2) - mean) / std
      y = torch.as_tensor(saved["y"][j:j + 1]).long()
      torch.manual_seed(int(index))
      rec, seconds = breaching_lenet.reconstruct(model, x, y, cfg, saved["mean"].tolist(),
                                                 saved["std"].tolist())
      pixels = (rec * std + mean).permute(0, 2, 3, 1).numpy()
      np.savez(out, x=pixels, seconds=seconds,
               versions=json.dumps({"breaching": "0.1.2", "torch": torch.__version__}))
      print(f"{name} {index}: {seconds:.1f} s", flush=True)


def table():
  from gradjax import metrics
  lines, numbers = [], {}
  for name, (_, sweep) in MODELS.items():
    truth = np.load(os.path.join(RUNS, "inputs", f"{name}.npz"))
    ours = {r["index"]: r for r in json.load(open(os.path.join(HERE, sweep, "results.json")))["rows"]}
    theirs, mine, seconds, my_seconds = [], [], [], []
    for j, index in enumerate(truth["index"]):
      path = os.path.join(RUNS, "outputs", f"{name}_{index}.npz")
      if not os.path.exists(path) or int(index) not in ours:
        continue
      got = np.load(path)
      theirs.append(metrics.score(np.clip(got["x"], 0, 1), truth["x"][j:j + 1])["psnr"])
      seconds.append(float(got["seconds"]))
      mine.append(ours[int(index)]["psnr"])
      my_seconds.append(ours[int(index)]["wall_time_s"])
    theirs, mine = np.array(theirs), np.array(mine)
    row = dict(images=len(theirs), breaching_mean=float(theirs.mean()), breaching_std=float(theirs.std()),
               breaching_median=float(np.median(theirs)), gradjax_mean=float(mine.mean()),
               gradjax_std=float(mine.std()), gradjax_median=float(np.median(mine)),
               gradjax_higher=int(np.sum(mine > theirs)), breaching_s=float(np.mean(seconds)),
               gradjax_s=float(np.mean(my_seconds)))
    numbers[name] = row
    lines.append(f"| {name} | {row['images']} | {row['breaching_mean']:.2f} ± {row['breaching_std']:.2f} "
                 f"({row['breaching_median']:.2f}) | {row['gradjax_mean']:.2f} ± {row['gradjax_std']:.2f} "
                 f"({row['gradjax_median']:.2f}) | {row['gradjax_higher']} | {row['breaching_s']:.1f} | "
                 f"{row['gradjax_s']:.1f} |")
  text = ("| LeNet(Zhu) | images | breaching IG, PSNR mean ± std (median) | gradjax IG | gradjax higher on "
          "| breaching s per image | gradjax s per image |\n|---|---|---|---|---|---|---|\n"
          + "\n".join(lines) + "\n")
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  with open(os.path.join(RUNS, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(numbers, fh, indent=1)
  print(text)


if __name__ == "__main__":
  {"export": export, "attack": attack, "table": table}[sys.argv[1]]()
