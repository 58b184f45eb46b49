"""Token recovery from a language model's gradient (DLG, Zhu et al. 2019 §4.2; SAPAG, Wang et al.).

The client trains a language model (:class:`gradjax.models.transformer.TransformerLM`) on sentences
of token ids s (N, T) with the next-token loss, and sends g = ∇_θ L. Token ids are not
differentiable, so the attack works in embedding space: it optimises dummy embeddings e' (N, T, dim),
fed to the model in place of the lookup, and (DLG's joint labels) dummy soft targets (N, T, V), until
the gradient of every parameter but the embedding table matches g (:func:`attack_view`), with any
distance of :mod:`gradjax.distances` (DLG's Euclidean, SAPAG's Gaussian kernel, cosine). The
recovered embeddings are then mapped back to tokens (:func:`nearest_tokens`, :func:`pinv_tokens`).

The embedding table's own gradient leaks the bag of tokens: row v of ∂L/∂E is the sum of ∂L/∂e_t
over the positions t where s_t = v, so the non-zero rows are exactly the tokens present
(:func:`token_bag`; Melis et al. 2019 make the same observation). The attack restricts both the
decoding and the soft targets to that bag (the targets are the sentence shifted by one, plus
``<eos>``). A defense that adds noise to every entry hides the bag; then every token is a candidate.
A model whose logits read the same table (tied, GPT-2's) shows no bag that way: the logits' gradient
reaches every row. The attacks match the other parameters' gradients with the table a constant
(:func:`tied_apply_fn`) and search the whole vocabulary.

A masked language model (BERT's objective, DLG §4.2) is trained on inputs where some positions hold
``<mask>`` and on targets at those positions only. The attacker does not know which: the targets
range over the vocabulary and *no target* (:func:`gradjax.losses.masked_cross_entropy`), and the
sentence is the inputs with each ``<mask>`` replaced by its target.
"""

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import attacks, compilation, dager, driver, sharding, solvers
from gradjax import labels as labels_lib
from gradjax.losses import cross_entropy, masked_cross_entropy
from gradjax.objectives import dummy_gradient
from gradjax.observation import Observation, check_observation

SEARCHES = ("embeddings", "tokens")

EMBEDDING = ("embed", "embedding")  # where the transformer keeps its (V, dim) table


def _table(params, path=EMBEDDING) -> np.ndarray:
  node = params
  for key in path:
    if not isinstance(node, dict) or key not in node:
      raise ValueError(f"the model has no embedding table at params/{'/'.join(path)}")
    node = node[key]
  table = np.asarray(node)
  if table.ndim != 2:
    raise ValueError(f"params/{'/'.join(path)} is not a (V, dim) table: shape {table.shape}")
  return table


def embedding_table(observation: Observation, path=EMBEDDING) -> np.ndarray:
  """The (V, dim) embedding table of the model the server sent."""
  return _table(observation.variables["params"], path)


def token_bag(observation: Observation, path=EMBEDDING) -> np.ndarray:
  """Sorted int ids of the tokens in the client's sentences: the rows of the observed embedding
  gradient with a non-zero entry (exact for an undefended gradient; with noise on every entry, all)."""
  grad = _table(observation.gradient, path)
  return np.flatnonzero(np.any(grad != 0, axis=1)).astype(np.int32)


def _drop(params, path):
  head, *rest = path
  if not rest:
    return {k: v for k, v in params.items() if k != head}
  inner = _drop(params[head], rest)
  return {**{k: v for k, v in params.items() if k != head}, **({head: inner} if inner else {})}


def attack_view(observation: Observation, path=EMBEDDING) -> Observation:
  """The observation without the embedding table, in gradient and parameters.

  Dummy embeddings bypass the lookup, so the dummy gradient of the table is zero whatever they are:
  that leaf would only add a constant (Euclidean) or bias every other term (cosine, kernel). The
  model reads no table when it is given embeddings, so the same ``apply_fn`` runs without it."""
  check_observation(observation)
  embedding_table(observation, path)
  variables = {**observation.variables, "params": _drop(observation.variables["params"], path)}
  return observation.replace(gradient=_drop(observation.gradient, path), variables=variables)


def _candidates(table: np.ndarray, candidates) -> np.ndarray:
  ids = np.arange(table.shape[0]) if candidates is None else np.asarray(candidates).reshape(-1)
  if ids.size == 0 or ids.min() < 0 or ids.max() >= table.shape[0]:
    raise ValueError(f"candidate token ids must be non-empty and lie in [0, {table.shape[0]})")
  return ids


def nearest_tokens(embeddings, table, candidates=None) -> np.ndarray:
  """int (..., ) ids: for each embedding (..., dim) the candidate row of ``table`` (V, dim) at the
  smallest Euclidean distance (DLG); ``candidates``: the ids allowed (all if None)."""
  e, table = np.asarray(embeddings, np.float64), np.asarray(table, np.float64)
  ids = _candidates(table, candidates)
  rows = table[ids]
  d2 = (np.sum(e * e, -1)[..., None] - 2 * e @ rows.T + np.sum(rows * rows, -1))
  return ids[np.argmin(d2, axis=-1)].astype(np.int32)


