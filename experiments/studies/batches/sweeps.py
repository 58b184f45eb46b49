"""What the batches study's programs share: a row is a ``gradjax sweep`` into ``runs/<part>/<row>/``
(run only where its results.json is missing), and a part's table is written as ``table.md`` and
``table.json`` beside its rows."""

import argparse
import json
import os
import shutil
import subprocess

import numpy as np

from gradjax import verdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def sweep(out: str, flags: list[str], data_dir: str | None, keep: tuple[str, ...] = ()) -> None:
  """``gradjax sweep FLAGS --output_dir=OUT``, unless ``out`` holds its results; keeps results.json
  (which records the command), results.md, psnr.svg and the files named in ``keep`` of the rest
  (reconstructions.png); drops config.py and the per-experiment arrays."""
  if os.path.exists(os.path.join(out, "results.json")):
    return
  command = ["gradjax", "sweep", *flags, f"--output_dir={os.path.relpath(out, ROOT)}"]
  if data_dir:
    command.append(f"--data_dir={data_dir}")
  print(" ".join(command), flush=True)
  subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  os.remove(os.path.join(out, "config.py"))
  shutil.rmtree(os.path.join(out, "items"))
  if "reconstructions.png" not in keep and os.path.exists(os.path.join(out, "reconstructions.png")):
    os.remove(os.path.join(out, "reconstructions.png"))


def rows(runs: str, row: str) -> list[dict] | None:
  """The per-experiment rows of ``runs/<row>/results.json``, or ``None`` before that row ran."""
  path = os.path.join(runs, row, "results.json")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as fh:
    return json.load(fh)["rows"]


def recount(row: dict) -> tuple[int, bool]:
  """(images recognisable, whether the run leaks) of a sweep's row by the verdict's rule as it is
  now (:func:`gradjax.verdict.image_findings`, its scores as the row saved them, CIFAR-10's 32 px):
  rows run before 2026-11-28 counted LPIPS <= 0.2 at 32 px, where unrelated images score as low."""
  # Rows run before the mean-colour floor was recorded are counted without it.
  row = {"psnr_mean_colour_per_image": None, **row}
  images = verdict.image_findings(row, labels_inferred=False, num_classes=10, side=32)["images"]
  saved = {k: v for k, v in (row.get("findings") or {}).items() if k != "images"}
  return images["recognisable"], bool(verdict.leaks({**saved, "images": images}))


def summary(rows: list[dict]) -> dict:
  """What a part's table reports of a row's batches (``rows`` of :func:`rows`): the mean and median
  per-image PSNR, the mean SSIM, the images recognisable and the leak verdicts by the verdict's rule
  as it is now (:func:`recount`), the images, the batches and the mean seconds per batch."""
  psnr = np.array([p for r in rows for p in r["psnr_per_image"]])
  ssim = np.array([s for r in rows for s in r["ssim_per_image"]])
  counted = [recount(r) for r in rows]
  return {"psnr_mean": float(psnr.mean()), "psnr_median": float(np.median(psnr)),
          "ssim_mean": float(ssim.mean()), "recognisable": int(sum(c[0] for c in counted)),
          "images": int(psnr.size), "leaks": int(sum(c[1] for c in counted)), "batches": len(rows),
          "seconds_per_batch": float(np.mean([r["wall_time_s"] for r in rows]))}


def cells(n: dict) -> str:
  """A :func:`summary`'s table cells: mean and median PSNR, mean SSIM, images recognisable, leak
  verdicts over batches."""
  return (f"{n['psnr_mean']:.2f} | {n['psnr_median']:.2f} | {n['ssim_mean']:.3f} | "
          f"{n['recognisable']} / {n['images']} | {n['leaks']} / {n['batches']}")


def main(doc: str, runs: str, rows: list, run, table) -> None:
  """The command line of a part: ``--table`` (only the table), ``--rows`` (a comma-separated subset
  to run), ``--data_dir``; runs ``run(*row, data_dir)`` for the rows wanted, then writes
  ``table()`` (markdown, numbers) into ``runs``."""
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--table", action="store_true", help="only write the table from the runs there")
  parser.add_argument("--rows", default="", help="comma-separated rows to run (default: all)")
  parser.add_argument("--data_dir", default=None, help="where the CIFAR-10 files are (gradjax's default)")
  args = parser.parse_args()
  if not args.table:
    wanted = set(filter(None, args.rows.split(",")))
    for row in rows:
      if not wanted or row[0] in wanted:
        run(*row, args.data_dir)
  write_table(runs, *table())


def write_table(runs: str, text: str, numbers: dict) -> None:
  """A part's table into ``runs``: ``table.md`` (``text``, markdown) and ``table.json`` (``numbers``)."""
  os.makedirs(runs, exist_ok=True)
  with open(os.path.join(runs, "table.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  with open(os.path.join(runs, "table.json"), "w", encoding="utf-8") as fh:
    json.dump(numbers, fh, indent=1)
  print(f"wrote {os.path.relpath(os.path.join(runs, 'table.md'), ROOT)}")
