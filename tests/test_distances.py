"""Tests for gradjax.distances: weighted distances, depth rules and layer selection.

References: plain NumPy formulas on random trees shaped like LeNet-5's gradient (float64), float64
central finite differences along random directions, closed-form gradients (euclidean, l1), and the
Flax creation order of real parameter trees. (tests/test_objectives.py covers unweighted euclidean and
cosine.)
"""

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gradjax import distances, models
from gradjax.compilation import once

NAMES = ("euclidean", "euclidean_half", "l1", "cosine", "cosine_per_layer", "gaussian_kernel",
         "gaussian_kernel_mean", "gaussian_kernel_annealed")
CALL_ORDER = ("Conv_0", "Conv_1", "Conv_2", "Conv_3", "head")  # LeNet-5's modules, as Flax creates them


def _lenet5_shapes():
  """LeNet-5's parameter shapes on 8x8x1 inputs (keys sorted: eval_shape returns sorted dicts)."""
  params = jax.eval_shape(lambda: models.create("lenet5", jax.random.key(0), input_shape=(8, 8, 1))
                          .variables)["params"]
  return jax.tree.map(lambda s: s.shape, params)


SHAPES = _lenet5_shapes()


def _trees(seed, near=True):
  """(dummy, observed, weights) as float64 NumPy trees; dummy close to observed when ``near``.

  Near means ‖Δ_l‖² ≈ Var(g_l), the regime where SAPAG's kernel is neither 0 nor saturated.
  """
  rng = np.random.default_rng(seed)
  is_shape = lambda s: isinstance(s, tuple)
  obs = jax.tree.map(lambda s: rng.normal(size=s) * rng.uniform(0.1, 2), SHAPES, is_leaf=is_shape)
  if near:
    dummy = jax.tree.map(lambda o: o + rng.normal(size=o.shape) * o.std() / np.sqrt(o.size), obs)
  else:
    dummy = jax.tree.map(lambda o: rng.normal(size=o.shape), obs)
  weights = jax.tree.map(lambda _: float(rng.uniform(0.2, 2)), obs)
  weights["Conv_2"]["kernel"] = 0.0  # a dropped leaf
  return dummy, obs, weights


def _np_reference(name, dummy, obs, weights, step=0):
  """The distance in NumPy, leaf by leaf in jax.tree order (``step``: the annealed kernel's, T = 250)."""
  d, o = jax.tree.leaves(dummy), jax.tree.leaves(obs)
  if weights is None and name.startswith("gaussian_kernel"):
    w = [1.0 / (1 + CALL_ORDER.index(p[0].key)) for p, _ in jax.tree_util.tree_flatten_with_path(obs)[0]]
  else:
    w = [1.0] * len(o) if weights is None else jax.tree.leaves(weights)
  w, d, o = np.array(w), [x.ravel() for x in d], [x.ravel() for x in o]
  if name in ("euclidean", "euclidean_half"):
    return (1.0 if name == "euclidean" else 0.5) * sum(wl * np.sum((a - b) ** 2) for wl, a, b in zip(w, d, o))
  if name == "l1":
    return sum(wl * np.sum(np.abs(a - b)) for wl, a, b in zip(w, d, o))
  eps = distances.EPS
  if name == "cosine":
    dot = sum(wl * a @ b for wl, a, b in zip(w, d, o))
    return 1 - dot / (np.sqrt(sum(wl * a @ a for wl, a in zip(w, d)) + eps)
                      * np.sqrt(sum(wl * b @ b for wl, b in zip(w, o)) + eps))
  if name == "cosine_per_layer":
    cos = [a @ b / (np.sqrt(a @ a + eps) * np.sqrt(b @ b + eps)) for a, b in zip(d, o)]
    return np.sum(w * (1 - np.array(cos))) / np.sum(w)
  if name == "gaussian_kernel":
    return sum(wl * (1 - np.exp(-np.sum((a - b) ** 2) / np.var(b))) for wl, a, b in zip(w, d, o))
  if name == "gaussian_kernel_mean":
    return sum(wl * (1 - np.exp(-np.mean((a - b) ** 2) / np.var(b))) for wl, a, b in zip(w, d, o))
  if name == "gaussian_kernel_annealed":  # width n_l^(1 - t/T) σ_l², then σ_l² from t = T on
    e = max(0.0, 1.0 - step / 250)
    return sum(wl * (1 - np.exp(-np.sum((a - b) ** 2) / (a.size ** e * np.var(b))))
               for wl, a, b in zip(w, d, o))
  raise AssertionError(name)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _jnp(tree):
  return jax.tree.map(jnp.asarray, tree)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("weighted", [False, True])
