"""What the zoo knows of one model family, in one record: :class:`ModelSpec`.

A family's file (``lenet.py``, ``convnet.py``, ...) holds its Flax module and its :class:`ModelSpec`: the
names it answers to, how it is built from them, how a PyTorch twin names its tensors (read by
:mod:`gradjax.interop`), and the twin itself (built for the benchmarks' PyTorch baseline, with the
``torch`` module handed in: gradjax never imports torch). :data:`gradjax.models.FAMILIES` lists the
specs; a new model is its file and one line there.
"""

import dataclasses
import re
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp


class ZooName(NamedTuple):
  """A zoo model's name, read (:func:`gradjax.models.parse_name`): its ``family``, a ResNet's
  ``depth``, and ``width``: the ConvNet's W (64 when unnamed), the MLP's hidden units H (32), the
  ResNet's width factor (1)."""

  family: str
  depth: int | None = None
  width: int | None = None


class Options(NamedTuple):
  """How a zoo module is built besides its name (:func:`gradjax.models.get_module`'s arguments):
  ``init`` is None for the family's default, ``conv`` already resolved; a family reads what it
  has."""

  num_classes: int
  init: str | None = None
  init_scale: float = 0.5
  act: str | None = None
  stride1: bool = False
  param_dtype: Any = jnp.float32
  remat: bool = False
  conv: str = "xla"
  text_sizes: Any = None


# One row of a PyTorch naming: (PyTorch module name, Flax module path, kind[, (C, H, W) flattened]),
# as gradjax.interop.module_mapping reads it.
TorchRow = tuple


def _no_flatten(zoo: ZooName, input_shape) -> None:
  del zoo, input_shape


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One zoo family.

  Attributes:
    family: its name, e.g. ``"resnet"``.
    pattern: the regular expression of its model names; groups give ``depth`` then ``width``, or
      ``width`` alone (``widths`` says which), defaults filled from ``default_width``.
    examples: names listed in :data:`gradjax.models.MODELS` (help texts, errors).
    build: ``build(zoo, options) -> flax module``.
    torch_rows: ``torch_rows(zoo, params, chw) -> [TorchRow]``: the PyTorch twin's tensor names
      (see :mod:`gradjax.interop`), or None when there is no twin.
    flatten_chw: ``flatten_chw(zoo, (H, W, C)) -> (C, H, W)`` of the map flattened before a dense
      layer (PyTorch flattens channels first), or None.
    torch_module: ``torch_module(zoo, torch, (H, W, C), num_classes) -> torch.nn.Module``, the PyTorch
      twin (same layers and parameter count, its own weights), or None.
    text: reads token ids (N, T) rather than images.
    masked_lm: a text model trained to predict masked tokens, not the next one.
    depth_and_width: the pattern's groups are (depth, width); else (width,).
    batch_norm: has BatchNorm, whose batch statistics in training mode make each example's
      gradient depend on the others'.
  """

  family: str
  pattern: str
  examples: tuple[str, ...]
  build: Callable[[ZooName, Options], Any]
  torch_rows: Callable[[ZooName, Any, Any], list[TorchRow]] | None = None
  flatten_chw: Callable[[ZooName, Any], tuple[int, int, int] | None] = _no_flatten
  torch_module: Callable[..., Any] | None = None
  default_width: int | None = None
  text: bool = False
  masked_lm: bool = False
  depth_and_width: bool = False
  batch_norm: bool = False

  def parse(self, name: str) -> ZooName | None:
    """The :class:`ZooName` of ``name`` if this family answers to it, else None."""
    m = re.fullmatch(self.pattern, name)
    if m is None:
      return None
    groups = m.groups()
    if self.depth_and_width:
      return ZooName(self.family, int(groups[0]), int(groups[1] or self.default_width))
    if groups:
      return ZooName(self.family, width=int(groups[0] or self.default_width))
    return ZooName(self.family)
