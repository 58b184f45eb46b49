"""A text experiment end to end: the client's sentences -> a language model -> its update -> the
attack (:mod:`gradjax.text`'s optimisation, or DAGER's span checks, :mod:`gradjax.dager`) -> token
scores, chance levels and the verdict, for a built :class:`gradjax.run.config.Config` of
``data.modality="text"``. The image experiment, and what both share (seeding, the trace, timing,
the verdict's fields), is :mod:`gradjax.run.pipeline`.
"""

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from gradjax import (checkpoint, closed_forms, compilation, corpus, dager, driver, metrics, models,
                     presets, text, verdict)
from gradjax import labels as labels_lib
from gradjax.run import config, pipeline, resume
from gradjax.run.config import Config, check


class Sentences(NamedTuple):
  """The client's private sentences: ``ids`` (N, T) int32 in ``vocabulary`` (a padded batch's with
  :data:`gradjax.corpus.PAD` past each sentence's end); ``pool`` the number of distinct corpus
  sentences of length T (of ``min_length`` to T tokens) that ``index`` ranges over; ``others``
  (pool − N, T) the pool's other sentences, what an attacker may know of the corpus (the chance level,
  :func:`chance`); ``words`` the N sentences' tokens as the corpus has them (None: those of
  ``ids``), among them words outside ``vocabulary`` that the model reads as ``<unk>``."""

  ids: np.ndarray
  vocabulary: corpus.Vocabulary
  pool: int
  others: np.ndarray
  words: tuple[tuple[str, ...], ...] | None = None

  @property
  def truth(self) -> np.ndarray:
    """(N, T) int: what an attack is scored against, ``ids`` with −1 where the word lies outside
    the vocabulary. The model read ``<unk>`` there, so no recovered token is that word (a
    checkpoint's vocabulary on another corpus, or ``--config.data.vocab_size`` below the corpus's)."""
    if self.words is None:
      return self.ids
    known = np.ones(self.ids.shape, bool)
    for i, w in enumerate(self.words):
      known[i, :len(w)] = [t in self.vocabulary.index for t in w]
    return np.where(known, self.ids, -1)

  def text(self, i: int) -> str:
    """Sentence ``i`` as the client wrote it."""
    return corpus.detokenize(list(self.words[i]) if self.words is not None
                             else self.vocabulary.decode(self.ids[i]))


def text_vocabulary(cfg: Config, sentences: list[list[str]]) -> corpus.Vocabulary:
  """The vocabulary of ``cfg``'s model: the checkpoint's (its token ids are the trained rows), else
  built from the corpus (``vocab_size`` most frequent tokens, and ``<mask>`` after them for a masked
  language model)."""
  if cfg.model.checkpoint:
    tokens = checkpoint.read_metadata(cfg.model.checkpoint).get("vocabulary")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
      raise ValueError(f"checkpoint {cfg.model.checkpoint} holds no text model's vocabulary")
    if cfg.data.vocab_size is not None and cfg.data.vocab_size != len(tokens):
      raise ValueError(f"checkpoint {cfg.model.checkpoint} has a vocabulary of {len(tokens)}, not "
                       f"--config.data.vocab_size {cfg.data.vocab_size}")
    return corpus.Vocabulary(tuple(tokens))
  vocabulary = corpus.Vocabulary.build(sentences, cfg.data.vocab_size)
  return vocabulary.with_mask() if models.is_masked_lm(cfg.model.name or "") else vocabulary


