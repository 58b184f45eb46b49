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
gradients), not any one input; the functions here therefore refuse batches.

References: Phong et al., "Privacy-Preserving Deep Learning via Additively Homomorphic
Encryption", 2017 (input of a biased neuron from its gradients); Geiping et al., "Inverting
Gradients - How easy is it to break privacy in federated learning?", NeurIPS 2020, Prop. 3.1
(the input to any fully connected layer with bias is recoverable analytically).
"""

from math import prod
from typing import Mapping

import jax
import jax.numpy as jnp

from gradjax.observation import Observation

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
  scale = jnp.max(jnp.abs(gb))
  if not bool(scale > min_abs):
    raise ValueError(f"every bias gradient is ≤ {min_abs:g} in magnitude (max {float(scale):.3g}); "
                     "the layer's input cannot be recovered from it")
  u = gb / scale  # rescaled so Σ u² cannot underflow
  # Per input j, only the units whose entry gW[j, i] is not 0 (a pruned or sparsified update zeroes
  # entries; unpruned, gW[j, i] = 0 only where x_j = 0 or gb_i = 0, which add nothing either way).
  kept = jnp.sum(jnp.where(gw != 0, u * u, 0.0), axis=1)
  return jnp.where(kept > 0, (gw @ u) / (scale * jnp.where(kept > 0, kept, 1.0)), 0.0).astype(gw.dtype)


def _dense_layer(gradient, name: str):
  """(kernel gradient, bias gradient) of the layer called ``name``, or a one-line ValueError."""
  if not isinstance(gradient, Mapping) or name not in gradient:
    raise ValueError(f"no layer {name!r} in the gradient tree (pass first_layer=...)")
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
  gw, gb = _dense_layer(observation.gradient, name)
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
