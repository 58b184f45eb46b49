"""Batch inversion on a trained BatchNorm network: HFGInv's labels and its ablation (issue protocol).

Each of ``--count`` clients holds a batch of ``--batch_size`` CIFAR-10 test images WITH repeated labels
(``--config.sampling.classes_per_batch`` classes drawn per batch, labels drawn from them with replacement, images of
those classes from the ``--config.sampling.pool`` test images from ``--start``; seeded) and sends one FedSGD gradient of the
trained model (``--checkpoint``, e.g. ``gradjax train --model=resnet20 --config.client.train_mode=True ...``),
which runs in evaluation mode as the server sent it (``--config.client.train_mode=True``: in training mode, BatchNorm on
the batch's statistics, as a client training it does; ``--config.client.share_statistics=True``: the client also returns
the running statistics that step updated, so the BatchNorm prior matches the batch's own moments). ``--head=fresh`` (the default) replaces its last
layer by a new random one, as HFGInv's protocol does (an ImageNet ResNet-34 with a new 1000-class
head; ``--head_classes`` sets the new head's width); ``--head=trained`` keeps the checkpoint's, where
confidently classified examples leave their class almost no trace in the head's gradient.

Two tables, on the same batches:

* **labels**: the label multiset from the gradient by every rule of :mod:`gradjax.labels`:
  ``negative_bias`` and ``yin`` (distinct labels only), ``llg`` and ``bias_counts`` (duplicate-aware)
  and ``hfginv`` (candidates from the head gradient, counts by the evolutionary search against the
  sorted features of ``--config.attack.aux`` auxiliary images: the test images after the pool, never in a batch).
  Order-free label accuracy and exact batches.
* **ablation**: the image side with the true labels (so that label errors do not blur it), at
  ``--iterations`` for every variant (each preset's step counts scaled by :func:`gradjax.attacks.rescaled`):
  ``cosine + TV`` (one cosine over every layer, TV 0.01, signed Adam lr 0.1, step decay), ``+ BN prior``
  (= the ``gradinversion`` preset: GradInversion's BatchNorm statistics prior 1e-4), ``+ stepwise``
  (HFGInv's growing layer set with gradient dropout) and ``+ schedule`` (= ``hfginv``: TV from 1/5 and
  the BN prior from 1/3 of the run, quantised sign, ×0.33 step decay). PSNR, SSIM and LPIPS (AlexNet,
  when the ``lpips`` extra is installed) after matching the batch order, mean over the batches.

Every attack is kept in ``items/`` as it ends (its row as JSON, its reconstruction as .npz);
``--resume`` reads finished rows back, and the reconstruction only for the first batch's grid. Writes
results.md, results.csv (the ablation), results.json and a grid of the first batch. Over several
processes (the launch flags, :mod:`gradjax.cli.distributed`), attack k of the ablation (batches in
order, the variants of each) runs on process k mod P, and process 0 writes the tables.

  gradjax batch-table --checkpoint=runs/train_resnet20_cifar10/epoch_5.npz
"""

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from gradjax.cli import common, distributed
from gradjax import attacks, checkpoint, clients, data, files, labels, metrics, presets
from gradjax.run import config, pipeline, report

# The options of the schema it reads (gradjax.run.config); its protocol is gradjax/configs/batch_table.py.
common.define_flags(
    "batch_table",
    fields=("model.checkpoint", "data.data_dir", "data.batch_size", "sampling.pool",
            "sampling.classes_per_batch", "attack.aux", "attack.iterations", "client.train_mode",
            "client.share_statistics"))
common.define_table_flags(psnr=False)
flags.DEFINE_list("batches", None, "Attack only these batch numbers (0-based) in this call, e.g. to "
                  "share the ablation between processes; a later --resume call without it reads them back.")
flags.DEFINE_string("variants", "all", "Comma-separated subset of the ablation's variant keys "
                    "(tv, bn, stepwise, hfginv, head), or all; none skips the ablation.")
flags.DEFINE_float("bn", None, "The BatchNorm prior's weight in the variants that use it (the presets': "
                   "GradInversion's 1e-4, set for running statistics; a client's own batch moments, "
                   "--config.client.share_statistics=True, bear more).")
