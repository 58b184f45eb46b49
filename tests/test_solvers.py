"""Solvers on problems with closed-form answers; divergence isolation; restart strategies agree."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradjax import compilation, driver, optimizers, solvers



@pytest.fixture(autouse=True, scope="module")
def _float64():
  """These closed forms are checked to 1e-8 and below: float64 for this module only (a global
  ``jax.config.update`` here would turn on float64 for every module pytest imports after it)."""
  with jax.enable_x64(True):
    yield

# A fixed SPD quadratic: f(p) = 0.5 (p - c)^T A (p - c), minimiser c.
_RNG = np.random.default_rng(0)
_M = _RNG.normal(size=(6, 6))
A = _M @ _M.T + 6 * np.eye(6)
C = _RNG.normal(size=6)


def quadratic(params, data, step=0):
  d = params["p"] - data
  return 0.5 * d @ (jnp.asarray(A) @ d)


def stacked(*rows):
  return {"p": jnp.asarray(np.stack(rows), jnp.float64)}


@pytest.mark.parametrize("strategy", ["sequential", "vmap", "map"])
@pytest.mark.slow
def test_lbfgs_finds_closed_form_minimiser(strategy):
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs", 1.0, history=10))
  init = stacked(np.zeros(6), np.ones(6), -np.ones(6))
  state = driver.run(solver, init, jnp.asarray(C), iterations=30,
                      execution=driver.Execution(strategy, chunk=7, map_batch_size=2))
  np.testing.assert_allclose(state.best_params["p"], np.broadcast_to(C, (3, 6)), atol=1e-8)
  assert np.all(state.best_loss < 1e-15)
  assert np.all(state.alive)
  # Every iteration evaluates the objective at least once (line search), plus init; finalize reads
  # the line search's value at the last iterate.
  assert np.all(state.evaluations >= state.iterations + 1)


@pytest.mark.parametrize("tol", [None, 1e-6])
def test_lbfgs_best_loss_is_the_objective_at_the_best_params(tol):
  """With the line search's stored values (no final evaluation), the recorded best loss is still
  the objective at the recorded best params, also for a restart frozen by ``tol`` (whose last
  search's value is kept while its optimizer state runs on); unlike Adam's, L-BFGS's best is
  scored at the last iterate too."""
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs", 1.0, history=10), tol=tol)
  init = stacked(np.zeros(6), np.full(6, 3.0))
  state = driver.run(solver, init, jnp.asarray(C), iterations=12,
                      execution=driver.Execution("sequential", chunk=5))
  for r in range(2):
    np.testing.assert_allclose(state.best_loss[r], quadratic({"p": state.best_params["p"][r]}, C),
                               rtol=1e-9, atol=1e-30)
    if tol is not None:
      assert state.best_loss[r] <= tol


def test_adam_counts_one_evaluation_per_iteration_and_tracks_the_best():
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
  state = driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=500,
                      execution=driver.Execution("sequential", chunk=100))
  assert int(state.iterations[0]) == 500
  assert int(state.evaluations[0]) == 501  # 500 steps + the final evaluation
  np.testing.assert_allclose(state.best_params["p"][0], C, atol=1e-2)
  # The recorded best loss is the objective at the recorded best params.
  np.testing.assert_allclose(state.best_loss[0], quadratic({"p": state.best_params["p"][0]}, C),
                             rtol=1e-12)


def test_the_last_iterate_when_only_it_counts():
  """track_from = the budget (``--config.attack.iterate=last``): the reconstruction is where the run
  ended, even where an earlier iterate was better. SGD at lr 1.5 on Σ (p − c)² multiplies p − c by
  −2 each step: the closed form p_k = c + (−2)^k (p_0 − c), the best iterate p_0."""
  def squares(params, data, step=0):
    return jnp.sum((params["p"] - data) ** 2)

  solver = solvers.make_solver(squares, optimizers.make_optimizer("sgd", 1.5), track_from=5)
  state = driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=5,
                     execution=driver.Execution("sequential", chunk=2))
  want = C + (-2.0) ** 5 * (0.0 - C)
  np.testing.assert_allclose(state.best_params["p"][0], want, rtol=1e-5)
  np.testing.assert_allclose(state.best_loss[0], np.sum((want - C) ** 2), rtol=1e-5)
  # A run that ends before track_from (a deadline, a budget below it) still has its last iterate.
  early = driver.run(solvers.make_solver(squares, optimizers.make_optimizer("sgd", 1.5), track_from=9),
                     stacked(np.zeros(6)), jnp.asarray(C), iterations=5,
                     execution=driver.Execution("sequential", chunk=2))
  np.testing.assert_allclose(early.best_params["p"][0], want, rtol=1e-5)
  np.testing.assert_allclose(early.best_loss[0], np.sum((want - C) ** 2), rtol=1e-5)
  tracked = driver.run(solvers.make_solver(squares, optimizers.make_optimizer("sgd", 1.5)),
                       stacked(np.zeros(6)), jnp.asarray(C), iterations=5)
  np.testing.assert_allclose(tracked.best_params["p"][0], np.zeros(6))  # the start was best


def test_strategies_agree():
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.05))
  init = stacked(np.zeros(6), np.full(6, 2.0), np.linspace(-1, 1, 6))
  results = [driver.run(solver, init, jnp.asarray(C), iterations=40,
                         execution=driver.Execution(s, chunk=15, map_batch_size=2))
             for s in ("sequential", "vmap", "map")]
  for other in results[1:]:
    np.testing.assert_allclose(other.best_params["p"], results[0].best_params["p"], rtol=1e-10)
    np.testing.assert_array_equal(other.iterations, results[0].iterations)


def log_objective(params, data, step=0):
  """log(p0) + Σ p^2: finite for p0 > 0, NaN for p0 < 0."""
  del data, step
  return jnp.log(params["p"][0]) + jnp.sum(params["p"] ** 2)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_diverging_restart_is_isolated(strategy):
  # SGD with lr 1 from p0 = 0.2: the step p0 - (1/p0 + 2 p0) jumps below zero, where log is NaN.
  solver = solvers.make_solver(log_objective, optimizers.make_optimizer("sgd", 1.0))
  init = stacked(np.full(6, 0.2), np.full(6, -1.0))
  state = jax.device_get(driver.run(solver, init, None, iterations=20,
                                     execution=driver.Execution(strategy, chunk=5)))
  # Restart 0 had one finite evaluation at its start, then diverged: frozen with that best.
  assert not state.alive[0] and not state.alive[1]
  np.testing.assert_allclose(state.best_loss[0], np.log(0.2) + 6 * 0.04, rtol=1e-12)
  np.testing.assert_allclose(state.best_params["p"][0], np.full(6, 0.2))
  assert np.isinf(state.best_loss[1])  # never finite
  assert np.all(np.isfinite(state.params["p"]))
  assert int(state.iterations[0]) == 1 and int(state.iterations[1]) == 0


def guarded_quadratic(params, data, step=0):
  """The quadratic, NaN wherever p0 < C0 − 10 (log of a negative number)."""
  return quadratic(params, data) + 0.0 * jnp.log(params["p"][0] - (C[0] - 10.0))


@pytest.mark.slow
def test_frozen_restart_costs_its_vmapped_neighbours_one_line_search_evaluation():
  # Restart 0 starts where the objective is NaN, restart 2 at the minimiser (frozen by tol at once):
  # each is handed a flat problem, so its line search ends at its first trial. Before, restart 0's
  # search ran to the cap (20) at every iteration, and under vmap every restart paid for it.
  solver = solvers.make_solver(guarded_quadratic, optimizers.make_optimizer("lbfgs", 1.0, history=5),
                               tol=1e-20)
  init = stacked(np.full(6, C[0] - 11.0), C + 1.0, C)
  searches = []

  def monitor(state):
    searches.append(np.asarray(optax.tree.get(state.opt_state, "num_linesearch_steps")))
    return False

  state = jax.device_get(driver.run(solver, init, jnp.asarray(C), iterations=12,
                                     execution=driver.Execution("vmap", chunk=1, monitor=monitor)))
  assert [bool(a) for a in state.alive] == [False, True, True]
  np.testing.assert_array_equal(np.stack(searches)[:, [0, 2]], 1)
  # The live restart is untouched by its neighbours: the same iterates as when run alone.
  alone = jax.device_get(driver.run(solver, stacked(C + 1.0), jnp.asarray(C), iterations=12,
                                     execution=driver.Execution("sequential")))
  np.testing.assert_allclose(state.best_params["p"][1], alone.best_params["p"][0], rtol=1e-12)
  np.testing.assert_array_equal(state.iterations[1], alone.iterations[0])
  assert state.best_loss[1] < 1e-10 and state.best_loss[2] == 0.0


def test_tolerance_stops_early_and_progress_is_reported():
  reports = []
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs", 1.0), tol=1e-20)
  state = driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=1000,
                      execution=driver.Execution("sequential", chunk=10, callback=reports.append))
  assert int(state.iterations[0]) < 1000
  assert reports[-1].iteration < 1000 and reports[-1].iteration % 10 == 0
  assert reports[0].compiling and reports[0].iteration == 0  # announced before compiling
  assert [r.iteration for r in reports[1:]] == list(range(10, reports[-1].iteration + 1, 10))
  assert reports[-1].best_loss <= 1e-20


def test_bad_arguments():
  with pytest.raises(ValueError, match="unknown optimizer"):
    optimizers.make_optimizer("rmsprop", 1.0)
  with pytest.raises(ValueError, match="learning rate"):
    optimizers.make_optimizer("adam", 0.0)
  with pytest.raises(ValueError, match="restart strategy"):
    driver.resolve_strategy("parallel")
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
  with pytest.raises(ValueError, match="positive"):
    driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=0)
  for bad, message in [(dict(strategy="parallel"), "unknown restart strategy 'parallel'"),
                       (dict(chunk=0), "chunk must be a positive integer"),
                       (dict(chunk=2.5), "chunk must be a positive integer, got 2.5"),
                       (dict(unroll=0), "unroll must be a positive integer"),
                       (dict(map_batch_size=0), "map_batch_size must be a positive integer"),
                       (dict(halving_rounds=0), "halving_rounds must be a positive integer"),
                       (dict(halving_rounds=True), "halving_rounds must be a positive integer"),
                       (dict(callback=5), "callback must be a function"),
                       (dict(halving_keep=1.5), "halving keep fraction"),
                       (dict(strategy="map", shard=True), "sharded restarts run with vmap")]:
    with pytest.raises(ValueError, match=message):
      driver.Execution(**bad)
  with pytest.raises(ValueError, match="halving rounds must lie in"):
    driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=2,
                execution=driver.Execution(halving_rounds=3))


def rate_at(tx, step):
  """The learning rate a schedule's transformation applies at ``step``: minus its update of 1."""
  state = dataclasses.replace(tx.init(None), count=jnp.asarray(step, jnp.int32))
  return -float(tx.update(jnp.ones(()), state)[0])


def test_step_schedule_matches_inverting_gradients_milestones():
  lr = functools.partial(rate_at, optimizers.learning_rate_schedule(0.1, "step", iterations=4800))
  # ×0.1 at 3/8, 5/8 and 7/8 of 4800 = steps 1800, 3000, 4200.
  for step, expected in [(0, 0.1), (1799, 0.1), (1800, 0.01), (2999, 0.01), (3000, 1e-3),
                         (4199, 1e-3), (4200, 1e-4), (4799, 1e-4)]:
    np.testing.assert_allclose(lr(step), expected, rtol=1e-6)


def test_cosine_and_warmup_closed_forms():
  lr = functools.partial(rate_at, optimizers.learning_rate_schedule(2.0, "cosine", iterations=110,
                                                                   warmup=10))
  for step in (0, 5, 10):
    np.testing.assert_allclose(lr(step), 2.0 * step / 10, rtol=1e-6)
  for step in (10, 35, 60, 110):
    t = (step - 10) / 100
    np.testing.assert_allclose(lr(step), 2.0 * 0.5 * (1 + np.cos(np.pi * t)), rtol=1e-5, atol=1e-7)


def test_signed_adam_is_adam_on_the_sign():
  """First step of Adam on sign(g) moves every coordinate by lr·sign(g) (bias-corrected m/sqrt(v) = ±1);
  later steps follow a NumPy Adam run on sign(g)."""
  opt = optimizers.make_optimizer("signed_adam", 0.1)
  params = {"p": jnp.asarray(np.linspace(-2.0, 3.0, 6))}
  state = opt.init(params)
  m = v = np.zeros(6)
  p = np.asarray(params["p"])
  for t in range(1, 6):
    g = np.asarray(jax.grad(lambda q: quadratic(q, jnp.asarray(C)))(params)["p"])
    updates, state = opt.update({"p": jnp.asarray(g)}, state, params)
    params = {"p": params["p"] + updates["p"]}
    s = np.sign(g)
    m = 0.9 * m + 0.1 * s
    v = 0.999 * v + 0.001 * s * s
    p = p - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(params["p"], p, rtol=1e-10)


def test_projection_keeps_iterates_in_the_box():
  solver = solvers.make_solver(
      quadratic, optimizers.make_optimizer("adam", 0.5),
      project=lambda params, data: {"p": jnp.clip(params["p"], -0.25, 0.25)})
  init = stacked(np.full(6, 3.0))  # projected at init too
  state = driver.run(solver, init, jnp.asarray(C), iterations=200,
                      execution=driver.Execution("sequential", chunk=50))
  assert np.all(np.abs(state.best_params["p"]) <= 0.25)
  # The box-constrained minimiser of a quadratic: compare with a fine projected-gradient reference.
  ref = np.zeros(6)
  for _ in range(20000):
    ref = np.clip(ref - 0.01 * A @ (ref - C), -0.25, 0.25)
  np.testing.assert_allclose(state.best_params["p"][0], ref, atol=5e-3)


def test_lbfgs_rejects_a_schedule():
  with pytest.raises(ValueError, match="schedule"):
    optimizers.make_optimizer("lbfgs", 1.0, schedule="step", iterations=10)
  with pytest.raises(ValueError, match="unknown schedule"):
    optimizers.learning_rate_schedule(0.1, "exponential")


def test_fixed_step_lbfgs_solves_a_quadratic():
  """Unit L-BFGS steps without a line search (PyTorch's default) converge on an SPD quadratic."""
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs_fixed", 1.0, history=10))
  state = driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=60,
                      execution=driver.Execution("sequential", chunk=20))
  np.testing.assert_allclose(state.best_params["p"][0], C, atol=1e-7)
  assert int(state.evaluations[0]) == 61  # one evaluation per step, plus the final one


