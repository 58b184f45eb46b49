"""Reconstruction-quality metrics for gradient-inversion attacks.

All functions run on the host: they take NumPy (or JAX) arrays, compute in
float64 and return NumPy arrays or plain Python numbers.

Conventions
-----------
* Images are NHWC float arrays meant to lie in ``[0, 1]``. Callers denormalise
  first (undo the dataset mean/std normalisation).
* Every image metric (``mse``, ``psnr``, ``ssim``) is computed on images
  **clamped to [0, 1]**, per image, and batch figures are plain means of the
  per-image values. Clamping matches what a rendered reconstruction shows and
  keeps ``data_range = 1`` honest. ``psnr_unclamped`` alone scores the
  reconstruction as the attack left it (the Inverting Gradients code's PSNR).
* An exact match has infinite PSNR; it is reported as ``PSNR_CAP = 100.0`` dB
  (PSNR is capped at that value), so results stay finite and JSON-friendly.
* SSIM equals ``skimage.metrics.structural_similarity(a, b, data_range=1,
  channel_axis=-1)``: 7x7 uniform window, K1 = 0.01, K2 = 0.03, sample
  covariance, a (win - 1) / 2 border cropped before the mean, channels
  averaged. Images smaller than 7 px use the largest odd window
  ``<= min(H, W)`` (skimage would raise; pass that ``win_size`` to skimage to
  get the same number). Images smaller than 3x3 are rejected.
* A batch of reconstructions comes back in arbitrary order, so ``score``
  first aligns it to the ground truth with the Hungarian algorithm on the
  pairwise MSE (``match_order``).
* Bad input (shape mismatch, empty batch, NaN/inf, a ground truth that is not floating point in
  [0, 1]) raises ``ValueError``.
* Text (:func:`score_text`): position-wise token accuracy and bag-of-words recall (multiset overlap)
  per sentence of token ids, after the same assignment on token accuracy.
"""

from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np

from gradjax.corpus import PAD

PSNR_CAP = 100.0

_K1 = 0.01
_K2 = 0.03
_WIN = 7


def _images(x, name: str) -> np.ndarray:
  """Validates an NHWC batch of floating-point images and returns it as float64 clamped to [0, 1]
  (an integer image, 0..255, would be clamped into a wrong score)."""
  if not np.issubdtype(np.asarray(x).dtype, np.floating):
    raise ValueError(f"{name} must be floating-point images in [0, 1], got {np.asarray(x).dtype} "
                     "(divide 8-bit images by 255)")
  return np.clip(_checked(x, name), 0.0, 1.0)


# How far outside [0, 1] a ground truth's pixels may lie (float rounding of a normalisation undone).
TRUTH_SLACK = 1e-3


def _truth(x_true) -> np.ndarray:
  """Validates a ground-truth batch: floating point in [0, 1] up to :data:`TRUTH_SLACK` (an image of
  0..255 or an integer one would be clamped into a wrong score); float64, clamped."""
  if not np.issubdtype(np.asarray(x_true).dtype, np.floating):
    raise ValueError(f"x_true must be floating-point images in [0, 1], got {np.asarray(x_true).dtype} "
                     "(divide 8-bit images by 255)")
  x_true = _checked(x_true, "x_true")
  low, high = float(x_true.min()), float(x_true.max())
  if low < -TRUTH_SLACK or high > 1 + TRUTH_SLACK:
    raise ValueError(f"x_true must lie in [0, 1] (denormalised), got values in [{low:.4g}, {high:.4g}]")
  return np.clip(x_true, 0.0, 1.0)


def _checked(x, name: str) -> np.ndarray:
  """Validates an NHWC batch of finite values and returns it as float64."""
  x = np.asarray(x, dtype=np.float64)
  if x.ndim != 4:
    raise ValueError(f"{name} must be NHWC (4-D), got shape {x.shape}.")
  if x.shape[0] == 0:
    raise ValueError(f"{name} is an empty batch.")
  if 0 in x.shape[1:]:
    raise ValueError(f"{name} has an empty spatial/channel axis: {x.shape}.")
  if x.shape[1] in (1, 3) and x.shape[3] > 4 and x.shape[2] > 4:
    # (N, C, H, W): scored as NHWC, SSIM's window would run over the channels.
    raise ValueError(f"{name} of shape {x.shape} looks channel-first (N, C, H, W); the metrics read "
                     "(N, H, W, C): transpose it with x.transpose(0, 2, 3, 1)")
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{name} contains NaN or inf.")
  return x


