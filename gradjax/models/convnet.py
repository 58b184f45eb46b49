"""The ConvNet of Geiping et al., "Inverting Gradients" (NeurIPS 2020), with width ``w`` (64 there).

Eight Conv(3x3, pad 1)-BatchNorm-ReLU blocks with channels w, 2w, 2w, 4w, 4w, 4w, [maxpool 3],
4w, 4w, [maxpool 3], then flatten and Dense(num_classes). A 32x32 input is pooled to 10x10 and then
3x3, so the head sees 36w features.
"""

from collections import OrderedDict
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, batch_norm, conv_general_dilated, head, max_pool
from gradjax.models.spec import Options, ModelSpec, ZooName


class ConvNet(nn.Module):
  """``x``: (N, H, W, C) -> logits (N, num_classes)."""

  num_classes: int = 10
  width: int = 64
  act: str = "relu"
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  conv: str = "xla"  # convolution implementation (gradjax.models.layers.CONVS)
  pool: str = "max"  # "max" (the paper's) or "avg": the two 3x3 poolings (the batches study's diagnosis)
  sharpness: Any = None  # κ: ReLU and max pooling rounded (layers.smooth_relu, layers.max_pool); None: exact

  @nn.compact
  def __call__(self, x, train: bool = False):
    if self.pool not in ("max", "avg"):
      raise ValueError(f"ConvNet pooling is max or avg, got {self.pool!r}")
    if self.pool == "max":
      pool = lambda x: max_pool(x, 3, self.sharpness)
    else:
      pool = lambda x: nn.avg_pool(x, (3, 3), strides=(3, 3))
    inits = get_initializers(self.weight_init, self.init_scale)
    conv_inits = get_initializers(self.weight_init, self.init_scale, conv=True)
    act = activation(self.act, self.sharpness)
    w = self.width
    for i, channels in enumerate((w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w, 4 * w, 4 * w)):
      x = nn.Conv(channels, (3, 3), padding=1, param_dtype=self.param_dtype, dtype=self.param_dtype,
                  conv_general_dilated=conv_general_dilated(self.conv), **conv_inits._asdict())(x)
      x = act(batch_norm(train, self.param_dtype)(x))
      if i in (5, 7):
        x = pool(x)
    x = x.reshape(x.shape[0], -1)
    return head(self.num_classes, inits, self.param_dtype)(x)


# --- zoo entry -------------------------------------------------------------------------------------


def _build(zoo: ZooName, o: Options) -> nn.Module:
  act = {} if o.act is None else {"act": o.act}
  return ConvNet(num_classes=o.num_classes, width=zoo.width, weight_init=o.init or "default",
                 init_scale=o.init_scale, param_dtype=o.param_dtype, conv=o.conv, **act)


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """model.conv{i}, model.bn{i} (i = 0..7), model.linear (Geiping et al.'s naming)."""
  del zoo, params
  rows = []
  for i in range(8):
    rows += [(f"model.conv{i}", f"Conv_{i}", "conv"), (f"model.bn{i}", f"BatchNorm_{i}", "batch_norm")]
  return rows + [("model.linear", "head", "dense", chw)]


def _torch_module(zoo: ZooName, torch, input_shape, num_classes: int):
  """Geiping et al.'s module: one Sequential ``model`` of conv{i}, bn{i}, relu{i} (i = 0..7), pool0
  after the sixth block and pool1 after the eighth, flatten, linear (:func:`_torch_rows`'s names)."""
  nn_ = torch.nn
  h, w, c = input_shape
  layers = []
  for i, out in enumerate(zoo.width * m for m in (1, 2, 2, 4, 4, 4, 4, 4)):
    layers += [(f"conv{i}", nn_.Conv2d(c, out, 3, padding=1)), (f"bn{i}", nn_.BatchNorm2d(out)),
               (f"relu{i}", nn_.ReLU())]
    if i in (5, 7):
      layers.append((f"pool{(i - 5) // 2}", nn_.MaxPool2d(3)))
    c = out
  layers.append(("flatten", nn_.Flatten()))
  with torch.no_grad():
    size = nn_.Sequential(OrderedDict(layers))(torch.zeros(1, input_shape[2], h, w)).shape[1]
  layers.append(("linear", nn_.Linear(size, num_classes)))
  return nn_.Sequential(OrderedDict(model=nn_.Sequential(OrderedDict(layers))))


# Two 3×3 max-pools: ⌊⌊H/3⌋/3⌋ × ⌊⌊W/3⌋/3⌋ × 4W flattened.
SPEC = ModelSpec("convnet", r"convnet(?:-([1-9]\d*))?", ("convnet",), _build, _torch_rows,
            lambda zoo, shape: (4 * zoo.width, int(shape[0]) // 3 // 3, int(shape[1]) // 3 // 3),
            _torch_module, default_width=64, batch_norm=True)
