"""The gradient-matching objective of the DLG family.

Given the observed gradient g = ∇_θ L(f_θ(x), y) of a client, the attacker minimises over dummy data
x' (and, in DLG, dummy soft labels y' = softmax(z'))

    D(∇_θ L(f_θ(x'), y'), g)

where D is a distance on parameter pytrees (:mod:`gradjax.distances`), optionally plus image priors
R(x', t) (:mod:`gradjax.priors`). ``jax.grad`` of the client's
loss gives the dummy gradient; differentiating the objective again w.r.t. x' (and z') drives the
optimizer, so the objective is one pure function that ``jit`` and ``vmap`` transform as a whole.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from gradjax.losses import cross_entropy
from gradjax.observation import Observation


def dummy_gradient(apply_fn, variables, x, targets, *, train: bool = False,
                   loss_fn=cross_entropy):
  """∇_θ L(f_θ(x), targets) at ``variables["params"]``: the gradient a client with data x would send."""

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), targets)

  return jax.grad(loss)(variables["params"])


def gradient_matching(apply_fn, distance: Callable, *, loss_fn=cross_entropy,
                      prior: Callable | None = None, one_sample_per_step: bool = False) -> Callable:
  """Returns ``objective(dummy, observation, labels=None, step=0) -> scalar``:

      D(∇_θ L(f_θ(x'), y'), g) + R(x', step)

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    distance: ``distance(dummy_gradient, observed_gradient) -> scalar``.
    loss_fn: the client's loss, ``loss_fn(logits, targets)``; targets are int labels or soft labels.
    prior: optional image prior ``prior(x, step) -> scalar`` (weights included), e.g.
      :func:`gradjax.priors.combine`.
    one_sample_per_step: DLG's batch option: at step t only dummy example t mod N receives a
      gradient (the others are held by ``stop_gradient``); the objective value is unchanged.

  The returned objective takes
    dummy: ``{"x": (N, H, W, C)}`` plus ``"label_logits": (N, K)`` when labels are optimised jointly
      (DLG); then the targets are ``softmax(label_logits)``.
    observation: the :class:`~gradjax.observation.Observation` (gradient and variables).
    labels: int (N,) labels used when ``dummy`` has no ``"label_logits"`` (known or inferred).
    step: the optimizer step (int scalar), for scheduled priors and ``one_sample_per_step``.
    weights: optional per-leaf distance weights (see :func:`gradjax.distances.depth_weights`).
  """

  def objective(dummy, observation: Observation, labels=None, step=0, weights=None):
    x, logits = dummy["x"], dummy.get("label_logits")
    if one_sample_per_step:
      active = jnp.arange(x.shape[0]) == step % x.shape[0]
      x = jnp.where(active[:, None, None, None], x, jax.lax.stop_gradient(x))
      if logits is not None:
        logits = jnp.where(active[:, None], logits, jax.lax.stop_gradient(logits))
    targets = labels if logits is None else jax.nn.softmax(logits, axis=-1)
    g = dummy_gradient(apply_fn, observation.variables, x, targets, train=observation.train,
                       loss_fn=loss_fn)
    if weights is None:
      value = distance(g, observation.gradient)
    else:
      value = distance(g, observation.gradient, weights=weights)
    if prior is not None:
      value = value + prior(dummy["x"], step)
    return value

  return objective