def pinv_tokens(embeddings, table, candidates=None) -> np.ndarray:
  """int (...,) ids by the pseudo-inverse of the embedding matrix (SAPAG): an embedding e = Eᵀ c with
  c one-hot, so c ≈ (Eᵀ)⁺ e over the candidate rows E (K, dim), and the token is argmax c. With K ≤ dim
  linearly independent candidates (the bag of a sentence) this inverts exact embeddings exactly."""
  e, table = np.asarray(embeddings, np.float64), np.asarray(table, np.float64)
  ids = _candidates(table, candidates)
  coefficients = e @ np.linalg.pinv(table[ids])  # (..., dim) @ (dim, K)
  return ids[np.argmax(coefficients, axis=-1)].astype(np.int32)


def _reads_embeddings_alone(apply_fn, view: Observation, dim: int, length: int) -> bool:
  """Whether the model runs on embeddings without its table (the view's parameters)."""
  try:
    jax.eval_shape(lambda v: apply_fn(v, jnp.zeros((1, length, dim), jnp.float32)), view.variables)
  except Exception:  # flax names the missing parameter in one of several error types
    return False
  return True


def embeddings_apply_fn(apply_fn: Callable, observation: Observation, length: int) -> Callable:
  """The model as the optimisation attacks run it on embeddings (N, ``length``, dim) and the
  parameters of :func:`attack_view`: ``apply_fn`` itself, or :func:`tied_apply_fn` of it for a
  model whose logits read the table too. ValueError for a model that does not run on embeddings."""
  view, dim = attack_view(observation), embedding_table(observation).shape[1]
  if _reads_embeddings_alone(apply_fn, view, dim, length):
    return apply_fn
  tied = tied_apply_fn(apply_fn, observation)
  if not _reads_embeddings_alone(tied, view, dim, length):
    raise ValueError("the model does not run on embeddings (N, T, dim) in place of token ids: the "
                     "optimisation attacks feed it dummy embeddings")
  return tied


def _insert(params, path, value):
  head, *rest = path
  return {**params, head: value if not rest else _insert(params.get(head, {}), rest, value)}


def tied_apply_fn(apply_fn: Callable, observation: Observation, path=EMBEDDING) -> Callable:
  """``apply_fn`` on the parameters of :func:`attack_view` for a model whose logits read its
  embedding table too (tied, as GPT-2's: logits = h Eᵀ): the server's table E enters as a constant.

  The observed table gradient is the input lookup's rows plus the logits' E-gradient
  Σ_t (p_t − y_t) h_tᵀ, which reaches every row; dummy embeddings bypass the lookup, so their table
  gradient would be the second term alone. Matching every other parameter's gradient, as for an
  untied model, leaves the table out of the objective while the logits still use it."""
  table = compilation.device_array(embedding_table(observation, path))

  def tied(variables, x, *args, **kwargs):
    return apply_fn({**variables, "params": _insert(variables["params"], path, table)}, x, *args,
                    **kwargs)

  return tied


class TextReconstruction(NamedTuple):
  """Result of :func:`reconstruct`.

  Attributes:
    embeddings: (N, T, dim) the best restart's dummy embeddings (the token search's settled
      sentence's rows, where :func:`settle_tokens` changed it).
    tokens_nearest: (N, T) int, the tokens by nearest embedding row (for a masked language model,
      the sentence: a position read as ``<mask>`` holds its target).
    tokens_pinv: (N, T) int, the tokens by the embedding matrix's pseudo-inverse (likewise).
    targets: (N, T) int, argmax of the dummy soft targets (the sentence shifted by one; for a masked
      language model the masked positions' words, -1 where 'no target' wins), or the known ones.
    bag: int ids of the tokens the embedding gradient reveals (the candidates when restricted);
      None for a model whose logits read the table too (:func:`tied_apply_fn`), whose every row the
      gradient reaches: the search then ranges over the whole vocabulary.
    reconstruction: the search's own result (losses, restarts, counts): the embedding search's
      :class:`gradjax.attacks.Reconstruction`, the token search's :class:`TokenSearch`.
  """

  embeddings: np.ndarray
  tokens_nearest: np.ndarray
  tokens_pinv: np.ndarray
  targets: np.ndarray
  bag: np.ndarray
  reconstruction: "attacks.Reconstruction | TokenSearch"


class TokenData(NamedTuple):
  """What the token search's objective reads: the observation without the embedding table, the
  candidates' embedding rows (K, dim) and ids (K,), the ``eos`` id, per-leaf distance weights, and
  which of the K slots hold a candidate, (K,), or which a position may take, (T, K) (the bag is
  padded to N·T slots, so every sentence of a length shares one compiled program); for a masked
  language model, the ``<mask>`` token's embedding row ``mask_row`` (dim,) (``None`` for a
  next-token model); the attack's :func:`gradjax.attacks.track_from` (int32 scalar, set by
  :func:`solve_tokens`: one solver program for every budget, the last-iterate rule's included)."""

  observation: Observation
  rows: jax.Array
  ids: jax.Array
  eos: jax.Array
  weights: dict | None
  valid: jax.Array | None = None
  mask_row: jax.Array | None = None
  track_from: jax.Array | None = None


