"""Exact text from a transformer's gradient by span checks (gradjax.dager, after DAGER, Petrov et al.
NeurIPS 2024), by model, sentence length and batch size.

  python experiments/studies/text/spans.py --data_dir=../shared/data     # runs what is missing
  python experiments/studies/text/spans.py --table                       # the table from the runs

Models (random initialisation, a fresh draw per batch):
* ``gpt``: the zoo's GPT-2-style decoder at GPT-2 small's width (768, 12 heads, feed-forward 3072),
  2 blocks (the attack reads the first two; the others only add to the client's cost), logits tied to
  the embedding; word vocabulary of WikiText-2's test split (12 483 tokens); sentences: the first T
  tokens of the test split's sentences of at least T tokens, distinct, in corpus order, batch k
  taking the k-th run of B.
* ``gpt_trained``: the same decoder after one epoch of FedSGD on WikiText-2's validation split in
  windows of 32 tokens, its vocabulary (12 024 tokens; the test split's other words are ``<unk>``)::

    gradjax train --modality=text --model=gpt --dataset=wikitext2 --data_dir=../shared/data \
      --config.data.sequence_length=32 --config.model.text_dim=768 --config.model.text_heads=12 --config.model.text_ffn=3072 --epochs=1 \
      --config.training.lr=0.1 --batch_size=32 --output_dir=<folder>

  (the checkpoint, about 90 MB, is not kept; ``--trained=<folder>/epoch_1.npz``).
* ``bert_trained``: the ``bert`` rows' encoder after one epoch on the same windows (``--model=bert``
  and ``--config.training.lr=0.01`` in the command above, 0.1 diverged; 15 % of each window's positions masked
  once; masked-token accuracy 6.7 %, 407 s), given with
  ``--trained_bert=<folder>/epoch_1.npz``; the test split's other words are ``<unk>``.
* ``gpt_bpe``: the ``gpt`` rows' decoder over byte-pair pieces instead of words: a SentencePiece
  model of 8000 pieces learned on the test split (``corpus.subwords``), sentences of T pieces.
* ``bert``: the zoo's BERT-style encoder with a masked-LM head at BERT-base's width (768, 12 heads,
  feed-forward 3072), 2 blocks, the ``gpt`` rows' sentences and vocabulary with ``<mask>`` added;
  the client masks 15 % of each sentence's positions (``corpus.masked_lm_pairs``, seed (0, batch))
  and its update is the gradient of the loss at those positions. The attack reads the input,
  ``<mask>`` included, from layer 1 and the masked words from the head's gradient
  (``dager.masked_targets``, once every sentence of the batch is found); at batches of several
  sentences the inputs come from a search against the second block (``dager`` on encoders), and a
  refused batch keeps each position's candidate words (``words_recall``: each true sentence's share
  of words among them).
* ``transformer``: SAPAG's Transformer (width 200) on the pydoc corpus's 15-token sentences, the
  sentences and model draws of ``experiments/studies/text_sapag`` (``gradjax.run.pipeline``'s keys and
  vocabulary), so its rows sit beside that study's optimisation attacks.
* Padded rows (:data:`PADDED`, ``_padded`` in the row's name): the client's sentences are the
  corpus's distinct sentences of ``min_length`` to T tokens, whole and in corpus order (``gpt``:
  WikiText-2's test split; ``transformer``: pydoc, the command line's ``--config.data.min_length``
  draw), padded on the right with no loss past their ends (``corpus.language_model_pairs``), read
  with ``dager.recover(..., padded=True)``; scores count each sentence's own tokens.

The client's update is the FedSGD gradient of the next-token loss (the ``gpt_fedavg*`` rows: a FedAvg
client's update after E epochs of local SGD, over the batch or mini-batches, :data:`LOCAL`); the attack searches the whole
vocabulary (it does not use the embedding gradient's rows). Nothing is tuned: the rank and tolerance
of each span are read from its singular values. Each batch's record (runs/spans/<row>.json) has the
scores (ROUGE-1/2/L, exact sentences, token accuracy after assignment), the spans' ranks and
tolerances, the sizes of the position sets, seconds (the first batch of a row includes compiling),
or the reason the attack refused; table.md and table.json summarise the rows.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from gradjax import clients, corpus, dager, metrics, models
from gradjax.run import config, pipeline, text_run

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs", "spans")
GPT = models.TextSizes(768, 12, 3072, 2)

# (row, model, T, B, batches)
ROWS = ([(f"gpt_t{t}_b{b}", "gpt", t, b, 3 if b <= 16 else 2)
         for t, sizes in ((16, (1, 2, 4, 8, 16, 32, 64)), (32, (1, 2, 4, 8, 16, 32, 64)),
                          (64, (1, 2, 4, 8, 16)))
         for b in sizes]
        + [("gpt_trained_t32_b1", "gpt_trained", 32, 1, 10)]
        + [("gpt_trained_t32_b1_unseen", "gpt_trained", 32, 1, 20)]
        + [(f"gpt_trained_t32_b{b}", "gpt_trained", 32, b, 3) for b in (2, 4, 8, 16)]
        + [(f"gpt_bpe_t32_b{b}", "gpt_bpe", 32, b, 3) for b in (1, 8, 16)]
        + [(f"bert_t{t}_b1", "bert", t, 1, 5) for t in (16, 32, 64)]
        + [(f"bert_t16_b{b}", "bert", 16, b, 3 if b < 8 else 2 if b < 16 else 1) for b in (2, 4, 8, 16)]
        + [(f"bert_t32_b{b}", "bert", 32, b, 2 if b < 16 else 1) for b in (4, 8, 16)]
        + [(f"bert_t16_b{b}", "bert", 16, b, 1) for b in (32, 64)]
        + [("bert_trained_t32_b1", "bert_trained", 32, 1, 5)]
        + [(f"bert_trained_t32_b{b}", "bert_trained", 32, b, 2) for b in (2, 4)]
        + [("transformer_t15_b1", "transformer", 15, 1, 20)]
        + [(f"transformer_t15_b{b}", "transformer", 15, b, 3) for b in (2, 4, 8)]
        + [(f"gpt_padded_t32_b{b}", "gpt", 32, b, 3 if b <= 16 else 2) for b in (1, 4, 8, 16, 32, 64)]
        + [(f"transformer_padded_t15_b{b}", "transformer", 15, b, 3) for b in (2, 4, 8)])
# Padded rows: row -> the shortest sentence's tokens (module docstring).
PADDED = {**{f"gpt_padded_t32_b{b}": 4 for b in (1, 4, 8, 16, 32, 64)},
          **{f"transformer_padded_t15_b{b}": 6 for b in (2, 4, 8)}}
# Rows whose batches start further into the pool: row -> the first batch. The unseen row's 20
# sentences (10-29) were never looked at while dager.settle was built on sentences 0-9.
FIRST = {"gpt_trained_t32_b1_unseen": 10}
# FedAvg rows: the client's update after E epochs of local SGD at learning rate η (no momentum), over
# the whole batch or mini-batches of b (E · B / b steps), read with dager.recover_local; row -> (E, η, b).
LOCAL = {f"gpt_fedavg{e}_lr{lr}_t{t}_b{b}": (e, lr, None)
         for t, b in ((16, 4), (16, 8), (16, 16), (32, 8)) for e, lr in ((2, 0.01), (5, 0.01), (5, 0.1))}
LOCAL.update({f"gpt_fedavg{e}_lr{lr}_mb{m}_t16_b{b}": (e, lr, m)
              for b, m in ((8, 4), (16, 4)) for e, lr in ((1, 0.01), (2, 0.01))})
ROWS += [(row, "gpt", int(row.split("_t")[1].split("_")[0]), int(row.split("_b")[1]), 2) for row in LOCAL]


BPE = 8000  # the gpt_bpe rows' pieces


def _gpt_batches(data_dir, length, batch, count, trained=None, name="gpt", first=0, shortest=None):
  sentences = corpus.sentences("wikitext2_test", data_dir)
  if name == "gpt_bpe":
    sentences, name = corpus.subwords(sentences, BPE), "gpt"
  if trained:  # the checkpoint's model and vocabulary (trained on the validation split)
    cfg = config.from_options({
        "data.modality": "text", "data.dataset": "wikitext2_test", "model.name": name,
        "model.checkpoint": trained, "data.sequence_length": length
    })
    vocabulary = text_run.text_vocabulary(cfg, sentences)
    model = text_run.text_model(cfg, vocabulary, None)
  else:
    vocabulary = corpus.Vocabulary.build(sentences)
    if models.is_masked_lm(name):
      vocabulary = vocabulary.with_mask()
  seen, pool = set(), []
  for s in sentences:
    if shortest is not None:  # whole sentences of shortest..length tokens
      if shortest <= len(s) <= length and tuple(s) not in seen:
        seen.add(tuple(s))
        pool.append(s)
    elif len(s) >= length and tuple(s[:length]) not in seen:
      seen.add(tuple(s[:length]))
      pool.append(s[:length])
  for k in range(first, first + count):
    chosen = pool[k * batch:(k + 1) * batch]
    if len(chosen) < batch:
      return
    ids = corpus.padded([vocabulary.encode(s) for s in chosen], length)
    if not trained:
      model = models.create(name, jax.random.key(k), input_shape=(length,),
                            num_classes=len(vocabulary), text_sizes=GPT)
    yield k, ids, model, vocabulary


def _sapag_batches(data_dir, length, batch, count, shortest=None):
  del data_dir
  for k in range(count):
    cfg = config.from_options({
        "data.dataset": "pydoc", "data.modality": "text", "model.name": "transformer",
        "data.sequence_length": length, "data.batch_size": batch, "data.index": k * batch,
        **({} if shortest is None else {"data.min_length": shortest, "attack.preset": "dager"})
    })
    key_model = pipeline.experiment_keys(cfg.seed, cfg.data.index).model
    sentences = text_run.load_sentences(cfg)
    model = text_run.text_model(cfg, sentences.vocabulary, key_model)
    yield k * batch, sentences.ids, model, sentences.vocabulary


def run_row(row, model_name, length, batch, count, data_dir, trained=None, trained_bert=None):
  if model_name == "gpt_trained" and not trained:
    print(f"{row}: skipped (give --trained=<checkpoint>)", flush=True)
    return None
  if model_name == "bert_trained":
    if not trained_bert:
      print(f"{row}: skipped (give --trained_bert=<checkpoint>)", flush=True)
      return None
    trained = trained_bert
  shortest = PADDED.get(row)
  if model_name == "transformer":
    batches = _sapag_batches(data_dir, length, batch, count, shortest)
  else:
    batches = _gpt_batches(data_dir, length, batch, count, trained if model_name.endswith("_trained") else None,
                           "bert" if model_name.startswith("bert") else model_name.removesuffix("_trained"),
                           first=FIRST.get(row, 0), shortest=shortest)
  records = []
  for index, ids, model, vocabulary in batches:
    masked = models.is_masked_lm(model.name)
    if masked:
      x, y = corpus.masked_lm_pairs(ids, vocabulary.mask, 0.15, seed=(0, index))
    else:
      x, y = corpus.language_model_pairs(ids, vocabulary.eos)
    if row in LOCAL:
      epochs, lr, mini = LOCAL[row]
      observation = clients.fedavg(model.apply_fn, model.variables, x, y,
                                   clients.LocalTraining(epochs, mini, lr))
    else:
      observation = clients.fedsgd(model.apply_fn, model.variables, x, y)
    start = time.perf_counter()
    try:
      if row in LOCAL:
        rec = dager.recover_local(model.apply_fn, model.variables, observation.gradient, length=length,
                                  local=observation.local, num_samples=len(ids), eos=vocabulary.eos)
      else:
        rec = dager.recover(model.apply_fn, model.variables, observation.gradient, length=length,
                            eos=None if masked else vocabulary.eos, padded=shortest is not None)
      extra = {}
      if masked and len(rec.sentences) == len(ids):  # the labels are counted over the whole batch
        targets, extra["masked_residual"] = dager.masked_targets(
            model.apply_fn, model.variables, observation.gradient, rec.sentences, vocabulary.mask)
        rec = rec._replace(sentences=np.where(targets >= 0, targets, rec.sentences))
    except ValueError as e:
      record = {"index": index, "refused": str(e), "seconds": time.perf_counter() - start,
                "lengths": corpus.lengths(ids).tolist()}
      sets = getattr(e, "position_sets", None)
      if sets is not None:
        words = np.unique(np.concatenate(sets))
        record["words_recall"] = float(np.mean(metrics.word_recall(words, ids)))
      records.append(record)
      print(f"{row} batch {index}: refused ({e})", flush=True)
      continue
    seconds = time.perf_counter() - start
    scores = metrics.score_text(rec.sentences, ids)
    records.append({
        "index": index, "seconds": seconds, "stopped_at": rec.stopped_at, "capped": rec.capped,
        "mini_batches": rec.mini_batches,
        "undetermined": None if rec.undetermined is None else rec.undetermined.tolist(),
        "residual": rec.residual,
        **extra, "found": int(len(rec.sentences)), "distinct_true": int(len({tuple(s) for s in ids.tolist()})),
        "lengths": corpus.lengths(ids).tolist(),
        "set_sizes": [int(len(s)) for s in rec.position_sets],
        "spans": [{"rank": s.rank, "tolerance": s.tolerance, "random_level": s.random_level}
                  for s in rec.spans],
        **{k: scores[k] for k in ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact",
                                  "unmatched")},
        "example": {"true": " ".join(vocabulary.decode(ids[0])),
                    "recovered": " ".join(vocabulary.decode(rec.sentences[scores["order"][0]]))
                    if scores["order"][0] >= 0 else None}})
    print(f"{row} batch {index}: exact {scores['exact']}/{batch}, ROUGE-1 {scores['rouge1']:.3f}, "
          f"{seconds:.1f} s", flush=True)
  return records


def table():
  numbers, lines = {}, [
      "| model | client | T | B | batches | exact sentences | ROUGE-1 | ROUGE-2 | token accuracy | s per batch "
      "(first) | ranks (input, output, second) | refused |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row, model_name, length, batch, count in ROWS:
    path = os.path.join(RUNS, f"{row}.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      records = json.load(f)
    done = [r for r in records if "refused" not in r]
    refused = len(records) - len(done)
    n = {"batches": len(records), "refused": refused}
    recalls = [r["words_recall"] for r in records if "words_recall" in r]
    if recalls:  # the refused batches' words, from layer 1
      n["words_recall"] = float(np.mean(recalls))
      refused = f"{refused} (words {n['words_recall']:.2f})"
    label = model_name
    if row in FIRST:  # batches FIRST[row] .. FIRST[row] + count - 1
      label = f"{model_name} (batches {FIRST[row]}-{FIRST[row] + count - 1})"
    if row in LOCAL:
      e, lr, mini = LOCAL[row]
      client = (f"FedAvg, {e} epochs, lr {lr}" + (f", mini-batches of {mini}" if mini else ""))
    else:
      client = "FedSGD"
    if row in PADDED:
      client += f", padded ({PADDED[row]}-{length} tokens)"
    if done:
      n.update(exact=sum(r["exact"] for r in done) / (batch * len(done)),
               rouge1=float(np.mean([r["rouge1"] for r in done])),
               rouge2=float(np.mean([r["rouge2"] for r in done])),
               token_accuracy=float(np.mean([r["token_accuracy"] for r in done])),
               seconds=float(np.median([r["seconds"] for r in done])),
               seconds_first=done[0]["seconds"],
               ranks=[int(np.median([r["spans"][i]["rank"] for r in done if len(r["spans"]) > i]))
                      for i in range(max(len(r["spans"]) for r in done))])
      lines.append(f"| {label} | {client} | {length} | {batch} | {len(records)} | {n['exact']:.2f} | "
                   f"{n['rouge1']:.3f} | {n['rouge2']:.3f} | {n['token_accuracy']:.3f} | "
                   f"{n['seconds']:.1f} ({n['seconds_first']:.1f}) | {', '.join(map(str, n['ranks']))} "
                   f"| {refused} |")
    else:
      lines.append(f"| {label} | {client} | {length} | {batch} | {len(records)} | – | – | – | – | – | – | "
                   f"{refused} |")
    numbers[row] = n
  return "\n".join(lines) + "\n", numbers


def parser(doc: str) -> argparse.ArgumentParser:
  """The options this folder's programs share: the data, table-only, and which rows to run."""
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--data_dir", default=None)
  p.add_argument("--table", action="store_true", help="only write the table from the runs")
  p.add_argument("--rows", default=None, help="comma-separated rows (all if omitted)")
  return p


