"""Federated-learning clients: what a client computes and sends, as an :class:`Observation`.

* FedSGD (McMahan et al., 2017): the client sends the gradient of its mean loss over one local batch,
  computed at the variables the server sent. Every attack of the DLG family starts from this threat
  model.
* FedAvg (McMahan et al., 2017): the client runs E local epochs of mini-batch SGD (optionally with
  momentum) over its n examples and sends its new weights W_{t+1}; the server, knowing W_t, sees the
  update W_t − W_{t+1}. :func:`aggregate` averages several clients' updates (secure aggregation's view).
* DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016), as Opacus runs it: a
  step that clips each example's gradient to L2 norm C over all parameters, averages, and adds
  Gaussian noise of standard deviation σC/B per entry (σ the noise multiplier; N(0, σ²C²) on the sum
  of the B clipped gradients): a FedSGD client's one step, ``fedsgd(..., dp_sgd=DPSGD(C, σ),
  key=...)``, or every local step of a FedAvg client, ``fedavg(..., dp_sgd=..., key=...)``. A step's
  batch is the one given (Opacus' ``poisson_sampling=False``), or with ``DPSGD(C, σ, q)`` a Poisson
  draw (Opacus' default): each of the client's n examples joins the step with probability q, and the
  sum is divided by the expected batch size qn (:func:`poisson_draws`). Its (ε, δ) over training:
  :mod:`gradjax.privacy`.
* A client that trains a BatchNorm network in training mode also updates the network's running
  statistics, and a client that returns its whole state (a PyTorch ``state_dict``, as Flower's examples
  do) sends them with its update: after one step they reveal the mean and variance of every BatchNorm
  layer's input over the client's batch (:func:`batch_moments`, ``share_statistics=True``).
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import defenses, models
from gradjax.compilation import check_key, device_array, once
from gradjax.losses import cross_entropy, masked_cross_entropy
from gradjax.observation import Observation, check_labels, couples_examples, plain_dicts


@once
def _difference(a, b):
  """``a − b`` leaf by leaf, one program (op by op, a program per leaf shape)."""
  return jax.tree.map(jnp.subtract, a, b)


def check_client_data(apply_fn, variables, x, y, loss_fn=cross_entropy):
  """(x, y) as arrays, or a one-line ValueError for bad client data: inputs the model cannot read
  or that are not finite; under gradjax's cross entropy (``loss_fn``), labels not
  :func:`gradjax.observation.check_labels`' (int (N,) or a language model's (N, T), in the model's
  classes) and a model without (N, K) logits of K ≥ 2 classes (one class's softmax is constant: its
  gradient is 0); under a loss of one's own, targets with the batch's N first and finite."""
  x, y = device_array(x), device_array(y)
  if x.ndim < 2:
    raise ValueError(f"client inputs must be (N, H, W, C) images or (N, T) token ids, got shape {x.shape}")
  if x.shape[0] == 0:
    raise ValueError(f"client inputs are an empty batch, shape {x.shape}")
  integer = jnp.issubdtype(x.dtype, jnp.integer)
  if integer and x.ndim > 2:
    raise ValueError(f"client images must be floating point, in the model's input space, got "
                     f"{x.dtype} {x.shape} (divide 8-bit images by 255, then normalise)")
  if not integer and not np.all(np.isfinite(np.asarray(x))):
    raise ValueError("client inputs contain NaN or inf")
  logits = models.output_shape(apply_fn, variables, x.shape[1:], x.dtype, what=(
      f"a client's input (x {x.shape}: {x.shape[0]} examples, the batch axis first), one example"))
  if integer:  # token ids index the embedding, which would read past its rows as NaN
    embed = variables.get("params", {}).get("embed")  # the zoo's nn.Embed, when the model has it
    table = embed.get("embedding") if hasattr(embed, "get") else None
    vocabulary = int(logits[-1] if table is None else table.shape[0])
    low, high = int(jnp.min(x)), int(jnp.max(x))
    if low < 0 or high >= vocabulary:
      raise ValueError(f"client token ids must lie in [0, {vocabulary}) (the model's vocabulary), "
                       f"got [{low}, {high}]")
  if loss_fn not in (cross_entropy, masked_cross_entropy):  # the loss says what its targets are
    if y.ndim < 1 or y.shape[0] != x.shape[0]:
      raise ValueError(f"client targets must hold the batch's {x.shape[0]} examples first, got "
                       f"shape {y.shape}")
    if not jnp.issubdtype(y.dtype, jnp.integer) and not np.all(np.isfinite(np.asarray(y))):
      raise ValueError("client targets contain NaN or inf")
    return x, y
  if len(logits) < 2 or logits[-1] < 2:
    raise ValueError(f"the model's output for one example is {tuple(logits)}: cross entropy reads "
                     "logits of K >= 2 classes, (1, K) (one output's softmax is constant and its "
                     "gradient 0; for a one-output model pass its own loss_fn)")
  # (N,) for a classifier, (N, T) for a language model
  check_labels(y, (x.shape[0], *logits[1:-1]), logits[-1], "client labels")
  return x, y


MOMENTUM = 0.9  # Flax's BatchNorm momentum in gradjax's models; PyTorch's default momentum 0.1 is 1 − it


def batch_moments(sent, returned, *, momentum: float = MOMENTUM, count=None):
  """The client's batch moments from the running statistics it returned after one training step.

  BatchNorm in training mode updates each layer's running statistics from the moments of its input
  h (N, H, W, C) over the batch and spatial axes, μ = mean h and σ² = mean (h − μ)² (C,), as::

    mean' = m · mean + (1 − m) · μ,    var' = m · var + (1 − m) · σ² · c      (m = ``momentum``)

  with c = 1 in Flax (biased) and c = n / (n − 1) in PyTorch (unbiased, n = N·H·W, the layer's
  ``count``). So μ = (mean' − m · mean) / (1 − m) and σ² = (var' − m · var) / ((1 − m) c) exactly.

  Args:
    sent: the server's ``batch_stats`` (a tree of ``{"mean", "var"}`` per BatchNorm layer).
    returned: the same tree as the client returned it.
    momentum: m, the weight of the old statistics (Flax's convention; PyTorch's ``momentum`` is 1 − m).
    count: ``None`` for Flax's biased update, or a tree like ``sent`` holding each layer's n in its
      leaves (PyTorch's unbiased update; read at the ``var`` leaves).

  Returns:
    A tree like ``sent`` of the batch moments ``{"mean": μ, "var": σ²}`` (σ² biased, as the BatchNorm
    prior computes it, :func:`gradjax.priors.batch_statistics`).
  Reference: Ioffe & Szegedy, "Batch Normalization", ICML 2015, Algorithm 1 and §3.1; PyTorch's
  ``torch.nn.BatchNorm2d`` documentation (running_var with the unbiased estimator).
  """
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"BatchNorm momentum (the old statistics' weight) must lie in [0, 1), got {momentum}")
  if jax.tree.structure(sent) != jax.tree.structure(returned):
    raise ValueError("the returned BatchNorm statistics do not match the ones the server sent")
  moments = jax.tree.map(lambda old, new: (jnp.asarray(new, jnp.float32) - momentum * old) / (1 - momentum),
                         sent, returned)
  if count is None:
    return moments
  return jax.tree_util.tree_map_with_path(  # PyTorch's σ²·n/(n−1) -> σ² in every ``var`` leaf
      lambda path, m, n: m * (n - 1) / n if path[-1].key == "var" else m, moments, count)


def returned_statistics(apply_fn, variables, x):
  """The running statistics a client holds after one training-mode forward pass on ``x`` (N, ...):
  the tree of ``variables["batch_stats"]`` updated by Flax's BatchNorm (``apply_fn.module`` must be
  the Flax module, as :func:`gradjax.models.make_apply_fn` sets it)."""
  module = getattr(apply_fn, "module", None)
  if module is None or "batch_stats" not in variables:
    raise ValueError("sharing BatchNorm statistics needs a gradjax model with BatchNorm layers")
  return _updated_statistics(variables, x, module)


@functools.partial(once, static_argnums=2)
def _updated_statistics(variables, x, module):
  """``variables["batch_stats"]`` after one training-mode forward pass of ``module`` on x, as one
  program."""
  _, state = module.apply(variables, x, train=True, mutable=["batch_stats"])
  return state["batch_stats"]


DP_SGD_TRAIN = ("DP-SGD clips each example's gradient: a model in training mode (BatchNorm's batch "
                "statistics) mixes the examples, so they have none of their own (Opacus refuses "
                "BatchNorm too)")


class DPSGD(NamedTuple):
  """DP-SGD's step (Abadi et al. 2016; Opacus' flat clipping): each example's gradient clipped to L2
  norm ``max_norm`` (C) over all parameters, then N(0, (``noise_multiplier`` · C)²) per entry on
  their sum, divided by the batch's size B: standard deviation σC/B on the mean.

  ``sampling_rate``: ``None``, the step's batch is the one given (Opacus' ``poisson_sampling=False``);
  a rate q in (0, 1], Poisson sampling (Opacus' default, its ``DPDataLoader``): each of the client's n
  examples joins the step independently with probability q, and the sum over those drawn, noise
  included, is divided by the expected batch size qn, not by the count drawn (Opacus'
  ``expected_batch_size``, which it truncates to an integer; here qn exactly)."""

  max_norm: float
  noise_multiplier: float = 0.0
  sampling_rate: float | None = None

  def check(self) -> "DPSGD":
    """Itself, or a one-line ValueError unless C > 0 and σ ≥ 0 are finite numbers and q, when
    given, lies in (0, 1]."""
    checked = (("max_norm", self.max_norm, False), ("noise_multiplier", self.noise_multiplier, True))
    if self.sampling_rate is not None:
      checked += (("sampling_rate", self.sampling_rate, False),)
    for name, value, low_ok in checked:
      if (isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer))
          or not math.isfinite(value) or value < 0 or (value == 0 and not low_ok)):
        raise ValueError(f"DP-SGD's {name} must be a finite number "
                         f"{'>= 0' if low_ok else '> 0'}, got {value!r}")
    if self.sampling_rate is not None and self.sampling_rate > 1:
      raise ValueError(f"DP-SGD's sampling_rate must lie in (0, 1], got {self.sampling_rate!r}")
    return self


def poisson_draws(key: jax.Array, steps: int, num_samples: int, rate: float) -> jax.Array:
  """(steps, n) bool: whether each of the client's n examples joins each step's batch, each
  independently with probability ``rate`` (Poisson sampling; Opacus' ``UniformWithReplacementSampler``
  draws the same distribution with torch's generator). A client's :func:`fedsgd` and
  :func:`local_sgd` draw theirs with the first key of ``jax.random.split(key)`` (their noise with the
  second): :func:`sampling_keys`. Drawn from float32 uniforms whatever ``jax_enable_x64`` says, so
  that a key gives the same draws in both."""
  return jax.random.uniform(key, (steps, num_samples), jnp.float32) < rate


def sampling_keys(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(the draws' key, the noise's key) of a Poisson-sampled DP-SGD client given ``key``."""
  draw, noise = jax.random.split(key)
  return draw, noise


def expected_draws(local: "LocalTraining", num_samples: int, rate: float,
                   expected_batch_size: float | None = None) -> jax.Array:
  """(T, n) q everywhere: the draws' expectation, which :func:`local_sgd` given as ``draws`` replays
  as the expected steps (each the clipped mean over all n examples), for the schedule's T steps.
  ``expected_batch_size``: E, a client that divided each step's drawn sum by E rather than by qn
  (Opacus' ``int(q·n)``): its expected step (q/E) Σ_n clip(·) is replayed by weights q·qn/E."""
  if expected_batch_size is None:
    return jnp.full((local.steps(num_samples), num_samples), rate)
  return jnp.full((local.steps(num_samples), num_samples), rate * rate * num_samples / expected_batch_size)


def drawn(dp_sgd: DPSGD, key: jax.Array, num_samples: int, steps: int = 1) -> np.ndarray:
  """(steps, n) bool: the examples each step of a Poisson-sampled client (``dp_sgd.sampling_rate``)
  drew with ``key``, as :func:`fedsgd` and :func:`local_sgd` draw them: what a simulation scores
  the attack against."""
  if key is None:
    raise ValueError("DP-SGD's Poisson sampling needs a PRNG key")
  check_key(key, "DP-SGD's key")
  return np.asarray(poisson_draws(sampling_keys(key)[0], steps, num_samples, dp_sgd.sampling_rate))


def clipped_gradient(apply_fn, variables, x, targets, max_norm: float, *, train: bool = False,
                     loss_fn=cross_entropy, scales=None):
  """DP-SGD's gradient before its noise: (1/N) Σ_n s_n clip(w_n ∇_θ L(f_θ(x_n), t_n), C), where
  clip(g, C) = g · min(1, C / ‖g‖) with the norm over every parameter (each example's loss is
  ``loss_fn`` on that example alone). Differentiable w.r.t. ``x`` and ``targets`` (int (N,) labels
  or (N, K) soft ones), so an attack that knows the clipping matches it (:mod:`gradjax.objectives`).

  w_n is Opacus' per-sample gradient of the batch's mean loss (N times the gradient of example n's
  terms in it) over that of example n's own mean: with int targets (N, ...), negative where a row
  has no target (a masked language model's unmasked positions), w_n = N M_n / Σ_m M_m for M_n the
  rows example n keeps; 1 when every example keeps as many (labels, next tokens, soft targets).

  ``scales``: (N,) s_n, or ``None`` for ones. A Poisson-sampled step (:class:`DPSGD`) passes
  d_n / q for d_n whether example n was drawn (0 or 1), so that the mean is Σ_(n drawn) clip(·) / qN;
  w_n then counts the drawn examples only (:func:`example_weights`).
  """

  def one(xn, tn, wn):
    g = jax.grad(lambda p: loss_fn(apply_fn({**variables, "params": p}, xn[None], train), tn[None]))(
        variables["params"])
    leaves, treedef = jax.tree.flatten(g)
    leaves = [(wn * a.astype(wn.dtype)).astype(a.dtype) for a in leaves]  # in the wider dtype
    return jax.tree.unflatten(treedef, defenses.clip_leaves(leaves, max_norm, per_layer=False))

  terms = jax.vmap(one)(x, targets, example_weights(targets, None if scales is None else scales > 0))
  if scales is None:
    return jax.tree.map(lambda a: jnp.mean(a, axis=0), terms)
  return jax.tree.map(lambda a: jnp.tensordot(scales.astype(a.dtype), a, axes=1) / a.shape[0], terms)


def example_weights(targets: jax.Array, drawn=None) -> jax.Array:
  """(N,) w_n = N M_n / Σ_m M_m, M_n the rows of example n with a target (int targets, negative
  where none); ones for soft targets. Opacus computes each example's gradient of a mean loss as N
  times its terms' gradient (``GradSampleModule``, ``loss_reduction="mean"``), so a batch whose
  examples keep different numbers of rows (a masked language model's masks) weighs each by its
  share of the batch's rows, before clipping (:func:`clipped_gradient`). ``drawn``: (N,) bool, the
  examples in the step's batch (a Poisson draw): N and the sums then count those only."""
  n, dtype = targets.shape[0], jnp.result_type(float)  # float64 under jax.enable_x64
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    return jnp.ones((n,), dtype)
  kept = jnp.sum((targets >= 0).reshape(n, -1), axis=1).astype(dtype)
  if drawn is None:
    return n * kept / jnp.maximum(jnp.sum(kept), 1)
  drawn = drawn.astype(dtype)
  return jnp.sum(drawn) * kept / jnp.maximum(jnp.sum(drawn * kept), 1)


@functools.partial(once, static_argnums=(5, 6, 7))
def _clipped_gradient(variables, x, y, max_norm, scales, apply_fn, train, loss_fn):
  return clipped_gradient(apply_fn, variables, x, y, max_norm, train=train, loss_fn=loss_fn,
                          scales=scales)


def fedsgd(apply_fn, variables, x, y, *, train: bool = False, share_labels: bool | str = False,
           share_statistics: bool = False, loss_fn=cross_entropy, dp_sgd: DPSGD | None = None,
           key: jax.Array | None = None) -> Observation:
  """The FedSGD update g = ∇_θ (1/N) Σ_n L(f_θ(x_n), y_n), or with ``dp_sgd`` DP-SGD's
  (1/N) (Σ_n clip(∇_θ L(f_θ(x_n), y_n), C) + σC ξ), ξ ~ N(0, I); with its Poisson sampling at rate q
  (1/qN) (Σ_(n drawn) clip(∇_θ L(f_θ(x_n), y_n), C) + σC ξ), the N examples being the client's data
  and those drawn :func:`drawn`'s.

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: ``{"params": θ, ...}`` as sent by the server.
    x: (N, H, W, C) private inputs, in the model's input space, or (N, T) token ids.
    y: (N,) int private labels, or (N, T) next tokens (:func:`gradjax.corpus.language_model_pairs`).
    train: run the model in training mode (BatchNorm uses the batch statistics).
    share_labels: what the threat model reveals of the labels: ``False`` nothing; ``True`` or
      ``"ordered"`` the labels in the client's order; ``"multiset"`` only which labels, sorted (a
      gradient's mean does not depend on the order). Under Poisson sampling, those of the examples
      drawn, fewer than ``num_samples``: an attack's batch is then the examples drawn
      (``observation.replace(num_samples=len(observation.labels))``, as
      :func:`gradjax.run.pipeline.poisson_draw` does) and its sum's divisor stays qN.
    share_statistics: whether the client returns its BatchNorm running statistics, updated by the
      step (needs ``train``): the observation then carries the batch's moments
      (:func:`batch_moments`).
    loss_fn: ``loss_fn(logits, y) -> scalar``; the mean cross entropy by default.
    dp_sgd: DP-SGD's clipping bound, noise multiplier and sampling (:class:`DPSGD`), or ``None``.
      Its per-example gradients need examples the model treats independently: not in training mode.
    key: the noise's PRNG key, when ``dp_sgd`` adds noise; under Poisson sampling, the draws' and
      the noise's (:func:`sampling_keys`).

  Returns:
    Observation with the gradient (same tree as ``variables["params"]``); its ``num_samples`` is N
    (under Poisson sampling the client's data, not the count drawn).
  """
  if share_labels not in LABEL_SHARING:
    raise ValueError(f"share_labels must be one of {LABEL_SHARING}, got {share_labels!r}")
  variables = plain_dicts(variables)
  x, y = check_client_data(apply_fn, variables, x, y, loss_fn)
  _check_sharing(train, share_statistics, 1)
  shared, std = y, 0.0
  if dp_sgd is None:
    gradient = _gradient(variables, x, y, apply_fn, train, loss_fn)
  else:
    dp_sgd = DPSGD(*dp_sgd).check()
    if couples_examples(train, variables):
      raise ValueError(DP_SGD_TRAIN)
    scales = None
    if dp_sgd.sampling_rate is not None:
      draws = drawn(dp_sgd, key, x.shape[0])[0]
      key = sampling_keys(key)[1]
      scales = jnp.asarray(draws / dp_sgd.sampling_rate, jnp.result_type(float))
      shared = y[draws]
    elif dp_sgd.noise_multiplier > 0:
      if key is None:
        raise ValueError("DP-SGD's noise needs a PRNG key")
      check_key(key, "DP-SGD's key")
    gradient = _clipped_gradient(variables, x, y, float(dp_sgd.max_norm), scales, apply_fn, train,
                                 loss_fn)
    std = dp_sgd.noise_multiplier * dp_sgd.max_norm / (x.shape[0] * (dp_sgd.sampling_rate or 1))
  if share_labels == "multiset":
    if shared.ndim != 1:
      raise ValueError("a multiset of labels is a classifier's (N,) labels, not a text client's "
                       "next tokens")
    shared = jnp.sort(shared)
  observation = Observation(gradient=gradient, variables=variables,
                            labels=shared if share_labels else None,
                            num_samples=int(x.shape[0]),
                            threat_model="fedsgd", train=train,
                            moments=_shared_moments(apply_fn, variables, x, share_statistics))
  if std > 0:
    observation = defenses.gaussian_noise(std ** 2).apply(observation, key)
  return observation


def _check_sharing(train, share, steps):
  if share and not train:
    raise ValueError("a client in evaluation mode leaves its BatchNorm statistics unchanged: sharing "
                     "them reveals nothing (set train)")
  if share and steps != 1:
    raise ValueError(f"the returned statistics mix the moments of {steps} local steps; the batch's "
                     "moments are read from one step only")


def _shared_moments(apply_fn, variables, x, share):
  if not share:
    return None
  if "batch_stats" not in variables:
    raise ValueError("the model has no BatchNorm statistics to return (share_statistics needs a "
                     "BatchNorm network)")
  return batch_moments(variables["batch_stats"], returned_statistics(apply_fn, variables, x))


def gradient(apply_fn, variables, x, y, *, train: bool = False, loss_fn=cross_entropy):
  """∇_θ loss_fn(f_θ(x), y) at ``variables["params"]``: the update a FedSGD client sends for (x, y)
  (:func:`fedsgd`'s, its program compiled once per model and shapes, so the update of a
  reconstruction of the same shapes, :func:`gradjax.verdict.residual`, compiles nothing)."""
  return _gradient(variables, x, y, apply_fn, train, loss_fn)


@functools.partial(once, static_argnums=(3, 4, 5))
def _gradient(variables, x, y, apply_fn, train, loss_fn):
  """∇_θ loss_fn(f_θ(x), y) at ``variables["params"]``, as one program."""

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), y)

  return jax.grad(loss)(variables["params"])


