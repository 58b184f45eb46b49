"""Closed-form recovery of a dense layer's input from its gradient.

For a biased dense layer y = x W + b (Flax kernel W of shape (in, out)) and one example, the chain
rule gives ∂L/∂W[:, i] = x · ∂L/∂b_i for every output unit i. So the layer's input is
x = ∂L/∂W[:, i] / ∂L/∂b_i for any i with ∂L/∂b_i ≠ 0, whatever the loss and whatever follows the
layer. Combining all units by least squares (min_x Σ_i ‖∂L/∂W[:, i] − x ∂L/∂b_i‖²)::

  x = Σ_i ∂L/∂W[:, i] ∂L/∂b_i / Σ_i (∂L/∂b_i)²

which is exact for one example and weights each unit by |∂L/∂b_i|, so units with tiny bias
gradients (dead ReLUs, rounding noise) barely count. The sums run, for each input j, over the units
whose entry ∂L/∂W[j, i] is not 0: an update that pruning or sparsification thinned (a defense of
:mod:`gradjax.defenses`) still gives x_j exactly from any entry it kept, and 0 where it kept none
(the entries pruning drops are the smallest |x_j ∂L/∂b_i|, so those x_j are small).

For a batch of N examples the gradient of the mean loss is a sum of N such rank-one terms, and the
same formula returns a mixture Σ_n w_n x_n of the inputs (weights from the examples' bias
gradients), not any one input; :func:`dense_input` and its callers therefore refuse batches.
:func:`exclusive_neurons` separates a batch where the layer is followed by a ReLU: a unit that only
one example activates is a batch-1 layer of its own.

References: Phong et al., "Privacy-Preserving Deep Learning via Additively Homomorphic
Encryption", 2017 (input of a biased neuron from its gradients); Geiping et al., "Inverting
Gradients - How easy is it to break privacy in federated learning?", NeurIPS 2020, Prop. 3.1
(the input to any fully connected layer with bias is recoverable analytically); Pan et al.,
"Exploring the Security Boundary of Data Reconstruction via Neuron Exclusivity Analysis", USENIX
Security 2022 (exclusively activated neurons).
"""

import functools
from math import prod
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax.compilation import once
from gradjax.observation import Observation, check_observation

DEFAULT_MIN_ABS = 1e-12


def dense_input(kernel_grad, bias_grad, *, min_abs: float = DEFAULT_MIN_ABS) -> jax.Array:
  """The input x (in,) of a biased dense layer from its gradients, for one example.

  x = Σ_i gW[:, i] gb_i / Σ_i gb_i² (least squares over the output units; see the module docstring).

  Args:
    kernel_grad: ∂L/∂W, (in, out) (Flax layout).
    bias_grad: ∂L/∂b, (out,).
    min_abs: the bias gradients are "all zero" (nothing to recover) when max_i |gb_i| ≤ min_abs.

  Returns:
    (in,) array in the gradients' dtype.
  """
  gw, gb = jnp.asarray(kernel_grad), jnp.asarray(bias_grad)
  if gw.ndim != 2 or gb.ndim != 1 or gb.shape[0] != gw.shape[1]:
    raise ValueError(f"need a dense kernel gradient (in, out) and bias gradient (out,), got "
                     f"{gw.shape} and {gb.shape}")
  scale, x = _dense_input(gw, gb)
  if not bool(scale > min_abs):
    raise ValueError(f"every bias gradient is ≤ {min_abs:g} in magnitude (max {float(scale):.3g}); "
                     "the layer's input cannot be recovered from it")
  return x


@once
def _dense_input(gw, gb):
  """(max_i |gb_i|, :func:`dense_input`'s x) as one program."""
  scale = jnp.max(jnp.abs(gb))
  u = gb / scale  # rescaled so Σ u² cannot underflow
  # Per input j, only the units whose entry gW[j, i] is not 0 (a pruned or sparsified update zeroes
  # entries; unpruned, gW[j, i] = 0 only where x_j = 0 or gb_i = 0, which add nothing either way).
  kept = jnp.sum(jnp.where(gw != 0, u * u, 0.0), axis=1)
  return scale, jnp.where(kept > 0, (gw @ u) / (scale * jnp.where(kept > 0, kept, 1.0)), 0.0).astype(gw.dtype)


def _dense_layer(gradient, name: str, keyword: str):
  """(kernel gradient, bias gradient) of the layer called ``name``, or a one-line ValueError
  naming the ``keyword`` that chooses another."""
  if not isinstance(gradient, Mapping) or name not in gradient:
    raise ValueError(f"no layer {name!r} in the gradient tree (pass {keyword}=...)")
  layer = gradient[name]
  if not isinstance(layer, Mapping) or "kernel" not in layer or jnp.ndim(layer["kernel"]) != 2:
    raise ValueError(f"layer {name!r} is not a dense layer (needs a 2-D 'kernel')")
  if "bias" not in layer or jnp.ndim(layer["bias"]) != 1:
    raise ValueError(f"layer {name!r} has no bias; the closed form needs a biased dense layer")
  return layer["kernel"], layer["bias"]


