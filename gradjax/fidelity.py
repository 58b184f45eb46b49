"""Fidelity of a captured update: does the declared model and recipe reproduce what the client sent?

An attack on a captured update is only as good as the auditor's description of the client: a ReLU
network attacked as a sigmoid one, inputs normalised by the client but not by the attack, BatchNorm in
the other mode, a summed loss, another learning rate or number of local steps. Each of these leaves
an attack that cannot match the update, which reads as "no leak" though the system leaks. This
module checks the description before any attack runs:

* :func:`check` (the auditor holds the client's examples, e.g. its own deployment): recompute the
  update in JAX from the imported weights and the declared recipe (:class:`Recipe`) and compare it
  with the captured one leaf by leaf (:func:`compare`: relative error ‖u − c‖ / ‖c‖ and cosine). Beyond
  :data:`TOLERANCE` the check fails; :func:`diagnose` then recomputes the update under each
  alternative recipe it is given and names the ones that reproduce the capture.
* :func:`head_features` (no data needed): for one example, or the zeros of a batch, the inputs of
  the last dense layer read off its weight and bias gradients (∂L/∂W_jc = h_j δ_c, ∂L/∂b_c = δ_c, so
  h = ∂L/∂W_:c / ∂L/∂b_c, Geiping et al. 2020, Prop. 3.1); :func:`activation_check` tests them
  against the range of the activation the model declares before its head (a sigmoid never gives 0
  or 1.3, a ReLU never −0.2).
* :func:`kind_check` (no data needed): a file whose declared kind is mistaken (weights read as a
  gradient, a gradient read as weights) leaves an update close to the weights themselves.
* :func:`check_capture` runs these on a captured update before an attack, with the alternatives a
  zoo model offers (:func:`alternatives`); the pipeline refuses a capture that fails
  (:class:`CaptureMismatch`) unless forced.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import clients, data, defenses, interop, models
from gradjax.compilation import device_array
from gradjax.losses import cross_entropy
from gradjax.observation import Observation

# A recomputed update reproduces a capture when the relative error over all leaves is at most
# TOLERANCE[0] and in every leaf at most TOLERANCE[1]. PyTorch and XLA differ by float32 rounding:
# measured (tests/test_fidelity.py) at most 1e-4 over all leaves for a gradient and a few local steps;
# each mismatch the module names moves it above 0.1.
TOLERANCE = (1e-2, 5e-2)

LOSS_REDUCTIONS = ("mean", "sum")


class Recipe(NamedTuple):
  """How the client computed its update from its examples.

  apply_fn: the model, ``apply_fn(variables, x, train) -> logits``, its input in the client's
    normalised space.
  normalize: maps [0, 1] images (N, H, W, C) to the model's input (the client's normalisation).
  train: BatchNorm on batch statistics (training mode).
  local: FedAvg's local training (:class:`gradjax.clients.LocalTraining`), or ``None`` for a FedSGD
    gradient.
  reduction: the loss over the batch: ``"mean"`` (PyTorch's default) or ``"sum"``.
  relayout: another reading of the captured files' layouts, a function of a params tree applied to
    the server's parameters and to the captured update alike before they are compared (e.g. a
    linear layer's inputs flattened in another order); ``None``: as imported.
  defense: the deterministic defense the client applied to its update
    (:class:`gradjax.defenses.Defense`: pruning, clipping, rounding), applied to the recomputed
    update too; ``None``: none.
  """

  apply_fn: Callable
  normalize: Callable
  train: bool = False
  local: clients.LocalTraining | None = None
  reduction: str = "mean"
  relayout: Callable | None = None
  defense: Callable | None = None


def _recompute(recipe: Recipe, observation: Observation, x, y) -> "Comparison":
  """:func:`simulate` under ``recipe`` against the capture, both read with ``recipe.relayout``."""
  variables, captured = observation.variables, observation.gradient
  if recipe.relayout is not None:
    variables = {**variables, "params": recipe.relayout(variables["params"])}
    captured = recipe.relayout(captured)
  return compare(simulate(recipe, variables, x, y), captured)


def _summed_cross_entropy(logits, targets):
  """The cross entropy summed over the batch (PyTorch's ``reduction="sum"``)."""
  return cross_entropy(logits, targets) * logits.shape[0]


def simulate(recipe: Recipe, variables, x, y):
  """The update the client of ``recipe`` sends for images ``x`` (N, H, W, C) in [0, 1] and int labels
  ``y`` (N,): the gradient (FedSGD), or W_t − W_{t+1} after local SGD (FedAvg)."""
  if recipe.reduction not in LOSS_REDUCTIONS:
    raise ValueError(f"unknown loss reduction {recipe.reduction!r}; choose one of "
                     f"{', '.join(LOSS_REDUCTIONS)}")
  loss_fn = _summed_cross_entropy if recipe.reduction == "sum" else cross_entropy
  # Normalised on the host: on the device each of its two operations compiles a program alone.
  inputs = device_array(np.asarray(recipe.normalize(np.asarray(x, np.float32)), np.float32))
  if recipe.local is None:
    observation = clients.fedsgd(recipe.apply_fn, variables, inputs, y, train=recipe.train,
                                 loss_fn=loss_fn)
  else:
    observation = clients.fedavg(recipe.apply_fn, variables, inputs, y, recipe.local,
                                 train=recipe.train, loss_fn=loss_fn)
  if recipe.defense is not None:
    observation = recipe.defense(observation)
  return observation.gradient


def _path(p) -> str:
  return jax.tree_util.keystr(p)


class Comparison(NamedTuple):
  """A recomputed update against the captured one.

  relative_error: ‖u − c‖ / ‖c‖ over all leaves (u recomputed, c captured).
  cosine: ⟨u, c⟩ / (‖u‖ ‖c‖) over all leaves.
  scale: ‖c‖ / ‖u‖ (a learning rate or loss reduction off by a factor shows as cosine 1, scale ≠ 1).
  layers: per leaf (its key path), ``{"relative_error", "cosine"}``.
  """

  relative_error: float
  cosine: float
  scale: float
  layers: dict

  def within(self, tolerance: tuple[float, float] = TOLERANCE) -> bool:
    """Whether the recomputation reproduces the capture within ``(overall, per leaf)`` tolerances."""
    return (self.relative_error <= tolerance[0]
            and all(v["relative_error"] <= tolerance[1] for v in self.layers.values()))

  def worst_layer(self) -> tuple[str, float]:
    """(key path, relative error) of the leaf reproduced worst."""
    path = max(self.layers, key=lambda k: self.layers[k]["relative_error"])
    return path, self.layers[path]["relative_error"]


def _stats(u: np.ndarray, c: np.ndarray) -> tuple[float, float, float, float]:
  """(‖u − c‖², ‖c‖², ‖u‖², ⟨u, c⟩) in float64."""
  u, c = np.asarray(u, np.float64).ravel(), np.asarray(c, np.float64).ravel()
  return float(np.sum((u - c) ** 2)), float(c @ c), float(u @ u), float(u @ c)


def _ratio(num: float, den: float) -> float:
  """num / den with 0/0 = 0 and x/0 = a large finite number (results stay JSON-ready)."""
  if den > 0:
    return num / den
  return 0.0 if num == 0 else 1e30


LEAF_FLOOR = float(np.sqrt(np.finfo(np.float32).eps))
"""A leaf's relative error is read against at least this share of the whole captured update's norm:
a leaf whose captured part lies below float32's resolution of the whole (a convolution's bias in
front of a training-mode BatchNorm, whose gradient is 0 but for rounding) has no relative error of
its own to check."""


def compare(recomputed, captured) -> Comparison:
  """:class:`Comparison` of two trees of the same structure (float64 sums). A leaf's relative error
  is ‖u_l − c_l‖ / max(‖c_l‖, :data:`LEAF_FLOOR` · ‖c‖)."""
  leaves_u = jax.tree_util.tree_leaves_with_path(recomputed)
  leaves_c = jax.tree.leaves(captured)
  if len(leaves_u) != len(leaves_c):
    raise ValueError("the recomputed and the captured update have different trees")
  stats = [(_path(path), _stats(u, c)) for (path, u), c in zip(leaves_u, leaves_c)]
  total = np.sum([s for _, s in stats], axis=0) if stats else np.zeros(4)
  floor = LEAF_FLOOR ** 2 * total[1]
  layers = {path: {"relative_error": float(np.sqrt(_ratio(s[0], max(s[1], floor)))),
                   "cosine": float(_ratio(s[3], np.sqrt(s[1] * s[2])))} for path, s in stats}
  diff, cc, uu, uc = total
  return Comparison(relative_error=float(np.sqrt(_ratio(diff, cc))),
                    cosine=float(_ratio(uc, np.sqrt(cc * uu))),
                    scale=float(np.sqrt(_ratio(cc, uu))), layers=layers)


class Check(NamedTuple):
  """The outcome of :func:`check`: ``ok``, the declared recipe's :class:`Comparison`, the
  ``tolerance`` and, when it failed, ``causes``: the alternatives that reproduce the capture
  (name -> their Comparison), best first, and ``explained``: a one-line account."""

  ok: bool
  comparison: Comparison
  tolerance: tuple[float, float]
  causes: dict
  explained: str

  def as_dict(self) -> dict:
    return {"ok": self.ok, "tolerance": list(self.tolerance), **self.comparison._asdict(),
            "causes": {k: {"relative_error": v.relative_error, "cosine": v.cosine}
                       for k, v in self.causes.items()},
            "explained": self.explained}


def diagnose(observation: Observation, alternatives: dict[str, Recipe], x, y,
             tolerance: tuple[float, float] = TOLERANCE) -> dict[str, Comparison]:
  """The alternatives (name -> :class:`Recipe`) whose recomputed update reproduces the capture
  within ``tolerance``, best first. A recipe that cannot run (e.g. a schedule that does not divide
  the batch) is skipped. ``x``: (N, H, W, C) the client's images in [0, 1]; ``y``: (N,) their int
  labels."""
  found = {}
  for name, recipe in alternatives.items():
    try:
      comparison = _recompute(recipe, observation, x, y)
    except ValueError:
      continue
    if comparison.within(tolerance):
      found[name] = comparison
  return dict(sorted(found.items(), key=lambda kv: kv[1].relative_error))


def check(observation: Observation, declared: Recipe, x, y,
          alternatives: Callable[[Comparison], dict[str, Recipe]] | None = None,
          tolerance: tuple[float, float] = TOLERANCE) -> Check:
  """Recomputes the captured ``observation`` from the client's examples under the ``declared``
  recipe, and, when that fails, under each of the alternatives (name -> Recipe, the name a phrase
  such as ``"activation relu (declare act=relu)"``).

  Args:
    observation: the captured update (its ``variables`` are the server's weights).
    declared: the recipe the auditor declared.
    x: (N, H, W, C) the client's images in [0, 1]; y: (N,) their int labels.
    alternatives: given the declared recipe's :class:`Comparison` (whose ``scale`` suggests a
      learning rate), the recipes that differ from ``declared`` in one known way; built only when
      the check fails.
    tolerance: (over all leaves, per leaf) bounds on the relative error.
  """
  comparison = _recompute(declared, observation, x, y)
  if comparison.within(tolerance):
    return Check(True, comparison, tolerance, {}, "")
  causes = diagnose(observation, alternatives(comparison) if alternatives else {}, x, y, tolerance)
  path, err = comparison.worst_layer()
  what = (f"relative error {comparison.relative_error:.3g} over all layers (cosine "
          f"{comparison.cosine:.3f}), {err:.3g} in {path}")
  if causes:
    explained = f"{what}; reproduced by: " + "; ".join(
        f"{name} (relative error {c.relative_error:.2g})" for name, c in causes.items())
  elif comparison.cosine > 1 - 1e-4 and abs(comparison.scale - 1) > tolerance[0]:
    explained = (f"{what}; the update is {comparison.scale:.4g} times the recomputed one in the same "
                 "direction: a learning rate or loss scale other than declared")
  else:
    explained = (f"{what}; no single known mismatch (activation, BatchNorm mode, loss reduction, "
                 "the named and common normalisations, learning rate, local steps, momentum) explains "
                 "it. Not "
                 "tested: a defense the client applied without declaring it (declare defense=), other "
                 "normalisation constants (declare normalization=MEAN/STD), data augmentation, "
                 "several mismatches at once. Check the model against its PyTorch twin (README), the "
                 "tensor layouts, --config.model.rename, and that the images and labels are the client's "
                 "(its examples from --index on, as many as the capture's num_samples declares)")
  return Check(False, comparison, tolerance, causes, explained)


# --- without data: the head's inputs ---------------------------------------------------------------

# The values each activation can output (a ReLU's zeros are exact; a sigmoid's or tanh's bounds are
# never reached in float32 short of saturation).
ACTIVATION_RANGES = {"sigmoid": (0.0, 1.0), "tanh": (-1.0, 1.0), "relu": (0.0, np.inf),
                     "softplus": (0.0, np.inf), "elu": (-1.0, np.inf), "gelu": (-0.17, np.inf),
                     "leaky_relu": (-np.inf, np.inf)}
EXACT_ZEROS = ("relu",)  # activations that output exact zeros for a finite share of inputs


def head_features(observation: Observation, head: str = "head") -> tuple[np.ndarray | None, float]:
  """What the last dense layer's gradient reveals of its inputs, without data.

  Returns ``(h, zero_fraction)``: ``h`` (F,) the head's input features for a batch of one
  (h = ∂L/∂W_:c / ∂L/∂b_c for the class c with the largest |∂L/∂b_c|), else ``None``;
  ``zero_fraction`` the share of the F inputs whose weight-gradient rows are exactly zero for every
  class (an input that is 0 for every example of the batch, as a ReLU gives).
  Only meaningful for a gradient, or an update of one local step (a scaled gradient).
  """
  params = observation.gradient
  if head not in params or "kernel" not in params[head]:
    return None, 0.0
  kernel = np.asarray(params[head]["kernel"], np.float64)  # (F, K)
  zero_fraction = float(np.mean(np.all(kernel == 0.0, axis=1)))
  h = None
  if observation.num_samples == 1 and "bias" in params[head]:
    bias = np.asarray(params[head]["bias"], np.float64)
    c = int(np.argmax(np.abs(bias)))
    if abs(bias[c]) > 0:
      h = kernel[:, c] / bias[c]
  return h, zero_fraction


def activation_check(observation: Observation, act: str) -> str | None:
  """``None`` when the head's inputs (:func:`head_features`) can come from activation ``act``, else
  a one-line account of why not. For models whose head reads the activation's output directly
  (flattened or pooled), a gradient or one-step update."""
  low, high = ACTIVATION_RANGES[act]
  h, zeros = head_features(observation)
  if zeros >= 0.05 and act not in EXACT_ZEROS:
    return (f"{zeros:.0%} of the last layer's inputs are exactly zero for the whole batch, as after a "
            f"ReLU; a {act} never outputs 0")
  if h is not None:
    span = max(1.0, float(np.max(np.abs(h))))
    slack = 1e-3 * span
    lo, hi = float(np.min(h)), float(np.max(h))
    if lo < low - slack or hi > high + slack:
      return (f"the last layer's inputs, read off its gradient, span [{lo:.3g}, {hi:.3g}]; a {act} "
              f"outputs only values in [{low:g}, {high:g}]")
  return None


# Bounds past which a file is not of its declared kind (:func:`kind_check`). A client's weights after
# a round lie near the weights sent: a file of kind gradient or update within KIND_DISTANCE of them
# (relative) holds weights, as no gradient copies the weights. A file of kind weights with at most
# KIND_DISTANCE of their norm, or at most KIND_COSINE of cosine with them, holds a gradient or an
# update: a round that halves the model's norm or turns its weights nearly orthogonal is no client's.
# The cosine is read only up to KIND_NORMS times their norm: a round that blew up (‖W_{t+1}‖ ≫ ‖W_t‖)
# turns the weights away too.
KIND_DISTANCE = 0.5
KIND_COSINE = 0.2
KIND_NORMS = 2.0


def kind_check(observation: Observation, kind: str, noisy: bool = False) -> str | None:
  """``None``, or why the captured file is not of the declared ``kind`` (``gradient``, ``update`` or
  ``weights``, the metadata's). No data needed.

  ``observation.gradient`` is what the declaration made of the file F: u = F for a gradient or an
  update W_t − W_{t+1}, u = W_t − F for weights. Over all parameters (flattened), a gradient or
  update F with ‖F − W_t‖ <= :data:`KIND_DISTANCE` ‖W_t‖ is the client's weights W_{t+1}; weights F
  with ‖F‖ <= :data:`KIND_DISTANCE` ‖W_t‖, or ‖F‖ <= :data:`KIND_NORMS` ‖W_t‖ and cos(F, W_t) <=
  :data:`KIND_COSINE`, are a gradient or an update (whose norm and direction are unlike the
  weights'; a round that diverged may turn the weights away, but lengthens them). ``noisy``: the
  client declares noise (a defense or DP-SGD), which moves a file away from the weights and turns it
  from their direction: the cosine is not read (the distances, which noise only lengthens, still
  are)."""
  u, w = (np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(tree)])
          for tree in (observation.gradient, observation.variables["params"]))
  norm = float(np.linalg.norm(w))
  if not norm or not np.isfinite(norm) or not np.all(np.isfinite(u)):
    return None
  if kind == "weights":
    f = w - u
    ratio = float(np.linalg.norm(f)) / norm
    cosine = float(f @ w) / (float(np.linalg.norm(f)) * norm) if ratio else 0.0
    if ratio > KIND_DISTANCE and (noisy or ratio > KIND_NORMS or cosine > KIND_COSINE):
      return None
    return (f"the file declared kind=weights is unlike the weights sent ({ratio:.2g} times their "
            f"norm, cosine {cosine:.2g}), as a client's weights after training are not: it holds a "
            f"gradient (declare kind=gradient) or an update W_t − W_(t+1) (kind=update)")
  distance = float(np.linalg.norm(u - w)) / norm
  if distance > KIND_DISTANCE:
    return None
  return (f"the file declared kind={kind} lies within {distance:.2g} (relative) of the weights sent: "
          f"it holds the client's weights after training (declare kind=weights)")


