"""Named attacks: presets that compose distance, priors, label strategy, optimizer and initialisation.

An :class:`Attack` is a frozen record of choices (hashable, so compiled programs are cached per attack
and reused across images). :func:`reconstruct` runs it against an Observation. Every part is also
usable on its own (:mod:`gradjax.distances`, :mod:`gradjax.priors`, :mod:`gradjax.labels`,
:mod:`gradjax.solvers`, :mod:`gradjax.objectives`).

Presets and where their defaults come from:

* ``dlg`` (Zhu et al., NeurIPS 2019; mit-han-lab/dlg): distance Σ‖g' − g‖² (no 0.5), dummy data and
  dummy label logits ~ N(0, 1) optimised jointly with soft labels softmax(z'), L-BFGS lr 1 with
  history 100. Budget: the paper runs 300 PyTorch ``LBFGS.step()`` calls of up to 20 inner iterations
  (up to 6000 objective evaluations). Here one iteration is one L-BFGS update with a zoom line search
  (about 1.05 evaluations on average for this objective), and the default is 2000 iterations, a third
  of the original evaluation budget: on CIFAR-10 test images 0-19 it gives PSNR >= 30 dB on 15 of 20
  (RESULTS.md). See :mod:`gradjax.solvers` on counting.
* ``idlg`` (Zhao et al., 2020): as ``dlg`` but the label is inferred first from the last layer's
  gradient (:func:`gradjax.labels.idlg`, batch 1) and only the data is optimised.
* ``adam_dlg``: the Euclidean distance driven by AdamW lr 1e-3 for 20 000 iterations, the "Adam-DLG"
  baseline of SAPAG (Wang et al.), i.e. SAPAG's ResNet-18 optimiser with DLG's distance.
* ``inverting_gradients`` (Geiping et al., NeurIPS 2020, Table 1 protocol): 1 − cosine over all layers,
  total variation mean|dx| + mean|dy| with weight 1e-4, Adam lr 0.1 on the sign of the gradient, lr
  ×0.1 at 3/8, 5/8, 7/8 of 4800 iterations, iterates clamped to the image box, init N(0, 1) in
  normalised space, labels known. (The paper's README example runs 24 000 iterations.)
* ``sapag`` (Wang et al., "SAPAG", LeNet-5 protocol): Gaussian-kernel distance
  Σ_l Q_l (1 − exp(−‖Δ_l‖² / (n_l σ_l²))) with σ_l² = Var(observed ∇W_l), n_l the leaf's size and
  Q_l = 1/(l+1), L-BFGS lr 1, dummy data kept in [0, 1] (clamped after every step), labels optimised
  jointly as in DLG. Two readings are ours. The kernel width n_l σ_l²: with the literal ‖Δ_l‖² / σ_l²
  (distance ``"gaussian_kernel"``) every large leaf's term underflows at a random start; on CIFAR-100
  images 1 and 2 (LeNet-5, Xavier normal) that gave 6.3 and 9.3 dB against 28.7 and 19.8 dB with the
  per-entry width. The budget, 2000 iterations: the paper's "500 iterations" are PyTorch
  ``LBFGS.step()`` calls of up to 20 iterations each (see ``dlg``), and 500 optax iterations left
  the preset about 10 dB under the paper's mean on CIFAR-100 images 0-19, 2000 above it (RESULTS.md,
  which also measures the fixed step, the printed width, an annealed width, uniform Q_l and the box).
  The box helps on CIFAR-100 and stalls the attack on MNIST, whose digits lie on its lower edge:
  there ``box=False`` (``--nobox``) reaches the paper's figure.
* ``sapag_adamw``: SAPAG's ResNet-18 protocol: the same distance with AdamW lr 1e-3, 20 000 iterations.
* ``dlm`` / ``dlm_plus`` (Zhao, Luo, Ding, weights-only leakage in FedAvg; MLP protocol): from
  W_t and W_{t+1} after one local SGD step, ‖∇W' − γ (W_t − W_{t+1})‖² with γ learned (init 1,
  optimised as log γ), Adam lr 0.1; DLM+: ‖∇W'/‖∇W'‖ − ΔW/‖ΔW‖‖², Adam lr 0.01; 4000 iterations
  (the paper: 4000-5000). DLM infers labels by iDLG (the sign pattern of the update is that of the
  gradient): with DLG's joint soft labels the dummy gradient can vanish (soft label = prediction)
  and γ with it. That trivial minimum (γ → 0, ∇W' → 0) also attracts DLM with fixed labels from a
  random start; γ reaches 1/lr only from a start near the data (RESULTS.md). The paper leaves γ's
  start and step size unstated: :class:`gradjax.objectives.Gamma` sets them (``--gamma``), and none of
  the readings measured (start at 1/lr, an Adam of its own, held for the first steps) reaches the
  paper's 68 %; γ held at 1/lr throughout does not either. DLM+ is
  scale-free, so it optimises labels jointly as DLG does, and clamps the dummy image to the box:
  on CIFAR-100 images 0-19 (mlp, lr 0.01) that gives 65 % over 30 dB (90 % with the paper's PSNR,
  which reports 92 %) against 15 % with iDLG labels and 5 % without the box
  (``experiments/dlm_table.py``). For LeNet the paper uses L-BFGS lr 1, 200 iterations
  (``--optimizer=lbfgs --lr=1 --iterations=200``).
* ``inverting_gradients_fedavg`` (Geiping et al. 2020 §6, FedAvg): the client's local training is
  replayed on the dummy data and W_t − W'_{t+1} matched to the observed update with 1 − cosine, TV
  1e-4, signed Adam lr 1 with step decay, 4800 iterations, box, labels known; needs the schedule in
  ``observation.local``. The lr is the paper's; the authors' ``rec_mult.py`` runs 0.1 unless ``--lr``
  is given (``--lr=0.1``; RESULTS.md measures both).
* ``hfginv`` (Ye et al., "High-Fidelity Gradient Inversion in Distributed Learning", AAAI 2024; the
  schedule from their code, ResNet-34 protocol): one cosine over a growing set of layers, deep to
  shallow, with gradient dropout 0.3 (:class:`gradjax.objectives.Stepwise`: the deepest tenth of the
  parameter tensors at first, a tenth more every 500 iterations, up to the deepest 86/110); TV 0.01
  from iteration 3000 (the paper; their code 5e-3) and the BatchNorm prior 1e-4 from 5000 (stem ×1.3,
  next layer ×3); Adam lr 0.1 on the quantised sign (:func:`gradjax.solvers.scale_by_quantized_sign`),
  ×0.33 at 3/8, 5/8 and 7/8 of 15 000 iterations; box; labels known or from
  :func:`gradjax.labels.hfginv`. The best iterate is taken from iteration 4000 on, once the layer set
  has stopped growing (their code resets its best every 500). :func:`rescaled` shrinks the budget.
* ``gradinversion``: the baseline HFGInv is compared with, as its ablation builds it: the same cosine
  over every layer with TV 0.01 and GradInversion's BatchNorm prior 1e-4 (first layer ×10, after
  DeepInversion) from the start, signed Adam lr 0.1 with Inverting Gradients' step decay, 15 000
  iterations, box, labels known (Yin et al., CVPR 2021, who also add an l2 prior and group consistency
  over restarts).
"""