class LocalTraining(NamedTuple):
  """A FedAvg client's local training: ``epochs`` passes over its n examples in mini-batches of
  ``batch_size`` (in order: batch b of every epoch holds examples b·B .. b·B + B − 1), SGD with
  ``learning_rate`` and heavy-ball ``momentum`` (PyTorch's form: v ← μ v + g, W ← W − η v)."""

  epochs: int = 1
  batch_size: int | None = None   # None: the whole local data set is one batch
  learning_rate: float = 0.01
  momentum: float = 0.0

  def steps(self, num_samples: int) -> int:
    """Number of SGD steps: epochs · n / B."""
    return self.epochs * (num_samples // (self.batch_size or num_samples))


def check_local_training(local: LocalTraining, num_samples: int) -> None:
  """Raises ``ValueError`` unless ``local`` is a valid schedule for ``num_samples`` examples."""
  if not isinstance(local, LocalTraining):
    raise ValueError(f"local training is a clients.LocalTraining, got {type(local).__name__}")
  if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
             for v in (local.epochs, num_samples if local.batch_size is None else local.batch_size)):
    raise ValueError(f"local epochs and batch size must be integers, got {local.epochs!r} and "
                     f"{local.batch_size!r}")
  b = num_samples if local.batch_size is None else local.batch_size
  if local.epochs < 1 or b < 1 or num_samples % b:
    raise ValueError(f"local training needs epochs >= 1 and a batch size dividing n = {num_samples}, "
                     f"got epochs {local.epochs}, batch size {local.batch_size}")
  if not (math.isfinite(local.learning_rate) and local.learning_rate > 0) or not 0 <= local.momentum < 1:
    raise ValueError(f"local learning rate must be positive and momentum in [0, 1), got "
                     f"{local.learning_rate} and {local.momentum}")