def negative_classes(observation: Observation,
                     bias: tuple[str, ...] = ("head", "bias")) -> list[int] | None:
  """The classes whose head-bias update is negative beyond float32 rounding: each is a class of the
  batch (see :func:`label_check`). ``None`` where the model has no head bias at ``bias``.

  For the cross entropy of softmax probabilities p_n, ∂L/∂b_c = Σ_n w_n (p_nc − y_nc) with w_n > 0
  (1/N for a mean, 1 for a sum, per-example clipping's factors): a class no example holds has only
  the terms w_n p_nc ≥ 0. A FedAvg update W_t − W_{t+1} is η Σ_s v_s with SGD's momentum buffers v_s
  non-negative combinations of such gradients, and deterministic defenses (clipping, pruning,
  rounding to fp16 / bf16 / int8's symmetric cells) keep a sign. So a negative bias entry, beyond the
  float32 rounding of W_t − W_{t+1} (ε₃₂ (2|b_c| + |u_c|) per step, plus ε₃₂ max|u|), names a class
  of the batch. Neither noise, label smoothing nor weight decay keeps this (the callers skip the
  first)."""
  node = observation.gradient
  weights = observation.variables["params"]
  for key in bias:
    if not hasattr(node, "keys") or key not in node or key not in weights:
      return None
    node, weights = node[key], weights[key]
  u = np.asarray(node, np.float64)
  if u.ndim != 1:
    return None
  eps = float(np.finfo(np.float32).eps)
  tolerance = eps * np.max(np.abs(u), initial=0.0)
  if observation.threat_model != "fedsgd":
    local = observation.local
    # Unknown local training: up to 10 epochs of mini-batches of one example.
    steps = local.steps(observation.num_samples) if local is not None else 10 * observation.num_samples
    tolerance = tolerance + steps * eps * (2 * np.abs(np.asarray(weights, np.float64)) + np.abs(u))
  return np.flatnonzero(u < -tolerance).tolist()


