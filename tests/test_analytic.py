"""Tests for gradjax.analytic: closed-form inputs of biased dense layers (Geiping et al. 2020, Prop. 3.1).

References: the client's own image (scikit-image photos), hand-built rank-one layer gradients, and the
MLP's hidden features computed by NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import analytic, clients, models
from gradjax.observation import Observation


@pytest.mark.parametrize("init", ["default", "uniform"])
def test_mlp_input_returns_the_image_float32(photos, init):
  for i in (0, 5, 9):
    model = models.create("mlp", jax.random.key(i), num_classes=10, init=init)
    obs = clients.fedsgd(model.apply_fn, model.variables, photos[i:i + 1], np.array([i % 10]))
    x = analytic.mlp_input(obs, photos.shape[1:])
    assert x.shape == photos.shape[1:] and x.dtype == jnp.float32
    assert np.max(np.abs(np.asarray(x) - photos[i])) <= 1e-5


def test_mlp_input_returns_the_image_float64(photos):
  image = photos[3:4].astype(np.float64)
  with jax.enable_x64(True):
    model = models.create("mlp-16", jax.random.key(3), num_classes=100, param_dtype=jnp.float64)
    obs = clients.fedsgd(model.apply_fn, model.variables, jnp.asarray(image), np.array([42]))
    x = analytic.mlp_input(obs, image.shape[1:], first_layer="Dense_0")
    assert x.dtype == jnp.float64
    assert np.max(np.abs(np.asarray(x) - image[0])) <= 1e-12


def test_mlp_input_gray_image(photos28):
  """A 28x28x1 input: the reshape follows the model's HWC flattening for any shape."""
  model = models.create("mlp", jax.random.key(4), input_shape=(28, 28, 1), num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos28[1:2], np.array([7]))
  np.testing.assert_allclose(analytic.mlp_input(obs, (28, 28, 1)), photos28[1], atol=1e-5)


def test_dense_input_hand_built_layer():
  rng = np.random.default_rng(0)
  x = rng.normal(size=20)
  gb = rng.normal(size=7)
  gb[[1, 4]] = 0.0  # dead units carry no information and must not matter
  gw = np.outer(x, gb)  # ∂L/∂W[:, i] = x ∂L/∂b_i
  with jax.enable_x64(True):
    got = analytic.dense_input(jnp.asarray(gw), jnp.asarray(gb))
    np.testing.assert_allclose(got, x, rtol=1e-13, atol=1e-14)
    # Any one unit with a nonzero bias gradient gives x on its own.
    np.testing.assert_allclose(analytic.dense_input(gw[:, :1], gb[:1]), x, rtol=1e-13)
    # Tiny gradients (a converged model, a scaled update) are no problem: nothing underflows.
    np.testing.assert_allclose(analytic.dense_input(gw * 1e-200, gb * 1e-200, min_abs=0.0), x, rtol=1e-12)


def test_dense_input_errors():
  with pytest.raises(ValueError, match="cannot be recovered"):
    analytic.dense_input(np.zeros((5, 3)), np.zeros(3))
  with pytest.raises(ValueError, match="cannot be recovered"):
    analytic.dense_input(np.ones((5, 3)), np.full(3, 1e-13))
  with pytest.raises(ValueError, match=r"\(in, out\)"):
    analytic.dense_input(np.zeros((5, 3)), np.ones(4))
  with pytest.raises(ValueError, match=r"\(in, out\)"):
    analytic.dense_input(np.zeros((2, 5, 3)), np.ones(3))


def test_dense_inputs_of_mlp_matches_numpy_features(photos):
  model = models.create("mlp", jax.random.key(5), num_classes=10)
  image = photos[6:7]
  obs = clients.fedsgd(model.apply_fn, model.variables, image, np.array([2]))
  found = analytic.dense_inputs_of(obs)
  assert set(found) == {"Dense_0", "head"}
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.variables["params"])
  flat = image.reshape(1, -1).astype(np.float64)
  hidden = np.maximum(flat @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"], 0)[0]
  np.testing.assert_allclose(found["Dense_0"], flat[0], atol=1e-5)
  np.testing.assert_allclose(found["head"], hidden, rtol=1e-4, atol=1e-5 * hidden.max())
  assert np.sum(hidden == 0) > 0  # ReLU zeros are recovered as zeros too


def test_dense_inputs_of_lenet_finds_only_the_head(photos):
  """Conv kernels are 4-D: only the head qualifies; its input is the 768 sigmoid features, in (0, 1)."""
  model = models.create("lenet_zhu", jax.random.key(6))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([1]))
  found = analytic.dense_inputs_of(obs)
  assert list(found) == ["head"] and found["head"].shape == (768,)
  assert np.all((np.asarray(found["head"]) > -1e-5) & (np.asarray(found["head"]) < 1 + 1e-5))


