"""Run one attack over a range of images and tabulate the results.

Each image (or batch) attacks a fresh random model, seeded by its index (see gradjax.run.pipeline), or
the one model of ``--checkpoint``, and is scored after batch-order matching. Writes
``results.json`` (per-image rows and the summary) and ``results.md`` (a table), ``results.csv``
(one row per experiment), ``reconstructions.png`` (ground truth above, reconstructions below) and
``psnr.svg`` (PSNR per experiment) to ``--output_dir``. LPIPS is reported when the ``lpips`` extra
is installed.

Each finished experiment is kept in ``items/<index>.json`` (with its restarts' per-iteration
history, which results.json leaves out) and ``items/<index>.npz`` as it ends, and
the running one saves its solver state to ``items/<index>.state.npz``: ``--resume`` skips finished
experiments and continues the interrupted one.

  gradjax sweep --dataset=cifar10 --count=20 --iterations=2000
  gradjax sweep --attack=idlg --dataset=cifar100 --start=0 --count=10
  gradjax sweep --config=my_sweep.py      # the sweep its get_sweep() declares (gradjax.run.config)

The experiments are images ``--start``, ``--start + --batch_size``, ... (``--count`` of them), or the
items of the configuration file's ``get_sweep()``, each a dict of options set over the file's
configuration, e.g. ``config.product(config.sweep("data.index", range(5)),
config.sweep("attack.restarts", [1, 4]))``. The ``config.py`` written with the results declares
the sweep that ran, so ``--config=<it>`` runs it again. With ``--config=file.py:arg`` a
``get_sweep(arg)`` gets the variant as ``get_config(arg)`` does (a study's recipe,
``experiments/studies/*/config.py``); ``--start``/``--count`` replace a declared image sweep by
other images.

Summary statistics: mean ± population std, median, and how many images reach ``--psnr_threshold``.
"""

import json
import os
import time

import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import data, fidelity, files, models
from gradjax.run import config, report, svg

common.define_flags(batched=True)
common.define_table_flags()
common.define_output_flags()
common.define_launch_flags(collectives=False)  # experiments split over processes
flags.adopt_module_key_flags(common)


CSV_COLUMNS = ("index", "psnr", "psnr_unclamped", "ssim", "lpips", "mse", "label_accuracy", "iterations",
               "loss", "wall_time_s", "verdict")


def verdict_of(row: dict) -> str:
  """A row's verdict status (runs saved before verdicts existed: "–")."""
  return (row.get("verdict") or {}).get("status", "–")


