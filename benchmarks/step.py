r"""Cost of one DLG iteration relative to one ordinary training step, in JAX and in PyTorch eager.

For each model, on the current JAX default device, this times two jitted programs on a batch of real
photos (scikit-image's bundled ones, 32x32):

* plain step: ``jax.value_and_grad`` of the client's mean cross entropy w.r.t. the parameters, i.e. the
  gradient of one ordinary training step (what a FedSGD client computes);
* matching step: ``jax.value_and_grad`` w.r.t. the dummy ``{"x", "label_logits"}`` of the DLG objective
  ``gradient_matching(apply_fn, distances.euclidean)`` against a ``clients.fedsgd`` observation, i.e. one
  DLG optimizer evaluation (a double backward through the model).

and reports the median and interquartile range (IQR) of the wall-clock time per call over ``--repeats``
calls after ``--warmup`` calls (``time.perf_counter`` around the call and ``jax.block_until_ready``), the
ratio matching / plain, and separately the time to trace and compile each program (ahead of time, so it
is never part of the timed calls).

When PyTorch is importable (``--torch=auto``) the same architecture is rebuilt in PyTorch here (weights
are drawn independently; parameter counts are checked to be equal) and timed in eager mode the way the
DLG reference code runs an iteration: plain = ``torch.autograd.grad(loss, params)``; matching =
``torch.autograd.grad(dummy_loss, params, create_graph=True)``, the summed squared difference to the
observed gradient, then ``backward`` to the dummy data and dummy label (soft-label cross entropy
``mean(sum(-softmax(label) * log_softmax(pred), -1))``).

Both frameworks run the models in inference mode: BatchNorm normalises with its running statistics
(``train=False`` in JAX, ``model.eval()`` in PyTorch), as in the zoo's default observation.

Run::

  python -m benchmarks step
  python -m benchmarks step --models=lenet_zhu,convnet,resnet20-4 --batch_size=4 \
      --repeats=50 --output=/tmp/bench.json --torch=on

Caveats:

* CPU numbers depend on the number of threads: XLA:CPU uses its own intra-op thread pool (one thread
  per core it may run on), PyTorch ``torch.get_num_threads()`` OpenMP threads (left at its default;
  printed). On a small shared machine PyTorch's threads wait on each other whenever another process
  takes a core, and its double backward can slow down 10-100x; ``taskset -c 0 python ...`` gives both
  frameworks one core and one thread and much steadier numbers.
* This compares two different stacks, not only two frameworks: XLA:CPU compiles each step into one
  optimised program with its own (Eigen-based) convolution kernels, while PyTorch eager dispatches op
  by op to ATen/oneDNN kernels with per-op overhead, which dominates for tiny models such as the LeNets.
* The PyTorch matching step differentiates only w.r.t. the dummy data and label
  (``backward(inputs=...)``), as the JAX one does; the DLG code's bare ``grad_diff.backward()`` also
  accumulates the (unused) second-order gradient of the parameters, which costs more.
* ``--max_seconds`` caps each measurement: a heavy model may get fewer than ``--repeats`` samples (at
  least 3); the number actually taken is reported.
"""

import contextlib
import dataclasses
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from typing import Callable, Iterator, NamedTuple

import flax
import jax
import jax.numpy as jnp
import jaxlib
import ml_dtypes
import numpy as np
from absl import app, flags

from benchmarks import torch_ports
from gradjax.cli.common import cpu_model
from gradjax.cli import common

import gradjax
from gradjax import (attacks, clients, compilation, data, distances, driver, lbfgs, models,
                     optimizers, presets, solvers)
from gradjax.losses import cross_entropy
from gradjax.objectives import gradient_matching

_MODELS = common.define_models_flag()
_FIELDS = common.define_fields("data.batch_size", "seed")  # batch_size photos, repeated past 16
_BATCH_SIZE, _SEED = _FIELDS["data.batch_size"], _FIELDS["seed"]
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per measurement (after warm-up).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed calls before each measurement.")
_MAX_SECONDS = flags.DEFINE_float("max_seconds", 10.0,
                                  "Stop a measurement after this many seconds even if fewer than --repeats "
                                  "calls were timed (at least 3 are).")
_OUTPUT = common.define_results_file_flag()
_TORCH = flags.DEFINE_enum("torch", "auto", ["auto", "on", "off"],
                           "PyTorch eager baseline: auto = when importable, on = required, off = skip.")

NUM_CLASSES = 10
IMAGE_SIZE = (32, 32)
MIN_SAMPLES = 3
BN_MODE = "eval: BatchNorm uses running statistics (JAX train=False, PyTorch model.eval())"


# --------------------------------------------------------------------------------------------------
# Timing.


def time_calls(fn: Callable[[], object], *, repeats: int, warmup: int, max_seconds: float) -> np.ndarray:
  """Seconds taken by each of up to ``repeats`` calls of ``fn`` after ``warmup`` untimed calls.

  ``fn`` must return only once its work is done (block on JAX results). Timing stops early once
  ``max_seconds`` have passed and at least ``MIN_SAMPLES`` calls were timed.
  """
  for _ in range(warmup):
    fn()
  samples = []
  start = time.perf_counter()
  while len(samples) < repeats:
    t0 = time.perf_counter()
    fn()
    samples.append(time.perf_counter() - t0)
    if len(samples) >= MIN_SAMPLES and time.perf_counter() - start > max_seconds:
      break
  return np.asarray(samples)


def summarize(seconds: np.ndarray) -> dict:
  """Median, quartiles and IQR in milliseconds, plus the raw samples."""
  ms = 1e3 * seconds
  q25, median, q75 = np.percentile(ms, [25, 50, 75])
  return dict(median_ms=float(median), q25_ms=float(q25), q75_ms=float(q75), iqr_ms=float(q75 - q25),
              n=int(ms.size), samples_ms=[round(float(t), 4) for t in ms])


