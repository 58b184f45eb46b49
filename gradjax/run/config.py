"""The configuration of one experiment: :class:`Config`, one frozen section per concern (``data``,
``model``, ``client``, ``defense``, ``attack``, ``execution``, ``output``, ``sampling``, ``training``,
``utility``, ``gate``; ``seed`` at the top), every option declared once with its documentation; the sections
build the objects the runner takes (:meth:`AttackConfig.build` the attack, :meth:`ExecutionConfig.build`
the restart driver's record).

An option is named by its dotted path (``"attack.iterations"``). Configuration files (big_vision's
style) hold the same tree: a file's ``get_config()`` returns an ``ml_collections.ConfigDict`` built
from :func:`defaults`::

  from gradjax.run import config

  def get_config():
    c = config.defaults()
    c.attack.preset = "inverting_gradients"
    c.model.name = "resnet20-4"
    return c

read with ``--config=that_file.py`` (``--config.attack.iterations=6000`` overrides one option; the
common options have short flags too, ``--iterations``: :data:`ALIASES`). :func:`from_dict` builds the
:class:`Config`; :func:`to_python` writes a resolved one back as such a file, which reproduces the run.
A file may declare a sweep, which ``gradjax sweep`` runs one experiment per item of::

  def get_sweep():
    return config.product(config.sweep("data.index", range(10)),
                          config.sweep("defense.spec", [None, "prune:0.2"]))

The runner, :mod:`gradjax.run.pipeline`, reads a built :class:`Config`; nothing below it reads names.
"""

import dataclasses
import functools
import math
import numbers
import os
import typing
from typing import Any, Callable

import numpy as np
from ml_collections import config_dict

from gradjax import attacks, auto, checkpoint, clients, closed_forms, corpus, data, defenses, distances
from gradjax import driver, dummy
from gradjax import interop, lpips, models, objectives, optimizers, presets, text
from gradjax import labels as labels_lib
from gradjax import priors as priors_lib

CLIENTS = ("fedsgd", "fedavg")
MODALITIES = ("image", "text")
LPIPS = ("auto", "none", *lpips.NETWORKS)  # auto: AlexNet when the lpips extra is installed
SHARED_LABELS = ("ordered", "multiset")  # what a FedAvg client with known labels reveals


def _field(default, help: str, *, choices: tuple[str, ...] | None = None, attack: str | None = None,
           parse: Callable | None = None):
  """An option of a section, with its documentation, declared once; the command-line programs derive
  their flags from these (``gradjax/cli/common.py``).

  help: the flag's help text. choices: the only values it takes. attack: the :class:`gradjax.attacks.Attack` field this one
  overrides when set, ``"optimizer.<field>"`` for a field of its :class:`gradjax.optimizers.Named`
  optimizer (``parse`` turns the option's text into that field's value: names resolve to objects here).
  """
  return dataclasses.field(default=default, metadata=dict(
      help=help, choices=choices, attack=attack, parse=parse))


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


# Label rules that run the server's copy of the model on images of its own (hfginv's auxiliary
# images, LLG*'s dummy ones): run() infers them and attacks them as known labels.
SERVER_INFERRED_LABELS = ("hfginv", "llg_star")


def _label_source(name: str):
  if name not in (*labels_lib.SOURCES, *SERVER_INFERRED_LABELS):
    raise ValueError(f"unknown label source {name!r}; choose one of "
                     f"{', '.join((*labels_lib.SOURCES, *SERVER_INFERRED_LABELS))}")
  return labels_lib.known if name in SERVER_INFERRED_LABELS else labels_lib.get_source(name)


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


def parse_iterate(spec: str) -> Callable[[int], int]:
  """``--config.attack.iterate``: the attack's ``track_from`` for a budget of ``iterations``:
  "best" 0 (every iterate counts, from where the objective's terms settle:
  :func:`gradjax.attacks.track_from`), "last" the budget (only the final iterate counts)."""
  if spec not in ("best", "last"):
    raise ValueError(f"iterate must be 'best' or 'last', got {spec!r}")
  return lambda iterations: 0 if spec == "best" else iterations


def parse_smoothing(spec: str) -> Callable[[int], objectives.Smoothing]:
  """``"0.5,start=2,end=1e4"`` -> ``lambda iterations: objectives.Smoothing(round(0.5 * iterations),
  2.0, 1e4)``: the model sharpens over that fraction of the attack's budget (in (0, 1)); ``start``
  and ``end`` keep their defaults when unset."""
  head, *items = (s.strip() for s in spec.split(","))
  usage = "use F[,start=S][,end=E], F the fraction of the iterations in (0, 1)"
  try:
    fraction = float(head)
  except ValueError:
    raise ValueError(f"bad smoothing {spec!r}: {usage}") from None
  if not 0 < fraction < 1:
    raise ValueError(f"bad smoothing {spec!r}: {usage}")
  fields = {}
  for item in filter(None, items):
    key, _, value = (part.strip() for part in item.partition("="))
    if key not in ("start", "end") or not value:
      raise ValueError(f"bad smoothing setting {item!r}: {usage}")
    try:
      fields[key] = float(value)
    except ValueError:
      raise ValueError(f"bad smoothing setting {item!r}: {key} needs a number") from None
  objectives.Smoothing(until=1, **fields)  # checks start and end now, not at the attack's build

  def smoothing(iterations: int) -> objectives.Smoothing:
    return objectives.Smoothing(until=max(1, round(fraction * iterations)), **fields)

  return smoothing


def _names(registry) -> str:
  return ", ".join(registry)


_PRESET = " (the preset's if unset)"


_SECTION_KINDS: dict[str, type] = {}  # section -> its class (filled once Config is declared)


@dataclasses.dataclass(frozen=True)
class _Section:
  """A section of :class:`Config`: its options that take ``choices`` are checked when it is built."""

  def __post_init__(self):
    name = next(s for s, kind in _SECTION_KINDS.items() if isinstance(self, kind))
    for f in dataclasses.fields(self):
      value, choices = getattr(self, f.name), f.metadata["choices"]
      if choices is not None and value not in choices:
        raise ValueError(f"{flag(f'{name}.{f.name}')}={value}: choose one of {', '.join(choices)}")


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
  """The client's data: the source and which examples (images, or sentences of a corpus) it trains
  on."""

  modality: str = _field(
      "image", "What the client trains: image (a classifier on --dataset images) or text (a language "
      f"model on sentences of the corpus --dataset: {_names(corpus.CORPORA)}; --model "
      f"{_names(models.TEXT_MODELS)}).",
      choices=MODALITIES)
  dataset: str | None = _field(
      "skimage", f"Data source: {_names(data.DATASETS)} or tfds:<name>. With --observation: the "
      "client's images for scoring, if given (else no ground truth).")
  data_dir: str | None = _field(None, "Data folder (default: $GRADJAX_DATA_DIR or ../shared/data).")
  index: int = _field(0, "First example of the client's batch (an image, or a sentence of the corpus).")
  batch_size: int = _field(1, "Client batch size.")
  image_size: int | None = _field(None,
                                  "Resize images to this square size (the source's if unset).")
  channels: int | None = _field(None, "Convert images to 1 or 3 channels.")
  normalization: str | None = _field(
      None, f"The client's input normalisation: {_names(data.NORMALIZATION_NAMES)}, or its own "
      "per-channel MEAN/STD, e.g. 0.5,0.5,0.5/0.25,0.25,0.25 (with captured files: their metadata's "
      "if unset; else none).")
  sequence_length: int = _field(
      15,
      "Text: tokens per sentence; the client's sentences are the corpus's distinct sentences of "
      "this length (at most, with --config.data.min_length), from --index on.")
  min_length: int | None = _field(
      None,
      "Text: the client's sentences hold min_length to sequence_length tokens, padded on the right "
      "to sequence_length with no loss past their ends (a padded batch; read by --attack=dager on "
      "a causal model). Unset: every sentence holds sequence_length.")
  vocab_size: int | None = _field(
      None,
      "Text: vocabulary of the most frequent corpus tokens, <unk> and <eos> included (all if unset)."
  )
  tokenizer: str = _field(
      "words",
      "Text: 'words' (the corpus's words) or 'bpe:N' (byte-pair pieces, N of them, learned "
      "on the corpus read by SentencePiece; needs the sentencepiece package); --config.data.sequence_length "
      "counts these tokens.")


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
  """The model the client trains: a zoo model, a checkpoint, or captured server weights."""

  name: str | None = _field(
      "lenet_zhu", f"Model: {_names(models.MODELS)}; convnet-W, resnetD-W and mlp-H set the width "
      f"(e.g. resnet20-4); for --modality=text {_names(models.TEXT_MODELS)}. With captured files: "
      "their metadata's model if unset.")
  checkpoint: str | None = _field(
      None, "Attack the model of this checkpoint (gradjax train) instead of a fresh --model "
      "(its model, init and activation come from the checkpoint).")
  weights: str | None = _field(
      None, "Captured server weights to attack (a PyTorch state_dict as safetensors or .npz; see the "
      "README's file format).")
  rename: str | None = _field(
      None, "Regex rules for the captured files' tensor names, pattern=replacement, comma separated "
      "(e.g. 'downsample=shortcut,^fc\\.=linear.' for torchvision ResNets).")
  init: str | None = _field(None, f"Model init: {_names(models.INITS)} (the model's own if unset).")
  act: str | None = _field(
      None, f"Activation for models that take one: {_names(models.ACTIVATIONS)}.")
  num_classes: int | None = _field(None, "Model classes (the dataset's if unset).")
  conv: str = _field(
      "auto", "Convolutions: xla (lax.conv), im2col (patches x matrix, faster double backward on "
      "XLA:CPU), gather (im2col with the patches taken by one gather: a shorter program to compile), "
      "split (lax.conv with the slow second derivative recast as a convolution), mixed "
      "(split on large feature maps, im2col elsewhere), auto (on CPU mixed for attacks and split for "
      "gradjax train, whose epochs run in a lax.scan; on accelerators im2col for restarts, label orders "
      "or clients vmapped together, xla for one run).",
      choices=models.CONVS)
  text_dim: int = _field(models.TextSizes().dim, "Text: transformer width (embedding size).")
  text_heads: int = _field(models.TextSizes().heads, "Text: attention heads.")
  text_ffn: int = _field(models.TextSizes().ffn, "Text: feed-forward width.")
  text_layers: int = _field(models.TextSizes().layers, "Text: encoder layers.")

  def text_sizes(self) -> models.TextSizes:
    """The transformer's sizes."""
    return models.TextSizes(self.text_dim, self.text_heads, self.text_ffn, self.text_layers)

  def build(self, key, input_shape: tuple[int, ...], num_classes: int, *, conv: str | None = None,
            remat: bool = False) -> models.Model:
    """A fresh zoo model ``name`` (:func:`gradjax.models.create`) drawn from ``key``: one example of
    ``input_shape`` ((H, W, C) images, (T,) tokens), ``num_classes`` outputs (an image model's: the
    section's ``num_classes`` where set, else the data's; a text model's: its vocabulary), its init
    and activation (an image model's) or its sizes (a text model's), its convolutions ``conv`` (the
    section's where None) and ``remat``."""
    if models.is_text(self.name or ""):
      return models.create(self.name, key, input_shape=input_shape, num_classes=num_classes,
                           init=self.init, text_sizes=self.text_sizes())
    return models.create(self.name, key, input_shape=input_shape,
                         num_classes=self.num_classes or num_classes, init=self.init, act=self.act,
                         remat=remat, conv=self.conv if conv is None else conv)


