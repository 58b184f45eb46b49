"""What the dense head of an untrained ConvNet-16 gives away at batch 32: the labels and each class's
mean head input, from the FedSGD gradient alone.

  python experiments/studies/batches/convnet_head.py --data_dir=../shared/data

Ten batches of 32 CIFAR-10 test images (500-819, in [0, 1]), a fresh ConvNet-16 per batch (Flax's
default init, evaluation mode), labels not shared. Per batch: the label multiset from the bias
gradient (gradjax.labels, ``bias_counts``), then the head's input per class present
(gradjax.analytic.head_inputs, from the head's weight and bias gradients and the inferred labels)
against the true mean head input of that class's examples (gradjax.objectives.head_input on the
client's images). Each class row's error is its distance to the true class mean over the batch's
spread (the RMS distance of the examples' head inputs to their batch mean); the baseline guesses the
batch's mean input for every class, as an attacker who knows the model's feature statistics but
nothing of this update would. Where all ten classes are present the rows are free along one
direction; the table gives the errors' second over first singular value and the rows pinned along
it (analytic.head_inputs with ``mean_input``) by the attacker's estimate of the batch's mean head
input (the mean over CIFAR-10 training images 0-499, its own) and, as an oracle, by the true one. Per-example inputs (analytic.head_inputs_per_example) need N ≤ K − 1
(here 32 > 9). Writes runs/convnet_head/table.md and table.json.
"""

import argparse
import json
import os

import jax
import numpy as np

from gradjax import analytic, clients, data, labels, metrics, models, objectives

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "convnet_head")
FIRST, BATCH, BATCHES = 500, 32, 10
OWN = 500  # the attacker's own images: CIFAR-10 training images 0-499


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  own = data.load("cifar10_train", data_dir=args.data_dir, indices=range(OWN)).x

  def own_mean(model):  # the attacker's estimate: the mean head input over its own images
    return np.asarray(objectives.head_input(model.apply_fn, model.variables, own), np.float64).mean(0)

  rows = []
  for b in range(BATCHES):
    images = data.load("cifar10", data_dir=args.data_dir,
                       indices=range(FIRST + b * BATCH, FIRST + (b + 1) * BATCH))
    model = models.create("convnet-16", jax.random.key(b), input_shape=images.x.shape[1:])
    obs = clients.fedsgd(model.apply_fn, model.variables, images.x, images.y)
    inferred = np.asarray(labels.infer(obs, "bias_counts"))
    head, grad = model.variables["params"]["head"], obs.gradient["head"]
    found = analytic.head_inputs(head["kernel"], head["bias"], grad["kernel"], grad["bias"], inferred)
    h = np.asarray(objectives.head_input(model.apply_fn, model.variables, images.x), np.float64)
    spread = np.sqrt(np.mean(np.sum((h - h.mean(0)) ** 2, axis=1)))
    errors, baseline = [], []
    for c, feature in zip(found.classes, found.features):
      truth = h[images.y == c].mean(0) if np.any(images.y == c) else None
      if truth is None:  # a class the labels got wrong: no true mean to compare with
        continue
      errors.append(float(np.linalg.norm(feature - truth) / spread))
      baseline.append(float(np.linalg.norm(h.mean(0) - truth) / spread))
    # Where every class is present, E's rows are dependent and the rows are free along one direction:
    # the errors' singular values, and the rows pinned by an estimate of the batch's mean head input
    # (head_inputs(mean_input=)): the attacker's (its own images' mean) and the true one (an oracle).
    known = np.isin(found.classes, images.y)
    truth = np.stack([h[images.y == c].mean(0) for c in found.classes[known]])
    sv = np.linalg.svd(found.features[known] - truth, compute_uv=False)
    pinned = {}
    for name, mean in (("own", own_mean(model)), ("oracle", h.mean(0))):
      rows_pinned = analytic.head_inputs(head["kernel"], head["bias"], grad["kernel"], grad["bias"],
                                         inferred, mean_input=mean).features[known]
      pinned[name] = (np.linalg.norm(rows_pinned - truth, axis=1) / spread).tolist()
    rows.append({"batch": b, "classes": int(len(found.classes)),
                 "error_sv_ratio": float(sv[1] / sv[0]) if sv[0] > 0 else 0.0,
                 "own_mean_errors": pinned["own"], "oracle_mean_errors": pinned["oracle"],
                 "labels_exact": sorted(inferred.tolist()) == sorted(images.y.tolist()),
                 "label_accuracy": metrics.label_accuracy(inferred, images.y),
                 "residual": float(found.residual), "errors": errors, "baseline": baseline,
                 "head_inputs": int(h.shape[1])})
    print(b, rows[-1]["labels_exact"], f"{np.median(errors):.3f}", f"{np.median(baseline):.3f}", flush=True)
  errors = np.concatenate([r["errors"] for r in rows])
  baseline = np.concatenate([r["baseline"] for r in rows])
  summary = {"batches": BATCHES, "batch_size": BATCH,
             "labels_exact": int(sum(r["labels_exact"] for r in rows)),
             "label_accuracy_mean": float(np.mean([r["label_accuracy"] for r in rows])),
             "class_rows": int(errors.size), "within_10pct": int(np.sum(errors <= 0.1)),
             "share_within_10pct": float(np.mean(errors <= 0.1)),
             "error_median": float(np.median(errors)), "baseline_median": float(np.median(baseline)),
             "residual_median": float(np.median([r["residual"] for r in rows])),
             **{f"{name}_mean_error_median_all_classes": float(np.median(np.concatenate(
                 [r[f"{name}_mean_errors"] for r in rows if r["classes"] == 10] or [[np.nan]])))
                for name in ("own", "oracle")}}
  os.makedirs(RUNS, exist_ok=True)
  with open(os.path.join(RUNS, "table.json"), "w") as f:
    json.dump({"summary": summary, "rows": rows}, f, indent=1)
  lines = ["| batch | classes | labels exact | class rows within 10 % | row error (median) | batch-mean guess (median) | residual | errors' σ2/σ1 | pinned by the attacker's mean (median) | pinned by the true mean (oracle, median) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    e = np.asarray(r["errors"])
    lines.append(f"| {r['batch']} | {r['classes']} | {'yes' if r['labels_exact'] else 'no'} | "
                 f"{int(np.sum(e <= 0.1))} / {e.size} | {np.median(e):.3f} | {np.median(r['baseline']):.3f} | "
                 f"{r['residual']:.2e} | {r['error_sv_ratio']:.3f} | {np.median(r['own_mean_errors']):.3f} | "
                 f"{np.median(r['oracle_mean_errors']):.3f} |")
  s = summary
  lines.append(f"| all | | {s['labels_exact']} / {s['batches']} | {s['within_10pct']} / {s['class_rows']} | "
               f"{s['error_median']:.3f} | {s['baseline_median']:.3f} | {s['residual_median']:.2e} | | "
               f"{s['own_mean_error_median_all_classes']:.3f} (all classes present) | "
               f"{s['oracle_mean_error_median_all_classes']:.3f} (all classes present) |")
  with open(os.path.join(RUNS, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
