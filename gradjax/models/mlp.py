"""The MLP of the DLM paper: flatten - Dense(32) - ReLU - Dense(num_classes).

With 32x32x3 inputs and 100 classes this is the 3072 -> 32 -> 100 network attacked by DLM / DLM+.
"""

from collections import OrderedDict
from typing import Any, Sequence

import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import activation, head
from gradjax.models.spec import Options, ModelSpec, ZooName


class MLP(nn.Module):
  """``x``: (N, ...) -> logits (N, num_classes)."""

  num_classes: int = 100
  hidden: Sequence[int] = (32,)
  act: str = "relu"
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  sharpness: Any = None  # κ: ReLU rounded to softplus_κ (layers.smooth_relu); None: exact

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    inits = get_initializers(self.weight_init, self.init_scale)
    kw = dict(param_dtype=self.param_dtype, dtype=self.param_dtype, **inits._asdict())
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = activation(self.act, self.sharpness)(nn.Dense(width, **kw)(x))
    return head(self.num_classes, inits, self.param_dtype)(x)


# --- zoo entry -------------------------------------------------------------------------------------


def _build(zoo: ZooName, o: Options) -> nn.Module:
  act = {} if o.act is None else {"act": o.act}
  return MLP(num_classes=o.num_classes, hidden=(zoo.width,), weight_init=o.init or "default",
             init_scale=o.init_scale, param_dtype=o.param_dtype, **act)


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """fc1 .. fc{k} (hidden layers), fc{k+1} (the head)."""
  del zoo
  hidden = sorted((k for k in params if k.startswith("Dense_")), key=lambda k: int(k[6:]))
  rows = [(f"fc{i + 1}", k, "dense", chw if i == 0 else None) for i, k in enumerate(hidden)]
  return rows + [(f"fc{len(hidden) + 1}", "head", "dense", None if hidden else chw)]


def _torch_module(zoo: ZooName, torch, input_shape, num_classes: int):
  """Flatten, ``fc1`` (the hidden layer), ReLU, ``fc2`` (the head): :func:`_torch_rows`'s names."""
  nn_ = torch.nn
  h, w, c = input_shape
  return nn_.Sequential(OrderedDict(flatten=nn_.Flatten(), fc1=nn_.Linear(h * w * c, zoo.width),
                                    relu=nn_.ReLU(), fc2=nn_.Linear(zoo.width, num_classes)))


# The input itself is flattened: (C, H, W).
SPEC = ModelSpec("mlp", r"mlp(?:-([1-9]\d*))?", ("mlp",), _build, _torch_rows,
            lambda zoo, shape: (int(shape[2]), int(shape[0]), int(shape[1])), _torch_module,
            default_width=32)
