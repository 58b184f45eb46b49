"""The gradient-matching objective of the DLG family.

Given the observed gradient g = ∇_θ L(f_θ(x), y) of a client, the attacker minimises over dummy data
x' (and, in DLG, dummy soft labels y' = softmax(z'))

    D(∇_θ L(f_θ(x'), y'), g)

where D is a distance on parameter pytrees (:mod:`gradjax.distances`), optionally plus image priors
R(x', t) (:mod:`gradjax.priors`) and a pull of each example's head input towards the one the head's
gradient gives for its label (:func:`head_input`, :func:`gradjax.analytic.head_inputs`). ``jax.grad`` of the client's
loss gives the dummy gradient; differentiating the objective again w.r.t. x' (and z') drives the
optimizer, so the objective is one pure function that ``jit`` and ``vmap`` transform as a whole.
"""

import dataclasses
import functools
import math
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from gradjax.clients import DPSGD, clipped_gradient, replayed_update
from gradjax.distances import Distance, as_distance
from gradjax.losses import cross_entropy
from gradjax.models import taps
from gradjax.observation import Observation
from gradjax.priors import Network



@dataclasses.dataclass(frozen=True)
class Gamma:
  """How DLM learns its scale γ in ‖∇W' − γ (W_t − W_{t+1})‖² (:class:`ScaledDifference`).

  The paper optimises γ jointly with the data and expects γ ≈ 1 / lr after one local SGD step; it
  states neither γ's start nor its step size. γ = exp(s) with s optimised, so it stays positive.

  Attributes:
    init: γ at the start (s = log init); 1 by default, 1 / lr starts it at the answer.
    learning_rate: a learning rate for s of its own (Adam, constant), or ``None``: s moves with the
      dummy data under the attack's optimizer.
    frozen: γ is held at ``init`` for this many steps (no gradient reaches s), so the data first
      moves towards the observation's direction.
  Reference: Zhao, Luo, Ding, "Deep Leakage from Model in Federated Learning", 2022.
  """

  init: float = 1.0
  learning_rate: float | None = None
  frozen: int = 0

  def __post_init__(self):
    if not (self.init > 0 and math.isfinite(self.init)):
      raise ValueError(f"DLM's initial gamma must be positive and finite, got {self.init}")
    if self.learning_rate is not None and not self.learning_rate > 0:
      raise ValueError(f"gamma's learning rate must be positive, got {self.learning_rate}")
    if self.frozen < 0:
      raise ValueError(f"gamma's frozen steps must be non-negative, got {self.frozen}")


@dataclasses.dataclass(frozen=True)
class Gradient:
  """What FedSGD's attacks match (DLG and relatives): u = g' = ∇_θ L(f_θ(x'), y'), the dummy
  gradient, against v = g, the observed one."""

  name: ClassVar[str] = "gradient"

  def match(self, g, observed, dummy, step):
    """(u, v) from the dummy gradient ``g`` and the ``observed`` one."""
    del dummy, step
    return g, observed


@dataclasses.dataclass(frozen=True)
class ClippedGradient(Gradient):
  """What an attack that knows the client ran DP-SGD matches: u = (1/N) Σ_n clip(g'_n, C), the mean
  of the dummy examples' own gradients each clipped to L2 norm C over all parameters
  (:func:`gradjax.clients.clipped_gradient`), against v = g, the clipped (and noised) observed one.
  ``expected_batch_size``: the client's step was Poisson-sampled (:class:`gradjax.clients.DPSGD`)
  and divided its sum by this, qn, not by the count it drew: u = (1/qn) Σ_n clip(g'_n, C) over the
  N dummy examples, one per example drawn.
  Reference: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016."""

  max_norm: float = 1.0
  expected_batch_size: float | None = None
  name: ClassVar[str] = "clipped_gradient"

  def __post_init__(self):
    if not (isinstance(self.max_norm, (int, float)) and 0 < self.max_norm < math.inf):
      raise ValueError(f"the clipping bound must be a positive number, got {self.max_norm!r}")
    if self.expected_batch_size is not None and not (
        isinstance(self.expected_batch_size, (int, float)) and 0 < self.expected_batch_size < math.inf):
      raise ValueError(f"the expected batch size must be a positive number, got "
                       f"{self.expected_batch_size!r}")

  def gradient(self, model, variables, x, targets, *, train, loss_fn):
    """u for the dummy examples ``x`` and their ``targets``."""
    g = clipped_gradient(model, variables, x, targets, self.max_norm, train=train, loss_fn=loss_fn)
    if self.expected_batch_size is None:
      return g
    return jax.tree.map(lambda a: a * (x.shape[0] / self.expected_batch_size), g)


