"""Real image datasets as numpy arrays, and explicit input normalisation.

`load` returns a `Dataset`: float32 images (N, H, W, C) in [0, 1] and int64 labels (N,). Normalisation is never
applied implicitly; use `normalize` / `denormalize` with a `Normalization` from `normalization`.

Sources (see `load` for details): photos bundled with scikit-image ("skimage", "lfw_subset"), scikit-learn's
"digits", files in a data folder ("mnist", "cifar10", "cifar100", "lfw", "folder"), and TensorFlow Datasets
("tfds:<name>"). `default_data_dir` locates the data folder.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import io
import math
import os
import re
import struct
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import numpy as np
import skimage
import skimage.color
import skimage.data
from PIL import Image

from gradjax import files, pickled

DATASETS = ("skimage", "lfw_subset", "digits", "mnist", "cifar10", "cifar10_train", "cifar100", "lfw",
            "folder")
"""Names accepted by `load`; "tfds:<name>" is accepted as well."""

SKIMAGE_PHOTOS = (
    # Colour photos.
    "astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field", "colorwheel",
    # Grayscale photos, repeated to RGB.
    "camera", "coins", "moon", "brick", "grass", "gravel", "clock", "page", "text",
)  # fmt: skip

# The files of SKIMAGE_PHOTOS in scikit-image's data folder where not NAME.png, decoded with PIL:
# skimage.data's loaders read them through skimage.io, whose backends take longer to import than
# the main job's photo to load; the arrays are the same (tests/test_data.py).
_SKIMAGE_FILES = {"rocket": "rocket.jpg", "immunohistochemistry": "ihc.png",
                  "hubble_deep_field": "hubble_deep_field.jpg", "colorwheel": "color.png",
                  "clock": "clock_motion.png"}

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table",
    "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

_DIGITS = tuple(str(i) for i in range(10))
_IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff")


class Dataset(NamedTuple):
  """A batch of labelled images.

  Attributes:
    x: float32 (N, H, W, C) images in [0, 1].
    y: int64 (N,) labels in [0, num_classes).
    num_classes: number of classes of the source.
    name: the name given to `load`.
    class_names: names indexed by label, or None. For "skimage" (whose photos have no classes) the names of
      the loaded photos instead, aligned with `x`.
  """

  x: np.ndarray
  y: np.ndarray
  num_classes: int
  name: str
  class_names: tuple[str, ...] | None = None


class Normalization(NamedTuple):
  """Per-channel mean and std; a single value applies to every channel."""

  mean: tuple[float, ...]
  std: tuple[float, ...]


_NORMALIZATIONS = {
  "none": Normalization((0.0,), (1.0,)),
  "cifar10": Normalization((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  "cifar100": Normalization((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  "mnist": Normalization((0.1307,), (0.3081,)),
  "imagenet": Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


NORMALIZATION_NAMES = tuple(_NORMALIZATIONS)

# Constants clients commonly use that differ from the named ones (as MEAN/STD specs), which a check
# of a capture tries as well (gradjax.fidelity.alternatives).
COMMON_NORMALIZATIONS = (
    "0.4914,0.4822,0.4465/0.2023,0.1994,0.2010",  # CIFAR-10 with the std of kuangliu/pytorch-cifar
    "0.5,0.5,0.5/0.5,0.5,0.5",                    # PyTorch's CIFAR-10 tutorial: [-1, 1]
    "0.5/0.5",                                    # the same for one channel (MNIST tutorials)
    "0.5071,0.4867,0.4408/0.2675,0.2565,0.2761",  # CIFAR-100 as widely copied
)


def normalization(spec: str) -> Normalization:
  """The normalisation ``spec`` names: "none", "cifar10", "cifar100", "mnist" or "imagenet", or a
  client's own per-channel statistics as ``"MEAN/STD"``, comma-separated values each (one value
  applies to every channel), e.g. ``"0.5,0.5,0.5/0.5,0.5,0.5"`` for PyTorch's
  ``transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))``."""
  spec = str(spec).strip()
  if spec in _NORMALIZATIONS:
    return _NORMALIZATIONS[spec]
  if "/" not in spec:
    raise ValueError(f"unknown normalization {spec!r}; expected one of {', '.join(_NORMALIZATIONS)} "
                     "or MEAN/STD, e.g. 0.5,0.5,0.5/0.25,0.25,0.25")
  mean, std = spec.split("/", 1)
  try:
    values = [tuple(float(v) for v in part.split(",")) for part in (mean, std)]
  except ValueError:
    raise ValueError(f"normalization {spec!r}: MEAN/STD takes comma-separated numbers") from None
  norm = Normalization(*values)
  if len(norm.mean) != len(norm.std):
    raise ValueError(f"normalization {spec!r} has {len(norm.mean)} means but {len(norm.std)} stds")
  if not all(np.isfinite(norm.mean)) or not all(np.isfinite(v) and v > 0 for v in norm.std):
    raise ValueError(f"normalization {spec!r}: means must be finite and stds positive")
  return norm


def _stats(norm: Normalization, channels: int):
  """Mean and std broadcastable against (..., channels); Python floats when a single value is given."""
  if len(norm.mean) != len(norm.std):
    raise ValueError(f"normalization has {len(norm.mean)} means but {len(norm.std)} stds")
  if not all(math.isfinite(v) for v in (*norm.mean, *norm.std)) or min(norm.std) <= 0:
    raise ValueError(f"normalization needs finite means and positive stds, got {norm}")
  if len(norm.mean) == 1:
    return norm.mean[0], norm.std[0]
  if len(norm.mean) != channels:
    raise ValueError(f"normalization has {len(norm.mean)} channel values but x has {channels} channels")
  return np.asarray(norm.mean, np.float32), np.asarray(norm.std, np.float32)


def normalize(x, norm: Normalization):
  """Returns (x - mean) / std over the last (channel) axis of x (..., C); numpy or jax arrays, jit-safe."""
  x = x if hasattr(x, "shape") else np.asarray(x, np.float32)  # a nested list
  mean, std = _stats(norm, x.shape[-1])
  return (x - mean) / std


def denormalize(x, norm: Normalization):
  """Inverse of `normalize`: x * std + mean over the last (channel) axis."""
  x = x if hasattr(x, "shape") else np.asarray(x, np.float32)
  mean, std = _stats(norm, x.shape[-1])
  return x * std + mean


def default_data_dir() -> str | None:
  """$GRADJAX_DATA_DIR if set, else `shared/data` beside the repository if it exists, else None."""
  if os.environ.get("GRADJAX_DATA_DIR"):
    return os.environ["GRADJAX_DATA_DIR"]
  shared = Path(__file__).resolve().parents[2] / "shared" / "data"
  return str(shared) if shared.is_dir() else None


def load(
  name: str,
  *,
  data_dir: str | None = None,
  indices: int | Sequence[int] | None = None,
  image_size: tuple[int, int] | None = None,
  channels: int | None = None,
) -> Dataset:
  """Loads images `indices` of dataset `name`.

  Sources (all real images):
    "skimage": 16 photos bundled with scikit-image (`SKIMAGE_PHOTOS`; grayscale ones repeated to RGB),
      centre-cropped to squares, default image_size (32, 32). They have no classes: photo i gets the arbitrary
      but deterministic label i % 10 (num_classes 10) so a client can compute a loss; pass your own labels
      where they matter.
    "lfw_subset": scikit-image's 200 25x25 gray patches; label 1 for the first 100 (faces), 0 for the rest.
    "digits": scikit-learn's 1797 8x8 digits (needs scikit-learn).
    "mnist": the 10000 test images, from IDX files t10k-{images-idx3,labels-idx1}-ubyte[.gz] in
      data_dir/mnist or data_dir.
    "cifar10" / "cifar100": test images, from cifar10/cifar10_test_prefix.npz (cifar100/cifar100_test_prefix.npz,
      fine labels) or from the python pickle cifar-10-batches-py/test_batch (cifar-100-python/test) under data_dir.
    "cifar10_train": the 50000 CIFAR-10 training images in canonical order, decoded from the JPEG copies
      (quality 75, about 30.5 dB from the canonical pixels: for training models, not for scoring
      reconstructions) in cifar10/cifar10_train_jpeg.tar.gz, ordered by cifar10/cifar10_train_labels.npz.
    "lfw": 80x80 LFW photos in data_dir/lfw/lfw_5590_80px.tar, sorted by file name; label = identity.
    "folder": images in data_dir, sorted; with subfolders, one class per subfolder (sorted), else label 0.
    "tfds:<name>": split "test" of a TensorFlow Datasets dataset (needs tensorflow-datasets); data_dir is
      passed to tfds as is.

  Args:
    name: one of `DATASETS` or "tfds:<name>".
    data_dir: data folder; `default_data_dir()` when None (except for "folder" and "tfds:").
    indices: an int, a sequence of ints, or None for all images. An int gives a batch of one.
    image_size: (H, W) to resize to (anti-aliased, clipped to [0, 1]), an int for a square, or None
      for the native size.
    channels: 1 (luminance of RGB), 3 (gray repeated) or None for the native channels.

  Returns:
    A `Dataset` with x float32 (N, H, W, C) in [0, 1] and y int64 (N,).
  """
  if channels not in (None, 1, 3):
    raise ValueError(f"channels must be 1, 3 or None, got {channels!r}")
  if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
    image_size = (int(image_size), int(image_size))  # a square
  if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
    raise ValueError(f"image_size must be (height, width) with positive sizes, got {image_size!r}")
  try:
    if name.startswith("tfds:"):
      images, y, num_classes, class_names = _load_tfds(name[len("tfds:") :], data_dir, indices)
    elif name == "skimage":  # resized here, once per photo and size
      idx = _select(indices, len(SKIMAGE_PHOTOS), "skimage")
      images = [_skimage_photo(int(i), tuple(image_size or (32, 32))) for i in idx]
      y, num_classes, class_names = idx % 10, 10, tuple(SKIMAGE_PHOTOS[i] for i in idx)
      image_size = None
    elif name in _SOURCES:
      images, y, num_classes, class_names = _SOURCES[name](data_dir, indices)
    else:
      raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)} or tfds:<name>")
    x = _finish(images, image_size, channels)
  except MemoryError as e:  # a size no machine holds (a typo): the size, not a traceback
    raise ValueError(f"{name}: the images{f' at {image_size[0]}x{image_size[1]}' if image_size else ''} "
                     f"do not fit in memory: {e}") from None
  return Dataset(x, np.asarray(y, np.int64), num_classes, name, class_names)


def count(name: str, *, data_dir: str | None = None) -> int | None:
  """The number of images of dataset ``name`` where it is known without decoding them
  ("skimage": its list; "cifar10_train": the length of its label file), else None
  (``len(load(name).y)`` then)."""
  if name == "skimage":
    return len(SKIMAGE_PHOTOS)
  if name == "cifar10_train":
    return len(_cifar10_train_order(data_dir)[0])
  return None


def _mirror(index: np.ndarray, n: int) -> np.ndarray:
  """Indices reflected about the first and last pixels' centres (-1 -> 1, n -> n - 2): numpy's
  "reflect" padding, scipy.ndimage's "mirror" mode."""
  if n == 1:
    return np.zeros_like(index)
  index = np.abs(index) % (2 * n - 2)
  return np.where(index >= n, 2 * n - 2 - index, index)


