"""The DP-SGD study's text tables: the span attack (``--attack=dager``, gradjax.dager) against a
language model's DP-SGD client (each sentence's gradient clipped to C over all parameters, then
N(0, σ²C²) on the sum) for noise multipliers σ from 0 up, beside the client's (ε, δ = 1e-5) for the
one update attacked (gradjax.privacy). ``--model=gpt``: the text study's ``gpt`` rows' decoder
(GPT-2 small's width, 2 blocks, a fresh draw per batch), next-token targets; ``--model=bert``: its
``bert`` rows' encoder (BERT-base's width, 2 blocks) whose client masks 15 % of each sentence's
positions, each sentence's gradient weighed by its share of the batch's masks before clipping, as
Opacus does (gradjax.clients.example_weights). Sentences: WikiText-2's test split, the first 16
tokens of its sentences of at least 16, batch k the k-th run of 4; C half the smallest of the
batch's sentences' (weighed) gradient norms (every sentence clipped).

  python experiments/studies/dp_sgd/text.py --data_dir=../shared/data [--model=bert]  # runs what is missing
  python experiments/studies/dp_sgd/text.py --table [--model=bert]                    # the table from the runs

Each row's batches are recorded in ``runs/text/<row>.json`` (``runs/text_bert/`` for bert: exact
sentences, ROUGE-1, the share of
each sentence's words among those the first block's span gave where the sentences could not be read
(bag recall) and of those words in the batch (word precision), the residual recomputed with the
clipping, the reason a batch was refused, seconds); ``table.md`` and ``table.json`` summarise the
rows. Nothing is tuned.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "batches"))
import sweeps  # noqa: E402  (the batches study's table writer)
import noise  # noqa: E402  (this study's image table: its row names)

from gradjax import clients, privacy  # noqa: E402
from gradjax.run import config, pipeline, text_run  # noqa: E402

RUNS = {"gpt": os.path.join(HERE, "runs", "text"), "bert": os.path.join(HERE, "runs", "text_bert")}
LENGTH, BATCH, BATCHES, DELTA = 16, 4, 3, 1e-5
SIGMAS = (0.0, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3)


def options(k: int, data_dir: str | None, model: str) -> dict:
  return {"data.modality": "text", "data.dataset": "wikitext2", "data.data_dir": data_dir,
          "model.name": model, "model.text_dim": 768, "model.text_heads": 12, "model.text_ffn": 3072,
          "model.text_layers": 2, "attack.preset": "dager", "data.sequence_length": LENGTH,
          "data.batch_size": BATCH, "data.index": k * BATCH}


def bound(cfg) -> float:
  """Half the smallest of the batch's sentences' gradient norms (each weighed as the client weighs
  it: 1 for next-token targets, its share of the masks for a masked model): every sentence is
  clipped."""
  batch = text_run.load_sentences(cfg)
  model = text_run.text_model(cfg, batch.vocabulary, pipeline.experiment_keys(cfg.seed, cfg.data.index)[0])
  x, y = text_run.client_pairs(cfg, model, batch.ids, batch.vocabulary)
  weights = np.asarray(clients.example_weights(jax.numpy.asarray(y)))
  norms = [float(weights[n]) * float(np.sqrt(sum(np.sum(np.square(a)) for a in jax.tree.leaves(
      clients.gradient(model.apply_fn, model.variables, x[n:n + 1], y[n:n + 1]))))) for n in range(BATCH)]
  return 0.5 * min(norms)


def run(sigma: float, data_dir: str | None, model: str) -> None:
  path = os.path.join(RUNS[model], f"sigma_{noise.tag(sigma)}.json")
  if os.path.exists(path):
    return
  records = []
  for k in range(BATCHES):
    cfg = config.from_options(options(k, data_dir, model))
    c = bound(cfg)
    cfg = config.replace(cfg, {"defense.dp_sgd_max_norm": c, "defense.dp_sgd_noise_multiplier": sigma})
    start = time.perf_counter()
    results = text_run.run_text(cfg)
    records.append({"batch": k, "max_norm": c, "exact": results["exact"], "rouge1": results["rouge1"],
                    "bag_recall": results["bag_recall"], "word_precision": results.get("word_precision"),
                    "word_recall": results.get("word_recall"),
                    "word_recall_chance": results.get("word_recall_chance"),
                    "residual": (results.get("residual") or {}).get("relative_error"),
                    "verdict": results["verdict"]["status"], "reason": results.get("unreadable"),
                    "epsilon": results["privacy"]["epsilon"], "seconds": time.perf_counter() - start})
    print(f"σ {sigma:g}, batch {k}: {results['exact']} of {BATCH} exact", flush=True)
  os.makedirs(RUNS[model], exist_ok=True)
  with open(path, "w", encoding="utf-8") as fh:
    json.dump({"noise_multiplier": sigma, "length": LENGTH, "batch_size": BATCH, "batches": records},
              fh, indent=1)


def table(model: str) -> tuple[str, dict]:
  lines = ["| σ | ε, this update | sentences exact | ROUGE-1, mean | words: bag recall, mean | "
           "residual (clipping recomputed), median | leak verdicts | s per batch |",
           "|---|---|---|---|---|---|---|---|"]
  numbers = {}
  for sigma in SIGMAS:
    path = os.path.join(RUNS[model], f"sigma_{noise.tag(sigma)}.json")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as fh:
      records = json.load(fh)["batches"]
    eps = privacy.epsilon(1.0, sigma, 1, DELTA).epsilon if sigma else float("inf")
    exact = sum(r["exact"] for r in records)
    residuals = [r["residual"] for r in records if r["residual"] is not None]
    numbers[noise.tag(sigma)] = {"epsilon": None if eps == float("inf") else eps, "exact": exact, "sentences": BATCH * len(records),
                             "rouge1": float(np.mean([r["rouge1"] for r in records])),
                             "bag_recall": float(np.mean([r["bag_recall"] for r in records])),
                             "residual_median": float(np.median(residuals)) if residuals else None,
                             "leaks": sum(r["verdict"] == "leak" for r in records),
                             "seconds": float(np.mean([r["seconds"] for r in records]))}
    n = numbers[noise.tag(sigma)]
    lines.append(f"| {sigma:g} | {'∞' if eps == float('inf') else f'{eps:.3g}'} | {exact} / "
                 f"{n['sentences']} | {n['rouge1']:.3f} | {n['bag_recall']:.3f} | "
                 + ("–" if n["residual_median"] is None else f"{n['residual_median']:.1e}")
                 + f" | {n['leaks']} / {len(records)} | {n['seconds']:.1f} |")
  return "\n".join(lines) + "\n", numbers


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", action="store_true", help="only write the table from the runs there")
  parser.add_argument("--data_dir", default=None, help="where WikiText-2 is (gradjax's default)")
  parser.add_argument("--model", default="gpt", choices=sorted(RUNS), help="the client's model")
  args = parser.parse_args()
  if not args.table:
    for sigma in SIGMAS:
      run(sigma, args.data_dir, args.model)
  sweeps.write_table(RUNS[args.model], *table(args.model))


if __name__ == "__main__":
  main()