@dataclasses.dataclass(frozen=True)
class ScaledDifference(Gradient):
  """DLM's: u = g' against v = γ (W_t − W_{t+1}), the observed model difference scaled by γ, which
  is optimised with the data (the paper: ≈ 1 / lr after one local SGD step). γ = exp(s) with
  s = ``dummy["log_gamma"]``: positive, and a first-order optimizer moves it multiplicatively (a
  step of log γ, not of γ); held (no gradient) before ``gamma.frozen`` steps. Nothing pulls γ to
  1/lr: ∂/∂γ vanishes at γ = ⟨g', ΔW⟩ / ‖ΔW‖², near 0 while g' is unrelated to ΔW, and a small γ lets
  g' shrink to the trivial minimum g' = γ = 0. On the paper's MLP the learned γ falls (median 0.25
  against 1/lr = 100; from γ = 1/lr too) and the images are not recovered
  (``experiments/studies/dlm_table1``); hold γ (``gamma.frozen``) or use :class:`Normalised`.
  Reference: Zhao, Luo, Ding, "Deep Leakage from Model in Federated Learning", 2022."""

  gamma: Gamma = Gamma()
  name: ClassVar[str] = "dlm"

  def __post_init__(self):
    if not isinstance(self.gamma, Gamma):
      raise ValueError(f"gamma must be an objectives.Gamma, got {self.gamma!r}")

  def match(self, g, observed, dummy, step):
    log_gamma = dummy["log_gamma"]
    if self.gamma.frozen:
      log_gamma = jnp.where(step < self.gamma.frozen, jax.lax.stop_gradient(log_gamma), log_gamma)
    return g, jax.tree.map(lambda o: jnp.exp(log_gamma) * o, observed)


@dataclasses.dataclass(frozen=True)
class Normalised(Gradient):
  """DLM+'s (learning-rate free): u = g' / ‖g'‖ against v = ΔW / ‖ΔW‖, norms over all layers; with
  ``layer_mean``, as the authors' released ``DLM_plus.py`` divides, u = g' / mean_l ‖g'_l‖ and
  v = ΔW / mean_l ‖ΔW_l‖, the mean over the L parameter tensors of each one's norm (0 at g' ∝ ΔW
  as the other, not equal to it elsewhere). Reference: Zhao, Luo, Ding, "Deep Leakage from Model
  in Federated Learning", 2022."""

  layer_mean: bool = False
  name: ClassVar[str] = "dlm_plus"

  def match(self, g, observed, dummy, step):
    del dummy, step
    unit = _layer_mean_unit if self.layer_mean else _unit
    return unit(g), unit(observed)