@dataclasses.dataclass(frozen=True)
class ClientConfig(_Section):
  """The client: its threat model (FedSGD gradient or FedAvg update) and local training, or a
  captured update."""

  name: str = _field("fedsgd", "Threat model: fedsgd (gradient) or fedavg (update after local "
                       "training).")
  train_mode: bool = _field(False, "Client runs the model in training mode (BatchNorm batch stats).")
  share_statistics: bool = _field(
      False, "The client returns its BatchNorm running statistics with its update (as a PyTorch "
      "state_dict does): after one training-mode step they reveal its batch's moments, which the "
      "BatchNorm prior then matches (needs --config.client.train_mode=True and one local step).")
  local_epochs: int = _field(1, "FedAvg local epochs.")
  local_batch_size: int | None = _field(None, "FedAvg local mini-batch size (whole batch if unset).")
  local_lr: float = _field(0.01, "FedAvg local learning rate.")
  local_momentum: float = _field(0.0, "FedAvg local SGD momentum.")
  shared_labels: str = _field(
      "ordered", "With known labels, what a FedAvg client reveals: ordered (labels per step) or "
      "multiset (which labels, not which step).")
  observation: str | None = _field(
      None, "Captured client gradient, update or weights after local training, against --weights "
      "(same format).")
  num_samples: int | None = _field(
      None,
      "Captured: examples behind the update (the file's num_samples or labels if unset, else 1).")
  force: bool = _field(
      False,
      "Attack a capture that fails its checks (the update recomputed from --dataset's images, "
      "the activation read off the last layer); its verdict is then inconclusive.")

  def local_training(self) -> clients.LocalTraining:
    """A FedAvg client's local training (epochs, mini-batch size, learning rate, momentum)."""
    return clients.LocalTraining(self.local_epochs, self.local_batch_size, self.local_lr,
                                 self.local_momentum)

  def build(self, *, share_labels: bool = False, dp_sgd: clients.DPSGD | None = None,
            key=None) -> Callable[..., clients.Observation]:
    """The simulated client, ``client(apply_fn, variables, x, y) -> Observation``:
    :func:`gradjax.clients.fedsgd`, or :func:`gradjax.clients.fedavg` after
    :meth:`local_training`, in the section's mode and sharing its statistics as it says.
    ``share_labels``: the threat model reveals the labels (the attack takes them as known); a FedAvg
    client then reveals them as ``shared_labels`` says. ``dp_sgd``: the client's steps are
    DP-SGD's (:meth:`DefenseConfig.dp_sgd`), their noise drawn with ``key``."""
    kind = dict(train=self.train_mode, share_statistics=self.share_statistics, dp_sgd=dp_sgd,
                key=key)
    if self.name == "fedsgd":
      return functools.partial(clients.fedsgd, share_labels=share_labels, **kind)
    return functools.partial(clients.fedavg, local=self.local_training(),
                             share_labels=self.shared_labels if share_labels else False, **kind)


@dataclasses.dataclass(frozen=True)
class DefenseConfig(_Section):
  """The defense the client applies to its update."""

  spec: str | None = _field(
      None, "Defense applied to the update, e.g. gaussian:1e-3, prune:0.3, fp16, int8, "
      "clip:1,gaussian:1e-4.")

  dp_sgd_max_norm: float | None = _field(
      None, "DP-SGD (Abadi et al. 2016, as Opacus runs it): the client's steps (a FedSGD client's "
      "one, every local step of a FedAvg client) clip each example's gradient to this L2 norm over "
      "all parameters before averaging (unset: no DP-SGD). With a capture: the bound its client "
      "used (a capture whose metadata declare dp_sgd_max_norm sets these options itself).")
  dp_sgd_noise_multiplier: float = _field(
      0.0, "DP-SGD's noise multiplier σ: N(0, σ²C²) on the sum of a step's clipped gradients "
      "(standard deviation σC/B on their mean over its B examples).")
  dp_sgd_sampling_rate: float = _field(
      1.0, "For DP-SGD's privacy budget: q, the chance that each of the client's examples is in a "
      "step's batch (its batch size over its data set's; 1: every step sees them all).")
  dp_sgd_steps: int = _field(
      1, "For DP-SGD's privacy budget: T, the DP-SGD steps of the client's training (a FedAvg "
      "client's fixed mini-batches put an example in one step an epoch, at rate 1). A simulated "
      "FedAvg client counts at least its round's own: its local epochs, or its local steps with "
      "dp_sgd_poisson.")
  dp_sgd_delta: float = _field(1e-5, "For DP-SGD's privacy budget: the δ of the (ε, δ) reported.")
  dp_sgd_poisson: bool = _field(
      False, "A simulated DP-SGD client draws each step's batch by Poisson sampling (Opacus' "
      "default): each of its examples joins at dp_sgd_sampling_rate q, the sum divided by the "
      "expected batch size q·n. FedSGD: the --batch_size examples are its data, the step's draw is "
      "what the attack is scored against (one dummy per example drawn); FedAvg: the local schedule's "
      "steps each draw from all its examples (Opacus: q = local batch size / n), which the adapted "
      "attack replays as their expectation. False: fixed batches (poisson_sampling=False). With a "
      "capture: its client's steps were drawn so (a capture's metadata dp_sgd_poisson=true set it).")
  dp_sgd_expected_batch_size: float | None = _field(
      None, "A captured Poisson-sampled DP-SGD client's divisor of a step's sum (Opacus' "
      "optimizer.expected_batch_size, int(q·n)): what a FedSGD capture's attack divides by, its "
      "num_samples being the count drawn (required there); a FedAvg capture's expected replay "
      "divides each step by it (unset: q·n). A simulated client divides by q·n (leave it unset).")

  def check_bound(self, capture: str | None = None) -> None:
    """ValueError where DP-SGD's options that need its clipping bound come without it: checked on
    the whole configuration (:class:`Config`), after a ``capture``'s declared DP-SGD is read in
    (:func:`with_declared`), which may give the bound."""
    where = f" (or a capture that declares dp_sgd_max_norm; {capture} declares none)" if capture else ""
    if self.dp_sgd_max_norm is None and self.dp_sgd_poisson:
      raise ValueError("--config.defense.dp_sgd_poisson draws DP-SGD's batches: give "
                       f"--config.defense.dp_sgd_max_norm too{where}")
    if self.dp_sgd_max_norm is None and self.dp_sgd_noise_multiplier:
      raise ValueError("--config.defense.dp_sgd_noise_multiplier scales DP-SGD's clipping bound: "
                       f"give --config.defense.dp_sgd_max_norm too{where}")

  def build(self) -> defenses.Defense | None:
    """The defense (:func:`gradjax.defenses.parse`), or None for none."""
    defense = defenses.parse(self.spec or "none")
    return None if defense.name == "none" else defense

  def dp_sgd(self) -> clients.DPSGD | None:
    """The client's DP-SGD step (:class:`gradjax.clients.DPSGD`), or None without one."""
    if self.dp_sgd_max_norm is None:
      return None
    return clients.DPSGD(self.dp_sgd_max_norm, self.dp_sgd_noise_multiplier,
                         self.dp_sgd_sampling_rate if self.dp_sgd_poisson else None).check()

  def __post_init__(self):
    super().__post_init__()
    if self.dp_sgd_max_norm is not None and not 0 < self.dp_sgd_max_norm < math.inf:
      raise ValueError(f"--config.defense.dp_sgd_max_norm must be a positive number, got "
                       f"{self.dp_sgd_max_norm}")
    if not 0 <= self.dp_sgd_noise_multiplier < math.inf:
      raise ValueError(f"--config.defense.dp_sgd_noise_multiplier must be a number >= 0, got "
                       f"{self.dp_sgd_noise_multiplier}")
    if self.dp_sgd_expected_batch_size is not None and not (
        self.dp_sgd_poisson and 0 < self.dp_sgd_expected_batch_size < math.inf):
      raise ValueError("--config.defense.dp_sgd_expected_batch_size is a Poisson-sampled step's "
                       f"divisor, a positive number with --config.defense.dp_sgd_poisson=True, got "
                       f"{self.dp_sgd_expected_batch_size} (dp_sgd_poisson={self.dp_sgd_poisson})")
    if not 0 < self.dp_sgd_sampling_rate <= 1:
      raise ValueError(f"--config.defense.dp_sgd_sampling_rate must lie in (0, 1], got "
                       f"{self.dp_sgd_sampling_rate}")
    if self.dp_sgd_steps < 1 or not 0 < self.dp_sgd_delta < 1:
      raise ValueError(f"--config.defense.dp_sgd_steps must be at least 1 and dp_sgd_delta in (0, 1), "
                       f"got {self.dp_sgd_steps} and {self.dp_sgd_delta}")


