"""Compiler options: short compilation for the programs that run once, a fast one for the step.

XLA hands every program to LLVM with its backend optimisation level (2 by default). For a program
that runs once, the optimisation costs more than it saves (on XLA:CPU a random draw of one small
kernel compiles several times faster at level 0). Code that is not jitted at all is no cheaper: each
primitive becomes a program of its own. So the set-up of an experiment (the model's initialisation,
the client's gradient, the dummy data, the solver's first evaluation, the LPIPS network) is jitted
whole with :func:`once`; the optimisation step that runs thousands of times gets the options of
:data:`STEP` (:func:`step_options`). Both turn off XLA:CPU's MLIR fusion emitters
(``xla_cpu_use_fusion_emitters``) for its older LLVM IR emitters, which compile the same fusions
faster into code as fast
(``python -m benchmarks suite``, startup section).

Where the attack runs on an accelerator, the set-up and the scoring run on the host's CPU
(:func:`setup_device`): their programs run once, and an accelerator compiles each of them slower than
a CPU core does (the README's main job on an H200: 8.8 s for the eight programs besides the step,
1.2 s on one CPU core).

:class:`Recorder` measures what making the programs costs (tracing, lowering, compiling or loading
from the persistent cache), per program, from JAX's monitoring events.

The options change the machine code and, through fused multiply-adds, the last bits of some results
(XLA:CPU runs without fast-math), so a long optimisation is reproducible under one set of options,
not across them. :func:`options` drops any option the installed XLA does not know.
"""

import contextlib
import functools
import os
import threading
from typing import Any, Iterator, NamedTuple

import jax
import numpy as np

# The persistent XLA compilation cache gradjax's programs use unless told otherwise: repeated runs
# load what an earlier one compiled. JAX's own JAX_COMPILATION_CACHE_DIR names it where set (a test
# run, a cluster job's scratch folder), else ~/.cache/gradjax/xla.
DEFAULT_CACHE = (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                 or os.path.join(os.path.expanduser("~"), ".cache", "gradjax", "xla"))


def use_persistent_cache(folder: str, min_compile_secs: float = 0.0) -> None:
  """Compiled programs are kept in ``folder`` and loaded from it by later runs ('' : none); only
  those whose compilation took at least ``min_compile_secs`` (0: every program, loading even a small
  one being faster than compiling it)."""
  if folder:
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_secs)

# Compiler options of a program that runs once (``jax.jit(..., compiler_options=...)``): LLVM's level
# 0, without the fusion emitters, which compile a program of DLG's set-up several times longer, and
# generated as one LLVM module (XLA:CPU splits a program into 32 to compile the parts in parallel,
# which at level 0 costs more than it saves: the README's main job's jit(solver_init) 0.43-0.55 s ->
# 0.26-0.39 s on one core, 0.32-0.44 -> 0.25-0.33 s on two).
ONCE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
        "xla_cpu_parallel_codegen_split_count": 1}
# Compiler options of the optimisation step, which runs thousands of times: LLVM's level 1 (level 2
# compiles longer for the same speed, level 0 runs slower), without the fusion emitters (DLG's step
# compiles faster and runs as fast).
#
# ``xla_cpu_copy_insertion_use_region_analysis``: without it XLA:CPU copies every donated buffer
# that a program both reads and updates in place (twice: L-BFGS's (m, ...) history, read by the
# direction's products and given its newest pair by ``.at[slot].set``), a fifth of a DLG iteration
# on LeNet and most of a vmapped one. Other backends ignore the ``xla_cpu_`` options.
STEP = {"xla_backend_optimization_level": 1, "xla_cpu_use_fusion_emitters": False,
        "xla_cpu_copy_insertion_use_region_analysis": True}
# The step of restarts batched in one program (vmap, or a map in batches): with the fusion
# emitters, whose batched update of L-BFGS's history (a scatter under vmap) stays in place; the
# older emitters copy it.
BATCHED_STEP = {**STEP, "xla_cpu_use_fusion_emitters": True}


def step_options(batched: bool = False) -> dict:
  """The compiler options of an optimisation step: :data:`BATCHED_STEP` for restarts batched in one
  program, else :data:`STEP`.

  With ``GRADJAX_FAST_COMPILE=1`` (or ``true``) in the environment, read at each call,
  :data:`ONCE`'s (with the copy insertion's region analysis that keeps a donated L-BFGS history in
  place): for runs of a few dozen iterations, where compiling the step at level 1 costs more than
  its faster iterations save (a test run sets it: tests/conftest.py): the step compiles several
  times faster and its iterations take a few times as long.
  """
  if os.environ.get("GRADJAX_FAST_COMPILE", "").lower() in ("1", "true"):
    return {**ONCE, "xla_cpu_copy_insertion_use_region_analysis": True}
  return BATCHED_STEP if batched else STEP