@dataclasses.dataclass(frozen=True)
class Replay:
  """What Inverting Gradients' FedAvg attack matches (Geiping et al. 2020 §6): u = W_t − W'_{t+1},
  the update of the client's local training replayed on the dummy data
  (:func:`gradjax.clients.local_sgd`, with the schedule the observation reveals in
  ``observation.local``), against v = W_t − W_{t+1}, the observed update.

  Attributes:
    max_norm: the client trained with DP-SGD: each replayed step clips its examples' gradients to
      this bound as the client's did (:func:`gradjax.clients.local_sgd`; its noise is not
      replayed); ``None``: plain SGD.
    sampling_rate: the client's DP-SGD drew each step's batch by Poisson sampling at this rate q;
      the draws are unknown to the server, so each step is replayed as its expectation over them,
      (1/n) Σ_n clip(g'_n, C) over all n dummy examples (``local_sgd``'s draws all q): an
      approximation of the client's steps, not them.
    expected_batch_size: E, the divisor of each of those steps' drawn sum when it is not q·n
      (Opacus' ``int(q·n)``): each replayed step is then (q/E) Σ_n clip(g'_n, C)
      (:func:`gradjax.clients.expected_draws`); ``None``: q·n.
    remat: ``jax.checkpoint`` each replayed local step, so differentiating through the local training
      keeps one parameter set per step and recomputes the step's activations (XLA's temporaries then
      grow with the parameters, not the activations). For the gradient itself, checkpoint inside the
      model instead (``gradjax.models.get_module(..., remat=True)``).
  """

  remat: bool = False
  max_norm: float | None = None
  sampling_rate: float | None = None
  expected_batch_size: float | None = None
  name: ClassVar[str] = "replay"

  def __post_init__(self):
    if self.max_norm is not None and not (isinstance(self.max_norm, (int, float))
                                          and 0 < self.max_norm < math.inf):
      raise ValueError(f"the clipping bound must be a positive number, got {self.max_norm!r}")
    if self.sampling_rate is not None:
      if self.max_norm is None:
        raise ValueError("a replay of Poisson-sampled steps needs DP-SGD's clipping bound")
      DPSGD(self.max_norm, 0.0, self.sampling_rate).check()
    if self.expected_batch_size is not None and not (
        self.sampling_rate is not None and isinstance(self.expected_batch_size, (int, float))
        and 0 < self.expected_batch_size < math.inf):
      raise ValueError(f"a replay's expected batch size divides Poisson-sampled steps: a positive "
                       f"number with a sampling rate, got {self.expected_batch_size!r}")

  def update(self, model, observation: Observation, x, targets, loss_fn):
    """u: the replayed update W_t − W'_{t+1} of ``model`` on ``x`` (each client's of an aggregate,
    :func:`gradjax.clients.replayed_update`)."""
    return replayed_update(model, observation, x, targets, loss_fn=loss_fn, remat=self.remat,
                           max_norm=self.max_norm, sampling_rate=self.sampling_rate,
                           expected_batch_size=self.expected_batch_size)


Matched = Gradient | Replay  # what an objective matches: one of the five above
# By name, those built without settings of the client's (ClippedGradient needs DP-SGD's bound).
MATCHED: dict[str, type] = {c.name: c for c in (Gradient, Replay, ScaledDifference, Normalised)}


def matched(name: str, **settings) -> Matched:
  """The part of :data:`MATCHED` called ``name``, built with ``settings`` (``gamma`` for ``"dlm"``,
  ``remat`` for ``"replay"``)."""
  if name not in MATCHED:
    raise ValueError(f"unknown matched part {name!r}; choose one of {', '.join(MATCHED)}")
  return MATCHED[name](**settings)


@dataclasses.dataclass(frozen=True)
class Smoothing:
  """A continuation from a rounded model to the model itself: the dummy gradient is taken of the
  model with sharpness κ(t) (:func:`gradjax.models.make_apply_fn`: ReLU as softplus(κx) / κ, max
  pooling as each window's softmax-weighted mean at κ), where

    κ(t) = start · (end / start)^(t / until)   for t < until,   κ(t) = end   from ``until`` on.

  A ReLU network's gradient is piecewise in its input: which units fire and which input wins each
  pooling window change in jumps, its second derivative through them is zero, and gradient matching
  stalls where the dummy's patterns differ from the client's (DLG swapped ReLU for sigmoid to keep
  the model twice differentiable). Rounded, the objective is smooth; the continuation follows its
  minimiser as κ grows, which helps only where that path leads to the real model's minimiser. At
  ``end`` = 1e4 ReLU is within log(2) / κ ≈ 7e-5 of itself and a pool's weights are one-hot but
  for entries within about 1e-3 of the maximum. gradjax's own construction
  (a homotopy, not one of the seed papers'); what it gives: ``experiments/studies/batches``.

  Attributes:
    until: the step from which κ stays at ``end``; objective values before it are not comparable
      with later ones, so the best iterate is tracked from there (:func:`gradjax.attacks.track_from`).
    start: κ at step 0 (2: ReLU's kink rounded over about one unit of its pre-activation).
    end: κ from ``until`` on.
  """

  until: int
  start: float = 2.0
  end: float = 1e4

  def __post_init__(self):
    if self.until < 1:
      raise ValueError(f"smoothing needs a positive number of steps, got until={self.until}")
    if not (0 < self.start <= self.end and math.isfinite(self.end)):
      raise ValueError(f"smoothing needs 0 < start <= end < inf, got start={self.start}, end={self.end}")

  def sharpness(self, step, until=None) -> jax.Array:
    """κ(step), a float32 scalar; ``until`` in place of the record's (an int scalar, e.g. traced:
    :class:`Schedule`)."""
    until = self.until if until is None else until
    f = jnp.clip(jnp.asarray(step, jnp.float32) / jnp.asarray(until, jnp.float32), 0.0, 1.0)
    return jnp.float32(self.start) * jnp.float32(self.end / self.start) ** f


