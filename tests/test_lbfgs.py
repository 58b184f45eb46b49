"""gradjax.lbfgs: the dense-product L-BFGS direction equals optax's two-loop recursion (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradjax import lbfgs


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(5, 5))
  a = a @ a.T + np.eye(5)

  def f(p):
    return 0.5 * p["a"] @ a @ p["a"] + jnp.sum(jnp.cosh(p["b"])) + p["a"][:2] @ p["b"] ** 2

  return f, {"a": jnp.asarray(rng.normal(size=5)), "b": jnp.asarray(rng.normal(size=(2,)))}


@pytest.mark.parametrize("memory_size", [1, 3, 10])
@pytest.mark.parametrize("scale_init_precond", [True, False])
@pytest.mark.slow
def test_direction_equals_optax_two_loop_recursion(memory_size, scale_init_precond):
  """Same inputs every call for 15 calls (the circular memory wraps for sizes 1 and 3)."""
  with jax.enable_x64(True):
    f, p = _problem()
    ref = optax.scale_by_lbfgs(memory_size, scale_init_precond)
    new = lbfgs.scale_by_lbfgs(memory_size, scale_init_precond)
    s_ref, s_new = ref.init(p), new.init(p)
    # Jitted, as a solver runs them: unjitted, each operation would be compiled on its own.
    grad, ref_update, new_update = jax.jit(jax.grad(f)), jax.jit(ref.update), jax.jit(new.update)
    for _ in range(15):
      g = grad(p)
      d_ref, s_ref = ref_update(g, s_ref, p)
      d_new, s_new = new_update(g, s_new, p)
      for a, b in zip(jax.tree.leaves(d_ref), jax.tree.leaves(d_new)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-10, atol=1e-13)
      p = jax.tree.map(lambda x, d: x - 0.3 * d, p, d_ref)
    # The Gram matrix the state keeps is s_i . y_j of the stored pairs.
    s_mem = np.concatenate([np.asarray(x).reshape(memory_size, -1)
                            for x in jax.tree.leaves(s_new.diff_params_memory)], axis=1)
    y_mem = np.concatenate([np.asarray(x).reshape(memory_size, -1)
                            for x in jax.tree.leaves(s_new.diff_updates_memory)], axis=1)
    np.testing.assert_allclose(np.asarray(s_new.gram), s_mem @ y_mem.T, rtol=1e-10, atol=1e-13)


@pytest.mark.slow
def test_lbfgs_with_line_search_follows_optax_iterates():
  """The full optimizer (direction, lr, zoom line search) gives optax.lbfgs's iterates on Rosenbrock."""
  def rosenbrock(p):
    x = p["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

  with jax.enable_x64(True):
    runs = []
    search = optax.scale_by_zoom_linesearch(max_linesearch_steps=15)
    for tx in (optax.lbfgs(memory_size=4, linesearch=search), lbfgs.lbfgs(memory_size=4, linesearch=search)):
      p = {"x": jnp.asarray([-1.2, 1.0, -0.5, 0.8])}
      state = tx.init(p)
      value_and_grad = optax.value_and_grad_from_state(rosenbrock)

      @jax.jit
      def step(p, state, tx=tx, value_and_grad=value_and_grad):
        value, grad = value_and_grad(p, state=state)
        updates, state = tx.update(grad, state, p, value=value, grad=grad, value_fn=rosenbrock)
        return optax.apply_updates(p, updates), state

      path = []
      for _ in range(30):
        p, state = step(p, state)
        path.append(np.asarray(p["x"]))
      runs.append(np.stack(path))
    # Equal up to rounding, which the nonconvex problem amplifies to ~1e-11 over 30 iterations.
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-8, atol=1e-9)
    assert rosenbrock({"x": jnp.asarray(runs[1][-1])}) < 1.0  # from 281.7


def test_bad_memory_size():
  with pytest.raises(ValueError, match="memory_size"):
    lbfgs.scale_by_lbfgs(0)


@pytest.mark.parametrize("restarts", [None, 3])
@pytest.mark.parametrize("min_curvature", [None, 1e-10])
def test_history_is_updated_in_place(restarts, min_curvature):
  """The solver's step program (donated state, ``compilation.STEP``; ``BATCHED_STEP`` vmapped) does
  not copy L-BFGS's (m, ...) history buffers, alone or vmapped over restarts: each copy reads and
  writes the whole history."""
  from gradjax import compilation
  tx = lbfgs.lbfgs(1.0, memory_size=7, linesearch=None, min_curvature=min_curvature)
  params = {"x": jnp.ones((4, 5, 3), jnp.float32), "y": jnp.ones((6,), jnp.float32)}

  def update(state, p):
    g = jax.tree.map(jnp.sin, p)
    u, state = tx.update(g, state, p)
    return state, optax.apply_updates(p, u)

  init = tx.init
  if restarts is not None:
    update, init = jax.vmap(update), jax.vmap(init)
    params = jax.tree.map(lambda a: jnp.stack([a] * restarts), params)
  state = jax.tree.map(jnp.copy, init(params))   # init shares one zeros buffer between leaves
  options = compilation.STEP if restarts is None else compilation.BATCHED_STEP
  step = jax.jit(update, donate_argnums=0, compiler_options=compilation.options(options))
  hlo = step.lower(state, params).compile().as_text()
  history = [f"f32[{'' if restarts is None else f'{restarts},'}7,4,5,3]",
             f"f32[{'' if restarts is None else f'{restarts},'}7,6]"]
  copies = [line for line in hlo.splitlines() if " copy(" in line and any(h in line for h in history)]
  assert not copies, copies
  state, params = step(state, params)   # and it runs
  assert np.isfinite(np.asarray(params["x"])).all()


