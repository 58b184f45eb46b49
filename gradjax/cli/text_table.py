"""Token recovery from a Transformer language model's gradient: DLG, SAPAG and cosine, on real sentences.

The text protocol of DLG (Zhu et al. 2019, Table 2) and SAPAG (Wang et al., text experiment): each
client holds one sentence of ``--config.data.sequence_length`` tokens (the corpus's distinct sentences of that
length, ``--start`` on) and sends the FedSGD gradient of the next-token loss of SAPAG's Transformer
(2 encoder layers, 4 heads, feed-forward 200, GELU, width 200). Three distances (DLG's Euclidean,
SAPAG's Gaussian kernel, cosine; L-BFGS lr 1, ``--iterations`` and ``--restarts`` for all) and two
searches:

* ``embeddings`` (the papers'): dummy embeddings and soft targets, tokens read back by the
  pseudo-inverse of the embedding matrix (SAPAG) and by the nearest embedding (DLG);
* ``tokens`` (gradjax): a distribution over the tokens present per position, the targets tied to
  the inputs (:func:`gradjax.text.soft_tokens`).

Both restrict tokens to the bag the embedding gradient reveals. The model is untrained (a fresh
random one per sentence) and, with ``--checkpoint``, trained (``gradjax train --modality=text``;
the same model for every sentence). The model, corpus and budget come from ``--config=sapag_text``
(the default; flags override it). Rows (``--methods``): ``DLG``, ``SAPAG``, ``cosine`` (the default),
``SAPAG-literal``, ``SAPAG-uniform``. Metrics: position-wise token accuracy, bag-of-words recall,
sentences recovered exactly; example sentences as in the papers' tables. Each attack is kept in
``items/`` as it ends; ``--resume`` reads them back. ``--methods`` also takes two other readings of
SAPAG, to see what its row depends on: ``SAPAG-literal`` (the kernel width σ_l² as written, not per
entry) and ``SAPAG-uniform`` (every layer weighted alike instead of Q_l = 1/(l+1)).

  gradjax text-table --count=20
  gradjax text-table --count=20 --checkpoint=runs/train_transformer_pydoc_fedsgd/epoch_1.npz
"""

import os
import time

import numpy as np
from absl import app, flags, logging

from gradjax.cli import common
from gradjax import configs, files, text
from gradjax.run import campaign, config, report, text_run

METHODS = {
    "DLG": {"attack.preset": "dlg"},
    "SAPAG": {"attack.preset": "sapag"},
    "cosine": {"attack.preset": "dlg", "attack.distance": "cosine"},
    # Readings of SAPAG, to find out what its row depends on (not in the default table):
    "SAPAG-literal": {"attack.preset": "sapag",
                      "attack.distance": "gaussian_kernel"},  # σ_l² literal, not per entry
    "SAPAG-uniform": {"attack.preset": "sapag",
                      "attack.depth_rule": "uniform"},  # Q_l = 1, no depth weights
}
TABLE = ("DLG", "SAPAG", "cosine")

flags.DEFINE_string("searches", ",".join(text.SEARCHES), "Comma-separated subset of "
                    f"{', '.join(text.SEARCHES)}.")
flags.DEFINE_bool("untrained", True, "Attack fresh random models too (with --checkpoint, its rows "
                  "are added beside the untrained ones).")
flags.DEFINE_integer("examples", 2, "Example sentences printed per model.", lower_bound=0)
common.define_flags("sapag_text")  # the papers' protocol: gradjax/configs/sapag_text.py
common.define_table_flags(psnr=False, methods=True)
common.define_output_flags()
common.define_launch_flags(collectives=False)  # experiments split over processes
flags.adopt_module_key_flags(common)


def experiments(model: str, method: str, search: str, base: dict, indices
                ) -> list[tuple[str, config.Config]]:
  """(key, configuration) of one row's experiment on each sentence of ``indices``."""
  return [(f"{model}_{method}_{search}_{index}",
           config.from_options({**base, **METHODS[method], "data.index": index,
                                 "attack.text_search": search}))
          for index in indices]


def run_rows(model: str, method: str, search: str, base: dict, indices, items: campaign.Items) -> dict:
  """One row of the table: ``method`` with ``search`` on every sentence of ``indices``."""
  rows = []
  for (key, cfg), index in zip(experiments(model, method, search, base, indices), indices):
    results, _, _ = items.run(key, cfg)
    rows.append({"index": index, "token_accuracy": results["token_accuracy"],
                 "token_accuracy_nearest": results["token_accuracy_nearest"],
                 "bag_recall": results["bag_recall"], "exact": results["exact"],
                 "loss": results["loss"], "wall_time_s": results["wall_time_s"],
                 "sentence": results["sentences"][0]})
    logging.info("%s %s %s sentence %d: token accuracy %.2f, bag recall %.2f", model, method, search,
                 index, results["token_accuracy"], results["bag_recall"])
  acc = np.array([r["token_accuracy"] for r in rows])
  return {"model": model, "method": method, "search": search, "rows": rows,
          "token_accuracy_mean": float(acc.mean()), "token_accuracy_std": float(acc.std()),
          "token_accuracy_median": float(np.median(acc)),
          "token_accuracy_nearest_mean": float(np.mean([r["token_accuracy_nearest"] for r in rows])),
          "bag_recall_mean": float(np.mean([r["bag_recall"] for r in rows])),
          "exact": int(sum(r["exact"] for r in rows)),
          "wall_time_s": float(sum(r["wall_time_s"] for r in rows))}


