"""A batch's inputs from the gradient of a biased dense first layer, by independent component
analysis: the Cocktail Party Attack (Kariyappa et al., ICML 2023), with the scale of each input
read from the bias and a refinement that makes the examples reproduce the update.

The layer y = x W + b sees examples x_n (n = 1..N, each flattened to ``in`` values); its FedSGD
gradient is [∂L/∂W; ∂L/∂b] = G = Σ_n x̃_n δ_nᵀ (in + 1, out), x̃_n = (x_n, 1) and δ_n = ∂L/∂b of
example n alone. So G's columns lie in the span of the N augmented examples: with G = U S Vᵀ of rank
r = N (below ``out``), each x̃_n = U_r c_n for some c_n ∈ R^r. Finding the c_n is blind source
separation: U_r's rows restricted to the pixels are r mixtures of the N images, and independent
component analysis unmixes them. Kariyappa et al. learn the unmixing matrix by gradient descent on a
non-Gaussianity contrast, a penalty on the recovered images' mutual similarity and a total-variation
prior; gradjax takes a different route to the same unmixing. Natural images are far from independent
as signals over pixels (their sample correlation is large); their spatial differences are sparse and
nearly independent, and a mixture's differences are the same mixture of the images' differences, so
gradjax runs FastICA (Hyvärinen 1999, symmetric, log cosh) on the mixtures' horizontal and vertical
differences and applies the unmixing it finds to the mixtures themselves. Scale and sign, which ICA
leaves open, are exact here: an example's bias coordinate is 1, so x_n = ĉ_n's pixels / its last
coordinate.

Refinement (gradjax's): with each estimate x̂_n and its label k_n (the label whose gradient
δ(x̂_n, k) = ∂L(f(x̂_n), k)/∂b / N, computed through the model the server sent, lies nearest the update's
row space, as :func:`gradjax.analytic.exclusive_neurons` accepts an example), the update determines
the examples by least squares, X̃ᵀ = G_S D_S⁺ with D = [δ(x̂_n, k_n)] and S the units (columns)
kept; each round moves the estimates a ``step`` towards those (each scaled to bias coordinate 1).
The least squares are trimmed: S is the share ``keep`` of the units some example reaches whose
columns the current estimates explain best (at least 2r of them). A unit whose activation an
estimate flips (a ReLU near its kink) gives a column no close estimate explains; left in, such
columns hold the estimates at a fixed point near, not at, the batch (on CIFAR-10 batches of 16 on
``mlp-1024``: a residual of 0.1, 47 dB); left out, the estimates converge to the batch where they
start close enough. Every round is scored by how much of the update the examples leave unexplained
at the best scale, min_α ‖G − α Σ_n x̃_n δ(x̂_n, k_n)ᵀ‖ / ‖G‖ (0 for the batch itself; α = 1 for a
FedSGD gradient, −η for a one-step FedAvg update of unknown learning rate η), and the best round is
kept; the rounds stop once a round moves the estimates by less than ``tol`` of their norm (the
residual alone says little of progress: on a batch of 64 it may stay near 0.3 for a hundred
rounds while the estimates travel, then fall to float32 rounding). FastICA's start decides where
the refinement ends up on some batches; ``restarts`` tries further starts and keeps the lowest
residual, which needs no ground truth.

What it needs: the client's loss is the mean cross entropy over N = ``observation.num_samples``
examples, each example's gradient its own (no BatchNorm batch statistics), N below the layer's
``out`` units, and the model is the one sent. Unlike exclusive neurons it needs no unit that one
example alone activates, so inputs centred by normalisation do not stop it.
"""

from collections.abc import Mapping
import functools
from math import prod
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from gradjax import analytic
from gradjax.observation import Observation


