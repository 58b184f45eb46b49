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

from typing import Any, Sequence

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, batch_norm, conv_general_dilated, head
from gradjax.models.spec import Options, ModelSpec, ZooName


class BasicBlock(nn.Module):
  channels: int
  stride: int
  act: str
  weight_init: str
  init_scale: float
  param_dtype: jnp.dtype
  conv: str
  sharpness: Any = None

  @nn.compact
  def __call__(self, x, train: bool):
    inits = get_initializers(self.weight_init, self.init_scale, conv=True)
    conv = lambda c, k, s: nn.Conv(c, (k, k), strides=s, padding=k // 2, use_bias=False,
                                   param_dtype=self.param_dtype, dtype=self.param_dtype,
                                   kernel_init=inits.kernel_init,
                                   conv_general_dilated=conv_general_dilated(self.conv))
    act = activation(self.act, self.sharpness)
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
  sharpness: Any = None  # κ: ReLU rounded to softplus_κ (layers.smooth_relu); None: exact

  @nn.compact
  def __call__(self, x, train: bool = False):
    inits = get_initializers(self.weight_init, self.init_scale)
    conv_inits = get_initializers(self.weight_init, self.init_scale, conv=True)
    block_cls = nn.remat(BasicBlock, static_argnums=(2,)) if self.remat else BasicBlock
    count = 0
    block_kw = dict(act=self.act, weight_init=self.weight_init, init_scale=self.init_scale,
                    param_dtype=self.param_dtype, conv=self.conv, sharpness=self.sharpness)
    x = nn.Conv(self.base_channels, (3, 3), padding=1, use_bias=False, param_dtype=self.param_dtype,
                dtype=self.param_dtype, kernel_init=conv_inits.kernel_init,
                conv_general_dilated=conv_general_dilated(self.conv))(x)
    x = activation(self.act, self.sharpness)(batch_norm(train, self.param_dtype)(x))
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


# --- zoo entry -------------------------------------------------------------------------------------


def _build(zoo: ZooName, o: Options) -> nn.Module:
  act = {} if o.act is None else {"act": o.act}
  return ResNet(**resnet_config(zoo.depth, zoo.width), num_classes=o.num_classes, stride1=o.stride1,
                weight_init=o.init or "default", init_scale=o.init_scale, param_dtype=o.param_dtype,
                remat=o.remat, conv=o.conv, **act)


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """conv1, bn1, layer{s}.{b}.{conv1,bn1,conv2,bn2,shortcut.0,shortcut.1}, linear (the CIFAR
  ResNets of kuangliu/pytorch-cifar and Geiping et al.)."""
  del chw
  rows = [("conv1", "Conv_0", "conv"), ("bn1", "BatchNorm_0", "batch_norm")]
  block = 0
  for s, count in enumerate(resnet_config(zoo.depth, zoo.width)["stage_sizes"]):
    for b in range(count):
      prefix, path = f"layer{s + 1}.{b}", f"BasicBlock_{block}"
      rows += [(f"{prefix}.conv1", f"{path}/Conv_0", "conv"),
               (f"{prefix}.bn1", f"{path}/BatchNorm_0", "batch_norm"),
               (f"{prefix}.conv2", f"{path}/Conv_1", "conv"),
               (f"{prefix}.bn2", f"{path}/BatchNorm_1", "batch_norm")]
      if "Conv_2" in params[path]:
        rows += [(f"{prefix}.shortcut.0", f"{path}/Conv_2", "conv"),
                 (f"{prefix}.shortcut.1", f"{path}/BatchNorm_2", "batch_norm")]
      block += 1
  return rows + [("linear", "head", "dense")]


def _torch_module(zoo: ZooName, torch, input_shape, num_classes: int):
  """kuangliu/pytorch-cifar's module (:func:`_torch_rows`'s names): stem conv1-bn1-ReLU, stages
  layer1.. of basic blocks (conv1-bn1-ReLU-conv2-bn2 plus ``shortcut``, projected where the shape
  changes, then ReLU; the stages after the first stride 2), global average pooling, linear."""
  nn_ = torch.nn
  relu = torch.nn.functional.relu

  class TorchBasicBlock(nn_.Module):

    def __init__(self, c_in, c_out, stride):
      super().__init__()
      self.conv1 = nn_.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
      self.bn1 = nn_.BatchNorm2d(c_out)
      self.conv2 = nn_.Conv2d(c_out, c_out, 3, padding=1, bias=False)
      self.bn2 = nn_.BatchNorm2d(c_out)
      self.shortcut = nn_.Sequential()
      if stride != 1 or c_in != c_out:
        self.shortcut = nn_.Sequential(nn_.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                       nn_.BatchNorm2d(c_out))

    def forward(self, x):
      return relu(self.bn2(self.conv2(relu(self.bn1(self.conv1(x))))) + self.shortcut(x))

  class TorchResNet(nn_.Module):

    def __init__(self):
      super().__init__()
      config = resnet_config(zoo.depth, zoo.width)
      base, c = config["base_channels"], input_shape[2]
      self.conv1 = nn_.Conv2d(c, base, 3, padding=1, bias=False)
      self.bn1 = nn_.BatchNorm2d(base)
      c = base
      for stage, blocks in enumerate(config["stage_sizes"]):
        layer = []
        for block in range(blocks):
          layer.append(TorchBasicBlock(c, base * 2**stage, 2 if stage > 0 and block == 0 else 1))
          c = base * 2**stage
        setattr(self, f"layer{stage + 1}", nn_.Sequential(*layer))
      self.stages = len(config["stage_sizes"])
      self.linear = nn_.Linear(c, num_classes)

    def forward(self, x):
      x = relu(self.bn1(self.conv1(x)))
      for stage in range(self.stages):
        x = getattr(self, f"layer{stage + 1}")(x)
      return self.linear(x.mean(dim=(2, 3)))

  return TorchResNet()


# Global pooling: nothing is flattened spatially.
SPEC = ModelSpec("resnet", r"resnet([1-9]\d*)(?:-([1-9]\d*))?",
            ("resnet20-4", "resnet32-10", "resnet18", "resnet34"), _build, _torch_rows,
            torch_module=_torch_module, default_width=1, depth_and_width=True, batch_norm=True)