@dataclasses.dataclass(frozen=True)
class AttackConfig(_Section):
  """The attack: a preset (or a closed form, or auto) and the parts that replace its own."""

  preset: str = _field(
      "dlg", f"Attack preset: {_names(presets.PRESETS)}; or a closed form: "
      f"{_names(closed_forms.CLOSED_FORMS)}; or auto (every attack the update and "
      "the model support, the one that matches the update best kept: gradjax.auto).")
  adaptive: bool = _field(
      False, "Adapt the attack to the client's defense (--defense, after the one a capture's "
      "metadata declare): its objective models what the defense did (gradjax.adaptive).")
  iterations: int | None = _field(
      None, "Optimizer iterations" + _PRESET + "; the preset's step counts (hfginv's prior starts and "
      "layer schedule) scale with it. With --attack=dager: the token search that orders the words "
      "where the spans give only each position's words (unset: none).", attack="iterations")
  matched: str | None = _field(
      None, f"What the objective matches{_PRESET}: {_names(objectives.MATCHED)} (gradient: a FedSGD "
      "gradient; replay: a FedAvg update by replaying the local steps; dlm, dlm_plus: DLM's scaled "
      "and normalised differences).", attack="matched")
  optimizer: str | None = _field(
      None, f"Optimizer{_PRESET}: {_names(optimizers.OPTIMIZERS)}.", attack="optimizer.name")
  learning_rate: float | None = _field(None, "Learning rate" + _PRESET + ".",
                                       attack="optimizer.learning_rate")
  schedule: str | None = _field(
      None, f"Learning-rate schedule{_PRESET}: {_names(optimizers.SCHEDULES)}.",
      attack="optimizer.schedule")
  tol: float | None = _field(None, "Stop a restart once its objective is <= tol" + _PRESET + ".",
                             attack="tol")
  distance: str | None = _field(
      None, f"Gradient distance{_PRESET}: {_names(distances.DISTANCES)}.", attack="distance",
      parse=distances.get_distance)
  depth_rule: str | None = _field(
      None, f"Per-layer distance weights by depth: {_names(distances.DEPTH_RULES)}.",
      attack="depth_rule")
  priors: str | None = _field(
      None, f"Image priors name:weight[:start_step], comma separated, e.g. tv:1e-4 ('' for none; "
      f"names: {_names(priors_lib.PRIORS)}).", attack="priors", parse=parse_priors)
  label_source: str | None = _field(
      None, f"Where the labels come from: joint, known, an inference method ({_names(labels_lib.METHODS)}), "
      "hfginv (duplicate-aware counts from --config.attack.aux images) or llg_star (LLG with its impact measured "
      "on dummy images through the server's model).", attack="label_source", parse=_label_source)
  aux: int = _field(40, "--labels=hfginv: auxiliary images for HFGInv's feature profile, the "
                    "dataset's images after the attacked batch (Ye et al. use 40).")
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
  head_features: float | None = _field(
      None, "Weight of the pull of each image's head input towards the one the dense head's gradient "
      "gives for it (per example up to K - 1 examples; 0: off; needs known or inferred labels).",
      attack="head_features")
  smoothing: str | None = _field(
      None, "Round the model's ReLUs and max pools for the dummy gradient, sharper every step over "
      "the first fraction F of the iterations, then the model itself (a zoo ConvNet, ResNet, MLP or "
      "LeNet): F[,start=S][,end=E], the sharpness from S (default 2) to E (1e4).",
      attack="smoothing", parse=parse_smoothing)
  iterate: str | None = _field(
      None, "Each restart's reconstruction: 'best', its lowest-objective iterate (the default; "
      "counted once every prior is on and the objective's schedule settles), or "
      "'last', its final one, as the Inverting Gradients and DLG code return it (a diverging "
      "restart then scores where it ended).", attack="track_from", parse=parse_iterate)
  restarts: int = _field(1, "Random restarts; the lowest objective wins.")
  budget: float | None = _field(
      None,
      "--attack=auto: seconds for all its attacks. Each candidate runs once while time is left, "
      "an optimisation attack with the iterations that fit its share (timed first; the preset's at "
      "most, unless --iterations is set); the rest goes to more restarts of the one that matches the "
      "update best, under successive halving by the matching objective (unset: each candidate once)."
  )
  permutations: int = _field(
      1,
      "Permutation search: candidate label-to-mini-batch assignments run in parallel (1 = none).")
  text_search: str = _field(
      "embeddings", "Text: what is optimised: embeddings (DLG, SAPAG: free dummy embeddings and soft "
      "targets, decoded afterwards) or tokens (gradjax: a distribution over the revealed tokens per "
      "position, the targets tied to the inputs).", choices=text.SEARCHES)
  restrict_tokens: bool = _field(
      True, "Text: decode, and let soft targets range, only over the tokens the embedding gradient "
      "reveals (else the whole vocabulary).")

  def build(self, *, modality: str = "image", remat: bool | None = None
            ) -> "attacks.Attack | closed_forms.ClosedForm":
    """The preset built at ``iterations`` (its own step counts, hfginv's prior starts and layer
    schedule, scale with it), with the parts this section names replaced: the one place where the
    names of distances, priors, label sources, dummy initialisations and optimizers become objects.
    ``modality``: a text client's next-token targets are optimised jointly unless ``label_source`` says
    otherwise; ``remat`` (the execution section's): the replayed local steps checkpointed. A closed
    form (:data:`gradjax.closed_forms.CLOSED_FORMS`) optimises nothing: an option of the optimisation
    attacks set beside it is refused. ValueError for the auto attack, which
    :func:`gradjax.run.pipeline.run` builds one attack at a time."""
    return _build_attack(self, modality, remat)


@dataclasses.dataclass(frozen=True)
class ExecutionConfig(_Section):
  """How the attack's restarts run: strategy, halving, sharding, progress chunks, precision, memory."""

  strategy: str = _field(
      "auto", "Restart strategy: auto (sequential on CPU; vmap on accelerators, or map where the "
      "vmapped step does not fit the device's free memory), tune, sequential, vmap, map.")
  map_batch_size: int | None = _field(None, "Restarts vectorised together by --config.execution.strategy=map.")
  halving_rounds: int = _field(
      1, "Successive halving over restarts x candidates: rounds (1 = off).")
  halving_keep: float = _field(0.5, "Successive halving: fraction kept after each round.")
  shard: bool = _field(
      False, "Split restarts (x permutation candidates) over all devices, of every process of a "
      "run over several processes (--num_processes).")
  chunk: int = _field(100, "Iterations per jitted chunk between progress reports.")
  matmul_precision: str = _field(
      "float32", "Matmul and convolution precision of the client's update and the attack: float32, "
      "tensorfloat32, bfloat16, or default (JAX's, which lets GPUs round float32 products and "
      "ruins gradient matching there).", choices=driver.PRECISIONS)
  remat: bool | None = _field(
      None, "jax.checkpoint ResNet blocks and replayed local steps: less memory, more compute.",
      attack="remat")
  clients_per_run: int | None = _field(
      None, "Experiments attacked in one solver run when they share the model's shapes and the "
      "attack (an audit's captured updates, a sweep's or a table's images), each with its own "
      "results and verdict. Unset: an audit up to 64 where the restarts run vmapped "
      "(accelerators) and one at a time where they run in sequence (CPU); a sweep or table one at a "
      "time (set, its blocks save no solver state mid-run).")

  def build(self, callback: Callable | None = None, monitor: Callable | None = None,
            saver: driver.Saver | None = None, setup_device=None) -> driver.Execution:
    """The :class:`gradjax.driver.Execution` of the restarts (``remat`` changes the model and the
    replay, not the driver); ``setup_device``: the run's (:func:`gradjax.run.pipeline.setup_device`)."""
    knobs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("remat", "clients_per_run")}
    return driver.Execution(**knobs, callback=callback, monitor=monitor, saver=saver,
                            setup_device=setup_device)

  def __post_init__(self):
    super().__post_init__()
    self.build()  # checks the restart knobs (strategy, chunk, halving, map batch size, shard)
    if self.clients_per_run is not None and self.clients_per_run < 1:
      raise ValueError(f"--config.execution.clients_per_run must be at least 1, got "
                       f"{self.clients_per_run}")


@dataclasses.dataclass(frozen=True)
class OutputConfig(_Section):
  """How a run is scored."""

  lpips: str = _field("auto", "LPIPS network for scoring (auto: alex when the lpips extra is "
                      "installed, else none).", choices=LPIPS)


@dataclasses.dataclass(frozen=True)
class SamplingConfig(_Section):
  """Batches with repeated labels (gradjax label-recovery, batch-table;
  data.duplicate_label_batches)."""

  pool: int = _field(1000, "Batches draw their images from the first POOL images of the dataset.")
  classes_per_batch: int = _field(
      4, "Distinct classes each batch's labels are drawn from (with replacement, so classes repeat "
      "when fewer than --batch_size).")


