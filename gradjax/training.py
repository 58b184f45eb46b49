"""Training a model under a defense: checkpoints for attacks at later epochs, and the utility side of
the privacy/utility trade-off.

* :func:`train_fedsgd`: central / FedSGD training. Step t takes one mini-batch B_t of a per-epoch
  shuffle, computes the client's gradient g_t = ∇_θ (1/|B_t|) Σ_{n∈B_t} L(f_θ(x_n), y_n) (the mean cross
  entropy, as :func:`gradjax.clients.fedsgd`), applies the defense to that observation, and updates
  with SGD and heavy-ball momentum in PyTorch's form: v ← μ v + D(g_t), θ ← θ − η v (Nesterov's form,
  a learning-rate schedule and weight decay as options). Training images can be augmented
  (:class:`Augmentation`: random crops and horizontal flips, the usual CIFAR recipe).
* :func:`train_fedavg`: FedAvg (McMahan et al., 2017) with K clients holding equal shards; each round
  every client runs :func:`gradjax.clients.local_sgd` from the global θ, sends its update
  Δ_k = θ − θ_k, the defense acts on each Δ_k, and the server steps θ ← θ − (1/K) Σ_k D(Δ_k)
  (:func:`gradjax.clients.aggregate`, server learning rate 1).

A defense that is applied during training is "the model trained with that defense": its test accuracy
(:func:`evaluate`) is the utility to set against the attack's PSNR.

BatchNorm (convnet and the ResNets; lenet_zhu, lenet5 and mlp have none): by default the model runs in
evaluation mode (``train=False``), as the attacked clients do by default, and ``batch_stats`` are kept
unchanged, so BatchNorm acts as a fixed affine map with the initial running statistics and only
``params`` are trained. :func:`train_fedsgd` with ``train_mode=True`` trains as usual for such
networks: every step normalises by the mini-batch's statistics and updates the running ones
(μ̂ ← 0.9 μ̂ + 0.1 μ_B, PyTorch's momentum), so the checkpoint carries the running statistics that the
BatchNorm prior of :mod:`gradjax.priors` reads.
"""

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradjax import clients as client_lib
from gradjax import data as data_lib
from gradjax.data import Dataset
from gradjax.defenses import Defense
from gradjax.losses import cross_entropy
from gradjax.observation import Observation

Callback = Callable[[int, dict, dict], dict | None]


# --- data ---------------------------------------------------------------------------------------


class Split(NamedTuple):
  """A train/test split of one dataset; ``*_indices`` index the images of the source dataset."""

  train: Dataset
  test: Dataset
  train_indices: np.ndarray
  test_indices: np.ndarray


def split_indices(n: int, train_count: int, test_count: int, seed: int | None = None,
                  name: str = "the dataset") -> tuple[np.ndarray, np.ndarray]:
  """The indices :func:`split` takes from a dataset of ``n`` images: (train (N,), test (M,)), so
  that a large source need only be read at those (``data.load(indices=...)``)."""
  if train_count < 1 or test_count < 0 or train_count + test_count > n:
    raise ValueError(f"need 1 <= train count and train + test count <= {n} images of "
                     f"{name!r}, got {train_count} + {test_count}")
  order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
  return order[:train_count], order[train_count:train_count + test_count]


def split(dataset: Dataset, train_count: int, test_count: int, seed: int | None = None) -> Split:
  """Images 0..N−1 for training and N..N+M−1 for testing, after a permutation when ``seed`` is given.

  Args:
    dataset: the source images (e.g. ``data.load("mnist")``, MNIST's 10000 test images).
    train_count, test_count: N ≥ 1 and M ≥ 0; N + M must not exceed the dataset.
    seed: ``None`` keeps the source order; an int permutes the images first with
      ``np.random.default_rng(seed).permutation`` (needed for class-sorted sources such as
      ``lfw_subset``).
  """
  tr, te = split_indices(len(dataset.x), train_count, test_count, seed, dataset.name)

  def part(idx):
    names = dataset.class_names
    if dataset.name == "skimage" and names is not None:  # names aligned with the images there
      names = tuple(names[i] for i in idx)
    return dataset._replace(x=dataset.x[idx], y=dataset.y[idx], class_names=names)

  return Split(part(tr), part(te), tr, te)


