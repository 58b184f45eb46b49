"""Label inference from an observed gradient.

Every method reads the gradient of the last dense layer ("head"), kernel W (Flax layout
(features, classes)) and bias b, of the mean cross entropy over the N examples of the observation.
With softmax probabilities p_n = softmax(z_n), one-hot labels y_n and head inputs a_n (features)::

  ∂L/∂W[j, c] = (1/N) Σ_n a_nj (p_nc − y_nc)          ∂L/∂b_c = (1/N) Σ_n (p_nc − y_nc)

So a class's entries carry a negative term −a_nj/N (−1/N for the bias) for each of its k_c examples,
and a positive term p_nc a_nj/N for every example. All methods return int labels of shape (N,), a
multiset: the order is meaningless (score it with :func:`gradjax.metrics.label_accuracy`).

==============  =======  ====  =============  ===========  ========================================
method          batch    bias  features ≥ 0   duplicates   reference / when it is right
==============  =======  ====  =============  ===========  ========================================
idlg            1 only   no    yes, or bias   (n/a)        Zhao et al. 2020; exact for one example
negative_bias   any      yes   no             no (unique)  present ⇔ ∂L/∂b_c < 0 when p̄_c < k_c/N
yin             any      no    yes            no (unique)  Yin et al. 2021 (GradInversion)
llg             any      no    yes            yes          Wainakh et al. 2022 (LLG; LLG+/LLG* with
                                                           :func:`llg_statistics`)
bias_counts     any      yes   no             yes          Geng et al. 2021 count estimate, on the
                                                           bias: exact given the batch-mean softmax
hfginv          any      no    yes            yes          Ye et al. 2024 (HFGInv): counts by an
                                                           evolutionary search against the sorted
                                                           features of auxiliary images
==============  =======  ====  =============  ===========  ========================================

"features ≥ 0": the head's inputs must be non-negative (a ReLU or sigmoid before the head: the zoo's
models with their own activations, not with ``act`` tanh, GELU, ELU or leaky ReLU); iDLG reads their
sign from the bias gradient instead where the head has a bias (:func:`idlg`). "unique": the method
returns N distinct classes (needs N ≤ K) and is only right when the batch has no repeated label.
Every rule assumes the client's model is untrained or barely trained: the positive terms p_nc a_nj/N
must stay small next to the negative ones, e.g. the mean probability p̄_c of a present class below
its share k_c/N. ``bias_counts`` drops that assumption
when the batch-mean probabilities are known.

The attacker-side helpers :func:`llg_statistics`, :func:`mean_probs` and :func:`feature_profile` run
the model on auxiliary or dummy inputs to estimate what LLG+ / LLG*, Geng et al. and HFGInv need.
``hfginv`` reads such a profile besides the observation, so it is called as :func:`hfginv`, not
by name from :data:`METHODS` (the command line's ``--config.attack.label_source=hfginv`` builds
the profile first).
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import models
from gradjax.compilation import check_key, once
from gradjax.losses import cross_entropy
from gradjax.objectives import head_input
from gradjax.observation import Observation

HEAD_KERNEL = ("head", "kernel")  # the dense head's parameter paths (objectives.HEAD names its module)
HEAD_BIAS = ("head", "bias")


def _leaf(gradient, path: tuple[str, ...]):
  node = gradient
  for key in path:
    if not hasattr(node, "keys") or key not in node:
      raise ValueError(f"no parameter at {'/'.join(path)} in the gradient tree; name the model's last "
                       "dense layer 'head' or pass its path")
    node = node[key]
  return node


def last_layer_gradient(gradient, path: tuple[str, ...] = HEAD_KERNEL) -> jax.Array:
  """The gradient of the last dense kernel, (features, classes), found at ``path`` in the tree."""
  node = gradient
  for key in path:
    if not isinstance(node, dict) or key not in node:
      raise ValueError(f"no parameter at {'/'.join(path)} in the gradient tree; name the model's last "
                       "dense layer 'head' or pass its path")
    node = node[key]
  if isinstance(node, dict) or jnp.ndim(node) != 2:
    raise ValueError(f"{'/'.join(path)} must be a 2-D dense kernel, got {'a subtree' if isinstance(node, dict) else jnp.shape(node)}")
  return node


def _finite(g, path: tuple[str, ...]):
  """``g``, or a one-line ValueError where it holds NaN or inf (a sign rule would read them as
  labels)."""
  if not np.all(np.isfinite(np.asarray(g))):
    raise ValueError(f"the observed gradient of {'/'.join(path)} contains NaN or inf")
  return g


def _batch(observation: Observation) -> int:
  """The observation's N, or a one-line ValueError where it is not positive."""
  if observation.num_samples < 1:
    raise ValueError(f"num_samples must be positive, got {observation.num_samples}")
  return observation.num_samples