def _per_channel(std, channels: int) -> np.ndarray:
  """σ (one value or one per channel) as (C,) float64; a one-line ValueError for another count."""
  std = np.asarray(std, np.float64).reshape(-1)
  if std.size not in (1, channels):
    raise ValueError(f"std must be one value or one per channel ({channels}), got {std.size}")
  return np.broadcast_to(std, (channels,))


def _pair(x, x_true) -> tuple[np.ndarray, np.ndarray]:
  x, x_true = _images(x, "x"), _truth(x_true)
  if x.shape != x_true.shape:
    raise ValueError(f"Shape mismatch: x {x.shape} vs x_true {x_true.shape}.")
  return x, x_true


def _psnr_from_mse(m: np.ndarray) -> np.ndarray:
  with np.errstate(divide="ignore"):
    p = 10.0 * np.log10(1.0 / m)
  return np.minimum(p, PSNR_CAP)


def mse(x, x_true) -> np.ndarray:
  """Per-image mean squared error on clamped images.

  ``mse_n = mean_{h,w,c} (clip(x)_nhwc - clip(x_true)_nhwc)^2``

  Args:
    x: reconstructions, (N, H, W, C), values nominally in [0, 1].
    x_true: ground truth, same shape.

  Returns:
    (N,) float64.
  """
  x, x_true = _pair(x, x_true)
  return np.mean((x - x_true) ** 2, axis=(1, 2, 3))


def psnr(x, x_true) -> np.ndarray:
  """Per-image peak signal-to-noise ratio in dB, peak 1, capped.

  ``psnr_n = min(10 log10(1 / mse_n), PSNR_CAP)`` with ``mse_n`` from ``mse``
  (clamped images). Equals ``skimage.metrics.peak_signal_noise_ratio(
  x_true[n], x[n], data_range=1)`` on in-range images.

  Args:
    x: reconstructions, (N, H, W, C).
    x_true: ground truth, same shape.

  Returns:
    (N,) float64; exact matches give ``PSNR_CAP``.
  """
  return _psnr_from_mse(mse(x, x_true))



def psnr_std(x, x_true, std) -> np.ndarray:
  """PSNR with the peak of std-normalised images, the form the DLM paper reports.

  ``10 log10(1 / mean_{h,w,c}(σ_c² (clip(x) − clip(x_true))²))`` (capped): the error is measured on
  [0, 1] images but the peak is the range 1/σ of normalised images. For one σ this is
  ``psnr + 20 log10(1 / σ)``, about 11.5 dB above :func:`psnr` for CIFAR-100's σ ≈ 0.267.

  Args:
    x, x_true: (N, H, W, C) in [0, 1].
    std: σ, a scalar or per channel (C,).

  Returns:
    (N,) float64.
  """
  x, x_true = _pair(x, x_true)
  std = _per_channel(std, x.shape[-1])
  if not np.all(std > 0):
    raise ValueError(f"std must be positive, got {std}")
  return _psnr_from_mse(np.mean(((x - x_true) * std) ** 2, axis=(1, 2, 3)))


def psnr_unclamped(x, x_true, std=1.0) -> np.ndarray:
  """PSNR of the reconstruction as it came out of the attack, not clamped: the measure of the Inverting
  Gradients code (Geiping et al. 2020; their ``metrics.psnr(output, ground_truth, factor=1/ds)`` on
  normalised tensors), which its Table 1 reports.

  ``psnr_n = mean_c 10 log10(1 / (σ_c² e_n))``, ``e_n = mean_{h,w,c'} ((x − x_true)_{nhwc'} / σ_{c'})²``
  (capped): the error is measured on normalised images and the peak of channel c is 1/σ_c, the dB
  averaged over channels. For one σ this is the plain PSNR of unclamped images, ``10 log10(1 / mse)``.
  It equals :func:`psnr` when ``x`` lies in [0, 1] and std is one value; an unboxed attack whose pixels
  leave [0, 1] scores lower here than there.

  Args:
    x: reconstructions in pixel space, (N, H, W, C), any finite values.
    x_true: ground truth, same shape, in [0, 1].
    std: σ, a scalar or per channel (C,): the client's normalisation.

  Returns:
    (N,) float64.
  """
  x, x_true = _checked(x, "x"), _truth(x_true)
  if x.shape != x_true.shape:
    raise ValueError(f"Shape mismatch: x {x.shape} vs x_true {x_true.shape}.")
  std = _per_channel(std, x.shape[-1])
  if not np.all(std > 0):
    raise ValueError(f"std must be positive, got {std}")
  e = np.mean(((x - x_true) / std) ** 2, axis=(1, 2, 3))
  with np.errstate(divide="ignore"):
    p = np.mean(10.0 * np.log10(1.0 / (std[None, :] ** 2 * e[:, None])), axis=1)
  return np.minimum(p, PSNR_CAP)


