"""Tests for gradjax.cocktail, the Cocktail Party Attack (Kariyappa et al., ICML 2023).

References: the sources a mixture was made of (FastICA), the client's own photos scored by
scikit-image, the update computed by NumPy in float64 (conftest's ``mlp_reference``), and the
closed form of an example's bias coordinate.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import skimage.metrics

from gradjax import analytic, clients, cocktail, data, models
from gradjax.observation import Observation
from gradjax.run import config, pipeline


def _whiten(x):
  centred = x - x.mean(axis=1, keepdims=True)
  var, vec = np.linalg.eigh(centred @ centred.T / centred.shape[1])
  return (vec / np.sqrt(var)).T @ centred


def test_fast_ica_unmixes_independent_sources():
  """Four independent Laplacian signals mixed by a random matrix: FastICA's components are the
  sources up to order, sign and scale (each correlates with its own source above 0.995)."""
  rng = np.random.default_rng(0)
  sources, mixing = rng.laplace(size=(4, 20000)), rng.normal(size=(4, 4))
  w, steps = cocktail.fast_ica(_whiten(mixing @ sources), seed=1)
  np.testing.assert_allclose(w @ w.T, np.eye(4), atol=1e-10)
  components = w @ _whiten(mixing @ sources)
  corr = np.abs(np.corrcoef(components, sources)[:4, 4:])
  rows, cols = scipy.optimize.linear_sum_assignment(-corr)
  assert corr[rows, cols].min() > 0.995 and steps < 1000, (corr, steps)
  start, none = cocktail.fast_ica(_whiten(mixing @ sources), seed=1, iterations=0)
  assert none == 0 and np.allclose(start @ start.T, np.eye(4))  # the random orthogonal start


def test_innovations_are_the_mixture_of_the_sources_innovations():
  rng = np.random.default_rng(1)
  sources, mixing = rng.normal(size=(3, 4 * 5 * 2)), rng.normal(size=(3, 3))
  np.testing.assert_allclose(cocktail.innovations(mixing @ sources, (4, 5, 2)),
                             mixing @ cocktail.innovations(sources, (4, 5, 2)), atol=1e-12)
  assert cocktail.innovations(sources, (4, 5, 2)).shape == (3, 3 * 5 * 2 + 4 * 4 * 2)
  assert cocktail.innovations(sources, (40,)) is sources  # not an image: the signals themselves


def test_an_examples_scale_and_sign_come_from_its_bias_coordinate():
  """An augmented example (x, 1) known up to any non-zero scale, negative included, is x."""
  rng = np.random.default_rng(2)
  x = rng.normal(size=(5, 12))
  scales = np.array([3.0, -0.5, 1e-3, -7.0, 1.0])
  np.testing.assert_allclose(cocktail._inputs(scales[:, None] * np.hstack([x, np.ones((5, 1))])), x,
                             rtol=1e-12)


def _scores(found, truth):
  """PSNR (scikit-image, data range 1) of each true image against the found one matched to it;
  an exact match (infinite PSNR) counts as 1000 dB."""
  with np.errstate(divide="ignore"):
    table = np.array([[skimage.metrics.peak_signal_noise_ratio(t.astype(np.float64),
                                                               np.clip(f, 0, 1).astype(np.float64),
                                                               data_range=1.0)
                       for f in found] for t in truth])
  table = np.minimum(table, 1000.0)
  rows, cols = scipy.optimize.linear_sum_assignment(-table)
  return table[rows, cols], cols


def test_a_centred_batch_that_no_unit_isolates_is_separated(photos, mlp_reference):
  """Batch 16 of the photos, centred on their mean (as normalisation centres inputs), through a
  256-unit ReLU layer: no unit isolates an example, so exclusive neurons recover nothing; the
  Cocktail Party Attack gives every image exactly (to float32 rounding) with its label, where its
  unmixed estimates were only near them."""
  model = models.create("mlp-256", jax.random.key(11), num_classes=10)
  y = np.arange(16) % 10
  mean = photos.mean(axis=(0, 1, 2))
  x = photos - mean
  grad = mlp_reference(model.variables["params"], x, y)[1]
  obs = Observation(gradient=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), grad),
                    variables=model.variables, num_samples=16)
  assert analytic.exclusive_neurons(obs, model.apply_fn, x.shape[1:]).inputs.shape[0] == 0
  unmixed = cocktail.separate(obs, model.apply_fn, x.shape[1:], rounds=0, restarts=1)
  found = cocktail.separate(obs, model.apply_fn, x.shape[1:], bounds=(-mean, 1 - mean))
  assert found.rank == 16 and found.inputs.shape == (16, 32, 32, 3)
  psnr, which = _scores(found.inputs + mean, photos)
  assert psnr.min() >= 100, psnr  # measured: 154.8, the photos to float32 rounding
  np.testing.assert_array_equal(found.labels[which], y)
  assert found.residual < 1e-6 < unmixed.residual and found.rounds >= 1
  assert np.median(_scores(unmixed.inputs + mean, photos)[0]) < np.median(psnr)


def test_the_command_line_attack_separates_a_normalised_batch():
  """``--attack=cocktail_party`` through the pipeline: a batch of 8 photos normalised with
  CIFAR-10's constants on mlp-512 comes back exactly, labels and verdict included."""
  cfg = config.from_options({"attack.preset": "cocktail_party", "model.name": "mlp-512",
                             "data.batch_size": 8, "data.normalization": "cifar10",
                             "output.lpips": "none"})
  results, images = pipeline.run(cfg)
  assert results["cocktail"]["separated"] == 8 and results["cocktail"]["rank"] == 8
  psnr = [skimage.metrics.peak_signal_noise_ratio(t.astype(np.float64), r.astype(np.float64),
                                                  data_range=1.0)
          for t, r in zip(images["ground_truth"], images["reconstruction"])]
  assert min(psnr) >= 100, psnr  # measured: 158.9, exact to float32 rounding
  assert results["label_accuracy"] == 1.0 and results["verdict"]["status"] == "leak"
  assert results["loss"] == results["cocktail"]["residual"] < 1e-5  # float32 rounding
  assert results["cocktail"]["scale"] == pytest.approx(1.0, abs=1e-5)  # a FedSGD gradient


