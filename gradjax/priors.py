"""Image priors: regularisers ``prior(x) -> scalar`` added to the gradient-matching objective.

``x`` is an NHWC batch (N, H, W, C). A :class:`Prior` is one built term of the objective: the
function, its weight (a number, or a function of the step) and the step it starts at, evaluated for a
traced step under ``jit`` / ``vmap`` / ``lax.scan``; :func:`combine` sums several into one
``fn(x, step, network)``.

Most priors read the image alone. A :class:`NetworkPrior` also reads the attacked model
(:class:`Network`): the BatchNorm statistics prior of GradInversion (:func:`batch_norm_prior`)
compares the dummy batch's feature moments with the running statistics of the server's model.
GradInversion's group consistency (:func:`group_consistency`) reads the other restarts: it pulls each
restart towards their mean, over the restart driver's vmapped axis.

Conventions (they change published numbers, so they are explicit):

* ``total_variation(form="mean")``: mean|Δ_w x| + mean|Δ_h x|, Inverting Gradients' (Geiping et al.,
  2020) form, whose scale does not depend on the image size.
* ``total_variation(form="isotropic")``: mean (Δ_w x² + Δ_h x² + eps)^(β/2), after Mahendran &
  Vedaldi 2015 ("Understanding Deep Image Representations by Inverting Them"), who sum instead of
  averaging.
* |x| is written as x·sign(x), so its derivative at 0 is sign(0) = 0 as in PyTorch (``jnp.abs``'s is 1):
  a flat image region gets no TV gradient.
"""

import dataclasses
import functools
import math
import numbers
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gradjax.models import taps
from gradjax.sharding import RESTART_AXIS

PriorFn = Callable[..., jax.Array]
WeightFn = Callable[[jax.Array], jax.Array]

TV_FORMS = ("mean", "isotropic")


def _check_images(x) -> None:
  if jnp.ndim(x) != 4:
    raise ValueError(f"images must be (N, H, W, C), got shape {jnp.shape(x)}")


def total_variation(x, *, form: str = "mean", beta: float = 1.0, eps: float = 1e-8) -> jax.Array:
  """Total variation of an image batch. ``x``: (N, H, W, C) -> scalar.

  With forward differences Δ_w x = x[:, :, 1:] − x[:, :, :-1] (shape (N, H, W−1, C)) and
  Δ_h x = x[:, 1:] − x[:, :-1] (shape (N, H−1, W, C)):

  * ``form="mean"`` (Inverting Gradients, Geiping et al. 2020)::

      TV(x) = mean|Δ_w x| + mean|Δ_h x|

    each mean over all entries of its difference array. ``beta`` and ``eps`` are unused.

  * ``form="isotropic"`` (Mahendran & Vedaldi 2015, exponent β)::

      TV(x) = mean_{n,i,j,c} ((x[n,i,j+1,c] − x[n,i,j,c])² + (x[n,i+1,j,c] − x[n,i,j,c])² + eps)^(β/2)

    i, j over the (H−1, W−1) pixels that have both a right and a lower neighbour; channels are separate
    entries. ``eps`` > 0 keeps the gradient finite where both differences vanish (β ≤ 2), so a constant
    image scores eps^(β/2), not 0.
  """
  _check_images(x)
  if form not in TV_FORMS:
    raise ValueError(f"unknown TV form {form!r}; choose one of {', '.join(TV_FORMS)}")
  if x.shape[1] < 2 or x.shape[2] < 2:
    raise ValueError(f"total variation needs H, W >= 2, got shape {x.shape}")
  if form == "mean":
    dx = x[:, :, 1:, :] - x[:, :, :-1, :]
    dy = x[:, 1:, :, :] - x[:, :-1, :, :]
    return jnp.mean(dx * jnp.sign(dx)) + jnp.mean(dy * jnp.sign(dy))
  if not eps >= 0:
    raise ValueError(f"eps must be non-negative, got {eps}")
  corner = x[:, :-1, :-1, :]
  dx = x[:, :-1, 1:, :] - corner
  dy = x[:, 1:, :-1, :] - corner
  return jnp.mean((jnp.square(dx) + jnp.square(dy) + eps) ** (beta / 2))


def l2_norm(x) -> jax.Array:
  """Squared L2 norm per image, averaged over the batch: (1/N) Σ_{n,i,j,c} x[n,i,j,c]². ``x``: NHWC."""
  _check_images(x)
  return jnp.sum(jnp.square(x)) / x.shape[0]


