"""Image priors: regularisers ``prior(x) -> scalar`` added to the gradient-matching objective.

``x`` is an NHWC batch (N, H, W, C). Priors are weighted by a schedule ``weight_fn(step) -> scalar``
(``step`` a jnp int, so the schedules work under ``jit`` / ``vmap`` / ``lax.scan``); :func:`combine`
sums several into one ``fn(x, step)``.

Conventions (they change published numbers, so they are explicit):

* ``total_variation(form="mean")``: mean|Δ_w x| + mean|Δ_h x|, Inverting Gradients' (Geiping et al.,
  2020) form, whose scale does not depend on the image size.
* ``total_variation(form="isotropic")``: mean (Δ_w x² + Δ_h x² + eps)^(β/2), after Mahendran &
  Vedaldi 2015 ("Understanding Deep Image Representations by Inverting Them"), who sum instead of
  averaging.
* |x| is written as x·sign(x), so its derivative at 0 is sign(0) = 0 as in PyTorch (``jnp.abs``'s is 1):
  a flat image region gets no TV gradient.
"""

import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

PriorFn = Callable[..., jax.Array]
WeightFn = Callable[[jax.Array], jax.Array]

TV_FORMS = ("mean", "isotropic")


def _check_images(x) -> None:
  if jnp.ndim(x) != 4:
    raise ValueError(f"images must be (N, H, W, C), got shape {jnp.shape(x)}")


def total_variation(x, *, form: str = "mean", beta: float = 1.0, eps: float = 1e-8) -> jax.Array:
  """Total variation of an image batch. ``x``: (N, H, W, C) -> scalar.

  With forward differences Δ_w x = x[:, :, 1:] − x[:, :, :-1] (shape (N, H, W−1, C)) and
  Δ_h x = x[:, 1:] − x[:, :-1] (shape (N, H−1, W, C)):

  * ``form="mean"`` (Inverting Gradients, Geiping et al. 2020)::

      TV(x) = mean|Δ_w x| + mean|Δ_h x|

    each mean over all entries of its difference array. ``beta`` and ``eps`` are unused.

  * ``form="isotropic"`` (Mahendran & Vedaldi 2015, exponent β)::

      TV(x) = mean_{n,i,j,c} ((x[n,i,j+1,c] − x[n,i,j,c])² + (x[n,i+1,j,c] − x[n,i,j,c])² + eps)^(β/2)

    i, j over the (H−1, W−1) pixels that have both a right and a lower neighbour; channels are separate
    entries. ``eps`` > 0 keeps the gradient finite where both differences vanish (β ≤ 2), so a constant
    image scores eps^(β/2), not 0.
  """
  _check_images(x)
  if form not in TV_FORMS:
    raise ValueError(f"unknown TV form {form!r}; choose one of {', '.join(TV_FORMS)}")
  if x.shape[1] < 2 or x.shape[2] < 2:
    raise ValueError(f"total variation needs H, W >= 2, got shape {x.shape}")
  if form == "mean":
    dx = x[:, :, 1:, :] - x[:, :, :-1, :]
    dy = x[:, 1:, :, :] - x[:, :-1, :, :]
    return jnp.mean(dx * jnp.sign(dx)) + jnp.mean(dy * jnp.sign(dy))
  if not eps >= 0:
    raise ValueError(f"eps must be non-negative, got {eps}")
  corner = x[:, :-1, :-1, :]
  dx = x[:, :-1, 1:, :] - corner
  dy = x[:, 1:, :-1, :] - corner
  return jnp.mean((jnp.square(dx) + jnp.square(dy) + eps) ** (beta / 2))


def l2_norm(x) -> jax.Array:
  """Squared L2 norm per image, averaged over the batch: (1/N) Σ_{n,i,j,c} x[n,i,j,c]². ``x``: NHWC."""
  _check_images(x)
  return jnp.sum(jnp.square(x)) / x.shape[0]


# --- weight schedules -----------------------------------------------------------------------------


def constant(weight: float) -> WeightFn:
  """``weight_fn(step) = weight`` at every step."""
  return lambda step: jnp.asarray(weight, float)


def step_on(weight: float, start: int) -> WeightFn:
  """``weight_fn(step) = 0`` for step < ``start``, ``weight`` from ``start`` on (steps count from 0).

  The prior "switched on at step T" of HFGInv (TV from 3000, BN from 5000). ``jnp.where``, so a traced
  step works under ``jit`` and ``vmap``.
  """
  if int(start) != start:
    raise ValueError(f"start must be an integer step, got {start}")
  return lambda step: jnp.where(jnp.asarray(step) >= start, jnp.asarray(weight, float), 0.0)


class Prior(NamedTuple):
  """A prior and its weight schedule; ``weight_fn`` may also be a number (a constant weight)."""

  fn: PriorFn
  weight_fn: WeightFn | float


def combine(priors: Sequence[Prior]) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """``fn(x, step) = Σ_k weight_fn_k(step) · fn_k(x)`` over ``(fn, weight_fn)`` pairs; 0 if empty."""
  pairs = []
  for item in priors:
    if not (isinstance(item, tuple) and len(item) == 2 and callable(item[0])):
      raise ValueError("combine takes (fn, weight_fn) pairs, e.g. Prior(total_variation, 1e-4)")
    fn, weight_fn = item
    pairs.append((fn, weight_fn if callable(weight_fn) else constant(weight_fn)))

  def prior(x, step):
    return sum((w(step) * fn(x) for fn, w in pairs), jnp.zeros((), jnp.result_type(x)))

  return prior


PRIORS: dict[str, PriorFn] = {
    "tv": total_variation,                                          # Inverting Gradients' mean form
    "tv_isotropic": functools.partial(total_variation, form="isotropic"),
    "l2": l2_norm,
}


def get_prior(name: str, **kwargs) -> PriorFn:
  """``prior(x)``: the prior registered as ``name`` with ``kwargs`` bound."""
  try:
    fn = PRIORS[name]
  except KeyError:
    raise ValueError(f"unknown prior {name!r}; choose one of {', '.join(PRIORS)}") from None
  return functools.partial(fn, **kwargs) if kwargs else fn
