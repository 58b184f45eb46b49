"""Solvers on problems with closed-form answers; divergence isolation; restart strategies agree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import solvers

jax.config.update("jax_enable_x64", True)

# A fixed SPD quadratic: f(p) = 0.5 (p - c)^T A (p - c), minimiser c.
_RNG = np.random.default_rng(0)
_M = _RNG.normal(size=(6, 6))
A = _M @ _M.T + 6 * np.eye(6)
C = _RNG.normal(size=6)


def quadratic(params, data):
  d = params["p"] - data
  return 0.5 * d @ (jnp.asarray(A) @ d)


def stacked(*rows):
  return {"p": jnp.asarray(np.stack(rows), jnp.float64)}


@pytest.mark.parametrize("strategy", ["sequential", "vmap", "map"])
def test_lbfgs_finds_closed_form_minimiser(strategy):
  solver = solvers.make_solver(quadratic, solvers.make_optimizer("lbfgs", 1.0, history=10))
  init = stacked(np.zeros(6), np.ones(6), -np.ones(6))
  state = solvers.run(solver, init, jnp.asarray(C), iterations=30, chunk=7, strategy=strategy,
                      map_batch_size=2)
  np.testing.assert_allclose(state.best_params["p"], np.broadcast_to(C, (3, 6)), atol=1e-8)
  assert np.all(state.best_loss < 1e-15)
  assert np.all(state.alive)
  # Every iteration evaluates the objective at least once (line search), plus init and finalize.
  assert np.all(state.evaluations >= state.iterations + 2)


def test_adam_counts_one_evaluation_per_iteration_and_tracks_the_best():
  solver = solvers.make_solver(quadratic, solvers.make_optimizer("adam", 0.1))
  state = solvers.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=500, chunk=100,
                      strategy="sequential")
  assert int(state.iterations[0]) == 500
  assert int(state.evaluations[0]) == 501  # 500 steps + the final evaluation
  np.testing.assert_allclose(state.best_params["p"][0], C, atol=1e-2)
  # The recorded best loss is the objective at the recorded best params.
  np.testing.assert_allclose(state.best_loss[0], quadratic({"p": state.best_params["p"][0]}, C),
                             rtol=1e-12)


def test_strategies_agree():
  solver = solvers.make_solver(quadratic, solvers.make_optimizer("adam", 0.05))
  init = stacked(np.zeros(6), np.full(6, 2.0), np.linspace(-1, 1, 6))
  results = [solvers.run(solver, init, jnp.asarray(C), iterations=40, chunk=15, strategy=s,
                         map_batch_size=2) for s in ("sequential", "vmap", "map")]
  for other in results[1:]:
    np.testing.assert_allclose(other.best_params["p"], results[0].best_params["p"], rtol=1e-10)
    np.testing.assert_array_equal(other.iterations, results[0].iterations)


def log_objective(params, data):
  """log(p0) + Σ p^2: finite for p0 > 0, NaN for p0 < 0."""
  del data
  return jnp.log(params["p"][0]) + jnp.sum(params["p"] ** 2)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_diverging_restart_is_isolated(strategy):
  # SGD with lr 1 from p0 = 0.2: the step p0 - (1/p0 + 2 p0) jumps below zero, where log is NaN.
  solver = solvers.make_solver(log_objective, solvers.make_optimizer("sgd", 1.0))
  init = stacked(np.full(6, 0.2), np.full(6, -1.0))
  state = jax.device_get(solvers.run(solver, init, None, iterations=20, chunk=5, strategy=strategy))
  # Restart 0 had one finite evaluation at its start, then diverged: frozen with that best.
  assert not state.alive[0] and not state.alive[1]
  np.testing.assert_allclose(state.best_loss[0], np.log(0.2) + 6 * 0.04, rtol=1e-12)
  np.testing.assert_allclose(state.best_params["p"][0], np.full(6, 0.2))
  assert np.isinf(state.best_loss[1])  # never finite
  assert np.all(np.isfinite(state.params["p"]))
  assert int(state.iterations[0]) == 1 and int(state.iterations[1]) == 0


def test_tolerance_stops_early_and_progress_is_reported():
  reports = []
  solver = solvers.make_solver(quadratic, solvers.make_optimizer("lbfgs", 1.0), tol=1e-20)
  state = solvers.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=1000, chunk=10,
                      strategy="sequential", tol=1e-20, callback=reports.append)
  assert int(state.iterations[0]) < 1000
  assert reports[-1].iteration < 1000 and reports[-1].iteration % 10 == 0
  assert [r.iteration for r in reports] == list(range(10, reports[-1].iteration + 1, 10))
  assert reports[-1].best_loss <= 1e-20


def test_bad_arguments():
  with pytest.raises(ValueError, match="unknown optimizer"):
    solvers.make_optimizer("rmsprop", 1.0)
  with pytest.raises(ValueError, match="learning rate"):
    solvers.make_optimizer("adam", 0.0)
  with pytest.raises(ValueError, match="restart strategy"):
    solvers.resolve_strategy("parallel")
  solver = solvers.make_solver(quadratic, solvers.make_optimizer("adam", 0.1))
  with pytest.raises(ValueError, match="positive"):
    solvers.run(solver, stacked(np.zeros(6)), jnp.asarray(C), iterations=0)