def load_split(name: str, train_count: int, test_count: int, seed: int | None = None, *,
               data_dir: str | None = None, image_size: tuple[int, int] | None = None,
               channels: int | None = None) -> Split:
  """:func:`split` of dataset ``name`` (``data.load``'s arguments), reading only the split's images
  where the source's size is known without decoding it (``data.count``: CIFAR-10's 50000 training
  JPEGs), every image otherwise."""
  n = data_lib.count(name, data_dir=data_dir)
  if n is None:
    return split(data_lib.load(name, data_dir=data_dir, image_size=image_size, channels=channels),
                 train_count, test_count, seed)
  train, test = split_indices(n, train_count, test_count, seed, name)
  ds = data_lib.load(name, data_dir=data_dir, indices=np.concatenate([train, test]),
                     image_size=image_size, channels=channels)
  return split(ds, len(train), len(test))._replace(train_indices=train, test_indices=test)


# --- evaluation ---------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def _correct(apply_fn, variables, x, y):
  return jnp.sum(jnp.argmax(apply_fn(variables, x, False), axis=-1) == y)


def evaluate(apply_fn, variables, x, y, batch_size: int = 500) -> float:
  """Test accuracy (1/N) Σ_n [argmax_k f_θ(x_n)_k = y_n], the model in evaluation mode; for a
  language model the next-token accuracy over every position of every sentence (a masked one's:
  over the positions with a target, y ≥ 0).

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: the model variables.
    x: (N, H, W, C) inputs or (N, T) token ids; y: (N,) int labels or (N, T) next tokens.
    batch_size: examples per jitted forward pass (the last batch may be smaller).

  Ties in the logits go to the lowest class index (``argmax``).
  """
  x, y = np.asarray(x), np.asarray(y)
  if x.ndim not in (2, 4) or y.shape != x.shape[:1 if x.ndim == 4 else 2] or len(x) == 0:
    raise ValueError(f"evaluate needs x (N, H, W, C) and y (N,), or token ids x and y (N, T), with "
                     f"N >= 1, got {x.shape} and {y.shape}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  correct = 0
  for start in range(0, len(x), batch_size):
    correct += int(_correct(apply_fn, variables, x[start:start + batch_size], y[start:start + batch_size]))
  return correct / max(int(np.sum(y >= 0)), 1)


# --- augmentation -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """Random crops and horizontal flips of training images: torchvision's ``RandomCrop(H,
  padding)`` followed by ``RandomHorizontalFlip()``, the CIFAR augmentation of He et al. (2016) that
  Inverting Gradients' trained models use (``inversefed/data/data_processing.py``: padding 4).

  Attributes:
    padding: p ≥ 0 pixels of ``fill`` added on every side before an H × W window is cut at a
      uniformly drawn offset.
    flip: mirror left-right with probability 1/2.
    fill: the padding's value in the data's space, one float or one per channel. torchvision pads
      the [0, 1] image with black before normalising, so for normalised data this is black
      normalised, (0 − mean) / std per channel.
  """

  padding: int = 4
  flip: bool = True
  fill: float | tuple[float, ...] = 0.0

  def __post_init__(self):
    if isinstance(self.padding, bool) or not isinstance(self.padding, (int, np.integer)) or self.padding < 0:
      raise ValueError(f"augmentation padding must be an integer >= 0, got {self.padding!r}")
    fill = np.atleast_1d(np.asarray(self.fill, np.float64))
    if fill.ndim != 1 or not np.all(np.isfinite(fill)):
      raise ValueError(f"augmentation fill must be finite, one value or one per channel, got {self.fill!r}")
    object.__setattr__(self, "fill", tuple(float(v) for v in fill) if fill.size > 1 else float(fill[0]))


def augment(x: jax.Array, key: jax.Array, augmentation: Augmentation) -> jax.Array:
  """One draw of ``augmentation`` on a batch: x (B, H, W, C) → (B, H, W, C).

  Example n is padded by p on every side with ``fill``, cut to rows o_n0 … o_n0 + H − 1 and columns
  o_n1 … o_n1 + W − 1 of the padded image, then mirrored (column j ← column W − 1 − j) where f_n, with

    o = jax.random.randint(fold_in(key, 0), (B, 2), 0, 2p + 1),
    f = jax.random.bernoulli(fold_in(key, 1), 0.5, (B,))   (all False unless ``augmentation.flip``).
  """
  if x.ndim != 4:
    raise ValueError(f"augment needs images (B, H, W, C), got shape {x.shape}")
  b, h, w, c = x.shape
  fill = jnp.asarray(augmentation.fill, x.dtype)
  if fill.size not in (1, c):
    raise ValueError(f"augmentation fill has {fill.size} values for {c} channels")
  p = augmentation.padding
  padded = jnp.broadcast_to(fill, (b, h + 2 * p, w + 2 * p, c)).at[:, p:p + h, p:p + w].set(x)
  offsets = jax.random.randint(jax.random.fold_in(key, 0), (b, 2), 0, 2 * p + 1)
  crop = jax.vmap(lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (h, w, c)))(padded, offsets)
  if not augmentation.flip:
    return crop
  flips = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.5, (b,))
  return jnp.where(flips[:, None, None, None], crop[:, :, ::-1], crop)


# --- FedSGD -------------------------------------------------------------------------------------


def batch_order(key: jax.Array, epoch: int, num_samples: int, batch_size: int) -> jax.Array:
  """The example indices of epoch ``epoch``'s mini-batches, (num_samples // batch_size, batch_size).

  ``jax.random.permutation(fold_in(key, epoch), num_samples)`` cut into consecutive batches; the last
  ``num_samples % batch_size`` examples of the permutation are left out of that epoch.
  """
  steps = num_samples // batch_size
  perm = jax.random.permutation(jax.random.fold_in(key, epoch), num_samples)
  return jnp.reshape(perm[:steps * batch_size], (steps, batch_size))


def _defended(defense, gradient, variables, num_samples, key, threat_model, local=None):
  if defense is None:
    return gradient
  observation = Observation(gradient=gradient, variables=variables, num_samples=num_samples,
                            threat_model=threat_model, local=local)
  return defense.apply(observation, key).gradient


def _module(apply_fn):
  module = getattr(apply_fn, "module", None)
  if module is None:
    raise ValueError("training in train mode needs a gradjax model's apply_fn (apply_fn.module, "
                     "gradjax.models.make_apply_fn) to update the BatchNorm statistics")
  return module


def sgd(learning_rate: float | optax.Schedule, momentum: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False) -> optax.GradientTransformation:
  """PyTorch's ``torch.optim.SGD`` (dampening 0) as an optax transformation. With d_t = g_t + λ θ_t
  (weight decay λ added to the gradient), v_{t+1} = μ v_t + d_t (v_0 = 0) and

    θ_{t+1} = θ_t − η_t v_{t+1}              (heavy ball)
    θ_{t+1} = θ_t − η_t (d_t + μ v_{t+1})    (``nesterov``),

  where η_t = ``learning_rate(t)`` for an optax schedule (t counts updates from 0), else constant.
  """
  return optax.chain(optax.add_decayed_weights(weight_decay) if weight_decay else optax.identity(),
                     optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov))


def step_decay(learning_rate: float, milestones: tuple[int, ...], steps_per_epoch: int,
               gamma: float = 0.1) -> optax.Schedule:
  """PyTorch's ``MultiStepLR`` stepped once per epoch, as a schedule over steps: η_t =
  ``learning_rate`` · γ^k for step t of epoch ⌊t / S⌋ + 1 (S = ``steps_per_epoch``), where k counts the
  milestones m with m ≤ ⌊t / S⌋, i.e. the rate drops by γ after epoch m. Inverting Gradients' training
  drops by 0.1 after epochs 44, 75 and 105 of 120 (``inversefed/training/training_routine.py``)."""
  if steps_per_epoch < 1 or not learning_rate > 0 or not 0 < gamma:
    raise ValueError(f"step decay needs steps_per_epoch >= 1, learning rate > 0 and gamma > 0, got "
                     f"{steps_per_epoch}, {learning_rate} and {gamma}")
  if any(m < 1 for m in milestones) or list(milestones) != sorted(set(milestones)):
    raise ValueError(f"milestones must be increasing epochs >= 1, got {list(milestones)}")
  # optax scales from the step count equal to a boundary on: step m·S is the first of epoch m + 1.
  return optax.piecewise_constant_schedule(learning_rate, {m * steps_per_epoch: gamma for m in milestones})


@functools.partial(jax.jit, static_argnames=("apply_fn", "optimizer", "defense", "train_mode",
                                             "augmentation"))
def _sgd_epoch(apply_fn, optimizer, defense, train_mode, augmentation, variables, opt_state, x, y,
               order, step0, defense_key, augment_key):
  """One epoch of defended SGD steps as a ``lax.scan`` over the rows of ``order``; returns the new
  variables (params and, in train mode, the updated ``batch_stats``), optimizer state and step
  losses."""

  def step(carry, idx):
    current, opt_state, t = carry
    xb, yb = x[idx], y[idx]
    if augmentation is not None:
      xb = augment(xb, jax.random.fold_in(augment_key, t), augmentation)

    def loss_fn(p):
      if train_mode:
        logits, state = _module(apply_fn).apply({**current, "params": p}, xb, train=True,
                                                mutable=["batch_stats"])
        return cross_entropy(logits, yb), state["batch_stats"]
      return cross_entropy(apply_fn({**current, "params": p}, xb, False), yb), None

    (loss, stats), grad = jax.value_and_grad(loss_fn, has_aux=True)(current["params"])
    grad = _defended(defense, grad, current, idx.shape[0], jax.random.fold_in(defense_key, t), "fedsgd")
    updates, opt_state = optimizer.update(grad, opt_state, current["params"])
    new = {**current, "params": optax.apply_updates(current["params"], updates)}
    if train_mode:  # Flax keeps running statistics in float32 whatever the parameters' dtype
      new["batch_stats"] = jax.tree.map(lambda a, b: a.astype(b.dtype), stats, current["batch_stats"])
    return (new, opt_state, t + 1), loss

  (variables, opt_state, _), losses = jax.lax.scan(step, (variables, opt_state, step0), order)
  return variables, opt_state, losses


def _check_data(apply_fn, variables, x, y):
  if not isinstance(variables, dict) or "params" not in variables:
    raise ValueError("variables must be a dict with a 'params' entry")
  x, y = client_lib.check_client_data(apply_fn, variables, x, y)
  return x, y


@jax.jit
def _all_finite(params) -> jax.Array:
  """Whether every parameter is finite: one program, not two per tensor."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))