def last_layer_bias_gradient(gradient, path: tuple[str, ...] = HEAD_BIAS) -> jax.Array:
  """The gradient of the last dense bias, (classes,), found at ``path`` in the tree."""
  node = _leaf(gradient, path)
  if hasattr(node, "keys") or jnp.ndim(node) != 1:
    raise ValueError(f"{'/'.join(path)} must be a 1-D dense bias (the method needs a head with a bias), "
                     f"got {'a subtree' if hasattr(node, 'keys') else jnp.shape(node)}")
  return jnp.asarray(node)


def _check_unique(n: int, num_classes: int, method: str) -> None:
  if n > num_classes:
    raise ValueError(f"{method} returns distinct labels, so it needs batch ≤ classes; got batch {n} "
                     f"and {num_classes} classes (use llg or bias_counts)")


def idlg(observation: Observation, path: tuple[str, ...] = HEAD_KERNEL) -> jax.Array:
  """iDLG label of a single-example observation: int array of shape (1,).

  For one example with cross entropy ∂L/∂W[j, c] = a_j (p_c − y_c), so s_c = Σ_j ∂L/∂W[j, c] =
  (p_c − y_c) Σ_j a_j: only the true class's p_c − y_c is negative. With non-negative inputs a
  (after a sigmoid or ReLU) that is iDLG's rule, the label is argmin_c s_c. Inputs of either sign
  (after a tanh, GELU or ELU) can sum below 0, which flips every s_c, and the label is then
  argmax_c s_c: where the head has a bias (next to ``path``), its gradient β = p − y gives the sign,
  Σ_j a_j ≈ ⟨s, β⟩ / ⟨β, β⟩ (s = (Σ_j a_j) β for one example), read only where s is that multiple
  of β within half its norm (so that noise, which breaks the relation, leaves iDLG's rule, and its
  robustness, as they were).

  Reference: Zhao et al., "iDLG: Improved Deep Leakage from Gradients", 2020.
  Needs: batch 1, cross entropy; non-negative inputs to the last layer, or a bias there.
  """
  if observation.num_samples != 1:
    raise ValueError(f"iDLG label inference needs batch 1, the observation has "
                     f"{observation.num_samples} samples; for a batch choose another label source: "
                     "joint, negative_bias, yin, llg, bias_counts, llg_star (a batch's repeated "
                     "classes) or hfginv (with auxiliary images)")
  g = _finite(last_layer_gradient(observation.gradient, path), path)
  bias_path = (*path[:-1], "bias")
  try:
    bias = _finite(last_layer_bias_gradient(observation.gradient, bias_path), bias_path)
  except ValueError:  # no bias: iDLG's rule (non-negative inputs)
    return _most_negative_column(g)
  return _signed_column(g, bias)


@once
def _most_negative_column(g):
  # One program (op by op, each operation would compile alone).
  return jnp.argmin(jnp.sum(g, axis=0))[None]


@once
def _signed_column(g, bias):
  """argmin of the column sums s times the sign of Σ_j a_j, read from the bias gradient β where s
  is a multiple of it within half its norm (else +1: iDLG's rule)."""
  s = jnp.sum(g, axis=0).astype(jnp.float32)
  b = bias.astype(jnp.float32)
  scale = jnp.vdot(s, b) / jnp.maximum(jnp.vdot(b, b), jnp.finfo(jnp.float32).tiny)
  fits = jnp.linalg.norm(s - scale * b) <= 0.5 * jnp.linalg.norm(s)
  sign = jnp.where(fits & (scale < 0), -1.0, 1.0)
  return jnp.argmin(s * sign)[None]


