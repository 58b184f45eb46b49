r"""The privacy budget of DP-SGD: Rényi differential privacy of the sampled Gaussian mechanism.

DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016) clips each example's
gradient to L2 norm C, sums, adds N(0, σ²C²) per entry and averages; with each example in a step's
batch independently with probability q (Poisson sampling) one step is the sampled Gaussian mechanism
with noise multiplier σ. Its Rényi divergence of order α > 1 between neighbouring datasets (one
example added or removed) is at most (Mironov, Talwar & Zhang, "Rényi Differential Privacy of the
Sampled Gaussian Mechanism", 2019)

    RDP(α) = log A_α / (α − 1),   A_α = E_{z ~ N(0, σ²)} [((1 − q) + q · exp((2z − 1) / (2σ²)))^α],

T steps compose to T · RDP(α), and (Balle et al., "Hypothesis Testing Interpretations and Rényi
Differential Privacy", AISTATS 2020, Theorem 21) give (ε, δ)-DP with

    ε = min_α  T · RDP(α) + log((α − 1) / α) − (log δ + log α) / (α − 1),

the conversion Opacus and Google's dp_accounting use. A_α is computed

* for integer α, as the finite sum  Σ_{k=0..α} C(α, k) (1 − q)^{α−k} q^k exp((k² − k) / (2σ²));
* for fractional α, by splitting the expectation at z₀ = σ² log(1/q − 1) + 1/2, where the two terms
  of the base are equal, and expanding the base as a binomial series in its smaller term on each
  side: with the Gaussian integral ∫ N(z; 0, σ²) exp(i(2z − 1)/(2σ²)) dz over a half-line =
  exp((i² − i)/(2σ²)) times N(i, σ²)'s mass there,

      A_α = Σ_{i≥0} C(α, i) [ (1−q)^{α−i} q^i e^{(i²−i)/(2σ²)} Φ((z₀ − i)/σ)
                             + (1−q)^i q^{α−i} e^{(j²−j)/(2σ²)} Φ((j − z₀)/σ) ],   j = α − i,

  summed in log space with the terms' signs until they are negligible;
* for q = 1 (every example in every step: the Gaussian mechanism), RDP(α) = α / (2σ²).

Example::

  budget = gradjax.privacy.epsilon(sampling_rate=256 / 60000, noise_multiplier=1.1, steps=14070,
                                   delta=1e-5)   # Budget(epsilon=..., order=...)
"""

import math
from typing import NamedTuple

import numpy as np
from scipy import special

# The orders ε is minimised over: 1.1 .. 10.9 by 0.1, the integers 11 .. 63, then powers of two to
# 1024 (a grid as dense as Opacus' and dp_accounting's where the minimum usually lies, reaching
# further for large budgets of little noise). Where the minimum lies past Opacus' largest default
# order, 63, ε is below what Opacus' get_epsilon prints, both valid bounds: q = 0.004, σ = 5, 100
# steps, δ = 1e-5 give 0.028 at order 256 here, 0.105 there (Opacus 1.6, measured 2026-12-07).
ORDERS = tuple([round(1 + x / 10, 1) for x in range(1, 100)] + list(range(11, 64))
               + [64, 128, 256, 512, 1024])

# The fractional series is summed in blocks of _BLOCK terms until a block ends below exp(_NEGLIGIBLE)
# (A_α ≥ 1: an absolute bound), at most _MAX_TERMS terms.
_NEGLIGIBLE, _BLOCK, _MAX_TERMS = -40.0, 1024, 1 << 22


class Budget(NamedTuple):
  """(ε, δ)-DP of a DP-SGD run: ``epsilon`` at ``delta``, reached at Rényi order ``order``."""

  epsilon: float
  delta: float
  order: float


