"""Tests for gradjax.losses, gradjax.clients.fedsgd and gradjax.observation.

References: a NumPy log-softmax and a hand-derived NumPy backprop of the DLM MLP (conftest), float64
central finite differences for a BatchNorm model in train mode.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, losses, models
from gradjax.observation import Observation, check_observation

# --- losses.cross_entropy ---------------------------------------------------------------------------


def test_cross_entropy_int_labels_matches_numpy(log_softmax_reference):
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    z = rng.normal(0, 3, (7, 10))
    y = rng.integers(0, 10, 7)
    got = float(losses.cross_entropy(jnp.asarray(z), jnp.asarray(y)))
  want = -np.mean(log_softmax_reference(z)[np.arange(7), y])
  np.testing.assert_allclose(got, want, rtol=1e-14)


def test_cross_entropy_soft_labels_matches_numpy(log_softmax_reference):
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    z = rng.normal(0, 2, (5, 100))
    t = rng.dirichlet(np.ones(100), 5)
    got = float(losses.cross_entropy(jnp.asarray(z), jnp.asarray(t)))
  want = -np.mean(np.sum(t * log_softmax_reference(z), axis=-1))
  np.testing.assert_allclose(got, want, rtol=1e-14)


def test_cross_entropy_leaves_out_negative_labels_as_pytorch_ignore_index(log_softmax_reference):
  """(N, T, K) logits with -1 at the unmasked positions: the mean over the kept positions only
  (NumPy), and 0 with its zero gradient when none is kept."""
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    z = rng.normal(0, 2, (3, 5, 7))
    y = rng.integers(0, 7, (3, 5))
    y[rng.random((3, 5)) < 0.6] = -1
    y[0, 0] = 4  # at least one kept
    got = float(losses.cross_entropy(jnp.asarray(z), jnp.asarray(y)))
    kept = y >= 0
    want = -np.mean(log_softmax_reference(z[kept])[np.arange(kept.sum()), y[kept]])
    np.testing.assert_allclose(got, want, rtol=1e-14)
    none = jnp.full((3, 5), -1)
    assert float(losses.cross_entropy(jnp.asarray(z), none)) == 0.0
    assert not np.any(np.asarray(jax.grad(losses.cross_entropy)(jnp.asarray(z), none)))


def test_cross_entropy_int_equals_one_hot():
  rng = np.random.default_rng(2)
  z = jnp.asarray(rng.normal(0, 2, (6, 10)), jnp.float32)
  y = rng.integers(0, 10, 6)
  one_hot = np.eye(10, dtype=np.float32)[y]
  a = float(losses.cross_entropy(z, jnp.asarray(y)))
  b = float(losses.cross_entropy(z, jnp.asarray(one_hot)))
  assert a > 0
  np.testing.assert_allclose(a, b, rtol=1e-6)
  # The same holds for the gradient w.r.t. the logits, (softmax - onehot) / N.
  ga = jax.grad(losses.cross_entropy)(z, jnp.asarray(y))
  gb = jax.grad(losses.cross_entropy)(z, jnp.asarray(one_hot))
  p = np.exp(np.asarray(z, np.float64))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(ga, (p - one_hot) / 6, atol=1e-7)
  np.testing.assert_allclose(gb, ga, atol=1e-7)


def test_cross_entropy_large_logits_stable(log_softmax_reference):
  z = np.array([[1000.0, -1000.0, 0.0], [-500.0, 500.0, 499.0]], np.float32)
  y = np.array([0, 2])
  got = float(losses.cross_entropy(jnp.asarray(z), jnp.asarray(y)))
  want = -np.mean(log_softmax_reference(z)[np.arange(2), y])
  assert np.isfinite(got)
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --- clients.fedsgd: the observed gradient against a hand-derived NumPy backprop -------------------------


@pytest.fixture(scope="module")
def mlp64(fill_variables):
  """DLM-style MLP with 8 hidden units and 10 classes, float64 parameters, U(-0.05, 0.05)."""
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=3, dtype=np.float64, scale=0.05)
  return models.make_apply_fn(module), variables


@pytest.mark.parametrize("labels", [[3], [0, 7, 7, 9]])
def test_fedsgd_mlp_matches_numpy_backprop(mlp64, photos, mlp_reference, labels):
  apply_fn, variables = mlp64
  n = len(labels)
  x = photos[4:4 + n].astype(np.float64)
  y = np.asarray(labels)
  with jax.enable_x64(True):
    obs = clients.fedsgd(apply_fn, variables, jnp.asarray(x), jnp.asarray(y))
    got = jax.tree.map(np.asarray, obs.gradient)
  _, want = mlp_reference(variables["params"], x, y)
  assert jax.tree.map(np.shape, got) == jax.tree.map(np.shape, variables["params"])
  assert all(g.dtype == np.float64 for g in jax.tree.leaves(got))
  hidden_active = np.mean(want["Dense_0"]["bias"] != 0)
  assert hidden_active > 0.25  # The ReLU passes part of the signal: the check is not trivial.
  for layer in ("Dense_0", "head"):
    for leaf in ("kernel", "bias"):
      np.testing.assert_allclose(got[layer][leaf], want[layer][leaf], rtol=1e-10,
                                 atol=1e-13 * np.abs(want[layer][leaf]).max())
  assert obs.num_samples == n and obs.threat_model == "fedsgd" and obs.train is False
  assert obs.labels is None


def test_fedsgd_share_labels(mlp64, photos):
  apply_fn, variables = mlp64
  y = np.array([1, 5])
  with jax.enable_x64(True):
    hidden = clients.fedsgd(apply_fn, variables, photos[:2], y)
    shared = clients.fedsgd(apply_fn, variables, photos[:2], y, share_labels=True)
  assert hidden.labels is None
  np.testing.assert_array_equal(np.asarray(shared.labels), y)
  assert jnp.issubdtype(shared.labels.dtype, jnp.integer)
  jax.tree.map(np.testing.assert_array_equal, shared.gradient, hidden.gradient)
  assert shared.variables is variables
  check_observation(shared)
  check_observation(hidden)
  # As fedavg's: "ordered" is True, "multiset" sorts, anything else is refused.
  y = np.array([5, 1])
  ordered = clients.fedsgd(apply_fn, variables, photos[:2], y, share_labels="ordered")
  multiset = clients.fedsgd(apply_fn, variables, photos[:2], y, share_labels="multiset")
  assert np.asarray(ordered.labels).tolist() == [5, 1] and np.asarray(multiset.labels).tolist() == [1, 5]
  for bad in ("no", "sorted"):
    with pytest.raises(ValueError, match="share_labels must be one of"):
      clients.fedsgd(apply_fn, variables, photos[:2], y, share_labels=bad)


@pytest.mark.slow
def test_fedsgd_train_mode_batchnorm_matches_finite_differences(photos, fill_variables):
  """Train-mode FedSGD on a BatchNorm ResNet: <g, d> equals the float64 central difference of the
  train-mode mean loss along random parameter directions d.

  A sigmoid ResNet-8 is smooth (no ReLU or max-pool kinks), so the difference converges as h^2.
  """
  with jax.enable_x64(True):
    module = models.get_module("resnet8", num_classes=10, act="sigmoid", param_dtype=jnp.float64)
    variables = fill_variables(module, (8, 8, 3), seed=4, dtype=np.float64, scale=0.3)
    apply_fn = models.make_apply_fn(module)
    x = jnp.asarray(photos[:3, 10:18, 10:18], jnp.float64)
    y = jnp.asarray([2, 4, 9])
    obs = clients.fedsgd(apply_fn, variables, x, y, train=True)
    assert obs.train is True

    def loss(params, train):
      return losses.cross_entropy(apply_fn({**variables, "params": params}, x, train), y)

    loss = jax.jit(loss, static_argnums=1)
    # Train mode normalises with the batch statistics, eval mode with the stored running ones.
    assert abs(float(loss(variables["params"], True)) - float(loss(variables["params"], False))) > 1e-3
    rng = np.random.default_rng(5)
    h = 1e-6
    for _ in range(4):  # the moves in NumPy (in JAX each operation would compile alone)
      d = jax.tree.map(lambda p: rng.standard_normal(p.shape), variables["params"])
      plus = jax.tree.map(lambda p, v: np.asarray(p) + h * v, variables["params"], d)
      minus = jax.tree.map(lambda p, v: np.asarray(p) - h * v, variables["params"], d)
      fd = (float(loss(plus, True)) - float(loss(minus, True))) / (2 * h)
      got = sum(float(np.vdot(np.asarray(g, np.float64), v))
                for g, v in zip(jax.tree.leaves(obs.gradient), jax.tree.leaves(d)))
      np.testing.assert_allclose(got, fd, rtol=1e-6)


@pytest.fixture(scope="module")
def lenet():
  return models.create("lenet_zhu", jax.random.key(0))


@pytest.mark.parametrize("case", ["3d_x", "float_labels", "label_shape", "label_too_big", "label_negative",
                                  "nan_x", "inf_x", "label_count"])
def test_fedsgd_rejects_bad_inputs(lenet, photos, case):
  x = np.array(photos[:2])
  y = np.array([1, 2])
  if case == "3d_x":
    x = x[0]
    y = y[:1]
  elif case == "float_labels":
    y = y.astype(np.float32)
  elif case == "label_shape":
    y = y[:, None]
  elif case == "label_too_big":
    y = np.array([1, 10])
  elif case == "label_negative":
    y = np.array([-1, 2])
  elif case == "nan_x":
    x[1, 3, 4, 0] = np.nan
  elif case == "inf_x":
    x[0, 0, 0, 2] = np.inf
  elif case == "label_count":
    y = np.array([1, 2, 3])
  with pytest.raises(ValueError):
    clients.fedsgd(lenet.apply_fn, lenet.variables, x, y)


def test_fedavg_and_aggregate_refuse_what_would_be_a_wrong_update(lenet, photos):
  """A learning rate that is not a finite positive number, epochs or a batch size that are not
  integers, and updates computed at different server variables (their mean is no round's)."""
  x, y = photos[:2], np.array([1, 2])
  for local in (clients.LocalTraining(learning_rate=float("nan")), clients.LocalTraining(learning_rate=float("inf")),
                clients.LocalTraining(epochs=1.5), clients.LocalTraining(batch_size=1.0)):
    with pytest.raises(ValueError, match="must be"):
      clients.fedavg(lenet.apply_fn, lenet.variables, x, y, local)
  with pytest.raises(ValueError, match="has no BatchNorm statistics to return"):  # was a KeyError
    clients.fedsgd(lenet.apply_fn, lenet.variables, x, y, train=True, share_statistics=True)
  with pytest.raises(ValueError, match="is a clients.LocalTraining, got tuple"):
    clients.fedavg(lenet.apply_fn, lenet.variables, x, y, (1, None, 0.1, 0.0))
  one = clients.fedsgd(lenet.apply_fn, lenet.variables, x, y)
  moved = jax.tree.map(lambda v: v + 1.0, lenet.variables)
  with pytest.raises(ValueError, match="different server variables"):
    clients.aggregate([one, clients.fedsgd(lenet.apply_fn, moved, x, y)])
  copied = jax.tree.map(np.array, lenet.variables)  # the same values in other arrays: one round
  assert clients.aggregate([one, clients.fedsgd(lenet.apply_fn, copied, x, y)]).num_samples == 4


def test_fedsgd_accepts_last_class(lenet, photos):
  obs = clients.fedsgd(lenet.apply_fn, lenet.variables, photos[:1], np.array([9]))
  head = np.asarray(obs.gradient["head"]["kernel"])
  # Single example: dL/dW[:, c] = a (p_c - y_c), so only the true class column has the other sign.
  signs = np.sign(head.sum(axis=0))
  assert signs[9] == -1 and np.all(signs[:9] == 1)


def test_a_clients_own_loss_reads_its_own_targets(photos):
  """A one-output model under a binary cross entropy of its own: targets 0/1 of the batch are
  taken (its gradient is NumPy's: (σ(z) − t) x / N for a linear model); under gradjax's cross
  entropy the same model is refused (one output's softmax is constant), as targets of another
  batch size are under any loss."""
  import flax.linen as nn
  import optax

  class Logit(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      return nn.Dense(1, name="head")(x.reshape(x.shape[0], -1))

  module = Logit()
  x = photos[:2, :4, :4, 0]
  variables = module.init(jax.random.key(0), x[:1])
  apply_fn = lambda v, x, train=False: module.apply(v, x)
  bce = lambda z, t: jnp.mean(optax.sigmoid_binary_cross_entropy(z[:, 0], t.astype(z.dtype)))
  t = np.array([0, 1])
  obs = clients.fedsgd(apply_fn, variables, x, t, loss_fn=bce)
  w, b = np.asarray(variables["params"]["head"]["kernel"], np.float64), float(
      variables["params"]["head"]["bias"][0])
  flat = np.asarray(x, np.float64).reshape(2, -1)
  r = 1 / (1 + np.exp(-(flat @ w[:, 0] + b))) - t
  np.testing.assert_allclose(obs.gradient["head"]["kernel"][:, 0], flat.T @ r / 2, rtol=1e-4,
                             atol=1e-7)
  with pytest.raises(ValueError, match="K >= 2 classes"):
    clients.fedsgd(apply_fn, variables, x, t)
  with pytest.raises(ValueError, match="the batch's 2 examples first"):
    clients.fedsgd(apply_fn, variables, x, np.array([0, 1, 1]), loss_fn=bce)


# --- observation.check_observation -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def observation(lenet, photos):
  return clients.fedsgd(lenet.apply_fn, lenet.variables, photos[:2], np.array([0, 3]), share_labels=True)


def _with_gradient(obs, fn):
  gradient = jax.tree.map(np.array, obs.gradient)  # mutable copy
  fn(gradient)
  return dataclasses.replace(obs, gradient=gradient)


def test_check_observation_accepts_valid(observation):
  assert check_observation(observation) is None
  # Observation is a pytree: it survives jit with its static fields.
  out = jax.jit(lambda o: o)(observation)
  assert isinstance(out, Observation) and out.num_samples == 2 and out.threat_model == "fedsgd"
  check_observation(out)


def _drop_head(g):
  del g["head"]


def _extra_layer(g):
  g["extra"] = {"kernel": np.zeros((2, 2), np.float32)}


def _drop_bias(g):
  del g["Conv_1"]["bias"]


def _transpose_head(g):
  g["head"]["kernel"] = g["head"]["kernel"].T.copy()


def _wrong_bias_shape(g):
  g["Conv_0"]["bias"] = np.zeros((13,), np.float32)


def _nan(g):
  g["Conv_2"]["kernel"][0, 0, 0, 0] = np.nan


def _inf(g):
  g["head"]["bias"][3] = -np.inf


@pytest.mark.parametrize("mutate", [_drop_head, _extra_layer, _drop_bias, _transpose_head,
                                    _wrong_bias_shape, _nan, _inf])
def test_check_observation_rejects_bad_gradient(observation, mutate):
  with pytest.raises(ValueError):
    check_observation(_with_gradient(observation, mutate))


@pytest.mark.parametrize("change", [
    dict(labels=np.array([0.0, 3.0])),
    dict(labels=np.array([0, 3, 1])),
    dict(num_samples=0),
    dict(variables={"weights": None}),
])
def test_check_observation_rejects_bad_metadata(observation, change):
  with pytest.raises(ValueError):
    check_observation(dataclasses.replace(observation, **change))


# --- DP-SGD ------------------------------------------------------------------------------------------


def test_dp_sgd_clips_each_examples_gradient_as_numpy_backprop_says(mlp64, photos, mlp_reference):
  """DP-SGD's update without noise: each example's gradient from the NumPy backprop, scaled by
  min(1, C/‖g_n‖) over all parameters, then averaged; a bound above every norm leaves the FedSGD
  gradient, one below them all averages unit-norm directions times C."""
  apply_fn, variables = mlp64
  x, y = photos[2:6].astype(np.float64), np.array([1, 4, 4, 9])
  per = [mlp_reference(variables["params"], x[n:n + 1], y[n:n + 1])[1] for n in range(4)]
  norms = np.array([np.sqrt(sum(np.sum(a ** 2) for a in jax.tree.leaves(g))) for g in per])
  assert norms.max() / norms.min() > 1.5  # the clip treats the examples differently
  for bound in (np.median(norms), 10 * norms.max(), 0.1 * norms.min()):
    want = jax.tree.map(lambda *gs: np.mean([g * min(1.0, bound / n) for g, n in zip(gs, norms)], 0), *per)
    with jax.enable_x64(True):
      obs = clients.fedsgd(apply_fn, variables, jnp.asarray(x), jnp.asarray(y),
                           dp_sgd=clients.DPSGD(bound))
    for got, ref in zip(jax.tree.leaves(obs.gradient), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=1e-13 * np.abs(ref).max())
  assert obs.threat_model == "fedsgd" and obs.num_samples == 4


def test_dp_sgd_per_example_gradients_are_those_of_the_batch_mean():
  """Examples that keep different numbers of target rows (a masked token model's 1, 2 and 4
  masks): DP-SGD's per-example gradient is, as Opacus defines it, N times the gradient of the
  batch's mean loss with respect to a copy of the parameters that only that example reads; clipped
  and averaged, it is clients.clipped_gradient's (float64)."""
  from gradjax import losses
  vocab, dim = 9, 5
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    params = {"embed": jnp.asarray(rng.normal(size=(vocab, dim))),
              "kernel": jnp.asarray(rng.normal(size=(dim, vocab)))}
    x = jnp.asarray(rng.integers(0, vocab, (3, 7)))
    t = np.full((3, 7), -1)
    for n, positions in enumerate(([2], [0, 5], [1, 3, 4, 6])):
      t[n, positions] = rng.integers(0, vocab, len(positions))
    t = jnp.asarray(t)

    def apply_fn(variables, xs, train=False):
      return variables["params"]["embed"][xs] @ variables["params"]["kernel"]

    def batch_loss(copies):  # example n's logits from copy n of the parameters
      logits = jnp.stack([apply_fn({"params": jax.tree.map(lambda a: a[n], copies)}, x[n])
                          for n in range(3)])
      return losses.cross_entropy(logits, t)

    copies = jax.tree.map(lambda a: jnp.stack([a] * 3), params)
    per = jax.tree.map(lambda g: 3 * g, jax.grad(batch_loss)(copies))
    norms = np.sqrt(sum(np.sum(np.asarray(g) ** 2, axis=tuple(range(1, g.ndim)))
                        for g in jax.tree.leaves(per)))
    bound = float(np.median(norms))
    want = jax.tree.map(lambda g: np.mean([np.asarray(g[n]) * min(1.0, bound / norms[n])
                                           for n in range(3)], axis=0), per)
    got = clients.clipped_gradient(apply_fn, {"params": params}, x, t, bound)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-14)
  assert min(norms) < bound < max(norms)


def test_dp_sgd_noise_has_standard_deviation_sigma_c_over_n(mlp64, photos):
  """σ > 0: the update minus the noiseless one is zero-mean Gaussian with standard deviation σC/N per
  entry (the sum's N(0, σ²C²) averaged), the same for the same key and another for another."""
  apply_fn, variables = mlp64
  x, y = photos[:8], np.arange(8)
  dp = clients.DPSGD(max_norm=0.5, noise_multiplier=1.3)
  with jax.enable_x64(True):  # the fixture's model is float64
    clean = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=clients.DPSGD(0.5))
    noisy = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=dp, key=jax.random.key(3))
    again = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=dp, key=jax.random.key(3))
    other = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=dp, key=jax.random.key(4))
  flat = lambda o: np.concatenate([np.ravel(a) for a in jax.tree.leaves(o.gradient)]).astype(np.float64)
  noise = flat(noisy) - flat(clean)
  assert noise.size > 20_000
  assert np.std(noise) == pytest.approx(1.3 * 0.5 / 8, rel=0.02)
  assert abs(np.mean(noise)) < 4 * 1.3 * 0.5 / 8 / np.sqrt(noise.size)
  np.testing.assert_array_equal(flat(noisy), flat(again))
  assert not np.allclose(flat(noisy), flat(other))