def markdown(table: list[dict], info: dict, examples: int) -> str:
  """The table, then example sentences (true and recovered) of each model."""
  lines = [f"# Token recovery from a Transformer's gradient ({info['dataset']}, "
           f"{info['count']} sentences of {info['sequence_length']} tokens)", "",
           f"`{info['command']}`", "",
           f"{info['device']}; jax {info['jax']}, flax {info['flax']}, optax {info['optax']}, Python "
           f"{info['python']}; total {info['total_time_s']:.0f} s.", "",
           "| model | method | search | token accuracy, mean ± std (median) | nearest-embedding decoding "
           "| bag recall | exact sentences | time (s) |", "|---|---|---|---|---|---|---|---|"]
  for t in table:
    lines.append(f"| {t['model']} | {t['method']} | {t['search']} | {t['token_accuracy_mean']:.2f} ± "
                 f"{t['token_accuracy_std']:.2f} ({t['token_accuracy_median']:.2f}) | "
                 f"{t['token_accuracy_nearest_mean']:.2f} | {t['bag_recall_mean']:.2f} | "
                 f"{t['exact']}/{len(t['rows'])} | {t['wall_time_s']:.0f} |")
  lines += ["", "Token accuracy: position-wise, tokens by the pseudo-inverse of the embedding matrix "
            "(the token search reads its argmax; both decodings agree there). Bag recall: tokens "
            "recovered anywhere, with multiplicity.", ""]
  for model in dict.fromkeys(t["model"] for t in table):
    for i in range(min(examples, info["count"])):
      rows = [t for t in table if t["model"] == model]
      lines += [f"**{model} model, sentence {rows[0]['rows'][i]['index']}**", "", "| | sentence |",
                "|---|---|", f"| true | {rows[0]['rows'][i]['sentence']['true']} |"]
      for t in rows:
        row = t["rows"][i]
        lines.append(f"| {t['method']}, {t['search']} ({row['token_accuracy']:.2f}) | "
                     f"{row['sentence']['recovered (pseudo-inverse)']} |")
      lines.append("")
  return "\n".join(lines).replace("| |", "|  |")


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  names = common.semicolon_list("methods", f.methods or ";".join(TABLE))
  searches = [s.strip() for s in f.searches.split(",") if s.strip()]
  if (not names or any(m not in METHODS for m in names) or not searches
      or any(s not in text.SEARCHES for s in searches) or len(set(searches)) != len(searches)
      or f.count < 1):
    common.fail(f"need a positive --count, methods from {', '.join(METHODS)} and distinct searches from "
                f"{', '.join(text.SEARCHES)}; got {f.methods!r} and {f.searches!r}")
  def check(cfg, files):
    if cfg.data.modality != "text":
      raise ValueError("the table attacks text models (--modality=text)")
    if cfg.attack.preset != configs.get("sapag_text").attack.preset:  # each row sets its own
      raise ValueError(f"--attack={cfg.attack.preset}: the table's attacks are its --methods")
    if cfg.data.batch_size != 1:
      raise ValueError(f"--batch_size={cfg.data.batch_size}: the table's clients hold one sentence "
                       "each (the papers' protocol)")
    if "data.index" in common.options_given():
      raise ValueError("--index is one experiment's sentence; the table's sentences are --start "
                       "and --count")
    for m in names:
      config.check(config.replace(cfg, METHODS[m]), files)
    if cfg.model.checkpoint and files:  # its vocabulary, read before the untrained rows run
      text_run.text_vocabulary(cfg, [])
    if files:  # the last sentence exists: refused now, not after the others were attacked
      try:
        text_run.load_sentences(config.replace(cfg, {"data.index": f.start + f.count - 1}))
      except ValueError as e:
        raise ValueError(f"--start={f.start} --count={f.count}: {e}") from None

  cfg = common.config_from_flags(check=check)
  models = ([("untrained", None)] if f.untrained else []) + (
      [("trained", cfg.model.checkpoint)] if cfg.model.checkpoint else [])
  if not models:
    common.fail("nothing to attack: --nountrained needs a --checkpoint")
  out = common.output_folder("text_table", own=("results.md", "results.json", "results.csv", "items/*.json", "config.py"))
  items = common.items(out)
  start = time.perf_counter()
  table = []
  indices = range(f.start, f.start + f.count)
  bases = {model: {**config.options(cfg), "model.checkpoint": path} for model, path in models}
  try:
    if not common.plan(items, [e for model, _ in models for s in searches for m in names
                       for e in experiments(model, m, s, bases[model], indices)]):
      return  # over several processes: this one's experiments are written, process 0 goes on
    for model, _ in models:
      table += [run_rows(model, m, s, bases[model], indices, items) for s in searches for m in names]
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    common.fail(str(e))
  info = {
      **common.provenance(), "dataset": cfg.data.dataset, "count": f.count,
      "sequence_length": cfg.data.sequence_length, "iterations": cfg.attack.iterations,
      "restarts": cfg.attack.restarts, "checkpoint": cfg.model.checkpoint,
      "total_time_s": items.earlier_s + time.perf_counter() - start
  }
  common.write_config(out, cfg, rows=True)  # each row sets its attack
  report.save_json(os.path.join(out, "results.json"), {"table": table, **info})
  columns = ("model", "method", "search", "token_accuracy_mean", "token_accuracy_std",
             "token_accuracy_median", "token_accuracy_nearest_mean", "bag_recall_mean", "exact",
             "wall_time_s")
  report.save_csv(os.path.join(out, "results.csv"), table, columns)
  md = markdown(table, info, f.examples)
  files.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(md), binary=False)
  print(md)
  print(f"wrote {out}: results.json, results.csv, results.md, items/")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
