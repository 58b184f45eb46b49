"""The gradient-matching objective of the DLG family.

Given the observed gradient g = ∇_θ L(f_θ(x), y) of a client, the attacker minimises over dummy data
x' (and, in DLG, dummy soft labels y' = softmax(z'))

    D(∇_θ L(f_θ(x'), y'), g)

where D is a distance on parameter pytrees (:mod:`gradjax.distances`), optionally plus image priors
R(x', t) (:mod:`gradjax.priors`). ``jax.grad`` of the client's
loss gives the dummy gradient; differentiating the objective again w.r.t. x' (and z') drives the
optimizer, so the objective is one pure function that ``jit`` and ``vmap`` transform as a whole.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from gradjax.clients import local_sgd
from gradjax.losses import cross_entropy
from gradjax.observation import Observation
from gradjax.priors import Network

MODES = ("gradient", "replay", "dlm", "dlm_plus")


def dummy_gradient(apply_fn, variables, x, targets, *, train: bool = False,
                   loss_fn=cross_entropy):
  """∇_θ L(f_θ(x), targets) at ``variables["params"]``: the gradient a client with data x would send."""

  def loss(params):
    return loss_fn(apply_fn({**variables, "params": params}, x, train), targets)

  return jax.grad(loss)(variables["params"])


def _unit(tree, eps=1e-12):
  """tree / ‖tree‖ with the norm over all leaves (sqrt(Σ + eps): differentiable at 0)."""
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)) + eps)
  return jax.tree.map(lambda x: x / norm, tree)


def gradient_matching(apply_fn, distance: Callable, *, loss_fn=cross_entropy,
                      prior: Callable | None = None, one_sample_per_step: bool = False,
                      mode: str = "gradient", remat: bool = False) -> Callable:
  """Returns ``objective(dummy, observation, labels=None, step=0, weights=None) -> scalar``:

      D(u(x', y'), v) + R(x', step)

  where, by ``mode``, with g' = ∇_θ L(f_θ(x'), y') the dummy gradient and g the observation:

  * ``"gradient"`` (FedSGD; DLG and relatives): u = g', v = g.
  * ``"replay"`` (FedAvg, Geiping et al. 2020 §6): u = W_t − W'_{t+1}, the update of the client's
    local training replayed on the dummy data (:func:`gradjax.clients.local_sgd`, with the schedule
    the observation reveals in ``observation.local``), v = the observed update W_t − W_{t+1}.
  * ``"dlm"`` (Zhao, Luo, Ding, "Deep Leakage from Model in Federated Learning"): u = g',
    v = γ (W_t − W_{t+1}) with γ optimised jointly (≈ 1 / lr after one step). γ = exp(s) with
    s = ``dummy["log_gamma"]``: positive, and a first-order optimizer moves it multiplicatively, so it
    reaches 1/lr = 100 in tens of steps rather than thousands.
  * ``"dlm_plus"`` (DLM+, learning-rate free): u = g' / ‖g'‖, v = ΔW / ‖ΔW‖, norms over all layers.

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    distance: ``distance(dummy_gradient, observed_gradient) -> scalar``.
    loss_fn: the client's loss, ``loss_fn(logits, targets)``; targets are int labels or soft labels.
    prior: optional image prior ``prior(x, step, network) -> scalar`` (weights included), e.g.
      :func:`gradjax.priors.combine`; ``network`` is the attacked model with the observation's
      variables (:class:`gradjax.priors.Network`), read by priors such as the BatchNorm prior.
    one_sample_per_step: DLG's batch option: at step t only dummy example t mod N receives a
      gradient (the others are held by ``stop_gradient``); the objective value is unchanged.
    remat: ``"replay"`` only: ``jax.checkpoint`` each replayed local step, so differentiating through
      the local training keeps one parameter set per step and recomputes the step's activations
      (ResNet-20 with 64 local steps: 354 -> 75 MB of XLA temporaries). For the gradient itself,
      checkpoint inside the model instead (``gradjax.models.get_module(..., remat=True)``).

  The returned objective takes
    dummy: ``{"x": (N, H, W, C)}`` (or any input the model reads, e.g. (N, T, dim) embeddings) plus
      ``"label_logits": (N, K)`` ((N, T, V) for a language model) when labels are optimised jointly
      (DLG); then the targets are ``softmax(label_logits)``.
    observation: the :class:`~gradjax.observation.Observation` (gradient and variables).
    labels: int (N,) labels used when ``dummy`` has no ``"label_logits"`` (known or inferred).
    step: the optimizer step (int scalar), for scheduled priors and ``one_sample_per_step``.
    weights: optional per-leaf distance weights (see :func:`gradjax.distances.depth_weights`).
    label_mask: optional (K,) bool: the classes soft labels may take; the others' logits are set to
      the dtype's minimum, so they get probability 0 (and no gradient).
  """

  if mode not in MODES:
    raise ValueError(f"unknown objective mode {mode!r}; choose one of {', '.join(MODES)}")

  def objective(dummy, observation: Observation, labels=None, step=0, weights=None, label_mask=None):
    x, logits = dummy["x"], dummy.get("label_logits")
    if logits is not None and label_mask is not None:
      logits = jnp.where(label_mask, logits, jnp.finfo(logits.dtype).min)
    if one_sample_per_step:
      active = jnp.arange(x.shape[0]) == step % x.shape[0]
      x = jnp.where(active.reshape(-1, *[1] * (x.ndim - 1)), x, jax.lax.stop_gradient(x))
      if logits is not None:
        logits = jnp.where(active.reshape(-1, *[1] * (logits.ndim - 1)), logits,
                           jax.lax.stop_gradient(logits))
    targets = labels if logits is None else jax.nn.softmax(logits, axis=-1)
    observed = observation.gradient
    if mode == "replay":
      if observation.local is None:
        raise ValueError("replay needs the client's local training schedule (observation.local)")
      params = observation.variables["params"]
      new = local_sgd(apply_fn, observation.variables, x, targets, observation.local,
                      train=observation.train, loss_fn=loss_fn, remat=remat)
      g = jax.tree.map(jnp.subtract, params, new)
    else:
      g = dummy_gradient(apply_fn, observation.variables, x, targets, train=observation.train,
                         loss_fn=loss_fn)
    if mode == "dlm":
      observed = jax.tree.map(lambda o: jnp.exp(dummy["log_gamma"]) * o, observed)
    elif mode == "dlm_plus":
      g, observed = _unit(g), _unit(observed)
    if weights is None:
      value = distance(g, observed)
    else:
      value = distance(g, observed, weights=weights)
    if prior is not None:
      network = Network(apply_fn, observation.variables, observation.train)
      value = value + prior(dummy["x"], step, network)
    return value

  return objective
