"""Attacks that are closed forms, as the pipeline runs them: built from their settings, an
:class:`~gradjax.observation.Observation` in and a :class:`gradjax.attacks.Reconstruction` out, like
the optimisation attacks, so an audit can run them beside those.

The mathematics is in :mod:`gradjax.analytic`.
"""

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np

from gradjax import analytic, cocktail, malicious, rgap
from gradjax.attacks import Reconstruction
from gradjax.models.lenet import LeNet5, LeNetZhu
from gradjax.models.mlp import MLP
from gradjax.observation import Observation


@dataclasses.dataclass(frozen=True)
class ExclusiveNeurons:
  """The closed-form attack of :func:`gradjax.analytic.exclusive_neurons` as the pipeline runs it:
  its settings (that function's defaults; nothing is optimised, so there is no budget)."""

  layer: str = "Dense_0"
  tol: float = 1e-3
  rank_tol: float = 1e-5
  name: str = "exclusive_neurons"


@dataclasses.dataclass(frozen=True)
class CocktailParty:
  """The Cocktail Party Attack (:func:`gradjax.cocktail.separate`; Kariyappa et al., ICML 2023) as
  the pipeline runs it: a batch of fewer examples than the biased dense first ``layer`` has units,
  unmixed by FastICA on the images' differences, each scaled by its bias coordinate, then at most
  ``rounds`` of refinement by the update itself (least squares on the share ``keep`` of the units
  the examples explain best, ``step`` a round) until a round moves them by less than ``tol``; up to
  ``restarts`` FastICA starts, stopping at the first whose residual is at most ``converged`` (that
  function's defaults; ICA is iterative, but nothing is optimised against a budget)."""

  layer: str = "Dense_0"
  rank_tol: float = 1e-5
  rounds: int = 500
  tol: float = 1e-7
  step: float = 0.2
  keep: float = 0.5
  seed: int = 0
  restarts: int = 4
  converged: float = 1e-4
  name: str = "cocktail_party"


@dataclasses.dataclass(frozen=True)
class RGap:
  """R-GAP through a ReLU chain (:func:`gradjax.rgap.rgap`) as the pipeline runs it: one example, a
  zoo model that is a chain of convolutions or dense layers, each followed by a ReLU, then a dense
  head (:func:`chain`: ``lenet_zhu``, ``lenet5`` or ``mlp-H`` with ``act=relu``). ``tv``: τ of the
  input layer's problem, chosen on CIFAR-10 test images 0-9 (``experiments/studies/batches``)."""

  tv: float = 0.03
  name: str = "rgap"


@dataclasses.dataclass(frozen=True)
class Dager:
  """The span attack on a language model's gradient (:func:`gradjax.dager.recover`; DAGER, Petrov
  et al., NeurIPS 2024) as the pipeline runs it: nothing is optimised, each span's rank and tolerance
  come from its singular values; ``max_prefixes`` and ``chunk`` bound its search and memory (that
  function's defaults). ``take_over``: where the spans give each position's words but not the
  sentences (:class:`gradjax.dager.Unreadable` with its ``position_sets``), the iterations of the
  token search (DLG's objective, :func:`gradjax.text.reconstruct` with ``search="tokens"``) that
  orders them, each position kept to its own set; 0: none (the words are reported)."""

  max_prefixes: int | None = None
  chunk: int = 512
  take_over: int = 0
  name: str = "dager"


@dataclasses.dataclass(frozen=True)
class Imprint:
  """A malicious server's read-out of the imprint it hid in the model it sent
  (:func:`gradjax.malicious.imprint_recover`; Robbing the Fed, Fowl et al., ICLR 2022): the units of
  the dense ``layer`` of the sent model that share one direction (:func:`gradjax.malicious.imprint_units`),
  each bin's example as the difference of two neighbouring units' weight gradients over that of their
  biases. What an audit runs on an update whose global model :func:`gradjax.malicious.inspect` flags.
  The read-outs fill the first slots (at most N, the bins of most weight), labels −1 (not read);
  ``loss`` is NaN (a read-out of ratios minimises no objective; the run reports none), and no update
  is recomputed from the read-outs for the verdict: without labels there is none to recompute."""

  layer: str = "Dense_0"
  tolerance: float = 1e-6
  name: str = "imprint"