def local_sgd(apply_fn, variables, x, targets, local: LocalTraining, *, train: bool = False,
              loss_fn=cross_entropy, remat: bool = False, dp_sgd: DPSGD | None = None,
              key: jax.Array | None = None, draws=None):
  """The client's parameters after local training; differentiable w.r.t. ``x`` and ``targets``.

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: the variables the server sent; only ``"params"`` are trained (batch statistics are
      held fixed).
    x: (n, H, W, C) local data.
    targets: (n,) int labels or (n, K) soft labels.
    local: the schedule; n must be a multiple of the batch size.
    remat: ``jax.checkpoint`` each step, so differentiating through the local training stores one
      parameter set per step instead of every step's activations.
    dp_sgd: every step is DP-SGD's (:class:`DPSGD`): its mini-batch's examples' gradients clipped
      (:func:`clipped_gradient`), N(0, (σC/B)²) per entry added to their mean, the noise of step t
      drawn with ``fold_in(key, t)``; ``None``: plain SGD. With its Poisson sampling at rate q, the
      schedule's T = epochs · n / B steps (Opacus keeps the data loader's length, with q = B/n) each
      draw their batch from all n examples and divide by qn (noise σC/qn).
    key: the noise's PRNG key, when ``dp_sgd`` adds noise; under Poisson sampling, the draws' and
      the noise's (:func:`sampling_keys`).
    draws: under Poisson sampling, (T, n) the steps' draws instead of ``key``'s: whether example n
      joined step t (:func:`drawn`), or any weights in [0, 1]; q for every entry replays the
      expected steps, (1/n) Σ_n clip(·) each (:class:`gradjax.objectives.Replay`).

  Returns:
    The parameters W_{t+1}, same tree as ``variables["params"]``. Written as a ``lax.scan`` over
    the epochs · n / B steps, so the attack can differentiate through it (unrolled replay).
  """
  check_local_training(local, x.shape[0])
  clip = noisy = False
  max_norm = noise_std = 0.0
  scales = None
  if dp_sgd is not None:
    dp_sgd = DPSGD(*dp_sgd).check()
    if couples_examples(train, variables):
      raise ValueError(DP_SGD_TRAIN)
    clip, max_norm = True, float(dp_sgd.max_norm)
    batch = local.batch_size or x.shape[0]
    if dp_sgd.sampling_rate is not None:
      steps = local.steps(x.shape[0])
      if draws is None:
        draws = drawn(dp_sgd, key, x.shape[0], steps)
        key = None if key is None else sampling_keys(key)[1]
      draws = jnp.asarray(draws, jnp.result_type(float))
      if draws.shape != (steps, x.shape[0]):
        raise ValueError(f"Poisson sampling's draws must have shape (steps, n) = "
                         f"{(steps, x.shape[0])}, got {draws.shape}")
      scales = draws / dp_sgd.sampling_rate
      batch = dp_sgd.sampling_rate * x.shape[0]
    elif draws is not None:
      raise ValueError("draws are Poisson sampling's: give DPSGD a sampling_rate")
    if dp_sgd.noise_multiplier > 0:
      if key is None:
        raise ValueError("DP-SGD's noise needs a PRNG key")
      check_key(key, "DP-SGD's key")
      noisy = True
      noise_std = dp_sgd.noise_multiplier * dp_sgd.max_norm / batch
  elif draws is not None:
    raise ValueError("draws are DP-SGD's Poisson sampling: give dp_sgd with a sampling_rate")
  return _local_sgd(variables, x, targets, float(local.learning_rate), float(local.momentum),
                    max_norm, noise_std, key if noisy else None, scales, apply_fn, train, loss_fn,
                    remat, local.epochs, local.batch_size, clip, noisy)