def _check_single(observation: Observation) -> None:
  if observation.num_samples != 1:
    raise ValueError(f"closed-form input recovery needs batch 1, the observation has "
                     f"{observation.num_samples} samples (for a batch the result is a mixture of the inputs)")


def mlp_input(observation: Observation, input_shape, first_layer: str | None = None, *,
              min_abs: float = DEFAULT_MIN_ABS) -> jax.Array:
  """The client's input to an MLP whose first layer is a biased Dense on the flattened input.

  The first layer sees x.reshape(1, -1) (HWC order for NHWC images, as gradjax's ``mlp`` flattens),
  so :func:`dense_input` of its gradients, reshaped to ``input_shape``, is the input itself: exact up
  to floating-point rounding, in any state of training.

  Args:
    observation: a single-example observation.
    input_shape: (H, W, C) of one example.
    first_layer: the first layer's name in the gradient tree (default "Dense_0", gradjax's ``mlp``).
    min_abs: see :func:`dense_input`.

  Returns:
    (H, W, C) input, in the model's input space (normalised if the client normalised).
  """
  _check_single(observation)
  shape = tuple(int(d) for d in input_shape)
  name = "Dense_0" if first_layer is None else first_layer
  gw, gb = _dense_layer(observation.gradient, name, "first_layer")
  if jnp.shape(gw)[0] != prod(shape):
    raise ValueError(f"layer {name!r} takes {jnp.shape(gw)[0]} inputs, but input_shape {shape} has "
                     f"{prod(shape)} values; is it the first layer?")
  return dense_input(gw, gb, min_abs=min_abs).reshape(shape)


def dense_inputs_of(observation: Observation, *, min_abs: float = DEFAULT_MIN_ABS) -> dict[str, jax.Array]:
  """The recovered input of every biased dense layer in the gradient tree, for one example.

  A biased dense layer is a subtree with a 2-D "kernel" (in, out) and a 1-D "bias" (out,). Its input
  is e.g. the feature vector the head sees (after the last activation): the starting point of
  feature-level attacks. Layers whose bias gradients are all ≤ ``min_abs`` (nothing flows through
  them, e.g. every unit dead) are left out.

  Returns:
    {"/"-joined layer path: (in,) input}, e.g. {"Dense_0": (3072,), "head": (32,)} for ``mlp``.
  """
  _check_single(observation)
  found = {}

  def walk(node, path):
    if not isinstance(node, Mapping):
      return
    kernel, bias = node.get("kernel"), node.get("bias")
    if (kernel is not None and bias is not None and not isinstance(kernel, Mapping)
        and not isinstance(bias, Mapping) and jnp.ndim(kernel) == 2 and jnp.ndim(bias) == 1
        and jnp.shape(bias)[0] == jnp.shape(kernel)[1]):
      if bool(jnp.max(jnp.abs(jnp.asarray(bias))) > min_abs):
        found["/".join(path)] = dense_input(kernel, bias, min_abs=min_abs)
      return
    for key, child in node.items():
      walk(child, (*path, str(key)))

  walk(observation.gradient, ())
  return found


# --- batches through a ReLU dense layer -----------------------------------------------------------


class Separation(NamedTuple):
  """What :func:`exclusive_neurons` recovered of a batch.

  Attributes:
    inputs: (k, *input_shape) the recovered examples (the layer's inputs), in the order found.
    labels: (k,) int, each one's label (the one whose gradient the update holds).
    rounds: (k,) int, the round that found each: 0 by its exclusively activated neurons alone, r > 0
      once the examples of rounds < r were taken off the update.
    rank: the numerical rank of the layer's augmented gradient [∂L/∂W; ∂L/∂b] (in + 1, out): how
      many examples reached the layer (at most the batch size).
    singular_values: its largest min(out, N + 1) singular values, relative to the largest.
    residual: ‖what is left of the augmented gradient‖ / ‖the augmented gradient‖ after the
      recovered examples' terms are taken off (about 1e-6 when all were found, float32 rounding).
  """

  inputs: np.ndarray
  labels: np.ndarray
  rounds: np.ndarray
  rank: int
  singular_values: np.ndarray
  residual: float


