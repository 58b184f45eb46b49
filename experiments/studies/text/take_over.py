"""Where the spans give each position's words but not the sentences: the token search takes over.

  python experiments/studies/text/take_over.py           # runs what is missing, then the table
  python experiments/studies/text/take_over.py --table   # the table from the runs

SAPAG's Transformer with one block (``--config.model.text_layers=1``) on pydoc sentences of 15
tokens, batches of 2 and 4 (the span rows' draws: sentences ``index`` .. ``index + B - 1``, model
key from the index): the span attack finds each position's words (its sinusoids pin a word to its
position) but has no second block to order them into sentences, so ``gradjax reconstruct
--attack=dager`` reports the words alone. Four runs of the pipeline on each batch: the span attack
alone; the span attack with ``--iterations=200`` (its token search, DLG's objective, each position
kept to the words the spans admit there, ``gradjax.run.text_run._take_over``); and the token search
over the embedding gradient's bag alone (``--attack=dlg --config.attack.text_search=tokens
--iterations=200``), what a user would run without the spans. One restart each, and the span
attack's token search with four (``--restarts=4``, the lowest objective kept). Each run's record:
runs/take_over/<row>.json; table: runs/take_over/table.md and table.json.
"""

import argparse
import json
import os

import numpy as np

from gradjax.run import config, text_run

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "take_over")
ITERATIONS = 200
BATCHES = 3
# row -> the options that differ between the three runs of each batch
RUNS_OF = {
    "spans": {"attack.preset": "dager"},
    "spans_take_over": {"attack.preset": "dager", "attack.iterations": ITERATIONS},
    "spans_take_over_4_restarts": {"attack.preset": "dager", "attack.iterations": ITERATIONS,
                                   "attack.restarts": 4},
    "token_search": {"attack.preset": "dlg", "attack.text_search": "tokens",
                     "attack.iterations": ITERATIONS},
}
SIZES = (2, 4)


def run(kind: str, batch: int) -> list[dict]:
  records = []
  for k in range(BATCHES):
    cfg = config.from_options({
        "data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
        "model.text_layers": 1, "data.sequence_length": 15, "data.batch_size": batch,
        "data.index": k * batch, **RUNS_OF[kind]})
    results = text_run.run_text(cfg)
    records.append({
        "index": k * batch, "seconds": results["wall_time_s"], "found": results.get("found"),
        **{key: results.get(key) for key in ("exact", "rouge1", "token_accuracy", "bag_recall")},
        "residual": (results.get("residual") or {}).get("relative_error"),
        "verdict": results["verdict"]["status"]})
    print(f"{kind} B={batch} batch {k}: exact {records[-1]['exact']}/{batch}, token accuracy "
          f"{records[-1]['token_accuracy']:.2f}, {records[-1]['seconds']:.1f} s", flush=True)
  return records


def table() -> tuple[str, dict]:
  lines = ["| run | B | batches | exact sentences | token accuracy | ROUGE-1 | residual (median) | s per batch |",
           "|---|---|---|---|---|---|---|---|"]
  numbers = {}
  for kind in RUNS_OF:
    for batch in SIZES:
      path = os.path.join(RUNS, f"{kind}_b{batch}.json")
      if not os.path.exists(path):
        continue
      with open(path) as f:
        records = json.load(f)
      residuals = [r["residual"] for r in records if r["residual"] is not None]
      n = {"exact": sum(r["exact"] for r in records) / (batch * len(records)),
           "token_accuracy": float(np.mean([r["token_accuracy"] for r in records])),
           "rouge1": (float(np.mean([r["rouge1"] for r in records]))
                      if all(r["rouge1"] is not None for r in records) else None),
           "residual": float(np.median(residuals)) if residuals else None,
           "seconds": float(np.median([r["seconds"] for r in records]))}
      numbers[f"{kind}_b{batch}"] = n
      residual = "–" if n["residual"] is None else f"{n['residual']:.1e}"
      rouge1 = "–" if n["rouge1"] is None else f"{n['rouge1']:.3f}"
      lines.append(f"| {kind} | {batch} | {len(records)} | {n['exact']:.2f} | {n['token_accuracy']:.3f} "
                   f"| {rouge1} | {residual} | {n['seconds']:.1f} |")
  return "\n".join(lines) + "\n", numbers


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--table", action="store_true", help="only write the table from the runs")
  args = p.parse_args()
  os.makedirs(RUNS, exist_ok=True)
  if not args.table:
    for kind in RUNS_OF:
      for batch in SIZES:
        path = os.path.join(RUNS, f"{kind}_b{batch}.json")
        if not os.path.exists(path):
          records = run(kind, batch)
          with open(path + ".tmp", "w") as f:
            json.dump(records, f, indent=1)
          os.replace(path + ".tmp", path)
  markdown, numbers = table()
  with open(os.path.join(RUNS, "table.md"), "w") as f:
    f.write(markdown)
  with open(os.path.join(RUNS, "table.json"), "w") as f:
    json.dump(numbers, f, indent=1)
  print(markdown)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
