"""One experiment end to end: data -> model -> client -> attack -> metrics.

The command-line programs in ``experiments/`` are thin wrappers around :func:`run`, so a single
reconstruction, a sweep over an image range and a test all take the same path.

Two sources of the observation: a simulated client (the default: ``dataset`` images through
``client``), or files captured from a real system (``weights`` and ``observation``, PyTorch layout,
:mod:`gradjax.interop`). For captured files the ground truth is optional: with a ``dataset`` the
reconstruction is scored against images ``index .. index + N − 1``; without one the run reports the
reconstruction and the objective only.

Seeding (:func:`experiment_keys`). Experiment ``index`` uses ``jax.random.fold_in(key(seed), index)``
split into a model key and an attack key (a defense's noise uses ``fold_in`` of it with 1), so every
image of a sweep attacks a fresh random model (as the DLG / iDLG protocols do) and a single run of
image ``i`` reproduces row ``i`` of a sweep.
"""

import dataclasses
import math
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import attacks, checkpoint, clients, compilation, corpus, data, defenses, distances, fidelity
from gradjax import interop, lpips, metrics, models, objectives, text, verdict
from gradjax import labels as labels_lib
from gradjax import priors as priors_lib
from gradjax import driver, dummy, optimizers, presets, resume

CLIENTS = ("fedsgd", "fedavg")
MODALITIES = ("image", "text")
LPIPS = ("auto", "none", *lpips.NETWORKS)  # auto: AlexNet when the lpips extra is installed
SHARED_LABELS = ("ordered", "multiset")  # what a FedAvg client with known labels reveals


def _field(default, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None,
           attack: str | None = None, parse: Callable | None = None, execution: bool = False):
  """A :class:`Config` field with its documentation, declared once. The experiment programs derive
  their flags from these (``experiments/common.py``).

  help: the flag's help text. flag: the flag's name when it is not the field's. choices: the only
  values the flag takes. attack: the :class:`gradjax.attacks.Attack` field this one overrides when
  set, ``"optimizer.<field>"`` for a field of its :class:`gradjax.optimizers.Named` optimizer
  (``parse`` turns the flag's text into that field's value: names resolve to objects here). execution: a field of
  :class:`gradjax.driver.Execution`.
  """
  return dataclasses.field(default=default, metadata=dict(
      help=help, flag=flag, choices=choices, attack=attack, parse=parse, execution=execution))


def parse_priors(spec: str) -> tuple[priors_lib.Prior, ...]:
  """``"tv:1e-4,l2:1e-6:100"`` -> ``(Prior(PRIORS["tv"], 1e-4, 0), Prior(PRIORS["l2"], 1e-6, 100))``;
  ``""`` -> no priors."""
  out = []
  for item in filter(None, (s.strip() for s in spec.split(","))):
    parts = item.split(":")
    try:
      if len(parts) not in (2, 3):
        raise ValueError
      weight, start = float(parts[1]), int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
      raise ValueError(f"bad prior {item!r}: use name:weight[:start_step], e.g. tv:1e-4") from None
    out.append(priors_lib.Prior(priors_lib.get_prior(parts[0]), weight, start))
  return tuple(out)


def _label_source(name: str):
  # hfginv's counts read auxiliary images: run() infers them and attacks them as known labels.
  return labels_lib.known if name == "hfginv" else labels_lib.get_source(name)


_GAMMA_KEYS = {"init": "init", "lr": "learning_rate", "frozen": "frozen"}


def parse_gamma(spec: str) -> objectives.Gamma:
  """``"init=100,lr=0.01,frozen=500"`` -> ``objectives.Gamma(100.0, 0.01, 500)``; unset keys keep
  their defaults (γ starts at 1, moves with the data's optimizer, from step 0)."""
  fields = {}
  for item in filter(None, (s.strip() for s in spec.split(","))):
    key, _, value = item.partition("=")
    if key.strip() not in _GAMMA_KEYS or not value:
      raise ValueError(f"bad gamma setting {item!r}: use init=G,lr=L,frozen=T (any of them)")
    name = _GAMMA_KEYS[key.strip()]
    try:
      fields[name] = int(value) if name == "frozen" else float(value)
    except ValueError:
      raise ValueError(f"bad gamma setting {item!r}: {key.strip()} needs a number") from None
  return objectives.Gamma(**fields)


def _names(registry) -> str:
  return ", ".join(registry)


