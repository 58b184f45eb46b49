"""Named attacks: presets that compose objective, label strategy, optimizer and initialisation.

An :class:`Attack` is a frozen record of choices (hashable, so compiled programs are cached per attack
and reused across images). :func:`reconstruct` runs it against an Observation.

Presets and where their defaults come from:

* ``dlg`` (Zhu et al., NeurIPS 2019; mit-han-lab/dlg): distance Σ‖g' − g‖² (no 0.5), dummy data and
  dummy label logits ~ N(0, 1) optimised jointly with soft labels softmax(z'), L-BFGS lr 1 with
  history 100. Budget: the paper runs 300 PyTorch ``LBFGS.step()`` calls of up to 20 inner iterations
  (up to 6000 objective evaluations). Here one iteration is one L-BFGS update with a zoom line search
  (about 1.05 evaluations on average for this objective), and the default is 2000 iterations, a third
  of the original evaluation budget: on CIFAR-10 test images 0-19 it gives PSNR >= 30 dB on 15 of 20
  (README, "Measured"). See :mod:`gradjax.solvers` on counting.
* ``idlg`` (Zhao et al., 2020): as ``dlg`` but the label is inferred first from the last layer's
  gradient (:func:`gradjax.labels.idlg`, batch 1) and only the data is optimised.
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import labels as labels_lib
from gradjax import solvers
from gradjax.distances import get_distance
from gradjax.objectives import gradient_matching
from gradjax.observation import Observation, check_observation

LABEL_STRATEGIES = ("joint", "idlg", "known")
DUMMY_INITS = ("normal", "uniform")


@dataclasses.dataclass(frozen=True)
class Attack:
  """A gradient-matching attack.

  Attributes:
    name: preset name.
    distance: a name in :data:`gradjax.distances.DISTANCES`.
    labels: ``"joint"`` (optimise soft labels with the data, DLG), ``"idlg"`` (infer, batch 1) or
      ``"known"`` (use ``observation.labels``).
    optimizer: ``"lbfgs"``, ``"adam"`` or ``"sgd"``.
    learning_rate: optimizer learning rate.
    iterations: optimizer iterations per restart.
    history: L-BFGS memory.
    max_linesearch_steps: zoom line-search evaluations per L-BFGS iteration at most.
    init: dummy-data initialisation, ``"normal"`` N(0, 1) or ``"uniform"`` U(0, 1).
    tol: a restart stops once its objective is <= tol.
  """

  name: str = "custom"
  distance: str = "euclidean"
  labels: str = "joint"
  optimizer: str = "lbfgs"
  learning_rate: float = 1.0
  iterations: int = 300
  history: int = 100
  max_linesearch_steps: int = 20
  init: str = "normal"
  tol: float = 0.0

  def __post_init__(self):
    get_distance(self.distance)
    if self.labels not in LABEL_STRATEGIES:
      raise ValueError(f"unknown label strategy {self.labels!r}; choose one of "
                       f"{', '.join(LABEL_STRATEGIES)}")
    if self.init not in DUMMY_INITS:
      raise ValueError(f"unknown dummy init {self.init!r}; choose one of {', '.join(DUMMY_INITS)}")
    if self.iterations < 1:
      raise ValueError(f"iterations must be positive, got {self.iterations}")
    if self.tol < 0:
      raise ValueError(f"tol must be non-negative, got {self.tol}")
    solvers.make_optimizer(self.optimizer, self.learning_rate, history=self.history,
                           max_linesearch_steps=self.max_linesearch_steps)


PRESETS: dict[str, Attack] = {
    "dlg": Attack(name="dlg", iterations=2000),
    "idlg": Attack(name="idlg", labels="idlg", iterations=2000),
}


def get_attack(name: str, **overrides) -> Attack:
  """Preset ``name`` with fields replaced by ``overrides`` (``None`` values are ignored)."""
  if name not in PRESETS:
    raise ValueError(f"unknown attack {name!r}; choose one of {', '.join(PRESETS)}")
  return dataclasses.replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


class Reconstruction(NamedTuple):
  """Result of :func:`reconstruct`.

  Attributes:
    x: (N, H, W, C) the best restart's reconstruction (the iterate with the lowest objective).
    labels: (N,) int labels: argmax of the dummy soft labels (joint) or the inferred / known ones.
    loss: the best restart's objective value.
    best_restart: its index.
    restart_losses: (R,) best objective of every restart (inf for a restart that never had a finite one).
    restart_alive: (R,) False for restarts that diverged (NaN/inf) and were frozen.
    x_restarts: (R, N, H, W, C) every restart's best iterate.
    iterations: (R,) optimizer iterations each restart ran.
    evaluations: (R,) objective evaluations (value and gradient) each restart used.
  """

  x: np.ndarray
  labels: np.ndarray
  loss: float
  best_restart: int
  restart_losses: np.ndarray
  restart_alive: np.ndarray
  x_restarts: np.ndarray
  iterations: np.ndarray
  evaluations: np.ndarray


def _solver(attack: Attack, apply_fn: Callable) -> solvers.Solver:
  """The solver of ``attack``; fields that only set the budget (iterations, init) do not recompile."""
  return _solver_cached(apply_fn, attack.distance, attack.optimizer, attack.learning_rate,
                        attack.history, attack.max_linesearch_steps, attack.tol)


@functools.lru_cache(maxsize=32)
def _solver_cached(apply_fn, distance, optimizer, learning_rate, history, max_linesearch_steps, tol):
  objective = gradient_matching(apply_fn, get_distance(distance))

  def value_fn(dummy, data):
    observation, labels = data
    return objective(dummy, observation, labels)

  optimizer = solvers.make_optimizer(optimizer, learning_rate, history=history,
                                     max_linesearch_steps=max_linesearch_steps)
  return solvers.make_solver(value_fn, optimizer, tol=tol)


def init_dummy(key: jax.Array, attack: Attack, shape: tuple[int, ...], num_classes: int,
               dtype=jnp.float32, joint_labels: bool = True) -> dict:
  """Initial dummy data ``{"x": shape, ["label_logits": (N, K)]}`` ~ the attack's ``init``."""
  kx, ky = jax.random.split(key)
  if attack.init == "normal":
    x = jax.random.normal(kx, shape, dtype)
  else:
    x = jax.random.uniform(kx, shape, dtype)
  dummy = {"x": x}
  if joint_labels:
    dummy["label_logits"] = jax.random.normal(ky, (shape[0], num_classes), dtype)
  return dummy