def label_check(observation: Observation, bias: tuple[str, ...] = ("head", "bias")) -> str | None:
  """``None`` when the labels ``observation`` declares can have produced its update's head bias, else
  a one-line account of the classes they miss (:func:`negative_classes`: each a class of the
  batch, which the declared labels must hold). No data needed. Not run without declared labels (or
  on text, whose labels are (N, T)) or without a head bias at ``bias``."""
  labels = observation.labels
  if labels is None or np.ndim(labels) != 1:
    return None
  negative = negative_classes(observation, bias)
  if negative is None:
    return None
  declared = set(np.asarray(labels).tolist())
  missing = [c for c in negative if c not in declared]
  if not missing:
    return None
  return (f"the update's head bias is negative for class{'es' if len(missing) > 1 else ''} "
          f"{', '.join(map(str, missing))}, which no declared label holds: cross entropy leaves a "
          f"class no example has a non-negative bias gradient, so the declared labels "
          f"{sorted(declared)} miss a class of the batch (or the client's loss or step is not plain "
          f"cross entropy and SGD: label smoothing, mixed targets, a FedAvg client's weight decay)")


def count_check(observation: Observation, bias: tuple[str, ...] = ("head", "bias")) -> str | None:
  """``None``, or why the update holds more examples than ``observation.num_samples``: its head bias
  names K classes of the batch (:func:`negative_classes`), which take at least K examples. No data
  needed (a capture that declares neither ``num_samples`` nor labels is read as one example)."""
  negative = negative_classes(observation, bias)
  if negative is None or len(negative) <= observation.num_samples:
    return None
  return (f"the update's head bias is negative for {len(negative)} classes "
          f"({', '.join(map(str, negative))}), each a class of the batch, so it holds at least "
          f"{len(negative)} examples, not "
          f"{observation.num_samples}: declare num_samples (or the labels); or the client's loss "
          f"or step is not plain cross entropy and SGD (label smoothing, mixed targets, weight decay)")