def _check_finite(params, what: str):
  if not bool(_all_finite(params)):
    raise FloatingPointError(f"training diverged: non-finite parameters after {what}")


def _run_callback(callback, index, variables, record, history):
  if callback is not None:
    extra = callback(index, variables, dict(record))
    if extra:
      record.update(extra)
  history.append(record)


def check_sgd(num_samples: int, epochs: int, batch_size: int, learning_rate: float | optax.Schedule,
              momentum: float, weight_decay: float = 0.0, nesterov: bool = False,
              names: dict[str, str] | None = None) -> None:
  """One-line ValueError unless the SGD settings are usable on ``num_samples`` training images (a
  schedule is checked at its first step), naming the setting that is not (``names``: each
  argument's name for the user, e.g. its flag; default the words below)."""
  n = {"epochs": "epochs", "batch_size": "batch size", "learning_rate": "learning rate",
       "momentum": "momentum", "weight_decay": "weight decay", "nesterov": "Nesterov's momentum",
       **(names or {})}
  if epochs < 1:
    raise ValueError(f"{n['epochs']} must be at least 1, got {epochs}")
  if not 1 <= batch_size <= num_samples:
    raise ValueError(f"{n['batch_size']} must lie in 1..{num_samples} (the training images), got "
                     f"{batch_size}")
  first = float(learning_rate(0)) if callable(learning_rate) else learning_rate
  if not first > 0:
    raise ValueError(f"{n['learning_rate']} must be positive, got {first}")
  if not 0 <= momentum < 1:
    raise ValueError(f"{n['momentum']} must lie in [0, 1), got {momentum}")
  if not weight_decay >= 0:
    raise ValueError(f"{n['weight_decay']} must be >= 0, got {weight_decay}")
  if nesterov and not momentum > 0:
    raise ValueError(f"{n['nesterov']} needs momentum > 0 ({n['momentum']})")


