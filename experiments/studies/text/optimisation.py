"""The optimisation attacks on the span rows' decoder and encoder: DLG's embedding search and
gradjax's token search (``gradjax.text``) against the ``gpt`` and ``bert`` rows of ``spans.py``, on
the same sentences, masks and model draws, so the two families sit side by side.

  python experiments/studies/text/optimisation.py --data_dir=../shared/data     # runs what is missing
  python experiments/studies/text/optimisation.py --table                       # the table from the runs

The decoder's logits read its embedding table (tied, GPT-2's), so the table's gradient reaches every
row and shows no bag: both searches range over the whole vocabulary (12 483 words) and match every
other parameter's gradient with the table held fixed (``text.tied_apply_fn``). The encoder's client
sends the gradient at its masked positions only (DLG §4.2's setting): the targets range over the
words and 'no target', and the sentence is the inputs with each ``<mask>`` filled by its target
(``losses.masked_cross_entropy``, ``text.soft_masked_tokens``). DLG's preset (Euclidean
distance, L-BFGS lr 1, joint soft targets) at ``ITERATIONS`` iterations, one restart. Each batch's
record (runs/optimisation/<row>.json): scores after assignment (token accuracy, ROUGE-1/2, exact
sentences), the final objective and seconds (the first batch of a row includes compiling).
"""

import json
import os
import sys
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spans  # noqa: E402  (the gpt rows' sentences and model draws)

from gradjax import clients, corpus, metrics, models, presets, text  # noqa: E402

RUNS = os.path.join(HERE, "runs", "optimisation")
ITERATIONS = 500
# (row, model, search, T, B, batches): 16-token sentences, at 3-8 minutes an attack on one core
ROWS = ([(f"gpt_{search}_t16_b{b}", "gpt", search, 16, b, count)
         for search in text.SEARCHES for b, count in ((1, 3), (4, 1))]
        + [(f"bert_{search}_t16_b1", "bert", search, 16, 1, 3) for search in text.SEARCHES])


def run_row(model_name, search, length, batch, count, data_dir):
  records = []
  for index, ids, model, vocabulary in spans._gpt_batches(data_dir, length, batch, count,
                                                           name=model_name):
    mask = vocabulary.mask if models.is_masked_lm(model_name) else None
    if mask is None:
      x, y = corpus.language_model_pairs(ids, vocabulary.eos)
    else:  # the span rows' masks
      x, y = corpus.masked_lm_pairs(ids, mask, 0.15, seed=(0, index))
    observation = clients.fedsgd(model.apply_fn, model.variables, x, y)
    start = time.perf_counter()
    rec = text.reconstruct(presets.dlg(ITERATIONS), model.apply_fn, observation, jax.random.key(index),
                           length=length, eos=vocabulary.eos, mask=mask, search=search)
    seconds = time.perf_counter() - start
    scores = metrics.score_text(rec.tokens_pinv, ids)
    records.append({
        "index": index, "seconds": seconds, "loss": float(rec.reconstruction.loss),
        **{k: scores[k] for k in ("rouge1", "rouge2", "token_accuracy", "exact")},
        "example": {"true": " ".join(vocabulary.decode(ids[0])),
                    "recovered": " ".join(vocabulary.decode(rec.tokens_pinv[scores["order"][0]]))}})
    print(f"{model_name} {search} T={length} B={batch} batch {index}: token accuracy {scores['token_accuracy']:.2f}, "
          f"exact {scores['exact']}/{batch}, {seconds:.1f} s", flush=True)
  return records


def table():
  lines = ["| model | search | T | B | batches | exact sentences | ROUGE-1 | token accuracy "
           "| objective (median) | s per batch (first) |", "|---|---|---|---|---|---|---|---|---|---|"]
  numbers = {}
  for row, model_name, search, length, batch, _ in ROWS:
    path = os.path.join(RUNS, f"{row}.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      records = json.load(f)
    n = {"exact": sum(r["exact"] for r in records) / (batch * len(records)),
         "rouge1": float(np.mean([r["rouge1"] for r in records])),
         "token_accuracy": float(np.mean([r["token_accuracy"] for r in records])),
         "loss": float(np.median([r["loss"] for r in records])),
         "seconds": float(np.median([r["seconds"] for r in records]))}
    numbers[row] = n
    lines.append(f"| {model_name} | {search} | {length} | {batch} | {len(records)} | {n['exact']:.2f} | {n['rouge1']:.3f} | "
                 f"{n['token_accuracy']:.3f} | {n['loss']:.2e} | {n['seconds']:.1f} "
                 f"({records[0]['seconds']:.1f}) |")
  return "\n".join(lines) + "\n", numbers


def main():
  args = spans.parser(__doc__).parse_args()
  os.makedirs(RUNS, exist_ok=True)
  wanted = None if args.rows is None else set(args.rows.split(","))
  if not args.table:
    for row, model_name, search, length, batch, count in ROWS:
      path = os.path.join(RUNS, f"{row}.json")
      if os.path.exists(path) or (wanted is not None and row not in wanted):
        continue
      spans.save(path, run_row(model_name, search, length, batch, count, args.data_dir))
  spans.write_tables(RUNS, *table())


if __name__ == "__main__":
  main()