class Schedule(NamedTuple):
  """The step counts of an objective's schedule as data of its program, each an int32 scalar, in
  place of those its records hold: so an objective whose counts move with the budget
  (:func:`gradjax.attacks.rescaled`) is one program for every budget.

  starts: one per prior, the step it switches on at (:class:`gradjax.priors.Prior`'s ``start``).
  period: :class:`Stepwise`'s, or ``None`` without one.
  until: :class:`Smoothing`'s, or ``None`` without one.
  """

  starts: tuple[jax.Array, ...]
  period: jax.Array | None
  until: jax.Array | None


@dataclasses.dataclass(frozen=True)
class Stepwise:
  """HFGInv's stepwise matching: a growing set of layers, deep to shallow, with gradient dropout.

  With the parameter leaves numbered 0..L−1 in depth order (:func:`gradjax.distances.layer_paths`),
  step t matches the deepest n(t) leaves, leaf i when i ≥ L − n(t), where

    n(t) = min(⌈first·L⌉ + ⌊t / period⌋ · ⌈grow·L⌉, ⌈last·L⌉)

  and each matched entry is kept with probability 1 − ``dropout`` (the same random mask on the dummy
  and the observed gradient, drawn anew every step from ``fold_in(key, t)`` with the run's own
  ``key``, not rescaled: each restart drops its own entries).

  Defaults: Ye et al.'s code on ResNet-34's 110 parameter tensors: tensors 100..110 at first (11),
  10 more every 500 of 15 000 iterations, down to tensor 25 (86 matched, the stem and first stage
  never), dropout 0.3; here as fractions of L, so they carry over to any model.
  Reference: Ye et al., "High-Fidelity Gradient Inversion in Distributed Learning", AAAI 2024.
  """

  first: float = 11 / 110
  grow: float = 10 / 110
  last: float = 86 / 110
  period: int = 500
  dropout: float = 0.3

  def __post_init__(self):
    if not (0 < self.first <= self.last <= 1 and 0 <= self.grow <= 1):
      raise ValueError(f"stepwise fractions need 0 < first <= last <= 1 and 0 <= grow <= 1, got "
                       f"{self.first}, {self.last}, {self.grow}")
    if self.period < 1 or not 0 <= self.dropout < 1:
      raise ValueError(f"stepwise needs period >= 1 and dropout in [0, 1), got {self.period}, "
                       f"{self.dropout}")

  def _leaves(self, num_leaves: int) -> tuple[int, int, int]:
    """(⌈first·L⌉ at least 1, ⌈grow·L⌉, ⌈last·L⌉) for L = ``num_leaves``."""
    ceil = lambda f: math.ceil(round(f * num_leaves, 6))  # round: 11/110 · 110 is 11, not 11.000…02
    return max(ceil(self.first), 1), ceil(self.grow), ceil(self.last)

  def num_matched(self, num_leaves: int, step, period=None) -> jax.Array:
    """n(t), the number of deepest leaves matched at ``step`` (int scalar); ``period`` in place of
    the record's (an int scalar, e.g. traced: :class:`Schedule`)."""
    first, grow, last = self._leaves(num_leaves)
    period = self.period if period is None else period
    return jnp.minimum(first + (jnp.asarray(step) // period) * grow, last)

  def settled_from(self, num_leaves: int) -> int:
    """The first step at which n(t) stops growing: ``period`` · ⌈(n_last − n_first) / n_grow⌉ in
    leaves of a model of ``num_leaves`` (0 when it never grows). Objective values before it match
    fewer layers and are not comparable with later ones (4000 for ResNet-34's 110 tensors)."""
    first, grow, last = self._leaves(num_leaves)
    return 0 if grow <= 0 or first >= last else self.period * math.ceil((last - first) / grow)

  def apply(self, positions, step, *trees, period=None, key=None):
    """``trees`` masked: leaf l of each tree times the leaf's mask at ``step``.

    ``positions``: the leaves' depth positions 0..L−1, a tree of ints of the trees' structure;
    ``period``: as :meth:`num_matched`'s; ``key``: the run's PRNG key, which the dropout masks are
    drawn from (needed when ``dropout`` > 0)."""
    num = len(jax.tree.leaves(positions))
    threshold = num - self.num_matched(num, step, period)
    if self.dropout and key is None:
      raise ValueError("stepwise gradient dropout draws its masks from the run's PRNG key (key=)")
    if self.dropout:
      key = jax.random.fold_in(key, step)
    flat, treedef = jax.tree.flatten(positions)
    masks = []
    for i, (position, leaf) in enumerate(zip(flat, jax.tree.leaves(trees[0]))):
      keep = (jnp.asarray(position) >= threshold).astype(leaf.dtype)
      if self.dropout:
        keep = keep * jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - self.dropout,
                                           leaf.shape).astype(leaf.dtype)
      masks.append(keep)
    masks = jax.tree.unflatten(treedef, masks)
    return tuple(jax.tree.map(jnp.multiply, tree, masks) for tree in trees)


def dummy_gradient(apply_fn, variables, x, targets, *, train: bool = False,
                   loss_fn=cross_entropy):
  """∇_θ L(f_θ(x), targets) at ``variables["params"]``: the gradient a client with data x would send.
  ``x``: (N, ...) the model's inputs; ``targets``: what ``loss_fn`` takes, (N,) int labels or (N, K)
  soft targets for cross entropy. Returns a tree shaped as ``variables["params"]``."""

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), targets)

  return jax.grad(loss)(variables["params"])


