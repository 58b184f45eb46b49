"""Text: corpus and vocabulary, the Transformer language model, token recovery and its metrics.

References are independent of the code under test: Counter-based multiset counts, plain loops,
NumPy sinusoids, float64 least squares, and exact embeddings whose tokens are known.
"""

import collections
import dataclasses
import functools
import itertools
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import attacks, clients, corpus, driver, labels, losses, metrics, models, presets, text
from conftest import assert_one_line_error

SMALL = models.TextSizes(dim=16, heads=2, ffn=16, layers=1)


@pytest.fixture(scope="module")
def pydoc():
  return corpus.sentences("pydoc")


@pytest.fixture(scope="module")
def vocab(pydoc):
  return corpus.Vocabulary.build(pydoc)


# --- corpus and vocabulary ----------------------------------------------------------------------


def test_pydoc_corpus_has_twenty_real_fifteen_token_sentences(pydoc):
  assert len(pydoc) > 1000
  fifteen = corpus.of_length(pydoc, 15)
  assert len(fifteen) >= 20
  assert len({tuple(s) for s in fifteen}) == len(fifteen)  # distinct
  assert all(len(s) == 15 for s in fifteen)
  # English prose: the most common words of English are among its tokens.
  assert {"the", "of", "is", "a", "to"} <= {t for s in pydoc for t in s}


def test_tokenizer_round_trip(pydoc, vocab):
  for sentence in pydoc[:300]:
    assert corpus.tokenize(corpus.detokenize(sentence)) == sentence
    assert vocab.decode(vocab.encode(sentence)) == sentence  # every corpus token is in the vocabulary
  assert corpus.tokenize('The "if" statement, isn\'t it?') == [
      "the", '"', "if", '"', "statement", ",", "isn't", "it", "?"]


def test_vocabulary_order_unknown_tokens_and_errors(pydoc):
  counts = collections.Counter(t for s in pydoc for t in s)
  small = corpus.Vocabulary.build(pydoc, max_size=12)
  assert small.tokens[:2] == (corpus.UNK, corpus.EOS) and len(small) == 12
  expected = sorted(counts, key=lambda t: (-counts[t], t))[:10]
  assert list(small.tokens[2:]) == expected
  assert small.encode(["the", "zzzz-not-a-word"]).tolist() == [small.tokens.index("the"), 0]
  with pytest.raises(ValueError, match="lie in"):
    small.decode([12])
  with pytest.raises(ValueError, match="starts with"):
    corpus.Vocabulary(("a", "b"))
  with pytest.raises(ValueError, match="unknown corpus"):
    corpus.sentences("shakespeare")


def test_unigram_guesses_against_enumeration():
  """The corpus's position and bag guesses reach the largest expected token accuracy and bag recall
  of every guess, enumerated (all tokens per position; all multisets of T tokens), with the
  expectations counted directly over the sentences."""
  rng = np.random.default_rng(0)
  sentences = rng.choice(5, size=(40, 4), p=[0.4, 0.25, 0.15, 0.12, 0.08])
  position, bag = corpus.unigram_guesses(sentences)
  for t in range(4):
    counts = [int(np.sum(sentences[:, t] == v)) for v in range(5)]
    assert counts[position[t]] == max(counts)

  def expected_recall(guess):
    g = collections.Counter(guess)
    return np.mean([sum(min(g[v], n) for v, n in collections.Counter(s.tolist()).items()) / 4
                    for s in sentences])

  best = max(expected_recall(m) for m in itertools.combinations_with_replacement(range(5), 4))
  assert len(bag) == 4 and expected_recall(bag.tolist()) == pytest.approx(best)
  # <unk> (0, the most frequent token here) never guessed: the best guesses among the others, whose
  # scored truth holds -1 where the corpus has <unk>.
  position, bag = corpus.unigram_guesses(sentences, never=(0,))
  for t in range(4):
    counts = [int(np.sum(sentences[:, t] == v)) if v else -1 for v in range(5)]
    assert counts[position[t]] == max(counts)
  scored = np.where(sentences == 0, -1, sentences)

  def recall_of_scored(guess):
    g = collections.Counter(guess)
    return np.mean([sum(min(g[v], n) for v, n in collections.Counter(s.tolist()).items()) / 4
                    for s in scored])

  best = max(recall_of_scored(m) for m in itertools.combinations_with_replacement(range(1, 5), 4))
  assert 0 not in bag and recall_of_scored(bag.tolist()) == pytest.approx(best)
  assert corpus.unigram_guesses(np.zeros((3, 2), np.int32), never=(0,))[0].tolist() == [0, 0]
  # Fewer known tokens than T: the bag still holds T (filled with the most frequent known one).
  few = np.array([[0, 0, 3], [0, 3, 0]], np.int32)
  assert [g.tolist() for g in corpus.unigram_guesses(few, never=(0,))] == [[3, 3, 3], [3, 3, 3]]
  with pytest.raises(ValueError, match="needs"):
    corpus.unigram_guesses(np.zeros((0, 4), np.int32))


def test_frequent_words_and_word_recall_against_enumeration():
  """metrics.word_recall counts each sentence's tokens whose word is in a set (plain Python here);
  corpus.frequent_words' set of k words reaches the largest expected word recall of every set of k
  words, enumerated; a set of the whole vocabulary recalls everything, however little it knows."""
  rng = np.random.default_rng(1)
  sentences = rng.choice(6, size=(30, 5), p=[0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
  truth = rng.choice(6, size=(3, 5))

  def recall(words, s):
    return sum(1 for t in s.tolist() if t in set(words)) / len(s)

  for k in range(7):
    guess = corpus.frequent_words(sentences, k)
    best = max(np.mean([recall(c, s) for s in sentences]) for c in itertools.combinations(range(6), k))
    assert len(guess) == min(k, 6) and np.mean([recall(guess.tolist(), s) for s in sentences]) == pytest.approx(best)
    np.testing.assert_allclose(metrics.word_recall(guess, truth), [recall(guess.tolist(), s) for s in truth])
  assert metrics.word_recall(np.arange(6), truth).tolist() == [1.0, 1.0, 1.0]
  assert metrics.word_recall([2, 2, 0], [[2, 1, 2, 0]]).tolist() == [0.75]
  # Past the words the sentences hold, the vocabulary's others fill the guess (smaller ids first):
  # a guess of the whole vocabulary recalls every word of any sentence.
  few = np.array([[1, 2, 3, 4], [2, 3, 4, 5], [1, 1, 2, 3]])
  assert corpus.frequent_words(few, 7, vocabulary_size=12).tolist() == [0, 1, 2, 3, 4, 5, 6]
  assert metrics.word_recall(corpus.frequent_words(few, 12, vocabulary_size=12), [[1, 2, 9, 8]]).tolist() == [1.0]
  assert corpus.frequent_words(few, 12).tolist() == [1, 2, 3, 4, 5]  # without V: the words seen
  # <unk> (0, the most frequent here) never guessed: the best k of the others, enumerated.
  for k in range(1, 6):
    guess = corpus.frequent_words(sentences, k, never=(0,))
    best = max(np.mean([recall(c, s) for s in sentences]) for c in itertools.combinations(range(1, 6), k))
    assert 0 not in guess and np.mean([recall(guess.tolist(), s) for s in sentences]) == pytest.approx(best)
  with pytest.raises(ValueError, match="needs"):
    corpus.frequent_words(np.zeros((0, 4), np.int32), 2)


def _lcs(a, b):
  """The longest common subsequence's length, by recursion over prefixes (memoised)."""
  @functools.lru_cache(maxsize=None)
  def f(i, j):
    if i == len(a) or j == len(b):
      return 0
    return f(i + 1, j + 1) + 1 if a[i] == b[j] else max(f(i + 1, j), f(i, j + 1))
  return f(0, 0)


def test_rouge_l_chance_of_a_sentences_own_words_in_random_order():
  """The bag guess of ROUGE-L: a 4-word sentence's words in 32 random orders average within 0.1 of
  their mean over all 24 orders (LCS by recursion); unknown words (-1) are never matched; none
  known gives 0."""
  from gradjax.run import text_run
  truth = np.array([5, 7, 5, 9])
  exact = np.mean([_lcs(p, tuple(truth)) / 4 for p in itertools.permutations(truth.tolist())])
  got = text_run._ordered_at_random(truth, np.random.default_rng(0))
  assert abs(got - exact) < 0.1
  # exactly the mean over the generator's 32 orders (the same draws, scored by the recursion)
  rng = np.random.default_rng(0)
  drawn = [tuple(rng.permutation(truth).tolist()) for _ in range(text_run.BAG_ORDERS)]
  assert got == pytest.approx(np.mean([_lcs(p, tuple(truth)) / 4 for p in drawn]), rel=1e-12)
  partly = np.array([5, -1, 7, -1])
  perms = [p + (-2, -2) for p in itertools.permutations((5, 7))]
  want = np.mean([_lcs(p, tuple(partly)) / 4 for p in perms])  # P = R = L / 4: F = L / 4
  assert text_run._ordered_at_random(partly, np.random.default_rng(0)) == pytest.approx(want, abs=0.1)
  assert text_run._ordered_at_random(np.array([-1, -1]), np.random.default_rng(0)) == 0.0


def test_chance_is_the_guess_from_the_other_sentences():
  """text_run.chance: the guesses are made from the pool without the client's sentences, and scored
  against each of them (plain Counter arithmetic here)."""
  from gradjax.run import config, text_run
  batch = text_run.load_sentences(
      config.from_options({
          "data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
          "data.batch_size": 2, "data.index": 3
      }))
  assert batch.others.shape == (batch.pool - 2, 15)
  assert not any((batch.others == s).all(1).any() for s in batch.ids)
  got = text_run.chance(batch)
  columns = list(zip(*batch.others.tolist()))
  counts = collections.Counter()
  for s in batch.others.tolist():
    for v, n in collections.Counter(s).items():
      counts.update((v, k) for k in range(1, n + 1))
  guess = collections.Counter(v for (v, _), _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))[:15])
  for i, s in enumerate(batch.ids.tolist()):
    top = [max(sorted(set(c)), key=c.count) for c in columns]
    assert got["token_accuracy_chance_per_sentence"][i] == pytest.approx(
        np.mean([a == b for a, b in zip(top, s)]))
    assert got["bag_recall_chance_per_sentence"][i] == pytest.approx(
        sum(min(guess[v], n) for v, n in collections.Counter(s).items()) / 15)
  assert got["bag_recall_chance"] == pytest.approx(np.mean(got["bag_recall_chance_per_sentence"]))
  # ROUGE-L's: the better of the position guess and the sentence's words in 32 random orders (one
  # generator over the sentences in turn), F = LCS / 15 for guesses of the sentence's length.
  rng = np.random.default_rng(0)
  for i, s in enumerate(batch.truth.tolist()):
    known = np.array([t for t in s if t >= 0])
    orders = np.mean([_lcs(tuple(rng.permutation(known).tolist()), tuple(s)) / 15
                      for _ in range(text_run.BAG_ORDERS)])
    assert got["rougeL_chance_per_sentence"][i] == pytest.approx(max(_lcs(tuple(top), tuple(s)) / 15, orders))
  assert got["rougeL_chance"] == pytest.approx(np.mean(got["rougeL_chance_per_sentence"]))
  # Words found without their places: word recall against the corpus's as many most frequent
  # words (Counter arithmetic, the vocabulary's unseen words after them by id); without other
  # sentences, against K words drawn at random: K/V of each sentence's tokens.
  found = np.array([batch.ids[0, 0], batch.ids[1, 3], 1, 2], np.int32)
  words = text_run._words_found(found, batch)
  in_batch = set(batch.truth.ravel().tolist())
  assert words["word_precision"] == sum(t in in_batch for t in found.tolist()) / 4 < 1
  seen = collections.Counter(batch.others.ravel().tolist())
  top = sorted(range(len(batch.vocabulary)), key=lambda v: (-seen[v], v))[:4]
  for i, s in enumerate(batch.ids.tolist()):
    assert words["word_recall_per_sentence"][i] == pytest.approx(np.mean([t in set(found.tolist()) for t in s]))
    assert words["word_recall_chance_per_sentence"][i] == pytest.approx(np.mean([t in top for t in s]))
  alone = text_run._words_found(found, batch._replace(others=batch.others[:0]))
  assert alone["word_guess"] == "uniform" and alone["word_recall_chance"] == pytest.approx(4 / len(batch.vocabulary))