@functools.partial(once, static_argnums=(9, 10, 11, 12, 13, 14, 15, 16))
def _local_sgd(variables, x, targets, learning_rate, momentum, max_norm, noise_std, key, scales,
               apply_fn, train, loss_fn, remat, epochs, batch_size, clip, noisy):
  """:func:`local_sgd` after its checks, as one program whose learning rate, momentum and DP-SGD's
  bound and noise are data (a client of another rate, a fidelity check's alternative, runs the
  same program); ``clip``, ``noisy``: whether the steps are DP-SGD's, with noise; ``scales``:
  (T, n) Poisson sampling's draws over q, each step then over all n examples, or ``None``."""
  local = LocalTraining(epochs, batch_size, learning_rate, momentum)
  n = x.shape[0]
  b = local.batch_size or n
  batches = n // b

  def step(carry, i):
    params, velocity = carry
    model = {**variables, "params": params}
    if scales is not None:
      grad = clipped_gradient(apply_fn, model, x, targets, max_norm, train=train, loss_fn=loss_fn,
                              scales=scales[i])
    else:
      start = (i % batches) * b
      xb = jax.lax.dynamic_slice_in_dim(x, start, b)
      tb = jax.lax.dynamic_slice_in_dim(targets, start, b)
      if clip:
        grad = clipped_gradient(apply_fn, model, xb, tb, max_norm, train=train, loss_fn=loss_fn)
      else:
        grad = jax.grad(lambda p: loss_fn(apply_fn({**variables, "params": p}, xb, train), tb))(params)
    if noisy:
      leaves, treedef = jax.tree.flatten(grad)
      keys = jax.random.split(jax.random.fold_in(key, i), len(leaves))
      grad = jax.tree.unflatten(treedef, [g + noise_std * jax.random.normal(k, g.shape, g.dtype)
                                          for g, k in zip(leaves, keys)])
    velocity = jax.tree.map(lambda v, g: local.momentum * v + g, velocity, grad)
    params = jax.tree.map(lambda p, v: p - local.learning_rate * v, params, velocity)
    return (params, velocity), None

  params = variables["params"]
  zeros = jax.tree.map(jnp.zeros_like, params)
  if remat:
    step = jax.checkpoint(step)
  (params, _), _ = jax.lax.scan(step, (params, zeros), jnp.arange(local.steps(n)))
  return params


