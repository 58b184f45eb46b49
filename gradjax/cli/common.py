"""Flags shared by the ``gradjax`` commands (and the study scripts), and their translation into a
``config.Config``."""

import atexit
import contextlib
import datetime
import glob
import logging as py_logging
import os
import platform
import re
import shlex
import shutil
import socket
import sys
import tempfile
import textwrap
from typing import Any, Callable

import jax
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

from gradjax import checkpoint, compilation, configs, files, models, progress
from gradjax.run import campaign, config, resume
from gradjax.run.config import Config
from gradjax.cli import distributed

STATE_FILE = campaign.STATE_FILE


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``; ``platform`` where that is missing)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


DEFAULT_CONFIG: list[str] = []  # the program's default configuration (define_flags)
CAPTURED: list[bool] = []  # [True] for a program that attacks captures (define_flags)
# Where a program of captures takes these options from when they are not given, as --help says
# (options_from_flags leaves them None for the captures' files to fill in).
_FROM_CAPTURES = {"model.name": "the captures' metadata", "data.dataset": "none: no scoring"}
FIELDS: list[str] = []  # the options (dotted paths) the program reads (define_flags)

# The command as typed: gradjax.cli.main sets ["gradjax", "<command>"] and the command's docstring; a
# module run as a script (a study in experiments/) is "python <its path>".
PROGRAM: list[str] = []
PROGRAM_DOC: list[str] = []


def program() -> list[str]:
  """The command that runs this program, without its flags (``["gradjax", "sweep"]``)."""
  return list(PROGRAM) or ["python", os.path.relpath(os.path.abspath(sys.argv[0]))]


def provenance() -> dict:
  """Where a table comes from, for its results.json: the command line as typed (``gradjax NAME
  flags...``), the device, the cores the process may use, the processes of the run, the versions and the
  UTC date (the studies quote it)."""
  import flax
  import optax
  device = jax.local_devices()[0]
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  import importlib.metadata
  try:
    version = importlib.metadata.version("gradjax")
  except importlib.metadata.PackageNotFoundError:
    version = None
  return {"command": shlex.join([*program(), *sys.argv[1:]]), "gradjax": version,
          "device": device.device_kind if device.platform != "cpu" else f"CPU ({cpu_model()})",
          "platform": device.platform, "cores": cores, "processes": distributed.process_count(),
          "jax": jax.__version__,
          "flax": flax.__version__, "optax": optax.__version__, "python": platform.python_version(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def define_flags(default_config: str | None = None, sections: tuple[str, ...] | None = None,
                 omit: tuple[str, ...] = (), fields: tuple[str, ...] | None = None,
                 batched: bool = False, captured: bool = False):
  """Defines ``--config`` (a configuration file, :mod:`gradjax.run.config`;
  ``--config.<section>.<key>=...`` sets one of its options), a short flag for each option the program
  reads that has one (:data:`gradjax.run.config.ALIASES`; default and help from the option),
  ``--print_config``, then the process settings (compilation cache, multi-host). ``--help`` lists
  every option the program reads, by section.

  ``default_config``: a packaged configuration (``gradjax.configs``) read when no ``--config`` is
  given: a table program's protocol (its options keep their one default; the protocol's values
  come from the configuration, which ``--print_config`` shows). ``sections``: only the options of
  these sections (and ``seed``) become flags, for programs that read no others (a configuration
  file may still set any option; the others keep their defaults); by default an attack's sections
  (``config.ATTACK_SECTIONS``). ``omit``: options (dotted paths) of those sections the program does
  not read. ``fields``: instead of sections, the options it reads (dotted paths; ``seed`` too).
  ``batched``: the program attacks several experiments at once and reads
  :data:`gradjax.run.config.BATCHED` (with sections; others never do). ``captured``: the program
  attacks captures, whose files give the model and whose ground truth is there only if
  ``--dataset`` is given (:func:`options_from_flags`)."""
  DEFAULT_CONFIG[:] = [default_config] if default_config else []
  CAPTURED[:] = [True] if captured else []
  sections = config.ATTACK_SECTIONS if sections is None else sections
  if fields is not None:
    for path in fields:
      config.option(path)
  FIELDS[:] = (config.names(sections, (*omit, *(() if batched else config.BATCHED))) if fields is None else
               [p for p in config.paths() if p in ("seed", *fields)])
  for path in FIELDS:
    if config.alias(path):
      _define_option(path)
  config_flags.DEFINE_config_file(
      "config", configs.path(default_config) if default_config else None,
      f"Configuration: a packaged one's name ({', '.join(configs.NAMES)}) or a "
      "Python file whose get_config() returns the nested options (gradjax.run.config; a run folder's "
      "config.py reproduces that run). Short flags given beside it override its options.",
      lock_config=True)
  flags.DEFINE_bool("print_config", False, "Check the resolved configuration as a run would, "
                    "print it (as a configuration file) and exit before anything runs.")
  flags.DEFINE_enum("layout", "torch", ["torch"], "Tensor layout of --weights and --observation files.")
  flags.DEFINE_string("compilation_cache", compilation.DEFAULT_CACHE, "Persistent XLA compilation cache folder, so repeated runs skip compilation ('' to disable).")
  flags.DEFINE_float("compilation_cache_min_secs", 0.0, "Cache only programs whose compilation took at least this many seconds (0, the default, caches every program: loading even a small one from the cache is faster than compiling it again).")


def define_launch_flags(collectives: bool):
  """The flags that start a run over several processes (:mod:`gradjax.cli.distributed`), for the
  programs that split their work over processes: one attack's restarts (``reconstruct --config.execution.shard=True``;
  ``collectives``: JAX's multi-process runtime, one mesh over every process's devices) or a table's
  experiments (:meth:`gradjax.run.campaign.Items.plan`; without collectives, each process its own JAX)."""
  _COLLECTIVES[:] = [collectives]
  group = "launch over several processes"
  flags.DEFINE_bool("distributed", False, "Join a run over several processes whose arguments JAX "
                    "detects (SLURM, Open MPI, TPU pods); implied by the flags below.",
                    module_name=group)
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0, where the processes "
                      "meet (the same on every process).", module_name=group)
  flags.register_validator("coordinator_address", _host_and_port,
                           "must be host:port, the port a number from 1 to 65535")
  flags.DEFINE_integer("num_processes", None, "Processes in the run (the same on every process).",
                       lower_bound=1, module_name=group)
  flags.DEFINE_integer("process_id", None, "This process's number, 0 .. --num_processes - 1 "
                       "(process 0 writes the results).", lower_bound=0, module_name=group)
  flags.DEFINE_list("local_device_ids", None, "Accelerators this process uses (e.g. 0,1; default: "
                    "all it sees).", module_name=group)
  flags.DEFINE_integer("initialization_timeout_s", 300, "Seconds to wait for every process to "
                       "join before giving up.", lower_bound=1, module_name=group)
  flags.DEFINE_integer("heartbeat_timeout_s", None, "Seconds without a heartbeat after which a "
                       "process counts as stopped and the others exit, naming it (default: "
                       f"{distributed.LOCAL_HEARTBEAT_TIMEOUT_S} with a coordinator on this machine, "
                       f"127.0.0.1 or localhost; else {distributed.CLUSTER_HEARTBEAT_TIMEOUT_S}).",
                       lower_bound=1, module_name=group)


_COLLECTIVES: list[bool] = []


def _launch() -> None:
  """Joins a run over several processes when the launch flags ask for one."""
  f = flags.FLAGS
  if "distributed" not in f:
    return
  given = [f.coordinator_address, f.num_processes, f.process_id, f.local_device_ids]
  if not f.distributed and all(v is None for v in given):
    return
  try:
    ids = None if f.local_device_ids is None else [int(i) for i in f.local_device_ids]
  except ValueError:
    fail(f"--local_device_ids must be integers, got {','.join(f.local_device_ids)}")
  if f.num_processes is not None and f.process_id is not None and f.process_id >= f.num_processes:
    fail(f"--process_id must lie in 0 .. {f.num_processes - 1} (--num_processes={f.num_processes}), "
         f"got {f.process_id}")
  try:
    distributed.initialize(f.coordinator_address, f.num_processes, f.process_id, ids,
                           initialization_timeout_s=f.initialization_timeout_s,
                           heartbeat_timeout_s=f.heartbeat_timeout_s, collectives=_COLLECTIVES[0])
  except distributed.Error as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(2)  # JAX's shutdown at exit would wait for the run that did not form
  sys.excepthook = _excepthook_over_processes
  atexit.register(distributed.finished)  # a normal exit (errors and faults leave by os._exit)
  distributed.watch()
  _check_same_flags()
  if ids is not None:  # JAX applies them to accelerators only: on a CPU they would change nothing
    try:
      backend = jax.default_backend()
    except RuntimeError as e:
      fail(f"--local_device_ids={','.join(map(str, ids))}: {' '.join(str(e).split())[:300]}")
    if backend == "cpu":
      fail(f"--local_device_ids={','.join(map(str, ids))} chooses accelerators; this process "
           "runs on the CPU (leave the flag out)")


# What a process may set for itself: which process it is, what it holds locally (its devices, its
# compilation cache, how long it waits), and where its machine finds the files (a shared filesystem
# may be mounted elsewhere; process 0 chooses the output folder for all).
_LOCAL_FLAGS = ("process_id", "local_device_ids", "compilation_cache", "compilation_cache_min_secs",
                "initialization_timeout_s", "heartbeat_timeout_s", "data_dir", "checkpoint", "weights",
                "observation", "output_dir", "output", "audit_dir", "flagfile")
_LOCAL_OPTIONS = ("data.data_dir", "model.checkpoint", "model.weights", "client.observation")


def _shared_flags() -> dict[str, str]:
  """This process's flags that every process of a run must share (:func:`_check_same_flags`):
  each flag's value, the configuration's options (``--config`` and its overrides), the
  coordinator's port (JAX serves every address of process 0's machine)."""
  f = flags.FLAGS
  shared = {}
  for module, held in f.flags_by_module_dict().items():
    for flag in held:
      name = flag.name
      if module.startswith("absl.") or name in _LOCAL_FLAGS or name.startswith("config."):
        continue
      if name == "config":
        given = config.given(flag.value) if flag.value is not None else {}
        shared.update({f"config.{path}": str(value) for path, value in given.items()
                       if path not in _LOCAL_OPTIONS})
      elif name == "coordinator_address":
        shared[name] = str(flag.value).rpartition(":")[2]
      else:
        shared[name] = str(flag.value)
  return shared


def _check_same_flags() -> None:
  """Ends a process started with other flags than process 0 (one line, exit 2): every process runs
  the same command, and what process 0 writes would otherwise record its flags alone."""
  mine = _shared_flags()
  first = distributed.agree(lambda: mine)
  differ = sorted(n for n in set(mine) | set(first) if mine.get(n) != first.get(n))
  if differ:
    shown = ", ".join(f"--{n}={mine.get(n)} (process 0: {first.get(n)})" for n in differ[:3])
    message = (f"process {distributed.process_index()} was started with other flags than process 0: "
               f"{shown}{' and more' if len(differ) > 3 else ''}; start every process with the same "
               "command (but --process_id)")
    distributed.fail(message, 2, line=f"error: {message}")


def _excepthook_over_processes(kind, value, tb):
  """An uncaught exception in a run over several processes: a collective whose peer is gone names
  that process (:func:`distributed.lost_peer`); anything else is printed, posted to the other
  processes, and ends this one without JAX's shutdown barrier."""
  if issubclass(kind, KeyboardInterrupt):
    print("interrupted", file=sys.stderr)
    distributed.fail("interrupted", 130)
  if distributed.is_collective_failure(value):
    distributed.lost_peer(value)
  sys.__excepthook__(kind, value, tb)
  distributed.fail(f"{kind.__name__}: {value}", 1)


def _define_option(path: str) -> flags.FlagHolder:
  """The short flag of option ``path`` (:func:`gradjax.run.config.alias`), its default, help and
  choices from the schema."""
  field = config.option(path)
  name, help_text, choices = config.alias(path), field.metadata["help"], field.metadata["choices"]
  if choices is not None:
    return flags.DEFINE_enum(name, field.default, list(choices), help_text, module_name=_OPTIONS)
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
            str: flags.DEFINE_string}[config.option_type(path)]
  return define(name, field.default, help_text, module_name=_OPTIONS)