def test_distance_matches_numpy(name, weighted):
  dummy, obs, weights = _trees(0, near=True)
  far, _, _ = _trees(1, near=False)
  w = weights if weighted else None
  with jax.enable_x64(True):  # jitted: eagerly each operation compiles alone
    distance = jax.jit(lambda d, o: distances.get_distance(name)(d, o, **({} if w is None else
                                                                          {"weights": w})))
    bound = jax.jit(distances.get_distance(name, weights=w))
    for d in (dummy, far):
      want = _np_reference(name, d, obs, w)
      np.testing.assert_allclose(float(distance(_jnp(d), _jnp(obs))), want, rtol=1e-11)
      if w is not None:  # binding the weights with get_distance is the same thing
        np.testing.assert_allclose(float(bound(_jnp(d), _jnp(obs))), want, rtol=1e-11)


@pytest.mark.parametrize("name", NAMES)
def test_distance_gradient_matches_finite_differences(name):
  # SAPAG's kernel is flat far away; the others are tested away from their minimum, where the
  # directional derivative is not tiny compared with the rounding error of the value.
  near = name.startswith("gaussian_kernel")
  dummy, obs, weights = _trees(2, near=near)
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    dist = jax.jit(distances.get_distance(name, weights=weights))
    grad = _flat(jax.grad(dist)(_jnp(dummy), _jnp(obs)))
    # The dropped leaf gets exactly no gradient.
    assert not np.any(np.asarray(jax.grad(dist)(_jnp(dummy), _jnp(obs))["Conv_2"]["kernel"]))
    h = 1e-5
    for _ in range(2):  # directions of the size of Δ
      scale = lambda o: o.std() / np.sqrt(o.size) if near else 1.0
      v = jax.tree.map(lambda x, o: rng.normal(size=x.shape) * scale(o), dummy, obs)
      shifted = lambda t: float(dist(jax.tree.map(lambda x, y: jnp.asarray(x + t * y), dummy, v), _jnp(obs)))
      fd = (shifted(h) - shifted(-h)) / (2 * h)
      analytic = grad @ _flat(v)
      assert abs(fd - analytic) <= 1e-6 * abs(analytic), (fd, analytic)


def test_annealed_kernel_narrows_from_per_entry_to_printed_width():
  dummy, obs, weights = _trees(12, near=True)
  far, _, _ = _trees(13, near=False)
  dist = distances.get_distance("gaussian_kernel_annealed", weights=weights)
  with jax.enable_x64(True):
    at = jax.jit(dist)
    for d in (dummy, far):
      for step in (0, 1, 100, 249, 250, 400):
        want = _np_reference("gaussian_kernel_annealed", d, obs, weights, step=step)
        got = at(_jnp(d), _jnp(obs), step=jnp.asarray(step))
        np.testing.assert_allclose(float(got), want, rtol=1e-11)
      # The two ends are the other registered widths.
      np.testing.assert_allclose(float(at(_jnp(d), _jnp(obs), step=jnp.asarray(0))),
                                 _np_reference("gaussian_kernel_mean", d, obs, weights), rtol=1e-11)
      np.testing.assert_allclose(float(at(_jnp(d), _jnp(obs), step=jnp.asarray(900))),
                                 _np_reference("gaussian_kernel", d, obs, weights), rtol=1e-11)
  # Binding the weights keeps what the record says of the distance.
  assert dist.reads_step and not distances.get_distance("cosine").reads_step
  assert not distances.as_distance(distances.cosine).reads_step
  assert dist.settled_from == 250 and dist.depth_rule == "inverse"
  assert distances.get_distance("gaussian_kernel_mean").settled_from == 0
  assert distances.as_distance(distances.cosine).settled_from == 0
  with pytest.raises(ValueError, match="non-negative"):
    distances.gaussian_kernel(_jnp(obs), _jnp(obs), anneal=-1)
  with pytest.raises(ValueError, match="per_entry"):
    distances.gaussian_kernel(_jnp(obs), _jnp(obs), anneal=10, per_entry=True)


