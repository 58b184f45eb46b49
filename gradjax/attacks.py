"""Gradient-matching attacks composed of built parts, and the restart search that runs them.

An :class:`Attack` holds objects, as an optax chain does: a distance (any function
``(dummy_grads, observed_grads) -> scalar``, or a :class:`gradjax.distances.Distance` that says how it
weighs layers and when it settles), image priors (:class:`gradjax.priors.Prior`, each built with its
weight and start), an optimizer (any optax ``GradientTransformation``, or a
:class:`gradjax.optimizers.Named` one built at the attack's budget), a label source (a function of
the observation, :mod:`gradjax.labels`) and a dummy initialisation (:mod:`gradjax.dummy`). The attack
is frozen and hashable, so its compiled programs are cached per attack and reused across images.
:mod:`gradjax.presets` builds the papers' attacks; names are resolved only at the configuration
boundary (``gradjax.run.pipeline``).

:func:`reconstruct` runs an attack against an Observation in three parts, each public: :func:`prepare`
(labels, label-order candidates, layer weights and order, every restart's start), :func:`solve` (the
restart driver, :func:`gradjax.driver.run`, on the attack's solver), and :func:`select` (the best
restart, its labels and candidate). The text attack (:mod:`gradjax.text`) reuses them.

Example::

  import optax
  def euclidean(dummy, observed):
    return sum(jnp.sum((d - o) ** 2) for d, o in zip(jax.tree.leaves(dummy), jax.tree.leaves(observed)))
  attack = attacks.Attack(distance=euclidean, optimizer=optax.adam(0.1), iterations=500)
  rec = attacks.reconstruct(attack, apply_fn, observation, jax.random.key(0), input_shape=(32, 32, 3))
"""

import dataclasses
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradjax import analytic, distances, models, objectives
from gradjax import dummy as dummy_lib
from gradjax import labels as labels_lib
from gradjax import optimizers
from gradjax import permutations as permutations_lib
from gradjax import priors as priors_lib
from gradjax import compilation, driver, sharding, solvers
from gradjax.compilation import device_array, once
from gradjax.losses import cross_entropy
from gradjax.objectives import Smoothing, Stepwise, gradient_matching
from gradjax.observation import Observation, check_labels, check_observation


@dataclasses.dataclass(frozen=True)
class Attack:
  """A gradient-matching attack, built from objects.

  Attributes:
    distance: ``distance(dummy_grads, observed_grads) -> scalar``, any function (taken as
      ``distances.Distance(fn)``: unweighted, step-free), or a :class:`gradjax.distances.Distance`
      (:data:`gradjax.distances.DISTANCES` holds the built-in ones).
    optimizer: any optax ``GradientTransformation`` (e.g. ``optax.adam(0.1)``,
      :func:`gradjax.optimizers.lbfgs`), or a :class:`gradjax.optimizers.Named` one, whose schedule
      is spread over ``iterations``.
    iterations: optimizer iterations per restart.
    priors: :class:`gradjax.priors.Prior` terms added to the objective.
    label_source: where the labels come from, ``label_source(observation) -> (N,) int labels``, or
      :func:`gradjax.labels.joint` (labels optimised with the data, DLG); see
      :data:`gradjax.labels.SOURCES`.
    dummy_init: ``init(key, shape, lo, hi, dtype) -> x``, where the dummy data start
      (:data:`gradjax.dummy.INITS`).
    matched: what the objective matches (:func:`gradjax.objectives.gradient_matching`): the
      gradient (``objectives.Gradient()``, FedSGD), the replayed local training
      (``objectives.Replay(remat)``, FedAvg), DLM's scaled model difference
      (``objectives.ScaledDifference(gamma)``) or DLM+'s unit vectors (``objectives.Normalised()``);
      :data:`gradjax.objectives.MATCHED` by name.
    depth_rule: ``None`` (the distance's own, ``distance.depth_rule``) or a depth rule of
      :func:`gradjax.distances.depth_weights` (``"inverse"``, ``"linear"``, ``"exp"``, ``"uniform"``).
    box: clamp the dummy data to the valid input range after every step.
    one_sample_per_step: DLG's batch option, only example t mod N moves at step t.
    tol: a restart stops once its objective is <= tol.
    stepwise: HFGInv's growing set of matched layers with gradient dropout
      (:class:`gradjax.objectives.Stepwise`), or ``None`` to match every layer.
    track_from: the reconstruction is the lowest-objective iterate from this iteration on (0: the
      whole run), or from where the objective's parts settle, if later (:func:`track_from`: the
      stepwise layer set, an annealed distance, a smoothing).
    head_features: the weight of the pull of each example's head input towards the one the head's
      gradient gives for it (:func:`head_targets`: solved per example up to K − 1 examples, classes
      repeated or not, where the float32 update pins it down; else its class's row where that class
      has one example that dominates its column), 0 for none; needs known or inferred labels and
      the gradient matched (``objectives.Gradient()``).
    smoothing: the dummy gradient taken of the model with its ReLUs and max pools rounded, sharper
      every step until the model itself (:class:`gradjax.objectives.Smoothing`), or ``None``; needs
      a model that can be rounded (:func:`gradjax.models.smoothable`) and a gradient matched, not
      the replayed training. The best iterate is tracked from ``smoothing.until`` on.
    name: what reports call the attack (a preset's name, or ``"custom"``).
  """

  distance: Callable = distances.DISTANCES["euclidean"]
  optimizer: optimizers.Optimizer = optimizers.Named()
  iterations: int = 300
  priors: tuple[priors_lib.Prior, ...] = ()
  label_source: labels_lib.LabelSource = labels_lib.joint
  dummy_init: dummy_lib.DummyInit = dummy_lib.normal
  matched: objectives.Matched = objectives.Gradient()
  depth_rule: str | None = None
  box: bool = False
  one_sample_per_step: bool = False
  tol: float = 0.0
  stepwise: Stepwise | None = None
  track_from: int = 0
  head_features: float = 0.0
  smoothing: Smoothing | None = None
  name: str = "custom"

  def __post_init__(self):
    object.__setattr__(self, "distance", distances.as_distance(self.distance))
    if isinstance(self.priors, priors_lib.Prior):
      raise ValueError("priors is a tuple of priors.Prior records: write priors=(prior,)")
    object.__setattr__(self, "priors", tuple(self.priors))
    if not isinstance(self.matched, (objectives.Gradient, objectives.Replay)):
      raise ValueError(f"matched must be an objectives part ({', '.join(objectives.MATCHED)}), got "
                       f"{self.matched!r}")
    if self.depth_rule is not None and self.depth_rule not in distances.DEPTH_RULES:
      raise ValueError(f"unknown depth rule {self.depth_rule!r}; choose one of "
                       f"{', '.join(distances.DEPTH_RULES)}")
    if self.depth_rule is not None:
      self.distance.check_weighted(self.depth_rule)
    bad = [p for p in self.priors if not isinstance(p, priors_lib.Prior)]
    if bad:
      raise ValueError(f"priors are priors.Prior records (function, weight, start), got {bad[0]!r}")
    for name in ("label_source", "dummy_init"):
      if not callable(getattr(self, name)):
        raise ValueError(f"{name} must be a function, got {getattr(self, name)!r}")
    if not isinstance(self.iterations, (int, np.integer)) or self.iterations < 1:
      raise ValueError(f"iterations must be a positive integer, got {self.iterations!r}")
    if not self.tol >= 0:  # NaN too
      raise ValueError(f"tol must be non-negative, got {self.tol}")
    if self.stepwise is not None and not isinstance(self.stepwise, Stepwise):
      raise ValueError(f"stepwise must be an objectives.Stepwise or None, got {self.stepwise!r}")
    if self.track_from < 0:
      raise ValueError(f"track_from must be non-negative, got {self.track_from}")
    if not self.head_features >= 0:
      raise ValueError(f"head_features must be a non-negative weight, got {self.head_features}")
    if self.head_features and (
        type(self.matched) not in (objectives.Gradient, objectives.ClippedGradient)
        or self.label_source is labels_lib.joint):
      raise ValueError("head features need known or inferred labels and a 'gradient' objective "
                       "(plain or clipped)")
    if self.smoothing is not None and not isinstance(self.smoothing, Smoothing):
      raise ValueError(f"smoothing must be an objectives.Smoothing or None, got {self.smoothing!r}")
    if self.smoothing is not None and isinstance(self.matched, objectives.Replay):
      raise ValueError("smoothing rounds the model of one gradient; replay's local steps are not rounded")
    if self.smoothing is not None and self.smoothing.until >= self.iterations:
      raise ValueError(f"smoothing must reach the model itself within the budget: until="
                       f"{self.smoothing.until} with {self.iterations} iterations")
    build_optimizer(self)

  @property
  def couples_restarts(self) -> bool:
    """Whether a prior reads the other restarts (GradInversion's group consistency): the restarts
    then run together, vmapped, all of one label order."""
    return any(p.couples_restarts for p in self.priors)

  @property
  def optimises_labels(self) -> bool:
    """Whether the labels are optimised with the data (DLG's joint soft labels)."""
    return self.label_source is labels_lib.joint