def test_batches_and_bad_layers_are_refused(photos):
  model = models.create("mlp", jax.random.key(7), num_classes=10)
  batch = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))
  with pytest.raises(ValueError, match="mixture") as e:
    analytic.mlp_input(batch, (32, 32, 3))
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="batch 1"):
    analytic.dense_inputs_of(batch)

  single = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([1]))
  with pytest.raises(ValueError, match="no layer"):
    analytic.mlp_input(single, (32, 32, 3), first_layer="Conv_0")
  with pytest.raises(ValueError, match="first layer"):
    analytic.mlp_input(single, (32, 32, 3), first_layer="head")  # 32 inputs, not 3072
  with pytest.raises(ValueError, match="first layer"):
    analytic.mlp_input(single, (28, 28, 3))

  # A first layer without bias.
  no_bias = {**single.gradient, "Dense_0": {"kernel": single.gradient["Dense_0"]["kernel"]}}
  obs = Observation(gradient=no_bias, variables=single.variables, num_samples=1)
  with pytest.raises(ValueError, match="no bias"):
    analytic.mlp_input(obs, (32, 32, 3))
  assert "Dense_0" not in analytic.dense_inputs_of(obs)

  # A convolutional first layer.
  lenet = models.create("lenet_zhu", jax.random.key(8))
  obs = clients.fedsgd(lenet.apply_fn, lenet.variables, photos[:1], np.array([1]))
  with pytest.raises(ValueError, match="not a dense layer"):
    analytic.mlp_input(obs, (32, 32, 3), first_layer="Conv_0")


def test_mlp_input_through_pruning(photos):
  """A pruned update (90 % of every leaf's entries zeroed): each pixel with a kept entry comes back
  exactly; a pixel with none is 0, and such pixels are the darkest (pruning drops small |x_j gb_i|)."""
  from gradjax import defenses
  model = models.create("mlp", jax.random.key(1), num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[2:3], np.array([3]))
  pruned = defenses.parse("prune:0.9").apply(obs)
  x = np.asarray(analytic.mlp_input(pruned, photos.shape[1:]))
  kept = np.asarray(pruned.gradient["Dense_0"]["kernel"] != 0).any(axis=1).reshape(photos.shape[1:])
  assert kept.mean() > 0.5
  np.testing.assert_allclose(x[kept], photos[2][kept], atol=1e-5)
  assert np.all(x[~kept] == 0) and np.max(photos[2][~kept], initial=0) <= np.median(photos[2][kept])


# --- exclusive_neurons: batches through a ReLU dense layer ------------------------------------------


def _numpy_observation(model, x, y, mlp_reference):
  """The update of the mean cross entropy over (x, y), computed by NumPy in float64 and sent as float32."""
  grad = mlp_reference(model.variables["params"], x, y)[1]
  return Observation(gradient=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), grad),
                     variables=model.variables, num_samples=len(x))


def _matched(found, truth):
  """Each found example's distance to its nearest true one (max abs), and which one that is."""
  d = np.abs(found.reshape(len(found), 1, -1) - truth.reshape(1, len(truth), -1)).max(-1)
  return d.min(1), d.argmin(1)


@pytest.mark.slow
def test_exclusive_neurons_separates_a_numpy_batch(photos, mlp_reference):
  """Batch 16 of the scikit-image photos through a 1024-unit ReLU layer: every example and its label
  back to float32 rounding."""
  model = models.create("mlp-1024", jax.random.key(11), num_classes=10)
  y = np.arange(16) % 10
  sep = analytic.exclusive_neurons(_numpy_observation(model, photos, y, mlp_reference),
                                   model.apply_fn, photos.shape[1:])
  assert sep.inputs.shape == (16, 32, 32, 3) and sep.rank == 16
  err, which = _matched(sep.inputs, photos)
  assert sorted(which) == list(range(16)) and err.max() <= 1e-4
  np.testing.assert_array_equal(sep.labels, y[which])
  assert sep.residual <= 1e-5 and sep.singular_values[16] <= 1e-6