def test_words_outside_the_vocabulary_are_never_recovered():
  """With a vocabulary smaller than the corpus's, the model reads <unk> for the other words: the
  scores count none of them as recovered (an attack that gets every id right gets the known words
  only), the chance level alike, and the true sentences are shown as written (the vocabulary and
  the pool rebuilt here with Counter and sorted)."""
  from gradjax.run import config, text_run
  cfg = config.from_options({"data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
                             "data.batch_size": 2, "data.index": 3, "data.vocab_size": 30})
  batch = text_run.load_sentences(cfg)
  sentences = corpus.tokenized(corpus.sentences("pydoc", None), "words")
  counts = collections.Counter(t for s in sentences for t in s if t not in ("<unk>", "<eos>"))
  known = set(sorted(counts, key=lambda t: (-counts[t], t))[:28])
  seen, pool = set(), []
  for s in sentences:
    if len(s) == 15 and tuple(s) not in seen:
      seen.add(tuple(s))
      pool.append(s)
  written = pool[3:5]
  assert [batch.text(i) for i in range(2)] == [" ".join(w) for w in written]
  hits = [np.mean([t in known for t in w]) for w in written]
  assert 0 < min(hits) and max(hits) < 1  # both kinds of word in the batch
  perfect = metrics.score_text(batch.ids, batch.truth)
  np.testing.assert_allclose(perfect["token_accuracy_per_sentence"], hits)
  assert perfect["exact"] == 0
  guess = text_run.chance(batch)["token_accuracy_chance_per_sentence"]
  unk_guess = [np.mean([t not in known for t in w]) for w in written]  # what <unk> everywhere had got
  allunk = metrics.token_accuracy(np.zeros_like(batch.ids), batch.truth)
  np.testing.assert_array_equal(allunk, [0.0, 0.0])
  assert all(g <= 1 - u + 1e-12 for g, u in zip(guess, unk_guess))
  # What any attack can recover, the verdict's ceiling: the share of known words (Counter's).
  np.testing.assert_allclose(text_run.chance(batch)["known_share_per_sentence"], hits)


def test_language_model_pairs_and_windows(vocab):
  ids = np.array([[5, 6, 7], [8, 9, 10]], np.int32)
  x, y = corpus.language_model_pairs(ids, vocab.eos)
  np.testing.assert_array_equal(x, ids)
  np.testing.assert_array_equal(y, [[6, 7, 1], [9, 10, 1]])
  sentences = [["the", "if"], ["a", "b", "c"]]
  v = corpus.Vocabulary.build(sentences)
  stream = [v.index[t] for t in ("the", "if")] + [1] + [v.index[t] for t in ("a", "b", "c")] + [1]
  xs, ys = corpus.windows(sentences, v, 3)
  np.testing.assert_array_equal(xs, [stream[0:3], stream[3:6]])
  np.testing.assert_array_equal(ys, [stream[1:4], stream[4:7]])


def test_padded_sentences_and_their_pairs(vocab):
  """A padded batch: PAD past each end; the client reads <eos> there, its last target is <eos> and
  no loss is taken past it (plain Python per sentence)."""
  sentences = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
  ids = corpus.padded(sentences, 4)
  assert corpus.lengths(ids).tolist() == [4, 2, 3]
  x, y = corpus.language_model_pairs(ids, vocab.eos)
  for s, xi, yi in zip(sentences, x.tolist(), y.tolist()):
    n = len(s)
    assert xi == s + [vocab.eos] * (4 - n) and yi == s[1:] + [vocab.eos] + [-1] * (4 - n)
  assert vocab.decode(ids[1]) == vocab.decode(sentences[1])
  for bad in ([[5, corpus.PAD, 6]], [[corpus.PAD, 5, 6]]):
    with pytest.raises(ValueError, match="PAD after its last token"):
      corpus.language_model_pairs(np.asarray(bad, np.int32), 1)
  with pytest.raises(ValueError, match="holds 1 to 4"):
    corpus.padded([[5] * 5], 4)
  pool = [["a"] * 3, ["b"] * 5, ["a"] * 3, ["c"] * 2, ["d"] * 4]
  assert corpus.of_length(pool, 4, shortest=3) == [["a"] * 3, ["d"] * 4]
  assert corpus.of_length(pool, 4) == [["d"] * 4]


def test_padded_scores_read_each_sentences_tokens():
  """Every text score of padded sentences is the score of their unpadded token lists: token accuracy
  over the positions either holds (plain Python), bag and word recall over the true tokens, ROUGE
  against rouge_score; guesses never hold PAD."""
  rng = np.random.default_rng(3)
  for _ in range(40):
    true_list = rng.integers(0, 5, size=rng.integers(1, 7)).tolist()
    pred_list = rng.integers(0, 5, size=rng.integers(1, 7)).tolist()
    true, pred = corpus.padded([true_list], 6), corpus.padded([pred_list], 6)
    span = max(len(true_list), len(pred_list))
    hits = sum(a == b for a, b in zip(true_list, pred_list))
    assert metrics.token_accuracy(pred, true)[0] == pytest.approx(hits / span)
    bag = sum(min(pred_list.count(v), true_list.count(v)) for v in set(true_list))
    assert metrics.bag_recall(pred, true)[0] == pytest.approx(bag / len(true_list))
    assert metrics.word_recall([0, 1], true)[0] == pytest.approx(
        sum(v in (0, 1) for v in true_list) / len(true_list))
    assert metrics.rouge_l(pred[0], true[0]) == metrics.rouge_l(pred_list, true_list)
    assert metrics.rouge_n(pred[0], true[0], 2) == metrics.rouge_n(pred_list, true_list, 2)
    scores = metrics.score_text(pred, true)
    assert scores["exact"] == int(pred_list == true_list)
  # A padded pool's position guess ends where most of its sentences have: of the 16 guesses of at
  # most 4 positions over {2, 3, 4, end}, none scores better over the pool (enumerated).
  pool = corpus.padded([[2, 3], [2, 3], [2, 3], [2, 3, 4, 4]], 4)
  position, bag = corpus.unigram_guesses(pool)
  assert position.tolist() == [2, 3, corpus.PAD, corpus.PAD] and corpus.PAD not in bag.tolist()

  def expected(guess):
    return np.mean(metrics.token_accuracy(np.broadcast_to(guess, pool.shape), pool))

  guesses = [corpus.padded([g[:n]], 4)[0] for n in range(1, 5)
             for g in itertools.product((2, 3, 4), repeat=n)]
  assert expected(position) == pytest.approx(max(expected(g) for g in guesses)) == 0.875
  assert corpus.unigram_guesses(pool, size=2)[1].tolist() == [2, 3]  # a bag of a sentence's size
  assert corpus.PAD not in corpus.frequent_words(pool, 5, vocabulary_size=5).tolist()
  # A padded pool's set of words weighs each sentence's tokens by 1/L: the best of every set of k
  # words by the mean word recall over the pool (enumerated).
  rng = np.random.default_rng(2)
  pool = corpus.padded([rng.integers(0, 6, size=rng.integers(1, 7)) for _ in range(30)], 6)
  for k in range(1, 6):
    guess = corpus.frequent_words(pool, k)
    best = max(metrics.word_recall(c, pool).mean() for c in itertools.combinations(range(6), k))
    assert metrics.word_recall(guess, pool).mean() == pytest.approx(best)
  assert corpus.unigram_guesses(np.array([[2, 3]], np.uint8))[0].tolist() == [2, 3]