@functools.cache
def _known(items: tuple) -> bool:
  """Whether the default backend's compiler takes every option of ``items`` ((name, value) pairs)
  together (one tiny compilation)."""
  try:
    jax.jit(lambda x: x, compiler_options=dict(items)).lower(np.float32(0)).compile()
  except jax.errors.JaxRuntimeError as e:
    if "compile option" not in str(e):
      raise
    return False
  return True


def options(wanted: dict) -> dict:
  """``wanted`` (:data:`ONCE`, :data:`STEP` or :data:`BATCHED_STEP`) less the options this XLA
  does not know: debug options come and go between versions, and an unknown one fails every
  compilation. Probed together first (one compilation for all of gradjax's options, whichever
  ``wanted``: what is probed is the names), one by one only when that fails."""
  every = {**ONCE, **STEP, **BATCHED_STEP}
  if _known(tuple(sorted({**every, **{k: v for k, v in wanted.items() if k not in every}}.items()))):
    return dict(wanted)
  return {k: v for k, v in wanted.items() if _known(((k, v),))}


# ``GRADJAX_SETUP_DEVICE=accelerator`` in the environment keeps the set-up and scoring on the
# accelerator (the accelerator suite's ``flags`` part compares the two).
SETUP_DEVICE_VARIABLE = "GRADJAX_SETUP_DEVICE"


def setup_device() -> jax.Device | None:
  """The device of a run's set-up and scoring programs (the keys, the model's draw, the client's
  update, the fidelity checks, the residual, the scores) where it is not the default device: the
  host's CPU when the default device is an accelerator. None on a CPU, where JAX was started without
  its CPU backend (``JAX_PLATFORMS=cuda``), or with ``GRADJAX_SETUP_DEVICE=accelerator``."""
  if jax.default_backend() == "cpu" or os.environ.get(SETUP_DEVICE_VARIABLE, "") == "accelerator":
    return None
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return None


@contextlib.contextmanager
def on_setup_device(device: jax.Device | None) -> Iterator[None]:
  """Within it, programs without committed inputs run on ``device`` (:func:`setup_device`; None: the
  default device), and the arrays they make live there, uncommitted."""
  if device is None:
    yield
    return
  with jax.default_device(device):
    yield


def to_default_device(tree: Any, device: jax.Device | None) -> Any:
  """The JAX arrays of ``tree`` on the default device where set-up ran on ``device`` (a transfer
  through the host, no program; NumPy leaves as they are); ``tree`` itself when ``device`` is None.

  Uncommitted, as arrays made on the default device are: a program's output is committed where an
  argument it reads is, and ``jit`` keys its programs by that, so committed data would make the
  solver's first chunk (its state from ``init``, which need not read the data) and the next ones
  (their state from a chunk, which does) two programs of one step, compiled twice
  (``experiments/studies/accelerator_h100``)."""
  if device is None:
    return tree
  target = jax.devices()[0]

  def place(x):
    if not isinstance(x, jax.Array) or (x.devices() == {target} and not x.committed):
      return x  # host data (NumPy), or already there as placed (an input the set-up passed on)
    with jax.default_device(target):
      return jax.device_put(jax.device_get(x))

  return jax.tree.map(place, tree)


def device_array(x) -> jax.Array:
  """``x`` (a NumPy array or scalar, or a ``jax.Array``) as a ``jax.Array`` of JAX's dtype for it,
  made without a program: ``jnp.asarray`` of host data compiles a copy program per shape and dtype
  (``jit(stage)``; on a warm cache still one to load), ``jax.device_put`` transfers it. Anything
  else (a list) goes through ``jnp.asarray``."""
  if isinstance(x, (np.ndarray, np.generic, jax.Array)):
    return jax.device_put(x)
  return jax.numpy.asarray(x)


def prng_key(seed: int) -> jax.Array:
  """``jax.random.key(seed)``, made without its two programs where JAX's default PRNG is threefry
  and 0 <= seed < 2³² (the key's data is then [0, seed]); otherwise ``jax.random.key`` itself."""
  if jax.config.jax_default_prng_impl == "threefry2x32" and 0 <= seed < 2**32:
    return jax.random.wrap_key_data(device_array(np.array([0, seed], np.uint32)),
                                    impl="threefry2x32")
  return jax.random.key(seed)


def check_key(key, what: str = "key") -> jax.Array:
  """``key`` itself when it is one PRNG key: a typed key (``jax.random.key``) of shape (), or a
  legacy uint32 key (``jax.random.PRNGKey``) of shape (2,); else a one-line ``ValueError`` (JAX's
  own error names neither the argument nor the fix). Traced keys pass unchecked but for their shape."""
  dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    if shape == ():
      return key
  elif dtype == np.uint32 and shape == (2,):
    return key
  raise ValueError(f"{what} must be one PRNG key (jax.random.key(seed)), got "
                   f"{type(key).__name__ if dtype is None else f'{dtype} {shape}'}")