def test_exclusive_neurons_peels_what_no_unit_isolates(photos, mlp_reference):
  """A narrower layer (256 units) isolates fewer examples: at batch 16 the first round finds some by
  their exclusive units, later rounds the rest once those are taken off."""
  y = np.arange(16) % 10
  model = models.create("mlp-256", jax.random.key(11), num_classes=10)
  obs = _numpy_observation(model, photos, y, mlp_reference)
  sep = analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:])
  err, which = _matched(sep.inputs, photos)
  assert sorted(which) == list(range(16)) and err.max() <= 1e-4
  np.testing.assert_array_equal(sep.labels, y[which])
  assert sep.rounds.max() >= 1 and np.sum(sep.rounds == 0) < 16
  # Stopped after one round, the peeling's share is missing, and the residual says so.
  first = analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:], max_rounds=1)
  assert len(first.inputs) == np.sum(sep.rounds == 0) and first.residual > 1e-2
  # The residual reported (the run's objective) is ‖G − Σ_found ∇_[W; b] L(x_k, y_k) / N‖ / ‖G‖ of
  # the first layer, each found example's own gradient by NumPy's backprop.
  params = model.variables["params"]

  def layer(grad):
    return np.vstack([grad["Dense_0"]["kernel"], grad["Dense_0"]["bias"][None]])

  g = layer(mlp_reference(params, photos, y)[1])
  for found in (first, sep):
    left = g - sum(layer(mlp_reference(params, x[None], np.array([k]))[1]) / 16
                   for x, k in zip(found.inputs, found.labels))
    assert found.residual == pytest.approx(np.linalg.norm(left) / np.linalg.norm(g), rel=1e-3, abs=1e-6)
  # Inputs centred on their mean leave no unit exclusive (the secure side of Pan et al.'s
  # boundary): nothing is claimed.
  none = analytic.exclusive_neurons(_numpy_observation(model, photos - photos.mean(axis=(0, 1, 2)),
                                                       y, mlp_reference),
                                    model.apply_fn, photos.shape[1:])
  assert none.inputs.shape[0] == 0 and none.rank == 16 and none.residual == 1.0


def test_exclusive_neurons_accepts_no_mixture(photos):
  """A sigmoid layer has no inactive unit, so every column mixes the whole batch: nothing passes."""
  model = models.create("mlp-256", jax.random.key(13), num_classes=10, act="sigmoid")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:8], np.arange(8))
  sep = analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:])
  assert sep.inputs.shape == (0, 32, 32, 3) and sep.rank == 8 and sep.residual == 1.0


def test_exclusive_neurons_refuses(photos):
  model = models.create("mlp-64", jax.random.key(14), num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))
  batch_norm = {**obs.variables, "batch_stats": {}}  # training mode with BatchNorm couples examples
  with pytest.raises(ValueError, match="training mode"):
    analytic.exclusive_neurons(obs.replace(train=True, variables=batch_norm), model.apply_fn,
                               photos.shape[1:])
  # without BatchNorm training mode changes nothing: read as in evaluation mode
  np.testing.assert_array_equal(
      analytic.exclusive_neurons(obs.replace(train=True), model.apply_fn, photos.shape[1:]).inputs,
      analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:]).inputs)
  with pytest.raises(ValueError, match="first layer"):
    analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:], layer="head")
  with pytest.raises(ValueError, match="no layer"):
    analytic.exclusive_neurons(obs, model.apply_fn, photos.shape[1:], layer="Conv_0")
  zero = obs.replace(gradient=jax.tree.map(jnp.zeros_like, obs.gradient))
  with pytest.raises(ValueError, match="all-zero"):
    analytic.exclusive_neurons(zero, model.apply_fn, photos.shape[1:])


# --- head_inputs: the dense head's input per class --------------------------------------------------


