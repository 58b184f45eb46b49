"""The package by layer: below the command line (gradjax.cli) no module imports absl's flags, the
command line or the benchmark programs, ends the process (os._exit, sys.exit) or reaches into JAX's
private modules; each folder imports only the layers below it (the core, then gradjax.run, then
gradjax.integrations); read from the sources' syntax trees."""

import ast
import importlib
import importlib.util
import os
import subprocess
import sys

import gradjax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "gradjax")


def _library_modules():
  for folder, dirs, files in os.walk(PACKAGE):
    dirs[:] = [d for d in dirs if d not in ("cli", "__pycache__")]
    for name in files:
      if name.endswith(".py") and not (folder == PACKAGE and name == "__main__.py"):  # the command
        yield os.path.relpath(os.path.join(folder, name), ROOT)


def _tree(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
    return ast.parse(fh.read(), path)


def _offences(path):
  found = [f"{path}:{line} imports {name}" for line, name in _imported(path)
           if name.split(".")[0] in ("absl", "benchmarks") or any(
               name == top or name.startswith(top + ".") for top in ("gradjax.cli", "jax._src"))]
  for node in ast.walk(_tree(path)):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and (node.value.id, node.attr) in (("os", "_exit"), ("sys", "exit"))):
      found.append(f"{path}:{node.lineno} calls {node.value.id}.{node.attr}")
  return found


def test_the_library_stays_below_the_command_line():
  modules = list(_library_modules())
  assert "gradjax/run/processes.py" in modules and "gradjax/attacks.py" in modules
  offences = [o for path in modules for o in _offences(path)]
  assert not offences, "\n".join(offences)


def test_the_check_sees_what_it_forbids(tmp_path):
  """The walker itself: each forbidden form is reported (an independent sample, not the package)."""
  sample = tmp_path / "sample.py"
  sample.write_text("import os, sys\nfrom absl import flags\nfrom jax._src import distributed\n"
                    "from gradjax.cli import common\nos._exit(1)\nsys.exit(2)\n")
  found = _offences(str(sample))
  assert [f.split(" ", 1)[1] for f in found] == [
      "imports absl", "imports absl.flags", "imports jax._src", "imports jax._src.distributed",
      "imports gradjax.cli", "imports gradjax.cli.common", "calls os._exit", "calls sys.exit"]


# What each folder of the package may not import: the layers above it.
ABOVE = {
    "core": ("gradjax.run", "gradjax.integrations", "gradjax.configs", "gradjax.cli"),
    "run": ("gradjax.integrations", "gradjax.configs", "gradjax.cli"),
    "integrations": ("gradjax.configs", "gradjax.cli"),
    "configs": ("gradjax.integrations", "gradjax.cli"),
}


def _layer(path):
  parts = path.split(os.sep)
  return parts[1] if len(parts) > 2 and parts[1] in ABOVE else "core"


def _imported(path):
  """(line, module) for every module ``path`` imports, ``from gradjax import x`` read as gradjax.x."""
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.Import):
      yield from ((node.lineno, a.name) for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.lineno, node.module
      yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)


def _layer_offences(path, layer=None):
  above = ABOVE[layer or _layer(path)]
  found = []
  for line, name in _imported(path):
    if any(name == top or name.startswith(top + ".") for top in above):
      found.append(f"{path}:{line} imports {name}, a layer above it")
    if name in gradjax.MOVED:
      found.append(f"{path}:{line} imports {name}, the old name of {gradjax.MOVED[name]}")
  return found


def test_each_folder_imports_only_the_layers_below_it():
  modules = list(_library_modules())
  layers = {_layer(path) for path in modules}
  assert layers == set(ABOVE), layers
  offences = [o for path in modules for o in _layer_offences(path)]
  assert not offences, "\n".join(offences)


# Where Flax's linen may be imported: the model zoo (its gradjax.models.taps is how the rest reads a
# forward pass's module calls) and the modules that build networks of their own (LPIPS's, the
# malicious server's imprint). The attacks read any model through apply_fn and variables.
LINEN = ("gradjax/models/", "gradjax/lpips.py", "gradjax/malicious.py")


def _linen_offences(path):
  return [f"{path}:{line} imports {name}" for line, name in _imported(path)
          if name == "flax.linen" or name.startswith("flax.linen.")]


def test_the_attacks_read_models_without_flax():
  modules = [path.replace(os.sep, "/") for path in _library_modules()]
  assert "gradjax/models/taps.py" in modules and _linen_offences("gradjax/models/taps.py")
  offences = [o for path in modules if not path.startswith(LINEN) for o in _linen_offences(path)]
  assert not offences, "\n".join(offences)


def test_the_layer_check_sees_what_it_forbids(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("from gradjax import attacks, config\nfrom gradjax.run import pipeline\n"
                    "import gradjax.integrations.audit\n")
  assert [f.split(" ", 1)[1] for f in _layer_offences(str(sample), "core")] == [
      "imports gradjax.config, the old name of gradjax.run.config",
      "imports gradjax.run, a layer above it", "imports gradjax.run.pipeline, a layer above it",
      "imports gradjax.integrations.audit, a layer above it"]
  assert _layer_offences(str(sample), "integrations") == [
      f"{sample}:1 imports gradjax.config, the old name of gradjax.run.config"]


def test_moved_modules_answer_to_their_old_names():
  """``from gradjax.flower import leakage_mod`` and the like, written before the package had folders."""
  for old, new in gradjax.MOVED.items():
    if new == "gradjax.integrations.flower" and importlib.util.find_spec("flwr") is None:
      continue  # the extra .[flower] is not installed
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == module.__spec__.name == new
  from gradjax import pipeline  # pylint: disable=import-outside-toplevel
  from gradjax.audit import Settings  # pylint: disable=import-outside-toplevel
  assert pipeline.__name__ == "gradjax.run.pipeline" and Settings.__module__ == "gradjax.integrations.audit"


def test_a_plain_import_reaches_the_submodules_on_first_use():
  code = ("import sys, gradjax\n"
          "assert 'gradjax.pickled' not in sys.modules and 'jax' not in sys.modules\n"
          "assert gradjax.pickled.__name__ == 'gradjax.pickled' and gradjax.run.config.__name__ == "
          "'gradjax.run.config' and gradjax.integrations.audit.__name__ == 'gradjax.integrations.audit'\n"
          "try:\n  gradjax.no_such_module\nexcept AttributeError as e:\n  print(e)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "module 'gradjax' has no attribute 'no_such_module'"