def group_consistency(x) -> jax.Array:
  """GradInversion's group consistency (Yin et al., CVPR 2021, §3.3): each restart's images pulled
  towards the restarts' consensus, their pixel-wise mean x̄ = (1/R) Σ_r x_r, as a squared L2 norm per
  image averaged over the batch::

    R_group(x_r) = (1/N) Σ_n ‖x_{r,n} − sg(x̄_n)‖²

  x̄ is a constant of each step (stop-gradient), recomputed from the restarts' current images every
  evaluation. ``x``: one restart's (N, H, W, C) images; the mean is taken over the restart driver's
  vmapped restart axis (:data:`gradjax.sharding.RESTART_AXIS`), so the prior runs only there: several
  restarts under the ``"vmap"`` strategy, all of one label order. The paper registers every restart to
  the mean first (RANSAC-flow); here the slots are compared in place, without registration.
  """
  _check_images(x)
  try:
    mean = jax.lax.pmean(jax.lax.stop_gradient(x), RESTART_AXIS)
  except NameError:
    raise ValueError("the group-consistency prior compares restarts: it runs only inside vmapped "
                     "restarts (several restarts, strategy 'vmap')") from None
  return jnp.sum(jnp.square(x - mean)) / x.shape[0]


group_consistency.couples_restarts = True


# --- priors that read the network -----------------------------------------------------------------


class Network(NamedTuple):
  """The attacked model as a network prior sees it: ``apply_fn(variables, x, train) -> logits``, the
  server's ``variables`` (with ``"batch_stats"`` for BatchNorm models), the client's mode and, where
  the client revealed them, its batch's BatchNorm input moments (``observation.moments``)."""

  apply_fn: Callable
  variables: Any
  train: bool = False
  moments: Any = None


@dataclasses.dataclass(frozen=True)
class NetworkPrior:
  """A prior ``fn(x, network) -> scalar`` that reads the model as well as the image; ``needs``: the
  variable collections it reads besides ``params`` (checked before an attack compiles)."""

  fn: Callable[[jax.Array, Network], jax.Array]
  needs: tuple[str, ...] = ()

  def __call__(self, x, network: Network) -> jax.Array:
    return self.fn(x, network)


class BatchStatistics(NamedTuple):
  """Per BatchNorm layer, in call order: ``paths`` (module paths, e.g. ("BasicBlock_0", "BatchNorm_1")),
  ``means`` and ``variances`` ((C,) each) of the layer's input over the batch and spatial axes; and
  the model's ``logits`` from the same forward pass."""

  paths: tuple[tuple[str, ...], ...]
  means: tuple[jax.Array, ...]
  variances: tuple[jax.Array, ...]
  logits: jax.Array


_COLLECTION = "batch_norm_inputs"


def _moments(h):
  """Mean and biased (two-pass) variance of h over every axis but the last (features)."""
  axes = tuple(range(h.ndim - 1))
  mean = jnp.mean(h, axis=axes)
  return mean, jnp.mean(jnp.square(h - mean), axis=axes)


def batch_statistics(network: Network, x) -> BatchStatistics:
  """The input moments of every BatchNorm layer when ``network`` runs on ``x``.

  For layer l with input h_l (N, H_l, W_l, C_l)::

    μ_l = mean_{n,i,j} h_l[n, i, j, :],   σ²_l = mean_{n,i,j} (h_l[n, i, j, :] − μ_l)²   (C_l,)

  (biased, two-pass), the quantities BatchNorm normalises by in training mode. Each BatchNorm
  layer's call is seen on its way (:func:`gradjax.models.taps.intercept`), so any model works
  unchanged and its outputs are not touched. With a gradjax model (``apply_fn.module`` set by
  :func:`gradjax.models.make_apply_fn`) the moments are recorded in a variable collection, which
  also works inside ``nn.remat``; any other ``apply_fn`` is traced with the moments collected on
  the side, which works unless a layer sits inside a lifted transform.

  Raises ValueError when the model has no BatchNorm layer.
  """
  order: list[tuple[str, ...]] = []
  side: dict[tuple[str, ...], tuple[jax.Array, jax.Array]] = {}
  module = getattr(network.apply_fn, "module", None)

  def moments(call, proceed):
    if call.kind == taps.BATCH_NORM and call.method == "__call__":
      if call.path not in order:  # a remat'ed block is traced more than once
        order.append(call.path)
      mean, var = _moments(call.args[0])
      if module is None:
        side[call.path] = (mean, var)
      else:
        call.record(_COLLECTION, "moments", (mean, var))
    return proceed()

  with taps.intercept(moments):
    if module is None:
      logits = network.apply_fn(network.variables, x, network.train)
      found = side
    else:
      mutable = [_COLLECTION, "batch_stats"] if network.train else [_COLLECTION]
      logits, state = module.apply(network.variables, x, train=network.train, mutable=mutable)
      found = {}
      for path in order:
        node = state[_COLLECTION]
        for key in path:
          node = node[key]
        found[path] = node["moments"]
  if not order:
    raise ValueError("the BatchNorm prior needs a model with BatchNorm layers; this one has none")
  return BatchStatistics(tuple(order), tuple(found[p][0] for p in order),
                         tuple(found[p][1] for p in order), logits)