flags.DEFINE_float("tv", None, "The TV prior's weight in every variant (the presets' 1e-2 if unset).")
flags.DEFINE_enum("head", "fresh", ["fresh", "trained"], "The classifier head the server sends: fresh (re-initialised, HFGInv's protocol: a pretrained network with a new random last layer) or trained (the checkpoint's).")
flags.DEFINE_integer("head_classes", None, "--head=fresh: classes of the new head (default: the checkpoint's; HFGInv's protocol has 1000). Labels stay CIFAR-10's 0-9: more classes only thin out every class's share of the softmax.")
common.define_output_flags()
common.define_launch_flags(collectives=False)  # the ablation's attacks split over processes
flags.adopt_module_key_flags(common)

LABEL_METHODS = ("negative_bias", "yin", "llg", "bias_counts", "hfginv")


def variants(iterations: int, bn: float | None = None,
             tv: float | None = None) -> dict[str, tuple[str, attacks.Attack]]:
  """The ablation, key -> (row name, attack), each built on the previous one; ``bn`` and ``tv``: the
  BatchNorm and TV priors' weights (the presets' if None)."""
  weight = {k: v for k, v in (("bn", bn), ("tv", tv)) if v is not None}
  hf = presets.hfginv(iterations, **weight)
  gi = attacks.rescaled(presets.gradinversion(**weight), iterations)
  tv = dataclasses.replace(gi, name="cosine_tv", priors=gi.priors[:1])
  stepwise = dataclasses.replace(gi, name="gradinversion_stepwise", stepwise=hf.stepwise)
  # Not HFGInv's: each image's head input pulled towards its own, solved from the head's gradient
  # (gradjax.analytic.head_inputs_per_example), at inverting_gradients_batch's weight.
  head = dataclasses.replace(hf, head_features=presets.inverting_gradients_batch().head_features,
                             name="hfginv_head_features")
  return {"tv": ("cosine + TV", tv), "bn": ("+ BN prior (gradinversion)", gi),
          "stepwise": ("+ stepwise", stepwise), "hfginv": ("+ schedule (hfginv)", hf),
          "head": ("+ head features per example", head)}


