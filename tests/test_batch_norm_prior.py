"""Tests for the BatchNorm statistics prior (gradjax.priors.batch_statistics / batch_norm_prior).

References: the moments of each BatchNorm layer's input computed in NumPy (float64) from the inputs
Flax itself records (``capture_intermediates``: the output of the convolution that feeds the layer),
and the GradInversion formula written out in NumPy.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gradjax import attacks, clients, models, presets, priors

# Models built here take conv="xla": what these tests check does not depend on the convolution,
# and XLA's compiles fastest on CPU (the implementations' equality is test_models' subject).


def _numpy_moments(h):
  h = np.asarray(h, np.float64).reshape(-1, h.shape[-1])
  mean = h.mean(axis=0)
  return mean, ((h - mean) ** 2).mean(axis=0)


def _perturbed_stats(variables, seed=0):
  """The model's batch_stats moved off their initial values (mean + U(0, 0.3), var · U(0.5, 1.5))."""
  rng = np.random.default_rng(seed)
  def move(path, v):
    v = np.asarray(v)
    if path[-1].key == "mean":
      return jnp.asarray(v + rng.uniform(0, 0.3, v.shape), v.dtype)
    return jnp.asarray(v * rng.uniform(0.5, 1.5, v.shape), v.dtype)
  return {**variables, "batch_stats": jax.tree_util.tree_map_with_path(move, variables["batch_stats"])}


def _captured(module, variables, x, train):
  """Flax's own record of every layer's output (``capture_intermediates``), jitted: run eagerly,
  each operation of the forward pass compiles as a program of its own."""
  capture = jax.jit(lambda v, x: module.apply(v, x, train=train, capture_intermediates=True,
                                               mutable=["intermediates", "batch_stats"])[1])
  return capture(variables, x)["intermediates"]


def _batch_statistics(network, x):
  """``priors.batch_statistics(network, x)``, jitted (see :func:`_captured`); its paths, which are
  not arrays, kept from the trace."""
  paths = []

  def statistics(x):
    stats = priors.batch_statistics(network, x)
    paths.append(stats.paths)
    return stats._replace(paths=None)

  return jax.jit(statistics)(x)._replace(paths=paths[0])


def _reference_prior(module, variables, x, train, multipliers):
  """Σ_l α_l (‖μ_l − μ̂_l‖ + ‖σ²_l − σ̂²_l‖) in NumPy, with each layer's input taken as the captured
  output of the convolution feeding it (every zoo BatchNorm_k follows Conv_k of the same module)."""
  inter = _captured(module, variables, x, train)
  order = []  # (path of the BN) in call order: the stem, then block by block
  order.append(("BatchNorm_0",))
  blocks = sorted((k for k in variables["batch_stats"] if k.startswith("BasicBlock_")),
                  key=lambda k: int(k.split("_")[1]))
  for b in blocks:
    order += [(b, k) for k in sorted(variables["batch_stats"][b])]
  total = 0.0
  for i, path in enumerate(order):
    node, stats = inter, variables["batch_stats"]
    for key in path[:-1]:
      node, stats = node[key], stats[key]
    conv = "Conv_" + path[-1].split("_")[1]
    mean, var = _numpy_moments(node[conv]["__call__"][0])
    running = stats[path[-1]]
    term = (np.linalg.norm(mean - np.asarray(running["mean"], np.float64))
            + np.linalg.norm(var - np.asarray(running["var"], np.float64)))
    total += (multipliers[i] if i < len(multipliers) else 1.0) * term
  return total, order


@pytest.mark.slow
@pytest.mark.parametrize("remat,train", [(False, False), (True, False), (False, True)])
def test_prior_equals_numpy_moments(remat, train):
  with jax.enable_x64(True):
    model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3), remat=remat,
                          param_dtype=jnp.float64)
    variables = _perturbed_stats(model.variables)
    x = jax.random.normal(jax.random.key(1), (3, 8, 8, 3), jnp.float64)
    network = priors.Network(model.apply_fn, variables, train)
    want, order = _reference_prior(model.apply_fn.module, variables, x, train, (2.0, 0.5, 3.0))
    stats = _batch_statistics(network, x)
    assert stats.paths == tuple(order)
    got = jax.jit(lambda x: priors.batch_norm_prior(x, network, multipliers=(2.0, 0.5, 3.0)))(x)
    np.testing.assert_allclose(float(got), want, rtol=1e-7)
    # The registered priors: GradInversion's first layer ×10, HFGInv's ×1.3 and ×3.
    for name, multipliers in (("bn", (10.0,)), ("bn_hfginv", (1.3, 3.0))):
      want, _ = _reference_prior(model.apply_fn.module, variables, x, train, multipliers)
      np.testing.assert_allclose(float(jax.jit(lambda x: priors.PRIORS[name](x, network))(x)), want,
                                 rtol=1e-7)


