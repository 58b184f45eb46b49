"""English text for the text attacks: sentences of a real corpus and a word-level vocabulary.

Corpora (:data:`CORPORA`):

* ``"pydoc"`` (the default; no download): the prose of the Python Language Reference as the standard
  library ships it for ``help()`` (``pydoc_data.topics``). Indented blocks (grammar rules, code) and
  section underlines are dropped; paragraphs are split into sentences at ``.``, ``!`` or ``?``
  followed by a capital letter, a quote or a parenthesis. With Python 3.11 that gives 2038 sentences
  of 55 747 tokens, 2449 distinct tokens and 53 distinct sentences of exactly 15 tokens (other Python
  versions ship a slightly different text).
* ``"wikitext2"``: WikiText-2 (Merity et al. 2016), its validation split ``wiki.valid.txt.gz`` from the
  data folder (``../shared/data/wikitext2``); one paragraph a line, already tokenised by the
  dataset (heading lines `` = Title = `` are dropped), split into sentences at `` . ``: 8059
  sentences of 209 338 tokens, 12 024 distinct tokens, 221 distinct sentences of 15 tokens.
  ``"wikitext2_test"``: its test split ``wiki.test.txt.gz``, read the same way.

Subwords (:func:`tokenized` with ``"bpe:N"``): the sentences' words cut into N byte-pair pieces
(Sennrich et al. 2016; GPT-2's tokens are byte-pair pieces too) learned on the sentences read, by
SentencePiece (the optional ``sentencepiece`` package, trained here on one thread: nothing is
downloaded); a piece that starts a word carries SentencePiece's "▁".

Tokens (:func:`tokenize`): lower-cased words (letters and digits, with an apostrophe suffix such as
``'s``) and every other non-space character on its own, so "the "if" statement." gives
``the " if " statement .``. :class:`Vocabulary` maps tokens to ids; ``<unk>`` (id 0) stands for a
token outside it and ``<eos>`` (id 1) ends a sentence (the language model's last target). A masked
language model's vocabulary also holds ``<mask>``, last (:meth:`Vocabulary.with_mask`), and its
client's inputs and targets are :func:`masked_lm_pairs`.

Padded batches (:func:`padded`): sentences of several lengths, each followed by :data:`PAD` up to the
batch's T. :data:`PAD` is no token: the model reads ``<eos>`` there and no loss is taken there
(:func:`language_model_pairs`), as a client that pads on the right and masks the padding's labels
(Hugging Face's ``-100``) trains; every score and guess leaves it out.
"""

import collections
import dataclasses
import gzip
import os
import re
import zlib
from collections.abc import Iterable, Sequence
import numpy as np

CORPORA = ("pydoc", "wikitext2", "wikitext2_test")
UNK, EOS, MASK = "<unk>", "<eos>", "<mask>"
PAD = -2
"""The id past a padded sentence's end (:func:`padded`): no token (−1 marks a word outside the
vocabulary in a ground truth, :class:`gradjax.run.text_run.Sentences`)."""

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_UNDERLINE = re.compile(r"[*=\-~^]+")


def tokenize(text: str) -> list[str]:
  """Lower-cased words and single punctuation characters of ``text`` (see the module docstring)."""
  return _TOKEN.findall(text.lower())


def detokenize(tokens: Sequence[str]) -> str:
  """The tokens joined by single spaces (``tokenize(detokenize(t)) == t`` for tokens of ``tokenize``);
  byte-pair pieces (:func:`subwords`) joined into their words."""
  if any(t.startswith(_WORD_START) for t in tokens):
    return "".join(tokens).replace(_WORD_START, " ").strip()
  return " ".join(tokens)


_WORD_START = "\u2581"  # SentencePiece's mark of a piece that starts a word


def tokenizer_size(tokenizer: str) -> int | None:
  """The number of pieces of ``"bpe:N"``, None for ``"words"``; a one-line ValueError otherwise."""
  if tokenizer == "words":
    return None
  name, _, size = tokenizer.partition(":")
  if name != "bpe" or not size.isdigit() or int(size) < 8:
    raise ValueError(f"unknown tokenizer {tokenizer!r}; choose 'words' or 'bpe:N' (N >= 8 pieces)")
  return int(size)


