"""One image experiment end to end: data -> model -> client -> attack -> metrics, for a built
:class:`gradjax.run.config.Config` (a text experiment: :mod:`gradjax.run.text_run`, which reads
this module's seeding, trace, timing and verdict fields).

The command-line programs in ``experiments/`` are thin wrappers around :func:`run`, so a single
reconstruction, a sweep over an image range and a test all take the same path.

Two sources of the observation: a simulated client (the default: ``dataset`` images through
``client``), or files captured from a real system (``weights`` and ``observation``, PyTorch layout,
:mod:`gradjax.interop`). For captured files the ground truth is optional: with a ``dataset`` the
reconstruction is scored against images ``index .. index + N − 1``; without one the run reports the
reconstruction and the objective only.

Seeding (:func:`experiment_keys`). Experiment ``index`` uses base = ``jax.random.fold_in(key(seed),
index)`` and five streams of it: the model's (``fold_in(base, 0)``), the attack's (1; restart r
draws from ``split(key, R)[r]``), the defense applied to the update (2; a chain's part i
``split(key, n)[i]``), the server's label inference (3) and the simulated client's own draws (4:
DP-SGD's batches and noise), so every image of a sweep attacks a fresh random
model (as the DLG / iDLG protocols do), a single run of image ``i`` reproduces row ``i`` of a
sweep, and no party draws another's numbers (under JAX's partitionable threefry, the default,
``split(k, n)[i]`` is ``fold_in(k, i)``: the streams are numbered apart).
"""

import dataclasses
import math
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import adaptive, attacks, auto, checkpoint, clients, closed_forms, compilation, data
from gradjax import defenses, driver, fidelity, files, interop, lpips, malicious, metrics, models
from gradjax import objectives, presets
from gradjax.run import config, resume
from gradjax import verdict
from gradjax import labels as labels_lib
from gradjax import privacy as privacy_lib
from gradjax.run.config import Config, attacked_model, check, fingerprint, labels_shared

# The options that name files the attack reads; a saved state records their digests.
INPUT_FILES = ("model.checkpoint", "model.weights", "client.observation")

class Keys(NamedTuple):
  """The PRNG keys of one experiment (:func:`experiment_keys`), one per party."""

  model: jax.Array    # the simulated model's initialisation
  attack: jax.Array   # the attack's restarts
  defense: jax.Array  # the defense applied to the update the client sends
  server: jax.Array   # what the server infers before the attack (labels from auxiliary images)
  client: jax.Array   # the simulated client's own draws (DP-SGD's Poisson batches and noise)


def experiment_keys(seed: int, index: int) -> Keys:
  """The PRNG keys of experiment ``index`` (see the module docstring)."""
  return Keys(*_experiment_keys(seed, index))


@compilation.once
def _experiment_keys(seed, index):
  # One program: derived eagerly, each operation was a program of its own.
  base = jax.random.fold_in(jax.random.key(seed), index)
  key_model, key_attack = jax.random.split(base)  # fold_in(base, 0) and fold_in(base, 1)
  return (key_model, key_attack, *(jax.random.fold_in(base, k) for k in (2, 3, 4)))


def dp_sgd_steps(cfg: Config) -> int:
  """T of the client's DP-SGD budget: the defense section's ``dp_sgd_steps``, and for a simulated
  FedAvg client at least what its round itself took of each example: its local epochs with fixed
  mini-batches (one step an epoch, at rate 1), its local steps with Poisson sampling (each draws
  from all its examples)."""
  steps = cfg.defense.dp_sgd_steps
  if not cfg.client.observation and cfg.client.name == "fedavg":
    local = cfg.client.local_training()
    steps = max(steps, local.steps(cfg.data.batch_size) if cfg.defense.dp_sgd_poisson else local.epochs)
  return steps


def dp_sgd_privacy(cfg: Config) -> dict | None:
  """The client's DP-SGD (the defense section's) and its (ε, δ) over its training
  (:func:`gradjax.privacy.epsilon` over :func:`dp_sgd_steps`; ε None without noise: no guarantee);
  None without DP-SGD. ``steps_declared``: the section's count where the simulated round took
  more."""
  dp_sgd, section = cfg.defense.dp_sgd(), cfg.defense
  if dp_sgd is None:
    return None
  steps = dp_sgd_steps(cfg)
  budget = (None if not dp_sgd.noise_multiplier else
            privacy_lib.epsilon(section.dp_sgd_sampling_rate, dp_sgd.noise_multiplier, steps,
                                section.dp_sgd_delta))
  privacy = {"max_norm": dp_sgd.max_norm, "noise_multiplier": dp_sgd.noise_multiplier,
             "sampling_rate": section.dp_sgd_sampling_rate, "steps": steps,
             "delta": section.dp_sgd_delta, "epsilon": None if budget is None else budget.epsilon,
             "order": None if budget is None else budget.order}
  if steps != section.dp_sgd_steps:
    privacy["steps_declared"] = section.dp_sgd_steps
  if not dp_sgd.noise_multiplier and cfg.client.observation and not any(
      "dp_sgd_noise_multiplier" in interop.read_metadata(f)
      for f in (cfg.model.weights, cfg.client.observation) if f):
    # A capture that declares its clipping bound and no noise: read as clipping only, not known.
    privacy["noise_multiplier_declared"] = False
  return privacy


def simulated_client(cfg: Config, share_labels: bool, key_client: jax.Array) -> Callable:
  """``cfg``'s client (:meth:`gradjax.run.config.ClientConfig.build`), with the DP-SGD step the
  defense section gives, its draws and noise from ``key_client`` (:attr:`Keys.client`)."""
  dp_sgd = cfg.defense.dp_sgd()
  key = None if dp_sgd is None else key_client
  return cfg.client.build(share_labels=share_labels, dp_sgd=dp_sgd, key=key)


def poisson_draw(cfg: Config, batch: data.Dataset, observation, key_client: jax.Array):
  """A Poisson-sampled FedSGD client's step drew some of its ``batch`` (:func:`gradjax.clients.drawn`,
  with :func:`simulated_client`'s key): (those examples, the observation of as many), what the
  attack reconstructs and is scored against. Its dummy batch holds one example per example drawn
  (the count a server is not told: the attack is given it), and its sum's divisor qn stays the
  client's (:func:`adapted`)."""
  dp_sgd = cfg.defense.dp_sgd()
  draws = clients.drawn(dp_sgd, key_client, batch.x.shape[0])[0]
  if not draws.any():
    raise ValueError(f"the client's Poisson draw at rate {dp_sgd.sampling_rate:g} from its "
                     f"{batch.x.shape[0]} examples holds none (seed {cfg.seed}): its update is noise "
                     "alone, nothing to reconstruct (another --seed draws again)")
  names = batch.class_names  # by label; skimage's are the photos', aligned with x
  if names is not None and batch.name == "skimage":
    names = [n for n, d in zip(names, draws) if d]
  kept = batch._replace(x=batch.x[draws], y=batch.y[draws], class_names=names)
  return kept, observation.replace(num_samples=int(draws.sum()))


def image_bounds(norm: data.Normalization, channels: int) -> tuple[np.ndarray, np.ndarray]:
  """The [0, 1] image box in normalised input space: ((0 − mean) / std, (1 − mean) / std), (C,) each."""
  lo = np.asarray(data.normalize(np.zeros((1, channels), np.float64), norm))[0]
  hi = np.asarray(data.normalize(np.ones((1, channels), np.float64), norm))[0]
  return lo, hi


def load_batch(cfg: Config) -> data.Dataset:
  """The client's private batch: images ``index .. index + batch_size - 1`` of the dataset."""
  size = None if cfg.data.image_size is None else (cfg.data.image_size, cfg.data.image_size)
  try:
    return data.load(
        cfg.data.dataset,
        data_dir=cfg.data.data_dir,
        indices=range(cfg.data.index, cfg.data.index + cfg.data.batch_size),
        image_size=size,
        channels=cfg.data.channels)
  except ValueError as e:
    if "out of range" not in str(e):
      raise
    # No flag named: a table's experiments take their index from --start and --count.
    raise ValueError(
        f"the client's batch is images {cfg.data.index}..{cfg.data.index + cfg.data.batch_size - 1}; "
        f"{e}") from None


def hfginv_labels(cfg: Config, model, observation, norm, key) -> jax.Array:
  """HFGInv's labels of ``observation`` (:func:`gradjax.labels.hfginv`), its feature profile from
  ``cfg.attack.aux`` images of the dataset after the attacked batch, which the client does not hold."""
  if cfg.data.dataset is None:
    raise ValueError("--labels=hfginv reads auxiliary images of --dataset; none is given")
  if cfg.attack.aux < 2:
    raise ValueError(f"--config.attack.aux must be at least 2 images, got {cfg.attack.aux}")
  start = cfg.data.index + observation.num_samples
  size = None if cfg.data.image_size is None else (cfg.data.image_size, cfg.data.image_size)
  try:
    aux = data.load(
        cfg.data.dataset,
        data_dir=cfg.data.data_dir,
        indices=range(start, start + cfg.attack.aux),
        image_size=size,
        channels=cfg.data.channels)
  except ValueError as e:
    if "out of range" not in str(e):
      raise
    raise ValueError(f"--labels=hfginv takes --config.attack.aux {cfg.attack.aux} images after the batch, "
                     f"{start}..{start + cfg.attack.aux - 1}; {e}") from None
  profile = labels_lib.feature_profile(model.apply_fn, model.variables,
                                       jnp.asarray(data.normalize(aux.x, norm), np.float32))
  return labels_lib.hfginv(observation, profile, key)