import dataclasses
import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradjax import distances
from gradjax import labels as labels_lib
from gradjax import permutations as permutations_lib
from gradjax import priors as priors_lib
from gradjax import solvers
from gradjax.compilation import once
from gradjax.objectives import MODES, Gamma, Stepwise, gradient_matching
from gradjax.observation import Observation, check_observation

DUMMY_INITS = ("normal", "uniform", "constant", "pattern")
PATTERN_SIZE = 4  # side of the random tile repeated by the "pattern" initialisation


def label_strategies() -> tuple[str, ...]:
  """``"joint"`` (optimise soft labels, DLG), ``"known"`` (shared by the threat model), any
  inference method of :data:`gradjax.labels.METHODS`, or ``"hfginv"`` (HFGInv's duplicate-aware counts,
  which read auxiliary images: infer them with :func:`gradjax.labels.hfginv` and attack with the
  labels known, as ``pipeline.run`` does for ``--labels=hfginv``)."""
  return ("joint", "known", *labels_lib.METHODS, "hfginv")


def _check_distance(name: str, layer_weights: str | None) -> None:
  distances.get_distance(name)
  if layer_weights is not None and layer_weights not in distances.SCHEDULES:
    raise ValueError(f"unknown layer-weight schedule {layer_weights!r}; choose one of "
                     f"{', '.join(distances.SCHEDULES)}")