@functools.partial(jax.jit, static_argnames=("apply_fn", "layer"))
def _bias_gradients(apply_fn, variables, layer: str, x, scale):
  """(M, K, out): scale · ∂L(f(x_m), k)/∂b for every candidate x_m (M, *input_shape) and every label
  k, b the bias of ``layer``, L the cross entropy. One forward per candidate; the K labels share it
  (∂L/∂logits = softmax(z) − e_k, so K backward passes of the part after ``layer``)."""
  params = variables["params"]

  def one(xm):
    def logits_of(bias):
      tree = {**params, layer: {**params[layer], "bias": bias}}
      return apply_fn({**variables, "params": tree}, xm[None], False)[0]

    logits, pullback = jax.vjp(logits_of, params[layer]["bias"])
    p = jax.nn.softmax(logits)
    cotangents = p[None, :] - jnp.eye(p.shape[0], dtype=p.dtype)
    return jax.vmap(lambda c: pullback(c)[0])(cotangents) * scale

  return jax.vmap(one)(x)


def _rank(s: np.ndarray, floor: float) -> int:
  return int(np.sum(s > floor))


def exclusive_neurons(observation: Observation, apply_fn: Callable, input_shape, *,
                      layer: str = "Dense_0", rank_tol: float = 1e-5, tol: float = 1e-3,
                      chunk: int = 128, max_rounds: int | None = None) -> Separation:
  """The examples of a batch, exactly, from the gradient of a biased dense layer followed by a ReLU.

  The layer y = relu(x W + b) sees examples x_n (n = 1..N); its gradient is a sum over them,
  [∂L/∂W; ∂L/∂b] = Σ_n x̃_n δ_nᵀ with x̃_n = (x_n, 1) and δ_n = ∂L/∂b (out,) of example n alone,
  which is 0 at every unit the example leaves inactive. Unit i's column is Σ_{n active at i} x̃_n δ_ni,
  so a unit that only example n activates (an exclusively activated neuron, Pan et al.) gives x_n as
  ∂L/∂W[:, i] / ∂L/∂b_i. No column says whether its unit is exclusive; the candidate x from each
  column is accepted only if the update holds that example's own gradient, which the attacker can
  compute from the model it sent (for every label k: δ(x, k) = ∂L(f(x), k)/∂b / N): G − x̃ δᵀ must
  lose one rank, that is δ lies in the row space of G = U S Vᵀ (rank r) and wᵀ c = 1 for the w with
  wᵀ (Uᵀ G) = δᵀ and c = Uᵀ x̃. A mixture of examples or a wrong label fails this (its δ lies in an
  r-dimensional subspace of R^out only by accident). The accepted examples' terms x̃ δᵀ are taken
  off and the search repeats: a unit that one remaining example activates beside recovered ones is
  exclusive now. This peeling is gradjax's; the acceptance test plays the role of SPEAR's sparsity
  filter (Dimitrov et al., NeurIPS 2024, who also use the gradient's low rank). It stops when every
  example reaching the layer is found or a round finds none.

  What it needs: the client's loss is the mean cross entropy over N = ``observation.num_samples``
  examples, each example's gradient is its own (no BatchNorm batch statistics: ``observation.train``
  is refused), the model is the one sent. It recovers nothing where no unit is exclusive, which is
  the secure side of Pan et al.'s boundary: inputs centred by normalisation make each unit active
  for about half the batch, so from batch 16 on a random 1024-unit layer has no exclusive unit.

  Args:
    observation: a FedSGD gradient (or a one-step FedAvg update read as one).
    apply_fn: the model, ``apply_fn(variables, x, train) -> logits``.
    input_shape: the shape of one example, e.g. (32, 32, 3); the layer reads it flattened.
    layer: the dense layer's name in the parameter tree (gradjax's ``mlp``: ``Dense_0``).
    rank_tol: singular values at most ``rank_tol`` times the largest one of the update are rounding
      (float32 gradients: about 1e-8 measured; the smallest example's at batch 128 on ``mlp-1024``
      about 1e-3).
    tol: the acceptance test's bound on ‖δ − its projection on the row space‖ / ‖δ‖ and on |wᵀc − 1|.
    chunk: candidates checked per call of the compiled program (one program for every round).
    max_rounds: at most this many rounds (default N).

  Returns:
    :class:`Separation`.
  """
  if observation.couples_examples:
    raise ValueError("exclusive_neurons needs each example's gradient to be its own; a client in "
                     "training mode (BatchNorm batch statistics) couples them")
  check_observation(observation)
  shape = tuple(int(d) for d in input_shape)
  gw, gb = _dense_layer(observation.gradient, layer, "layer")
  if jnp.shape(gw)[0] != prod(shape):
    raise ValueError(f"layer {layer!r} takes {jnp.shape(gw)[0]} inputs, but input_shape {shape} has "
                     f"{prod(shape)} values; is it the first layer?")
  n = int(observation.num_samples)
  g = np.vstack([np.asarray(gw, np.float64), np.asarray(gb, np.float64)[None]])  # (in + 1, out)
  total = float(np.linalg.norm(g))
  if total == 0.0:
    raise ValueError(f"layer {layer!r} has an all-zero gradient: no example reached it")
  s0 = np.linalg.svd(g, compute_uv=False)
  floor = rank_tol * s0[0]
  rank = _rank(s0, floor)
  dtype = np.asarray(gw).dtype
  found_x, found_y, found_round = [], [], []
  for round_ in range(n if max_rounds is None else max_rounds):
    left = n - len(found_x)
    norms = np.linalg.norm(g, axis=0)
    live = np.flatnonzero(norms > floor)  # columns with an example not yet taken off
    if left == 0 or live.size == 0:
      break
    u, s, vt = np.linalg.svd(g[:, live], full_matrices=False)
    r = min(_rank(s, floor), left)
    if r == 0:
      break
    u, s, vt = u[:, :r], s[:r], vt[:r]
    coords = u.T @ g[:, live]  # (r, live)
    candidates = _distinct_columns(coords, g[-1, live])
    if candidates.size == 0:
      break
    xs = g[:-1, live[candidates]] / g[-1, live[candidates]]  # (in, M)
    xt = np.vstack([xs, np.ones((1, xs.shape[1]))])
    c = u.T @ xt  # (r, M)
    accepted, score_of, delta_of = [], {}, {}
    for start in range(0, xs.shape[1], chunk):
      block = xs[:, start:start + chunk].T
      pad = chunk - block.shape[0]
      batch = np.concatenate([block, np.zeros((pad, block.shape[1]))]).reshape(chunk, *shape)
      deltas = np.asarray(_bias_gradients(apply_fn, observation.variables, layer,
                                          jnp.asarray(batch, dtype), 1.0 / n), np.float64)
      full = deltas[:block.shape[0]]  # (m, K, out): an accepted example's term is x̃ δᵀ
      deltas = full[:, :, live]
      proj = deltas @ vt.T  # (m, K, r)
      off = np.linalg.norm(deltas - proj @ vt, axis=-1) / np.maximum(
          np.linalg.norm(deltas, axis=-1), 1e-300)
      w = proj / s  # wᵀ (S Vᵀ) = δᵀ
      one = np.abs(np.einsum("mkr,rm->mk", w, c[:, start:start + chunk]) - 1.0)
      score = np.maximum(off, one)
      for m in range(block.shape[0]):
        k = int(np.argmin(score[m]))
        if score[m, k] <= tol:
          accepted.append((start + m, k))
          score_of[(start + m, k)] = float(score[m, k])
          delta_of[(start + m, k)] = full[m, k]
    accepted.sort(key=lambda mk: score_of[mk])
    new = _distinct_examples(xs, accepted, found_x)
    if not new:
      break
    terms = {mk: np.outer(xt[:, mk[0]], delta_of[mk]) for mk in new}
    # Each accepted example takes one rank off; if together they do not, keep only the best one.
    left_rank = _rank(np.linalg.svd(u.T @ (g[:, live] - sum(terms.values())[:, live]),
                                    compute_uv=False), floor)
    if left_rank > r - len(new):
      new = new[:1]
    for m, k in new:
      g = g - terms[(m, k)]
      found_x.append(xs[:, m].reshape(shape))
      found_y.append(k)
      found_round.append(round_)
  inputs = (np.stack(found_x) if found_x else np.zeros((0, *shape))).astype(dtype)
  top = s0[:min(s0.size, n + 1)] / s0[0]
  return Separation(inputs, np.asarray(found_y, np.int64), np.asarray(found_round, np.int64), rank,
                    top, float(np.linalg.norm(g)) / total)


