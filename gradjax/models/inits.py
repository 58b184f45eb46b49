"""Weight initialisation schemes used by the gradient-inversion literature.

Attacks are sensitive to how the attacked model was initialised (SAPAG, Table I: DLG on LeNet-5 goes
from 43.9 dB with U(-0.5, 0.5) to 3.8 dB with Xavier normal on CIFAR-100). Every zoo model therefore
takes an ``init`` name that selects the initialisers of its convolution and dense layers:

* ``"uniform"``: every weight and every bias ~ U(-a, a), a = 0.5 by default. This is the
  ``weights_init`` of the DLG code (Zhu et al., 2019) that the DLG and iDLG tables use.
* ``"xavier_normal"``: weights ~ N(0, gain^2 * 2 / (fan_in + fan_out)) with gain 1, untruncated, as
  PyTorch's ``xavier_normal_`` (used by SAPAG, Wang et al.); biases are zero.
* ``"default"``: Flax's defaults (LeCun normal kernels, zero biases).

BatchNorm scale and offset keep their defaults (1 and 0) under every scheme.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

INITS = ("uniform", "xavier_normal", "default")


class Initializers(NamedTuple):
  kernel_init: nn.initializers.Initializer
  bias_init: nn.initializers.Initializer


def symmetric_uniform(a: float) -> nn.initializers.Initializer:
  """U(-a, a) for any shape; ``jax.nn.initializers.uniform`` only covers [0, a)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, minval=-a, maxval=a)

  return init


def get_initializers(name: str, scale: float = 0.5) -> Initializers:
  """Initializers for scheme ``name`` (see module docstring); ``scale`` is ``a`` of ``"uniform"``."""
  if name == "uniform":
    return Initializers(symmetric_uniform(scale), symmetric_uniform(scale))
  if name == "xavier_normal":
    # fan_avg with scale 1 gives variance 2 / (fan_in + fan_out); fans count the receptive field.
    return Initializers(nn.initializers.variance_scaling(1.0, "fan_avg", "normal"),
                        nn.initializers.zeros)
  if name == "default":
    return Initializers(nn.initializers.lecun_normal(), nn.initializers.zeros)
  raise ValueError(f"unknown init {name!r}; choose one of {', '.join(INITS)}")