def test_poisson_draws_join_each_example_at_the_rate():
  """Poisson sampling's draws: each example joins each step independently with probability q (the
  count over 400 steps of 50 examples within four binomial standard deviations of 400·50·q, each
  example's within five of 400q, the steps' sizes' variance that of Binomial(50, q)); the same key
  gives the same draws."""
  q = 0.3
  draws = np.asarray(clients.poisson_draws(jax.random.key(0), 400, 50, q))
  assert draws.shape == (400, 50) and draws.dtype == bool
  total = 400 * 50
  assert abs(draws.sum() - total * q) < 4 * np.sqrt(total * q * (1 - q))
  assert np.all(np.abs(draws.sum(0) - 400 * q) < 5 * np.sqrt(400 * q * (1 - q)))
  assert np.var(draws.sum(1)) == pytest.approx(50 * q * (1 - q), rel=0.25)
  np.testing.assert_array_equal(draws, clients.poisson_draws(jax.random.key(0), 400, 50, q))


def test_a_poisson_sampled_fedsgd_client_divides_the_drawn_sum_by_qn(mlp64, photos, mlp_reference):
  """DP-SGD with Poisson sampling, no noise: the update is the NumPy-backprop gradients of the
  examples drawn (clients.drawn with the client's key), each clipped to C, summed and divided by qN
  (Opacus' expected batch size), not by the count drawn; the labels it shares are the drawn ones."""
  apply_fn, variables = mlp64
  x, y = photos[:8].astype(np.float64), np.arange(8)
  q, key = 0.5, jax.random.key(7)
  dp = clients.DPSGD(0.4, 0.0, q)
  draws = clients.drawn(dp, key, 8)[0]
  assert 0 < draws.sum() < 8 and draws.sum() != 4  # the divisor differs from the count drawn
  norm = lambda g: np.sqrt(sum(np.sum(a ** 2) for a in jax.tree.leaves(g)))
  per = [mlp_reference(variables["params"], x[n:n + 1], y[n:n + 1])[1] for n in range(8)]
  want = jax.tree.map(lambda *gs: sum(g * min(1.0, 0.4 / norm(p)) for g, p, d in zip(gs, per, draws)
                                      if d) / (q * 8), *per)
  with jax.enable_x64(True):
    obs = clients.fedsgd(apply_fn, variables, jnp.asarray(x), jnp.asarray(y), dp_sgd=dp, key=key,
                         share_labels=True)
  for got, ref in zip(jax.tree.leaves(obs.gradient), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=1e-13 * np.abs(ref).max())
  np.testing.assert_array_equal(np.asarray(obs.labels), np.arange(8)[draws])
  assert obs.num_samples == 8
  with pytest.raises(ValueError, match="PRNG key"), jax.enable_x64(True):
    clients.fedsgd(apply_fn, variables, jnp.asarray(x), jnp.asarray(y), dp_sgd=dp)