def once(fun=None, **jit_kwargs):
  """``jax.jit(fun, **jit_kwargs)`` with the compiler options :data:`ONCE`; also a decorator
  (``@once`` or ``@once(static_argnames=...)``).

  Called inside another transformation (``jit``, ``vmap``, ``eval_shape``, ``grad``), where JAX
  takes compiler options only at the top level, it is the plain ``jax.jit(fun, **jit_kwargs)``.
  """
  if fun is None:
    return functools.partial(once, **jit_kwargs)
  plain = jax.jit(fun, **jit_kwargs)
  fast = []  # jitted at the first call: probing the compiler's options starts the backend

  @functools.wraps(fun)
  def call(*args, **kwargs):
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
      return plain(*args, **kwargs)
    if not fast:
      fast.append(jax.jit(fun, compiler_options=options(ONCE), **jit_kwargs))
    try:
      return fast[0](*args, **kwargs)
    except ValueError as e:  # inside a trace that none of the arguments shows
      if "compiler_options" not in str(e):
        raise
      return plain(*args, **kwargs)

  return call


# jax.random's draws for programs that run once (dummy inputs, a random direction, a defense's
# noise): threefry's rounds take XLA:CPU about a second to compile at LLVM's default level and a fifth
# of that at level 0 (measured: a LeNet gradient's Gaussian noise 1.0 -> 0.2 s).
uniform = once(jax.random.uniform, static_argnames=("shape", "dtype"))
normal = once(jax.random.normal, static_argnames=("shape", "dtype"))
randint = once(jax.random.randint, static_argnames=("shape", "dtype"))


# --- what making programs cost ------------------------------------------------------------------

# JAX's monitoring events of making one program: tracing the function to a jaxpr, lowering the jaxpr
# to an MLIR module, and XLA's compilation of the module (or loading it from the persistent cache).
STAGES = {"tracing": "/jax/core/compile/jaxpr_trace_duration",
          "lowering": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "compiling": "/jax/core/compile/backend_compile_duration"}
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


class Program(NamedTuple):
  """One program made: ``name`` as JAX names the module (``jit(fun)``), the seconds of its
  ``lowering`` and ``compiling`` (XLA's compilation, or reading it from the persistent cache when
  ``cached``) and of the ``tracing`` that preceded its lowering in the same thread."""

  name: str
  tracing: float
  lowering: float
  compiling: float
  cached: bool

  @property
  def seconds(self) -> float:
    return self.tracing + self.lowering + self.compiling


def covered(spans, start: float = -np.inf, end: float = np.inf) -> float:
  """Seconds of the union of ``spans`` ((start, end) pairs) inside [start, end]: spans that nest
  (a trace that traces another function) or overlap (threads) count once."""
  clipped = sorted((max(a, start), min(b, end)) for a, b in spans if min(b, end) > max(a, start))
  total, reach = 0.0, -np.inf
  for a, b in clipped:
    if b > reach:
      total += b - max(a, reach)
      reach = b
  return total


class Recorder:
  """Records what JAX spends making programs while open (``with Recorder() as made:``), from its
  monitoring events (``jax.monitoring``): every span of tracing, lowering and compiling (wall-clock
  ``time.time()`` seconds, from any thread of the process), and each compiled program
  (:class:`Program`, in order). Programs already in JAX's in-memory cache cost nothing and do not
  appear."""

  def __init__(self):
    self.spans = {stage: [] for stage in STAGES}
    self.programs: list[Program] = []
    self._local = threading.local()
    self._stage = {event: stage for stage, event in STAGES.items()}

  def _span(self, event, start, end, **kwargs):
    stage = self._stage.get(event)
    if stage is None:
      return
    self.spans[stage].append((start, end))
    local = self._local
    if stage == "tracing":
      local.traced = (kwargs.get("fun_name"), end - start)
    elif stage == "lowering":
      local.lowered = (kwargs.get("fun_name"), end - start)
    else:
      name = kwargs.get("fun_name", "")
      traced, lowered = getattr(local, "traced", None), getattr(local, "lowered", None)
      self.programs.append(Program(
          name, traced[1] if traced and name == f"jit({traced[0]})" else 0.0,
          lowered[1] if lowered and lowered[0] == name else 0.0, end - start,
          getattr(local, "hit", False)))
      local.traced = local.lowered = None
      local.hit = False

  def _event(self, event, **kwargs):
    if event == _CACHE_HIT:
      self._local.hit = True

  def __enter__(self) -> "Recorder":
    jax.monitoring.register_event_time_span_listener(self._span)
    jax.monitoring.register_event_listener(self._event)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_time_span_listener(self._span)
    jax.monitoring.unregister_event_listener(self._event)

  def seconds(self, start: float = -np.inf, end: float = np.inf) -> dict[str, float]:
    """Seconds spent in each stage and in any (``"programs"``) inside [start, end] (``time.time()``)."""
    out = {stage: covered(spans, start, end) for stage, spans in self.spans.items()}
    out["programs"] = covered([s for spans in self.spans.values() for s in spans], start, end)
    return out
