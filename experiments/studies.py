"""RESULTS.md from the studies under ``experiments/studies/``: one headline table (each published
number beside ours on the same protocol, the gap, the study) and the list of studies.

  python experiments/studies.py            # writes RESULTS.md
  python experiments/studies.py --check    # exit 1 when RESULTS.md is not what the studies give

A study is a folder (one paper table or one question) holding its configuration files, its runs'
outputs (``runs/<run>/``: the tables and figures the programs wrote), a hand-written
``analysis.md`` and ``study.json``, the data this program reads::

  {"title": "DLG: CIFAR-10 reconstructions",
   "source": "Zhu, Liu, Han: Deep Leakage from Gradients (NeurIPS 2019)",
   "rows": [{"quantity": "PSNR (dB), mean", "setting": "LeNet, batch 1", "published": 18.0,
             "where": "Table 1", "digits": 2,
             "ours": {"runs": ["runs/a", "runs/b"], "field": "psnr", "statistic": "mean"}}]}

``images`` (optional) says which images a row ran on: ``"development"`` (where its settings were
chosen) or ``"unseen"`` (a range no setting was chosen on, ../shared/PROTOCOLS.md); the headline shows
both rows of a setting side by side. ``ours`` pools the per-item rows of the named runs (a sweep's ``results.json`` ``rows``, a single
run's ``metrics.json``) and takes ``field``'s ``statistic`` (:data:`STATISTICS`; ``fraction_at_least``
takes ``threshold``), or reads one number: ``{"file": "runs/x/results.json", "path": "summary.a.0"}``
(dotted keys, list positions as integers). ``published`` is null where the paper gives no number;
the gap is ours minus published. A pooled row also shows its median, population std and count.
"""

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
STUDIES = os.path.join("experiments", "studies")
OUTPUT = "RESULTS.md"

STATISTICS = {
    "mean": np.mean,
    "median": np.median,
    "std": np.std,  # population std, as the programs report it
    "min": np.min,
    "max": np.max,
    "count": len,
}


def _read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as fh:
    return json.load(fh)


def run_rows(folder: str) -> list[dict]:
  """The per-item rows of one run: a sweep's ``results.json`` rows, or a single run's
  ``metrics.json`` as one row."""
  results, metrics = os.path.join(folder, "results.json"), os.path.join(folder, "metrics.json")
  if os.path.exists(results):
    rows = _read_json(results).get("rows")
    if isinstance(rows, list):
      return rows
  if os.path.exists(metrics):
    return [_read_json(metrics)]
  raise ValueError(f"{folder} holds neither a sweep's results.json rows nor a metrics.json")


def at_path(tree, path: str):
  """``tree``'s value at a dotted path (``"summary.psnr.mean"``, ``"rows.0.psnr"``)."""
  node = tree
  for key in path.split("."):
    node = node[int(key)] if isinstance(node, list) else node[key]
  return node


def pooled(study_dir: str, spec: dict) -> np.ndarray:
  """The values of ``spec["field"]`` over every row of ``spec["runs"]``."""
  values = np.asarray([float(row[spec["field"]]) for run in spec["runs"]
                       for row in run_rows(os.path.join(study_dir, run))], np.float64)
  if not len(values):
    raise ValueError(f"{study_dir}: no rows in {spec['runs']}")
  return values


def ours(study_dir: str, spec: dict) -> float:
  """The number ``spec`` names in the study's runs (see the module's description)."""
  if "file" in spec:
    return float(at_path(_read_json(os.path.join(study_dir, spec["file"])), spec["path"]))
  values = pooled(study_dir, spec)
  if spec["statistic"] == "fraction_at_least":
    return float(np.mean(values >= spec["threshold"]))
  return float(STATISTICS[spec["statistic"]](values))


def studies(root: str = ROOT) -> list[tuple[str, dict]]:
  """(folder relative to ``root``, study.json) of every study, sorted by folder."""
  base = os.path.join(root, STUDIES)
  out = []
  for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
    path = os.path.join(base, name, "study.json")
    if os.path.exists(path):
      out.append((os.path.join(STUDIES, name), _read_json(path)))
  return out


def _number(value: float | None, digits: int) -> str:
  return "–" if value is None else f"{value:.{digits}f}"


