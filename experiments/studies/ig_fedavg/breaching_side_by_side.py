"""The FedAvg replay rows side by side with breaching 0.1.2's replay of the same update.

The same image, the same model draw (the ConvNet of width 64 that ``config.py:VARIANT --index=I``
attacks, exported in PyTorch layout by gradjax.interop), the same client (5 local SGD steps of lr
1e-4 on the one image, the model in evaluation mode, cross entropy) and the same attack:
breaching's ``invertinggradients`` attacker with its multi-step objective (it replays the client's
local steps on the candidate, as gradjax's ``inverting_gradients_fedavg`` does), 1 − cosine over
all parameters, TV 1e-4 (breaching's mean |dx| + |dy| is gradjax's up to the border), signed Adam
with the step decay at 3/8, 5/8 and 7/8 of the budget, the box, one restart, labels known; the
budget and learning rate are the gradjax run's (``--iterations`` to shorten both sides alike).
breaching's client computes its own update from the exported weights; ``attack`` first checks it
against gradjax's (relative difference under 1e-2: both are differences of float32 weights, each
about 1e-3 from a float64 client's), which checks the twin. One thread.

  python experiments/studies/ig_fedavg/breaching_side_by_side.py export [--index=500] [--iterations=N]
  /path/to/breaching-env/bin/python experiments/studies/ig_fedavg/breaching_side_by_side.py attack
  python experiments/studies/ig_fedavg/breaching_side_by_side.py table   # runs/breaching/table.md

``table`` scores breaching's reconstructions with gradjax.metrics beside the gradjax runs named in
:data:`RUNS_OF` (the same image, model and budget); a shortened budget is compared with a gradjax
run of that budget, ``runs/breaching/gradjax_<I>_<N>`` (``export`` prints its command).
"""

import argparse
import glob
import json
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "runs", "breaching")
VARIANT = "fedavg_replay_1img_5steps_convnet64"
RUNS_OF = {0: "runs/fedavg_replay_1img_5steps_convnet64", 500: "runs/fedavg_replay_1img_5steps_convnet64_500"}
TV = 1e-4


def _gradjax_run(index: int, iterations: int, full: int) -> str:
  if iterations == full and index in RUNS_OF:
    return RUNS_OF[index]
  return f"runs/breaching/gradjax_{index}_{iterations}"


def export(index: int, iterations: int | None):
  """Writes runs/breaching/inputs/<index>_<iterations>.npz: the image, its label, the model's
  weights (``w:<name>``) and gradjax's update W_t − W_{t+1} (``u:<name>``), in PyTorch layout."""
  import importlib.util
  import jax
  from gradjax import data, interop, models
  from gradjax.run import config, pipeline
  spec = importlib.util.spec_from_file_location("ig_fedavg_config", os.path.join(HERE, "config.py"))
  study = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(study)
  cfg = config.replace(config.from_dict(study.get_config(VARIANT)), {"data.index": index})
  full = cfg.attack.iterations
  iterations = iterations or full
  key_model = pipeline.experiment_keys(cfg.seed, index).model
  batch = pipeline.load_batch(cfg)
  norm = data.normalization(cfg.data.normalization)
  model = models.create(cfg.model.name, key_model, input_shape=batch.x.shape[1:],
                        num_classes=batch.num_classes, init=cfg.model.init, conv=cfg.model.conv)
  x = np.asarray(data.normalize(batch.x, norm), np.float32)
  observation = cfg.client.build(share_labels=True)(model.apply_fn, model.variables, x, batch.y)
  mapping = interop.zoo_mapping(model)
  weights = interop.variables_to_torch(model.variables, mapping)
  update = interop.params_to_torch(jax.device_get(observation.gradient), mapping)
  attack = config.get_attack(cfg)
  local = observation.local
  os.makedirs(os.path.join(OUT, "inputs"), exist_ok=True)
  path = os.path.join(OUT, "inputs", f"{index}_{iterations}.npz")
  np.savez(path, x=batch.x, y=batch.y, index=index, mean=np.array(norm.mean), std=np.array(norm.std),
           width=models.family(cfg.model.name).parse(cfg.model.name).width, num_classes=batch.num_classes,
           local_lr=local.learning_rate, local_steps=local.steps(len(batch.y)),
           local_batch=local.batch_size or len(batch.y), iterations=iterations, full_iterations=full,
           attack_lr=attack.optimizer.learning_rate,
           **{f"w:{k}": v for k, v in weights.items()}, **{f"u:{k}": v for k, v in update.items()})
  print(f"wrote {path}")
  run = _gradjax_run(index, iterations, full)
  if not os.path.exists(os.path.join(HERE, run, "metrics.json")):
    print(f"gradjax's side: gradjax reconstruct --config=experiments/studies/ig_fedavg/config.py:{VARIANT} "
          f"--index={index} --iterations={iterations} --lpips=none "
          f"--output_dir=experiments/studies/ig_fedavg/{run}")