def soft_tokens(z, data: TokenData, vocabulary: int):
  """(embeddings, targets) of token logits ``z`` (N, T, K) over the candidates: with p = softmax(z),
  the inputs are e_t = Σ_k p_tk E_k (N, T, dim), and the next-token targets (N, T, V) are p_{t+1}
  placed at the candidates' ids, ``eos`` one-hot at the last position. Slots that are not
  ``data.valid`` get probability 0."""
  if data.valid is not None:
    z = jnp.where(data.valid, z, jnp.finfo(z.dtype).min)
  p = jax.nn.softmax(z, axis=-1)
  e = p @ data.rows
  n, t, _ = z.shape
  shifted = jnp.zeros((n, t - 1, vocabulary), p.dtype).at[..., data.ids].add(p[:, 1:])
  last = jnp.broadcast_to(jax.nn.one_hot(data.eos, vocabulary, dtype=p.dtype), (n, 1, vocabulary))
  return e, jnp.concatenate([shifted, last], axis=1)


def soft_masked_tokens(z, m, data: TokenData, vocabulary: int):
  """(embeddings, targets) of a masked language model's client from token logits ``z`` (N, T, K)
  over the candidates and mask logits ``m`` (N, T): with p = softmax(z) the word at each position and
  q = sigmoid(m) the chance that the client masked it, the inputs are
  e_t = q_t E_mask + (1 − q_t) Σ_k p_tk E_k (N, T, dim) and the targets (N, T, V + 1) are q_t p_t at
  the candidates' ids with 1 − q_t on 'no target' (:func:`gradjax.losses.masked_cross_entropy`).
  One sentence p drives both, as :func:`soft_tokens`' next-token targets do."""
  if data.valid is not None:
    z = jnp.where(data.valid, z, jnp.finfo(z.dtype).min)
  p = jax.nn.softmax(z, axis=-1)
  q = jax.nn.sigmoid(m)[..., None]
  e = q * data.mask_row + (1 - q) * (p @ data.rows)
  n, t, _ = z.shape
  words = jnp.zeros((n, t, vocabulary), p.dtype).at[..., data.ids].add(q * p)
  return e, jnp.concatenate([words, 1 - q], axis=-1)


def _gradient(apply_fn: Callable, data: TokenData, e, targets, masked: bool):
  """The gradient a client with inputs ``e`` and ``targets`` sends: the observation's model, its
  mode, and the next-token (``masked``: masked) language model's loss."""
  return dummy_gradient(apply_fn, data.observation.variables, e, targets,
                        train=data.observation.train,
                        loss_fn=masked_cross_entropy if masked else cross_entropy)


def _token_value(attack: attacks.Attack, apply_fn: Callable, vocabulary: int, masked: bool):
  """The token search's objective ``value_fn(dummy, data, step)``: the attack's distance between
  the gradient of the sentence that the logits ``dummy`` make and the client's."""

  def value_fn(dummy, data: TokenData, step):
    if masked:
      e, targets = soft_masked_tokens(dummy["z"], dummy["m"], data, vocabulary)
    else:
      e, targets = soft_tokens(dummy["z"], data, vocabulary)
    g = _gradient(apply_fn, data, e, targets, masked)
    return attack.distance(g, data.observation.gradient, weights=data.weights, step=step)

  return value_fn


def _token_solver(attack: attacks.Attack, apply_fn: Callable, vocabulary: int,
                  masked: bool = False) -> solvers.Solver:
  """The token search's solver, for data whose ``track_from`` is set (:func:`solve_tokens`); the
  name, the budget and the step the best iterate is tracked from make no other one (a learning-rate
  schedule is spread over the run's budget by :func:`gradjax.driver.run`; the search reads no
  smoothing)."""
  key = dataclasses.replace(attack, name="", iterations=1, track_from=0, smoothing=None)
  return _token_solver_cached(key, apply_fn, vocabulary, masked)


@functools.lru_cache(maxsize=16)
def _token_solver_cached(attack: attacks.Attack, apply_fn: Callable, vocabulary: int,
                         masked: bool) -> solvers.Solver:
  return solvers.make_solver(_token_value(attack, apply_fn, vocabulary, masked),
                             attacks.build_optimizer(attack), tol=attack.tol,
                             track_from=lambda data: data.track_from)


def _hard_tokens(slots, flags, data: TokenData, vocabulary: int, masked: bool):
  """(embeddings, targets) of hard sentences, slot ``slots`` (n, T) of the candidates at every
  position, masked where ``flags`` (n, T): :func:`soft_tokens` (:func:`soft_masked_tokens`) of one-hot
  logits (mask chances 0 or 1)."""
  hot = jax.nn.one_hot(slots, data.rows.shape[0], dtype=bool)
  z = jnp.where(hot, 0.0, -jnp.inf).astype(data.rows.dtype)
  if masked:
    m = jnp.where(flags, jnp.inf, -jnp.inf).astype(data.rows.dtype)
    return soft_masked_tokens(z, m, data, vocabulary)
  return soft_tokens(z, data, vocabulary)


@functools.lru_cache(maxsize=16)
def _sentence_objective(attack: attacks.Attack, apply_fn: Callable, vocabulary: int, masked: bool):
  """``objective(slots, flags, data, step) -> (B,)`` as one program: the token search's objective
  at B hard sentences, slot ``slots`` (B, N, T) of the candidates at every position and, for a masked
  language model, masked where ``flags`` (B, N, T) (:func:`_hard_tokens`)."""

  def objective(slots, flags, data, step):
    def one(s, f):
      g = _gradient(apply_fn, data, *_hard_tokens(s, f, data, vocabulary, masked), masked)
      return attack.distance(g, data.observation.gradient, weights=data.weights, step=step)
    return jax.vmap(one)(slots, flags)

  return compilation.once(objective)