def batch_norm_counts(apply_fn, variables, input_shape) -> dict[tuple[str, ...], int]:
  """n = N·H_l·W_l, the values each BatchNorm layer's moments average over, for a batch of
  ``input_shape`` (N, H, W, C) (read off the layers' input shapes while tracing, nothing computed):
  PyTorch's unbiased running variance scales the batch's by n / (n − 1)
  (:func:`gradjax.clients.batch_moments`)."""
  counts: dict[tuple[str, ...], int] = {}

  def count(call, proceed):
    if call.kind == taps.BATCH_NORM and call.method == "__call__":
      counts[call.path] = math.prod(call.args[0].shape[:-1])
    return proceed()

  with taps.intercept(count):
    jax.eval_shape(lambda x: apply_fn(variables, x, True),
                   jax.ShapeDtypeStruct(tuple(input_shape), jnp.float32))
  return counts


def _norm(d):
  """‖d‖₂ with gradient 0 (not NaN) where d = 0, as PyTorch's ``norm`` backward gives."""
  s = jnp.sum(jnp.square(d))
  positive = s > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, s, 1.0)), 0.0)


def _targets(network: Network, path):
  """Layer ``path``'s target mean and variance: the client's batch moments where it revealed them,
  else the running statistics the server sent."""
  if network.moments is not None:
    node, where = network.moments, "the client's batch moments"
  else:
    node = network.variables.get("batch_stats") if hasattr(network.variables, "get") else None
    where = "the model's batch_stats"
  for key in path:
    if node is None or key not in node:
      raise ValueError(f"no statistics for BatchNorm layer {'/'.join(path)} in {where}")
    node = node[key]
  return node["mean"], node["var"]


def batch_norm_prior(x, network: Network, *, multipliers: Sequence[float] = (10.0,)) -> jax.Array:
  """GradInversion's BatchNorm statistics prior (DeepInversion's feature-distribution term)::

    R_BN(x) = Σ_l α_l (‖μ_l(x) − μ̂_l‖₂ + ‖σ²_l(x) − σ̂²_l‖₂)

  with μ_l, σ²_l the dummy batch's input moments of BatchNorm layer l (:func:`batch_statistics`),
  μ̂_l, σ̂²_l the running mean and variance in the server's ``batch_stats`` (GradInversion's proxy for
  the batch's), or the batch's own moments where the client revealed them (``network.moments``: the
  statistics it returned after a training-mode step, :func:`gradjax.clients.batch_moments`); α_l = ``multipliers[l]``
  for the first layers in call order and 1 for the rest. Norms are plain (unsquared) L2 norms over
  channels.

  ``x``: the dummy batch (N, H, W, C); returns a scalar.
  Multipliers: (10,) is DeepInversion's ``first_bn_multiplier``; HFGInv (Ye et al., AAAI 2024, their
  code) weighs the stem ×1.3 and the next layer ×3.
  Reference: Yin et al., "See through Gradients: Image Batch Recovery via GradInversion", CVPR 2021,
  eq. (7); Yin et al., "Dreaming to Distill" (DeepInversion), CVPR 2020, eq. (4).
  """
  stats = batch_statistics(network, x)
  total = jnp.zeros((), jnp.result_type(x))
  try:
    for i, (path, mean, var) in enumerate(zip(stats.paths, stats.means, stats.variances)):
      target_mean, target_var = _targets(network, path)
      term = _norm(mean - target_mean) + _norm(var - target_var)
      total = total + (multipliers[i] if i < len(multipliers) else 1.0) * term
  except jax.errors.UnexpectedTracerError:
    raise ValueError("a BatchNorm layer runs inside a lifted transform (nn.remat, nn.scan): build "
                     "apply_fn with gradjax.models.make_apply_fn so its moments can be sown") from None
  return total