class FirstLayerBatchNorm(nn.Module):
  """BatchNorm on the input, then the head: the layer's input moments are the input's own."""

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.BatchNorm(use_running_average=not train, use_fast_variance=False)(x)
    return nn.Dense(3, name="head")(x.reshape(x.shape[0], -1))


def test_moments_of_a_first_layer_batch_norm_are_the_inputs_moments():
  """A model whose first layer is BatchNorm: its input moments are those of x itself."""
  module = FirstLayerBatchNorm()
  x = np.random.default_rng(0).normal(1.5, 2.0, (5, 4, 4, 2)).astype(np.float32)
  variables = module.init(jax.random.key(0), x)
  apply_fn = lambda v, x, train: module.apply(v, x, train=train, mutable=False) if not train \
      else module.apply(v, x, train=True, mutable=["batch_stats"])[0]
  stats = priors.batch_statistics(priors.Network(apply_fn, variables, False), x)  # no .module
  mean, var = _numpy_moments(x)
  np.testing.assert_allclose(np.asarray(stats.means[0]), mean, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(stats.variances[0]), var, rtol=1e-5)
  want = 2.0 * (np.linalg.norm(mean - 0.0) + np.linalg.norm(var - 1.0))  # initial running stats 0, 1
  got = priors.batch_norm_prior(x, priors.Network(apply_fn, variables, False), multipliers=(2.0,))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True])
def test_interceptor_leaves_outputs_unchanged(train):
  model = models.create("resnet8", jax.random.key(2), conv="xla", input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(3), (2, 8, 8, 3))
  stats = _batch_statistics(priors.Network(model.apply_fn, model.variables, train), x)
  logits = jax.jit(model.apply_fn, static_argnums=2)(model.variables, x, train)
  np.testing.assert_array_equal(np.asarray(stats.logits), np.asarray(logits))


@pytest.mark.slow
def test_bn_prior_in_an_attack_and_its_errors():
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, x, jnp.array([1, 4]), share_labels=True)
  attack = dataclasses.replace(presets.inverting_gradients(iterations=4),
                               priors=(priors.Prior(priors.PRIORS["tv"], 1e-4, 0),
                                       priors.Prior(priors.PRIORS["bn"], 1e-3, 2)))
  rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), input_shape=(8, 8, 3))
  assert rec.x.shape == (2, 8, 8, 3) and np.isfinite(rec.loss)
  lenet = models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3))
  obs = clients.fedsgd(lenet.apply_fn, lenet.variables, x, jnp.array([1, 4]), share_labels=True)
  with pytest.raises(ValueError, match="reads the model.s batch_stats"):
    attacks.reconstruct(attack, lenet.apply_fn, obs, jax.random.key(2), input_shape=(8, 8, 3))
  with pytest.raises(ValueError, match="network prior"):
    priors.combine([priors.Prior(priors.PRIORS["bn"], 1.0)])(x, 0)
  bound = priors.get_prior("bn", multipliers=(1.0,))  # keywords bound, still a network prior
  assert isinstance(bound, priors.NetworkPrior)
  network = priors.Network(model.apply_fn, model.variables)
  np.testing.assert_allclose(float(bound(x, network)),
                             float(priors.batch_norm_prior(x, network, multipliers=(1.0,))), rtol=1e-6)


def test_gradient_is_finite_where_the_moments_equal_the_running_statistics():
  """A batch whose first-layer moments equal the running ones exactly: the norm's gradient there is
  0, not NaN (sqrt at 0)."""
  module = FirstLayerBatchNorm()
  x = jnp.array([[[[1.0]]], [[[-1.0]]]])  # mean 0, biased variance 1: the initial running statistics
  variables = module.init(jax.random.key(0), x)
  network = priors.Network(lambda v, x, t: module.apply(v, x, train=t), variables, False)
  assert float(jax.jit(lambda x: priors.batch_norm_prior(x, network))(x)) == 0.0
  grad = jax.jit(jax.grad(lambda x: priors.batch_norm_prior(x, network)))(x)
  np.testing.assert_array_equal(np.asarray(grad), 0.0)


# --- the client's own batch moments, from the statistics it returns ----------------------------------