def _sentence_sum(apply_fn: Callable, vocabulary: int, masked: bool):
  """``sentence_sum(s, f, data) -> (S, m)``: of one hard sentence (slots ``s`` (T,), mask flags
  ``f`` (T,)), the gradient S = ∇_θ Σ_t ℓ_t of its summed token losses and the count m of its
  targets (T for a next-token model, its masked positions for a masked one). Where the model reads
  each sentence alone, a batch's gradient is Σ_n S_n / Σ_n m_n (:func:`cross_entropy` and
  :func:`masked_cross_entropy` average over the batch's targets)."""

  def sentence_sum(s, f, data):
    m = (jnp.sum(f) if masked else jnp.asarray(s.shape[0])).astype(data.rows.dtype)
    g = _gradient(apply_fn, data, *_hard_tokens(s[None], f[None], data, vocabulary, masked), masked)
    return jax.tree.map(lambda x: x * m, g), m

  return sentence_sum


@functools.lru_cache(maxsize=16)
def _sentence_sums(apply_fn: Callable, vocabulary: int, masked: bool):
  """``sums(slots, flags, data) -> (S, m)``: :func:`_sentence_sum` of each of N sentences (N, T), one
  program; S a gradient tree with a leading axis N, m (N,)."""
  sentence_sum = _sentence_sum(apply_fn, vocabulary, masked)
  return compilation.once(jax.vmap(sentence_sum, in_axes=(0, 0, None)))


@functools.lru_cache(maxsize=16)
def _exchange_objective(attack: attacks.Attack, apply_fn: Callable, vocabulary: int, masked: bool):
  """``objective(S, m, n, slots, flags, data, step) -> (C,)`` as one program: the token search's
  objective at C batches that differ from the batch of sums ``S``, ``m`` (:func:`_sentence_sums`)
  in sentence ``n`` alone, which takes each of the C sentences ``slots`` (C, T) (masked where
  ``flags`` (C, T)): the batch's gradient (Σ_{j≠n} S_j + S'_c) / (Σ_{j≠n} m_j + m'_c), so each
  trial costs one sentence's gradient, not the batch's."""
  sentence_sum = _sentence_sum(apply_fn, vocabulary, masked)

  def objective(S, m, n, slots, flags, data, step):
    rest = jax.tree.map(lambda x: x.sum(0) - x[n], S)
    rest_m = m.sum() - m[n]

    def one(s, f):
      own, own_m = sentence_sum(s, f, data)
      total = jnp.maximum(rest_m + own_m, jnp.finfo(m.dtype).tiny)
      g = jax.tree.map(lambda r, o: (r + o) / total, rest, own)
      return attack.distance(g, data.observation.gradient, weights=data.weights, step=step)
    return jax.vmap(one)(slots, flags)

  return compilation.once(objective)


@functools.lru_cache(maxsize=16)
def _sums_error(apply_fn: Callable, vocabulary: int, masked: bool):
  """``error(slots, flags, data) -> scalar``: ‖Σ_n S_n / Σ_n m_n − G‖ / ‖G‖, G the gradient of the
  batch of hard sentences ``slots`` (N, T) read at once: 0 up to rounding where the model reads
  each sentence alone (no batch statistics), as :func:`_exchange_objective` assumes."""
  sums = jax.vmap(_sentence_sum(apply_fn, vocabulary, masked), in_axes=(0, 0, None))

  def error(slots, flags, data):
    S, m = sums(slots, flags, data)
    g = _gradient(apply_fn, data, *_hard_tokens(slots, flags, data, vocabulary, masked), masked)
    total = jnp.maximum(m.sum(), jnp.finfo(m.dtype).tiny)
    leaves = zip(jax.tree.leaves(S), jax.tree.leaves(g))
    diff, norm = 0.0, 0.0
    for s, x in leaves:
      diff += jnp.sum(jnp.square(s.sum(0) / total - x))
      norm += jnp.sum(jnp.square(x))
    return jnp.sqrt(diff / jnp.maximum(norm, jnp.finfo(m.dtype).tiny))

  return compilation.once(error)


# Of the token search's batch of hard sentences, the largest relative difference between its gradient
# read at once and the sum of its sentences' (:func:`_sums_error`) that :func:`settle_tokens` reads as
# rounding (float32's is near 1e-7): beyond it the model mixes its sentences, and every trial
# computes the whole batch's gradient.
SEPARABLE = 1e-4


class TokenProblem(NamedTuple):
  """What the token search's solver runs (:func:`prepare_tokens`): its ``data``, every restart's
  start ``init`` ({"z": (R, N, T, K)} logits over the K candidate slots, and for a masked language
  model {"m": (R, N, T)} mask logits), the candidates' ids ``ids`` (the slots past them are padding)
  and the ``vocabulary`` size V of the targets."""

  data: TokenData
  init: dict
  ids: np.ndarray
  vocabulary: int