def tokenized(sentences: Sequence[Sequence[str]], tokenizer: str) -> list[list[str]]:
  """``sentences`` (of words) as ``tokenizer`` cuts them: unchanged for ``"words"``, their
  :func:`subwords` for ``"bpe:N"``."""
  size = tokenizer_size(tokenizer)
  return [list(s) for s in sentences] if size is None else subwords(sentences, size)


def subwords(sentences: Sequence[Sequence[str]], size: int) -> list[list[str]]:
  """Each sentence as byte-pair pieces of a SentencePiece model of ``size`` pieces trained on these
  sentences (their words joined by spaces; no normalisation, every character covered, one thread,
  so the same sentences give the same pieces)."""
  try:
    import sentencepiece
  except ImportError:
    raise ValueError("--config.data.tokenizer=bpe:N needs the sentencepiece package (pip install "
                     "sentencepiece)") from None
  import io
  text = [" ".join(s) for s in sentences]
  model = io.BytesIO()
  try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=size, model_type="bpe",
        character_coverage=1.0, num_threads=1, normalization_rule_name="identity",
        minloglevel=2, max_sentence_length=1 << 16)
  except RuntimeError as e:  # e.g. more pieces asked than the text allows
    raise ValueError(f"--config.data.tokenizer=bpe:{size}: {str(e).splitlines()[0]}") from None
  processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
  return [processor.encode(t, out_type=str) for t in text]


def _pydoc_sentences() -> list[list[str]]:
  try:
    from pydoc_data import topics
  except ImportError:  # some distributions strip it
    raise ValueError("corpus 'pydoc' needs the standard library's pydoc_data, which this Python "
                     "lacks; use --corpus=wikitext2 with a data folder") from None
  out = []
  for name in sorted(topics.topics):
    for paragraph in re.split(r"\n\s*\n", topics.topics[name]):
      lines = paragraph.split("\n")
      if any(line.startswith(" ") for line in lines) or _UNDERLINE.fullmatch(lines[-1].strip() or "-"):
        continue  # code, grammar, or a heading with its underline
      text = " ".join(line.strip() for line in lines)
      out.extend(t for t in map(tokenize, _SENTENCE_END.split(text)) if t)
  return out


def _wikitext_sentences(data_dir: str | None, split: str = "valid") -> list[list[str]]:
  from gradjax.data import default_data_dir

  root = data_dir or default_data_dir()
  name = f"wiki.{split}.txt.gz"
  path = None if root is None else os.path.join(root, "wikitext2", name)
  if path is None or not os.path.isfile(path):
    raise FileNotFoundError(f"WikiText-2's {split} split needs {path or '<data_dir>/wikitext2/' + name}"
                            " (give --data_dir)")
  try:
    with gzip.open(path, "rt", encoding="utf-8") as f:
      lines = f.read().splitlines()
  except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
    raise ValueError(f"{path} is not a readable gzip text file: {e}") from None
  out = []
  for line in lines:
    line = line.strip()
    if not line or line.startswith("="):
      continue
    for sentence in re.split(r"(?<= \.) ", line):
      tokens = sentence.lower().split()
      if tokens:
        out.append(tokens)
  return out


def sentences(name: str, data_dir: str | None = None) -> list[list[str]]:
  """The tokenised sentences of corpus ``name`` (one of :data:`CORPORA`), in corpus order."""
  if name == "pydoc":
    return _pydoc_sentences()
  if name == "wikitext2":
    return _wikitext_sentences(data_dir)
  if name == "wikitext2_test":
    return _wikitext_sentences(data_dir, "test")
  raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")


def of_length(corpus: Iterable[Sequence[str]], length: int, shortest: int | None = None
              ) -> list[list[str]]:
  """The distinct sentences of exactly ``length`` tokens (of ``shortest`` to ``length`` tokens when
  ``shortest`` is given), in order of first appearance."""
  shortest = length if shortest is None else shortest
  if not 1 <= shortest <= length:
    raise ValueError(f"sentence lengths must satisfy 1 <= shortest <= length, got {shortest}, {length}")
  seen, out = set(), []
  for s in corpus:
    if shortest <= len(s) <= length and tuple(s) not in seen:
      seen.add(tuple(s))
      out.append(list(s))
  return out


