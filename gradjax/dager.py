"""Exact recovery of a batch of sentences by span checks (DAGER; Petrov et al., NeurIPS 2024).

A transformer block projects each row x_i ∈ R^d of its input (i over the N·T positions of the batch)
to a query, a key and a value, y_i = x_i W + b with W (d, m). The weight gradient is a sum of outer
products,

    ∇W = Σ_i x_i g_iᵀ = Xᵀ G,        X (N·T, d),  G = ∂L/∂Y (N·T, m),

so its column space lies in span{x_i}, and is that span when G has full row rank (N·T ≤ m, and
generic weights). Stacking the three projections' gradients, [∇W_q ∇W_k ∇W_v] (d, 3m), keeps the
span and covers the first position of a causal model, whose query gradient is zero (a softmax over
one key). A candidate vector z can be one of the block's inputs only if its relative distance to
that span is zero:

    δ(z) = ‖z − U Uᵀ z‖ / ‖z‖,       U (d, r) an orthonormal basis of the span (:func:`span`).

**Rank and tolerance from the singular values** σ₁ ≥ σ₂ ≥ … of the stacked gradient: the rank r is
where the ratio σ_r / σ_{r+1} is largest, the directions past it being the gradient's rounding E
(‖E‖ ≈ σ_{r+1}). By Wedin's theorem the computed span is within an angle θ of the true one, with
sin θ ≤ ‖E‖ / (σ_r − ‖E‖) = ρ / (1 − ρ), ρ = σ_{r+1} / σ_r, so every true input lies within
τ = ρ / (1 − ρ) of it. The candidates themselves are computed in the gradient's precision, by
another sequence of operations than the client's (a decoding step, not a whole sentence), so τ is
at least sqrt(ε) (3.5e-4 in float32: half the digits). A random direction of the D-dimensional space that the
candidates occupy (D = d, or d − 1 after a LayerNorm without offset: :func:`candidate_dimensions`)
lies at about β = sqrt(1 − r/D); where β < :data:`SEPARATION` τ the check cannot tell members from
others, which is the case when the inputs (less repeats) fill that space, or when some inputs reach
the gradient with weights near its rounding: the span is then reported ``full``.

**Layer 1** (:func:`first_layer_distances`): the first block's input at position t depends on the
token at t alone (its embedding plus the position's, with the pre-norm's LayerNorm in GPT-2), so
scoring every (token, position) pair of the vocabulary gives, for each position, the set of tokens
that some sentence of the batch may hold there. With additive positions the span holds
span{e_v} + span{p_t} as soon as the batch's (token, position) pairs connect its tokens and
positions, so for a batch of several sentences each position's set is the batch's bag of tokens:
layer 1 finds the tokens, the next checks their order. A batch of one needs no order: its T inputs
are distinct (one per position), so where the largest fall of the singular values reads a rank of at
most T (a trained model's weakest positions reach the gradient near its rounding and fall past it),
the span is read at rank T and each position takes its nearest token (:func:`_one_sentence`). A
position whose runner-up lies within :data:`SEPARATION` times is open; for a next-token model, whose
client's targets follow from its sentence, the whole gradient decides among the open positions'
nearest tokens: the sentence whose own gradient comes nearest the client's (:func:`settle`).

**Ordering** (:func:`recover`): in a causal model every later quantity at position t depends on the
tokens at positions ≤ t only, so sentences grow position by position from the model's key/value
cache: each kept prefix extended by each token of the position's set is kept when (i) the first
block's attention output at the new position lies in the span of its output projection's gradient
(one position's query, key and value: the cheap check) and (ii) the second block's input lies in
the second block's span (the whole first block, on the few that pass (i)). A model with one block
is answered at batch 1 only (one token per position).

**Padded batches** (``padded`` in :func:`recover`): a client that pads its sentences on the right
and takes no loss past their ends (Hugging Face's ``-100`` labels) gives no gradient to a causal
model's positions past a sentence's end (their outputs reach no loss, and the causal mask keeps
them from the sentence's own positions), so the spans hold each sentence's own inputs only: the
extension runs as above, and a prefix that no token extends is a whole sentence.

**Encoders** (no decode mode; :func:`_search`): every position's input to the second block depends on
the whole sentence, so only whole sentences can be checked. The second span's rank r counts the
batch's N = r / T sentences. A freshly initialised encoder attends nearly uniformly, so the second
block's input at t is about F(x_t, the sentence's mean input): with every other position holding the
batch's mean embedding, the tokens that some sentence holds at t lie nearer the span than the rest
(:func:`context_distances`), and each position keeps its N nearest. Coordinate descent over those
(each position in turn takes the token whose own δ_t, given the rest of the sentence, is least)
settles on the sentence that most of its start's tokens come from; starts drawn among the tokens that no sentence
found holds at each position reach the sentences still missing. A sentence is kept when every δ_t
is within the second span's tolerance, as a decoder's prefixes are.

**FedAvg** (:func:`recover_local`): an update W_0 − W_E of several local steps sums the steps'
gradients, each at the weights its step started from; the first step's inputs are those the sent
model gives, the later ones drift (``drift`` in :func:`span`). Over mini-batches, mini-batch s is read
from W_s, which replaying the client's first s steps on the sentences already found gives.

**Masked language models** (:func:`masked_targets`): the client's inputs, ``<mask>`` included where
it masked, are found as any encoder's. The targets at the M masked positions follow from the found
input: the loss is linear in the targets, L = −(1/M) Σ_m log p_m[y_m], so the output bias's gradient
(1/M) Σ_m (p_m − e_(y_m)) with the p_m that the found input gives counts the labels, and the gradient
of the head's ``transform`` kernel, Σ_m u_m ⊗ G_m with u_m the kernel's input at m and
G_m = Σ_l A_ml g_ml, g_ml the gradient of −(1/M) log p_m[l] at its output, places them (G from the u
by least squares, each A_m from the g, then the assignment that respects the counts). A DP-SGD
client scales each sentence's terms by its own clipping factor; the counts are then weighted by
those factors, which the bias's entries off the labels give (:func:`_scaled_bag`), and each row
takes its largest weight.

Shapes: ``ids`` (N, T) int; first-layer distances (V, T); sentences (K, T) with K the number of
distinct sentences found (the batch's, when every check holds), a padded batch's with
:data:`gradjax.corpus.PAD` past each sentence's end.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import clients, compilation, corpus, losses
from gradjax.models import bert, taps
from gradjax.observation import Observation

SEPARATION = 10.0
"""The least ratio β / τ (a random direction's distance over a member's largest) for a usable span."""

CANDIDATES = 32
"""Of a batch of one, the nearest tokens an undetermined position keeps (:func:`settle`)."""

SETTLED = 1e-5
"""The relative gradient residual below which a settled sentence is the client's. Measured on the
trained decoder of ``experiments/studies/text`` (32 tokens): the client's own sentence 5.9e-7 to
5.8e-6 (float32's rounding; eleven sentences settled exactly), two neighbouring tokens exchanged
2.5e-5 and 8.0e-5, one wrong token 0.03-0.4."""

MOST_OPEN = 0.25
"""The largest share of a sentence's positions that :func:`recover` settles: more open positions are
not a sentence read from the span (a batch of several read as one), and coordinate descent over
many interacting positions stops short (each sweep costs a gradient per candidate)."""

FLOOR = 10.0
"""With ``drift`` (:func:`span`), the directions kept: singular values above this times the median."""

PROJECTIONS = ("query", "key", "value")


class Unreadable(ValueError):
  """The span attack cannot read this update (a span that cannot separate its members); the message
  says why. ``position_sets``: the tokens the first block admits at each position when that span
  was readable (the batch's words, without their order), else None."""

  def __init__(self, reason: str, position_sets: list | None = None):
    super().__init__(reason)
    self.position_sets = position_sets


class Span(NamedTuple):
  """The span of one block's inputs, read from its projections' gradient.

  Attributes:
    basis: (d, r) orthonormal columns U.
    singular_values: (min(d, m),) σ of the stacked gradient, descending.
    rank: r.
    tolerance: τ = max(ρ / (1 − ρ), sqrt(ε)), the largest relative distance of a member (Wedin's
      bound, and the rounding of the candidates).
    member_level: ρ = σ_{r+1} / σ_r.
    random_level: β = sqrt(1 − r/D), the distance expected of a random direction.
    full: whether the check cannot separate members: β < :data:`SEPARATION` τ (with ``drift``: a
      rank over half the singular values, where the median no longer reads rounding).
    drift: read as a FedAvg update of several local steps (:func:`span`).
  """

  basis: jax.Array
  singular_values: np.ndarray
  rank: int
  tolerance: float
  member_level: float
  random_level: float
  full: bool
  drift: bool = False


def span(columns, rank: int | None = None, dimension: int | None = None, *,
         drift: bool = False) -> Span:
  """The :class:`Span` of the columns (d, m) of a weight gradient; ``rank`` overrides the rank read
  from the singular values (see the module docstring); ``dimension`` is that of the space the
  candidates occupy (d if None; a LayerNorm without offset keeps its outputs in d − 1 dimensions,
  :func:`candidate_dimensions`), against which a random direction's distance β is counted.

  ``drift``: the columns are a FedAvg update of several local steps, Σ_k η X_kᵀ G_k, whose inputs
  X_k move a little from step to step: the singular values fall from the first step's inputs through
  the later steps' drift to the rounding, on the zoo's decoder without one clear gap (the largest
  ratio then reads a span too wide to use, or one that leaves out the drift), so the rank is every direction above
  :data:`FLOOR` times the rounding level (the median singular value, which is rounding while the
  inputs span less than half the columns), the received model's inputs X_1 lie in that span up to
  rounding, and the tolerance is β / :data:`SEPARATION` (a member well inside, a random direction
  well outside)."""
  columns = np.asarray(columns)
  if columns.ndim != 2 or min(columns.shape) < 1:
    raise ValueError(f"a span is read from a (d, m) matrix, got shape {columns.shape}")
  d = columns.shape[0]
  eps = float(np.finfo(columns.dtype).eps)
  with jax.enable_x64(True):  # float32's SVD blurs singular values below about eps·σ₁
    u, s, _ = _svd(compilation.device_array(np.asarray(columns, np.float64)))
    u, s = np.asarray(u).astype(columns.dtype), np.asarray(s)  # on the host: no program each
  if not np.all(np.isfinite(s)):
    raise ValueError("the gradient contains NaN or inf")
  if not s[0] > 0:
    raise ValueError("the gradient is zero: it spans nothing")
  floor = s[0] * np.finfo(np.float64).eps  # no division by zero
  if rank is None and drift:
    rank = int(np.sum(s > FLOOR * np.median(s)))
  elif rank is None:
    ratios = s[:-1] / np.maximum(s[1:], floor)
    rank = int(np.argmax(ratios)) + 1 if ratios.size else 1
  rank = int(min(max(rank, 1), s.size))
  member = float(max(s[rank], floor) / s[rank - 1]) if rank < s.size else eps * s.size
  random_level = float(np.sqrt(max(1.0 - rank / (dimension or d), 0.0)))
  if drift:
    tolerance = random_level / SEPARATION
    full = tolerance < np.sqrt(eps) or 2 * rank > s.size
  else:
    tolerance = max(member / (1.0 - member) if member < 1 else np.inf, float(np.sqrt(eps)))
    full = random_level < SEPARATION * tolerance
  return Span(u[:, :rank], s, rank, tolerance, member, random_level, bool(full), drift)


@compilation.once
def _svd(columns):
  return jnp.linalg.svd(columns, full_matrices=False)


def distances(basis, z) -> jax.Array:
  """δ(z) = ‖z − U Uᵀ z‖ / ‖z‖ for z (..., d) and U (d, r) with orthonormal columns: (...)."""
  residual = z - (z @ basis) @ basis.T
  return jnp.linalg.norm(residual, axis=-1) / jnp.maximum(jnp.linalg.norm(z, axis=-1),
                                                         jnp.finfo(z.dtype).tiny)


# --- reading a model: its attention blocks' inputs and gradients -----------------------------------


class _Enough(Exception):
  """Stops a forward pass once the wanted inputs are captured."""


def attention_inputs(apply_fn: Callable, variables, ids, count: int | None = None):
  """[(path, input (N, T, d))] of the model's self-attention blocks (Flax's
  ``MultiHeadDotProductAttention``) in the order the forward pass reaches them; ``count`` stops the
  pass after that many. ``path`` is the block's place in the parameter tree."""
  captured = []

  def inputs(call, proceed):
    if call.method == "__call__" and call.kind == taps.ATTENTION:
      captured.append((call.path, call.args[0]))
      if count is not None and len(captured) >= count:
        raise _Enough
    return proceed()

  try:
    with taps.intercept(inputs):
      apply_fn(variables, ids)
  except _Enough:
    pass
  return captured


def projection_gradient(gradient, path) -> np.ndarray:
  """(d, 3m): the query, key and value kernels' gradients of the attention block at ``path`` in the
  parameter tree, each reshaped (d, heads·head_dim), side by side."""
  node = gradient["params"] if "params" in gradient else gradient
  for key in path:
    node = node[key]
  kernels = [np.asarray(node[p]["kernel"]) for p in PROJECTIONS]  # on the host: no program each
  return np.concatenate([k.reshape(k.shape[0], -1) for k in kernels], axis=1)


def attention_paths(apply_fn: Callable, variables, length: int) -> list[tuple[str, ...]]:
  """The parameter paths of the model's attention blocks, in forward order (a shape-only trace)."""
  paths = []

  def trace():
    paths.extend(p for p, _ in attention_inputs(apply_fn, variables, jnp.zeros((1, length), jnp.int32)))

  jax.eval_shape(trace)
  return paths


def numerical_rank(vectors) -> int:
  """The rank of (n, d) ``vectors`` at the relative tolerance sqrt(eps) of their dtype (float32:
  3.5e-4 of the largest singular value): directions held only by rounding do not count."""
  vectors = np.asarray(vectors, np.float64)
  # σ² are the Gram matrix's eigenvalues; float64 resolves them far below the threshold's (1.2e-7)
  small = vectors.T if vectors.shape[0] > vectors.shape[1] else vectors
  s2 = np.linalg.eigvalsh(small @ small.T)[::-1]
  return int(np.sum(s2 > s2[0] * np.finfo(np.float32).eps)) if s2.size and s2[0] > 0 else 0


def candidate_dimensions(apply_fn: Callable, variables, length: int, key: jax.Array,
                         vocabulary: int) -> tuple[int, int, int]:
  """The dimensions of the spaces that the checked vectors occupy, read off random sentences: the
  first block's inputs, its attention outputs, the second block's inputs (0 where the model has no
  second block). Enough sentences for at least twice the widest space's vectors."""
  if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
    raise ValueError(f"sentence length must be a positive integer, got {length!r}")
  attention = attention_paths(apply_fn, variables, length)
  d = int(np.asarray(variables["params"]["embed"]["embedding"]).shape[1])
  count = -(-4 * d // length)
  ids = compilation.randint(key, (count, length), 0, vocabulary)
  captured = _hidden(apply_fn, variables, ids)
  flat = lambda x: np.asarray(x).reshape(count * length, -1)
  first = numerical_rank(flat(captured["input"][0]))
  output = numerical_rank(flat(captured["output"][0]))
  second = numerical_rank(flat(captured["input"][1])) if len(attention) > 1 else 0
  return first, output, second


@compilation.once(static_argnames=("apply_fn",))
def _hidden(apply_fn, variables, ids):
  """{"input": the first two attention blocks' inputs, "output": the first block's attention output
  (its output projection's input)} for the sentences ``ids``."""
  captured = {"input": [], "output": []}

  def hidden(call, proceed):
    if call.method == "__call__":
      if call.kind == taps.ATTENTION and len(captured["input"]) < 2:
        captured["input"].append(call.args[0])
      elif call.kind == taps.ATTENTION_OUTPUT and not captured["output"]:
        captured["output"].append(call.args[0])
    return proceed()

  with taps.intercept(hidden):
    apply_fn(variables, ids)
  return captured


# --- layer 1: which token can sit at which position --------------------------------------------------


@functools.partial(jax.jit, static_argnames=("apply_fn", "length", "chunk"))
def _first_layer(apply_fn, variables, basis, tokens, length, chunk):
  n = tokens.shape[0]
  padded = jnp.concatenate([tokens, jnp.full((-n % chunk,), tokens[0], tokens.dtype)])

  def one(block):
    ids = jnp.broadcast_to(block[:, None], (chunk, length))
    (_, z), = attention_inputs(apply_fn, variables, ids, count=1)
    return distances(basis, z)

  out = jax.lax.map(one, padded.reshape(-1, chunk))
  return out.reshape(-1, length)[:n]


def first_layer_distances(apply_fn: Callable, variables, basis, tokens, length: int,
                          chunk: int = 128) -> jax.Array:
  """δ of the first block's input for every candidate token at every position: (len(tokens), T).

  Token v's input at position t is read from the model on the sentence of v repeated T times, which
  holds only where that input depends on the token at t alone (embedding, position, LayerNorm), as in
  every zoo language model."""
  tokens = jnp.asarray(tokens, jnp.int32).reshape(-1)
  return _first_layer(apply_fn, variables, basis, tokens, int(length), int(min(chunk, tokens.size)))


# --- layer 2: sentences, position by position --------------------------------------------------------


class Recovery(NamedTuple):
  """Result of :func:`recover`.

  Attributes:
    sentences: (K, T) int, the distinct sentences found (K = N when every check holds); of a padded
      batch, :data:`gradjax.corpus.PAD` past each one's end.
    distances: (K,) the largest ordering distance along each sentence (a batch of one: the largest
      first-block distance of its nearest tokens, before :func:`settle`).
    position_sets: T int arrays, the tokens the first block admits at each position (a batch of
      one's open positions: their nearest, :data:`CANDIDATES` at most).
    spans: the :class:`Span` of the first block's input, then of the checks that order the tokens
      (the first block's attention output, the second block's input) where the model has them.
    stopped_at: the first position where no prefix could be extended, or None.
    capped: whether more prefixes than ``max_prefixes`` were admitted at some position (the least
      distant were kept).
    mini_batches: of a FedAvg update over mini-batches (:func:`recover_local`), those found in order;
      None otherwise.
    undetermined: of a batch of one, the positions whose nearest token is not :data:`SEPARATION`
      times nearer than the next and that :func:`settle` left open (their best token kept); None
      otherwise.
    residual: of a settled batch of one, its gradient's relative distance to the client's
      (:func:`settle`); None otherwise.
    unexplained: of a batch read by extension, the second block's span's rank less the distinct
      prefixes of the sentences found (each prefix is one input of that block): above 0, the span
      holds inputs that no sentence found gives (a sentence cut short where a check failed, or
      missed, or shorter than the others where ``padded`` was not given); below 0, the
      sentences found hold prefixes that are not inputs (a branch that passed the checks near their
      tolerance and ended; such branches far past the others' distance are dropped first); None
      otherwise (and of :func:`recover_local`, whose steps read several spans).
  """

  sentences: np.ndarray
  distances: np.ndarray
  position_sets: list
  spans: tuple
  stopped_at: int | None
  capped: bool
  mini_batches: int | None = None
  undetermined: np.ndarray | None = None
  residual: float | None = None
  unexplained: int | None = None


def output_gradient(gradient, path) -> jax.Array:
  """(heads·head_dim, d): the gradient of the output projection of the attention block at ``path``;
  its columns span the block's attention outputs (the projection's inputs)."""
  node = gradient["params"] if "params" in gradient else gradient
  for key in path:
    node = node[key]
  kernel = jnp.asarray(node["out"]["kernel"])
  return kernel.reshape(-1, kernel.shape[-1])


def _decoder(apply_fn):
  module = getattr(apply_fn, "module", None)
  if module is None or not hasattr(module, "decode"):
    return None
  return module.clone(decode=True)


def _node(tree, path):
  for key in path:
    tree = tree[key]
  return tree


@jax.jit
def output_distances(attention, keys, values, position, x, basis) -> jax.Array:
  """δ (P, S) of the first block's attention output at ``position`` t for each of P prefixes and S
  candidate tokens, the cheap check of :func:`recover`.

  The first block's input x (S, d) at t depends on the token alone, so its query, key and value are
  computed once per token; the prefixes' keys and values (P, T, heads, head_dim) are read from the
  decode cache (positions < t count). As Flax's ``MultiHeadDotProductAttention``: q = x W_q + b_q
  per head, a = softmax(q kᵀ / sqrt(head_dim)) over the prefix's t keys and the token's own, output
  o = Σ a v (heads·head_dim), the output projection's input. ``attention``: that block's parameters.
  """
  project = lambda name: (jnp.einsum("sd,dhk->shk", x, attention[name]["kernel"])
                          + attention[name].get("bias", 0.0))
  q, k, v = project("query"), project("key"), project("value")
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  before = jnp.einsum("shk,pjhk->pshj", q, keys)  # (P, S, heads, T)
  before = jnp.where(jnp.arange(keys.shape[1]) < position, before, -jnp.inf)
  own = jnp.broadcast_to(jnp.einsum("shk,shk->sh", q, k)[None, ..., None], before.shape[:-1] + (1,))
  a = jax.nn.softmax(jnp.concatenate([before, own], axis=-1), axis=-1)
  o = jnp.einsum("pshj,pjhk->pshk", a[..., :-1], values) + a[..., -1:] * v[None]
  return distances(basis, o.reshape(*o.shape[:2], -1))


@functools.partial(jax.jit, static_argnames=("apply_fn", "length"))
def _inputs_at(apply_fn, variables, tokens, length, position):
  """The first block's inputs (S, d) of ``tokens`` (S,) at ``position``."""
  ids = jnp.broadcast_to(tokens[:, None], (tokens.shape[0], length))
  (_, z), = attention_inputs(apply_fn, variables, ids, count=1)
  return jax.lax.dynamic_index_in_dim(z, position, axis=1, keepdims=False)


@functools.partial(jax.jit, static_argnames=("decoder",))
def _step(decoder, params, prefixes, rows, ids, basis):
  """One decoding step of candidates ``ids`` (n,) after the prefixes ``rows`` (n,) of the cache
  ``prefixes``: (second-block δ (n,), the candidates' caches).

  Once the second block's input is read, every later module call returns its input unchanged: the
  rest of the step (the second block, the logits) is not needed, and the first block's cache is
  already written (the zoo's blocks keep the width through every layer, so shapes still agree)."""
  captured = []

  def to_second_block(call, proceed):
    if len(captured) >= 2:
      return call.args[0]
    if call.method == "__call__" and call.kind == taps.ATTENTION:
      captured.append(call.args[0])
      if len(captured) >= 2:
        return call.args[0]
    return proceed()

  with taps.intercept(to_second_block):
    _, updated = decoder.apply({"params": params, "cache": _take(prefixes, rows)}, ids[:, None],
                               mutable=["cache"])
  return distances(basis, captured[1][:, 0]), updated["cache"]


def _init_cache(decoder, length, first):
  """The decoder's zero cache, batch 1, with only what the first block and the model's own position
  counter hold (the second block's is never written: :func:`_step` stops before it)."""
  shapes = jax.eval_shape(lambda: decoder.init(jax.random.key(0), jnp.zeros((1, length), jnp.int32)))
  cache = {k: v for k, v in shapes["cache"].items() if k == first[0] or not isinstance(v, dict)}
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)


def _take(cache, rows):
  return jax.tree.map(lambda c: c[rows] if c.ndim else c, cache)


def _bucket(n: int) -> int:
  return max(8, 1 << (n - 1).bit_length())


def _chunked(fn, rows, ids, chunk):
  """``fn(rows, ids)`` over chunks of at most ``chunk`` candidates, each padded to a power of two
  (one program per size): the concatenated first outputs (n,), and the list of other outputs."""
  size = min(chunk, _bucket(len(ids)))
  delta, rest = [], []
  for lo in range(0, len(ids), size):
    r, i = rows[lo:lo + size], ids[lo:lo + size]
    out = fn(jnp.asarray(np.pad(r, (0, size - len(r)))),
             jnp.asarray(np.pad(i, (0, size - len(i)), constant_values=i[0])))
    d, extra = (out, None) if not isinstance(out, tuple) else out
    delta.append(np.asarray(d)[:len(r)])
    rest.append(extra)
  return np.concatenate(delta), rest


# --- encoders: whole sentences against the second block ---------------------------------------------

SWEEPS = 10
"""The most passes over the positions of a search (:func:`_search`); one that changes no token ends it."""


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def sentence_distances(apply_fn: Callable, variables, basis, x) -> jax.Array:
  """δ (N, T) of the second block's input at every position of ``x``: ids (N, T), or input embeddings
  (N, T, d) that the model adds its positions to, against the span ``basis`` (d, r)."""
  (_, z), = attention_inputs(apply_fn, variables, x, count=2)[1:]
  return distances(basis, z)


def context_distances(apply_fn: Callable, variables, basis, sets, length: int,
                      chunk: int = 128) -> list[np.ndarray]:
  """For each position t, δ at t of the second block's input for each token v of ``sets[t]``
  placed at t, every other position holding the mean embedding of the tokens in ``sets``: a
  sentence's context averaged over the batch's words. (len(sets[t]),) per position.

  A freshly initialised encoder's attention is nearly uniform, so the second block's input at t is
  about F(x_t, mean of the sentence's inputs): a token that some sentence holds at t lands within
  the context's mismatch of the span, a token that none holds there adds its own mismatch on top
  (on the zoo's BERT-base-width ``bert``: 0.04-0.05 against 0.13 or more)."""
  table = jnp.asarray(variables["params"]["embed"]["embedding"])
  mean = table[np.unique(np.concatenate(sets))].mean(axis=0)
  pairs = np.concatenate([np.stack([np.full(len(s), t), s], 1) for t, s in enumerate(sets)])
  out = np.zeros(len(pairs))
  for lo in range(0, len(pairs), chunk):
    part = pairs[lo:lo + chunk]
    padded = np.pad(part, ((0, chunk - len(part)), (0, 0)), mode="edge")
    x = jnp.broadcast_to(mean, (chunk, length, mean.shape[0]))
    x = x.at[np.arange(chunk), padded[:, 0]].set(table[padded[:, 1]])
    d = np.asarray(sentence_distances(apply_fn, variables, basis, x))
    out[lo:lo + len(part)] = d[np.arange(len(part)), part[:, 0]]
  split = np.cumsum([len(s) for s in sets])[:-1]
  return np.split(out, split)


def _descend(apply_fn, variables, basis, candidates, x, tolerance):
  """Coordinate descent from the sentences ``x`` (S, T): each position t in turn takes the candidate
  (``candidates`` (T, k)) whose second-block input at t lies nearest the span (δ_t: the token that
  agrees best with the rest of the sentence); a sentence stops when a pass over its positions
  changes nothing or its every δ is within ``tolerance`` (at most :data:`SWEEPS` passes).
  (sentences (S, T), their largest δ (S,)).

  On the zoo's encoder (:func:`_encoder_block`) δ_t of every candidate is computed from position t's
  query alone, the other positions' keys and values shared (:func:`position_distances`); otherwise
  from the whole sentence's forward pass."""
  length, k = candidates.shape
  x = np.array(x, np.int32)
  worst = lambda rows: np.asarray(sentence_distances(
      apply_fn, variables, basis, jnp.asarray(_pad_rows(rows)))).max(axis=1)[:len(rows)]
  block = _encoder_block(apply_fn, variables)
  if block is not None:  # every candidate's first-block input at its position (T, k, d), once
    inputs = jnp.stack([_inputs_at(apply_fn, variables, jnp.asarray(candidates[t]), length, t)
                        for t in range(length)])
    # a sentence's first-block inputs are its tokens' rows of that table (each input depends on its
    # own token and position only)
    index = np.stack([np.argmax(candidates[t][None] == x[:, t, None], axis=1)
                      for t in range(length)], axis=1)
  active = np.flatnonzero(worst(x) > tolerance)
  for _ in range(SWEEPS):
    if active.size == 0:
      break
    changed = np.zeros(len(x), bool)
    for t in range(length):
      rows = x[active]
      if block is not None:
        z = inputs[np.arange(length), _pad_rows(index[active])]
        d = np.asarray(position_distances(block, z, t, inputs[t], basis))[:len(rows)]
      else:
        trial = np.repeat(rows[:, None], k, axis=1)
        trial[:, :, t] = candidates[t]
        d = np.asarray(sentence_distances(apply_fn, variables, basis,
                                          jnp.asarray(_pad_rows(trial.reshape(-1, length)))))
        d = d[:len(rows) * k].reshape(len(rows), k, length)[:, :, t]
      choice = np.argmin(d, axis=1)
      best = candidates[t][choice]
      changed[active] |= best != rows[:, t]
      x[active, t] = best
      if block is not None:
        index[active, t] = choice
    active = active[changed[active]]
    active = active[worst(x[active]) > tolerance] if active.size else active
  return x, worst(x)


def _encoder_block(apply_fn, variables):
  """The first block's parameters where the model is the zoo's post-norm encoder
  (:class:`gradjax.models.bert.BERT`), whose block :func:`position_distances` computes; else None."""
  if not isinstance(getattr(apply_fn, "module", None), bert.BERT):
    return None
  return variables["params"]["block_0"]


@jax.jit
def position_distances(block, x, position, candidates, basis) -> jax.Array:
  """δ (S, k) of the second block's input at ``position`` t, for each of S sentences whose first-
  block inputs are ``x`` (S, T, d) with t's input replaced by each of k ``candidates`` (k, d).

  The zoo's post-norm block (:class:`gradjax.models.bert.Block`; ``block``: its parameters) at
  one position: with q, k, v = z W + b per head (Flax's ``MultiHeadDotProductAttention``), the
  attention of t's query over the sentence's keys, the candidate's own key and value at t,
  a = softmax(q kᵀ / sqrt(head_dim)), o = Σ a v; h = LN_0(c + o W_o + b_o), z = LN_1(h + FFN(h)),
  LayerNorm with ε = 1e-5 and GELU (erf) as the block has them. Position t's output alone costs
  one token's block and the sentence's keys and values, which the k candidates share."""
  attention = block["attention"]
  project = lambda name, z: (jnp.einsum("...d,dhk->...hk", z, attention[name]["kernel"])
                             + attention[name]["bias"])
  keys, values = project("key", x), project("value", x)  # (S, T, heads, head_dim)
  q, k, v = project("query", candidates), project("key", candidates), project("value", candidates)
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("chk,sjhk->schj", q, keys)  # (S, k, heads, T)
  own = jnp.broadcast_to(jnp.einsum("chk,chk->ch", q, k)[None], logits.shape[:-1])
  logits = logits.at[..., position].set(own)
  a = jax.nn.softmax(logits, axis=-1)
  o = (jnp.einsum("schj,sjhk->schk", a, values)
       + a[..., position, None] * (v[None] - values[:, None, position]))
  out = jnp.einsum("schk,hkd->scd", o, attention["out"]["kernel"]) + attention["out"]["bias"]

  def norm(z, p):
    mean = z.mean(-1, keepdims=True)
    var = jnp.square(z - mean).mean(-1, keepdims=True)
    return (z - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

  h = norm(candidates[None] + out, block["norm_0"])
  f = jax.nn.gelu(h @ block["ffn_0"]["kernel"] + block["ffn_0"]["bias"], approximate=False)
  z = norm(h + f @ block["ffn_1"]["kernel"] + block["ffn_1"]["bias"], block["norm_1"])
  return distances(basis, z)


def _pad_rows(rows):
  """``rows`` (n, T) padded to a power of two by repeating the last (one program per bucket)."""
  return np.pad(rows, ((0, _bucket(len(rows)) - len(rows)), (0, 0)), mode="edge")


def _search(apply_fn, variables, second: Span, sets, length, first: Span, chunk, rounds: int = 3):
  """The sentences of a bidirectional model's batch (see :func:`recover`): N = round(r / T) sentences
  (each holds T of the second span's r directions); each position keeps the N tokens of its first-
  layer set nearest to the span in an averaged context (:func:`context_distances`). Sentences come
  from coordinate descent (:func:`_descend`), which settles on the sentence that most of its start's
  tokens come from, or stops short of it where no single token's change lowers its δ. Each
  round starts 2 M + 2 descents for the M sentences still missing, each position drawn among the
  kept tokens that no sentence found holds there and that lie as near as those held (so that the
  missing sentences make up the start), else among the held ones; the sentences that pass the
  second block's check (δ ≤ τ at every position) are kept, until N are found or ``rounds`` rounds
  in a row find none; :class:`Unreadable`, with the position sets, where none is found."""
  count = max(1, int(round(second.rank / length)))
  proxy = context_distances(apply_fn, variables, second.basis, sets, length, max(8, chunk // 4))
  order = [np.argsort(p, kind="stable")[:count] for p in proxy]
  # A position whose set holds fewer than N tokens repeats them (all N sentences hold one of them).
  kept = np.stack([np.resize(s[o], count) for s, o in zip(sets, order)]).astype(np.int32)
  near = [np.resize(p[o], count) for p, o in zip(proxy, order)]  # the kept tokens' context distances
  rng = np.random.default_rng(0)
  found, worst, idle = [], [], 0
  while len(found) < count and idle < rounds:
    starts = np.empty((2 * (count - len(found)) + 2, length), np.int32)
    for t in range(length):
      held = np.isin(kept[t], [f[t] for f in found])
      # a missing sentence holds at t a token no sentence found holds there and as near as those
      # they hold (a true token, not an extra kept at a position whose sentences share tokens), or
      # one of theirs
      free = ~held & (near[t] <= near[t][held].max() if held.any() else True)
      starts[:, t] = rng.choice(kept[t][free] if free.any() else kept[t][held], len(starts))
    x, d = _descend(apply_fn, variables, second.basis, kept, starts, second.tolerance)
    before = len(found)
    for row, dist in zip(x, d):
      if dist <= second.tolerance and not any((row == f).all() for f in found):
        found.append(row)
        worst.append(dist)
    idle = 0 if len(found) > before else idle + 1
  if not found:
    raise Unreadable(
        f"the search against the second block's span found none of the batch's {count} sentences "
        f"(its descents settled on mixtures of them): layer 1 gives each position's candidate "
        f"tokens ({min(map(len, sets))} to {max(map(len, sets))} a position), not their sentences",
        sets)
  sentences = np.asarray(found, np.int32).reshape(-1, length)
  return Recovery(sentences, np.asarray(worst), sets, (first, second), None, False)


def recover(apply_fn: Callable, variables, gradient, *, length: int, tokens=None,
            max_prefixes: int | None = None, rank: int | None = None, chunk: int = 512,
            drift: bool = False, eos: int | None = None, padded: bool = False) -> Recovery:
  """The client's sentences (K, ``length``) from the gradient of a transformer language model.

  Args:
    apply_fn: the language model (a zoo text model: ``apply_fn.module`` with a ``decode`` mode).
    variables: the parameters the client received.
    gradient: the client's gradient (same tree as ``variables``).
    length: T, tokens per sentence.
    tokens: candidate token ids (all of the vocabulary if None), e.g. the bag that an untied embedding
      gradient shows (:func:`gradjax.text.token_bag`).
    max_prefixes: the most prefixes kept at a position (the least distant), default 4 x the second
      span's rank.
    rank: the spans' rank (read from their singular values if None).
    chunk: candidates per decoding step (memory: chunk x T x d x 2 floats of cache).
    drift: the gradient is a FedAvg update of several local steps over the same sentences (the spans
      read as :func:`span` says); the sentences are those of the first step, the received model's.
    eos: of a next-token model's client (targets the sentence shifted by one, ``eos`` last), the
      end token: a batch of one's undetermined positions (at most :data:`MOST_OPEN` of them) are
      then settled by the whole gradient (:func:`settle`). None (a masked language model, whose
      targets are unknown): left open.
    padded: the client's sentences may be shorter than ``length``, padded on the right with no loss
      past their ends (:func:`gradjax.corpus.language_model_pairs`). A causal model's positions
      past a sentence's end reach neither the loss nor, through the causal mask, its own positions:
      they leave no row in any span, so the sentences are read by extension alone, and a prefix
      that no token extends is a whole sentence (its last input, whose target is the end token, is
      in the spans). Found sentences hold :data:`gradjax.corpus.PAD` past their ends. A sentence
      that is a prefix of another of the batch is not told apart from the longer one's prefix: the
      sentences found lack it (fewer than the batch, with nothing ``unexplained``), and
      :func:`complete` finds it from the whole gradient. Needs a model with a ``decode`` mode
      and two blocks; a bidirectional model's padding is masked in its attention, which the zoo's
      encoders do not take.

  Raises :class:`Unreadable` (a ValueError) where a span cannot separate its members.

  Sentences grow position by position (a causal model with a ``decode`` mode): each prefix extended
  by each token of the position's set is first checked against the first block's attention-output
  span (the query, key and value of one position: cheap), and the survivors against the second
  block's input span (the whole first block). A batch of one (the first span's rank read at most T)
  is answered by layer 1 alone, in the span of the top T directions, for every model
  (:func:`_one_sentence`: a trained model's weakest positions can fall past the largest gap). An
  encoder's batch of several sentences is searched whole against the second block's span (module
  docstring, "Encoders"); a one-block model's raises :class:`Unreadable` with the position sets.
  """
  _check_gradient(gradient)
  check_length(gradient, length, padded)
  attention = attention_paths(apply_fn, variables, length)
  if not attention:
    raise ValueError("the model has no self-attention block: the span attack reads a transformer")
  if padded and (_decoder(apply_fn) is None or len(attention) < 2):
    raise ValueError("the span attack reads a padded batch by extension, which needs a causal model "
                     "with a decode mode and at least two blocks (gpt, transformer)")
  vocabulary = _vocabulary_size(variables)
  if tokens is not None and not np.issubdtype(np.asarray(tokens).dtype, np.integer):
    raise ValueError(f"candidate token ids must be integers, got {np.asarray(tokens).dtype}")
  tokens = np.unique(np.arange(vocabulary) if tokens is None else np.asarray(tokens)).astype(np.int32)
  if tokens.size == 0 or tokens[0] < 0 or tokens[-1] >= vocabulary:
    raise ValueError(f"candidate token ids must be non-empty and lie in [0, {vocabulary})")
  if eos is not None and (isinstance(eos, bool) or not isinstance(eos, (int, np.integer))
                          or not 0 <= eos < vocabulary):
    raise ValueError(f"eos must be a token id in [0, {vocabulary}), got {eos!r}")
  dimensions = candidate_dimensions(apply_fn, variables, length, compilation.prng_key(0), vocabulary)
  columns = projection_gradient(gradient, attention[0])
  first = span(columns, rank, dimensions[0], drift=drift)
  if rank is None and not drift and not padded and first.rank <= length < dimensions[0]:
    try:
      one = _one_sentence(apply_fn, variables, columns, tokens, length, dimensions[0])
    except Unreadable:
      if not first.full:
        raise
    else:
      if eos is None or not 0 < one.undetermined.size <= MOST_OPEN * length:
        return one
      sentence, residual = settle(apply_fn, variables, gradient, one.sentences[0],
                                  {int(t): one.position_sets[t] for t in one.undetermined}, eos=eos)
      return one._replace(sentences=sentence[None],
                          undetermined=one.undetermined[:0] if residual <= SETTLED else one.undetermined,
                          residual=residual)
  if first.full:  # (where it was read as one sentence too, no position separated)
    raise Unreadable(_unusable("first block's input", first, dimensions[0]))
  delta = np.asarray(first_layer_distances(apply_fn, variables, first.basis, tokens, length))
  sets = [tokens[delta[:, t] <= first.tolerance] for t in range(length)]
  if rank is None and not drift and _hole(sets, padded) is not None:
    for wider in _wider_ranks(first):  # inputs weighted near the rounding: a later gap, if any
      candidate = span(columns, wider, dimensions[0])
      if candidate.full:
        break
      d = np.asarray(first_layer_distances(apply_fn, variables, candidate.basis, tokens, length))
      wider_sets = [tokens[d[:, t] <= candidate.tolerance] for t in range(length)]
      if _hole(wider_sets, padded) is None:
        first, delta, sets = candidate, d, wider_sets
        break
  if (t := _hole(sets, padded)) is not None:
    return Recovery(np.zeros((0, length), np.int32), np.zeros(0), sets, (first,), t, False)
  decoder = _decoder(apply_fn)
  if len(attention) < 2:  # several sentences' (token, position) pairs and nothing to order them by
    raise Unreadable(
        f"the span attack orders a batch of several sentences (the first block's span has rank "
        f"{first.rank} > {length} positions) against the second block's span, which a one-block "
        f"model does not have: layer 1 gives each position's candidate tokens "
        f"({min(map(len, sets))} to {max(map(len, sets))} a position), not their sentences", sets)
  if decoder is None:  # bidirectional: no prefix to extend, whole sentences checked
    second = span(projection_gradient(gradient, attention[1]), rank, dimensions[2], drift=drift)
    if second.full:
      raise Unreadable(_unusable("second block's input", second, dimensions[2]), sets)
    return _search(apply_fn, variables, second, sets, length, first, chunk)
  output = span(output_gradient(gradient, attention[0]), rank, dimensions[1], drift=drift)
  second = span(projection_gradient(gradient, attention[1]), rank, dimensions[2], drift=drift)
  if second.full:
    raise Unreadable(_unusable("second block's input", second, dimensions[2]), sets)
  return _extend(apply_fn, variables, decoder, (first, output, second), sets, length, max_prefixes,
                 attention[0], chunk, padded)


def _check_gradient(gradient) -> None:
  """A one-line ValueError where ``gradient`` is a whole observation, not its gradient tree."""
  if isinstance(gradient, Observation):
    raise ValueError("pass the observation's gradient tree (observation.gradient), not the "
                     "observation")


def check_length(gradient, length: int, padded: bool | None = None) -> None:
  """A one-line ValueError where the gradient's learned positions (:func:`positions_moved`) say the
  client's sentences are not ``length`` tokens: longer (the attack would read their first
  ``length``), or, unless ``padded``, all shorter (the positions past them hold no token, so no
  sentence of ``length`` tokens explains the gradient). ``padded`` None: the caller reads no padded
  batch (the message does not offer one)."""
  moved = positions_moved(gradient)
  if moved is not None and moved > length:
    raise ValueError(f"the gradient's learned position table moved at {moved} positions: the "
                     f"client's sentences hold up to {moved} tokens, more than length={length}")
  if moved is not None and moved < length and not padded:
    padding = "" if padded is None else (f", or padded=True if shorter sentences were padded to "
                                         f"{length}")
    raise ValueError(f"the gradient's learned position table moved at {moved} positions only: the "
                     f"client's longest sentence holds {moved} tokens, fewer than length={length} "
                     f"(pass length={moved}{padding})")


def positions_moved(gradient) -> int | None:
  """How many positions of a learned position table (a top-level ``positions`` leaf of the
  parameters, (context, dim): gpt, bert) the gradient moved, to its last nonzero row: the longest
  sentence's length (a position past every sentence reaches no loss). None without such a table, or
  where every row moved (noise on the update)."""
  tree = gradient.get("params", gradient) if hasattr(gradient, "get") else {}
  table = tree.get("positions") if hasattr(tree, "get") else None
  if table is None or np.ndim(table) != 2:
    return None
  rows = np.flatnonzero(np.any(np.asarray(table) != 0, axis=1))
  if rows.size == 0 or rows[-1] + 1 == np.shape(table)[0]:
    return None
  return int(rows[-1]) + 1


def _hole(sets, padded: bool) -> int | None:
  """The first position whose set of tokens is empty where a sentence must hold one, or None: any
  empty position; of a padded batch, one before the last position that holds a token (the positions
  past the longest sentence hold none)."""
  empty = [s.size == 0 for s in sets]
  if padded and not all(empty):
    empty = empty[:max(t for t, e in enumerate(empty) if not e) + 1]
  return next((t for t, e in enumerate(empty) if e), None)


def recover_local(apply_fn: Callable, variables, update, *, length: int, local, num_samples: int,
                  eos: int, max_norm: float | None = None, **kwargs) -> Recovery:
  """The client's sentences from a FedAvg update W_0 − W_E of local SGD over mini-batches.

  Step s of the first epoch trains on mini-batch s at weights W_s, so its inputs lie in the update's
  span as computed from W_s (:func:`recover` with ``drift``), not from the W_0 the server sent. The
  mini-batches are found in order: from W_0 the first one's b sentences; then W_1 by replaying the
  client's first step on them (:func:`gradjax.clients.local_sgd`, its learning rate, momentum and
  loss as ``local`` says, the next-token targets ending in ``eos``), from W_1 the second's (the
  sentences found before set aside; of more than b new ones, the b nearest), and so on; later epochs
  repeat the same mini-batches. Stops where a step finds fewer than b new sentences, since the next
  weights would then be unknown.

  Args:
    apply_fn, variables, length: as :func:`recover`; ``update``: the client's W_0 − W_E (same tree as
      ``variables``).
    local: the client's :class:`gradjax.clients.LocalTraining` (the threat model reveals it).
    num_samples: n, the client's sentences.
    eos: the token id that ends every target sequence.
    max_norm: the client's steps are DP-SGD's with this clipping bound (each sentence's gradient
      clipped, :func:`gradjax.clients.clipped_gradient`), and are replayed so; their noise, if
      any, cannot be.
    kwargs: passed to :func:`recover` (``tokens``, ``max_prefixes``, ``rank``, ``chunk``).

  Returns:
    :class:`Recovery` with the sentences in training order (mini-batch by mini-batch), the spans and
    ``stopped_at`` of the last step read, and ``mini_batches`` found.
  """
  b = local.batch_size or num_samples
  steps = num_samples // b
  found = np.zeros((0, length), np.int32)
  worst = np.zeros(0)
  rec = None
  drift = local.steps(num_samples) > 1
  for s in range(steps):
    if s == 0:
      params = variables["params"]
    else:  # W_s: the client's first s steps, replayed on the mini-batches found so far
      x, y = corpus.language_model_pairs(found, eos)
      replay = clients.LocalTraining(1, b, local.learning_rate, local.momentum)
      params = clients.local_sgd(apply_fn, variables, jnp.asarray(x), jnp.asarray(y), replay,
                                 dp_sgd=None if max_norm is None else clients.DPSGD(max_norm))
    rec = recover(apply_fn, {**variables, "params": params}, update, length=length, drift=drift,
                  **kwargs)
    new = np.asarray([i for i, row in enumerate(rec.sentences.tolist())
                      if not any(row == f for f in found.tolist())], np.int64)
    if new.size < b:
      return rec._replace(sentences=found, distances=worst, mini_batches=s, unexplained=None)
    # Later mini-batches' inputs at W_s lie near the span too (their own steps' inputs drift from
    # them); this step's own are in it up to rounding: the b nearest.
    new = new[np.argsort(rec.distances[new], kind="stable")[:b]]
    found = np.concatenate([found, rec.sentences[new]]).astype(np.int32)
    worst = np.concatenate([worst, rec.distances[new]])
  return rec._replace(sentences=found, distances=worst, mini_batches=steps, unexplained=None)


def masked_targets(apply_fn: Callable, variables, gradient, inputs, mask: int
                   ) -> tuple[np.ndarray, float]:
  """The targets of a masked language model's client whose inputs are known (found by
  :func:`recover`), read from its gradient (see the module docstring).

  Args:
    apply_fn, variables: the model (a zoo ``bert``: ``output_bias`` and the ``transform`` Dense).
    gradient: the client's gradient (same tree as ``variables``), mean cross entropy over the masked
      positions (:func:`gradjax.corpus.masked_lm_pairs`).
    inputs: (N, T) int, the client's inputs, ``mask`` where it masked.
    mask: the ``<mask>`` id.

  Returns:
    (targets (N, T) int, -1 where the input is not ``mask``; the relative residual
    ‖Σ_m u_m ⊗ g_(m, y_m) − ∇W_t‖ / ‖∇W_t‖ of the transform kernel's gradient, each sentence's
    terms scaled by a fitted factor where the counts were read scaled (:func:`_placed`), ~1e-6 when
    the targets are the client's).

  Raises :class:`Unreadable` where the inputs hold no ``mask`` or the bias gradient does not count
  M labels (the inputs are not the client's, or the update was defended).
  """
  inputs = np.asarray(inputs, np.int32)
  where = np.argwhere(inputs == mask)
  m = len(where)
  if m == 0:
    raise Unreadable("the inputs found hold no <mask>: nothing for a masked language model's "
                     "targets to fill")
  node = gradient["params"] if "params" in gradient else gradient
  if "output_bias" not in node or "transform" not in node:
    raise ValueError("masked_targets reads a zoo 'bert' (params output_bias and transform)")
  logits = np.asarray(apply_fn(variables, jnp.asarray(inputs)), np.float64)[where[:, 0], where[:, 1]]
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  bias = np.asarray(node["output_bias"], np.float64)
  counts = p.sum(axis=0) - m * bias
  rounded = np.rint(counts)
  integral = not (rounded.min() < 0 or rounded.sum() != m or np.abs(counts - rounded).max() > 0.1)
  target = np.asarray(node["transform"]["kernel"], np.float64)
  place = functools.partial(_placed, apply_fn, variables, inputs, where, target)
  labels = residual = None
  if integral:
    labels, residual = place(np.flatnonzero(rounded).astype(np.int32), rounded)
  if residual is None or residual > SCALED_FALLBACK:
    # Each sentence's terms scaled by its own factor (DP-SGD's clipping; its weighted counts can
    # also fall near integers), or the inputs are not the client's.
    bag = _scaled_bag(p, where[:, 0], bias, m)
    scaled = None if bag is None else place(bag, None)
    if scaled is not None and (residual is None or scaled[1] < residual):
      labels, residual = scaled
  if labels is None:
    raise Unreadable(f"the output bias's gradient does not count the {m} masked labels (largest "
                     f"distance of a count to an integer {np.abs(counts - rounded).max():.2f}), "
                     "nor with a scale of each sentence's own")
  targets = np.full(inputs.shape, -1, np.int32)
  targets[where[:, 0], where[:, 1]] = labels
  return targets, float(residual)


# A residual above this, of the targets the integer counts placed, tries the scaled reading too.
SCALED_FALLBACK = 1e-4


def _placed(apply_fn, variables, inputs, where, target, bag, counts):
  """(labels (M,), residual) of the M masked rows (``where``) placed among the labels ``bag`` by the
  transform kernel's gradient ``target`` (module docstring): with integer ``counts`` (V,), the
  assignment that respects them, the residual ‖Σ_m u_m ⊗ g_(m, y_m) − ∇W_t‖ / ‖∇W_t‖; with None
  (each sentence scaled by its own factor), each row's largest weight, the residual with the
  sentences' scales α fitted, ‖Σ_n α_n Σ_(m in n) u_m ⊗ g_(m, y_m) − ∇W_t‖ / ‖∇W_t‖. None where
  a fitted scale is not positive."""
  m = len(where)
  u, g = (np.asarray(a, np.float64) for a in _transform_factors(
      apply_fn, variables, jnp.asarray(inputs), jnp.asarray(where[:, 0]), jnp.asarray(where[:, 1]),
      jnp.asarray(bag), m))
  # ∇W_t = Σ_m u_m ⊗ G_m with G_m = Σ_l A_ml g_ml: G from the inputs u, then each row's weights A_m
  rows_g = np.linalg.lstsq(u.T, target, rcond=None)[0]
  weights = np.stack([np.linalg.lstsq(g[i].T, rows_g[i], rcond=None)[0] for i in range(m)])
  if counts is not None:
    slots = np.repeat(np.arange(len(bag)), counts[bag].astype(int))  # one slot per label occurrence
    from scipy.optimize import linear_sum_assignment
    rows, cols = linear_sum_assignment(-weights[:, slots])
    labels = bag[slots[cols[np.argsort(rows)]]]
  else:  # a row's weights are its sentence's scale on its label: no counts to respect
    labels = bag[np.argmax(weights, axis=1)]
  chosen = g[np.arange(m), np.searchsorted(bag, labels)]
  fitted = u.T @ chosen
  if counts is None:
    parts = [u[where[:, 0] == n].T @ chosen[where[:, 0] == n] for n in np.unique(where[:, 0])]
    alpha = np.linalg.lstsq(np.stack([q.ravel() for q in parts], 1), target.ravel(), rcond=None)[0]
    if np.any(alpha <= 0):
      return None
    fitted = sum(a * q for a, q in zip(alpha, parts))
  residual = np.linalg.norm(fitted - target) / max(np.linalg.norm(target), np.finfo(np.float64).tiny)
  return labels, float(residual)


def _scaled_bag(p: np.ndarray, sentence: np.ndarray, bias: np.ndarray, m: int) -> np.ndarray | None:
  """The labels of M masked rows whose sentences' terms are scaled each by its own unknown factor
  (DP-SGD clips each sentence's gradient): M ∇b = Σ_n α_n (P_n − c_n), P_n the sum of sentence n's
  rows of ``p`` (M, V), c_n its label counts, α_n its scale (1 unclipped). Off the labels,
  M ∇b = Σ_n α_n P_n, which gives α by least squares; the weighted counts r = Σ_n α_n P_n − M ∇b
  are then Σ_n α_n c_n: positive on the labels, 0 elsewhere. The labels are those of the M + 1
  largest entries of r that exceed ten times the largest magnitude past them (no label is: there
  are at most M), the fit repeated without them until they stop changing; the first fit leaves out
  the M most negative entries of ∇b, where the labels' are. None where none exceeds it, or a scale
  is not positive."""
  if p.shape[1] <= m + 1:
    return None
  sentences = np.unique(sentence)
  total = np.stack([p[sentence == n].sum(axis=0) for n in sentences], axis=1)  # (V, N)
  keep = np.ones(p.shape[1], bool)
  keep[np.argsort(bias)[:m]] = False
  bag = None
  for _ in range(10):
    alpha = np.linalg.lstsq(total[keep], m * bias[keep], rcond=None)[0]
    r = total @ alpha - m * bias
    ranked = np.argsort(r)[::-1]
    floor = np.abs(r[ranked[m + 1:]]).max()  # past the M + 1 largest: no label (at most M)
    found = np.sort(ranked[:m + 1][r[ranked[:m + 1]] > 10 * floor]).astype(np.int32)
    if found.size == 0:
      return None
    if bag is not None and np.array_equal(found, bag):
      return bag if np.all(alpha > 0) else None
    bag, keep = found, np.ones(p.shape[1], bool)
    keep[bag] = False
  return None


@compilation.once(static_argnames=("apply_fn", "m"))
def _transform_factors(apply_fn, variables, inputs, rows, cols, bag, m):
  """The transform kernel's gradient of −(1/m) log p_(m')[l] is u_(m') ⊗ g_(m', l): the Dense's input
  u at the masked position m' and the loss's gradient at its output. (u (M, d), g (M, L, d)) for the
  M masked positions (``rows``, ``cols``) and the L labels ``bag``; the head works position by
  position, so one backward pass through it gives every position's g for a label."""
  captured = []

  def forward(delta):
    def shifted(call, proceed):
      out = proceed()
      if call.method == "__call__" and call.name == "transform":
        captured.append(call.args[0])
        return out + delta
      return out

    with taps.intercept(shifted):
      return apply_fn(variables, inputs)

  kernel = variables["params"]["transform"]["kernel"]
  logits, backward = jax.vjp(forward, jnp.zeros(inputs.shape + (kernel.shape[1],), kernel.dtype))
  p = jax.nn.softmax(logits[rows, cols], axis=-1)

  def per_label(label):
    seed = (p - jax.nn.one_hot(label, p.shape[-1], dtype=p.dtype)) / m
    return backward(jnp.zeros_like(logits).at[rows, cols].set(seed))[0][rows, cols]

  return captured[0][rows, cols], jnp.swapaxes(jax.lax.map(per_label, bag), 0, 1)


def _one_sentence(apply_fn, variables, columns, tokens, length, dimension) -> Recovery:
  """A batch of one sentence (the first span's rank read at most T): its T first-block inputs are
  distinct (each holds its position), so the span has rank T exactly, and the directions past the
  largest gap that a trained model's weakly weighted positions leave near the rounding belong to it.
  Each position takes its nearest token in the top-T span; a position whose next nearest token is
  less than :data:`SEPARATION` times farther is kept but ``undetermined``, its set the tokens within
  :data:`SEPARATION` times the nearest's distance (at most :data:`CANDIDATES`, the nearest). Raises
  :class:`Unreadable` where no position is determined."""
  s = span(columns, length, dimension)
  delta = np.asarray(first_layer_distances(apply_fn, variables, s.basis, tokens, length))
  order = np.argsort(delta, axis=0, kind="stable")
  positions = np.arange(length)
  nearest = delta[order[0], positions]
  runner = delta[order[1], positions] if len(tokens) > 1 else np.full(length, np.inf)
  undetermined = np.flatnonzero(runner < SEPARATION * nearest)
  sets = [tokens[delta[:, t] <= max(s.tolerance, nearest[t])] for t in positions]
  for t in undetermined:
    near = order[:CANDIDATES, t]
    sets[t] = tokens[near[delta[near, t] <= SEPARATION * nearest[t]]]
  if undetermined.size == length:
    raise Unreadable(
        "the span attack cannot read this update: read as one sentence (the first block's span has "
        f"rank {s.rank} <= {length} positions), no position's nearest token is {SEPARATION:g}x "
        "nearer than the next", sets)
  return Recovery(tokens[order[0]][None].astype(np.int32), np.asarray([nearest.max()]), sets, (s,),
                  None, False, undetermined=undetermined)


def settle(apply_fn: Callable, variables, gradient, sentence, candidates: dict, *, eos: int,
           sweeps: int = 8) -> tuple[np.ndarray, float]:
  """A sentence whose next-token gradient is nearest the client's, by coordinate descent over the
  open positions: each position of ``candidates`` in turn takes the token of its set whose sentence
  (the others held) gives the least relative residual ‖∇θ L(s) − g‖ / ‖g‖, then the best exchanges
  of two open positions' tokens are made while they lower it (the first block's span cannot tell a
  position's token from another position's nearby), until a sweep changes nothing or ``sweeps``
  have run. The residual is about float32's rounding (1e-6) for the client's own sentence;
  coordinate descent can stop short of it where several open positions interact.

  Args:
    apply_fn, variables: the language model, as :func:`recover`'s.
    gradient: the client's gradient g (same tree as ``variables["params"]``).
    sentence: (T,) int, the start (each position's nearest token).
    candidates: {position: int ids}, the open positions' sets.
    eos: the end token of the targets (the sentence shifted by one, ``eos`` last).
    sweeps: the most passes over the open positions.

  Returns:
    (the sentence (T,) int, its residual).
  """
  sentence = np.array(sentence, np.int32)
  size = max(len(c) for c in candidates.values())
  open_ = sorted(candidates)
  pairs = [(a, b) for i, a in enumerate(open_) for b in open_[i + 1:]]
  if isinstance(gradient, dict) and "params" in gradient:  # the tree of ``variables``
    gradient = gradient["params"]

  def residuals(trial):  # (K, T) sentences -> (K,)
    return np.array(_residuals(apply_fn, variables, gradient, jnp.asarray(trial), eos))
  best = float(residuals(sentence[None])[0])
  for _ in range(sweeps):
    changed = False
    for t, ids in candidates.items():
      ids = np.asarray(ids, np.int32)
      trial = np.repeat(sentence[None], size, axis=0)  # past len(ids): the sentence itself
      trial[:len(ids), t] = ids
      r = residuals(trial)[:len(ids)]
      k = int(np.argmin(r))
      if r[k] < best and ids[k] != sentence[t]:
        sentence[t], best, changed = ids[k], float(r[k]), True
    for _ in range(len(pairs)):  # two open positions exchanging their tokens: no single change
      trial = np.repeat(sentence[None], len(pairs), axis=0)
      for row, (a, b) in enumerate(pairs):
        trial[row, [a, b]] = sentence[[b, a]]
      r = residuals(trial)  # every pair, so one program: an exchange of equal tokens is no step
      r[[sentence[a] == sentence[b] for a, b in pairs]] = np.inf
      k = int(np.argmin(r))
      if r[k] >= best:
        break
      sentence, best, changed = trial[k].copy(), float(r[k]), True
    if not changed:
      break
  return sentence, best


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def _residuals(apply_fn, variables, gradient, sentences, eos):
  """‖∇θ L(s_k) − g‖ / ‖g‖ of each of the sentences (K, T), one at a time (lax.map: one gradient's
  memory)."""
  leaves = jax.tree.leaves(gradient)
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))

  def one(s):
    x = s[None]
    y = jnp.concatenate([s[1:], jnp.asarray(eos, s.dtype)[None]])[None]
    own = jax.grad(_loss, argnums=2)(apply_fn, variables, variables["params"], x, y)
    return jnp.sqrt(sum(jnp.sum(jnp.square(a - b)) for a, b in
                        zip(jax.tree.leaves(own), leaves))) / norm

  return jax.lax.map(one, sentences)


def complete(apply_fn: Callable, variables, gradient, sentences, *, count: int, eos: int
             ) -> tuple[np.ndarray, float]:
  """The client's batch of ``count`` sentences from the K < ``count`` distinct ``sentences`` the spans
  gave, where the others leave no input of their own in any span: a repeat of a sentence found, or,
  of a padded batch, a sentence that is the start of one found (its inputs are that one's first ones).

  The missing sentences are added one at a time, each the candidate c (a sentence found or, padded,
  one of its prefixes) whose addition brings the batch's next-token gradient nearest the client's g.
  The client's loss is the mean over its M targets, so with S = M ∇L(F) the summed gradient of the
  batch F so far and L_c the targets of c,

      r(c) = ‖(S + L_c ∇L(c)) / (M + L_c) − g‖ / ‖g‖,

  one gradient of one sentence per candidate (``lax.map``). The additions are kept up to the first
  batch whose residual is at most :data:`SETTLED` (the client's own batch, to float32's rounding);
  where none settles, none is kept. Meant for a plain FedSGD gradient (a DP-SGD client's clipping
  weighs each sentence apart; noise leaves no batch that settles).

  Args:
    apply_fn, variables: the language model, as :func:`recover`'s.
    gradient: the client's gradient g (same tree as ``variables``, or its ``params``).
    sentences: (K, T) int, the sentences found (:data:`gradjax.corpus.PAD` past a padded one's end).
    count: the client's batch size N.
    eos: the end token of the targets (:func:`gradjax.corpus.language_model_pairs`).

  Returns:
    (the sentences (K', T), K ≤ K' ≤ N, the ones added last; the residual of their gradient).
  """
  _check_gradient(gradient)
  if isinstance(sentences, Recovery):
    raise ValueError("pass the sentences found (recovery.sentences), not the Recovery")
  sentences = np.asarray(sentences)
  if sentences.ndim != 2 or not np.issubdtype(sentences.dtype, np.integer) or len(sentences) == 0:
    raise ValueError(f"sentences must be (K, T) int ids with K >= 1, got {sentences.dtype} "
                     f"{sentences.shape}")
  if count < len(sentences):
    raise ValueError(f"the batch of {count} sentences cannot hold the {len(sentences)} found")
  sentences = sentences.astype(np.int32)
  if isinstance(gradient, dict) and "params" in gradient:
    gradient = gradient["params"]
  lengths = corpus.lengths(sentences)
  padded = bool(np.any(lengths < sentences.shape[1]))
  candidates = {tuple(s[:k]) for s, n in zip(sentences.tolist(), lengths.tolist())
                for k in (range(1, n + 1) if padded else (n,))}
  candidates = corpus.padded(sorted(candidates), sentences.shape[1])
  cx, cy = corpus.language_model_pairs(candidates, eos)
  cx, cy = jnp.asarray(_pad_rows(cx)), jnp.asarray(_pad_rows(cy))  # one program per bucket

  def residuals(batch, empty=False):  # r(c) of every candidate, with batch as F
    x, y = corpus.language_model_pairs(batch, eos)
    rows = _bucket(len(x)) - len(x)  # rows without a target add nothing: one program per bucket
    x = np.concatenate([x, np.full((rows, x.shape[1]), eos, x.dtype)])
    y = np.concatenate([y, np.full((rows, y.shape[1]), -1, y.dtype)])
    r = _completion_residuals(apply_fn, variables, gradient, jnp.asarray(x), jnp.asarray(y),
                              cx[:1] if empty else cx, cy[:1] if empty else cy, empty=empty)
    return np.asarray(r)[:len(candidates)]

  start = float(residuals(sentences, empty=True)[0])
  found, trail = sentences, []
  while len(found) < count and (not trail or trail[-1] > SETTLED):
    r = residuals(found)
    k = int(np.argmin(r))
    found = np.concatenate([found, candidates[k:k + 1]])
    trail.append(float(r[k]))
  settled = [i for i, r in enumerate(trail) if r <= SETTLED]
  if not settled:
    return sentences, start
  return found[:len(sentences) + settled[0] + 1], trail[settled[0]]


def _loss(apply_fn, variables, params, x, y):
  return losses.cross_entropy(apply_fn({**variables, "params": params}, x), y)


@functools.partial(jax.jit, static_argnames=("apply_fn", "empty"))
def _completion_residuals(apply_fn, variables, gradient, x, y, cx, cy, empty=False):
  """r(c) of :func:`complete` with the batch ``x``, ``y`` (K, T) as F, for the candidates' pairs
  ``cx``, ``cy`` (C, T), one at a time; with ``empty``, the residual of F alone."""
  leaves = jax.tree.leaves(gradient)
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
  m = jnp.sum(y >= 0).astype(jnp.float32)
  total = jax.tree.map(lambda a: a * m, jax.grad(_loss, argnums=2)(apply_fn, variables,
                                                                   variables["params"], x, y))

  def one(pair):
    xc, yc = pair
    n = 0.0 if empty else jnp.sum(yc >= 0).astype(jnp.float32)
    own = jax.grad(_loss, argnums=2)(apply_fn, variables, variables["params"], xc[None], yc[None])
    pred = jax.tree.map(lambda a, b: (a + n * b) / (m + n), total, own)
    return jnp.sqrt(sum(jnp.sum(jnp.square(a - b)) for a, b in
                        zip(jax.tree.leaves(pred), leaves))) / norm

  return jax.lax.map(one, (cx, cy))


def _wider_ranks(s: Span) -> list[int]:
  """Ranks past ``s.rank`` where the singular values fall by at least :data:`SEPARATION` times,
  widest gap first: where the largest gap leaves out inputs that reach the gradient with small
  weights (a trained model's positions far from its loss), the span that holds every position is
  at one of these."""
  sv = np.maximum(s.singular_values, s.singular_values[0] * np.finfo(np.float64).eps)
  ratios = sv[:-1] / sv[1:]
  ranks = [r + 1 for r in np.argsort(-ratios, kind="stable")
           if r + 1 > s.rank and ratios[r] >= SEPARATION]
  return ranks


def _unusable(what: str, s: Span, dimension: int) -> str:
  """Why the span of ``what`` cannot tell members from other vectors (one line)."""
  if s.drift and 2 * s.rank > len(s.singular_values):
    cause = (f"its rank {s.rank} is over half of the update's {len(s.singular_values)} directions: "
             "the local steps' drifting inputs fill it")
  elif s.rank >= 0.9 * dimension:
    cause = (f"its rank {s.rank} nearly fills the {dimension} dimensions the candidates occupy: the "
             "batch holds about as many (token, position) pairs or prefixes as the model's width, or "
             "noise on the update (a defense, DP-SGD) fills every direction")
  else:
    cause = (f"its singular values fall off without a clear gap (rank read {s.rank} of {dimension}, "
             f"σ_(r+1)/σ_r = {s.member_level:.1e}): noise or pruning on the update, or inputs that "
             "reach the gradient with weights near its rounding, as a saturated attention leaves them")
  return (f"the span attack cannot read this update: the span of the {what} separates its members "
          f"from other vectors by less than {SEPARATION:g}x ({cause})")


def _vocabulary_size(variables) -> int:
  params = variables["params"]
  if "embed" not in params or "embedding" not in params["embed"]:
    raise ValueError("the model has no token embedding at params/embed/embedding")
  return int(params["embed"]["embedding"].shape[0])


def _extend(apply_fn, variables, decoder, spans, sets, length, max_prefixes, first, chunk,
            padded=False):
  """Sentences by extension (see :func:`recover`); ``spans``: the first block's input span, then the
  attention-output span and the second block's input span (either may be missing). ``padded``: a
  prefix that no token extends is a whole sentence, kept with :data:`gradjax.corpus.PAD` past its
  end (``finished``), and the extension stops at the first position with no token (past the
  longest sentence) or no kept prefix."""
  _, output, second = spans
  params = variables["params"]
  cap = max_prefixes or 4 * second.rank
  cache = _init_cache(decoder, length, first)
  prefixes, worst, capped = np.zeros((1, 0), np.int32), np.zeros(1), False
  finished, finished_worst = [], []

  def ended(t, extended=()):  # of a padded batch: the prefixes of length t that nothing extends
    if padded and t > 0:
      for i in sorted(set(range(len(prefixes))) - set(np.asarray(extended).tolist())):
        finished.append(np.concatenate([prefixes[i], np.full(length - t, corpus.PAD, np.int32)]))
        finished_worst.append(worst[i])

  def count_prefixes(kept):
    return len({tuple(s[:k]) for s in kept for k in range(1, int(np.sum(s != corpus.PAD)) + 1)})

  def result(t):
    if not finished:
      return Recovery(np.zeros((0, length), np.int32), np.zeros(0), sets, spans, t, capped)
    kept, distance = list(finished), list(finished_worst)
    # More prefixes than the span's rank: a branch that passed the checks near their tolerance and
    # then found no token (which a sentence of one length would have dropped) is not the client's.
    # Those far past the sentences' typical distance go, the farthest first, while they are too many.
    while count_prefixes(kept) > second.rank:
      far = [i for i, d in enumerate(distance) if d > SEPARATION * np.median(distance)]
      if not far:
        break
      i = max(far, key=lambda j: distance[j])
      del kept[i], distance[i]
    return Recovery(np.stack(kept).astype(np.int32), np.asarray(distance), sets, spans, None,
                    capped, unexplained=second.rank - count_prefixes(kept))

  for t in range(length):
    if padded and sets[t].size == 0:  # past the longest sentence
      ended(t)
      return result(t)
    rows = np.repeat(np.arange(len(prefixes)), len(sets[t]))
    ids = np.tile(sets[t], len(prefixes)).astype(np.int32)
    distance = np.zeros(len(ids))
    if not output.full:  # the cheap check first, on every prefix and token
      tokens = sets[t]
      n_p, n_s = _bucket(len(prefixes)), _bucket(len(tokens))
      x = _inputs_at(apply_fn, variables, jnp.asarray(np.pad(tokens, (0, n_s - len(tokens)), mode="edge")),
                     length, t)
      attention_cache = _node(cache, first)
      pad = jnp.asarray(np.pad(np.arange(len(prefixes)), (0, n_p - len(prefixes))))
      d = np.asarray(output_distances(_node(params, first), attention_cache["cached_key"][pad],
                                      attention_cache["cached_value"][pad], t, x, output.basis))
      d = d[:len(prefixes), :len(tokens)].reshape(-1)  # row-major: prefix, then token, as rows/ids
      alive = np.flatnonzero(d <= output.tolerance)
      rows, ids, distance = rows[alive], ids[alive], d[alive]
    if len(ids) == 0:
      ended(t)
      return result(t)
    d, caches = _chunked(lambda r, i: _step(decoder, params, cache, r, i, second.basis), rows, ids,
                         chunk)
    keep = np.flatnonzero(d <= second.tolerance)
    ended(t, rows[keep])
    if keep.size == 0:
      return result(t)
    cache = jax.tree.map(lambda *c: jnp.concatenate(c) if c[0].ndim else c[0], *caches)
    if keep.size > cap:
      capped = True
      keep = keep[np.argsort(d[keep], kind="stable")[:cap]]
    # The kept prefixes' caches, padded to a power of two (rows past len(keep) repeat the last and
    # are never read): one program of _step per bucket of prefixes, not per count.
    cache = _take(cache, jnp.asarray(np.pad(keep, (0, _bucket(keep.size) - keep.size), mode="edge")))
    prefixes = np.concatenate([prefixes[rows[keep]], ids[keep, None]], axis=1)
    worst = np.maximum(worst[rows[keep]], np.maximum(d[keep], distance[keep]))
  ended(length)
  if padded:
    return result(length)
  return Recovery(prefixes.astype(np.int32), worst, sets, spans, None, capped,
                  unexplained=second.rank - count_prefixes(prefixes))