_PRESET = " (the preset's if unset)"


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything that defines one reconstruction experiment (``None`` = the preset's or source's
  default). Each field carries its documentation (``dataclasses.fields(Config)[i].metadata["help"]``),
  which is also its command-line flag's help."""

  modality: str = _field(
      "image", "What the client trains: image (a classifier on --dataset images) or text (a language "
      f"model on sentences of the corpus --dataset: {_names(corpus.CORPORA)}; --model transformer).",
      choices=MODALITIES)
  attack: str = _field("dlg", f"Attack preset: {_names(presets.PRESETS)}.")
  model: str | None = _field(
      "lenet_zhu", f"Model: {_names(models.MODELS)}; convnet-W, resnetD-W and mlp-H set the width "
      "(e.g. resnet20-4). With captured files: their metadata's model if unset.")
  checkpoint: str | None = _field(
      None, "Attack the model of this checkpoint (experiments/train.py) instead of a fresh --model "
      "(its model, init and activation come from the checkpoint).")
  weights: str | None = _field(
      None, "Captured server weights to attack (a PyTorch state_dict as safetensors or .npz; see the "
      "README's file format).")
  observation: str | None = _field(
      None, "Captured client gradient, update or weights after local training, against --weights "
      "(same format).")
  rename: str | None = _field(
      None, "Regex rules for the captured files' tensor names, pattern=replacement, comma separated "
      "(e.g. 'downsample=shortcut,^fc\\.=linear.' for torchvision ResNets).")
  num_samples: int | None = _field(
      None, "Captured: examples behind the update (the file's num_samples or labels if unset, else 1).")
  init: str | None = _field(None, f"Model init: {_names(models.INITS)} (the model's own if unset).")
  act: str | None = _field(
      None, f"Activation for models that take one: {_names(models.ACTIVATIONS)}.")
  num_classes: int | None = _field(None, "Model classes (the dataset's if unset).")
  dataset: str | None = _field(
      "skimage", f"Data source: {_names(data.DATASETS)} or tfds:<name>. With --observation: the "
      "client's images for scoring, if given (else no ground truth).")
  data_dir: str | None = _field(None, "Data folder (default: $GRADJAX_DATA_DIR or ../shared/data).")
  index: int = _field(0, "First image of the client's batch.")
  batch_size: int = _field(1, "Client batch size.")
  image_size: int | None = _field(None, "Resize images to this square size (the source's if unset).")
  channels: int | None = _field(None, "Convert images to 1 or 3 channels.")
  normalization: str | None = _field(
      None, f"The client's input normalisation: {_names(data.NORMALIZATION_NAMES)}, or its own "
      "per-channel MEAN/STD, e.g. 0.5,0.5,0.5/0.25,0.25,0.25 (with captured files: their metadata's "
      "if unset; else none).")
  train_mode: bool = _field(False, "Client runs the model in training mode (BatchNorm batch stats).")
  force: bool = _field(
      False, "Attack a capture that fails its checks (the update recomputed from --dataset's images, "
      "the activation read off the last layer); its verdict is then inconclusive.")
  client: str = _field("fedsgd", "Threat model: fedsgd (gradient) or fedavg (update after local "
                       "training).")
  local_epochs: int = _field(1, "FedAvg local epochs.")
  local_batch_size: int | None = _field(None, "FedAvg local mini-batch size (whole batch if unset).")
  local_lr: float = _field(0.01, "FedAvg local learning rate.")
  local_momentum: float = _field(0.0, "FedAvg local SGD momentum.")
  shared_labels: str = _field(
      "ordered", "With known labels, what a FedAvg client reveals: ordered (labels per step) or "
      "multiset (which labels, not which step).")
  defense: str | None = _field(
      None, "Defense applied to the update, e.g. gaussian:1e-3, prune:0.3, fp16, int8, "
      "clip:1,gaussian:1e-4.")
  restarts: int = _field(1, "Random restarts; the lowest objective wins.")
  permutations: int = _field(
      1, "Permutation search: candidate label-to-mini-batch assignments run in parallel (1 = none).")
  shard: bool = _field(
      False, "Split restarts (x permutation candidates) over all devices, of all hosts with "
      "--distributed.", execution=True)
  halving_rounds: int = _field(
      1, "Successive halving over restarts x candidates: rounds (1 = off).", execution=True)
  halving_keep: float = _field(0.5, "Successive halving: fraction kept after each round.",
                               execution=True)
  strategy: str = _field("auto", "Restart strategy: auto (sequential on CPU, vmap on accelerators), "
                         "tune, sequential, vmap, map.", execution=True)
  map_batch_size: int | None = _field(None, "Restarts vectorised together by --strategy=map.",
                                      execution=True)
  iterations: int | None = _field(
      None, "Optimizer iterations" + _PRESET + "; the preset's step counts (hfginv's prior starts and "
      "layer schedule) scale with it.", attack="iterations")
  objective: str | None = _field(
      None, f"What is matched{_PRESET}: {_names(objectives.MODES)}.", attack="objective")
  optimizer: str | None = _field(
      None, f"Optimizer{_PRESET}: {_names(optimizers.OPTIMIZERS)}.", attack="optimizer.name")
  learning_rate: float | None = _field(None, "Learning rate" + _PRESET + ".", flag="lr",
                                       attack="optimizer.learning_rate")
  tol: float | None = _field(None, "Stop a restart once its objective is <= tol" + _PRESET + ".",
                             attack="tol")
  distance: str | None = _field(
      None, f"Gradient distance{_PRESET}: {_names(distances.DISTANCES)}.", attack="distance",
      parse=distances.get_distance)
  layer_weights: str | None = _field(
      None, f"Per-layer distance weights by depth: {_names(distances.DEPTH_RULES)}.",
      attack="layer_weights")
  priors: str | None = _field(
      None, f"Image priors name:weight[:start_step], comma separated, e.g. tv:1e-4 ('' for none; "
      f"names: {_names(priors_lib.PRIORS)}).", attack="priors", parse=parse_priors)
  labels: str | None = _field(
      None, f"Labels: joint, known, an inference method ({_names(labels_lib.METHODS)}) or "
      "hfginv (duplicate-aware counts from --aux images).", attack="labels", parse=_label_source)
  aux: int = _field(40, "--labels=hfginv: auxiliary images for HFGInv's feature profile, the "
                    "dataset's images after the attacked batch (Ye et al. use 40).")
  schedule: str | None = _field(
      None, f"Learning-rate schedule{_PRESET}: {_names(optimizers.SCHEDULES)}.",
      attack="optimizer.schedule")
  box: bool | None = _field(None, "Clamp dummy data to the valid image range after every step.",
                            attack="box")
  dummy_init: str | None = _field(
      None, f"Dummy-data init: {_names(dummy.INITS)}.", attack="dummy_init",
      parse=dummy.get_init)
  one_sample_per_step: bool | None = _field(
      None, "DLG batch option: move one dummy example per step.", attack="one_sample_per_step")
  gamma: str | None = _field(
      None, "DLM's scale γ (--attack=dlm): init=G (start, default 1), lr=L (Adam of its own), "
      "frozen=T (held for T steps), comma separated, e.g. init=100,frozen=500.", attack="gamma",
      parse=parse_gamma)
  remat: bool | None = _field(
      None, "jax.checkpoint ResNet blocks and replayed local steps: less memory, more compute.",
      attack="remat")
  sequence_length: int = _field(
      15, "Text: tokens per sentence; the client's sentences are the corpus's distinct sentences of "
      "this length, from --index on.")
  vocab_size: int | None = _field(
      None, "Text: vocabulary of the most frequent corpus tokens, <unk> and <eos> included (all if unset).")
  text_dim: int = _field(models.TextSizes().dim, "Text: transformer width (embedding size).")
  text_heads: int = _field(models.TextSizes().heads, "Text: attention heads.")
  text_ffn: int = _field(models.TextSizes().ffn, "Text: feed-forward width.")
  text_layers: int = _field(models.TextSizes().layers, "Text: encoder layers.")
  text_search: str = _field(
      "embeddings", "Text: what is optimised: embeddings (DLG, SAPAG: free dummy embeddings and soft "
      "targets, decoded afterwards) or tokens (gradjax: a distribution over the revealed tokens per "
      "position, the targets tied to the inputs).", choices=text.SEARCHES)
  restrict_tokens: bool = _field(
      True, "Text: decode, and let soft targets range, only over the tokens the embedding gradient "
      "reveals (else the whole vocabulary).")
  conv: str = _field(
      "auto", "Convolutions: xla (lax.conv), im2col (patches x matrix, faster double backward on "
      "XLA:CPU), split (lax.conv with the slow second derivative recast as a convolution), mixed "
      "(split on large feature maps, im2col elsewhere), auto (mixed on CPU, xla elsewhere).",
      choices=models.CONVS)
  seed: int = _field(0, "PRNG seed (model and dummy initialisation).")
  chunk: int = _field(100, "Iterations per jitted chunk between progress reports.", execution=True)
  matmul_precision: str = _field(
      "float32", "Matmul and convolution precision of the client's update and the attack: float32, "
      "tensorfloat32, bfloat16, or default (JAX's, which lets GPUs round float32 products and "
      "ruins gradient matching there).", choices=driver.PRECISIONS, execution=True)
  lpips: str = _field("auto", "LPIPS network for scoring (auto: alex when the lpips extra is "
                      "installed, else none).", choices=LPIPS)

  def execution(self, callback: Callable | None = None, monitor: Callable | None = None,
                saver: driver.Saver | None = None) -> driver.Execution:
    """The :class:`gradjax.driver.Execution` of this experiment's restarts."""
    knobs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.metadata["execution"]}
    return driver.Execution(**knobs, callback=callback, monitor=monitor, saver=saver)

  def text_sizes(self) -> models.TextSizes:
    """The transformer's sizes of this experiment."""
    return models.TextSizes(self.text_dim, self.text_heads, self.text_ffn, self.text_layers)

  def __post_init__(self):
    if self.modality not in MODALITIES:
      raise ValueError(f"unknown modality {self.modality!r}; choose one of {', '.join(MODALITIES)}")
    if self.modality == "text":
      if self.weights or self.observation:
        raise ValueError("captured files hold image models; text runs simulate the client")
      if self.client != "fedsgd":
        raise ValueError("text runs simulate a FedSGD client (--client=fedsgd)")
      if not self.checkpoint and not models.is_text(self.model or ""):
        raise ValueError(f"--modality=text needs a text model ({', '.join(models.TEXT_MODELS)}), "
                         f"not {self.model!r}")
      if self.dataset not in corpus.CORPORA:
        raise ValueError(f"--modality=text reads a corpus ({', '.join(corpus.CORPORA)}), not "
                         f"{self.dataset!r}")
      if self.text_search not in text.SEARCHES:
        raise ValueError(f"unknown text search {self.text_search!r}; choose one of "
                         f"{', '.join(text.SEARCHES)}")
      if self.sequence_length < 1:
        raise ValueError(f"sequence_length must be positive, got {self.sequence_length}")
      if min(self.text_sizes()) < 1:
        raise ValueError(f"transformer sizes must be positive, got {self.text_sizes()}")
    elif models.is_text(self.model or ""):
      raise ValueError(f"model {self.model!r} reads text: add --modality=text")
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--{f.metadata['flag'] or f.name} must be a finite number, got {value}")
    for name in ("learning_rate", "local_lr"):
      if getattr(self, name) is not None and getattr(self, name) <= 0:
        raise ValueError(f"--{'lr' if name == 'learning_rate' else name} must be positive, got "
                         f"{getattr(self, name)}")
    if not 0 <= self.local_momentum < 1:
      raise ValueError(f"--local_momentum must lie in [0, 1), got {self.local_momentum}")
    if self.normalization is not None:
      data.normalization(self.normalization)
    if bool(self.weights) != bool(self.observation):
      raise ValueError("captured files need both --weights and --observation")
    if self.weights and self.checkpoint:
      raise ValueError("--checkpoint and --weights both name the model; give one")
    if self.dataset is None and not self.observation:
      raise ValueError("a simulated client needs a --dataset")
    if self.model is None and not self.weights:
      raise ValueError("no --model given")
    if self.num_samples is not None and self.num_samples < 1:
      raise ValueError(f"num_samples must be positive, got {self.num_samples}")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {self.batch_size}")
    if self.index < 0:
      raise ValueError(f"index must be non-negative, got {self.index}")
    if self.image_size is not None and self.image_size < 1:
      raise ValueError(f"image_size must be positive, got {self.image_size}")
    if self.client not in CLIENTS:
      raise ValueError(f"unknown client {self.client!r}; choose one of {', '.join(CLIENTS)}")
    if self.lpips not in LPIPS:
      raise ValueError(f"unknown LPIPS network {self.lpips!r}; choose one of {', '.join(LPIPS)}")
    if self.lpips in lpips.NETWORKS and not lpips.available(self.lpips):
      raise ValueError(f"--lpips={self.lpips} needs the lpips extra: pip install 'gradjax[lpips]'")
    if self.conv not in models.CONVS:
      raise ValueError(f"unknown convolution implementation {self.conv!r}; choose one of "
                       f"{', '.join(models.CONVS)}")
    if self.shared_labels not in SHARED_LABELS:
      raise ValueError(f"unknown label sharing {self.shared_labels!r}; choose one of "
                       f"{', '.join(SHARED_LABELS)}")
    for name in ("restarts", "permutations"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    self.execution()  # checks the restart knobs (strategy, chunk, halving, map batch size, shard)


def get_attack(cfg: Config) -> attacks.Attack:
  """The preset ``cfg.attack`` built at ``cfg.iterations`` (the preset's own step counts, hfginv's
  prior starts and layer schedule, scale with it), with the parts the configuration names replaced:
  the one place where the names of distances, priors, label sources, dummy initialisations and
  optimizers become objects."""
  overrides, optimizer = {}, {}
  for f in dataclasses.fields(cfg):
    value, parse, target = getattr(cfg, f.name), f.metadata["parse"], f.metadata["attack"]
    if target and target != "iterations" and value is not None:
      value = parse(value) if parse else value
      if target.startswith("optimizer."):
        optimizer[target.removeprefix("optimizer.")] = value
      else:
        overrides[target] = value
  preset = presets.get_preset(cfg.attack)
  attack = preset() if cfg.iterations is None else preset(iterations=cfg.iterations)
  if optimizer:
    overrides["optimizer"] = dataclasses.replace(attack.optimizer, **optimizer)
  return dataclasses.replace(attack, **overrides)


def experiment_keys(seed: int, index: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(model, attack, defense) PRNG keys of experiment ``index`` (see the module docstring)."""
  return _experiment_keys(seed, index)


@compilation.once
def _experiment_keys(seed, index):
  # One program: derived eagerly, each of the five operations was a program of its own.
  base = jax.random.fold_in(jax.random.key(seed), index)
  key_model, key_attack = jax.random.split(base)
  return key_model, key_attack, jax.random.fold_in(base, 1)


def image_bounds(norm: data.Normalization, channels: int) -> tuple[np.ndarray, np.ndarray]:
  """The [0, 1] image box in normalised input space: ((0 − mean) / std, (1 − mean) / std), (C,) each."""
  lo = np.asarray(data.normalize(np.zeros((1, channels), np.float64), norm))[0]
  hi = np.asarray(data.normalize(np.ones((1, channels), np.float64), norm))[0]
  return lo, hi


# Fields that change how a run is scored or where its data lie, not what it computes: a saved state
# continues under other values of these.
NOT_FINGERPRINTED = ("lpips", "data_dir", "force")


def fingerprint(cfg: Config) -> dict:
  """What determines ``cfg``'s reconstruction (its fields but ``NOT_FINGERPRINTED``), for state files."""
  return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_FINGERPRINTED}


def _input_file(path: str | None, flag: str) -> None:
  if path is None:
    return
  if os.path.isdir(path):
    raise ValueError(f"--{flag} {path} is a directory, not a file")
  if not os.path.exists(path):
    raise FileNotFoundError(f"--{flag} {path} does not exist")
  if not os.access(path, os.R_OK):
    raise ValueError(f"--{flag} {path} is not readable")


def check(cfg: Config) -> attacks.Attack:
  """Validates what ``cfg`` names without loading data or compiling anything: the attack and its
  overrides, the defense, the model name, the dataset name and the input files. Returns the attack.
  (Field values were checked when ``cfg`` was built.)"""
  attack = get_attack(cfg)
  if cfg.defense:
    defenses.parse(cfg.defense)
  if cfg.model is not None and not cfg.checkpoint:
    models.get_module(cfg.model, num_classes=cfg.num_classes or 10, init=cfg.init, act=cfg.act,
                      conv=cfg.conv, text_sizes=cfg.text_sizes())
  if (cfg.modality == "image" and cfg.dataset is not None and not cfg.dataset.startswith("tfds:")
      and cfg.dataset not in data.DATASETS):  # a text corpus was checked with the configuration
    raise ValueError(f"unknown dataset {cfg.dataset!r}; expected one of {', '.join(data.DATASETS)} "
                     "or tfds:<name>")
  for flag in ("checkpoint", "weights", "observation"):
    _input_file(getattr(cfg, flag), flag)
  return attack


def attacked_model(cfg: Config) -> str:
  """The name of the model ``cfg`` attacks: ``--model``, or the checkpoint's or the capture's
  model when there is one ("captured" when a capture names none). Reads file metadata only."""
  model = cfg.model
  if cfg.checkpoint:
    model = checkpoint.read_metadata(cfg.checkpoint).get("model", model)
  if cfg.observation and cfg.model is None:
    model = interop.read(cfg.weights).metadata.get("model") or "captured"
  return model


def run_name(cfg: Config) -> str:
  """``<attack>_<model>_<source>``: the run's default folder name, from what is attacked
  (:func:`attacked_model`). Reads file metadata only."""
  model = attacked_model(cfg)
  if cfg.observation:
    source = os.path.splitext(os.path.basename(cfg.observation))[0]
  else:
    # Ranges as a..b: "-k" is the suffix of a taken folder (experiments/common.output_folder).
    source = f"{cfg.dataset.replace(':', '-')}_{cfg.index}" + (
        f"..{cfg.index + cfg.batch_size - 1}" if cfg.batch_size > 1 else "")
  return f"{cfg.attack}_{model}_{source}".replace(os.sep, "-")


def load_batch(cfg: Config) -> data.Dataset:
  """The client's private batch: images ``index .. index + batch_size - 1`` of the dataset."""
  size = None if cfg.image_size is None else (cfg.image_size, cfg.image_size)
  try:
    return data.load(cfg.dataset, data_dir=cfg.data_dir,
                     indices=range(cfg.index, cfg.index + cfg.batch_size), image_size=size,
                     channels=cfg.channels)
  except ValueError as e:
    if "out of range" not in str(e):
      raise
    raise ValueError(f"--index {cfg.index} with --batch_size {cfg.batch_size} asks for images "
                     f"{cfg.index}..{cfg.index + cfg.batch_size - 1}; {e}") from None


def hfginv_labels(cfg: Config, model, observation, norm, key) -> jax.Array:
  """HFGInv's labels of ``observation`` (:func:`gradjax.labels.hfginv`), its feature profile from
  ``cfg.aux`` images of the dataset after the attacked batch, which the client does not hold."""
  if cfg.dataset is None:
    raise ValueError("--labels=hfginv reads auxiliary images of --dataset; none is given")
  if cfg.aux < 2:
    raise ValueError(f"--aux must be at least 2 images, got {cfg.aux}")
  start = cfg.index + observation.num_samples
  size = None if cfg.image_size is None else (cfg.image_size, cfg.image_size)
  try:
    aux = data.load(cfg.dataset, data_dir=cfg.data_dir, indices=range(start, start + cfg.aux),
                    image_size=size, channels=cfg.channels)
  except ValueError as e:
    if "out of range" not in str(e):
      raise
    raise ValueError(f"--labels=hfginv takes --aux {cfg.aux} images after the batch, "
                     f"{start}..{start + cfg.aux - 1}; {e}") from None
  profile = labels_lib.feature_profile(model.apply_fn, model.variables,
                                       jnp.asarray(data.normalize(aux.x, norm), np.float32))
  return labels_lib.hfginv(observation, profile, key)


def _captured(cfg: Config, batch: data.Dataset | None):
  """(model, observation, metadata) from the captured files of ``cfg``."""
  input_shape = None
  if batch is not None:
    input_shape = batch.x.shape[1:]
  elif cfg.image_size is not None:
    input_shape = (cfg.image_size, cfg.image_size, cfg.channels or 3)
  module_kwargs = dict(remat=bool(cfg.remat), conv=cfg.conv)
  if cfg.act is not None:
    module_kwargs["act"] = cfg.act
  imported = interop.load(cfg.weights, cfg.observation, model=cfg.model, input_shape=input_shape,
                          num_classes=cfg.num_classes, rename=interop.parse_renames(cfg.rename),
                          num_samples=cfg.num_samples, train=cfg.train_mode or None,
                          **module_kwargs)
  return imported.model, imported.observation, imported.metadata


def _simulated(cfg: Config, batch: data.Dataset, norm, key_model):
  """The model the simulated client of ``cfg`` trains: a fresh zoo model or a checkpoint's."""
  num_classes = cfg.num_classes or batch.num_classes
  if int(batch.y.max()) >= num_classes:
    raise ValueError(f"labels reach {int(batch.y.max())} but the model has {num_classes} classes")
  input_shape = batch.x.shape[1:]
  if cfg.checkpoint:
    model = checkpoint.load_model(cfg.checkpoint, remat=bool(cfg.remat), conv=cfg.conv)
    saved = checkpoint.load(cfg.checkpoint)[1].get("normalization", "none")
    if saved != (cfg.normalization or "none"):
      raise ValueError(f"checkpoint {cfg.checkpoint} was trained with normalization {saved!r}, "
                       f"not {cfg.normalization or 'none'!r}")
    if tuple(model.input_shape) != tuple(input_shape) or model.num_classes < batch.num_classes:
      raise ValueError(f"checkpoint {cfg.checkpoint} holds a model for {tuple(model.input_shape)} "
                       f"inputs and {model.num_classes} classes; the data is {tuple(input_shape)} "
                       f"with {batch.num_classes} classes")
  else:
    model = models.create(cfg.model, key_model, input_shape=input_shape, num_classes=num_classes,
                          init=cfg.init, act=cfg.act, remat=bool(cfg.remat), conv=cfg.conv)
  return model


class Trace:
  """The objective after every solver chunk, and the PSNR of the current best iterate when a ground
  truth is given: ``rows`` of ``{"restart", "iteration", "loss"[, "psnr"]}`` (restart ``None`` when
  all restarts advance together; then ``loss`` is the best over them), from the first report with a
  best iterate (an attack's ``track_from`` delays it).

  Pass :meth:`progress` as the solver's ``callback`` and :meth:`monitor` as its ``monitor``.
  """

  def __init__(self, callback: Callable | None = None, truth: np.ndarray | None = None,
               norm: data.Normalization | None = None):
    self.rows: list[dict] = []
    self._callback, self._truth, self._norm = callback, truth, norm
    self._recorded = False  # whether the last report made a row (monitor scores that row)

  def progress(self, p) -> None:
    # No row before there is a best iterate (its objective is inf until the attack's track_from).
    self._recorded = not p.compiling and math.isfinite(p.best_loss)
    if self._recorded:
      self.rows.append({"restart": p.restart, "iteration": int(p.iteration), "loss": float(p.best_loss)})
    if self._callback is not None:
      self._callback(p)

  def monitor(self, state) -> bool:
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
    return False


class _Resumable:
  """One experiment's wall time, counted across the runs that resumed it, and its solver-state
  ``saver`` (``None`` without a state file); restoring a state restores the trace's rows too."""

  def __init__(self, cfg: Config, state: resume.StateFile | None, trace: Trace):
    self.start, self.earlier_s, self.resumed, self.saver = time.perf_counter(), 0.0, False, None
    if state is not None:
      def restored(extra):
        trace.rows = list(extra.get("history", []))
        self.earlier_s, self.resumed = float(extra.get("wall_time_s", 0.0)), True

      self.saver = state.saver(fingerprint(cfg), on_restore=restored, extra=lambda: {
          "history": trace.rows, "wall_time_s": self.wall_s()})

  def wall_s(self) -> float:
    return self.earlier_s + time.perf_counter() - self.start


def _record(cfg: Config, attack: attacks.Attack, rec: attacks.Reconstruction, model: models.Model,
            observation, trace: Trace, timing: _Resumable) -> dict[str, Any]:
  """The results every experiment reports: timing, counts, the objective, configuration, device."""
  saver = timing.saver
  return dict(
      wall_time_s=timing.wall_s(),
      iterations=int(rec.iterations[rec.best_restart]),
      evaluations=int(rec.evaluations.sum()),
      restarts=cfg.restarts,
      resumed=timing.resumed,
      state_saves=0 if saver is None else saver.saves,
      state_save_s=0.0 if saver is None else saver.seconds,
      state_save_error=None if saver is None else saver.error,
      restarts_diverged=int((~rec.restart_alive).sum()),
      best_restart=rec.best_restart,
      loss=rec.loss,
      history=trace.rows,
      model=model.name,
      num_samples=observation.num_samples,
      threat_model=observation.threat_model,
      attack=attacks.describe(attack),
      config=dataclasses.asdict(cfg),
      device=str(jax.devices()[0]),
      devices=jax.device_count() if cfg.shard else 1,
      backend=jax.default_backend(),
      jax_version=jax.__version__,
  )


def run(cfg: Config, *, callback: Callable | None = None, batch: data.Dataset | None = None,
        state: resume.StateFile | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Runs experiment ``cfg``; returns (JSON-ready results, images).

  ``state``: where the solver's state is saved every so often, and whether a saved one is continued
  (:mod:`gradjax.resume`; the file is refused unless it was saved by a run of the same
  :func:`fingerprint`). The caller deletes it once the results are written.

  ``results`` holds the metrics (``psnr``, ``ssim``, ``mse``, ``label_accuracy`` and per-image values,
  scored after matching the batch order; absent without ground truth), ``wall_time_s`` of the attack
  (compilation included), iteration and evaluation counts, the objective value, labels, the
  configuration and the device. ``images`` holds ``reconstruction`` (N, H, W, C) in [0, 1] space (in
  the ground truth's order when there is one, else in the attack's slot order) and
  ``ground_truth`` (or ``None``).
  """
  if cfg.modality != "image":
    raise ValueError(f"run() attacks images; a {cfg.modality} experiment runs with run_text()")
  with driver.precision_scope(cfg.matmul_precision):  # the client's update as well as the attack
    return _run_image(cfg, callback, batch, state)


def _run_image(cfg: Config, callback, batch, state):
  attack = check(cfg)
  key_model, key_attack, key_defense = experiment_keys(cfg.seed, cfg.index)
  share_labels = cfg.labels != "hfginv" and attack.labels is labels_lib.known  # else a finding
  checks, problems = {}, []
  if cfg.observation:
    if batch is None and cfg.dataset is not None:
      # The ground truth for scoring: as many images as the capture says the client had.
      n = cfg.num_samples or interop_num_samples(cfg)
      batch = load_batch(dataclasses.replace(cfg, batch_size=n))
    model, observation, meta = _captured(cfg, batch)
    norm = data.normalization(cfg.normalization or meta.get("normalization") or "none")
    if batch is not None and batch.x.shape[0] != observation.num_samples:
      raise ValueError(f"the capture holds {observation.num_samples} samples but the ground truth "
                       f"has {batch.x.shape[0]} images")
    checks, problems = fidelity.check_capture(model, observation, batch, norm)
    if problems and not cfg.force:
      raise fidelity.CaptureMismatch("the capture does not fit the declared client: " + "; ".join(problems)
                            + " (--force attacks it anyway; its verdict is then inconclusive)")
  else:
    norm = data.normalization(cfg.normalization or "none")
    batch = load_batch(cfg) if batch is None else batch
    model = _simulated(cfg, batch, norm, key_model)
    x_client = np.asarray(data.normalize(batch.x, norm), np.float32)
    if share_labels and cfg.client == "fedavg":
      share_labels = cfg.shared_labels
    if cfg.client == "fedsgd":
      observation = clients.fedsgd(model.apply_fn, model.variables, x_client, batch.y,
                                   train=cfg.train_mode, share_labels=share_labels)
    else:
      local = clients.LocalTraining(cfg.local_epochs, cfg.local_batch_size, cfg.local_lr,
                                    cfg.local_momentum)
      observation = clients.fedavg(model.apply_fn, model.variables, x_client, batch.y, local,
                                   train=cfg.train_mode, share_labels=share_labels)
  input_shape = tuple(model.input_shape)
  if cfg.defense:
    observation = defenses.parse(cfg.defense).apply(observation, key_defense)
  if (attack.objective == "gradient" and observation.threat_model == "fedavg"
      and observation.local is not None):
    # One local step is lr times a gradient: match that gradient (several steps raise, naming the
    # objectives that replay them).
    observation = clients.update_as_gradient(observation)

  if cfg.labels == "hfginv":  # inferred here, where the auxiliary images are, then attacked as known
    observation = observation.replace(
        labels=hfginv_labels(cfg, model, observation, norm, jax.random.fold_in(key_attack, 1)))

  trace = Trace(callback, None if batch is None else np.asarray(batch.x, np.float64), norm)
  timing = _Resumable(cfg, state, trace)
  # PSNR per chunk needs a ground truth; sharded runs would gather the whole solver state to the
  # host for it, so they record the objective only.
  execution = cfg.execution(callback=trace.progress,
                            monitor=trace.monitor if batch is not None and not cfg.shard else None,
                            saver=timing.saver)
  rec = attacks.reconstruct(attack, model.apply_fn, observation, key_attack, input_shape=input_shape,
                            bounds=image_bounds(norm, input_shape[-1]), restarts=cfg.restarts,
                            permutations=cfg.permutations, execution=execution)
  results = _record(cfg, attack, rec, model, observation, trace, timing)

  x_rec = np.asarray(data.denormalize(rec.x, norm), np.float64)
  if not np.all(np.isfinite(x_rec)):
    raise FloatingPointError("the best reconstruction is not finite")
  results.update(
      candidates=int(rec.candidates.shape[0]),
      labels_by_slot=rec.labels.tolist(),  # the labels of dummy slots 0..N-1 (mini-batch order)
      gamma=(float(np.exp(rec.dummy["log_gamma"])) if "log_gamma" in rec.dummy else None),
      conv=models.resolve_conv(cfg.conv),
      normalization={"mean": list(norm.mean), "std": list(norm.std)},
      checks=checks,
  )
  residual = verdict.residual(model.apply_fn, observation, rec.dummy, rec.labels, mode=attack.objective)
  findings, images = None, {"ground_truth": None, "reconstruction": np.clip(x_rec, 0.0, 1.0)}
  if batch is not None:
    scores = metrics.score(x_rec, batch.x, rec.labels, batch.y)
    order = np.asarray(scores["order"])
    results.update(scores, labels_true=batch.y.tolist(),
                   labels_reconstructed=rec.labels[order].tolist())
    results.update(lpips_scores(cfg.lpips, x_rec[order], batch.x))
    results["psnr_mean_colour_per_image"] = verdict.mean_colour_psnr(batch.x).tolist()
    findings = verdict.image_findings(results, labels_inferred=not share_labels,
                                      num_classes=model.num_classes)
    images = {"ground_truth": batch.x, "reconstruction": np.clip(x_rec[order], 0.0, 1.0)}
  if results.get("lpips") is None:
    results["lpips_absent"] = lpips_absent(cfg.lpips, batch, input_shape)
  results.update(_verdict(results, residual, findings, problems, cfg))
  return results, images


def _verdict(results: dict, residual, findings, problems, cfg: Config) -> dict:
  """``verdict``, ``residual`` and ``thresholds`` of a run's results (:mod:`gradjax.verdict`)."""
  budget = verdict.budget(cfg.attack, results["iterations"], cfg.restarts)
  improving = verdict.still_improving(results["history"], results["iterations"])
  return {"verdict": verdict.decide(findings=findings, residual=residual, improving=improving,
                                    budget=budget, problems=problems),
          "residual": None if residual is None else residual._asdict(),
          "still_improving": improving, "thresholds": verdict.THRESHOLDS._asdict()}


def lpips_absent(net: str, batch, input_shape) -> str:
  """Why a run reports no LPIPS (one phrase)."""
  if batch is None:
    return "no ground truth to compare with"
  if net == "none":
    return "switched off (--lpips=none)"
  if not lpips.available("alex"):
    return "the lpips extra is not installed (pip install 'gradjax[lpips]')"
  return (f"images of {input_shape[0]}x{input_shape[1]} pixels are smaller than AlexNet's "
          f"{lpips.MIN_SIZE['alex']}")


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
  return interop.metadata_num_samples(interop.read(cfg.observation).metadata, cfg.observation) or 1


# --- text -----------------------------------------------------------------------------------------


class Sentences(NamedTuple):
  """The client's private sentences: ``ids`` (N, T) int32 in ``vocabulary``; ``pool`` the number of
  distinct corpus sentences of length T that ``index`` ranges over."""

  ids: np.ndarray
  vocabulary: corpus.Vocabulary
  pool: int


def text_vocabulary(cfg: Config, sentences: list[list[str]]) -> corpus.Vocabulary:
  """The vocabulary of ``cfg``'s model: the checkpoint's (its token ids are the trained rows), else
  built from the corpus (``vocab_size`` most frequent tokens)."""
  if cfg.checkpoint:
    tokens = checkpoint.read_metadata(cfg.checkpoint).get("vocabulary")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
      raise ValueError(f"checkpoint {cfg.checkpoint} holds no text model's vocabulary")
    if cfg.vocab_size is not None and cfg.vocab_size != len(tokens):
      raise ValueError(f"checkpoint {cfg.checkpoint} has a vocabulary of {len(tokens)}, not "
                       f"--vocab_size {cfg.vocab_size}")
    return corpus.Vocabulary(tuple(tokens))
  return corpus.Vocabulary.build(sentences, cfg.vocab_size)


def load_sentences(cfg: Config) -> Sentences:
  """Sentences ``index .. index + batch_size − 1`` of the corpus's distinct ``sequence_length``-token
  sentences (:func:`gradjax.corpus.of_length`), as ids of :func:`text_vocabulary`."""
  sentences = corpus.sentences(cfg.dataset, cfg.data_dir)
  vocabulary = text_vocabulary(cfg, sentences)
  pool = corpus.of_length(sentences, cfg.sequence_length)
  if cfg.index + cfg.batch_size > len(pool):
    raise ValueError(f"--index {cfg.index} with --batch_size {cfg.batch_size} asks for sentences "
                     f"{cfg.index}..{cfg.index + cfg.batch_size - 1}, but corpus {cfg.dataset!r} has "
                     f"{len(pool)} distinct sentences of {cfg.sequence_length} tokens")
  chosen = pool[cfg.index:cfg.index + cfg.batch_size]
  return Sentences(np.stack([vocabulary.encode(s) for s in chosen]), vocabulary, len(pool))


def text_model(cfg: Config, vocabulary: corpus.Vocabulary, key_model) -> models.Model:
  """A fresh ``cfg.model`` over ``vocabulary``, or the checkpoint's trained one."""
  if cfg.checkpoint:
    model = checkpoint.load_model(cfg.checkpoint)
    if not models.is_text(model.name) or model.num_classes != len(vocabulary):
      raise ValueError(f"checkpoint {cfg.checkpoint} does not hold a text model over its vocabulary")
    return model
  if cfg.num_classes is not None and cfg.num_classes != len(vocabulary):
    raise ValueError(f"a language model's classes are its vocabulary ({len(vocabulary)}); drop "
                     "--num_classes or set --vocab_size")
  return models.create(cfg.model, key_model, input_shape=(cfg.sequence_length,),
                       num_classes=len(vocabulary), init=cfg.init, text_sizes=cfg.text_sizes())


def run_text(cfg: Config, *, callback: Callable | None = None,
             state: resume.StateFile | None = None) -> dict[str, Any]:
  """Runs text experiment ``cfg`` (``modality="text"``); returns JSON-ready results.

  The client computes the FedSGD gradient of the next-token loss on its sentences
  (:func:`gradjax.corpus.language_model_pairs`), a defense may act on it, and
  :func:`gradjax.text.reconstruct` recovers the sentences. ``results`` holds ``token_accuracy`` and
  ``bag_recall`` of the pseudo-inverse decoding (SAPAG's) and ``*_nearest`` of the nearest-neighbour
  one (DLG's), ``exact`` sentences, ``sentences`` (true and recovered text side by side), the bag of
  tokens the gradient revealed, counts, timing, configuration and device. ``state`` as :func:`run`.
  """
  with driver.precision_scope(cfg.matmul_precision):
    return _run_text(cfg, callback, state)


def _run_text(cfg: Config, callback, state):
  attack = check(cfg)
  key_model, key_attack, key_defense = experiment_keys(cfg.seed, cfg.index)
  batch = load_sentences(cfg)
  vocabulary = batch.vocabulary
  model = text_model(cfg, vocabulary, key_model)
  x, y = corpus.language_model_pairs(batch.ids, vocabulary.eos)
  observation = clients.fedsgd(model.apply_fn, model.variables, x, y,
                               share_labels=attack.labels is labels_lib.known)
  if cfg.defense:
    observation = defenses.parse(cfg.defense).apply(observation, key_defense)

  trace = Trace(callback)
  timing = _Resumable(cfg, state, trace)
  execution = cfg.execution(callback=trace.progress, saver=timing.saver)
  rec = text.reconstruct(attack, model.apply_fn, observation, key_attack, length=cfg.sequence_length,
                         eos=vocabulary.eos, restrict=cfg.restrict_tokens, restarts=cfg.restarts,
                         search=cfg.text_search, execution=execution)
  results = _record(cfg, attack, rec.reconstruction, model, observation, trace, timing)
  pinv = metrics.score_text(rec.tokens_pinv, batch.ids)
  nearest = metrics.score_text(rec.tokens_nearest, batch.ids)
  rows = []
  for i in range(batch.ids.shape[0]):
    p, n = rec.tokens_pinv[pinv["order"][i]], rec.tokens_nearest[nearest["order"][i]]
    rows.append({"true": corpus.detokenize(vocabulary.decode(batch.ids[i])),
                 "recovered (pseudo-inverse)": corpus.detokenize(vocabulary.decode(p)),
                 "recovered (nearest)": corpus.detokenize(vocabulary.decode(n)),
                 "token_accuracy": pinv["token_accuracy_per_sentence"][i],
                 "bag_recall": pinv["bag_recall_per_sentence"][i]})
  results.update(
      token_accuracy=pinv["token_accuracy"],
      bag_recall=pinv["bag_recall"],
      exact=pinv["exact"],
      token_accuracy_nearest=nearest["token_accuracy"],
      bag_recall_nearest=nearest["bag_recall"],
      exact_nearest=nearest["exact"],
      token_accuracy_per_sentence=pinv["token_accuracy_per_sentence"],
      bag_recall_per_sentence=pinv["bag_recall_per_sentence"],
      token_accuracy_nearest_per_sentence=nearest["token_accuracy_per_sentence"],
      sentences=rows,
      bag=vocabulary.decode(rec.bag),
      bag_size=int(rec.bag.size),
      sentence_pool=batch.pool,
      vocabulary_size=len(vocabulary),
      sequence_length=cfg.sequence_length,
  )
  residual = None
  if "x" in rec.reconstruction.dummy and cfg.text_search == "embeddings":
    residual = verdict.residual(model.apply_fn, observation, rec.reconstruction.dummy,
                                rec.reconstruction.labels)
  results.update(_verdict(results, residual, verdict.text_findings(results), [], cfg))
  return results