def test_a_padded_batchs_truth_and_known_share_read_its_words():
  """A padded client batch of a small vocabulary: the truth is each sentence's ids, -1 for a word
  outside the vocabulary, PAD past its end; the known share counts its own words (plain Python)."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt", "attack.preset": "dager",
      "data.batch_size": 4, "data.sequence_length": 10, "data.min_length": 4, "data.vocab_size": 60})
  batch = text_run.load_sentences(cfg)
  assert len({len(w) for w in batch.words}) > 1
  chance = text_run.chance(batch)
  for i, words in enumerate(batch.words):
    known = [w in batch.vocabulary.index for w in words]
    expected = [batch.vocabulary.index[w] if k else -1 for w, k in zip(words, known)]
    assert batch.truth[i].tolist() == expected + [corpus.PAD] * (10 - len(words))
    assert chance["known_share_per_sentence"][i] == pytest.approx(sum(known) / len(words))
    assert batch.text(i) == corpus.detokenize(words)


def test_masked_lm_pairs_and_the_mask_token(vocab):
  """A masked language model's vocabulary adds <mask> last and keeps the other ids; its client masks
  round(0.15 T) positions of each sentence, the targets being their tokens and -1 elsewhere."""
  masked = vocab.with_mask()
  assert masked.tokens[:-1] == vocab.tokens and masked.tokens[-1] == "<mask>"
  assert masked.mask == len(vocab) and masked.with_mask() is masked
  with pytest.raises(ValueError, match="no <mask>"):
    vocab.mask
  ids = np.random.default_rng(0).integers(2, len(vocab), (4, 20)).astype(np.int32)
  x, y = corpus.masked_lm_pairs(ids, masked.mask, 0.15, seed=(0, 1))
  chosen = x == masked.mask
  assert (chosen.sum(axis=1) == 3).all()
  np.testing.assert_array_equal(y, np.where(chosen, ids, -1))
  np.testing.assert_array_equal(x[~chosen], ids[~chosen])
  again, _ = corpus.masked_lm_pairs(ids, masked.mask, 0.15, seed=(0, 1))
  np.testing.assert_array_equal(again, x)
  assert (corpus.masked_lm_pairs(ids[:, :3], masked.mask, 0.15)[0] == masked.mask).sum() == 4


def test_byte_pair_pieces_rebuild_the_sentences(pydoc):
  """--config.data.tokenizer=bpe:N: pieces that join back into each sentence's words, the same on a second
  training, at most N distinct; the word tokenizer leaves sentences as they are; bad names refused."""
  pytest.importorskip("sentencepiece")
  pieces = corpus.tokenized(pydoc, "bpe:500")
  assert len(pieces) == len(pydoc) and pieces == corpus.subwords(pydoc, 500)
  assert all(corpus.detokenize(p) == " ".join(s) for p, s in zip(pieces, pydoc))
  assert len({t for p in pieces for t in p}) <= 500
  assert sum(map(len, pieces)) > sum(map(len, pydoc))  # rarer words take several pieces
  assert corpus.tokenized(pydoc[:3], "words") == pydoc[:3]
  for bad in ("bpe", "bpe:4", "wordpiece:100", "bpe:x"):
    with pytest.raises(ValueError, match="unknown tokenizer"):
      corpus.tokenizer_size(bad)


def test_a_text_client_reads_byte_pair_sentences():
  """--config.data.tokenizer=bpe:N: the client's sentences are the corpus's distinct sentences of T pieces, as
  ids of a vocabulary of those pieces; a checkpoint (a word vocabulary) with --config.data.tokenizer is refused."""
  pytest.importorskip("sentencepiece")
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "gpt",
      "attack.preset": "dager", "data.batch_size": 2, "data.sequence_length": 12,
      "data.tokenizer": "bpe:1000", "data.index": 3
  })
  sentences = text_run.load_sentences(cfg)
  pool = corpus.of_length(corpus.subwords(corpus.sentences("pydoc"), 1000), 12)
  assert sentences.pool == len(pool)
  assert [sentences.vocabulary.decode(s) for s in sentences.ids] == pool[3:5]
  with pytest.raises(ValueError, match="drop --config.data.tokenizer"):
    config.replace(cfg, {"model.checkpoint": "x.npz"})


def test_wikitext2_when_present():
  try:
    wiki = corpus.sentences("wikitext2")
  except FileNotFoundError:
    pytest.skip("no WikiText-2 in the data folder")
  assert len(wiki) > 5000 and len(corpus.of_length(wiki, 15)) >= 20
  assert all(not s[0].startswith("=") for s in wiki)


# --- the model ------------------------------------------------------------------------------------


def test_positional_encoding_closed_form():
  from gradjax.models.transformer import positional_encoding
  pe = positional_encoding(7, 6)
  for t, i in itertools.product(range(7), range(3)):
    angle = t / 10000 ** (2 * i / 6)
    assert pe[t, 2 * i] == pytest.approx(math.sin(angle), abs=1e-12)
    assert pe[t, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-12)


def test_transformer_reads_ids_or_embeddings_and_is_causal():
  m = models.create("transformer", jax.random.key(0), input_shape=(6,), num_classes=30, text_sizes=SMALL)
  apply_fn = jax.jit(m.apply_fn)  # two programs (ids, embeddings), not one per primitive
  ids = jnp.array([[3, 4, 5, 6, 7, 8]])
  logits = apply_fn(m.variables, ids)
  assert logits.shape == (1, 6, 30)
  table = m.variables["params"]["embed"]["embedding"]
  np.testing.assert_allclose(apply_fn(m.variables, table[ids]), logits, rtol=1e-6, atol=1e-6)
  changed = apply_fn(m.variables, ids.at[0, 4].set(20))  # a later token cannot change earlier logits
  np.testing.assert_allclose(changed[0, :4], logits[0, :4], rtol=1e-6, atol=1e-6)
  assert not np.allclose(changed[0, 4:], logits[0, 4:])
  assert set(m.variables["params"]) == {"embed", "block_0", "head"}
  with pytest.raises(ValueError, match="input_shape"):
    models.create("transformer", jax.random.key(0), input_shape=(6, 6, 1), num_classes=30)


# --- gradient leakage -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
  """A tiny model, the gradient of one 5-token sentence (a token repeated), and the sentence."""
  m = models.create("transformer", jax.random.key(1), input_shape=(5,), num_classes=40, text_sizes=SMALL)
  ids = np.array([[7, 12, 3, 12, 25]], np.int32)
  x, y = corpus.language_model_pairs(ids, 1)
  return m, clients.fedsgd(m.apply_fn, m.variables, x, y), ids


def test_token_bag_is_the_set_of_input_tokens(client):
  _, obs, ids = client
  np.testing.assert_array_equal(text.token_bag(obs), sorted(set(ids.ravel().tolist())))


@pytest.mark.slow
def test_attack_view_drops_only_the_embedding(client):
  m, obs, ids = client
  view = text.attack_view(obs)
  assert "embed" not in view.gradient and "embed" not in view.variables["params"]
  assert set(view.gradient) == set(obs.gradient) - {"embed"}
  # The true embeddings and next tokens reproduce the rest of the observed gradient exactly.
  from gradjax.objectives import dummy_gradient
  e = np.asarray(m.variables["params"]["embed"]["embedding"])[ids]
  _, y = corpus.language_model_pairs(ids, 1)
  g = dummy_gradient(m.apply_fn, view.variables, jnp.asarray(e), jnp.asarray(y))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(view.gradient)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_exact_embeddings_decode_exactly():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(50, 16))
  ids = rng.integers(0, 50, size=(2, 9))
  e = table[ids]
  np.testing.assert_array_equal(text.nearest_tokens(e, table), ids)
  bag = np.unique(ids)
  np.testing.assert_array_equal(text.pinv_tokens(e, table, bag), ids)
  # The pseudo-inverse against a float64 least-squares solve (an independent computation).
  noisy = e + 0.3 * rng.normal(size=e.shape)
  coeffs = np.linalg.lstsq(table[bag].T, noisy.reshape(-1, 16).T, rcond=None)[0].T
  np.testing.assert_array_equal(text.pinv_tokens(noisy, table, bag).ravel(), bag[coeffs.argmax(-1)])
  # Nearest neighbour against a plain loop.
  want = [[min(bag, key=lambda v: np.sum((noisy[n, t] - table[v]) ** 2)) for t in range(9)]
          for n in range(2)]
  np.testing.assert_array_equal(text.nearest_tokens(noisy, table, bag), want)


def test_soft_tokens_of_one_hot_logits_are_the_sentence(client):
  m, _, ids = client
  table = np.asarray(m.variables["params"]["embed"]["embedding"])
  cand = np.unique(ids)
  z = 1e4 * (ids[..., None] == cand).astype(np.float32)  # one-hot logits
  # Padded with two empty slots (id 0), which must take no probability.
  z = np.concatenate([z, np.full((*z.shape[:2], 2), 5e3, np.float32)], axis=-1)
  rows = np.concatenate([table[cand], np.zeros((2, table.shape[1]))])
  data = text.TokenData(None, jnp.asarray(rows), jnp.asarray(np.append(cand, [0, 0])), jnp.asarray(1),
                        None, jnp.arange(cand.size + 2) < cand.size)
  e, targets = text.soft_tokens(jnp.asarray(z), data, 40)
  np.testing.assert_allclose(e, table[ids], atol=1e-6)
  _, y = corpus.language_model_pairs(ids, 1)
  np.testing.assert_array_equal(np.argmax(targets, -1), y)
  np.testing.assert_allclose(np.sum(targets, -1), 1.0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("search", text.SEARCHES)
def test_attack_recovers_a_short_sentence_exactly(client, search):
  m, obs, ids = client
  if search == "embeddings":  # free embeddings with the targets known: the decoding is exact
    obs = obs.replace(labels=jnp.asarray(corpus.language_model_pairs(ids, 1)[1]))
    attack = dataclasses.replace(presets.dlg(iterations=150), label_source=labels.known)
  else:  # the token search, from the gradient alone
    attack = presets.dlg(iterations=200)
  rec = text.reconstruct(attack, m.apply_fn, obs, jax.random.key(0), length=5, eos=1, restarts=4,
                         search=search)
  np.testing.assert_array_equal(rec.tokens_pinv, ids)
  np.testing.assert_array_equal(rec.tokens_nearest, ids)
  assert rec.reconstruction.loss < 1e-6


@pytest.mark.slow
def test_a_tied_decoder_is_read_by_the_token_search_with_its_table_held_fixed():
  """GPT's logits read its embedding table: the table's gradient reaches every row (no bag), and
  with the server's table a constant the true embeddings and next tokens reproduce every other
  gradient; the token search, from the gradient alone over the whole vocabulary, gives the
  sentence back."""
  from gradjax.objectives import dummy_gradient
  m = models.create("gpt", jax.random.key(1), input_shape=(5,), num_classes=40, text_sizes=SMALL)
  ids = np.array([[7, 12, 3, 12, 25]], np.int32)
  x, y = corpus.language_model_pairs(ids, 1)
  obs = clients.fedsgd(m.apply_fn, m.variables, x, y)
  assert text.token_bag(obs).size == 40
  view = text.attack_view(obs)
  e = np.asarray(m.variables["params"]["embed"]["embedding"])[x]
  g = dummy_gradient(text.tied_apply_fn(m.apply_fn, obs), view.variables, jnp.asarray(e), jnp.asarray(y))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(view.gradient), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  rec = text.reconstruct(presets.dlg(iterations=200), m.apply_fn, obs, jax.random.key(0), length=5,
                         eos=1, restarts=4, search="tokens")
  assert rec.bag is None
  np.testing.assert_array_equal(rec.tokens_pinv, ids)
  assert rec.reconstruction.loss < 1e-6


def test_masked_cross_entropy_weighs_each_row_by_its_share_of_targets(log_softmax_reference):
  """Soft targets over K classes and 'no target': −Σ t log softmax(z) over the K classes divided by
  their total mass (NumPy, float64); one-hot rows give the int labels' loss with -1 for 'no target'."""
  rng = np.random.default_rng(0)
  z = rng.normal(size=(2, 5, 7))
  t = rng.dirichlet(np.ones(8), size=(2, 5))
  want = -np.sum(t[..., :7] * log_softmax_reference(z)) / np.sum(t[..., :7])
  assert float(losses.masked_cross_entropy(jnp.asarray(z, jnp.float32), jnp.asarray(t, jnp.float32))
               ) == pytest.approx(want, rel=1e-5)
  y = np.array([[-1, 3, -1, -1, 2], [0, -1, -1, 6, -1]])
  one_hot = np.eye(8)[np.where(y < 0, 7, y)]
  kept = y >= 0
  want = -np.mean(log_softmax_reference(z)[kept, y[kept]])
  for targets in (jnp.asarray(y), jnp.asarray(one_hot, jnp.float32)):
    assert float(losses.masked_cross_entropy(jnp.asarray(z, jnp.float32), targets)) == pytest.approx(
        want, rel=1e-5)
  with pytest.raises(ValueError, match="8 columns, got 7"):
    losses.masked_cross_entropy(jnp.asarray(z), jnp.asarray(t[..., :7]))


