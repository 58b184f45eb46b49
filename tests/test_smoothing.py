"""The rounded model (models.layers.smooth_relu, max_pool with a sharpness) and the attack's
continuation towards the model itself (objectives.Smoothing), against NumPy (the rounded MLP's
backpropagation: conftest.np_mlp_grads) and closed forms."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import attacks, models, objectives, presets
from gradjax.models import layers
from gradjax.objectives import Smoothing
from gradjax.observation import Observation


def _np_soft_pool(x, k, kappa):
  n, h, w, c = x.shape
  out = np.zeros((n, h // k, w // k, c))
  for i in range(h // k):
    for j in range(w // k):
      v = x[:, i * k:(i + 1) * k, j * k:(j + 1) * k].reshape(n, k * k, c).astype(np.float64)
      e = np.exp(kappa * (v - v.max(axis=1, keepdims=True)))
      out[:, i, j] = (e * v).sum(axis=1) / e.sum(axis=1)
  return out


def test_smooth_relu_is_softplus_and_within_log2_over_kappa():
  x = np.linspace(-3, 3, 601)
  for kappa in (0.5, 2.0, 50.0):
    got = np.asarray(layers.smooth_relu(jnp.asarray(x, jnp.float32), kappa))
    np.testing.assert_allclose(got, np.logaddexp(0.0, kappa * x) / kappa, rtol=1e-5, atol=1e-6)
    gap = got - np.maximum(x, 0)
    assert gap.min() >= -1e-6 and gap.max() <= np.log(2) / kappa + 1e-6
  assert layers.activation("relu", None) is jax.nn.relu
  assert layers.activation("sigmoid", 3.0) is jax.nn.sigmoid  # already smooth: unchanged


def test_soft_max_pool_against_numpy_and_its_limits():
  x = np.random.default_rng(0).normal(size=(2, 10, 10, 3)).astype(np.float32)
  for kappa in (0.3, 4.0):
    np.testing.assert_allclose(np.asarray(layers.max_pool(jnp.asarray(x), 3, kappa)),
                               _np_soft_pool(x, 3, kappa), rtol=1e-5, atol=1e-6)
  exact = x[:, :9, :9].reshape(2, 3, 3, 3, 3, 3).max(axis=(2, 4))
  np.testing.assert_array_equal(np.asarray(layers.max_pool(jnp.asarray(x), 3)), exact)
  np.testing.assert_allclose(np.asarray(layers.max_pool(jnp.asarray(x), 3, 1e4)), exact, atol=1e-3)
  mean = x[:, :9, :9].reshape(2, 3, 3, 3, 3, 3).mean(axis=(2, 4))
  np.testing.assert_allclose(np.asarray(layers.max_pool(jnp.asarray(x), 3, 1e-6)), mean, atol=1e-5)


@pytest.mark.slow
def test_rounded_convnet_tends_to_the_model_and_differs_when_rounded():
  model = models.create("convnet-1", jax.random.key(0), input_shape=(16, 16, 3), conv="xla")
  x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3))
  exact = np.asarray(model.apply_fn(model.variables, x))
  assert models.smoothable(model.apply_fn)
  sharp = np.asarray(model.apply_fn(model.variables, x, sharpness=1e5))
  soft = np.asarray(model.apply_fn(model.variables, x, sharpness=1.0))
  np.testing.assert_allclose(sharp, exact, atol=1e-3 * np.abs(exact).max())
  assert np.abs(soft - exact).max() > 1e-2 * np.abs(exact).max()


def test_sharpness_schedule_is_geometric_then_constant():
  s = Smoothing(until=100, start=2.0, end=2e4)
  kappa = np.asarray([s.sharpness(t) for t in (0, 50, 100, 250)])
  np.testing.assert_allclose(kappa, [2.0, 2.0 * np.sqrt(1e4), 2e4, 2e4], rtol=1e-5)
  for bad in (dict(until=0), dict(until=5, start=0.0), dict(until=5, start=10.0, end=1.0)):
    with pytest.raises(ValueError):
      Smoothing(**bad)


def _observation(name="mlp-16", n=2):
  model = models.create(name, jax.random.key(3), input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(4), (n, 8, 8, 3))
  y = jnp.arange(n)
  g = objectives.dummy_gradient(model.apply_fn, model.variables, x, y)
  return model, Observation(g, model.variables, labels=y, num_samples=n), x, y


@pytest.mark.slow
def test_objective_takes_the_rounded_gradient_before_until_and_the_sharp_one_after(mlp_reference):
  model, obs, x, y = _observation()
  dummy = {"x": jax.random.uniform(jax.random.key(5), x.shape)}
  dist = lambda a, b: sum(jnp.sum((p - q) ** 2) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  plain = objectives.gradient_matching(model.apply_fn, dist)
  smooth = objectives.gradient_matching(model.apply_fn, dist, smoothing=Smoothing(until=10, end=1e5))
  params = model.variables["params"]
  observed = mlp_reference(params, x, y)[1]

  def by_hand(kappa):  # NumPy's backpropagation through softplus(κa)/κ (None: the ReLU)
    g = mlp_reference(params, dummy["x"], y, kappa)[1]
    return sum(np.sum((p - q) ** 2) for p, q in zip(jax.tree.leaves(g), jax.tree.leaves(observed)))

  np.testing.assert_allclose(float(smooth(dummy, obs, y, 0)), by_hand(2.0), rtol=1e-4)
  np.testing.assert_allclose(float(plain(dummy, obs, y, 0)), by_hand(None), rtol=1e-4)
  np.testing.assert_allclose(float(smooth(dummy, obs, y, 20)), by_hand(None), rtol=1e-4)
  assert abs(by_hand(2.0) - by_hand(None)) > 1e-2 * by_hand(None)  # the rounding shows


@pytest.mark.slow
def test_attack_tracks_its_best_iterate_after_the_smoothing_and_rescales_it():
  attack = dataclasses.replace(presets.inverting_gradients_batch(40), smoothing=Smoothing(until=20))
  assert attacks.track_from(attack) == 20
  assert attacks.rescaled(attack, 80).smoothing.until == 40
  assert attacks.describe(attack)["smoothing"] == {"until": 20, "start": 2.0, "end": 1e4}
  with pytest.raises(ValueError, match="within the budget"):
    dataclasses.replace(attack, smoothing=Smoothing(until=40))
  with pytest.raises(ValueError, match="replay"):
    dataclasses.replace(presets.inverting_gradients_fedavg(), smoothing=Smoothing(until=5))
  model, obs, _, _ = _observation()
  rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(0), input_shape=(8, 8, 3))
  assert np.isfinite(rec.loss) and rec.x.shape == (2, 8, 8, 3)
  # A constant schedule (DLG's L-BFGS) shares its compiled solver across budgets, not across smoothings.
  lbfgs = dataclasses.replace(presets.dlg(40), smoothing=Smoothing(until=20))
  rec = attacks.reconstruct(lbfgs, model.apply_fn, obs, jax.random.key(0), input_shape=(8, 8, 3))
  assert np.isfinite(rec.loss)
  with pytest.raises(ValueError, match="sharpness"):
    attacks.prepare(attack, lambda v, z, t=False: model.apply_fn(v, z, t), obs, jax.random.key(0),
                    input_shape=(8, 8, 3))