def test_any_optax_transformation_plugs_in():
  """A plain optax transformation runs as the named one does; only a line search's state stores the
  objective's value (so L-BFGS evaluates only in its search)."""
  runs = [driver.run(solvers.make_solver(quadratic, tx), stacked(np.zeros(6)), jnp.asarray(C), iterations=50,
                     execution=driver.Execution("sequential", chunk=25))
          for tx in (optax.sgd(0.05), optimizers.make_optimizer("sgd", 0.05))]
  np.testing.assert_allclose(runs[0].best_params["p"], runs[1].best_params["p"], rtol=1e-12)
  assert int(runs[0].evaluations[0]) == 51
  params = {"p": jnp.zeros(6)}
  assert optimizers.stores_value(optimizers.make_optimizer("lbfgs", 1.0).init(params))
  assert not optimizers.stores_value(optimizers.make_optimizer("lbfgs_fixed", 1.0).init(params))
  assert not optimizers.stores_value(optax.adam(0.1).init(params))


def test_halving_plan_counts():
  assert driver.halving_plan(100, 8, 3, 0.5) == [(8, 33), (4, 33), (2, 34)]
  assert driver.halving_plan(10, 5, 1, 0.5) == [(5, 10)]
  assert driver.halving_plan(9, 3, 3, 0.1) == [(3, 3), (1, 3), (1, 3)]
  for bad in [(10, 4, 0, 0.5), (10, 4, 11, 0.5), (10, 4, 2, 0.0), (10, 4, 2, 1.5)]:
    with pytest.raises(ValueError):
      driver.halving_plan(*bad)


