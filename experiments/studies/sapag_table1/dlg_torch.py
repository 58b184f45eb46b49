r"""DLG's baseline of SAPAG's Table I in its reference form: DLG's own loop in PyTorch eager on the
same LeNet-5 draws and images as gradjax's ``dlg_fixed_*`` rows.

For each image index of ``--start``/``--count`` (CIFAR-100 test images in [0, 1]), the LeNet-5 that
``gradjax sweep`` attacks there (seed 0, ``--init``) is exported with gradjax.interop into a PyTorch
LeNet-5 (four 5x5 sigmoid convolutions of 12 channels, stride 1, and the head), its logits checked
against gradjax's, and attacked by DLG's reference loop (``experiments/studies/dlg_batch/
dlg_torch_batch.py``'s: dummy image and label logits N(0, 1), ``torch.optim.LBFGS`` lr 1, history 100,
up to 20 evaluations per step, no line search), ``--steps`` calls of ``step``: the paper's "500
iterations". Writes ``results.json`` and ``table.md`` into ``--output_dir``; needs PyTorch. Flags
as dlg_torch_batch.py's (``--start`` and ``--count`` count images here), and ``--init``.

  python experiments/studies/sapag_table1/dlg_torch.py --start=60 --count=10 \
      --output_dir=experiments/studies/sapag_table1/runs/dlg_torch_lenet5_uniform_cifar100_60-69
"""

import json
import os
import sys

import numpy as np
from absl import app, flags

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dlg_batch"))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
import dlg_torch_batch  # noqa: E402  (DLG's reference loop)
from gradjax import data, interop, models  # noqa: E402
from gradjax.run import pipeline  # noqa: E402
from gradjax.cli import common  # noqa: E402

# dlg_torch_batch defines --data_dir, --start, --count, --steps and the output flags; here they
# count images of CIFAR-100 and default to the unseen range and the paper's 500 steps.
flags.DEFINE_enum("init", "uniform", ["uniform", "xavier_normal"], "LeNet-5's initialisation.")
flags.FLAGS.set_default("start", 60)
flags.FLAGS.set_default("count", 10)
flags.FLAGS.set_default("steps", 500)

def lenet5(torch, weights: dict, num_classes: int, size: int):
  """LeNet-5 of SAPAG in PyTorch, named as gradjax.interop exports it (body.{0,2,4,6}, fc.0)."""

  class LeNet5(torch.nn.Module):
    def __init__(self):
      super().__init__()
      layers = []
      for c in (3, 12, 12, 12):
        layers += [torch.nn.Conv2d(c, 12, 5, 1, 2), torch.nn.Sigmoid()]
      self.body = torch.nn.Sequential(*layers)
      self.fc = torch.nn.Sequential(torch.nn.Linear(12 * size * size, num_classes))

    def forward(self, x):
      return self.fc(self.body(x).flatten(1))

  net = LeNet5()
  net.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})
  return net


def main(argv):
  del argv
  f = flags.FLAGS
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  out = common.output_folder(f"dlg_torch_lenet5_{f.init}_cifar100", own=("results.json", "table.md"))
  source = data.load("cifar100", data_dir=f.data_dir, indices=range(f.start, f.start + f.count))
  rows = []
  for i, index in enumerate(range(f.start, f.start + f.count)):
    x, y = source.x[i:i + 1].astype(np.float32), source.y[i:i + 1].astype(np.int64)
    model = models.create("lenet5", pipeline.experiment_keys(0, index)[0], input_shape=x.shape[1:],
                          num_classes=source.num_classes, init=f.init)
    net = lenet5(torch, interop.variables_to_torch(model.variables, interop.zoo_mapping(model)),
                 source.num_classes, x.shape[1])
    with torch.no_grad():
      logits = net(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).numpy()
    reference = np.asarray(model.apply_fn(model.variables, x, False))
    gap = float(np.max(np.abs(logits - reference)) / np.max(np.abs(reference)))
    if not gap <= 1e-5:  # relative: a head of 12 288 inputs sums to logits in the tens
      common.fail(f"image {index}: the PyTorch LeNet-5 misses gradjax's logits by {gap:.1e} of their scale")
    _, row = dlg_torch_batch.attack(torch, net, x, y, steps=f.steps, tol=0.0, seed=index)
    rows.append({"index": index, "logit_gap": gap, **row})
    print(f"image {index}: PSNR {row['psnr']}, objective {row['loss']:.2e}, {row['evaluations']} "
          f"evaluations, {row['wall_time_s']:.0f} s", flush=True)
  psnr = np.array([r["psnr"] if r["psnr"] is not None else np.nan for r in rows])
  result = {**common.provenance(), "torch": torch.__version__, "init": f.init, "start": f.start,
            "count": f.count, "steps": f.steps, "rows": rows,
            "psnr_mean": float(np.nanmean(psnr)), "psnr_median": float(np.nanmedian(psnr)),
            "at_30_db": int(np.sum(psnr >= 30)), "diverged": int(np.sum(~np.isfinite(psnr)))}
  with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(result, fh, indent=1)
  lines = [f"# DLG's reference loop (PyTorch eager) on SAPAG's LeNet-5, {f.init} init", "",
           f"`{result['command']}`", "", "| image | PSNR (dB) | final objective | evaluations | s |",
           "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['index']} | {r['psnr'] if r['psnr'] is None else round(r['psnr'], 2)} | "
                 f"{r['loss']:.2e} | {r['evaluations']} | {r['wall_time_s']:.0f} |")
  lines.append(f"\nMean {result['psnr_mean']:.2f} dB, median {result['psnr_median']:.2f}, "
               f"{result['at_30_db']} of {len(rows)} at 30 dB, {result['diverged']} not finite.")
  with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as fh:
    fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