def _unit(tree, eps=1e-12):
  """tree / ‖tree‖ with the norm over all leaves (sqrt(Σ + eps): differentiable at 0)."""
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)) + eps)
  return jax.tree.map(lambda x: x / norm, tree)


def _layer_mean_unit(tree, eps=1e-12):
  """tree / mean_l ‖tree_l‖ over its L leaves (each norm sqrt(Σ + eps): differentiable at 0)."""
  leaves = jax.tree.leaves(tree)
  norm = sum(jnp.sqrt(jnp.sum(jnp.square(x)) + eps) for x in leaves) / len(leaves)
  return jax.tree.map(lambda x: x / norm, tree)


HEAD = "head"  # the dense head's module name in gradjax's models (and their captured twins)


def _with_head_input(apply_fn, variables, x, train: bool, layer: str = HEAD):
  """(logits, (N, F) input of the module named ``layer``) of one forward pass, seen on its way
  (:func:`gradjax.models.taps.intercept`: the model runs unchanged). Raises ValueError when no
  module of that name is called."""
  seen = []

  def head(call, proceed):
    if call.name == layer and call.method == "__call__":
      seen.append(call.args[0])
    return proceed()

  with taps.intercept(head):
    logits = apply_fn(variables, x, train)
  if not seen:
    raise ValueError(f"the model calls no module named {layer!r} (its dense head)")
  return logits, seen[-1].reshape(x.shape[0], -1)


def head_input(apply_fn, variables, x, train: bool = False, *, layer: str = HEAD) -> jax.Array:
  """(N, F): the input of the module named ``layer`` (the model's dense head) when the model runs on
  ``x``. Raises ValueError when no module of that name is called."""
  return _with_head_input(apply_fn, variables, x, train, layer)[1]


