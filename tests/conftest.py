"""Shared fixtures: real client images (scikit-image photos) and plain NumPy reference implementations.

Tests marked ``isolated`` run in a Python process of their own, one for the isolated tests of a
module: those that import PyTorch or TensorFlow, which keeps their libraries, threads and memory out
of the process that compiles JAX programs; the session fails if either is found loaded in the main
process. (Segfaults of XLA compilations late in CI runs were first blamed on them; the cause was the
number of memory mappings, see ``_release_compiled_programs``.)
"""

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Each pytest-xdist worker on a core of its own when there are as many workers as cores (``-n
# auto``; fewer workers stay free to share a larger machine with other runs), set before JAX's
# backend starts, so that XLA sizes its thread pools for one core and the children a test starts
# stay there too: two workers each running XLA's threads across both cores slow each other.
# Measured with `-n 2` on two cores, one run after the other: the whole suite 1063 s pinned against
# 1188 s unpinned; test_solvers, test_lbfgs, test_compose, test_objectives, test_batch_norm_prior
# and test_fidelity (two runs each, alternated) 128 and 127 s against 151 and 139 s, user time 219
# and 235 s against 261 and 243 s. GRADJAX_TEST_PIN=0 leaves the workers unpinned.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if (_WORKER.startswith("gw") and hasattr(os, "sched_setaffinity")
    and os.environ.get("GRADJAX_TEST_PIN", "1") == "1"):
  _CPUS = sorted(os.sched_getaffinity(0))
  if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")) == len(_CPUS):
    os.sched_setaffinity(0, {_CPUS[int(_WORKER[2:]) % len(_CPUS)]})

# XLA:CPU's older LLVM IR emitters for the fusions of every program the tests compile and that sets
# no compiler options of its own (gradjax's set-up and step programs choose theirs, see
# gradjax.compilation), in this process, its workers and the children it starts: most of the suite's
# CPU time is compilation (measured with jax.monitoring: 1278 of its 2155 in-process CPU seconds),
# and with the fusion emitters the DLG objective's gradient compiles 1.3-1.8 times as long (LeNet
# with each convolution, ResNet-8; one core) into programs that run about as fast (ResNet-8's up to
# a fifth slower, LeNet's with the mixed convolution faster). And LLVM's optimisation level 0 for
# those programs, most of which run a few times in a test: gradjax's step and set-up programs keep
# the levels they choose (their compiler options override these flags). Measured side by side on one
# core each: test_attacks, test_objectives and test_solvers 258 -> 216 s on the same core (206 on
# the other); test_models, test_hfginv, test_text, test_training and test_rgap 685 -> 614 s (on the
# other core); test_permutations, test_verdict, test_lpips, test_training and test_labels 239 -> 178 s.
# (A program that runs once but long, as R-GAP's Jacobians, chooses its options: see gradjax.rgap.)
# And every program, gradjax's too, generated as one LLVM module: XLA:CPU splits a program into 32
# by default to compile the parts in parallel, which on a worker's one core only adds work.
# Measured side by side on the two cores, each configuration once on each: test_attacks,
# test_compose and test_objectives 201 and 214 s -> 175 and 186 s; test_hfginv, test_rgap and
# test_models 225 and 244 s -> 206 and 220 s.
# Set before JAX's backend starts; a flag the caller set is kept.
for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0",
              "--xla_cpu_parallel_codegen_split_count=1"):
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), _flag]).strip()
# And gradjax's optimisation steps compiled as programs that run once (GRADJAX_FAST_COMPILE,
# gradjax.compilation.step_options): a test runs a few dozen iterations, where compiling the step at
# LLVM's level 1 costs more than its faster iterations save. Measured side by side on the two cores:
# test_attacks, test_compose, test_solvers and test_audit 245.9 -> 145.7 s; test_text, test_hfginv,
# test_batch_norm_prior and test_permutations 330.6 -> 268.5 s (the cores swapped). The step's own
# options still run in the tests that name them (test_compilation, test_lbfgs) and in the README's
# command (test_cli.test_reconstruct_writes_metrics_and_grid) and in the tests of long
# optimisations, which ask for them (fixture ``optimised_step``). A value the caller set is kept.
os.environ.setdefault("GRADJAX_FAST_COMPILE", "1")