def _gamma(attack: Attack) -> objectives.Gamma | None:
  """DLM's γ settings where ``attack`` matches DLM's scaled difference, else None."""
  return attack.matched.gamma if isinstance(attack.matched, objectives.ScaledDifference) else None


def _couples_variables(optimizer) -> bool:
  if isinstance(optimizer, optimizers.Named):
    return optimizer.couples_variables
  return optimizers.stores_value(jax.eval_shape(optimizer.init, {"x": jnp.zeros((1,))}))


def build_optimizer(attack: Attack) -> optax.GradientTransformationExtraArgs:
  """The transformation ``attack`` runs (:func:`gradjax.optimizers.build` at its budget), with DLM's
  γ on an Adam of its own when the matched part's ``gamma`` has a learning rate."""
  tx = optimizers.build(attack.optimizer, attack.iterations)
  gamma = _gamma(attack)
  if gamma is None or gamma.learning_rate is None:
    return tx
  if _couples_variables(attack.optimizer):
    raise ValueError("a learning rate of gamma's own needs a first-order optimizer (adam, sgd, ...), "
                     "not L-BFGS, whose direction couples every variable")
  # DLM's log γ on Adam of its own; the dummy data and labels keep the attack's optimizer.
  tx = optax.multi_transform(
      {"data": tx, "gamma": optax.adam(gamma.learning_rate)},
      lambda params: {k: "gamma" if k == "log_gamma" else "data" for k in params})
  return optax.with_extra_args_support(tx)


def track_from(attack: Attack, num_leaves: int | None = None) -> int:
  """The first iteration whose objective counts for the best iterate: the attack's ``track_from``,
  or later while its objective still changes with the step, so that earlier values are not
  comparable with later ones: until the last prior switches on (its ``start``: before it the
  objective lacks that term and reads lower), while the distance anneals
  (``distance.settled_from``), the stepwise layer set grows
  (:meth:`gradjax.objectives.Stepwise.settled_from` for a model of ``num_leaves`` parameter leaves)
  or a smoothing sharpens the model. Past the budget, the final iterate is the reconstruction."""
  if attack.stepwise is not None and num_leaves is None:
    raise ValueError("an attack matching stepwise settles at a step set by the model's number of "
                     "parameter leaves (num_leaves=)")
  return max(attack.track_from, attack.distance.settled_from, *(p.start for p in attack.priors),
             attack.stepwise.settled_from(num_leaves) if attack.stepwise is not None else 0,
             attack.smoothing.until if attack.smoothing is not None else 0)