class TokenSearch(NamedTuple):
  """The best restart of a token search (:func:`select_tokens`).

  Attributes:
    tokens: (N, T) int, argmax over the candidates at every position (the sentence).
    probabilities: (N, T, K) the softmax over the K candidates (``TokenProblem.ids``).
    embeddings: (N, T, dim) the inputs they make, Σ_k p_tk E_k (a masked language model's with
      q_t E_mask mixed in).
    targets: (N, T) int, the tokens shifted by one, ``eos`` last; for a masked language model the
      tokens where the mask's chance q_t exceeds 1/2, -1 elsewhere.
    loss, best_restart, restart_losses, restart_alive, iterations, evaluations: as
      :class:`gradjax.attacks.Reconstruction`'s (``loss``, once :func:`settle_tokens` has changed
      the sentence, that sentence's objective).
  """

  tokens: np.ndarray
  probabilities: np.ndarray
  embeddings: np.ndarray
  targets: np.ndarray
  loss: float
  best_restart: int
  restart_losses: np.ndarray
  restart_alive: np.ndarray
  iterations: np.ndarray
  evaluations: np.ndarray


def prepare_tokens(attack: attacks.Attack, apply_fn: Callable, view: Observation, table: np.ndarray,
                   key: jax.Array, *, length: int, eos: int | None, candidates=None,
                   restarts: int = 1, mask: int | None = None,
                   position_sets=None) -> TokenProblem:
  """The token search of :func:`reconstruct` on the ``view`` of :func:`attack_view`, with the
  embedding ``table`` (V, dim) and the ``candidates`` ids (all V if None): its data and every
  restart's logits, drawn N(0, 1) from ``jax.random.split(key, restarts)``. The candidates are
  padded to N·T slots, so every sentence of a length shares one compiled program. ``mask``: the
  ``<mask>`` id of a masked language model (:func:`soft_masked_tokens`; its mask logits are drawn
  N(0, 1) too), or ``None`` for a next-token model, which needs ``eos``. ``position_sets``: T arrays
  of ids, the words position t may hold (e.g. those the span attack admits there,
  :class:`gradjax.dager.Recovery`); the candidates are then their union, and each position's
  probability stays on its own set."""
  if not attack.optimises_labels or attack.matched.name != "gradient" or attack.priors:
    described = attacks.describe(attack)
    raise ValueError("the token search matches a FedSGD gradient with the next tokens tied to the "
                     "inputs: it takes no label source, objective mode or image prior "
                     f"(attack {attack.name!r} has label_source={described['label_source']!r}, "
                     f"objective={attack.matched.name!r}, priors={described['priors']!r})")
  if eos is None and mask is None:
    raise ValueError("the token search needs the end-of-sentence id (the last target)")
  n = view.num_samples
  if position_sets is not None:
    if len(position_sets) != length or any(np.size(s) == 0 for s in position_sets):
      raise ValueError(f"position_sets: {length} non-empty arrays of token ids, one per position")
    candidates = np.unique(np.concatenate([np.asarray(s).reshape(-1) for s in position_sets]))
  ids = np.arange(table.shape[0]) if candidates is None else np.asarray(candidates)
  slots = max(ids.size, n * length) if candidates is not None else ids.size
  padded = np.concatenate([ids, np.full(slots - ids.size, ids[0])]).astype(np.int32)
  valid = np.arange(slots) < ids.size
  if position_sets is not None:  # (T, slots): position t's own words
    valid = np.stack([valid & np.isin(padded, s) for s in position_sets])
  dtype = jnp.result_type(*jax.tree.leaves(view.variables["params"]))
  order = attacks.depth_order(attack, apply_fn, view, jnp.zeros((1, length, table.shape[1]), dtype))
  weights = attacks.layer_weights(attack, view, order)
  data = TokenData(view, jnp.asarray(np.where(np.any(valid.reshape(-1, slots), 0)[:, None],
                                              table[padded], 0.0), dtype),
                   jnp.asarray(padded), jnp.asarray(-1 if eos is None else eos, jnp.int32), weights,
                   jnp.asarray(valid),
                   None if mask is None else jnp.asarray(table[mask], dtype))
  init = _token_starts(jax.random.split(key, restarts), (n, length, slots), mask is not None, dtype)
  return TokenProblem(data, init, ids, int(table.shape[0]))


@functools.partial(compilation.once, static_argnums=(1, 2, 3))
def _token_starts(keys, shape, masked, dtype):
  """Every restart's start (one program): standard-normal token logits ``z`` of ``shape`` (N, T,
  slots) and, for a masked client, mask logits ``m`` (N, T)."""
  init = {"z": jax.vmap(lambda k: jax.random.normal(k, shape, dtype))(keys)}
  if masked:
    init["m"] = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 1), shape[:2], dtype))(keys)
  return init


def solve_tokens(attack: attacks.Attack, apply_fn: Callable, problem: TokenProblem,
                 execution: driver.Execution = driver.Execution()) -> solvers.SolverState:
  """Runs every restart of ``problem`` (:func:`gradjax.driver.run`); the final state, fetched to the
  host."""
  masked = problem.data.mask_row is not None
  data = problem.data._replace(
      track_from=compilation.device_array(np.int32(attacks.track_from(attack))))
  state = driver.run(_token_solver(attack, apply_fn, problem.vocabulary, masked), problem.init, data,
                     iterations=attack.iterations, execution=execution)
  return sharding.fetch(state)