@dataclasses.dataclass(frozen=True)
class TrainingConfig(_Section):
  """Training a model (gradjax train; gradjax.training): FedSGD steps on data.batch_size examples,
  or FedAvg rounds of the client's local training."""

  train_count: int | None = _field(
      150, "Training examples: the first N of the (permuted) dataset (text: every window but the "
      "test ones unless given).")
  test_count: int | None = _field(
      50, "Test examples: the M after the training ones, or the first M of --config.training.test_dataset (text: "
      "the last tenth of the windows unless given).")
  data_seed: int = _field(0, "Permutation of the dataset before the split; -1 keeps the file order.")
  test_dataset: str | None = _field(
      None, "Test on the first --config.training.test_count images of this dataset (default: the --config.training.test_count "
      "images after the training ones).")
  epochs: int = _field(10, "Epochs (FedSGD) or communication rounds (FedAvg).")
  lr: float = _field(0.02, "FedSGD: the learning rate of the model's SGD.")
  momentum: float = _field(0.9, "FedSGD: heavy-ball momentum (PyTorch's form).")
  weight_decay: float = _field(
      0.0, "FedSGD: weight decay λ on every parameter (PyTorch's SGD: λθ added to the step's "
      "gradient, after the defense).")
  nesterov: bool = _field(False, "FedSGD: Nesterov's momentum (PyTorch's SGD(nesterov=True)).")
  lr_milestones: str = _field(
      "", "FedSGD: comma-separated epochs after which the learning rate is multiplied by "
      "--config.training.lr_gamma (PyTorch's MultiStepLR, stepped per epoch); Inverting Gradients trains 120 "
      "epochs with 44,75,105.")
  lr_gamma: float = _field(0.1, "FedSGD: the learning rate's factor at each of --lr_milestones.")
  augment: bool = _field(
      False, "FedSGD on images: random crops of the image padded by 4 black pixels and horizontal "
      "flips, drawn afresh for every step (the usual CIFAR augmentation, Inverting Gradients' "
      "training).")
  clients: int = _field(1, "FedAvg: clients, each training on an equal shard of the training "
                        "examples.")


@dataclasses.dataclass(frozen=True)
class UtilityConfig(_Section):
  """What a defense costs (gradjax defense-sweep --utility): a small model trained by FedSGD with the
  defense on every step (gradjax.training.train_fedsgd), its test accuracy the utility."""

  model: str = _field("mlp", f"The model trained for the utility column: {_names(models.MODELS)}.")
  dataset: str = _field("mnist", "Its dataset (the source's test split, see gradjax.data).")
  train_count: int = _field(2000, "Training images: the first N of the (permuted) dataset.")
  test_count: int = _field(1000, "Test images: the M following the training images.")
  data_seed: int = _field(-1, "Permutation of the dataset before the split; -1 keeps the file order.")
  epochs: int = _field(3, "Epochs of mini-batch SGD.")
  batch_size: int = _field(32, "Mini-batch size.")
  lr: float = _field(0.1, "Learning rate.")
  momentum: float = _field(0.9, "Heavy-ball momentum (PyTorch's form).")


@dataclasses.dataclass(frozen=True)
class GateConfig(_Section):
  """The Flower client gate (:func:`gradjax.integrations.flower.leakage_mod`): which rounds it
  attacks the client's own update on, and what it withholds."""

  threshold_db: float = _field(
      10.0, "Leak score (dB above what a uniform gray image scores on the client's examples) from "
      "which the update is withheld.")
  rounds: str | None = _field(
      None, "Server rounds audited: comma-separated rounds (1,4,9; empty: none), every:K for every "
      "K-th round, or every round (unset).")
  time_budget_s: float = _field(
      120.0, "The attack's wall time per round, start-up and compilation included; an update whose "
      "attack runs past it passes, marked not audited.")
  refuse_malicious: bool = _field(
      True, "Check the model the server sends before training and refuse one built to leak "
      "(an imprint's units, tensors the declared model lacks, trap weights seen on the round's "
      "examples); an input layer that fires rarely on them for another reason (units that died in "
      "training) is logged, not refused, and the update is audited after training.")

  def __post_init__(self):
    super().__post_init__()
    _rounds(self.rounds)
    if not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
      raise ValueError(f"--config.gate.time_budget_s must be a positive number of seconds, got "
                       f"{self.time_budget_s}")

  def audits(self, server_round: int) -> bool:
    """Whether the gate audits ``server_round``."""
    return _rounds(self.rounds)(server_round)