def measure(fn, **timing_kwargs) -> dict:
  return summarize(time_calls(fn, **timing_kwargs))


# --------------------------------------------------------------------------------------------------
# JAX.


def photos(n: int, size=(32, 32)) -> data.Dataset:
  """``n`` scikit-image photos (cycling through the 16) at ``size``, with their labels i % 10."""
  return data.load("skimage", indices=[i % len(data.SKIMAGE_PHOTOS) for i in range(n)],
                   image_size=size)


def _dlg_evaluation(model):
  """One evaluation of DLG's objective and its gradient w.r.t. the dummy, ``(dummy, obs)``."""
  return jax.value_and_grad(gradient_matching(model.apply_fn, distances.euclidean))


def step_memory(name: str, batch: int, seed: int) -> dict:
  """The matching step's compiled memory footprint (bytes) and, where reported, the device peak."""
  x = photos(batch).x
  model = models.create(name, jax.random.key(seed), input_shape=x.shape[1:], num_classes=NUM_CLASSES)
  obs = clients.fedsgd(model.apply_fn, model.variables, x, np.zeros(batch, np.int32))
  step = _dlg_evaluation(model)
  dummy = {"x": jnp.zeros(x.shape, jnp.float32),
           "label_logits": jnp.zeros((batch, NUM_CLASSES), jnp.float32)}
  compiled = jax.jit(step).lower(dummy, obs).compile()
  analysis = compiled.memory_analysis()
  out = {"compiled_bytes": None, "peak_bytes_in_use": None}
  if analysis is not None:
    out["compiled_bytes"] = int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                                + analysis.temp_size_in_bytes)
  jax.block_until_ready(compiled(dummy, obs))
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    out["peak_bytes_in_use"] = int(stats["peak_bytes_in_use"])
  return out