def negative_bias(observation: Observation, path: tuple[str, ...] = HEAD_BIAS) -> jax.Array:
  """The N classes with the most negative bias gradient (distinct labels), int (N,).

  ∂L/∂b_c = p̄_c − k_c/N with p̄_c = (1/N) Σ_n p_nc and k_c the count of class c: negative exactly
  for the present classes while p̄_c < k_c/N (an untrained model with p̄_c ≈ 1/K < 1/N), and
  positive for every absent class (k_c = 0). Returns the classes sorted by ∂L/∂b_c, first N: if
  fewer than N are negative the remaining slots take the next most negative classes (no class
  twice); if more, the N most negative. Exact for batches without repeated labels whenever
  p̄_c < 1/N for the present classes; a batch with duplicates always loses its repeats.

  Needs: a bias in the last layer, N ≤ K. No assumption on the features.
  Reference: the sign rule of iDLG applied to the bias (e.g. the "analytic" label inference of
  Geiping et al.'s breaching library).
  """
  gb = _finite(last_layer_bias_gradient(observation.gradient, path), path)
  n = _batch(observation)
  _check_unique(n, gb.shape[0], "negative_bias")
  return jnp.argsort(gb, stable=True)[:n]


def yin(observation: Observation, path: tuple[str, ...] = HEAD_KERNEL) -> jax.Array:
  """GradInversion label restoration (distinct labels), int (N,).

  m_c = min_j ∂L/∂W[j, c]; labels = the N classes with the smallest m_c. With non-negative features
  every entry of an absent class is ≥ 0 (only the p_nc a_nj terms), while a present class has
  negative entries at features j where its example's −(1 − p) a_nj outweighs the others' p a_nj.

  Needs: non-negative head inputs, N ≤ K, no repeated label in the batch (repeats are lost).
  Reference: Yin et al., "See through Gradients: Image Batch Recovery via GradInversion", CVPR 2021
  (batch label restoration from the fully connected layer's gradient).
  """
  g = _finite(last_layer_gradient(observation.gradient, path), path)
  n = _batch(observation)
  _check_unique(n, g.shape[1], "yin")
  return jnp.argsort(jnp.min(g, axis=0), stable=True)[:n]


def llg(observation: Observation, path: tuple[str, ...] = HEAD_KERNEL, *, impact=None,
        offset=None) -> jax.Array:
  """Label Leakage from Gradients (LLG), duplicate-aware, int (N,).

  With g_c = Σ_j ∂L/∂W[j, c] (K,) and non-negative features, g_c = (1/N) Σ_n (p_nc − y_nc) σ_n
  (σ_n = Σ_j a_nj > 0): each example of class c adds about −σ/N to g_c, so a class present k_c times
  sits near k_c · m with the per-example "impact" m < 0. The algorithm:

  1. every class with g_c < 0 is present: assign it once and set g_c ← g_c − m (if more than N are
     negative, the N most negative);
  2. subtract the per-class offset s_c (the positive part g_c of a class absent from the batch;
     0 for plain LLG), then fill the remaining slots greedily: c = argmin_c g_c; assign c;
     g_c ← g_c − m (m < 0, so g_c rises by |m| and another class or a repeat comes next).

  Plain LLG estimates the impact from the observed gradient alone (the (1 + 1/K) factor as in the
  authors' code): m = (1 + 1/K) · (1/N) Σ_{c: g_c < 0} g_c. LLG+ (auxiliary real inputs) and LLG* (dummy inputs)
  measure m and s on the attacker's copy of the model with :func:`llg_statistics` and pass them here.

  Args:
    observation: mean-loss gradient over N examples.
    path: the head's kernel.
    impact: m, a negative scalar (estimated from the gradient when None).
    offset: s, (K,) (zeros when None).

  Returns:
    int (N,) labels; a class can appear several times.

  Needs: non-negative head inputs and an (almost) untrained model.
  Reference: Wainakh et al., "User-Level Label Leakage from Gradients in Federated Learning",
  PoPETs 2022(2), and their code (tklab-tud/LLG, Code/Predictor.py: v1 = LLG, v2 = LLG+,
  v3-{zero,one,random} = LLG*).
  """
  g = jnp.sum(_finite(last_layer_gradient(observation.gradient, path), path), axis=0)
  n, k = _batch(observation), g.shape[0]
  if not bool(jnp.any(g != 0)):
    raise ValueError("the head's kernel gradient is zero; nothing to infer labels from")
  negative = g < 0
  if impact is None:
    impact = jnp.sum(jnp.where(negative, g, 0.0)) / n * (1.0 + 1.0 / k)
  impact = jnp.asarray(impact, g.dtype)
  if not bool(impact < 0):
    raise ValueError(f"the LLG impact must be negative (a present class lowers g_c), got {float(impact)}")
  if offset is None:
    offset = jnp.zeros_like(g)
  offset = jnp.asarray(offset, g.dtype)
  if offset.shape != g.shape:
    raise ValueError(f"offset must have shape {g.shape}, got {offset.shape}")
  return _llg_assign(g, offset, impact, n)