def rescaled(attack: Attack, iterations: int) -> Attack:
  """``attack`` with its budget set to ``iterations`` and every step count of its schedule scaled by
  iterations / attack.iterations: prior start steps, the stepwise period, the smoothing's ``until``
  and ``track_from`` (a
  :class:`gradjax.optimizers.Named` schedule is already a fraction of the budget). ``hfginv`` at 3000
  iterations switches TV on at 600 and the BatchNorm prior at 1000, grows its layer set every 100
  steps. The solver reads these counts as data (:func:`scheduled`): every budget runs one program."""
  if iterations < 1:
    raise ValueError(f"iterations must be positive, got {iterations}")
  r = iterations / attack.iterations
  stepwise = attack.stepwise and dataclasses.replace(attack.stepwise,
                                                     period=max(1, round(attack.stepwise.period * r)))
  smoothing = attack.smoothing and dataclasses.replace(attack.smoothing,
                                                       until=max(1, round(attack.smoothing.until * r)))
  return dataclasses.replace(
      attack, iterations=iterations, stepwise=stepwise, smoothing=smoothing,
      track_from=round(attack.track_from * r),
      priors=tuple(dataclasses.replace(p, start=round(p.start * r)) for p in attack.priors))


def _name_in(registry: dict, obj) -> str:
  """``obj``'s name in ``registry``, else its function's ``__name__``, else its type's name."""
  for name, value in registry.items():
    if value is obj or (type(value) is type(obj) and value == obj):
      return name
  fn = obj.fn if isinstance(obj, distances.Distance) else obj
  return getattr(fn, "__name__", None) or type(fn).__name__


def describe(attack: Attack) -> dict:
  """``attack`` as JSON-ready names and numbers (for results files): a registered part by its
  registry name, any other by its function name or repr."""
  opt = attack.optimizer
  return dict(
      name=attack.name, objective=attack.matched.name,
      distance=_name_in(distances.DISTANCES, attack.distance),
      depth_rule=attack.depth_rule,
      priors=[[_name_in(priors_lib.PRIORS, p.fn), p.weight if not callable(p.weight) else repr(p.weight),
               p.start] for p in attack.priors],
      label_source=_name_in(labels_lib.SOURCES, attack.label_source),
      optimizer=(dataclasses.asdict(opt) if isinstance(opt, optimizers.Named) else {"name": "optax"}),
      iterations=attack.iterations, box=attack.box, one_sample_per_step=attack.one_sample_per_step,
      dummy_init=_name_in(dummy_lib.INITS, attack.dummy_init), tol=attack.tol,
      remat=isinstance(attack.matched, objectives.Replay) and attack.matched.remat,
      stepwise=None if attack.stepwise is None else dataclasses.asdict(attack.stepwise),
      track_from=attack.track_from,
      gamma=dataclasses.asdict(_gamma(attack) or objectives.Gamma()),
      head_features=attack.head_features,
      smoothing=None if attack.smoothing is None else dataclasses.asdict(attack.smoothing))


class Reconstruction(NamedTuple):
  """Result of :func:`reconstruct`.

  Attributes:
    x: (N, H, W, C) the best restart's reconstruction (the iterate with the lowest objective).
    labels: (N,) int labels: argmax of the dummy soft labels (joint) or the inferred / known ones.
    loss: the best restart's objective value (NaN for a closed form that has none: the imprint's
      read-out).
    best_restart: its index.
    restart_losses: (R,) best objective of every restart (inf for a restart that never had a finite
      one; NaN where ``loss`` is).
    restart_alive: (R,) False for restarts that diverged (NaN/inf) and were frozen.
    x_restarts: (R, N, H, W, C) every restart's best iterate.
    iterations: (R,) optimizer iterations each restart ran.
    evaluations: (R,) objective evaluations (value and gradient) each restart used.
    dummy: the best restart's optimised variables (``"x"``, and ``"label_logits"`` or DLM's
      ``"log_gamma"`` when the attack has them).
    permutation: (N,) the label order of the best run: ``labels`` = known labels[permutation]
      (the identity without a permutation search).
    candidates: (K, N) every label order searched (K = 1 without a search).

  With a permutation search the runs are indexed ``r · K + k`` (restart r, candidate k) in
  ``restart_losses``, ``x_restarts`` and the other per-run arrays.
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
  dummy: dict
  permutation: np.ndarray | None = None
  candidates: np.ndarray | None = None


class MatchingData(NamedTuple):
  """What the solver's objective reads besides the dummy data (shared by every restart).

  observation: the :class:`~gradjax.observation.Observation`.
  labels: (N,) known or inferred int labels, or ``None`` when labels are optimised jointly.
  bounds: (lo, hi), each (C,): the valid input range in the model's input space.
  weights: per-leaf distance weights (:func:`layer_weights`) or ``None``.
  label_mask: (K,) bool, the classes joint soft labels may take, or ``None`` for all.
  positions: per-leaf depth positions for stepwise matching
    (:func:`gradjax.distances.leaf_positions`), or ``None``.
  head_targets: (t (N, F), w (N,)): each example's head-input target and its weight, in the labels'
    order (:func:`head_targets`), or ``None``.
  schedule: the attack's step counts that its budget moves (:func:`rescaled`), as data
    (:class:`gradjax.objectives.Schedule`), and
  track_from: its :func:`track_from` (int32 scalar), so one solver program serves every budget; both
    set by :func:`scheduled` (``None`` before).

  Each run also sees its own :class:`RunData` (its label order and PRNG seed): the solver's data is
  ``(MatchingData, RunData)``.
  """

  observation: Observation
  labels: jax.Array | None
  bounds: tuple[jax.Array, jax.Array]
  weights: dict | None
  label_mask: jax.Array | None = None
  positions: dict | None = None
  head_targets: tuple[jax.Array, jax.Array] | None = None
  schedule: objectives.Schedule | None = None
  track_from: jax.Array | None = None


def scheduled(attack: Attack, data: MatchingData, num_leaves: int) -> MatchingData:
  """``data`` with ``attack``'s step counts (on a model of ``num_leaves`` parameter leaves) as the
  data its solver reads: each prior's start, the stepwise period, the smoothing's ``until`` and
  the best iterate's :func:`track_from`."""
  count = lambda n: device_array(np.int32(n))
  return data._replace(
      schedule=objectives.Schedule(
          tuple(count(p.start) for p in attack.priors),
          None if attack.stepwise is None else count(attack.stepwise.period),
          None if attack.smoothing is None else count(attack.smoothing.until)),
      track_from=count(track_from(attack, num_leaves)))