def _prior(spec: tuple[tuple[str, float, int], ...]) -> Callable | None:
  if not spec:
    return None
  parts = []
  for item in spec:
    if len(item) != 3:
      raise ValueError(f"a prior is (name, weight, start_step), got {item!r}")
    name, weight, start = item
    if name not in priors_lib.PRIORS:
      raise ValueError(f"unknown prior {name!r}; choose one of {', '.join(priors_lib.PRIORS)}")
    parts.append(priors_lib.Prior(priors_lib.PRIORS[name], priors_lib.step_on(weight, start)))
  return priors_lib.combine(parts)


@dataclasses.dataclass(frozen=True)
class Attack:
  """A gradient-matching attack.

  Attributes:
    name: preset name.
    objective: what is matched, a mode of :func:`gradjax.objectives.gradient_matching`:
      ``"gradient"`` (FedSGD), ``"replay"`` (FedAvg, local training replayed), ``"dlm"``, ``"dlm_plus"``.
    distance: a name in :data:`gradjax.distances.DISTANCES`.
    layer_weights: ``None`` (the distance's default) or a depth schedule of
      :func:`gradjax.distances.depth_weights` (``"inverse"``, ``"linear"``, ``"exp"``,
      ``"uniform"``) used as per-layer weights.
    priors: ``((name, weight, start_step), ...)`` image priors of :data:`gradjax.priors.PRIORS`,
      each switched on from ``start_step``.
    labels: one of :func:`label_strategies`.
    optimizer: a name in :data:`gradjax.solvers.OPTIMIZERS`.
    learning_rate: optimizer learning rate (peak, with a schedule).
    schedule: learning-rate schedule, ``"constant"``, ``"step"`` or ``"cosine"``.
    warmup: linear warm-up steps.
    weight_decay: AdamW's decoupled weight decay.
    iterations: optimizer iterations per restart.
    history: L-BFGS memory.
    max_linesearch_steps: zoom line-search evaluations per L-BFGS iteration at most.
    box: clamp the dummy data to the valid image range after every step.
    one_sample_per_step: DLG's batch option, only example t mod N moves at step t.
    init: dummy-data initialisation: ``"normal"`` N(0, 1), ``"uniform"`` U(lo, hi) over the image
      box, ``"constant"`` the box's midpoint (mid-grey), ``"pattern"`` a random N(0, 1) 4×4 tile
      repeated over the image.
    tol: a restart stops once its objective is <= tol.
    remat: ``jax.checkpoint`` each replayed local step (objective ``"replay"``): memory grows with
      one parameter set per local step instead of every step's activations.
    stepwise: HFGInv's growing set of matched layers with gradient dropout
      (:class:`gradjax.objectives.Stepwise`), or ``None`` to match every layer.
    track_from: the reconstruction is the lowest-objective iterate from this iteration on (0: the
      whole run); with ``stepwise``, objective values are comparable only once the layer set stops
      growing. An annealed distance raises it to the step it settles at
      (:func:`gradjax.distances.settled_from`).
    gamma: objective ``"dlm"`` only: how its scale γ starts and learns (:class:`gradjax.objectives.Gamma`).
  """

  name: str = "custom"
  objective: str = "gradient"
  distance: str = "euclidean"
  layer_weights: str | None = None
  priors: tuple[tuple[str, float, int], ...] = ()
  labels: str = "joint"
  optimizer: str = "lbfgs"
  learning_rate: float = 1.0
  schedule: str = "constant"
  warmup: int = 0
  weight_decay: float = 0.01
  iterations: int = 300
  history: int = 100
  max_linesearch_steps: int = 20
  box: bool = False
  one_sample_per_step: bool = False
  init: str = "normal"
  tol: float = 0.0
  remat: bool = False
  stepwise: Stepwise | None = None
  track_from: int = 0
  gamma: Gamma = Gamma()

  def __post_init__(self):
    if self.objective not in MODES:
      raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(MODES)}")
    _check_distance(self.distance, self.layer_weights)
    _prior(self.priors)
    if self.labels not in label_strategies():
      raise ValueError(f"unknown label strategy {self.labels!r}; choose one of "
                       f"{', '.join(label_strategies())}")
    if self.init not in DUMMY_INITS:
      raise ValueError(f"unknown dummy init {self.init!r}; choose one of {', '.join(DUMMY_INITS)}")
    if self.iterations < 1:
      raise ValueError(f"iterations must be positive, got {self.iterations}")
    if self.tol < 0:
      raise ValueError(f"tol must be non-negative, got {self.tol}")
    if self.stepwise is not None and not isinstance(self.stepwise, Stepwise):
      raise ValueError(f"stepwise must be an objectives.Stepwise or None, got {self.stepwise!r}")
    if self.track_from < 0:
      raise ValueError(f"track_from must be non-negative, got {self.track_from}")
    if not isinstance(self.gamma, Gamma):
      raise ValueError(f"gamma must be an objectives.Gamma, got {self.gamma!r}")
    if self.gamma != Gamma() and self.objective != "dlm":
      raise ValueError(f"gamma settings apply to the 'dlm' objective only, not {self.objective!r}")
    build_optimizer(self)