def _check(sampling_rate, noise_multiplier) -> tuple[float, float]:
  q, sigma = float(sampling_rate), float(noise_multiplier)
  if not 0.0 <= q <= 1.0:
    raise ValueError(f"the sampling rate must lie in [0, 1], got {sampling_rate}")
  if not (sigma > 0 and math.isfinite(sigma)):
    raise ValueError(f"the noise multiplier must be positive and finite, got {noise_multiplier} "
                     "(without noise DP-SGD gives no privacy: ε is infinite)")
  return q, sigma


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
  k = np.arange(alpha + 1, dtype=np.float64)
  log_terms = (special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
               + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma ** 2))
  return float(special.logsumexp(log_terms))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
  z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
  logs, signs = [], []
  for start in range(0, _MAX_TERMS, _BLOCK):
    i = np.arange(start, start + _BLOCK, dtype=np.float64)
    j = alpha - i
    binom = special.binom(alpha, i)
    log_binom = np.log(np.abs(binom))
    low = (log_binom + j * math.log1p(-q) + i * math.log(q) + (i * i - i) / (2 * sigma ** 2)
           + special.log_ndtr((z0 - i) / sigma))
    high = (log_binom + i * math.log1p(-q) + j * math.log(q) + (j * j - j) / (2 * sigma ** 2)
            + special.log_ndtr((j - z0) / sigma))
    logs += [low, high]
    signs += [np.sign(binom)] * 2
    # The terms past α fall polynomially (|C(α, i)| ~ i^(-α-1)); A_α ≥ 1, so terms below
    # exp(_NEGLIGIBLE) leave its logarithm exact to rounding.
    if i[-1] > alpha and max(low[-1], high[-1]) < _NEGLIGIBLE:
      break
  else:
    raise ArithmeticError(f"the series of A_{alpha} did not settle in {_MAX_TERMS} terms (q={q}, "
                          f"σ={sigma})")
  logs, signs = np.concatenate(logs), np.concatenate(signs)
  keep = signs != 0  # C(α, i) is never 0 for fractional α; kept safe
  value, sign = special.logsumexp(logs[keep], b=signs[keep], return_sign=True)
  if sign <= 0:  # cannot happen for A_α ≥ 1; a sum that cancelled below rounding
    raise ArithmeticError(f"the series of A_{alpha} lost its precision (q={q}, σ={sigma})")
  return float(value)


def rdp(sampling_rate: float, noise_multiplier: float, orders=ORDERS) -> np.ndarray:
  """RDP(α) of one step of the sampled Gaussian mechanism at each order in ``orders`` (all > 1):
  (len(orders),) float64. ``sampling_rate`` q in [0, 1], ``noise_multiplier`` σ > 0."""
  q, sigma = _check(sampling_rate, noise_multiplier)
  orders = np.asarray(orders, np.float64).reshape(-1)
  if not np.all(orders > 1) or not np.all(np.isfinite(orders)):
    raise ValueError(f"Rényi orders must be finite and > 1, got {orders.tolist()}")
  if q == 0:
    return np.zeros_like(orders)
  if q == 1:
    return orders / (2 * sigma ** 2)
  out = []
  for alpha in orders:
    if float(alpha).is_integer():
      log_a = _log_a_integer(q, sigma, int(alpha))
    else:
      log_a = _log_a_fractional(q, sigma, float(alpha))
    out.append(log_a / (alpha - 1))
  return np.asarray(out, np.float64)


def epsilon(sampling_rate: float, noise_multiplier: float, steps: int, delta: float,
            orders=ORDERS) -> Budget:
  """(ε, δ)-DP of ``steps`` DP-SGD steps (each example sampled with probability ``sampling_rate``,
  noise multiplier ``noise_multiplier``): the smallest ε over ``orders`` of Balle et al.'s
  conversion (module docstring), with the order that gives it."""
  if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f"steps must be a positive integer, got {steps!r}")
  if not 0 < delta < 1:
    raise ValueError(f"delta must lie in (0, 1), got {delta}")
  orders = np.asarray(orders, np.float64).reshape(-1)
  total = steps * rdp(sampling_rate, noise_multiplier, orders)
  eps = total + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
  best = int(np.argmin(eps))
  return Budget(max(float(eps[best]), 0.0), float(delta), float(orders[best]))