class Problem(NamedTuple):
  """What :func:`prepare` sets up for the restart driver.

  data: the :class:`MatchingData` every run shares.
  orders: (K, N) int, the label orders searched (K = 1 without a permutation search).
  init: every run's starting dummy variables, stacked on a leading (R·K,) axis, run r·K + k being
    restart r with candidate k.
  restart_data: each run's own :class:`RunData`, stacked on the same (R·K,) axis.
  """

  data: MatchingData
  orders: np.ndarray
  init: dict
  restart_data: "RunData"


class RunData(NamedTuple):
  """What one run (a restart with a candidate label order) sees of its own.

  order: (N,) int32, its label order (a permutation-search candidate; the identity without one).
  seed: () uint32, the seed of the PRNG key of the draws its objective makes (HFGInv's gradient
    dropout); a restart's candidates share it.
  """

  order: jax.Array
  seed: jax.Array


class ClientSplit(NamedTuple):
  """How :func:`reconstruct_clients` hands the runs their clients' :class:`MatchingData`: the leaves
  where every client's data is the same (the round's model, as a Flower round's clients received it)
  once, shared by every run, and the others per run. ``structure``: the MatchingData's tree;
  ``shared``: per leaf, whether it is shared (static: the solver's programs are built for it)."""

  structure: jax.tree_util.PyTreeDef
  shared: tuple[bool, ...]

  def merge(self, shared_leaves, own_leaves) -> MatchingData:
    """A run's MatchingData from the shared leaves and its own (each a tuple, in leaf order)."""
    shared_leaves, own_leaves = iter(shared_leaves), iter(own_leaves)
    return self.structure.unflatten([next(shared_leaves) if s else next(own_leaves)
                                     for s in self.shared])


def _run_data(data, clients: ClientSplit | None):
  """(this run's MatchingData, its :class:`RunData`) from the solver's data: ``(shared, run)``, or
  with several clients ``(shared leaves, (its client's own leaves, run))``
  (:func:`reconstruct_clients`)."""
  if clients is None:
    return data
  shared, (own, run) = data
  return clients.merge(shared, own), run


def _clip_to_box(dummy, data):
  lo, hi = data[0].bounds
  return {**dummy, "x": jnp.clip(dummy["x"], lo, hi)}


def _solver(attack: Attack, apply_fn: Callable, num_leaves: int,
            loss_fn: Callable = cross_entropy, clients: ClientSplit | None = None) -> solvers.Solver:
  """The solver of ``attack`` on a model of ``num_leaves`` parameter leaves whose client trains on
  ``loss_fn`` (``clients``: each run reads its client's data, :func:`_run_data`), for data set by
  :func:`scheduled`. The name, the dummy initialisation, the budget and the step counts it moves do
  not make another solver: a learning-rate schedule is spread over the run's budget by
  :func:`gradjax.driver.run`, the other counts are the data's."""
  key = dataclasses.replace(
      attack, name="", dummy_init=dummy_lib.normal, iterations=2, track_from=0,
      priors=tuple(dataclasses.replace(p, start=0) for p in attack.priors),
      stepwise=attack.stepwise and dataclasses.replace(attack.stepwise, period=1),
      smoothing=attack.smoothing and dataclasses.replace(attack.smoothing, until=1))
  return _solver_cached(key, apply_fn, num_leaves, loss_fn, clients)


@functools.lru_cache(maxsize=32)
def _solver_cached(attack: Attack, apply_fn: Callable, num_leaves: int,
                   loss_fn: Callable, clients: ClientSplit | None = None) -> solvers.Solver:
  objective = gradient_matching(apply_fn, attack.distance, loss_fn=loss_fn,
                                prior=priors_lib.combine(attack.priors) if attack.priors else None,
                                matched=attack.matched,
                                one_sample_per_step=attack.one_sample_per_step,
                                stepwise=attack.stepwise, head_features=attack.head_features,
                                smoothing=attack.smoothing)

  def value_fn(dummy, data, step):
    shared, run = _run_data(data, clients)
    labels = None if shared.labels is None else shared.labels[run.order]
    targets = None if shared.head_targets is None else tuple(a[run.order]
                                                             for a in shared.head_targets)
    if shared.schedule is None:
      raise ValueError("the solver reads the attack's step counts from its data: "
                       "attacks.scheduled(attack, data, num_leaves)")
    return objective(dummy, shared.observation, labels, step, shared.weights,
                     label_mask=shared.label_mask, positions=shared.positions, head_targets=targets,
                     schedule=shared.schedule, key=jax.random.key(run.seed))

  def project(dummy, data):
    return _clip_to_box(dummy, _run_data(data, clients))

  # The key's step counts are placeholders (:func:`_solver`): the objective and the best-iterate
  # rule read the run's from its data.
  return solvers.make_solver(value_fn, build_optimizer(attack), tol=attack.tol,
                             project=project if attack.box else None,
                             track_from=lambda data: _run_data(data, clients)[0].track_from,
                             independent=not attack.couples_restarts)