import jax
import numpy as np
import pytest

from gradjax import data

_ISOLATED = "GRADJAX_TEST_ISOLATED"

# One persistent XLA compilation cache per test run, shared by its pytest-xdist workers and isolated
# child processes: a program compiled by one test module is loaded, not compiled again, by the next
# (jax.clear_caches() after every module empties only the in-memory cache). The quick loop on one
# core: 4:30 without it, 4:07 with it. Removed when the run ends.
_CACHE = os.environ.setdefault(
    "GRADJAX_TEST_XLA_CACHE",
    os.path.join(tempfile.gettempdir(),
                 f"gradjax-tests-xla-{os.getpid()}"))  # workers inherit the run's folder
# The command lines the tests start use it too (gradjax.compilation.DEFAULT_CACHE), not the user's
# ~/.cache/gradjax/xla: a test run leaves nothing there, and a cache the developer's own runs warmed
# does not hide what a fresh one (CI's) compiles. (Measured: no faster than separate caches.)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


_SESSION = []


def pytest_sessionstart(session):
  _SESSION.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """The run's own process removes the run's compilation cache. An isolated test's child process
  ends here, its report written, without the interpreter's teardown (destroying JAX's and
  PyTorch's objects takes about a second)."""
  if not hasattr(config, "workerinput") and not os.environ.get(_ISOLATED):  # the run's own process
    shutil.rmtree(_CACHE, ignore_errors=True)
  if os.environ.get(_ISOLATED) and _SESSION:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_SESSION[0].exitstatus))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
  """The tests marked ``slow`` first, in their order, then the others: pytest-xdist hands tests out
  in this order, so the longest start early and the run ends on short ones, not on one worker
  finishing a two-minute test while the other waits. The isolated tests of a module form one
  ``xdist_group``: ``--dist=loadgroup`` (pyproject.toml) sends them to one worker, which runs them
  in one child process (:func:`pytest_pyfunc_call`)."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
  for item in items:
    if item.get_closest_marker("isolated") is not None:
      item.add_marker(pytest.mark.xdist_group(_isolated_group(item)))
  result = yield  # pytest-xdist's worker names each test's group in its node id ("<id>@<group>")
  # ... in the attribute that pytest < 9.2 read; from 9.2 the node id is structured and the group
  # never reaches the scheduler (pytest-xdist issue 1386): name it there too. Where that fails, the
  # isolated tests run one child each (_grouped).
  for item in items:
    named = getattr(item, "_nodeid", None)
    if (item.get_closest_marker("isolated") is not None and isinstance(named, str)
        and named != item.nodeid and hasattr(item, "_id")):
      path, *names = named.split("::")  # the group after the parameters: names, not parameters
      try:
        item._id = type(item._id)(path=path, names=tuple(names))
      except (TypeError, ValueError):  # another pytest's node ids: ungrouped (_grouped)
        pass
  return result


def _grouped(item) -> bool:
  """Whether the other isolated tests of ``item``'s module run in this process: without
  pytest-xdist, or where its scheduler sees their group."""
  return (not os.environ.get("PYTEST_XDIST_WORKER")
          or item.nodeid.endswith("@" + _isolated_group(item)))


def _isolated_group(item) -> str:
  return "isolated-" + item.path.stem


# A third of the kernel's default limit on a process's memory mappings (vm.max_map_count, 65530).
_MAX_MAPPINGS = 20_000


def _mappings() -> int | None:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux
    return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Clears JAX's compilation caches after a test module once the process holds more than
  ``_MAX_MAPPINGS`` memory mappings (after every module where they cannot be counted). Each XLA:CPU
  executable holds about six (measured: 300 small programs added 1866, ``jax.clear_caches()``
  released them); the whole suite in one process reached the kernel's limit of 65530, and the next
  compilation segfaulted in CI. Clearing after every module instead cost the quick loop about 8 %:
  the next module compiled or loaded again the programs they share."""
  yield
  count = _mappings()
  if count is None or count > _MAX_MAPPINGS:
    jax.clear_caches()
    gc.collect()