def _numpy_head(h, y, w, b):
  """∂L/∂W (F, K) and ∂L/∂b (K,) of the mean cross entropy of z = h W + b over the rows of h, in float64."""
  z = h @ w + b
  p = np.exp(z - z.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  e = (p - np.eye(w.shape[1])[y]) / len(y)
  return h.T @ e, e.sum(0)


def test_head_inputs_of_distinct_classes_are_exact():
  """Six examples of six classes through a random 10-class head: every example's input back exactly,
  from the fixed point started at the batch-1 closed form (which the others' predictions perturb)."""
  rng = np.random.default_rng(5)
  h = rng.uniform(0, 1, size=(6, 40))
  w, b = rng.normal(size=(40, 10)) * 0.3, rng.normal(size=10) * 0.1
  y = np.array([3, 0, 7, 1, 9, 4])
  gw, gb = _numpy_head(h, y, w, b)
  found = analytic.head_inputs(w, b, gw, gb, y)
  np.testing.assert_array_equal(found.classes, np.sort(y))
  order = np.argsort(y)
  np.testing.assert_allclose(found.features, h[order], rtol=1e-8, atol=1e-10)
  np.testing.assert_allclose(found.own, -6 * gb[found.classes])
  z = h[order] @ w + b  # the trust test from NumPy's own predictions: |E_cc| / max_k |E_kc|
  p = np.exp(z - z.max(axis=1, keepdims=True))
  e = np.abs(p / p.sum(axis=1, keepdims=True) - np.eye(10)[np.sort(y)])[:, np.sort(y)]
  dominance = [e[i, i] / np.delete(e[:, i], i).max() for i in range(6)]
  np.testing.assert_allclose(found.dominance, dominance, rtol=1e-8)
  np.testing.assert_array_equal(found.usable, np.asarray(dominance) >= 3)
  assert found.usable.sum() >= 3 and found.residual < 1e-10
  start = gw[:, found.classes] / gb[found.classes]
  assert np.max(np.abs(start.T - h[order])) > 1e-3  # the closed form alone is not exact


def test_head_inputs_of_repeated_classes_are_their_means():
  """Two examples of one class with the same prediction: the class's row is their mean, and not
  usable as either one's; a class its own example barely enters (the model already predicts it)
  is not usable either."""
  rng = np.random.default_rng(6)
  w, b = rng.normal(size=(30, 10)) * 0.3, rng.normal(size=10) * 0.1
  h = rng.uniform(0, 1, size=(4, 30))
  shift = rng.normal(size=30)
  shift -= (shift @ w) @ np.linalg.pinv(w)  # moves an input without changing its logits
  h[1] = h[0] + 0.05 * shift
  y = np.array([2, 2, 5, 8])
  gw, gb = _numpy_head(h, y, w, b)
  found = analytic.head_inputs(w, b, gw, gb, y, nonnegative=False)
  np.testing.assert_allclose(found.features[0], (h[0] + h[1]) / 2, rtol=1e-7, atol=1e-9)
  np.testing.assert_allclose(found.features[1:], h[2:], rtol=1e-7, atol=1e-9)
  np.testing.assert_array_equal(found.usable, [False, True, True])
  # Example 3's class made certain: its own share of the column vanishes.
  b2 = b.copy()
  b2[8] = 30.0 - h[3] @ w[:, 8]
  gw, gb = _numpy_head(h, y, w, b2)
  found = analytic.head_inputs(w, b2, gw, gb, y, nonnegative=False)
  assert not found.usable[2] and found.own[2] < 0.5 and found.dominance[2] < 1


def test_head_inputs_with_every_class_present_are_fixed_by_the_batch_mean():
  """Every class of a 4-class head present, three examples each, near-uniform predictions: the rows
  of E sum to zero, so the least-norm rows miss the class means along one direction; given the
  batch's mean input they come back to the class means (NumPy's means of the true inputs)."""
  rng = np.random.default_rng(8)
  w, b = rng.normal(size=(50, 4)) * 0.01, np.zeros(4)
  y = np.repeat(np.arange(4), 3)
  h = rng.uniform(0, 1, size=(12, 50)) + np.repeat(rng.uniform(0, 1, size=(4, 50)), 3, axis=0)
  gw, gb = _numpy_head(h, y, w, b)
  means = np.stack([h[y == c].mean(0) for c in range(4)])
  spread = np.sqrt(np.mean(np.sum((h - h.mean(0)) ** 2, axis=1)))
  plain = analytic.head_inputs(w, b, gw, gb, y, nonnegative=False)
  fixed = analytic.head_inputs(w, b, gw, gb, y, nonnegative=False, mean_input=h.mean(0))
  assert np.linalg.norm(plain.features - means, axis=1).max() > 0.5 * spread
  assert np.linalg.norm(fixed.features - means, axis=1).max() < 0.05 * spread
  np.testing.assert_allclose(np.bincount(y) @ fixed.features / 12, h.mean(0), rtol=1e-6)
  # A batch missing a class has no free direction: the estimate is not used.
  some = y < 3
  gw, gb = _numpy_head(h[some], y[some], w, b)
  np.testing.assert_array_equal(
      analytic.head_inputs(w, b, gw, gb, y[some], mean_input=np.zeros(50)).features,
      analytic.head_inputs(w, b, gw, gb, y[some]).features)


def _matched_within_classes(found, h, y):
  """Largest relative distance of each true input to its found row, examples of a class matched
  by an assignment (the gradient does not order them)."""
  from scipy.optimize import linear_sum_assignment
  err = np.zeros(len(y))
  for c in np.unique(y):
    idx = np.flatnonzero(y == c)
    d = np.linalg.norm(found[idx][:, None] - h[idx][None], axis=-1) / np.linalg.norm(h[idx], axis=-1)
    r, col = linear_sum_assignment(d)
    err[idx[col]] = d[r, col]
  return err


@pytest.mark.slow  # compiles the solver (restarts and probes: about 8 s on one core)
def test_head_inputs_per_example_separate_a_repeated_class():
  """Seven examples, three of one class and two of another, through a random 10-class head: each
  example's own input back (to 1e-6), not its class's mean, and every one usable."""
  rng = np.random.default_rng(7)
  h = rng.uniform(0, 1, size=(7, 40))
  w, b = rng.normal(size=(40, 10)) * 0.5, rng.normal(size=10) * 0.1
  y = np.array([4, 1, 4, 7, 4, 1, 0])
  gw, gb = _numpy_head(h, y, w, b)
  found = analytic.head_inputs_per_example(w, b, gw, gb, y, key=jax.random.key(0), restarts=8, steps=100)
  assert _matched_within_classes(found.features, h, y).max() < 1e-6
  assert found.usable.all() and found.error.max() < 1e-3 and found.cost < 1e-20
  np.testing.assert_allclose(found.singular_values, np.linalg.svd(gw, compute_uv=False)[:7], rtol=1e-8)
  means = analytic.head_inputs(w, b, gw, gb, y).features  # the class means are no one's own
  assert np.linalg.norm(means[list(np.unique(y)).index(4)] - h[0]) > 0.1 * np.linalg.norm(h[0])
  # One example: its error is relative to its own norm (a batch of one has no spread).
  gw, gb = _numpy_head(h[:1], y[:1], w, b)
  one = analytic.head_inputs_per_example(w, b, gw, gb, y[:1], key=jax.random.key(0), restarts=8, steps=100)
  assert one.usable.all() and _matched_within_classes(one.features, h[:1], y[:1]).max() < 1e-8


@pytest.mark.slow
def test_head_inputs_per_example_flag_examples_the_gradient_does_not_separate():
  """Two examples of a class whose predictions are equal (they differ along a direction the logits
  do not see): the gradient holds only their sum, so neither is usable; the others stay exact; and a
  batch above K − 1 is refused."""
  rng = np.random.default_rng(8)
  w, b = rng.normal(size=(40, 10)) * 0.5, rng.normal(size=10) * 0.1
  h = rng.uniform(0, 1, size=(7, 40))
  shift = rng.normal(size=40)
  shift -= (shift @ w) @ np.linalg.pinv(w)
  h[1] = h[0] + 0.3 * shift
  y = np.array([2, 2, 5, 8, 3, 6, 0])
  gw, gb = _numpy_head(h, y, w, b)
  found = analytic.head_inputs_per_example(w, b, gw, gb, y, key=jax.random.key(1), restarts=8, steps=100)
  np.testing.assert_array_equal(found.usable, [False, False, True, True, True, True, True])
  assert _matched_within_classes(found.features, h, y)[2:].max() < 1e-6
  with pytest.raises(ValueError, match="at most K - 1"):
    analytic.head_inputs_per_example(w, b, gw, gb, np.arange(10), key=jax.random.key(1))


def test_head_inputs_with_uniform_predictions_are_usable():
  """An untrained network predicts every class about equally (small logits): each class's column
  holds about 1 − N/K of its own example, little by ``own``, but more than any other class's
  share: the rows are exact and usable."""
  rng = np.random.default_rng(7)
  h = rng.uniform(0, 1, size=(8, 50))
  w, b = rng.normal(size=(50, 10)) * 0.01, np.zeros(10)
  y = np.array([0, 1, 2, 3, 4, 5, 6, 7])
  gw, gb = _numpy_head(h, y, w, b)
  found = analytic.head_inputs(w, b, gw, gb, y)
  np.testing.assert_allclose(found.features, h, rtol=1e-6, atol=1e-8)
  assert np.all(found.own < 0.5) and np.all(found.usable)


def test_head_inputs_refuses():
  w, b = np.zeros((4, 3)), np.zeros(3)
  with pytest.raises(ValueError, match="labels"):
    analytic.head_inputs(w, b, w, b, np.array([3]))
  with pytest.raises(ValueError, match="dense head"):
    analytic.head_inputs(w, b, w[:, :2], b, np.array([0]))