def build_optimizer(attack: "Attack") -> solvers.Optimizer:
  """The :class:`gradjax.solvers.Optimizer` ``attack`` names (optimizer, learning rate, schedule),
  with DLM's γ on an Adam of its own when ``attack.gamma`` has a learning rate."""
  optimizer = solvers.make_optimizer(
      attack.optimizer, attack.learning_rate, history=attack.history,
      max_linesearch_steps=attack.max_linesearch_steps, schedule=attack.schedule,
      iterations=attack.iterations, warmup=attack.warmup, weight_decay=attack.weight_decay)
  if attack.gamma.learning_rate is None:
    return optimizer
  if attack.optimizer.startswith("lbfgs"):
    raise ValueError("a learning rate of gamma's own needs a first-order optimizer (adam, sgd, ...), "
                     f"not {attack.optimizer!r}, whose direction couples every variable")
  # DLM's log γ on Adam of its own; the dummy data and labels keep the attack's optimizer.
  tx = optax.multi_transform(
      {"data": optimizer.tx, "gamma": optax.adam(attack.gamma.learning_rate)},
      lambda params: {k: "gamma" if k == "log_gamma" else "data" for k in params})
  return solvers.Optimizer(optax.with_extra_args_support(tx), False)


PRESETS: dict[str, Attack] = {
    "dlg": Attack(name="dlg", iterations=2000),
    "idlg": Attack(name="idlg", labels="idlg", iterations=2000),
    "adam_dlg": Attack(name="adam_dlg", optimizer="adamw", learning_rate=1e-3, iterations=20_000),
    "inverting_gradients": Attack(
        name="inverting_gradients", distance="cosine", priors=(("tv", 1e-4, 0),), labels="known",
        optimizer="signed_adam", learning_rate=0.1, schedule="step", iterations=4800, box=True),
    "dlm": Attack(name="dlm", objective="dlm", labels="idlg", optimizer="adam", learning_rate=0.1,
                  iterations=4000),
    "dlm_plus": Attack(name="dlm_plus", objective="dlm_plus", optimizer="adam",
                       learning_rate=0.01, iterations=4000, box=True),
    "inverting_gradients_fedavg": Attack(
        name="inverting_gradients_fedavg", objective="replay", distance="cosine",
        priors=(("tv", 1e-4, 0),), labels="known", optimizer="signed_adam", learning_rate=1.0,
        schedule="step", iterations=4800, box=True),
    "sapag": Attack(name="sapag", distance="gaussian_kernel_mean", iterations=2000, box=True),
    "sapag_adamw": Attack(name="sapag_adamw", distance="gaussian_kernel_mean", optimizer="adamw",
                          learning_rate=1e-3, iterations=20_000, box=True),
    "gradinversion": Attack(
        name="gradinversion", distance="cosine", priors=(("tv", 1e-2, 0), ("bn", 1e-4, 0)),
        labels="known", optimizer="signed_adam", learning_rate=0.1, schedule="step",
        iterations=15_000, box=True),
    "hfginv": Attack(
        name="hfginv", distance="cosine", priors=(("tv", 1e-2, 3000), ("bn_hfginv", 1e-4, 5000)),
        labels="known", optimizer="quantized_adam", learning_rate=0.1, schedule="step_hfginv",
        iterations=15_000, box=True, stepwise=Stepwise(), track_from=4000),
}