def _rounds(spec: str | None) -> Callable[[int], bool]:
  """--config.gate.rounds read: a predicate on the server round. ValueError for a malformed spec."""
  if spec is None:
    return lambda r: True
  text = spec.strip()
  if text.startswith("every:"):
    try:
      k = int(text.removeprefix("every:"))
    except ValueError:
      k = 0
    if k < 1:
      raise ValueError(f"--config.gate.rounds={spec}: every:K takes a positive integer K")
    return lambda r: r % k == 0
  try:
    chosen = frozenset(int(r) for r in text.split(",") if r.strip())
  except ValueError:
    raise ValueError(f"--config.gate.rounds={spec}: comma-separated rounds (1,4,9) or every:K")
  return lambda r: r in chosen


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything that defines one experiment, by section (``None`` in an option = the preset's or the
  source's default). Each option carries its documentation (:func:`option`), which is also its
  command-line flag's help."""

  seed: int = _field(0, "PRNG seed of everything the program draws (model and dummy "
                     "initialisation; batches, shuffling and noise where it draws them).")
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  client: ClientConfig = dataclasses.field(default_factory=ClientConfig)
  defense: DefenseConfig = dataclasses.field(default_factory=DefenseConfig)
  attack: AttackConfig = dataclasses.field(default_factory=AttackConfig)
  execution: ExecutionConfig = dataclasses.field(default_factory=ExecutionConfig)
  output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
  sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
  training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
  utility: UtilityConfig = dataclasses.field(default_factory=UtilityConfig)
  gate: GateConfig = dataclasses.field(default_factory=GateConfig)

  def __post_init__(self):
    if self.data.modality not in MODALITIES:
      raise ValueError(
          f"unknown modality {self.data.modality!r}; choose one of {', '.join(MODALITIES)}")
    if not self.client.observation:  # a capture may declare the bound (with_declared checks then)
      self.defense.check_bound()
    if self.data.modality == "text":
      if self.model.weights or self.client.observation:
        raise ValueError("the command line attacks captured image models; a text run simulates its "
                         f"client (read a text model's capture with the library: {_TEXT_CAPTURE})")
      if self.client.name != "fedsgd" and self.attack.preset != "dager":
        raise ValueError(f"text runs simulate a FedSGD client (--client=fedsgd); a FedAvg client's "
                         f"update is read by --attack=dager, not --attack={self.attack.preset} "
                         f"(this run's client: --client={self.client.name})")
      if not self.model.checkpoint and not models.is_text(self.model.name or ""):
        raise ValueError(f"--modality=text needs a text model ({', '.join(models.TEXT_MODELS)}), "
                         f"not {self.model.name!r}")
      if self.data.dataset not in corpus.CORPORA:
        raise ValueError(f"--modality=text reads a corpus ({', '.join(corpus.CORPORA)}), not "
                         f"{self.data.dataset!r}")
      if self.attack.text_search not in text.SEARCHES:
        raise ValueError(f"unknown text search {self.attack.text_search!r}; choose one of "
                         f"{', '.join(text.SEARCHES)}")
      if self.data.sequence_length < 1:
        raise ValueError(f"sequence_length must be positive, got {self.data.sequence_length}")
      if self.data.min_length is not None:
        self._check_padding()
      if self.attack.preset == auto.AUTO:
        raise ValueError("--attack=auto chooses among image attacks; a text run names its attack "
                         "(dager, or an optimisation preset such as dlg or sapag)")
      if self.attack.label_source in SERVER_INFERRED_LABELS:
        raise ValueError(f"--labels={self.attack.label_source} infers image labels with the "
                         "server's model; a text run's targets are the next tokens, known or "
                         "optimised jointly")
      corpus.tokenizer_size(self.data.tokenizer)
      if self.model.checkpoint and self.data.tokenizer != "words":
        raise ValueError("a checkpoint's vocabulary is its training corpus's words: drop --config.data.tokenizer")
      if min(self.model.text_sizes()) < 1:
        raise ValueError(f"transformer sizes must be positive, got {self.model.text_sizes()}")
    elif models.is_text(self.model.name or ""):
      raise ValueError(f"model {self.model.name!r} reads text: add --modality=text")
    reads_text = self.data.modality == "text"
    stray = [flag(p) for p in (IMAGE_ONLY if reads_text else TEXT_ONLY)
             if get(self, p) != option(p).default]
    if stray:
      raise ValueError(f"{', '.join(stray)} {'is' if len(stray) == 1 else 'are'} for "
                       f"{'images' if reads_text else 'text (--modality=text)'}: drop "
                       f"{'it' if len(stray) == 1 else 'them'}")
    check_values(options(self))
    if bool(self.model.weights) != bool(self.client.observation):
      raise ValueError("captured files need both --weights and --observation")
    if self.model.weights and self.model.checkpoint:
      raise ValueError("--checkpoint and --weights both name the model; give one")
    if self.model.rename is not None:
      if not self.model.weights:
        raise ValueError("--config.model.rename renames the tensors of captured files: give --weights "
                         "and --observation")
      interop.parse_renames(self.model.rename)
    if self.client.observation and self.data.dataset is None and self.data.batch_size != 1:
      raise ValueError("--batch_size is a simulated client's; a capture's count is its metadata's "
                       "num_samples or --config.client.num_samples")
    if self.data.dataset is None and not self.client.observation:
      raise ValueError("a simulated client needs a --dataset")
    if self.model.name is None and not self.model.weights:
      raise ValueError("no --model given")
    if self.client.num_samples is not None and self.client.num_samples < 1:
      raise ValueError(f"num_samples must be positive, got {self.client.num_samples}")
    if self.data.batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {self.data.batch_size}")
    if self.data.index < 0:
      raise ValueError(f"index must be non-negative, got {self.data.index}")
    if self.data.channels not in (None, 1, 3):
      raise ValueError(f"channels must be 1, 3 or None, got {self.data.channels!r}")
    if self.client.name not in CLIENTS:
      raise ValueError(f"unknown client {self.client.name!r}; choose one of {', '.join(CLIENTS)}")
    if self.output.lpips not in LPIPS:
      raise ValueError(
          f"unknown LPIPS network {self.output.lpips!r}; choose one of {', '.join(LPIPS)}")
    if self.output.lpips in lpips.NETWORKS and not lpips.available(self.output.lpips):
      raise ValueError(f"--lpips={self.output.lpips} needs the lpips extra: {lpips.INSTALL}")
    if self.model.conv not in models.CONVS:
      raise ValueError(f"unknown convolution implementation {self.model.conv!r}; choose one of "
                       f"{', '.join(models.CONVS)}")
    if self.client.shared_labels not in SHARED_LABELS:
      raise ValueError(f"unknown label sharing {self.client.shared_labels!r}; choose one of "
                       f"{', '.join(SHARED_LABELS)}")
    if self.attack.budget is not None and not (self.attack.budget > 0 and
                                               self.attack.preset == auto.AUTO):
      raise ValueError(f"--budget is the time of --attack=auto's attacks, a positive number of seconds; "
                       f"got {self.attack.budget} with --attack={self.attack.preset}")

  def _check_padding(self) -> None:
    """A padded batch (``data.min_length``): what reads it (:func:`gradjax.dager.recover`'s
    ``padded``)."""
    shortest, length = self.data.min_length, self.data.sequence_length
    if not 1 <= shortest <= length:
      raise ValueError(f"--config.data.min_length must lie in [1, sequence_length = {length}], got "
                       f"{shortest}")
    if self.attack.preset != "dager":
      raise ValueError("a padded batch (--config.data.min_length) is read by --attack=dager; the "
                       f"optimisation attacks' dummies hold sequence_length tokens each, not "
                       f"--attack={self.attack.preset}")
    if self.attack.iterations is not None:
      raise ValueError("the token search that takes over from the span attack (--iterations) orders "
                       "sentences of sequence_length tokens: drop --iterations or "
                       "--config.data.min_length")
    if models.is_masked_lm(self.model.name or ""):
      raise ValueError(f"--model={self.model.name} attends to every position and takes no padding "
                       "mask: a padded batch needs a causal model (gpt, transformer)")
    if not self.model.checkpoint and self.model.text_layers < 2:
      raise ValueError("a padded batch is read by extension, which checks each prefix against the "
                       "second block: --config.model.text_layers must be at least 2")



def _matched(preset: objectives.Matched, name: str, gamma: objectives.Gamma | None,
             remat: bool | None) -> objectives.Matched:
  """What the objective matches: the part ``name`` (the preset's own, with its settings, when it is
  the preset's), with DLM's ``gamma`` and the replay's ``remat`` where set (``remat`` also
  checkpoints the model, so it is not refused elsewhere)."""
  matched = preset if name == preset.name else objectives.matched(name)
  if gamma is not None:
    if not isinstance(matched, objectives.ScaledDifference):
      raise ValueError(f"--config.attack.gamma sets DLM's scale: it applies with --config.attack.matched=dlm only, not {name!r}")
    matched = dataclasses.replace(matched, gamma=gamma)
  if remat is not None and isinstance(matched, objectives.Replay):
    matched = dataclasses.replace(matched, remat=remat)
  return matched


def _build_attack(section: AttackConfig, modality: str, remat: bool | None):
  """:meth:`AttackConfig.build`."""
  if section.preset == auto.AUTO:
    raise ValueError(
        "--attack=auto runs several attacks, built one at a time by gradjax.run.pipeline")
  fields = [
      (f, getattr(section, f.name)) for f in dataclasses.fields(section) if f.metadata["attack"]
  ]
  fields.append((_OPTIONS["execution.remat"], remat))
  if section.preset in closed_forms.CLOSED_FORMS:
    # The span attack's token search, where it takes over, runs for attack.iterations.
    takes_over = section.preset == "dager" and section.iterations is not None
    given = [flag(_PATH_OF[id(f)]) for f, value in fields
             if value is not None and not (takes_over and f.name == "iterations")]
    if given:
      raise ValueError(f"--attack={section.preset} is a closed form: it optimises nothing, so "
                       f"{', '.join(given)} do not apply")
    if takes_over:
      return closed_forms.Dager(take_over=section.iterations)
    return closed_forms.CLOSED_FORMS[section.preset]()
  overrides, optimizer = {}, {}
  for f, value in fields:
    parse, target = f.metadata["parse"], f.metadata["attack"]
    if target != "iterations" and value is not None:
      value = parse(value) if parse else value
      if target.startswith("optimizer."):
        optimizer[target.removeprefix("optimizer.")] = value
      else:
        overrides[target] = value
  if section.preset not in presets.PRESETS:  # every name --attack takes, not only the presets
    raise ValueError(f"unknown attack {section.preset!r}; choose one of "
                     f"{', '.join((*presets.PRESETS, *closed_forms.CLOSED_FORMS, auto.AUTO))}")
  preset = presets.get_preset(section.preset)
  attack = preset() if section.iterations is None else preset(iterations=section.iterations)
  if (modality == "text" and "label_source" not in overrides
      and attack.label_source not in (labels_lib.joint, labels_lib.known)):
    # A preset's label inference (SAPAG's iDLG) reads a classifier's head; a language model's
    # next-token targets are optimised jointly, as DLG and SAPAG do for text.
    overrides["label_source"] = labels_lib.joint
  if optimizer:
    overrides["optimizer"] = dataclasses.replace(attack.optimizer, **optimizer)
  if {"matched", "gamma", "remat"} & set(overrides):
    overrides["matched"] = _matched(attack.matched, overrides.pop("matched", attack.matched.name),
                                    overrides.pop("gamma", None), overrides.pop("remat", None))
  if "smoothing" in overrides:  # a fraction of the budget, now known
    overrides["smoothing"] = overrides["smoothing"](attack.iterations)
  if "track_from" in overrides:  # the budget, now known
    overrides["track_from"] = overrides["track_from"](attack.iterations)
  return dataclasses.replace(attack, **overrides)


def get_attack(cfg: Config) -> "attacks.Attack | closed_forms.ClosedForm":
  """``cfg``'s attack: :meth:`AttackConfig.build` for its modality and its execution's ``remat``."""
  return cfg.attack.build(modality=cfg.data.modality, remat=cfg.execution.remat)


# The schema's options: dotted path -> its field, in the order of the sections.
SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config) if f.name != "seed"}
_SECTION_KINDS.update(SECTIONS)
# The sections of an attack's configuration (``sampling`` is the batch tables', ``training`` gradjax
# train's, ``utility`` gradjax defense-sweep's, ``gate`` the Flower client gate's).
ATTACK_SECTIONS = tuple(s for s in SECTIONS
                        if s not in ("sampling", "training", "utility", "gate"))
_OPTIONS: dict[str, dataclasses.Field] = {"seed": next(f for f in dataclasses.fields(Config)
                                                       if f.name == "seed")}
for _section, _kind in SECTIONS.items():
  for _f in dataclasses.fields(_kind):
    _OPTIONS[f"{_section}.{_f.name}"] = _f
_PATH_OF = {id(f): path for path, f in _OPTIONS.items()}
del _section, _kind, _f


def paths() -> tuple[str, ...]:
  """Every option's dotted path (``"seed"``, ``"data.modality"``, ...), in the schema's order."""
  return tuple(_OPTIONS)


def option(path: str) -> dataclasses.Field:
  """The field of option ``path``: its default, and in ``metadata`` its help and choices."""
  if path not in _OPTIONS:
    raise ValueError(f"unknown configuration option {path!r}; options are dotted paths such as "
                     "data.index")
  return _OPTIONS[path]


# The short flags: the options users set most, each a name for its dotted path. Every option, these
# too, is also set by --config.<path> (``--config.client.local_lr=0.1``).
ALIASES = {
    "seed": "seed",
    "modality": "data.modality", "dataset": "data.dataset", "data_dir": "data.data_dir",
    "index": "data.index", "batch_size": "data.batch_size", "image_size": "data.image_size",
    "normalization": "data.normalization",
    "model": "model.name", "checkpoint": "model.checkpoint", "weights": "model.weights",
    "client": "client.name", "observation": "client.observation",
    "defense": "defense.spec",
    "attack": "attack.preset", "iterations": "attack.iterations", "restarts": "attack.restarts",
    "budget": "attack.budget", "labels": "attack.label_source", "priors": "attack.priors",
    "lpips": "output.lpips",
    "epochs": "training.epochs",
}
_ALIAS_OF = {path: name for name, path in ALIASES.items()}


def alias(path: str) -> str | None:
  """The short flag of option ``path`` (:data:`ALIASES`: ``"iterations"`` for
  ``attack.iterations``, ``"attack"`` for ``attack.preset``), or None for an option set only as
  ``--config.<path>``."""
  option(path)
  return _ALIAS_OF.get(path)


def flag(path: str) -> str:
  """How a user sets option ``path`` on the command line: ``--<alias>`` or ``--config.<path>``."""
  return f"--{alias(path)}" if alias(path) else f"--config.{path}"


def section(path: str) -> str:
  """The section of option ``path`` (``""`` for the top-level ``seed``)."""
  option(path)
  return path.rpartition(".")[0]