@functools.partial(once, static_argnums=3)
def _llg_assign(g, offset, impact, n: int) -> jax.Array:
  """LLG's two stages for row sums g (K,), offset s (K,) and impact m < 0: int (n,) labels."""
  k = g.shape[0]
  ranked = jnp.argsort(g, stable=True)
  first = jnp.minimum(jnp.sum(g < 0), n)  # stage-1 picks: the negative classes, most negative first

  def pick(i, state):
    scores, labels = state
    c = jnp.where(i < first, ranked[jnp.minimum(i, k - 1)], jnp.argmin(scores))
    return scores.at[c].add(-impact), labels.at[i].set(c)

  # Stage-1 picks come first, so by the first stage-2 argmin every stage-1 class carries its −m.
  _, labels = jax.lax.fori_loop(0, n, pick, (g - offset, jnp.zeros(n, ranked.dtype)))
  return labels


def llg_statistics(apply_fn: Callable, variables, x, num_samples: int, *,
                   path: tuple[str, ...] = HEAD_KERNEL, train: bool = False) -> tuple[jax.Array, jax.Array]:
  """Impact m and offset s of LLG+ / LLG*, measured on the attacker's copy of the model.

  For each class c the attacker computes the head gradient of the mean cross entropy of its own
  inputs ``x`` (M examples) all labelled c, with row sums r⁽ᶜ⁾ = Σ_j ∂L/∂W[j, :] (K,). Then::

    m   = (1 + 1/K) · (1/K) Σ_c r⁽ᶜ⁾_c / N          (per-example impact in an N-example mean)
    s_c = 1/(K − 1) Σ_{c' ≠ c} r⁽ᶜ'⁾_c               (g_c of a class absent from the batch)

  With real auxiliary inputs from the client's distribution this is LLG+; with dummy inputs
  (zeros, ones or noise) it is LLG* (Wainakh et al. 2022; tklab-tud/LLG Code/Predictor.py).

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: the model the server sent.
    x: (M, H, W, C) auxiliary or dummy inputs.
    num_samples: N of the observation to attack.
    path: the head's kernel in the params tree.
    train: run the model in training mode.

  Returns:
    (impact m, scalar; offset s, (K,)), to pass to :func:`llg`.
  """
  x = jnp.asarray(x)
  if x.ndim != 4 or x.shape[0] < 1:
    raise ValueError(f"auxiliary inputs must be (M, H, W, C) with M ≥ 1, got shape {x.shape}")
  _check_auxiliary(apply_fn, variables, x, train)
  if num_samples < 1:
    raise ValueError(f"num_samples must be positive, got {num_samples}")

  r = _class_row_sums(apply_fn, variables, x, path, train)  # r[c]: row sums, batch all labelled c
  k = r.shape[0]
  own = jnp.diagonal(r)
  impact = jnp.mean(own) / num_samples * (1.0 + 1.0 / k)
  offset = (jnp.sum(r, axis=0) - own) / (k - 1)
  return impact, offset