def select_tokens(problem: TokenProblem, state: solvers.SolverState, table: np.ndarray) -> TokenSearch:
  """The best restart of a finished token search (fetched ``state``): its tokens, their
  probabilities and embeddings in the ``table`` (V, dim)."""
  best, losses = attacks.best_restart(state)
  ids, n = problem.ids, problem.init["z"].shape[1]
  z = np.asarray(state.best_params["z"][best])[..., :ids.size]
  if problem.data.valid is not None:  # the slots a position may not take: probability 0
    z = np.where(np.asarray(problem.data.valid)[..., :ids.size], z, -np.inf)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  tokens = ids[np.argmax(z, axis=-1)].astype(np.int32)
  embeddings = p @ table[ids].astype(np.float64)
  if problem.data.mask_row is not None:  # masked where the mask's chance exceeds 1/2
    m = np.asarray(state.best_params["m"][best], np.float64)
    q = 1 / (1 + np.exp(-m))
    targets = np.where(q > 0.5, tokens, -1).astype(np.int32)
    embeddings = q[..., None] * np.asarray(problem.data.mask_row, np.float64) + (
        1 - q[..., None]) * embeddings
  else:
    eos = int(problem.data.eos)
    targets = np.concatenate([tokens[:, 1:], np.full((n, 1), eos, np.int32)], axis=1)
  return TokenSearch(tokens, p, embeddings, targets, float(losses[best]),
                     best, losses, np.asarray(state.alive), np.asarray(state.iterations),
                     np.asarray(state.evaluations))


# The candidates a position tries when the token search's sentence settles: its likeliest 64 (every
# candidate of a bag that small).
SETTLE_CANDIDATES = 64


def settle_tokens(attack: attacks.Attack, apply_fn: Callable, problem: TokenProblem,
                  found: TokenSearch, table: np.ndarray, *, candidates: int = SETTLE_CANDIDATES,
                  sweeps: int = 4, stop: Callable[[], None] | None = None) -> TokenSearch:
  """The token search's sentence (``found``, :func:`select_tokens`) settled on hard tokens by
  coordinate descent on the search's own objective: each position in turn takes, of its
  ``candidates`` likeliest words (for a masked language model each of them masked or not), the one
  whose sentence, the others held, matches the gradient best, until a sweep changes nothing or
  ``sweeps`` have run. The relaxation's argmax can stop a word off where its minimum is shallow (a
  bert client's five words: 3.7e-6 with the first word wrong, 1e-13 for the sentence, one
  exchange apart). (:func:`gradjax.dager.settle` does the like for the span attack's next-token
  sentences, on the relative residual of the gradient and with pair exchanges.)

  Returns ``found`` where no exchange lowers the objective of its sentence, else the settled
  sentence: its tokens, targets, embeddings (the table's rows, ``<mask>``'s where masked) and
  objective (``loss``); the probabilities, restarts and counts stay the search's. ``stop``: called
  before each position (N·T a sweep); it raises to end the run (a signal: the saved search resumes
  and settles again).

  Of a batch (N > 1) whose model reads each sentence alone (:func:`_sums_error` within
  :data:`SEPARABLE` at the start and at the next likeliest words), a trial computes the gradient of
  the one sentence it changes and adds the others' kept sums (:func:`_exchange_objective`: N
  gradients held, where they fit in a quarter of the device's memory); else the whole batch's.
  """
  masked = problem.data.mask_row is not None
  p = np.asarray(found.probabilities)  # (N, T, K), K = problem.ids.size
  slots = np.argmax(problem.ids == np.asarray(found.tokens)[..., None], axis=-1).astype(np.int32)
  flags = (found.targets >= 0) if masked else np.zeros(slots.shape, bool)
  # The slots each position may take ((K,) or (T, K): position sets), likeliest first.
  valid = (np.ones(p.shape[-1], bool) if problem.data.valid is None
           else np.asarray(problem.data.valid)[..., :problem.ids.size])
  valid = np.broadcast_to(valid, p.shape)
  # No wider than the largest set: a narrower position's other trials would repeat its sentence.
  width = int(min(candidates, max(valid.sum(axis=-1).max(), 1)))
  likely = np.argsort(np.where(valid, -p, np.inf), axis=-1, kind="stable")[..., :width]
  step = jnp.asarray(attack.iterations, jnp.int32)
  choices = [(k, f) for f in ((False, True) if masked else (False,)) for k in range(width)]
  whole = _sentence_objective(attack, apply_fn, problem.vocabulary, masked)
  # Separable (the docstring): checked at the start and at each position's next likeliest word (a
  # batch of equal sentences would hide a mixing model); the N sums held within a quarter of memory.
  error = _sums_error(apply_fn, problem.vocabulary, masked)
  held = slots.shape[0] * sum(np.size(g) * np.dtype(g.dtype).itemsize
                              for g in jax.tree.leaves(problem.data.observation.gradient))
  memory = driver.memory_bytes()
  separable = slots.shape[0] > 1 and (memory is None or held <= memory / 4) and all(
      float(error(jnp.asarray(at), jnp.asarray(flags), problem.data)) <= SEPARABLE
      for at in (slots, likely[..., min(1, width - 1)].astype(np.int32)))
  if separable:
    sums = _sentence_sums(apply_fn, problem.vocabulary, masked)
    exchange = _exchange_objective(attack, apply_fn, problem.vocabulary, masked)
    S, m = sums(jnp.asarray(slots), jnp.asarray(flags), problem.data)

  def evaluate(n, trial_slots, trial_flags):  # always len(choices) trials: one program
    if separable:
      r = exchange(S, m, jnp.asarray(n, jnp.int32), jnp.asarray(trial_slots[:, n]),
                   jnp.asarray(trial_flags[:, n]), problem.data, step)
    else:
      r = whole(jnp.asarray(trial_slots), jnp.asarray(trial_flags), problem.data, step)
    return np.asarray(r, np.float64)

  best = float(evaluate(0, np.repeat(slots[None], len(choices), 0),
                        np.repeat(flags[None], len(choices), 0))[0])
  settled = False
  for _ in range(sweeps):
    changed = False
    for n, t in np.ndindex(*slots.shape):
      if stop is not None:
        stop()
      trial_slots = np.repeat(slots[None], len(choices), 0)
      trial_flags = np.repeat(flags[None], len(choices), 0)
      for i, (k, f) in enumerate(choices):
        if valid[n, t, likely[n, t, k]]:
          trial_slots[i, n, t], trial_flags[i, n, t] = likely[n, t, k], f
      r = evaluate(n, trial_slots, trial_flags)
      # The sentence as it is, where a trial holds it, is the reference, computed as the others are
      # (the separable route's sums round otherwise than the value it started from).
      same = (trial_slots[:, n, t] == slots[n, t]) & (trial_flags[:, n, t] == flags[n, t])
      current = float(r[same].min()) if same.any() else best
      r = np.where(same, np.inf, r)
      i = int(np.argmin(r))
      if r[i] < current:
        slots, flags, best, changed = trial_slots[i], trial_flags[i], float(r[i]), True
        if separable:
          S, m = sums(jnp.asarray(slots), jnp.asarray(flags), problem.data)
    settled |= changed
    if not changed:
      break
  if not settled:
    return found
  tokens = problem.ids[slots].astype(np.int32)
  embeddings = np.asarray(table, np.float64)[tokens]
  if masked:
    targets = np.where(flags, tokens, -1).astype(np.int32)
    embeddings = np.where(flags[..., None], np.asarray(problem.data.mask_row, np.float64), embeddings)
  else:
    eos = int(problem.data.eos)
    targets = np.concatenate([tokens[:, 1:], np.full((tokens.shape[0], 1), eos, np.int32)], axis=1)
  return found._replace(tokens=tokens, embeddings=embeddings, targets=targets, loss=best)