def offset_quadratic(params, data, step=0):
  """Per-restart data (target c_r, offset o_r): 0.5 ‖p − c_r‖² + o_r, minimum o_r at c_r."""
  _, (target, offset) = data
  return 0.5 * jnp.sum((params["p"] - target) ** 2) + offset


@pytest.mark.parametrize("strategy", ["sequential", "vmap", "map"])
def test_restart_data_and_successive_halving(strategy):
  r = 6
  targets = jnp.asarray(_RNG.normal(size=(r, 6)))
  offsets = jnp.asarray([5.0, 0.5, 3.0, 0.0, 4.0, 2.0])
  solver = solvers.make_solver(offset_quadratic, optimizers.make_optimizer("adam", 0.05))
  init = {"p": jnp.zeros((r, 6))}
  execution = driver.Execution(strategy, chunk=40, map_batch_size=2, halving_rounds=3, halving_keep=0.5)
  state = jax.device_get(driver.run(solver, init, None, iterations=300, execution=execution,
                                     restart_data=(targets, offsets)))
  # Rounds of 100 steps: 6 restarts, then the best 3 by objective (offsets 0, 0.5, 2), then 2.
  np.testing.assert_array_equal(state.iterations, [100, 300, 100, 300, 100, 200])
  assert np.argmin(state.best_loss) == 3
  np.testing.assert_allclose(state.best_params["p"][3], targets[3], atol=1e-3)
  np.testing.assert_allclose(state.best_loss[[1, 3]], np.asarray(offsets)[[1, 3]], atol=1e-5)