def markdown(rows: list[dict], summary: dict, title: str, labels: list[str] | None = None,
             header: str = "index") -> str:
  """The table: one row per experiment, labelled by ``labels`` (default: its image index)."""
  with_lpips = "lpips" in summary
  labels = [str(r["index"]) for r in rows] if labels is None else labels
  lines = [f"# {title}", "", f"| {header} | PSNR (dB) | SSIM | " + ("LPIPS | " if with_lpips else "")
           + "label acc. | iterations | loss | time (s) | verdict |",
           "|---|---|---|---|---|---|---|---|" + ("---|" if with_lpips else "")]
  for r, label in zip(rows, labels):
    lines.append(f"| {label} | {r['psnr']:.2f} | {r['ssim']:.3f} | "
                 + (f"{r['lpips']:.3f} | " if with_lpips else "")
                 + ("–" if r["label_accuracy"] is None else f"{r['label_accuracy']:.2f}")
                 + f" | {r['iterations']} | "
                 + ("–" if r["loss"] is None else f"{r['loss']:.2e}") + " | "
                 f"{r['wall_time_s']:.1f} | {verdict_of(r)} |")
  s = summary
  unclamped = (f"; unclamped {s['psnr_unclamped']['mean']:.2f} ± {s['psnr_unclamped']['std']:.2f}"
               if "psnr_unclamped" in s else "")
  lines += ["", f"PSNR {s['psnr']['mean']:.2f} ± {s['psnr']['std']:.2f} dB (median "
            f"{s['psnr']['median']:.2f}{unclamped}); SSIM {s['ssim']['mean']:.3f} ± {s['ssim']['std']:.3f}; "
            + (f"LPIPS {s['lpips']['mean']:.3f} ± {s['lpips']['std']:.3f}; " if with_lpips else "") +
            (f"label accuracy {s['label_accuracy']['mean']:.3f}; " if "label_accuracy" in s else "")
            + f"{s['successes']}/{s['experiments']} at PSNR >= {s['psnr_threshold']:g} dB; "
            f"total {s['total_time_s']:.1f} s ({s['wall_time_s']['mean']:.1f} s per experiment, "
            "compilation included).", ""]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  try:
    base = common.config_from_flags(check=common.images_only(config.check), printed=False)
    declared = common.declared_sweep()
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  chosen = f["start"].present or f["count"].present
  image_sweep = declared is not None and all(set(i) == {"data.index"} for i in declared)
  if declared is None or (chosen and image_sweep):  # --start/--count choose other images
    if "data.index" in common.options_given():
      common.fail("--index is one experiment's image; a sweep's images are --start and --count")
    sweep = [{"data.index": f.start + k * base.data.batch_size} for k in range(f.count)]
  elif chosen:
    common.fail("--start and --count choose the images of an image sweep; the configuration "
                "declares a sweep over other options (get_sweep)")
  else:
    sweep = declared
  swept = set().union(*map(set, sweep))
  overridden = sorted(swept & common.command_line_options())
  if overridden and sweep is declared:
    common.fail(f"{', '.join(config.flag(p) for p in overridden)}: the configuration's get_sweep() "
                "sets it in its items; change the items, or leave the flag out")
  unread = sorted(swept - set(common.FIELDS))
  if unread:
    common.fail(f"a sweep item sets {', '.join(unread)}, which gradjax sweep does not read")
  try:
    cfgs = [config.with_options(base, item) for item in sweep]
    for cfg in cfgs:
      config.check(cfg, files=not f.print_config)  # as config_from_flags checks them
  except (ValueError, FileNotFoundError, TypeError) as e:
    common.fail(f"a sweep item: {e}")
  for cfg, item in zip(cfgs, sweep):
    common.check_given(cfg, set(item), files=not f.print_config)
  common.print_config(base, sweep=sweep)  # with --print_config: the experiments too, then exit
  images = all(set(item) == {"data.index"} for item in sweep)  # an image sweep: rows by index
  labels = [str(cfg.data.index) if images else ", ".join(f"{k}={v}" for k, v in item.items())
            for cfg, item in zip(cfgs, sweep)]
  keys = labels if images else ["_".join(f"{k}={v}" for k, v in item.items()) for item in sweep]
  same = [tuple(sorted(item.items(), key=lambda kv: kv[0])) for item in sweep]  # keys in any order
  if len(set(keys)) != len(keys) or len(set(same)) != len(same):
    twice = next(k for k, s in zip(keys, same) if keys.count(k) > 1 or same.count(s) > 1)
    common.fail(f"the sweep repeats an experiment: {twice}")
  if images and base.data.dataset is not None:  # the last image, before the first experiment runs
    last = max(cfg.data.index for cfg in cfgs) + base.data.batch_size - 1
    try:
      n = data.count(base.data.dataset, data_dir=base.data.data_dir)
      if n is None:  # not known without loading: the last image is loaded (its range checked)
        data.load(base.data.dataset, data_dir=base.data.data_dir, indices=[last])
    except (OSError, ValueError) as e:
      n = None  # the experiment's own loading says what else is wrong
      if "out of range" in str(e):
        common.fail(f"the sweep's last experiment reads image {last}: {e} (--start and --count "
                    "choose the images)")
    if n is not None and last >= n:
      common.fail(f"the sweep's last experiment reads image {last}, past the {n} images of "
                  f"{base.data.dataset} (--start and --count choose them)")
  model = config.attacked_model(base)
  if images:
    first, last = cfgs[0].data.index, cfgs[-1].data.index + base.data.batch_size - 1
    span = f"{first}..{last}"
  else:
    span = (common.config_variant(f["config"])
            or os.path.splitext(os.path.basename(common.config_file(f["config"])))[0])
  out = common.output_folder(
      f"sweep_{base.attack.preset}_{model}_{base.data.dataset.replace(':', '-')}_{span}",
      own=("results.md", "results.json", "results.csv", "psnr.svg", "reconstructions.png",
           "items/*.json", "items/*.npz", "config.py"))
  items = common.items(out)
  start, resumed = time.perf_counter(), 0
  if not common.plan(items, list(zip(keys, cfgs))):
    return  # over several processes: this one's experiments are written, process 0 writes the table
  rows, truth, recon, skipped, kept = [], [], [], [], []
  try:
    for k, (cfg, item, key, label) in enumerate(zip(cfgs, sweep, keys, labels)):
      try:
        results, pictures, done = items.run(key, cfg)
      except fidelity.ZeroUpdate as e:  # nothing to attack: said, and the sweep goes on
        skipped.append({"experiment": label, "reason": str(e)})
        logging.warning("experiment %d/%d (%s): skipped: %s", k + 1, len(cfgs), label, e)
        continue
      results["index"] = cfg.data.index
      if not images:
        results["options"] = item
      resumed += done
      rows.append(results)
      kept.append(label)
      truth.append(pictures["ground_truth"])
      recon.append(pictures["reconstruction"])
      logging.info("experiment %d/%d (%s): PSNR %.2f dB, SSIM %.3f, labels %s, %.1f s%s, ETA %.0f s",
                   k + 1, len(cfgs), label, results["psnr"], results["ssim"],
                   ("not read" if results["label_accuracy"] is None
                    else f"{results['label_accuracy']:.2f}"), results["wall_time_s"],
                   " (saved earlier)" if done else "",
                   (time.perf_counter() - start) / max(k + 1 - resumed, 1) * (len(cfgs) - k - 1))
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  if not rows:
    common.fail(f"no experiment had an update to attack ({skipped[0]['reason']})")
  labels = kept  # the experiments in the table
  summary = report.summarize(rows, f.psnr_threshold)
  summary["total_time_s"] = items.earlier_s + time.perf_counter() - start
  if base.model.checkpoint:
    weights = f"checkpoint {os.path.basename(base.model.checkpoint)}"
  elif base.client.observation:
    weights = "captured weights"
  else:  # the draw the model makes when none is named (lenet_zhu: DLG's uniform)
    weights = "init " + (base.model.init or getattr(
        models.get_module(model, num_classes=base.model.num_classes or 10), "weight_init", "default"))
  title = (
      f"{base.attack.preset} on {model} ({weights}), {base.data.dataset} {span}, batch {base.data.batch_size}"
      if images else
      f"{base.attack.preset} on {model} ({weights}), {base.data.dataset}: sweep {span} "
      f"({len(cfgs)} experiments)")
  common.write_config(out, base, sweep)  # the base configuration and the sweep over it
  # Per-experiment metrics; each restart's per-iteration history stays in items/<key>.json.
  table_rows = [{k: v for k, v in r.items() if k != "history"} for r in rows]
  report.save_json(os.path.join(out, "results.json"),
                   {"summary": summary, "rows": table_rows, "skipped": skipped, "title": title,
                    **common.provenance()})
  text = markdown(rows, summary, title, labels, "index" if images else "options")
  budgets = {json.dumps(r.get("privacy"), sort_keys=True) for r in rows}
  if len(budgets) == 1 and rows[0].get("privacy"):  # every experiment's client ran the same DP-SGD
    text += f"\nDP-SGD: {report.privacy_line(rows[0]['privacy'])}\n"
  files.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(text), binary=False)
  report.save_csv(os.path.join(out, "results.csv"),
                  [{**r, "verdict": verdict_of(r), "options": label} for r, label in zip(rows, labels)],
                  CSV_COLUMNS if images else ("options", *CSV_COLUMNS))
  report.write_svg(os.path.join(out, "psnr.svg"),
                   svg.bars(labels, [r["psnr"] for r in rows], f.psnr_threshold, title))
  if len({t.shape[1:] for t in truth}) == 1:
    report.save_png(os.path.join(out, "reconstructions.png"),
                    report.image_grid([np.concatenate(truth), np.concatenate(recon)], scale=2))
  print(text)
  print(f"wrote {out}: results.json, results.md, results.csv, psnr.svg, reconstructions.png")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