@functools.partial(once, static_argnums=(0, 3, 4))
def _class_row_sums(apply_fn, variables, x, path, train) -> jax.Array:
  """(K, K): row c holds Σ_j ∂L/∂W[j, :] of the mean cross entropy of x with every label set to c."""

  def row_sums(c):
    def loss(params):
      logits = apply_fn({**variables, "params": params}, x, train)
      return cross_entropy(logits, jnp.full((x.shape[0],), c, jnp.int32))
    return jnp.sum(last_layer_gradient(jax.grad(loss)(variables["params"]), path), axis=0)

  k = last_layer_gradient(variables["params"], path).shape[1]
  return jax.lax.map(row_sums, jnp.arange(k))


def bias_counts(observation: Observation, probs=None, path: tuple[str, ...] = HEAD_BIAS) -> jax.Array:
  """Label counts from the bias gradient (duplicate-aware), int (N,).

  For softmax cross entropy ∂L/∂b_c = p̄_c − k_c/N with p̄_c = (1/N) Σ_n p_nc, so::

    k_c = N · (p̄_c − ∂L/∂b_c)

  ``probs`` is p̄ (K,); None uses 1/K (an untrained model with small logits). The real-valued k is
  rounded to a multiset of exactly N labels by the largest-remainder method: negatives clipped to 0,
  rescaled to sum N, each class gets ⌊k_c⌋ and the leftover slots go to the largest remainders
  (ties to the lower class).

  Exact (up to rounding error) when ``probs`` is the batch-mean softmax of the client's examples;
  with an estimate p̂ the counts are right as long as N · |p̂_c − p̄_c| < 1/2 for every class
  (e.g. 1/K on an untrained model with near-uniform outputs, or :func:`mean_probs` of auxiliary
  or dummy inputs). No assumption on the features or on duplicates. This is the count estimate of
  Geng et al. 2021 (there on the kernel row sums with an estimated mean feature sum Ô; the bias is
  the kernel row of a constant feature 1, so here Ô = 1 exactly).

  Needs: a bias in the last layer, softmax cross entropy.
  Reference: Geng et al., "Towards General Deep Leakage in Federated Learning", arXiv:2110.09074.
  """
  gb = _finite(last_layer_bias_gradient(observation.gradient, path), path)
  n, k = _batch(observation), gb.shape[0]
  if probs is None:
    probs = jnp.full((k,), 1.0 / k, gb.dtype)
  probs = jnp.asarray(probs, gb.dtype)
  if probs.shape != (k,):
    raise ValueError(f"probs must be the ({k},) mean class probabilities, got shape {probs.shape}")
  p = np.asarray(probs, np.float64)
  if not (np.all(np.isfinite(p)) and np.all(p >= 0) and abs(p.sum() - 1) <= 1e-3):
    raise ValueError(f"probs must be class probabilities (finite, >= 0, summing to 1), got sum "
                     f"{p.sum():.4g}, min {p.min():.4g}")
  return _largest_remainder(n * (probs - gb), n)


@functools.partial(once, static_argnums=1)
def _largest_remainder(counts, n: int) -> jax.Array:
  """Rounds real counts (K,) to integers summing to n (largest remainder), as an int (n,) multiset."""
  q = jnp.maximum(counts, 0.0)
  total = jnp.sum(q)
  q = jnp.where(total > 0, q * n / jnp.where(total > 0, total, 1.0), jnp.full_like(q, n / q.shape[0]))
  base = jnp.floor(q)
  left = n - jnp.sum(base).astype(jnp.int32)
  order = jnp.argsort(-(q - base), stable=True)
  extra = jnp.zeros(q.shape[0], jnp.int32).at[order].set((jnp.arange(q.shape[0]) < left).astype(jnp.int32))
  per_class = base.astype(jnp.int32) + extra
  return jnp.repeat(jnp.arange(q.shape[0]), per_class, total_repeat_length=n)


def mean_probs(apply_fn: Callable, variables, x, *, train: bool = False) -> jax.Array:
  """p̂_c = (1/M) Σ_m softmax(f(x_m))_c over the attacker's inputs x (M, H, W, C): (K,).

  The estimate of p̄ that Geng et al. take from dummy inputs; pass it to :func:`bias_counts`.
  """
  x = jnp.asarray(x)
  if x.ndim != 4 or x.shape[0] < 1:
    raise ValueError(f"inputs must be (M, H, W, C) with M ≥ 1, got shape {x.shape}")
  return jnp.mean(jax.nn.softmax(apply_fn(variables, x, train), axis=-1), axis=0)