def test_gaussian_kernel_keeps_its_precision_in_float32_near_convergence():
  # An attack that converges drives every term's exponent x_l toward 0; in float32, 1 − exp(−x)
  # rounds to 0 below x ≈ 6e-8 and carries an absolute error of ~6e-8 above, which stopped SAPAG's
  # L-BFGS at ~40 dB. The value must keep float32's relative precision down to x ~ 1e-12. Both trees
  # are float32 values and the reference takes those very values to float64, so the only error left
  # is the kernel's own arithmetic.
  _, obs, weights = _trees(14, near=True)
  obs = jax.tree.map(lambda o: o.astype(np.float32), obs)
  rng = np.random.default_rng(15)
  for scale in (1e-2, 1e-4, 1e-6):  # Δ_l ~ scale · σ_l: x_l ~ scale² per entry
    dummy = jax.tree.map(lambda o: (o + (rng.normal(size=o.shape) * o.std() * scale)).astype(np.float32),
                         obs)
    for name in ("gaussian_kernel", "gaussian_kernel_mean"):
      want = _np_reference(name, jax.tree.map(np.float64, dummy), jax.tree.map(np.float64, obs), weights)
      distance = jax.jit(distances.get_distance(name, weights=weights))  # as attacks run it
      got = distance(_jnp(dummy), _jnp(obs))
      assert got.dtype == jnp.float32 and want > 0
      np.testing.assert_allclose(float(got), want, rtol=1e-4)


def test_closed_form_gradients():
  dummy, obs, weights = _trees(4, near=False)
  w = np.concatenate([np.full(np.size(x), wl)
                      for x, wl in zip(jax.tree.leaves(obs), jax.tree.leaves(weights))])
  delta = _flat(dummy) - _flat(obs)
  with jax.enable_x64(True):
    d, o = _jnp(dummy), _jnp(obs)
    g = jax.grad(lambda t: distances.euclidean(t, o, scale=0.3, weights=weights))(d)
    np.testing.assert_allclose(_flat(g), 2 * 0.3 * w * delta, rtol=1e-13)
    g = jax.grad(lambda t: distances.l1(t, o, weights=weights))(d)
    np.testing.assert_array_equal(_flat(g), w * np.sign(delta))
    # At Δ = 0 the l1 gradient is sign(0) = 0 (jnp.abs would give 1).
    assert not np.any(_flat(jax.grad(distances.l1)(o, o)))


