"""The restart driver: many restarts of one solver (:mod:`gradjax.solvers`), run by a strategy, with
successive halving, sharding over devices, progress reports and resumable snapshots.

Restart strategies (``Execution.strategy``):

* ``"sequential"``: a Python loop over restarts, each jitted chain run alone. The CPU default: with
  L-BFGS (the DLG presets) the zoom line search is a while loop, which under ``vmap`` runs until the
  slowest restart's search ends, and the restarts' L-BFGS memories outgrow the CPU's caches (the
  restart tables and profile in ``experiments/studies/speed_cpu``). Without a line search ``vmap`` is as fast or faster on
  CPU too, provided convolutions run as im2col (``conv="im2col"``, ``gradjax.models``): XLA's
  native ones, which the CPU default ``"mixed"`` takes for large feature maps, turn into grouped
  convolutions under ``vmap``.
* ``"vmap"``: all restarts advance together in one vectorised program (the accelerator default,
  where its step fits in the device's free memory: :func:`fit_strategy`).
* ``"map"``: ``lax.map`` over restarts with ``map_batch_size`` vectorised at a time (what ``"auto"``
  runs on an accelerator whose memory holds the step of a batch of restarts but not of all).
* ``"tune"``: time a few iterations of each on the actual problem and run the fastest
  (:func:`tune_strategy`; costs the extra compilations, worth it for long runs).

Scale. ``restart_data`` gives each restart its own data (a candidate label order); successive halving
(``halving_rounds``) advances all restarts, keeps the best fraction by objective and continues, so many
restarts cost little more than a few; ``shard`` splits the restarts over all devices (of every
process, in a run over several: :mod:`gradjax.cli.distributed`) with a ``NamedSharding`` on a 1-D
``"restarts"`` mesh. These
knobs, with the progress ``callback`` and ``monitor``, travel together as one :class:`Execution`.

Precision. Every program of a run is traced at ``Execution.matmul_precision`` for matrix products and
convolutions (``jax.default_matmul_precision``), float32 unless asked otherwise: matching gradients of
gradients must drive a residual to ~1e-6, which float32 products rounded as JAX's default precision
lets a GPU round them (to TensorFloat-32 or bfloat16) cannot (``experiments/studies/accelerator_h100``).
"""

import contextlib
import dataclasses
import functools
import math
import os
import time
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import compilation, optimizers, solvers
from gradjax.compilation import once
from gradjax.progress import Progress
from gradjax.sharding import RESTART_AXIS, fetch, restart_mesh, shard_restarts
from gradjax.solvers import Solver, SolverState

PyTree = Any
STRATEGIES = ("auto", "tune", "sequential", "vmap", "map")


class Snapshot(NamedTuple):
  """Where a :func:`run` stands after a chunk: enough to continue it to the same result
  (``Execution.saver`` saves one, :mod:`gradjax.run.resume` writes it to a file).

  state: every restart's :class:`SolverState` stacked on a leading (R,) axis, host arrays.
  round: the successive-halving round being run (0 without halving).
  survivors: (S,) int, the restarts this round advances, best first.
  position: sequential strategy: how many of ``survivors`` have finished this round (else 0).
  steps: steps the restart(s) being advanced have taken in this round.
  stopped: whether the monitor ended the run.
  strategy: the resolved restart strategy (a snapshot continues under one of the same kind: in
    sequence, or together, vmap and map).
  """

  state: SolverState
  round: int
  survivors: np.ndarray
  position: int
  steps: int
  stopped: bool
  strategy: str


class Saver(Protocol):
  """What :func:`run` calls to save and restore its :class:`Snapshot` (:class:`gradjax.run.resume.Saver`
  is the file-backed one)."""

  def restore(self, like: Callable[[], SolverState]) -> Snapshot | None:
    """The snapshot to continue from, or None to start afresh; ``like()`` gives the stacked state's
    shapes and dtypes (``jax.ShapeDtypeStruct`` leaves) to check it against."""

  def __call__(self, snapshot: Callable[[], Snapshot], *, final: bool = False) -> None:
    """Called after every chunk; saves ``snapshot()`` when it is due (always when ``final``)."""


PRECISIONS = ("float32", "tensorfloat32", "bfloat16", "default")