def ssim_window(h: int, w: int) -> int:
  """SSIM's window side for (h, w) images (:func:`ssim`), or a one-line ValueError below 3x3."""
  win = min(_WIN, h, w)
  win -= 1 - win % 2  # largest odd value <= min(7, H, W)
  if win < 3:
    raise ValueError(f"SSIM needs images of at least 3x3 pixels, got {h}x{w}.")
  return win


def ssim(x, x_true) -> np.ndarray:
  """Per-image structural similarity (Wang et al., 2004), skimage defaults.

  For each channel, with local statistics from a ``win x win`` uniform filter
  (``win = 7``, or the largest odd value ``<= min(H, W)`` for small images)
  and sample covariance (factor ``win^2 / (win^2 - 1)``)::

    S = (2 mu_x mu_y + C1)(2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(s_x^2 + s_y^2 + C2))

  with ``C1 = (0.01)^2``, ``C2 = (0.03)^2`` (data range 1). ``S`` is averaged
  over the map after cropping a ``(win - 1) / 2`` border, then over channels.
  Matches ``skimage.metrics.structural_similarity(x_true[n], x[n],
  data_range=1, channel_axis=-1, win_size=win)``.

  Reference: Z. Wang, A. C. Bovik, H. R. Sheikh, E. P. Simoncelli, "Image
  quality assessment: from error visibility to structural similarity", IEEE
  TIP 13(4), 2004.

  Args:
    x: reconstructions, (N, H, W, C); clamped to [0, 1].
    x_true: ground truth, same shape.

  Returns:
    (N,) float64.
  """
  x, y = _pair(x, x_true)
  win = ssim_window(x.shape[1], x.shape[2])
  filt = lambda a: _box_mean(a, win)
  cov_norm = win**2 / (win**2 - 1)
  ux, uy = filt(x), filt(y)
  vx = cov_norm * (filt(x * x) - ux * ux)
  vy = cov_norm * (filt(y * y) - uy * uy)
  vxy = cov_norm * (filt(x * y) - ux * uy)
  c1, c2 = _K1**2, _K2**2
  s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / (
      (ux**2 + uy**2 + c1) * (vx + vy + c2))
  return s.mean(axis=(1, 2)).mean(axis=-1)


def _box_mean(a: np.ndarray, win: int) -> np.ndarray:
  """The mean of every ``win x win`` window of ``a`` (N, H, W, C) that lies inside the image:
  (N, H - win + 1, W - win + 1, C), by differences of cumulative sums along H, then W. These are
  the windows centred on the pixels that SSIM keeps after cropping its ``(win - 1) / 2`` border,
  so no boundary rule enters (skimage filters with scipy's 'reflect' and crops the same border)."""
  for axis in (1, 2):
    c = np.cumsum(a, axis=axis)
    zero = np.zeros_like(np.take(c, [0], axis=axis))
    c = np.concatenate([zero, c], axis=axis)
    a = (np.take(c, range(win, c.shape[axis]), axis=axis) -
         np.take(c, range(c.shape[axis] - win), axis=axis))
  return a / win**2


def label_accuracy(pred, true) -> float:
  """Order-free label accuracy (multiset overlap).

  ``acc = sum_c min(#pred == c, #true == c) / len(true)``

  Example: pred [1, 1, 2], true [1, 2, 2] -> (1 + 1) / 3.

  Args:
    pred: (N,) integer labels recovered by the attack.
    true: (N,) integer ground-truth labels.

  Returns:
    Python float in [0, 1].
  """
  pred, true = np.asarray(pred), np.asarray(true)
  for name, a in (("pred", pred), ("true", true)):
    if a.ndim != 1:
      raise ValueError(f"{name} must be 1-D, got shape {a.shape}.")
    if a.size and not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"{name} must hold integer labels, got {a.dtype}.")
  if len(pred) != len(true):
    raise ValueError(f"Length mismatch: pred {len(pred)} vs true {len(true)}.")
  if len(true) == 0:
    raise ValueError("Empty label arrays.")
  return _bag(pred, true)


