"""Weight initialisation schemes used by the gradient-inversion literature.

Attacks are sensitive to how the attacked model was initialised (SAPAG, Table I: DLG on LeNet-5 goes
from 43.9 dB with U(-0.5, 0.5) to 3.8 dB with Xavier normal on CIFAR-100). Every zoo model therefore
takes an ``init`` name that selects the initialisers of its convolution and dense layers:

* ``"uniform"``: every weight and every bias ~ U(-a, a), a = 0.5 by default. This is the
  ``weights_init`` of the DLG code (Zhu et al., 2019) that the DLG and iDLG tables use.
* ``"xavier_normal"``: weights ~ N(0, gain^2 * 2 / (fan_in + fan_out)) with gain 1, untruncated, as
  PyTorch's ``xavier_normal_`` (used by SAPAG, Wang et al.); biases are zero.
* ``"default"``: Flax's defaults (LeCun normal kernels, zero biases).
* ``"torch"``: PyTorch's defaults for ``nn.Conv2d`` and ``nn.Linear`` (their ``reset_parameters``:
  ``kaiming_uniform_(a=sqrt(5))``), every weight and every bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  with fan_in = in_features x kernel height x kernel width: a weight variance of 1/(3 fan_in), a
  third of LeCun's. An untrained PyTorch model has it, Inverting Gradients' ConvNet included. A bias
  initialiser does not see its layer's fan-in, so :func:`torch_biases` draws the biases after
  ``module.init`` (``gradjax.models.create`` does); the zoo's text models do not take it.
* ``"torchvision"``: torchvision's ResNets: convolution kernels ~ N(0, 2 / fan_out), untruncated,
  fan_out = out_channels x kernel height x kernel width (``kaiming_normal_(mode='fan_out',
  nonlinearity='relu')``, He et al., ICCV 2015); dense layers and any convolution bias as under
  ``"torch"``. The ResNets of Inverting Gradients' code (``inversefed``) and of breaching draw
  their layers the same way; on a 3x3 convolution with as many inputs as outputs its
  variance is six times ``"torch"``'s. Image models only, as ``"torch"``.

BatchNorm scale and offset keep their defaults (1 and 0) under every scheme.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

INITS = ("uniform", "xavier_normal", "default", "torch", "torchvision")
# Schemes whose biases torch_biases draws after module.init (PyTorch's default bias).
TORCH_INITS = ("torch", "torchvision")


class Initializers(NamedTuple):
  kernel_init: nn.initializers.Initializer
  bias_init: nn.initializers.Initializer


def symmetric_uniform(a: float) -> nn.initializers.Initializer:
  """U(-a, a) for any shape; ``jax.nn.initializers.uniform`` only covers [0, a)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, minval=-a, maxval=a)

  return init


def get_initializers(name: str, scale: float = 0.5, *, conv: bool = False) -> Initializers:
  """Initializers for scheme ``name`` (see module docstring); ``scale`` is ``a`` of ``"uniform"``;
  ``conv``: for a convolution (only ``"torchvision"`` draws convolutions apart)."""
  if name == "uniform":
    return Initializers(symmetric_uniform(scale), symmetric_uniform(scale))
  if name == "xavier_normal":
    # fan_avg with scale 1 gives variance 2 / (fan_in + fan_out); fans count the receptive field.
    return Initializers(nn.initializers.variance_scaling(1.0, "fan_avg", "normal"),
                        nn.initializers.zeros)
  if name == "default":
    return Initializers(nn.initializers.lecun_normal(), nn.initializers.zeros)
  if name == "torch":
    # U(-l, l) with l = sqrt(3 scale / fan_in) = 1 / sqrt(fan_in) at scale 1/3; zero biases until
    # torch_biases draws them.
    return Initializers(nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
                        nn.initializers.zeros)
  if name == "torchvision":
    if not conv:
      return get_initializers("torch")
    return Initializers(nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
                        nn.initializers.zeros)
  raise ValueError(f"unknown init {name!r}; choose one of {', '.join(INITS)}")


def torch_biases(params, key: jax.Array):
  """``params`` with the bias of every layer that has a ``kernel`` redrawn from
  U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in the product of the kernel's dimensions but the last
  (Flax's (kh, kw, in, out) and (in, out) layouts): PyTorch's default bias of ``nn.Conv2d`` and
  ``nn.Linear``. BatchNorm's offsets (no ``kernel`` beside them) are kept. Layers get independent
  draws (``key`` folded with the layer's position in the tree)."""
  count = [0]

  def visit(tree):
    if not isinstance(tree, dict):
      return tree
    if "kernel" in tree and "bias" in tree:
      kernel, bias = tree["kernel"], tree["bias"]
      fan_in = 1
      for d in kernel.shape[:-1]:
        fan_in *= int(d)
      bound = 1.0 / fan_in ** 0.5
      count[0] += 1
      drawn = jax.random.uniform(jax.random.fold_in(key, count[0]), bias.shape, bias.dtype,
                                 minval=-bound, maxval=bound)
      return {**tree, "bias": drawn}
    return {k: visit(v) for k, v in tree.items()}

  return visit(params)