def option_type(path: str) -> type:
  """int, float, bool or str: option ``path``'s type without ``| None``."""
  field = option(path)
  kinds = [t for t in typing.get_args(field.type) or (field.type,) if t is not type(None)]
  if len(kinds) != 1 or kinds[0] not in (int, float, bool, str):
    raise TypeError(f"option {path} has type {field.type}, which no flag takes")
  return kinds[0]


# The options only one modality reads (the other's runs refuse them when set).
TEXT_ONLY = ("data.sequence_length", "data.min_length", "data.tokenizer", "data.vocab_size",
             "model.text_dim", "model.text_ffn", "model.text_heads", "model.text_layers",
             "attack.text_search")
IMAGE_ONLY = ("data.image_size", "data.channels", "data.normalization", "attack.box", "model.conv",
              "client.train_mode")

# Options only the programs that attack several experiments at once read (an audit's captures, a
# sweep's or a table's experiments); a single run's program does not.
BATCHED = ("execution.clients_per_run",)
# What attacking captured files leaves to the files (an audit, --weights/--observation): the model
# from their metadata, and no ground truth to score against unless a dataset is given.
CAPTURED = {"model.name": None, "data.dataset": None}


def names(sections: tuple[str, ...] = ATTACK_SECTIONS,
          omit: tuple[str, ...] = ()) -> tuple[str, ...]:
  """The options (dotted paths) in ``sections`` (and ``seed``) but ``omit``: what a program reads."""
  return tuple(p for p in _OPTIONS if section(p) in ("", *sections) and p not in omit)


def get(cfg: Config, path: str) -> Any:
  """The value of option ``path`` in ``cfg``."""
  option(path)
  node = cfg
  for key in path.split("."):
    node = getattr(node, key)
  return node


def options(cfg: Config, paths: tuple[str, ...] | None = None) -> dict[str, Any]:
  """Dotted path -> value of ``cfg``'s options (all, or ``paths``)."""
  return {p: get(cfg, p) for p in (_OPTIONS if paths is None else paths)}


def replace(cfg: Config, values: dict[str, Any]) -> Config:
  """``cfg`` with options set (dotted path -> value): a sweep item, a table's row. ValueError for a
  path the schema lacks or a value its checks refuse."""
  values = _plain(values)  # "five" iterations, True for a count: refused here, not in a run
  top = {"seed": values.get("seed", cfg.seed)}
  for name in SECTIONS:
    mine = {p.partition(".")[2]: v for p, v in values.items() if section(p) == name}
    top[name] = dataclasses.replace(getattr(cfg, name), **mine) if mine else getattr(cfg, name)
  return Config(**top)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
  """``values`` checked for their options' types (:func:`check_type`), NumPy's numbers as Python's
  (a configuration is written as JSON and as a Python file)."""
  for path, value in values.items():
    check_type(path, value)
  return {p: v.item() if isinstance(v, np.generic) else v for p, v in values.items()}


def check_values(values: dict[str, Any]) -> None:
  """The checks of single options (dotted path -> value, those of ``values``' sections): finite
  numbers in a 32-bit integer's range, rates and counts positive, a known normalisation, images of
  at least 3 pixels; :class:`Config` runs them on every option, :func:`sections` on its sections'.
  ValueError naming the option."""
  for path, value in values.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f"{flag(path)} must be a finite number, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**31 <= value < 2**31:
      raise ValueError(f"{flag(path)} must lie in a 32-bit integer's range, got {value}")
  for path in ("attack.learning_rate", "client.local_lr", "training.lr", "utility.lr"):
    if values.get(path) is not None and values[path] <= 0:
      raise ValueError(f"{flag(path)} must be positive, got {values[path]}")
  for path in ("training.epochs", "training.clients", "sampling.pool",
               "sampling.classes_per_batch", "attack.restarts", "attack.permutations"):
    if path in values and values[path] < 1:
      raise ValueError(f"{flag(path)} must be positive, got {values[path]}")
  for path in ("training.train_count", "utility.train_count"):
    if values.get(path) is not None and values[path] < 1:
      raise ValueError(f"{flag(path)} must be positive, got {values[path]}")
  for path in ("training.test_count", "utility.test_count"):
    if values.get(path) is not None and values[path] < 0:
      raise ValueError(f"{flag(path)} must be non-negative, got {values[path]}")
  if values.get("model.num_classes") is not None and values["model.num_classes"] < 2:
    raise ValueError(f"--config.model.num_classes must be at least 2, got {values['model.num_classes']}")
  if "client.local_momentum" in values and not 0 <= values["client.local_momentum"] < 1:
    raise ValueError(f"--config.client.local_momentum must lie in [0, 1), got "
                     f"{values['client.local_momentum']}")
  if values.get("data.normalization") is not None:
    data.normalization(values["data.normalization"])
  if values.get("data.image_size") is not None and values["data.image_size"] < 3:
    raise ValueError(f"image_size must be at least 3 (SSIM compares windows of 3x3 pixels), got "
                     f"{values['data.image_size']}")