class CaptureMismatch(ValueError):
  """A captured update that the declared model and recipe do not reproduce."""


class ZeroUpdate(ValueError):
  """A captured update that carries nothing about the data (:func:`zero_update`)."""


def zero_update(observation: Observation) -> str | None:
  """``None``, or why the captured update carries nothing about the client's data: a gradient whose
  every value is 0, or a weight update W_t − W_{t+1} whose every value is 0 or within float32
  rounding of its weight (|u| <= ε₃₂ |w|, ε₃₂ = 2⁻²³: the weights came back as they were sent, up
  to a cast). Checked before anything reads the update: its zeros are no activation's."""
  return zero_arrays(jax.tree.leaves(observation.gradient),
                     jax.tree.leaves(observation.variables["params"]),
                     gradient=observation.threat_model == "fedsgd")


def zero_arrays(updates, weights, *, gradient: bool = False) -> str | None:
  """:func:`zero_update` on matching lists of arrays: ``updates`` (gradients when ``gradient``,
  else W_t − W_{t+1}) and the ``weights`` W_t."""
  if any(np.any(np.asarray(u) != 0) for u in updates):
    if gradient:
      return None
    eps = float(np.finfo(np.float32).eps)
    if any(np.any(np.abs(np.asarray(u, np.float64)) > eps * np.abs(np.asarray(w, np.float64)))
           for u, w in zip(updates, weights, strict=True)):
      return None
    return ("the update is zero up to float32 rounding of the weights: the client sent back the "
            "weights it received; nothing to attack")
  if gradient:
    return ("the gradient is zero in every tensor (the model fits the examples with certainty in "
            "float32, or nothing was trained); nothing to attack")
  return ("the update is zero in every tensor: the client sent back the weights it received, trained "
          "on nothing, or its step fell below the float32 rounding of its weights (a model that already "
          "fits its examples with certainty); nothing to attack")