class Cocktail(NamedTuple):
  """What :func:`separate` recovered of a batch.

  Attributes:
    inputs: (r, *input_shape) the recovered examples (the layer's inputs), in no particular order.
    labels: (r,) int, each one's label (the one whose gradient lies nearest the update's row space).
    mismatch: (r,) each one's ‖δ − its projection on the update's row space‖ / ‖δ‖ at its label:
      near 0 for an example of the batch, near 1 for a mixture.
    rank: the directions of the augmented gradient's (in + 1, out) spectrum kept: its numerical
      rank, at most N (the examples that reached the layer); N where a defense's noise fills the
      rest of the spectrum.
    residual: min_α ‖G − α Σ_n x̃_n δ(x_n, k_n)ᵀ‖ / ‖G‖ of the examples returned: how much of the
      layer's update they leave unexplained (float32 rounding, about 1e-7, when they are the
      batch).
    scale: that α, the update's scale against the examples' own gradient: 1 for a FedSGD gradient,
      −η for a one-step FedAvg update (w' − w) of learning rate η.
    ica_iterations: FastICA's iterations (its ``iterations`` when it did not settle).
    rounds: the refinement round returned (0: the unmixed estimates themselves).
    seed: FastICA's start of the restart returned.
    restarts: the restarts run (each a FastICA start and its refinement; they stop at the first
      whose residual is at most ``converged``).
  """

  inputs: np.ndarray
  labels: np.ndarray
  mismatch: np.ndarray
  rank: int
  residual: float
  scale: float
  ica_iterations: int
  rounds: int
  seed: int
  restarts: int


def fast_ica(z: np.ndarray, *, seed: int = 0, iterations: int = 1000, tol: float = 1e-8
             ) -> tuple[np.ndarray, int]:
  """Symmetric FastICA (Hyvärinen, IEEE TNN 1999) with the log cosh contrast, G'(u) = tanh(u).

  Args:
    z: (r, T) whitened signals (zero mean, identity covariance over the T samples).
    seed: the random orthogonal start.
    iterations: at most this many fixed-point steps.
    tol: stop once every row of the unmixing turns by less than this: max |1 − |⟨w_new, w⟩||.

  Returns:
    (w, steps): the (r, r) orthogonal unmixing, so that w @ z are the independent components, and
    the steps taken. Each step is w ← (E[g(wz) zᵀ] − diag(E[g'(wz)]) w), then (w wᵀ)^(−1/2) w.
  """
  r, t = z.shape
  w = _decorrelate(np.random.default_rng(seed).normal(size=(r, r)))
  step = 0
  for step in range(1, iterations + 1):
    g = np.tanh(w @ z)
    new = _decorrelate((g @ z.T) / t - np.mean(1.0 - g * g, axis=1)[:, None] * w)
    turned = float(np.max(np.abs(np.abs(np.sum(new * w, axis=1)) - 1.0)))
    w = new
    if turned < tol:
      break
  return w, step


def _decorrelate(w: np.ndarray) -> np.ndarray:
  """(w wᵀ)^(−1/2) w: the orthogonal matrix nearest w's rows."""
  s, u = np.linalg.eigh(w @ w.T)
  return (u / np.sqrt(s)) @ u.T @ w


def innovations(signals: np.ndarray, input_shape) -> np.ndarray:
  """(r, T') each signal's horizontal and vertical differences where ``input_shape`` is an image
  (H, W, C) with H, W > 1; the signals themselves otherwise. Linear, so a mixture's innovations are
  the mixture of the sources' innovations."""
  shape = tuple(int(d) for d in input_shape)
  if len(shape) != 3 or min(shape[:2]) < 2:
    return signals
  img = signals.reshape(-1, *shape)
  return np.concatenate([np.diff(img, axis=1).reshape(len(img), -1),
                         np.diff(img, axis=2).reshape(len(img), -1)], axis=1)


