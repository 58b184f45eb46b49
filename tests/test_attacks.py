"""DLG and iDLG end to end on real images, and the attack's input checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.metrics

from gradjax import attacks, clients, data, models


def setup(index, image_size=16, channels=3, model="lenet_zhu", seed=0):
  batch = data.load("skimage", indices=[index], image_size=(image_size, image_size), channels=channels)
  net = models.create(model, jax.random.key(seed + index), input_shape=batch.x.shape[1:])
  obs = clients.fedsgd(net.apply_fn, net.variables, batch.x, batch.y)
  return batch, net, obs


@pytest.mark.parametrize("name", ["dlg", "idlg"])
def test_reconstructs_real_photos(name):
  attack = attacks.get_attack(name, iterations=500)
  for index in (0, 3, 7):
    batch, net, obs = setup(index)
    rec = attacks.reconstruct(attack, net.apply_fn, obs, jax.random.key(100 + index),
                              input_shape=batch.x.shape[1:])
    x = np.clip(rec.x, 0, 1).astype(np.float64)
    psnr = skimage.metrics.peak_signal_noise_ratio(batch.x[0].astype(np.float64), x[0], data_range=1)
    assert psnr > 30, (name, index, psnr)
    np.testing.assert_array_equal(rec.labels, batch.y)
    assert rec.loss < 1e-3


def test_restarts_pick_the_lowest_objective():
  batch, net, obs = setup(1)
  rec = attacks.reconstruct(attacks.get_attack("dlg", iterations=30), net.apply_fn, obs,
                            jax.random.key(0), input_shape=batch.x.shape[1:], restarts=3,
                            strategy="vmap")
  assert rec.restart_losses.shape == (3,) and rec.x_restarts.shape == (3, 1, 16, 16, 3)
  assert rec.best_restart == int(np.argmin(rec.restart_losses))
  np.testing.assert_array_equal(rec.x, rec.x_restarts[rec.best_restart])
  assert len(set(np.round(rec.restart_losses, 8))) == 3  # independent initialisations
  assert np.all(rec.iterations == 30)


def test_known_labels_and_errors():
  batch, net, obs = setup(2)
  with pytest.raises(ValueError, match="carries none"):
    attacks.reconstruct(attacks.get_attack("dlg", labels="known"), net.apply_fn, obs,
                        jax.random.key(0), input_shape=(16, 16, 3))
  two = data.load("skimage", indices=[0, 1], image_size=(16, 16))
  obs2 = clients.fedsgd(net.apply_fn, net.variables, two.x, two.y)
  with pytest.raises(ValueError, match="batch 1"):
    attacks.reconstruct(attacks.get_attack("idlg"), net.apply_fn, obs2, jax.random.key(0),
                        input_shape=(16, 16, 3))
  bad = obs.replace(gradient=jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), obs.gradient))
  with pytest.raises(ValueError, match="NaN"):
    attacks.reconstruct(attacks.get_attack("dlg"), net.apply_fn, bad, jax.random.key(0),
                        input_shape=(16, 16, 3))
  other = models.create("mlp", jax.random.key(0), input_shape=(16, 16, 3))
  mixed = obs.replace(variables=other.variables)
  with pytest.raises(ValueError, match="does not match"):
    attacks.reconstruct(attacks.get_attack("dlg"), net.apply_fn, mixed, jax.random.key(0),
                        input_shape=(16, 16, 3))
  with pytest.raises(ValueError, match="unknown attack"):
    attacks.get_attack("deepleak")
  with pytest.raises(ValueError, match="unknown distance"):
    attacks.get_attack("dlg", distance="manhattan")
