"""Optimizers of dummy data: optax transformations, and the named ones of the presets and flags.

An attack's optimizer is any ``optax.GradientTransformation`` (``optax.adam(0.1)``, a chain of
one's own). The solver reads what it needs from the transformation's state: a zoom line search
(:func:`gradjax.linesearch.scale_by_zoom_linesearch`, or optax's own) stores the objective's value and
gradient at the iterate, which the next step reuses (:func:`stores_value`).

The optimizers of the papers are built here by function (:func:`lbfgs`, :func:`signed_adam`, ...), and
by name through :func:`make_optimizer`. A :class:`Named` optimizer is a name and its numbers, built
once the attack's iteration budget is known: its learning-rate schedule's steps are fractions of that
budget, so a preset keeps its schedule when the budget changes, and a flag can change one number of a
preset's optimizer (``--config.attack.learning_rate=0.5``) without restating the others.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradjax import lbfgs as lbfgs_lib
from gradjax import linesearch

OPTIMIZERS = ("lbfgs", "lbfgs_fixed", "adam", "adamw", "signed_adam", "quantized_adam", "sgd")
SCHEDULES = ("constant", "step", "step_hfginv", "cosine")

# torch.optim.LBFGS stores a curvature pair only when y · s exceeds this.
PYTORCH_MIN_CURVATURE = 1e-10


class QuantizedSignState(NamedTuple):
  count: jax.Array


def scale_by_quantized_sign(boost_steps: int = 101, boost: float = 2.0) -> optax.GradientTransformation:
  """HFGInv's quantised sign of the gradient, per leaf g::

    s = 2 / (median|g| + 1e-10),   q = 0.8 · clip(round(s g) / 2, −1, 1) + 0.2 · sign(g)

  so every entry becomes one of ±0.2, ±0.6, ±1 (0 where g is 0): a sign that keeps three magnitude
  levels around the median. The first ``boost_steps`` updates are multiplied by ``boost`` (their code:
  ×2 while the iteration is ≤ 100). Reference: Ye et al., AAAI 2024, and their code (``hard_quantify``).
  """

  def init(params):
    del params
    return QuantizedSignState(jnp.zeros((), jnp.int32))

  def update(updates, state, params=None):
    del params
    factor = jnp.where(state.count < boost_steps, boost, 1.0)

    def quantize(g):
      s = 2.0 / (jnp.median(jnp.abs(g)) + 1e-10)
      q = 0.8 * jnp.clip(jnp.round(s * g) / 2, -1.0, 1.0) + 0.2 * jnp.sign(g)
      return (factor * q).astype(g.dtype)

    return jax.tree.map(quantize, updates), QuantizedSignState(state.count + 1)

  return optax.GradientTransformation(init, update)


def _budget(schedule: str, iterations: int, warmup: int) -> tuple[tuple[int, ...], float, int]:
  """(boundaries, scale, length) of ``schedule`` at ``iterations``: the steps after the warmup at
  which a step schedule multiplies by ``scale``, and the steps after the warmup (a cosine schedule
  decays over them)."""
  length = max(iterations - warmup, 1)
  if schedule == "step":  # Inverting Gradients: ×0.1 at 3/8, 5/8 and 7/8 of the budget
    return tuple(int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)), 0.1, length
  if schedule == "step_hfginv":  # HFGInv's code: 5624, 9374 and 13 134 of 15 000
    return tuple(int(iterations // d) for d in (2.667, 1.6, 1.142)), 0.33, length
  return (), 1.0, length


# No zero-size leaves (the driver reshapes state leaves): one unreachable step stands for none.
_NO_BOUNDARY = (int(np.iinfo(np.int32).max),)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["count", "boundaries", "length"],
                   meta_fields=["schedule", "warmup"])
@dataclasses.dataclass(frozen=True)
class ScheduleState:
  """The step and the schedule's budget-dependent numbers, as data: one compiled step serves every
  budget (a program with them as constants compiles again whenever ``--iterations`` changes). The
  schedule's name and warmup are the state's structure (:func:`at_budget` reads them)."""
  count: jax.Array       # int32: updates so far
  boundaries: jax.Array  # int32 (k,): where a step schedule scales the rate (after the warmup)
  length: jax.Array      # int32: steps after the warmup, over which a cosine schedule decays
  schedule: str          # of SCHEDULES
  warmup: int


def budget(iterations: int) -> dict[str, np.ndarray]:
  """Every schedule's budget-dependent numbers at ``iterations``, as host arrays: ``"iterations"``
  (int32) and each step schedule's boundaries (int32 (3,)). A program that takes them as an argument
  and sets them with :func:`at_budget` is the same program at every budget."""
  numbers = {"iterations": np.asarray(iterations, np.int32)}
  for schedule in SCHEDULES:
    boundaries = _budget(schedule, iterations, 0)[0]  # after the warmup, so not depending on it
    if boundaries:
      numbers[schedule] = np.asarray(boundaries, np.int32)
  return numbers


def at_budget(opt_state, numbers: dict[str, jax.Array]):
  """``opt_state`` with every :func:`learning_rate_schedule` state spread over the budget whose
  :func:`budget` is ``numbers``: its boundaries and length as :func:`learning_rate_schedule`'s
  ``init`` at that many iterations sets them, the rest unchanged. The solver driver calls it in the
  program that makes a run's first state, with ``numbers`` an argument, so that the constants
  ``init`` wrote are dead code and the program's text does not depend on the budget."""

  def spread(s):
    if not isinstance(s, ScheduleState):
      return s
    boundaries = numbers[s.schedule] if s.schedule in numbers else s.boundaries
    length = jnp.maximum(numbers["iterations"] - s.warmup, 1).astype(jnp.int32)
    return dataclasses.replace(s, boundaries=jnp.asarray(boundaries, jnp.int32), length=length)

  return jax.tree.map(spread, opt_state, is_leaf=lambda s: isinstance(s, ScheduleState))