def main():
  options = parser(__doc__)
  options.add_argument("--trained", default=None, help="the gpt_trained rows' checkpoint (see the "
                      "module docstring)")
  options.add_argument("--trained_bert", default=None, help="the bert_trained rows' checkpoint")
  args = options.parse_args()
  os.makedirs(RUNS, exist_ok=True)
  wanted = None if args.rows is None else set(args.rows.split(","))
  if not args.table:
    for row, model_name, length, batch, count in ROWS:
      path = os.path.join(RUNS, f"{row}.json")
      if os.path.exists(path) or (wanted is not None and row not in wanted):
        continue
      records = run_row(row, model_name, length, batch, count, args.data_dir, args.trained,
                        args.trained_bert)
      if records is not None:
        save(path, records)
  write_tables(RUNS, *table())
  return 0


def save(path, records):
  """A row's records, written whole or not at all (a row on disk is a finished row)."""
  with open(path + ".tmp", "w") as f:
    json.dump(records, f, indent=1)
  os.replace(path + ".tmp", path)


def write_tables(runs, markdown, numbers):
  """table.md and table.json in ``runs``; the markdown printed."""
  with open(os.path.join(runs, "table.md"), "w") as f:
    f.write(markdown)
  with open(os.path.join(runs, "table.json"), "w") as f:
    json.dump(numbers, f, indent=1)
  print(markdown)


if __name__ == "__main__":
  sys.exit(main())