@functools.partial(once, static_argnums=(1, 2, 3, 4, 5, 7, 8))
def _init_restarts(key, restarts, candidates, init, shape, label_shape, bounds, dtype, gamma):
  """(every run's initial dummy data, every run's :class:`RunData` seed), stacked (restart r's
  repeated for each of the ``candidates`` label orders), as one program. Restart r's dummy data
  draws from ``jax.random.split(key, restarts)[r]``, its seed from stream ``restarts + 1``
  (``fold_in(key, restarts + 1)`` split in R; stream ``restarts`` is the head targets')."""
  repeat = lambda a: jnp.repeat(a, candidates, axis=0)
  first = lambda kr: dummy_lib.init_dummy(kr, init, shape, label_shape, bounds, dtype, gamma=gamma)
  dummies = jax.vmap(first)(repeat(jax.random.split(key, restarts)))
  seeds = jax.vmap(lambda kr: jax.random.bits(kr, (), jnp.uint32))(
      jax.random.split(jax.random.fold_in(key, restarts + 1), restarts))
  return dummies, repeat(seeds)


def _depth_rule(attack: Attack) -> str | None:
  """The :func:`gradjax.distances.depth_weights` schedule ``attack`` weights its layers by, or None."""
  return attack.depth_rule if attack.depth_rule is not None else attack.distance.depth_rule


def depth_order(attack: Attack, apply_fn: Callable, observation: Observation, example):
  """The modules' call order (:func:`gradjax.distances.module_call_order` on ``example``, one input of
  shape (1, ...)) when ``attack`` weighs its layers by depth or matches them stepwise, else None."""
  if attack.stepwise is None and _depth_rule(attack) is None:
    return None
  return distances.module_call_order(apply_fn, observation.variables, example)


def layer_weights(attack: Attack, observation: Observation, order=None):
  """Per-leaf distance weights of ``attack`` (a pytree of scalars), or None for unweighted.

  Depth is the modules' call ``order`` (:func:`gradjax.distances.module_call_order`; without it, the
  insertion order of ``observation.variables["params"]``, which a model built under ``jit`` has
  lost); computed here, outside ``jit``. SAPAG's kernel defaults to Q_l = 1/(l+1).
  """
  rule = _depth_rule(attack)
  if rule is None:
    return None
  w = distances.depth_weights(observation.variables["params"], rule, order=order)
  return jax.tree.map(lambda v: device_array(np.float32(v)), w)


# The per-example solve (N² unknowns, about N⁴·K operations a step) is tried up to N⁴·K of this
# (N = 8 with 100 classes: about 20 s on one core; N = 16 with 100 classes took 207 s).
MAX_SOLVE_COST = 8 ** 4 * 100


def head_targets(observation: Observation, labels, dtype, key: jax.Array, *,
                 per_example: bool = True) -> tuple[jax.Array, jax.Array]:
  """(t (N, F), w (N,)): each example's head-input target from the dense head's gradient, with
  weight 1 where the target is that example's own and 0 elsewhere. An example alone in its class,
  which dominates its column, has its class's row (:func:`gradjax.analytic.head_inputs`, exact:
  a batch of one or of distinct classes needs nothing else). Otherwise, up to K − 1 examples (and
  a cost N⁴·K of :data:`MAX_SOLVE_COST`) each example's input is solved for
  (:func:`gradjax.analytic.head_inputs_per_example`, classes repeated or not; ``key`` draws its
  starts), kept where the float32 update pins it down; an example it leaves open keeps its class's
  row where that row is usable (a class of one that dominates its column). ``per_example=False``
  (a DP-SGD client, whose clipping scales each example's e_n by its own factor, which the
  per-example equations do not model): the class rows alone, each class's weight read from the
  bias gradient (:func:`gradjax.analytic.head_inputs`' ``clipped``)."""
  params, grads = observation.variables["params"], observation.gradient
  head = objectives.HEAD
  if head not in params or "kernel" not in params[head] or jnp.ndim(params[head]["kernel"]) != 2:
    raise ValueError(f"head features need a dense head named {head!r} in the model")
  labels = np.asarray(labels)
  kernel, bias = params[head]["kernel"], params[head]["bias"]
  found = analytic.head_inputs(kernel, bias, grads[head]["kernel"], grads[head]["bias"], labels,
                              clipped=not per_example)
  row = {int(c): i for i, c in enumerate(found.classes)}
  slots = np.asarray([row[int(c)] for c in labels])
  features, usable = found.features[slots], found.usable[slots]
  n, k = len(labels), np.shape(kernel)[1]
  if per_example and not usable.all() and n <= k - 1 and n ** 4 * k <= MAX_SOLVE_COST:
    own = analytic.head_inputs_per_example(kernel, bias, grads[head]["kernel"], grads[head]["bias"],
                                           labels, key=key)
    features = np.where(own.usable[:, None], np.maximum(own.features, 0.0), features)
    usable = own.usable | usable
  return jnp.asarray(features, dtype), jnp.asarray(usable, dtype)


def _known_labels(attack: Attack, observation: Observation):
  labels = attack.label_source(observation)
  return None if labels is None else jnp.asarray(labels)


