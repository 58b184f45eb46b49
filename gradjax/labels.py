"""Label inference from an observed gradient.

iDLG (Zhao et al., "iDLG: Improved Deep Leakage from Gradients", 2020). For one example with cross
entropy, the gradient of the last dense layer W (Flax layout (features, classes)) is
∂L/∂W[j, c] = a_j (p_c − y_c), where a are the layer's inputs. When the inputs are non-negative (after a
sigmoid or ReLU) Σ_j ∂L/∂W[j, c] = (p_c − y_c) Σ_j a_j is negative only for the true class c, because
p_c − y_c < 0 exactly there. So the label is argmin_c Σ_j ∂L/∂W[j, c].

Needs: batch 1, a cross-entropy loss, non-negative inputs to the last layer (true for all zoo models).
"""

import jax
import jax.numpy as jnp

from gradjax.observation import Observation

HEAD = ("head", "kernel")


def last_layer_gradient(gradient, path: tuple[str, ...] = HEAD) -> jax.Array:
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


def idlg(observation: Observation, path: tuple[str, ...] = HEAD) -> jax.Array:
  """iDLG label of a single-example observation: int array of shape (1,)."""
  if observation.num_samples != 1:
    raise ValueError(f"iDLG label inference needs batch 1, the observation has "
                     f"{observation.num_samples} samples")
  g = last_layer_gradient(observation.gradient, path)
  return jnp.argmin(jnp.sum(g, axis=0))[None]