def separate(observation: Observation, apply_fn: Callable, input_shape, *, layer: str = "Dense_0",
             rank_tol: float = 1e-5, ica_iterations: int = 1000, rounds: int = 500,
             tol: float = 1e-7, step: float = 0.2, keep: float = 0.5, seed: int = 0,
             restarts: int = 4, converged: float = 1e-4, bounds=None) -> Cocktail:
  """The examples of a batch from the gradient of the biased dense ``layer`` (see the module).

  Args:
    observation: a FedSGD gradient (or a one-step FedAvg update read as one).
    apply_fn: the model, ``apply_fn(variables, x, train) -> logits``.
    input_shape: the shape of one example, e.g. (32, 32, 3); the layer reads it flattened.
    layer: the dense layer's name in the parameter tree (gradjax's ``mlp``: ``Dense_0``).
    rank_tol: singular values at most ``rank_tol`` times the largest one are rounding.
    ica_iterations: at most this many FastICA steps (:func:`fast_ica`).
    rounds: at most this many refinement rounds (0: the unmixed estimates).
    tol: stop once a round moves the estimates by less than this share of their norm,
      ‖x_{t+1} − x_t‖ ≤ tol ‖x_t‖ (float32 rounding leaves about 1e-8 at convergence).
    step: how far each round moves the examples towards the least-squares ones (1: all the way).
    keep: the share of the layer's units each round's least squares uses (1: all; see the module).
      ``step``, ``keep``, ``tol``, ``rounds`` and ``restarts`` were chosen on CIFAR-10 test images
      0-447 (batches of 16 and 64 on ``mlp-1024``; ``experiments/studies/cocktail_party``, rows
      ``dev_*``).
    seed: FastICA's start of the first restart; restart i starts from ``seed + i``.
    restarts: at most this many FastICA starts, each refined; the one of lowest residual is
      returned (the residual says which converged without the truth). On four development batches
      of 64 in [0, 1] each start converged on two, the best of four on three; a batch that
      converges takes 50-400 rounds.
    converged: the restarts stop at the first whose residual is at most this (a converged batch
      leaves float32 rounding, below 1e-6; one that is not, 0.1 or more).
    bounds: optional (lo, hi), (C,) each: the box every input lies in (the images' range, in the
      model's normalisation); estimates are clipped to it before each round.

  Returns:
    :class:`Cocktail`. Raises ``ValueError`` (one line) where the update cannot be separated.
  """
  if observation.couples_examples:
    raise ValueError("cocktail_party needs each example's gradient to be its own; a client in "
                     "training mode (BatchNorm batch statistics) couples them")
  if not 0 < keep <= 1:
    raise ValueError(f"keep is a share of the layer's units, in (0, 1], got {keep}")
  if restarts < 1:
    raise ValueError(f"restarts is the number of FastICA starts, at least 1, got {restarts}")
  if not 0 < step <= 1 or not tol >= 0 or rounds < 0:
    raise ValueError(f"the refinement needs 0 < step <= 1, tol >= 0 and rounds >= 0, got step "
                     f"{step}, tol {tol}, rounds {rounds}")
  shape = tuple(int(d) for d in input_shape)
  if not isinstance(observation.gradient, Mapping) or layer not in observation.gradient:
    raise ValueError(f"no layer {layer!r} in the gradient tree: the Cocktail Party Attack needs a "
                     "model whose first layer is a biased dense layer (gradjax's mlp-H: 'Dense_0')")
  gw, gb = analytic._dense_layer(observation.gradient, layer, "layer")  # pylint: disable=protected-access
  if jnp.shape(gw)[0] != prod(shape):
    raise ValueError(f"layer {layer!r} takes {jnp.shape(gw)[0]} inputs, but input_shape {shape} has "
                     f"{prod(shape)} values; is it the first layer?")
  n, out = int(observation.num_samples), int(jnp.shape(gw)[1])
  if n >= out:  # with as many, the update's row space is all of R^out and tells no label
    raise ValueError(f"a batch of {n} is not fewer examples than layer {layer!r} has units ({out}): "
                     "its gradient does not separate them (the Cocktail Party Attack needs fewer "
                     "examples than units)")
  g = np.vstack([np.asarray(gw, np.float64), np.asarray(gb, np.float64)[None]])  # (in + 1, out)
  if not np.all(np.isfinite(g)):
    raise ValueError(f"layer {layer!r} has a gradient with NaN or infinite entries")
  if not np.any(g):
    raise ValueError(f"layer {layer!r} has an all-zero gradient: no example reached it")
  u, s, vt = np.linalg.svd(g, full_matrices=False)
  # At most N examples: where a defense's noise fills the rest of the spectrum, the N largest
  # directions hold the batch.
  r = min(int(np.sum(s > rank_tol * s[0])), n)
  basis, rows = u[:, :r], vt[:r].T  # the examples' span (in + 1, r); the row space (out, r)

  mixtures = innovations(basis[:-1].T, shape)  # (r, T)
  centred = mixtures - mixtures.mean(axis=1, keepdims=True)
  var, vec = np.linalg.eigh(centred @ centred.T / centred.shape[1])
  whitening = (vec / np.sqrt(np.maximum(var, var.max() * 1e-12))).T
  whitened = whitening @ centred  # the same for every start
  deltas = _deltas(apply_fn, observation.variables, layer, shape, 1.0 / n)
  refine = functools.partial(_refine, g=g, rows=rows, deltas=deltas, clip=_clipper(bounds, shape),
                             shape=shape, dtype=np.asarray(gw).dtype, rounds=rounds,
                             tol=tol, step=step, keep=keep)
  best, restart = None, 0
  for restart in range(restarts):
    w, steps = fast_ica(whitened, seed=seed + restart, iterations=ica_iterations)
    found = refine(_inputs((w @ whitening) @ basis.T))  # scale and sign from the bias
    if best is None or found.residual < best.residual:
      best = found._replace(ica_iterations=steps, seed=seed + restart)
    if best.residual <= converged:
      break
  return best._replace(restarts=restart + 1)


