"""Programs compiled with gradjax.compilation's options compute what plain jax.jit computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, compilation, models


@pytest.mark.slow
def test_model_init_as_one_program_equals_flax_init():
  model = models.create("lenet_zhu", jax.random.key(3), input_shape=(16, 16, 3), num_classes=5)
  module = models.get_module("lenet_zhu", num_classes=5)
  eager = module.init(jax.random.key(3), jnp.zeros((1, 16, 16, 3)), train=False)
  jax.tree.map(np.testing.assert_array_equal, model.variables, eager)  # threefry draws: exact


@pytest.mark.slow
def test_once_and_step_options_agree_with_default_jit(photos):
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))

  def matching(x):
    g = jax.grad(lambda p: jnp.sum(model.apply_fn({"params": p}, x) ** 2))(model.variables["params"])
    return sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(obs.gradient)))

  fn = jax.value_and_grad(matching)
  # XLA's defaults, fusion emitters included (the suite's XLA_FLAGS turn them off: tests/conftest.py)
  default = compilation.options({"xla_cpu_use_fusion_emitters": True})
  want = jax.jit(fn, compiler_options=default)(photos[2:4])
  # float32 with cancellation: the levels differ in fused multiply-adds, so compare on the scale
  # of each result.
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=3e-4 * np.abs(b).max())
  for options in (compilation.ONCE, compilation.STEP):
    got = jax.jit(fn, compiler_options=compilation.options(options))(photos[2:4])
    jax.tree.map(close, got, want)
  got = compilation.once(fn)(photos[2:4])
  jax.tree.map(close, got, want)


def test_once_inside_other_transformations():
  double = compilation.once(lambda x: 2.0 * x)
  x = jnp.arange(3.0)
  np.testing.assert_array_equal(double(x), 2.0 * np.arange(3.0))
  np.testing.assert_array_equal(jax.jit(double)(x), 2.0 * np.arange(3.0))
  np.testing.assert_array_equal(jax.vmap(double)(x), 2.0 * np.arange(3.0))
  assert jax.grad(lambda v: double(v).sum())(x).tolist() == [2.0, 2.0, 2.0]
  shapes = jax.eval_shape(
      lambda: models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3)).variables)
  assert shapes["params"]["head"]["kernel"].shape == (12 * 2 * 2, 10)


def test_options_drops_what_the_compiler_does_not_know():
  wanted = {"xla_backend_optimization_level": 0, "xla_no_such_option_anywhere": True}
  assert compilation.options(wanted) == {"xla_backend_optimization_level": 0}