# Eleven parameters: attacks.reconstruct's (attack, model, observation, key, restarts, execution) and
# the text's own (sentence length, end token, mask token, token restriction, search).
def reconstruct(attack: attacks.Attack, apply_fn: Callable, observation: Observation, key: jax.Array,
                *, length: int, eos: int | None = None, mask: int | None = None,
                restrict: bool = True, restarts: int = 1, search: str = "embeddings",
                position_sets=None,
                execution: driver.Execution = driver.Execution()) -> TextReconstruction:
  """Recovers the client's sentences (N, ``length``) from a language model's gradient.

  Args:
    attack: an attack of :mod:`gradjax.attacks` (``dlg``, ``sapag``, or a cosine distance); its
      ``box`` keeps the dummy embeddings within the per-dimension range of the embedding table, its
      ``dummy_init`` draws them (``normal`` matches the table's N(0, 1) init); the token search stays in
      the candidates' convex hull by construction and draws its logits N(0, 1), so it reads neither.
    apply_fn: the language model, reading (N, T, dim) embeddings.
    observation: the client's gradient of the whole model (embedding table included).
    key: PRNG key of the dummy data.
    length: T, tokens per sentence.
    eos: the end-of-sentence id, added to the targets' candidates (it is the last target but not an
      input); ``None`` for none.
    mask: the ``<mask>`` id of a masked language model, whose client's targets are its masked
      positions' words (:func:`gradjax.corpus.masked_lm_pairs`): the targets then range over the
      vocabulary and 'no target' (:func:`gradjax.losses.masked_cross_entropy`), and each position
      read as ``<mask>`` takes its target in the sentence; ``None`` for a next-token model.
    restrict: decode, and let soft targets range, only over the :func:`token_bag` (plus ``eos``);
      ``False`` searches the whole vocabulary, as a model with a tied table always does.
    search: ``"embeddings"`` (DLG, SAPAG): free dummy embeddings (N, T, dim) and, with joint labels,
      free soft targets (N, T, V), decoded afterwards. ``"tokens"`` (gradjax): logits z (N, T, K)
      over the K candidate tokens, the inputs the softmax-weighted candidate embeddings and the
      targets the same distributions shifted by one (:func:`soft_tokens`), so inputs and targets
      stay one sentence; tokens are argmax z, then settled on hard tokens
      (:func:`settle_tokens`). For a masked language model the search adds a mask logit per
      position (:func:`soft_masked_tokens`).
    position_sets: the token search only: T arrays of ids, the words each position may hold (as
      the span attack leaves them, :class:`gradjax.dager.Recovery`), within the bag when
      ``restrict``.
    restarts, execution: as :func:`gradjax.attacks.reconstruct`.
  """
  with driver.precision_scope(execution.matmul_precision):
    return _reconstruct(attack, apply_fn, observation, key, length, eos, mask, restrict, restarts,
                        search, position_sets, execution)


