"""Batch label recovery with repeated labels: the rules of gradjax.labels compared on real images.

Each of ``--count`` clients holds a batch of ``--batch_size`` real test images WITH repeated labels and
sends one FedSGD gradient of a freshly initialised (untrained) model. Every method infers the batch's
label multiset from that gradient; we report the order-free label accuracy
(:func:`gradjax.metrics.label_accuracy`) and how many batches were recovered exactly.

Batch construction (seeded ``numpy.random.Generator(--seed)``): for batch b, draw
``--config.sampling.classes_per_batch`` distinct classes, then ``--batch_size`` labels from them WITH replacement (so
with classes_per_batch < batch_size some class always repeats), then for each label a distinct image
of that class from the ``--config.sampling.pool`` images of the dataset from ``--start`` (0: the first). The model of
batch b is initialised from ``fold_in(key(--seed), b)``.

Methods (see gradjax.labels):
  negative_bias, yin    distinct labels only: they lose every repeat by design
  llg                   LLG (Wainakh et al.): impact estimated from the gradient
  bias_counts           k_c = N (1/K − ∂L/∂b_c), rounded (Geng et al.'s estimate on the bias)
  llg* (dummy)          LLG with impact and offset measured on ``--aux_size`` dummy U(0, 1) images
  bias_counts (dummy p̂) p̄ estimated as the mean softmax of the same dummy images
  bias_counts (oracle)  p̄ of the client's own batch: exact by construction (a check, not an attack)
  idlg                  only with --batch_size=1

  gradjax label-recovery
  gradjax label-recovery --model=mlp
  gradjax label-recovery --dataset=mnist --count=100 --output=labels.json

Over several processes (the launch flags, :mod:`gradjax.cli.distributed`), batch b runs on process
b mod P and process 0 prints and writes the table.

Data and model come from ``--config=batch_labels`` (the default; flags override it). Prints a
Markdown table; ``--output=X.json`` writes the per-batch results as JSON and the table
beside it as ``X.md``. Bad flags or data: one-line
error, exit code 2.
"""

import os
import time

import jax
import numpy as np
from absl import app, flags

from gradjax.cli import common, distributed
from gradjax.cli.common import fail, parse_flags, provenance
from gradjax import clients, compilation, data, files, labels, metrics, models
from gradjax.run import report

# configs/batch_labels.py; images of batches it samples itself, fresh models (no checkpoint or captures).
common.define_flags("batch_labels", sections=("data", "model", "sampling"),
                    omit=("data.index", "data.modality", "data.sequence_length", "data.min_length",
                          "data.tokenizer",
                          "data.vocab_size", "model.checkpoint", "model.weights", "model.rename",
                          "model.conv", "model.text_dim", "model.text_ffn", "model.text_heads",
                          "model.text_layers"))
common.define_table_flags(psnr=False)
flags.DEFINE_integer("aux_size", 16, "Dummy images for the LLG* and p̂ estimates (0: skip those rows).")
common.define_results_file_flag()
common.define_launch_flags(collectives=False)  # batches split over processes

NEEDS = {
    "idlg": "batch 1, features ≥ 0",
    "negative_bias": "bias; distinct labels",
    "yin": "features ≥ 0; distinct labels",
    "llg": "features ≥ 0",
    "bias_counts": "bias; p ≈ 1/K",
    "llg* (dummy)": "features ≥ 0; white-box model",
    "bias_counts (dummy p̂)": "bias; white-box model",
    "bias_counts (oracle p̄)": "the client's own p̄ (check)",
}