_OPTIONS = "configuration options"  # the short flags' group (grouped_help lists them by section)


def _values_given() -> tuple[dict, set[str]]:
  """(dotted path -> value, the options the user chose) of the parsed flags: set by a flag given,
  by ``--config.<path>`` (even to its default), or by ``--config`` to another value than the
  program's default (the schema's, with the program's default configuration over it). An option
  given both as a short flag and as ``--config.<path>``, to different values: one line, exit 2."""
  f = flags.FLAGS
  values = {path: config.option(path).default for path in config.paths()}
  chosen = set()
  if f.config is not None:
    baseline = dict(values)
    if DEFAULT_CONFIG and (not f["config"].present
                           or config_file(f["config"]) == configs.path(DEFAULT_CONFIG[0])):
      baseline.update(config.given(configs.get(DEFAULT_CONFIG[0])))
    from_file = config.given(f.config)
    chosen |= {path for path, value in from_file.items()
               if value != baseline[path] or _override_given(path)}
    values.update(from_file)
  for path in FIELDS:
    name = config.alias(path)
    if name and name in f and f[name].present:
      if _override_given(path) and f[name].value != values[path]:
        fail(f"--{name}={f[name].value} and --config.{path}={values[path]} set one option to two "
             "values; give one of them")
      values[path] = f[name].value
      chosen.add(path)
  return values, chosen


def _override_given(path: str) -> bool:
  """Whether ``--config.<path>`` was on the command line (ml_collections defines a flag per override)."""
  name = f"config.{path}"
  return name in flags.FLAGS and flags.FLAGS[name].present


def command_line_options() -> set[str]:
  """The options (dotted paths) set on the command line itself: by a short flag or a
  ``--config.<path>`` override (not by the ``--config`` file)."""
  f = flags.FLAGS
  return {path for path in FIELDS if _override_given(path) or (
      config.alias(path) and config.alias(path) in f and f[config.alias(path)].present)}


def option_values() -> dict[str, Any]:
  """Dotted path -> the value the flags and ``--config`` give it (the schema's default where
  neither does), before a :class:`Config` is built and checked: for a program's own messages about
  options that the configuration's checks word for the attacks."""
  return _values_given()[0]


def options_given() -> set[str]:
  """The options (dotted paths) that ``--config`` or a flag set (to check options a protocol does
  not use)."""
  return _values_given()[1]