# Nine parameters: the attack, what it attacks and its key, then the search's independent options
# (the input space, how many restarts and label orders), each with a default but the input shape.
def prepare(attack: Attack, apply_fn: Callable, observation: Observation, key: jax.Array, *,
            input_shape: tuple[int, ...], bounds=(0.0, 1.0), restarts: int = 1, permutations: int = 1,
            permutation_seed: int = 0, label_shape: tuple[int, ...] | None = None) -> Problem:
  """Everything the restart driver needs: labels (known, inferred or none), the label-order
  candidates, the layers' weights and depth positions, every restart's start. Arguments as
  :func:`reconstruct`'s; ``label_shape``: one example's joint soft labels (default the model's
  output's, e.g. (T, V + 1) for a masked language model's targets with 'no target',
  :func:`gradjax.losses.masked_cross_entropy`)."""
  check_observation(observation)
  if not any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(observation.gradient)):
    raise ValueError("the observed update is 0 everywhere: any data reproduce it, so no attack "
                     "reads the client's (e.g. a model that already fits its examples with "
                     "certainty, or one class: softmax cross entropy's gradient is then 0)")
  key = compilation.check_key(key)
  if (attack.matched.name == "gradient" and observation.local is not None
      and observation.threat_model.startswith("fedavg")):
    raise ValueError("the gradient objective reads a FedSGD gradient; this is a FedAvg update: "
                     "clients.update_as_gradient turns one local step into its gradient, several "
                     "need the replay, dlm or dlm_plus objective")
  if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 1:
    raise ValueError(f"restarts must be a positive integer, got {restarts!r}")
  if not 1 <= len(input_shape) <= 3:
    raise ValueError(f"input_shape must be the shape of one example, without the batch axis: "
                     f"(H, W, C) or (T,), got {tuple(input_shape)}")
  n = observation.num_samples
  dtype = jnp.result_type(*jax.tree.leaves(observation.variables["params"]))
  out = models.output_shape(apply_fn, observation.variables, input_shape, dtype, observation.train,
                            what="input_shape, one example's (e.g. (H, W, C)),")
  known = _known_labels(attack, observation)
  if known is not None:  # the observation's, or what the attack's label source inferred
    check_labels(known, (n, *out[1:-1]), out[-1], "the attack's labels")
  try:
    lo, hi = (np.broadcast_to(np.asarray(b, dtype), input_shape[-1:]) for b in bounds)
  except ValueError:
    raise ValueError(f"bounds must be (lo, hi), scalars or one per channel ({input_shape[-1]}), got "
                     f"{bounds}") from None
  if not np.all(lo < hi):
    raise ValueError(f"bounds must satisfy lo < hi, got {bounds}")
  lo, hi = device_array(lo), device_array(hi)
  if permutations < 1:
    raise ValueError(f"permutations must be positive, got {permutations}")
  if attack.couples_restarts and (restarts < 2 or permutations > 1):
    raise ValueError("group consistency compares restarts of one label order: it needs several "
                     f"restarts and no permutation search, got {restarts} restart(s) and "
                     f"{permutations} label order(s)")
  # What a declared batch needs before anything is allocated: a capture's num_samples may be wrong
  # by orders (10⁸ photos made XLA:CPU wait forever on an allocation).
  need = restarts * n * int(np.prod(input_shape)) * jnp.dtype(dtype).itemsize
  have = driver.memory_bytes()
  if have is not None and need > have:
    raise ValueError(f"the dummy batch of {n} examples of shape {tuple(input_shape)}"
                     f"{f' for {restarts} restarts' if restarts > 1 else ''} alone needs "
                     f"{need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB this device has: "
                     "is the observation's num_samples right?")
  local = observation.local
  if permutations > 1:
    if known is None:
      raise ValueError("a permutation search needs known or inferred labels, not joint ones")
    replay = isinstance(attack.matched, objectives.Replay)
    if not replay or local is None or (local.batch_size or n) == n:
      raise ValueError("a permutation search needs the replay objective and a client with more than "
                       "one local mini-batch (the label order changes nothing otherwise)")
  if known is None or known.ndim > 1:  # joint labels, or a language model's (N, T) targets
    orders = np.arange(n, dtype=np.int32)[None]
  else:
    orders = permutations_lib.candidates(np.asarray(known), local and local.batch_size,
                                         permutations, permutation_seed)
  # Depth from the model's call order, not the dicts' (sorted) order.
  order = depth_order(attack, apply_fn, observation, np.zeros((1, *input_shape), dtype))
  weights = layer_weights(attack, observation, order)
  if attack.smoothing is not None and not models.smoothable(apply_fn):
    raise ValueError("smoothing rounds the ReLUs and max pools of the zoo's ConvNets, ResNets, MLPs and "
                     "LeNets; this model takes no sharpness (gradjax.models.smoothable)")
  for prior in attack.priors:
    missing = [c for c in prior.needs if c not in observation.variables]
    if missing:
      raise ValueError(f"prior {_name_in(priors_lib.PRIORS, prior.fn)!r} reads the model's "
                       f"{', '.join(missing)} (a BatchNorm network's running statistics); this model "
                       "has none")
  positions = None
  if attack.stepwise is not None:
    positions = jax.tree.map(lambda i: jnp.asarray(i, jnp.int32),
                             distances.leaf_positions(observation.variables["params"], order))
  init, seeds = _init_restarts(key, restarts, orders.shape[0], attack.dummy_init, (n, *input_shape),
                               (tuple(label_shape or out[1:]) if known is None else None),
                               (lo, hi), dtype,
                               None if _gamma(attack) is None else _gamma(attack).init)
  targets = None
  if attack.head_features:
    if known is None or known.ndim != 1:
      raise ValueError("head features need known or inferred labels of images")
    # Stream ``restarts``: restart r draws from split(key, R)[r], which is fold_in(key, r).
    targets = head_targets(observation, known, dtype, jax.random.fold_in(key, restarts),
                           per_example=not isinstance(attack.matched, objectives.ClippedGradient))
  data = MatchingData(observation, known, (lo, hi), weights, None, positions, targets)
  return Problem(data, orders, init, RunData(device_array(np.tile(orders, (restarts, 1))), seeds))


def restrict_labels(problem: Problem, support, num_classes: int) -> Problem:
  """``problem`` with joint soft labels restricted to the class ids ``support`` (the others get
  probability 0), e.g. the tokens an embedding gradient reveals (:func:`gradjax.text.token_bag`)."""
  if problem.data.labels is not None:
    raise ValueError("a label support restricts joint soft labels; this attack's labels are fixed")
  support = np.asarray(support).reshape(-1)
  if support.size == 0 or not np.issubdtype(support.dtype, np.integer) or support.min() < 0 \
      or support.max() >= num_classes:
    raise ValueError(f"a label support must be a non-empty set of class ids in [0, {num_classes})")
  mask = device_array(np.isin(np.arange(num_classes), support))
  return problem._replace(data=problem.data._replace(label_mask=mask))