def learning_rate_schedule(learning_rate: float, schedule: str = "constant", *, iterations: int = 1,
                           warmup: int = 0) -> optax.GradientTransformation:
  """Scales updates by −(the learning rate at the current step): the last link of an optimizer's
  chain, as ``optax.scale_by_learning_rate`` with a schedule, its budget held in its state.

  * ``"constant"``.
  * ``"step"``: ×0.1 at 3/8, 5/8 and 7/8 of ``iterations`` (Inverting Gradients, Geiping et al. 2020).
  * ``"step_hfginv"``: ×0.33 at ⌊iterations / 2.667⌋, ⌊iterations / 1.6⌋ and ⌊iterations / 1.142⌋
    in floating point (HFGInv's code: 5624, 9374 and 13 134 of 15 000; 15 000 / 1.6 rounds below
    9375).
  * ``"cosine"``: cosine decay from ``learning_rate`` to 0 over ``iterations`` − ``warmup``.

  ``warmup`` > 0 prepends a linear ramp from 0 over that many steps; the main schedule then starts
  (its steps counted from the ramp's end), as ``optax.join_schedules`` joins them.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
  if warmup < 0:
    raise ValueError(f"warmup must be non-negative, got {warmup}")
  boundaries, scale, length = _budget(schedule, iterations, warmup)

  def rate(state: ScheduleState) -> jax.Array:
    after = state.count - warmup
    if schedule == "cosine":
      t = jnp.minimum(after, state.length) / state.length
      main = learning_rate * 0.5 * (1 + jnp.cos(jnp.pi * t))
    elif boundaries:
      main = learning_rate * jnp.prod(jnp.where(after >= state.boundaries, scale, 1.0))
    else:  # constant: a Python number, so the update keeps the gradient's precision (optax's way)
      main = learning_rate
    if warmup == 0:
      return main
    return jnp.where(state.count < warmup, learning_rate * state.count / warmup, main)

  def init(params):
    del params
    return ScheduleState(jnp.zeros((), jnp.int32), jnp.asarray(boundaries or _NO_BOUNDARY, jnp.int32),
                         jnp.asarray(length, jnp.int32), schedule, warmup)

  def update(updates, state, params=None):
    del params
    step = -rate(state)
    updates = jax.tree.map(lambda g: (step * g).astype(g.dtype), updates)
    return updates, dataclasses.replace(state, count=optax.safe_int32_increment(state.count))

  return optax.GradientTransformation(init, update)


def lbfgs(learning_rate: float = 1.0, *, history: int = 100,
          max_linesearch_steps: int = 20) -> optax.GradientTransformationExtraArgs:
  """L-BFGS (:mod:`gradjax.lbfgs`) with the zoom line search of :mod:`gradjax.linesearch` (optax's,
  with one objective evaluation per trial); ``learning_rate`` scales the direction before the line
  search picks the step. DLG: lr 1, history 100 (Zhu et al. 2019, their code)."""
  if history < 1 or max_linesearch_steps < 1:
    raise ValueError("L-BFGS needs history >= 1 and max_linesearch_steps >= 1")
  search = linesearch.scale_by_zoom_linesearch(max_linesearch_steps, initial_guess_strategy="one")
  # optax.chain's, carrying its parts: a solver can then run the search one trial at a time.
  return linesearch.chained(lbfgs_lib.links(learning_rate, memory_size=history), search)


def lbfgs_fixed(learning_rate: float = 1.0, *, history: int = 100) -> optax.GradientTransformationExtraArgs:
  """L-BFGS steps of fixed size ``learning_rate`` without a line search, as PyTorch's
  ``torch.optim.LBFGS`` runs by default (the DLG code); it can diverge where :func:`lbfgs`
  backtracks. As PyTorch, a pair (s, y) enters the memory only if s · y > 1e-10. optax scales the
  first direction by min(1, 1/‖g‖) (PyTorch: by min(1, 1/‖g‖₁))."""
  if history < 1:
    raise ValueError("fixed-step L-BFGS needs history >= 1")
  return optax.with_extra_args_support(lbfgs_lib.lbfgs(
      learning_rate, memory_size=history, linesearch=None, min_curvature=PYTORCH_MIN_CURVATURE))


def _rate(learning_rate) -> optax.GradientTransformation:
  """The learning-rate link of a chain: a number, an optax schedule, or :func:`learning_rate_schedule`'s."""
  if isinstance(learning_rate, optax.GradientTransformation):
    return learning_rate
  return optax.scale_by_learning_rate(learning_rate)


