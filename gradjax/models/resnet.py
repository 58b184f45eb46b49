"""ResNets for small images (He et al., 2016), as used throughout the gradient-inversion literature.

Two families, both with a 3x3 stride-1 stem and no stem pooling (CIFAR style), basic blocks,
projection shortcuts (1x1 conv + BatchNorm) where the shape changes, global average pooling and a
Dense head:

* depth 6n + 2 (``resnet20``, ``resnet32``, ...): 3 stages of n blocks, channels b, 2b, 4b with
  b = 16 * width. ``resnet20-4`` is Geiping et al.'s ResNet20-4 (b = 64), ``resnet32-10`` b = 160.
* ``resnet18`` / ``resnet34``: 4 stages of [2, 2, 2, 2] / [3, 4, 6, 3] blocks, channels b .. 8b with
  b = 64 * width.

``act`` selects the activation (SAPAG attacks a sigmoid ResNet-18) and ``stride1=True`` makes every
stage stride 1 (SAPAG's stride-1 variant; the feature maps then keep the input resolution).
"""

from typing import Sequence

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, batch_norm, conv_general_dilated, head


class BasicBlock(nn.Module):
  channels: int
  stride: int
  act: str
  weight_init: str
  init_scale: float
  param_dtype: jnp.dtype
  conv: str

  @nn.compact
  def __call__(self, x, train: bool):
    inits = get_initializers(self.weight_init, self.init_scale)
    conv = lambda c, k, s: nn.Conv(c, (k, k), strides=s, padding=k // 2, use_bias=False,
                                   param_dtype=self.param_dtype, dtype=self.param_dtype,
                                   kernel_init=inits.kernel_init,
                                   conv_general_dilated=conv_general_dilated(self.conv))
    act = activation(self.act)
    y = act(batch_norm(train, self.param_dtype)(conv(self.channels, 3, self.stride)(x)))
    y = batch_norm(train, self.param_dtype)(conv(self.channels, 3, 1)(y))
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = batch_norm(train, self.param_dtype)(conv(self.channels, 1, self.stride)(x))
    return act(x + y)


class ResNet(nn.Module):
  """``x``: (N, H, W, C) -> logits (N, num_classes)."""

  stage_sizes: Sequence[int]
  base_channels: int
  num_classes: int = 10
  act: str = "relu"
  stride1: bool = False
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  remat: bool = False  # jax.checkpoint every block: activations recomputed in backward passes
  conv: str = "xla"  # convolution implementation (gradjax.models.layers.CONVS)

  @nn.compact
  def __call__(self, x, train: bool = False):
    inits = get_initializers(self.weight_init, self.init_scale)
    block_cls = nn.remat(BasicBlock, static_argnums=(2,)) if self.remat else BasicBlock
    count = 0
    block_kw = dict(act=self.act, weight_init=self.weight_init, init_scale=self.init_scale,
                    param_dtype=self.param_dtype, conv=self.conv)
    x = nn.Conv(self.base_channels, (3, 3), padding=1, use_bias=False, param_dtype=self.param_dtype,
                dtype=self.param_dtype, kernel_init=inits.kernel_init,
                conv_general_dilated=conv_general_dilated(self.conv))(x)
    x = activation(self.act)(batch_norm(train, self.param_dtype)(x))
    for stage, blocks in enumerate(self.stage_sizes):
      for block in range(blocks):
        stride = 2 if stage > 0 and block == 0 and not self.stride1 else 1
        # Named as without remat, so checkpoints and observations fit either way.
        x = block_cls(self.base_channels * 2**stage, stride, name=f"BasicBlock_{count}",
                      **block_kw)(x, train)
        count += 1
    x = jnp.mean(x, axis=(1, 2))
    return head(self.num_classes, inits, self.param_dtype)(x)


def resnet_config(depth: int, width: int) -> dict:
  """Stage sizes and base channels of ``resnet{depth}-{width}``."""
  if depth == 18:
    return dict(stage_sizes=(2, 2, 2, 2), base_channels=64 * width)
  if depth == 34:
    return dict(stage_sizes=(3, 4, 6, 3), base_channels=64 * width)
  if depth >= 8 and (depth - 2) % 6 == 0:
    n = (depth - 2) // 6
    return dict(stage_sizes=(n, n, n), base_channels=16 * width)
  raise ValueError(f"unsupported ResNet depth {depth}: use 18, 34 or 6n+2 (20, 32, 44, 56, 110)")