# LLG*'s dummy inputs: U(0, 1) images the server runs through its copy of the model (as many as in
# experiments/studies/batch_labels, where they give 0.994 of the labels of LeNet batches of 8 against
# plain LLG's 0.881).
LLG_STAR_DUMMIES = 16


def llg_star_labels(model, observation, norm, key) -> jax.Array:
  """LLG*'s labels of ``observation``, (N,) int: :func:`gradjax.labels.llg` with the impact and
  offset of :func:`gradjax.labels.llg_statistics` measured on :data:`LLG_STAR_DUMMIES` dummy
  U(0, 1) images (normalised as the client's) through the model the server sent."""
  dummy = np.asarray(compilation.uniform(key, (LLG_STAR_DUMMIES, *model.input_shape)))
  dummy = jnp.asarray(data.normalize(dummy, norm), jnp.float32)
  impact, offset = labels_lib.llg_statistics(model.apply_fn, model.variables, dummy,
                                             observation.num_samples, train=observation.train)
  return labels_lib.llg(observation, impact=impact, offset=offset)


def _captured(cfg: Config, batch: data.Dataset | None, conv: str):
  """(model, observation, metadata) from the captured files of ``cfg``, the model's convolutions
  computed by ``conv`` (:func:`model_conv`)."""
  input_shape = None
  if batch is not None:
    input_shape = batch.x.shape[1:]
  elif cfg.data.image_size is not None:
    input_shape = (cfg.data.image_size, cfg.data.image_size, cfg.data.channels or 3)
  module_kwargs = dict(remat=bool(cfg.execution.remat), conv=conv)
  if cfg.model.act is not None:
    module_kwargs["act"] = cfg.model.act
  imported = interop.load(
      cfg.model.weights,
      cfg.client.observation,
      model=cfg.model.name,
      input_shape=input_shape,
      num_classes=cfg.model.num_classes,
      rename=interop.parse_renames(cfg.model.rename),
      num_samples=cfg.client.num_samples,
      train=cfg.client.train_mode or None,
      **module_kwargs)
  taken = tuple(imported.model.input_shape)
  if cfg.data.channels is not None and taken[-1] != cfg.data.channels:
    raise ValueError(
        f"--config.data.channels={cfg.data.channels}, but the captured model takes {taken[-1]}-channel "
        f"inputs ({'x'.join(map(str, taken))})")
  return imported.model, imported.observation, imported.metadata


def _simulated(cfg: Config, batch: data.Dataset, norm, key_model, conv: str):
  """The model the simulated client of ``cfg`` trains: a fresh zoo model or a checkpoint's, its
  convolutions computed by ``conv`` (:func:`model_conv`)."""
  num_classes = cfg.model.num_classes or batch.num_classes
  if num_classes < 2 and not cfg.model.checkpoint:
    raise ValueError(f"dataset {cfg.data.dataset!r} gives its images one class (a folder without class "
                     "subfolders): give the model's classes with --config.model.num_classes (at least 2)")
  if int(batch.y.max()) >= num_classes:
    raise ValueError(f"labels reach {int(batch.y.max())} but the model has {num_classes} classes")
  input_shape = batch.x.shape[1:]
  if cfg.model.checkpoint:
    model = checkpoint.load_model(
        cfg.model.checkpoint, remat=bool(cfg.execution.remat), conv=conv)
    if models.is_text(model.name):
      raise ValueError(f"checkpoint {cfg.model.checkpoint} holds a text model ({model.name}): add "
                       "--modality=text (and a corpus, --dataset)")
    saved = checkpoint.load(cfg.model.checkpoint)[1].get("normalization", "none")
    if saved != (cfg.data.normalization or "none"):
      raise ValueError(
          f"checkpoint {cfg.model.checkpoint} was trained with normalization {saved!r}, "
          f"not {cfg.data.normalization or 'none'!r}")
    if tuple(model.input_shape) != tuple(input_shape) or model.num_classes < batch.num_classes:
      raise ValueError(
          f"checkpoint {cfg.model.checkpoint} holds a model for {tuple(model.input_shape)} "
          f"inputs and {model.num_classes} classes; the data is {tuple(input_shape)} "
          f"with {batch.num_classes} classes")
  else:
    model = cfg.model.build(key_model, input_shape, num_classes, conv=conv,
                            remat=bool(cfg.execution.remat))
  return model


class Trace:
  """The objective after every solver chunk, and the PSNR of the current best iterate when a ground
  truth is given: ``rows`` of ``{"restart", "iteration", "loss"[, "psnr"]}`` (restart ``None`` when
  all restarts advance together; then ``loss`` is the best over them), from the first report with a
  best iterate (an attack's ``track_from`` delays it).

  Pass :meth:`progress` as the solver's ``callback`` and :meth:`monitor` as its ``monitor``; with a
  ``deadline`` (a ``time.perf_counter()`` value) the monitor ends the run at the first chunk past it,
  with a ``target_psnr`` (dB, given a ground truth) at the first chunk whose best iterate reaches it.
  """

  def __init__(self, callback: Callable | None = None, truth: np.ndarray | None = None,
               norm: data.Normalization | None = None, deadline: float | None = None,
               target_psnr: float | None = None):
    self.rows: list[dict] = []
    self._callback, self._truth, self._norm, self._deadline = callback, truth, norm, deadline
    self.target = target_psnr
    self._recorded = False  # whether the last report made a row (monitor scores that row)

  def progress(self, p) -> None:
    # No row before there is a best iterate (its objective is inf until the attack's track_from).
    self._recorded = not p.compiling and math.isfinite(p.best_loss)
    if self._recorded:
      self.rows.append({"restart": p.restart, "iteration": int(p.iteration), "loss": float(p.best_loss)})
    if self._callback is not None:
      self._callback(p)

  def monitor(self, state) -> bool:
    if self._deadline is not None and time.perf_counter() >= self._deadline:
      return True
    if self._truth is None or not self._recorded:
      return False
    x = np.asarray(state.best_params["x"], np.float64)
    if x.ndim == 5:  # stacked restarts: the best one
      losses = np.asarray(state.best_loss, np.float64).reshape(-1)
      x = x[int(np.argmin(np.where(np.isfinite(losses), losses, np.inf)))]
    x = np.clip(np.asarray(data.denormalize(x, self._norm), np.float64), 0.0, 1.0)
    if np.all(np.isfinite(x)):
      order = metrics.match_order(x, self._truth) if x.shape[0] > 1 else np.arange(x.shape[0])
      self.rows[-1]["psnr"] = float(np.mean(metrics.psnr(x[order], self._truth)))
      return self.reached
    return False

  @property
  def scores(self) -> bool:
    """Whether the trace scores iterates (it has a ground truth)."""
    return self._truth is not None

  @property
  def reached(self) -> bool:
    """Whether the last PSNR recorded reaches ``target_psnr``."""
    return (self.target is not None and bool(self.rows)
            and self.rows[-1].get("psnr", -math.inf) >= self.target)


def input_digests(cfg: Config) -> dict[str, str]:
  """The SHA-256 of each input file the configuration names (:data:`INPUT_FILES`: a checkpoint, a
  capture's weights and update), by option: what a resumed run or a table's finished experiment
  compares, a file replaced since being another run's input."""
  return {p: files.sha256(config.get(cfg, p)) for p in INPUT_FILES if config.get(cfg, p)}


class Timing:
  """One experiment's wall time, counted across the runs that resumed it, and its solver-state
  ``saver`` (``None`` without a state file); restoring a state restores the trace's rows too."""

  def __init__(self, cfg: Config, state: resume.StateFile | None, trace: Trace):
    self.start, self.earlier_s, self.resumed, self.saver = time.perf_counter(), 0.0, False, None
    if state is not None:
      def restored(extra):
        rows = list(extra.get("history", []))
        if not all(isinstance(r, dict) and isinstance(r.get("iteration"), int) and files.is_number(r.get("loss"))
                   and (r.get("psnr") is None or files.is_number(r["psnr"]))
                   and "restart" in r and (r["restart"] is None or isinstance(r["restart"], int))
                   for r in rows):
          raise ValueError(f"{state.path}: its progress history holds rows that are not this "
                           f"program's (a restart, an iteration and an objective each); {state.afresh}")
        trace.rows = rows
        self.earlier_s, self.resumed = float(extra.get("wall_time_s", 0.0)), True

      spread = cfg.execution.shard and jax.process_count(
      ) > 1  # one attack over every process's devices
      saved_with = fingerprint(cfg)
      read = input_digests(cfg)
      if read:  # the files' contents, not only their paths: a file replaced since is another run
        saved_with["input_sha256"] = read
      if cfg.execution.shard:  # the restarts' split over devices shapes the vmapped programs' values
        saved_with["restarts_split_over"] = (f"{jax.device_count()} devices of "
                                             f"{jax.process_count()} processes")
      self.saver = state.saver(saved_with, on_restore=restored, collective=spread,
                               renamed=config.RENAMED, canonical=config.canonical, extra=lambda: {
          "history": trace.rows, "wall_time_s": self.wall_s()})

  def wall_s(self) -> float:
    return self.earlier_s + time.perf_counter() - self.start