def test_an_update_of_unknown_learning_rate_is_separated_as_its_gradient(photos, mlp_reference):
  """A one-step FedAvg update w' − w = −η G of a learning rate the server does not know gives the
  examples the gradient G gives, the same residual, and −η as the update's scale (NumPy's float64
  gradient as the reference)."""
  model = models.create("mlp-512", jax.random.key(12), num_classes=10)
  x, y = photos[:6], np.arange(6)
  grad = mlp_reference(model.variables["params"], x, y)[1]
  obs = Observation(gradient=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), grad),
                    variables=model.variables, num_samples=6)
  update = obs.replace(gradient=jax.tree.map(lambda a: -0.05 * a, obs.gradient))
  ref = cocktail.separate(obs, model.apply_fn, x.shape[1:], bounds=(0.0, 1.0))
  found = cocktail.separate(update, model.apply_fn, x.shape[1:], bounds=(0.0, 1.0))
  assert ref.residual < 1e-5 and found.residual == pytest.approx(ref.residual, rel=1e-3, abs=1e-6)
  assert ref.scale == pytest.approx(1.0, abs=1e-5) and found.scale == pytest.approx(-0.05, rel=1e-5)
  np.testing.assert_allclose(found.inputs, ref.inputs, atol=1e-4)
  psnr, which = _scores(found.inputs, x)
  assert psnr.min() >= 60, psnr
  np.testing.assert_array_equal(found.labels[which], y)


def test_units_no_example_reaches_are_left_out_of_the_least_squares(photos, mlp_reference):
  """Three quarters of a 512-unit ReLU layer switched off for every input (bias −100): their
  columns of the update are 0 and explained by any estimate, so a share of the units taken from all
  of them would be those dead columns alone and the refinement would do nothing; taken from the
  live units, it still returns each of 6 photos exactly (scikit-image PSNR, NumPy's float64
  gradient)."""
  model = models.create("mlp-512", jax.random.key(12), num_classes=10)
  params = jax.tree.map(np.asarray, model.variables["params"])
  params["Dense_0"]["bias"] = np.where(np.arange(512) < 384, -100.0, params["Dense_0"]["bias"]
                                       ).astype(np.float32)
  variables = {**model.variables, "params": params}
  x, y = photos[:6], np.arange(6)
  grad = mlp_reference(params, x, y)[1]
  assert not np.any(grad["Dense_0"]["kernel"][:, :384])  # dead: no example reaches them
  obs = Observation(gradient=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), grad),
                    variables=variables, num_samples=6)
  found = cocktail.separate(obs, model.apply_fn, x.shape[1:], bounds=(0.0, 1.0))
  psnr, which = _scores(found.inputs, x)
  assert psnr.min() >= 100 and found.residual < 1e-6, (psnr, found.residual)
  np.testing.assert_array_equal(found.labels[which], y)


