"""Tests for gradjax.metrics against scikit-image and brute force, on real images."""

import itertools
import json

import numpy as np
import pytest
from skimage import data, filters, transform
from skimage.metrics import peak_signal_noise_ratio as sk_psnr
from skimage.metrics import structural_similarity as sk_ssim

from gradjax import metrics


def _resize(img, size=32):
  return transform.resize(img, (size, size), anti_aliasing=True).astype(np.float64)


@pytest.fixture(scope="module")
def truth():
  """(5, 32, 32, 3) real photos in [0, 1]: astronaut, chelsea, coffee and two variants."""
  a, c, k = (_resize(f()) for f in (data.astronaut, data.chelsea, data.coffee))
  return np.stack([a, c, k, a[:, ::-1], np.rot90(c)])


@pytest.fixture(scope="module")
def recon(truth):
  """Real-looking degraded versions: noise (some out of [0, 1]) and blur."""
  rng = np.random.default_rng(0)
  noisy = truth + 0.08 * rng.standard_normal(truth.shape)
  blurred = np.stack([filters.gaussian(t, sigma=1.0, channel_axis=-1) for t in truth])
  return np.concatenate([noisy[:3], blurred[3:]])


# --- PSNR / MSE ------------------------------------------------------------------------------


def test_psnr_matches_skimage(truth, recon):
  got = metrics.psnr(recon, truth)
  want = [sk_psnr(t, np.clip(r, 0, 1), data_range=1) for r, t in zip(recon, truth)]
  assert got.shape == (5,) and got.dtype == np.float64
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
  assert np.all(got < metrics.PSNR_CAP)


def test_mse_is_per_image_mean_of_clamped(truth, recon):
  want = ((np.clip(recon, 0, 1) - truth) ** 2).mean(axis=(1, 2, 3))
  np.testing.assert_allclose(metrics.mse(recon, truth), want, rtol=0, atol=1e-15)


def test_clamping():
  x_true = np.full((2, 4, 4, 1), 1.0 + metrics.TRUTH_SLACK / 2)  # Rounding above 1: clamps to 1.
  x = np.stack([np.full((4, 4, 1), 2.0), np.full((4, 4, 1), 0.5)])  # Clamp to 1 and 0.5.
  np.testing.assert_allclose(metrics.mse(x, x_true), [0.0, 0.25], rtol=0, atol=0)
  np.testing.assert_allclose(metrics.psnr(x, x_true), [100.0, 10 * np.log10(4.0)], rtol=1e-14)
  x_neg = np.full((1, 4, 4, 1), -3.0)
  assert metrics.psnr(x_neg, np.zeros_like(x_neg))[0] == metrics.PSNR_CAP


def test_a_ground_truth_outside_the_unit_range_is_refused():
  """Images of 0..255 (float or 8-bit) as the ground truth would be clamped into a high score
  (33 dB for two unrelated random images): refused, for every metric that reads one."""
  rng = np.random.default_rng(0)
  a, b = rng.random((2, 8, 8, 3)), rng.random((2, 8, 8, 3))
  for fn in (metrics.psnr, metrics.ssim, metrics.mse, metrics.psnr_unclamped, metrics.score,
             metrics.match_order):
    with pytest.raises(ValueError, match=r"x_true must lie in \[0, 1\]"):
      fn(a, b * 255)
    with pytest.raises(ValueError, match="x_true must be floating-point images in \\[0, 1\\], got uint8"):
      fn(a, (b * 255).astype(np.uint8))
  with pytest.raises(ValueError, match=r"got values in \[-0.495"):
    metrics.psnr(a, b - 0.5)
  with pytest.raises(ValueError, match=r"std must be one value or one per channel \(3\), got 2"):
    metrics.psnr_unclamped(a, b, std=(0.2, 0.3))


def test_psnr_cap(truth):
  assert metrics.PSNR_CAP == 100.0
  np.testing.assert_array_equal(metrics.psnr(truth, truth), np.full(5, 100.0))
  almost = truth + 1e-7  # mse ~1e-14 -> 140 dB uncapped.
  np.testing.assert_array_equal(metrics.psnr(almost, truth), np.full(5, 100.0))


# --- SSIM ------------------------------------------------------------------------------------