def _gradient_and_head_input(apply_fn, variables, x, targets, train, loss_fn):
  """(∇_θ L(f_θ(x), targets), head input of x) from one forward pass: the head-feature term reads
  the activations the dummy gradient computes anyway."""

  def loss(params):
    logits, h = _with_head_input(apply_fn, {**variables, "params": params}, x, train)
    return loss_fn(logits, targets), h

  return jax.grad(loss, has_aux=True)(variables["params"])


# Nine parameters: the model and the distance, then one keyword per part or term of the objective,
# each with the plain DLG objective's default.
def gradient_matching(apply_fn, distance: Callable | Distance, *, matched: Matched = Gradient(),
                      loss_fn=cross_entropy, prior: Callable | None = None,
                      one_sample_per_step: bool = False, stepwise: Stepwise | None = None,
                      head_features: float = 0.0, smoothing: Smoothing | None = None) -> Callable:
  """Returns ``objective(dummy, observation, labels=None, step=0, weights=None) -> scalar``:

      D(u(x', y'), v) + R(x', step) + λ Σ_n w_n ‖h(x'_n) − t_n‖² / Σ_n w_n ‖t_n‖²

  where ``matched`` says what u and v are, with g' = ∇_θ L(f_θ(x'), y') the dummy gradient and g
  the observation: :class:`Gradient` (u = g', v = g: FedSGD, DLG and relatives), :class:`Replay`
  (the client's local training replayed on the dummy data against the observed update: FedAvg,
  Geiping et al. 2020 §6), :class:`ScaledDifference` (DLM's u = g', v = γ ΔW),
  :class:`Normalised` (DLM+'s unit vectors) or :class:`ClippedGradient` (u the mean of the dummy
  examples' gradients clipped as a DP-SGD client clips its own).

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    distance: ``distance(dummy_gradient, observed_gradient) -> scalar``, or a
      :class:`gradjax.distances.Distance` (one that reads the step, an annealed kernel, is given it).
    matched: what is matched (above); :data:`MATCHED` by name, built by :func:`matched`.
    loss_fn: the client's loss, ``loss_fn(logits, targets)``; targets are int labels or soft labels.
    prior: optional image prior ``prior(x, step, network) -> scalar`` (weights included), e.g.
      :func:`gradjax.priors.combine`; ``network`` is the attacked model with the observation's
      variables and moments (:class:`gradjax.priors.Network`), read by priors such as the BatchNorm
      prior.
    one_sample_per_step: DLG's batch option: at step t only dummy example t mod N receives a
      gradient (the others are held by ``stop_gradient``); the objective value is unchanged.
    stepwise: HFGInv's schedule of matched layers and gradient dropout (:class:`Stepwise`), applied
      to u and v before the distance; the objective then needs ``positions``.
    head_features: λ, the weight of the last term: each example's head input h(x'_n)
      (:func:`head_input`) against a target t_n with weight w_n (``head_targets``, from the head's
      gradient for that example's label, :func:`gradjax.analytic.head_inputs`); 0: no such term.
      With :class:`Gradient` only.
    smoothing: the dummy gradient (and head input) of the model rounded at the step's sharpness
      (:class:`Smoothing`; ``apply_fn`` must take ``sharpness=``, :func:`gradjax.models.smoothable`),
      or ``None``: of the model itself. Not with :class:`Replay`.

  The returned objective takes
    dummy: ``{"x": (N, H, W, C)}`` (or any input the model reads, e.g. (N, T, dim) embeddings) plus
      ``"label_logits": (N, K)`` ((N, T, V) for a language model) when labels are optimised jointly
      (DLG), then the targets are ``softmax(label_logits)``; plus ``"log_gamma"`` with
      :class:`ScaledDifference`.
    observation: the :class:`~gradjax.observation.Observation` (gradient and variables).
    labels: int (N,) labels used when ``dummy`` has no ``"label_logits"`` (known or inferred).
    step: the optimizer step (int scalar), for scheduled priors and ``one_sample_per_step``.
    weights: optional per-leaf distance weights (see :func:`gradjax.distances.depth_weights`).
    label_mask: optional (K,) bool: the classes soft labels may take; the others' logits are set to
      the dtype's minimum, so they get probability 0 (and no gradient).
    positions: with ``stepwise``, every parameter leaf's depth position 0..L−1 (a tree of ints of the
      gradient's structure, :func:`gradjax.distances.leaf_positions`).
    head_targets: with ``head_features``, (t (N, F), w (N,)) in the examples' order.
    schedule: the step counts of ``prior`` (built by :func:`gradjax.priors.combine`), ``stepwise``
      and ``smoothing`` as data (:class:`Schedule`), or ``None``: those the records hold.
    key: the run's PRNG key, for draws the objective makes: ``stepwise`` gradient dropout's masks.
  """

  if not isinstance(matched, (Gradient, Replay)):
    raise ValueError(f"matched must be one of {', '.join(c.__name__ for c in MATCHED.values())}, "
                     f"got {matched!r}")
  replay = isinstance(matched, Replay)
  if head_features and type(matched) not in (Gradient, ClippedGradient):
    raise ValueError("the head-feature term reads the dummy gradient's forward pass against the "
                     "observed gradient: the 'gradient' objectives only (plain or clipped)")
  if smoothing is not None and replay:
    raise ValueError("smoothing rounds the model of one gradient; replay's local steps are not rounded")
  distance = as_distance(distance)

  def objective(dummy, observation: Observation, labels=None, step=0, weights=None, label_mask=None,
                positions=None, head_targets=None, schedule: Schedule | None = None, key=None):
    x, logits = dummy["x"], dummy.get("label_logits")
    if logits is not None and label_mask is not None:
      logits = jnp.where(label_mask, logits, jnp.finfo(logits.dtype).min)
    if one_sample_per_step:
      active = jnp.arange(x.shape[0]) == step % x.shape[0]
      x = jnp.where(active.reshape(-1, *[1] * (x.ndim - 1)), x, jax.lax.stop_gradient(x))
      if logits is not None:
        logits = jnp.where(active.reshape(-1, *[1] * (logits.ndim - 1)), logits,
                           jax.lax.stop_gradient(logits))
    targets = labels if logits is None else jax.nn.softmax(logits, axis=-1)
    model = apply_fn  # the dummy gradient's model: rounded while a smoothing sharpens it
    if smoothing is not None:
      model = functools.partial(apply_fn, sharpness=smoothing.sharpness(
          step, None if schedule is None else schedule.until))
    if replay:
      u, v = matched.update(model, observation, x, targets, loss_fn), observation.gradient
    else:
      if isinstance(matched, ClippedGradient):  # each example's gradient: the features apart
        g = matched.gradient(model, observation.variables, x, targets, train=observation.train,
                             loss_fn=loss_fn)
        if head_features:
          h = head_input(model, observation.variables, x, observation.train)
      elif head_features:
        g, h = _gradient_and_head_input(model, observation.variables, x, targets, observation.train,
                                        loss_fn)
      else:
        g = dummy_gradient(model, observation.variables, x, targets, train=observation.train,
                           loss_fn=loss_fn)
      u, v = matched.match(g, observation.gradient, dummy, step)
    if stepwise is not None:
      if positions is None:
        raise ValueError("stepwise matching needs the leaves' depth positions (positions=)")
      u, v = stepwise.apply(positions, step, u, v, key=key,
                            period=None if schedule is None else schedule.period)
    value = distance(u, v, weights=weights, step=step)
    if prior is not None:
      network = Network(apply_fn, observation.variables, observation.train, observation.moments)
      value = value + (prior(x, step, network) if schedule is None else
                       prior(x, step, network, starts=schedule.starts))
    if head_features:
      if head_targets is None:
        raise ValueError("the head-feature term needs its targets (head_targets=)")
      t, w = head_targets
      value = value + head_features * jnp.sum(w[:, None] * jnp.square(h - t)) / (
          jnp.sum(w[:, None] * jnp.square(t)) + 1e-12)
    return value

  return objective

