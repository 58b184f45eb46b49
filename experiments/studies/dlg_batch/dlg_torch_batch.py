r"""DLG's batch table in its reference form, PyTorch eager: does the reference loop converge where
gradjax's stalls?

For each batch size B in ``--batch_sizes`` and ``--count`` batches (batch i holds CIFAR-10 test
images ``start + i·B`` to ``start + (i+1)·B − 1``, as ``sweep.py --batch_size=B`` takes them), the
same LeNet(Zhu) that ``sweep.py`` attacks for that experiment (gradjax's model for its index, its
weights copied into ``benchmarks.torch_ports``' PyTorch port, whose logits are checked against gradjax's on
the batch: ``logit_gap``, the largest difference) is attacked with DLG's reference loop: dummy data
and label logits N(0, 1) (``torch.manual_seed(seed + index)``, ``--seed``), ``torch.optim.LBFGS``
with lr 1, history 100 and 20 evaluations per step without a line search, ``--steps`` calls of
``step``; the objective is ``benchmarks.torch_ports.torch_dlg_objective`` (soft-label cross entropy, Σ‖∇W' −
∇W‖²). Each batch records the steps until the objective first reached ``--tol`` (what the paper
counts), the evaluations that took, the final objective, and the PSNR and label accuracy after
batch-order matching.

Writes ``results.json``, ``results.md`` and ``reconstructions.npz`` (batch B at index i as ``"B_i"``,
(B, H, W, C) in [0, 1]); needs PyTorch (``pip install torch``).

  python experiments/studies/dlg_batch/dlg_torch_batch.py --batch_sizes=1,2,4 --count=5 --steps=1200
"""

import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from benchmarks import torch_ports  # noqa: E402  (the clone's PyTorch ports)
from gradjax.cli import common  # noqa: E402
from gradjax import data, files, metrics, models  # noqa: E402
from gradjax.run import pipeline, report  # noqa: E402

flags.DEFINE_string("data_dir", None, "Data folder (default: $GRADJAX_DATA_DIR or ../shared/data).")
flags.DEFINE_list("batch_sizes", ["1", "2", "4"], "Batch sizes.")
flags.DEFINE_integer("start", 0, "First image index.")
flags.DEFINE_integer("count", 5, "Batches per batch size.")
flags.DEFINE_integer("steps", 1200, "LBFGS.step calls per batch (DLG's code: 300; the paper's batch "
                     "table: 270 / 602 / 1173 / 2711 for batches of 1 / 2 / 4 / 8).")
_SEED = common.define_fields("seed")["seed"]
flags.DEFINE_float("tol", 1e-5, "The objective that counts as converged (as the gradjax batch table).")
common.define_output_flags(resumable=False)
flags.adopt_module_key_flags(common)


def attack(torch, net, x_true: np.ndarray, y: np.ndarray, *, steps: int, tol: float, seed: int
           ) -> tuple[np.ndarray, dict]:
  """DLG's reference loop on one batch: ``steps`` LBFGS steps from N(0, 1) dummies (``seed``), until
  the objective reaches ``tol``. Returns the reconstruction clipped to [0, 1] (its batch order) and
  the row."""
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  params = list(net.parameters())
  x = torch.from_numpy(np.ascontiguousarray(x_true.transpose(0, 3, 1, 2)))
  client_loss = F.cross_entropy(net(x), torch.from_numpy(y))
  observed = [g.detach() for g in torch.autograd.grad(client_loss, params)]
  torch.manual_seed(seed)
  dummy_x = torch.randn(x.shape).requires_grad_(True)
  dummy_y = torch.randn((len(y), net(x).shape[-1])).requires_grad_(True)
  opt = torch.optim.LBFGS([dummy_x, dummy_y], lr=1, history_size=100)
  evaluations, converged_at, converged_evaluations, loss = 0, None, None, float("inf")

  def closure():
    nonlocal evaluations
    evaluations += 1
    opt.zero_grad()
    return torch_ports.torch_dlg_objective(net, params, observed, dummy_x, dummy_y)

  start = time.perf_counter()
  for step in range(1, steps + 1):
    opt.step(closure)
    opt.zero_grad()  # the objective after the step, as DLG's code reads it (not counted)
    loss = float(torch_ports.torch_dlg_objective(net, params, observed, dummy_x, dummy_y).detach())
    if not np.isfinite(loss):
      break
    if loss <= tol:
      converged_at, converged_evaluations = step, evaluations
      break
  rec = np.clip(dummy_x.detach().numpy().transpose(0, 2, 3, 1), 0.0, 1.0)
  finite = bool(np.all(np.isfinite(rec)))
  scores = metrics.score(rec, x_true) if finite else None
  labels = dummy_y.detach().numpy().argmax(-1)
  row = dict(converged_step=converged_at, converged_evaluations=converged_evaluations, steps=step,
             evaluations=evaluations, loss=loss, finite=finite,
             psnr=scores["psnr"] if scores else None, ssim=scores["ssim"] if scores else None,
             labels=labels.tolist(), label_accuracy=metrics.label_accuracy(labels, y),
             wall_time_s=time.perf_counter() - start)
  return rec, row