def signed_adam(learning_rate) -> optax.GradientTransformation:
  """Adam applied to sign(∇) (Inverting Gradients, Geiping et al. 2020); ``learning_rate`` a number,
  an optax schedule or :func:`learning_rate_schedule`'s transformation."""
  return optax.chain(optax.scale_by_sign(), optax.scale_by_adam(), _rate(learning_rate))


def quantized_adam(learning_rate) -> optax.GradientTransformation:
  """Adam applied to HFGInv's quantised sign (:func:`scale_by_quantized_sign`; Ye et al. 2024)."""
  return optax.chain(scale_by_quantized_sign(), optax.scale_by_adam(), _rate(learning_rate))


def make_optimizer(name: str, learning_rate: float, *, history: int = 100,
                   max_linesearch_steps: int = 20, schedule: str = "constant", iterations: int = 1,
                   warmup: int = 0, weight_decay: float = 0.01) -> optax.GradientTransformationExtraArgs:
  """The optimizer ``name`` of :data:`OPTIMIZERS`, built.

  * ``"lbfgs"`` (:func:`lbfgs`), ``"lbfgs_fixed"`` (:func:`lbfgs_fixed`): no schedule.
  * ``"adam"``, ``"sgd"``, ``"signed_adam"`` (:func:`signed_adam`), ``"quantized_adam"``
    (:func:`quantized_adam`): with the learning-rate ``schedule`` over ``iterations``
    (:func:`learning_rate_schedule`).
  * ``"adamw"``: Adam with decoupled weight decay ``weight_decay`` (0.01 is PyTorch's default; SAPAG
    attacks ResNet-18 with AdamW lr 1e-3).
  """
  if not learning_rate > 0:
    raise ValueError(f"learning rate must be positive, got {learning_rate}")
  if name in ("lbfgs", "lbfgs_fixed"):
    if schedule != "constant" or warmup:
      raise ValueError("L-BFGS takes no learning-rate schedule (its line search sets the step)")
    if name == "lbfgs":
      return lbfgs(learning_rate, history=history, max_linesearch_steps=max_linesearch_steps)
    return lbfgs_fixed(learning_rate, history=history)
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
  # optax's adam, adamw and sgd, with the rate's link holding the budget as data.
  lr = learning_rate_schedule(learning_rate, schedule, iterations=iterations, warmup=warmup)
  tx = {"adam": lambda: optax.chain(optax.scale_by_adam(), lr),
        "adamw": lambda: optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(weight_decay), lr),
        "signed_adam": lambda: signed_adam(lr), "quantized_adam": lambda: quantized_adam(lr),
        "sgd": lambda: lr}[name]()
  return optax.with_extra_args_support(tx)


@dataclasses.dataclass(frozen=True)
class Named:
  """An optimizer of :data:`OPTIMIZERS` by name and numbers, built at an attack's iteration budget
  (:meth:`build`). The presets' optimizers are these; the fields mean what
  :func:`make_optimizer`'s arguments do."""

  name: str = "lbfgs"
  learning_rate: float = 1.0
  schedule: str = "constant"
  warmup: int = 0
  weight_decay: float = 0.01
  history: int = 100
  max_linesearch_steps: int = 20

  def __post_init__(self):
    self.build(1)  # checks the name and the numbers

  def build(self, iterations: int) -> optax.GradientTransformationExtraArgs:
    """The transformation, its schedule spread over ``iterations``."""
    return make_optimizer(self.name, self.learning_rate, history=self.history,
                          max_linesearch_steps=self.max_linesearch_steps, schedule=self.schedule,
                          iterations=iterations, warmup=self.warmup, weight_decay=self.weight_decay)

  @property
  def couples_variables(self) -> bool:
    """Whether one update direction mixes every variable (L-BFGS), so no variable can have an
    optimizer of its own."""
    return self.name.startswith("lbfgs")


Optimizer = optax.GradientTransformation | Named


def build(optimizer: Optimizer, iterations: int) -> optax.GradientTransformationExtraArgs:
  """``optimizer`` as a transformation that takes the solver's extra arguments (value, grad,
  value_fn): a :class:`Named` one built at ``iterations``, an optax one as it is."""
  if isinstance(optimizer, Named):
    return optimizer.build(iterations)
  if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
    raise ValueError(f"an optimizer is an optax GradientTransformation or optimizers.Named, got "
                     f"{optimizer!r}")
  return optax.with_extra_args_support(optimizer)


def stores_value(opt_state) -> bool:
  """Whether an optimizer state holds a zoom line search's value and gradient at the iterate
  (``optax.ScaleByZoomLinesearchState``): the solver then evaluates the objective once per trial
  and reuses the search's last one. Read at trace time from the state's structure."""
  found = jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByZoomLinesearchState))
  return any(isinstance(s, optax.ScaleByZoomLinesearchState) for s in found)