def _numpy_lbfgs_skipping(grad, x, iterations, memory_size, lr, min_curvature):
  """Fixed-step L-BFGS as torch.optim.LBFGS runs it, in float64 NumPy: the two-loop recursion over
  the stored pairs, a pair stored only if s·y > min_curvature, γ = s·y / y·y of the newest stored
  pair (min(1, 1/‖g‖) before any), x ← x − lr · H g."""
  pairs, gamma, prev, skipped, xs = [], None, None, 0, []
  for _ in range(iterations):
    g = grad(x)
    if prev is None:
      gamma = min(1.0, 1.0 / np.linalg.norm(g))
    else:
      s, y = x - prev[0], g - prev[1]
      if s @ y > min_curvature:
        pairs = (pairs + [(s, y)])[-memory_size:]
        gamma = (s @ y) / (y @ y)
      else:
        skipped += 1
    q, alphas = g.copy(), []
    for s, y in reversed(pairs):
      a = (s @ q) / (y @ s)
      alphas.append(a)
      q -= a * y
    r = gamma * q
    for (s, y), a in zip(pairs, reversed(alphas)):
      r += s * (a - (y @ r) / (y @ s))
    prev = (x, g)
    x = x - lr * r
    xs.append(x)
  return np.array(xs), skipped


@pytest.mark.slow
def test_fixed_step_skips_pairs_of_negative_curvature_as_pytorch():
  """On a nonconvex function, where fixed steps meet negative curvature, the iterates equal a NumPy
  L-BFGS that skips pairs with s·y <= 1e-10 (torch.optim.LBFGS's rule); optax's store-every-pair
  rule gives other iterates."""
  f = lambda x: jnp.sum(0.5 * x ** 2 + 3.0 * jnp.sin(4.0 * x))
  x0 = np.linspace(-1.3, 1.7, 6)
  with jax.enable_x64(True):
    grad = jax.jit(jax.grad(f))
    want, skipped = _numpy_lbfgs_skipping(lambda x: np.asarray(grad(jnp.asarray(x))), x0, 25, 4, 1.0,
                                          1e-10)
    assert skipped >= 2
    got = {}
    for rule in (1e-10, None):
      tx = lbfgs.lbfgs(1.0, memory_size=4, linesearch=None, min_curvature=rule)
      x, state, xs = jnp.asarray(x0), None, []
      state, update = tx.init(x), jax.jit(tx.update)
      for _ in range(25):
        u, state = update(grad(x), state, x)
        x = optax.apply_updates(x, u)
        xs.append(np.asarray(x))
      got[rule] = np.array(xs)
  np.testing.assert_allclose(got[1e-10], want, rtol=1e-9, atol=1e-12)
  assert np.abs(got[None] - want).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("min_curvature", [None, 1e-10])
def test_non_finite_pair_never_enters_the_memory(min_curvature):
  """A NaN gradient (a diverged restart) leaves the stored pairs, their weights, the Gram matrix and
  the pair count as they were; a later finite call's direction is then finite."""
  f, p = _problem()
  grad = jax.jit(jax.grad(f))
  tx = lbfgs.scale_by_lbfgs(memory_size=3, min_curvature=min_curvature)
  state, update = tx.init(p), jax.jit(tx.update)
  for _ in range(4):
    u, state = update(grad(p), state, p)
    p = optax.apply_updates(p, optax.tree.scale(-0.1, u))
  before = state
  nan = jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), grad(p))
  _, state = update(nan, state, p)
  for name in ("diff_params_memory", "diff_updates_memory", "weights_memory"):
    jax.tree.map(np.testing.assert_array_equal, getattr(state, name), getattr(before, name))
  # The Gram matrix's row and column of the kept slot are recomputed from the same vectors.
  np.testing.assert_allclose(state.gram, before.gram, rtol=1e-6)
  assert int(state.count) == int(before.count) and state.identity_scale == before.identity_scale
  u, state = update(grad(p), state, p)   # the pair against the NaN gradient is skipped too
  u, state = update(grad(p), state, optax.apply_updates(p, optax.tree.scale(-0.1, u)))
  assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves((u, state)))