@pytest.mark.slow
def test_a_token_search_one_word_off_settles_on_the_sentence():
  """bert's masked client (five words, two masked): a token search that ended with its first word
  wrong settles on the client's sentence and targets, and its objective is the attack's distance
  between the client's gradient and the gradient of the sentence's own rows (``<mask>``'s where
  masked) with one-hot targets, computed here without the search's logits; a sentence that no
  exchange improves comes back as it was."""
  from gradjax.objectives import dummy_gradient
  m = models.create("bert", jax.random.key(1), input_shape=(5,), num_classes=40, text_sizes=SMALL)
  ids, mask = np.array([[7, 12, 3, 12, 25]], np.int32), 39
  x, y = corpus.masked_lm_pairs(ids, mask, 0.4, seed=0)
  obs = clients.fedsgd(m.apply_fn, m.variables, x, y)
  view, table = text.attack_view(obs), text.embedding_table(obs)
  tied = text.tied_apply_fn(m.apply_fn, obs)
  attack = presets.dlg(iterations=200)
  problem = text.prepare_tokens(attack, tied, view, table, jax.random.key(0), length=5, eos=None,
                                mask=mask, candidates=np.arange(39))
  off = ids.copy()
  off[0, 0] = 14
  found = text.TokenSearch(off, np.eye(39)[off], table[off], np.where(x == mask, off, -1), 1.0, 0,
                           np.ones(1), np.ones(1, bool), np.zeros(1), np.zeros(1))
  settled = text.settle_tokens(attack, tied, problem, found, table)
  np.testing.assert_array_equal(settled.tokens, ids)
  np.testing.assert_array_equal(settled.targets, y)
  e = np.where((x == mask)[..., None], table[mask], table[ids])
  np.testing.assert_allclose(settled.embeddings, e)
  g = dummy_gradient(tied, view.variables, jnp.asarray(e, jnp.float32),
                     jnp.asarray(np.eye(41)[np.where(y < 0, 40, y)], jnp.float32),
                     loss_fn=losses.masked_cross_entropy)
  want = float(attack.distance(g, view.gradient, weights=problem.data.weights, step=200))
  assert want < 1e-10 and settled.loss == pytest.approx(want, rel=1e-2, abs=1e-12)
  assert text.settle_tokens(attack, tied, problem, settled, table) is settled
  # A stop asked for while it settles (a signal) ends it at the next position.
  calls = []

  def stop():
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    text.settle_tokens(attack, tied, problem, found, table, stop=stop)
  assert len(calls) == 3