@pytest.mark.parametrize("name", ["cosine", "cosine_per_layer", "gaussian_kernel", "gaussian_kernel_mean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_safe_at_zero_gradients(name, dtype):
  dummy, obs, _ = _trees(5, near=False)
  obs["Conv_1"]["kernel"] = np.zeros_like(obs["Conv_1"]["kernel"])  # an all-zero observed layer
  obs["head"]["bias"] = np.full_like(obs["head"]["bias"], 0.3)        # zero variance, nonzero
  zeros = jax.tree.map(np.zeros_like, obs)
  value_and_grad = jax.jit(jax.value_and_grad(distances.get_distance(name)))
  with jax.enable_x64(True):
    cast = lambda t: jax.tree.map(lambda x: jnp.asarray(x, dtype), t)
    for d, o in ((zeros, obs), (dummy, obs), (zeros, zeros), (obs, obs)):
      value, grad = value_and_grad(cast(d), cast(o))
      assert np.isfinite(float(value)), (name, value)
      assert np.all(np.isfinite(_flat(grad))), name


def test_zero_layer_values():
  """What the guarded terms evaluate to at an all-zero observed layer."""
  _, obs, _ = _trees(6)
  obs = jax.tree.map(np.zeros_like, obs)
  sel = distances.select_layers(obs, include=["Conv_0/kernel"])
  with jax.enable_x64(True):
    o = _jnp(obs)
    ones = jax.tree.map(jnp.ones_like, o)
    # cosine against zeros is 1; a zero layer's kernel term saturates at Q_l once Δ ≠ 0 ...
    assert float(distances.cosine(ones, o)) == pytest.approx(1.0)
    assert float(distances.cosine_per_layer(ones, o)) == pytest.approx(1.0)
    assert float(distances.gaussian_kernel(ones, o, weights=sel)) == pytest.approx(1.0)
    # ... and is 0 with a zero gradient at Δ = 0.
    value, grad = jax.value_and_grad(distances.gaussian_kernel)(o, o, weights=sel)
    assert float(value) == 0.0 and not np.any(_flat(grad))


def test_weights_equal_dropping_leaves():
  dummy, obs, _ = _trees(7, near=False)
  sel = distances.select_layers(obs, exclude=["head", "Conv_0/bias"])
  sub = lambda t: {k: ({"kernel": v["kernel"]} if k == "Conv_0" else v) for k, v in t.items() if k != "head"}
  with jax.enable_x64(True):
    for name in [n for n in NAMES if not n.startswith("gaussian_kernel")]:  # these weight by depth,
      # which dropping leaves changes
      got = distances.get_distance(name, weights=sel)(_jnp(dummy), _jnp(obs))
      want = distances.get_distance(name)(_jnp(sub(dummy)), _jnp(sub(obs)))
      np.testing.assert_allclose(float(got), float(want), rtol=1e-12)


def test_traced_weights_under_jit():
  dummy, obs, weights = _trees(8)
  with jax.enable_x64(True):
    for name in NAMES:
      fn = distances.get_distance(name)
      # The weights as constants of the program, then traced (one program each, compiled at
      # level 0 as the library's run-once programs, not one per operation).
      want = float(once(lambda d, o: fn(d, o, weights=weights))(_jnp(dummy), _jnp(obs)))
      got = once(lambda d, o, w: fn(d, o, weights=w))(_jnp(dummy), _jnp(obs), _jnp(weights))
      np.testing.assert_allclose(float(got), want, rtol=1e-12)


# --- depth order, schedules, selection --------------------------------------------------------------


class _Deep(nn.Module):
  """11 Dense + LayerNorm pairs then "head": sorted keys would put Dense_10 before Dense_2."""

  @nn.compact
  def __call__(self, x):
    for _ in range(11):
      x = nn.LayerNorm()(nn.Dense(2)(x))
    return nn.Dense(3, name="head")(x)


@pytest.fixture(scope="module")
def lenet5_params():
  return models.create("lenet5", jax.random.key(0), input_shape=(8, 8, 1)).variables["params"]


@pytest.fixture(scope="module")
def deep_params():
  return _Deep().init(jax.random.key(0), jnp.zeros((1, 2)))["params"]


def test_depth_order_lenet5(lenet5_params):
  paths = distances.layer_paths(lenet5_params)
  assert [p[0] for p in paths[::2]] == list(CALL_ORDER)
  index = distances.layer_index(lenet5_params)
  assert {k: set(v.values()) for k, v in index.items()} == {k: {i} for i, k in enumerate(CALL_ORDER)}
  for schedule, rule in [("inverse", lambda l: 1 / (l + 1)), ("linear", lambda l: (5 - l) / 5),
                         ("exp", lambda l: 0.3**l), ("uniform", lambda l: 1.0)]:
    q = distances.depth_weights(lenet5_params, schedule, decay=0.3)
    assert jax.tree.structure(q) == jax.tree.structure(lenet5_params)
    for l, k in enumerate(CALL_ORDER):
      assert q[k]["kernel"] == q[k]["bias"] == pytest.approx(rule(l))


def test_depth_order_follows_insertion_not_sorting(deep_params):
  order = [f"{c}_{i}" for i in range(11) for c in ("Dense", "LayerNorm")] + ["head"]
  assert sorted(deep_params) != order  # JAX's order would be wrong here
  assert list(dict.fromkeys(p[0] for p in distances.layer_paths(deep_params))) == order
  q = distances.depth_weights(deep_params)
  for l, k in enumerate(order):
    assert set(q[k].values()) == {1 / (l + 1)}
  assert q["Dense_2"]["kernel"] > q["Dense_10"]["kernel"]
  # A tree that went through jax.grad / tree.map has its keys sorted: depth is no longer recoverable.
  assert list(jax.tree.map(lambda x: x, deep_params)) == sorted(deep_params)


def test_nested_modules_count_separately():
  block = {"Conv_0": {"kernel": 0.0}, "Norm_0": {"scale": 0.0, "bias": 0.0}}
  params = {"Conv_0": {"kernel": 0.0}, "Block_0": block, "head": {"kernel": 0.0, "bias": 0.0}}
  assert distances.layer_index(params) == {
      "Conv_0": {"kernel": 0}, "head": {"kernel": 3, "bias": 3},
      "Block_0": {"Conv_0": {"kernel": 1}, "Norm_0": {"scale": 2, "bias": 2}}}
  assert distances.select_layers(params, include=["Block_0"], exclude=["Block_0/Norm_0/bias"]) == {
      "Conv_0": {"kernel": 0.0}, "head": {"kernel": 0.0, "bias": 0.0},
      "Block_0": {"Conv_0": {"kernel": 1.0}, "Norm_0": {"scale": 1.0, "bias": 0.0}}}


def test_gaussian_kernel_default_schedule(lenet5_params):
  """With weights=None, Q_l = 1/(l+1) in call order, also from a (key-sorted) gradient tree."""
  dummy, obs, _ = _trees(9)
  with jax.enable_x64(True):
    d, o = _jnp(dummy), _jnp(obs)
    want = distances.gaussian_kernel(d, o, weights=distances.depth_weights(lenet5_params))
    np.testing.assert_allclose(float(distances.gaussian_kernel(d, o)), float(want), rtol=1e-14)
  # 11 Dense layers: name order still recoverable (Dense_2 before Dense_10), single class + head.
  dense = {f"Dense_{i}": {"kernel": np.full(3, float(i))} for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)}
  dense["head"] = {"kernel": np.arange(3.0)}
  ordered = {k: dense[k] for k in [f"Dense_{i}" for i in range(11)] + ["head"]}
  zeros = jax.tree.map(np.zeros_like, dense)
  np.testing.assert_allclose(
      float(distances.gaussian_kernel(zeros, dense)),
      float(distances.gaussian_kernel(zeros, dense, weights=distances.depth_weights(ordered))), rtol=1e-6)


def test_call_order(lenet5_params, deep_params):
  grad = jax.grad(lambda p: sum(jnp.sum(x) for x in jax.tree.leaves(p)))(lenet5_params)
  assert list(grad) == sorted(CALL_ORDER)  # jax.grad sorts keys ...
  restored = distances.call_order(grad)   # ... call_order restores them from the names
  assert distances.layer_index(restored) == distances.layer_index(lenet5_params)
  dense = {f"Dense_{i}": {"kernel": 0.0} for i in range(12)}
  assert list(distances.call_order(dict(sorted(dense.items())))) == list(dense)
  with pytest.raises(ValueError, match="depth order"):
    distances.call_order(jax.tree.map(lambda x: x, deep_params))  # Dense_i / LayerNorm_i interleaving


def test_gaussian_kernel_needs_weights_for_mixed_modules(deep_params):
  grad = jax.tree.map(jnp.ones_like, deep_params)
  with pytest.raises(ValueError, match="depth_weights"):
    distances.gaussian_kernel(grad, grad)
  assert float(distances.gaussian_kernel(grad, grad, weights=distances.depth_weights(deep_params))) == 0.0


def test_combined_weights(lenet5_params):
  q = distances.depth_weights(lenet5_params, "linear")
  s = distances.select_layers(lenet5_params, include=["Conv_1", "head"])
  w = jax.tree.map(operator.mul, q, s)
  assert w["Conv_1"]["bias"] == pytest.approx(0.8) and w["head"]["kernel"] == pytest.approx(0.2)
  assert w["Conv_0"]["kernel"] == 0.0
  grad = jax.tree.map(jnp.ones_like, lenet5_params)
  assert float(distances.cosine(grad, grad, weights=w)) == pytest.approx(0.0, abs=1e-6)


# --- errors -----------------------------------------------------------------------------------------


def test_errors(lenet5_params):
  _, obs, weights = _trees(10)
  o = _jnp(obs)
  missing = {k: v for k, v in obs.items() if k != "head"}
  with pytest.raises(ValueError, match="dummy tree"):
    distances.euclidean(missing, o)
  with pytest.raises(ValueError, match="weights tree"):
    distances.cosine(o, o, weights={k: v for k, v in weights.items() if k != "head"})
  bad_shape = {**obs, "head": {"kernel": obs["head"]["kernel"][:1], "bias": obs["head"]["bias"]}}
  with pytest.raises(ValueError, match="shape"):
    distances.l1(bad_shape, o)
  for bad in (-1.0, np.nan):
    with pytest.raises(ValueError, match="non-negative"):
      distances.cosine(o, o, weights={**weights, "head": {"kernel": bad, "bias": 1.0}})
  with pytest.raises(ValueError, match="one scalar"):
    distances.euclidean(o, o, weights={**weights, "head": {"kernel": np.ones(2), "bias": 1.0}})
  with pytest.raises(ValueError, match="no layer"):
    distances.cosine_per_layer(o, o, weights=jax.tree.map(lambda _: 0.0, weights))
  with pytest.raises(ValueError, match="no leaves"):
    distances.euclidean({}, {})
  with pytest.raises(ValueError, match="unknown distance"):
    distances.get_distance("manhattan")
  with pytest.raises(ValueError, match="takes no"):
    distances.get_distance("l1", eps=1e-8)
  with pytest.raises(ValueError, match="depth rule"):
    distances.depth_weights(lenet5_params, "cosine")
  with pytest.raises(ValueError, match="decay"):
    distances.depth_weights(lenet5_params, "exp", decay=0.0)
  with pytest.raises(ValueError, match="unknown layer"):
    distances.select_layers(lenet5_params, include=["Conv_9"])
  with pytest.raises(ValueError, match="unknown layer"):
    distances.select_layers(lenet5_params, exclude="kernel")
  with pytest.raises(ValueError, match="no layer"):
    distances.select_layers(lenet5_params, include=["head"], exclude=["head"])


def test_a_depth_rule_needs_a_distance_that_takes_weights():
  from gradjax import attacks  # pylint: disable=g-import-not-at-top

  def plain(u, v):
    return sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(v)))

  def weighted(u, v, weights=None):
    del weights
    return plain(u, v)

  for make in (lambda: attacks.Attack(distance=plain, depth_rule="inverse"),
               lambda: distances.Distance(plain, depth_rule="inverse")):
    with pytest.raises(ValueError, match="depth rule 'inverse' weighs the layers, but the distance "
                                         "plain takes no keyword 'weights'"):
      make()
  assert attacks.Attack(distance=weighted, depth_rule="inverse").depth_rule == "inverse"
  assert attacks.Attack(distance=lambda u, v, **kw: plain(u, v), depth_rule="linear")
