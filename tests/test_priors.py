"""Tests for gradjax.priors: total variation (both forms), the L2 prior, group consistency, weight
schedules, combine.

References: NumPy loops / slices on real photos (scikit-image) and random images in float64, float64
central finite differences along random directions, and closed-form gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import data, priors
from gradjax.compilation import once


@pytest.fixture(scope="module")
def images():
  """Two real photos (2, 16, 16, 3) in [0, 1], float64."""
  return np.asarray(data.load("skimage", indices=range(2), image_size=(16, 16)).x, np.float64)


def _np_tv_mean(x):
  return np.mean(np.abs(np.diff(x, axis=2))) + np.mean(np.abs(np.diff(x, axis=1)))


def _np_tv_isotropic(x, beta, eps):
  n, h, w, c = x.shape
  total = 0.0
  for i in range(h - 1):
    for j in range(w - 1):
      dx = x[:, i, j + 1] - x[:, i, j]
      dy = x[:, i + 1, j] - x[:, i, j]
      total += np.sum((dx**2 + dy**2 + eps) ** (beta / 2))
  return total / (n * (h - 1) * (w - 1) * c)


def test_tv_matches_numpy(images):
  rng = np.random.default_rng(0)
  noisy = rng.normal(size=(3, 5, 7, 2))
  with jax.enable_x64(True):
    tv = once(priors.total_variation, static_argnames=("form", "beta", "eps"))
    for x in (images, noisy):
      np.testing.assert_allclose(float(tv(jnp.asarray(x))), _np_tv_mean(x), rtol=1e-13)
      np.testing.assert_allclose(float(once(priors.get_prior("tv"))(jnp.asarray(x))), _np_tv_mean(x),
                                 rtol=1e-13)
      for beta, eps in ((1.0, 1e-8), (2.0, 0.0), (1.5, 1e-3)):
        want = _np_tv_isotropic(x, beta, eps)
        got = tv(jnp.asarray(x), form="isotropic", beta=beta, eps=eps)
        np.testing.assert_allclose(float(got), want, rtol=1e-12)
      got = once(priors.get_prior("tv_isotropic", beta=1.5))(jnp.asarray(x))
      np.testing.assert_allclose(float(got), _np_tv_isotropic(x, 1.5, 1e-8), rtol=1e-12)


def test_tv_mean_gradient_closed_form(images):
  """∂TV/∂x from the signs of the differences, sign(0) = 0 where neighbouring pixels are equal."""
  x = images.copy()
  x[0, 4:9, 4:9, :] = 0.5  # a flat patch: ties, where jnp.abs would give a one-sided gradient
  sx, sy = np.sign(np.diff(x, axis=2)), np.sign(np.diff(x, axis=1))
  want = np.zeros_like(x)
  want[:, :, 1:] += sx / sx.size
  want[:, :, :-1] -= sx / sx.size
  want[:, 1:] += sy / sy.size
  want[:, :-1] -= sy / sy.size
  with jax.enable_x64(True):
    got = once(jax.grad(priors.total_variation))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["tv", "tv_isotropic", "l2"])
def test_prior_gradient_matches_finite_differences(name, images):
  rng = np.random.default_rng(1)
  x = images + 0.01 * rng.normal(size=images.shape)  # no exactly equal neighbours
  prior = jax.jit(priors.get_prior(name))
  h = 1e-6
  with jax.enable_x64(True):
    grad = np.asarray(jax.grad(prior)(jnp.asarray(x)))
    for _ in range(2):
      v = rng.normal(size=x.shape)
      fd = (float(prior(jnp.asarray(x + h * v))) - float(prior(jnp.asarray(x - h * v)))) / (2 * h)
      analytic = np.sum(grad * v)
      assert abs(fd - analytic) <= 1e-6 * abs(analytic), (name, fd, analytic)


def test_constant_image_has_no_variation():
  x = jnp.full((2, 6, 5, 3), 0.7, jnp.float32)
  value, grad = jax.value_and_grad(priors.total_variation)(x)
  assert float(value) == 0.0 and not np.any(np.asarray(grad))
  value, grad = jax.value_and_grad(lambda x: priors.total_variation(x, form="isotropic", beta=1.0))(x)
  # eps^(β/2), the smoothing floor, to float32's power function (without the fusion emitters, as the
  # attack's step compiles it, 1.04e-6 of it off)
  assert float(value) == pytest.approx(1e-8 ** 0.5, rel=2e-6)
  assert np.all(np.isfinite(np.asarray(grad))) and not np.any(np.asarray(grad))


def test_l2_norm(images):
  with jax.enable_x64(True):
    x = jnp.asarray(images)
    # One program each (compilation.once), not one per operation.
    np.testing.assert_allclose(float(once(priors.l2_norm)(x)), np.sum(images**2) / 2, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(once(jax.grad(priors.l2_norm))(x)), images, rtol=1e-13)


def test_prior_switches_on_at_its_start_under_jit_and_vmap(images):
  """HFGInv's "switched on at step T": 0 before, weight · fn(x) from T on, for a traced step."""
  x = jnp.asarray(images, jnp.float32)
  tv = float(priors.total_variation(x))
  prior = jax.jit(priors.Prior(priors.total_variation, 0.01, 3000))
  got = [float(prior(x, jnp.asarray(s))) for s in (0, 2999, 3000, 3001)]
  np.testing.assert_allclose(got, [0.0, 0.0, 0.01 * tv, 0.01 * tv], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.vmap(prior, in_axes=(None, 0))(x, jnp.arange(2998, 3003))),
                             [0, 0, 0.01 * tv, 0.01 * tv, 0.01 * tv], rtol=1e-6)
  ramp = priors.Prior(priors.total_variation, lambda step: 1e-3 * step, 5)  # a weight by step
  np.testing.assert_allclose([float(ramp(x, jnp.asarray(s))) for s in (4, 5, 6)],
                             [0.0, 5e-3 * tv, 6e-3 * tv], rtol=1e-6)