LABEL_SHARING = (False, True, "ordered", "multiset")


def replayed_update(apply_fn, observation: Observation, x, targets, *, loss_fn=cross_entropy,
                    remat: bool = False, max_norm: float | None = None,
                    sampling_rate: float | None = None, expected_batch_size: float | None = None):
  """u = W_t − W'_{t+1}: the observation's local training (``observation.local``) replayed from the
  sent variables on ``x`` (N, ...) with ``targets`` (N,) labels or (N, K) soft labels; for an
  aggregate (``observation.clients`` = (n_1, ..., n_K)), client k's on its n_k consecutive examples,
  the updates weighed n_k / N as :func:`aggregate` weighs them. Differentiable w.r.t. ``x`` and
  ``targets``.

  ``max_norm``: the steps are DP-SGD's, each example's gradient clipped to it (its noise is not
  replayed); ``sampling_rate``: they were Poisson draws at that rate, replayed as their expectation
  (:func:`expected_draws`, with ``expected_batch_size``); ``remat``: as :func:`local_sgd`.
  """
  if observation.local is None:
    raise ValueError("replay needs the client's local training (observation.local)")
  if expected_batch_size is not None and len(observation.clients or ()) > 1:
    raise ValueError("a declared expected batch size is one client's divisor; an aggregate's "
                     "clients are replayed with their own, q·n_k")
  dp_sgd = None if max_norm is None else DPSGD(max_norm, 0.0, sampling_rate)
  params, total = observation.variables["params"], x.shape[0]
  update, start = None, 0
  for n in observation.clients or (total,):
    draws = None if sampling_rate is None else expected_draws(observation.local, n, sampling_rate,
                                                              expected_batch_size)
    new = local_sgd(apply_fn, observation.variables, x[start:start + n], targets[start:start + n],
                    observation.local, train=observation.train, loss_fn=loss_fn, remat=remat,
                    dp_sgd=dp_sgd, draws=draws)
    part = jax.tree.map(lambda p, w, n=n: (n / total) * (p - w), params, new)
    update = part if update is None else jax.tree.map(jnp.add, update, part)
    start += n
  if start != total:
    raise ValueError(f"the aggregate's clients hold {start} examples, the replayed batch {total}")
  return update