# The attacks that are closed forms, by name (``--attack``): built with no arguments.
CLOSED_FORMS = {"exclusive_neurons": ExclusiveNeurons, "cocktail_party": CocktailParty, "rgap": RGap,
                "dager": Dager, "imprint": Imprint}
TEXT_CLOSED_FORMS = ("dager",)  # the others recover images
ClosedForm = ExclusiveNeurons | CocktailParty | RGap | Dager | Imprint


def chain(module) -> tuple[rgap.Layer, ...]:
  """The ReLU chain of a zoo model's Flax ``module`` (its layers below the head), for R-GAP; raises
  ``ValueError`` for a model that is not one."""
  if not (isinstance(module, (LeNetZhu, LeNet5)) or isinstance(module, MLP) and module.hidden):
    raise ValueError(f"R-GAP here knows the zoo's ReLU chains lenet_zhu, lenet5 and mlp-H, not "
                     f"{type(module).__name__ if module is not None else 'this model'} (a chain of "
                     "one's own: gradjax.rgap.rgap with its rgap.Layer list)")
  if getattr(module, "act", None) != "relu":
    raise ValueError(f"R-GAP inverts ReLU chains; the model's activation is "
                     f"{getattr(module, 'act', None)!r} (declare act=relu if the client's is)")
  pad = ((2, 2), (2, 2))
  if isinstance(module, LeNetZhu):
    return tuple(rgap.Layer(f"Conv_{i}", (s, s), pad) for i, s in enumerate((2, 2, 1)))
  if isinstance(module, LeNet5):
    return tuple(rgap.Layer(f"Conv_{i}", (1, 1), pad) for i in range(4))
  if isinstance(module, MLP) and module.hidden:
    return tuple(rgap.Layer(f"Dense_{i}") for i in range(len(module.hidden)))


def reconstruct(attack: ClosedForm, apply_fn: Callable, observation: Observation,
                input_shape, bounds) -> tuple[Reconstruction, dict[str, Any]]:
  """``attack`` on ``observation`` as a :class:`gradjax.attacks.Reconstruction` of all N slots, and
  what the closed form found, JSON-ready (``separation`` or ``recursion``).

  :class:`ExclusiveNeurons`: the recovered examples fill the first slots with their labels; a slot
  with nothing recovered holds the middle of the input box ``bounds`` ((lo, hi), (C,) each: a flat
  gray image) and the label −1 (none). ``loss`` is the separation's residual, ``iterations`` its
  rounds. :class:`RGap`: the one example and its label; ``loss`` is the input layer's residual,
  ``iterations`` the layers inverted. :class:`CocktailParty`: the components unmixed (as many as
  the update's rank, at most N) fill the first slots with their labels (a slot beyond the rank as
  for :class:`ExclusiveNeurons`); ``loss`` is the share of the layer's update they leave
  unexplained, ``iterations`` the refinement round kept.
  """
  if isinstance(attack, RGap):
    return _rgap(attack, apply_fn, observation, input_shape, bounds)
  if isinstance(attack, CocktailParty):
    return _cocktail(attack, apply_fn, observation, input_shape, bounds)
  if isinstance(attack, Imprint):
    return _imprint(attack, observation, input_shape, bounds)
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
  return rec, {"separation": {
      "recovered": k, "rank": sep.rank, "rounds": sep.rounds.tolist(), "residual": sep.residual,
      "singular_values": sep.singular_values.tolist()}}


