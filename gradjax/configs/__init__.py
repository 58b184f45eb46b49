"""Experiment configurations, one per paper protocol: ``--config=<name>`` (or a file's path).

Each module's ``get_config()`` returns the nested options of :mod:`gradjax.run.config`, starting from
:func:`gradjax.run.config.defaults`, and says where its settings come from.
"""

import importlib
import os

FOLDER = os.path.dirname(__file__)
NAMES = tuple(sorted(f[:-3] for f in os.listdir(FOLDER) if f.endswith(".py") and f != "__init__.py"))


def path(name: str) -> str:
  """The file of configuration ``name`` (one of ``NAMES``)."""
  if name not in NAMES:
    raise ValueError(f"unknown configuration {name!r}; choose one of {', '.join(NAMES)} or give a file")
  return os.path.join(FOLDER, f"{name}.py")


def get(name: str):
  """The ``ConfigDict`` of packaged configuration ``name``."""
  path(name)
  return importlib.import_module(f"{__name__}.{name}").get_config()