def noisy(defense: str | None) -> bool:
  """Whether the defense spec adds noise (read as :func:`gradjax.defenses.parse` reads it: any
  spelling, case and alias)."""
  return bool(defense) and any(p.head in defenses.NOISY
                               for p in defenses.parts(defenses.parse(defense)))


def check_capture(model: models.Model, observation: Observation, batch: data.Dataset | None,
                  norm: data.Normalization, defense: str | None = None, dp_sgd: bool = False,
                  order_known: bool = True, kind: str | None = None,
                  count_declared: bool = True) -> tuple[dict, list[str]]:
  """Checks a captured ``observation`` against the declared ``model`` (its activation) and input
  normalisation ``norm`` before any attack: :func:`activation_check` (a gradient or a one-step
  update), and, with the client's examples ``batch``, :func:`check` against the recipe's
  alternatives (:func:`alternatives`); without them, the declared labels against the head's bias
  (:func:`label_check`; not under noise). Returns (``checks`` for the run's results, ``problems``: one
  phrase per failed check, naming the likely cause).

  ``defense``: the spec of a defense the capture declares its client applied. The activation is
  then not read off the update (pruning's zeros and noise hide it); a deterministic defense
  (pruning, clipping, rounding) is applied to the recomputed update before the comparison, and
  under noise the update is not recomputed. ``dp_sgd``: the client ran DP-SGD (per-example
  clipping, noise): neither the activation nor the update is checked. ``order_known``: whether the
  ``batch``'s order is the one the client trained in; without it (a capture whose labels are a
  multiset) an update of several mini-batches, which depends on that order, is not recomputed.
  ``kind``: the file's declared kind (``gradient``, ``update``, ``weights``), checked first
  (:func:`kind_check`; ``None``: not checked); a mistaken one stops the other checks.
  ``count_declared``: False where the capture gave neither ``num_samples`` nor labels (its count
  is the default, one): then :func:`count_check` reads the head bias for more (a count declared is
  taken as given: a file stored below float32, weight decay or label smoothing can turn an absent
  class's bias update negative).

  Raises :class:`ZeroUpdate` for an update that carries nothing (:func:`zero_update`)."""
  zero = zero_update(observation)
  if zero:
    raise ZeroUpdate(zero)
  checks, problems = {}, []
  noised = dp_sgd or noisy(defense)
  if kind is not None:
    why = kind_check(observation, kind, noisy=noised)
    checks["kind"] = {"declared": kind, "ok": why is None, "explained": why}
    if why:  # every other check would read the file as what it is not
      return checks, [why]
  applied = None
  head = observation.gradient.get("head", {}) if hasattr(observation.gradient, "get") else {}
  if not count_declared and not noised and "bias" in head:  # what count_check reads
    why = count_check(observation)
    if why:  # the attack's batch would be too small for the update: nothing else reads right
      checks["count"] = {"declared": observation.num_samples, "ok": False, "explained": why}
      return checks, [why]
    checks["count"] = {"declared": observation.num_samples, "ok": True, "explained": None}
  if (batch is None and not noised and observation.labels is not None
      and np.ndim(observation.labels) == 1 and "bias" in head):  # what label_check reads
    why = label_check(observation)
    checks["labels"] = {"ok": why is None, "explained": why}
    if why:
      problems.append(why)
  if dp_sgd:
    why = ("not checked: the client declares DP-SGD, whose per-example clipping and noise change "
           "its update")
    return {**checks, "activation": {"ok": None, "explained": why},
            "fidelity": {"ok": None, "explained": why}}, []
  if defense:
    why = f"not checked: the client declares the defense {defense}, which changes its update"
    checks["activation"] = {"ok": None, "explained": why}
    if noisy(defense):
      checks["fidelity"] = {"ok": None, "explained": why + " at random"}
      return checks, problems
    applied = defenses.parse(defense)
  module = getattr(model.apply_fn, "module", None)
  act = getattr(module, "act", None)
  local = observation.local
  scaled_gradient = observation.threat_model == "fedsgd" or (
      local is not None and local.steps(observation.num_samples) == 1)
  if act in ACTIVATION_RANGES and scaled_gradient and not defense:
    why = activation_check(observation, act)
    checks["activation"] = {"declared": act, "ok": why is None, "explained": why}
    if why:
      problems.append(f"{why} (declare the client's activation: --config.model.act or the metadata's act)")
  if batch is None:
    return checks, problems
  if observation.labels is not None and sorted(np.asarray(observation.labels).tolist()) != sorted(
      batch.y.tolist()):
    problems.append(f"the capture's labels {np.asarray(observation.labels).tolist()} are not the "
                    f"ground truth's {batch.y.tolist()} (are --dataset and --index the client's?)")
  if observation.threat_model != "fedsgd" and local is None:
    checks["fidelity"] = {"ok": None, "explained": "not checked: the local training is unknown"}
    return checks, problems
  mini_batches = local is not None and (local.batch_size or observation.num_samples) < observation.num_samples
  if mini_batches and not order_known:
    checks["fidelity"] = {"ok": None, "explained": (
        "not checked: the capture's labels are a multiset (label_order=multiset), so the order the "
        "client took its examples in, on which an update of several mini-batches depends, is unknown")}
    return checks, problems
  declared = Recipe(model.apply_fn, functools.partial(data.normalize, norm=norm), observation.train,
                    local, defense=applied)
  result = check(observation, declared, batch.x, batch.y,
                 alternatives=lambda c: alternatives(
                     declared, module, observation, norm, batch.x.shape[-1], c, _head_chw(model),
                     None if local is None else matching_learning_rate(declared, observation, batch.x,
                                                                        batch.y, c),
                     defense_spec=defense or None))
  checks["fidelity"] = result.as_dict()
  if not result.ok:
    order = ("; or the order the client took its examples in (a shuffling data loader): declare "
             "label_order=multiset, or give the examples in training order (gradjax audit's "
             "data_indices)") if mini_batches and not result.causes else ""
    problems.append(f"the update recomputed from the ground truth differs: {result.explained}{order}")
  return checks, problems