def rescaled(attack: Attack, iterations: int) -> Attack:
  """``attack`` with its budget set to ``iterations`` and every step count of its schedule scaled by
  iterations / attack.iterations: prior start steps, the stepwise period and ``track_from`` (the
  learning-rate schedules are already fractions of the budget). ``hfginv`` at 3000 iterations switches
  TV on at 600 and the BatchNorm prior at 1000, grows its layer set every 100 steps."""
  if iterations < 1:
    raise ValueError(f"iterations must be positive, got {iterations}")
  r = iterations / attack.iterations
  stepwise = attack.stepwise and dataclasses.replace(attack.stepwise,
                                                     period=max(1, round(attack.stepwise.period * r)))
  return dataclasses.replace(
      attack, iterations=iterations, stepwise=stepwise, track_from=round(attack.track_from * r),
      priors=tuple((name, weight, round(start * r)) for name, weight, start in attack.priors))


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


def _solver(attack: Attack, apply_fn: Callable) -> solvers.Solver:
  """The solver of ``attack``; ``init`` and, for constant schedules, ``iterations`` do not recompile."""
  key = dataclasses.replace(attack, name="", init="normal",
                            iterations=attack.iterations if attack.schedule != "constant" else 1)
  return _solver_cached(key, apply_fn)


class MatchingData(NamedTuple):
  """What the solver's objective reads besides the dummy data (shared by every restart).

  observation: the :class:`~gradjax.observation.Observation`.
  labels: (N,) known or inferred int labels, or ``None`` when labels are optimised jointly.
  bounds: (lo, hi), each (C,): the image box in the model's input space.
  weights: per-leaf distance weights (:func:`layer_weights`) or ``None``.
  label_mask: (K,) bool, the classes joint soft labels may take, or ``None`` for all.
  positions: per-leaf depth positions for stepwise matching
    (:func:`gradjax.distances.leaf_positions`), or ``None``.

  Each restart also sees its own ``order`` (N,) of the labels (a permutation-search candidate):
  the solver's data is ``(MatchingData, order)``.
  """

  observation: Observation
  labels: jax.Array | None
  bounds: tuple[jax.Array, jax.Array]
  weights: dict | None
  label_mask: jax.Array | None = None
  positions: dict | None = None


def _clip_to_box(dummy, data):
  lo, hi = data[0].bounds
  return {**dummy, "x": jnp.clip(dummy["x"], lo, hi)}