def padded(sentences: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """(N, ``length``) int32: the id sentences, each followed by :data:`PAD` up to ``length``."""
  out = np.full((len(sentences), length), PAD, np.int32)
  for i, s in enumerate(sentences):
    if not 1 <= len(s) <= length:
      raise ValueError(f"sentence {i} has {len(s)} tokens; a padded batch holds 1 to {length}")
    out[i, :len(s)] = s
  return out


def lengths(ids) -> np.ndarray:
  """(N,) int: the tokens of each sentence of ``ids`` (N, T) before its :data:`PAD`."""
  return np.sum(np.asarray(ids) != PAD, axis=-1)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """A word-level vocabulary: ``tokens[i]`` is the token of id i; ids 0 and 1 are ``<unk>``, ``<eos>``."""

  tokens: tuple[str, ...]
  index: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    tokens = tuple(self.tokens)
    if tokens[:2] != (UNK, EOS) or len(set(tokens)) != len(tokens):
      raise ValueError("a vocabulary starts with <unk>, <eos> and holds each token once")
    object.__setattr__(self, "tokens", tokens)
    object.__setattr__(self, "index", {t: i for i, t in enumerate(tokens)})

  @classmethod
  def build(cls, corpus: Iterable[Sequence[str]], max_size: int | None = None) -> "Vocabulary":
    """The ``max_size`` (all if ``None``) most frequent tokens of ``corpus`` after ``<unk>`` and
    ``<eos>``, by decreasing count, ties in alphabetical order."""
    if max_size is not None and max_size < 3:
      raise ValueError(f"a vocabulary needs room for <unk>, <eos> and a word, got size {max_size}")
    counts = collections.Counter(t for s in corpus for t in s if t not in (UNK, EOS))
    if not counts:
      raise ValueError("the corpus holds no tokens")
    words = sorted(counts, key=lambda t: (-counts[t], t))
    if max_size is not None:
      words = words[:max_size - 2]
    return cls((UNK, EOS, *words))

  def __len__(self) -> int:
    return len(self.tokens)

  @property
  def eos(self) -> int:
    """The id of ``<eos>``."""
    return 1

  def with_mask(self) -> "Vocabulary":
    """This vocabulary with ``<mask>`` after its last token (itself if it holds one): a masked
    language model's, whose other ids stay those of this one."""
    return self if MASK in self.index else Vocabulary((*self.tokens, MASK))

  @property
  def mask(self) -> int:
    """The id of ``<mask>``; raises if the vocabulary has none."""
    if MASK not in self.index:
      raise ValueError("this vocabulary has no <mask> token (Vocabulary.with_mask)")
    return self.index[MASK]

  def encode(self, tokens: Sequence[str]) -> np.ndarray:
    """int32 (T,) ids of ``tokens``; a token outside the vocabulary becomes ``<unk>`` (0)."""
    return np.asarray([self.index.get(t, 0) for t in tokens], np.int32)

  def decode(self, ids) -> list[str]:
    """The tokens of int ids (any shape flattened in order), :data:`PAD` left out; raises on ids
    outside the vocabulary."""
    ids = np.asarray(ids).reshape(-1)
    ids = ids[ids != PAD]
    if ids.size and (ids.min() < 0 or ids.max() >= len(self.tokens)):
      raise ValueError(f"token ids must lie in [0, {len(self.tokens)}), got {ids.min()}..{ids.max()}")
    return [self.tokens[int(i)] for i in ids]


def unigram_guesses(sentences: np.ndarray, never: Sequence[int] = (), size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
  """What a corpus alone lets an attacker guess of a T-token sentence, without any update: the chance
  level of the text verdict (:func:`gradjax.verdict.text_findings`).

  * the position guess g (T,): at each position t the token most frequent there,
    argmax_v #{n : s_nt = v}, which maximises the expected token accuracy (1/T) Σ_t P(s_t = g_t).
    Of a padded pool (:data:`PAD` past the sentences' ends), the guess also ends: its first k
    positions' tokens, then :data:`PAD`, with the k that maximises the mean over the pool of
    :func:`gradjax.metrics.token_accuracy` (hits over the positions either holds, so each guessed
    token past a sentence's end costs a little and each missed hit more);
  * the bag guess (``size`` tokens, default T): the multiset B maximising the expected bag-of-words
    recall (1/L) Σ_v E[min(#v in B, #v in s)] = (1/L) Σ_v Σ_{k ≤ #v in B} P(#v in s ≥ k): the sum is
    separable and each token's terms fall with k, so the ``size`` largest P(#v in s ≥ k) over all
    (v, k) give the optimum (a padded sentence's guess holds as many tokens as the sentence).

  Probabilities are frequencies over ``sentences`` (N, T) ids (e.g. the corpus's other sentences of
  that length); ties go to the smaller id, then the smaller k. ``never``: ids not guessed (``<unk>``,
  which stands for words no scored token can be; a position holding only those takes the most
  frequent other token). Returns (position guess, bag guess), int32, the bag sorted by id."""
  sentences = np.asarray(sentences).astype(np.int64)
  if sentences.ndim != 2 or sentences.shape[0] < 1 or sentences.shape[1] < 1:
    raise ValueError(f"a unigram guess needs (N, T) sentences with N, T >= 1, got shape {sentences.shape}")
  length = sentences.shape[1]
  size = length if size is None else size
  if size < 0:
    raise ValueError(f"a bag guess needs a size >= 0, got {size}")
  ended = sentences == PAD
  allowed = ~np.isin(sentences, np.asarray([*never, PAD], np.int64))
  values, counts = np.unique(sentences[allowed], return_counts=True)
  fallback = values[np.argmax(counts)] if values.size else sentences.flat[0]
  position = []
  for column, ok in zip(sentences.T, allowed.T):
    values, counts = np.unique(column[ok], return_counts=True)
    # np.unique sorts: the first maximum has the smaller id
    position.append(values[np.argmax(counts)] if values.size else fallback)
  if ended.any():  # where the guess ends: the k of the best mean token accuracy over the pool
    lengths = np.sum(~ended, axis=1)
    hits = np.cumsum(sentences == np.asarray(position), axis=1)  # PAD never equals a guess
    k = np.arange(1, length + 1)
    mean = np.mean(hits / np.maximum(k[None, :], lengths[:, None]), axis=0)
    end = int(np.argmax(mean)) + 1  # the first best: the shortest guess
    position[end:] = [PAD] * (length - end)
  at_least = collections.Counter()  # (v, k) -> sentences holding v at least k times
  for s, ok in zip(sentences, allowed):
    values, counts = np.unique(s[ok], return_counts=True)
    for v, n in zip(values.tolist(), counts.tolist()):
      for k in range(1, n + 1):
        at_least[(v, k)] += 1
  best = [v for v, _ in sorted(at_least, key=lambda vk: (-at_least[vk], vk))[:size]]
  # Fewer tokens than the guess holds outside ``never``: any filler adds nothing; the most frequent one.
  best += [int(fallback)] * (size - len(best))
  return np.asarray(position, np.int32), np.sort(np.asarray(best, np.int32))


def frequent_words(sentences: np.ndarray, size: int, vocabulary_size: int | None = None,
                   never: Sequence[int] = ()) -> np.ndarray:
  """The set of ``size`` words a corpus alone lets an attacker guess, without any update, that
  maximises the expected word recall (:func:`gradjax.metrics.word_recall`) of a T-token sentence:
  (1/T) Σ_t P(s_t ∈ S) = Σ_(v ∈ S) E[#v in s] / T is separable, so the ``size`` words with the most
  occurrences in ``sentences`` (N, T) ids (e.g. the corpus's other sentences of that length); ties
  go to the smaller id. With ``vocabulary_size`` V the words the sentences lack (ids below V, no
  occurrence) fill the guess up to ``size``, so a guess of V words is the whole vocabulary; without
  it, fewer when the sentences hold fewer distinct words. ``never``: ids not guessed (``<unk>``, which
  no scored word can be; :data:`PAD` is never one). Of a padded pool the recall of sentence n is
  over its L_n tokens, so each occurrence counts 1/L_n. The chance level of a set of words found
  (:func:`gradjax.verdict.text_findings`). Returns int32, sorted by id."""
  sentences = np.asarray(sentences)
  if sentences.ndim != 2 or sentences.shape[0] < 1 or sentences.shape[1] < 1:
    raise ValueError(f"a guess of words needs (N, T) sentences with N, T >= 1, got shape {sentences.shape}")
  if size < 0:
    raise ValueError(f"a guess of words needs a size >= 0, got {size}")
  real = sentences != PAD
  values, counts = np.unique(sentences[real], return_counts=True)
  if not real.all():  # each occurrence weighs 1/L_n
    index = np.searchsorted(values, sentences[real])
    weights = np.broadcast_to(1.0 / np.sum(real, axis=1, keepdims=True), sentences.shape)[real]
    counts = np.zeros(values.size)
    np.add.at(counts, index, weights)
  if vocabulary_size is not None:
    if values.size and not 0 <= values.min() <= values.max() < vocabulary_size:
      raise ValueError(f"token ids must lie in [0, {vocabulary_size}), got {values.min()}..{values.max()}")
    all_counts = np.zeros(vocabulary_size, counts.dtype)
    all_counts[values] = counts
    values, counts = np.arange(vocabulary_size), all_counts
  allowed = ~np.isin(values, np.asarray(never, values.dtype))
  values, counts = values[allowed], counts[allowed]
  order = np.lexsort((values, -counts))  # most occurrences first, then the smaller id
  return np.sort(values[order[:size]]).astype(np.int32)


def language_model_pairs(ids: np.ndarray, eos: int) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) of next-token prediction for sentences ``ids`` (N, T): the inputs are the
  sentences, the targets the sentences shifted left by one with ``eos`` as the last target. Of a
  padded batch (:func:`padded`), ``eos`` is each sentence's last target and the input past its end,
  and the targets there are −1 (no loss: :func:`gradjax.losses.cross_entropy`)."""
  ids = np.asarray(ids)
  if ids.ndim != 2:
    raise ValueError(f"sentences must be (N, T) ids, got shape {ids.shape}")
  pad = ids == PAD
  if np.any(pad[:, :-1] & ~pad[:, 1:]) or np.any(pad[:, 0]):
    raise ValueError("a padded sentence holds PAD after its last token only, and at least one token")
  targets = np.concatenate([ids[:, 1:], np.full((ids.shape[0], 1), eos, ids.dtype)], axis=1)
  targets = np.where(np.concatenate([pad[:, 1:], pad[:, -1:]], axis=1), eos, targets)
  return np.where(pad, eos, ids).astype(ids.dtype), np.where(pad, -1, targets).astype(ids.dtype)


def masked_lm_pairs(ids: np.ndarray, mask: int, rate: float = 0.15, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) of masked-token prediction for sentences ``ids`` (N, T) (BERT's objective,
  Devlin et al. 2019): in each sentence max(1, round(rate·T)) positions drawn without replacement
  (``numpy.random.default_rng(seed)``, sentence by sentence) hold ``mask`` in the inputs and their
  token in the targets; the targets elsewhere are -1 (no loss there:
  :func:`gradjax.losses.cross_entropy`). BERT replaces a tenth of the drawn tokens by a random one
  and keeps another tenth; here every drawn token is masked."""
  ids = np.asarray(ids)
  if ids.ndim != 2:
    raise ValueError(f"sentences must be (N, T) ids, got shape {ids.shape}")
  if not 0 < rate <= 1:
    raise ValueError(f"the masking rate must lie in (0, 1], got {rate}")
  n, t = ids.shape
  k = max(1, round(rate * t))
  rng = np.random.default_rng(seed)
  chosen = np.zeros((n, t), bool)
  for i in range(n):
    chosen[i, rng.choice(t, size=k, replace=False)] = True
  inputs = np.where(chosen, mask, ids).astype(np.int32)
  targets = np.where(chosen, ids, -1).astype(np.int32)
  return inputs, targets


def windows(corpus: Iterable[Sequence[str]], vocabulary: Vocabulary, length: int
            ) -> tuple[np.ndarray, np.ndarray]:
  """Language-model training data: the corpus as one stream of ids, every sentence followed by
  ``<eos>``, cut into consecutive non-overlapping windows (PyTorch's word_language_model batching):
  inputs (M, T) = stream[iT : iT + T], targets (M, T) = stream[iT + 1 : iT + T + 1]."""
  if length < 1:
    raise ValueError(f"window length must be positive, got {length}")
  stream = np.concatenate([np.append(vocabulary.encode(s), vocabulary.eos) for s in corpus])
  m = (stream.size - 1) // length
  if m < 1:
    raise ValueError(f"the corpus has {stream.size} tokens, too few for one window of {length}")
  inputs = stream[:m * length].reshape(m, length)
  targets = stream[1:m * length + 1].reshape(m, length)
  return inputs.astype(np.int32), targets.astype(np.int32)