def test_a_poisson_sampled_clients_noise_has_standard_deviation_sigma_c_over_qn(mlp64, photos):
  """σ > 0 under Poisson sampling at q = 0.25 over N = 8: the noise is σC/(qN) per entry, twice
  what a fixed batch of the 8 would get (the draws and the noise from the key's two halves)."""
  apply_fn, variables = mlp64
  x, y = photos[:8], np.arange(8)
  key = jax.random.key(5)
  with jax.enable_x64(True):
    clean = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=clients.DPSGD(0.5, 0.0, 0.25), key=key)
    noisy = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=clients.DPSGD(0.5, 1.3, 0.25), key=key)
  flat = lambda o: np.concatenate([np.ravel(a) for a in jax.tree.leaves(o.gradient)]).astype(np.float64)
  noise = flat(noisy) - flat(clean)
  assert np.std(noise) == pytest.approx(1.3 * 0.5 / 2, rel=0.02)


def _dp_fedavg_client(mlp64, photos, mlp_reference):
  """A FedAvg DP-SGD client's set-up shared by the NumPy tests below: the model, four photos and
  labels, two epochs of mini-batches of 2 with momentum 0.5, the sent weights in float64, the
  NumPy-backprop gradient of example i at weights w, the L2 norm of a tree, and a bound C (the
  median of the examples' norms: some clipped, some not)."""
  apply_fn, variables = mlp64
  x, y = photos[4:8].astype(np.float64), np.array([0, 3, 3, 8])
  local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.05, momentum=0.5)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  grads = lambda w, i: mlp_reference(w, x[i:i + 1], y[i:i + 1])[1]
  norm = lambda g: np.sqrt(sum(np.sum(a ** 2) for a in jax.tree.leaves(g)))
  bound = float(np.median([norm(grads(params, i)) for i in range(4)]))
  return apply_fn, variables, x, y, local, params, grads, norm, bound