def test_restart_data_needs_a_leading_restart_axis():
  solver = solvers.make_solver(offset_quadratic, optimizers.make_optimizer("adam", 0.05))
  with pytest.raises(ValueError, match="leading axis"):
    driver.run(solver, {"p": jnp.zeros((3, 6))}, None, iterations=5,
                restart_data=(jnp.zeros((2, 6)), jnp.zeros(2)))


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_monitor_stops_a_run_after_the_chunk_it_returns_true(strategy):
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.01))
  seen = []

  def monitor(state):
    seen.append(int(np.max(state.iterations)))
    return seen[-1] >= 30

  state = driver.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=100,
                      execution=driver.Execution(strategy, chunk=10, monitor=monitor))
  assert seen == [10, 20, 30] and int(state.iterations[0]) == 30


def test_tune_times_every_strategy_and_picks_the_fastest():
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
  init = stacked(np.zeros(6), np.ones(6), -np.ones(6))
  best, seconds = driver.tune_strategy(solver, init, jnp.asarray(C), steps=3)
  assert set(seconds) == {"sequential", "vmap", "map"} and best == min(seconds, key=seconds.get)
  assert all(t > 0 for t in seconds.values())
  one, timed = driver.tune_strategy(solver, stacked(np.zeros(6)), jnp.asarray(C), steps=3)
  assert one == "sequential" and set(timed) == {"sequential"}
  # The programs timed are the run's own: a fresh solver's tuned run makes one step program and one
  # first-state program per strategy timed, and nothing else but the run's set-up.
  fresh = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
  with compilation.Recorder() as made:
    state = driver.run(fresh, init, jnp.asarray(C), iterations=200,
                       execution=driver.Execution("tune", chunk=50))
  names = [p.name for p in made.programs]
  assert names.count("jit(solver_steps)") == 3 and names.count("jit(solver_init)") == 3, names
  assert not {"jit(dynamic_slice)", "jit(squeeze)"} & set(names), names  # rows sliced on the host
  np.testing.assert_allclose(state.best_params["p"], np.tile(C, (3, 1)), atol=1e-3)


def test_monitor_stop_ends_every_round_of_halving():
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.01))
  execution = driver.Execution("vmap", chunk=25, halving_rounds=2, monitor=lambda state: True)
  state = driver.run(solver, stacked(np.zeros(6), np.ones(6)), jnp.asarray(C), iterations=200,
                      execution=execution)
  np.testing.assert_array_equal(state.iterations, [25, 25])


@pytest.mark.parametrize("strategy, restarts", [("sequential", 3), ("vmap", 4)])
def test_progress_eta_covers_the_whole_run(strategy, restarts, monkeypatch):
  """The ETA is the restart-steps the whole run has left over the measured rate: every later restart
  of a sequential run counts, and vmapped restarts advance together. The rate is the steps over
  the driver's clock since the step was compiled: a clock that moves 2 s at every reading gives 10
  steps (a chunk) in 2 s."""
  readings = iter(range(0, 10_000, 2))
  monkeypatch.setattr(driver, "time", types.SimpleNamespace(perf_counter=lambda: float(next(readings))))
  reports = []
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.01))
  init = stacked(*[np.ones(len(A)) * (r + 1) for r in range(restarts)])
  driver.run(solver, init, jnp.zeros(len(A), jnp.float64), iterations=40,
             execution=driver.Execution(strategy=strategy, chunk=10, callback=reports.append))
  timed = [p for p in reports if not p.compiling and np.isfinite(p.its_per_s)]
  assert timed and all(p.its_per_s == 10 / 2 for p in timed)
  for p in timed:
    if strategy == "sequential":
      left, width = (restarts - p.restart - 1) * 40 + 40 - p.iteration, 1
    else:
      left, width = restarts * (40 - p.iteration), restarts
    np.testing.assert_allclose(p.eta_s * p.its_per_s * width, left, rtol=1e-9)


@pytest.mark.parametrize("schedule, iterations, warmup", [
    ("step", 4800, 0), ("step", 333, 7), ("step_hfginv", 15_000, 0), ("step_hfginv", 1001, 0),
    ("cosine", 110, 10), ("cosine", 500, 0), ("constant", 50, 5)])
def test_the_schedule_is_optaxs(schedule, iterations, warmup):
  """The budget-carrying schedule gives optax's own schedule (piecewise constant, cosine decay, joined
  to a linear warmup) at every step of the budget and past it."""
  lr = 0.3
  if schedule == "step":
    main = optax.piecewise_constant_schedule(lr, {int(iterations * f): 0.1 for f in (3 / 8, 5 / 8, 7 / 8)})
  elif schedule == "step_hfginv":
    main = optax.piecewise_constant_schedule(lr, {int(iterations // d): 0.33 for d in (2.667, 1.6, 1.142)})
  elif schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, max(iterations - warmup, 1))
  else:
    main = optax.constant_schedule(lr)
  want = main if not warmup else optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), main], [warmup])
  tx = optimizers.learning_rate_schedule(lr, schedule, iterations=iterations, warmup=warmup)
  steps = sorted(set(np.linspace(0, iterations + 5, 60).astype(int)) | {warmup, warmup + 1})
  if schedule.startswith("step"):
    steps += [b + warmup + d for b in optimizers._budget(schedule, iterations, warmup)[0] for d in (-1, 0)]
  for step in steps:
    np.testing.assert_allclose(rate_at(tx, step), float(want(step)), rtol=2e-6, atol=1e-7, err_msg=step)


