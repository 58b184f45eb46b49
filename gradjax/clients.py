"""Federated-learning clients: what a client computes and sends, as an :class:`Observation`.

FedSGD (McMahan et al., 2017): the client sends the gradient of its mean loss over one local batch,
computed at the variables the server sent. Every attack of the DLG family starts from this threat model.
"""

import jax
import jax.numpy as jnp
import numpy as np

from gradjax.losses import cross_entropy
from gradjax.observation import Observation


def fedsgd(apply_fn, variables, x, y, *, train: bool = False, share_labels: bool = False,
           loss_fn=cross_entropy) -> Observation:
  """The FedSGD update g = ∇_θ (1/N) Σ_n L(f_θ(x_n), y_n).

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: ``{"params": θ, ...}`` as sent by the server.
    x: (N, H, W, C) private inputs, in the model's input space.
    y: (N,) int private labels.
    train: run the model in training mode (BatchNorm uses the batch statistics).
    share_labels: whether the threat model also reveals the labels to the server.
    loss_fn: ``loss_fn(logits, y) -> scalar``; the mean cross entropy by default.

  Returns:
    Observation with the gradient (same tree as ``variables["params"]``).
  """
  x = jnp.asarray(x)
  y = jnp.asarray(y)
  if x.ndim != 4:
    raise ValueError(f"client inputs must be (N, H, W, C), got shape {x.shape}")
  if y.shape != (x.shape[0],) or not jnp.issubdtype(y.dtype, jnp.integer):
    raise ValueError(f"client labels must be int ({x.shape[0]},), got {y.dtype} {y.shape}")
  if not np.all(np.isfinite(np.asarray(x))):
    raise ValueError("client inputs contain NaN or inf")
  num_classes = jax.eval_shape(lambda: apply_fn(variables, x[:1], False)).shape[-1]
  if int(y.min()) < 0 or int(y.max()) >= num_classes:
    raise ValueError(f"labels must lie in [0, {num_classes}), got [{int(y.min())}, {int(y.max())}]")

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), y)

  gradient = jax.grad(loss)(variables["params"])
  return Observation(gradient=gradient, variables=variables, labels=y if share_labels else None,
                     num_samples=int(x.shape[0]), threat_model="fedsgd", train=train)