def _twin(torch, saved):
  """gradjax's convnet-W in PyTorch, named as gradjax.interop exports it (model.conv{i}, model.bn{i},
  model.linear), its weights and BatchNorm buffers from ``saved``."""
  nn = torch.nn
  w, classes = int(saved["width"]), int(saved["num_classes"])

  class Body(nn.Module):
    def __init__(self):
      super().__init__()
      c = 3
      for i, out in enumerate(w * m for m in (1, 2, 2, 4, 4, 4, 4, 4)):
        setattr(self, f"conv{i}", nn.Conv2d(c, out, 3, padding=1))
        setattr(self, f"bn{i}", nn.BatchNorm2d(out))
        c = out
      self.linear = nn.Linear(4 * w * 3 * 3, classes)  # 32 x 32 inputs: two 3 x 3 max-pools leave 3 x 3

    def forward(self, x):
      for i in range(8):
        x = torch.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        if i in (5, 7):
          x = torch.nn.functional.max_pool2d(x, 3)
      return self.linear(x.flatten(1))

  class ConvNet(nn.Module):
    def __init__(self):
      super().__init__()
      self.model = Body()

    def forward(self, x):
      return self.model(x)

  net = ConvNet()
  net.load_state_dict({k[2:]: torch.as_tensor(saved[k]) for k in saved.files if k.startswith("w:")})
  return net.eval()