# --- HFGInv: counts by an evolutionary search -------------------------------------------------------


class FeatureProfile(NamedTuple):
  """What HFGInv learns from auxiliary images about the head's input features.

  Each auxiliary image's feature vector a_m (F,) is sorted ascending, s_m = sort(a_m); over the M
  images, position i has mean s̄_i and coefficient of variation CV_i = std_m(s_mi) / s̄_i (std with
  M − 1). ``mean``: s̄ (F,); ``positions``: the P positions of lowest CV, (P,) int, most stable first.
  """

  mean: jax.Array
  positions: jax.Array


def _check_auxiliary(apply_fn, variables, x, train) -> None:
  """A one-line ValueError where the model cannot read the auxiliary inputs ``x`` (M, H, W, C)
  (e.g. NCHW images: Flax's own error names the kernel's shapes)."""
  models.output_shape(apply_fn, variables, x.shape[1:], x.dtype, train,
                      what="an auxiliary input (M, H, W, C, in the model's input space), one example")


_head_input = once(head_input, static_argnums=(0, 3))  # (apply_fn, variables, x, train)


def feature_profile(apply_fn: Callable, variables, x, *, positions: int = 20,
                    train: bool = False) -> FeatureProfile:
  """HFGInv's reference profile from M ≥ 2 auxiliary (public) inputs ``x`` (M, H, W, C).

  Ye et al. use 40 web images and the 20 lowest-CV positions of a ResNet-34's 512 pooled features.
  """
  x = jnp.asarray(x)
  if x.ndim != 4 or x.shape[0] < 2:
    raise ValueError(f"auxiliary inputs must be (M, H, W, C) with M ≥ 2, got shape {x.shape}")
  _check_auxiliary(apply_fn, variables, x, train)
  features = _head_input(apply_fn, variables, x, train)
  s = np.sort(np.asarray(features, np.float64), axis=1)
  if not 1 <= positions <= s.shape[1]:
    raise ValueError(f"positions must be in [1, {s.shape[1]}] (the head's inputs), got {positions}")
  mean = s.mean(axis=0)
  with np.errstate(divide="ignore", invalid="ignore"):
    cv = np.where(mean > 0, s.std(axis=0, ddof=1) / mean, np.inf)
  if not np.isfinite(cv).any():
    raise ValueError("the auxiliary features are never positive: HFGInv needs non-negative head "
                     "inputs with some spread (a ReLU before the head)")
  order = np.argsort(cv, kind="stable")[:positions]
  return FeatureProfile(jnp.asarray(mean, jnp.float32), jnp.asarray(order, jnp.int32))


def count_fitness(counts, target, profile_values, n: int):
  """HFGInv's fitness of per-class counts: cos(v, g) with v_c = (k_c / N) · s̄[P] and g_c the sorted
  |∂L/∂W[:, c]| at P, both stacked over the candidate classes.

  ``counts``: (K,) (0 off the candidates); ``target``: (K, P) (0 off the candidates);
  ``profile_values``: s̄[P], (P,). Returns a scalar in [−1, 1].
  """
  v = (counts / n)[:, None] * profile_values[None, :]
  return jnp.sum(v * target) / (jnp.linalg.norm(v) * jnp.linalg.norm(target) + 1e-30)


def _repair(counts, candidates, n: int):
  """Positive integer counts on the candidates summing to n: 1 each, plus n − |C| shared in
  proportion to (counts − 1)⁺ by the largest-remainder rule (evenly when that is all zero)."""
  spare = n - jnp.sum(candidates)
  extra = jnp.where(candidates, jnp.maximum(counts - 1.0, 0.0), 0.0)
  total = jnp.sum(extra)
  share = jnp.where(total > 0, extra / jnp.where(total > 0, total, 1.0),
                    candidates / jnp.sum(candidates)) * spare
  base = jnp.floor(share)
  left = (spare - jnp.sum(base)).astype(jnp.int32)
  order = jnp.argsort(jnp.where(candidates, -(share - base), jnp.inf), stable=True)
  bonus = jnp.zeros(counts.shape[0]).at[order].set((jnp.arange(counts.shape[0]) < left).astype(base.dtype))
  return jnp.where(candidates, 1.0 + base + bonus, 0.0)


