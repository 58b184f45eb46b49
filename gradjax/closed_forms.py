"""Attacks that are closed forms, as the pipeline runs them: built from their settings, an
:class:`~gradjax.observation.Observation` in and a :class:`gradjax.attacks.Reconstruction` out, like
the optimisation attacks, so an audit can run them beside those.

The mathematics is in :mod:`gradjax.analytic`.
"""

import dataclasses
from typing import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from gradjax import analytic
from gradjax.attacks import Reconstruction
from gradjax.observation import Observation


@dataclasses.dataclass(frozen=True)
class ExclusiveNeurons:
  """The closed-form attack of :func:`gradjax.analytic.exclusive_neurons` as the pipeline runs it:
  its settings (that function's defaults; nothing is optimised, so there is no budget)."""

  layer: str = "Dense_0"
  tol: float = 1e-3
  rank_tol: float = 1e-5
  name: str = "exclusive_neurons"


# The attacks that are closed forms, by name (``--attack``): built with no arguments.
CLOSED_FORMS = {"exclusive_neurons": ExclusiveNeurons}


def reconstruct(attack: ExclusiveNeurons, apply_fn: Callable, observation: Observation,
                input_shape, bounds) -> tuple[Reconstruction, analytic.Separation]:
  """``attack`` on ``observation`` as a :class:`gradjax.attacks.Reconstruction` of all N slots.

  The recovered examples fill the first slots with their labels; a slot with nothing recovered
  holds the middle of the input box ``bounds`` ((lo, hi), (C,) each: a flat gray image) and the
  label −1 (none). ``loss`` is the separation's residual, ``iterations`` its rounds.
  """
  tree = observation.gradient
  if not isinstance(tree, Mapping) or attack.layer not in tree:
    raise ValueError(f"{attack.name} needs a model whose first layer is a biased dense layer "
                     f"followed by a ReLU (such as mlp-H); the gradient has no layer {attack.layer!r}")
  sep = analytic.exclusive_neurons(observation, apply_fn, input_shape, layer=attack.layer,
                                   tol=attack.tol, rank_tol=attack.rank_tol)
  n, k = int(observation.num_samples), sep.inputs.shape[0]
  lo, hi = (np.asarray(b, np.float32) for b in bounds)
  x = np.broadcast_to((lo + hi) / 2, (n, *tuple(input_shape))).astype(sep.inputs.dtype).copy()
  x[:k] = sep.inputs
  labels = np.full(n, -1, np.int64)
  labels[:k] = sep.labels
  rounds = int(sep.rounds.max()) + 1 if k else 0
  rec = Reconstruction(x=x, labels=labels, loss=sep.residual, best_restart=0,
                       restart_losses=np.array([sep.residual]), restart_alive=np.array([True]),
                       x_restarts=x[None], iterations=np.array([rounds]),
                       evaluations=np.array([rounds]), dummy={"x": jnp.asarray(x)},
                       permutation=np.arange(n), candidates=np.arange(n)[None])
  return rec, sep
