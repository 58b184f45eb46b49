"""Run one attack over a range of images and tabulate the results.

Each image (or batch) attacks a fresh random model, seeded by its index (see gradjax.pipeline), or
the one model of ``--checkpoint``, and is scored after batch-order matching. Writes
``results.json`` (per-image rows and the summary) and ``results.md`` (a table), ``results.csv``
(one row per experiment), ``reconstructions.png`` (ground truth above, reconstructions below) and
``psnr.png`` (PSNR per experiment) to ``--output_dir``. LPIPS is reported when the ``lpips`` extra
is installed.

Each finished experiment is kept in ``items/<index>.json`` and ``items/<index>.npz`` as it ends, and
the running one saves its solver state to ``items/<index>.state.npz``: ``--resume`` skips finished
experiments and continues the interrupted one.

  gradjax sweep --dataset=cifar10 --count=20 --iterations=2000
  gradjax sweep --attack=idlg --dataset=cifar100 --start=0 --count=10

Summary statistics: mean ± population std, median, and how many images reach ``--psnr_threshold``.
"""

import os
import time

import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import config, report

common.define_flags()
common.define_table_flags()
common.define_output_flags()
flags.adopt_module_key_flags(common)


CSV_COLUMNS = ("index", "psnr", "ssim", "lpips", "mse", "label_accuracy", "iterations", "loss", "wall_time_s",
               "verdict")


def verdict_of(row: dict) -> str:
  """A row's verdict status (runs saved before verdicts existed: "–")."""
  return (row.get("verdict") or {}).get("status", "–")


def markdown(rows: list[dict], summary: dict, title: str) -> str:
  with_lpips = "lpips" in summary
  lines = [f"# {title}", "", "| index | PSNR (dB) | SSIM | " + ("LPIPS | " if with_lpips else "")
           + "label acc. | iterations | loss | time (s) | verdict |",
           "|---|---|---|---|---|---|---|---|" + ("---|" if with_lpips else "")]
  for r in rows:
    lines.append(f"| {r['index']} | {r['psnr']:.2f} | {r['ssim']:.3f} | "
                 + (f"{r['lpips']:.3f} | " if with_lpips else "")
                 + f"{r['label_accuracy']:.2f} | {r['iterations']} | {r['loss']:.2e} | "
                 f"{r['wall_time_s']:.1f} | {verdict_of(r)} |")
  s = summary
  lines += ["", f"PSNR {s['psnr']['mean']:.2f} ± {s['psnr']['std']:.2f} dB (median "
            f"{s['psnr']['median']:.2f}); SSIM {s['ssim']['mean']:.3f} ± {s['ssim']['std']:.3f}; "
            + (f"LPIPS {s['lpips']['mean']:.3f} ± {s['lpips']['std']:.3f}; " if with_lpips else "") +
            f"label accuracy {s['label_accuracy']['mean']:.3f}; "
            f"{s['successes']}/{s['experiments']} at PSNR >= {s['psnr_threshold']:g} dB; "
            f"total {s['total_time_s']:.1f} s ({s['wall_time_s']['mean']:.1f} s per experiment, "
            "compilation included).", ""]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  if f.count < 1:
    common.fail(f"count must be positive, got {f.count}")
  try:
    base = common.config_from_flags()
    config.check(base)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  last = f.start + f.count * base.batch_size - 1
  model = config.attacked_model(base)
  out = common.output_folder(
      f"sweep_{base.attack}_{model}_{base.dataset.replace(':', '-')}_{f.start}..{last}",
      own=("results.*", "psnr.png", "reconstructions.png", "items/*.json", "items/*.npz", "config.py"))
  items = common.Items(out)
  rows, truth, recon = [], [], []
  start, resumed = time.perf_counter(), 0
  try:
    for k in range(f.count):
      cfg = common.replace(base, index=f.start + k * base.batch_size)
      results, images, done = items.run(str(cfg.index), cfg)
      results["index"] = cfg.index
      resumed += done
      rows.append(results)
      truth.append(images["ground_truth"])
      recon.append(images["reconstruction"])
      logging.info("image %d/%d (index %d): PSNR %.2f dB, SSIM %.3f, labels %.2f, %.1f s%s, ETA %.0f s",
                   k + 1, f.count, cfg.index, results["psnr"], results["ssim"],
                   results["label_accuracy"], results["wall_time_s"],
                   " (saved earlier)" if done else "",
                   (time.perf_counter() - start) / max(k + 1 - resumed, 1) * (f.count - k - 1))
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  summary = report.summarize(rows, f.psnr_threshold)
  summary["total_time_s"] = items.earlier_s + time.perf_counter() - start
  weights = (f"checkpoint {os.path.basename(base.checkpoint)}" if base.checkpoint
             else f"init {base.init or 'model default'}")
  title = f"{base.attack} on {model} ({weights}), {base.dataset} " \
          f"{f.start}..{f.start + f.count * base.batch_size - 1}, batch {base.batch_size}"
  common.write_config(out, base)  # the sweep's base configuration (each image sets its index)
  report.save_json(os.path.join(out, "results.json"),
                   {"summary": summary, "rows": rows, "title": title, **common.provenance()})
  text = markdown(rows, summary, title)
  report.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(text), binary=False)
  report.save_csv(os.path.join(out, "results.csv"), [{**r, "verdict": verdict_of(r)} for r in rows],
                  CSV_COLUMNS)
  report.psnr_figure(os.path.join(out, "psnr.png"), [str(r["index"]) for r in rows],
                     [r["psnr"] for r in rows], f.psnr_threshold, title)
  if len({t.shape[1:] for t in truth}) == 1:
    report.save_png(os.path.join(out, "reconstructions.png"),
                    report.image_grid([np.concatenate(truth), np.concatenate(recon)], scale=2))
  print(text)
  print(f"wrote {out}: results.json, results.md, results.csv, psnr.png, reconstructions.png")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