def sections(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
  """Section name -> that section built from its defaults with ``values`` (dotted path -> value)
  set, for a program that reads a few sections, not a whole experiment (the Flower gate): each
  section checks its own options, and :func:`check_values` each option of them; the checks across
  sections of :class:`Config` do not apply. ValueError for a path outside ``names``' sections or a
  value of another type than its option's."""
  for path in values:
    if section(path) not in names:
      raise ValueError(f"{path} is not an option here, which reads the {', '.join(names)} sections")
  values = _plain(values)  # "ten" for a number would pass the sections' own checks unseen
  built = {name: SECTIONS[name](**{p.partition(".")[2]: v for p, v in values.items()
                                   if section(p) == name}) for name in names}
  check_values({f"{name}.{f.name}": getattr(built[name], f.name) for name in names
                for f in dataclasses.fields(built[name])})
  return built


def unread_by_client(client: str, given: set[str]) -> list[str]:
  """The options of ``given`` (dotted paths) that training with ``client`` does not read (sorted):
  FedAvg's local steps under FedSGD, FedSGD's optimiser under FedAvg."""
  unread = ({"data.batch_size", "training.lr", "training.momentum", "training.weight_decay",
             "training.nesterov", "training.lr_milestones", "training.lr_gamma", "training.augment"}
            if client == "fedavg" else
            {"client.local_epochs", "client.local_batch_size", "client.local_lr",
             "client.local_momentum", "client.shared_labels"})
  return sorted(unread & given)


# What a text experiment reads where its options leave them out (the schema's defaults are an image
# experiment's): SAPAG's transformer on Python's documentation, the training split its corpus's own.
TEXT_DEFAULTS = {"model.name": "transformer", "data.dataset": "pydoc", "training.train_count": None,
                 "training.test_count": None}


def from_options(values: dict[str, Any]) -> Config:
  """The :class:`Config` of the defaults with ``values`` (dotted path -> value) set; with
  ``data.modality`` text, :data:`TEXT_DEFAULTS` where ``values`` leave them out."""
  if values.get("data.modality") == "text":
    values = {**TEXT_DEFAULTS, **values}
  return replace(Config(), values)


def record(cfg: Config, paths: tuple[str, ...] | None = None) -> dict[str, Any]:
  """``cfg``'s options (all, or ``paths``) as nested plain dicts, the configuration a run's results
  record (:func:`recorded` reads it back)."""
  out: dict[str, Any] = {}
  for path, value in options(cfg, paths).items():
    *sections, key = path.split(".")
    node = out
    for name in sections:
      node = node.setdefault(name, {})
    node[key] = value
  return out


# What a results file recorded before the schema was nested (one flat record): its key -> the path.
# (The utility section came later: its keys are not these.)
_FLAT_RECORD = {**{p.rpartition(".")[2]: p for p in _OPTIONS
                   if section(p) != "utility" and p.rpartition(".")[2] not in ("name", "spec", "preset", "lr")},
                "model": "model.name", "client": "client.name", "defense": "defense.spec",
                "attack": "attack.preset", "train_lr": "training.lr", "objective": "attack.matched",
                "labels": "attack.label_source", "layer_weights": "attack.depth_rule"}


# Options renamed since a run wrote its configuration, results or state: the old path -> the new one.
# Configuration files (a run folder's config.py), results and saved states written under the old
# names are read under the new ones.
RENAMED = {"attack.labels": "attack.label_source", "attack.layer_weights": "attack.depth_rule",
           "attack.objective": "attack.matched"}


def recorded(values: dict[str, Any]) -> dict[str, Any]:
  """Dotted path -> value of a configuration a run's results recorded: :func:`record`'s nested
  form, dotted paths (:func:`fingerprint`), or the flat record of results written before the schema
  was nested (their keys the options' short names). Keys the schema no longer has are left out."""
  if any(isinstance(v, dict) for v in values.values()):
    out = {}

    def walk(node, prefix):
      for key, value in node.items():
        path = RENAMED.get(f"{prefix}{key}", f"{prefix}{key}")
        if isinstance(value, dict):
          walk(value, f"{prefix}{key}.")
        elif path in _OPTIONS:
          out[path] = value

    walk(values, "")
    return out
  out = {}
  for key, value in values.items():
    path = RENAMED.get(key, key)
    path = path if path in _OPTIONS else _FLAT_RECORD.get(key)
    if path is not None:
      out[path] = value
  return out


# Options that change how a run is scored, where its data lie or how its restarts are scheduled, not
# what it computes: a saved item or state continues under other values of these. (A state saved
# mid-run holds its resolved strategy and continues only under the same one: auto resolves to vmap on
# an accelerator and to sequential on a CPU, so a run begun on one resumes on the other with
# --config.execution.strategy=vmap.)
NOT_FINGERPRINTED = ("output.lpips", "data.data_dir", "client.force", "execution.strategy",
                     "execution.map_batch_size", "execution.clients_per_run")


def fingerprint(cfg: Config) -> dict:
  """What determines ``cfg``'s reconstruction (its attack sections' options but
  ``NOT_FINGERPRINTED``; dotted path -> value), for state files; :func:`canonical`."""
  return canonical({p: v for p, v in options(cfg, names()).items() if p not in NOT_FINGERPRINTED})


def canonical(fp: dict) -> dict:
  """``fp`` (a :func:`fingerprint`, or one saved by an earlier run) with an option that changes
  nothing recorded as unset: ``attack.iterations`` given as its preset's own count (the preset built
  at it is the preset; not for ``auto``, whose budget keeps a count given and times one left unset).
  So a run saved without ``--iterations`` continues with the preset's count spelt out, and the other
  way round."""
  n, name = fp.get("attack.iterations"), fp.get("attack.preset")
  if n is None or name not in presets.PRESETS or n != presets.get_preset(name)().iterations:
    return fp
  return {**fp, "attack.iterations": None}


def _input_file(path: str | None, flag: str) -> None:
  if path is None:
    return
  if os.path.isdir(path):
    raise ValueError(f"--{flag} {path} is a directory, not a file")
  if not os.path.exists(path):
    if os.path.islink(path):  # a link to nothing, or to itself
      raise FileNotFoundError(f"--{flag} {path} is a link that leads to no file")
    raise FileNotFoundError(f"--{flag} {path} does not exist")
  if not os.path.isfile(path):  # a FIFO or a device would block or never end
    raise ValueError(f"--{flag} {path} is not a regular file")
  if not os.access(path, os.R_OK):
    raise ValueError(f"--{flag} {path} is not readable")


# How a captured text model's update is attacked: by the library (README, "Text").
_TEXT_CAPTURE = "gradjax.interop.load, then gradjax.dager.recover on its model and gradient"


def labels_shared(cfg: Config, attack) -> bool:
  """Whether the threat model hands the client's labels to ``attack`` (:func:`check`'s): an
  optimisation attack that takes known labels the server does not infer itself
  (:data:`SERVER_INFERRED_LABELS`); a closed form infers its own."""
  return (isinstance(attack, attacks.Attack) and attack.label_source is labels_lib.known
          and cfg.attack.label_source not in SERVER_INFERRED_LABELS)


def check(cfg: Config, files: bool = True) -> attacks.Attack:
  """Validates what ``cfg`` names without loading data or compiling anything: the attack and its
  overrides, the defense, the model name, the dataset name and (``files``) the input files. Returns
  the attack (``None`` for auto, whose attacks :func:`gradjax.run.pipeline.run` builds one by one).
  (Field values were checked when ``cfg`` was built.)"""
  attack = None if cfg.attack.preset == auto.AUTO else get_attack(cfg)
  if (isinstance(attack, attacks.Attack) and cfg.attack.permutations > 1
      and attack.label_source is labels_lib.joint):  # the flags alone show it: refused before any run
    raise ValueError("--config.attack.permutations: a permutation search orders known or inferred "
                     f"labels; --attack={cfg.attack.preset} optimises them jointly (set --labels, e.g. "
                     "--labels=known with a client that shares them)")
  if (isinstance(attack, attacks.Attack) and isinstance(attack.matched, objectives.Replay)
      and cfg.client.name == "fedsgd" and not cfg.client.observation):
    raise ValueError(f"--attack={cfg.attack.preset} replays the client's local training (objective "
                     "'replay'), which a FedSGD client does not do: attack a FedAvg client "
                     "(--client=fedavg), or match its gradient (--config.attack.matched=gradient)")
  if (cfg.attack.permutations > 1 and labels_shared(cfg, attack) and cfg.client.name == "fedavg"
      and cfg.client.shared_labels == "ordered" and not cfg.client.observation):
    raise ValueError("--config.attack.permutations searches which step each label was in; the "
                     "client shares its labels in order (--config.client.shared_labels=ordered), "
                     "which says it: set shared_labels=multiset, or drop the search")
  if cfg.attack.preset in closed_forms.CLOSED_FORMS:
    if cfg.attack.adaptive:
      raise ValueError(
          f"--config.attack.adaptive=True adapts an optimisation attack's objective; --attack={cfg.attack.preset} "
          "is a closed form")
    modality = "text" if cfg.attack.preset in closed_forms.TEXT_CLOSED_FORMS else "image"
    searches = getattr(attack, "take_over", 0) > 0  # the span attack's token search has restarts
    wrong = ([f"--modality={modality}"] if cfg.data.modality != modality else []) + (
        ["--restarts=1" + (" (or --iterations for its token search)" if modality == "text" else "")]
        if cfg.attack.restarts != 1 and not searches else []) + (
        ["--config.attack.permutations=1"] if cfg.attack.permutations != 1 else [])
    if wrong:
      raise ValueError(
          f"--attack={cfg.attack.preset} recovers {'sentences' if modality == 'text' else 'images'}"
          f" in one pass: it needs {' and '.join(wrong)}")
  if cfg.data.modality == "text" and isinstance(attack, attacks.Attack) and attack.priors:
    # Every prior (gradjax.priors) reads an image batch (N, H, W, C); text optimises embeddings.
    if cfg.attack.priors:
      raise ValueError(f"--priors={cfg.attack.priors}: image priors, which do not apply to text "
                       "(leave --priors out)")
    raise ValueError(f"--attack={cfg.attack.preset} has image priors, which do not apply to text: "
                     "give --priors= with --modality=text")
  if (cfg.data.modality == "text" and models.is_masked_lm(cfg.model.name or "")
      and cfg.client.name != "fedsgd"):
    raise ValueError(f"a masked language model's ({cfg.model.name}) update is read as a FedSGD "
                     "gradient (FedAvg replay and the span attack's local steps train on "
                     "next-token targets)")
  if cfg.client.share_statistics and (not cfg.client.train_mode or cfg.client.observation or
                                      cfg.data.modality != "image"):
    raise ValueError("--config.client.share_statistics=True simulates a client that returns the BatchNorm statistics its "
                     "training-mode step updated: it needs --config.client.train_mode=True and a simulated image client")
  if cfg.client.share_statistics and not (isinstance(attack, attacks.Attack)
                                   and any("batch_stats" in p.needs for p in attack.priors)):
    raise ValueError(
        "--config.client.share_statistics=True gives the batch's BatchNorm moments to the bn prior, which "
        f"this attack ({cfg.attack.preset}) does not use: add it, e.g. --priors=tv:1e-2,bn:1e-4")
  cfg.defense.build()
  if cfg.defense.dp_sgd() is not None:
    if cfg.data.modality == "text" and cfg.attack.adaptive:
      raise ValueError("--config.attack.adaptive=True models DP-SGD's clipping in an image "
                       "attack; a text attack matches the update as it is (leave it out)")
    if cfg.defense.dp_sgd_poisson and cfg.data.modality != "image":
      raise ValueError("--config.defense.dp_sgd_poisson models an image client's Poisson-sampled "
                       "steps; a text client's are not attacked here")
    if cfg.defense.dp_sgd_expected_batch_size is not None and not cfg.client.observation:
      raise ValueError("--config.defense.dp_sgd_expected_batch_size is a captured client's divisor; "
                       "a simulated client divides by q·n (leave it out)")
    spec = models.family(cfg.model.name or "")
    if cfg.client.train_mode and (spec is None or spec.batch_norm):  # unknown: a checkpoint's
      raise ValueError("--config.defense.dp_sgd_max_norm clips each example's gradient: a client in "
                       "training mode (--config.client.train_mode=True, BatchNorm's batch statistics) "
                       "mixes the examples, so they have none of their own (Opacus refuses it too)")
  if cfg.attack.adaptive and not (cfg.defense.spec or cfg.client.observation or cfg.defense.dp_sgd()):
    raise ValueError("--config.attack.adaptive=True adapts the attack to the client's defense: give --defense, "
                     "--config.defense.dp_sgd_max_norm (or a capture whose metadata declare its 'defense')")
  if cfg.model.name is not None and not cfg.model.checkpoint:
    models.get_module(
        cfg.model.name,
        num_classes=cfg.model.num_classes or 10,
        init=cfg.model.init,
        act=cfg.model.act,
        conv=cfg.model.conv,
        text_sizes=cfg.model.text_sizes())
  if (cfg.data.modality == "image" and cfg.data.dataset is not None and
      not cfg.data.dataset.startswith("tfds:") and
      cfg.data.dataset not in data.DATASETS):  # a text corpus was checked with the configuration
    raise ValueError(
        f"unknown dataset {cfg.data.dataset!r}; expected one of {', '.join(data.DATASETS)} "
        "or tfds:<name>")
  if files:
    check_input_files(cfg)
    captured = attacked_model(cfg) if cfg.client.observation else None
    if captured and models.is_text(captured):
      raise ValueError(f"{cfg.client.observation} holds the update of a text model ({captured}): the "
                       "command line attacks captured image models; read a text model's capture "
                       f"with the library ({_TEXT_CAPTURE})")
  return attack


def check_input_files(cfg: Config) -> None:
  """FileNotFoundError or ValueError (one line) unless every file ``cfg`` names (a checkpoint,
  captured weights and observation) exists as a readable file."""
  for path in ("model.checkpoint", "model.weights", "client.observation"):
    _input_file(get(cfg, path), flag(path).removeprefix("--"))


def with_declared(cfg: Config) -> Config:
  """``cfg`` with the DP-SGD its capture declares (:func:`gradjax.interop.declared_dp_sgd`: the
  captured files' metadata ``dp_sgd_*``, the options ``defense.dp_sgd_*``); ``cfg`` itself without a
  capture or a declaration. ValueError (one line) where a declared value is out of range or an
  option set away from its default says otherwise: the client knows what it ran, and a run must not
  attack under two accounts of it. Each experiment applies it to its own capture
  (:func:`gradjax.run.pipeline.run`); a saved run's configuration holds the result. Reads file
  metadata only."""
  if not cfg.client.observation:
    return cfg
  meta = {**(interop.read_metadata(cfg.model.weights) if cfg.model.weights else {}),
          **interop.read_metadata(cfg.client.observation)}
  declared = interop.declared_dp_sgd(meta, cfg.client.observation)
  if not declared:
    cfg.defense.check_bound(cfg.client.observation)
    return cfg
  given = cfg.defense
  for k, v in declared.items():  # an option set (away from its default) must agree
    mine = getattr(given, k)
    if mine != option(f"defense.{k}").default and mine != v:
      raise ValueError(f"{cfg.client.observation} declares {k}={v!r}, but "
                       f"--config.defense.{k}={mine!r}: leave the option out (the client's own "
                       "account is read)")
  try:
    merged = dataclasses.replace(cfg, defense=dataclasses.replace(given, **declared))
    merged.defense.check_bound(cfg.client.observation)
  except ValueError as e:
    raise ValueError(f"{cfg.client.observation} declares DP-SGD the options refuse: {e}") from None
  return merged


def attacked_model(cfg: Config) -> str:
  """The name of the model ``cfg`` attacks: ``--model``, or the checkpoint's or the capture's
  model when there is one ("captured" when a capture names none). Reads file metadata only."""
  model = cfg.model.name
  if cfg.model.checkpoint:
    model = checkpoint.read_metadata(cfg.model.checkpoint).get("model", model)
  if cfg.client.observation and cfg.model.name is None:
    model = interop.read(cfg.model.weights).metadata.get("model") or "captured"
  return model


def run_name(cfg: Config) -> str:
  """``<attack>_<model>_<source>``: the run's default folder name, from what is attacked
  (:func:`attacked_model`). Reads file metadata only."""
  model = attacked_model(cfg)
  if cfg.client.observation:
    source = os.path.splitext(os.path.basename(cfg.client.observation))[0]
  else:
    # Ranges as a..b: "-k" is the suffix of a taken folder (experiments/common.output_folder).
    source = f"{cfg.data.dataset.replace(':', '-')}_{cfg.data.index}" + (
        f"..{cfg.data.index + cfg.data.batch_size - 1}" if cfg.data.batch_size > 1 else "")
  return f"{cfg.attack.preset}_{model}_{source}".replace(os.sep, "-")


def defaults() -> config_dict.ConfigDict:
  """The nested configuration with every option at its default; a config file starts from it.
  Options that default to ``None`` are typed placeholders, so ``--config.<path>=...`` can set them."""
  return to_dict(Config())


def overridden(options: dict[str, Any]) -> config_dict.ConfigDict:
  """:func:`defaults` with ``options`` (dotted path -> value) set: a study's recipe
  (``experiments/studies/*/config.py``) is its options over the defaults. ValueError for a path the
  schema lacks."""
  c = defaults()
  for path, value in options.items():
    option(path)
    *sections, key = path.split(".")
    node = c
    for name in sections:
      node = node[name]
    node[key] = value
  return c


def recipes(base: dict[str, Any], variants: dict[str, tuple]) -> tuple[Callable, Callable]:
  """``get_config(variant)`` and ``get_sweep(variant)`` of a study's ``config.py``, whose
  ``variants`` map a name to (the command and its arguments, the images of a sweep or None, options
  over ``base``); ``base`` holds the options every variant sets over :func:`defaults`."""

  def check(variant):
    if variant not in variants:
      raise ValueError(f"variant {variant!r}; choose one of {', '.join(variants)}")
    return variants[variant]

  def get_config(variant):
    return overridden({**base, **check(variant)[2]})

  def get_sweep(variant):
    images = check(variant)[1]
    return None if images is None else sweep("data.index", images)

  return get_config, get_sweep


def to_dict(cfg: Config) -> config_dict.ConfigDict:
  """``cfg`` as the nested ``ConfigDict`` a configuration file returns (``None`` options as typed
  placeholders)."""
  tree: dict[str, Any] = {}
  for path, value in options(cfg).items():
    if value is None:
      value = config_dict.placeholder(option_type(path))
    *sections, key = path.split(".")
    node = tree
    for name in sections:
      node = node.setdefault(name, {})
    node[key] = value
  return config_dict.ConfigDict(tree)


def from_dict(tree) -> Config:
  """The :class:`Config` of a nested configuration (a ``ConfigDict`` or plain dicts); options it
  leaves out keep their defaults. Raises ValueError naming an option the schema does not have."""
  return from_options(given(tree))


def given(tree) -> dict[str, Any]:
  """Dotted path -> value of every option ``tree`` holds (ValueError for one the schema lacks or a
  value of another type, :func:`check_type`); an option under its old name (:data:`RENAMED`) is
  read under its new one."""
  plain = tree.to_dict() if isinstance(tree, config_dict.ConfigDict) else dict(tree)
  out, unknown = {}, []

  def walk(node, prefix):
    for key, value in node.items():
      path = RENAMED.get(f"{prefix}{key}", f"{prefix}{key}")
      if isinstance(value, dict):
        walk(value, path + ".")
      elif path in _OPTIONS:
        check_type(path, value)
        out[path] = value
      else:
        unknown.append(path)

  walk(plain, "")
  if unknown:
    raise ValueError(f"unknown configuration option{'s' if len(unknown) > 1 else ''} "
                     f"{', '.join(sorted(unknown))}; the sections are {', '.join(SECTIONS)} "
                     "(and seed)")
  return out


def sweep(path: str, values) -> list[dict[str, Any]]:
  """One option's values as sweep items: ``sweep("data.index", range(3))`` ->
  ``[{"data.index": 0}, {"data.index": 1}, {"data.index": 2}]``. ``path``: a dotted path of the
  schema (:func:`paths`)."""
  if path not in _OPTIONS:
    raise ValueError(f"unknown option {path!r} in a sweep")
  return [{path: value} for value in values]


def product(*sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Every combination of the sweeps' items, the last varying fastest:
  ``product(sweep("data.index", [0, 1]), sweep("attack.restarts", [1, 4]))`` has 4 items."""
  out = [{}]
  for items in sweeps:
    out = [{**a, **b} for a in out for b in items]
  return out


def with_options(cfg: Config, item: dict[str, Any]) -> Config:
  """``cfg`` with a sweep item's options (dotted paths) set; ValueError for a path the schema lacks
  or a value its checks refuse."""
  unknown = sorted(set(item) - set(_OPTIONS))
  if unknown:
    raise ValueError(f"unknown option {unknown[0]!r} in a sweep item; options are dotted paths such "
                     "as data.index")
  if not item:
    raise ValueError("an empty sweep item (each item sets at least one option)")
  return replace(cfg, item)


def check_type(path: str, value: Any) -> None:
  """ValueError unless ``value`` has option ``path``'s type (an integer, NumPy's too, for an int, not
  a bool or a float; any real number for a float; None where the option may be unset)."""
  field = option(path)
  kinds = typing.get_args(field.type) or (field.type,)
  if value is None and type(None) in kinds:
    return
  if isinstance(value, (bool, np.bool_)):
    ok = bool in kinds
  elif isinstance(value, numbers.Integral):
    ok = int in kinds or float in kinds
  elif isinstance(value, numbers.Real):
    ok = float in kinds
  else:
    ok = str in kinds and isinstance(value, str)
  if not ok:
    names = " or ".join("None" if k is type(None) else getattr(k, "__name__", str(k)) for k in kinds)
    raise ValueError(f"{path} takes {names}, got {value!r}")


def to_python(cfg: "Config | dict[str, Any]", *, comment: str = "",
              fields: tuple[str, ...] | None = None, sweep: list[dict[str, Any]] | None = None) -> str:
  """A configuration file that sets every option of ``cfg`` (a :class:`Config`, or dotted path ->
  value; or only the options ``fields``; defaults too, so it reproduces the run whatever later
  defaults become): ``--config=<file>``. ``comment``: lines put first, as comments. ``sweep``: its
  items, as the file's ``get_sweep()`` (``gradjax sweep`` runs one experiment per item)."""
  lines = [f"# {line}" for line in comment.splitlines()]
  lines += ['"""A gradjax configuration (gradjax.run.config)."""', "", "from gradjax.run import config", "", "",
            "def get_config():", "  c = config.defaults()"]
  values = options(cfg) if isinstance(cfg, Config) else dict(cfg)
  for path in _OPTIONS:
    if (fields is None or path in fields) and path in values:
      lines.append(f"  c.{path} = {values[path]!r}")
  lines += ["  return c", ""]
  if sweep is not None:
    lines += ["", "def get_sweep():"] + _sweep_source(sweep)
  return "\n".join(lines)


def _sweep_source(sweep: list[dict[str, Any]]) -> list[str]:
  """``get_sweep()``'s body: ``config.sweep(path, range(...))`` when the items step one integer
  option evenly (an image sweep), else the items one per line."""
  keys = {tuple(item) for item in sweep}
  values = [next(iter(item.values())) for item in sweep]
  if (len(keys) == 1 and len(next(iter(keys))) == 1 and len(values) >= 2
      and all(type(v) is int for v in values)):
    step = values[1] - values[0]
    if step > 0 and all(b - a == step for a, b in zip(values, values[1:])):
      stop = values[-1] + 1
      steps = "" if step == 1 else f", {step}"
      return [f"  return config.sweep({next(iter(keys))[0]!r}, range({values[0]}, {stop}{steps}))", ""]
  return ["  return ["] + [f"      {item!r}," for item in sweep] + ["  ]", ""]