def attack():
  import logging
  import breaching
  import torch
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # breaching's progress
  torch.set_num_threads(1)
  os.makedirs(os.path.join(OUT, "outputs"), exist_ok=True)
  for path in sorted(glob.glob(os.path.join(OUT, "inputs", "*.npz"))):
    name = os.path.basename(path)[:-4]
    out = os.path.join(OUT, "outputs", f"{name}.npz")
    if os.path.exists(out):
      continue
    saved = np.load(path)
    mean, std = (torch.as_tensor(saved[k], dtype=torch.float).view(1, 3, 1, 1) for k in ("mean", "std"))
    x = (torch.as_tensor(saved["x"]).permute(0, 3, 1, 2) - mean) / std
    y = torch.as_tensor(saved["y"]).long()
    model = _twin(torch, saved)
    server = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.CrossEntropyLoss()
    steps, per_step, lr = int(saved["local_steps"]), int(saved["local_batch"]), float(saved["local_lr"])
    # The client: plain SGD over its batches in order, the model in evaluation mode (as breaching's
    # UserMultiStep with buffers shared, and gradjax's fedavg client).
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    labels_per_step = []
    for s in range(steps):
      part = slice((s * per_step) % len(y), (s * per_step) % len(y) + per_step)
      labels_per_step.append(y[part].sort()[0])
      sgd.zero_grad()
      loss(model(x[part]), y[part]).backward()
      sgd.step()
    update = [(p - q).detach() for p, q in zip(model.parameters(), server)]  # W_{t+1} − W_t
    names = [n for n, _ in model.named_parameters()]
    theirs = np.concatenate([-u.numpy().ravel() for u in update])
    ours = np.concatenate([saved[f"u:{n}"].ravel() for n in names])
    error = float(np.linalg.norm(theirs - ours) / np.linalg.norm(ours))
    print(f"{name}: breaching's client update against gradjax's: relative error {error:.2e}", flush=True)
    # Both updates are differences of float32 weights 1e-4 apart: each is about 1e-3 from a float64
    # client's (measured on image 500), so a twin that agrees to 1e-2 is the same client.
    if error > 1e-2:
      raise SystemExit(f"{name}: the PyTorch twin's update differs from gradjax's ({error:.2e})")
    with torch.no_grad():
      for p, q in zip(model.parameters(), server):
        p.copy_(q)

    cfg = breaching.get_attack_config("invertinggradients")
    cfg.optim.max_iterations = int(saved["iterations"])
    cfg.optim.callback = 200
    cfg.optim.step_size = float(saved["attack_lr"])
    cfg.regularization.total_variation.scale = TV

    class Shape:  # the data description breaching's attacker reads
      shape, modality = tuple(x.shape[1:]), "vision"
      mean, std = tuple(saved["mean"].tolist()), tuple(saved["std"].tolist())

    attacker = breaching.attacks.prepare_attack(model, loss, cfg, dict(dtype=torch.float,
                                                                          device=torch.device("cpu")))
    buffers = [b.detach().clone() for b in model.buffers()]
    payload = [dict(parameters=server, buffers=buffers, metadata=Shape)]
    shared = [dict(gradients=update, buffers=buffers,
                   metadata=dict(num_data_points=len(y), labels=y,
                                 local_hyperparams=dict(lr=lr, steps=steps, data_per_step=per_step,
                                                        labels=labels_per_step)))]
    torch.manual_seed(int(saved["index"]))
    start = time.perf_counter()
    rec, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    seconds = time.perf_counter() - start
    pixels = (rec["data"].detach() * std + mean).permute(0, 2, 3, 1).numpy()
    np.savez(out, x=pixels, seconds=seconds, update_error=error,
             versions=json.dumps({"breaching": "0.1.2", "torch": torch.__version__}))
    print(f"{name}: {seconds:.1f} s", flush=True)


def table():
  from gradjax import metrics
  rows, lines = [], []
  for path in sorted(glob.glob(os.path.join(OUT, "outputs", "*.npz"))):
    name = os.path.basename(path)[:-4]
    index, iterations = map(int, name.split("_"))
    truth = np.load(os.path.join(OUT, "inputs", f"{name}.npz"))
    got = np.load(path)
    run = _gradjax_run(index, iterations, int(truth["full_iterations"]))
    mine = json.load(open(os.path.join(HERE, run, "metrics.json"), encoding="utf-8"))
    row = dict(index=index, iterations=iterations, attack_lr=float(truth["attack_lr"]),
               breaching_psnr=float(metrics.score(np.clip(got["x"], 0, 1), truth["x"])["psnr"]),
               breaching_s=float(got["seconds"]), update_error=float(got["update_error"]),
               gradjax_psnr=float(mine["psnr"]), gradjax_s=float(mine["wall_time_s"]), gradjax_run=run)
    rows.append(row)
    lines.append(f"| {index} | {iterations} | {row['attack_lr']:g} | {row['breaching_psnr']:.2f} | "
                 f"{row['gradjax_psnr']:.2f} | {row['breaching_s']:.0f} | {row['gradjax_s']:.0f} | "
                 f"{row['update_error']:.1e} |")
  text = ("| image | iterations | attack lr | breaching PSNR (dB) | gradjax PSNR (dB) | breaching s | "
          "gradjax s | client update, relative difference |\n|---|---|---|---|---|---|---|---|\n"
          + "\n".join(lines) + "\n")
  with open(os.path.join(OUT, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  with open(os.path.join(OUT, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(rows, fh, indent=1)
  print(text)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("step", choices=("export", "attack", "table"))
  parser.add_argument("--index", type=int, default=500)
  parser.add_argument("--iterations", type=int, default=None)
  args = parser.parse_args()
  if args.step == "export":
    export(args.index, args.iterations)
  else:
    {"attack": attack, "table": table}[args.step]()