def options_from_flags() -> dict[str, Any]:
  """Dotted path -> value of the parsed flags: the defaults, then ``--config``'s options, then the
  short flags given. An option the program does not read, set to another value
  than its default: one line, exit 2. With captured files (--weights/--observation, or a program
  of captures: :func:`define_flags`'s ``captured``) --model and --dataset default to the files' metadata
  and to no ground truth unless given; with --modality=text to transformer and pydoc (and the
  training split to the corpus's last tenth)."""
  values, chosen = _values_given()
  unused = sorted(chosen - set(FIELDS))
  if unused:  # e.g. a training option given to an attack: it would be recorded, and change nothing
    fail(f"{', '.join('--config.' + p for p in unused)}: not an option of {shlex.join(program())}, "
         f"which reads {', '.join(sorted({config.section(p) or 'seed' for p in FIELDS}))} options")
  if CAPTURED or values["model.weights"] or values["client.observation"]:
    values.update({p: v for p, v in config.CAPTURED.items() if p not in chosen})
  if values["data.modality"] == "text":  # the text defaults: SAPAG's transformer on Python's docs
    values.update({p: v for p, v in config.TEXT_DEFAULTS.items() if p not in chosen})
  return values


def config_from_flags(check: Callable[[Config, bool], Any] | None = None,
                      printed: bool = True) -> Config:
  """The :class:`gradjax.run.config.Config` of :func:`options_from_flags`. Input files that are
  missing or unreadable, options the user gave that the run would not read (:func:`check_given`)
  and what the program's ``check(cfg, files)`` refuses (ValueError, e.g.
  :func:`gradjax.run.config.check`): one line, exit 2. With ``--print_config`` the same checks but
  of the input files (``files`` False: a configuration may name files a run makes later), then it
  is printed and the process exits 0 (``printed=False``: the program prints it, with what it
  resolves next, :func:`print_config`)."""
  files = not flags.FLAGS.print_config
  try:
    values = options_from_flags()
    if "modality" not in flags.FLAGS and models.is_text(values.get("model.name") or ""):
      raise ValueError(f"--model={values['model.name']} reads text; {shlex.join(program())} "
                       "reads image models")
    cfg = config.from_options(values)
    if files:
      config.check_input_files(cfg)
      config.with_declared(cfg)  # a contradiction of the capture's DP-SGD, before any run starts
    check_given(cfg, options_given(), files=files)
    if check is not None:
      check(cfg, files)
  except (ValueError, FileNotFoundError) as e:
    fail(str(e))
  if printed:
    print_config(cfg)
  return cfg


def images_only(check: Callable[[Config, bool], Any]) -> Callable[[Config, bool], Any]:
  """``check`` (a program's ``config_from_flags`` check) for a program whose tables score images:
  a text configuration is refused first."""
  def checked(cfg: Config, files: bool):
    if cfg.data.modality != "image":
      raise ValueError(f"{shlex.join(program())} tabulates image attacks; for text use gradjax "
                       "text-table (or reconstruct --modality=text)")
    return check(cfg, files)
  return checked


def check_given(cfg: Config, given: set[str], files: bool = True) -> None:
  """One line, exit 2, where options ``given`` (dotted paths: the user's, or a sweep item's) would
  not be read by ``cfg``'s run: FedAvg's local training under a simulated FedSGD client, model
  options other than a ``--checkpoint``'s (:func:`_check_checkpoint_model`; unless ``files`` is
  False and the checkpoint is not there); with a capture, the simulated client's kind (the file's
  metadata ``kind`` says what it holds) and an image index without a ``--dataset`` to take it from."""
  if cfg.client.observation and "client.name" in given:
    fail("--client chooses a simulated client; a capture's update is what its file's metadata "
         "'kind' says (gradient, update or weights): leave --client out")
  if cfg.client.observation and "data.index" in given and cfg.data.dataset is None:
    fail("--index chooses the capture's ground truth in --dataset; give --dataset too, or leave "
         "--index out (no ground truth: the verdict reads the residual only)")
  if cfg.client.name == "fedsgd" and not cfg.client.observation:
    ignored = [p for p in config.unread_by_client("fedsgd", given) if p.startswith("client.")]
    if ignored:
      fail(f"{', '.join(config.flag(p) for p in ignored)} {'does' if len(ignored) == 1 else 'do'} not apply "
           "to --client=fedsgd")
  if cfg.model.checkpoint and (files or os.path.isfile(cfg.model.checkpoint)):
    _check_checkpoint_model(cfg, given)


def _check_checkpoint_model(cfg: Config, given: set[str]) -> None:
  """One line, exit 2, where ``--model``, its activation, init, class count or transformer sizes,
  given beside ``--checkpoint``, differ from what the checkpoint holds (the checkpoint's are used)."""
  try:
    saved = checkpoint.read_metadata(cfg.model.checkpoint)
  except ValueError as e:
    fail(str(e))
  sizes = saved.get("text_sizes") if isinstance(saved.get("text_sizes"), dict) else {}
  for key, path in (("model", "model.name"), ("act", "model.act"), ("init", "model.init"),
                    ("num_classes", "model.num_classes"), ("text_dim", "model.text_dim"),
                    ("text_heads", "model.text_heads"), ("text_ffn", "model.text_ffn"),
                    ("text_layers", "model.text_layers")):
    if key.startswith("text_") and not sizes:
      continue  # not a text model's checkpoint: refused as such elsewhere
    held = sizes.get(key.removeprefix("text_")) if key.startswith("text_") else saved.get(key)
    if key == "num_classes" and config.get(cfg, path) is None:
      continue
    if path in given and config.get(cfg, path) != held and (held is not None or key != "model"):
      fail(f"--checkpoint {cfg.model.checkpoint} holds a model with {config.flag(path)}="
           f"{'its default' if held is None else held}, not {config.get(cfg, path)}: drop "
           f"{config.flag(path)}")


def print_config(options: Config | dict[str, Any], sweep: list[dict[str, Any]] | None = None) -> None:
  """With ``--print_config``: prints ``options`` (the program's options; ``sweep``: the items it
  runs, as the file's ``get_sweep()``) as a configuration file and exits 0."""
  if flags.FLAGS.print_config:
    print(config.to_python(options, comment="The resolved configuration (--print_config).",
                           fields=tuple(FIELDS), sweep=sweep), end="")
    sys.exit(0)


def refuse_a_sweep(runs: str = "runs one experiment") -> None:
  """One line, exit 2, where the ``--config`` file declares a sweep (``get_sweep()``), which a
  program that sweeps nothing would not run (``gradjax train``, ``gradjax audit``; ``reconstruct``
  runs one of a sweep's experiments, chosen by its flags); ``runs`` says what the program does."""
  try:
    declared = declared_sweep()
  except (ValueError, TypeError):
    declared = []
  if declared is not None:
    fail(f"--config={config_file(flags.FLAGS['config'])} declares a sweep (get_sweep()): gradjax "
         f"sweep runs it; {shlex.join(program())} {runs}")