def _distinct_columns(coords: np.ndarray, bias: np.ndarray, *, parallel: float = 1e-4) -> np.ndarray:
  """Indices of the columns of ``coords`` (r, M) worth a candidate: one per set of parallel columns
  (|sin| below ``parallel``: units activated by the same examples in proportion, among them every
  exclusive unit of one example), the one with the largest |bias| (the homogeneous coordinate
  divided by), and none whose bias gradient is 0."""
  scale = np.max(np.abs(bias))
  ok = np.flatnonzero(np.abs(bias) > 1e-6 * scale)
  if ok.size == 0:
    return ok
  d = coords[:, ok] / np.linalg.norm(coords[:, ok], axis=0)
  cos = np.abs(d.T @ d)
  same = np.sqrt(np.clip(1.0 - cos * cos, 0.0, None)) < parallel
  keep, taken = [], np.zeros(ok.size, bool)
  for i in np.argsort(-np.abs(bias[ok])):
    if not taken[i]:
      keep.append(ok[i])
      taken |= same[i]
  return np.asarray(keep, np.int64)


def _distinct_examples(xs: np.ndarray, accepted: list, found: list, *, rtol: float = 1e-3) -> list:
  """``accepted`` (candidate, label) pairs less those within ``rtol`` of an earlier one or of an
  example ``found`` in an earlier round (two units that isolate the same example)."""
  out, seen = [], [np.ravel(f) for f in found]
  for m, k in accepted:
    if all(np.linalg.norm(xs[:, m] - v) > rtol * np.linalg.norm(v) for v in seen):
      out.append((m, k))
      seen.append(xs[:, m])
  return out


