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

from collections import OrderedDict
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, conv_general_dilated, head
from gradjax.models.spec import Options, ModelSpec, ZooName


class LeNetZhu(nn.Module):
  """DLG's LeNet. ``x``: (N, H, W, C) -> logits (N, num_classes)."""

  num_classes: int = 10
  weight_init: str = "uniform"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  conv: str = "xla"  # convolution implementation (gradjax.models.layers.CONVS)
  act: str = "sigmoid"
  sharpness: Any = None  # κ: a ReLU rounded to softplus_κ (layers.smooth_relu); None: exact

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # no batch statistics
    inits = get_initializers(self.weight_init, self.init_scale)
    kw = dict(kernel_size=(5, 5), padding=2, param_dtype=self.param_dtype, dtype=self.param_dtype,
              conv_general_dilated=conv_general_dilated(self.conv),
              **get_initializers(self.weight_init, self.init_scale, conv=True)._asdict())
    for stride in (2, 2, 1):
      x = activation(self.act, self.sharpness)(nn.Conv(12, strides=stride, **kw)(x))
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
  sharpness: Any = None  # κ: a ReLU rounded to softplus_κ (layers.smooth_relu); None: exact

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    inits = get_initializers(self.weight_init, self.init_scale)
    conv_inits = get_initializers(self.weight_init, self.init_scale, conv=True)
    for _ in range(4):
      x = activation(self.act, self.sharpness)(nn.Conv(12, (5, 5), strides=1, padding=2, param_dtype=self.param_dtype,
                             dtype=self.param_dtype, conv_general_dilated=conv_general_dilated(self.conv),
                             **conv_inits._asdict())(x))
    x = x.reshape(x.shape[0], -1)
    return head(self.num_classes, inits, self.param_dtype)(x)


# --- zoo entries -----------------------------------------------------------------------------------


def _build(cls):
  def build(zoo: ZooName, o: Options) -> nn.Module:
    del zoo
    act = {} if o.act is None else {"act": o.act}
    return cls(num_classes=o.num_classes, weight_init=o.init or "uniform", init_scale=o.init_scale,
               param_dtype=o.param_dtype, conv=o.conv, **act)
  return build


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """body.{0,2,4[,6]} (convolutions between activations), fc.0 (the head) of a Sequential twin."""
  del zoo
  convs = sorted((k for k in params if k.startswith("Conv_")), key=lambda k: int(k[5:]))
  return [(f"body.{2 * i}", k, "conv") for i, k in enumerate(convs)] + [("fc.0", "head", "dense", chw)]


def _torch_module(strides):
  def torch_module(zoo: ZooName, torch, input_shape, num_classes: int):
    """Sigmoid convolutions of 12 channels (``body``), then the head (``fc``), named as
    :func:`_torch_rows` (DLG's code); every weight and bias ~ U(-0.5, 0.5) (its ``weights_init``)."""
    del zoo
    nn_ = torch.nn
    h, w, c = input_shape
    layers = []
    for stride in strides:
      layers += [nn_.Conv2d(c, 12, 5, stride=stride, padding=2), nn_.Sigmoid()]
      c = 12
    body = nn_.Sequential(*layers)
    with torch.no_grad():
      size = body(torch.zeros(1, input_shape[2], h, w)).numel()
    model = nn_.Sequential(OrderedDict(body=body, flatten=nn_.Flatten(),
                                       fc=nn_.Sequential(nn_.Linear(size, num_classes))))
    for p in model.parameters():
      nn_.init.uniform_(p, -0.5, 0.5)
    return model
  return torch_module


# lenet_zhu: strides 2, 2, 1 give ⌈H/4⌉ × ⌈W/4⌉ × 12; lenet5: H × W × 12.
LENET_ZHU = ModelSpec("lenet_zhu", "lenet_zhu", ("lenet_zhu",), _build(LeNetZhu), _torch_rows,
                 lambda zoo, shape: (12, -(-int(shape[0]) // 4), -(-int(shape[1]) // 4)),
                 _torch_module((2, 2, 1)))
LENET5 = ModelSpec("lenet5", "lenet5", ("lenet5",), _build(LeNet5), _torch_rows,
              lambda zoo, shape: (12, int(shape[0]), int(shape[1])), _torch_module((1, 1, 1, 1)))