def best_restart(state: solvers.SolverState) -> tuple[int, np.ndarray]:
  """(the run with the lowest objective, every run's best objective with inf for a run that never had
  a finite one), from a fetched :class:`gradjax.solvers.SolverState` stacked over runs."""
  losses = np.where(np.isfinite(state.best_loss), state.best_loss, np.inf)
  if not np.isfinite(losses).any():
    raise FloatingPointError("every restart diverged before its first finite objective value")
  return int(np.argmin(losses)), losses


def select(problem: Problem, state: solvers.SolverState) -> "Reconstruction":
  """The best run of a finished search (fetched ``state``): its reconstruction, labels (the argmax
  of its soft labels, or the known ones in its candidate order) and candidate."""
  best, losses = best_restart(state)
  k = problem.orders.shape[0]
  order = problem.orders[best % k]
  if problem.data.labels is None:
    label_logits = np.asarray(state.best_params["label_logits"][best])
    if problem.data.label_mask is not None:
      label_logits = np.where(np.asarray(problem.data.label_mask), label_logits, -np.inf)
    labels = np.argmax(label_logits, axis=-1)
  else:
    labels = np.asarray(problem.data.labels)[order]
  x_restarts = np.asarray(state.best_params["x"])
  return Reconstruction(x=x_restarts[best], labels=labels, loss=float(losses[best]),
                        best_restart=best, restart_losses=losses,
                        restart_alive=np.asarray(state.alive), x_restarts=x_restarts,
                        iterations=np.asarray(state.iterations),
                        evaluations=np.asarray(state.evaluations),
                        dummy=jax.tree.map(lambda v: np.asarray(v[best]), state.best_params),
                        permutation=order, candidates=problem.orders)


def solve(attack: Attack, apply_fn: Callable, problem: Problem,
          execution: driver.Execution = driver.Execution(), *,
          loss_fn: Callable = cross_entropy) -> solvers.SolverState:
  """Runs every restart × candidate of ``problem`` (:func:`gradjax.driver.run`); the final state,
  fetched to the host. ``loss_fn``: the client's loss (``loss_fn(logits, targets)``; a masked
  language model's is :func:`gradjax.losses.masked_cross_entropy`). An attack that couples its
  restarts (:attr:`Attack.couples_restarts`) runs them vmapped: the ``"auto"`` strategy becomes
  ``"vmap"``, another one is refused."""
  if attack.couples_restarts:
    execution = coupled_execution(execution)
  num_leaves = len(jax.tree.leaves(problem.data.observation.gradient))
  state = driver.run(_solver(attack, apply_fn, num_leaves, loss_fn), problem.init,
                     scheduled(attack, problem.data, num_leaves),
                     iterations=attack.iterations, execution=execution,
                     restart_data=problem.restart_data)
  return sharding.fetch(state)


def coupled_execution(execution: driver.Execution) -> driver.Execution:
  """``execution`` for restarts that read each other: all advance in one vmapped program on one
  device (the consensus is taken over the vmapped axis, :data:`gradjax.sharding.RESTART_AXIS`)."""
  if execution.strategy not in ("auto", "vmap") or execution.shard:
    raise ValueError("group consistency runs the restarts together on one device (strategy 'vmap', "
                     f"unsharded), not strategy {execution.strategy!r}"
                     + (" sharded" if execution.shard else ""))
  return dataclasses.replace(execution, strategy="vmap")


# Eleven parameters: those of prepare(), the execution record (see prepare) and the client's loss.
def reconstruct(attack: Attack, apply_fn: Callable, observation: Observation, key: jax.Array, *,
                input_shape: tuple[int, ...], bounds=(0.0, 1.0), restarts: int = 1,
                permutations: int = 1, permutation_seed: int = 0,
                execution: driver.Execution = driver.Execution(),
                loss_fn: Callable = cross_entropy) -> Reconstruction:
  """Reconstructs the client's data behind ``observation``: :func:`prepare`, :func:`solve`,
  :func:`select`.

  Args:
    attack: e.g. ``presets.dlg()``, or an :class:`Attack` of one's own parts.
    apply_fn: the model, ``apply_fn(variables, x, train) -> logits``.
    observation: what the attacker observed (see :mod:`gradjax.clients`).
    key: PRNG key; restart r's dummy (its image, and labels where optimised) is drawn by
      :func:`gradjax.dummy.init_dummy` from ``jax.random.split(key, restarts)[r]`` (all in one
      compiled program: a draw of its own agrees up to float32 rounding), so restart r of a run of
      R restarts is not restart r of one of another count.
    input_shape: (H, W, C) of one example, in the model's input space (any shape the model reads as
      a float input, e.g. (T, dim) embeddings of a text model, :mod:`gradjax.text`).
    bounds: (lo, hi), scalars or per channel (C,): the valid image range in the model's input space,
      e.g. ((0 − mean) / std, (1 − mean) / std) for normalised inputs. Used by ``box`` and the
      ``uniform`` / ``constant`` initialisations.
    restarts: independent random initialisations; the one with the lowest objective is returned.
    permutations: permutation search: up to this many candidate orders of the known or inferred
      labels (:func:`gradjax.permutations.candidates`, for the client's local mini-batch size) are
      each run from every restart's initialisation, all in one solver run; the lowest objective
      wins. 1 = take the labels in the order given. Needs labels that are not optimised jointly.
    permutation_seed: seed of the candidate sample when there are more orders than ``permutations``.
    execution: how the restarts × candidates run (:class:`gradjax.driver.Execution`: strategy,
      chunk, successive halving, sharding over devices, progress callback and monitor).
    loss_fn: the client's loss, ``loss_fn(logits, targets) -> scalar`` (default the mean cross
      entropy of :func:`gradjax.clients.fedsgd`): the one the dummy gradient is computed with, so
      it must be the client's (a client of another loss is matched by the wrong model otherwise).
  """
  with driver.precision_scope(execution.matmul_precision):
    host = None if execution.shard else execution.setup_device
    with compilation.on_setup_device(host):
      problem = prepare(attack, apply_fn, observation, key, input_shape=input_shape, bounds=bounds,
                        restarts=restarts, permutations=permutations,
                        permutation_seed=permutation_seed)
    problem = compilation.to_default_device(problem, host)
    return select(problem, solve(attack, apply_fn, problem, execution, loss_fn=loss_fn))