@pytest.mark.slow
def test_settling_a_batch_recomputes_only_the_sentence_it_changes(monkeypatch):
  """Three 5-token sentences, two words off in two of them: the batch's gradient is the sum of its
  sentences' summed-loss gradients over its count of targets (against the batch's own gradient), so
  a trial computes its one sentence's; the settled batch is the client's, as when every trial
  computes the whole batch's gradient, and its objective is the attack's distance at the client's
  sentences computed here without the search. A model that mixes its sentences (a batch mean) is
  not split: every trial reads the whole batch."""
  from gradjax.objectives import dummy_gradient
  m = models.create("transformer", jax.random.key(1), input_shape=(5,), num_classes=40, text_sizes=SMALL)
  ids = np.array([[7, 12, 3, 12, 25], [4, 9, 30, 2, 8], [11, 5, 6, 21, 17]], np.int32)
  x, y = corpus.language_model_pairs(ids, 1)
  obs = clients.fedsgd(m.apply_fn, m.variables, x, y)
  view, table = text.attack_view(obs), text.embedding_table(obs)
  apply = text.embeddings_apply_fn(m.apply_fn, obs, 5)
  attack = presets.dlg(iterations=50)
  problem = text.prepare_tokens(attack, apply, view, table, jax.random.key(0), length=5, eos=1,
                                candidates=np.unique(ids))
  off = ids.copy()
  off[0, 1], off[2, 4] = 30, 9
  slots = np.searchsorted(problem.ids, off)
  found = text.TokenSearch(off, np.eye(problem.ids.size)[slots], table[off], y, 1.0, 0, np.ones(1),
                           np.ones(1, bool), np.zeros(1), np.zeros(1))
  error = text._sums_error(apply, problem.vocabulary, False)
  assert float(error(jnp.asarray(slots), jnp.zeros(slots.shape, bool), problem.data)) < 1e-5
  settled = text.settle_tokens(attack, apply, problem, found, table)
  np.testing.assert_array_equal(settled.tokens, ids)
  g = dummy_gradient(apply, view.variables, jnp.asarray(table[ids], jnp.float32),
                     jnp.asarray(np.eye(40)[y], jnp.float32))
  want = float(attack.distance(g, view.gradient, weights=problem.data.weights, step=50))
  assert settled.loss == pytest.approx(want, rel=1e-2, abs=1e-12)
  # Started at the client's batch, no exchange lowers it: the search comes back as it was (the
  # sums' rounding is no improvement).
  at_truth = found._replace(tokens=ids, probabilities=np.eye(problem.ids.size)[
      np.searchsorted(problem.ids, ids)])
  assert text.settle_tokens(attack, apply, problem, at_truth, table) is at_truth
  monkeypatch.setattr(text, "SEPARABLE", -1.0)  # every trial the whole batch's gradient
  whole = text.settle_tokens(attack, apply, problem, found, table)
  np.testing.assert_array_equal(whole.tokens, settled.tokens)
  assert whole.loss == pytest.approx(settled.loss, rel=1e-2, abs=1e-12)
  monkeypatch.undo()

  def mixing(variables, e, train=False):
    return apply(variables, e - 0.5 * e.mean(axis=0, keepdims=True), train)

  mixed = text.prepare_tokens(attack, mixing, view, table, jax.random.key(0), length=5, eos=1,
                              candidates=np.unique(ids))
  assert float(text._sums_error(mixing, mixed.vocabulary, False)(
      jnp.asarray(slots), jnp.zeros(slots.shape, bool), mixed.data)) > text.SEPARABLE
  monkeypatch.setattr(text, "_exchange_objective", None)  # called, it would fail
  assert text.settle_tokens(attack, mixing, mixed, found, table).loss < found.loss


@pytest.mark.slow
def test_a_masked_encoder_is_read_by_the_optimisation_attacks():
  """bert's client masks two of five positions and sends the gradient at those positions only. At
  the true sentence both searches' inputs and targets (the embedding search's soft targets with
  'no target' elsewhere, the token search's words and mask chances) reproduce every gradient but
  the tied table's; the token search, from the gradient alone over the whole vocabulary, gives the
  inputs, the masked words and so the sentence back; the embedding search's result is a sentence
  with its masks filled by its targets."""
  from gradjax.objectives import dummy_gradient
  m = models.create("bert", jax.random.key(1), input_shape=(5,), num_classes=40, text_sizes=SMALL)
  ids, mask = np.array([[7, 12, 3, 12, 25]], np.int32), 39
  x, y = corpus.masked_lm_pairs(ids, mask, 0.4, seed=0)
  assert np.sum(x == mask) == 2 and np.all((y >= 0) == (x == mask))
  obs = clients.fedsgd(m.apply_fn, m.variables, x, y)
  view, table = text.attack_view(obs), text.embedding_table(obs)
  tied = text.tied_apply_fn(m.apply_fn, obs)
  soft = jnp.asarray(np.eye(41)[np.where(y < 0, 40, y)], jnp.float32)
  # One program each, not one per operation.
  gradient = jax.jit(lambda e, t: dummy_gradient(tied, view.variables, e, t,
                                                 loss_fn=losses.masked_cross_entropy))
  g = gradient(jnp.asarray(table[x]), soft)
  problem = text.prepare_tokens(presets.dlg(), tied, view, table, jax.random.key(0), length=5,
                                eos=None, mask=mask, candidates=np.arange(39))
  e, targets = jax.jit(text.soft_masked_tokens, static_argnums=3)(
      jnp.asarray(50.0 * np.eye(39)[ids], jnp.float32),
      jnp.asarray(np.where(x == mask, 50.0, -50.0), jnp.float32), problem.data, 40)
  np.testing.assert_allclose(e, table[x], atol=1e-6)
  g_tokens = gradient(e, targets)
  for a, b, c in zip(jax.tree.leaves(g), jax.tree.leaves(g_tokens), jax.tree.leaves(view.gradient),
                     strict=True):
    scale = np.max(np.abs(c)) + 1e-6  # the attention key bias's gradient is zero up to rounding
    np.testing.assert_allclose(a / scale, c / scale, atol=1e-5)
    np.testing.assert_allclose(b / scale, c / scale, atol=1e-5)
  rec = text.reconstruct(presets.dlg(iterations=200), m.apply_fn, obs, jax.random.key(0), length=5,
                         mask=mask, search="tokens")
  np.testing.assert_array_equal(rec.tokens_pinv, ids)
  np.testing.assert_array_equal(rec.targets, y)
  assert rec.reconstruction.loss < 1e-6
  # The embedding search's decoding (Adam: what is checked is the decoding, not the optimiser, and
  # Adam's step compiles faster than L-BFGS's).
  rec = text.reconstruct(presets.adam_dlg(iterations=3), m.apply_fn, obs, jax.random.key(0), length=5,
                         mask=mask)
  assert rec.reconstruction.dummy["label_logits"].shape == (1, 5, 41)
  assert set(rec.targets.ravel().tolist()) <= set(range(39)) | {-1}  # never <mask>
  masked = np.asarray(text.nearest_tokens(rec.embeddings, table)) == mask
  np.testing.assert_array_equal(rec.tokens_nearest[masked & (rec.targets >= 0)],
                                rec.targets[masked & (rec.targets >= 0)])
  from gradjax.run import config, text_run  # the command line's path, its residual on hard targets
  results = text_run.run_text(config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "bert", "attack.preset": "adam_dlg",
      "attack.iterations": 2, "data.sequence_length": 8,
      "model.text_dim": 16, "model.text_heads": 2, "model.text_ffn": 16, "model.text_layers": 1}))
  assert results["bag"] is None and len(results["sentences"]) == 1
  assert 0 <= results["residual"]["relative_error"] <= 1 + 1e-6  # sin of the update's angle


@pytest.mark.slow
def test_joint_soft_targets_stay_in_the_bag(client):
  m, obs, ids = client
  rec = text.reconstruct(presets.dlg(iterations=3), m.apply_fn, obs, jax.random.key(0),
                         length=5, eos=1)
  assert set(rec.targets.ravel().tolist()) <= set(ids.ravel().tolist()) | {1}
  assert set(rec.tokens_nearest.ravel().tolist()) <= set(ids.ravel().tolist())
  fixed = dataclasses.replace(presets.dlg(), label_source=lambda o: jnp.asarray(ids))  # (1, 5) targets
  problem = attacks.prepare(fixed, m.apply_fn, text.attack_view(obs), jax.random.key(0),
                            input_shape=(5, 16))
  with pytest.raises(ValueError, match=r"the attack's labels must be int \(1, 5\)"):  # iDLG's (1,)
    attacks.prepare(presets.idlg(), m.apply_fn, text.attack_view(obs), jax.random.key(0),
                    input_shape=(5, 16))
  with pytest.raises(ValueError, match="label support restricts joint"):
    attacks.restrict_labels(problem, [3], text.embedding_table(obs).shape[0])
  with pytest.raises(ValueError, match="label inference reads a classifier"):
    text.reconstruct(presets.idlg(iterations=1), m.apply_fn, obs, jax.random.key(0),
                     length=5, eos=1)
  with pytest.raises(ValueError, match="has objective='dlm'$"):  # not blamed on label inference
    text.reconstruct(presets.dlm(iterations=1), m.apply_fn, obs, jax.random.key(0),
                     length=5, eos=1)
  with pytest.raises(ValueError, match="unknown text search"):
    text.reconstruct(presets.dlg(iterations=1), m.apply_fn, obs, jax.random.key(0),
                     length=5, eos=1, search="beam")


def test_text_client_rejects_bad_targets(client):
  m, _, ids = client
  with pytest.raises(ValueError, match=r"client labels must be int \(1, 5\)"):
    clients.fedsgd(m.apply_fn, m.variables, ids, ids[:, :3])
  with pytest.raises(ValueError, match="lie in"):
    clients.fedsgd(m.apply_fn, m.variables, ids, ids + 40)


# --- metrics ----------------------------------------------------------------------------------------