def client_pairs(cfg: Config, model: models.Model, ids: np.ndarray, vocabulary: corpus.Vocabulary
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The text client's (inputs, targets) for sentences ``ids``: next-token prediction
  (:func:`gradjax.corpus.language_model_pairs`), or for a masked language model 15 % of each
  sentence's positions masked (BERT's rate; :func:`gradjax.corpus.masked_lm_pairs`, the positions
  drawn from the experiment's seed and index)."""
  if models.is_masked_lm(model.name):
    return corpus.masked_lm_pairs(ids, vocabulary.mask, 0.15, seed=(cfg.seed, cfg.data.index))
  return corpus.language_model_pairs(ids, vocabulary.eos)


def searched_pairs(cfg: Config, model: models.Model, ids: np.ndarray, targets: np.ndarray,
                   vocabulary: corpus.Vocabulary) -> tuple[np.ndarray, np.ndarray] | None:
  """The (inputs, targets) that a token search's sentences ``ids`` (N, T) stand for, to recompute
  their update: a next-token model's :func:`client_pairs`; a masked language model's the search's own
  (the client's masked positions are its draw, unknown to the attacker): ``<mask>`` where the
  search's ``targets`` (N, T) name a word, those words as targets, none elsewhere. None where the
  search masked no position (such inputs give no update to compare)."""
  if not models.is_masked_lm(model.name):
    return client_pairs(cfg, model, ids, vocabulary)
  targets = np.asarray(targets, np.int32)
  if not np.any(targets >= 0):
    return None
  return np.where(targets >= 0, vocabulary.mask, ids).astype(np.int32), targets


def load_sentences(cfg: Config) -> Sentences:
  """Sentences ``index .. index + batch_size − 1`` of the corpus's distinct ``sequence_length``-token
  sentences (of ``min_length`` to ``sequence_length`` tokens, padded: :func:`gradjax.corpus.padded`)
  (:func:`gradjax.corpus.of_length`; tokens as ``cfg.data.tokenizer`` cuts them), as ids of
  :func:`text_vocabulary`."""
  sentences = corpus.tokenized(
      corpus.sentences(cfg.data.dataset, cfg.data.data_dir), cfg.data.tokenizer)
  vocabulary = text_vocabulary(cfg, sentences)
  pool = corpus.of_length(sentences, cfg.data.sequence_length, cfg.data.min_length)
  if cfg.data.index + cfg.data.batch_size > len(pool):
    lengths = (f"{cfg.data.sequence_length}" if cfg.data.min_length is None else
               f"{cfg.data.min_length} to {cfg.data.sequence_length}")
    raise ValueError(
        f"the client's batch is sentences {cfg.data.index}..{cfg.data.index + cfg.data.batch_size - 1}, "
        f"but corpus {cfg.data.dataset!r} has {len(pool)} distinct sentences of {lengths} tokens")
  ids = corpus.padded([vocabulary.encode(s) for s in pool], cfg.data.sequence_length)
  batch = np.arange(cfg.data.index, cfg.data.index + cfg.data.batch_size)
  return Sentences(ids[batch], vocabulary, len(pool), np.delete(ids, batch, axis=0),
                   tuple(tuple(pool[i]) for i in batch))


def chance(batch: Sentences) -> dict:
  """What the corpus alone gives of the batch (:func:`gradjax.corpus.unigram_guesses` over the pool's
  other sentences): ``token_accuracy_chance_per_sentence`` of the position guess,
  ``rougeL_chance_per_sentence`` of the better of the position guess and the sentence's own words
  in random order (:func:`_ordered_at_random`: what the bag an update gives is worth unordered), and
  ``bag_recall_chance_per_sentence`` of the bag guess against each true sentence (of a padded
  batch, a guess of as many tokens as the sentence), with their means, where the pool holds other
  sentences; and ``known_share_per_sentence`` (with its mean), the
  share of each sentence's words the vocabulary holds, what any attack can recover."""
  # What any attack can recover: the words the vocabulary holds (the others the model read as <unk>).
  known = _known_share(batch.truth)
  found = {"known_share": float(known.mean()), "known_share_per_sentence": [float(k) for k in known]}
  if batch.others.shape[0] == 0:
    return found
  # <unk> (id 0) is never guessed: where the truth has a word outside the vocabulary it is -1.
  position, bag = corpus.unigram_guesses(batch.others, never=(0,))
  n, length = batch.ids.shape
  accuracy = metrics.token_accuracy(np.broadcast_to(position, batch.ids.shape), batch.truth)
  lengths = corpus.lengths(batch.ids)
  if np.all(lengths == length):
    bags = np.broadcast_to(bag, (n, bag.size))
  else:  # a padded batch: each sentence's bag guess holds as many tokens as the sentence
    bags = corpus.padded([corpus.unigram_guesses(batch.others, never=(0,), size=k)[1] for k in lengths],
                         length)
  recall = metrics.bag_recall(bags, batch.truth)
  # ROUGE-L's guess: the position guess's, or the sentence's own words in random order (the bag an
  # embedding gradient gives outright), whichever is higher.
  rng = np.random.default_rng(0)
  lcs = [max(metrics.rouge_l(position, t), _ordered_at_random(t, rng)) for t in np.asarray(batch.truth)]
  return {**found, "token_accuracy_chance": float(accuracy.mean()),
          "bag_recall_chance": float(recall.mean()), "rougeL_chance": float(np.mean(lcs)),
          "token_accuracy_chance_per_sentence": [float(a) for a in accuracy],
          "rougeL_chance_per_sentence": [float(v) for v in lcs],
          "bag_recall_chance_per_sentence": [float(r) for r in recall]}


def _known_share(truth) -> np.ndarray:
  """(N,) the share of each sentence's tokens (:data:`gradjax.corpus.PAD` left out) that the
  vocabulary holds (ids >= 0)."""
  truth = np.asarray(truth)
  return np.sum(truth >= 0, axis=1) / np.sum(truth != corpus.PAD, axis=1)


BAG_ORDERS = 32  # random orders of a sentence's words over which ROUGE-L's bag guess is averaged


def _ordered_at_random(truth: np.ndarray, rng: np.random.Generator) -> float:
  """The mean ROUGE-L against ``truth`` (T,) of its known words (ids >= 0) in :data:`BAG_ORDERS`
  random orders, the sentence's other positions held by no word (a padded sentence's: up to its
  end)."""
  truth = truth[truth != corpus.PAD]
  known = truth[truth >= 0]
  if known.size == 0:
    return 0.0
  guess = np.full_like(truth, corpus.PAD - 1)  # matches no truth: ids >= 0, -1 a word outside, PAD
  scores = []
  for _ in range(BAG_ORDERS):
    guess[:known.size] = rng.permutation(known)
    scores.append(metrics.rouge_l(guess, truth))
  return float(np.mean(scores))


def text_model(cfg: Config, vocabulary: corpus.Vocabulary, key_model) -> models.Model:
  """A fresh ``cfg.model.name`` over ``vocabulary``, or the checkpoint's trained one."""
  if cfg.model.checkpoint:
    model = checkpoint.load_model(cfg.model.checkpoint)
    if not models.is_text(model.name) or model.num_classes != len(vocabulary):
      raise ValueError(
          f"checkpoint {cfg.model.checkpoint} does not hold a text model over its vocabulary")
    return model
  if cfg.model.num_classes is not None and cfg.model.num_classes != len(vocabulary):
    raise ValueError(f"a language model's classes are its vocabulary ({len(vocabulary)}); drop "
                     "--config.model.num_classes or set --config.data.vocab_size")
  return cfg.model.build(key_model, (cfg.data.sequence_length,), len(vocabulary))


def _run_spans(cfg: Config, attack, batch: Sentences, model: models.Model, observation,
               execution: driver.Execution = driver.Execution()) -> dict:
  """The span attack (:func:`gradjax.dager.recover`) on a text client's update: the sentences found
  (on a plain FedSGD gradient, with those that leave no input of their own in a span where their
  batch's gradient is the update: :func:`gradjax.dager.complete`, counted in ``completed``),
  scored against the true ones after an optimal assignment (ROUGE-1/2/L, exact sentences, token
  accuracy), and the residual of the found batch's own gradient against the update when it holds
  as many sentences as the client's (0 up to rounding when it is the client's batch). ``execution``:
  the token search's that takes over (:func:`_take_over`; its saver saves it and stops it on a
  signal)."""
  vocabulary = batch.vocabulary
  start = time.perf_counter()
  try:
    options = dict(
        length=cfg.data.sequence_length, max_prefixes=attack.max_prefixes, chunk=attack.chunk,
        padded=cfg.data.min_length is not None)
    if observation.threat_model == "fedavg":  # mini-batch by mini-batch, replaying the client's steps
      rec = dager.recover_local(model.apply_fn, model.variables, observation.gradient,
                                local=observation.local, num_samples=observation.num_samples,
                                eos=vocabulary.eos, max_norm=cfg.defense.dp_sgd_max_norm, **options)
    else:
      eos = None if models.is_masked_lm(model.name) else vocabulary.eos  # open positions settled
      rec = dager.recover(model.apply_fn, model.variables, observation.gradient, eos=eos, **options)
  except dager.Unreadable as e:
    if attack.take_over and e.position_sets is not None and observation.threat_model == "fedsgd":
      return _take_over(cfg, attack, batch, model, observation, e, time.perf_counter() - start,
                        execution)
    return _unreadable_spans(cfg, attack, batch, model, observation, e, time.perf_counter() - start)
  completed = None
  if (observation.threat_model == "fedsgd" and not models.is_masked_lm(model.name)
      and cfg.defense.dp_sgd() is None and cfg.defense.build() is None
      and 0 < len(rec.sentences) < observation.num_samples):
    # Sentences that leave no input of their own in a span (a repeat, a padded sentence that is
    # another's start): added where the gradient of the batch with them is the update.
    sentences, _ = dager.complete(model.apply_fn, model.variables, observation.gradient,
                                  rec.sentences, count=observation.num_samples, eos=vocabulary.eos)
    completed = len(sentences) - len(rec.sentences)
    rec = rec._replace(sentences=sentences)
  masked_residual = pairs = None
  if models.is_masked_lm(model.name) and len(rec.sentences) == batch.ids.shape[0]:
    try:  # the inputs hold <mask>: their targets from the gradient, the sentences with them
      targets, masked_residual = dager.masked_targets(
          model.apply_fn, model.variables, observation.gradient, rec.sentences, vocabulary.mask)
      pairs = (rec.sentences, targets)
      rec = rec._replace(sentences=np.where(targets >= 0, targets, rec.sentences))
    except dager.Unreadable as e:
      return _unreadable_spans(cfg, attack, batch, model, observation, e, time.perf_counter() - start)
  seconds = time.perf_counter() - start
  scores = metrics.score_text(rec.sentences, batch.truth)
  found = [vocabulary.decode(rec.sentences[j]) if j >= 0 else None for j in scores["order"]]
  results = _span_results(cfg, attack, batch, model, observation, seconds, found, scores)
  results.update(
      iterations=cfg.data.sequence_length if rec.stopped_at is None else rec.stopped_at,
      found=int(len(rec.sentences)), stopped_at=rec.stopped_at, capped=rec.capped,
      mini_batches=rec.mini_batches,
      spans=[{"rank": s.rank, "tolerance": s.tolerance, "random_level": s.random_level}
             for s in rec.spans],
      position_set_sizes=[int(len(s)) for s in rec.position_sets],
      undetermined_positions=None if rec.undetermined is None else rec.undetermined.tolist(),
      settled_residual=rec.residual, unexplained_inputs=rec.unexplained, completed=completed)
  if masked_residual is not None:
    results["masked_targets_residual"] = masked_residual
  residual = None
  if len(rec.sentences) == batch.ids.shape[0]:
    x, targets = pairs or corpus.language_model_pairs(rec.sentences, vocabulary.eos)
    residual = verdict.residual(model.apply_fn, observation, {"x": x}, targets,
                                matched="replay" if observation.threat_model == "fedavg" else "gradient",
                                max_norm=cfg.defense.dp_sgd_max_norm)
  results["findings"] = verdict.text_findings(results)
  decided = pipeline.verdict_fields(results, residual, results["findings"], [], cfg)
  if residual is None and decided["verdict"]["status"] != "leak":  # say why, not "not recomputed"
    why = (f"the span attack found {len(rec.sentences)} sentences for a batch of "
           f"{batch.ids.shape[0]}")
    causes = []
    local = observation.local  # mini-batches per epoch
    steps = None if local is None else local.steps(observation.num_samples) // local.epochs
    if rec.mini_batches is not None and steps and rec.mini_batches < steps:
      causes.append(f"{rec.mini_batches} of the client's {steps} mini-batches found in order (the "
                    "next one's weights are those its predecessors' sentences give)")
    if rec.stopped_at is not None:
      # A defense on the update (or DP-SGD's clipping and noise) moves every span first.
      defended = [d for d in (cfg.defense.spec, "DP-SGD" if cfg.defense.dp_sgd() else None)
                  if d and d != "none"]
      if defended:
        hint = (f"the client's defense ({', '.join(defended)}) changes the update the spans are "
                "read from" + ("; so do its later local steps" if local is not None else ""))
      elif local is not None:
        hint = ("the client's later local steps move their inputs off the span of the model sent; "
                "a wider model keeps more of them")
      else:
        hint = "a trained model's update can hide inputs below float32's rounding"
      causes.append(f"no prefix passed the ordering checks at position {rec.stopped_at} ({hint})")
    if rec.unexplained is not None and rec.unexplained > 0:
      causes.append(f"the second block's span holds {rec.unexplained} inputs that no sentence found "
                    "gives (a sentence cut short where a check failed, or missed)")
    elif rec.unexplained is not None and rec.unexplained < 0:
      causes.append(f"the sentences found hold {-rec.unexplained} prefixes more than the second "
                    "block's span has directions (a branch that passed the checks near their "
                    "tolerance, or inputs that reach the gradient below its rounding)")
    elif rec.unexplained == 0 and len(rec.sentences) < batch.ids.shape[0]:
      causes.append("every input of the second block's span is a prefix of a sentence found, and "
                    "no repeat or start of one makes the update's gradient")
    if causes:
      why += ": " + "; ".join(causes)
    decided["verdict"] = {"status": "inconclusive", "reason": why, "leaks": []}
  elif len(rec.sentences) > batch.ids.shape[0]:  # the scores chose among them by the ground truth
    decided["verdict"]["reason"] += (
        f"; {len(rec.sentences)} sentences found for a batch of {batch.ids.shape[0]}: those scored "
        "are the ones the assignment to the true sentences picks, which an attacker without them "
        "cannot")
  results.update(decided)
  return results


def _unreadable_spans(cfg: Config, attack, batch: Sentences, model: models.Model, observation,
                      error, seconds: float) -> dict:
  """The span attack's results where a span could not be read (``error``, a
  :class:`gradjax.dager.Unreadable`): no sentence (bag-of-words recall 0), and the batch's words
  when the first block's span gave them (each true sentence's word recall against their union,
  :func:`_words_found`); a leak of words, or inconclusive with the reason."""
  words = _span_words(error, batch, model, observation)
  n = batch.ids.shape[0]
  scores = {"token_accuracy": 0.0, "rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "exact": 0,
            "unmatched": 0, "token_accuracy_per_sentence": [0.0] * n,
            "bag_recall_per_sentence": [0.0] * n, "bag_recall": 0.0}
  results = _span_results(cfg, attack, batch, model, observation, seconds, [None] * n, scores)
  # The positions whose words the spans gave (none where they gave nothing).
  results.update(iterations=len(error.position_sets or ()), found=0, unreadable=str(error),
                 **_words_found(words, batch))
  results["findings"] = verdict.text_findings(results)
  decided = pipeline.verdict_fields(results, None, results["findings"], [], cfg)
  if decided["verdict"]["status"] != "leak":
    decided["verdict"] = {"status": "inconclusive", "reason": str(error), "leaks": []}
  results.update(decided)
  return results


def _span_words(error, batch: Sentences, model: models.Model, observation) -> np.ndarray:
  """The words the first block's span gave where the sentences could not be read (``error``, a
  :class:`gradjax.dager.Unreadable`): the union of its position sets; without them, the rows of
  the embedding table the update moved (:func:`gradjax.text.token_bag`)."""
  if error.position_sets is not None:
    words = np.unique(np.concatenate(error.position_sets))
  else:  # a table tied to the output layer moves in every row: every word, which no guess misses
    words = np.asarray(text.token_bag(observation))
  return _own_words(words, batch, model)


def _own_words(words: np.ndarray, batch: Sentences, model: models.Model) -> np.ndarray:
  """``words`` without ``<mask>``, a masked model's input, not one of the client's words."""
  words = np.asarray(words)
  if models.is_masked_lm(model.name):
    words = words[words != batch.vocabulary.mask]
  return words


def _words_found(words: np.ndarray, batch: Sentences) -> dict:
  """``words`` (decoded); ``word_precision``, the share of them in the client's sentences;
  ``word_recall`` (with ``_per_sentence``), each true sentence's share of tokens among them
  (:func:`gradjax.metrics.word_recall`), and ``word_recall_chance`` (with ``_per_sentence``), that
  of a guess of as many words, the bar the verdict measures it against: the corpus's most frequent
  (:func:`gradjax.corpus.frequent_words` of the pool's other sentences, ``word_guess``
  ``"frequent"``), or without other sentences words drawn at random (``"uniform"``: each of a
  sentence's known tokens in the guess with probability K/V); ``word_guess_size``, K."""
  recall = metrics.word_recall(words, batch.truth)
  size, vocabulary = int(words.size), len(batch.vocabulary)
  if batch.others.shape[0]:
    kind = "frequent"
    guess = metrics.word_recall(corpus.frequent_words(batch.others, size, vocabulary, never=(0,)),
                                batch.truth)
  else:
    kind = "uniform"
    guess = min(1.0, size / vocabulary) * _known_share(batch.truth)
  return {"words": list(batch.vocabulary.decode(words)),
          "word_precision": float(np.isin(words, batch.truth).mean()) if words.size else None,
          "word_recall": float(recall.mean()), "word_recall_per_sentence": [float(r) for r in recall],
          "word_recall_chance": float(np.mean(guess)),
          "word_recall_chance_per_sentence": [float(r) for r in guess],
          "word_guess": kind, "word_guess_size": size}


def _take_over(cfg: Config, attack, batch: Sentences, model: models.Model, observation, error,
               seconds: float, execution: driver.Execution = driver.Execution()) -> dict:
  """Where the span attack gives each position's words but not the sentences (``error``, a
  :class:`gradjax.dager.Unreadable` with ``position_sets``): the token search (DLG's objective,
  ``attack.take_over`` iterations, ``cfg.attack.restarts`` restarts) orders them, each position kept
  to its own set (:func:`gradjax.text.reconstruct`). Scored as the span attack's sentences are; the
  residual of the found sentences' own gradient against the update (a masked model's where the
  search masked, :func:`searched_pairs`) decides whether they are the client's."""
  masked = models.is_masked_lm(model.name)
  key_attack = pipeline.experiment_keys(cfg.seed, cfg.data.index).attack
  start = time.perf_counter()
  rec = text.reconstruct(
      presets.dlg(attack.take_over), model.apply_fn, observation, key_attack,
      length=cfg.data.sequence_length, eos=batch.vocabulary.eos,
      mask=batch.vocabulary.mask if masked else None, restarts=cfg.attack.restarts,
      search="tokens", position_sets=error.position_sets, execution=execution)
  searched = time.perf_counter() - start
  found = rec.tokens_pinv
  scores = metrics.score_text(found, batch.truth)
  # The spans gave the words whatever order the search finds: reported as without it.
  words = _span_words(error, batch, model, observation)
  rows = [batch.vocabulary.decode(found[j]) if j >= 0 else None for j in scores["order"]]
  results = _span_results(cfg, attack, batch, model, observation, seconds + searched, rows, scores)
  search = rec.reconstruction
  results.update(
      iterations=int(np.max(search.iterations)), found=int(len(found)), unreadable=str(error),
      **_words_found(words, batch),
      position_set_sizes=[int(len(s)) for s in error.position_sets],
      take_over={"iterations": attack.take_over, "restarts": cfg.attack.restarts,
                 "loss": search.loss, "seconds": searched, "spans_seconds": seconds})
  residual, pairs = None, searched_pairs(cfg, model, found, rec.targets, batch.vocabulary)
  if pairs is not None:
    residual = verdict.residual(model.apply_fn, observation, {"x": pairs[0]}, pairs[1],
                                max_norm=cfg.defense.dp_sgd_max_norm)
  results["findings"] = verdict.text_findings(results)
  decided = pipeline.verdict_fields(results, residual, results["findings"], [], cfg)
  if decided["verdict"]["status"] != "leak":
    decided["verdict"] = {"status": "inconclusive", "reason": (
        f"{error}; the token search over each position's words ({attack.take_over} iterations) "
        "did not reproduce the update"), "leaks": []}
  results.update(decided)
  return results


def _span_results(cfg: Config, attack, batch: Sentences, model: models.Model, observation,
                  seconds: float, found: list, scores: dict) -> dict:
  """What every span-attack run reports: timing, model, configuration, device, the scores of
  :func:`gradjax.metrics.score_text` and each true sentence beside the one found for it (``found``:
  token lists, None for none)."""
  decode = lambda tokens: corpus.detokenize(tokens) if tokens is not None else "(none)"
  rows = [{"true": batch.text(i), "recovered": decode(f), "token_accuracy": a, "bag_recall": r}
          for i, (f, a, r) in enumerate(zip(found, scores["token_accuracy_per_sentence"],
                                            scores["bag_recall_per_sentence"]))]
  return dict(
      wall_time_s=seconds,
      evaluations=0,
      restarts=1,
      history=[],
      model=model.name,
      num_samples=observation.num_samples,
      threat_model=observation.threat_model,
      attack={"closed_form": dataclasses.asdict(attack)},
      config=config.record(cfg, config.names()),
      device=str(jax.local_devices()[0]),
      backend=jax.default_backend(),
      jax_version=jax.__version__,
      sentences=rows,
      vocabulary_size=len(batch.vocabulary),
      sequence_length=cfg.data.sequence_length,
      sentence_pool=batch.pool,
      **chance(batch),
      **{
          k: scores[k]
          for k in ("token_accuracy", "bag_recall", "rouge1", "rouge2", "rougeL", "exact",
                    "unmatched", "token_accuracy_per_sentence", "bag_recall_per_sentence")
      },
      # A sentence's ROUGE-L counts only where no candidate was left out: the best of more
      # candidates than sentences is picked by the ground truth.
      **({"rougeL_per_sentence": scores["rougeL_per_sentence"]}
         if scores.get("unmatched") == 0 and "rougeL_per_sentence" in scores else {}))


def run_text(cfg: Config, *, callback: Callable | None = None,
             state: resume.StateFile | None = None) -> dict[str, Any]:
  """Runs text experiment ``cfg`` (``modality="text"``); returns JSON-ready results.

  The client computes the FedSGD gradient of the next-token loss on its sentences
  (:func:`gradjax.corpus.language_model_pairs`), a defense may act on it, and
  :func:`gradjax.text.reconstruct` recovers the sentences. ``results`` holds ``token_accuracy`` and
  ``bag_recall`` of the pseudo-inverse decoding (SAPAG's) and ``*_nearest`` of the nearest-neighbour
  one (DLG's), ``exact`` sentences, ``sentences`` (true and recovered text side by side), the bag of
  tokens the gradient revealed, counts, timing (``time`` as :func:`run`'s), configuration and
  device. ``state`` as :func:`run`.
  """
  with driver.precision_scope(cfg.execution.matmul_precision), compilation.Recorder() as made:
    marks = [time.time()]
    results = _run_text(cfg, callback, state, marks)
    marks.append(time.time())
  results["time"] = pipeline.time_spent(pipeline.between(made, marks))
  results["privacy"] = pipeline.dp_sgd_privacy(cfg)
  return results


def _run_text(cfg: Config, callback, state, marks: list[float]):
  attack = check(cfg)
  keys = pipeline.experiment_keys(cfg.seed, cfg.data.index)
  key_model, key_attack, key_defense, key_client = keys.model, keys.attack, keys.defense, keys.client
  batch = load_sentences(cfg)
  vocabulary = batch.vocabulary
  model = text_model(cfg, vocabulary, key_model)
  x, y = client_pairs(cfg, model, batch.ids, vocabulary)
  # A FedAvg client is the span attack's only (Config checks); it reveals no labels.
  client = pipeline.simulated_client(cfg, cfg.client.name == "fedsgd" and
                            getattr(attack, "label_source", None) is labels_lib.known, key_client)
  observation = client(model.apply_fn, model.variables, x, y)
  defense = cfg.defense.build()
  if defense is not None:
    observation = defense.apply(observation, key_defense)
  marks.append(time.time())
  trace = pipeline.Trace(callback)
  timing = pipeline.Timing(cfg, state, trace)
  execution = cfg.execution.build(callback=trace.progress, saver=timing.saver)
  if isinstance(attack, closed_forms.Dager):  # scored as it reads (its attack and scoring in one)
    return _run_spans(cfg, attack, batch, model, observation, execution)
  attack, adapted_to = pipeline.adapted(cfg, attack, cfg.defense.spec, observation)

  rec = text.reconstruct(
      attack,
      model.apply_fn,
      observation,
      key_attack,
      length=cfg.data.sequence_length,
      eos=vocabulary.eos,
      mask=vocabulary.mask if models.is_masked_lm(model.name) else None,
      restrict=cfg.attack.restrict_tokens,
      restarts=cfg.attack.restarts,
      search=cfg.attack.text_search,
      execution=execution)
  marks.append(time.time())
  results = pipeline.common_results(cfg, attack, rec.reconstruction, model, observation, trace,
                                    timing, adapted_to)
  pinv = metrics.score_text(rec.tokens_pinv, batch.truth)
  nearest = metrics.score_text(rec.tokens_nearest, batch.truth)
  rows = []
  for i in range(batch.ids.shape[0]):
    p, n = rec.tokens_pinv[pinv["order"][i]], rec.tokens_nearest[nearest["order"][i]]
    rows.append({"true": batch.text(i),
                 "recovered (pseudo-inverse)": corpus.detokenize(vocabulary.decode(p)),
                 "recovered (nearest)": corpus.detokenize(vocabulary.decode(n)),
                 "token_accuracy": pinv["token_accuracy_per_sentence"][i],
                 "bag_recall": pinv["bag_recall_per_sentence"][i]})
  results.update(
      token_accuracy=pinv["token_accuracy"],
      bag_recall=pinv["bag_recall"],
      exact=pinv["exact"],
      token_accuracy_nearest=nearest["token_accuracy"],
      bag_recall_nearest=nearest["bag_recall"],
      exact_nearest=nearest["exact"],
      token_accuracy_per_sentence=pinv["token_accuracy_per_sentence"],
      bag_recall_per_sentence=pinv["bag_recall_per_sentence"],
      rougeL_per_sentence=pinv["rougeL_per_sentence"],
      token_accuracy_nearest_per_sentence=nearest["token_accuracy_per_sentence"],
      sentences=rows,
      bag=None if rec.bag is None else vocabulary.decode(rec.bag),  # None: a tied table shows none
      bag_size=None if rec.bag is None else int(rec.bag.size),
      sentence_pool=batch.pool,
      vocabulary_size=len(vocabulary),
      sequence_length=cfg.data.sequence_length,
      rouge1=pinv["rouge1"], rouge2=pinv["rouge2"], rougeL=pinv["rougeL"],
      **chance(batch),
  )
  if rec.bag is not None:  # the embedding gradient's rows give the batch's words outright
    results.update(_words_found(_own_words(rec.bag, batch, model), batch))
  residual = None
  # An embedding search's residual leaves the table out, whose gradient a DP-SGD client's clipping
  # norm includes: not recomputed under DP-SGD.
  if (cfg.attack.text_search == "embeddings" and "x" in rec.reconstruction.dummy
      and cfg.defense.dp_sgd() is None):
    dummy = rec.reconstruction.dummy
    if models.is_masked_lm(model.name):  # its soft targets hold 'no target': the hard ones
      dummy = {"x": dummy["x"]}
    # What the embeddings determine, as the attack matched it: the update without the table, whose
    # gradient comes from the lookup that dummy embeddings bypass.
    residual = verdict.residual(
        text.embeddings_apply_fn(model.apply_fn, observation, cfg.data.sequence_length),
        text.attack_view(observation), dummy, rec.reconstruction.labels)
  elif cfg.attack.text_search == "tokens":
    # The sentences it decoded, as the client would have trained on them (a masked model's: where
    # the search masked): the closer of the two decodings.
    pairs = [searched_pairs(cfg, model, tokens, rec.targets, vocabulary)
             for tokens in (rec.tokens_pinv, rec.tokens_nearest)]
    if pairs[0] is not None:
      residual = min((verdict.residual(model.apply_fn, observation, {"x": xs}, ys,
                                       max_norm=cfg.defense.dp_sgd_max_norm) for xs, ys in pairs),
                     key=lambda r: r.relative_error)
  results["findings"] = verdict.text_findings(results)
  results.update(pipeline.verdict_fields(results, residual, results["findings"], [], cfg))
  return results
