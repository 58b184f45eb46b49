"""LeNets of the DLG and SAPAG papers.

``LeNetZhu`` (Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, and the mit-han-lab/dlg code)::

  Conv(12, 5x5, pad 2, stride 2) - sigmoid - Conv(12, 5x5, pad 2, stride 2) - sigmoid
  - Conv(12, 5x5, pad 2, stride 1) - sigmoid - flatten - Dense(num_classes)

On 32x32x3 inputs the flattened feature has 8*8*12 = 768 entries. The DLG paper uses sigmoid because
ReLU's zero second derivative starves the gradient-matching objective.

``LeNet5`` (Wang et al., SAPAG): four Conv(12, 5x5, pad 2, stride 1) - sigmoid, then one Dense.

Both papers use sigmoid; ``act`` swaps it for another ``jax.nn`` activation (e.g. ``"relu"``, the
common PyTorch LeNet), so a captured update of such a client is attacked as the network it came from.

Inputs are NHWC. Flattening is in HWC order (PyTorch flattens CHW); for randomly initialised models this
is only a relabelling of the head's rows.
"""

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, conv_general_dilated, head


class LeNetZhu(nn.Module):
  """DLG's LeNet. ``x``: (N, H, W, C) -> logits (N, num_classes)."""

  num_classes: int = 10
  weight_init: str = "uniform"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  conv: str = "xla"  # convolution implementation (gradjax.models.layers.CONVS)
  act: str = "sigmoid"

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # no batch statistics
    inits = get_initializers(self.weight_init, self.init_scale)
    kw = dict(kernel_size=(5, 5), padding=2, param_dtype=self.param_dtype, dtype=self.param_dtype,
              conv_general_dilated=conv_general_dilated(self.conv), **inits._asdict())
    for stride in (2, 2, 1):
      x = activation(self.act)(nn.Conv(12, strides=stride, **kw)(x))
    x = x.reshape(x.shape[0], -1)
    return head(self.num_classes, inits, self.param_dtype)(x)


class LeNet5(nn.Module):
  """SAPAG's LeNet-5. ``x``: (N, H, W, C) -> logits (N, num_classes)."""

  num_classes: int = 10
  weight_init: str = "xavier_normal"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  conv: str = "xla"
  act: str = "sigmoid"

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    inits = get_initializers(self.weight_init, self.init_scale)
    for _ in range(4):
      x = activation(self.act)(nn.Conv(12, (5, 5), strides=1, padding=2, param_dtype=self.param_dtype,
                             dtype=self.param_dtype, conv_general_dilated=conv_general_dilated(self.conv),
                             **inits._asdict())(x))
    x = x.reshape(x.shape[0], -1)
    return head(self.num_classes, inits, self.param_dtype)(x)