def test_text_metrics_against_plain_references():
  rng = np.random.default_rng(3)
  true = rng.integers(0, 6, size=(4, 10))
  pred = np.where(rng.random((4, 10)) < 0.5, true, rng.integers(0, 6, size=(4, 10)))
  acc = [sum(int(p == t) for p, t in zip(pr, tr)) / 10 for pr, tr in zip(pred, true)]
  recall = [sum((collections.Counter(pr.tolist()) & collections.Counter(tr.tolist())).values()) / 10
            for pr, tr in zip(pred, true)]
  np.testing.assert_allclose(metrics.token_accuracy(pred, true), acc)
  np.testing.assert_allclose(metrics.bag_recall(pred, true), recall)
  assert metrics.bag_recall([[1, 1, 2]], [[1, 2, 2]])[0] == pytest.approx(2 / 3)
  # A batch returned in another order is matched back before scoring.
  s = metrics.score_text(pred[::-1], true)
  assert s["order"] == [3, 2, 1, 0] and s["token_accuracy"] == pytest.approx(np.mean(acc))
  assert metrics.score_text(true, true)["exact"] == 4
  with pytest.raises(ValueError, match="Shape mismatch"):
    metrics.token_accuracy(pred[:, :5], true)
  with pytest.raises(ValueError, match="integer token ids"):
    metrics.bag_recall(pred.astype(float), true)


# --- the programs -----------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.model.text_dim=16", "--config.model.text_heads=2", "--config.model.text_ffn=16", "--config.model.text_layers=1"]


def run_program(name, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "gradjax", name.removesuffix(".py").replace("_", "-"), *args],
                        capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_train_then_attack_a_sentence_from_the_command_line(tmp_path, pydoc):
  train = run_program("train.py", "--modality=text", "--epochs=1", "--config.training.lr=0.1", "--config.data.sequence_length=8",
                      "--config.data.vocab_size=200", f"--output_dir={tmp_path / 'train'}", *TINY)
  assert train.returncode == 0, train.stderr[-2000:]
  saved = json.loads((tmp_path / "train" / "results.json").read_text())
  assert saved["metadata"]["model"] == "transformer" and len(saved["metadata"]["vocabulary"]) == 200
  assert saved["history"][1]["accuracy"] > saved["history"][0]["accuracy"]  # it learned something
  out = tmp_path / "attack"
  proc = run_program("reconstruct.py", "--modality=text", "--iterations=5", "--index=1",
                     f"--checkpoint={tmp_path / 'train' / 'epoch_1.npz'}", "--config.data.sequence_length=8",
                     f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((out / "metrics.json").read_text())
  vocab = corpus.Vocabulary(tuple(saved["metadata"]["vocabulary"]))
  true = corpus.of_length(pydoc, 8)[1]
  assert any(t not in vocab.index for t in true)  # a word the model reads as <unk>, shown as written
  assert results["sentences"][0]["true"] == " ".join(true)
  # Every score from the sentences shown, word by word and as multisets.
  row = results["sentences"][0]
  written = row["true"].split()
  for key, shown in (("", "recovered (pseudo-inverse)"), ("_nearest", "recovered (nearest)")):
    recovered = row[shown].split()
    accuracy = np.mean([a == b for a, b in zip(recovered, written)])
    assert results[f"token_accuracy{key}"] == pytest.approx(accuracy)
    assert results[f"exact{key}"] == int(accuracy == 1)
    overlap = collections.Counter(recovered) & collections.Counter(t for t in written if t in vocab.index)
    assert results[f"bag_recall{key}"] == pytest.approx(sum(overlap.values()) / len(written))
  assert results["token_accuracy_nearest_per_sentence"] == [results["token_accuracy_nearest"]]
  assert results["sentence_pool"] == len(corpus.of_length(pydoc, 8))
  assert results["vocabulary_size"] == 200 and results["iterations"] == 5
  assert results["command"].startswith("gradjax reconstruct --modality=text")
  assert (out / "sentences.txt").read_text().startswith("sentence 0")
  assert f"token accuracy {results['token_accuracy']:.2f}" in proc.stdout
  assert (out / "report.html").exists()


@pytest.mark.slow
def test_train_a_masked_language_model_then_read_a_sentence_of_it(tmp_path, pydoc):
  """gradjax train on bert: its vocabulary ends in <mask>, its accuracy counts the masked positions
  only; the span attack on the trained model gives a client's sentence back, but for the word
  outside the vocabulary, which the model read as <unk>."""
  sizes = ["--config.model.text_dim=32", "--config.model.text_heads=2", "--config.model.text_ffn=32", "--config.model.text_layers=2"]
  train = run_program("train.py", "--modality=text", "--model=bert", "--epochs=1", "--config.training.lr=0.1",
                      "--config.data.sequence_length=8", "--config.data.vocab_size=200", f"--output_dir={tmp_path / 'train'}",
                      *sizes)
  assert train.returncode == 0, train.stderr[-2000:]
  saved = json.loads((tmp_path / "train" / "results.json").read_text())
  vocabulary = saved["metadata"]["vocabulary"]
  assert len(vocabulary) == 201 and vocabulary[-1] == "<mask>"
  out = tmp_path / "attack"
  proc = run_program("reconstruct.py", "--modality=text", "--attack=dager", "--index=1",
                     f"--checkpoint={tmp_path / 'train' / 'epoch_1.npz'}", "--config.data.sequence_length=8",
                     f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((out / "metrics.json").read_text())
  true = corpus.of_length(pydoc, 8)[1]
  known = [t in vocabulary for t in true]
  assert sum(known) == 7 and results["sentences"][0]["true"] == " ".join(true)
  recovered = results["sentences"][0]["recovered"].split()
  assert [a == b for a, b in zip(recovered, true)] == known
  assert results["token_accuracy_per_sentence"] == [7 / 8] and results["exact"] == 0
  assert results["verdict"]["status"] == "leak"


def test_accuracy_of_a_masked_language_model_counts_its_targets_only():
  """training.evaluate with -1 targets: the share of the kept positions whose argmax is the target
  (NumPy)."""
  from gradjax import training
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 6, 9)).astype(np.float32)
  y = rng.integers(0, 9, (5, 6))
  y[rng.random((5, 6)) < 0.7] = -1
  y[0, 0] = 3
  apply_fn = lambda variables, x, train=False: jnp.asarray(logits)[x[:, 0]]
  x = np.repeat(np.arange(5)[:, None], 6, axis=1)
  kept = y >= 0
  want = np.mean(np.argmax(logits, axis=-1)[kept] == y[kept])
  assert training.evaluate(apply_fn, {}, x, y) == pytest.approx(want)


TEXT_ERRORS = [
    (["--model=lenet_zhu"], "needs a text model"),
    (["--dataset=mnist"], "reads a corpus"),
    (["--client=fedavg"], "FedSGD client"),
    (["--index=100000"], "distinct sentences of 15 tokens"),
    (["--config.data.vocab_size=2"], "room for <unk>"),
    (["--config.data.tokenizer=bpe:3"], "unknown tokenizer"),
    (["--attack=inverting_gradients"], "image priors, which do not apply to text"),
]


def test_text_cli_errors_are_one_line(tmp_path):
  """Each case exits 2 with one ``error:`` line naming it (the cases share one process)."""
  from test_cli import run_in_one_process
  cases = [(["gradjax", "reconstruct", "--modality=text", "--iterations=1", *TINY, *args,
             f"--output_dir={tmp_path / str(k)}"], tmp_path) for k, (args, _) in enumerate(TEXT_ERRORS)]
  for (args, message), proc in zip(TEXT_ERRORS, run_in_one_process(cases), strict=True):
    assert_one_line_error(proc, message, args)


@pytest.mark.slow
def test_readme_text_example_runs(capsys):
  """The README's text snippet (section "Text"), with 5 iterations instead of 500."""
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  section = readme[readme.index("### Text"):]
  code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 9)]
  assert "presets.dlg(500)" in code
  ns = {}
  exec(compile(code.replace("presets.dlg(500)", "presets.dlg(5)"), "README.md", "exec"), ns)
  printed = capsys.readouterr().out
  # the decoded sentence and its token accuracy, the share of positions equal to the client's (NumPy)
  tokens, ids, vocab = np.asarray(ns["rec"].tokens_pinv), np.asarray(ns["ids"]), ns["vocab"]
  assert tokens.shape == ids.shape == (1, 15) and tokens.min() >= 0 and tokens.max() < len(vocab)
  accuracy = np.mean(tokens == ids)
  assert printed.strip() == f"{vocab.decode(tokens[0])} {np.asarray([accuracy])}"


@pytest.mark.slow
@pytest.mark.parametrize("search", text.SEARCHES)
def test_best_iterate_tracked_from_the_attacks_track_from(client, search):
  """Both text searches take the best iterate from ``track_from`` on, as the image attacks do
  (the token search once tracked from step 0: an annealed distance's early values would win)."""
  m, obs, ids = client
  rows = []
  execution = driver.Execution(chunk=1, callback=lambda p: rows.append((p.iteration, p.best_loss))
                                if not p.compiling else None)
  text.reconstruct(dataclasses.replace(presets.dlg(iterations=5), track_from=3), m.apply_fn, obs,
                   jax.random.key(0), length=5, eos=1, search=search, execution=execution)
  # The report after k iterations has seen the iterates of steps 0..k-1: step 3 first counts at 4.
  assert [i for i, loss in rows if math.isfinite(loss)] == [4, 5], rows


