"""The MLP of the DLM paper: flatten - Dense(32) - ReLU - Dense(num_classes).

With 32x32x3 inputs and 100 classes this is the 3072 -> 32 -> 100 network attacked by DLM / DLM+.
"""

from typing import Sequence

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, head


class MLP(nn.Module):
  """``x``: (N, ...) -> logits (N, num_classes)."""

  num_classes: int = 100
  hidden: Sequence[int] = (32,)
  act: str = "relu"
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    inits = get_initializers(self.weight_init, self.init_scale)
    kw = dict(param_dtype=self.param_dtype, dtype=self.param_dtype, **inits._asdict())
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = activation(self.act)(nn.Dense(width, **kw)(x))
    return head(self.num_classes, inits, self.param_dtype)(x)