# --- the dense head's input, per class ------------------------------------------------------------


class HeadInputs(NamedTuple):
  """What :func:`head_inputs` recovered of the features a dense head saw.

  Attributes:
    classes: (C,) the classes present in the batch.
    counts: (C,) how many examples of each.
    features: (C, F) the mean head input of each class's examples (the example's own for a class of
      one).
    own: (C,) m_c − Σ_n p_nc = −N ∂L/∂b_c: the weight of the class's own examples in its column of
      the gradient, less what the other examples' predictions of class c put there.
    dominance: (C,) |E_cc| / max_{k≠c} |E_kc| at the solution: how much more the class's own
      examples weigh in its column than any other class's (∞ for a batch of one class).
    usable: (C,) a class of one example whose column it dominates (``dominance`` at least
      ``min_dominance``): its feature row is that example's head input.
    residual: ‖H̄ᵀE(H̄) − ∂L/∂W‖ / ‖∂L/∂W‖ at the solution (0 when the examples of every class share
      their predictions, in particular when every class has one).
  """

  classes: np.ndarray
  counts: np.ndarray
  features: np.ndarray
  own: np.ndarray
  dominance: np.ndarray
  usable: np.ndarray
  residual: float


def head_inputs(kernel, bias, kernel_grad, bias_grad, labels, *, iterations: int = 200,
                nonnegative: bool = True, min_dominance: float = 3.0, mean_input=None,
                clipped: bool = False) -> HeadInputs:
  """The input of a dense head z = hᵀW + b per class present in a batch, from its gradient.

  With the mean cross entropy over N examples, ∂L/∂W = Σ_n h_n (p_n − e_{y_n})ᵀ / N with
  p_n = softmax(Wᵀh_n + b). Grouping the examples by class c (m_c of them, mean input h̄_c) and taking
  their predictions as equal, ∂L/∂W = H̄ᵀE(H̄) with E_c = m_c (softmax(Wᵀh̄_c + b) − e_c) / N (C × K):
  exact for classes of one example. The rows of E each sum to 0; with C < K classes they are
  generically independent and H̄ᵀ = ∂L/∂W E⁺ is the fixed point iterated here (with all K classes
  present they span K − 1 dimensions, and along the one combination of classes the gradient leaves
  free the pseudo-inverse takes the least-norm rows), from each
  class's column over its bias gradient
  (∂L/∂W[:, c] / ∂L/∂b_c, the batch-1 closed form, which the other examples' p_nc perturb).
  The fixed point is not unique where a class's own examples barely enter its column (the model
  already predicts c for them, or another example predicts c as surely): ``dominance`` and
  ``usable`` say where the row can be trusted as the example's features. (Chosen on CIFAR-10 test
  images 0-159 in batches of 8, the rows of classes of one example: with dominance >= 3, 50 of 65
  rows within 10 % of the truth (relative to the batch's spread) on DLG's LeNet, worst 0.44, and
  68 of 68 on an untrained convnet-16, whose near-uniform predictions keep ``own`` near 0.2 while
  its rows are exact; ``own`` >= 0.5 kept 49 of 65 on LeNet, worst 0.53, and none of convnet-16's.) A batch larger than K repeats classes: its rows are class
  means, and no example's own. With every class present the pseudo-inverse leaves the rows wrong
  along that free combination: H̄ + w uᵀ fits as well for w the left null vector of E (w_c ∝ 1/m_c
  when the predictions are near uniform) and any u; given ``mean_input``, an estimate of the batch's
  mean head input (e.g. the mean over the attacker's own images), u is chosen so that the rows'
  weighted mean Σ_c m_c H̄_c / N equals it.

  A DP-SGD client (``clipped``) scales each example's gradient by its own clipping factor a_n =
  min(1, C / ‖g_n‖), which the rows would take on (H̄ of a class of one comes out a_n h_n): E_c's
  weight is then s_c, a class's Σ a_n / N, unknown, read at each step by least squares from the bias
  gradient, ∂L/∂b = Σ_c s_c (softmax(Wᵀh̄_c + b) − e_c) (K equations, C < K unknowns). With every
  class present those rows sum to 0 and leave the weights a free direction: no row is ``usable``.

  Args:
    kernel, bias: the head's weights W (F, K) and bias b (K,), as the server sent them.
    kernel_grad, bias_grad: their gradients (F, K), (K,).
    labels: (N,) int, the batch's labels (known or inferred, e.g. :mod:`gradjax.labels`).
    iterations: fixed-point steps.
    nonnegative: clip the features at 0 (a head after a ReLU, a sigmoid or a pooling of them).
    min_dominance: ``usable`` needs ``dominance`` at least this.
    mean_input: (F,) the batch's mean head input as the attacker estimates it; used only when every
      class of the head is present (``None``: the least-norm rows).
    clipped: the gradient is DP-SGD's mean of clipped per-example gradients (above).

  Returns:
    :class:`HeadInputs`.

  Reference: the per-class recovery of the last layer's input under softmax and cross entropy is
  the first step of R-GAP's recursion (Zhu and Blaschko, ICLR 2021) and of feature-level attacks; the
  fixed point and the trust test are gradjax's.
  """
  w, b = np.asarray(kernel, np.float64), np.asarray(bias, np.float64)
  gw, gb = np.asarray(kernel_grad, np.float64), np.asarray(bias_grad, np.float64)
  y = np.asarray(labels).astype(np.int64)
  n, k = y.shape[0], w.shape[1]
  if gw.shape != w.shape or gb.shape != (k,) or b.shape != (k,):
    raise ValueError(f"a dense head's kernel (F, K), bias (K,) and their gradients, got {w.shape}, "
                     f"{b.shape}, {gw.shape}, {gb.shape}")
  if y.ndim != 1 or n == 0 or y.min() < 0 or y.max() >= k:
    raise ValueError(f"labels must be (N,) classes of the head's {k}, got {y}")
  classes, counts = np.unique(y, return_counts=True)
  onehot = np.eye(k)[classes]

  def errors(h):
    z = h @ w + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    unit = p / p.sum(axis=1, keepdims=True) - onehot
    if clipped and len(classes) < k:  # from the bias gradient: least squares, clamped above 0
      weight = np.maximum(np.linalg.lstsq(unit.T, gb, rcond=None)[0], 1e-300)
    else:
      weight = counts / n
    return weight[:, None] * unit

  scale = np.where(gb[classes] != 0, gb[classes], 1.0)
  h = (gw[:, classes] / scale).T
  pinned = mean_input is not None and len(classes) == k
  for _ in range(iterations):
    e = errors(h)
    h = (gw @ np.linalg.pinv(e, rcond=1e-10)).T  # E 1 = 0: with every class, rank K − 1
    if pinned:  # along E's left null vector w (wᵀE = 0) to the estimated mean
      free = np.linalg.svd(e)[0][:, -1]
      weight = counts @ free / n
      if abs(weight) > 1e-12 * np.abs(free).max():
        h = h - np.outer(free, (counts @ h / n - np.asarray(mean_input, np.float64)) / weight)
    if nonnegative:
      h = np.maximum(h, 0.0)
  e = errors(h)
  residual = float(np.linalg.norm(h.T @ e - gw) / max(np.linalg.norm(gw), 1e-300))
  own = -n * gb[classes]
  column = np.abs(e[:, classes])  # column i: class i's column, one row per class present
  others = np.where(np.eye(len(classes), dtype=bool), 0.0, column).max(axis=0)
  mine = np.diag(column)
  dominance = np.divide(mine, others, out=np.full(len(classes), np.inf), where=others > 0)
  # Clipped with every class present, the weights are not determined (E's rows sum to 0): no row
  # is trusted.
  usable = (counts == 1) & (dominance >= min_dominance) & ~(clipped and len(classes) == k)
  return HeadInputs(classes, counts, h, own, dominance, usable, residual)