def _mutate(key, counts, candidates):
  """Moves one count from a random candidate holding more than one to another random candidate."""
  k_src, k_dst = jax.random.split(key)
  source_ok = candidates & (counts > 1)
  src = jnp.argmax(jnp.where(source_ok, jax.random.uniform(k_src, counts.shape), -1.0))
  dst_ok = candidates & (jnp.arange(counts.shape[0]) != src)
  dst = jnp.argmax(jnp.where(dst_ok, jax.random.uniform(k_dst, counts.shape), -1.0))
  move = jnp.any(source_ok) & jnp.any(dst_ok)
  return counts.at[src].add(jnp.where(move, -1.0, 0.0)).at[dst].add(jnp.where(move, 1.0, 0.0))


@functools.partial(jax.jit, static_argnames=("n", "population", "generations"))
def evolve_counts(key, target, profile_values, candidates, *, n: int, population: int = 20,
                  generations: int = 199):
  """HFGInv's evolutionary search for per-class counts maximising :func:`count_fitness`.

  Individuals are count vectors (K,) with k_c ≥ 1 on the candidates, 0 elsewhere, Σ k_c = n.
  Generation: every individual i mates with a random partner (a random permutation of the population),
  uniform crossover (each gene from either parent with probability 0.5), repaired to a valid count
  vector (:func:`_repair`), then mutated by moving one count between two candidates; the child replaces
  its parent when its fitness is strictly higher. The population's fitness is one ``vmap``.

  Args:
    key: PRNG key. target: (K, P) sorted |gradient| rows at the profile positions (0 off candidates).
    profile_values: (P,). candidates: (K,) bool, at most n of them. n: the batch size.
    population: individuals (HFGInv: 20). generations: (HFGInv: fewer than 200).

  Returns:
    ``(counts (K,) float, fitness)`` of the fittest individual of the last generation.
  """
  k = candidates.shape[0]
  fitness = jax.vmap(lambda c: count_fitness(c, target, profile_values, n))
  init_key, key = jax.random.split(key)
  raw = jax.random.randint(init_key, (population, k), 1, n + 2).astype(jnp.float32)
  pop = jax.vmap(lambda c: _repair(c, candidates, n))(raw)
  fit = fitness(pop)

  def generation(carry, gen_key):
    pop, fit = carry
    k_perm, k_mask, k_mut = jax.random.split(gen_key, 3)
    partners = pop[jax.random.permutation(k_perm, population)]
    mask = jax.random.bernoulli(k_mask, 0.5, pop.shape)
    children = jax.vmap(lambda c: _repair(c, candidates, n))(jnp.where(mask, pop, partners))
    children = jax.vmap(_mutate, in_axes=(0, 0, None))(jax.random.split(k_mut, population), children,
                                                         candidates)
    child_fit = fitness(children)
    better = child_fit > fit
    return (jnp.where(better[:, None], children, pop), jnp.where(better, child_fit, fit)), None

  (pop, fit), _ = jax.lax.scan(generation, (pop, fit), jax.random.split(key, generations))
  best = jnp.argmax(fit)
  return pop[best], fit[best]


