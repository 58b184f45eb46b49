"""The ConvNet of Geiping et al., "Inverting Gradients" (NeurIPS 2020), with width ``w`` (64 there).

Eight Conv(3x3, pad 1)-BatchNorm-ReLU blocks with channels w, 2w, 2w, 4w, 4w, 4w, [maxpool 3],
4w, 4w, [maxpool 3], then flatten and Dense(num_classes). A 32x32 input is pooled to 10x10 and then
3x3, so the head sees 36w features.
"""

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, batch_norm, conv_general_dilated, head


class ConvNet(nn.Module):
  """``x``: (N, H, W, C) -> logits (N, num_classes)."""

  num_classes: int = 10
  width: int = 64
  act: str = "relu"
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  conv: str = "xla"  # convolution implementation (gradjax.models.layers.CONVS)

  @nn.compact
  def __call__(self, x, train: bool = False):
    inits = get_initializers(self.weight_init, self.init_scale)
    act = activation(self.act)
    w = self.width
    for i, channels in enumerate((w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w, 4 * w, 4 * w)):
      x = nn.Conv(channels, (3, 3), padding=1, param_dtype=self.param_dtype, dtype=self.param_dtype,
                  conv_general_dilated=conv_general_dilated(self.conv), **inits._asdict())(x)
      x = act(batch_norm(train, self.param_dtype)(x))
      if i in (5, 7):
        x = nn.max_pool(x, (3, 3), strides=(3, 3))
    x = x.reshape(x.shape[0], -1)
    return head(self.num_classes, inits, self.param_dtype)(x)