def precision_scope(precision: str):
  """A context in which JAX traces matrix products and convolutions at ``precision`` (one of
  ``PRECISIONS``; ``"default"``: JAX's default, left as the caller set it)."""
  if precision not in PRECISIONS:
    raise ValueError(f"unknown matmul precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
  return contextlib.nullcontext() if precision == "default" else jax.default_matmul_precision(precision)


@dataclasses.dataclass(frozen=True)
class Execution:
  """How :func:`run` executes the restarts: one record, built once and passed whole.

  Attributes:
    strategy: one of ``STRATEGIES`` (module docstring); ``"auto"``: sequential on CPU, vmap on
      accelerators, or map where the vmapped step does not fit the device's memory
      (:func:`fit_strategy`).
    chunk: steps per jitted call between progress reports (and monitor calls).
    map_batch_size: restarts vectorised together by the ``"map"`` strategy (``None``: all).
    unroll: steps traced in each trip of a chunk's loop on accelerators (:func:`repeat`; on CPU a
      chunk is a host loop of one-step calls, see :func:`_compiled`). Not used where the solver
      advances two or more restarts vmapped together one line-search trial a trip
      (``Solver.advance``: L-BFGS).
    halving_rounds, halving_keep: successive halving (:func:`halving_plan`; 1 round: off). A
      restart dropped after a round keeps the state it reached (its ``iterations`` say how far).
    shard: split the restarts over every device (:func:`shard_restarts`; in a run over several
      processes, every process's: :mod:`gradjax.cli.distributed`) and run them with ``vmap``, each
      device advancing its share.
      With halving, each round's survivors are gathered and split over the devices again.
    callback: called on the host with a :class:`Progress` after every chunk.
    monitor: called on the host with the (stacked, or one restart's) state after every chunk; a True
      return stops the run there (e.g. once a reconstruction reaches a target PSNR).
    saver: a :class:`Saver`: asked for a snapshot to resume from before the run, and
      offered one after every chunk (``gradjax.run.resume.Saver`` saves it to a file every so often).
    matmul_precision: one of ``PRECISIONS``: the precision of matrix products and convolutions
      the run's programs are traced at (:func:`precision_scope`); ``"default"``: JAX's own.
    setup_device: where the run's programs that run once run (the solver's first state here, the
      dummy data's draw in :func:`gradjax.attacks.reconstruct`), their results then placed on the
      default device for the steps (:func:`gradjax.compilation.to_default_device`); None: the
      default device. :func:`gradjax.compilation.setup_device`: the host's CPU where the default
      device is an accelerator, which compiles such a program faster than the accelerator
      (``experiments/studies/accelerator_h100``). Not used with ``shard``.
  """

  strategy: str = "auto"
  chunk: int = 50
  map_batch_size: int | None = None
  unroll: int = 1
  halving_rounds: int = 1
  halving_keep: float = 0.5
  shard: bool = False
  callback: Callable[[Progress], None] | None = None
  monitor: Callable[[SolverState], bool] | None = None
  saver: Saver | None = None
  matmul_precision: str = "float32"
  setup_device: Any = None  # a jax.Device

  def __post_init__(self):
    if self.matmul_precision not in PRECISIONS:
      raise ValueError(f"unknown matmul precision {self.matmul_precision!r}; choose one of "
                       f"{', '.join(PRECISIONS)}")
    if self.strategy not in STRATEGIES:
      raise ValueError(f"unknown restart strategy {self.strategy!r}; choose one of "
                       f"{', '.join(STRATEGIES)}")
    counts = {"chunk": self.chunk, "unroll": self.unroll, "halving_rounds": self.halving_rounds,
              "map_batch_size": 1 if self.map_batch_size is None else self.map_batch_size}
    for name, value in counts.items():
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name in ("callback", "monitor", "saver"):
      if getattr(self, name) is not None and not callable(getattr(self, name)):
        raise ValueError(f"{name} must be a function (or None), got {getattr(self, name)!r}")
    if not 0 < self.halving_keep <= 1:
      raise ValueError(f"halving keep fraction must lie in (0, 1], got {self.halving_keep}")
    if self.shard and self.strategy not in ("auto", "vmap"):
      raise ValueError(f"sharded restarts run with vmap, not strategy {self.strategy!r}")


def resolve_strategy(strategy: str) -> str:
  """``"auto"``: sequential on CPU, vmap on accelerators (see module docstring); ``"tune"`` is
  resolved by :func:`tune_strategy` inside :func:`run`."""
  if strategy not in STRATEGIES:
    raise ValueError(f"unknown restart strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
  if strategy == "auto":
    return "sequential" if jax.default_backend() == "cpu" else "vmap"
  return strategy


def tune_strategy(solver: Solver, init_params: PyTree, data: PyTree, *, steps: int = 5,
                  execution: Execution = Execution(), restart_data: PyTree = None
                  ) -> tuple[str, dict[str, float]]:
  """Measures ``steps`` iterations of every restart under each strategy and returns the fastest.

  Each strategy is compiled and run once untimed, then timed over the same ``steps`` from the same
  start (so the figure is the per-chunk cost of a run, compilation excluded), with ``execution``'s
  ``map_batch_size`` and ``unroll``. With one restart only ``"sequential"`` is considered. Returns
  (strategy, {strategy: seconds}). The timings are not kept: each ``run`` with strategy ``"tune"``
  measures again, so tune once and pass the winner for many short runs. On a device that says how
  much memory it has free, vmap is not timed where its step does not fit (:func:`fit_strategy`).
  The programs timed are the run's own, so the run that follows compiles nothing.
  """
  restarts = jax.tree.leaves(init_params)[0].shape[0]
  candidates = ("sequential",) if restarts == 1 else ("sequential", "vmap", "map")
  free = free_memory()
  if restarts > 1 and free is not None and footprint(_step_program(
      solver, "vmap", None, init_params, data, restart_data, steps, execution.unroll)) > int(
          MEMORY_HEADROOM * free):
    candidates = ("sequential", "map")  # the vmapped step does not fit the device (fit_strategy)
  seconds, numbers = {}, optimizers.budget(steps)
  # A sequence's rows sliced on the host (as the run does: nothing compiled for them).
  host_params, host_per = jax.device_get((init_params, restart_data))
  rows = [(_slice(host_params, r), None if host_per is None else _slice(host_per, r))
          for r in range(restarts)]
  for strategy in candidates:
    # The run's own programs (the same _compiled key): the run that follows compiles nothing.
    init, advance, _ = _compiled(solver, strategy, execution.map_batch_size, execution.unroll, None)

    def chunk():
      if strategy == "sequential":
        return [advance(init(params, data, per, numbers), data, per, steps) for params, per in rows]
      return advance(init(init_params, data, restart_data, numbers), data, restart_data, steps)

    jax.block_until_ready(chunk())
    start = time.perf_counter()
    jax.block_until_ready(chunk())
    seconds[strategy] = time.perf_counter() - start
  return min(seconds, key=seconds.get), seconds


# The share of a device's free memory the step of ``"auto"``'s restarts may need: the programs run
# beside it (the first evaluation, the scores) and the allocator's fragmentation want the rest.
MEMORY_HEADROOM = 0.8


def free_memory(device: jax.Device | None = None) -> int | None:
  """Bytes ``device`` (the first local one) can still allocate: its allocator's limit less what is
  in use (``Device.memory_stats``); None where the backend does not say (XLA:CPU)."""
  stats = (device or jax.local_devices()[0]).memory_stats()
  if not stats or "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def memory_bytes(device: jax.Device | None = None) -> int | None:
  """Bytes a run can have at most on ``device``: its :func:`free_memory`, or where the backend does not
  say (XLA:CPU) the host's physical memory; None where neither is known."""
  free = free_memory(device)
  if free is not None:
    return free
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):  # no such sysconf name on this system
    return None


def footprint(compiled: jax.stages.Compiled) -> int:
  """Device bytes a compiled program holds while it runs (XLA's ``memory_analysis``): its arguments,
  the outputs not written over a donated argument, and its temporaries."""
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)