def test_poisson_sampled_local_steps_clip_each_draw_as_numpy_says(mlp64, photos, mlp_reference):
  """A FedAvg client under Poisson sampling (2 epochs of n/B = 2 steps, q = 1/2, momentum): each
  step sums the NumPy-backprop clipped gradients of the examples its draw holds, at the current
  weights, over qn; the draws are clients.drawn's with the client's key, and passing them gives
  the same update. Draws of q everywhere replay the expected steps, the clipped mean over all n."""
  apply_fn, variables, x, y, local, params, grads, norm, bound = _dp_fedavg_client(
      mlp64, photos, mlp_reference)
  dp, key = clients.DPSGD(bound, 0.0, 0.5), jax.random.key(1)
  draws = clients.drawn(dp, key, 4, steps=4)

  def numpy_client(weights, divisor=2.0):
    w, v = params, jax.tree.map(np.zeros_like, params)
    for step in range(4):
      gs = [grads(w, i) for i in range(4)]
      g = jax.tree.map(lambda *a: sum(weights[step, i] * b * min(1.0, bound / norm(gs[i]))
                                      for i, b in enumerate(a)) / divisor, *gs)
      v = jax.tree.map(lambda a, b: 0.5 * a + b, v, g)
      w = jax.tree.map(lambda a, b: a - 0.05 * b, w, v)
    return w

  assert len({tuple(d) for d in draws}) > 1
  with jax.enable_x64(True):
    sampled = clients.fedavg(apply_fn, variables, jnp.asarray(x), jnp.asarray(y), local, dp_sgd=dp,
                             key=key).gradient
    given = jax.tree.map(jnp.subtract, variables["params"], clients.local_sgd(
        apply_fn, variables, jnp.asarray(x), jnp.asarray(y), local, dp_sgd=dp, draws=draws))
    expected = jax.tree.map(jnp.subtract, variables["params"], clients.local_sgd(
        apply_fn, variables, jnp.asarray(x), jnp.asarray(y), local, dp_sgd=dp,
        draws=np.full((4, 4), 0.5)))
    # A client dividing by Opacus' E = 1 rather than qn = 2: its expected steps, q Σ clip / E.
    divided = jax.tree.map(jnp.subtract, variables["params"], clients.local_sgd(
        apply_fn, variables, jnp.asarray(x), jnp.asarray(y), local, dp_sgd=dp,
        draws=clients.expected_draws(local, 4, 0.5, expected_batch_size=1.0)))
  for weights, got, divisor in ((draws.astype(float), sampled, 2.0), (draws.astype(float), given, 2.0),
                                (np.full((4, 4), 0.5), expected, 2.0), (np.full((4, 4), 0.5), divided, 1.0)):
    want = numpy_client(weights, divisor)
    for a, sent, new in zip(jax.tree.leaves(got), jax.tree.leaves(params), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), sent - new, rtol=1e-9,
                                 atol=1e-13 * np.abs(sent - new).max())


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp_sgd=clients.DPSGD(0.0)), "max_norm"),
    (dict(dp_sgd=clients.DPSGD(1.0, -1.0)), "noise_multiplier"),
    (dict(dp_sgd=clients.DPSGD(float("inf"))), "max_norm"),
    (dict(dp_sgd=clients.DPSGD(1.0, 1.0)), "PRNG key"),
    (dict(dp_sgd=clients.DPSGD(1.0, 0.0, 0.0)), "sampling_rate"),
    (dict(dp_sgd=clients.DPSGD(1.0, 0.0, 1.5)), "sampling_rate"),
    (dict(dp_sgd=clients.DPSGD(1.0, 0.0, 0.5)), "PRNG key"),
])
def test_dp_sgd_refuses_what_it_cannot_compute(mlp64, photos, kwargs, message):
  apply_fn, variables = mlp64
  with pytest.raises(ValueError, match=message), jax.enable_x64(True):
    clients.fedsgd(apply_fn, variables, photos[:2], np.array([0, 1]), **kwargs)