def _head_chw(model: models.Model) -> tuple[int, int, int] | None:
  """(C, H, W) of the map a zoo model flattens into its head (``None``: its head reads no flattened
  map, or the model has no PyTorch naming)."""
  try:
    mapping = interop.zoo_mapping(model)
  except ValueError:
    return None
  return next(e.chw for e in mapping.entries if e.path == ("params", "head", "kernel"))


def _flattened_hwc(params, chw):
  """``params`` with the head's kernel rows read as an (H, W, C) flattening where the import took
  PyTorch's (C, H, W) (:func:`gradjax.interop.to_gradjax` undone for the rows)."""
  head = params["head"]
  kernel = np.asarray(head["kernel"])[np.argsort(interop.chw_permutation(chw))]
  return {**params, "head": {**head, "kernel": jnp.asarray(kernel)}}


def matching_learning_rate(declared: Recipe, observation: Observation, x, y, comparison: Comparison,
                           steps: int = 10) -> float:
  """The local learning rate η at which the update recomputed under ``declared`` (a FedAvg recipe)
  has the captured one's norm, from the declared rate's ``comparison`` (scale s = ‖c‖ / ‖u(η₀)‖).

  One local step's update is η times a gradient: η₀ s, exact. Several steps' updates are no
  multiple of η: from η₁ = η₀ s, the root of log ‖u(η)‖ / ‖c‖ in log η, by secant steps inside
  the bracket once one is found (halving it where a secant leaves it or an update is not finite),
  up to ``steps`` recomputations; the rate of the norm closest to the capture's.
  ``x``: (N, H, W, C) the client's images in [0, 1]; ``y``: (N,) their int labels."""
  local = declared.local
  lr = local.learning_rate * comparison.scale
  if not (np.isfinite(lr) and lr > 0) or local.steps(observation.num_samples) == 1:
    return lr

  def gap(rate):  # log ‖u(η)‖ / ‖c‖; an update that is not finite is too large
    try:
      c = _recompute(declared._replace(local=local._replace(learning_rate=rate)), observation, x, y)
    except ValueError:
      return np.nan
    if not np.isfinite(c.relative_error) or not c.scale > 0:  # diverged: NaN or inf in the update
      return np.inf
    return -np.log(c.scale)

  tried = [(np.log(local.learning_rate), -np.log(comparison.scale))]
  t = np.log(lr)
  for _ in range(steps):
    g = gap(float(np.exp(t)))
    if np.isnan(g):
      break
    tried.append((t, g))
    if abs(g) < 1e-6:
      break
    below = [p for p in tried if p[1] < 0]
    above = [p for p in tried if p[1] > 0]
    if below and above:  # bracketed: a secant between the closest points, else the midpoint
      (t0, g0), (t1, g1) = max(below, key=lambda p: p[1]), min(above, key=lambda p: p[1])
      mid = 0.5 * (t0 + t1)
      t = t0 - g0 * (t1 - t0) / (g1 - g0) if np.isfinite(g1) else mid
      if not min(t0, t1) < t < max(t0, t1):
        t = mid
    else:  # a step of the ratio, as for one local step
      t = t - g
  return float(np.exp(min(tried[1:], key=lambda p: abs(p[1]))[0])) if len(tried) > 1 else lr


