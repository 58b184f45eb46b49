"""Tests for gradjax.labels: iDLG label inference on fresh random DLG LeNets and real photos.

The reference is the client's true label (Zhao et al. report 100 % for iDLG on LeNet).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, labels, models


@pytest.mark.parametrize("num_classes,runs", [(10, 30), (100, 10)])
def test_idlg_recovers_label_on_fresh_lenets(photos, num_classes, runs):
  rng = np.random.default_rng(num_classes)
  keys = jax.random.split(jax.random.key(num_classes), runs)
  # Arbitrary labels (photos have no classes): every class 3 times for 10 classes, 10 distinct of 100.
  ys = rng.permutation(np.repeat(np.arange(10), 3)) if num_classes == 10 else rng.choice(100, runs, False)
  true, found = [], []
  for i in range(runs):
    model = models.create("lenet_zhu", keys[i], num_classes=num_classes)  # U(-0.5, 0.5), DLG's init
    image = photos[i % len(photos)][None]
    y = int(ys[i])
    obs = clients.fedsgd(model.apply_fn, model.variables, image, np.array([y]))
    label = labels.idlg(obs)
    assert label.shape == (1,) and jnp.issubdtype(label.dtype, jnp.integer)
    true.append(y)
    found.append(int(label[0]))
  assert found == true


def test_idlg_reads_last_layer_sign(photos):
  """With an observed head gradient built by hand, iDLG returns the one column with a negative sum."""
  model = models.create("lenet_zhu", jax.random.key(11))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([4]))
  g = jax.tree.map(np.array, obs.gradient)
  a = np.abs(np.random.default_rng(0).normal(size=768))       # non-negative features
  p = np.full(10, 0.1)
  t = np.eye(10)[6]
  g["head"]["kernel"] = np.outer(a, p - t).astype(np.float32)  # dL/dW[j, c] = a_j (p_c - y_c)
  assert int(labels.idlg(dataclasses.replace(obs, gradient=g))[0]) == 6
  np.testing.assert_array_equal(labels.last_layer_gradient(g), g["head"]["kernel"])


@pytest.fixture(scope="module")
def single(photos):
  model = models.create("lenet_zhu", jax.random.key(12))
  return model, clients.fedsgd(model.apply_fn, model.variables, photos[7:8], np.array([5]))


def test_idlg_custom_path(single):
  _, obs = single
  g = dict(obs.gradient)
  g["classifier"] = g.pop("head")
  renamed = dataclasses.replace(obs, gradient=g)
  assert int(labels.idlg(renamed, path=("classifier", "kernel"))[0]) == 5
  with pytest.raises(ValueError):
    labels.idlg(renamed)  # No 'head' any more.


def test_idlg_rejects_batches(single, photos):
  model, _ = single
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))
  with pytest.raises(ValueError):
    labels.idlg(obs)


@pytest.mark.parametrize("path", [("head", "bias"), ("head", "weight"), ("Conv_0", "kernel"), ("head",)])
def test_idlg_rejects_bad_path(single, path):
  _, obs = single
  with pytest.raises(ValueError):
    labels.idlg(obs, path=path)