def _diverged(rec: attacks.Reconstruction) -> int:
  """The restarts none of whose runs stayed finite (a permutation search runs each restart once
  per label-order candidate, runs ``r · K + k``)."""
  k = 1 if getattr(rec, "candidates", None) is None else len(rec.candidates)
  return int((~np.asarray(rec.restart_alive).reshape(-1, k)).all(axis=1).sum())


def common_results(cfg: Config, attack: attacks.Attack, rec: attacks.Reconstruction, model: models.Model,
            observation, trace: Trace, timing: Timing, adapted_to: str | None) -> dict[str, Any]:
  """The results every experiment reports: timing, counts, the objective, configuration, device;
  ``adaptation``: what the attack adapted to the defense ``adapted_to`` assumes (else None)."""
  saver = timing.saver
  return dict(
      wall_time_s=timing.wall_s(),
      iterations=int(rec.iterations[rec.best_restart]),
      evaluations=int(rec.evaluations.sum()),
      restarts=cfg.attack.restarts,
      resumed=timing.resumed,
      state_saves=0 if saver is None else saver.saves,
      state_save_s=0.0 if saver is None else saver.seconds,
      state_save_error=None if saver is None else saver.error,
      restarts_diverged=_diverged(rec),
      best_restart=rec.best_restart,
      # A closed form without an objective (the imprint's read-out) reports none.
      loss=(None if not isinstance(attack, attacks.Attack) and math.isnan(rec.loss) else rec.loss),
      history=trace.rows,
      model=model.name,
      num_samples=observation.num_samples,
      threat_model=observation.threat_model,
      attack=(attacks.describe(attack) if isinstance(attack, attacks.Attack)
              else {"closed_form": dataclasses.asdict(attack)}),
      adaptation=adaptation(attack, adapted_to),
      config=config.record(cfg, config.names()),
      device=str(jax.local_devices()[0]),
      devices=jax.device_count() if cfg.execution.shard else 1,
      processes=jax.process_count() if cfg.execution.shard else 1,
      backend=jax.default_backend(),
      jax_version=jax.__version__,
  )


def adaptation(attack, adapted_to: str | None) -> list[str] | None:
  """What an adapted ``attack`` assumes, one line per part: DP-SGD's clipping when its objective
  models it, then each part of the defense spec ``adapted_to`` its distance models
  (:func:`gradjax.adaptive.assumptions`); None for an attack not adapted."""
  lines, matched = [], getattr(attack, "matched", None)
  heads = {p.head for p in defenses.parts(defenses.parse(adapted_to))} if adapted_to else set()
  if getattr(matched, "max_norm", None) is not None:  # ClippedGradient, or a Replay of DP-SGD's steps
    lines.append(f"dp_sgd: the bound C = {matched.max_norm:g} (declared); each dummy example's "
                 "gradient is clipped to it over all parameters before the mean"
                 + (" in every replayed step" if isinstance(matched, objectives.Replay) else "")
                 + ", as the client's" + (" (its noise: the gaussian part)"
                                          if "gaussian" in heads else ""))
    if isinstance(matched, objectives.ClippedGradient) and matched.expected_batch_size is not None:
      lines.append(f"poisson: the step drew each example at rate q; one dummy example per example "
                   f"drawn, their clipped sum divided by qn = {matched.expected_batch_size:g}")
    if getattr(matched, "sampling_rate", None) is not None:
      lines.append(f"poisson: each step drew each example at rate q = {matched.sampling_rate:g}; "
                   "the draws unknown, every replayed step is their expectation, "
                   + ("the clipped mean over all the dummy examples" if matched.expected_batch_size is None
                      else f"q times the clipped sum over all the dummy examples divided by E = "
                           f"{matched.expected_batch_size:g}"))
  if adapted_to:
    lines += adaptive.assumptions(defenses.parse(adapted_to), attack.matched.name)
  return lines or None