def _settings_of(path: str):
  """The settings an item file was computed with (None where it is unreadable or has none)."""
  try:
    with open(path, encoding="utf-8") as fh:
      row = json.load(fh)
  except (OSError, ValueError):
    return None
  settings = row.get("settings") if isinstance(row, dict) else None
  return config.canonical(settings) if isinstance(settings, dict) else settings


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  try:
    cfg = common.config_from_flags()
  except ValueError as e:
    common.fail(str(e))
  if not cfg.model.checkpoint:
    common.fail("--checkpoint is required (a trained BatchNorm model, gradjax train --config.client.train_mode=True)")
  if cfg.client.share_statistics and not cfg.client.train_mode:
    common.fail("--config.client.share_statistics=True needs --config.client.train_mode=True (in evaluation mode the statistics stay as sent)")
  if f.count < 1 or cfg.attack.aux < 1 or cfg.attack.iterations is None or cfg.attack.iterations < 1:
    common.fail(
        f"--count, --config.attack.aux and --iterations must be positive, got {f.count}, {cfg.attack.aux} and "
        f"{cfg.attack.iterations}")
  for name in ("bn", "tv"):
    if getattr(f, name) is not None and getattr(f, name) < 0:
      common.fail(f"--{name} must be a weight (>= 0), got {getattr(f, name)}")
  table = variants(cfg.attack.iterations, f.bn, f.tv)
  keys = list(table) if f.variants == "all" else [] if f.variants == "none" else \
      [k.strip() for k in f.variants.split(",")]
  if any(k not in table for k in keys) or len(set(keys)) != len(keys):
    common.fail(f"--variants: choose from {', '.join(table)}, all or none; got {f.variants!r}")
  if f.tv is not None and not keys:
    common.fail("--tv weighs the TV prior of the ablation's variants, which --variants=none skips")
  try:
    only = None if f.batches is None else {int(b) for b in f.batches}
  except ValueError:
    common.fail(f"--batches must be batch numbers, got {f.batches}")
  if only is not None and not only <= set(range(f.count)):
    common.fail(f"--batches must lie in 0..{f.count - 1}, got {sorted(only)}")
  out = common.output_folder("batch_table", own=("results.md", "results.json", "results.csv", "items/*",
                                                 "batch_0.png", "config.py"))
  start = time.perf_counter()
  try:
    model = checkpoint.load_model(cfg.model.checkpoint, conv="auto")
    meta = checkpoint.read_metadata(cfg.model.checkpoint)
    if list(meta.get("input_shape") or ()) != [32, 32, 3]:
      raise ValueError(f"{cfg.model.checkpoint} holds a model of {meta.get('input_shape')} inputs; "
                       "batch-table attacks CIFAR-10's 32x32x3 images")
    if f.head == "trained" and meta.get("dataset") not in ("cifar10", "cifar10_train"):
      raise ValueError(f"--head=trained keeps {cfg.model.checkpoint}'s head, trained on "
                       f"{meta.get('dataset')} ({meta.get('num_classes')} classes), where the batches "
                       "carry CIFAR-10's labels: use --head=fresh")
    if f.head_classes is not None and (f.head != "fresh" or f.head_classes < 10):
      raise ValueError(f"--head_classes needs --head=fresh and at least CIFAR-10's 10 classes, got "
                       f"{f.head_classes}")
    if f.head == "fresh":  # a new random head, initialised as the model initialises its own
      fresh = checkpoint.model_from_metadata(
          {**meta, "num_classes": f.head_classes or meta["num_classes"]},
          jax.random.fold_in(jax.random.key(cfg.seed), 10**6), conv="auto")
      params = {**model.variables["params"], "head": fresh.variables["params"]["head"]}
      model = fresh._replace(variables={**model.variables, "params": params})
    if "batch_stats" not in model.variables:
      raise ValueError(
          f"{cfg.model.checkpoint} has no BatchNorm statistics: train a BatchNorm model with --config.client.train_mode=True"
      )
    with_bn = [k for k in keys if any("batch_stats" in getattr(p, "needs", ()) for p in table[k][1].priors)]
    if f.bn is not None and not with_bn:
      raise ValueError(f"--bn weighs the BN prior, which none of --variants={f.variants} uses")
    if with_bn and not (meta.get("train_mode") and meta.get("epoch", 0)):
      raise ValueError(f"{cfg.model.checkpoint} holds no learnt BatchNorm statistics (trained "
                       f"without --config.client.train_mode=True, or before its first epoch), which "
                       f"the BN prior of --variants {','.join(with_bn)} matches")
    norm = data.normalization(meta.get("normalization", "none"))
    end = f.start + cfg.sampling.pool + cfg.attack.aux
    try:
      source = data.load("cifar10", data_dir=cfg.data.data_dir, indices=range(f.start, end))
    except ValueError as e:
      if "out of range" not in str(e):
        raise
      raise ValueError(f"--start {f.start}, --config.sampling.pool {cfg.sampling.pool} and "
                       f"--config.attack.aux {cfg.attack.aux} ask for images {f.start}..{end - 1}; "
                       f"{e}") from None
    pool_y = source.y[:cfg.sampling.pool]
    rng = np.random.default_rng(cfg.seed)
    batches = data.duplicate_label_batches(pool_y, source.num_classes, f.count, cfg.data.batch_size,
                                           cfg.sampling.classes_per_batch,
                                           rng)  # positions in source
    aux = jnp.asarray(data.normalize(source.x[cfg.sampling.pool:], norm))
    profile = labels.feature_profile(model.apply_fn, model.variables, aux)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  # What determines an item's attack, kept in it: --resume reads back only items of these settings.
  settings = json.loads(json.dumps({
      **config.fingerprint(cfg), "checkpoint_sha256": files.sha256(cfg.model.checkpoint),
      "head": f.head, "head_classes": f.head_classes, "bn": f.bn, "tv": f.tv, "start": f.start,
      "count": f.count}))
  os.makedirs(os.path.join(out, "items"), exist_ok=True)  # once the flags and data are known good
  if f.resume:
    for name in sorted(os.listdir(os.path.join(out, "items"))):
      if name.endswith(".json") and _settings_of(os.path.join(out, "items", name)) != settings:
        common.fail(f"{os.path.join(out, 'items', name)} was computed with other settings; rerun "
                    "with --overwrite or another --output_dir")
  common.write_config(out, cfg, rows=True)
  input_shape = tuple(source.x.shape[1:])
  bounds = pipeline.image_bounds(norm, input_shape[-1])

  def observe(b):
    x_true, y = source.x[batches[b]], source.y[batches[b]]
    return x_true, y, clients.fedsgd(model.apply_fn, model.variables,
                                     jnp.asarray(data.normalize(x_true, norm)), jnp.asarray(y),
                                     train=cfg.client.train_mode, share_labels=True,
                                     share_statistics=cfg.client.share_statistics)

  def item(key, b):
    return os.path.join(out, "items", f"{key}_{b}")

  # The ablation's attacks: attack k by process k mod P (one process: all), each written to items/
  # as it ends; process 0 then reads them all back for the tables.
  attacked = [(key, b) for b in range(f.count) if only is None or b in only for key in keys]
  count, me = distributed.process_count(), distributed.process_index()
  for k, (key, b) in enumerate(attacked):
    path = item(key, b)
    if k % count != me or (f.resume and os.path.exists(path + ".json")):
      continue
    x_true, y, obs = observe(b)
    name, attack = table[key]
    t = time.perf_counter()
    rec = attacks.reconstruct(attack, model.apply_fn, obs,
                              jax.random.fold_in(jax.random.key(cfg.seed + 1), b),
                              input_shape=input_shape, bounds=bounds)
    x_rec = np.clip(np.asarray(data.denormalize(rec.x, norm)), 0.0, 1.0)
    scores = metrics.score(x_rec, x_true)
    x_rec = x_rec[np.asarray(scores["order"])]
    row = {"batch": b, "indices": (batches[b] + f.start).tolist(), "labels": y.tolist(), "psnr": scores["psnr"],
           "ssim": scores["ssim"], "psnr_per_image": scores["psnr_per_image"],
           **pipeline.lpips_scores("auto", x_rec, x_true), "loss": rec.loss,
           "wall_time_s": time.perf_counter() - t, "attack": attacks.describe(attack),
           "settings": settings}
    files.atomic_write(path + ".npz", lambda fh: np.savez(fh, reconstruction=x_rec.astype(np.float32)),
                        binary=True)
    report.save_json(path + ".json", row)  # last: its presence marks the attack finished
    logging.info("batch %d %s: PSNR %.2f SSIM %.3f", b, name, row["psnr"], row["ssim"])
  if not distributed.is_writer():
    distributed.finished()
    logging.info("process %d: its attacks are written; process 0 writes the tables", me)
    return

  label_rows = {m: [] for m in LABEL_METHODS}
  ablation = {k: [] for k in keys}
  grid = None
  for b in range(f.count):
    x_true, y, obs = observe(b)
    for method in LABEL_METHODS:
      try:
        got = labels.hfginv(obs, profile, jax.random.fold_in(jax.random.key(cfg.seed), b)) \
            if method == "hfginv" else labels.infer(obs, method)
        got = np.asarray(got)
        label_rows[method].append({"batch": b, "labels": sorted(got.tolist()), "truth": sorted(y.tolist()),
                                   "accuracy": metrics.label_accuracy(got, y),
                                   "exact": sorted(got.tolist()) == sorted(y.tolist())})
      except ValueError as e:
        label_rows[method].append({"batch": b, "truth": sorted(y.tolist()), "error": str(e), "accuracy": 0.0,
                                   "exact": False})
    for key in keys if only is None or b in only else ():
      path = item(key, b)
      distributed.wait_for(lambda: os.path.exists(path + ".json"))  # another process's: once written
      with open(path + ".json", encoding="utf-8") as fh:
        ablation[key].append(json.load(fh))
      if b == 0:  # the reconstruction is only needed for the first batch's grid
        with open(path + ".npz", "rb") as fh:
          x_rec = files.npz_arrays(fh.read(), path + ".npz")["reconstruction"]
        grid = [x_true] if grid is None else grid
        grid.append(x_rec)
  wall = time.perf_counter() - start
  info = {
      **common.provenance(), "checkpoint": cfg.model.checkpoint, "model": meta.get("model"),
      "epoch": meta.get("epoch"), "test_accuracy": meta.get("accuracy"), "head": f.head,
      "train_mode": cfg.client.train_mode, "share_statistics": cfg.client.share_statistics,
      "head_classes": int(model.num_classes), "count": f.count, "batch_size": cfg.data.batch_size,
      "classes_per_batch": cfg.sampling.classes_per_batch, "start": f.start,
      "pool": cfg.sampling.pool, "aux": cfg.attack.aux, "iterations": cfg.attack.iterations,
      "bn": f.bn, "tv": f.tv, "batches": (batches + f.start).tolist(),
      "attacked": sorted(only or range(f.count)), "wall_time_s": wall}
  label_summary = [{"method": m, "accuracy_mean": float(np.mean([r["accuracy"] for r in rows])),
                    "exact": int(sum(r["exact"] for r in rows)), "batches": len(rows),
                    "error": next((r["error"] for r in rows if "error" in r), None)}
                   for m, rows in label_rows.items()]
  ablation_summary = []
  for key in keys:
    rows = ablation[key]
    entry = {"variant": table[key][0], "key": key,
             "psnr_mean": float(np.mean([r["psnr"] for r in rows])),
             "psnr_std": float(np.std([r["psnr"] for r in rows])),
             "ssim_mean": float(np.mean([r["ssim"] for r in rows])),
             "time_s": float(sum(r["wall_time_s"] for r in rows))}
    if all("lpips" in r for r in rows):
      entry["lpips_mean"] = float(np.mean([r["lpips"] for r in rows]))
    ablation_summary.append(entry)
  report.save_json(os.path.join(out, "results.json"), {
      "labels": label_summary, "label_rows": label_rows, "ablation": ablation_summary,
      "ablation_rows": ablation, **info})
  report.save_csv(os.path.join(out, "results.csv"), ablation_summary,
                  ("variant", "psnr_mean", "psnr_std", "ssim_mean", "lpips_mean", "time_s"))
  if grid is not None:
    report.save_png(os.path.join(out, "batch_0.png"), report.image_grid(grid))
  md = markdown(label_summary, ablation_summary, info)
  files.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(md), binary=False)
  print(md)
  print(f"wrote {out}")