class Fit(NamedTuple):
  """What :func:`fit_strategy` chose: the strategy, ``map``'s batch of restarts (else None), and
  the bytes the step of all restarts vmapped needs (``need``) against those it may take
  (``budget``: :data:`MEMORY_HEADROOM` of the free memory)."""

  strategy: str
  map_batch_size: int | None
  need: int
  budget: int


def fit_strategy(solver: Solver, init_params: PyTree, data: PyTree, *, free: int, steps: int = 1,
                 execution: Execution = Execution(), restart_data: PyTree = None) -> Fit:
  """How ``"auto"`` runs R restarts on an accelerator with ``free`` bytes of memory.

  ``"vmap"`` where the step of all R vectorised, advancing ``steps`` iterations (the run's chunk
  program, whose step count is an argument: one program for every count), needs at most
  :data:`MEMORY_HEADROOM` of ``free`` (:func:`footprint` of the compiled program: measured, not
  estimated; the run then calls that same program, so where it fits this compiles nothing extra).
  Otherwise ``"map"`` of the most restarts at a time whose step fits. A map holds every restart's
  state, as vmap does; only the step's temporaries (the activations of the double backward pass)
  shrink with its batch, so the batch is sized as if each restart took an R-th of the vmapped
  step's temporaries, and sized again at half as many restarts' worth until its compiled step fits.
  Where not even two fit, ``"sequential"``. That order is the measured speed of 64 DLG restarts on
  LeNet on an H200 (``experiments/studies/accelerator_h100/runs/gpu_h200/gpu_restarts.md``).
  """
  restarts = jax.tree.leaves(init_params)[0].shape[0]
  budget = int(MEMORY_HEADROOM * free)
  compiled = lambda strategy, batch: _step_program(solver, strategy, batch, init_params, data,
                                                   restart_data, steps, execution.unroll)
  step = compiled("vmap", None)
  vmapped = footprint(step)
  if vmapped <= budget:
    return Fit("vmap", None, vmapped, budget)
  temp = step.memory_analysis().temp_size_in_bytes
  room = (budget - (vmapped - temp)) / max(temp / restarts, 1.0)  # restarts' temporaries that fit
  while True:
    # A batch b that does not divide R runs as batches of b and one of R mod b, whose
    # temporaries XLA keeps apart: b + R mod b restarts' worth.
    batches = [b for b in range(2, restarts) if b + restarts % b <= room]
    if not batches:
      break
    batch = max(batches)
    if footprint(compiled("map", batch)) <= budget:
      return Fit("map", batch, vmapped, budget)
    room = (batch + restarts % batch) / 2
  return Fit("sequential", None, vmapped, budget)