def pytest_sessionfinish(session, exitstatus):
  """Fails the run if a test loaded PyTorch or TensorFlow into the main process (mark it isolated)."""
  loaded = [m for m in ("torch", "tensorflow") if m in sys.modules]
  if loaded and not os.environ.get(_ISOLATED):
    print(f"\nerror: {' and '.join(loaded)} loaded in the main pytest process; mark the test that "
          "imports it @pytest.mark.isolated", file=sys.stderr)
    session.exitstatus = 1


# Where an isolated test's child process writes its reports (JSON lines), and what the children
# reported of the tests this process has yet to run.
_ISOLATED_REPORTS = "GRADJAX_TEST_ISOLATED_REPORTS"
_REPORTED: dict[str, list[dict]] = {}


def _plain_id(item) -> str:
  """The item's node id without the ``@group`` pytest-xdist appends under ``--dist=loadgroup``."""
  return item.nodeid.removesuffix("@" + _isolated_group(item))


def pytest_runtest_logreport(report):
  """In an isolated tests' child process, each phase's outcome for the process that started it."""
  path = os.environ.get(_ISOLATED_REPORTS)
  if not path or not os.environ.get(_ISOLATED):
    return
  reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else None
  with open(path, "a") as f:
    f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                        "text": None if report.passed else str(report.longreprtext)[-4000:],
                        "reason": reason}) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """Runs an ``isolated`` test in a child process, ``python -m pytest <node ids>``, with the other
  isolated tests of its module that this process is to run (one start-up, one import of PyTorch,
  programs compiled once; the first of them waits for all), and reports the child's outcome for it:
  pass, skip with its reason, or failure with the child's report."""
  if pyfuncitem.get_closest_marker("isolated") is None or os.environ.get(_ISOLATED):
    return None
  node = _plain_id(pyfuncitem)
  if node not in _REPORTED:
    peers = [_plain_id(i) for i in pyfuncitem.session.items
             if i.path == pyfuncitem.path and i.get_closest_marker("isolated") is not None]
    peers = [n for n in peers if n not in _REPORTED and n != node] if _grouped(pyfuncitem) else []
    with tempfile.TemporaryDirectory() as folder:
      reports = os.path.join(folder, "reports.jsonl")
      proc = subprocess.run(
          [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node, *peers],
          cwd=str(pyfuncitem.config.rootpath), capture_output=True, text=True,
          env={**os.environ, _ISOLATED: "1", _ISOLATED_REPORTS: reports},
          timeout=900 * (1 + len(peers)))
      got = []
      if os.path.exists(reports):
        with open(reports) as f:
          got = [json.loads(line) for line in f]
    out = (proc.stdout + proc.stderr)[-4000:]
    # A child that exited with an error no test reported (it crashed after the tests, or failed
    # outside them) fails them all, as a test the child did not see to its end (it crashed, or did
    # not collect it) fails: with the child's output.
    unexplained = proc.returncode != 0 and not any(r["outcome"] == "failed" for r in got)
    for n in (node, *peers):
      mine = [r for r in got if r["nodeid"] == n]
      if unexplained or not any(r["when"] == "call" or r["outcome"] != "passed" for r in mine):
        mine.append({"outcome": "failed", "when": "run", "reason": None,
                     "text": f"the isolated run did not report it (exit {proc.returncode}):\n{out}"})
      _REPORTED[n] = mine
  reports = _REPORTED.pop(node)
  failed = [r for r in reports if r["outcome"] == "failed"]
  if failed:
    pytest.fail("isolated run failed:\n" + "\n".join(f"[{r['when']}] {r['text']}" for r in failed),
                pytrace=False)
  skipped = [r for r in reports if r["outcome"] == "skipped"]
  if skipped:
    pytest.skip((skipped[0]["reason"] or "").removeprefix("Skipped: "))
  return True


@pytest.fixture
def optimised_step(monkeypatch):
  """The optimisation step compiled with its own options (LLVM's level 1), in this test and the
  processes it starts: for a test of a long optimisation, whose iterations at the test run's level 0
  (GRADJAX_FAST_COMPILE, above) take longer than the step's compilation saves."""
  monkeypatch.setenv("GRADJAX_FAST_COMPILE", "0")


@pytest.fixture(scope="session")
def photos():
  """All 16 scikit-image photos as float32 (16, 32, 32, 3) in [0, 1]."""
  return data.load("skimage", indices=range(16), image_size=(32, 32)).x


