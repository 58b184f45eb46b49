"""gradjax.linesearch: optax's zoom line search with one objective evaluation per trial (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradjax import compilation, lbfgs
from gradjax import linesearch


def _quadratic(p):
  return 0.5 * jnp.sum(jnp.arange(1.0, p.size + 1.0) * p**2)


def _rosenbrock(p):
  return jnp.sum(100.0 * (p[1:] - p[:-1] ** 2) ** 2 + (1.0 - p[:-1]) ** 2)


def _log_barrier(p):
  return jnp.sum(p**2 - jnp.log(p))  # NaN for any negative entry: steps can leave the domain


_X = np.asarray([0.7, -1.3, 0.4, 1.1])
# (objective, point, direction as a multiple of −∇f): step 1 too short (bracketing doubles it), too
# long (zooming), about right, an ascent direction (the search fails), and steps that leave the
# domain of the logarithm.
_CASES = {
    "short": (_quadratic, _X, 0.05),
    "long": (_quadratic, _X, 1.0),
    "rosenbrock": (_rosenbrock, _X, 1e-3),
    "ascent": (_quadratic, _X, -1.0),
    "domain": (_log_barrier, np.abs(_X), 2.0),
}


def _one_search(transform, f, x, scale):
  x = jnp.asarray(x)
  value, grad = jax.value_and_grad(f)(x)
  state = transform.init(x)
  updates, state = transform.update(-scale * grad, state, x, value=value, grad=grad, value_fn=f)
  return updates, state


@pytest.mark.parametrize("case", sorted(_CASES))
def test_one_search_equals_optax(case):
  """Same accepted step, value, gradient, trial count and errors as optax's search."""
  f, x, scale = _CASES[case]
  with jax.enable_x64(True):
    ours = _one_search(linesearch.scale_by_zoom_linesearch(20), f, x, scale)
    ref = _one_search(optax.scale_by_zoom_linesearch(20), f, x, scale)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("case", ["short", "long", "rosenbrock", "domain"])
def test_accepted_step_satisfies_strong_wolfe(case):
  """The step meets Armijo's decrease (c₁ = 1e-4) and the curvature condition (c₂ = 0.9), checked
  in NumPy from values and gradients computed again at the accepted point."""
  f, x, scale = _CASES[case]
  with jax.enable_x64(True):
    updates, state = _one_search(linesearch.scale_by_zoom_linesearch(20), f, x, scale)
    x = np.asarray(x, np.float64)
    g0 = np.asarray(jax.grad(f)(jnp.asarray(x)))
    direction = -scale * g0
    step = float(state.learning_rate)
    new = x + step * direction
    f0, f1 = float(f(jnp.asarray(x))), float(f(jnp.asarray(new)))
    g1 = np.asarray(jax.grad(f)(jnp.asarray(new)))
  np.testing.assert_allclose(np.asarray(updates), step * direction, rtol=1e-12)
  slope0, slope1 = g0 @ direction, g1 @ direction
  assert step > 0 and np.isfinite(f1)
  assert f1 <= f0 + 1e-4 * step * slope0
  assert abs(slope1) <= 0.9 * abs(slope0)
  np.testing.assert_allclose(float(state.value), f1, rtol=1e-12)
  np.testing.assert_allclose(np.asarray(state.grad), g1, rtol=1e-12)


def test_zoom_on_a_quadratic_lands_on_the_line_minimum():
  """Along a quadratic the interpolation is exact: one overshooting trial, then η* = −f'(0)/f''."""
  with jax.enable_x64(True):
    f, x, scale = _CASES["long"]
    _, state = _one_search(linesearch.scale_by_zoom_linesearch(20), f, x, scale)
  g = np.arange(1.0, 5.0) * x
  d = -scale * g
  exact = -(g @ d) / (d @ (np.arange(1.0, 5.0) * d))
  np.testing.assert_allclose(float(state.learning_rate), exact, rtol=1e-10)
  assert int(state.info.num_linesearch_steps) == 2


