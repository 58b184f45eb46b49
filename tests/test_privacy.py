"""gradjax.privacy: the sampled Gaussian mechanism's Rényi DP and DP-SGD's (ε, δ), against the
defining integral in float64 (scipy's quadrature), the Gaussian mechanism's closed forms, and the
exact privacy curve of composed Gaussian mechanisms (Balle & Wang 2018)."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from gradjax import privacy


def _rdp_by_quadrature(q, sigma, alpha):
  """log E_{z~N(0,σ²)}[((1 − q) + q exp((2z − 1)/(2σ²)))^α] / (α − 1), integrated numerically."""
  def integrand(z):  # the pdf times the base to the α, multiplied in log space
    base = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma ** 2))
    return math.exp(stats.norm.logpdf(z, scale=sigma) + alpha * base)
  # The integrand peaks between 0 and about α and falls as a Gaussian of width σ on either side.
  z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5  # where the base's two terms are equal
  lo, hi = -40 * sigma, alpha + 40 * sigma
  points = sorted({lo, 0.0, min(max(z0, lo), hi), 0.5 + alpha, hi})
  total = sum(integrate.quad(integrand, a, b, epsabs=0, epsrel=1e-12, limit=200)[0]
              for a, b in zip(points, points[1:]))
  return math.log(total) / (alpha - 1)


@pytest.mark.parametrize("q, sigma", [(0.01, 2.0), (256 / 60000, 1.1), (0.3, 1.5), (0.9, 0.9),
                                      (1e-3, 0.6)])
def test_rdp_is_the_defining_integral(q, sigma):
  """Integer orders (the finite binomial sum) and fractional ones (the split series) against the
  expectation that defines A_α, integrated in float64."""
  orders = [1.1, 1.5, 2, 2.5, 3, 4.7, 8, 10.5, 16]
  got = privacy.rdp(q, sigma, orders)
  want = [_rdp_by_quadrature(q, sigma, a) for a in orders]
  np.testing.assert_allclose(got, want, rtol=1e-7)


def test_rdp_without_sampling_and_without_examples():
  """q = 1: the Gaussian mechanism's α/(2σ²); q = 0: nothing released about anyone."""
  orders = np.array([1.1, 2, 7.5, 64])
  np.testing.assert_allclose(privacy.rdp(1.0, 0.8, orders), orders / (2 * 0.8 ** 2), rtol=1e-15)
  np.testing.assert_array_equal(privacy.rdp(0.0, 0.8, orders), 0.0)


def test_epsilon_is_balle_et_als_conversion_minimised_over_the_orders():
  """ε of T full-batch steps: min over the orders of Tα/(2σ²) + log((α−1)/α) − (log δ + log α)/(α−1),
  written out here, and the order that attains it."""
  sigma, steps, delta = 1.3, 40, 1e-6
  a = np.asarray(privacy.ORDERS)
  curve = steps * a / (2 * sigma ** 2) + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
  budget = privacy.epsilon(1.0, sigma, steps, delta)
  assert budget.epsilon == pytest.approx(curve.min(), rel=1e-12)
  assert budget.order == a[np.argmin(curve)] and budget.delta == delta


@pytest.mark.parametrize("sigma, steps, delta", [(1.0, 1, 1e-5), (2.0, 10, 1e-5), (4.0, 100, 1e-6),
                                                 (0.7, 3, 1e-3)])
def test_epsilon_bounds_the_exact_privacy_curve_of_the_gaussian_mechanism(sigma, steps, delta):
  """T full-batch steps are one Gaussian mechanism with μ = √T/σ, whose exact δ(ε) is
  Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) (Balle & Wang, ICML 2018): the reported ε holds (its δ is at
  most the one asked) and is within 35 % of the tight ε."""
  mu = math.sqrt(steps) / sigma
  exact_delta = lambda eps: (stats.norm.cdf(mu / 2 - eps / mu)
                             - math.exp(eps + stats.norm.logcdf(-mu / 2 - eps / mu)))
  budget = privacy.epsilon(1.0, sigma, steps, delta)
  tight = optimize.brentq(lambda eps: exact_delta(eps) - delta, 1e-9, 200)
  assert exact_delta(budget.epsilon) <= delta * (1 + 1e-9)
  assert tight <= budget.epsilon <= 1.35 * tight


def test_subsampling_amplifies_privacy():
  """Fewer of the examples in each step, less ε; more steps or less noise, more."""
  eps = lambda q, sigma, steps: privacy.epsilon(q, sigma, steps, 1e-5).epsilon
  assert eps(0.01, 1.1, 1000) < eps(0.1, 1.1, 1000) < eps(1.0, 1.1, 1000)
  assert eps(0.01, 1.1, 100) < eps(0.01, 1.1, 1000) and eps(0.01, 2.0, 1000) < eps(0.01, 1.1, 1000)


@pytest.mark.parametrize("call, message", [
    (lambda: privacy.rdp(1.5, 1.0), "sampling rate"),
    (lambda: privacy.rdp(0.1, 0.0), "noise multiplier"),
    (lambda: privacy.rdp(0.1, float("nan")), "noise multiplier"),
    (lambda: privacy.rdp(0.1, 1.0, [1.0, 2.0]), "orders"),
    (lambda: privacy.epsilon(0.1, 1.0, 0, 1e-5), "steps"),
    (lambda: privacy.epsilon(0.1, 1.0, 2.5, 1e-5), "steps"),
    (lambda: privacy.epsilon(0.1, 1.0, 10, 0.0), "delta"),
])
def test_bad_arguments_are_named(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_a_simulated_fedavg_round_counts_its_own_dp_sgd_steps():
  """T of the reported ε: as declared for a FedSGD client and a capture; for a simulated FedAvg
  client at least its round's own (3 local epochs of fixed mini-batches: 3 steps of each example
  at rate 1; with Poisson sampling its 2 epochs x 8 / 2 local steps), never fewer than declared."""
  from gradjax.run import config, pipeline
  dp = {"defense.dp_sgd_max_norm": 1.0, "defense.dp_sgd_noise_multiplier": 1.0}
  fedavg = {**dp, "client.name": "fedavg", "client.local_epochs": 3, "data.batch_size": 8,
            "client.local_batch_size": 2}
  cases = [({**dp}, 1), ({**dp, "defense.dp_sgd_steps": 7}, 7), (fedavg, 3),
           ({**fedavg, "defense.dp_sgd_steps": 100}, 100),
           ({**fedavg, "client.local_epochs": 2, "defense.dp_sgd_poisson": True,
             "defense.dp_sgd_sampling_rate": 0.25}, 8)]
  for options, steps in cases:
    cfg = config.from_options(options)
    got = pipeline.dp_sgd_privacy(cfg)
    q = cfg.defense.dp_sgd_sampling_rate
    assert got["steps"] == steps, options
    assert got["epsilon"] == privacy.epsilon(q, 1.0, steps, 1e-5).epsilon
    assert got.get("steps_declared") == (None if steps == cfg.defense.dp_sgd_steps
                                         else cfg.defense.dp_sgd_steps)