@pytest.mark.slow
def test_the_token_search_keeps_each_position_in_its_own_set(client):
  """position_sets: the candidates are their union, each position's probability stays on its own
  set (zero elsewhere), a position of one token holds it in the objective's inputs too (its table
  row); reconstruct passes them to the token search only."""
  m, obs, ids = client
  view, table = text.attack_view(obs), text.embedding_table(obs)
  sets = [np.array([7]), np.array([12, 3]), np.array([3, 25, 12]), np.array([12]), np.array([25, 7])]
  attack = presets.dlg(iterations=3)
  problem = text.prepare_tokens(attack, m.apply_fn, view, table, jax.random.key(0), length=5, eos=1,
                                position_sets=sets)
  np.testing.assert_array_equal(problem.ids, [3, 7, 12, 25])
  state = text.solve_tokens(attack, m.apply_fn, problem)
  found = text.select_tokens(problem, state, table)
  for t, allowed in enumerate(sets):
    assert found.tokens[0, t] in allowed
    assert (found.probabilities[0, t, ~np.isin(problem.ids, allowed)] == 0).all()
  assert found.tokens[0, 0] == 7 and found.tokens[0, 3] == 12
  z = state.best_params["z"][found.best_restart]
  e, _ = text.soft_tokens(z, problem.data, problem.vocabulary)
  np.testing.assert_allclose(np.asarray(e)[0, [0, 3]], table[[7, 12]], rtol=1e-6)
  with pytest.raises(ValueError, match="one per position"):
    text.prepare_tokens(attack, m.apply_fn, view, table, jax.random.key(0), length=5, eos=1,
                        position_sets=sets[:4])
  with pytest.raises(ValueError, match="token search"):
    text.reconstruct(attack, m.apply_fn, obs, jax.random.key(0), length=5, eos=1,
                     search="embeddings", position_sets=sets)


@pytest.mark.slow
def test_the_token_search_is_prepare_solve_select(client):
  """text.prepare_tokens / solve_tokens / select_tokens: the candidates padded to N·T slots (one
  program per length), the best restart's tokens the argmax of its logits over the candidates, its
  embeddings their softmax-weighted table rows (NumPy), its targets the tokens shifted by one."""
  m, obs, ids = client
  view, table, bag = text.attack_view(obs), text.embedding_table(obs), text.token_bag(obs)
  attack = presets.dlg(iterations=2)
  problem = text.prepare_tokens(attack, m.apply_fn, view, table, jax.random.key(0), length=5, eos=1,
                                candidates=bag, restarts=3)
  assert problem.init["z"].shape == (3, 1, 5, max(bag.size, 5)) and problem.vocabulary == 40
  np.testing.assert_array_equal(problem.ids, bag)
  state = text.solve_tokens(attack, m.apply_fn, problem)
  found = text.select_tokens(problem, state, table)
  z = np.asarray(state.best_params["z"][found.best_restart])[..., :bag.size]
  np.testing.assert_array_equal(found.tokens, bag[np.argmax(z, -1)])
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(found.embeddings, p @ table[bag].astype(np.float64), rtol=1e-5)
  np.testing.assert_array_equal(found.targets[:, :-1], found.tokens[:, 1:])
  assert (found.targets[:, -1] == 1).all() and found.loss == found.restart_losses.min()
  with pytest.raises(ValueError, match="end-of-sentence"):
    text.prepare_tokens(attack, m.apply_fn, view, table, jax.random.key(0), length=5, eos=None)


def test_another_budget_is_the_same_token_solver():
  """The token search's budget makes no other solver (its compiled programs serve an audit's probes
  and its run in one process), the last-iterate rule's included (its step is the data's)."""
  apply_fn = lambda variables, x, train: x
  for make in (presets.dlg, presets.adam_dlg):
    assert text._token_solver(make(iterations=30), apply_fn, 11) is text._token_solver(
        make(iterations=300), apply_fn, 11)
  last = lambda n: dataclasses.replace(presets.dlg(iterations=n), track_from=n)
  assert text._token_solver(last(30), apply_fn, 11) is text._token_solver(last(300), apply_fn, 11)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_a_text_runs_residual_is_the_sine_to_the_update_its_embeddings_determine(monkeypatch, model):
  """run_text's relative residual of an embedding search (the report's, and what its verdict reads):
  sin ∠(u, c) in NumPy float64 over every parameter but the embedding table, with u the gradient of
  the reconstruction's embeddings and soft targets written out here with jax.grad and c the client's
  (dummy embeddings bypass the lookup: the table's gradient is not theirs to reproduce, and a tied
  decoder reads the server's table as a constant); and 0 for the client's own embeddings and next
  tokens, which before counted ‖c_table‖ / ‖c‖ as a residual."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": model,
      "attack.preset": "adam_dlg", "attack.iterations": 2, "data.sequence_length": 6,
      "model.text_dim": 16, "model.text_heads": 2, "model.text_ffn": 16, "model.text_layers": 1})
  batch = text_run.load_sentences(cfg)
  x, y = corpus.language_model_pairs(batch.ids, batch.vocabulary.eos)
  seen, reconstruct = {}, text.reconstruct

  def spy(attack, apply_fn, observation, key, **kwargs):
    rec = reconstruct(attack, apply_fn, observation, key, **kwargs)
    seen.update(apply_fn=apply_fn, observation=observation, dummy=rec.reconstruction.dummy)
    if seen.get("truth"):  # the client's own embeddings and (nearly one-hot) next tokens
      table = np.asarray(observation.variables["params"]["embed"]["embedding"])
      logits = np.where(np.arange(table.shape[0]) == y[..., None], 40.0, 0.0).astype(np.float32)
      rec = rec._replace(reconstruction=rec.reconstruction._replace(
          dummy={"x": table[x], "label_logits": logits}))
    return rec

  monkeypatch.setattr(text, "reconstruct", spy)
  results = text_run.run_text(cfg)
  apply_fn, obs, dummy = seen["apply_fn"], seen["observation"], seen["dummy"]
  table = obs.variables["params"]["embed"]["embedding"]
  others = {k: v for k, v in obs.variables["params"].items() if k != "embed"}
  t = np.exp(dummy["label_logits"] - dummy["label_logits"].max(-1, keepdims=True))
  t = t / t.sum(-1, keepdims=True)

  def loss(params):  # −Σ_v t_v log softmax(z)_v, mean over positions; the table held fixed
    logits = apply_fn({**obs.variables, "params": {**params, "embed": {"embedding": table}}},
                      jnp.asarray(dummy["x"]))
    return -(t * jax.nn.log_softmax(logits, axis=-1)).sum(-1).mean()

  u = jax.grad(loss)(others)
  c = {k: v for k, v in obs.gradient.items() if k != "embed"}
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)]).astype(np.float64)
  cos = flat(u) @ flat(c) / np.linalg.norm(flat(u)) / np.linalg.norm(flat(c))
  assert results["residual"]["relative_error"] == pytest.approx(np.sqrt(1 - cos ** 2), rel=1e-3)
  assert results["residual"]["cosine"] == pytest.approx(cos, rel=1e-5)
  alpha = flat(u) @ flat(c) / (flat(u) @ flat(u))
  layers = results["residual"]["layers"]
  assert len(layers) == len(jax.tree.leaves(c)) and not any("embed" in k for k in layers)
  # A leaf is read against at least float32's resolution of the whole, sqrt(eps) ‖c‖ (the attention
  # key's bias: zero up to rounding).
  floor = np.sqrt(np.finfo(np.float32).eps) * np.linalg.norm(flat(c))
  for (path, ui), ci in zip(jax.tree_util.tree_flatten_with_path(u)[0], jax.tree.leaves(c), strict=True):
    ui, ci = np.ravel(ui).astype(np.float64), np.ravel(ci).astype(np.float64)
    assert layers[jax.tree_util.keystr(path)]["relative_error"] == pytest.approx(
        np.linalg.norm(alpha * ui - ci) / max(np.linalg.norm(ci), floor), rel=1e-3, abs=1e-6)
  seen["truth"] = True
  results = text_run.run_text(cfg)
  assert results["residual"]["relative_error"] < 1e-4


@pytest.mark.slow
def test_a_masked_models_embedding_search_residual_is_the_sine_at_its_hard_targets(monkeypatch):
  """A masked model's (bert's) embedding search: run_text's relative residual is sin ∠(u, c) in NumPy
  float64 over every parameter but the table, u the gradient of the cross entropy at the hard
  targets its soft ones give (the argmax over the words and 'no target', the latter leaving the
  position out), written out here with jax.grad; c the client's update."""
  from gradjax.run import config, text_run
  cfg = config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": "bert",
      "attack.preset": "adam_dlg", "attack.iterations": 2, "data.sequence_length": 6,
      "model.text_dim": 16, "model.text_heads": 2, "model.text_ffn": 16, "model.text_layers": 1})
  seen, reconstruct = {}, text.reconstruct

  def spy(attack, apply_fn, observation, key, **kwargs):
    rec = reconstruct(attack, apply_fn, observation, key, **kwargs)
    seen.update(apply_fn=apply_fn, observation=observation, dummy=rec.reconstruction.dummy)
    return rec

  monkeypatch.setattr(text, "reconstruct", spy)
  results = text_run.run_text(cfg)
  apply_fn, obs, dummy = seen["apply_fn"], seen["observation"], seen["dummy"]
  soft = np.asarray(dummy["label_logits"])
  words = soft.shape[-1] - 1  # the last column: no target
  hard = np.where(soft.argmax(-1) == words, -1, soft.argmax(-1))
  kept = hard >= 0
  assert kept.any()
  table = obs.variables["params"]["embed"]["embedding"]
  others = {k: v for k, v in obs.variables["params"].items() if k != "embed"}

  def loss(params):  # −(1/M) Σ_kept log softmax(z)_target, the table held fixed
    logits = apply_fn({**obs.variables, "params": {**params, "embed": {"embedding": table}}},
                      jnp.asarray(dummy["x"]))
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                                 jnp.asarray(np.maximum(hard, 0))[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(jnp.asarray(kept), picked, 0.0)) / kept.sum()

  u = jax.grad(loss)(others)
  c = {k: v for k, v in obs.gradient.items() if k != "embed"}
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)]).astype(np.float64)
  cos = flat(u) @ flat(c) / np.linalg.norm(flat(u)) / np.linalg.norm(flat(c))
  assert results["residual"]["relative_error"] == pytest.approx(np.sqrt(1 - cos ** 2), rel=1e-3)
  assert results["residual"]["cosine"] == pytest.approx(cos, rel=1e-5, abs=1e-7)