# Twelve parameters: fedsgd's client (model, data, mode, loss, what it shares, DP-SGD and its key)
# plus its local training and whether the schedule is shared; each keyword has a default.
def fedavg(apply_fn, variables, x, y, local: LocalTraining = LocalTraining(), *,
           train: bool = False, share_labels: bool | str = False, share_local: bool = True,
           share_statistics: bool = False, loss_fn=cross_entropy, dp_sgd: DPSGD | None = None,
           key: jax.Array | None = None) -> Observation:
  """A FedAvg client's update W_t − W_{t+1} after :func:`local_sgd` on (x, y).

  Args:
    apply_fn, variables, x, y, train, loss_fn: as :func:`fedsgd`.
    local: the client's local training.
    share_labels: what the threat model reveals of the labels: ``False`` nothing; ``True`` or
      ``"ordered"`` the labels in the client's order (so which mini-batch, i.e. step, each belongs
      to); ``"multiset"`` only which labels, sorted (the order is then a search,
      :mod:`gradjax.permutations`).
    share_local: whether the threat model reveals ``local`` (learning rate, epochs, batch size) to
      the server; then ``observation.local`` carries it.
    share_statistics: as :func:`fedsgd`, for a client of one local step.
    dp_sgd, key: every local step is DP-SGD's (:func:`local_sgd`), as a client training with
      Opacus; ``None``: plain SGD.

  Returns:
    Observation whose ``gradient`` holds the update W_t − W_{t+1} (for one full-batch step without
    momentum that is η · ∇L, the FedSGD gradient scaled by the learning rate).
  """
  if share_labels not in LABEL_SHARING:
    raise ValueError(f"share_labels must be one of {LABEL_SHARING}, got {share_labels!r}")
  variables = plain_dicts(variables)
  x, y = check_client_data(apply_fn, variables, x, y, loss_fn)
  check_local_training(local, x.shape[0])
  _check_sharing(train, share_statistics, local.steps(x.shape[0]))
  shared = None if share_labels is False else jnp.sort(y) if share_labels == "multiset" else y
  new = local_sgd(apply_fn, variables, x, y, local, train=train, loss_fn=loss_fn, dp_sgd=dp_sgd,
                  key=key)
  update = _difference(variables["params"], new)
  return Observation(gradient=update, variables=variables, labels=shared,
                     num_samples=int(x.shape[0]), threat_model="fedavg", train=train,
                     local=local if share_local else None,
                     moments=_shared_moments(apply_fn, variables, x, share_statistics))