@functools.lru_cache(maxsize=32)
def _solver_cached(attack: Attack, apply_fn: Callable) -> solvers.Solver:
  distance = distances.get_distance(attack.distance)
  objective = gradient_matching(apply_fn, distance,
                                prior=_prior(attack.priors),
                                one_sample_per_step=attack.one_sample_per_step,
                                mode=attack.objective, remat=attack.remat, stepwise=attack.stepwise,
                                gamma=attack.gamma)

  def value_fn(dummy, data, step):
    shared, order = data
    labels = None if shared.labels is None else shared.labels[order]
    return objective(dummy, shared.observation, labels, step, shared.weights,
                     label_mask=shared.label_mask, positions=shared.positions)

  return solvers.make_solver(value_fn, build_optimizer(attack), tol=attack.tol,
                             project=_clip_to_box if attack.box else None,
                             track_from=track_from(attack, distance))


def track_from(attack: Attack, distance: Callable) -> int:
  """The first iteration whose objective counts for the best iterate: the attack's ``track_from``,
  or later while ``distance`` still anneals (:func:`gradjax.distances.settled_from`: earlier values
  are not comparable with later ones)."""
  return max(attack.track_from, distances.settled_from(distance))


def init_dummy(key: jax.Array, init: str, shape: tuple[int, ...], label_shape: int | tuple[int, ...] | None,
               bounds=(0.0, 1.0), dtype=jnp.float32, gamma: float | None = None) -> dict:
  """Initial dummy data ``{"x": shape, ["label_logits": (N, *label_shape) ~ N(0, 1)], ["log_gamma"]}``.

  Args:
    key: PRNG key.
    init: one of :data:`DUMMY_INITS`.
    shape: (N, H, W, C) images, or (N, ..., C) any input whose last axis the bounds index (text:
      (N, T, dim) embeddings); ``"pattern"`` needs images.
    label_shape: the logits of one example, K or (K,) for a classifier, (T, V) for a language model;
      None when labels are not optimised.
    bounds: (lo, hi) of the valid input range in the model's input space, scalars or (C,).
    gamma: DLM's initial scale γ: adds ``log_gamma`` = log γ (``None``: no γ).
  """
  kx, ky = jax.random.split(key)
  lo, hi = (jnp.broadcast_to(jnp.asarray(b, dtype), shape[-1:]) for b in bounds)
  if init == "normal":
    x = jax.random.normal(kx, shape, dtype)
  elif init == "uniform":
    x = lo + (hi - lo) * jax.random.uniform(kx, shape, dtype)
  elif init == "constant":
    x = jnp.broadcast_to((lo + hi) / 2, shape).astype(dtype)
  elif init == "pattern":
    if len(shape) != 4:
      raise ValueError(f"the 'pattern' initialisation tiles images (N, H, W, C), not shape {shape}")
    n, h, w, c = shape
    tile = jax.random.normal(kx, (n, PATTERN_SIZE, PATTERN_SIZE, c), dtype)
    reps = (1, -(-h // PATTERN_SIZE), -(-w // PATTERN_SIZE), 1)
    x = jnp.tile(tile, reps)[:, :h, :w, :]
  else:
    raise ValueError(f"unknown dummy init {init!r}; choose one of {', '.join(DUMMY_INITS)}")
  dummy = {"x": x}
  if label_shape is not None:
    label_shape = (label_shape,) if isinstance(label_shape, int) else tuple(label_shape)
    dummy["label_logits"] = jax.random.normal(ky, (shape[0], *label_shape), dtype)
  if gamma is not None:
    dummy["log_gamma"] = jnp.full((), math.log(gamma), dtype)
  return dummy


@functools.partial(once, static_argnums=(1, 2, 3, 4, 5, 7, 8))
def _init_restarts(key, restarts, candidates, init, shape, label_shape, bounds, dtype, gamma):
  """Every run's initial dummy data, stacked (restart r's init repeated for each of the
  ``candidates`` label orders, from ``jax.random.split(key, restarts)[r]``), as one program."""
  keys = jnp.repeat(jax.random.split(key, restarts), candidates, axis=0)
  return jax.vmap(lambda kr: init_dummy(kr, init, shape, label_shape, bounds, dtype, gamma=gamma))(keys)


def _weight_schedule(attack: Attack) -> str | None:
  """The :func:`gradjax.distances.depth_weights` schedule ``attack`` weights its layers by, or None."""
  if attack.layer_weights is None and attack.distance.startswith("gaussian_kernel"):
    return "inverse"  # SAPAG's Q_l = 1/(l+1)
  return attack.layer_weights


def depth_order(attack: Attack, apply_fn: Callable, observation: Observation, example):
  """The modules' call order (:func:`gradjax.distances.module_call_order` on ``example``, one input of
  shape (1, ...)) when ``attack`` weighs its layers by depth or matches them stepwise, else None."""
  if attack.stepwise is None and _weight_schedule(attack) is None:
    return None
  return distances.module_call_order(apply_fn, observation.variables, example)


def layer_weights(attack: Attack, observation: Observation, order=None):
  """Per-leaf distance weights of ``attack`` (a pytree of scalars), or None for unweighted.

  Depth is the modules' call ``order`` (:func:`gradjax.distances.module_call_order`; without it, the
  insertion order of ``observation.variables["params"]``, which a model built under ``jit`` has
  lost); computed here, outside ``jit``. ``gaussian_kernel`` defaults to SAPAG's Q_l = 1/(l+1).
  """
  schedule = _weight_schedule(attack)
  if schedule is None:
    return None
  w = distances.depth_weights(observation.variables["params"], schedule, order=order)
  return jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), w)