def reconstruct(attack: Attack, apply_fn: Callable, observation: Observation, key: jax.Array, *,
                input_shape: tuple[int, int, int], restarts: int = 1, strategy: str = "auto",
                chunk: int = 50, map_batch_size: int | None = None, unroll: int = 1,
                callback: Callable[[solvers.Progress], None] | None = None) -> Reconstruction:
  """Reconstructs the client's data behind ``observation``.

  Args:
    attack: e.g. ``get_attack("dlg")``.
    apply_fn: the model, ``apply_fn(variables, x, train) -> logits``.
    observation: what the attacker observed (see :mod:`gradjax.clients`).
    key: PRNG key; restart r starts from ``jax.random.split(key, restarts)[r]``.
    input_shape: (H, W, C) of one example, in the model's input space.
    restarts: independent random initialisations; the one with the lowest objective is returned.
    strategy, chunk, map_batch_size, unroll, callback: see :func:`gradjax.solvers.run`.
  """
  check_observation(observation)
  if restarts < 1:
    raise ValueError(f"restarts must be positive, got {restarts}")
  if len(input_shape) != 3:
    raise ValueError(f"input_shape must be (H, W, C), got {input_shape}")
  n = observation.num_samples
  params = observation.variables["params"]
  dtype = jnp.result_type(*jax.tree.leaves(params))
  logits = jax.eval_shape(lambda: apply_fn(observation.variables, jnp.zeros((1, *input_shape), dtype),
                                           observation.train))
  num_classes = logits.shape[-1]
  if attack.labels == "idlg":
    known = labels_lib.idlg(observation)
  elif attack.labels == "known":
    if observation.labels is None:
      raise ValueError("attack uses known labels but the observation carries none")
    known = jnp.asarray(observation.labels)
  else:
    known = None
  keys = jax.random.split(key, restarts)
  init = jax.vmap(lambda k: init_dummy(k, attack, (n, *input_shape), num_classes, dtype,
                                       joint_labels=known is None))(keys)
  state = solvers.run(_solver(attack, apply_fn), init, (observation, known),
                      iterations=attack.iterations, chunk=chunk, strategy=strategy,
                      map_batch_size=map_batch_size, unroll=unroll, tol=attack.tol,
                      callback=callback)
  state = jax.device_get(state)
  losses = np.where(np.isfinite(state.best_loss), state.best_loss, np.inf)
  if not np.isfinite(losses).any():
    raise FloatingPointError("every restart diverged before its first finite objective value")
  best = int(np.argmin(losses))
  x_restarts = np.asarray(state.best_params["x"])
  if known is None:
    labels = np.argmax(np.asarray(state.best_params["label_logits"][best]), axis=-1)
  else:
    labels = np.asarray(known)
  return Reconstruction(x=x_restarts[best], labels=labels, loss=float(losses[best]),
                        best_restart=best, restart_losses=losses,
                        restart_alive=np.asarray(state.alive), x_restarts=x_restarts,
                        iterations=np.asarray(state.iterations),
                        evaluations=np.asarray(state.evaluations))