def update_as_gradient(observation: Observation) -> Observation:
  """A FedAvg update of one full-batch SGD step as the FedSGD gradient it scales.

  With one local step, W_t − W_{t+1} = η ∇_W L(x, y) (momentum changes nothing on the first step,
  PyTorch's buffer starts at the gradient), so ``gradient = (W_t − W_{t+1}) / η`` is exactly what DLG,
  iDLG and the other gradient-matching attacks expect. Several local steps are no scaled gradient:
  they need the replay, DLM or DLM+ objective, and this raises ``ValueError`` saying so.
  """
  local = observation.local
  if observation.threat_model != "fedavg" or local is None:
    raise ValueError(f"a {observation.threat_model} observation whose local training is unknown is "
                     "not a scaled gradient")
  steps = local.steps(observation.num_samples)
  if steps != 1:
    raise ValueError(f"the update comes from {steps} local SGD steps, not one: match it with the "
                     "replay, dlm or dlm_plus objective (e.g. attack inverting_gradients_fedavg)")
  gradient = jax.tree.map(lambda u: u / local.learning_rate, observation.gradient)
  return observation.replace(gradient=gradient, threat_model="fedsgd", local=None)


def aggregate(observations) -> Observation:
  """The server's mean of K clients' updates, as it sees them under secure aggregation: FedAvg's
  (McMahan et al., 2017) weighted by the clients' sizes, Σ_k (n_k / N) Δ_k with N = Σ_k n_k, so
  that FedSGD clients' gradients give the gradient of the mean loss over all N examples.

  All observations must share the variables the server sent, their threat model and schedule;
  labels are concatenated when every client shares them. ``num_samples`` is N and ``clients`` the
  sizes (n_1, ..., n_K) (an aggregate's own sizes, flattened), which a replay of local training
  needs: each client trained apart from the sent model (:class:`gradjax.objectives.Replay`). The
  aggregate carries no batch moments: averaged running statistics give the union of the batches'
  mean but not its variance (the spread between the clients' means is lost).
  """
  observations = list(observations)
  if not observations:
    raise ValueError("aggregate needs at least one observation")
  first = observations[0]
  sent = jax.tree.leaves(first.variables)
  for o in observations[1:]:
    if jax.tree.structure(o.gradient) != jax.tree.structure(first.gradient):
      raise ValueError("observations to aggregate have different parameter trees")
    if o.variables is not first.variables and (
        jax.tree.structure(o.variables) != jax.tree.structure(first.variables)
        or not all(np.array_equal(np.asarray(a), np.asarray(b))
                   for a, b in zip(jax.tree.leaves(o.variables), sent))):
      raise ValueError("observations to aggregate were computed at different server variables (a "
                       "round's clients all start from the model the server sent)")
    if ((_client_threat_model(o), o.train, o.local)
        != (_client_threat_model(first), first.train, first.local)):
      raise ValueError("observations to aggregate come from different threat models or schedules")
  total = sum(o.num_samples for o in observations)
  if len({o.num_samples for o in observations}) == 1:  # equal weights: the plain mean, as before
    mean = jax.tree.map(lambda *g: sum(g) / len(g), *(o.gradient for o in observations))
  else:
    mean = jax.tree.map(lambda *g: sum(o.num_samples / total * u for o, u in zip(observations, g)),
                        *(o.gradient for o in observations))
  labels = None
  if all(o.labels is not None for o in observations):
    labels = jnp.concatenate([o.labels for o in observations])
  sizes = tuple(int(n) for o in observations for n in (o.clients or (o.num_samples,)))
  return first.replace(gradient=mean, labels=labels, num_samples=total, clients=sizes,
                       threat_model=_client_threat_model(first) + "_aggregate", moments=None)


def _client_threat_model(observation: Observation) -> str:
  """The threat model of the clients behind ``observation`` (an aggregate's, without the suffix)."""
  return observation.threat_model.removesuffix("_aggregate")
