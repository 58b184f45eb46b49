"""The package by layer: below the command line (gradjax.cli) no module imports absl's flags, the
command line or the benchmark programs, ends the process (os._exit, sys.exit) or reaches into JAX's
private modules; read from the sources' syntax trees."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "gradjax")


def _library_modules():
  for folder, dirs, files in os.walk(PACKAGE):
    dirs[:] = [d for d in dirs if d not in ("cli", "__pycache__")]
    for name in files:
      if name.endswith(".py") and not (folder == PACKAGE and name == "__main__.py"):  # the command
        yield os.path.relpath(os.path.join(folder, name), ROOT)


def _offences(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
    tree = ast.parse(fh.read(), path)
  found = []
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      if name.split(".")[0] in ("absl", "benchmarks") or any(
          name == top or name.startswith(top + ".") for top in ("gradjax.cli", "jax._src")):
        found.append(f"{path}:{node.lineno} imports {name}")
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and (node.value.id, node.attr) in (("os", "_exit"), ("sys", "exit"))):
      found.append(f"{path}:{node.lineno} calls {node.value.id}.{node.attr}")
  return found


def test_the_library_stays_below_the_command_line():
  modules = list(_library_modules())
  assert "gradjax/processes.py" in modules and "gradjax/attacks.py" in modules
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
