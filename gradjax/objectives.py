"""The gradient-matching objective of the DLG family.

Given the observed gradient g = ∇_θ L(f_θ(x), y) of a client, the attacker minimises over dummy data
x' (and, in DLG, dummy soft labels y' = softmax(z'))

    D(∇_θ L(f_θ(x'), y'), g)

where D is a distance on parameter pytrees (:mod:`gradjax.distances`). ``jax.grad`` of the client's
loss gives the dummy gradient; differentiating the objective again w.r.t. x' (and z') drives the
optimizer, so the objective is one pure function that ``jit`` and ``vmap`` transform as a whole.
"""

from typing import Callable

import jax

from gradjax.losses import cross_entropy
from gradjax.observation import Observation


def dummy_gradient(apply_fn, variables, x, targets, *, train: bool = False,
                   loss_fn=cross_entropy):
  """∇_θ L(f_θ(x), targets) at ``variables["params"]``: the gradient a client with data x would send."""

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), targets)

  return jax.grad(loss)(variables["params"])


def gradient_matching(apply_fn, distance: Callable, *, loss_fn=cross_entropy) -> Callable:
  """Returns ``objective(dummy, observation, labels) -> scalar``.

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    distance: ``distance(dummy_gradient, observed_gradient) -> scalar``.
    loss_fn: the client's loss, ``loss_fn(logits, targets)``; targets are int labels or soft labels.

  The returned objective takes
    dummy: ``{"x": (N, H, W, C)}`` plus ``"label_logits": (N, K)`` when labels are optimised jointly
      (DLG); then the targets are ``softmax(label_logits)``.
    observation: the :class:`~gradjax.observation.Observation` (gradient and variables).
    labels: int (N,) labels used when ``dummy`` has no ``"label_logits"`` (known or inferred).
  """

  def objective(dummy, observation: Observation, labels=None):
    if "label_logits" in dummy:
      targets = jax.nn.softmax(dummy["label_logits"], axis=-1)
    else:
      targets = labels
    g = dummy_gradient(apply_fn, observation.variables, dummy["x"], targets,
                       train=observation.train, loss_fn=loss_fn)
    return distance(g, observation.gradient)

  return objective
