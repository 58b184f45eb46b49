"""Candidate label orders for the permutation search, and the search inside ``reconstruct``."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import attacks, clients, driver, labels, models, objectives, permutations


def blocks(seq, b):
  """Hand-written equivalence key: the multiset of labels of each consecutive block, in order."""
  return tuple(tuple(sorted(int(v) for v in seq[i:i + b])) for i in range(0, len(seq), b))


@pytest.mark.parametrize("labels, b, expected", [
    ([3, 1, 4, 0], 2, 6),       # 4! / (2! 2!)
    ([0, 0, 1, 1], 2, 3),       # {00|11}, {11|00}, {01|01}
    ([2, 5, 7, 1, 0, 9], 2, 90),  # 6! / 2!^3
    ([2, 5, 7, 1, 0, 9], 3, 20),  # 6! / 3!^2
    ([1, 2, 3, 4], None, 1),    # one batch: nothing to search
    ([1, 2, 3, 4], 1, 24),
])
def test_candidates_enumerate_every_distinct_assignment(labels, b, expected):
  labels = np.asarray(labels)
  got = permutations.candidates(labels, b, count=1000)
  assert got.shape == (expected, len(labels)) and got.dtype == np.int32
  np.testing.assert_array_equal(got[0], np.arange(len(labels)))
  keys = {blocks(labels[p], b or len(labels)) for p in got}
  assert len(keys) == expected
  for p in got:
    assert sorted(p) == list(range(len(labels)))


def test_candidates_sample_distinct_orders_reproducibly():
  labels = np.arange(10)
  a = permutations.candidates(labels, 2, count=16, seed=3)
  assert a.shape == (16, 10)
  assert len({blocks(labels[p], 2) for p in a}) == 16
  np.testing.assert_array_equal(a, permutations.candidates(labels, 2, count=16, seed=3))
  few = permutations.candidates(np.array([3, 1, 4, 0]), 2, count=2, seed=0)
  assert few.shape == (2, 4) and tuple(few[0]) == (0, 1, 2, 3)


@pytest.mark.parametrize("labels, b, count", [([1, 2, 3], 2, 4), ([1, 2], 2, 0), ([[1, 2]], 1, 2)])
def test_candidates_reject_bad_input(labels, b, count):
  with pytest.raises(ValueError):
    permutations.candidates(np.asarray(labels), b, count)


@pytest.mark.slow
def test_search_recovers_the_mini_batch_assignment():
  """4 images in 2 local mini-batches, labels revealed only as a sorted multiset: the search over the
  6 assignments must pick one equivalent to the client's, with a lower objective than the given
  (wrong) order."""
  with jax.enable_x64(True):
    model = models.create("mlp-16", jax.random.key(0), input_shape=(5, 5, 1), num_classes=4,
                          act="sigmoid", param_dtype=jnp.float64)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(4, 5, 5, 1))
    y = np.array([2, 0, 3, 1])           # mini-batches {0, 2} then {1, 3}; sorted order is wrong
    local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.5)
    obs = clients.fedavg(model.apply_fn, model.variables, x, y, local, share_labels="multiset")
    np.testing.assert_array_equal(obs.labels, [0, 1, 2, 3])
    attack = attacks.Attack(matched=objectives.Replay(), label_source=labels.known, iterations=300)
    kw = dict(input_shape=(5, 5, 1), execution=driver.Execution("vmap"))
    plain = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(1), **kw)
    search = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(1), permutations=6,
                                 **kw)
  assert search.candidates.shape == (6, 4) and len(search.restart_losses) == 6
  assert blocks(search.labels, 2) == blocks(y, 2)
  assert search.loss < 1e-12 < 1e-3 * plain.loss
  np.testing.assert_allclose(search.restart_losses[0], plain.loss, rtol=1e-6)


def test_search_refuses_a_client_whose_label_order_changes_nothing():
  model = models.create("mlp-16", jax.random.key(0), input_shape=(5, 5, 1), num_classes=4)
  x = np.random.default_rng(0).uniform(size=(4, 5, 5, 1))
  y = np.array([2, 0, 3, 1])
  one_batch = clients.fedavg(model.apply_fn, model.variables, x, y, clients.LocalTraining(),
                             share_labels="multiset")
  sgd = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True)
  for attack, obs in [(attacks.Attack(matched=objectives.Replay(), label_source=labels.known), one_batch),
                      (attacks.Attack(label_source=labels.known), sgd)]:
    with pytest.raises(ValueError, match="more than one local mini-batch"):
      attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(0), input_shape=(5, 5, 1),
                          permutations=3)