def test_ssim_matches_skimage_rgb(truth, recon):
  got = metrics.ssim(recon, truth)
  want = [sk_ssim(np.clip(r, 0, 1), t, data_range=1, channel_axis=-1) for r, t in zip(recon, truth)]
  assert got.shape == (5,)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
  np.testing.assert_allclose(metrics.ssim(truth, truth), np.ones(5), rtol=0, atol=1e-12)


def test_ssim_is_symmetric_and_dtype_agnostic(truth, recon):
  x = np.clip(recon, 0, 1)
  np.testing.assert_allclose(metrics.ssim(x, truth), metrics.ssim(truth, x), atol=1e-12)
  np.testing.assert_allclose(
      metrics.ssim(x.astype(np.float32), truth.astype(np.float32)),
      metrics.ssim(x.astype(np.float32).astype(np.float64), truth.astype(np.float32)),
      rtol=0, atol=0)


def test_ssim_gray(truth):
  gray = truth.mean(axis=-1, keepdims=True)
  blurred = np.stack([filters.gaussian(g[..., 0], sigma=1.5)[..., None] for g in gray])
  got = metrics.ssim(blurred, gray)
  want_2d = [sk_ssim(b[..., 0], g[..., 0], data_range=1) for b, g in zip(blurred, gray)]
  want_ch = [sk_ssim(b, g, data_range=1, channel_axis=-1) for b, g in zip(blurred, gray)]
  np.testing.assert_allclose(got, want_2d, rtol=0, atol=1e-10)
  np.testing.assert_allclose(got, want_ch, rtol=0, atol=1e-10)


@pytest.mark.parametrize("hw, win", [((5, 5), 5), ((6, 6), 5), ((4, 9), 3), ((3, 3), 3), ((7, 6), 5)])
def test_ssim_small_images(hw, win):
  rng = np.random.default_rng(1)
  a, b = rng.random((2, 3) + hw + (3,))
  b = 0.6 * a + 0.4 * b  # Correlated, so SSIM is far from 0.
  got = metrics.ssim(a, b)
  want = [sk_ssim(x, y, data_range=1, channel_axis=-1, win_size=win) for x, y in zip(a, b)]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_ssim_too_small():
  with pytest.raises(ValueError, match="3x3"):
    metrics.ssim(np.zeros((1, 2, 5, 3)), np.zeros((1, 2, 5, 3)))


# --- Labels ----------------------------------------------------------------------------------


def test_label_accuracy_hand_counted():
  # Class 0: min(3, 2) = 2, class 1: min(1, 3) = 1, classes 2, 3: 0 -> 3 / 6.
  assert metrics.label_accuracy([0, 0, 0, 1, 2, 2], [0, 0, 1, 1, 1, 3]) == 0.5
  assert metrics.label_accuracy([1, 1, 2], [1, 2, 2]) == pytest.approx(2 / 3)
  assert metrics.label_accuracy([7, 7, 7], [7, 7, 7]) == 1.0
  assert metrics.label_accuracy([1, 2], [3, 4]) == 0.0
  assert isinstance(metrics.label_accuracy(np.array([1]), np.array([1])), float)


def test_label_accuracy_closed_form_and_order_free():
  rng = np.random.default_rng(2)
  for _ in range(20):
    n = int(rng.integers(1, 30))
    pred, true = rng.integers(0, 5, n), rng.integers(0, 5, n)
    want = np.minimum(np.bincount(pred, minlength=5), np.bincount(true, minlength=5)).sum() / n
    assert metrics.label_accuracy(pred, true) == pytest.approx(want, abs=1e-15)
    assert metrics.label_accuracy(rng.permutation(pred), true) == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("pred, true", [
    ([0, 1], [0, 1, 2]),  # Length mismatch.
    ([], []),  # Empty.
    ([[0, 1]], [[0, 1]]),  # Not 1-D.
    ([0.0, 1.0], [0, 1]),  # Not integer.
])
def test_label_accuracy_errors(pred, true):
  with pytest.raises(ValueError):
    metrics.label_accuracy(pred, true)


# --- Order matching --------------------------------------------------------------------------