# Fifteen parameters: the model and data, then one keyword per training hyper-parameter, as the train
# program's flags set them (a configuration record comes with the config-files issue).
def train_fedsgd(apply_fn, variables, x, y, *, key: jax.Array, epochs: int, batch_size: int,
                 learning_rate: float | optax.Schedule, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, defense: Defense | None = None,
                 train_mode: bool = False, augmentation: Augmentation | None = None,
                 callback: Callback | None = None):
  """Central / FedSGD training with a defense on every step's gradient.

  Epoch e (1-based) visits the mini-batches of :func:`batch_order` ``(fold_in(key, 0), e, N, B)``;
  step t (0-based, counted over all epochs) computes the mean cross-entropy gradient g_t of its batch
  at the current parameters θ_t (model in evaluation mode), on the batch's images augmented by
  :func:`augment` with key ``fold_in(fold_in(key, 2), t)`` when ``augmentation`` is given, defends it
  with ``defense.apply(Observation(g_t, ...), fold_in(fold_in(key, 1), t))`` and updates

    v_{t+1} = μ v_t + D(g_t) + λ θ_t,   θ_{t+1} = θ_t − η_t v_{t+1},   v_0 = 0

  (:func:`sgd`: PyTorch's SGD with momentum and weight decay λ on every parameter, dampening 0;
  ``nesterov`` steps by D(g_t) + λ θ_t + μ v_{t+1} instead; the decay is the client's own, not part of
  the gradient it shares, so the defense does not see it). ``batch_stats`` are left unchanged unless
  ``train_mode`` (module docstring).

  Args:
    apply_fn: ``apply_fn(variables, x, train) -> logits``.
    variables: initial ``{"params": θ_0, ...}``.
    x: (N, H, W, C) training inputs; y: (N,) int labels (or (N, T) token ids and next tokens).
    key: PRNG key (shuffling, the augmentation and the defense's noise).
    epochs: passes over the data, ≥ 1; each has ⌊N / B⌋ steps.
    batch_size: B, 1 ≤ B ≤ N.
    learning_rate: η > 0, or an optax schedule t ↦ η_t over the steps (e.g. the step decay of
      :func:`step_decay`). momentum: μ ∈ [0, 1). weight_decay: λ ≥ 0. nesterov: Nesterov's momentum.
    defense: applied to every step's gradient; ``None`` for none.
    train_mode: run the model in training mode: BatchNorm normalises by each mini-batch's statistics
      and updates its running statistics (needs ``apply_fn.module``; a model without ``batch_stats``
      is unaffected).
    augmentation: random crops and flips of every batch's images (:class:`Augmentation`); ``None``
      trains on the images as they are.
    callback: ``callback(epoch, variables, record) -> dict | None`` after every epoch; a returned dict
      is merged into that epoch's history record (e.g. ``{"accuracy": evaluate(...)}``).

  Returns:
    ``(variables, history)``: the trained variables and one record per epoch, ``{"epoch", "steps",
    "train_loss" (mean of the steps' mini-batch losses, before each update), "time_s"}``.

  Raises:
    ValueError: bad data or hyperparameters. FloatingPointError: non-finite parameters after an epoch.
  """
  x, y = _check_data(apply_fn, variables, x, y)
  n = x.shape[0]
  check_sgd(n, epochs, batch_size, learning_rate, momentum, weight_decay, nesterov)
  if augmentation is not None and (not isinstance(augmentation, Augmentation) or x.ndim != 4):
    raise ValueError("augmentation must be a training.Augmentation, on images (N, H, W, C)")
  shuffle_key, defense_key = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
  optimizer = sgd(learning_rate, momentum, weight_decay, nesterov)
  opt_state = optimizer.init(variables["params"])
  train_mode = bool(train_mode) and "batch_stats" in variables
  if train_mode:
    _module(apply_fn)
  history, step = [], 0
  for epoch in range(1, epochs + 1):
    start = time.perf_counter()
    order = batch_order(shuffle_key, epoch, n, batch_size)
    variables, opt_state, losses = _sgd_epoch(apply_fn, optimizer, defense, train_mode, augmentation,
                                              dict(variables), opt_state, x, y, order,
                                              jnp.asarray(step, jnp.uint32), defense_key,
                                              jax.random.fold_in(key, 2))
    step += order.shape[0]
    _check_finite(variables, f"epoch {epoch}")
    record = {"epoch": epoch, "steps": step, "train_loss": float(jnp.mean(losses)),
              "time_s": time.perf_counter() - start}
    _run_callback(callback, epoch, variables, record, history)
  return variables, history