def attack(method, obs, model, x, dummy, log_softmax):
  """Labels of ``obs`` by the experiment's method name (registry names and the three variants)."""
  if method == "llg* (dummy)":
    impact, offset = labels.llg_statistics(model.apply_fn, model.variables, dummy, obs.num_samples)
    return labels.llg(obs, impact=impact, offset=offset)
  if method == "bias_counts (dummy p̂)":
    return labels.bias_counts(obs, probs=labels.mean_probs(model.apply_fn, model.variables, dummy))
  if method == "bias_counts (oracle p̄)":
    return labels.bias_counts(obs, probs=np.exp(log_softmax(model.apply_fn(model.variables, x))).mean(0))
  return labels.infer(obs, method)


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  try:
    cfg = common.config_from_flags()
  except ValueError as e:
    fail(str(e))
  common.check_output_file(beside=(".md",))
  if f.aux_size < 0:
    fail(f"--aux_size must be ≥ 0, got {f.aux_size}")
  start = time.perf_counter()
  try:
    try:
      size = None if cfg.data.image_size is None else (cfg.data.image_size, cfg.data.image_size)
      pool = data.load(
          cfg.data.dataset,
          data_dir=cfg.data.data_dir,
          indices=range(f.start, f.start + cfg.sampling.pool),
          image_size=size,
          channels=cfg.data.channels)
    except ValueError as e:
      raise ValueError(f"{e}: --start={f.start} with a pool of {cfg.sampling.pool} images reads images "
                       f"{f.start}..{f.start + cfg.sampling.pool - 1} (lower --start or "
                       "--config.sampling.pool)" if "out of range" in str(e) else str(e)) from None
    pool_x, pool_y = pool.x, pool.y
    num_classes = cfg.model.num_classes or pool.num_classes
    if int(pool_y.max()) >= num_classes:
      raise ValueError(f"--config.model.num_classes={num_classes} but the data has label {int(pool_y.max())}")
    if cfg.sampling.classes_per_batch > num_classes:
      raise ValueError(
          f"--config.sampling.classes_per_batch={cfg.sampling.classes_per_batch} exceeds the {num_classes} classes")
    norm = data.normalization(cfg.data.normalization or "none")
    init = models.get_module(
        cfg.model.name, num_classes=num_classes, init=cfg.model.init, act=cfg.model.act).weight_init
    rng = np.random.default_rng(cfg.seed)
    batches = data.duplicate_label_batches(pool_y, num_classes, f.count, cfg.data.batch_size,
                                           cfg.sampling.classes_per_batch, rng)
    methods = (["idlg"] if cfg.data.batch_size == 1 else
               []) + ["negative_bias", "yin", "llg", "bias_counts"]
    if f.aux_size:
      methods += ["llg* (dummy)", "bias_counts (dummy p̂)"]
    methods += ["bias_counts (oracle p̄)"]
    per_batch = {}  # this process's batches: b -> method -> (labels, seconds) or the method's error
    for b in range(distributed.process_index(), f.count, distributed.process_count()):
      idx = batches[b]
      key_model, key_dummy = jax.random.split(jax.random.fold_in(jax.random.key(cfg.seed), b))
      model = cfg.model.build(key_model, pool_x.shape[1:], num_classes)
      x = data.normalize(pool_x[idx], norm)
      y = pool_y[idx]
      obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
      dummy = data.normalize(np.asarray(compilation.uniform(key_dummy, (f.aux_size, *pool_x.shape[1:]))), norm)
      per_batch[b] = {}
      for method in methods:
        t = time.perf_counter()
        try:
          got = np.asarray(attack(method, obs, model, x, dummy, _log_softmax))
        except ValueError as e:  # The method does not apply to this setting (e.g. batch > classes).
          per_batch[b][method] = str(e)
          continue
        per_batch[b][method] = (got.tolist(), time.perf_counter() - t)
  except (ValueError, FileNotFoundError) as e:
    fail(str(e))
  shares = distributed.gather(sorted(per_batch.items()))
  if shares is None:  # not process 0, which prints and writes the table
    distributed.finished()
    return
  results = {m: {"accuracy": [], "exact": [], "time_s": [], "labels": [], "error": None} for m in methods}
  for b, outcome in sorted((b, outcome) for share in shares for b, outcome in share):
    y = pool_y[batches[b]]
    for method, r in results.items():
      if r["error"]:  # a method that does not apply to one batch is reported as not applying
        continue
      if isinstance(outcome[method], str):
        r["error"] = outcome[method]
        continue
      got, seconds = np.asarray(outcome[method][0]), outcome[method][1]
      r["time_s"].append(seconds)
      r["labels"].append(got)
      r["accuracy"].append(metrics.label_accuracy(got, y))
      r["exact"].append(sorted(got.tolist()) == sorted(y.tolist()))

  wall = time.perf_counter() - start
  distinct = [len(np.unique(pool_y[idx])) for idx in batches]
  lines = [
      f"Label recovery on {f.count} {cfg.data.dataset} batches of {cfg.data.batch_size} (images "
      f"{f.start}-{f.start + cfg.sampling.pool - 1}, labels from "
      f"{cfg.sampling.classes_per_batch} classes with replacement, {np.mean(distinct):.2f} distinct on average), "
      f"fresh {cfg.model.name} (init {init}) per batch, seed {cfg.seed}:", "",
      "| method | needs | label accuracy (mean ± std) | exact batches | ms / batch (median) |",
      "|---|---|---|---|---|"
  ]
  summary = {}
  for method, r in results.items():
    if r["error"]:
      lines.append(f"| {method} | {NEEDS[method]} | n/a: {r['error']} | | |")
      summary[method] = {"error": r["error"]}
      continue
    acc = np.asarray(r["accuracy"])
    summary[method] = {
        "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std()),
        "exact_batches": int(np.sum(r["exact"])), "median_time_ms": float(np.median(r["time_s"]) * 1e3),
        "accuracy_per_batch": acc, "exact_per_batch": r["exact"], "labels_per_batch": r["labels"],
    }
    lines.append(f"| {method} | {NEEDS[method]} | {acc.mean():.3f} ± {acc.std():.3f} | "
                 f"{int(np.sum(r['exact']))}/{len(acc)} | {np.median(r['time_s']) * 1e3:.1f} |")
  upper = float(np.mean(np.asarray(distinct) / cfg.data.batch_size))
  lines += ["", f"Distinct-label methods can reach at most {upper:.3f} here (distinct classes / batch "
            f"size). Std is the population std over batches. Wall time {wall:.1f} s on {jax.devices()[0]}."]
  table = "\n".join(lines) + "\n"
  print(table, end="")
  if f.output:
    report.save_json(
        f.output, {
            "config": {
                "dataset": cfg.data.dataset, "start": f.start, "pool": int(len(pool_y)),
                "normalization": cfg.data.normalization, "model": cfg.model.name, "init": init,
                "act": cfg.model.act, "num_classes": num_classes, "count": f.count,
                "batch_size": cfg.data.batch_size,
                "classes_per_batch": cfg.sampling.classes_per_batch, "aux_size": f.aux_size,
                "seed": cfg.seed},
            "batches": {
                "indices": np.asarray(batches) + f.start, "labels": pool_y[batches],
                "distinct": distinct
            },
            "distinct_label_upper_bound": upper,
            "methods": summary,
            "wall_time_s": wall,
            **provenance(),
        })
    markdown = os.path.splitext(f.output)[0] + ".md"
    files.atomic_write(markdown, lambda fh: fh.write(table), binary=False)
    print(f"wrote {f.output} and {markdown}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