def _brute_force(x, x_true, pair_cost):
  n = len(x)
  costs = {p: sum(pair_cost(x[p[j]], x_true[j]) for j in range(n))
           for p in itertools.permutations(range(n))}
  ranked = sorted(costs.items(), key=lambda kv: kv[1])
  return ranked[0], ranked[1][1]


@pytest.mark.parametrize("metric", ["mse", "psnr"])
def test_match_order_equals_brute_force(truth, metric):
  # Heavy noise plus blends of two photos, shuffled, so greedy matching is not enough.
  rng = np.random.default_rng(3)
  mixed = 0.55 * truth + 0.45 * truth[[1, 2, 3, 4, 0]] + 0.15 * rng.standard_normal(truth.shape)
  shuffle = rng.permutation(5)
  x = mixed[shuffle]
  mse1 = lambda a, b: metrics.mse(a[None], b[None])[0]
  pair_cost = mse1 if metric == "mse" else (lambda a, b: -metrics.psnr(a[None], b[None])[0])
  (best_perm, best_cost), second = _brute_force(x, truth, pair_cost)
  perm = metrics.match_order(x, truth, metric=metric)
  assert perm.shape == (5,) and sorted(perm.tolist()) == list(range(5))
  got_cost = sum(pair_cost(x[perm[j]], truth[j]) for j in range(5))
  assert got_cost == pytest.approx(best_cost, abs=1e-12)
  assert second - best_cost > 1e-9  # Unique optimum, so the permutation itself must agree.
  assert tuple(perm.tolist()) == best_perm


def test_match_order_undoes_shuffle(truth):
  p = np.array([3, 0, 4, 1, 2])
  np.testing.assert_array_equal(metrics.match_order(truth[p], truth), np.argsort(p))
  np.testing.assert_array_equal(truth[p][metrics.match_order(truth[p], truth)], truth)


# --- score -----------------------------------------------------------------------------------


def test_score_undoes_known_shuffle(truth, recon):
  p = np.array([2, 4, 0, 1, 3])
  result = metrics.score(recon[p], truth, labels=[5, 5, 1, 2, 9], labels_true=[1, 5, 2, 9, 9])
  assert result["order"] == np.argsort(p).tolist()
  np.testing.assert_array_equal(result["psnr_per_image"], metrics.psnr(recon, truth))
  np.testing.assert_array_equal(result["ssim_per_image"], metrics.ssim(recon, truth))
  np.testing.assert_array_equal(result["mse_per_image"], metrics.mse(recon, truth))
  assert result["psnr"] == pytest.approx(np.mean(result["psnr_per_image"]), abs=1e-12)
  assert result["ssim"] == pytest.approx(np.mean(result["ssim_per_image"]), abs=1e-12)
  assert result["mse"] == pytest.approx(np.mean(result["mse_per_image"]), abs=1e-15)
  assert result["label_accuracy"] == 0.8  # {1, 2, 5, 9} shared once each, 5 twice in pred once in true.
  json.dumps(result, allow_nan=False)  # Plain Python types only.
  assert all(type(v) is float for v in result["psnr_per_image"])
  assert all(type(v) is int for v in result["order"])


def test_score_without_matching(truth, recon):
  p = np.array([1, 0, 2, 3, 4])
  result = metrics.score(recon[p], truth, match=False)
  assert result["order"] == [0, 1, 2, 3, 4]
  assert result["label_accuracy"] is None
  np.testing.assert_array_equal(result["mse_per_image"], metrics.mse(recon[p], truth))
  single = metrics.score(truth[:1], truth[:1])
  assert single["order"] == [0] and single["psnr"] == 100.0 and single["ssim"] == pytest.approx(1.0)


# --- Errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [metrics.mse, metrics.psnr, metrics.ssim, metrics.match_order, metrics.score])
def test_image_errors(fn):
  good = np.zeros((2, 8, 8, 3))
  nan, inf = good.copy(), good.copy()
  nan[0, 1, 2, 0], inf[1, 0, 0, 2] = np.nan, np.inf
  cases = [
      (good, np.zeros((2, 8, 8, 1))),  # Shape mismatch.
      (good, np.zeros((3, 8, 8, 3))),  # Batch mismatch.
      (good[0], good[0]),  # Not NHWC.
      (good[:0], good[:0]),  # Empty batch.
      (nan, good),
      (good, inf),
  ]
  for x, x_true in cases:
    with pytest.raises(ValueError):
      fn(x, x_true)


