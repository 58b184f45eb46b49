"""Flags shared by the experiment programs, and their translation into a ``pipeline.Config``."""

import dataclasses
import os
import sys

import jax
from absl import flags, logging

from gradjax import attacks, data, models, pipeline, solvers
from gradjax.pipeline import Config

MATMUL_PRECISIONS = ("bfloat16", "tensorfloat32", "float32", "default", "high", "highest")


def define_flags():
  """Defines the experiment flags (defaults: DLG on DLG's LeNet, a bundled scikit-image photo)."""
  d = Config()
  flags.DEFINE_string("attack", d.attack, f"Attack preset: {', '.join(attacks.PRESETS)}.")
  flags.DEFINE_string("model", d.model, f"Model: {', '.join(models.MODELS)} (see gradjax.models).")
  flags.DEFINE_string("weights", d.weights, "Captured server weights to attack (a PyTorch state_dict as safetensors or .npz; see the README's file format).")
  flags.DEFINE_string("observation", d.observation, "Captured client gradient, update or weights after local training, against --weights (same format).")
  flags.DEFINE_enum("layout", "torch", ["torch"], "Tensor layout of --weights and --observation files.")
  flags.DEFINE_string("rename", d.rename, "Regex rules for the captured files' tensor names, pattern=replacement, comma separated (e.g. 'downsample=shortcut,^fc\\.=linear.' for torchvision ResNets).")
  flags.DEFINE_integer("num_samples", d.num_samples, "Captured: examples behind the update (the file's num_samples or labels if unset, else 1).")
  flags.DEFINE_string("checkpoint", d.checkpoint, "Attack the model of this checkpoint (experiments/train.py) instead of a fresh --model (its model, init and activation come from the checkpoint).")
  flags.DEFINE_string("init", d.init, "Model init: uniform, xavier_normal, default (model's own if unset).")
  flags.DEFINE_string("act", d.act, "Activation for models that take one (relu, sigmoid, ...).")
  flags.DEFINE_integer("num_classes", d.num_classes, "Model classes (the dataset's if unset).")
  flags.DEFINE_string("dataset", d.dataset, f"Data source: {', '.join(data.DATASETS)} or tfds:<name>. With --observation: the client's images for scoring, if given (else no ground truth).")
  flags.DEFINE_string("data_dir", d.data_dir, "Data folder (default: $GRADJAX_DATA_DIR or ../shared/data).")
  flags.DEFINE_integer("index", d.index, "First image of the client's batch.")
  flags.DEFINE_integer("batch_size", d.batch_size, "Client batch size.")
  flags.DEFINE_integer("image_size", d.image_size, "Resize images to this square size (source's if unset).")
  flags.DEFINE_integer("channels", d.channels, "Convert images to 1 or 3 channels.")
  flags.DEFINE_string("normalization", d.normalization, "Input normalisation: none, cifar10, cifar100, mnist, imagenet.")
  flags.DEFINE_bool("train_mode", d.train_mode, "Client runs the model in training mode (BatchNorm batch stats).")
  flags.DEFINE_string("client", d.client, "Threat model: fedsgd (gradient) or fedavg (update after local training).")
  flags.DEFINE_integer("local_epochs", d.local_epochs, "FedAvg local epochs.")
  flags.DEFINE_integer("local_batch_size", d.local_batch_size, "FedAvg local mini-batch size (whole batch if unset).")
  flags.DEFINE_float("local_lr", d.local_lr, "FedAvg local learning rate.")
  flags.DEFINE_float("local_momentum", d.local_momentum, "FedAvg local SGD momentum.")
  flags.DEFINE_string("shared_labels", d.shared_labels, "With known labels, what a FedAvg client reveals: ordered (labels per step) or multiset (which labels, not which step).")
  flags.DEFINE_string("defense", d.defense, "Defense applied to the update, e.g. gaussian:1e-3, prune:0.3, fp16, int8, clip:1,gaussian:1e-4.")
  flags.DEFINE_integer("restarts", d.restarts, "Random restarts; the lowest objective wins.")
  flags.DEFINE_integer("permutations", d.permutations, "Permutation search: candidate label-to-mini-batch assignments run in parallel (1 = none).")
  flags.DEFINE_integer("halving_rounds", d.halving_rounds, "Successive halving over restarts x candidates: rounds (1 = off).")
  flags.DEFINE_float("halving_keep", d.halving_keep, "Successive halving: fraction kept after each round.")
  flags.DEFINE_bool("shard", d.shard, "Split restarts (x permutation candidates) over all devices, of all hosts with --distributed.")
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (multi-host: pods, SLURM, Open MPI clusters).")
  flags.DEFINE_string("strategy", d.strategy, f"Restart strategy: {', '.join(solvers.STRATEGIES)}.")
  flags.DEFINE_integer("map_batch_size", d.map_batch_size, "Restarts vectorised together by --strategy=map.")
  flags.DEFINE_integer("iterations", d.iterations, "Optimizer iterations (preset's if unset).")
  flags.DEFINE_string("objective", d.objective, "What is matched (preset's if unset): gradient, replay, dlm, dlm_plus.")
  flags.DEFINE_string("optimizer", d.optimizer, f"Optimizer: {', '.join(solvers.OPTIMIZERS)} (preset's if unset).")
  flags.DEFINE_float("lr", d.learning_rate, "Learning rate (preset's if unset).")
  flags.DEFINE_float("tol", d.tol, "Stop a restart once its objective is <= tol (preset's if unset).")
  flags.DEFINE_string("distance", d.distance, "Gradient distance (preset's if unset): euclidean, euclidean_half, l1, cosine, cosine_per_layer, gaussian_kernel.")
  flags.DEFINE_string("layer_weights", d.layer_weights, "Per-layer distance weights by depth: inverse, linear, exp.")
  flags.DEFINE_string("priors", d.priors, "Image priors name:weight[:start_step], comma separated, e.g. tv:1e-4 ('' for none).")
  flags.DEFINE_string("labels", d.labels, "Label strategy: joint, known, or an inference method (idlg, negative_bias, yin, llg, bias_counts).")
  flags.DEFINE_string("schedule", d.schedule, "Learning-rate schedule: constant, step, cosine.")
  flags.DEFINE_bool("box", d.box, "Clamp dummy data to the valid image range after every step.")
  flags.DEFINE_string("dummy_init", d.dummy_init, "Dummy-data init: normal, uniform, constant, pattern.")
  flags.DEFINE_bool("one_sample_per_step", d.one_sample_per_step, "DLG batch option: move one dummy example per step.")
  flags.DEFINE_bool("remat", d.remat, "jax.checkpoint ResNet blocks and replayed local steps: less memory, more compute.")
  flags.DEFINE_enum("conv", d.conv, list(models.CONVS), "Convolutions: xla (lax.conv), im2col (patches x matrix, faster double backward on XLA:CPU), auto (im2col on CPU).")
  flags.DEFINE_string("matmul_precision", None, "jax_default_matmul_precision: bfloat16, tensorfloat32, float32 (accelerators; no effect on CPU).")
  flags.DEFINE_string("compilation_cache", os.path.join(os.path.expanduser("~"), ".cache", "gradjax", "xla"), "Persistent XLA compilation cache folder, so repeated runs skip compilation ('' to disable).")
  flags.DEFINE_float("compilation_cache_min_secs", 0.2, "Cache only programs whose compilation took at least this many seconds (0 caches every program).")
  flags.DEFINE_integer("seed", d.seed, "PRNG seed (model and dummy initialisation).")
  flags.DEFINE_enum("lpips", d.lpips, list(pipeline.LPIPS), "LPIPS network for scoring (auto: alex when the lpips extra is installed, else none).")
  flags.DEFINE_integer("chunk", d.chunk, "Iterations per jitted chunk between progress reports.")