@pytest.mark.slow
def test_returned_statistics_reveal_the_batchs_moments():
  """A training-mode client that returns its running statistics: every layer's moments read back
  from them (clients.batch_moments) equal NumPy's moments of the layer's input (the convolution
  Flax captures); the BatchNorm prior against them is 0 at the client's batch and positive off it."""
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  variables = _perturbed_stats(model.variables)
  x = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3))
  obs = clients.fedsgd(model.apply_fn, variables, x, jnp.array([1, 4, 4, 0]), train=True,
                       share_statistics=True)
  _, order = _reference_prior(model.apply_fn.module, variables, x, True, ())
  inter = _captured(model.apply_fn.module, variables, x, True)
  for path in order:
    node, got = inter, obs.moments
    for key in path[:-1]:
      node, got = node[key], got[key]
    mean, var = _numpy_moments(node["Conv_" + path[-1].split("_")[1]]["__call__"][0])
    np.testing.assert_allclose(np.asarray(got[path[-1]]["mean"]), mean, atol=2e-6)
    np.testing.assert_allclose(np.asarray(got[path[-1]]["var"]), var, rtol=1e-4, atol=2e-6)
  network = priors.Network(model.apply_fn, variables, True, obs.moments)
  prior = jax.jit(lambda x, moments: priors.batch_norm_prior(x, network._replace(moments=moments)))
  assert float(prior(x, obs.moments)) < 1e-4
  assert float(prior(x[::-1] * 0.5, obs.moments)) > 0.1
  assert float(prior(x, None)) > 0.1  # running stats


@pytest.mark.isolated
@pytest.mark.slow
def test_pytorch_running_statistics_give_the_biased_moments():
  """PyTorch's BatchNorm2d in training mode (momentum 0.1, unbiased running variance): batch_moments
  with the layer's count n = N·H·W returns the biased moments NumPy computes from the input."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  h = rng.normal(0.5, 2.0, (3, 4, 5, 6)).astype(np.float32)  # N, C, H, W
  layer = torch.nn.BatchNorm2d(4)
  with torch.no_grad():
    layer.running_mean.copy_(torch.tensor(rng.normal(0, 1, 4), dtype=torch.float32))
    layer.running_var.copy_(torch.tensor(rng.uniform(0.5, 2, 4), dtype=torch.float32))
  sent = {"bn": {"mean": layer.running_mean.numpy().copy(), "var": layer.running_var.numpy().copy()}}
  layer.train()
  layer(torch.from_numpy(h))
  returned = {"bn": {"mean": layer.running_mean.numpy(), "var": layer.running_var.numpy()}}
  count = {"bn": {"mean": 3 * 5 * 6, "var": 3 * 5 * 6}}
  got = clients.batch_moments(sent, returned, momentum=1 - layer.momentum, count=count)
  mean, var = _numpy_moments(np.moveaxis(h, 1, -1))
  np.testing.assert_allclose(np.asarray(got["bn"]["mean"]), mean, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["bn"]["var"]), var, rtol=1e-4)


@pytest.mark.slow
def test_shared_statistics_errors():
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3))
  y = jnp.array([1, 4, 4, 0])
  with pytest.raises(ValueError, match="evaluation mode"):
    clients.fedsgd(model.apply_fn, model.variables, x, y, share_statistics=True)
  with pytest.raises(ValueError, match="2 local steps"):
    clients.fedavg(model.apply_fn, model.variables, x, y, clients.LocalTraining(batch_size=2),
                   train=True, share_statistics=True)
  with pytest.raises(ValueError, match="momentum"):
    clients.batch_moments(model.variables["batch_stats"], model.variables["batch_stats"], momentum=1.0)
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, train=True, share_statistics=True)
  assert clients.aggregate([obs, obs]).moments is None  # the union's variance is not in the mean
  from gradjax import observation as observation_lib
  observation_lib.check_observation(obs)
  wrong = jax.tree.map(lambda m: -jnp.ones_like(m), obs.moments)
  with pytest.raises(ValueError, match="negative"):
    observation_lib.check_observation(obs.replace(moments=wrong))
  with pytest.raises(ValueError, match="every BatchNorm layer"):
    observation_lib.check_observation(obs.replace(moments={"BatchNorm_0": obs.moments["BatchNorm_0"]}))
  from gradjax.run import config
  with pytest.raises(ValueError, match="needs --config.client.train_mode=True"):
    config.check(config.from_options({"client.share_statistics": True}))
  with pytest.raises(ValueError, match="does not use"):  # no option that nothing reads
    config.check(config.from_options({"client.share_statistics": True, "client.train_mode": True}))
  config.check(
      config.from_options({
          "client.share_statistics": True, "client.train_mode": True,
          "attack.priors": "tv:1e-2,bn:1e-4"
      }))