def _step_program(solver, strategy, batch, init_params, data, restart_data, steps, unroll):
  """The compiled step that a run of ``strategy`` (``map``: ``batch`` at a time) advances its
  stacked restarts with, ``steps`` iterations a call: the run's own program (the same
  :func:`_compiled` key), so compiling it here compiles nothing the run would not."""
  restarts = jax.tree.leaves(init_params)[0].shape[0]
  shapes = _state_shapes(solver, init_params, data, restart_data, restarts)
  _, advance, _ = _compiled(solver, strategy, batch, unroll, None)
  # On CPU a chunk is a host loop of the one-step program (``_compiled``): that one is measured.
  program, n = (advance.step, 1) if hasattr(advance, "step") else (advance, steps)
  return program.lower(shapes, data, restart_data, n).compile()


def repeat(step: Callable[[Any], Any], state, n, unroll: int = 1):
  """``step`` applied ``n`` times to ``state``, ``n`` a traced integer: a while loop whose trip count
  is data, so one compiled program serves every count (a budget's remainder included). ``unroll``
  steps are traced in each trip of the loop, the ``n mod unroll`` left one a trip (``lax.fori_loop``
  unrolls only a count known when tracing)."""
  if unroll == 1:
    return jax.lax.fori_loop(0, n, lambda _, s: step(s), state)

  def trip(_, s):
    for _ in range(unroll):
      s = step(s)
    return s

  state = jax.lax.fori_loop(0, n // unroll, trip, state)
  return jax.lax.fori_loop(0, n % unroll, lambda _, s: step(s), state)


@functools.lru_cache(maxsize=64)
def _compiled(solver: Solver, strategy: str, map_batch_size: int | None, unroll: int,
              mesh: jax.sharding.Mesh | None = None):
  """Jitted (init, advance, finalize) for one solver and strategy, cached across calls.

  Each takes ``(state(s), data, per_restart, ...)``; the solver sees ``data`` alone when
  ``per_restart`` is None and ``(data, per_restart)`` otherwise; ``init`` also takes the budget's
  :func:`gradjax.optimizers.budget`, which it sets in the optimizer's state. With a ``mesh`` the vmapped
  functions run under ``shard_map``: each device advances its own block of restarts with a local
  program, and ``data`` is replicated. (``check_vma=False``: the dummy gradient is taken w.r.t. the
  replicated parameters, and with the check on, its transpose would sum it over devices. Plain
  ``jit`` auto-partitioning of the same vmapped program returned wrong values for the batched conv
  weight gradient on XLA:CPU in jax 0.10.2, hence the explicit per-device program.)
  """

  def bind(fn):
    return lambda s, data, per, *a: fn(s, data if per is None else (data, per), *a)

  on_cpu = jax.default_backend() == "cpu"

  def advance_one(state, data, n):
    if on_cpu:  # a host loop calls the one-step program (below)
      return solver.step(state, data)
    return repeat(lambda s: solver.step(s, data), state, n, unroll)

  def advance_trials(state, data, n):
    # One line-search trial a trip: batched restarts search on their own (``Solver.advance``).
    return solver.advance(state, data, n)

  def init_at(params, data, numbers):
    # The schedule's budget as an argument: the first state's program is one for every budget.
    state = solver.init(params, data)
    return state._replace(opt_state=optimizers.at_budget(state.opt_state, numbers))

  init, advance, finalize = bind(init_at), bind(advance_one), bind(solver.finalize)
  if strategy == "vmap":
    # The restarts are a named axis: an objective may reduce over them (a group-consistency prior).
    init = jax.vmap(init, in_axes=(0, None, 0, None), axis_name=RESTART_AXIS)
    stepped = jax.vmap(advance, in_axes=(0, None, 0, None), axis_name=RESTART_AXIS)
    advance = stepped
    if not on_cpu and solver.advance is not None:
      tried = jax.vmap(bind(advance_trials), in_axes=(0, None, 0, None), axis_name=RESTART_AXIS)
      # Chosen when traced, by the restarts it holds (a device's share under a mesh): a restart
      # alone gains nothing from searching on its own, and would recompute its direction and
      # select its whole state at every trial.
      advance = lambda states, *a: (tried if jax.tree.leaves(states)[0].shape[0] > 1
                                    else stepped)(states, *a)
    finalize = jax.vmap(finalize, in_axes=(0, None, 0), axis_name=RESTART_AXIS)
  elif strategy == "map":
    def lift(fn):
      return lambda states, data, per, *a: jax.lax.map(lambda sp: fn(sp[0], data, sp[1], *a),
                                                       (states, per), batch_size=map_batch_size)
    if map_batch_size is not None and map_batch_size > 1 and not on_cpu and solver.advance is not None:
      advance = bind(advance_trials)  # the map's batches are vmapped: they search on their own
    init, advance, finalize = lift(init), lift(advance), lift(finalize)
  if mesh is not None:
    spec, replicated = jax.sharding.PartitionSpec("restarts"), jax.sharding.PartitionSpec()

    def per_device(fn):
      def sharded(states, data, per, *a):
        local = lambda s, d, p: fn(s, d, p, *a)
        return jax.shard_map(local, mesh=mesh, in_specs=(spec, replicated, spec), out_specs=spec,
                             check_vma=False)(states, data, per)
      return sharded
    init, advance, finalize = per_device(init), per_device(advance), per_device(finalize)
  # The state is donated to each chunk: its buffers are reused for the next state in place. The
  # first and last evaluations run once: compiled fast, not optimised (gradjax.compilation).
  # A map without a batch size is a loop of the unbatched step: STEP's options (it compiled faster
  # so, at the same time an iteration, for 4 DLG restarts on LeNet on one core).
  batched = strategy == "vmap" or (strategy == "map" and map_batch_size is not None)
  # Named, so their programs read jit(solver_init) and so on (gradjax.compilation.Recorder, logs).
  for fn, name in ((init, "solver_init"), (advance, "solver_steps"), (finalize, "solver_finalize")):
    fn.__name__ = fn.__qualname__ = name
  # On an accelerator the step count is an argument (traced): one program for every chunk, a
  # budget's remainder and the last iterate's scoring step. On CPU it is unused (static).
  advance = jax.jit(advance, static_argnums=3 if on_cpu else (), donate_argnums=0,
                    compiler_options=compilation.options(compilation.step_options(batched)))
  init, finalize = once(init), once(finalize)
  if not on_cpu:
    return init, advance, finalize

  def host_loop(states, data, per, n):
    """On CPU a chunk is n calls of the one-step program: XLA:CPU runs a step inside a while loop
    slower than the same step as its own program (``python -m benchmarks suite``, loops section)."""
    for _ in range(n):
      states = advance(states, data, per, 1)
    return states

  host_loop.step = advance  # the program it calls (fit_strategy measures its memory)
  return init, host_loop, finalize


def _slice(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def _stack(trees):
  """Restart states stacked on the host (one NumPy call per leaf, nothing to compile)."""
  return jax.tree.map(lambda *xs: np.stack(xs), *jax.device_get(trees))


# :func:`_slice` of a device tree by an index array, as one program (op by op, each leaf's gather
# would compile alone, again for each round's number of survivors).
_take = compilation.once(_slice)


@compilation.once
def _scatter(tree, index, sub):
  """``tree`` with rows ``index`` of every leaf set to ``sub``'s, as one program (see :func:`_take`)."""
  return jax.tree.map(lambda x, s: x.at[index].set(s), tree, sub)


def halving_plan(iterations: int, restarts: int, rounds: int, keep: float
                     ) -> list[tuple[int, int]]:
  """Successive halving: ``[(survivors, steps), ...]`` per round.

  Round i advances its survivors by ``iterations·(i+1)/rounds − iterations·i/rounds`` steps, then
  keeps the best ⌈keep · survivors⌉ (at least 1) by objective, so every final survivor runs the full
  ``iterations`` and the total is about ``iterations · R · (1 + keep + keep² ...) / rounds``
  (Jamieson & Talwalkar 2016; Li et al., Hyperband, 2018). ``rounds = 1`` runs every restart fully.
  """
  if rounds < 1 or rounds > iterations:
    raise ValueError(f"halving rounds must lie in [1, iterations = {iterations}], got {rounds}")
  if not 0 < keep <= 1:
    raise ValueError(f"halving keep fraction must lie in (0, 1], got {keep}")
  out, alive = [], restarts
  for i in range(rounds):
    out.append((alive, iterations * (i + 1) // rounds - iterations * i // rounds))
    alive = max(1, math.ceil(alive * keep))
  return out


def run(solver: Solver, init_params: PyTree, data: PyTree, *, iterations: int,
        execution: Execution = Execution(), restart_data: PyTree = None) -> SolverState:
  """Runs the restarts for ``iterations`` steps; returns the stacked final :class:`SolverState`.

  Args:
    solver: from :func:`gradjax.solvers.make_solver` (its ``tol`` stops the run once every live
      restart reached it).
    init_params: initial dummy data with a leading restart axis R on every leaf.
    data: the observation-side arguments of the objective, shared by every restart.
    iterations: optimizer steps per restart (per surviving restart with halving). A
      :func:`gradjax.optimizers.learning_rate_schedule` in the solver's optimizer is spread over
      them (:func:`gradjax.optimizers.at_budget`), whatever budget it was built at.
    execution: how the restarts run (:class:`Execution`).
    restart_data: optional pytree with a leading axis R: restart r's solver then sees
      ``(data, restart_data[r])`` (e.g. its candidate label permutation).

  With ``execution.shard`` the result is a global array sharded over the devices (:func:`fetch`
  brings it to the host).
  """
  if iterations < 1:
    raise ValueError(f"iterations must be positive, got {iterations}")
  restarts = jax.tree.leaves(init_params)[0].shape[0]
  _check_restart_data(restart_data, restarts)  # before padding could hide a wrong count
  with precision_scope(execution.matmul_precision):
    return _run_all(solver, init_params, data, iterations, execution, restart_data, restarts)


def _run_all(solver, init_params, data, iterations, execution, restart_data, restarts):
  if not execution.shard:
    return _run(solver, init_params, data, iterations, execution, restart_data, None, restarts)
  mesh = restart_mesh()
  init_params, restart_data = shard_restarts((init_params, restart_data), mesh)
  state = _run(solver, init_params, data, iterations, dataclasses.replace(execution, strategy="vmap"),
               restart_data, mesh, restarts)
  return _slice(state, slice(0, restarts))


def _state_shapes(solver: Solver, init_params: PyTree, data: PyTree, restart_data: PyTree,
                  restarts: int) -> SolverState:
  """Shapes and dtypes of the first ``restarts`` rows of the stacked state (nothing is computed)."""
  init = lambda p, per: solver.init(p, data if per is None else (data, per))
  shapes = jax.eval_shape(jax.vmap(init, in_axes=(0, None if restart_data is None else 0)),
                          init_params, restart_data)
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct((restarts, *s.shape[1:]), s.dtype), shapes)


class _Search:
  """One call of :func:`run`, what every strategy's loop shares: the compiled step, the plan, the
  saved position (``snap``) and :meth:`drive`, which advances a state chunk by chunk.

  The loop's position is a cursor (round, survivors, position, steps): a :class:`Snapshot` taken after
  any chunk, handed back through ``execution.saver``, continues from there with the same chunk
  boundaries, so the steps that follow are the same programs on the same values."""

  def __init__(self, solver: Solver, data: PyTree, iterations: int, execution: Execution,
               strategy: str, mesh, restarts: int, plan, snap: Snapshot | None, note: str = ""):
    self.solver, self.data, self.iterations, self.ex = solver, data, iterations, execution
    self.note = note  # why the restarts run as they do, where the device's memory chose
    self.strategy, self.mesh, self.restarts, self.plan, self.snap = (
        strategy, mesh, restarts, plan, snap)
    self.init, self.advance, self.finalize = _compiled(solver, strategy, execution.map_batch_size,
                                                       execution.unroll, mesh)
    self.tol = -jnp.inf if solver.tol is None else solver.tol
    self.stopped = False if snap is None else bool(snap.stopped)  # a monitor ended the run
    self.compiled = False  # whether a chunk has run (the first one compiles the step)
    # Restart-steps the whole run still has to take (every survivor of every round), for the ETA.
    self.left = sum(count * n for count, n in plan)
    if snap is not None:
      done_rounds = sum(count * n for count, n in plan[:snap.round])
      count, n = plan[snap.round]
      this_round = (snap.position * n + snap.steps if strategy == "sequential"
                    else count * snap.steps)
      self.left -= done_rounds + this_round

  def start(self) -> tuple[np.ndarray, int, int]:
    """(survivors, steps done, first round) where the run starts: afresh, or at the snapshot."""
    if self.snap is None:
      return np.arange(self.restarts), 0, 0
    first = self.snap.round
    return (np.asarray(self.snap.survivors, np.int64), sum(n for _, n in self.plan[:first]),
            first)

  def first(self, params, per):
    """The solver's first state from ``params`` (one restart's or stacked), made on the execution's
    ``setup_device`` where it has one (not over a mesh) and placed on the default device."""
    host = None if self.mesh is not None else self.ex.setup_device
    with compilation.on_setup_device(host):
      state = self.init(params, self.data, per, optimizers.budget(self.iterations))
    return compilation.to_default_device(state, host)

  def drive(self, state, per, restart, done, n, snapshot, width=1):
    """Advances ``state`` (``width`` restarts) by ``n`` steps from step ``done``; stops early once
    all converged. ``snapshot(state, finished)`` is the run's :class:`Snapshot` with ``state`` in
    place. The ETA reported covers the whole run: every restart and halving round still to come."""
    ex, iterations = self.ex, self.iterations
    target, start, first = done + n, time.perf_counter(), done
    began = start
    if not self.compiled and ex.callback is not None and n > 0:
      ex.callback(Progress(restart, done, iterations, math.inf, 0, math.nan, math.nan, 0.0, True,
                           self.note))
    while done < target:
      k = min(ex.chunk, target - done)  # one program for every k (_compiled)
      state = self.advance(state, self.data, per, k)
      done += k
      self.left -= k * width
      best, alive = fetch((state.best_loss, state.alive))
      now = time.perf_counter()
      if not self.compiled:  # rates from here on exclude the compilation
        rate = math.nan
        self.compiled, start, first = True, now, done
      else:
        rate = (done - first) / max(now - start, 1e-9)
      if ex.callback is not None:
        ex.callback(Progress(restart, done, iterations, float(best.min()), int(alive.sum()), rate,
                             max(self.left, 0) / (rate * width), now - began))
      finished = not (alive & (best > self.tol)).any()
      if (not finished and ex.monitor is not None
          and ex.monitor(state if self.mesh is None else fetch(state))):
        self.stopped = finished = True
      if ex.saver is not None:
        ex.saver(lambda: snapshot(state, target if finished else done))
      if finished:
        break
    return state

  def final(self, state, per):
    """``state`` (one restart's or stacked) finished, its final iterate scored on the host where a
    line search stored its objective and the restarts are not sharded
    (:func:`gradjax.solvers.finalize_stored`), else by one more step of the run's step program
    where that step scores it as ``finalize`` would (:func:`gradjax.solvers.scores_by_step`; the
    state is then fetched to the host), else, and for restarts sharded over devices (which stay
    so), by ``finalize``'s program."""
    if self.mesh is None and solvers.scores_stored(self.solver, state):
      return solvers.finalize_stored(fetch(state))
    if (self.mesh is not None
        or not solvers.scores_by_step(self.solver, state,
                                      self.data if per is None else (self.data, per))):
      return self.finalize(state, self.data, per)
    kept = fetch(state)  # the step's program takes the state's buffers (donated)
    return solvers.from_step(kept, fetch(self.advance(state, self.data, per, 1)))

  def cursor(self, rnd, survivors, position, round_start):
    """``snapshot(state, done)`` for :meth:`drive`, given how to place ``state`` in the whole."""
    def make(whole, done):
      return Snapshot(whole, rnd, np.asarray(survivors), position, done - round_start, self.stopped,
                      self.strategy)
    return make

  def save_final(self, state, rnd, survivors, position, steps):
    """The last snapshot, saved whatever the interval: a crash writing the results loses nothing."""
    if self.ex.saver is not None:
      self.ex.saver(lambda: Snapshot(state, rnd, np.asarray(survivors), position, steps,
                                          self.stopped, self.strategy), final=True)


def _sequential(search: _Search, init_params: PyTree, restart_data: PyTree) -> SolverState:
  """The ``"sequential"`` strategy: each restart advanced alone, one after another in each round."""
  snap, restarts = search.snap, search.restarts
  survivors, done, first_round = search.start()
  # Each restart's rows are sliced on the host once: slicing a device array compiles a program
  # per leaf.
  host_params, host_per = jax.device_get((init_params, restart_data))
  pers = [None if host_per is None else jax.device_put(_slice(host_per, r)) for r in range(restarts)]
  if snap is None:
    states = [search.first(_slice(host_params, r), pers[r]) for r in range(restarts)]
  else:
    states = [jax.device_put(_slice(snap.state, r)) for r in range(restarts)]
  last = None  # (round, its survivors) of the last round run
  for i in range(first_round, len(search.plan)):
    count, n = search.plan[i]
    resumed = snap is not None and i == first_round
    survivors = survivors[:count]
    for j in range(snap.position if resumed else 0, count):
      r = int(survivors[j])
      taken = snap.steps if resumed and j == snap.position else 0
      if search.stopped:
        break
      make = search.cursor(i, survivors, j, done)

      def whole(state, finished, r=r, make=make):
        return make(_stack(states[:r] + [state] + states[r + 1:]), finished)

      states[r] = search.drive(states[r], pers[r], r, done + taken, n - taken, whole)
    done += n
    last = (i, survivors)
    survivors = _rank(np.stack(jax.device_get([s.best_loss for s in states])), survivors)
  if last is not None:
    search.save_final(_stack(states), last[0], last[1], len(last[1]), 0)
  return _stack([search.final(s, pers[r]) for r, s in enumerate(states)])


def _together(search: _Search, init_params: PyTree, restart_data: PyTree) -> SolverState:
  """The ``"vmap"`` and ``"map"`` strategies, sharded over a mesh or not: every survivor of a round
  advanced in one program. With a mesh the leading axis is padded to a multiple of the device count
  (``search.restarts`` is the real count): halving ranks only those, and each later round's
  survivors are gathered on the host and sharded again (padded) over the mesh."""
  snap, restarts, mesh = search.snap, search.restarts, search.mesh
  survivors, done, first_round = search.start()
  if mesh is None:  # the runs' own data on the device once, not with every chunk's call
    restart_data = jax.device_put(restart_data)
  per_of = (lambda i: None) if restart_data is None else (lambda i: _slice(restart_data, i))
  if snap is None:
    state = search.first(init_params, restart_data)
  else:
    state = shard_restarts(snap.state, mesh) if mesh is not None else jax.device_put(snap.state)
  on_host = False  # with a mesh: whether ``state`` was gathered to the host by a halving round
  last = None  # (round, its survivors, its steps) of the last round run
  for i in range(first_round, len(search.plan)):
    if search.stopped:
      break
    count, n = search.plan[i]
    taken = snap.steps if snap is not None and i == first_round else 0
    survivors = survivors[:count]
    make = search.cursor(i, survivors, 0, done)
    if count == restarts:
      state = search.drive(state, restart_data, None, done + taken, n - taken,
                           lambda s, d: make(_slice(fetch(s), slice(0, restarts)), d), count)
    elif mesh is None:
      per = None if restart_data is None else _take(restart_data, survivors)
      sub = search.drive(_take(state, survivors), per, None, done + taken, n - taken,
                         lambda s, d: make(_set_rows(fetch(state), survivors, fetch(s)), d), count)
      state = _scatter(state, survivors, sub)
    else:
      if not on_host:
        state, restart_data, on_host = fetch(state), fetch(restart_data), True
      index = np.asarray(survivors)
      sub, per = shard_restarts((_slice(state, index), per_of(index)), mesh)
      full = lambda s, d: make(_slice(_set_rows(state, index, _slice(fetch(s), slice(0, count))),
                                      slice(0, restarts)), d)
      sub = _slice(fetch(search.drive(sub, per, None, done + taken, n - taken, full, count)),
                   slice(0, count))
      state = _set_rows(state, index, sub)
    done += n
    last = (i, survivors, n)
    survivors = _rank(fetch(state.best_loss)[:restarts], survivors)
  if last is not None:
    search.save_final(_slice(fetch(state), slice(0, restarts)), last[0], last[1], 0, last[2])
  if on_host:
    state, restart_data = shard_restarts((state, restart_data), mesh)
  return search.final(state, restart_data)


def _run(solver: Solver, init_params: PyTree, data: PyTree, iterations: int, execution: Execution,
         restart_data: PyTree, mesh: jax.sharding.Mesh | None, restarts: int) -> SolverState:
  """The restart search of :func:`run`: the plan, the snapshot to continue from, the strategy
  (tuned, or the snapshot's), then the strategy's loop."""
  ex = execution
  plan = halving_plan(iterations, restarts, ex.halving_rounds, ex.halving_keep)
  snap = None
  if ex.saver is not None:
    snap = ex.saver.restore(
        lambda: _state_shapes(solver, init_params, data, restart_data, restarts))
  strategy = resolve_strategy(ex.strategy)
  fit = None
  if ex.strategy == "auto" and strategy == "vmap" and mesh is None and restarts > 1:
    free = free_memory()
    if free is not None:
      fit = fit_strategy(solver, init_params, data, free=free, execution=ex,
                         restart_data=restart_data)
      strategy = fit.strategy
      ex = dataclasses.replace(ex, map_batch_size=fit.map_batch_size)
  if snap is not None:
    # A snapshot's position means the same for the two strategies that run the restarts together
    # (vmap, map), another thing in a sequence: it continues under any strategy of its kind.
    same_kind = (snap.strategy == "sequential") == (strategy == "sequential")
    if strategy == "tune" or (ex.strategy == "auto" and not same_kind):
      strategy = snap.strategy  # what the timing or the device chose then (it may choose otherwise now)
      if strategy == "map" and ex.strategy == "auto":  # as many at a time as fit
        ex = dataclasses.replace(ex, map_batch_size=1 if fit and fit.strategy == "sequential"
                                 else restarts)
    elif not same_kind:
      raise ValueError(f"the saved run used restart strategy {snap.strategy!r}, this one "
                       f"{strategy!r}; resume with --config.execution.strategy={snap.strategy}")
    if (not 0 <= snap.round < len(plan) or len(snap.survivors) != plan[snap.round][0]
        or not 0 <= snap.position <= len(snap.survivors)
        or not 0 <= snap.steps <= plan[snap.round][1]):
      raise ValueError("the saved run's position does not fit this run's iterations and halving "
                       "plan")
  elif strategy == "tune":
    strategy, _ = tune_strategy(solver, init_params, data, steps=min(ex.chunk, iterations, 10),
                                execution=ex, restart_data=restart_data)
  note = ""
  if fit is not None and strategy == fit.strategy != "vmap":
    how = "one at a time" if strategy == "sequential" else f"{ex.map_batch_size} at a time"
    note = (f"{restarts} restarts vmapped need {_size(fit.need)}, more than the "
            f"{_size(fit.budget)} of the device's free memory a run takes: {how}")
  search = _Search(solver, data, iterations, ex, strategy, mesh, restarts, plan, snap, note)
  loop = _sequential if strategy == "sequential" else _together
  return loop(search, init_params, restart_data)


def _size(n: int) -> str:
  """``n`` bytes in the largest binary unit that keeps them at 1 or more: ``"2.5 GiB"``."""
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024


def _check_restart_data(restart_data, restarts: int) -> None:
  for leaf in jax.tree.leaves(restart_data):
    if leaf.shape[:1] != (restarts,):
      raise ValueError(f"restart_data needs a leading axis of {restarts} restarts, got {leaf.shape}")


def _set_rows(x, index, rows):
  """A copy of host array ``x`` with ``x[index] = rows`` (of every leaf, for pytrees)."""
  def put(a, r):
    a = np.array(a)
    a[index] = r
    return a
  return jax.tree.map(put, x, rows)



def _rank(best_loss, survivors):
  """``survivors`` sorted by best objective (non-finite last), ties by index (on the host)."""
  best_loss = np.asarray(jax.device_get(best_loss))
  loss = np.where(np.isfinite(best_loss), best_loss, np.inf)[survivors]
  return survivors[np.argsort(loss, kind="stable")]