def test_dp_sgd_in_training_mode_needs_a_model_without_batchnorm(mlp64, photos):
  """Training mode couples a batch's examples only through BatchNorm: without it a DP-SGD client
  in training mode sends what it sends in evaluation mode; with it, refused."""
  apply_fn, variables = mlp64
  x, y = photos[:2], np.array([0, 1])
  with jax.enable_x64(True):
    train = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=clients.DPSGD(1.0), train=True)
    evaluation = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=clients.DPSGD(1.0))
  for a, b in zip(jax.tree.leaves(train.gradient), jax.tree.leaves(evaluation.gradient)):
    np.testing.assert_array_equal(a, b)
  convnet = models.create("convnet-4", jax.random.key(0), num_classes=10)
  with pytest.raises(ValueError, match="training mode"):
    clients.fedsgd(convnet.apply_fn, convnet.variables, x, y, dp_sgd=clients.DPSGD(1.0), train=True)


def test_a_dp_sgd_fedavg_client_clips_every_local_step_as_numpy_says(mlp64, photos, mlp_reference):
  """FedAvg with DP-SGD's steps, no noise: two epochs of mini-batches of 2 with momentum, each step
  the mean of its examples' NumPy-backprop gradients clipped to C at the current weights."""
  apply_fn, variables, x, y, local, params, grads, norm, bound = _dp_fedavg_client(
      mlp64, photos, mlp_reference)
  w, v = params, jax.tree.map(np.zeros_like, params)
  for step in range(4):
    batch = [2 * (step % 2), 2 * (step % 2) + 1]
    gs = [grads(w, i) for i in batch]
    g = jax.tree.map(lambda *a: np.mean([b * min(1.0, bound / norm(gg)) for b, gg in zip(a, gs)], 0), *gs)
    v = jax.tree.map(lambda a, b: 0.5 * a + b, v, g)
    w = jax.tree.map(lambda a, b: a - 0.05 * b, w, v)
  with jax.enable_x64(True):
    obs = clients.fedavg(apply_fn, variables, jnp.asarray(x), jnp.asarray(y), local,
                         dp_sgd=clients.DPSGD(bound))
  for got, sent, new in zip(jax.tree.leaves(obs.gradient), jax.tree.leaves(params), jax.tree.leaves(w)):
    np.testing.assert_allclose(np.asarray(got), sent - new, rtol=1e-9, atol=1e-13 * np.abs(sent - new).max())