def _linear_sum_assignment(cost):
  """``scipy.optimize.linear_sum_assignment``, imported on first use: scipy.optimize is slow to
  import and a batch of one, the command line's default, never needs it."""
  from scipy.optimize import linear_sum_assignment
  return linear_sum_assignment(cost)


def match_order(x, x_true, metric: str = "mse") -> np.ndarray:
  """Permutation aligning a batch of reconstructions with the ground truth.

  Solves the linear assignment problem (Hungarian algorithm, Kuhn 1955;
  ``scipy.optimize.linear_sum_assignment``)::

    perm = argmin_{p in S_N} sum_j cost(x[p_j], x_true[j])

  with ``cost = mse`` (``metric="mse"``) or ``-psnr`` (``metric="psnr"``),
  both on clamped images.

  Args:
    x: reconstructions, (N, H, W, C).
    x_true: ground truth, same shape.
    metric: "mse" or "psnr".

  Returns:
    (N,) int64 ``perm`` such that ``x[perm]`` is best aligned with ``x_true``.
  """
  if metric not in ("mse", "psnr"):
    raise ValueError(f"metric must be 'mse' or 'psnr', got {metric!r}.")
  x, x_true = _pair(x, x_true)
  # cost[j, i]: recon i scored against truth j.
  cost = np.stack([np.mean((x - t) ** 2, axis=(1, 2, 3)) for t in x_true])
  if metric == "psnr":
    cost = -_psnr_from_mse(cost)
  _, perm = _linear_sum_assignment(cost)
  return perm.astype(np.int64)


def score(
    x,
    x_true,
    labels: Optional[Sequence[int]] = None,
    labels_true: Optional[Sequence[int]] = None,
    *,
    match: bool = True,
) -> dict[str, Any]:
  """All metrics for one attack result, as JSON-serialisable Python types.

  When ``match`` and N > 1, ``x`` is first reordered by ``match_order(x,
  x_true, "mse")``; the label accuracy is order-free and needs no reordering.

  Args:
    x: reconstructions, (N, H, W, C), in [0, 1] space.
    x_true: ground truth, same shape.
    labels: optional (N,) recovered labels; give both or neither.
    labels_true: optional (N,) true labels.
    match: align the batch order before scoring.

  Returns:
    dict with "psnr", "ssim", "mse" (batch means), "psnr_per_image",
    "ssim_per_image", "mse_per_image" (lists, in ground-truth order),
    "order" (list of ints, ``x[order]`` was scored; identity if no matching),
    "psnr_mean_colour_per_image" (:func:`mean_colour_psnr`: what each true image's own mean colour
    scores, the verdict's floor) and "label_accuracy" (float, or None without labels).
  """
  if (labels is None) != (labels_true is None):
    raise ValueError("Give both labels and labels_true, or neither.")
  xv, tv = _pair(x, x_true)
  n = xv.shape[0]
  order = match_order(xv, tv) if (match and n > 1) else np.arange(n)
  xv = xv[order]
  m, s = mse(xv, tv), ssim(xv, tv)
  p = _psnr_from_mse(m)
  acc = None if labels is None else label_accuracy(labels, labels_true)
  return {
      "psnr": float(p.mean()),
      "ssim": float(s.mean()),
      "mse": float(m.mean()),
      "psnr_per_image": [float(v) for v in p],
      "ssim_per_image": [float(v) for v in s],
      "mse_per_image": [float(v) for v in m],
      "order": [int(i) for i in order],
      "psnr_mean_colour_per_image": [float(v) for v in mean_colour_psnr(tv)],
      "label_accuracy": acc,
  }


def mean_colour_psnr(x_true) -> np.ndarray:
  """(N,) PSNR of each image's own mean colour against it: what a reconstruction that knows
  nothing but the average colour scores (:func:`psnr`)."""
  x_true = np.asarray(x_true, np.float64)
  return psnr(np.broadcast_to(x_true.mean(axis=(1, 2), keepdims=True), x_true.shape), x_true)


