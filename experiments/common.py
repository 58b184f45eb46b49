"""Flags shared by the experiment programs, and their translation into a ``pipeline.Config``."""

import dataclasses
import os
import sys
import typing

import jax
from absl import flags, logging

from gradjax import solvers
from gradjax.pipeline import Config

MATMUL_PRECISIONS = ("bfloat16", "tensorfloat32", "float32", "default", "high", "highest")


def flag_name(field: dataclasses.Field) -> str:
  """The command-line flag of a :class:`gradjax.pipeline.Config` field."""
  return field.metadata["flag"] or field.name


def _flag_type(field: dataclasses.Field) -> type:
  """int, float, bool or str: the field's type without ``| None``."""
  kinds = [t for t in typing.get_args(field.type) or (field.type,) if t is not type(None)]
  if len(kinds) != 1 or kinds[0] not in (int, float, bool, str):
    raise TypeError(f"Config field {field.name} has type {field.type}, which no flag takes")
  return kinds[0]


def define_flags():
  """Defines one flag per :class:`gradjax.pipeline.Config` field (its name, default and help come
  from the field), then the process settings (compilation cache, matmul precision, multi-host)."""
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
            str: flags.DEFINE_string}
  for field in dataclasses.fields(Config):
    help_text, choices = field.metadata["help"], field.metadata["choices"]
    if choices is not None:
      flags.DEFINE_enum(flag_name(field), field.default, list(choices), help_text)
    else:
      define[_flag_type(field)](flag_name(field), field.default, help_text)
  flags.DEFINE_enum("layout", "torch", ["torch"], "Tensor layout of --weights and --observation files.")
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (multi-host: pods, SLURM, Open MPI clusters).")
  flags.DEFINE_string("matmul_precision", None, "jax_default_matmul_precision: bfloat16, tensorfloat32, float32 (accelerators; no effect on CPU).")
  flags.DEFINE_string("compilation_cache", os.path.join(os.path.expanduser("~"), ".cache", "gradjax", "xla"), "Persistent XLA compilation cache folder, so repeated runs skip compilation ('' to disable).")
  flags.DEFINE_float("compilation_cache_min_secs", 0.2, "Cache only programs whose compilation took at least this many seconds (0 caches every program).")


def config_from_flags(**overrides) -> Config:
  """The :class:`gradjax.pipeline.Config` of the parsed flags, with ``overrides`` replacing fields.
  With captured files (--weights/--observation) --model and --dataset default to the files'
  metadata and to no ground truth unless given."""
  f = flags.FLAGS
  values = {field.name: f[flag_name(field)].value for field in dataclasses.fields(Config)}
  if f.weights or f.observation:
    for name in ("model", "dataset"):
      if not f[name].present:
        values[name] = None
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