@pytest.fixture(scope="session")
def photos28():
  """The first 4 photos as 28x28 gray images (4, 28, 28, 1), an MNIST-like shape."""
  return data.load("skimage", indices=range(4), image_size=(28, 28), channels=1).x


def assert_one_line_error(proc, message, case=None):
  """A finished command's refusal as the tool promises it: exit 2, one ``error:`` line on stderr
  naming ``message``, no traceback (``case``: shown where it fails)."""
  assert proc.returncode == 2, (case, proc.returncode, proc.stderr[-2000:])
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], (case, proc.stderr[-2000:])
  assert "Traceback" not in proc.stderr, (case, proc.stderr[-2000:])


def np_log_softmax(z):
  z = np.asarray(z, np.float64)
  m = z.max(axis=-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def np_mlp_grads(params, x, targets, kappa=None):
  """Hand-derived backprop of flatten - Dense - ReLU - Dense ('head') with the mean cross entropy.

  Flax Dense kernels are (in, out) and x is flattened in HWC order (NumPy's C order on NHWC).
  ``targets`` are int labels or an (N, K) matrix of soft labels (rows summing to 1). ``kappa``: the
  ReLU rounded to softplus(κa)/κ (derivative sigmoid(κa)), as the model at sharpness κ.
  Returns (loss, gradient tree shaped like ``params``), all float64 NumPy.
  """
  w1 = np.asarray(params["Dense_0"]["kernel"], np.float64)
  b1 = np.asarray(params["Dense_0"]["bias"], np.float64)
  w2 = np.asarray(params["head"]["kernel"], np.float64)
  b2 = np.asarray(params["head"]["bias"], np.float64)
  x = np.asarray(x, np.float64)
  n = x.shape[0]
  xf = x.reshape(n, -1)
  a = xf @ w1 + b1
  if kappa is None:
    h, dh = np.maximum(a, 0.0), (a > 0).astype(np.float64)
  else:
    h, dh = np.logaddexp(0.0, kappa * a) / kappa, 1.0 / (1.0 + np.exp(-kappa * a))
  z = h @ w2 + b2
  targets = np.asarray(targets)
  if targets.ndim == 1:
    t = np.zeros_like(z)
    t[np.arange(n), targets] = 1.0
  else:
    t = targets.astype(np.float64)
  log_p = np_log_softmax(z)
  loss = -np.mean(np.sum(t * log_p, axis=-1))
  dz = (np.exp(log_p) - t) / n          # dL/dz for softmax + CE with sum(t) = 1 per row.
  dw2 = h.T @ dz
  db2 = dz.sum(axis=0)
  da = (dz @ w2.T) * dh
  dw1 = xf.T @ da
  db1 = da.sum(axis=0)
  return loss, {"Dense_0": {"kernel": dw1, "bias": db1}, "head": {"kernel": dw2, "bias": db2}}


@pytest.fixture(scope="session")
def mlp_reference():
  return np_mlp_grads


@pytest.fixture(scope="session")
def log_softmax_reference():
  return np_log_softmax


def np_fill_variables(module, input_shape, seed=0, *, dtype=np.float32, scale=0.5):
  """Variables of ``module`` with NumPy values, without running any jax.random initialiser.

  The tree comes from ``jax.eval_shape`` of ``module.init``; every parameter is U(-scale, scale) except
  BatchNorm scales (1 + U(-0.1, 0.1)); running means are U(-0.1, 0.1) and running variances U(0.5, 1.5).
  Cheap even for ResNet-18/34, and independent of gradjax's initialisers.
  """
  import jax
  import jax.numpy as jnp

  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1, *input_shape), dtype),
                                              train=False))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = path[-1].key
    collection = path[0].key
    if collection == "batch_stats":
      lo, hi = (-0.1, 0.1) if name == "mean" else (0.5, 1.5)
      return jnp.asarray(rng.uniform(lo, hi, leaf.shape), dtype)
    if name == "scale":
      return jnp.asarray(1.0 + rng.uniform(-0.1, 0.1, leaf.shape), dtype)
    return jnp.asarray(rng.uniform(-scale, scale, leaf.shape), dtype)

  return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope="session")
def fill_variables():
  return np_fill_variables