def test_one_compiled_step_serves_every_budget():
  """An optimizer's step lowered at two budgets is the same program (the schedule's numbers are
  state, not constants), so a run with another --iterations hits the compilation cache."""
  params = {"x": jnp.ones((3,))}

  def lowered(iterations):
    tx = optimizers.make_optimizer("signed_adam", 0.1, schedule="step", iterations=iterations, warmup=2)
    state = tx.init(params)
    return jax.jit(lambda g, s: tx.update(g, s, params)).lower(params, state).as_text()

  assert lowered(300) == lowered(4800)


def test_at_budget_sets_every_schedule_state_as_its_init_at_that_budget():
  """``optimizers.at_budget`` with ``optimizers.budget(N)`` turns the state of an optimizer built at
  another budget into that optimizer's own state at N, schedules nested in a ``multi_transform``
  (DLM's γ on an Adam of its own) included; states without a schedule are left as they are."""
  params = {"x": jnp.ones((3,)), "y": jnp.ones((2,)), "log_gamma": jnp.zeros(())}

  def make(iterations):
    named = lambda schedule: optimizers.make_optimizer("adam", 0.1, schedule=schedule,
                                                       iterations=iterations, warmup=5)
    return optax.multi_transform(
        {"x": named("step"), "y": named("step_hfginv"), "log_gamma": named("cosine")},
        {"x": "x", "y": "y", "log_gamma": "log_gamma"})

  for n in (1, 7, 300, 15_000):
    got = optimizers.at_budget(make(40).init(params), optimizers.budget(n))
    want = make(n).init(params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)
  plain = optax.adam(0.1).init(params)
  kept = optimizers.at_budget(plain, optimizers.budget(9))
  assert jax.tree.structure(kept) == jax.tree.structure(plain)
  for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(plain)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("schedule", ["step", "step_hfginv", "cosine"])
