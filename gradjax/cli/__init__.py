"""The ``gradjax`` command: ``gradjax <command> [flags]`` (also ``python -m gradjax``).

Each command is a module of this package with a ``main(argv)``, its flags defined when it is
imported; only the command asked for is imported, so each has its own flags and ``--help``.
"""

import atexit
import importlib
import logging
import os
import signal
import sys

# command -> (module, one line on what it does)
COMMANDS = {
    "reconstruct": ("reconstruct", "reconstruct a client's images or sentences from its update"),
    "sweep": ("sweep", "one attack over a range of images, as a table"),
    "audit": ("audit", "attack every update a recorded federation or a capture folder holds"),
    "defense-sweep": ("defense_sweep", "one attack against a grid of defenses: leak and utility"),
    "train": ("train", "train a model (FedSGD or FedAvg, under a defense) and save checkpoints"),
    "label-accuracy": ("label_accuracy", "iDLG's label inference over many fresh models"),
    "label-recovery": ("label_recovery", "batch label recovery rules on real images"),
    "dlm-table": ("dlm_table", "DLG, cosine, DLM and DLM+ on FedAvg weights (DLM's Table 1)"),
    "text-table": ("text_table", "token recovery from a language model's gradient"),
    "batch-table": ("batch_table", "batch inversion on a trained BatchNorm network"),
}


def usage(program: str = "gradjax", commands: dict = COMMANDS) -> str:
  width = max(map(len, commands))
  lines = [f"usage: {program} <command> [flags]   ({program} <command> --help lists its flags)", "",
           "commands:"]
  lines += [f"  {name:<{width}}  {what}" for name, (_, what) in commands.items()]
  return "\n".join(lines)


def main(argv: list[str] | None = None, *, program: str = "gradjax", commands: dict = COMMANDS,
         package: str = "gradjax.cli") -> None:
  """Runs ``<program> <command> [flags]``: the command's module (in ``package``) ``main`` under
  absl. The benchmark programs, outside the installed package, share it (``python -m benchmarks``).

  Called without ``argv`` (the ``gradjax`` script, ``python -m gradjax``), the process ends as soon
  as the command does: see :func:`_run_and_leave`."""
  if argv is None:
    return _run_and_leave(lambda: main(sys.argv, program=program, commands=commands, package=package))
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):  # asked for: stdout; missing: stderr
    print(usage(program, commands), file=sys.stdout if len(argv) >= 2 else sys.stderr)
    sys.exit(0 if len(argv) >= 2 else 2)
  name = argv[1]
  if name not in commands:
    print(f"error: unknown command {name!r}; choose one of {', '.join(commands)}", file=sys.stderr)
    sys.exit(2)
  for path in _flagfiles(argv[2:]):  # absl reads them as the flags are defined, with a traceback
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
      print(f"error: --flagfile {path} is not a readable file", file=sys.stderr)
      sys.exit(2)
  from absl import app

  from gradjax.cli import common
  # Before the command's flags are defined: ml_collections reads --config.<path> flags from sys.argv.
  sys.argv = common.config_first([f"{program} {name}", *argv[2:]])
  module = importlib.import_module(f"{package}.{commands[name][0]}")
  if _RECEIVED:  # Ctrl-C while the imports ran (:func:`_run_and_leave`)
    raise KeyboardInterrupt
  from gradjax.run import resume
  resume.interrupt_until_run()  # from here until the run saves on signals, Ctrl-C stops the program
  common.PROGRAM[:] = [program, name]
  common.PROGRAM_DOC[:] = [module.__doc__ or ""]
  app.run(module.main, argv=sys.argv, flags_parser=common.parse_flags)


def _flagfiles(args: list[str]) -> list[str]:
  """The paths that ``--flagfile=PATH`` (or ``--flagfile PATH``) name among ``args``."""
  found = []
  for k, arg in enumerate(args):
    for prefix in ("--flagfile=", "-flagfile="):
      if arg.startswith(prefix):
        found.append(arg[len(prefix):])
    if arg in ("--flagfile", "-flagfile") and k + 1 < len(args):
      found.append(args[k + 1])
  return found


def _run_and_leave(run) -> None:
  """Runs the command (``run()``) and ends the process at its exit without the interpreter's
  teardown. An exit handler registered before any other runs after all of them (the run's own:
  removing an empty output folder, leaving a run of several processes), flushes the output and
  the logs, and exits with the status the interpreter would give: ``sys.exit``'s code (1 for a
  message), 1 after an uncaught exception (printed as usual), 0 otherwise. What it skips is the
  destruction of the modules' objects, which for JAX's on CPU takes 0.8-1.2 s (a jitted one-line
  program ends 0.8 s sooner without it, the README's job 1.2 s). An interrupt (Ctrl-C) before the
  run handles signals itself ends with one line and status 130 (in a run over several processes,
  the others are told: :func:`gradjax.cli.common.parse_flags`' exception hook)."""
  status = []
  if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _remember)  # while the extension modules import, not in them

  def leave():
    if not status:  # interrupted
      return
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):  # a closed pipe or stream
        pass
    logging.shutdown()
    os._exit(status[0])

  atexit.register(leave)
  try:
    run()
  except SystemExit as e:
    status.append(0 if e.code is None else e.code if isinstance(e.code, int) else 1)
    raise
  except BaseException as e:
    peers = sys.modules.get("gradjax.cli.distributed")
    if not _an_interrupt(e) or (peers is not None and peers.process_count() > 1):
      status.append(1)  # (a run over several processes tells the others: its excepthook, which exits)
      raise
    # Ctrl-C where the run does not save on signals itself (resume.stop_on_signals): the imports,
    # the set-up, a program that keeps no state. The exit handlers still run (a claimed folder
    # released, a folder set aside by --overwrite restored).
    print("error: interrupted", file=sys.stderr)
    status.append(130)
    raise SystemExit(130) from None
  status.append(0)


_RECEIVED: list[int] = []  # SIGINT received while the command's modules were imported


def _remember(signum, frame) -> None:
  """SIGINT while the command's modules import: remembered, raised once they are (an exception
  raised inside an extension module's initialisation can crash the interpreter)."""
  del frame
  _RECEIVED.append(signum)


def _an_interrupt(e: BaseException) -> bool:
  """Whether ``e`` is Ctrl-C's KeyboardInterrupt, or an error it caused: one raised inside an
  extension module's import is re-raised as an ImportError whose context is the interrupt."""
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, KeyboardInterrupt):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False