def hfginv(observation: Observation, profile: FeatureProfile, key: jax.Array, *,
           population: int = 20, generations: int = 199, path: tuple[str, ...] = HEAD_KERNEL) -> jax.Array:
  """HFGInv's duplicate-aware labels, int (N,) sorted by class.

  1. Candidates: the classes whose head-kernel gradient column has a negative mean,
     mean_j ∂L/∂W[j, c] < 0 (a present class's column carries −(1 − p) a_nj / N per example); if more
     than N, the N most negative.
  2. Target: g_c = sort_j |∂L/∂W[j, c]| at the profile's P stable positions, per candidate.
  3. Counts: :func:`evolve_counts` maximises cos(stack_c (k_c / N) s̄[P], stack_c g_c), the sorted
     feature profile of one example (auxiliary images, :func:`feature_profile`) scaled by each class's
     share of the batch.

  Needs: non-negative head inputs, a model whose features of different images have similar sorted
  profiles (a trained network), auxiliary images from a similar distribution.
  Reference: Ye et al., "High-Fidelity Gradient Inversion in Distributed Learning", AAAI 2024 (§ label
  restoration; their code: 20 individuals, fewer than 200 generations, one-to-one replacement).
  """
  g = jnp.asarray(_finite(last_layer_gradient(observation.gradient, path), path))
  n = _batch(observation)
  positions = jnp.asarray(profile.positions)
  if profile.mean.shape[0] != g.shape[0] or positions.ndim != 1:
    raise ValueError(f"the feature profile has {profile.mean.shape[0]} features, the head "
                     f"{g.shape[0]}: build it with feature_profile on this model")
  key = check_key(key)  # the evolution's draws: explicit, as every draw
  negative, labels = _hfginv(g, positions, jnp.asarray(profile.mean), key, n=n, population=population,
                             generations=generations)
  if int(negative) == 0:
    raise ValueError("no class has a negative mean head gradient: HFGInv finds no candidate class")
  return labels


@functools.partial(once, static_argnames=("n", "population", "generations"))
def _hfginv(g, positions, profile_mean, key, *, n: int, population: int, generations: int):
  """:func:`hfginv`'s steps 1-3 as one program: (the number of classes with a negative mean
  column, the labels int (n,))."""
  k = g.shape[1]
  means = jnp.mean(g, axis=0)
  negative = jnp.sum(means < 0)
  rank = jnp.zeros(k, jnp.int32).at[jnp.argsort(means, stable=True)].set(jnp.arange(k, dtype=jnp.int32))
  candidates = rank < jnp.minimum(negative, n)  # the min(negative, n) most negative columns
  target = jnp.where(candidates[:, None], jnp.sort(jnp.abs(g), axis=0).T[:, positions], 0.0)
  counts, _ = evolve_counts(key, target.astype(jnp.float32), profile_mean[positions], candidates,
                            n=n, population=population, generations=generations)
  return negative, jnp.repeat(jnp.arange(k), counts.astype(jnp.int32), total_repeat_length=n)


METHODS: dict[str, Callable[[Observation], jax.Array]] = {
    "idlg": idlg,
    "negative_bias": negative_bias,
    "yin": yin,
    "llg": llg,
    "bias_counts": bias_counts,
}
"""Label-inference methods by name; each maps an Observation to int (N,) labels (see the table)."""


def infer(observation: Observation, method: str) -> jax.Array:
  """Labels of ``observation`` by the method called ``method`` (a key of :data:`METHODS`)."""
  if method not in METHODS:
    raise ValueError(f"unknown label method {method!r}; choose one of {', '.join(METHODS)}")
  return METHODS[method](observation)


# --- label sources of an attack ---------------------------------------------------------------


def joint(observation: Observation) -> None:
  """The label source of DLG: no labels are fixed; the attack optimises soft labels softmax(z')
  with the data (Zhu et al. 2019). Returns None."""
  del observation


def known(observation: Observation) -> jax.Array:
  """The label source of a threat model that shares the labels (Inverting Gradients' protocol):
  the observation's own, (N,) int."""
  if observation.labels is None:
    raise ValueError("attack uses known labels but the observation carries none")
  return jnp.asarray(observation.labels)


LabelSource = Callable[[Observation], jax.Array | None]

SOURCES: dict[str, LabelSource] = {"joint": joint, "known": known, **METHODS}
"""An attack's labels by name: :func:`joint` (optimised, returns None), :func:`known`, or inferred by
a method of :data:`METHODS`. Any function of the observation returning (N,) int labels is one."""


def get_source(name: str) -> LabelSource:
  """The label source registered as ``name``."""
  if name not in SOURCES:
    raise ValueError(f"unknown label source {name!r}; choose one of {', '.join(SOURCES)}")
  return SOURCES[name]
