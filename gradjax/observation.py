"""What the attacker holds: the :class:`Observation` of one client round.

An Observation is a pytree: its arrays (observed gradient, the variables the server sent, labels when
the threat model shares them) are leaves, so it passes through ``jit`` and ``vmap``; the threat-model
metadata are static fields.
"""

from collections.abc import Mapping as MappingABC
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


@flax.struct.dataclass
class Observation:
  """The attacker's view of one client update.

  Attributes:
    gradient: the observed gradient (or update), same tree structure and shapes as
      ``variables["params"]``.
    variables: the model variables the server sent (``{"params": ..., [batch_stats]}``).
    labels: int (N,) labels ((N, T) next tokens for a language model), when the threat model shares
      them; otherwise ``None``.
    num_samples: N, the number of examples behind the update (static).
    threat_model: name of the client simulation that produced it (static), e.g. ``"fedsgd"``.
    train: whether the client ran the model in training mode (BatchNorm batch statistics) (static).
    local: the client's local-training hyperparameters when the threat model reveals them
      (:class:`gradjax.clients.LocalTraining`, static), else ``None``. For FedAvg observations
      ``gradient`` holds the update W_t − W_{t+1}.
    moments: when the client returned its BatchNorm running statistics after one training-mode step,
      the batch's moments they reveal: a tree like ``variables["batch_stats"]`` of ``{"mean": μ,
      "var": σ²}`` per layer, σ² biased (:func:`gradjax.clients.batch_moments`); otherwise ``None``.
    clients: for an aggregate of K clients' updates (:func:`gradjax.clients.aggregate`), their sizes
      (n_1, ..., n_K) (static; Σ n_k = ``num_samples``), in the order of ``labels``: the server's
      mean weighs client k by n_k / N, and a replay of local training replays each client on its
      own n_k examples; ``None``: one client's update.
  """

  gradient: PyTree
  variables: PyTree
  labels: jax.Array | None = None
  num_samples: int = flax.struct.field(pytree_node=False, default=1)
  threat_model: str = flax.struct.field(pytree_node=False, default="fedsgd")
  train: bool = flax.struct.field(pytree_node=False, default=False)
  local: Any = flax.struct.field(pytree_node=False, default=None)
  moments: PyTree | None = None
  clients: tuple[int, ...] | None = flax.struct.field(pytree_node=False, default=None)

  @property
  def couples_examples(self) -> bool:
    """Whether one example's input reaches another's gradient: a client in training mode whose
    model has BatchNorm (batch statistics, ``variables["batch_stats"]``). Training mode without
    it changes nothing that gradjax's models compute."""
    return couples_examples(self.train, self.variables)


def couples_examples(train: bool, variables) -> bool:
  """Whether a client in mode ``train`` of a model with ``variables`` couples its examples'
  gradients: training mode with BatchNorm's batch statistics (``variables["batch_stats"]``)."""
  return bool(train) and "batch_stats" in variables


def _paths(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def check_labels(labels, shape: tuple[int, ...], num_classes: int, what: str = "labels", *,
                 absent: bool = False) -> np.ndarray:
  """``labels`` as a NumPy array, or a one-line ``ValueError`` unless they are int ``shape`` ((N,)
  for a classifier; (N, T) for a language model, whose negative targets mark positions without
  one, :func:`gradjax.losses.cross_entropy`) in [0, ``num_classes``). ``absent``: a negative label
  marks an example without one for a classifier too (a closed form's example it did not recover),
  and every label may be."""
  y = np.asarray(labels)
  if y.shape != tuple(shape) or not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"{what} must be int {tuple(shape)}, got {y.dtype} {y.shape}")
  kept = y[y >= 0] if absent or len(shape) > 1 else y
  if kept.size == 0:
    if absent:
      return y
    raise ValueError(f"every one of the {what} is negative (no target): the loss has no term")
  low, high = int(np.min(kept)), int(np.max(kept))
  if low < 0 or high >= num_classes:
    raise ValueError(f"{what} must lie in [0, {num_classes}) (the model's classes), got [{low}, {high}]")
  return y