@pytest.mark.slow
@pytest.mark.parametrize("guess", ["one", "keep"])
def test_lbfgs_iterates_equal_optax(guess):
  """L-BFGS with either search follows the same path on Rosenbrock for 40 iterations."""
  def path(search):
    tx = lbfgs.lbfgs(memory_size=5, linesearch=search)
    p = jnp.asarray([-1.2, 1.0, -0.5, 0.8])
    state = tx.init(p)

    @jax.jit
    def step(p, state):
      value, grad = jax.value_and_grad(_rosenbrock)(p)
      updates, state = tx.update(grad, state, p, value=value, grad=grad, value_fn=_rosenbrock)
      return optax.apply_updates(p, updates), state

    out = []
    for _ in range(40):
      p, state = step(p, state)
      out.append((np.asarray(p), int(optax.tree.get(state, "num_linesearch_steps"))))
    return out

  with jax.enable_x64(True):
    ours = path(linesearch.scale_by_zoom_linesearch(15, initial_guess_strategy=guess))
    ref = path(optax.scale_by_zoom_linesearch(15, initial_guess_strategy=guess))
  np.testing.assert_allclose(np.stack([p for p, _ in ours]), np.stack([p for p, _ in ref]),
                             rtol=1e-9, atol=1e-12)
  assert [n for _, n in ours] == [n for _, n in ref]
  assert _rosenbrock(jnp.asarray(ours[-1][0])) < 0.1  # from 281.7


def test_objective_is_traced_once_per_search():
  """optax's body is a cond whose two branches each evaluate the objective (both run under vmap);
  this search's body evaluates it once."""
  def traces(search):
    count = [0]

    def f(p):
      count[0] += 1
      return _quadratic(p)

    x = jnp.asarray(_X)
    jax.make_jaxpr(lambda x: search.update(-jax.grad(f)(x), search.init(x), x, value=f(x),
                                           grad=jax.grad(f)(x), value_fn=f))(x)
    return count[0] - 3  # the three calls outside the search

  assert traces(linesearch.scale_by_zoom_linesearch(20)) == 1
  assert traces(optax.scale_by_zoom_linesearch(20)) == 2


def test_vmapped_searches_equal_their_runs_alone():
  """Restarts whose searches take different numbers of trials, vmapped, give each one's own result."""
  search = linesearch.scale_by_zoom_linesearch(20)
  with jax.enable_x64(True):
    scales = jnp.asarray([0.05, 3.0, 0.3])
    x = jnp.asarray(_X)

    def one(scale):
      value, grad = jax.value_and_grad(_quadratic)(x)
      return search.update(-scale * grad, search.init(x), x, value=value, grad=grad,
                           value_fn=_quadratic)

    batched = jax.vmap(one)(scales)
    alone = [one(s) for s in scales]
  steps = [int(a[1].info.num_linesearch_steps) for a in alone]
  assert len(set(steps)) > 1
  for i, a in enumerate(alone):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(batched)):
      np.testing.assert_allclose(np.asarray(v)[i], np.asarray(u), rtol=1e-12, atol=1e-15)


def test_bad_guess_strategy():
  with pytest.raises(ValueError, match="initial guess strategy"):
    linesearch.scale_by_zoom_linesearch(20, initial_guess_strategy="double")


def test_state_keeps_its_types():
  """init_fn's state has update_fn's types (no weak types), so a jitted step taking either compiles
  once."""
  search = linesearch.scale_by_zoom_linesearch(20)
  x = jnp.asarray(_X, jnp.float32)
  value, grad = compilation.once(jax.value_and_grad(_quadratic))(x)
  state = search.init(x)
  _, new = compilation.once(lambda s: search.update(-grad, s, x, value=value, grad=grad,
                                           value_fn=_quadratic))(state)
  aval = lambda a: (a.shape, a.dtype, a.weak_type)
  assert jax.tree.map(aval, state) == jax.tree.map(aval, new)