def test_a_dp_sgd_fedavg_clients_noise_carries_through_momentum(mlp64, photos):
  """The noise DP-SGD leaves in a FedAvg update (noisy minus noiseless, the same steps): zero-mean
  with the variance per entry the adapted attack weighs by, η² (σC/B)² Σ_s ((1 − μ^(T−s+1))/(1 − μ))²
  (gradjax.run.pipeline.dp_sgd_variance), here over T = 4 steps with μ = 0.6."""
  from gradjax.run import pipeline
  apply_fn, variables = mlp64
  x, y = photos[:4], np.array([1, 2, 3, 4])
  local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.1, momentum=0.6)
  dp = clients.DPSGD(0.5, 0.7)
  with jax.enable_x64(True):
    clean = clients.fedavg(apply_fn, variables, x, y, local, dp_sgd=clients.DPSGD(0.5))
    noisy = clients.fedavg(apply_fn, variables, x, y, local, dp_sgd=dp, key=jax.random.key(2))
  flat = lambda o: np.concatenate([np.ravel(a) for a in jax.tree.leaves(o.gradient)]).astype(np.float64)
  noise = flat(noisy) - flat(clean)
  want = sum(((1 - 0.6 ** (4 - s + 1)) / 0.4) ** 2 for s in range(1, 5)) * (0.1 * 0.7 * 0.5 / 2) ** 2
  # The noise also moves the weights the later steps' gradients are taken at: a second-order term.
  assert np.var(noise) == pytest.approx(want, rel=0.03)
  assert pipeline.dp_sgd_variance(dp, noisy) == pytest.approx(want, rel=1e-12)
  assert abs(np.mean(noise)) < 4 * np.sqrt(want / noise.size)
  with jax.enable_x64(True):
    fedsgd = clients.fedsgd(apply_fn, variables, x, y)
  assert pipeline.dp_sgd_variance(dp, fedsgd) == pytest.approx((0.7 * 0.5 / 4) ** 2, rel=1e-12)


def test_a_frozen_dicts_variables_are_read_as_plain_dicts(mlp64, photos):
  import flax  # pylint: disable=g-import-not-at-top
  from gradjax import attacks, presets  # pylint: disable=g-import-not-at-top
  apply_fn, variables = mlp64
  y = np.array([1, 5])
  with jax.enable_x64(True):
    frozen = clients.fedsgd(apply_fn, flax.core.freeze(variables), photos[:2], y)
    plain = clients.fedsgd(apply_fn, variables, photos[:2], y)
    assert type(frozen.variables) is dict and type(frozen.variables["params"]) is dict
    jax.tree.map(np.testing.assert_array_equal, frozen.gradient, plain.gradient)
    attacks.reconstruct(presets.dlg(2), apply_fn, frozen, jax.random.key(0), input_shape=(32, 32, 3))
  with pytest.raises(ValueError, match="FrozenDict: pass gradjax.observation.plain_dicts"):
    check_observation(plain.replace(variables=flax.core.freeze(variables)))