SCOPED = ("clip", "prune", "int8")  # defenses per layer or, with ':global', over the whole update


def scope_variants(spec: str | None) -> list[str]:
  """The defense ``spec`` (:func:`gradjax.defenses.parse`'s form) with one part of :data:`SCOPED`
  at a time taken the other way, per layer or ``:global``, as canonical specs: ``"clip:1"`` ->
  ``["clip:1.0:global"]``."""
  parts = defenses.parts(defenses.parse(spec)) if spec else ()
  out = []
  for i, p in enumerate(parts):
    if p.head not in SCOPED:
      continue
    other = p._replace(options=tuple(o for o in p.options if o != "global") if p.whole_tree
                       else (*p.options, "global"))
    out.append(",".join(q.spec for q in (*parts[:i], other, *parts[i + 1:])))
  return out


def alternatives(declared: Recipe, module, observation: Observation, norm: data.Normalization,
                 channels: int, comparison: Comparison,
                 flatten_chw: tuple[int, int, int] | None = None,
                 learning_rate: float | None = None,
                 defense_spec: str | None = None) -> dict[str, Recipe]:
  """Recipes that differ from ``declared`` in one known way, each named by what to declare instead:
  every other activation of ``module`` (a Flax module with an ``act`` field), the other BatchNorm
  mode, a summed loss, the head's inputs flattened in the other order (for a model that flattens a
  ``flatten_chw`` = (C, H, W) map), every named and common normalisation
  (:data:`gradjax.data.COMMON_NORMALIZATIONS`) that fits the ``channels``, and for
  FedAvg the local learning rate ``learning_rate`` (default: the one ``comparison.scale`` suggests,
  exact for one step; :func:`matching_learning_rate` for several), 1-5 epochs in every batch
  size that divides the examples, and momentum 0 or 0.9 (PyTorch's SGD default and the common
  choice) where the schedule takes several steps; of a declared deterministic ``defense_spec``, each
  part that clips, prunes or quantises per layer or over the whole update the other way
  (:func:`scope_variants`: PyTorch's ``clip_grad_norm_`` clips the whole gradient, gradjax's
  ``clip:C`` each layer)."""
  alts = {}
  for spec in scope_variants(defense_spec):
    alts[f"the defense {spec} (declare defense={spec})"] = declared._replace(
        defense=defenses.parse(spec))
  act = getattr(module, "act", None)
  if act is not None:
    for name in models.ACTIVATIONS:
      if name != act:
        alts[f"activation {name} (declare act={name})"] = declared._replace(
            apply_fn=models.make_apply_fn(module.clone(act=name)))
  if "batch_stats" in observation.variables:
    mode = not declared.train
    alts[f"BatchNorm in {'training' if mode else 'evaluation'} mode (declare train="
         f"{str(mode).lower()})"] = declared._replace(train=mode)
  alts["a summed loss (declare loss_reduction=sum)"] = declared._replace(reduction="sum")
  if flatten_chw is not None:
    alts["the last layer's inputs flattened in (H, W, C) order, not PyTorch's (C, H, W) (a layout: "
         "permute the linear layer's columns when exporting)"] = declared._replace(
             relayout=functools.partial(_flattened_hwc, chw=flatten_chw))
  for name in data.NORMALIZATION_NAMES + data.COMMON_NORMALIZATIONS:
    other = data.normalization(name)
    if other != norm and len(other.mean) in (1, channels):
      alts[f"normalisation {name} (declare normalization={name})"] = declared._replace(
          normalize=functools.partial(data.normalize, norm=other))
  local = declared.local
  if local is not None:
    lr = local.learning_rate * comparison.scale if learning_rate is None else learning_rate
    alts[f"local learning rate {lr:.4g} (declare local_lr={lr:.4g})"] = declared._replace(
        local=local._replace(learning_rate=lr))
    n = observation.num_samples
    for epochs in range(1, 6):
      for b in (d for d in range(1, n + 1) if n % d == 0):
        if (epochs, b) != (local.epochs, local.batch_size or n):
          alts[f"{epochs} local epochs in batches of {b} (declare local_epochs={epochs}, "
               f"local_batch_size={b})"] = declared._replace(
                   local=local._replace(epochs=epochs, batch_size=b))
    if local.steps(n) > 1:  # the first step's momentum buffer is its gradient: one step cannot tell
      for momentum in (0.0, 0.9):
        if momentum != local.momentum:
          alts[f"local momentum {momentum:g} (declare local_momentum={momentum:g})"] = (
              declared._replace(local=local._replace(momentum=momentum)))
  return alts
