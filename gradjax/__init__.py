"""gradjax: gradient inversion attacks on federated learning, in JAX.

The package by layer (README, "How it is built"): the attack core in ``gradjax`` and ``gradjax.models``;
the run around it in ``gradjax.run``; ``gradjax.integrations``; the command line in ``gradjax.cli``.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# Modules that moved into a layer's folder answer to their old names too (``from gradjax.flower import
# leakage_mod``, ``from gradjax import config``): the old name is the same module object as the new one.
MOVED = {
    "gradjax.config": "gradjax.run.config",
    "gradjax.pipeline": "gradjax.run.pipeline",
    "gradjax.resume": "gradjax.run.resume",
    "gradjax.report": "gradjax.run.report",
    "gradjax.processes": "gradjax.run.processes",
    "gradjax.audit": "gradjax.integrations.audit",
    "gradjax.flower": "gradjax.integrations.flower",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports a moved module under its old name, as the one module object of its new name."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

  def create_module(self, spec):
    module = importlib.import_module(MOVED[spec.name])
    spec.loader_state = module.__spec__  # the import system sets the old name's spec on the module
    return module

  def exec_module(self, module):
    module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
  sys.meta_path.append(_OldNames())


def lazy_submodules(package: str):
  """A package's module-level ``__getattr__``: ``package.name`` imports the submodule ``name`` on
  first use, so that the docstrings' ``gradjax.models.create(...)`` works after a plain
  ``import gradjax``, which itself imports nothing heavy."""

  def getattr_(name: str):
    if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
      return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  return getattr_


__getattr__ = lazy_submodules(__name__)