# --- the dense head's input, per example ----------------------------------------------------------


class ExampleHeadInputs(NamedTuple):
  """What :func:`head_inputs_per_example` recovered: each example's own head input.

  Attributes:
    features: (N, F) example n's head input h_n, in the order of ``labels`` (examples of one class
      are interchangeable: the gradient does not say which of them came first).
    error: (N,) how far h_n moves, relative to the batch's spread (mean ‖h_n − h̄‖; ‖h_1‖ for one
      example), when the gradient is rounded again as float32 rounds it (the largest over ``probes``
      re-solves) or in another restart that ends as low; ∞ for an example of a repeated class where
      the span lacks a direction (below).
    usable: (N,) ``error`` at most ``max_error``.
    cost: the least-squares residual ‖r‖² of the best restart (its float32 rounding floor is about
      1e-14 for a LeNet head).
    singular_values: (N,) the largest N singular values of ∂L/∂W; the last ones, where two examples
      of a class barely differ in their predictions, decide ``error``.
  """

  features: np.ndarray
  error: np.ndarray
  usable: np.ndarray
  cost: float
  singular_values: np.ndarray


def head_inputs_per_example(kernel, bias, kernel_grad, bias_grad, labels, *, key: jax.Array,
                            restarts: int = 64, steps: int = 400, probes: int = 8,
                            rounding: float = 2.0 ** -24, max_error: float = 0.1) -> ExampleHeadInputs:
  """Each example's input of a dense head z = hᵀW + b from its gradient, classes repeated or not.

  With the mean cross entropy over N ≤ K − 1 examples, ∂L/∂W = Σ_n h_n e_nᵀ / N with
  e_n = softmax(Wᵀh_n + b) − e_{y_n} (F × K, rank N): its column space is span{h_n}. With U (F, N)
  its leading left singular vectors, h_n = U a_n and the N² unknowns A solve the N·K + K equations

    Uᵀ ∂L/∂W = Aᵀ E(A) / N,    ∂L/∂b = Σ_n e_n(A) / N,

  nonlinear through the predictions. :func:`head_inputs` gives each class's mean (exact for a class
  of one); two examples of one class differ only through their predictions p_n, so the directions
  that tell them apart carry singular values of ∂L/∂W as small as their difference in p. Here the
  system is solved by Levenberg-Marquardt in float64 from the class means plus noise (``restarts``
  of them, vmapped; the lowest residual kept), then ``probes`` times again from the solution with
  ∂L/∂W and ∂L/∂b rounded anew (each entry times 1 + ``rounding``·U(−1, 1), float32's relative
  rounding, and the logits' rounding, which dominates): where an example moves by more than
  ``max_error`` of the batch's spread, the float32 update no longer holds what sets it apart, and
  it is not ``usable``. Nor is it where another restart ends as low (within 10x of the best
  residual) with that example elsewhere (the equations do not pick one answer), nor, for an example
  of a repeated class, where the N-th singular value of ∂L/∂W lies below its float32 rounding
  (``rounding``·rms(∂L/∂W)·(√F + √K)): the span then lacks a direction that tells two examples
  apart. (On DLG's LeNet, untrained, CIFAR-10 test images in batches of 8, these rules were set on
  images 0-39, where the 29 examples they keep are the 29 within 10 % of the truth; on 500-539 they
  keep 20, all within 4 %, of the 22 within 10 %.)

  Args:
    kernel, bias: the head's weights W (F, K) and bias b (K,).
    kernel_grad, bias_grad: their gradients (F, K), (K,), as observed.
    labels: (N,) int, the batch's labels, N ≤ K − 1.
    key: PRNG key of the restarts' and probes' noise.
    restarts, steps: Levenberg-Marquardt starts and iterations.
    probes: re-solves with the gradient rounded anew, for ``error``.
    rounding: the relative rounding of the observed gradient (float32: 2⁻²⁴).
    max_error: ``usable`` where ``error`` is at most this.

  Returns:
    :class:`ExampleHeadInputs`.

  Reference: the span of a low-rank weight gradient as the span of a layer's inputs is DAGER's
  (Petrov et al., NeurIPS 2024) for transformers and the premise of R-GAP's head step (Zhu and
  Blaschko, ICLR 2021); solving it per example through the softmax is gradjax's.
  """
  w, b = np.asarray(kernel, np.float64), np.asarray(bias, np.float64)
  gw, gb = np.asarray(kernel_grad, np.float64), np.asarray(bias_grad, np.float64)
  y = np.asarray(labels).astype(np.int64)
  n, k = y.shape[0], w.shape[1]
  if n > k - 1:
    raise ValueError(f"per-example head inputs need at most K - 1 = {k - 1} examples (the rank of "
                     f"the head's gradient), got {n}")
  grouped = head_inputs(w, b, gw, gb, y, nonnegative=False)
  row = {int(c): i for i, c in enumerate(grouped.classes)}
  means = grouped.features[[row[int(c)] for c in y]]  # (N, F)
  with jax.enable_x64(True):
    program = _per_example_program(n, k, restarts, steps, probes)
    out = program(key, *(jnp.asarray(v) for v in (means, gw, gb, w, b, y)), jnp.asarray(rounding))
    h, error, others, costs, s = (np.asarray(v) for v in out)
  best = int(np.argmin(costs))
  # Directions of ∂L/∂W below its float32 rounding (spectral norm about u·rms·(√F + √K)) are not
  # the examples' own: the span lacks what tells some examples of a class apart (their predictions
  # agree to rounding), so no example of a repeated class is pinned down.
  floor = rounding * np.sqrt(np.mean(gw ** 2)) * (np.sqrt(gw.shape[0]) + np.sqrt(k))
  if s[-1] < floor:
    repeated = np.isin(y, np.unique(y)[np.unique(y, return_counts=True)[1] > 1])
    error = np.where(repeated, np.inf, error)
  # Restarts that end as low (within ``near`` of the best residual) but elsewhere: the equations do
  # not pick one answer; examples of a class matched by an assignment, as they are interchangeable.
  near = costs <= 10 * costs[best]
  spread = _spread(np, h)
  from scipy.optimize import linear_sum_assignment  # here: slow to import, and only this path needs it
  for other in others[near]:
    moved = np.zeros(n)
    for c in np.unique(y):
      idx = np.flatnonzero(y == c)
      d = np.linalg.norm(other[idx][:, None] - h[idx][None], axis=-1)
      r, col = linear_sum_assignment(d)
      moved[idx[col]] = d[r, col]
    error = np.maximum(error, moved / spread)
  return ExampleHeadInputs(h, error, error <= max_error, float(costs[best]), s)