def test_other_errors(truth):
  with pytest.raises(ValueError, match="metric"):
    metrics.match_order(truth, truth, metric="ssim")
  with pytest.raises(ValueError, match="both"):
    metrics.score(truth, truth, labels=[0, 1, 2, 3, 4])
  with pytest.raises(ValueError, match="Length"):
    metrics.score(truth, truth, labels=[0, 1], labels_true=[0, 1, 2, 3, 4])


def test_psnr_unclamped_is_scikit_images_psnr_of_the_raw_reconstruction(truth, recon):
  """One σ: scikit-image's PSNR of the unclamped images (``recon`` leaves [0, 1] by noise); in range
  it equals :func:`psnr`; a pixel far out of range costs here what clamping hides."""
  want = [sk_psnr(t, r, data_range=1) for r, t in zip(recon, truth)]
  for std in (1.0, 0.25):  # one σ cancels
    np.testing.assert_allclose(metrics.psnr_unclamped(recon, truth, std), want, rtol=0, atol=1e-10)
  assert np.all(metrics.psnr_unclamped(recon[:3], truth[:3]) < metrics.psnr(recon[:3], truth[:3]))
  np.testing.assert_allclose(metrics.psnr_unclamped(recon[3:], truth[3:]),
                             metrics.psnr(recon[3:], truth[3:]), rtol=1e-12)  # blurred: in range
  far = truth[:1].copy()
  far[0, 0, 0, 0] = 40.0  # one pixel 40 above the peak: mse = 40² / (32·32·3) without the clamp
  err = (40.0 - truth[0, 0, 0, 0]) ** 2 / truth[0].size
  np.testing.assert_allclose(metrics.psnr_unclamped(far, truth[:1]), [10 * np.log10(1 / err)], rtol=1e-12)


def test_psnr_unclamped_per_channel_std_is_the_inverting_gradients_codes(truth, recon):
  """Per-channel σ: normalise both images with a mean and σ, take the error, and average over channels
  10 log10(σ_c⁻² / error) (their ``psnr(output, ground_truth, factor=1/ds)``), in a plain NumPy loop."""
  mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
  got = metrics.psnr_unclamped(recon, truth, std)
  for n in range(len(recon)):
    err, count = 0.0, 0
    for c in range(3):
      a = (recon[n, ..., c] - mean[c]) / std[c]
      b = (truth[n, ..., c] - mean[c]) / std[c]
      err += np.sum((a - b) ** 2)
      count += a.size
    err /= count
    want = np.mean([10 * np.log10((1 / std[c]) ** 2 / err) for c in range(3)])
    np.testing.assert_allclose(got[n], want, rtol=1e-12)
  with pytest.raises(ValueError, match="std"):
    metrics.psnr_unclamped(recon, truth, [0.2, 0.0, 0.2])
  with pytest.raises(ValueError, match="NaN"):
    metrics.psnr_unclamped(np.full_like(recon, np.nan), truth)
  with pytest.raises(ValueError, match="Shape"):
    metrics.psnr_unclamped(recon[:, :16], truth)


def test_psnr_std_is_the_standard_psnr_with_peak_one_over_sigma(truth, recon):
  """One σ: the closed form psnr + 20 log10(1/σ); per-channel σ: a NumPy loop over pixels."""
  sigma = 0.2673
  np.testing.assert_allclose(metrics.psnr_std(recon, truth, sigma),
                             metrics.psnr(recon, truth) + 20 * np.log10(1 / sigma), rtol=1e-12)
  std = np.array([0.2673, 0.2564, 0.2762])
  x, t = np.clip(recon, 0, 1), np.clip(truth, 0, 1)
  for n in range(len(x)):
    total = 0.0
    for c in range(3):
      total += np.sum((std[c] * (x[n, ..., c] - t[n, ..., c])) ** 2)
    want = 10 * np.log10(x[n].size / total)
    np.testing.assert_allclose(metrics.psnr_std(recon, truth, std)[n], want, rtol=1e-10)
  with pytest.raises(ValueError, match="std"):
    metrics.psnr_std(recon, truth, 0.0)