@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_a_runs_first_state_is_one_program_for_every_budget(schedule, strategy):
  """The driver's first-state program is the same program at two budgets (the schedule's numbers
  are its argument, not constants), so a run with another --iterations compiles nothing new; and a
  run of N iterations follows the schedule spread over N whatever budget its optimizer was built at
  (here 7): its iterates are those of a plain loop of the optimizer built at N (warmup 2)."""
  params = {"x": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
  target = jnp.asarray([0.3, -0.2, 0.5])
  value_fn = lambda p, data, step: jnp.sum((p["x"] - data) ** 4)
  make = lambda iterations: optimizers.make_optimizer("adam", 0.05, schedule=schedule,
                                                      iterations=iterations, warmup=2)

  def lowered(iterations):
    init, _, _ = driver._compiled(solvers.make_solver(value_fn, make(iterations)), strategy, None, 1)
    per = None if strategy == "sequential" else jnp.zeros((2,))
    one = params if strategy == "sequential" else jax.tree.map(lambda x: x[None].repeat(2, 0), params)
    return jax.jit(init.__wrapped__).lower(one, target, per, optimizers.budget(iterations)).as_text()

  assert lowered(300) == lowered(4800)
  for iterations in (16, 40):
    state = driver.run(solvers.make_solver(value_fn, make(7)),
                       jax.tree.map(lambda x: x[None], params), target, iterations=iterations,
                       execution=driver.Execution(strategy))
    tx, p = make(iterations), params
    opt_state = tx.init(p)
    for _ in range(iterations):
      updates, opt_state = tx.update(jax.grad(value_fn)(p, target, 0), opt_state, p)
      p = optax.apply_updates(p, updates)
    np.testing.assert_allclose(state.params["x"][0], p["x"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_the_last_iterate_is_scored_by_the_step_program(strategy, monkeypatch):
  """One more call of the step program scores an Adam run's last iterate: on CPU (a host loop of the
  one-step program) and on an accelerator (run here on CPU by telling the driver it is on a GPU),
  whose chunk program takes its step count as an argument: one ``solver_steps`` program for whole
  chunks, a budget's remainder (23 iterations in chunks of 10) and the scoring step, and no
  ``solver_finalize``; the same states as on CPU (each a fresh solver: the compiled programs are
  cached per solver)."""
  def run(iterations, solver=None):
    solver = solver or solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
    with compilation.Recorder() as made:
      state = driver.run(solver, stacked(np.zeros(6), np.ones(6)), jnp.asarray(C),
                         iterations=iterations, execution=driver.Execution(strategy, chunk=10))
    return state, [p.name for p in made.programs]

  on_cpu = {}
  for iterations in (23, 20):
    on_cpu[iterations], programs = run(iterations)
    assert "jit(solver_finalize)" not in programs, programs
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  for iterations in (23, 20):
    state, programs = run(iterations)
    assert "jit(solver_finalize)" not in programs and programs.count("jit(solver_steps)") == 1, (
        iterations, programs)
    np.testing.assert_array_equal(state.iterations, [iterations] * 2)
    np.testing.assert_array_equal(state.evaluations, [iterations + 1] * 2)  # the last iterate's too
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(on_cpu[iterations])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    # The best loss is the objective at the best params, the last iterate scored too.
    np.testing.assert_allclose(state.best_loss,
                               [quadratic({"p": p}, C) for p in state.best_params["p"]], rtol=1e-12)


@pytest.mark.parametrize("unroll", [1, 3])
def test_repeat_takes_its_step_count_as_data(unroll):
  """driver.repeat: n steps for every n (0 to 8, past and between multiples of ``unroll``) from one
  jitted program, equal to n steps taken in Python."""
  step = lambda s: {"x": 0.5 * s["x"] + jnp.sin(s["x"]), "k": s["k"] + 1}
  program = jax.jit(lambda s, n: driver.repeat(step, s, n, unroll))
  start = {"x": jnp.linspace(-2.0, 2.0, 5), "k": jnp.int32(0)}
  for n in range(9):
    want = start
    for _ in range(n):
      want = step(want)
    got = program(start, n)
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-15)
    assert int(got["k"]) == n
  assert program._cache_size() == 1


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_an_accelerators_runs_of_any_budget_share_one_step_program(strategy, monkeypatch):
  """On an accelerator (told here, on CPU) a solver's runs of 23, 37 and 40 iterations in chunks of
  10, unrolled by 1 or 4, compile one step program between them, and end where the CPU's host loop
  of one-step calls does."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  for unroll in (1, 4):
    solver = solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1))
    steps = []
    for iterations in (23, 37, 40):
      with compilation.Recorder() as made:
        state = driver.run(solver, stacked(np.zeros(6), np.ones(6)), jnp.asarray(C),
                           iterations=iterations,
                           execution=driver.Execution(strategy, chunk=10, unroll=unroll))
      steps.append([p.name for p in made.programs].count("jit(solver_steps)"))
      with monkeypatch.context() as cpu:
        cpu.setattr(jax, "default_backend", lambda: "cpu")
        want = driver.run(solvers.make_solver(quadratic, optimizers.make_optimizer("adam", 0.1)),
                          stacked(np.zeros(6), np.ones(6)), jnp.asarray(C), iterations=iterations,
                          execution=driver.Execution(strategy, chunk=10))
      for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
    assert steps == [1, 0, 0], (unroll, steps)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_a_line_search_runs_last_iterate_is_scored_on_the_host(strategy):
  """An L-BFGS run's last iterate is scored from its line search's stored objective on the host: no
  ``solver_finalize`` program, and the same state as that program gives, for a restart whose last
  iterate is the best, one whose earlier best is kept (its best loss set below the iterate's) and one
  marked dead (its iterate, however low, never becomes the best)."""
  solver = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs", 1.0, history=10))
  with compilation.Recorder() as made:
    state = driver.run(solver, stacked(np.zeros(6), np.ones(6)), jnp.asarray(C), iterations=3,
                       execution=driver.Execution(strategy))
  assert "jit(solver_finalize)" not in [p.name for p in made.programs]
  np.testing.assert_allclose(state.best_loss, [quadratic({"p": p}, C) for p in state.best_params["p"]],
                             rtol=1e-12)

  init = jax.vmap(solver.init, in_axes=(0, None))(stacked(np.zeros(6), np.ones(6), -np.ones(6)),
                                                  jnp.asarray(C))
  steps = jax.jit(jax.vmap(solver.step, in_axes=(0, None)))
  run = steps(steps(init, jnp.asarray(C)), jnp.asarray(C))
  run = run._replace(best_loss=run.best_loss.at[1].set(-1.0), alive=run.alive.at[2].set(False))
  want = jax.device_get(jax.jit(jax.vmap(solver.finalize, in_axes=(0, None)))(run, jnp.asarray(C)))
  assert solvers.scores_stored(solver, run)
  got = solvers.finalize_stored(jax.device_get(run))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
    assert np.asarray(a).dtype == np.asarray(b).dtype
  stored = np.asarray(optax.tree.get(run.opt_state, "value"))
  np.testing.assert_array_equal(got.best_loss, [stored[0], -1.0, run.best_loss[2]])
  np.testing.assert_array_equal(got.best_params["p"][1], run.best_params["p"][1])
  boxed = solvers.make_solver(quadratic, optimizers.make_optimizer("lbfgs", 1.0),
                              project=lambda p, data: p)
  assert not solvers.scores_stored(boxed, run)


def test_footprint_counts_arguments_outputs_and_temporaries():
  """driver.footprint against a closed form: x ↦ 2x on 1000 float64 holds its argument and its
  output (8 000 bytes each) unless the argument is donated and the output written over it."""
  x = jax.ShapeDtypeStruct((1000,), jnp.float64)
  kept = jax.jit(lambda x: 2 * x).lower(x).compile()
  donated = jax.jit(lambda x: 2 * x, donate_argnums=0).lower(x).compile()
  assert driver.footprint(kept) == 16000 and driver.footprint(donated) == 8000


def test_sizes_are_written_in_binary_units():
  assert [driver._size(n) for n in (512, 1536, 3 * 2**20, 2.5 * 2**30, 2**42)] == [
      "512 B", "1.5 KiB", "3.0 MiB", "2.5 GiB", "4096.0 GiB"]


# An objective whose step's temporaries grow with the restarts run together (a hidden layer of
# 20 000 units per restart) while every restart's state is 6 numbers.
_W = _RNG.normal(size=(6, 20000)) / 3


def wide(params, data, step=0):
  return jnp.mean((jnp.tanh(params["p"] @ data) - 0.5) ** 2)


class _Memo:
  """An in-memory driver.Saver: keeps every snapshot offered; restores ``start``."""

  def __init__(self, start=None):
    self.start, self.snapshots = start, []

  def restore(self, like):
    return self.start

  def __call__(self, snapshot, *, final=False):
    self.snapshots.append(snapshot())


@pytest.mark.slow
def test_auto_fits_the_restarts_to_the_devices_memory(monkeypatch):
  """fit_strategy: vmap where the vmapped step fits 80 % of the free memory, else a map of a batch
  whose compiled step fits, else a sequence; driver.run under "auto" on a device that says how
  much memory it has free runs the chosen strategy, says so, and gives what a sequence gives, also
  when it continues a vmapped run's snapshot mapped."""
  solver = solvers.make_solver(wide, optimizers.make_optimizer("adam", 0.05))
  init = stacked(*_RNG.normal(size=(8, 6)))
  data = jnp.asarray(_W)
  roomy = driver.fit_strategy(solver, init, data, free=10**12)
  assert roomy == (driver.Fit("vmap", None, roomy.need, int(0.8 * 10**12)))
  # The vmapped step holds at least the 8 hidden layers it differentiates through.
  assert roomy.need > 8 * 20000 * 8
  tight = driver.fit_strategy(solver, init, data, free=roomy.need)
  assert tight.strategy == "map" and 2 <= tight.map_batch_size < 8 and tight.need == roomy.need
  shapes = driver._state_shapes(solver, init, data, None, 8)
  mapped = lambda b: driver.footprint(
      driver._compiled(solver, "map", b, 1)[1].step.lower(shapes, data, None, 1).compile())
  # The most restarts at a time whose step fits.
  assert mapped(tight.map_batch_size) <= tight.budget
  assert all(mapped(b) > tight.budget for b in range(tight.map_batch_size + 1, 8))
  assert driver.fit_strategy(solver, init, data, free=100).strategy == "sequential"

  sequence = driver.run(solver, init, data, iterations=40,
                        execution=driver.Execution("sequential", chunk=10))
  memo = _Memo()
  vmapped = driver.run(solver, init, data, iterations=40,
                       execution=driver.Execution("vmap", chunk=10, saver=memo))
  monkeypatch.setattr(driver, "resolve_strategy", lambda s: "vmap" if s == "auto" else s)
  # Where the vmapped step fits, the program measured is the one the run calls: one step program.
  monkeypatch.setattr(driver, "free_memory", lambda device=None: 10**12)
  fresh = solvers.make_solver(wide, optimizers.make_optimizer("adam", 0.05))
  with compilation.Recorder() as made:
    driver.run(fresh, init, data, iterations=40, execution=driver.Execution(chunk=10))
  assert [p.name for p in made.programs].count("jit(solver_steps)") == 1
  monkeypatch.setattr(driver, "free_memory", lambda device=None: roomy.need)
  reports = []
  auto = driver.run(solver, init, data, iterations=40,
                    execution=driver.Execution(chunk=10, callback=reports.append))
  line = reports[0].line()
  assert reports[0].compiling and f"{tight.map_batch_size} at a time" in line
  # The vmapped step's bytes and 80 % of the free memory, in MiB (about 3.4 and 2.7 here).
  assert f"need {roomy.need / 2**20:.1f} MiB" in line and f"the {0.8 * roomy.need / 2**20:.1f} MiB" in line
  for state in (vmapped, auto):
    np.testing.assert_allclose(state.best_params["p"], sequence.best_params["p"], rtol=1e-12)
    np.testing.assert_array_equal(state.iterations, sequence.iterations)
  # "tune" times only the strategies whose step fits.
  assert set(driver.tune_strategy(solver, init, data, steps=2)[1]) == {"sequential", "map"}
  # The vmapped run's snapshot at step 20 continues mapped to the uninterrupted run's end.
  assert memo.snapshots[1].strategy == "vmap" and memo.snapshots[1].steps == 20
  resumed_memo = _Memo(start=memo.snapshots[1])
  resumed = driver.run(solver, init, data, iterations=40,
                       execution=driver.Execution(chunk=10, saver=resumed_memo))
  assert resumed_memo.snapshots[-1].strategy == "map"
  np.testing.assert_allclose(resumed.best_params["p"], sequence.best_params["p"], rtol=1e-12)


def _bumpy(params, data, step=0):
  """A nonconvex objective whose line searches take different numbers of trials from different
  starts (the quadratic's accept step 1 nearly always)."""
  x = params["p"]
  return quadratic(params, data) + jnp.sum(jnp.cos(3.0 * x)) + 0.1 * jnp.sum(x ** 4)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_lbfgs_counts_every_evaluation_of_the_objective(strategy):
  """``evaluations`` is the number of times the objective ran (a callback in it counts them, one
  restart at a time): init's, each line-search trial's (several a step on a nonconvex objective),
  none for the final iterate's score, whose value the last search stored."""
  calls = []

  def counted(params, data, step=0):
    jax.debug.callback(lambda _: calls.append(1), params["p"][0])
    return _bumpy(params, data, step)

  solver = solvers.make_solver(counted, optimizers.make_optimizer("lbfgs", 1.0, history=5))
  counts = []
  for seed in range(4):
    calls.clear()
    start = np.random.default_rng(seed).normal(size=6) * 2.0
    state = driver.run(solver, stacked(start), jnp.asarray(C), iterations=17,
                       execution=driver.Execution(strategy, chunk=5))
    jax.effects_barrier()
    assert int(state.iterations[0]) == 17
    assert int(state.evaluations[0]) == len(calls), seed
    counts.append(len(calls))
  assert max(counts) > 17 + 1, counts  # some steps searched more than once: the count means something


def test_lbfgs_restarts_search_on_their_own_under_vmap(monkeypatch):
  """``Solver.advance`` (L-BFGS: one line-search trial a trip) gives the iterates, bests and counts
  of the same number of steps, bit for bit, vmapped or one restart alone; vmapped, its loop makes
  as many trips as the busiest restart's trials (counted by a callback in the objective), where
  the steps' loop makes at each step as many as the restart that needs most that step (counted
  from each restart's own steps). The driver on an accelerator (told here) runs it, a restart frozen
  by ``tol`` included, and ends where the CPU's host loop of steps does."""
  calls = []

  def counted(params, data, step=0):
    jax.debug.callback(lambda _: calls.append(1), params["p"][0])
    return _bumpy(params, data, step)

  optimizer = optimizers.make_optimizer("lbfgs", 1.0, history=5)
  solver = solvers.make_solver(counted, optimizer)
  assert solver.advance is not None
  assert solvers.make_solver(counted, optimizers.make_optimizer("adam", 0.1)).advance is None
  assert solvers.make_solver(counted, optimizer, independent=False).advance is None
  starts = {"p": jnp.asarray(np.random.default_rng(1).normal(size=(8, 6)) * 2.0)}
  first = jax.jit(jax.vmap(solver.init, in_axes=(0, None)))(starts, jnp.asarray(C))
  n = 25
  def steps(state):  # n steps, and each step's evaluations
    def one(q, _):
      q = solver.step(q, C)
      return q, q.evaluations
    return jax.lax.scan(one, state, None, length=n)
  stepped = jax.jit(jax.vmap(steps))
  advanced = jax.jit(jax.vmap(lambda s, k: solver.advance(s, C, k), in_axes=(0, None)))

  def calls_of(fn, *args):
    calls.clear()
    out = jax.block_until_ready(fn(*args))
    jax.effects_barrier()
    return out, len(calls)

  (by_steps, evaluations), step_calls = calls_of(stepped, first)
  by_trials, trial_calls = calls_of(advanced, first, n)
  for a, b in zip(jax.tree.leaves(by_steps), jax.tree.leaves(by_trials)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(by_trials.iterations, [n] * 8)
  # One restart alone makes the same steps, up to the rounding of another program.
  alone = jax.jit(steps)(jax.tree.map(lambda a: a[0], first))[0]
  np.testing.assert_allclose(alone.best_loss, by_trials.best_loss[0], rtol=1e-10)
  np.testing.assert_allclose(alone.best_params["p"], by_trials.best_params["p"][0], rtol=1e-6, atol=1e-8)
  trials = np.diff(np.concatenate([np.asarray(first.evaluations)[:, None], evaluations], axis=1))
  busiest, per_step = trials.sum(axis=1).max(), trials.max(axis=0).sum()
  assert busiest < per_step  # the starts differ in their searches: the test means something
  # A callback under vmap is called once per trip or once per restart per trip: either way the
  # ratio of the counts is the ratio of the trips.
  assert step_calls * busiest == trial_calls * per_step, (step_calls, trial_calls, busiest, per_step)

  # The driver on an accelerator, a restart frozen by tol among them, against the CPU's; its
  # batched runs go through ``advance``, one program for every budget.
  traced = []
  real = solvers.make_solver(_bumpy, optimizer, tol=-2.2)
  frozen = real._replace(advance=lambda *a: traced.append(1) or real.advance(*a))

  def run(backend, iterations=23):
    with monkeypatch.context() as m, compilation.Recorder() as made:
      m.setattr(jax, "default_backend", lambda: backend)
      state = driver.run(frozen, starts, jnp.asarray(C), iterations=iterations,
                         execution=driver.Execution("vmap", chunk=10))
    return state, [p.name for p in made.programs].count("jit(solver_steps)")
  (on_gpu, programs), (on_cpu, _) = run("gpu"), run("cpu")
  assert traced and programs == 1 and run("gpu", 37)[1] == 0
  traced.clear()  # one restart alone gains nothing from it: its steps' loop
  with monkeypatch.context() as m:
    m.setattr(jax, "default_backend", lambda: "gpu")
    driver.run(frozen, jax.tree.map(lambda a: a[:1], starts), jnp.asarray(C), iterations=5,
               execution=driver.Execution("vmap", chunk=10))
  assert not traced
  # Frozen by tol at different iterations, before the budget's end.
  assert len(set(on_cpu.iterations.tolist())) > 1 and max(on_cpu.iterations) < 23, on_cpu.iterations
  for a, b in zip(jax.tree.leaves((on_gpu.params, on_gpu.best_params, on_gpu.best_loss, on_gpu.iterations,
                                   on_gpu.evaluations, on_gpu.alive)),
                  jax.tree.leaves((on_cpu.params, on_cpu.best_params, on_cpu.best_loss, on_cpu.iterations,
                                   on_cpu.evaluations, on_cpu.alive))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("loop", ["steps", "trials"])
def test_a_restart_whose_gradient_is_not_finite_ends_where_it_is(loop):
  """f(x) = ‖x − c‖² + √|x₀| has a finite value and an infinite derivative at x₀ = 0: an L-BFGS
  restart started there ends (not alive) with the objective there, ‖c‖² = 14, as its best, where it
  used to store the flat problem's value 0 and run on from a best it never reached."""
  c = jnp.asarray([1.0, 2.0, 3.0])
  f = lambda params, data, step=0: jnp.sum((params["p"] - data) ** 2) + jnp.sqrt(jnp.abs(params["p"][0]))
  solver = solvers.make_solver(f, optimizers.make_optimizer("lbfgs", 1.0, history=5))
  state = solver.init({"p": jnp.zeros(3)}, c)
  if loop == "steps":
    for _ in range(3):
      state = jax.jit(solver.step)(state, c)
  else:
    state = jax.jit(solver.advance)(state, c, 3)
  assert not bool(state.alive)
  np.testing.assert_allclose(state.best_loss, 14.0, rtol=1e-12)
  np.testing.assert_array_equal(state.best_params["p"], np.zeros(3))
  np.testing.assert_array_equal(state.params["p"], np.zeros(3))