def test_combine(images):
  x = jnp.asarray(images, jnp.float32)
  combined = jax.jit(priors.combine([priors.Prior(priors.total_variation, 0.5, 10),
                                     priors.Prior(priors.l2_norm, 1e-3)]))
  tv, l2 = float(priors.total_variation(x)), float(priors.l2_norm(x))
  assert float(combined(x, jnp.asarray(9))) == pytest.approx(1e-3 * l2, rel=1e-6)
  assert float(combined(x, jnp.asarray(10))) == pytest.approx(0.5 * tv + 1e-3 * l2, rel=1e-6)
  assert float(priors.combine([])(x, jnp.asarray(0))) == 0.0
  # Differentiable in x, and vmappable over steps.
  assert np.all(np.isfinite(np.asarray(jax.grad(combined)(x, jnp.asarray(10)))))
  assert jax.vmap(combined, in_axes=(None, 0))(x, jnp.arange(8, 12)).shape == (4,)


def test_group_consistency_over_vmapped_restarts(images):
  """GradInversion's term (1/N) Σ_n ‖x_{r,n} − x̄_n‖² per restart r, x̄ the mean over restarts, against
  NumPy; its gradient is 2 (x_r − x̄) / N (the consensus is a constant of the step), checked against
  the closed form in float64."""
  rng = np.random.default_rng(3)
  x = np.stack([images + 0.1 * rng.normal(size=images.shape) for _ in range(3)])  # (R=3, N=2, ...)
  mean = x.mean(axis=0)
  want = np.sum((x - mean) ** 2, axis=(1, 2, 3, 4)) / x.shape[1]
  run = lambda fn: jax.vmap(fn, axis_name=priors.RESTART_AXIS)
  with jax.enable_x64(True):
    np.testing.assert_allclose(np.asarray(run(priors.group_consistency)(jnp.asarray(x))), want,
                               rtol=1e-12)
    grad = run(jax.grad(priors.group_consistency))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(grad), 2 * (x - mean) / x.shape[1], rtol=1e-10, atol=1e-14)
  # Restarts that agree pay nothing; outside vmapped restarts the term has nothing to compare.
  same = jnp.broadcast_to(jnp.asarray(images, jnp.float32), (4, *images.shape))
  assert not np.any(np.asarray(run(priors.group_consistency)(same)))
  with pytest.raises(ValueError, match="vmapped restarts"):
    priors.group_consistency(jnp.asarray(images))
  assert priors.Prior(priors.PRIORS["group"], 0.1).couples_restarts
  assert not priors.Prior(priors.total_variation, 0.1).couples_restarts


def test_errors():
  x = jnp.zeros((1, 4, 4, 1))
  with pytest.raises(ValueError, match="N, H, W, C"):
    priors.total_variation(jnp.zeros((4, 4, 1)))
  with pytest.raises(ValueError, match="N, H, W, C"):
    priors.l2_norm(jnp.zeros((4, 4)))
  with pytest.raises(ValueError, match="TV form"):
    priors.total_variation(x, form="anisotropic")
  with pytest.raises(ValueError, match="H, W >= 2"):
    priors.total_variation(jnp.zeros((1, 1, 4, 1)))
  with pytest.raises(ValueError, match="eps"):
    priors.total_variation(x, form="isotropic", eps=-1.0)
  with pytest.raises(ValueError, match="unknown prior"):
    priors.get_prior("group_consistency")
  with pytest.raises(ValueError, match="Prior records"):
    priors.combine([priors.total_variation])
  with pytest.raises(ValueError, match="Prior records"):
    priors.combine([(priors.total_variation, 1e-4)])  # a (fn, weight) pair is not a Prior
  for start in (-1, 2.5):
    with pytest.raises(ValueError, match="non-negative integer step"):
      priors.Prior(priors.total_variation, 1.0, start)
  for weight in (-1e3, float("nan"), float("inf"), "1e-4"):  # a negative weight rewards the prior
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
      priors.Prior(priors.total_variation, weight)
  with pytest.raises(ValueError, match="function of the images"):
    priors.Prior("tv", 1e-4)