# --- text -----------------------------------------------------------------------------------------


def _sentences(pred, true) -> tuple[np.ndarray, np.ndarray]:
  pred, true = np.asarray(pred), np.asarray(true)
  for name, a in (("pred", pred), ("true", true)):
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"{name} must be (N, T) integer token ids, got {a.dtype} {a.shape}.")
  if pred.shape != true.shape:
    raise ValueError(f"Shape mismatch: pred {pred.shape} vs true {true.shape}.")
  if true.size == 0:
    raise ValueError("Empty sentences.")
  return pred, true


def token_accuracy(pred, true) -> np.ndarray:
  """Position-wise token accuracy per sentence: ``acc_n = (1/T) Σ_t [pred_nt = true_nt]``. Of padded
  sentences (:data:`gradjax.corpus.PAD` past their ends) over the positions that either holds a
  token: ``Σ_t [pred_nt = true_nt ≠ PAD] / #{t : pred_nt ≠ PAD or true_nt ≠ PAD}``, so a sentence
  read too short or too long loses the positions it misses or adds.

  Args:
    pred, true: (N, T) integer token ids.

  Returns:
    (N,) float64 in [0, 1].
  """
  pred, true = _sentences(pred, true)
  either = (pred != PAD) | (true != PAD)
  count = np.sum(either, axis=1)
  hits = np.sum((pred == true) & either, axis=1, dtype=np.float64)
  return np.where(count == 0, 1.0, hits / np.maximum(count, 1))  # two empty sentences agree


def bag_recall(pred, true) -> np.ndarray:
  """Bag-of-words recall per sentence, order-free and with multiplicity:
  ``recall_n = Σ_v min(#v in pred_n, #v in true_n) / T`` (T: true_n's tokens, :data:`PAD` left out).

  Example: pred [a, a, b], true [a, b, b] -> (1 + 1) / 3.

  Args:
    pred, true: (N, T) integer token ids.

  Returns:
    (N,) float64 in [0, 1].
  """
  pred, true = _sentences(pred, true)
  return np.asarray([_bag(p[p != PAD], t[t != PAD]) for p, t in zip(pred, true)], np.float64)


def _bag(pred, true) -> float:
  """Σ_v min(#v in ``pred``, #v in ``true``) / len(``true``) of two token sequences."""
  if len(true) == 0:  # nothing to recall
    return 1.0
  cp, ct = Counter(np.asarray(pred).tolist()), Counter(np.asarray(true).tolist())
  return sum(min(n, cp[c]) for c, n in ct.items()) / len(true)


def word_recall(words, true) -> np.ndarray:
  """Word recall per sentence of a set of words found without their places or counts (e.g. the
  union of the span attack's position sets, :class:`gradjax.dager.Unreadable`):
  ``recall_n = #{t : true_nt ∈ words} / T``, the share of sentence n's tokens (:data:`PAD` left
  out) whose word is in the set. Unlike :func:`bag_recall` it does not count a word once per occurrence found: a larger set
  can only raise it (every word of the vocabulary gives 1), so it means something only against a
  guess of as many words (:func:`gradjax.corpus.frequent_words`).

  Example: words {a, c}, true [a, b, a] -> 2 / 3.

  Args:
    words: (K,) integer token ids (repeats do not count).
    true: (N, T) integer token ids.

  Returns:
    (N,) float64 in [0, 1].
  """
  true = np.asarray(true)
  if true.ndim != 2 or true.shape[1] < 1:
    raise ValueError(f"sentences must be (N, T) token ids with T >= 1, got shape {true.shape}")
  real = true != PAD
  found = np.isin(true, np.asarray(words).reshape(-1)) & real
  return np.sum(found, axis=1, dtype=np.float64) / np.maximum(np.sum(real, axis=1), 1)


def _ngrams(tokens, n: int) -> Counter:
  return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _f1(overlap: float, predicted: int, reference: int) -> float:
  if overlap == 0:
    return 0.0
  precision, recall = overlap / predicted, overlap / reference
  return 2 * precision * recall / (precision + recall)


def _tokens(sentence) -> list:
  """A token sequence as a list, :data:`gradjax.corpus.PAD` left out."""
  sentence = np.asarray(sentence).reshape(-1)
  return sentence[sentence != PAD].tolist()


