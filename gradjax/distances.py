"""Distances between a dummy gradient and the observed one, over whole parameter pytrees.

A distance is ``distance(dummy_tree, observed_tree) -> scalar``; both trees have the parameters'
structure. Norms are written as ``sqrt(sum + eps)`` rather than ``jnp.linalg.norm`` because the attack
differentiates through them and the norm's gradient at 0 is NaN.

Conventions (they change published numbers, so they are explicit):

* ``euclidean``: D = scale · Σ_l ‖g'_l − g_l‖². The DLG code uses scale 1 ("dlg"); breaching and other
  libraries use 0.5.
* ``cosine``: D = 1 − ⟨g', g⟩ / (‖g'‖ ‖g‖), inner products and norms over all layers together
  (Geiping et al., "Inverting Gradients", 2020).
"""

from typing import Callable

import jax
import jax.numpy as jnp

Distance = Callable[..., jax.Array]

EPS = 1e-12


def _tree_sum(fn, *trees) -> jax.Array:
  return sum(jnp.sum(fn(*leaves)) for leaves in zip(*(jax.tree.leaves(t) for t in trees)))


def euclidean(dummy, observed, *, scale: float = 1.0) -> jax.Array:
  """scale · Σ_l ‖dummy_l − observed_l‖² (DLG, Zhu et al. 2019, with scale 1)."""
  return scale * _tree_sum(lambda a, b: jnp.square(a - b), dummy, observed)


def cosine(dummy, observed, *, eps: float = EPS) -> jax.Array:
  """1 − ⟨g', g⟩ / (sqrt(‖g'‖² + eps) · sqrt(‖g‖² + eps)), over all layers together."""
  dot = _tree_sum(jnp.multiply, dummy, observed)
  norm_d = jnp.sqrt(_tree_sum(jnp.square, dummy) + eps)
  norm_o = jnp.sqrt(_tree_sum(jnp.square, observed) + eps)
  return 1.0 - dot / (norm_d * norm_o)


DISTANCES: dict[str, Distance] = {
    "euclidean": euclidean,                                   # DLG code: Σ‖g' − g‖²
    "euclidean_half": lambda d, o: euclidean(d, o, scale=0.5),  # breaching: 0.5·Σ‖g' − g‖²
    "cosine": cosine,
}


def get_distance(name: str) -> Distance:
  """The distance registered as ``name`` (see ``DISTANCES``)."""
  try:
    return DISTANCES[name]
  except KeyError:
    raise ValueError(f"unknown distance {name!r}; choose one of {', '.join(DISTANCES)}") from None