def markdown(result: dict) -> str:
  lines = [f"# DLG's reference loop in PyTorch eager on gradjax's batches ({result['count']} per size)",
           "", f"`{result['command']}`", "",
           f"{result['device']}; torch {result['torch']}; {result['wall_time_s']:.0f} s.", "",
           f"| batch | converged (objective ≤ {result['tol']:g}) | steps to converge, median | "
           "final objective, median | PSNR mean ± std | label acc. | time / batch |",
           "|---|---|---|---|---|---|---|"]
  for b, rows in result["rows"].items():
    done = [r["converged_step"] for r in rows if r["converged_step"] is not None]
    psnr = np.array([r["psnr"] if r["psnr"] is not None else np.nan for r in rows])
    lines.append(f"| {b} | {len(done)} / {len(rows)} | "
                 + (f"{np.median(done):.0f}" if done else f"– (of {result['steps']})")
                 + f" | {np.median([r['loss'] for r in rows]):.2e} | {np.nanmean(psnr):.2f} ± "
                 f"{np.nanstd(psnr):.2f} | {100 * np.mean([r['label_accuracy'] for r in rows]):.0f} % | "
                 f"{np.mean([r['wall_time_s'] for r in rows]):.1f} s |")
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  try:
    sizes = [int(b) for b in f.batch_sizes]
  except ValueError:
    common.fail(f"--batch_sizes takes integers, got {f.batch_sizes}")
  if min(sizes + [f.count, f.steps]) < 1 or f.start < 0 or not f.tol > 0:
    common.fail("batch sizes, --count and --steps must be positive, --start not negative, --tol > 0")
  torch = torch_ports.import_torch()
  if torch is None:
    common.fail("this program needs PyTorch: pip install torch")
  torch.set_num_threads(1)
  out = common.output_folder("dlg_torch_batch", own=("results.*", "reconstructions.npz"))
  start = time.perf_counter()
  result = {**common.provenance(), "torch": torch.__version__, "batch_sizes": sizes, "count": f.count,
            "start": f.start, "steps": f.steps, "tol": f.tol, "seed": _SEED.value, "rows": {}}
  try:
    source = data.load("cifar10", data_dir=f.data_dir,
                       indices=range(f.start, f.start + f.count * max(sizes)))
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  reconstructions = {}
  for b in sizes:
    rows = []
    for i in range(f.count):
      index = f.start + i * b
      x, y = source.x[index - f.start:index - f.start + b], source.y[index - f.start:index - f.start + b]
      key_model = pipeline.experiment_keys(_SEED.value, index)[0]
      model = models.create("lenet_zhu", key_model, input_shape=x.shape[1:],
                            num_classes=source.num_classes)
      try:
        net, gap = torch_ports.torch_lenet(model, torch, x)
      except ValueError as e:
        common.fail(f"index {index}: {e}")
      rec, row = attack(torch, net, x.astype(np.float32), y.astype(np.int64), steps=f.steps, tol=f.tol,
                   seed=_SEED.value + index)
      rows.append({"index": index, "logit_gap": gap, **row})
      reconstructions[f"{b}_{index}"] = rec.astype(np.float32)
      print(f"batch {b}, index {index}: converged at step {row['converged_step']}, objective "
            f"{row['loss']:.2e}, PSNR {row['psnr']}", flush=True)
    result["rows"][str(b)] = rows
  result["wall_time_s"] = time.perf_counter() - start
  report.save_json(os.path.join(out, "results.json"), result)
  files.atomic_write(os.path.join(out, "reconstructions.npz"),
                      lambda fh: np.savez(fh, **reconstructions), binary=True)
  md = markdown(result)
  files.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(md), binary=False)
  print(md)
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