# --- built priors ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Prior:
  """An image prior with its weight, switched on at step ``start``: a term of the objective::

    term(x, step) = w(step) · fn(x)      for step >= start, else 0

  with w = ``weight`` (a number, or a function of the step ``weight_fn(step)``, which must work on a
  traced step under ``jit`` and ``vmap``); ``fn(x, network)`` for a
  :class:`NetworkPrior`, which reads the attacked model too (``needs``: its variable collections).
  Example: ``Prior(total_variation, 1e-4)`` (Inverting Gradients), ``Prior(PRIORS["bn_hfginv"], 1e-4,
  start=5000)`` (HFGInv).
  """

  fn: PriorFn
  weight: float | WeightFn = 1.0
  start: int = 0

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"a prior is a function of the images, got {self.fn!r}")
    if isinstance(self.weight, (np.ndarray, jax.Array)) and np.ndim(self.weight) == 0:
      try:  # the number it holds: an attack's fields key its compiled programs (hashable)
        object.__setattr__(self, "weight", float(self.weight))
      except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError("a prior's weight is a number or a function of the step, not a traced "
                         "value: build the Prior outside jit") from None
    if int(self.start) != self.start or self.start < 0:
      raise ValueError(f"a prior's start must be a non-negative integer step, got {self.start}")
    if not callable(self.weight) and not (isinstance(self.weight, numbers.Real)
                                          and math.isfinite(self.weight) and self.weight >= 0):
      # A negative weight rewards the prior (the objective runs to −∞ on a rough image).
      raise ValueError(f"a prior's weight must be a finite number >= 0 (or a function of the "
                       f"step), got {self.weight!r}")

  @property
  def couples_restarts(self) -> bool:
    """Whether ``fn`` reads the other restarts (:func:`group_consistency`)."""
    return getattr(self.fn, "couples_restarts", False)

  @property
  def needs(self) -> tuple[str, ...]:
    """The model's variable collections ``fn`` reads besides ``params``."""
    return getattr(self.fn, "needs", ())

  def __call__(self, x, step, network: Network | None = None, start=None) -> jax.Array:
    """The term at ``step``; ``start`` in place of the record's (an int scalar, e.g. traced:
    :class:`gradjax.objectives.Schedule`)."""
    w = self.weight(step) if callable(self.weight) else jnp.asarray(self.weight, float)
    start = self.start if start is None else start
    if not isinstance(start, int) or start:
      w = jnp.where(jnp.asarray(step) >= start, w, 0.0)
    if isinstance(self.fn, NetworkPrior):
      if network is None:
        raise ValueError("a network prior (e.g. bn) needs the attacked model: pass network=")
      return w * self.fn(x, network)
    return w * self.fn(x)


def combine(priors: Sequence[Prior]) -> Callable[..., jax.Array]:
  """``fn(x, step, network=None, starts=None) = Σ_k prior_k(x, step, network)`` over :class:`Prior`
  records, 0 if empty; ``starts``: one start per prior in place of the records' (as data:
  :class:`gradjax.objectives.Schedule`)."""
  for item in priors:
    if not isinstance(item, Prior):
      raise ValueError("combine takes Prior records, e.g. Prior(total_variation, 1e-4)")
  priors = tuple(priors)

  def prior(x, step, network: Network | None = None, starts=None):
    if starts is not None and len(starts) != len(priors):
      raise ValueError(f"one start per prior: got {len(starts)} for {len(priors)} priors")
    total = jnp.zeros((), jnp.result_type(x))
    for k, p in enumerate(priors):
      total = total + p(x, step, network, None if starts is None else starts[k])
    return total

  return prior


PRIORS: dict[str, PriorFn] = {
    "tv": total_variation,                                          # Inverting Gradients' mean form
    "tv_isotropic": functools.partial(total_variation, form="isotropic"),
    "l2": l2_norm,
    "group": group_consistency,                                     # GradInversion, over restarts
    "bn": NetworkPrior(batch_norm_prior, ("batch_stats",)),         # GradInversion, first layer ×10
    "bn_hfginv": NetworkPrior(functools.partial(batch_norm_prior, multipliers=(1.3, 3.0)),
                              ("batch_stats",)),
}


def get_prior(name: str, **kwargs) -> PriorFn:
  """``prior(x)`` (``prior(x, network)`` for a :class:`NetworkPrior`): the prior registered as
  ``name`` with ``kwargs`` bound."""
  try:
    fn = PRIORS[name]
  except KeyError:
    raise ValueError(f"unknown prior {name!r}; choose one of {', '.join(PRIORS)}") from None
  if not kwargs:
    return fn
  if isinstance(fn, NetworkPrior):
    return NetworkPrior(functools.partial(fn.fn, **kwargs), fn.needs)
  return functools.partial(fn, **kwargs)
