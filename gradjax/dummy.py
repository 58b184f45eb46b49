"""Dummy data: where an attack's optimisation starts.

A dummy initialisation is ``init(key, shape, lo, hi, dtype) -> x``: ``shape`` the dummy batch's,
(N, H, W, C) for images or (N, ..., C) for any input whose last axis ``lo`` and ``hi`` ((C,) each,
the valid range in the model's input space) index. :data:`INITS` names the built-in ones;
:func:`init_dummy` adds the other optimised variables (DLG's soft-label logits, DLM's scale).
"""

import math
from typing import Callable

import jax
import jax.numpy as jnp

PATTERN_SIZE = 4  # side of the random tile repeated by pattern()

DummyInit = Callable[..., jax.Array]


def normal(key, shape, lo, hi, dtype):
  """x ~ N(0, 1) (DLG; Inverting Gradients in normalised space)."""
  del lo, hi
  return jax.random.normal(key, shape, dtype)


def uniform(key, shape, lo, hi, dtype):
  """x ~ U(lo, hi) over the image box."""
  return lo + (hi - lo) * jax.random.uniform(key, shape, dtype)


def constant(key, shape, lo, hi, dtype):
  """x = (lo + hi) / 2, the box's midpoint (mid-grey)."""
  del key
  return jnp.broadcast_to((lo + hi) / 2, shape).astype(dtype)


def pattern(key, shape, lo, hi, dtype):
  """A random N(0, 1) tile of PATTERN_SIZE × PATTERN_SIZE pixels per image, repeated over it;
  images (N, H, W, C) only."""
  del lo, hi
  if len(shape) != 4:
    raise ValueError(f"the 'pattern' initialisation tiles images (N, H, W, C), not shape {shape}")
  n, h, w, c = shape
  tile = jax.random.normal(key, (n, PATTERN_SIZE, PATTERN_SIZE, c), dtype)
  reps = (1, -(-h // PATTERN_SIZE), -(-w // PATTERN_SIZE), 1)
  return jnp.tile(tile, reps)[:, :h, :w, :]


INITS: dict[str, DummyInit] = {"normal": normal, "uniform": uniform, "constant": constant,
                               "pattern": pattern}


def get_init(name: str) -> DummyInit:
  """The dummy initialisation registered as ``name``."""
  if name not in INITS:
    raise ValueError(f"unknown dummy init {name!r}; choose one of {', '.join(INITS)}")
  return INITS[name]


def init_dummy(key: jax.Array, init: DummyInit, shape: tuple[int, ...],
               label_shape: int | tuple[int, ...] | None, bounds=(0.0, 1.0), dtype=jnp.float32,
               gamma: float | None = None) -> dict:
  """Initial dummy variables ``{"x": shape, ["label_logits": (N, *label_shape) ~ N(0, 1)],
  ["log_gamma"]}``.

  Args:
    key: PRNG key.
    init: a dummy initialisation, e.g. :func:`normal`.
    shape: (N, H, W, C) images, or (N, ..., C) any input whose last axis the bounds index (text:
      (N, T, dim) embeddings).
    label_shape: the logits of one example, K or (K,) for a classifier, (T, V) for a language model;
      None when labels are not optimised.
    bounds: (lo, hi) of the valid input range in the model's input space, scalars or (C,).
    gamma: DLM's initial scale γ: adds ``log_gamma`` = log γ (``None``: no γ).
  """
  kx, ky = jax.random.split(key)
  lo, hi = (jnp.broadcast_to(jnp.asarray(b, dtype), shape[-1:]) for b in bounds)
  dummy = {"x": jnp.asarray(init(kx, shape, lo, hi, dtype), dtype)}
  if dummy["x"].shape != tuple(shape):
    raise ValueError(f"the dummy initialisation gave shape {dummy['x'].shape}, not {tuple(shape)}")
  if label_shape is not None:
    label_shape = (label_shape,) if isinstance(label_shape, int) else tuple(label_shape)
    dummy["label_logits"] = jax.random.normal(ky, (shape[0], *label_shape), dtype)
  if gamma is not None:
    dummy["log_gamma"] = jnp.full((), math.log(gamma), dtype)
  return dummy