def _with_targets(inputs: np.ndarray, targets: np.ndarray, mask: int) -> np.ndarray:
  """A masked language model's sentences: ``inputs`` (N, T) with each ``mask`` replaced by its
  target (a -1 target, 'no target', leaves the mask)."""
  return np.where((inputs == mask) & (targets >= 0), targets, inputs).astype(np.int32)


def _position_words(allowed, words, vocabulary: int, mask: int | None) -> np.ndarray:
  """A position's candidate words: ``allowed`` within ``words`` (the bag; all of the vocabulary if
  None), without ``<mask>``; where nothing is left (a masked position, whose input is ``<mask>``),
  every word."""
  every = np.arange(vocabulary) if words is None else np.asarray(words)
  if mask is not None:
    every = every[every != mask]
  kept = np.intersect1d(np.asarray(allowed).reshape(-1), every)
  return kept if kept.size else every


def _reconstruct(attack, apply_fn, observation, key, length, eos, mask, restrict, restarts, search,
                 position_sets, execution):
  key = compilation.check_key(key)
  if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
    raise ValueError(f"sentence length must be a positive integer, got {length!r}")
  dager.check_length(observation.gradient, length)
  if attack.matched.name != "gradient":
    raise ValueError("text attacks match a FedSGD gradient (objective 'gradient'); attack "
                     f"{attack.name!r} has objective={attack.matched.name!r}")
  if attack.label_source not in (labels_lib.joint, labels_lib.known):
    raise ValueError("text attacks take joint soft targets or known next tokens; attack "
                     f"{attack.name!r} has label_source={attacks.describe(attack)['label_source']!r} "
                     "(label inference reads a classifier's head)")
  table = embedding_table(observation)
  view = attack_view(observation)
  bag = token_bag(observation)
  if bag.size == 0:
    raise ValueError("the observed embedding gradient is zero: no tokens to recover")
  given, apply_fn = apply_fn, embeddings_apply_fn(apply_fn, observation, length)
  if apply_fn is not given:
    bag = None  # the logits' gradient reaches every row of a tied table: it reveals no bag
  if mask is not None and not 0 <= mask < table.shape[0]:
    raise ValueError(f"the <mask> id {mask} is not a row of the {table.shape[0]}-token embedding table")
  if eos is not None and not 0 <= eos < table.shape[0]:
    raise ValueError(f"the end-of-sentence id {eos} is not a row of the {table.shape[0]}-token "
                     "embedding table")
  candidates = bag if restrict else None
  vocabulary = table.shape[0]
  words = candidates  # what a position's word may be: never <mask>, the client's own token
  if mask is not None:
    words = np.setdiff1d(np.arange(vocabulary) if candidates is None else candidates, [mask])
    candidates = None if candidates is None else np.union1d(candidates, [mask]).astype(np.int32)
  if position_sets is not None and search != "tokens":
    raise ValueError("position_sets restrict the token search (search='tokens')")
  if search == "tokens":
    if position_sets is not None:  # each position's own words, within the bag, never <mask>
      position_sets = [_position_words(s, words, vocabulary, mask) for s in position_sets]
    problem = prepare_tokens(attack, apply_fn, view, table, key, length=length, eos=eos,
                             candidates=words, restarts=restarts, mask=mask,
                             position_sets=position_sets)
    found = select_tokens(problem, solve_tokens(attack, apply_fn, problem, execution), table)
    found = settle_tokens(attack, apply_fn, problem, found, table,
                          stop=getattr(execution.saver, "stop_point", None))
    return TextReconstruction(found.embeddings, found.tokens, found.tokens, found.targets, bag, found)
  if search != "embeddings":
    raise ValueError(f"unknown text search {search!r}; choose one of {', '.join(SEARCHES)}")
  if mask is not None and not attack.optimises_labels:
    raise ValueError("a masked language model's targets are its masked positions' words, which the "
                     "attacker does not know: the embedding search optimises them (joint labels)")
  problem = attacks.prepare(attack, apply_fn, view, key, input_shape=(length, table.shape[1]),
                            bounds=(table.min(axis=0), table.max(axis=0)), restarts=restarts,
                            label_shape=None if mask is None else (length, vocabulary + 1))
  if mask is not None:  # the targets: the words and 'no target' (column V)
    problem = attacks.restrict_labels(problem, np.append(words, vocabulary).astype(np.int32),
                                      vocabulary + 1)
  elif candidates is not None and attack.optimises_labels:
    support = np.union1d(bag, [] if eos is None else [eos]).astype(np.int32)
    problem = attacks.restrict_labels(problem, support, vocabulary)
  rec = attacks.select(problem, attacks.solve(
      attack, apply_fn, problem, execution,
      loss_fn=cross_entropy if mask is None else masked_cross_entropy))
  e = np.asarray(rec.x, np.float64)
  nearest, pinv = nearest_tokens(e, table, candidates), pinv_tokens(e, table, candidates)
  targets = np.asarray(rec.labels)
  if mask is not None:  # 'no target' (column V) is -1, as in the client's targets
    targets = np.where(targets == vocabulary, -1, targets).astype(np.int32)
    rec = rec._replace(labels=targets)
    nearest, pinv = _with_targets(nearest, targets, mask), _with_targets(pinv, targets, mask)
  return TextReconstruction(e, nearest, pinv, targets, bag, rec)
