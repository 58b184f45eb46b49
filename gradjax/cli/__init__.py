"""The ``gradjax`` command: ``gradjax <command> [flags]`` (also ``python -m gradjax``).

Each command is a module of this package with a ``main(argv)``, its flags defined when it is
imported; only the command asked for is imported, so each has its own flags and ``--help``.
"""

import importlib
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
  absl. The benchmark programs, outside the installed package, share it (``python -m benchmarks``)."""
  argv = sys.argv if argv is None else argv
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage(program, commands))
    sys.exit(0 if len(argv) >= 2 else 2)
  name = argv[1]
  if name not in commands:
    print(f"error: unknown command {name!r}; choose one of {', '.join(commands)}", file=sys.stderr)
    sys.exit(2)
  from absl import app

  from gradjax.cli import common
  # Before the command's flags are defined: ml_collections reads --config.<path> flags from sys.argv.
  sys.argv = common.config_first([f"{program} {name}", *argv[2:]])
  module = importlib.import_module(f"{package}.{commands[name][0]}")
  common.PROGRAM[:] = [program, name]
  common.PROGRAM_DOC[:] = [module.__doc__ or ""]
  app.run(module.main, argv=sys.argv, flags_parser=common.parse_flags)