def headline_rows(root: str = ROOT) -> list[dict]:
  """Every row of every study with ours computed: study, quantity, setting, published, ours, gap."""
  out = []
  for folder, study in studies(root):
    for row in study["rows"]:
      value = ours(os.path.join(root, folder), row["ours"])
      published = row.get("published")
      spread = None
      if "runs" in row["ours"] and row["ours"]["statistic"] == "mean":
        values = pooled(os.path.join(root, folder), row["ours"])
        spread = {"median": float(np.median(values)), "std": float(np.std(values)), "count": len(values)}
      out.append({"study": study["title"], "folder": folder, "quantity": row["quantity"],
                  "setting": row.get("setting", ""), "where": row.get("where", ""),
                  "images": row.get("images"), "published": published, "ours": value, "spread": spread,
                  "gap": None if published is None else value - published,
                  "digits": row.get("digits", 2)})
  return out


def render(root: str = ROOT) -> str:
  """RESULTS.md."""
  rows = headline_rows(root)
  rows = ([r for r in rows if r["published"] is not None]  # published numbers first
          + [r for r in rows if r["published"] is None])
  lines = ["# gradjax results", "",
           "Generated by `python experiments/studies.py` from each study's `study.json` and runs; "
           "do not edit by hand. Each study's `analysis.md` says what was run and what it means. "
           "Rows with a published number come first. \"median, std (n)\" is over the n values "
           "the row's mean pools: its images, or its batches where a run records one value a "
           "batch; a mean over images that reach PSNR's 100 dB cap depends on the cap.", "",
           "| study | quantity | setting | images | published | ours | median, std (n) | gap |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    where = f" ({r['where']})" if r["where"] else ""
    gap = "–" if r["gap"] is None else f"{r['gap']:+.{r['digits']}f}"
    s, d = r["spread"], r["digits"]
    spread = "–" if s is None else f"{s['median']:.{d}f}, {s['std']:.{d}f} ({s['count']})"
    lines.append(f"| [{r['study']}]({r['folder']}/analysis.md) | {r['quantity']} | {r['setting']} | "
                 f"{r['images'] or '–'} | {_number(r['published'], r['digits'])}{where} | "
                 f"{_number(r['ours'], r['digits'])} | {spread} | {gap} |")
  lines += ["", "## Studies", ""]
  for folder, study in studies(root):
    lines.append(f"- [{study['title']}]({folder}/analysis.md): {study['source']}")
  return "\n".join(lines) + "\n"


def config_of(folder: str) -> str:
  """A configuration file that runs a recorded sweep again (``gradjax sweep --config=<it>``): the
  options its rows recorded that differ from today's defaults (options added since take their
  defaults, which keep what a run did) and a sweep over the rows' images; a study's ``config.py``
  takes them as one variant's options. ValueError when the rows differ in more than their image."""
  from gradjax.run import config
  rows = run_rows(folder)
  fields = config.names()
  defaults = config.options(config.Config(), fields)

  def options(row):
    return {**defaults, **{k: v for k, v in config.recorded(row["config"]).items() if k in fields}}

  base = options(rows[0])
  for row in rows[1:]:
    differ = sorted(k for k, v in options(row).items() if v != base[k] and k != "data.index")
    if differ:
      raise ValueError(f"{folder}: rows differ in {', '.join(differ)}, not only in their image")
  sweep = [{"data.index": options(row)["data.index"]} for row in rows]
  fields = tuple(
      k for k in fields if base[k] != defaults[k] and k != "data.index")  # a recipe, not a dump
  command = _read_json(os.path.join(folder, "results.json")).get("command", "")
  return config.to_python(base, comment=f"Runs {os.path.relpath(folder, ROOT)} again: gradjax sweep "
                          f"--config=<this file>.\nRecorded command: {command}", fields=fields,
                          sweep=sweep)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md is stale")
  parser.add_argument("--config_of", metavar="RUN", help="print a configuration file that runs "
                      "the recorded sweep RUN again, and exit")
  args = parser.parse_args(argv)
  if args.config_of:
    print(config_of(args.config_of), end="")
    return
  text = render()
  path = os.path.join(ROOT, OUTPUT)
  if args.check:
    with open(path, encoding="utf-8") as fh:
      if fh.read() != text:
        print(f"{OUTPUT} is stale: run python experiments/studies.py and commit it", file=sys.stderr)
        sys.exit(1)
    return
  with open(path, "w", encoding="utf-8") as fh:
    fh.write(text)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