def resize(img: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
  """A float32 (H, W, C) image anti-aliased to ``image_size`` (H', W'), clipped to [0, 1].

  scikit-image's ``transform.resize(img, (H', W', C), anti_aliasing=True)``, computed here without
  scipy's import: per axis a Gaussian of ``sigma = max(0, (f - 1) / 2)``, ``f = H / H'``, truncated
  at ``int(4 sigma + 0.5)`` pixels (mirror boundary), each pass rounded to float32 as scipy's
  ``gaussian_filter`` stores it; then linear interpolation at ``(i + 0.5) f - 0.5`` (pixel centres,
  mirror boundary) in float64, and a clip to the input's range. Only the pixels the interpolation
  reads are filtered. Equal to scikit-image's bit for bit (tests/test_data.py).
  """
  x = np.asarray(img, np.float32)
  low, high = x.min(), x.max()
  reads = []  # per axis: each output's fraction, its lower and upper pixel's place in `pixels`
  for axis, size in enumerate(image_size):  # the Gaussians, each pass stored as float32
    n = x.shape[axis]
    f = n / size
    at = (np.arange(size) + 0.5) * f - 0.5
    if n == 1:  # the coordinate itself mirrored into [0, n - 1] first, as scipy does
      at = np.zeros_like(at)
    else:
      at = np.where(at < 0, -at, at)
      at = np.where(at > n - 1, 2 * n - 2 - at, at)
    below = np.floor(at).astype(np.int64)
    pixels = np.unique(np.concatenate([_mirror(below, n), _mirror(below + 1, n)]))
    reads.append((at - below, np.searchsorted(pixels, _mirror(below, n)),
                  np.searchsorted(pixels, _mirror(below + 1, n))))
    sigma = max(0.0, (f - 1) / 2)
    if sigma <= 1e-15:  # scipy.ndimage skips an axis of zero width
      x = np.take(x, pixels, axis=axis)
      continue
    radius = int(4.0 * sigma + 0.5)
    weights = np.exp(-0.5 / (sigma * sigma) * np.arange(-radius, radius + 1) ** 2)
    weights = (weights / weights.sum())[radius:]  # normalised over the whole window, as scipy
    shifted = [np.take(x, _mirror(pixels + j, n), axis=axis).astype(np.float64)
               for j in range(-radius, radius + 1)]
    total = shifted[radius] * weights[0]
    for j in range(1, radius + 1):  # scipy's order: the pair at -j and +j, then its weight
      total += (shifted[radius - j] + shifted[radius + j]) * weights[j]
    x = total.astype(np.float32)
  # Linear interpolation in float64, summed as scipy.ndimage.zoom does: over the corners in order
  # (last axis fastest), each pixel's value times its weight along each axis in turn.
  x, y = x.astype(np.float64), 0.0
  for corner in itertools.product((0, 1), repeat=len(reads)):
    term = x[np.ix_(*(read[1 + c] for read, c in zip(reads, corner)))]
    for axis, ((frac, _, _), c) in enumerate(zip(reads, corner)):
      term = term * (frac if c else 1 - frac).reshape((1,) * axis + (-1,) + (1,) * (x.ndim - axis - 1))
    y = y + term
  return np.clip(np.clip(np.asarray(y, np.float32), low, high), 0.0, 1.0)


def _finish(images, image_size, channels) -> np.ndarray:
  """Resizes and converts the channels of float (H, W, C) images; returns float32 (N, H', W', C')."""
  out = []
  for img in images:
    if image_size is not None:
      img = resize(img, image_size)
    if channels == 1 and img.shape[-1] == 3:
      img = skimage.color.rgb2gray(img)[..., None]
    elif channels == 3 and img.shape[-1] == 1:
      img = np.repeat(img, 3, axis=-1)
    out.append(img.astype(np.float32))
  shapes = sorted({img.shape for img in out})
  if len(shapes) > 1:
    raise ValueError(f"images have different shapes {shapes}; give them one (--image_size and "
                     "--config.data.channels; image_size= and channels= in gradjax.data.load)")
  return np.stack(out)


def _select(indices, n: int, name: str) -> np.ndarray:
  """Checks `indices` (int, sequence of ints or None = all) against n images; returns int (K,)."""
  if n == 0:
    raise ValueError(f"dataset {name!r} has no images")
  if indices is None:
    return np.arange(n)
  idx = np.atleast_1d(np.asarray(indices))
  if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
    raise ValueError(f"indices must be an int or a non-empty sequence of ints, got {type(indices).__name__}")
  bad = idx[(idx < 0) | (idx >= n)]
  if bad.size:
    raise ValueError(f"index {bad[0]} out of range for dataset {name!r} with {n} images")
  return idx


def _data_dir(data_dir: str | None, name: str, hint: str) -> Path:
  data_dir = data_dir or default_data_dir()
  if data_dir is None:
    raise ValueError(f"dataset {name!r} needs --data_dir (folder with {hint})")
  return Path(data_dir)


def _find(root: Path, candidates: Sequence[str], name: str) -> Path:
  """The first of `candidates` (paths relative to root) that is a file."""
  for candidate in candidates:
    if (root / candidate).is_file():
      return root / candidate
  raise FileNotFoundError(f"dataset {name!r}: none of {', '.join(candidates)} found in {root}")


def _decode(data: bytes, where: str, mode: str | None = None) -> np.ndarray:
  """Decodes image bytes to float32 (H, W, C) in [0, 1]: C = 1 for gray images, else 3 (or as `mode` says).
  16-bit gray images are divided by 65535; floating-point ones are refused (no known range)."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # large photos are resized
      with Image.open(io.BytesIO(data)) as img:
        if img.mode == "F":
          raise ValueError(f"image {where} holds floating-point pixels (PIL mode F), whose range is "
                           "unknown; give 8- or 16-bit images")
        if img.mode.startswith("I"):  # 16-bit gray (I;16*), or 32-bit integers holding them (I)
          x = np.asarray(img, np.float32)
          if x.min() < 0 or x.max() > 65535:
            raise ValueError(f"image {where} holds 32-bit pixel values beyond 16 bits; give 8- or "
                             "16-bit images")
          x = x[..., None] / 65535
          return np.repeat(x, 3, axis=-1) if mode == "RGB" else x
        mode = mode or ("L" if img.mode in ("1", "L", "LA") else "RGB")
        x = np.asarray(img.convert(mode), np.float32) / 255
  except (OSError, Image.DecompressionBombError) as e:
    # PIL names the buffer it read (<_io.BytesIO object at 0x…>), not the file: drop it.
    why = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e)) or type(e).__name__
    raise ValueError(f"cannot decode image {where}: {why}") from None
  return x[..., None] if x.ndim == 2 else x


# Sources: (data_dir, indices) -> (images (N, H, W, C) in [0, 1], labels (N,), num_classes, class_names).


@functools.lru_cache(maxsize=128)
def _skimage_photo(i: int, image_size: tuple[int, int]) -> np.ndarray:
  """scikit-image photo ``SKIMAGE_PHOTOS[i]``, gray repeated to RGB, centre-cropped to a square and
  resized to ``image_size`` (read-only: one decoded and resized copy per photo and size)."""
  name = SKIMAGE_PHOTOS[i]
  path = os.path.join(skimage.data_dir, _SKIMAGE_FILES.get(name, name + ".png"))
  if os.path.isfile(path):
    with Image.open(path) as f:
      img = np.asarray(f)
  else:  # a scikit-image that keeps it elsewhere (fetched into its cache)
    img = getattr(skimage.data, name)()
  if img.ndim == 2:
    img = np.repeat(img[..., None], 3, axis=-1)
  h, w = img.shape[:2]
  s = min(h, w)
  top, left = (h - s) // 2, (w - s) // 2
  img = resize(img[top : top + s, left : left + s].astype(np.float32) / 255, image_size)
  img.flags.writeable = False
  return img


def _load_lfw_subset(data_dir, indices):
  del data_dir  # Bundled with scikit-image.
  x = skimage.data.lfw_subset()  # (200, 25, 25) float in [0, 1]: 100 faces, then 100 non-faces.
  idx = _select(indices, len(x), "lfw_subset")
  return x[idx, :, :, None], (idx < 100).astype(np.int64), 2, ("non-face", "face")


def _load_digits(data_dir, indices):
  del data_dir  # Bundled with scikit-learn.
  try:
    from sklearn.datasets import load_digits
  except ImportError:
    raise ValueError("dataset 'digits' requires scikit-learn: pip install scikit-learn") from None
  digits = load_digits()
  idx = _select(indices, len(digits.images), "digits")
  return digits.images[idx, :, :, None] / 16.0, digits.target[idx], 10, _DIGITS


def _read_idx(path: Path, magic: int) -> np.ndarray:
  """Reads an IDX file of unsigned bytes (magic 0x08NN, NN = number of dims), possibly gzipped."""
  try:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(f"corrupt IDX file {path}: {e}") from None
  ndim = magic & 0xFF
  header = 4 + 4 * ndim
  if len(data) < header or struct.unpack(">I", data[:4])[0] != magic:
    raise ValueError(f"corrupt IDX file {path}: expected magic number {magic}")
  shape = struct.unpack(f">{ndim}I", data[4:header])
  if len(data) - header != np.prod(shape):
    raise ValueError(f"corrupt IDX file {path}: {len(data) - header} data bytes for shape {shape}")
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _load_mnist(data_dir, indices):
  root = _data_dir(data_dir, "mnist", "mnist/t10k-images-idx3-ubyte.gz")

  def read(stem, magic):
    candidates = [f"{folder}{stem}{suffix}" for folder in ("mnist/", "") for suffix in (".gz", "")]
    return _read_idx(_find(root, candidates, "mnist"), magic)

  images, labels = read("t10k-images-idx3-ubyte", 2051), read("t10k-labels-idx1-ubyte", 2049)
  if len(images) != len(labels):
    raise ValueError(f"MNIST in {root} has {len(images)} images but {len(labels)} labels")
  idx = _select(indices, len(images), "mnist")
  return images[idx, :, :, None].astype(np.float32) / 255, labels[idx], 10, _DIGITS


def _load_cifar(data_dir, indices, *, name, npz, label_key, python_batch, label_pickle_key, classes):
  root = _data_dir(data_dir, name, f"{name}/{npz}")
  path = _find(root, [f"{name}/{npz}", npz, python_batch], name)
  if path.suffix == ".npz":
    x, y = _npz_entries(path, ("x", label_key))
  else:
    batch = pickled.arrays(path)
    if not isinstance(batch, dict) or not {b"data", label_pickle_key} <= batch.keys():
      raise ValueError(f"{path} is not a CIFAR batch (a dict with b'data' and {label_pickle_key!r})")
    x, y = batch[b"data"], np.asarray(batch[label_pickle_key])
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != 3072:
      raise ValueError(f"{path}: b'data' must be a (N, 3072) array, got {getattr(x, 'shape', type(x))}")
    x = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # Channel-planar rows -> NHWC.
  if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3) or y.shape != (len(x),):
    raise ValueError(
      f"{path}: expected uint8 images (N, 32, 32, 3) and N labels, got {x.shape} and {y.shape}"
    )
  _check_label_values(y, len(classes), path)
  idx = _select(indices, len(x), name)
  return x[idx].astype(np.float32) / 255, y[idx], len(classes), classes


def _load_cifar10(data_dir, indices):
  return _load_cifar(
        data_dir, indices, name="cifar10", npz="cifar10_test_prefix.npz", label_key="y",
        python_batch="cifar-10-batches-py/test_batch", label_pickle_key=b"labels", classes=CIFAR10_CLASSES,
    )  # fmt: skip


def _load_cifar100(data_dir, indices):
  return _load_cifar(
        data_dir, indices, name="cifar100", npz="cifar100_test_prefix.npz", label_key="y_fine",
        python_batch="cifar-100-python/test", label_pickle_key=b"fine_labels", classes=CIFAR100_CLASSES,
    )  # fmt: skip


def _cifar10_train_order(data_dir):
  """(labels (50000,), the JPEG number of each image in canonical order) from the label file."""
  root = _data_dir(data_dir, "cifar10_train", "cifar10/cifar10_train_jpeg.tar.gz")
  order = _find(root, ["cifar10/cifar10_train_labels.npz"], "cifar10_train")
  y, number = _npz_entries(order, ("labels_all", "jpeg_index"))
  if y.shape != number.shape or y.ndim != 1 or not y.size:
    raise ValueError(f"{order}: expected labels_all and jpeg_index of one length, not empty")
  _check_label_values(y, 10, order)
  if number.dtype.kind not in "iu" or number.min() < 0:
    raise ValueError(f"{order}: jpeg_index must hold non-negative integers, got {number.dtype}")
  return y.astype(np.int64), number.astype(np.int64)


def _npz_entries(path, keys) -> list[np.ndarray]:
  """``keys``' arrays of the ``.npz`` file ``path``, read without unpickling
  (:func:`gradjax.files.npz_arrays`); a one-line ValueError naming the file otherwise."""
  data = Path(path).read_bytes()
  if not zipfile.is_zipfile(io.BytesIO(data)):
    raise ValueError(f"cannot read {path}: not an .npz file (not a zip archive)")
  arrays = files.npz_arrays(data, f"cannot read {path}")
  missing = [k for k in keys if k not in arrays]
  if missing:
    raise ValueError(f"cannot read {path}: no entry {missing[0]!r}")
  return [arrays[k] for k in keys]


def _check_label_values(y: np.ndarray, classes: int, where) -> None:
  """One line naming the first label that is no class index (an integer in 0..classes − 1)."""
  if y.dtype.kind not in "iu":
    raise ValueError(f"{where}: labels must be integers in 0..{classes - 1}, got {y.dtype}")
  bad = np.flatnonzero((y < 0) | (y >= classes))
  if bad.size:
    raise ValueError(f"{where}: labels must be integers in 0..{classes - 1}, got {y.flat[bad[0]]} "
                     f"at {bad[0]}")


def _load_cifar10_train(data_dir, indices):
  root = _data_dir(data_dir, "cifar10_train", "cifar10/cifar10_train_jpeg.tar.gz")
  archive = _find(root, ["cifar10/cifar10_train_jpeg.tar.gz"], "cifar10_train")
  y, number = _cifar10_train_order(data_dir)
  idx = _select(indices, len(y), "cifar10_train")
  wanted = {f"train/{CIFAR10_CLASSES[y[i]]}/{number[i]:04d}.jpg": k for k, i in enumerate(idx)}
  images = [None] * len(idx)
  try:
    with tarfile.open(archive, "r:gz") as tar:
      for member in tar:
        k = wanted.get(member.name)
        if k is not None and member.isfile():
          images[k] = _decode(tar.extractfile(member).read(), f"{archive}:{member.name}", "RGB")
  except (OSError, tarfile.TarError, EOFError, zlib.error) as e:
    raise ValueError(f"cannot read {archive}: {e}") from None
  missing = [name for name, k in wanted.items() if images[k] is None]
  if missing:
    raise ValueError(f"{archive} lacks {len(missing)} of the requested images, e.g. {missing[0]}")
  return np.stack(images), y[idx], 10, CIFAR10_CLASSES


_LFW_FILE = re.compile(r"(.+)_\d{4}\.jpg")


def _load_lfw(data_dir, indices):
  path = _find(_data_dir(data_dir, "lfw", "lfw/lfw_5590_80px.tar"), ["lfw/lfw_5590_80px.tar"], "lfw")
  try:
    with tarfile.open(path, "r:") as tar:
      members = sorted(tar.getmembers(), key=lambda m: m.name)
      for m in members:
        parts = PurePosixPath(m.name)
        if parts.is_absolute() or ".." in parts.parts:
          raise ValueError(f"unsafe member name {m.name!r} in {path}")
      members = [m for m in members if m.isfile() and m.name.endswith(".jpg")]
      people = []
      for m in members:
        match = _LFW_FILE.fullmatch(PurePosixPath(m.name).name)
        if match is None:
          raise ValueError(f"unexpected member {m.name!r} in {path}: expected <Person_Name>_<NNNN>.jpg")
        people.append(match.group(1))
      idx = _select(indices, len(members), "lfw")
      images = [_decode(tar.extractfile(members[i]).read(), f"{path}:{members[i].name}", "RGB") for i in idx]
  except (tarfile.TarError, EOFError, zlib.error) as e:
    raise ValueError(f"corrupt tar file {path}: {e}") from None
  identities = tuple(sorted(set(people)))
  label = {person: i for i, person in enumerate(identities)}
  return images, [label[people[i]] for i in idx], len(identities), identities


def _images_in(folder: Path) -> list[Path]:
  return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)


def _load_folder(data_dir, indices):
  if data_dir is None:
    raise ValueError("dataset 'folder' needs --data_dir (a folder of images, or of one subfolder per class)")
  root = Path(data_dir)
  if not root.is_dir():
    raise FileNotFoundError(f"image folder {root} does not exist")
  classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
  if classes and _images_in(root):
    raise ValueError(f"{root} mixes images and class subfolders; use one or the other")
  files = [(f, label) for label, d in enumerate(classes) for f in _images_in(d)] or [
    (f, 0) for f in _images_in(root)
  ]
  if not files:
    raise ValueError(f"no images ({', '.join(_IMAGE_SUFFIXES)}) in {root}")
  idx = _select(indices, len(files), "folder")
  images = [_decode(files[i][0].read_bytes(), str(files[i][0])) for i in idx]
  class_names = tuple(d.name for d in classes) if classes else None
  return images, [files[i][1] for i in idx], max(len(classes), 1), class_names


def _load_tfds(name, data_dir, indices):
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    hint = "pip install tensorflow-datasets"
    raise ValueError(f"dataset 'tfds:{name}' requires tensorflow-datasets: {hint}") from None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # tfds raises its own DatasetNotFoundError
    raise ValueError(f"unknown tfds dataset {name!r}: {str(e).splitlines()[0]}") from None
  builder.download_and_prepare()
  splits = builder.info.splits
  if splits and "test" not in splits:
    raise ValueError(f"tfds dataset {name!r} has no 'test' split (it has {', '.join(splits)})")
  if splits:  # the split's size is known (a prepared dataset): check the indices before reading
    idx = _select(indices, splits["test"].num_examples, f"tfds:{name}")
  elif indices is None:
    raise ValueError(f"tfds dataset {name!r} does not state its size; pass the image indices")
  else:  # the size shows while reading
    idx = _select(indices, np.iinfo(np.int64).max, f"tfds:{name}")
  wanted, examples, count = set(idx.tolist()), {}, 0
  for count, example in enumerate(tfds.as_numpy(builder.as_dataset(split=f"test[:{idx.max() + 1}]")), 1):
    if count - 1 in wanted:
      examples[count - 1] = example
    if count > idx.max():
      break
  missing = sorted(wanted - examples.keys())
  if missing:
    raise ValueError(f"index {missing[0]} out of range for dataset 'tfds:{name}' with {count} test images")
  images = [examples[i]["image"].astype(np.float32) / 255 for i in idx]
  label = builder.info.features["label"]
  return images, [examples[i]["label"] for i in idx], label.num_classes, tuple(label.names)


_SOURCES = {
  "lfw_subset": _load_lfw_subset,
  "digits": _load_digits,
  "cifar10_train": _load_cifar10_train,
  "mnist": _load_mnist,
  "cifar10": _load_cifar10,
  "cifar100": _load_cifar100,
  "lfw": _load_lfw,
  "folder": _load_folder,
}


def duplicate_label_batches(y, num_classes: int, count: int, batch_size: int, classes_per_batch: int,
                            rng: np.random.Generator) -> np.ndarray:
  """Index arrays (count, batch_size) into images labelled ``y`` for batches WITH repeated labels.

  Batch b: ``classes_per_batch`` distinct classes drawn from those with at least ``batch_size`` images,
  ``batch_size`` labels drawn from them with replacement (so with classes_per_batch < batch_size some
  class always repeats), then for each label a distinct image of that class; all from ``rng`` in that
  order. The protocol of label-recovery and batch-inversion tables with duplicates.
  """
  y = np.asarray(y)
  by_class = {c: np.flatnonzero(y == c) for c in range(num_classes)}
  usable = np.array([c for c in range(num_classes) if len(by_class[c]) >= batch_size])
  if len(usable) < classes_per_batch:
    raise ValueError(f"only {len(usable)} classes have {batch_size} images in the pool; lower "
                     "the classes per batch or the batch size, or raise the pool")
  batches = []
  for _ in range(count):
    classes = rng.choice(usable, classes_per_batch, replace=False)
    labels = rng.choice(classes, batch_size)
    idx = np.empty(batch_size, np.int64)
    for c in np.unique(labels):
      slots = np.flatnonzero(labels == c)
      idx[slots] = rng.choice(by_class[c], len(slots), replace=False)
    batches.append(idx)
  return np.stack(batches)