def rouge_n(pred, true, n: int) -> float:
  """ROUGE-n F-measure of one sentence (Lin 2004): with clipped n-gram overlap
  O = Σ_g min(#g in pred, #g in true), P = O / #n-grams of pred, R = O / #n-grams of true,
  F = 2PR / (P + R); 0 where either has no n-gram. ``pred``, ``true``: token sequences
  (:data:`gradjax.corpus.PAD` left out)."""
  pred, true = _tokens(pred), _tokens(true)
  a, b = _ngrams(pred, n), _ngrams(true, n)
  return _f1(sum((a & b).values()), sum(a.values()), sum(b.values()))


def rouge_l(pred, true) -> float:
  """ROUGE-L F-measure of one sentence: the longest common subsequence L of the two token sequences,
  P = L / len(pred), R = L / len(true), F = 2PR / (P + R) (:data:`gradjax.corpus.PAD` left out)."""
  pred, true = _tokens(pred), _tokens(true)
  row = [0] * (len(true) + 1)
  for p in pred:  # dynamic programme over prefixes, one row at a time
    previous = 0
    for j, t in enumerate(true):
      current = row[j + 1]
      row[j + 1] = previous + 1 if p == t else max(row[j + 1], row[j])
      previous = current
  return _f1(row[-1], len(pred), len(true))


def score_text(pred, true, *, match: bool = True) -> dict[str, Any]:
  """Text metrics of one attack, as JSON-serialisable Python types.

  ``pred`` may hold another number of sentences K than ``true`` holds (N): an exact attack returns the
  distinct sentences it found. When ``match`` and N > 1 or K != N, the recovered sentences are first
  assigned to the true ones so that the total token accuracy is largest
  (``scipy.optimize.linear_sum_assignment``, as :func:`score` does for images); a true sentence left
  without one scores 0 and extra recovered sentences are counted, not scored.

  Args:
    pred: (K, T) integer token ids; true: (N, T). Padded sentences hold :data:`gradjax.corpus.PAD`
      past their ends; every score reads their tokens only.

  Returns:
    dict with means over the true sentences of "token_accuracy", "bag_recall", "rouge1", "rouge2",
    "rougeL" (F-measures), the per-sentence token accuracy, bag recall and ROUGE-L lists (in
    ground-truth order), "exact" (true sentences recovered entirely), "unmatched" (recovered sentences assigned
    to none) and "order" (``pred[order[j]]`` was scored against ``true[j]``, -1 for none).
  """
  pred, true = np.asarray(pred), np.asarray(true)
  for name, a in (("pred", pred), ("true", true)):
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"{name} must be (N, T) integer token ids, got {a.dtype} {a.shape}.")
  if true.size == 0:
    raise ValueError("Empty sentences.")
  if pred.shape[1] != true.shape[1]:
    raise ValueError(f"Length mismatch: pred {pred.shape} vs true {true.shape}.")
  n, k = true.shape[0], pred.shape[0]
  order = np.full(n, -1)
  if k and match and (n > 1 or k != n):
    gain = np.stack([token_accuracy(pred, np.broadcast_to(t, pred.shape)) for t in true])
    rows, cols = _linear_sum_assignment(-gain)
    order[rows] = cols
  elif k:
    order[:min(n, k)] = np.arange(min(n, k))
  scored = order >= 0
  def per(fn):
    return np.asarray([fn(pred[order[j]], true[j]) if scored[j] else 0.0 for j in range(n)], np.float64)
  acc = per(lambda p, t: float(token_accuracy(p[None], t[None])[0]))
  recall = per(lambda p, t: float(bag_recall(p[None], t[None])[0]))
  lcs = per(rouge_l)
  return {
      "token_accuracy": float(acc.mean()),
      "bag_recall": float(recall.mean()),
      "rouge1": float(per(lambda p, t: rouge_n(p, t, 1)).mean()),
      "rouge2": float(per(lambda p, t: rouge_n(p, t, 2)).mean()),
      "rougeL": float(lcs.mean()),
      "token_accuracy_per_sentence": [float(v) for v in acc],
      "bag_recall_per_sentence": [float(v) for v in recall],
      "rougeL_per_sentence": [float(v) for v in lcs],
      "exact": int(np.sum(acc == 1.0)),
      "unmatched": int(k - scored.sum()),
      "order": [int(i) for i in order],
  }