def _imprint(attack: Imprint, observation, input_shape, bounds):
  sent = observation.variables["params"]
  if attack.layer not in sent or "kernel" not in sent[attack.layer]:
    raise ValueError(f"{attack.name} reads an imprint in the dense layer {attack.layer!r}, which the "
                     "sent model does not have")
  units = malicious.imprint_units(sent[attack.layer]["kernel"], sent[attack.layer]["bias"])
  if not len(units):
    raise ValueError(f"the sent model's layer {attack.layer!r} holds no imprint (fewer than "
                     f"{malicious.MIN_UNITS} units share one direction): the server sent an honest model")
  found = malicious.imprint_recover(observation.gradient, tuple(input_shape), layer=attack.layer,
                                    units=units, tolerance=attack.tolerance)
  n = int(observation.num_samples)
  keep = np.sort(np.argsort(-np.abs(found.weights), kind="stable")[:n])  # at most one per example
  k = len(keep)
  lo, hi = (np.asarray(b, np.float32) for b in bounds)
  x = np.broadcast_to((lo + hi) / 2, (n, *tuple(input_shape))).astype(np.float32).copy()
  x[:k] = found.x[keep]
  # A read-out of ratios has no objective to report (NaN: the run's results say None).
  rec = Reconstruction(x=x, labels=np.full(n, -1, np.int64), loss=math.nan, best_restart=0,
                       restart_losses=np.array([math.nan]), restart_alive=np.array([True]),
                       x_restarts=x[None], iterations=np.array([1]), evaluations=np.array([1]),
                       dummy={"x": jnp.asarray(x)}, permutation=np.arange(n),
                       candidates=np.arange(n)[None])
  return rec, {"imprint": {"layer": attack.layer, "units": int(len(units)),
                           "bins_read": int(len(found.bins)), "kept": k}}


def _cocktail(attack: CocktailParty, apply_fn, observation, input_shape, bounds):
  found = cocktail.separate(observation, apply_fn, input_shape, layer=attack.layer,
                            rank_tol=attack.rank_tol, rounds=attack.rounds,
                            tol=attack.tol, step=attack.step, keep=attack.keep,
                            seed=attack.seed, restarts=attack.restarts,
                            converged=attack.converged, bounds=bounds)
  n, k = int(observation.num_samples), min(found.rank, int(observation.num_samples))
  lo, hi = (np.asarray(b, np.float32) for b in bounds)
  x = np.broadcast_to((lo + hi) / 2, (n, *tuple(input_shape))).astype(found.inputs.dtype).copy()
  x[:k] = found.inputs[:k]
  labels = np.full(n, -1, np.int64)
  labels[:k] = found.labels[:k]
  rec = Reconstruction(x=x, labels=labels, loss=found.residual, best_restart=0,
                       restart_losses=np.array([found.residual]), restart_alive=np.array([True]),
                       x_restarts=x[None], iterations=np.array([found.rounds]),
                       evaluations=np.array([found.rounds]), dummy={"x": jnp.asarray(x)},
                       permutation=np.arange(n), candidates=np.arange(n)[None])
  return rec, {"cocktail": {
      "separated": k, "rank": found.rank, "round": found.rounds, "residual": found.residual,
      "scale": found.scale, "ica_iterations": found.ica_iterations, "seed": found.seed,
      "restarts": found.restarts,
      "mismatch": found.mismatch.tolist()}}


def _rgap(attack: RGap, apply_fn, observation, input_shape, bounds):
  found = rgap.rgap(observation, chain(getattr(apply_fn, "module", None)), input_shape,
                    bounds=bounds, tv=attack.tv)
  x, residual, depth = found.x, found.layers[0]["residual"], len(found.layers)
  rec = Reconstruction(x=x, labels=np.array([found.label]), loss=residual, best_restart=0,
                       restart_losses=np.array([residual]), restart_alive=np.array([True]),
                       x_restarts=x[None], iterations=np.array([depth]),
                       evaluations=np.array([depth]), dummy={"x": jnp.asarray(x)},
                       permutation=np.arange(1), candidates=np.arange(1)[None])
  return rec, {"recursion": found.layers}