def markdown(label_summary, ablation_summary, info) -> str:
  head = (f"a fresh random {info['head_classes']}-class head" if info["head"] == "fresh"
          else "its trained head")
  accuracy = "n/a" if info["test_accuracy"] is None else f"{info['test_accuracy']:.1%}"
  client = ("" if not info.get("train_mode") else ", the client in training mode"
            + (" returning its BatchNorm statistics" if info.get("share_statistics") else ""))
  lines = [f"# Batch inversion on a trained {info['model']} (epoch {info['epoch']}, test accuracy "
           f"{accuracy}) with {head}{client}: {info['count']} CIFAR-10 batches of "
           f"{info['batch_size']} with labels from {info['classes_per_batch']} classes (test images "
           f"{info['start']}-{info['start'] + info['pool'] - 1}); HFGInv's profile from "
           f"{info['aux']} auxiliary images", "", f"`{info['command']}`", "",
           f"{info['device']}; jax {info['jax']}, flax {info['flax']}, optax {info['optax']}, Python "
           f"{info['python']}; {info['wall_time_s']:.0f} s.", "", "## Labels", "",
           "| method | label accuracy (mean) | exact batches |", "|---|---|---|"]
  for r in label_summary:
    note = f" ({r['error']})" if r["error"] else ""
    lines.append(f"| {r['method']}{note} | {r['accuracy_mean']:.3f} | {r['exact']}/{r['batches']} |")
  if ablation_summary:
    attacked = ("" if len(info["attacked"]) == info["count"]
                else f", batches {', '.join(map(str, info['attacked']))} only")
    lines += ["", f"## Ablation ({info['iterations']} iterations each, true labels{attacked})", "",
              "| variant | PSNR (dB), mean ± std | SSIM | LPIPS | time (s) |", "|---|---|---|---|---|"]
    for r in ablation_summary:
      lp = f"{r['lpips_mean']:.3f}" if "lpips_mean" in r else "n/a"
      lines.append(f"| {r['variant']} | {r['psnr_mean']:.2f} ± {r['psnr_std']:.2f} | "
                   f"{r['ssim_mean']:.3f} | {lp} | {r['time_s']:.0f} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