def run(cfg: Config, *, callback: Callable | None = None, batch: data.Dataset | None = None,
        state: resume.StateFile | None = None, deadline: float | None = None,
        target_psnr: float | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Runs experiment ``cfg``; returns (JSON-ready results, images).

  ``state``: where the solver's state is saved every so often, and whether a saved one is continued
  (:mod:`gradjax.run.resume`; the file is refused unless it was saved by a run of the same
  :func:`fingerprint`). The caller deletes it once the results are written.

  ``deadline``: a ``time.perf_counter()`` value; the attack stops at the end of the first chunk past
  it, its best iterate so far kept (``--attack=auto``'s budget). ``target_psnr``: with a ground
  truth, the attack stops at the end of the first chunk whose best iterate reaches this PSNR (dB): a
  leak is established (the Flower gate's; ``auto`` hands it to each attack it tries).

  ``results`` holds the metrics (``psnr``, ``ssim``, ``mse``, ``label_accuracy`` and per-image values,
  scored after matching the batch order; absent without ground truth), ``wall_time_s`` of the attack
  (compilation included), iteration and evaluation counts, the objective value, labels, the
  configuration and the device, and ``time``: where the run's time went (:func:`time_spent`).
  ``images`` holds ``reconstruction`` (N, H, W, C) in [0, 1] space (in the ground truth's order when
  there is one, else in the attack's slot order) and ``ground_truth`` (or ``None``).
  """
  if cfg.data.modality != "image":
    raise ValueError(f"run() attacks images; a {cfg.data.modality} experiment runs with "
                     "gradjax.run.text_run.run_text()")
  cfg = config.with_declared(cfg)  # a capture's own account of its DP-SGD
  if cfg.attack.preset == auto.AUTO:
    return _run_auto(cfg, callback, batch, target_psnr)
  with driver.precision_scope(
      cfg.execution.matmul_precision):  # the client's update as well as the attack
    return _run_image(cfg, callback, batch, state, deadline, target_psnr)


def auto_attacks(cfg: Config) -> tuple[str, ...]:
  """The attacks ``--attack=auto`` tries on ``cfg``'s update (:func:`gradjax.auto.choose`): from a
  capture's metadata, or from the simulated client."""
  model = attacked_model(cfg)
  if cfg.client.observation:
    meta = {"kind": "gradient", **interop.read(cfg.client.observation).metadata}  # interop's default
    if cfg.client.num_samples:
      meta["num_samples"] = cfg.client.num_samples
    return auto.for_metadata({**meta, **({"act": cfg.model.act} if cfg.model.act else {})}, model)
  steps = 1
  if cfg.client.name == "fedavg":
    steps = cfg.client.local_training().steps(cfg.data.batch_size)
  return auto.choose(num_samples=cfg.data.batch_size, steps=steps, model=model, act=cfg.model.act)


def capture_label_source(name: str, meta: dict) -> str | None:
  """The label source for attack ``name`` on a capture whose ``meta`` (its metadata) holds no labels
  where the attack reads known ones: iDLG's sign rule for one example, LLG* for a batch (it counts
  duplicates, its impact measured on dummy images through the model the server sent); else None."""
  if (name in closed_forms.CLOSED_FORMS or "labels" in meta
      or presets.get_preset(name)().label_source is not labels_lib.known):
    return None
  return "idlg" if int(meta.get("num_samples") or 1) == 1 else "llg_star"


# Successive halving of the restarts a budget buys (rounds, fraction kept): a third of the steps in
# each round, half the restarts going on, so R restarts cost about 0.58 R single runs.
BUDGET_HALVING = (3, 0.5)
BUDGET_MAX_RESTARTS = 64


def budget_restarts(seconds_left: float, seconds_per_restart: float, iterations: int) -> int:
  """How many restarts under :data:`BUDGET_HALVING` fit in ``seconds_left`` when one restart run
  alone takes ``seconds_per_restart`` (0 when fewer than two fit; at most
  :data:`BUDGET_MAX_RESTARTS`)."""
  rounds, keep = BUDGET_HALVING

  def cost(r):
    return sum(count * n for count, n in driver.halving_plan(iterations, r, rounds, keep)) / iterations

  fits = [r for r in range(2, BUDGET_MAX_RESTARTS + 1)
          if cost(r) * seconds_per_restart <= seconds_left]
  return max(fits, default=0)


# Before --budget fits an optimisation attack's iterations, two probes of this many iterations with
# one-step chunks: the first compiles what the run needs (on CPU every chunk runs the same one-step
# program), the second times a step and what a compiled run spends around its attack.
PROBE_ITERATIONS = 4
BUDGET_CHUNK_S = 10.0  # a run under a budget checks its time at least this often (when a step allows)


def budget_iterations(seconds: float, seconds_per_iteration: float, iterations: int) -> int:
  """The iterations of a run that fit in ``seconds`` at ``seconds_per_iteration``: at most the
  preset's ``iterations``, at least :data:`PROBE_ITERATIONS` (a budget spent before the run starts
  still runs the attack, short)."""
  fit = math.floor(seconds / seconds_per_iteration) if seconds > 0 else 0
  return int(min(iterations, max(fit, PROBE_ITERATIONS)))


def _run_auto(cfg: Config, callback, batch, target_psnr=None):
  """The attacks of :func:`auto_attacks` in turn (no solver state: a run is not resumed midway),
  until one matches the update (:func:`gradjax.verdict.matched`: data that reproduce it were found,
  no later attack can match it better) or ``cfg.attack.budget`` seconds are spent; with time left, the
  optimisation attack that matched best again with as many more restarts as fit
  (:func:`budget_restarts`), the best by the matching objective going on. With a budget and no
  ``--iterations``, an optimisation attack whose preset's iterations would not fit in its share of
  the time left (that time over the optimisation attacks still to try) runs as many as fit
  (:func:`budget_iterations`), timed by two probes of :data:`PROBE_ITERATIONS` iterations first.
  Under a budget every optimisation run also stops at the end of its share (at the first chunk past
  it, chunks of about :data:`BUDGET_CHUNK_S` seconds), keeping its best iterate so far. The results
  of the run whose reconstruction matches the update best (the lowest relative
  residual, :func:`gradjax.verdict.residual`), with ``auto`` naming every run and the time of all
  of them. An attack whose conditions the update does not meet (it raises ValueError, e.g. a closed
  form on examples that BatchNorm couples) is skipped and named in ``refused`` and the verdict."""
  names, tried, best, matched = auto_attacks(cfg), [], None, False
  refused = []  # the attacks whose conditions the update does not meet, with why
  start = time.perf_counter()
  elapsed = lambda: time.perf_counter() - start
  step_s = {}  # attack -> seconds per restart step once compiled (from the progress reports)
  took = {}  # attack -> seconds its (last) run took
  probes = []  # the probes that timed an attack before its iterations were fitted to the budget
  overhead = {}  # attack -> seconds a compiled run spends outside its attack (from the probes)

  def fitted(name, step, share):
    """``step`` with the iterations that fit in ``share`` seconds, after two probes timed them, in
    chunks of about :data:`BUDGET_CHUNK_S` seconds."""
    rates = []

    def watch(p):
      if p.its_per_s > 0:  # NaN for the step that compiled
        rates.append(1.0 / (p.its_per_s * max(p.alive, 1)))

    probe = config.replace(step, {"attack.iterations": PROBE_ITERATIONS, "execution.chunk": 1})
    began = time.perf_counter()
    run(probe, batch=batch)  # compiles
    warm = time.perf_counter()
    results, _ = run(probe, callback=watch, batch=batch)
    now = time.perf_counter()
    if not rates:  # the probe stopped before a step was timed (its objective reached the tolerance)
      return step
    per_iteration = rates[-1] * step.attack.restarts  # every restart takes each iteration
    # What a compiled run spends outside its attack (simulating, solving the head, scoring).
    overhead[name] = max(now - warm - results["wall_time_s"], 0.0)
    preset = presets.get_preset(name)().iterations
    iterations = budget_iterations(share - (now - began) - overhead[name], per_iteration, preset)
    probes.append({"attack": name, "iterations": PROBE_ITERATIONS, "seconds": now - began,
                   "seconds_per_iteration": per_iteration, "overhead_s": overhead[name],
                   "fitted_iterations": iterations, "preset_iterations": preset})
    chunk = max(1, min(step.execution.chunk, math.floor(BUDGET_CHUNK_S / per_iteration)))
    return config.replace(step, {"execution.chunk": chunk, **({} if iterations >= preset else
                                                              {"attack.iterations": iterations})})

  def attempt(name, step, chosen_settings=None, until=None):
    """Runs ``step``; ``until``: the end of its time (seconds from the start), less what the run
    spends after its attack."""
    nonlocal best, matched

    def watch(p):
      if p.its_per_s > 0:  # NaN for the chunk that compiled
        step_s[name] = 1.0 / (p.its_per_s * max(p.alive, 1))
      if callback is not None:
        callback(p)

    began = time.perf_counter()
    deadline = None if until is None else start + until - overhead.get(name, 0.0)
    results, images = run(step, callback=watch, batch=batch, deadline=deadline,
                          target_psnr=target_psnr)
    took[name] = time.perf_counter() - began  # with loading the model and scoring
    residual = (results.get("residual") or {}).get("relative_error", math.inf)
    tried.append({
        "attack": name, "settings": chosen_settings or {}, "restarts": step.attack.restarts,
        "iterations": results.get("iterations"), "residual": residual, "verdict": results["verdict"]
                                                                                  ["status"],
        "psnr": results.get("psnr"), "wall_time_s": results["wall_time_s"]
    })
    if best is None or residual < best[0]:
      best = (residual, name, results, images, step)
    matched = bool(results.get("residual")) and verdict.matched(
        fidelity.Comparison(**results["residual"]))

  model = attacked_model(cfg)
  meta = {}  # a capture's metadata: labels it does not hold are inferred (capture_label_source)
  if cfg.client.observation and cfg.attack.label_source is None:
    meta = interop.read_metadata(cfg.client.observation)
    meta = {**meta, "num_samples": cfg.client.num_samples or interop.metadata_num_samples(
        meta, cfg.client.observation) or 1}
  for index, name in enumerate(names):
    if tried and cfg.attack.budget is not None and elapsed() >= cfg.attack.budget:
      break
    chosen_settings = {k: v for k, v in auto.settings(name, model).items()
                       if config.get(cfg, k) is None}
    if meta and (source := capture_label_source(name, meta)) is not None:
      chosen_settings["attack.label_source"] = source
    step = config.replace(cfg, {"attack.preset": name, "attack.budget": None, **chosen_settings})
    if (step.attack.adaptive and step.defense.dp_sgd() is not None and name in presets.PRESETS
        and not models_dp_sgd(config.get_attack(step))):
      # DLM+ cannot model DP-SGD's clipping: it runs as it is, beside the attacks that can.
      step = config.replace(step, {"attack.adaptive": False})
      chosen_settings = {**chosen_settings, "attack.adaptive": False}
    if name in closed_forms.CLOSED_FORMS:  # nothing to optimise: the optimisation options stay out
      step = config.replace(step, {
          "attack.restarts": 1, "attack.permutations": 1, "attack.adaptive": False,
          **{p: None for p in config.paths() if config.option(p).metadata["attack"]}})
    until = None  # the end of this attack's share of the budget, seconds from the start
    check(step)  # an option this attack does not take is the user's to mend: it ends the run
    try:
      if name not in closed_forms.CLOSED_FORMS and cfg.attack.budget is not None:
        optimising = sum(n not in closed_forms.CLOSED_FORMS for n in names[index:])
        share = (cfg.attack.budget - elapsed()) / optimising
        until = elapsed() + share
        if cfg.attack.iterations is None:
          step = fitted(name, step, share)
      attempt(name, step, chosen_settings, until)
    except (fidelity.ZeroUpdate, fidelity.CaptureMismatch):  # the update's, not the attack's
      raise
    except ValueError as e:  # its conditions do not hold (e.g. BatchNorm couples the examples)
      refused.append({"attack": name, "reason": str(e)})
      continue
    if matched:
      break
  if best is None:
    raise ValueError("auto: every attack refused the update: "
                     + "; ".join(f"{r['attack']}: {r['reason']}" for r in refused))
  _, chosen, _, _, chosen_step = best
  if cfg.attack.budget is not None and not matched and chosen not in closed_forms.CLOSED_FORMS:
    once = next(t for t in tried if t["attack"] == chosen)
    iterations = best[2]["attack"]["iterations"]
    per_restart = iterations * step_s.get(
        chosen, once["wall_time_s"] / chosen_step.attack.restarts / iterations)
    # What the run spent outside the attack (loading, simulating, scoring) is counted again, though
    # the programs it compiled are cached by then.
    outside = max(took[chosen] - once["wall_time_s"], 0.0)
    more = budget_restarts(cfg.attack.budget - elapsed() - outside, per_restart, iterations)
    if more > chosen_step.attack.restarts:
      rounds, keep = BUDGET_HALVING
      attempt(chosen, config.replace(chosen_step, {
          "attack.restarts": more, "execution.halving_rounds": rounds,
          "execution.halving_keep": keep}), until=cfg.attack.budget)
  _, chosen, results, images, chosen_step = best
  results = {**results, "wall_time_s": elapsed(),
             "auto": {"tried": tried, "chosen": chosen, "restarts": chosen_step.attack.restarts,
                      "budget_s": cfg.attack.budget, "probes": probes, "refused": refused}}
  shortened = {p["attack"] for p in probes if p["fitted_iterations"] < p["preset_iterations"]}

  def described(t):
    notes = [f"{t['restarts']} restarts"] * (t["restarts"] > 1) + [
        f"{t['iterations']} iterations to fit the budget"] * (t["attack"] in shortened)
    return t["attack"] + (f" ({', '.join(notes)})" if notes else "")

  ran = [described(t) for t in tried]
  ran_or_refused = {t["attack"] for t in tried} | {r["attack"] for r in refused}
  rest = [n for n in names if n not in ran_or_refused]
  why = ("it stops once an attack matches the update" if matched
         else f"the budget of {cfg.attack.budget or 0:g} s was spent")
  restarts = chosen_step.attack.restarts
  results["verdict"] = {**results["verdict"], "tried": [t["attack"] for t in tried], "reason": (
      f"auto tried {', '.join(ran)}" + (f" (not {', '.join(rest)}: {why})" if rest else "")
      + "".join(f" ({r['attack']} refused it: {r['reason']})" for r in refused)
      + f" and kept {chosen}" + (f" ({restarts} restarts)" if restarts > 1 else "")
      + "; " + results["verdict"]["reason"])}
  return results, images


def models_dp_sgd(attack: attacks.Attack) -> bool:
  """Whether :func:`adapted` can model DP-SGD's per-example clipping in ``attack``'s objective: a
  gradient or the replayed local steps (not DLM's or DLM+'s scaled differences)."""
  return isinstance(attack.matched, objectives.Replay) or attack.matched.name == objectives.Gradient.name


def adapted(cfg: Config, attack: attacks.Attack, declared: str | None, observation,
            update_scale: float = 1.0) -> tuple[attacks.Attack, str | None]:
  """``attack`` adapted to the client's defense when ``cfg.attack.adaptive``, with the defense spec
  its distance models (:func:`gradjax.adaptive.adapt`, the defense having acted on ``update_scale``
  times what is matched); else ``(attack, None)``. The defense: DP-SGD's steps (the defense
  section's: the attack clips its examples' gradients as the client's,
  :class:`gradjax.objectives.ClippedGradient` or a :class:`gradjax.objectives.Replay` with the bound,
  and the noise's variance in the update, :func:`dp_sgd_variance`, comes first), then the
  ``declared`` spec (what a capture's metadata declare, then ``cfg.defense.spec``)."""
  if not cfg.attack.adaptive:
    return attack, None
  if declared and not defenses.parts(defenses.parse(declared)):  # "none": no defense
    declared = None
  dp_sgd = cfg.defense.dp_sgd()
  if not declared and dp_sgd is None:
    raise ValueError("--config.attack.adaptive=True: no defense to adapt to (the capture's metadata declare none and "
                     "--defense is not given)")
  if dp_sgd is not None:
    q = dp_sgd.sampling_rate
    expected = None if q is None else expected_batch_size(cfg, observation)
    fedsgd = observation.threat_model == "fedsgd"
    other = None if q is None else replay_divisor(cfg, observation)
    if not models_dp_sgd(attack):
      raise ValueError(f"--config.attack.adaptive=True models DP-SGD's per-example clipping in the "
                       f"gradient or the replayed steps the attack matches, not in "
                       f"{attack.matched.name!r}")
    if isinstance(attack.matched, objectives.Replay):
      matched = dataclasses.replace(attack.matched, max_norm=float(dp_sgd.max_norm),
                                    sampling_rate=None if q is None else float(q),
                                    expected_batch_size=other)
    else:  # the gradient
      if other is not None:
        raise ValueError(
            f"a one-step FedAvg update read as a gradient expects its step's divisor q·n = "
            f"{q * observation.num_samples:g}; the client declares {expected:g}: attack it with a "
            "replay (--config.attack.matched=replay, e.g. --attack=inverting_gradients_fedavg)")
      # FedSGD: the dummies are the examples drawn, their clipped sum over E; a one-step FedAvg
      # update read as a gradient: its expectation, the clipped mean over all n dummies.
      matched = objectives.ClippedGradient(float(dp_sgd.max_norm), expected if fedsgd else None)
    attack = dataclasses.replace(attack, matched=matched)
    if dp_sgd.noise_multiplier > 0:
      variance = dp_sgd_variance(dp_sgd, observation, expected)
      declared = ",".join(filter(None, (f"gaussian:{variance:.8g}", declared)))
  return (adaptive.adapt(attack, declared, update_scale) if declared else
          dataclasses.replace(attack, name=f"{attack.name}+adaptive")), declared


def expected_batch_size(cfg: Config, observation) -> float:
  """The divisor E of a Poisson-sampled DP-SGD step's sum (``cfg.defense.dp_sgd_poisson``). A
  simulated FedSGD client's: q times its ``--batch_size`` examples (the observation counts those its
  step drew); a simulated FedAvg client's: q times its n examples. A capture's: the declared
  ``dp_sgd_expected_batch_size`` (Opacus' ``optimizer.expected_batch_size``, ``int(q·n)``), else,
  for FedAvg, q·n; a FedSGD capture's is required (ValueError, one line): nothing in the update
  tells it."""
  q, declared = cfg.defense.dp_sgd_sampling_rate, cfg.defense.dp_sgd_expected_batch_size
  if declared is not None:
    return declared
  if observation.threat_model != "fedsgd":
    return q * observation.num_samples
  if not cfg.client.observation:
    return q * cfg.data.batch_size
  raise ValueError(
      f"{cfg.client.observation}: a Poisson-sampled DP-SGD step divides its drawn sum by the "
      "expected batch size, which the update does not tell: declare dp_sgd_expected_batch_size "
      "(Opacus' optimizer.expected_batch_size) in its metadata (or the option "
      "defense.dp_sgd_expected_batch_size), and num_samples the count the step drew")


def replay_divisor(cfg: Config, observation) -> float | None:
  """A Poisson-sampled FedAvg client's divisor E where it is not q·n, what the expected replay
  divides each step by (:class:`gradjax.objectives.Replay`); None where it is q·n, or for FedSGD."""
  if observation.threat_model == "fedsgd":
    return None
  expected = expected_batch_size(cfg, observation)
  q_n = cfg.defense.dp_sgd_sampling_rate * observation.num_samples
  return None if math.isclose(expected, q_n, rel_tol=1e-9) else expected


def dp_sgd_variance(dp_sgd: clients.DPSGD, observation, expected_batch_size: float | None = None
                    ) -> float:
  """The variance per entry that DP-SGD's noise leaves in the observed update: (σC/N)² for a
  FedSGD gradient of N examples; for a FedAvg update of T steps of batch B, learning rate η and
  momentum μ, W_0 − W_T = η Σ_s g_s (1 − μ^(T−s+1)) / (1 − μ), so η² (σC/B)² Σ_s ((1 − μ^(T−s+1))
  / (1 − μ))². Under Poisson sampling (``dp_sgd.sampling_rate``) N and B are the expected batch
  size E (:func:`expected_batch_size`; the observation of a FedSGD step counts the examples drawn),
  q·n for a FedAvg client when not given."""
  local = observation.local
  if local is None and observation.threat_model != "fedsgd":
    raise ValueError("DP-SGD's noise in a FedAvg update depends on the client's local training "
                     "(learning rate, batch size, momentum), which the capture does not say")
  if local is None:
    divisor = observation.num_samples if dp_sgd.sampling_rate is None else expected_batch_size
    return (dp_sgd.noise_multiplier * dp_sgd.max_norm / divisor) ** 2
  steps = local.steps(observation.num_samples)
  batch = local.batch_size or observation.num_samples
  if dp_sgd.sampling_rate is not None:
    batch = expected_batch_size or dp_sgd.sampling_rate * observation.num_samples
  mu = local.momentum
  carried = sum(((1 - mu ** (steps - s + 1)) / (1 - mu)) ** 2 for s in range(1, steps + 1))
  return (local.learning_rate * dp_sgd.noise_multiplier * dp_sgd.max_norm / batch) ** 2 * carried


class _Prepared(NamedTuple):
  """An image experiment up to its attack (:func:`_prepare`): the attack (adapted to a declared
  defense; a closed form's name), the model and the observation it attacks, and what scoring reads."""

  attack: Any
  closed: bool
  model: models.Model
  observation: Any
  batch: data.Dataset | None
  norm: data.Normalization
  key_attack: jax.Array
  share_labels: bool
  matched: str
  declared: str
  adapted_to: str | None
  checks: dict
  problems: list
  conv: str
  local: Any = None  # the client's local training as read (a capture's over the options), or None

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.model.input_shape)


def _prepare(cfg: Config, batch, together: int = 1) -> _Prepared:
  """``together``: how many experiments may share its solver run (:func:`run_clients`)."""
  attack = check(cfg)
  conv_name = model_conv(cfg, together)
  closed = not isinstance(attack, attacks.Attack)  # a closed form (gradjax.closed_forms) infers labels
  key_model, key_attack, key_defense, key_server, key_client = experiment_keys(cfg.seed, cfg.data.index)
  share_labels = labels_shared(cfg, attack)
  checks, problems = {}, []
  if cfg.client.observation:
    if batch is None and cfg.data.dataset is not None:
      # The ground truth for scoring: as many images as the capture says the client had.
      n = cfg.client.num_samples or interop_num_samples(cfg)
      if cfg.data.batch_size not in (1, n):  # 1: the default, which a capture's count replaces
        raise ValueError(f"--batch_size={cfg.data.batch_size}, but the capture holds {n} "
                         f"sample{'' if n == 1 else 's'}: its ground truth is images "
                         f"{cfg.data.index}..{cfg.data.index + n - 1} (leave --batch_size out)")
      batch = load_batch(config.replace(cfg, {"data.batch_size": n}))
    if batch is not None:  # the scores' size, known before anything is compiled
      check_lpips(cfg.output.lpips, batch.x.shape[1:3])
    model, observation, meta = _captured(cfg, batch, conv_name)
    if meta.get("defense"):
      try:
        defenses.parse(meta["defense"])
      except ValueError as e:
        raise ValueError(f"{cfg.client.observation}: its metadata 'defense': {e}") from None
    norm = data.normalization(cfg.data.normalization or meta.get("normalization") or "none")
    if batch is not None and batch.x.shape[0] != observation.num_samples:
      raise ValueError(f"the capture holds {observation.num_samples} samples but the ground truth "
                       f"has {batch.x.shape[0]} images")
    counted = bool(cfg.client.num_samples or "num_samples" in meta or "labels" in meta)
    checks, problems = fidelity.check_capture(model, observation, batch, norm, meta.get("defense"),
                                              dp_sgd=cfg.defense.dp_sgd() is not None,
                                              order_known=meta.get("label_order") != "multiset",
                                              kind=meta.get("kind", "gradient"),
                                              count_declared=counted)
    if problems and not cfg.client.force:
      raise fidelity.CaptureMismatch("the capture does not fit the declared client: " + "; ".join(problems)
                            + " (--config.client.force=True attacks it anyway; its verdict is then inconclusive)")
    # A capture's labels are what the client shared with the server (interop's metadata): the
    # server knew them, whatever the attack reads, so recovering them is no leak.
    share_labels = share_labels or observation.labels is not None
  else:
    meta = {}
    norm = data.normalization(cfg.data.normalization or "none")
    batch = load_batch(cfg) if batch is None else batch
    check_lpips(cfg.output.lpips, batch.x.shape[1:3])  # before anything is compiled
    model = _simulated(cfg, batch, norm, key_model, conv_name)
    x_client = np.asarray(data.normalize(batch.x, norm), np.float32)
    client = simulated_client(cfg, share_labels, key_client)
    observation = client(model.apply_fn, model.variables, x_client, batch.y)
    if observation.threat_model == "fedsgd" and cfg.defense.dp_sgd_poisson:
      batch, observation = poisson_draw(cfg, batch, observation, key_client)
  defense = cfg.defense.build()
  if defense is not None:
    observation = defense.apply(observation, key_defense)
  # Nothing to attack: e.g. an example the model already fits with certainty, or pruned away.
  zero = fidelity.zero_update(observation)
  if zero:
    raise fidelity.ZeroUpdate(zero)
  declared = ",".join(d for d in (meta.get("defense"), cfg.defense.spec) if d and d != "none")
  matched = "gradient" if closed else attack.matched.name
  as_gradient = (matched == "gradient" and observation.threat_model == "fedavg"
                 and observation.local is not None)
  attack, adapted_to = adapted(cfg, attack, declared, observation,
                               observation.local.learning_rate if as_gradient else 1.0)
  local = observation.local
  if as_gradient:
    # One local step is lr times a gradient: match that gradient (several steps raise, naming the
    # objectives that replay them); the defense acted on the update, lr times it.
    observation = clients.update_as_gradient(observation)

  # Rules that run the server's copy of the model: inferred here, then attacked as known labels.
  if cfg.attack.label_source == "hfginv":
    observation = observation.replace(
        labels=hfginv_labels(cfg, model, observation, norm, key_server))
  elif cfg.attack.label_source == "llg_star":
    observation = observation.replace(
        labels=llg_star_labels(model, observation, norm, key_server))
  return _Prepared(attack, closed, model, observation, batch, norm, key_attack, share_labels, matched,
                   declared, adapted_to, checks, problems, conv_name, local)


def _run_image(cfg: Config, callback, batch, state, deadline=None, target_psnr=None):
  with compilation.Recorder() as made:
    marks = [time.time()]
    results, images = _attack_image(cfg, callback, batch, state, deadline, target_psnr, marks)
    marks.append(time.time())
  results["time"] = time_spent(between(made, marks))
  return results, images


# The programs :func:`time_spent` lists, those that cost most.
LARGEST_PROGRAMS = 8
# A run's phases: ``setup``, the data, the model and the client's update; ``attack``, in this
# process (a resumed run's earlier part is in ``wall_time_s`` only); ``scoring``, the residual, the
# scores and the verdict. The span attack scores as it reads: its ``attack`` is both.
PHASES = ("setup", "attack", "scoring")


def between(made: compilation.Recorder, marks: list[float]) -> dict:
  """The :data:`PHASES` between consecutive ``marks`` (``time.time()``), all recorded by ``made``:
  :func:`time_spent`'s argument."""
  return {name: (made, start, end) for name, start, end in zip(PHASES, marks, marks[1:])}


def time_spent(phases: dict[str, tuple[compilation.Recorder, float, float]]) -> dict:
  """Where a run's time went. ``phases`` maps each phase (:data:`PHASES`) to the recorder open
  during it and its start and end (``time.time()``). For each, its seconds and the seconds JAX spent
  making programs in it (tracing, lowering, compiling or loading from the persistent cache, and any
  of them: ``making_programs``); over the recorders, how many programs were made and how many of
  them were loaded from the cache, and the :data:`LARGEST_PROGRAMS` that cost most
  (:class:`gradjax.compilation.Program`)."""
  out, recorders = {}, []
  for name, (made, start, end) in phases.items():
    spent = made.seconds(start, end)
    out[name] = {"seconds": end - start, "making_programs": spent.pop("programs"), **spent}
    if all(made is not r for r in recorders):
      recorders.append(made)
  programs = [p for made in recorders for p in made.programs]
  largest = sorted(programs, key=lambda p: p.seconds, reverse=True)[:LARGEST_PROGRAMS]
  return {"phases": out, "programs": len(programs),
          "programs_loaded": sum(p.cached for p in programs),
          "largest_programs": [{**p._asdict(), "seconds": p.seconds} for p in largest]}


def setup_device(cfg: Config) -> jax.Device | None:
  """Where ``cfg``'s set-up and scoring run when not on the default device
  (:func:`gradjax.compilation.setup_device`); a run sharded over devices keeps them there."""
  return None if cfg.execution.shard else compilation.setup_device()


def _placed(p: _Prepared, device: jax.Device | None) -> _Prepared:
  """``p`` as the attack takes it: the model's variables and the observation on the default device,
  where the set-up ran on ``device`` (:func:`setup_device`)."""
  if device is None:
    return p
  return p._replace(model=p.model._replace(
      variables=compilation.to_default_device(p.model.variables, device)),
                    observation=compilation.to_default_device(p.observation, device))


def _attack_image(cfg: Config, callback, batch, state, deadline, target_psnr, marks: list[float]):
  host = setup_device(cfg)
  with compilation.on_setup_device(host):
    scored = _prepare(cfg, batch)
  p = _placed(scored, host)
  marks.append(time.time())
  trace = Trace(callback, None if p.batch is None else np.asarray(p.batch.x, np.float64), p.norm,
                deadline, target_psnr)
  timing = Timing(cfg, state, trace)
  # PSNR per chunk needs a ground truth; sharded runs would gather the whole solver state to the
  # host for it, so they record the objective only.
  execution = cfg.execution.build(callback=trace.progress,
                            monitor=(trace.monitor if (p.batch is not None or deadline is not None)
                                     and not cfg.execution.shard else None),
                            saver=timing.saver, setup_device=host)
  found = {}  # what a closed form found besides the reconstruction
  if p.closed:
    rec, found = closed_forms.reconstruct(p.attack, p.model.apply_fn, p.observation, p.input_shape,
                                          image_bounds(p.norm, p.input_shape[-1]))
  else:
    rec = attacks.reconstruct(p.attack, p.model.apply_fn, p.observation, p.key_attack,
                              input_shape=p.input_shape,
                              bounds=image_bounds(p.norm, p.input_shape[-1]),
                              restarts=cfg.attack.restarts, permutations=cfg.attack.permutations,
                              execution=execution)
  marks.append(time.time())
  with compilation.on_setup_device(host):
    return _finish(cfg, scored, rec, found, trace, timing)


# Clients an accelerator attacks in one solver run unless --config.execution.clients_per_run says.
CLIENTS_PER_RUN = 64


def clients_per_run(cfg: Config) -> int:
  """How many experiments :func:`run_clients` attacks in one solver run under ``cfg``: its
  ``execution.clients_per_run``, else :data:`CLIENTS_PER_RUN` where the restarts run vmapped or
  mapped and 1 where they run in sequence (a CPU, where one run of K clients costs what K runs do)."""
  if cfg.execution.clients_per_run is not None:
    return cfg.execution.clients_per_run
  return 1 if driver.resolve_strategy(cfg.execution.strategy) == "sequential" else CLIENTS_PER_RUN


def model_conv(cfg: Config, together: int = 1) -> str:
  """The convolutions of ``cfg``'s model (:func:`gradjax.models.resolve_conv`): ``auto`` is batched
  where the restarts, label orders and experiments sharing a solver run (``together``, the clients
  of :func:`run_clients`) are more than one run, vmapped or mapped together."""
  runs = cfg.attack.restarts * cfg.attack.permutations * together
  batched = runs > 1 and driver.resolve_strategy(cfg.execution.strategy) != "sequential"
  return models.resolve_conv(cfg.model.conv, batched=batched)


class _ClientTraces:
  """The progress callback and monitor of one solver run of several clients: each chunk's report
  goes to the :class:`Trace` of the client it concerns (every client's when the runs advance
  together), with that client's best objective and iterate."""

  def __init__(self, traces: list[Trace], runs: int):
    self.traces, self.runs, self.last = traces, runs, None

  def progress(self, p) -> None:
    self.last = p

  def monitor(self, state) -> bool:
    p = self.last
    best = np.asarray(state.best_loss, np.float64).reshape(-1)
    x = None
    if p.restart is None:  # every run advanced: each client's block of runs
      for k, trace in enumerate(self.traces):
        block = slice(k * self.runs, (k + 1) * self.runs)
        finite = best[block][np.isfinite(best[block])]
        trace.progress(p._replace(best_loss=float(finite.min()) if finite.size else math.inf))
        if trace.scores:
          x = np.asarray(state.best_params["x"]) if x is None else x
          trace.monitor(_BestOf(x[block], best[block]))
    else:  # one run advanced (the sequential strategy): run r is client r // runs's
      k = p.restart // self.runs
      self.traces[k].progress(p._replace(restart=p.restart % self.runs))
      self.traces[k].monitor(state)
    # A target ends the shared run once every client reached it (the driver stops all runs at once).
    return all(trace.reached for trace in self.traces)


class _BestOf(NamedTuple):
  """What :meth:`Trace.monitor` reads of a solver state: ``best_params["x"]`` and ``best_loss``."""

  x: np.ndarray
  best_loss: np.ndarray

  @property
  def best_params(self):
    return {"x": self.x}


def run_clients(cfgs, batches=None, target_psnr: float | None = None) -> list:
  """Runs image experiments ``cfgs`` (e.g. one attack on each of a Flower round's captured
  updates), those whose optimisation attacks share the attack, the model, the observation's
  structure and the execution in one solver run (:func:`gradjax.attacks.reconstruct_clients`),
  :func:`clients_per_run` at a time; a run the device has no memory for is split in halves (again
  while it does not fit). ``batches``: each experiment's ground truth (as :func:`run`'s ``batch``;
  default none given); ``target_psnr``: as :func:`run`'s, a shared run ending once every one of its
  experiments reached it (under the sequential strategy, at the last one's: those before it ran
  their budget).

  Returns, per experiment, ``(results, images)`` as :func:`run` gives for it (its own key, labels,
  scores and verdict; the same up to float32 rounding, which a long L-BFGS run can grow),
  with ``clients_together``: how many experiments shared its solver run, whose time its
  ``wall_time_s`` and its ``time``'s ``attack`` phase are (its set-up and scoring its own); or the
  exception it raised (ValueError, FileNotFoundError,
  FloatingPointError): one bad capture never stops the others. ``auto``, closed forms, attacks
  whose restarts read each other (group consistency) or are halved run as :func:`run` runs them,
  one by one; no solver state is saved (the campaign store runs an experiment that has one alone).
  """
  cfgs = list(cfgs)
  batches = [None] * len(cfgs) if batches is None else list(batches)
  if len(batches) != len(cfgs):
    raise ValueError(f"one batch per experiment: got {len(batches)} for {len(cfgs)}")
  out: list = [None] * len(cfgs)
  groups: dict = {}
  setups: dict = {}  # each experiment's set-up phase (time_spent)
  for i, (cfg, batch) in enumerate(zip(cfgs, batches)):
    try:
      cfgs[i] = cfg = config.with_declared(cfg)
      alone = (cfg.data.modality != "image" or cfg.attack.preset == auto.AUTO
               or clients_per_run(cfg) == 1 or cfg.execution.halving_rounds > 1)
      attack = None if alone else check(cfg)
      # Nothing to optimise (a closed form), or restarts that read each other: one by one.
      if alone or not isinstance(attack, attacks.Attack) or attack.couples_restarts:
        out[i] = run(cfg, batch=batch, target_psnr=target_psnr)
        continue
      with (driver.precision_scope(cfg.execution.matmul_precision), compilation.Recorder() as made,
            compilation.on_setup_device(setup_device(cfg))):
        start = time.time()
        p = _prepare(cfg, batch, min(clients_per_run(cfg), len(cfgs)))
        setups[i] = (made, start, time.time())
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
      out[i] = e
      continue
    leaves = jax.tree.leaves(p.observation)
    key = (p.attack, p.model.apply_fn, p.input_shape, p.norm, cfg.attack.restarts,
           cfg.attack.permutations, cfg.execution, jax.tree.structure(p.observation),
           tuple((jnp.shape(a), jnp.result_type(a)) for a in leaves))
    groups.setdefault(key, []).append((i, p))
  for members in groups.values():
    size = clients_per_run(cfgs[members[0][0]])
    chunks = [members[start:start + size] for start in range(0, len(members), size)]
    while chunks:
      chunk = chunks.pop(0)
      try:
        for (i, _), done in zip(chunk, _attack_together(cfgs, chunk, setups, target_psnr)):
          out[i] = done
      except (ValueError, FileNotFoundError, FloatingPointError) as e:
        for i, _ in chunk:
          out[i] = e
      except Exception as e:  # noqa: BLE001 - a device out of memory: the halves, one after the other
        if len(chunk) == 1 or not _out_of_memory(e):
          raise
        chunks[:0] = [chunk[:len(chunk) // 2], chunk[len(chunk) // 2:]]
  return out


def _out_of_memory(error: Exception) -> bool:
  """Whether ``error`` is XLA's report of a device allocation that did not fit."""
  return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def _attack_together(cfgs, members, setups, target_psnr=None) -> list:
  """One solver run of ``members`` ((index, _Prepared) of one group of :func:`run_clients`); each
  one's (results, images), or the exception its scoring raised. Each one's ``time``
  (:func:`time_spent`): its own set-up (``setups[index]``) and scoring, and the shared attack."""
  cfg, first = cfgs[members[0][0]], members[0][1]
  traces = [Trace(None, None if p.batch is None else np.asarray(p.batch.x, np.float64), p.norm,
                  target_psnr=target_psnr) for _, p in members]
  timings = [Timing(cfgs[i], None, trace) for (i, _), trace in zip(members, traces)]
  shared = _ClientTraces(traces, cfg.attack.restarts * cfg.attack.permutations)
  host = setup_device(cfg)
  execution = cfg.execution.build(callback=shared.progress, monitor=shared.monitor,
                                  setup_device=host)
  with driver.precision_scope(cfg.execution.matmul_precision):
    with compilation.Recorder() as made:
      start = time.time()
      recs = attacks.reconstruct_clients(
          first.attack, first.model.apply_fn,
          [p.observation for _, p in members],  # prepared where they were made (setup_device)
          [p.key_attack for _, p in members], input_shape=first.input_shape,
          bounds=image_bounds(first.norm, first.input_shape[-1]), restarts=cfg.attack.restarts,
          permutations=cfg.attack.permutations, execution=execution)
      solved = (made, start, time.time())  # every member's attack, compilation included
    done = []
    for (i, p), rec, trace, timing in zip(members, recs, traces, timings):
      try:  # one member's failure (a reconstruction that is not finite) is its own
        with compilation.Recorder() as scored, compilation.on_setup_device(host):
          start = time.time()
          results, images = _finish(cfgs[i], p, rec, {}, trace, timing)
          scoring = (scored, start, time.time())
      except (ValueError, FileNotFoundError, FloatingPointError) as e:
        done.append(e)
        continue
      results.update(wall_time_s=solved[2] - solved[1], clients_together=len(members),
                     time=time_spent({"setup": setups[i], "attack": solved, "scoring": scoring}))
      done.append((results, images))
  return done


def _finish(cfg: Config, p: _Prepared, rec: attacks.Reconstruction, found: dict, trace: Trace,
            timing: Timing) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """The results and images of an attack's reconstruction ``rec``: scores against the ground truth,
  the residual, the verdict."""
  attack, model, observation, batch, norm = p.attack, p.model, p.observation, p.batch, p.norm
  input_shape = p.input_shape
  results = common_results(cfg, attack, rec, model, observation, trace, timing,
                    p.adapted_to)
  if trace.target is not None:  # the run ended where it reached this PSNR, if it did
    results["target_psnr"] = {"psnr": trace.target, "reached": trace.reached}
  # The local training the attack read (a capture's metadata over the options), or None.
  results["local_training"] = None if p.local is None else p.local._asdict()
  # A capture's labels (shared with the server) that an attack optimising its own left aside.
  results["shared_labels_unused"] = bool(cfg.client.observation and observation.labels is not None
                                         and isinstance(attack, attacks.Attack)
                                         and attack.optimises_labels)

  x_rec = np.asarray(data.denormalize(rec.x, norm), np.float64)
  if not np.all(np.isfinite(x_rec)):
    raise FloatingPointError("the best reconstruction is not finite")
  results.update(
      candidates=int(rec.candidates.shape[0]),
      labels_by_slot=rec.labels.tolist(),  # the labels of dummy slots 0..N-1 (mini-batch order)
      gamma=(float(np.exp(rec.dummy["log_gamma"])) if "log_gamma" in rec.dummy else None),
      conv=p.conv,
      normalization={"mean": list(norm.mean), "std": list(norm.std)},
      checks=p.checks,
      separation=found.get("separation"),
      recursion=found.get("recursion"),
      imprint=found.get("imprint"),
      cocktail=found.get("cocktail"),
  )
  q = getattr(cfg.defense.dp_sgd(), "sampling_rate", None)
  read_out = cfg.attack.preset == "imprint"  # bins read as ratios: no labels, so no update to recompute
  # A deterministic defense (clipping, pruning, rounding) is applied to the reconstruction's update
  # as the client applied it to its own; under noise no update matches.
  sent = None if not p.declared or fidelity.noisy(p.declared) else defenses.parse(p.declared)
  residual = None if read_out else verdict.residual(
      model.apply_fn, observation, rec.dummy, rec.labels, matched=p.matched,
      max_norm=cfg.defense.dp_sgd_max_norm, sampling_rate=q,
      expected_batch_size=(None if q is None or p.matched != "replay"
                           else replay_divisor(cfg, observation)),
      defense=sent, defense_scale=(p.local.learning_rate if sent is not None and p.local is not None
                                   and p.matched == "gradient" else 1.0))
  findings, images = None, {"ground_truth": None, "reconstruction": np.clip(x_rec, 0.0, 1.0)}
  if batch is not None:
    # An attack that reads no labels (the imprint's read-out) is not scored on them; another one's
    # slots it did not read (-1: a closed form's examples it did not separate) count as wrong.
    scores = metrics.score(x_rec, batch.x, None if read_out else rec.labels,
                           None if read_out else batch.y)
    order = np.asarray(scores["order"])
    results.update(scores, labels_true=batch.y.tolist(),
                   labels_reconstructed=rec.labels[order].tolist())
    unclamped = metrics.psnr_unclamped(x_rec[order], batch.x, norm.std)
    results.update(psnr_unclamped=float(unclamped.mean()),
                   psnr_unclamped_per_image=[float(v) for v in unclamped])
    results.update(lpips_scores(cfg.output.lpips, x_rec[order], batch.x))
    findings = verdict.image_findings(results, labels_inferred=not p.share_labels,
                                      num_classes=model.num_classes, side=min(batch.x.shape[1:3]))
    results["findings"] = findings
    images = {"ground_truth": batch.x, "reconstruction": np.clip(x_rec[order], 0.0, 1.0)}
  # What the residual recomputed the update from: the attack's data as the model reads them, in its
  # slots' order (labels_by_slot), neither clipped nor reordered.
  images["model_input"] = np.asarray(rec.x, np.float32)
  if results.get("lpips") is None:
    results["lpips_absent"] = lpips_absent(cfg.output.lpips, batch, input_shape)
  _end_history_at_the_result(results["history"], rec, results.get("psnr"))
  # What a match of the update determines: its nonzero entries against the data's values.
  entries = sum(int(np.count_nonzero(np.asarray(g))) for g in jax.tree.leaves(observation.gradient))
  constraints = (entries, int(np.size(rec.x)))
  decided = verdict_fields(results, residual, findings, p.problems, cfg, constraints)
  if read_out and batch is None and decided["verdict"]["status"] == "inconclusive" and not p.problems:
    decided["verdict"]["reason"] = (
        f"the imprint's read-out gave {found['imprint']['kept']} image(s) and reads no labels, so no "
        "update is recomputed from them to check against the captured one: each is an example alone "
        "in its bin or a blend of a bin's examples; score them against the client's data (--dataset)")
  results.update(decided)
  results["malicious_server"] = malicious.server_row(observation.num_samples)
  results["privacy"] = dp_sgd_privacy(cfg)
  return results, images


def _end_history_at_the_result(history: list[dict], rec: attacks.Reconstruction,
                              psnr: float | None) -> None:
  """Sets the best restart's last row of ``history`` (a :class:`Trace`'s rows), where it is the
  run's last iteration, to the result: the run scores its last iterate after the last row was
  recorded (the solver's ``finalize``), so the best can improve there, and the curves end where
  the printed objective and PSNR are."""
  mine = [r for r in history if r["restart"] in (None, rec.best_restart)]
  if not mine or mine[-1]["iteration"] != int(rec.iterations[rec.best_restart]):
    return
  mine[-1]["loss"] = min(mine[-1]["loss"], rec.loss)
  if psnr is not None and "psnr" in mine[-1]:
    mine[-1]["psnr"] = psnr


def separated(results: dict) -> tuple[int, int] | None:
  """(examples separated, batch size) of a run of ``exclusive_neurons`` (its ``separation``) or
  ``cocktail_party`` (its ``cocktail``), or None."""
  if results.get("separation"):
    return int(results["separation"]["recovered"]), int(results["num_samples"])
  if results.get("cocktail"):
    return int(results["cocktail"]["separated"]), int(results["num_samples"])
  return None


def verdict_fields(results: dict, residual, findings, problems, cfg: Config,
             constraints: tuple[int, int] | None = None) -> dict:
  """``verdict``, ``residual`` and ``thresholds`` of a run's results (:mod:`gradjax.verdict`);
  ``constraints``: :func:`gradjax.verdict.decide`'s."""
  budget = (verdict.closed_form_budget(cfg.attack.preset, results["iterations"], separated(results))
            if cfg.attack.preset in closed_forms.CLOSED_FORMS
            else verdict.budget(cfg.attack.preset, results["iterations"], cfg.attack.restarts))
  improving = verdict.still_improving(results["history"], results["iterations"])
  return {"verdict": verdict.decide(findings=findings, residual=residual, improving=improving,
                                    budget=budget, problems=problems, constraints=constraints),
          "residual": None if residual is None else residual._asdict(),
          "still_improving": improving, "thresholds": verdict.THRESHOLDS._asdict()}


def lpips_absent(net: str, batch, input_shape) -> str:
  """Why a run reports no LPIPS (one phrase)."""
  if batch is None:
    return "no ground truth to compare with"
  if net == "none":
    return "switched off (--lpips=none)"
  if not lpips.available("alex"):
    return f"the lpips extra is not installed ({lpips.INSTALL})"
  return (f"images of {input_shape[0]}x{input_shape[1]} pixels are smaller than AlexNet's "
          f"{lpips.MIN_SIZE['alex']}")


def check_lpips(net: str, size) -> None:
  """A one-line ValueError where ``net`` (named, not auto) cannot score images of ``size`` (H, W),
  or where SSIM cannot (:func:`gradjax.metrics.ssim`): before anything is compiled."""
  metrics.ssim_window(*size)
  if net in lpips.NETWORKS and min(size) < lpips.MIN_SIZE[net]:
    fits = [n for n in lpips.NETWORKS if min(size) >= lpips.MIN_SIZE[n]]
    raise ValueError(f"--lpips={net} needs images of at least {lpips.MIN_SIZE[net]} pixels a side, "
                     f"these are {size[0]}x{size[1]} (--lpips={' or '.join([*fits, 'none'])}; auto "
                     "leaves LPIPS out where AlexNet cannot score)")


def lpips_scores(net: str, x, x_true) -> dict:
  """``{"lpips", "lpips_per_image", "lpips_net"}`` of images in [0, 1] (already in matching order), or
  ``{}`` when ``net`` is "none", or "auto" without the lpips extra or with images too small for
  AlexNet."""
  if net == "auto":
    net = "alex" if lpips.available("alex") and min(np.shape(x)[1:3]) >= lpips.MIN_SIZE["alex"] else "none"
  if net == "none":
    return {}
  d = lpips.distance(lpips.load(net), x, x_true)
  return {"lpips": float(d.mean()), "lpips_per_image": [float(v) for v in d], "lpips_net": net}


def interop_num_samples(cfg: Config) -> int:
  """How many examples the captured observation of ``cfg`` says the client had (1 if it is silent)."""
  return interop.metadata_num_samples(
      interop.read(cfg.client.observation).metadata, cfg.client.observation) or 1