def _token_search_config(model: str):
  """A token search of 2 iterations on two 6-token pydoc sentences, ``model`` at width 16."""
  from gradjax.run import config
  return config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "model.name": model,
      "attack.preset": "adam_dlg", "attack.text_search": "tokens", "attack.iterations": 2,
      "data.sequence_length": 6, "data.batch_size": 2, "model.text_dim": 16, "model.text_heads": 2,
      "model.text_ffn": 16, "model.text_layers": 1})


@pytest.mark.slow
def test_a_token_searchs_residual_is_that_of_the_sentences_it_decoded(monkeypatch):
  """run_text's residual of a token search (before: none, so its verdict could never say the update
  was matched): sin ∠(u, c) in NumPy float64 over every parameter, u the gradient of next-token
  cross entropy at the decoded sentences written out here with jax.grad (the closer of the two
  decodings), c the client's; 0 when the search decodes the client's own sentences."""
  from gradjax.run import text_run
  cfg = _token_search_config("transformer")
  batch = text_run.load_sentences(cfg)
  eos = batch.vocabulary.eos
  seen, reconstruct = {}, text.reconstruct

  def spy(attack, apply_fn, observation, key, **kwargs):
    rec = reconstruct(attack, apply_fn, observation, key, **kwargs)
    if seen.get("truth"):  # both decodings read the client's sentences, in another order
      rec = rec._replace(tokens_pinv=batch.ids[::-1], tokens_nearest=batch.ids[::-1])
    seen.update(apply_fn=apply_fn, observation=observation, decoded=(rec.tokens_pinv, rec.tokens_nearest))
    return rec

  monkeypatch.setattr(text, "reconstruct", spy)
  results = text_run.run_text(cfg)
  apply_fn, obs = seen["apply_fn"], seen["observation"]
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)]).astype(np.float64)
  c = flat(obs.gradient)

  def sine(ids):
    ids = np.asarray(ids)
    targets = np.concatenate([ids[:, 1:], np.full((len(ids), 1), eos)], axis=1)

    def loss(params):  # mean over sentences and positions of −log p(next token)
      logp = jax.nn.log_softmax(apply_fn({**obs.variables, "params": params}, jnp.asarray(ids)), -1)
      return -jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], -1).mean()

    u = flat(jax.grad(loss)(obs.variables["params"]))
    cos = u @ c / np.linalg.norm(u) / np.linalg.norm(c)
    return np.sqrt(max(1 - cos ** 2, 0.0))

  want = min(sine(ids) for ids in seen["decoded"])
  assert results["residual"]["relative_error"] == pytest.approx(want, rel=1e-3, abs=1e-5)
  seen["truth"] = True
  results = text_run.run_text(cfg)
  assert results["residual"]["relative_error"] < 1e-4


@pytest.mark.slow
def test_a_masked_models_token_search_residual_is_that_of_its_own_masks(monkeypatch):
  """run_text's residual of a masked language model's token search (before: none): sin ∠(u, c) in
  NumPy float64, u the gradient of the mean cross entropy at the positions the search masked,
  inputs ``<mask>`` there and its words as targets, written out here with jax.grad; 0 at the
  client's own sentences and masks; none where the search masked nothing."""
  from gradjax.run import text_run
  cfg = _token_search_config("bert")
  batch = text_run.load_sentences(cfg)
  mask = batch.vocabulary.mask
  client_x, client_y = corpus.masked_lm_pairs(batch.ids, mask, 0.15, seed=(cfg.seed, cfg.data.index))
  # The search's masks: the client's first masked position moved by one, and one more.
  masks = np.zeros(batch.ids.shape, bool)
  masks[0, 1], masks[1, 4] = True, True
  seen, reconstruct = {"targets": lambda tokens: np.where(masks, tokens, -1)}, text.reconstruct

  def spy(attack, apply_fn, observation, key, **kwargs):
    rec = reconstruct(attack, apply_fn, observation, key, **kwargs)
    tokens = batch.ids if seen.get("truth") else rec.tokens_pinv
    targets = client_y if seen.get("truth") else seen["targets"](tokens)
    seen.update(apply_fn=apply_fn, observation=observation, tokens=tokens)
    return rec._replace(tokens_pinv=tokens, tokens_nearest=tokens, targets=targets)

  monkeypatch.setattr(text, "reconstruct", spy)
  results = text_run.run_text(cfg)
  apply_fn, obs, tokens = seen["apply_fn"], seen["observation"], np.asarray(seen["tokens"])
  inputs, targets = np.where(masks, mask, tokens), np.where(masks, tokens, 0)

  def loss(params):  # mean over the masked positions of −log p(word)
    logp = jax.nn.log_softmax(apply_fn({**obs.variables, "params": params}, jnp.asarray(inputs)), -1)
    picked = jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], -1)[..., 0]
    return -jnp.sum(jnp.where(jnp.asarray(masks), picked, 0.0)) / masks.sum()

  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)]).astype(np.float64)
  u, c = flat(jax.grad(loss)(obs.variables["params"])), flat(obs.gradient)
  cos = u @ c / np.linalg.norm(u) / np.linalg.norm(c)
  assert results["residual"]["relative_error"] == pytest.approx(np.sqrt(max(1 - cos ** 2, 0.0)),
                                                                rel=1e-3, abs=1e-5)
  seen["truth"] = True
  assert text_run.run_text(cfg)["residual"]["relative_error"] < 1e-4
  seen.update(truth=False, targets=lambda tokens: np.full(tokens.shape, -1))
  assert text_run.run_text(cfg)["residual"] is None


def test_a_corrupt_wikitext_gzip_is_one_value_error(tmp_path):
  """WikiText-2's file with bytes flipped inside its deflate stream: a ValueError naming the file
  (zlib's own error escaped the reader before)."""
  import gzip
  from gradjax import corpus
  folder = tmp_path / "wikitext2"
  folder.mkdir()
  raw = bytearray(gzip.compress(("The cat sat on the mat . " * 4000).encode()))
  for i in range(200, 260):
    raw[i] ^= 0xFF
  (folder / "wiki.valid.txt.gz").write_bytes(bytes(raw))
  with pytest.raises(ValueError, match="is not a readable gzip text file"):
    corpus._wikitext_sentences(str(tmp_path), "valid")


@pytest.mark.slow
def test_an_optimisation_attack_counts_the_words_the_embedding_gradient_gives():
  """SAPAG on the default language model (the README's text run, a few iterations): the embedding
  gradient's moved rows are the sentence's words (NumPy's set of its tokens), counted as a leak of
  the bag whatever the decoded sentence scores; ROUGE of the decoded sentences is reported."""
  from gradjax.run import config, text_run
  options = {"data.modality": "text", "data.dataset": "pydoc", "model.name": "transformer",
             "attack.preset": "sapag", "attack.iterations": 3}
  results = text_run.run_text(config.from_options(options))
  sentences = text_run.load_sentences(config.from_options(options))
  truth = set(sentences.vocabulary.decode(np.unique(sentences.ids)))
  assert set(results["words"]) == set(results["bag"]) == truth
  assert results["word_precision"] == 1.0 and results["word_recall"] == 1.0
  assert results["findings"]["bag"]["leak"] and "bag" in results["verdict"]["leaks"]
  # ROUGE of the decoded sentence as the rouge_score package gives it on the strings the run wrote.
  rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")

  class Words:  # the run's tokens, space-separated: no stemming or filtering
    def tokenize(self, text):
      return text.split()

  (written,) = results["sentences"]
  reference = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=Words()).score(
      written["true"], written["recovered (pseudo-inverse)"])
  assert written["true"] != written["recovered (pseudo-inverse)"]  # a decoding short of exact
  for k in ("rouge1", "rouge2", "rougeL"):
    assert results[k] == pytest.approx(reference[k].fmeasure), k
  assert results["rougeL_per_sentence"] == [pytest.approx(reference["rougeL"].fmeasure)]