def _spread(xp, h):
  """The scale of :class:`ExampleHeadInputs`' error: mean ‖h_n − h̄‖, or ‖h_1‖ for one example."""
  if h.shape[0] == 1:
    return xp.linalg.norm(h[0])
  return xp.mean(xp.linalg.norm(h - h.mean(0), axis=1))


@functools.lru_cache(maxsize=None)
def _per_example_program(n: int, k: int, restarts: int, steps: int, probes: int):
  """:func:`head_inputs_per_example`'s computation for N examples and K classes, one jitted program:
  (key, class means (N, F), ∂L/∂W, ∂L/∂b, W, b, labels, rounding) -> (h (N, F), error (N,), every
  restart's h (R, N, F), their residuals (R,), the leading N singular values)."""

  def solve(a, u, gw, gb, w, b, y):  # Levenberg-Marquardt from a
    uw, target, onehot = u.T @ w, u.T @ gw, jax.nn.one_hot(y, k, dtype=a.dtype)  # (N, K) each

    def r_of(v):  # logits a Uᵀ W + b: N·N·K per evaluation, whatever F
      e = jax.nn.softmax(v.reshape(n, n) @ uw + b) - onehot
      return jnp.concatenate([(target - v.reshape(n, n).T @ e / n).ravel(), e.sum(0) / n - gb])

    def step(carry, _):
      v, lam = carry
      r, jac = r_of(v), jax.jacfwd(r_of)(v)
      hess = jac.T @ jac
      damped = hess + lam * (jnp.diag(jnp.diag(hess)) + 1e-12 * jnp.eye(v.size))
      trial = v - jnp.linalg.solve(damped, jac.T @ r)
      r2 = r_of(trial)
      better = (r2 @ r2 < r @ r) & jnp.all(jnp.isfinite(r2))
      return (jnp.where(better, trial, v), jnp.where(better, lam / 3, lam * 4)), None

    (v, _), _ = jax.lax.scan(step, (a.ravel(), jnp.asarray(1e-3, a.dtype)), None, length=steps)
    r = r_of(v)
    return v.reshape(n, n), r @ r

  # Restarts and probes in batches whose Jacobians, (N·K + K) x N² each, stay under 256 MB.
  batch = max(1, min(restarts, 2 ** 25 // ((n * k + k) * n * n)))

  def span(gw):
    u, s, _ = jnp.linalg.svd(gw, full_matrices=False)
    return u[:, :n], s[:n]

  @jax.jit
  def program(key, means, gw, gb, w, b, y, rounding):
    k_start, k_probe = jax.random.split(key)
    u, s = span(gw)
    a0 = means @ u
    noise = jnp.abs(a0).mean() * jnp.geomspace(0.03, 1.0, restarts)[:, None, None]
    starts = a0[None] + noise * jax.random.normal(k_start, (restarts, n, n), a0.dtype)
    found, costs = jax.lax.map(lambda a: solve(a, u, gw, gb, w, b, y), starts, batch_size=batch)
    h = found[jnp.argmin(costs)] @ u.T
    z = h @ w + b
    p = jax.nn.softmax(z)
    z_rounding = 0.5 * rounding * (jnp.abs(h) @ jnp.abs(w))  # (N, K)

    def probe(key):
      kw, kb, kz = jax.random.split(key, 3)
      # The client's logits carry an absolute rounding error of about u Σ_j |h_j W_jk| / 3 (measured
      # on DLG's LeNet in float32: below 0.64 u Σ|hW|, 90 % below 0.38), which moves e_n by
      # p_n ⊙ (δz − p_n·δz); the gradient's entries are then rounded once more.
      dz = z_rounding * jax.random.uniform(kz, z.shape, z.dtype, -1, 1)
      de = jax.nn.softmax(z + dz) - p
      gw_p = (gw + h.T @ de / n) * (1 + rounding * jax.random.uniform(kw, gw.shape, gw.dtype, -1, 1))
      gb_p = (gb + de.sum(0) / n) * (1 + rounding * jax.random.uniform(kb, gb.shape, gb.dtype, -1, 1))
      u_p, _ = span(gw_p)
      a, _ = solve(h @ u_p, u_p, gw_p, gb_p, w, b, y)
      return a @ u_p.T

    moved = jax.lax.map(probe, jax.random.split(k_probe, probes), batch_size=batch)  # (P, N, F)
    spread = _spread(jnp, h)
    error = jnp.max(jnp.linalg.norm(moved - h[None], axis=-1), axis=0) / spread
    return h, error, found @ u.T, costs, s

  return program