def _refine(x, *, g, rows, deltas, clip, shape, dtype, rounds, tol, step, keep) -> Cocktail:
  """The refinement (see the module) from estimates x (r, in): the round of lowest residual."""
  r = len(x)
  best, chosen, unexplained, live, moved = None, None, None, None, np.inf
  for round_ in range(rounds + 1):
    if round_:  # a step towards the examples the units explained best give for the current δ's
      units = _explained_best(unexplained, live, keep, r)
      last = x
      x = clip(x + step * (_inputs((g[:, units] @ np.linalg.pinv(chosen[:, units])).T) - x))
      moved = float(np.linalg.norm(x - last) / max(np.linalg.norm(last), np.finfo(float).tiny))
      if not np.isfinite(moved):
        break
    else:
      x = clip(x)
    every = deltas(x)  # (r, K, out)
    off = every - (every @ rows) @ rows.T
    size = np.linalg.norm(every, axis=-1)
    mismatch = np.where(size > 0, np.linalg.norm(off, axis=-1) / np.where(size > 0, size, 1.0), 1.0)
    labels = np.argmin(mismatch, axis=1)
    chosen = every[np.arange(r), labels]  # (r, out)
    made = np.hstack([x, np.ones((r, 1))]).T @ chosen  # the update these examples make at α = 1
    scale = float(np.vdot(g, made) / np.vdot(made, made)) if np.any(made) else 0.0
    unexplained = np.linalg.norm(g - scale * made, axis=0)  # (out,) each unit's column
    live = np.any(g, axis=0) | np.any(made, axis=0)  # a unit no example reaches tells nothing
    residual = float(np.linalg.norm(unexplained) / np.linalg.norm(g))
    residual = residual if np.isfinite(residual) else np.inf
    if best is None or residual < best.residual:
      best = Cocktail(x.reshape(r, *shape).astype(dtype), labels, mismatch[np.arange(r), labels],
                      r, residual, scale, 0, round_, 0, 1)
    if moved <= tol:
      break
  return best


def _explained_best(unexplained: np.ndarray, live: np.ndarray, keep: float, r: int) -> np.ndarray:
  """(out,) bool: the share ``keep`` of the live units whose columns are explained best, and never
  fewer than 2r of them (or all the live ones), so the least squares for r examples stay
  overdetermined."""
  alive = np.flatnonzero(live)
  count = min(len(alive), max(int(np.ceil(keep * len(alive))), 2 * r))
  units = np.zeros(live.shape, bool)
  units[alive[np.argsort(unexplained[alive], kind="stable")[:count]]] = True
  return units


def _inputs(augmented: np.ndarray) -> np.ndarray:
  """(r, in) the examples of (r, in + 1) augmented rows known up to scale: divided by their bias
  coordinate, which is 1 for an example (a row whose coordinate is 0 stays as found)."""
  last = augmented[:, -1:]
  return augmented[:, :-1] / np.where(last == 0, 1.0, last)


def _clipper(bounds, shape):
  if bounds is None:
    return lambda x: x
  lo, hi = (np.broadcast_to(np.asarray(b, np.float64), shape).reshape(-1) for b in bounds)
  return lambda x: np.clip(x, lo, hi)


def _deltas(apply_fn, variables, layer, shape, scale):
  """x (M, in) -> (M, K, out) float64: scale · ∂L(f(x_m), k)/∂b for every label k
  (:func:`gradjax.analytic._bias_gradients`), in chunks of one compiled size."""
  chunk = 64

  def run(x):
    m = len(x)
    padded = np.zeros((-(-m // chunk) * chunk, *shape), np.float32)
    padded[:m] = x.reshape(m, *shape)
    parts = [np.asarray(analytic._bias_gradients(  # pylint: disable=protected-access
        apply_fn, variables, layer, jnp.asarray(padded[i:i + chunk]), scale), np.float64)
             for i in range(0, len(padded), chunk)]
    return np.concatenate(parts)[:m]

  return run