def config_from_flags(**overrides) -> Config:
  f = flags.FLAGS
  captured = bool(f.weights or f.observation)
  values = dict(attack=f.attack, checkpoint=f.checkpoint, init=f.init, act=f.act,
                model=None if captured and not f["model"].present else f.model,
                weights=f.weights, observation=f.observation, rename=f.rename,
                num_samples=f.num_samples,
                num_classes=f.num_classes,
                dataset=None if captured and not f["dataset"].present else f.dataset,
                data_dir=f.data_dir, index=f.index, batch_size=f.batch_size,
                image_size=f.image_size, channels=f.channels, normalization=f.normalization,
                train_mode=f.train_mode, client=f.client, local_epochs=f.local_epochs,
                local_batch_size=f.local_batch_size, local_lr=f.local_lr,
                local_momentum=f.local_momentum, shared_labels=f.shared_labels, defense=f.defense,
                restarts=f.restarts, permutations=f.permutations, halving_rounds=f.halving_rounds,
                halving_keep=f.halving_keep, shard=f.shard, strategy=f.strategy,
                map_batch_size=f.map_batch_size,
                iterations=f.iterations, objective=f.objective, optimizer=f.optimizer, learning_rate=f.lr, tol=f.tol,
                distance=f.distance, layer_weights=f.layer_weights, priors=f.priors, labels=f.labels,
                schedule=f.schedule, box=f.box, dummy_init=f.dummy_init,
                one_sample_per_step=f.one_sample_per_step, remat=f.remat, conv=f.conv,
                seed=f.seed, chunk=f.chunk, lpips=f.lpips)
  values.update(overrides)
  return Config(**values)


def log_progress(p: solvers.Progress):
  """One progress line per chunk: a bar, the objective, restarts alive, rate and ETA."""
  where = "" if p.restart is None else f"restart {p.restart} "
  filled = round(20 * p.iteration / max(p.iterations, 1))
  logging.info("%s[%s%s] %d/%d  loss %.3e  alive %d  %.0f it/s  ETA %.1fs", where, "#" * filled,
               "." * (20 - filled), p.iteration, p.iterations, p.best_loss, p.alive, p.its_per_s, p.eta_s)


def permutation_seed(value: int, flag: str) -> int | None:
  """A data-permutation flag's value for :func:`gradjax.training.split`: -1 means the file order
  (None); other negative values are an error."""
  if value < -1:
    raise ValueError(f"--{flag} must be >= 0 or -1 (file order), got {value}")
  return None if value == -1 else value


def fail(message: str):
  """One-line error on stderr and exit code 2 (bad flags or data)."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv):
  """absl flag parser that reports bad flags in one line with exit code 2, then applies the process
  settings: the persistent compilation cache, the matmul precision, and the multi-host runtime
  (``--distributed``)."""
  try:
    argv = flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e))
  f = flags.FLAGS
  if "compilation_cache" in f and f.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", f.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", f.compilation_cache_min_secs)
  if "matmul_precision" in f and f.matmul_precision:
    if f.matmul_precision not in MATMUL_PRECISIONS:
      fail(f"unknown --matmul_precision {f.matmul_precision!r}; choose one of "
           f"{', '.join(MATMUL_PRECISIONS)}")
    jax.config.update("jax_default_matmul_precision", f.matmul_precision)
  if "distributed" in f and f.distributed:
    try:
      jax.distributed.initialize()
    except (RuntimeError, ValueError) as e:
      fail(f"jax.distributed.initialize() failed: {str(e).splitlines()[0]}")
  return argv


def replace(cfg: Config, **kw) -> Config:
  return dataclasses.replace(cfg, **kw)