def matmul_peak(size: int = 1024, repeats: int = 10) -> float:
  """The device's measured float32 matrix-product rate (FLOP/s): the fastest of ``repeats`` calls of
  a jitted ``jnp.dot`` of two ``size`` × ``size`` matrices (2 size³ flops)."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  dot = jax.jit(jnp.dot)
  seconds = time_calls(lambda: jax.block_until_ready(dot(a, a)), repeats=repeats, warmup=2,
                       max_seconds=10.0)
  return 2.0 * size**3 / float(seconds.min())


def read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
  """Bytes per second of one pass over a float32 buffer of ``megabytes`` (far larger than the
  caches): the fastest of ``repeats`` calls of a jitted sum."""
  a = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  seconds = time_calls(lambda: jax.block_until_ready(total(a)), repeats=repeats, warmup=1,
                       max_seconds=10.0)
  return a.nbytes / float(seconds.min())


def _dlg_problem(seed: int, conv: str = "auto"):
  """DLG on ``lenet_zhu`` (its convolutions computed as ``conv``) and one photo: (model,
  observation)."""
  x = photos(1)
  model = models.create("lenet_zhu", jax.random.key(seed), input_shape=(32, 32, 3),
                        num_classes=NUM_CLASSES, conv=conv)
  return model, clients.fedsgd(model.apply_fn, model.variables, x.x, x.y)


def _flops(compiled) -> float:
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis["flops"])


def dlg_evaluation_flops(model, obs) -> float:
  """XLA's cost analysis of one evaluation of DLG's objective and its gradient (one restart)."""
  dummy = {"x": jnp.zeros((1, 32, 32, 3), jnp.float32), "label_logits": jnp.zeros((1, NUM_CLASSES))}
  return _flops(jax.jit(_dlg_evaluation(model)).lower(dummy, obs).compile())


def restart_profile(counts, seed: int, *, repeats: int = 10, max_seconds: float = 10.0) -> dict:
  """Where a vmapped DLG iteration on ``lenet_zhu`` spends its time, per restart count R.

  * ``step_ms``: R vmapped evaluations of the objective and its gradient (one jitted program,
    compiled as the solver's step is), median; ``gflops``: XLA's cost analysis of that program over
    its time, and ``peak_fraction`` over the measured :func:`matmul_peak`.
  * ``lbfgs_ms``: R vmapped L-BFGS updates alone (:func:`gradjax.lbfgs.scale_by_lbfgs` with the
    ``dlg`` preset's history m, on a quadratic so that pairs are stored): the direction's products
    and the memory update, median.
  * ``history_mb``: the R restarts' stored pairs, 2 m n float32 values each (n the dummy's size);
    ``floor_ms``: two passes over them (the direction reads S and Y before it can combine them) at
    the measured :func:`read_bandwidth`, a lower bound on ``lbfgs_ms`` once the history leaves
    the caches.

  Returns ``{"peak_flops", "bandwidth", "flops_per_evaluation", "history", "rows": [...]}``.
  """
  model, obs = _dlg_problem(seed)
  memory_size = presets.dlg().optimizer.history
  step = jax.vmap(_dlg_evaluation(model), in_axes=(0, None))
  tx = lbfgs.scale_by_lbfgs(memory_size=memory_size)

  def lbfgs_update(state, params, target):
    updates, state = tx.update(params - target, state, params)
    return state, params + updates

  update = jax.vmap(lbfgs_update)
  peak, bandwidth = matmul_peak(), read_bandwidth()
  flops_one = dlg_evaluation_flops(model, obs)
  size = 32 * 32 * 3 + NUM_CLASSES
  timing = dict(repeats=repeats, warmup=2, max_seconds=max_seconds)
  rows = []
  for r in counts:
    key = jax.random.key(r)
    dummy = {"x": jax.random.normal(key, (r, 1, 32, 32, 3)),
             "label_logits": jax.random.normal(key, (r, 1, NUM_CLASSES))}
    options = compilation.options(compilation.BATCHED_STEP)
    compiled = jax.jit(step, compiler_options=options).lower(dummy, obs).compile()
    step_s = np.median(time_calls(lambda: jax.block_until_ready(compiled(dummy, obs)), **timing))
    params = jax.random.normal(key, (r, size))
    target = jax.random.normal(jax.random.fold_in(key, 1), (r, size))
    state = jax.vmap(tx.init)(params)
    run = jax.jit(update, donate_argnums=(0, 1), compiler_options=options)
    holder = [state, params]

    def one_update():
      holder[0], holder[1] = run(holder[0], holder[1], target)
      jax.block_until_ready(holder[1])

    lbfgs_s = np.median(time_calls(one_update, **timing))
    history = r * 2 * memory_size * size * 4
    flops = _flops(compiled)
    rows.append(dict(restarts=r, step_ms=1e3 * step_s, gflops=flops / step_s / 1e9,
                     peak_fraction=flops / step_s / peak, flops_over_one=flops / flops_one,
                     lbfgs_ms=1e3 * lbfgs_s, history_mb=history / 2**20,
                     floor_ms=1e3 * 2 * history / bandwidth))
    print(f"restart profile {rows[-1]}", flush=True)
  return dict(peak_flops=peak, bandwidth=bandwidth, flops_per_evaluation=flops_one,
              history=memory_size, rows=rows)


def restart_timings(counts, iterations: int, strategies, map_batch_size: int, seed: int,
                    conv: str = "auto") -> Iterator[dict]:
  """Rows, one at a time as measured: the wall time of ``iterations`` DLG iterations on ``lenet_zhu``
  (one photo) for each restart count and strategy, compilation excluded (a first, untimed run
  compiles), and the ratio to one restart (``over_one``, None without a count of 1). ``gflops``: the
  objective evaluations the run made (line-search ones included) times XLA's count for one
  (:func:`dlg_evaluation_flops`), over the wall time. ``conv``: how the model computes its
  convolutions (``gradjax.models.CONVS``; under vmap XLA's own convolutions of the per-restart
  weight gradients become grouped ones, 64 groups for 64 restarts, im2col's are batched matrix
  products)."""
  model, obs = _dlg_problem(seed, conv)
  flops_one = dlg_evaluation_flops(model, obs)
  attack = presets.dlg(iterations)
  for strategy in strategies:
    base = None
    for r in counts:
      kw = dict(input_shape=(32, 32, 3), restarts=r, execution=driver.Execution(
          strategy, chunk=iterations, map_batch_size=min(map_batch_size, r)))
      attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(1), **kw)  # compiles
      start = time.perf_counter()
      rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), **kw)
      seconds = time.perf_counter() - start
      base = seconds if r == 1 else base
      row = dict(strategy=strategy, conv=models.resolve_conv(conv), restarts=r,
                 seconds=seconds, ms_per_iteration=1e3 * seconds / iterations,
                 over_one=None if base is None else seconds / base,
                 evaluations=int(rec.evaluations.sum()),
                 gflops=int(rec.evaluations.sum()) * flops_one / seconds / 1e9)
      print(f"restarts {row}", flush=True)
      yield row


def _client_model(seed: int, conv: str) -> models.Model:
  """The round's ``lenet_zhu`` (one draw per ``seed``), its convolutions by ``conv``."""
  return models.create("lenet_zhu", jax.random.key(seed), input_shape=(32, 32, 3),
                       num_classes=NUM_CLASSES, conv=conv)


def client_observations(count: int, seed: int, conv: str = "auto"):
  """``count`` clients of one round: FedSGD on ``lenet_zhu`` (one draw, convolutions by ``conv``),
  one photo each, the 16 photos cycled and client i's shifted by i // 16 pixels so no two updates are
  the same. Returns (model, observations)."""
  model = _client_model(seed, conv)
  images = photos(count)
  return model, [clients.fedsgd(model.apply_fn, model.variables,
                                np.roll(images.x[i:i + 1], i // 16, axis=2), images.y[i:i + 1],
                                share_labels=True) for i in range(count)]


def client_timings(counts, iterations: int, strategies, seed: int,
                   attack_names=("dlg", "inverting_gradients"), conv: str = "auto",
                   one_by_one: bool = True) -> Iterator[dict]:
  """Rows, one at a time as measured: the wall time of ``iterations`` of an attack on K clients of
  ``lenet_zhu`` (one restart each), compilation excluded (a first, untimed run compiles):
  ``together_s``, the K clients as the runs of one solver run
  (:func:`gradjax.attacks.reconstruct_clients`) under ``strategy``; ``one_by_one_s``, K calls of
  :func:`gradjax.attacks.reconstruct`, as an audit attacked a round's clients before (the baseline,
  run in the same process); ``over_one``: ``together_s`` over one client's time alone (the issue's
  "64 clients <= 3x one"); ``speedup``: ``one_by_one_s / together_s``. What a user waits for, the
  first call's time, compilation included: ``together_cold_s`` (the K clients' first run together),
  ``one_cold_s`` (one client's first run alone, its program compiled once for every K) and
  ``over_one_cold``, their ratio (measured where the counts include 1). The model's convolutions are
  ``conv`` as an audit resolves it (:func:`gradjax.models.resolve_conv`): batched for K > 1 clients
  vmapped or mapped together, not for one client alone (``conv`` in the rows: the together run's).
  The same parameters either way. ``one_by_one=False``: the K runs one by one only for K = 1
  (``one_by_one_s`` and ``speedup`` None for the others), for budgets where they would take long."""
  model, observations = client_observations(max(counts), seed, models.resolve_conv(conv))
  batched_model = _client_model(seed, models.resolve_conv(conv, batched=True))
  for name in attack_names:
    attack = presets.get_preset(name)(iterations=iterations)
    kw = dict(input_shape=(32, 32, 3))
    alone, cold = {}, {}
    for k in sorted(set(counts)):
      obs, keys = observations[:k], list(jax.random.split(jax.random.key(seed + 1), k))
      single = driver.Execution("sequential", chunk=iterations)
      if "one" not in cold:  # the first k's call compiles one client's programs
        start = time.perf_counter()
        attacks.reconstruct(attack, model.apply_fn, obs[0], keys[0], execution=single, **kw)
        cold["one"] = time.perf_counter() - start
      if one_by_one or k == 1:
        start = time.perf_counter()
        for o, key in zip(obs, keys):
          attacks.reconstruct(attack, model.apply_fn, o, key, execution=single, **kw)
        alone[k] = time.perf_counter() - start
      for strategy in strategies:
        execution = driver.Execution(strategy, chunk=iterations)
        together = batched_model if k > 1 and strategy != "sequential" else model
        start = time.perf_counter()
        attacks.reconstruct_clients(attack, together.apply_fn, obs, keys, execution=execution, **kw)
        together_cold = time.perf_counter() - start
        start = time.perf_counter()
        attacks.reconstruct_clients(attack, together.apply_fn, obs, keys, execution=execution, **kw)
        seconds = time.perf_counter() - start
        row = dict(attack=name, strategy=strategy, clients=k, iterations=iterations,
                   conv=models.resolve_conv(conv, batched=together is batched_model),
                   together_s=seconds, one_by_one_s=alone.get(k),
                   over_one=seconds / alone[1] if 1 in alone else None,
                   speedup=alone[k] / seconds if k in alone else None,
                   together_cold_s=together_cold, one_cold_s=cold["one"],
                   over_one_cold=together_cold / cold["one"] if 1 in alone else None)
        print(f"clients {row}", flush=True)
        yield row


class SolverJob(NamedTuple):
  """:func:`_solver_job`: the attack, its solver, the driver's first state of the restarts (stacked;
  the schedule spread over the budget), and each restart's data (``both``: the shared data and the
  label orders, as :mod:`gradjax.driver` passes them; ``axes``, their ``in_axes``)."""

  attack: attacks.Attack
  solver: solvers.Solver
  state: solvers.SolverState
  both: tuple
  axes: tuple

  def chunk(self, step, states, both):
    """``step(state, data)`` vmapped over ``states`` with each restart's data of ``both`` (an
    argument of the program that calls it, as in the driver's: closed over, the model's weights
    and the observed update would be constants of the program, folded when it compiles)."""
    return jax.vmap(step, in_axes=self.axes)(states, both)


def _solver_job(preset: str, name: str, restarts: int, iterations: int, seed: int, conv: str = "auto"):
  """An attack's solver as the driver runs it, for :func:`loop_timings` and :func:`compile_anatomy`:
  ``preset`` at ``iterations`` on ``name`` (its convolutions ``conv`` resolved for ``restarts``), the
  photo of :func:`photos`, the client's FedSGD update with its label shared (what the presets with
  known labels, Inverting Gradients', read; the others infer it): a :class:`SolverJob`."""
  x = photos(1)
  model = models.create(name, jax.random.key(seed), input_shape=(32, 32, 3), num_classes=NUM_CLASSES,
                        conv=models.resolve_conv(conv, batched=restarts > 1))
  obs = clients.fedsgd(model.apply_fn, model.variables, x.x, x.y, share_labels=True)
  attack = presets.get_preset(preset)(iterations=iterations)
  problem = attacks.prepare(attack, model.apply_fn, obs, jax.random.key(seed + 1),
                            input_shape=(32, 32, 3), restarts=restarts)
  num_leaves = len(jax.tree.leaves(obs.gradient))
  solver = attacks._solver(attack, model.apply_fn, num_leaves)  # pylint: disable=protected-access
  data = attacks.scheduled(attack, problem.data, num_leaves)
  both, axes = (data, problem.restart_data), (0, (None, 0))

  def first(params, restart_data):  # the driver's first state (driver._compiled)
    state = solver.init(params, restart_data)
    return state._replace(opt_state=optimizers.at_budget(state.opt_state,
                                                         optimizers.budget(iterations)))

  state = jax.vmap(first, in_axes=axes)(problem.init, both)
  return SolverJob(attack, solver, state, both, axes)


def loop_timings(jobs, iterations: int, seed: int, conv: str = "auto") -> Iterator[dict]:
  """Rows, one at a time as measured: a chunk of ``iterations`` steps of an attack's solver as the
  driver runs it on an accelerator, a while loop whose step count is an argument
  (:func:`gradjax.driver.repeat`: one program for every chunk, a budget's remainder and the last
  iterate's scoring step), against the same steps in a loop with the count compiled in (a
  ``lax.fori_loop`` of a constant count, what the driver ran before: a program per count, one more
  for a budget's remainder); for a solver with ``advance`` (L-BFGS), also the loop the driver runs
  for it, one line-search trial a trip (``one trial a trip``: each vmapped restart searches on its
  own). ``jobs``: (preset, model, restarts) triples, the restarts vmapped (:func:`_solver_job`), the
  state not donated.
  Per loop: ``compile_s`` (tracing, lowering and compiling the chunk's program, after an untimed
  compilation of one step, so neither loop pays alone what a process pays once: the first tracing
  of the model, an accelerator's autotuning of its convolutions) and ``ms_per_iteration`` (the median
  of 3 timed calls after an untimed one, all from the same first state); ``over_constant``, the
  loop's ms over the constant one's, in the same process."""
  for preset, name, restarts in jobs:
    job = _solver_job(preset, name, restarts, iterations, seed, conv)
    solver, state, chunk, both = job.solver, job.state, job.chunk, job.both
    loops = {"count compiled in": (lambda s, b: chunk(lambda r, d: jax.lax.fori_loop(
                 0, iterations, lambda _, q: solver.step(q, d), r), s, b), (state, both)),
             "count as data": (lambda s, b, n: chunk(lambda r, d: driver.repeat(
                 lambda q: solver.step(q, d), r, n), s, b), (state, both, iterations))}
    if solver.advance is not None:  # what the driver runs for L-BFGS
      loops["one trial a trip"] = (lambda s, b, n: chunk(lambda r, d: solver.advance(r, d, n), s, b),
                                   (state, both, iterations))
    # The driver's compiler options for a vmapped step (gradjax.driver._compiled).
    options = compilation.options(compilation.step_options(batched=True))
    with driver.precision_scope("float32"):  # the untimed step (see the docstring)
      jax.jit(lambda s, b: chunk(solver.step, s, b), compiler_options=options).lower(state, both).compile()
    ms = {}
    for loop, (fn, args) in loops.items():
      start = time.perf_counter()
      with driver.precision_scope("float32"):  # as the attacks run (driver.Execution)
        compiled = jax.jit(fn, compiler_options=options).lower(*args).compile()
      compile_s = time.perf_counter() - start
      jax.block_until_ready(compiled(*args))
      ms[loop] = 1e3 * float(np.median([_seconds(compiled, args) for _ in range(3)])) / iterations
      row = dict(attack=preset, model=name, restarts=restarts, loop=loop, iterations=iterations,
                 compile_s=compile_s, ms_per_iteration=ms[loop],
                 over_constant=(ms[loop] / ms["count compiled in"]
                                if loop != "count compiled in" else None))
      print(f"loops {row}", flush=True)
      yield row


@contextlib.contextmanager
def compiled_afresh():
  """Within it, programs are compiled, not loaded from JAX's persistent compilation cache (its
  setting restored on leaving)."""
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)


# An HLO instruction in XLA's text: ``name = shape opcode(operands)``.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.-]+\s*=\s*.*?\s([a-z][a-z0-9-]*)\(")


def hlo_counts(text: str) -> tuple[int, int]:
  """(instructions, fusions) in an HLO module's text (``Lowered.as_text("hlo")``,
  ``Compiled.as_text()``): its instructions in every computation, and those that are fusions (after
  optimisation, each a kernel of its own on a GPU)."""
  ops = [m.group(1) for m in map(_INSTRUCTION.match, text.splitlines()) if m]
  return len(ops), ops.count("fusion")


ANATOMY_CHUNK = 100  # steps of the chunk program's loop (a traced count: any count, one program)


def compile_anatomy(jobs, repeats: int, seed: int) -> Iterator[dict]:
  """Where the compilation of an attack's first result goes: per (preset, model[, restarts[, conv]])
  of ``jobs`` (one restart, ``auto``'s convolutions unless given), the restarts on the photo of
  :func:`photos` (:func:`_solver_job`), each of the programs below lowered
  and compiled afresh ``repeats`` times (the in-memory caches cleared, the persistent one off), in
  this order, with the driver's options for a step:

  * ``first state``: the solver's first state: with L-BFGS one value and gradient of the objective,
    whose line search starts from them (the objective's share of the step); Adam's holds zeros. The
    driver's ``solver_init`` is this program compiled with :data:`gradjax.compilation.ONCE`, on the
    host's CPU where the default device is an accelerator;
  * ``step``: one iteration (what the driver calls on CPU);
  * ``chunk``: a loop of the step whose count is an argument (:func:`gradjax.driver.repeat`, the
    driver's ``solver_steps`` on an accelerator);
  * ``step, quadratic objective``: the same optimizer's iteration on Σ x² over the same dummy data:
    the solver's own share of ``step``;
  * ``step, quadratic objective, no line search`` (L-BFGS only): the same with fixed steps
    (``lbfgs_fixed``, same history): the direction's share, the line search's being the difference.

  As the driver runs one restart: unbatched on CPU, vmapped on an accelerator (several restarts:
  vmapped everywhere). Per row (with its ``restarts`` and resolved ``conv``): the seconds
  of the first lowering and compilation (``lower_first_s``, ``compile_first_s``: on a GPU the
  first includes the autotuning of its convolutions and products, whose results XLA keeps for
  the later compilations in the process) and the median of all (``lower_s``, ``compile_s``), and
  the program's HLO instructions as lowered (``hlo_ops``) and as compiled (``compiled_ops``, of which
  ``fusions``)."""
  cpu = jax.default_backend() == "cpu"
  with compiled_afresh():
    for preset, name, *more in jobs:
      restarts, conv = int(more[0]) if more else 1, more[1] if len(more) > 1 else "auto"
      alone = cpu and restarts == 1  # the driver's sequential strategy: the restart unbatched
      options = compilation.options(compilation.step_options(batched=not alone))
      job = _solver_job(preset, name, restarts, ANATOMY_CHUNK, seed, conv)
      square = lambda x, data, step: sum(jnp.sum(jnp.square(v)) for v in jax.tree.leaves(x))
      quadratic = solvers.make_solver(square, attacks.build_optimizer(job.attack), tol=job.attack.tol)
      optimizer = job.attack.optimizer
      fixed = (solvers.make_solver(square, attacks.build_optimizer(dataclasses.replace(
                   job.attack, optimizer=dataclasses.replace(optimizer, name="lbfgs_fixed"))),
                   tol=job.attack.tol)
               if isinstance(optimizer, optimizers.Named) and optimizer.name == "lbfgs" else None)
      if alone:  # the restart alone, with its data (the driver's sequential strategy)
        state = jax.tree.map(lambda v: v[0], job.state)
        data = (job.both[0], jax.tree.map(lambda v: v[0], job.both[1]))
        run = lambda step, s, d: step(s, d)
      else:
        state, data, run = job.state, job.both, job.chunk
      solver = job.solver
      start_of = lambda solver, params, d: run(lambda p, dd: solver.init(p, dd), params, d)
      quadratic_state = start_of(quadratic, state.params, data)
      programs = {
          "first state": (lambda p, d: start_of(solver, p, d), (state.params, data)),
          "step": (lambda s, d: run(solver.step, s, d), (state, data)),
          "chunk": (lambda s, d, n: run(lambda r, dd: driver.repeat(lambda q: solver.step(q, dd), r, n),
                                        s, d), (state, data, ANATOMY_CHUNK)),
          "step, quadratic objective": (lambda s, d: run(quadratic.step, s, d), (quadratic_state, data)),
      }
      if fixed is not None:
        programs["step, quadratic objective, no line search"] = (
            lambda s, d: run(fixed.step, s, d), (start_of(fixed, state.params, data), data))
      for program, (fn, args) in programs.items():
        lowering, compiling = [], []
        for _ in range(repeats):
          jax.clear_caches()
          start = time.perf_counter()
          with driver.precision_scope("float32"):  # as the attacks run (driver.Execution)
            lowered = jax.jit(fn, compiler_options=options).lower(*args)
          lowering.append(time.perf_counter() - start)
          start = time.perf_counter()
          compiled = lowered.compile()
          compiling.append(time.perf_counter() - start)
        hlo_ops, _ = hlo_counts(lowered.as_text(dialect="hlo"))
        compiled_ops, fusions = hlo_counts(compiled.as_text())
        row = dict(attack=preset, model=name, restarts=restarts,
                   conv=models.resolve_conv(conv, batched=restarts > 1), program=program,
                   platform=jax.default_backend(),
                   repeats=repeats, lower_first_s=lowering[0], compile_first_s=compiling[0],
                   lower_s=float(np.median(lowering)), compile_s=float(np.median(compiling)),
                   hlo_ops=hlo_ops, compiled_ops=compiled_ops, fusions=fusions)
        print(f"anatomy {row}", flush=True)
        yield row


def anatomy_markdown(rows: list[dict]) -> list[str]:
  """:func:`compile_anatomy`'s rows as a Markdown table."""
  lines = ["| attack | model | restarts | conv | program | lower (s): first, median | "
           "compile (s): first, median | HLO instructions | compiled | fusions |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['attack']} | {r['model']} | {r.get('restarts', 1)} | {r.get('conv', '-')} | "
                 f"{r['program']} | {r['lower_first_s']:.2f}, "
                 f"{r['lower_s']:.2f} | {r['compile_first_s']:.2f}, {r['compile_s']:.2f} | {r['hlo_ops']} | "
                 f"{r['compiled_ops']} | {r['fusions']} |")
  return lines


def _seconds(compiled, args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return time.perf_counter() - start


def count_params(tree) -> int:
  return int(sum(leaf.size for leaf in jax.tree.leaves(tree)))


def compile_ahead(fn, *args):
  """``jax.jit(fn)`` traced, lowered and compiled for ``args``; returns (executable, seconds)."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - t0


def jax_steps(name: str, x: np.ndarray, y: np.ndarray, *, seed: int, conv: str = "auto"):
  """Zoo model ``name``'s plain and gradient-matching steps in JAX with their arguments:
  ``(model, plain_step, plain_args, match_step, match_args)``, convolutions computed by ``conv``
  (``gradjax.models.CONVS``)."""
  model = models.create(name, jax.random.key(seed), input_shape=x.shape[1:], num_classes=NUM_CLASSES,
                        conv=conv)
  x, y = jnp.asarray(x), jnp.asarray(y)

  def plain_step(variables, x, y):
    def loss(params):
      return cross_entropy(model.apply_fn({**variables, "params": params}, x, False), y)

    return jax.value_and_grad(loss)(variables["params"])

  observation = clients.fedsgd(model.apply_fn, model.variables, x, y)
  match_step = _dlg_evaluation(model)
  key_x, key_label = jax.random.split(jax.random.key(seed + 1))
  dummy = {"x": jax.random.normal(key_x, x.shape, x.dtype),
           "label_logits": jax.random.normal(key_label, (x.shape[0], NUM_CLASSES), x.dtype)}
  return model, plain_step, (model.variables, x, y), match_step, (dummy, observation)


def benchmark_jax(name: str, x: np.ndarray, y: np.ndarray, *, seed: int, conv: str = "auto",
                  **timing_kwargs) -> dict:
  """Times the plain and the gradient-matching step of zoo model ``name`` in JAX, with convolutions
  computed by ``conv`` (``gradjax.models.CONVS``)."""
  model, plain_step, plain_args, match_step, match_args = jax_steps(name, x, y, seed=seed, conv=conv)
  plain, plain_compile_s = compile_ahead(plain_step, *plain_args)
  match, match_compile_s = compile_ahead(match_step, *match_args)
  value, _ = match(*match_args)
  if not np.isfinite(float(value)):
    raise RuntimeError(f"{name}: the JAX matching objective is not finite ({float(value)})")
  return dict(
      framework="jax",
      conv=models.resolve_conv(conv),
      num_params=count_params(model.variables["params"]),
      plain=measure(lambda: jax.block_until_ready(plain(*plain_args)), **timing_kwargs),
      match=measure(lambda: jax.block_until_ready(match(*match_args)), **timing_kwargs),
      compile_s=dict(plain=plain_compile_s, match=match_compile_s),
  )


# --------------------------------------------------------------------------------------------------
# PyTorch eager baseline (the ports in benchmarks.torch_ports), only when it runs.


def last_line(text: str) -> str:
  """The last non-empty line of a process's output, for a one-line error."""
  return (text.strip().splitlines() or ["no output"])[-1]


# How many of a process's costliest programs :func:`reconstruct_processes` names.
COSTLIEST = 4


def reconstruct_processes(args: list[str], runs: int, environ: dict | None = None) -> list[dict]:
  """``gradjax reconstruct ARGS`` as ``runs`` whole processes, the first on an empty compilation
  cache and the others on the cache it filled: per process its wall time from outside
  (``process_s``), its attack's own ``wall_time_s`` (``attack_s``), its PSNR, and from the run's
  ``time`` the seconds of its set-up and scoring, the seconds spent making programs over the whole
  run (``programs_s``), how many programs it made or loaded (``programs``) and the :data:`COSTLIEST`
  that cost most (``costliest``, names and seconds).

  The processes write and reuse Python's bytecode as on a user's machine, also where this one runs
  with ``PYTHONDONTWRITEBYTECODE`` set (a container's default): without its bytecode every gradjax
  process compiles gradjax's sources again. Cold means an empty compilation cache; gradjax's
  bytecode may already be there from an earlier process. ``environ``: the processes' environment
  (None: this one's)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  environ = os.environ if environ is None else environ
  env = {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, "-m", "gradjax", "reconstruct", *args,
           f"--compilation_cache={os.path.join(tmp, 'cache')}",
           f"--output_dir={os.path.join(tmp, 'run')}", "--overwrite"]
    for _ in range(runs):
      start = time.perf_counter()
      proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
      seconds = time.perf_counter() - start
      if proc.returncode != 0:
        raise RuntimeError(f"gradjax reconstruct exited with status {proc.returncode}: "
                           f"{last_line(proc.stderr)}")
      with open(os.path.join(tmp, "run", "metrics.json"), encoding="utf-8") as fh:
        metrics = json.load(fh)
      phases = metrics["time"]["phases"]
      costliest = metrics["time"]["largest_programs"][:COSTLIEST]
      rows.append(dict(process_s=seconds, attack_s=metrics["wall_time_s"], psnr=metrics["psnr"],
                       setup_s=phases["setup"]["seconds"], scoring_s=phases["scoring"]["seconds"],
                       programs_s=sum(p["making_programs"] for p in phases.values()),
                       programs=metrics["time"]["programs"],
                       costliest=", ".join(f"{p['name']} {p['seconds']:.2f} s" for p in costliest)))
  return rows


def torch_steps(name: str, x: np.ndarray, y: np.ndarray, *, seed: int, device: str = "cpu"):
  """The PyTorch port of ``name`` in eager mode on ``device`` (``"cpu"`` or ``"cuda"``):
  ``(plain_step, match_step, number of parameters)``, each step a no-argument callable that returns
  once the device has finished it."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  model = torch_ports.build_torch_model(name, x.shape[1:], NUM_CLASSES).to(device).eval()
  params = list(model.parameters())
  x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device)  # NHWC -> NCHW
  y = torch.from_numpy(np.asarray(y, np.int64)).to(device)
  done = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

  def plain_step():
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    done()
    return loss, grads

  observed = [g.detach() for g in plain_step()[1]]
  dummy_x = torch.randn(x.shape, device=device, requires_grad=True)
  dummy_label = torch.randn(x.shape[0], NUM_CLASSES, device=device, requires_grad=True)

  def match_step():
    dummy_x.grad = dummy_label.grad = None  # optimizer.zero_grad()
    value = torch_ports.torch_dlg_objective(model, params, observed, dummy_x, dummy_label)
    done()
    return value

  if not torch.isfinite(match_step()):
    raise RuntimeError(f"{name}: the PyTorch matching objective is not finite")
  return plain_step, match_step, sum(p.numel() for p in params)


def benchmark_torch(name: str, x: np.ndarray, y: np.ndarray, *, seed: int, device: str = "cpu",
                    **timing_kwargs) -> dict:
  """Times the plain and the gradient-matching step of the PyTorch port of ``name`` in eager mode
  on ``device``."""
  plain_step, match_step, num_params = torch_steps(name, x, y, seed=seed, device=device)
  return dict(
      framework="torch",
      num_params=num_params,
      plain=measure(plain_step, **timing_kwargs),
      match=measure(match_step, **timing_kwargs),
      compile_s=None,
  )


# --------------------------------------------------------------------------------------------------
# Reporting.


def command_line() -> str:
  """This process's command as one would type it: ``<python> -m benchmarks <program> flags...``
  (the harness names the program ``python -m benchmarks <program>`` in ``sys.argv[0]``)."""
  head = sys.argv[0].split()
  head = head[1:] if head[:3] == ["python", "-m", "benchmarks"] else [sys.argv[0]]
  return shlex.join([sys.executable, *head, *sys.argv[1:]])


def torch_baseline():
  """The torch module of the PyTorch eager baseline as ``--torch`` asks (None: off, or auto
  without torch); one line and exit 2 where ``--torch=on`` and torch is not importable."""
  torch = None if _TORCH.value == "off" else torch_ports.import_torch()
  if torch is None and _TORCH.value == "on":
    fail("--torch=on but torch is not importable")
  return torch


def git_commit() -> str | None:
  """The commit of the checkout gradjax runs from (with ``+`` where its tracked files differ), or
  None outside a git checkout: which code a stored measurement ran."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return head + ("+" if dirty else "")


def environment(torch) -> dict:
  device = jax.devices()[0]
  env = dict(
      python=platform.python_version(), os=platform.platform(), cpu_model=cpu_model(),
      cpu_count=os.cpu_count(),
      cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
      jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__, gradjax=gradjax.__version__,
      commit=git_commit(),
      # Their imports are part of every process's start (pyproject.toml, ml_dtypes).
      numpy=np.__version__, ml_dtypes=ml_dtypes.__version__,
      platform=device.platform, device_kind=device.device_kind, num_devices=jax.device_count(),
      torch=None, torch_threads=None, torch_interop_threads=None,
      # What changes XLA's or gradjax's compilation without a flag of the command.
      variables={k: v for k, v in sorted(os.environ.items())
                 if k in ("XLA_FLAGS", "GRADJAX_FAST_COMPILE") or k.startswith("XLA_PYTHON_CLIENT_")},
  )
  if torch is not None:
    env.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
               torch_interop_threads=torch.get_num_interop_threads())
  return env


def _cell(stats: dict) -> str:
  return f"{stats['median_ms']:.3f} ({stats['iqr_ms']:.3f})"


def markdown_table(results: list[dict]) -> str:
  header = ("| model | batch | framework | plain ms | match ms | match/plain | compile s (plain / match) "
            "| torch/jax (match step) |")
  lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
  for r in results:
    compile_s = "-"
    if r["compile_s"] is not None:
      compile_s = f"{r['compile_s']['plain']:.2f} / {r['compile_s']['match']:.2f}"
    speedup = "-" if r.get("torch_over_jax_match") is None else f"{r['torch_over_jax_match']:.2f}x"
    lines.append(f"| {r['model']} | {r['batch_size']} | {r['framework']} | {_cell(r['plain'])} "
                 f"| {_cell(r['match'])} | {r['match_over_plain']:.2f} | {compile_s} | {speedup} |")
  return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Main.


def check_flags() -> str | None:
  """A one-line message for the first bad flag value, or None."""
  if not _MODELS.value:
    return "--models is empty"
  for name in _MODELS.value:
    try:
      models.get_module(name, num_classes=NUM_CLASSES, conv="xla")  # checks the name only
    except ValueError as e:
      return str(e)
  if _BATCH_SIZE.value < 1:
    return f"--batch_size must be at least 1, got {_BATCH_SIZE.value}"
  if _REPEATS.value < 1:
    return f"--repeats must be at least 1, got {_REPEATS.value}"
  if _WARMUP.value < 0:
    return f"--warmup must be non-negative, got {_WARMUP.value}"
  if _MAX_SECONDS.value <= 0:
    return f"--max_seconds must be positive, got {_MAX_SECONDS.value}"
  return None


def fail(message: str):
  """Exits with status 2 after a one-line error on stderr."""
  print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
  sys.exit(2)


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if (error := check_flags()) is not None:
    fail(error)
  common.check_output_file()
  torch = torch_baseline()

  env = environment(torch)
  command = command_line()
  print(f"command: {command}")
  print(f"device: {env['platform']} / {env['device_kind']} ({env['cpu_model']}, {env['cpu_count']} CPUs, "
        f"{env['cpu_affinity']} usable)")
  print(f"jax {env['jax']}, jaxlib {env['jaxlib']}, flax {env['flax']}; torch "
        + (f"{env['torch']} with {env['torch_threads']} threads" if torch else "not used"))
  print(f"BatchNorm mode: {BN_MODE}")

  batch = _BATCH_SIZE.value
  images = data.load("skimage", indices=[i % len(data.SKIMAGE_PHOTOS) for i in range(batch)],
                     image_size=IMAGE_SIZE)
  timing = dict(repeats=_REPEATS.value, warmup=_WARMUP.value, max_seconds=_MAX_SECONDS.value)

  results = []
  for name in _MODELS.value:
    rows = [benchmark_jax(name, images.x, images.y, seed=_SEED.value, **timing)]
    if torch is not None:
      rows.append(benchmark_torch(name, images.x, images.y, seed=_SEED.value, **timing))
      jax_params, torch_params = rows[0]["num_params"], rows[1]["num_params"]
      print(f"{name}: parameters jax {jax_params:,}, torch {torch_params:,}")
      if jax_params != torch_params:
        raise RuntimeError(f"{name}: the PyTorch port has {torch_params} parameters, JAX {jax_params}")
      rows[1]["torch_over_jax_match"] = rows[1]["match"]["median_ms"] / rows[0]["match"]["median_ms"]
    for row in rows:
      row.update(model=name, batch_size=batch,
                 match_over_plain=row["match"]["median_ms"] / row["plain"]["median_ms"])
      row.setdefault("torch_over_jax_match", None)
    results += rows

  print()
  print("Times: median (IQR) over the timed calls, in ms. torch/jax > 1: JAX is faster.")
  print()
  print(markdown_table(results))

  if _OUTPUT.value:
    config = dict(models=_MODELS.value, batch_size=batch, repeats=_REPEATS.value, warmup=_WARMUP.value,
                  max_seconds=_MAX_SECONDS.value, seed=_SEED.value, torch=_TORCH.value, bn_mode=BN_MODE,
                  images=list(images.class_names), image_size=list(IMAGE_SIZE), num_classes=NUM_CLASSES,
                  distance="euclidean (scale 1, DLG)")
    report = dict(command=command, argv=sys.argv, config=config, environment=env, results=results)
    with open(_OUTPUT.value, "w") as f:
      json.dump(report, f, indent=2)
    print(f"\nwrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