def test_restarts_keep_the_start_whose_refinement_explains_the_update(mlp_reference):
  """24 faces of scikit-image's LFW subset, centred, through a 128-unit ReLU layer: from FastICA's
  starts 0-2 the refinement ends half the update unexplained; from start 3 it reaches the batch.
  Four restarts return start 3's examples, every face exact (scikit-image PSNR) with its label,
  without the truth; starting at 3, the first restart converges and no other runs."""
  faces = data.load("lfw_subset", indices=range(24)).x
  mean = faces.mean(axis=(0, 1, 2))
  x, y = faces - mean, np.arange(24) % 10
  model = models.create("mlp-128", jax.random.key(1), input_shape=x.shape[1:], num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True)
  kw = {"bounds": (-mean, 1 - mean)}
  alone = cocktail.separate(obs, model.apply_fn, x.shape[1:], restarts=1, **kw)
  found = cocktail.separate(obs, model.apply_fn, x.shape[1:], restarts=4, **kw)
  assert alone.residual > 0.1 and alone.restarts == 1, alone.residual  # measured: 0.56
  # That residual and the mismatches, in NumPy (float64): the layer's update G = [∂W; ∂b] against
  # the best multiple of the gradient the returned examples make with their labels, and each
  # example's δ (its own bias gradient) off the top-rank row space of G.
  params = model.variables["params"]
  layer = lambda tree: np.vstack([np.asarray(tree["Dense_0"]["kernel"], np.float64),
                                  np.asarray(tree["Dense_0"]["bias"], np.float64)[None]])
  g, made = layer(obs.gradient), layer(mlp_reference(params, alone.inputs, alone.labels)[1])
  alpha = np.vdot(g, made) / np.vdot(made, made)
  assert alone.residual == pytest.approx(np.linalg.norm(g - alpha * made) / np.linalg.norm(g), rel=1e-4)
  rows = np.linalg.svd(g, full_matrices=False)[2][:alone.rank].T
  for xn, kn, m in zip(alone.inputs, alone.labels, alone.mismatch, strict=True):
    delta = mlp_reference(params, xn[None], [kn])[1]["Dense_0"]["bias"]
    assert m == pytest.approx(np.linalg.norm(delta - rows @ (rows.T @ delta)) / np.linalg.norm(delta),
                              rel=1e-3, abs=1e-6)
  assert (found.seed, found.restarts) == (3, 4) and found.residual < 1e-6, found.residual
  psnr, which = _scores(found.inputs + mean, faces)
  assert psnr.min() >= 100, psnr
  np.testing.assert_array_equal(found.labels[which], y)
  first = cocktail.separate(obs, model.apply_fn, x.shape[1:], seed=3, restarts=4, **kw)
  assert (first.seed, first.restarts) == (3, 1) and first.residual == found.residual


def test_cocktail_party_refuses_what_it_cannot_separate(photos):
  model = models.create("mlp-8", jax.random.key(14), num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:12], np.arange(12) % 10)
  with pytest.raises(ValueError, match="not fewer examples than layer 'Dense_0' has units"):
    cocktail.separate(obs, model.apply_fn, photos.shape[1:])
  eight = clients.fedsgd(model.apply_fn, model.variables, photos[:8], np.arange(8))
  with pytest.raises(ValueError, match="a batch of 8 is not fewer"):  # the row space is all of R^8
    cocktail.separate(eight, model.apply_fn, photos.shape[1:])
  with pytest.raises(ValueError, match="is it the first layer"):
    cocktail.separate(obs, model.apply_fn, (16, 16, 3))
  with pytest.raises(ValueError, match="no layer 'Dense_9'.*first layer is a biased dense layer"):
    cocktail.separate(obs, model.apply_fn, photos.shape[1:], layer="Dense_9")
  with pytest.raises(ValueError, match="training mode"):  # BatchNorm's statistics couple examples
    cocktail.separate(obs.replace(train=True, variables={**obs.variables, "batch_stats": {}}),
                      model.apply_fn, photos.shape[1:])
  four = clients.fedsgd(model.apply_fn, model.variables, photos[:4], np.arange(4))
  broken = four.replace(gradient=jax.tree.map(lambda a: a.at[(0,) * a.ndim].set(jnp.nan),
                                              four.gradient))
  with pytest.raises(ValueError, match="NaN or infinite"):
    cocktail.separate(broken, model.apply_fn, photos.shape[1:])
  for bad in ({"keep": 0.0}, {"keep": 1.5}, {"step": 0.0}, {"tol": -1.0}, {"restarts": 0}, {"rounds": -1}):
    with pytest.raises(ValueError, match="keep is a share|the refinement needs|restarts is the number"):
      cocktail.separate(obs, model.apply_fn, photos.shape[1:], **bad)
