"""Run one attack against a grid of defenses and tabulate how much each one leaks.

For every defense spec (see gradjax.defenses.parse) and every image, the client's update is defended
and then attacked, exactly as ``reconstruct.py --defense=SPEC`` would. Writes ``results.json`` and
``results.md`` to ``--output_dir``: per defense, PSNR and SSIM (mean ± population std), label accuracy
and the success rate (PSNR ≥ ``--psnr_threshold``).

  python experiments/defense_sweep.py --dataset=cifar10 --count=5
  python experiments/defense_sweep.py --defenses="none;gaussian:1e-2;prune:0.3" --count=10

The default grid is the DLG paper's defense table (Zhu et al. 2019, §5): Gaussian and Laplacian
noise of variance 1e-4 .. 1e-1, fp16, int8, and magnitude pruning of 1 % .. 70 %.
"""

import os
import time

from absl import app, flags, logging

import common
from gradjax import pipeline, report

DLG_TABLE = ("none;gaussian:1e-4;gaussian:1e-3;gaussian:1e-2;gaussian:1e-1;laplacian:1e-4;"
             "laplacian:1e-3;laplacian:1e-2;laplacian:1e-1;fp16;int8;prune:0.01;prune:0.1;"
             "prune:0.2;prune:0.3;prune:0.5;prune:0.7")

common.define_flags()
flags.DEFINE_string("defenses", DLG_TABLE, "Semicolon-separated defense specs ('none' = undefended).")
flags.DEFINE_integer("start", 0, "First image index.")
flags.DEFINE_integer("count", 5, "Images per defense.")
flags.DEFINE_float("psnr_threshold", 30.0, "PSNR (dB) counted as a successful reconstruction.")
flags.DEFINE_string("output_dir", None, "Output folder (default runs/defenses_<attack>_<model>_<dataset>).")


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  specs = [s.strip() for s in f.defenses.split(";") if s.strip()]
  if not specs or f.count < 1:
    common.fail("need at least one defense and a positive --count")
  table = []
  start = time.perf_counter()
  try:
    base = common.config_from_flags()
    for spec in specs:
      rows = []
      for k in range(f.count):
        cfg = common.replace(base, defense=None if spec == "none" else spec,
                             index=f.start + k * base.batch_size)
        results, _ = pipeline.run(cfg)
        rows.append(results)
      summary = report.summarize(rows, f.psnr_threshold)
      logging.info("%s: PSNR %.2f dB, %d/%d successes", spec, summary["psnr"]["mean"],
                   summary["successes"], f.count)
      table.append({"defense": spec, "summary": summary,
                    "psnr_per_image": [r["psnr"] for r in rows]})
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  out = f.output_dir or os.path.join("runs", f"defenses_{base.attack}_{base.model}_{base.dataset}")
  report.save_json(os.path.join(out, "results.json"),
                   {"table": table, "config": vars(base), "total_time_s": time.perf_counter() - start})
  lines = [f"# {base.attack} on {base.model} against defenses, {base.dataset} {f.start}.."
           f"{f.start + f.count * base.batch_size - 1}, batch {base.batch_size}", "",
           "| defense | PSNR (dB) | SSIM | label acc. | success (PSNR ≥ "
           f"{f.psnr_threshold:g}) |", "|---|---|---|---|---|"]
  for row in table:
    s = row["summary"]
    lines.append(f"| {row['defense']} | {s['psnr']['mean']:.2f} ± {s['psnr']['std']:.2f} | "
                 f"{s['ssim']['mean']:.3f} | {s['label_accuracy']['mean']:.2f} | "
                 f"{s['successes']}/{s['experiments']} |")
  lines += ["", f"Total {time.perf_counter() - start:.0f} s.", ""]
  text = "\n".join(lines)
  with open(os.path.join(out, "results.md"), "w") as fh:
    fh.write(text)
  print(text)


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