def plain_dicts(tree):
  """``tree`` with every mapping (a Flax ``FrozenDict`` among them) rebuilt as a plain dict, the
  containers of the variables an Observation holds; arrays are kept, not copied, and a tree of
  plain dicts is returned itself."""
  if not isinstance(tree, MappingABC):
    return tree
  plain = {k: plain_dicts(v) for k, v in tree.items()}
  if type(tree) is dict and all(plain[k] is v for k, v in tree.items()):
    return tree
  return plain


def check_observation(observation: Observation) -> None:
  """Raises ``ValueError`` (one line) unless the observation is usable by an attack.

  Checks that the gradient tree matches ``variables["params"]`` leaf for leaf (paths and shapes), that
  every observed value is finite, and that the labels (if any) are integers with num_samples rows.
  """
  if not isinstance(observation, Observation):
    raise ValueError(f"an attack reads an Observation (a client's, gradjax.clients.fedsgd; or "
                     f"gradjax.interop.load's), got {type(observation).__name__}")
  if not isinstance(observation.variables, dict) or "params" not in observation.variables:
    frozen = (" (a Flax FrozenDict: pass gradjax.observation.plain_dicts(variables))"
              if isinstance(observation.variables, MappingABC) else "")
    raise ValueError(f"observation.variables must be a dict with a 'params' entry, got "
                     f"{type(observation.variables).__name__}{frozen}")
  params = observation.variables["params"]
  got, want = _paths(observation.gradient), _paths(params)
  if got != want:
    missing = sorted(set(want) - set(got))[:3]
    extra = sorted(set(got) - set(want))[:3]
    raise ValueError(f"gradient tree does not match the model parameters (missing {missing}, "
                     f"unexpected {extra})")
  for path, g, p in zip(want, jax.tree.leaves(observation.gradient), jax.tree.leaves(params)):
    if jnp.shape(g) != jnp.shape(p):
      raise ValueError(f"gradient{path} has shape {jnp.shape(g)}, parameter has {jnp.shape(p)}")
    if not jnp.issubdtype(jnp.result_type(g), jnp.inexact):
      raise ValueError(f"gradient{path} must be floating point, got {jnp.result_type(g)}")
    if not np.all(np.isfinite(np.asarray(g))):
      raise ValueError(f"observed gradient{path} contains NaN or inf")
  for path, p in zip(want, jax.tree.leaves(params)):
    if not np.all(np.isfinite(np.asarray(p))):
      raise ValueError(f"the sent model's parameter{path} contains NaN or inf")
  if observation.num_samples < 1:
    raise ValueError(f"num_samples must be positive, got {observation.num_samples}")
  sizes = observation.clients
  if sizes is not None and not (
      isinstance(sizes, tuple) and sizes and all(isinstance(n, int) and n >= 1 for n in sizes)
      and sum(sizes) == observation.num_samples):
    raise ValueError(f"observation.clients must be a tuple of the aggregated clients' positive "
                     f"sizes summing to num_samples {observation.num_samples}, got {sizes!r}")
  if observation.labels is not None:
    labels = np.asarray(observation.labels)
    if (labels.ndim < 1 or labels.shape[0] != observation.num_samples
        or not np.issubdtype(labels.dtype, np.integer)):
      raise ValueError(f"labels must be int ({observation.num_samples},) (or (N, T) for text), got "
                       f"{labels.dtype} {labels.shape}")
  if observation.moments is not None:
    stats = observation.variables.get("batch_stats")
    if stats is None or _paths(observation.moments) != _paths(stats):
      raise ValueError("observation.moments must hold a mean and a variance for every BatchNorm layer "
                       "of variables['batch_stats']")
    for path, m in zip(_paths(stats), jax.tree.leaves(observation.moments)):
      m = np.asarray(m)
      if not np.all(np.isfinite(m)):
        raise ValueError(f"the client's batch moments{path} contain NaN or inf")
      if path.endswith("['var']") and np.min(m) < -1e-3 * max(1.0, float(np.max(np.abs(m)))):
        raise ValueError(f"the client's batch variances{path} are negative: the returned statistics do "
                         "not come from one step at the declared BatchNorm momentum")