def reconstruct(attack: Attack, apply_fn: Callable, observation: Observation, key: jax.Array, *,
                input_shape: tuple[int, ...], bounds=(0.0, 1.0), restarts: int = 1,
                permutations: int = 1, permutation_seed: int = 0, label_support=None,
                execution: solvers.Execution = solvers.Execution()) -> Reconstruction:
  """Reconstructs the client's data behind ``observation``.

  Args:
    attack: e.g. ``get_attack("dlg")``.
    apply_fn: the model, ``apply_fn(variables, x, train) -> logits``.
    observation: what the attacker observed (see :mod:`gradjax.clients`).
    key: PRNG key; restart r starts from ``jax.random.split(key, restarts)[r]``.
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
    label_support: int class ids that joint soft labels may take (the others get probability 0), e.g.
      the tokens an embedding gradient reveals (:func:`gradjax.text.token_bag`); ``None``: all.
    execution: how the restarts × candidates run (:class:`gradjax.solvers.Execution`: strategy,
      chunk, successive halving, sharding over devices, progress callback and monitor).
  """
  check_observation(observation)
  if restarts < 1:
    raise ValueError(f"restarts must be positive, got {restarts}")
  if len(input_shape) < 1:
    raise ValueError(f"input_shape must be the shape of one example, e.g. (H, W, C), got {input_shape}")
  n = observation.num_samples
  dtype = jnp.result_type(*jax.tree.leaves(observation.variables["params"]))
  logits = jax.eval_shape(lambda: apply_fn(observation.variables, jnp.zeros((1, *input_shape), dtype),
                                           observation.train))
  num_classes = logits.shape[-1]
  label_mask = None
  if label_support is not None:
    if attack.labels != "joint":
      raise ValueError("label_support restricts joint soft labels; this attack's labels are "
                       f"{attack.labels!r}")
    support = np.asarray(label_support).reshape(-1)
    if support.size == 0 or not np.issubdtype(support.dtype, np.integer) or support.min() < 0 \
        or support.max() >= num_classes:
      raise ValueError(f"label_support must be a non-empty set of class ids in [0, {num_classes})")
    label_mask = jnp.asarray(np.isin(np.arange(num_classes), support))
  if attack.labels == "joint":
    known = None
  elif attack.labels == "known":
    if observation.labels is None:
      raise ValueError("attack uses known labels but the observation carries none")
    known = jnp.asarray(observation.labels)
  elif attack.labels == "hfginv":
    raise ValueError("labels 'hfginv' read auxiliary images: infer them with gradjax.labels.hfginv, "
                     "then attack observation.replace(labels=...) with labels='known'")
  else:
    known = jnp.asarray(labels_lib.infer(observation, attack.labels))
  lo, hi = (np.broadcast_to(np.asarray(b, dtype), input_shape[-1:]) for b in bounds)
  if not np.all(lo < hi):
    raise ValueError(f"bounds must satisfy lo < hi, got {bounds}")
  lo, hi = jnp.asarray(lo), jnp.asarray(hi)
  if permutations < 1:
    raise ValueError(f"permutations must be positive, got {permutations}")
  if permutations > 1:
    local = observation.local
    if known is None:
      raise ValueError("a permutation search needs known or inferred labels, not joint ones")
    if attack.objective != "replay" or local is None or (local.batch_size or n) == n:
      raise ValueError("a permutation search needs the replay objective and a client with more than "
                       "one local mini-batch (the label order changes nothing otherwise)")
  if known is None or known.ndim > 1:  # joint labels, or a language model's (N, T) targets
    orders = np.arange(n, dtype=np.int32)[None]
  else:
    local = observation.local
    orders = permutations_lib.candidates(np.asarray(known), local and local.batch_size,
                                         permutations, permutation_seed)
  k = orders.shape[0]
  # Depth from the model's call order, not the dicts' (sorted) order.
  order = depth_order(attack, apply_fn, observation, np.zeros((1, *input_shape), dtype))
  weights = layer_weights(attack, observation, order)
  for name, _, _ in attack.priors:
    missing = [c for c in getattr(priors_lib.PRIORS[name], "needs", ()) if c not in observation.variables]
    if missing:
      raise ValueError(f"prior {name!r} reads the model's {', '.join(missing)} (a BatchNorm network's "
                       "running statistics); this model has none")
  positions = None
  if attack.stepwise is not None:
    positions = jax.tree.map(lambda i: jnp.asarray(i, jnp.int32),
                             distances.leaf_positions(observation.variables["params"], order))
  init = _init_restarts(key, restarts, k, attack.init, (n, *input_shape),
                        tuple(logits.shape[1:]) if known is None else None, (lo, hi), dtype,
                        attack.gamma.init if attack.objective == "dlm" else None)
  data = MatchingData(observation, known, (lo, hi), weights, label_mask, positions)
  state = solvers.run(_solver(attack, apply_fn), init, data, iterations=attack.iterations,
                      execution=execution, restart_data=jnp.asarray(np.tile(orders, (restarts, 1))))
  state = solvers.fetch(state)
  losses = np.where(np.isfinite(state.best_loss), state.best_loss, np.inf)
  if not np.isfinite(losses).any():
    raise FloatingPointError("every restart diverged before its first finite objective value")
  best = int(np.argmin(losses))
  x_restarts = np.asarray(state.best_params["x"])
  order = orders[best % k]
  if known is None:
    label_logits = np.asarray(state.best_params["label_logits"][best])
    if label_mask is not None:
      label_logits = np.where(np.asarray(label_mask), label_logits, -np.inf)
    labels = np.argmax(label_logits, axis=-1)
  else:
    labels = np.asarray(known)[order]
  return Reconstruction(x=x_restarts[best], labels=labels, loss=float(losses[best]),
                        best_restart=best, restart_losses=losses,
                        restart_alive=np.asarray(state.alive), x_restarts=x_restarts,
                        iterations=np.asarray(state.iterations),
                        evaluations=np.asarray(state.evaluations),
                        dummy=jax.tree.map(lambda v: np.asarray(v[best]), state.best_params),
                        permutation=order, candidates=orders)