def declared_sweep() -> list[dict[str, Any]] | None:
  """The items of the ``--config`` file's ``get_sweep()`` (:func:`gradjax.run.config.sweep`), or None
  when it declares none. With ``--config=file.py:arg`` a ``get_sweep(arg)`` that takes an argument
  gets it, as ``get_config(arg)`` does (a study's variant), and may return None (the variant declares
  no sweep). ValueError for a sweep that is not a non-empty list of option dicts."""
  f = flags.FLAGS
  if f.config is None:
    return None
  import importlib.util
  import inspect
  path = config_file(f["config"])
  arg = config_variant(f["config"])
  spec = importlib.util.spec_from_file_location("_gradjax_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # config_flags ran it already: it loads
  if not hasattr(module, "get_sweep"):
    return None
  takes_arg = bool(inspect.signature(module.get_sweep).parameters)
  try:
    items = module.get_sweep(arg) if takes_arg and arg is not None else module.get_sweep()
  except Exception as e:  # the user's code: one line, not a traceback
    raise ValueError(f"{path}: get_sweep() failed: {type(e).__name__}: {e}") from None
  if items is None and takes_arg:
    return None
  if (not isinstance(items, (list, tuple)) or not items
      or not all(isinstance(i, dict) and all(isinstance(k, str) for k in i) for i in items)):
    raise ValueError(f"{path}: get_sweep() must return a non-empty list of dicts of options "
                     "(config.sweep, config.product)")
  return [dict(i) for i in items]


def config_variant(flag) -> str | None:
  """``arg`` of a ``--config=file.py:arg`` flag (``get_config(arg)``'s variant), else None."""
  name = config_flags.get_config_filename(flag)
  path = config_file(flag)
  return name[len(path) + 1:] if name != path else None


def config_file(flag) -> str:
  """The file of a ``--config`` flag: ``file.py`` of ``file.py:arg`` (``get_config(arg)``'s variant),
  which ml_collections' ``get_config_filename`` returns with the argument still attached."""
  return _file_of(config_flags.get_config_filename(flag))


def _file_of(value: str) -> str:
  """``file.py`` of a ``--config`` value ``file.py`` or ``file.py:arg``."""
  return value if os.path.exists(value) or ":" not in value else value.rsplit(":", 1)[0]


def write_config(out: str, cfg: Config, sweep: list[dict[str, Any]] | None = None,
                 rows: bool = False) -> None:
  """Writes ``cfg`` (and its ``sweep``) as ``<out>/config.py``, which ``--config`` reads to
  reproduce the run (process 0 of a run over several processes; the others write nothing).
  ``rows``: ``cfg`` is what a table's rows share, the rows and counts the program's own flags,
  which the recorded command holds."""
  if not distributed.is_writer():
    return
  command = shlex.join([*program(), *sys.argv[1:]]).replace("\n", "\\n")
  what = ("The rows' common configuration of the run in this folder: the command below reproduces "
          "it (with --config=<this file>, give that command's own flags too: the table's rows and "
          "counts)" if rows else
          "The configuration of the run in this folder: --config=<this file> reproduces it")
  text = config.to_python(cfg, comment=f"{what}.\nCommand: {command}", fields=tuple(FIELDS),
                          sweep=sweep)
  files.atomic_write(os.path.join(out, "config.py"), lambda fh: fh.write(text), binary=False)
  # The claim stays until the run ends (_leave): its process line says the folder is being written.


def define_fields(*paths: str) -> dict[str, flags.FlagHolder]:
  """Flags for these options (dotted paths; their short names, defaults and help), for programs that
  measure rather than run an experiment (no ``--config``); path -> its flag."""
  return {path: _define_option(path) for path in paths}


def define_results_file_flag() -> flags.FlagHolder:
  """--output: the optional JSON file of a program that writes no run folder, and --overwrite. A
  folder, or a file in a folder that does not exist or cannot be written, is refused when the flags
  are parsed; an existing file by :func:`check_output_file`, unless --overwrite."""
  holder = flags.DEFINE_string("output", None, "Optional JSON file of the results (and, where the "
                               "program prints a table, that table as Markdown beside it).")
  flags.register_validator("output", _check_results_file)
  _define_overwrite()
  return holder


def _define_overwrite() -> None:
  """--overwrite, once for a program with --output_dir, --output or both."""
  if "overwrite" not in flags.FLAGS:
    flags.DEFINE_bool("overwrite", False, "Write over an earlier run's results: into an "
                      "--output_dir that holds its files, or an existing --output file.")


def check_output_file(beside: tuple[str, ...] = ()) -> None:
  """Once the configuration is resolved (after --print_config), before anything is computed: one
  line and exit 2 where --output names an existing file, or one the program writes beside it
  (``beside``: extensions replacing --output's, e.g. ``(".md",)``), and --overwrite is not given;
  or where --output itself has one of those extensions (the two files would be one)."""
  f = flags.FLAGS
  if not f.output:
    return
  clash = [ext for ext in beside if os.path.splitext(f.output)[1] == ext]
  if clash:
    fail(f"--output {f.output}: the program writes its {clash[0]} file beside the results under "
         f"that name; name the results' file .json")
  if f.overwrite:
    return
  for path in (f.output, *(os.path.splitext(f.output)[0] + ext for ext in beside)):
    if os.path.exists(path):
      fail(f"--output {f.output}: {path} exists; give another name, or --overwrite to replace it")


def _check_results_file(path: str | None) -> bool:
  """True where ``path`` (if given) names a file a program can write; else
  ``flags.ValidationError`` saying why (the error's line)."""
  if not path:
    return True
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    problem = "a folder; give the name of a .json file"
  elif not os.path.isdir(folder):
    problem = f"no folder {folder}"
  else:
    try:  # a file made and removed: os.access says yes to root on a read-only filesystem
      handle, probe = tempfile.mkstemp(prefix=".gradjax-probe-", dir=folder)
      os.close(handle)
      os.remove(probe)
      return True
    except OSError as e:
      problem = f"cannot write to {folder} ({e.strerror})"
  raise flags.ValidationError(problem)


def _host_and_port(address: str | None) -> bool:
  """Whether ``address`` is None or ``host:port`` (``[v6 address]:port`` too) with a valid port."""
  if address is None:
    return True
  host, _, port = address.rpartition(":")
  return bool(host.strip("[]")) and port.isdigit() and 1 <= int(port) <= 65535


def define_models_flag() -> flags.FlagHolder:
  """--models of the measuring programs (benchmark, benchmark-step, batch-memory)."""
  return flags.DEFINE_list("models", ["lenet_zhu", "resnet20-4"],
                           "Zoo models to measure (gradjax.models names).")


def define_batch_sizes_flag() -> flags.FlagHolder:
  """--batch_sizes of the measuring programs (benchmark, batch-memory)."""
  return flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes to measure.")


def define_table_flags(psnr: bool = True, methods: bool = False, start: bool = True):
  """(``start``) --start, --count, (``psnr``) --psnr_threshold and (``methods``) --methods of the
  table programs (one definition, one default)."""
  if methods:
    flags.DEFINE_string("methods", "", "Semicolon-separated rows of the table, from those its "
                        "description lists (empty: its default rows).")
  if start:
    flags.DEFINE_integer("start", 0, "First item of the table (an image, a client's batch or a "
                         "sentence: one client each).")
    flags.register_validator("start", lambda v: v >= 0, "--start must be non-negative")
  flags.DEFINE_integer("count", 10, "Items in the table (one client each).")
  flags.register_validator("count", lambda v: v >= 1, "--count must be positive")
  if psnr:
    flags.DEFINE_float("psnr_threshold", 30.0, "Success: PSNR at or above this (dB; dlm-table: "
                       "above it, as DLM counts).")
    flags.register_validator("psnr_threshold", lambda v: v > 0,
                             "--psnr_threshold must be positive (dB; images in [0, 1] score >= 0)")


def semicolon_list(name: str, value: str) -> list[str]:
  """The items of a table's semicolon-separated flag ``--name`` (spaces around them dropped); one
  line and exit 2 for an empty item (``a;;b``) or one given twice (a row of the table twice,
  read back from one experiment)."""
  items = [s.strip() for s in value.split(";")]
  if not any(items) or not all(items):
    fail(f"--{name} takes semicolon-separated items without empty ones, got {value!r}")
  twice = next((s for k, s in enumerate(items) if s in items[:k]), None)
  if twice is not None:
    fail(f"--{name} repeats {twice!r}")
  return items


def log_progress(p: progress.Progress):
  """Prints :meth:`gradjax.progress.Progress.line` on stderr after every chunk (plain: no log
  prefix; in a run over several processes, the process's number first)."""
  who = f"[process {distributed.process_index()}] " if distributed.process_count() > 1 else ""
  print(who + p.line(), file=sys.stderr, flush=True)


RESUME_HELP = ("Continue an interrupted run, reading back what it finished: in --output_dir (without "
               "it: the latest default folder with a saved state); audit: in --audit_dir, the "
               "captures attacked with the same options.")


def define_output_flags(resumable: bool = True):
  """--output_dir (default ``runs/<the run's name>``, :func:`output_folder`, suffixed -2, -3, ...
  when taken) and --overwrite; with ``resumable`` also --resume and --save_every_s."""
  flags.DEFINE_string("output_dir", None, "Output folder (default: runs/<the run's name>, with -2, "
                      "-3, ... appended when that folder holds another run).")
  _define_overwrite()
  if resumable:
    flags.DEFINE_bool("resume", False, RESUME_HELP)
    flags.DEFINE_float("save_every_s", 60.0, "Seconds between saves of the solver state, which "
                       "--resume continues from (0: after every --config.execution.chunk iterations).")


def _holds_files(path: str) -> bool:
  return os.path.isdir(path) and any(os.scandir(path))


def recorded_command(out: str) -> list[str] | None:
  """The command (program and flags) that ``<out>/config.py`` records (:func:`write_config`), or
  before a run has written it, its claim of the folder (:data:`CLAIM`); ``None`` where neither
  file or line is there."""
  for name in ("config.py", CLAIM):
    try:
      with open(os.path.join(out, name), encoding="utf-8") as fh:
        for line in fh:
          if line.startswith("# Command: "):
            return shlex.split(line[len("# Command: "):])
          if not line.startswith("#"):
            break
    except (OSError, UnicodeDecodeError, ValueError):
      continue
  return None


CLAIM = ".gradjax-claim"
"""The file a run creates in its folder the moment it claims it (exclusively: of two runs started
together, one gets the folder), holding its command and its process (``# Process: <pid> <start> on
<host>``, :func:`running`); removed at exit where ``config.py`` records the command or the run
wrote nothing else. An interrupted run's claim names its program."""

_PROCESS = "# Process: "


def process_start(pid: int) -> str:
  """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field),
  which tells it from a later process given the same number; "-" where it cannot be read."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
      return fh.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return "-"


def _process_line() -> str:
  return f"{_PROCESS}{os.getpid()} {process_start(os.getpid())} on {socket.gethostname()}\n"


def _claim(out: str, *, exclusive: bool = True, keep: bool = False) -> bool:
  """Creates ``<out>/``:data:`CLAIM` with this run's command and process; False where ``exclusive``
  and another run's claim is there. ``keep`` (a resumed run): an interrupted run's claim keeps the
  command that ran (a resume refused for another configuration must not replace it), with this
  process in place of that one's."""
  path = os.path.join(out, CLAIM)
  if keep and os.path.isfile(path):
    with open(path, encoding="utf-8") as fh:
      kept = [line for line in fh if not line.startswith(_PROCESS)]
    files.atomic_write(path, lambda fh: fh.write("".join(kept) + _process_line()), binary=False)
    return True
  text = ("# Command: " + shlex.join([*program(), *sys.argv[1:]]).replace("\n", "\\n") + "\n"
          + _process_line())
  mode = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
  try:
    fd = os.open(os.path.join(out, CLAIM), mode, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w", encoding="utf-8") as fh:
    fh.write(text)
  return True


def running(out: str) -> str | None:
  """Where ``out``'s claim (:data:`CLAIM`) names a process of this host that still runs (not this
  one): "process <pid> (<its command>)"; else None (no claim, or one of an older version without
  the line, a process that ended, e.g. interrupted or killed, a number now another process's, whose
  start differs, or a process of another host, which cannot be told)."""
  try:
    with open(os.path.join(out, CLAIM), encoding="utf-8") as fh:
      lines = fh.read().splitlines()
  except (OSError, UnicodeDecodeError):
    return None
  found = [line[len(_PROCESS):].split(" on ", 1) for line in lines if line.startswith(_PROCESS)]
  if not found or len(found[0]) != 2 or len(found[0][0].split()) != 2:
    return None
  (pid, start), host = found[0][0].split(), found[0][1]
  if not pid.isdigit() or host != socket.gethostname() or int(pid) == os.getpid():
    return None
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return None
  except PermissionError:
    pass  # alive, another user's
  now = process_start(int(pid))
  if "-" not in (start, now) and now != start:
    return None  # the number was given to a later process
  command = recorded_command(out)
  return f"process {pid}" + (f" ({shlex.join(command[:2])})" if command else "")


def _check_not_running(out: str) -> None:
  """Exits with one line where a process still running here writes ``out`` (:func:`running`): a
  --resume or --overwrite there would be written over by it."""
  if live := running(out):
    fail(f"--output_dir {out} is being written by {live}, which is still running: wait for it to "
         "end (or stop it), or choose another folder")


def _release_claim(out: str) -> None:
  try:
    os.remove(os.path.join(out, CLAIM))
  except FileNotFoundError:
    pass


# Where a program keeps its solver states: a table program (its files under items/) one per
# experiment there, the others one in the run's folder.
ITEM_STATES, RUN_STATE = os.path.join("items", "*." + STATE_FILE), STATE_FILE


def _states(own: tuple[str, ...]) -> str:
  """The glob pattern, in its folder, of the solver states of the program whose files are ``own``."""
  return ITEM_STATES if any(p.startswith("items/") for p in own) else RUN_STATE


def _found(out: str, pattern: str) -> list[str]:
  return glob.glob(os.path.join(glob.escape(out), pattern))


def _results(out: str, own: tuple[str, ...]) -> list[str]:
  """The files of this program (``own``'s patterns) in ``out`` that a run writes as it gets
  results: neither its ``config.py`` (written at the start) nor a saved state."""
  states = set(_found(out, _states(own)))
  return [p for pattern in own for p in _found(out, pattern)
          if os.path.isfile(p) and p not in states and os.path.basename(p) != "config.py"]


def _check_resumable(out: str, own: tuple[str, ...]) -> None:
  """Exits with one line unless ``out`` holds a run of this program to continue: files, among them
  a saved state or finished experiments (``items/``) or this program's ``config.py``, and no
  ``config.py`` or saved state of another command."""
  if not _holds_files(out):
    fail(f"--resume: {out} holds no saved state or run to continue; run without --resume to start "
         "afresh")
  mine = program()
  command = recorded_command(out)
  if command and command[0] == "gradjax" and mine[0] == "gradjax" and command[:2] != mine[:2]:
    fail(f"--resume: {out} holds a run of {shlex.join(command[:2])}, not of {shlex.join(mine)}; "
         "choose another folder")
  states = _states(own)
  other = RUN_STATE if states == ITEM_STATES else ITEM_STATES
  if command is None and not _found(out, states) and _found(out, other):
    fail(f"--resume: {out} holds an interrupted run of another program ({_found(out, other)[0]}), "
         f"not of {shlex.join(mine)}; choose another folder")
  ours = command is not None or os.path.isdir(os.path.join(out, "items")) or _found(out, states)
  if not ours:
    fail(f"--resume: {out} holds files of no gradjax run (no config.py, saved state or items/); "
         "choose another folder")


def _check_overwritable(out: str) -> None:
  """Exits with one line where ``out`` holds another gradjax program's run: --overwrite replaces
  this program's files (its ``config.py`` among them), never another's record."""
  mine, command = program(), recorded_command(out)
  if command and command[0] == "gradjax" and mine[0] == "gradjax" and command[:2] != mine[:2]:
    fail(f"--overwrite: {out} holds a run of {shlex.join(command[:2])}, not of {shlex.join(mine)}; "
         "--overwrite replaces a run of the same program only: choose another folder")


def output_folder(default: str, own: tuple[str, ...] = ()) -> str:
  """Claims the run's folder before any data is loaded or anything compiled, and checks that it is
  writable. ``default``: the folder's name under ``runs/`` (from what is attacked). ``own``: glob
  patterns of this program's files, replaced with --overwrite (:func:`_set_aside`).

  A folder that holds files is never written into unless --overwrite or --resume says so; without
  --output_dir the first free ``runs/<default>[-k]`` is taken (with --resume: the latest holding a
  saved state). In a run over several processes process 0 claims it and the others take its choice
  (:func:`gradjax.cli.distributed.agree`)."""
  return distributed.agree(lambda: _claim_output_folder(default, own))


def _taken(out: str, resumable: bool) -> str:
  """The line that refuses an ``--output_dir`` holding files, naming what it holds and what may be
  done: another program's run is never written into; this program's may be replaced or continued;
  a user's own files stay beside this program's results with --overwrite."""
  command = recorded_command(out) if os.path.isdir(out) else None
  if os.path.isdir(out) and (live := running(out)):
    return f"--output_dir {out} is being written by {live}, which is still running; choose another folder"
  if command and command[0] == "gradjax" and command[:2] != program()[:2]:
    return f"--output_dir {out} holds a run of {shlex.join(command[:2])}; choose another folder"
  if command:
    # A run stopped before it saved anything (killed at its start) leaves only its claim: nothing
    # to continue.
    saved = bool(
        os.path.exists(os.path.join(out, "config.py")) or os.path.isdir(os.path.join(out, "items"))
        or glob.glob(os.path.join(glob.escape(out), "**", "*" + STATE_FILE), recursive=True))
    return (f"--output_dir {out} holds a run of {shlex.join(command[:2])}"
            f"{' that saved nothing to continue' if resumable and not saved else ''}; pass "
            f"--overwrite to replace it{', --resume to continue it' if resumable and saved else ''}, "
            "or choose another folder")
  names = sorted(e.name for e in os.scandir(out)) if os.path.isdir(out) else []
  shown = [n for n in names if not n.startswith(".")] or names
  if not shown:
    return f"--output_dir {out} holds another run's files; choose another folder"
  return (f"--output_dir {out} holds files: {', '.join(shown[:3])}{', ...' if len(shown) > 3 else ''}; "
          "pass --overwrite to write there (this program's results are replaced, other files kept), "
          "or choose another folder")


def _claim_output_folder(default: str, own: tuple[str, ...]) -> str:
  global _INTERRUPTED
  _INTERRUPTED = False  # (several commands in one process: a test's)
  f = flags.FLAGS
  resuming = "resume" in f and f.resume
  if "save_every_s" in f and f.save_every_s < 0:
    fail(f"--save_every_s must be non-negative, got {f.save_every_s}")
  if resuming and f.overwrite:
    fail("--resume continues a run and --overwrite replaces one; give one of them")
  if f.output_dir:
    out = f.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
      fail(f"--output_dir {out} is a file, not a folder")
    taken = _taken(out, "resume" in f)
    if _holds_files(out) and not (f.overwrite or resuming):
      fail(taken)
    if resuming or f.overwrite:
      _check_not_running(out)
    if resuming:
      _check_resumable(out, own)
    elif f.overwrite:
      _check_overwritable(out)
  else:
    base = os.path.join("runs", default)
    if resuming:
      suffixed = sorted(glob.glob(glob.escape(base) + "-*"),
                        key=lambda d: int(d[len(base) + 1:]) if d[len(base) + 1:].isdigit() else -1)
      saved = [d for d in [base] + suffixed
               if glob.glob(os.path.join(glob.escape(d), "**", "*" + STATE_FILE), recursive=True)]
      if not saved:
        fail(f"--resume: no interrupted run under {base}[-k] holds a saved state; give --output_dir")
      out = saved[-1]
      _check_not_running(out)
    else:
      out = None
  candidates = [out] if out is not None else [base] + [f"{base}-{k}" for k in range(2, 10_000)]
  for out in candidates:
    if len(candidates) > 1 and _holds_files(out):
      continue
    created = not os.path.exists(out)
    try:
      os.makedirs(out, exist_ok=True)
      with tempfile.TemporaryFile(dir=out):
        pass
      claimed = _claim(out, exclusive=not (f.overwrite or resuming), keep=resuming)
    except OSError as e:
      fail(f"cannot write to the output folder {out}: {e.strerror or e}")
    if claimed:
      break
    if len(candidates) == 1:  # another run claimed it since it was found free
      fail(taken)
  atexit.register(_leave, out, created, own)
  _CLAIMED[:] = [(out, created)]  # what fail() leaves, where it ends the process without exit handlers
  if f.overwrite:
    _set_aside(out, own)
  elif resuming:
    atexit.register(_drop_replaced, out, own)
  print(f"writing to {out}", flush=True)  # stdout: a later error is the one line on stderr
  return out


_CLAIMED: list[tuple[str, bool]] = []  # this run's folder, and whether it created it


def _leave(out: str, created: bool, own: tuple[str, ...] = ()) -> None:
  """At exit: the claim is removed where the folder's ``config.py`` records the command (a finished
  run's), where the program wrote a file of its own but a saved state (a benchmark's results, which
  write no ``config.py``) or where the run wrote nothing else; the folder too where the run created
  it and it is empty then."""
  if not os.path.isdir(out):
    return
  if (os.path.exists(os.path.join(out, "config.py")) or _results(out, own)
      or [e.name for e in os.scandir(out)] == [CLAIM]):
    _release_claim(out)
  if created and not any(os.scandir(out)):
    with contextlib.suppress(OSError):  # another run claimed it meanwhile
      os.rmdir(out)


def _set_aside(out: str, own: tuple[str, ...]) -> None:
  """--overwrite: this program's files and states in ``out`` (not its subfolders' but those its
  patterns name, e.g. ``items/*``) are moved into a hidden folder there, and at exit either
  removed, if the new run wrote any of its own files but ``config.py`` (results or a saved state),
  or moved back, if it wrote none: a run that fails before its first result (a bad index, a
  dataset that does not load) leaves the earlier run as it was."""
  folders = sorted(p for pattern in own for p in _found(out, pattern) if os.path.isdir(p))
  if folders:
    fail(f"--overwrite: {folders[0]} is a folder where the program writes its file; move it away")
  held = sorted({p for pattern in own + (_states(own),) for p in _found(out, pattern) if os.path.isfile(p)})
  if not held:
    return
  aside = tempfile.mkdtemp(prefix=".overwritten-", dir=out)
  names = [os.path.relpath(p, out) for p in held]
  for name in names:
    os.makedirs(os.path.dirname(os.path.join(aside, name)), exist_ok=True)
    os.replace(os.path.join(out, name), os.path.join(aside, name))

  def settle():
    results, states = _results(out, own), _found(out, _states(own))
    if not results and not states:  # nothing of the new run's but its configuration: the earlier run comes back
      for path in (p for pattern in own for p in _found(out, pattern)):
        if os.path.isfile(path):
          os.remove(path)
      for name in names:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        os.replace(os.path.join(aside, name), os.path.join(out, name))
    elif _INTERRUPTED or not results:  # stopped before its last result
      print(f"the run it replaces is kept in {aside} until a run in this folder finishes",
            file=sys.stderr)
      return
    shutil.rmtree(aside, ignore_errors=True)
    _drop_replaced(out, own)  # runs an earlier interrupted --overwrite kept aside too

  atexit.register(settle)


def _drop_replaced(out: str, own: tuple[str, ...]) -> None:
  """At the exit of a run (resumed, or one that replaced another): where it finished (results
  written, no saved state left), the runs that interrupted --overwrites kept aside
  (:func:`_set_aside`) are removed."""
  if _INTERRUPTED or _found(out, _states(own)) or not _results(out, own):
    return
  for aside in _found(out, ".overwritten-*"):
    shutil.rmtree(aside, ignore_errors=True)


def state_file(out: str) -> resume.StateFile:
  """Where a run in ``out`` keeps its solver state, per the --save_every_s and --resume flags."""
  f = flags.FLAGS
  return resume.StateFile(os.path.join(out, STATE_FILE), f.save_every_s, f.resume)


def items(out: str) -> campaign.Items:
  """The store of a table program's experiments in ``out``, per the --resume and --save_every_s flags,
  over this run's processes (:class:`gradjax.run.campaign.Items`)."""
  f = flags.FLAGS
  try:
    return campaign.Items(out, resume=f.resume, save_every_s=f.save_every_s, peers=distributed,
                          interrupted=lambda e: interrupted(e, out))
  except ValueError as e:
    fail(str(e))


def plan(items: campaign.Items, experiments: list) -> bool:
  """:meth:`gradjax.run.campaign.Items.plan`, its refusals one line and exit 2."""
  try:
    return items.plan(experiments)
  except ValueError as e:
    fail(str(e))


def permutation_seed(value: int, flag: str) -> int | None:
  """A data-permutation flag's value for :func:`gradjax.training.split`: -1 means the file order
  (None); other negative values are an error."""
  if value < -1:
    raise ValueError(f"--{flag} must be >= 0 or -1 (file order), got {value}")
  return None if value == -1 else value


def resume_command(out: str | None) -> str:
  """The command line as typed, made to continue the run in ``out``: ``--resume --output_dir=out``
  in place of any --resume, --overwrite or --output_dir given (``out`` None: ``--resume`` only, for
  a program that writes into a folder of its input, like ``audit``)."""
  args, skip = [], False
  for a in sys.argv[1:]:
    name = a.split("=")[0]
    if skip:
      skip = False
    elif name in ("--resume", "--noresume", "--overwrite", "--nooverwrite"):
      continue
    elif name == "--output_dir" and out is not None:
      skip = "=" not in a
    else:
      args.append(a)
  return shlex.join([*program(), *args, "--resume", *([] if out is None else [f"--output_dir={out}"])])


_INTERRUPTED = False  # a signal stopped this run (interrupted): what --overwrite set aside stays


def interrupted(e: resume.Interrupted, out: str):
  """One line for a run a signal stopped, naming the command that continues it, and exit code
  128 + the signal's number (130 for Ctrl-C)."""
  global _INTERRUPTED
  _INTERRUPTED = True
  # The state is saved: what is left is leaving, which a second signal would only break off (a
  # traceback from an exit handler), not hasten.
  resume.ignore_further_signals()
  if e.path is None:
    print(f"interrupted at iteration {e.iteration}; the state could not be saved, so the run starts "
          "afresh next time", file=sys.stderr)
  else:
    print(f"interrupted at iteration {e.iteration}; resume with: {resume_command(out)}",
          file=sys.stderr)
  if distributed.process_count() > 1:  # the others stop too (a process waiting for this one's work)
    distributed.fail(f"interrupted at iteration {e.iteration}", 128 + e.signum)
  sys.exit(128 + e.signum)


def _one_line_keyboard_interrupt(kind, value, tb):
  if issubclass(kind, KeyboardInterrupt):
    print("interrupted", file=sys.stderr)
    return
  sys.__excepthook__(kind, value, tb)


def fail(message: str):
  """One-line error on stderr and exit code 2 (bad flags or data). In a run over several processes a
  collective that failed because another process stopped names that process instead (exit 1), and
  any other error is posted to the other processes, which stop naming this one."""
  if distributed.process_count() > 1 and distributed.is_collective_failure(message):
    distributed.lost_peer(message)
  if distributed.process_count() > 1:
    for claimed in _CLAIMED:  # distributed.fail leaves without the exit handlers
      _leave(*claimed)
    distributed.fail(message, 2, line=f"error: {message}")
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv):
  """absl flag parser that reports bad flags in one line with exit code 2, then applies the process
  settings: the persistent compilation cache and the run over several processes (the launch flags,
  :mod:`gradjax.cli.distributed`)."""
  argv = [_config_path(a) for a in config_first(argv)]
  given = [a.removeprefix("--config=") for a in argv[1:] if a.startswith("--config=")]
  if given:  # file.py, or file.py:arg (get_config(arg)'s variant)
    file = _file_of(given[-1])
    if os.path.isdir(file):
      fail(f"--config: {file} is a folder; give a Python file's path or a packaged configuration's "
           f"name ({', '.join(configs.NAMES)})")
    if not os.path.exists(file):
      fail(f"--config: no file {file} (from {os.getcwd()}); give a packaged configuration's name "
           f"({', '.join(configs.NAMES)}) or a Python file's path")
  if not given and any(a.startswith("--config.") for a in argv[1:]) and "config" in flags.FLAGS:
    # --config.<path> overrides the program's configuration (else the defaults), named here so
    # that ml_collections reads the overrides when it parses it, in every process that parses flags.
    argv = [argv[0], f"--config={configs.path(DEFAULT_CONFIG[0] if DEFAULT_CONFIG else 'defaults')}",
            *argv[1:]]
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:  # from the default's own parse
      delattr(flags.FLAGS, name)
  if any(a in ("--help", "-h", "-?", "--helpshort") for a in argv[1:]):
    print(grouped_help())
    sys.exit(0)
  quiet = _Quiet()  # ml_collections' warnings while it reads the file: the error line says it
  logging.get_absl_logger().addFilter(quiet)
  try:
    argv = flags.FLAGS(argv)
    f = flags.FLAGS
    if "config" in f and f.config is not None:
      f.config.to_dict()  # config_flags reads the file (and applies --config.<path>) only when asked
    elif given and "config" in f:
      raise AttributeError("'NoneType' object has no attribute 'to_dict'")
  except flags.Error as e:
    fail(_config_error(e, given) if "Error whilst parsing config file" in str(e) else str(e))
  except SystemExit as e:  # --helpfull prints every module's flags, then absl exits 1
    if "--helpfull" not in argv[1:] and given:  # the --config file's own sys.exit()
      fail(f"--config={given[-1]}: get_config() exited (code {e.code!r}) instead of returning the options")
    sys.exit(0 if "--helpfull" in argv[1:] else e.code)
  except Exception as e:  # the --config file's own code, what it returned, or an override
    fail(_config_error(e, given))
  finally:
    logging.get_absl_logger().removeFilter(quiet)
  sys.excepthook = _one_line_keyboard_interrupt  # Ctrl-C where nothing is saved: no traceback
  for name in f:  # every float flag of every program: a NaN or inf is caught here, not after a run
    value = f[name].value
    if isinstance(value, float) and not np.isfinite(value):
      fail(f"--{name} must be a finite number, got {value}")
  if "tpu" not in os.environ.get("JAX_PLATFORMS", "").split(","):
    # JAX probes for a TPU runtime and logs "Unable to initialize backend 'tpu'" when there is none.
    py_logging.getLogger("jax._src.xla_bridge").setLevel(py_logging.WARNING)
  if "compilation_cache" in f:
    if f.compilation_cache and os.path.exists(f.compilation_cache) and not os.path.isdir(f.compilation_cache):
      fail(f"--compilation_cache {f.compilation_cache} is a file, not a folder")
    if f.compilation_cache and f["compilation_cache"].present:  # JAX only warns where it cannot write
      try:
        os.makedirs(f.compilation_cache, exist_ok=True)
        with tempfile.TemporaryFile(dir=f.compilation_cache):
          pass
      except OSError as e:
        fail(f"cannot write to the --compilation_cache folder {f.compilation_cache}: "
             f"{e.strerror or e} ('' disables the cache)")
    if not f.compilation_cache_min_secs >= 0:
      fail(f"--compilation_cache_min_secs must be a number of seconds >= 0, got "
           f"{f.compilation_cache_min_secs}")
    compilation.use_persistent_cache(f.compilation_cache, f.compilation_cache_min_secs)
  _launch()
  return argv


class _Quiet(py_logging.Filter):
  """Drops ml_collections' log records (its configuration file reader's warnings)."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    return "ml_collections" not in record.pathname


def _config_error(e: Exception, given: list[str]) -> str:
  """One line for a ``--config`` that gave no configuration: the file's syntax error, the exception
  its ``get_config()`` raised (ml_collections passes some on as a traceback in a flag error's text:
  its last line), no ``get_config``, a value that is not a configuration, or a bad override."""
  where = f"--config={given[-1]}" if given else "--config"
  if isinstance(e, SyntaxError):
    at = f"{e.filename} line {e.lineno}: " if e.lineno is not None else ""  # none for NUL bytes
    return (f"{where}: {at}{e.msg} (a configuration is a Python file whose get_config() returns the "
            "options)")
  text = str(e).replace("\\n", "\n").replace("\\'", "'").replace("config_config", "")
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if isinstance(e, flags.Error):
    return f"{where}: " + (lines[-1] if any(line.startswith("Traceback") for line in lines)
                           else " ".join(lines))
  if isinstance(e, AttributeError) and "attribute 'get_config'" in text:
    return f"{where}: the file defines no get_config() (it returns the options)"
  if isinstance(e, AttributeError) and "attribute 'to_dict'" in text:
    kind = text.split("'")[1] if text.count("'") >= 2 else "something else"
    return (f"{where}: get_config() returned {kind}, not a configuration (return "
            "gradjax.run.config.defaults() with your changes)")
  missing = e.args[0] if isinstance(e, AttributeError) and e.args else e  # ml_collections wraps it
  if isinstance(missing, KeyError) and missing.args and isinstance(missing.args[0], str):
    # An override's unknown section or option; ml_collections adds a line with its guess.
    first, _, rest = missing.args[0].partition("\n")
    name = first.strip("'\"\\")
    guess = re.search(r'Did you mean "([^"]+)"', rest)
    named = [a.split("=")[0] for a in sys.argv[1:]
             if a.startswith("--config.") and name in a.split("=")[0].split(".")]
    return (f"{named[0] if named else where}: no section or option {name!r} ("
            + (f"did you mean {guess.group(1)!r}? " if guess else "") + "--help lists the options)")
  if isinstance(e, (OSError, KeyError, TypeError, ValueError, AttributeError)):
    return f"{where}: " + " ".join(line.strip("'") for line in lines)
  return f"{where}: get_config() failed: {type(e).__name__}: {' '.join(lines)}"


def config_first(argv: list[str]) -> list[str]:
  """``argv`` with its ``--config=`` flags first (after the program): ml_collections refuses a
  ``--config.<path>`` given before ``--config``, when it defines the flags as well as later."""
  return [argv[0], *(a for a in argv[1:] if a.startswith("--config=")),
          *(a for a in argv[1:] if not a.startswith("--config="))]


def _config_path(arg: str) -> str:
  """``--config=dlg`` -> ``--config=<gradjax/configs/dlg.py>`` (a packaged configuration's name);
  other arguments as they are."""
  value = arg.removeprefix("--config=")
  name, variant = value.split(":", 1) if ":" in value else (value, None)
  if value != arg and name in configs.NAMES and not os.path.exists(value):
    return f"--config={configs.path(name)}" + (f":{variant}" if variant is not None else "")
  return arg


def grouped_help() -> str:
  """``--help``: the program's docstring, then every option it reads by section of the configuration
  (:mod:`gradjax.run.config`; its short flag, else ``--config.<path>``), then the program's own flags
  and the process settings."""
  by_module = flags.FLAGS.flags_by_module_dict()
  # The short flags of define_fields (a program without --config) are listed as its own.
  own = [g for g in by_module if (g != _OPTIONS or not FIELDS) and not g.startswith("absl")
         and g != __name__]
  doc = PROGRAM_DOC[0] if PROGRAM_DOC else sys.modules["__main__"].__doc__
  parts = [(doc or "").strip(), ""]
  if DEFAULT_CONFIG:
    parts += [f"Options not given take the values of --config={DEFAULT_CONFIG[0]} "
              f"({configs.path(DEFAULT_CONFIG[0])}); --print_config shows them.", ""]
  if FIELDS:
    parts += ["Every option is --config.<section>.<key>=VALUE; the common ones have a short flag too.",
              ""]
  sections = {}
  for path in FIELDS:
    sections.setdefault(config.section(path) or "experiment", []).append(path)
  packaged = config.given(configs.get(DEFAULT_CONFIG[0])) if DEFAULT_CONFIG else {}
  for name, paths in sections.items():
    parts.append(f"{name} options:")
    for path in paths:
      parts += _option_help(path, packaged)
    parts.append("")
  for group in own + [__name__]:
    if group in by_module:  # the flags the group defines (not those a module adopted: listed once)
      # A named group (the launch flags) keeps its name; a module's own flags are the program's.
      title = "run settings" if group == __name__ else group if " " in group else "program options"
      parts.append(f"{title}:")
      for flag in sorted(by_module[group], key=lambda fl: fl.name):
        parts += _flag_help(flag)
      parts.append("")
  parts.append("--helpfull lists absl's own flags too.")
  return "\n".join(parts)


def _flag_help(flag: flags.Flag) -> list[str]:
  """A flag's lines of ``--help``, in the form of :func:`_option_help`."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  default = "" if flag.default is None else f" (default: {flag.default_as_str})"
  return textwrap.wrap(f"{name}: {flag.help}{default}", 100, initial_indent="  ",
                       subsequent_indent="    ", break_on_hyphens=False)


def _option_help(path: str, packaged: dict[str, Any]) -> list[str]:
  """Option ``path``'s lines of ``--help``: its flags, its help and the default this program runs
  (``packaged``: its packaged configuration's options; a program of captures takes the model and
  the data from their files), wrapped as absl's."""
  field = config.option(path)
  names = ([f"--{config.alias(path)}"] if config.alias(path) else []) + [f"--config.{path}"]
  choices = field.metadata["choices"]
  head = ", ".join(names) + (f": <{'|'.join(choices)}>" if choices else ":")
  value = packaged.get(path, field.default)
  if CAPTURED and path in _FROM_CAPTURES:
    default = f" (default: {_FROM_CAPTURES[path]})"
  else:
    default = "" if value is None else f" (default: {value!r})"
  return textwrap.wrap(f"{head} {field.metadata['help']}{default}", 100, initial_indent="  ",
                       subsequent_indent="    ", break_on_hyphens=False)