# --- FedAvg -------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("apply_fn", "local", "defense"))
def _client_update(apply_fn, local, defense, variables, x, y, key):
  """One client's defended update D(θ − local_sgd(θ)) for its shard (x, y)."""
  new = client_lib.local_sgd(apply_fn, variables, x, y, local)
  update = jax.tree.map(jnp.subtract, variables["params"], new)
  return _defended(defense, update, variables, x.shape[0], key, "fedavg", local)


# Ten parameters: the model and data, the federation (rounds, clients, local training), the defense
# and the callback.
def train_fedavg(apply_fn, variables, x, y, *, key: jax.Array, rounds: int, clients: int,
                 local: client_lib.LocalTraining, defense: Defense | None = None,
                 callback: Callback | None = None):
  """Simulated FedAvg with a defense on every client's update.

  The N examples are cut, in order, into K = ``clients`` shards of S = ⌊N / K⌋ examples (shard k holds
  examples kS .. kS + S − 1; the remaining N − KS are unused). Round r (1-based) sends θ_r to every
  client; client k runs :func:`gradjax.clients.local_sgd` with ``local`` on its shard (in order, model
  in evaluation mode) and sends Δ_k = θ_r − θ_k, defended with key ``fold_in(fold_in(key, r), k)``;
  the server averages (:func:`gradjax.clients.aggregate`) and steps θ_{r+1} = θ_r − (1/K) Σ_k D(Δ_k).
  Without a defense, one client and one round give exactly :func:`gradjax.clients.fedavg`'s update.

  Args:
    apply_fn, variables, x, y, defense: as :func:`train_fedsgd`.
    key: PRNG key of the defenses' noise.
    rounds: communication rounds, ≥ 1.
    clients: K ≥ 1, at most N.
    local: the clients' :class:`gradjax.clients.LocalTraining`; its batch size must divide S.
    callback: ``callback(round, variables, record) -> dict | None`` after every round (see
      :func:`train_fedsgd`).

  Returns:
    ``(variables, history)``, one record per round: ``{"round", "update_norm" (L2 norm of the
    aggregated update), "time_s"}``.
  """
  num_clients = clients  # the argument's name is the module's; client_lib is the module
  x, y = _check_data(apply_fn, variables, x, y)
  if rounds < 1 or not 1 <= num_clients <= x.shape[0]:
    raise ValueError(f"need rounds >= 1 and 1 <= clients <= {x.shape[0]}, got {rounds} and "
                     f"{num_clients}")
  if not isinstance(local, client_lib.LocalTraining):
    raise ValueError(f"local must be a clients.LocalTraining, got {type(local).__name__}")
  shard = x.shape[0] // num_clients
  client_lib.check_local_training(local, shard)
  history = []
  for r in range(1, rounds + 1):
    start = time.perf_counter()
    round_key = jax.random.fold_in(key, r)
    observations = []
    for k in range(num_clients):
      xs, ys = x[k * shard:(k + 1) * shard], y[k * shard:(k + 1) * shard]
      update = _client_update(apply_fn, local, defense, variables, xs, ys,
                              jax.random.fold_in(round_key, k))
      observations.append(Observation(gradient=update, variables=variables, num_samples=shard,
                                      threat_model="fedavg", local=local))
    mean = client_lib.aggregate(observations).gradient
    params = jax.tree.map(jnp.subtract, variables["params"], mean)
    _check_finite(params, f"round {r}")
    variables = {**variables, "params": params}
    norm = float(jnp.sqrt(sum(jnp.sum(jnp.square(u)) for u in jax.tree.leaves(mean))))
    record = {"round": r, "update_norm": norm, "time_s": time.perf_counter() - start}
    _run_callback(callback, r, variables, record, history)
  return variables, history
