"""The text verdict's chance level: what the corpus alone lets an attacker guess of a sentence.

  python experiments/studies/text/baseline.py --data_dir=../shared/data

For each sentence of a corpus's pool (its distinct sentences of exactly T tokens, as the text
pipeline draws a client's), the guesses of :func:`gradjax.corpus.unigram_guesses` made from the pool's
other sentences (:func:`gradjax.run.text_run.chance`, leave-one-out): the position guess's token accuracy
and the bag guess's bag-of-words recall against that sentence. The verdict counts a finding at least
halfway from these to 1 (:func:`gradjax.verdict.halfway`); before, it counted 0.5 whatever the
corpus. Writes runs/baseline/table.md and table.json.
"""

import argparse
import json
import os

import numpy as np

from gradjax.run import config, text_run

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "baseline")
ROWS = (("wikitext2_test", 16), ("wikitext2_test", 32), ("wikitext2_test", 64), ("pydoc", 15))


def row(dataset: str, length: int, data_dir: str | None) -> dict:
  model = "gpt" if dataset.startswith("wikitext") else "transformer"
  first = text_run.load_sentences(
      config.from_options({
          "data.modality": "text", "data.dataset": dataset, "data.data_dir": data_dir,
          "model.name": model, "data.sequence_length": length, "data.batch_size": 1
      }))
  pool = text_run.load_sentences(
      config.from_options({
          "data.modality": "text", "data.dataset": dataset, "data.data_dir": data_dir,
          "model.name": model, "data.sequence_length": length, "data.batch_size": first.pool
      }))
  ids = pool.ids
  accuracy, recall = [], []
  for i in range(len(ids)):
    c = text_run.chance(text_run.Sentences(ids[i:i + 1], pool.vocabulary, len(ids),
                                           np.delete(ids, i, axis=0)))
    accuracy.append(c["token_accuracy_chance"])
    recall.append(c["bag_recall_chance"])
  accuracy, recall = np.asarray(accuracy), np.asarray(recall)
  return {"corpus": dataset, "length": length, "sentences": len(ids),
          "position_accuracy_mean": float(accuracy.mean()), "position_accuracy_max": float(accuracy.max()),
          "bag_recall_mean": float(recall.mean()), "bag_recall_median": float(np.median(recall)),
          "bag_recall_max": float(recall.max()),
          "bag_at_half": float(np.mean(recall >= 0.5)),
          "position_at_half": float(np.mean(accuracy >= 0.5))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  rows = [row(d, t, args.data_dir) for d, t in ROWS]
  os.makedirs(RUNS, exist_ok=True)
  with open(os.path.join(RUNS, "table.json"), "w", encoding="utf-8") as f:
    json.dump({f"{r['corpus']}_t{r['length']}": r for r in rows}, f, indent=2)
    f.write("\n")
  lines = ["| corpus | T | sentences | position guess: token accuracy, mean (max) | share >= 0.5 "
           "| bag guess: recall, mean (median, max) | share >= 0.5 |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['corpus']} | {r['length']} | {r['sentences']} | {r['position_accuracy_mean']:.3f} "
                 f"({r['position_accuracy_max']:.3f}) | {r['position_at_half']:.3f} | "
                 f"{r['bag_recall_mean']:.3f} ({r['bag_recall_median']:.3f}, {r['bag_recall_max']:.3f}) | "
                 f"{r['bag_at_half']:.3f} |")
  with open(os.path.join(RUNS, "table.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