# Eleven parameters, as reconstruct's: one key per client.
def reconstruct_clients(attack: Attack, apply_fn: Callable, observations: Sequence[Observation],
                        keys, *, input_shape: tuple[int, ...], bounds=(0.0, 1.0), restarts: int = 1,
                        permutations: int = 1, permutation_seed: int = 0,
                        execution: driver.Execution = driver.Execution(),
                        loss_fn: Callable = cross_entropy) -> list[Reconstruction]:
  """Reconstructs the data behind K clients' observations of one model in one solver run: the K
  clients × R restarts × P label orders are the driver's runs, so ``execution.strategy`` advances them
  one after another (``"sequential"``), all in one vmapped program (``"vmap"``, what an accelerator
  is for) or in vmapped blocks (``"map"``); ``"tune"`` measures which is fastest.

  Client k's reconstruction is the one :func:`reconstruct` gives for ``observations[k]`` and
  ``keys[k]``, up to float32 rounding (its step is another program) (each client's problem is
  prepared alone, :func:`prepare`; what differs between the clients' problems, such as their updates
  and labels, each of its runs carries, K·R·P copies; what is the same for all, such as the round's
  model, is held once and shared by every run (:class:`ClientSplit`); its best run is selected among
  its own, :func:`select`). One program serves every client, so the
  observations must share a structure: the model's parameter tree and shapes, the batch size, the
  threat model and its local training (a Flower round's clients, or one client over rounds).

  Args:
    attack, apply_fn, input_shape, bounds, restarts, permutations, permutation_seed, loss_fn: as
      :func:`reconstruct`'s, for every client.
    observations: K observations (:mod:`gradjax.clients`).
    keys: K PRNG keys (e.g. ``jax.random.split(key, K)``); client k's restart r starts from
      ``jax.random.split(keys[k], restarts)[r]``.
    execution: as :func:`reconstruct`'s; successive halving (which would rank one client's runs
      against another's) and attacks that couple their restarts (a consensus over runs) are refused
      for more than one client. A ``monitor`` sees every client's runs stacked.

  Returns:
    K :class:`Reconstruction`, in the order of ``observations``; each one's per-run arrays
    (``restart_losses``, ``x_restarts`` ...) hold that client's R·P runs.
  """
  observations = list(observations)
  if getattr(keys, "shape", None) == () or getattr(keys, "shape", None) == (2,) and keys.dtype == np.uint32:
    raise ValueError("keys: one PRNG key per client, e.g. jax.random.split(key, K); got one key")
  keys = list(keys)
  if not observations:
    raise ValueError("reconstruct_clients needs at least one observation")
  if len(keys) != len(observations):
    raise ValueError(f"one key per client: got {len(keys)} keys for {len(observations)} observations")
  several = len(observations) > 1
  if several and attack.couples_restarts:
    raise ValueError("group consistency takes a consensus over the restarts it runs together; "
                     "attack one client at a time")
  if several and execution.halving_rounds > 1:
    raise ValueError("successive halving would rank one client's restarts against another's; "
                     "attack several clients with halving_rounds = 1")
  with driver.precision_scope(execution.matmul_precision):
    host = None if execution.shard else execution.setup_device
    with compilation.on_setup_device(host):
      problems = [prepare(attack, apply_fn, obs, key, input_shape=input_shape, bounds=bounds,
                          restarts=restarts, permutations=permutations,
                          permutation_seed=permutation_seed)
                  for obs, key in zip(observations, keys)]
    first = jax.tree.structure(problems[0].data)
    for k, problem in enumerate(problems[1:], 1):
      shapes = [jnp.shape(a) for a in jax.tree.leaves(problem.data)]
      if (jax.tree.structure(problem.data) != first
          or shapes != [jnp.shape(a) for a in jax.tree.leaves(problems[0].data)]
          or problem.restart_data.order.shape != problems[0].restart_data.order.shape):
        raise ValueError(f"clients attacked in one program share the model, its parameter shapes, "
                         f"the batch size, the threat model and its local training; client {k} "
                         "differs from client 0 (attack it separately)")
    runs = problems[0].restart_data.order.shape[0]  # R·P per client
    # What every client has the same (the round's model) is shared by every run; the rest each run
    # carries (a vmapped program reads it as an input, not by a gather at every step; the
    # sequential strategy moves each run's to the device once).
    num_leaves = len(jax.tree.leaves(observations[0].gradient))
    datas = jax.device_get([scheduled(attack, p.data, num_leaves) for p in problems])
    leaves = [jax.tree.leaves(d) for d in datas]
    split = ClientSplit(jax.tree.structure(datas[0]),
                        tuple(all(np.array_equal(mine[i], leaves[0][i]) for mine in leaves[1:])
                              for i in range(len(leaves[0]))))
    shared = tuple(device_array(a) for a, s in zip(leaves[0], split.shared) if s)
    own = tuple(np.repeat(np.stack([mine[i] for mine in leaves]), runs, axis=0)
                for i, s in enumerate(split.shared) if not s)
    # The runs' first dummy data and RunData, stacked on the host (the driver places them).
    init = jax.tree.map(lambda *a: np.concatenate(a), *jax.device_get([p.init for p in problems]))
    runs_data = jax.tree.map(lambda *a: np.concatenate(a),
                             *jax.device_get([p.restart_data for p in problems]))
    state = driver.run(_solver(attack, apply_fn, num_leaves, loss_fn, clients=split), init, shared,
                       iterations=attack.iterations, execution=execution,
                       restart_data=(own, runs_data))
    state = sharding.fetch(state)
    return [select(p, jax.tree.map(lambda a, k=k: a[k * runs:(k + 1) * runs], state))
            for k, p in enumerate(problems)]
