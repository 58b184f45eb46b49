"""Tests for gradjax.data: real images only (files written here are built from scikit-image photos)."""

import gzip
import importlib.util
import os
import pickle
import struct
import tarfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.data
import skimage.transform
from PIL import Image

from gradjax import data, pickled

DATA_DIR = data.default_data_dir()
needs_data = pytest.mark.skipif(DATA_DIR is None, reason="no shared data folder (set GRADJAX_DATA_DIR)")


def _photo(name, size):
  """A real scikit-image photo resized to size x size, as uint8 RGB."""
  img = getattr(skimage.data, name)()
  if img.ndim == 2:
    img = np.repeat(img[..., None], 3, axis=-1)
  return (skimage.transform.resize(img, (size, size), anti_aliasing=True) * 255).round().astype(np.uint8)


# Bundled sources.


def test_skimage_default():
  ds = data.load("skimage")
  assert ds.x.shape == (16, 32, 32, 3) and ds.x.dtype == np.float32
  assert 0.0 <= ds.x.min() and ds.x.max() <= 1.0
  assert ds.y.dtype == np.int64 and ds.y.tolist() == [i % 10 for i in range(16)]
  assert ds.num_classes == 10 and ds.name == "skimage"
  assert ds.class_names == data.SKIMAGE_PHOTOS
  colour, gray = ds.x[:7], ds.x[7:]
  assert np.all(np.ptp(colour, axis=-1).max(axis=(1, 2)) > 0.1)  # Real colour photos.
  assert np.array_equal(gray[..., 0], gray[..., 2])  # Grayscale repeated to RGB.


def test_skimage_indices_resize_channels():
  ds = data.load("skimage", indices=[1, 13], image_size=(48, 40), channels=1)
  assert ds.x.shape == (2, 48, 40, 1)
  assert ds.y.tolist() == [1, 3] and ds.class_names == ("chelsea", "clock")
  # The astronaut is square already, so the crop keeps it whole.
  astronaut = skimage.transform.resize(skimage.data.astronaut() / 255, (32, 32, 3), anti_aliasing=True)
  np.testing.assert_allclose(data.load("skimage", indices=0).x[0], astronaut, atol=1e-5)


@pytest.mark.parametrize("shape,size", [((512, 512, 3), (32, 32)), ((300, 451, 3), (28, 28)),
                                        ((28, 28, 1), (32, 32)), ((64, 48, 3), (40, 48)),
                                        ((1, 5, 1), (3, 2)), ((33, 17, 3), (7, 64))])
def test_resize_is_scikit_images_anti_aliased_resize(shape, size):
  """Down by integer and other factors, up, one pixel wide: bit for bit."""
  img = np.random.default_rng(sum(shape)).random(shape, dtype=np.float32)
  want = np.clip(skimage.transform.resize(img, (*size, shape[-1]), anti_aliasing=True), 0.0, 1.0)
  got = data.resize(img, size)
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, want)


def test_skimage_photos_are_scikit_images_arrays():
  """Every photo at the default 32x32; the first three at 28x28 too (a factor that is no integer)."""
  for k, name in enumerate(data.SKIMAGE_PHOTOS):
    photo = getattr(skimage.data, name)()
    if photo.ndim == 2:
      photo = np.repeat(photo[..., None], 3, axis=-1)
    s = min(photo.shape[:2])
    top, left = (photo.shape[0] - s) // 2, (photo.shape[1] - s) // 2
    crop = photo[top:top + s, left:left + s] / 255
    for size in [(32, 32)] + ([(28, 28)] if k < 3 else []):
      want = np.clip(skimage.transform.resize(crop.astype(np.float32), (*size, 3),
                                              anti_aliasing=True), 0.0, 1.0)
      got = data.load("skimage", indices=k, image_size=size).x[0]
      np.testing.assert_array_equal(got, want, err_msg=f"{name} at {size}")


def test_lfw_subset():
  ds = data.load("lfw_subset")
  assert ds.x.shape == (200, 25, 25, 1) and ds.num_classes == 2
  assert ds.y[:100].tolist() == [1] * 100 and ds.y[100:].tolist() == [0] * 100
  assert data.load("lfw_subset", indices=5, channels=3).x.shape == (1, 25, 25, 3)


def test_digits():
  try:
    import sklearn  # noqa: F401
  except ImportError:
    with pytest.raises(ValueError, match="pip install scikit-learn"):
      data.load("digits")
    return
  ds = data.load("digits", indices=range(10))
  assert ds.x.shape == (10, 8, 8, 1) and ds.y.tolist() == list(range(10)) and ds.x.max() <= 1.0


@pytest.mark.skipif(importlib.util.find_spec("tensorflow_datasets") is not None,
                    reason="tensorflow_datasets is installed (and needs internet)")
def test_tfds_missing():
  with pytest.raises(ValueError, match="pip install tensorflow-datasets"):
    data.load("tfds:cifar10", indices=0)


def _mock_tfds():
  """tfds and its mock_data context (random examples of the dataset's real features, no download)."""
  tfds = pytest.importorskip("tensorflow_datasets")
  return tfds, tfds.testing.mock_data


@pytest.mark.isolated
@pytest.mark.slow
def test_tfds_images_and_labels_as_tfds_gives_them_and_names_an_unknown_set():
  tfds, mock_data = _mock_tfds()
  with mock_data(num_examples=6):
    ds = data.load("tfds:cifar10", indices=[0, 4])
    raw = list(tfds.as_numpy(tfds.builder("cifar10").as_dataset(split="test")))[:5]
    with pytest.raises(ValueError, match="index 7 out of range for dataset 'tfds:cifar10' with 6"):
      data.load("tfds:cifar10", indices=[1, 7])
    with pytest.raises(ValueError, match="pass the image indices"):
      data.load("tfds:cifar10")
  with mock_data(num_examples=2), pytest.raises(ValueError, match="unknown tfds dataset 'no_such_set'"):
    data.load("tfds:no_such_set", indices=0)
  assert ds.x.shape == (2, 32, 32, 3) and ds.x.dtype == np.float32 and ds.num_classes == 10
  np.testing.assert_array_equal(ds.x, np.stack([raw[0]["image"], raw[4]["image"]]) / np.float32(255))
  assert ds.y.tolist() == [int(raw[0]["label"]), int(raw[4]["label"])]
  assert len(ds.class_names) == 10


@pytest.mark.isolated
@pytest.mark.slow
def test_tfds_dataset_drives_an_attack():
  """--dataset=tfds:mnist end to end (config.Config is what the CLI builds from its flags)."""
  _, mock_data = _mock_tfds()
  from gradjax.run import config, pipeline
  with mock_data(num_examples=3):
    results, images = pipeline.run(
        config.from_options({
            "data.dataset": "tfds:mnist", "data.index": 2, "attack.iterations": 5,
            "data.image_size": 16, "output.lpips": "none"
        }))
    truth = data.load("tfds:mnist", indices=2, image_size=(16, 16))
  np.testing.assert_array_equal(images["ground_truth"], truth.x)
  assert results["labels_true"] == truth.y.tolist() and np.isfinite(results["psnr"])


# Errors.


def test_unknown_dataset():
  with pytest.raises(ValueError, match="unknown dataset 'imagenet21k'"):
    data.load("imagenet21k")


@pytest.mark.parametrize("indices", [16, [0, 16], -1, [], [0.5], [True]])
def test_bad_indices(indices):
  with pytest.raises(ValueError, match="out of range|indices must be"):
    data.load("skimage", indices=indices)


def test_bad_channels_and_size():
  with pytest.raises(ValueError, match="channels"):
    data.load("lfw_subset", channels=2)
  with pytest.raises(ValueError, match="image_size"):
    data.load("lfw_subset", image_size=(0, 8))


def test_missing_data_dir(monkeypatch, tmp_path):
  monkeypatch.setattr(data, "default_data_dir", lambda: None)
  with pytest.raises(ValueError, match="needs --data_dir"):
    data.load("mnist")
  with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
    data.load("mnist", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="'folder' needs --data_dir"):
    data.load("folder")


def test_default_data_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("GRADJAX_DATA_DIR", str(tmp_path))
  assert data.default_data_dir() == str(tmp_path)
  monkeypatch.delenv("GRADJAX_DATA_DIR")
  shared = Path(data.__file__).resolve().parents[2] / "shared" / "data"
  assert data.default_data_dir() == (str(shared) if shared.is_dir() else None)


# Normalisation.


def test_normalize_closed_form_and_round_trip():
  norm = data.normalization("cifar10")
  x = np.full((2, 4, 4, 3), 0.5, np.float32)
  z = data.normalize(x, norm)
  assert z.dtype == np.float32
  expected = [(0.5 - 0.4914) / 0.2470, (0.5 - 0.4822) / 0.2435, (0.5 - 0.4465) / 0.2616]
  np.testing.assert_allclose(z[0, 0, 0], expected, rtol=1e-6)
  real = data.load("skimage", indices=[0, 7]).x
  np.testing.assert_allclose(data.denormalize(data.normalize(real, norm), norm), real, atol=1e-6)


def test_normalize_jax_and_broadcast():
  mnist = data.normalization("mnist")
  x = jnp.asarray(data.load("skimage", indices=[2]).x)  # 3 channels, 1 normalisation value.
  z = jax.jit(lambda v: data.normalize(v, mnist))(x)
  assert isinstance(z, jax.Array) and z.dtype == jnp.float32
  np.testing.assert_allclose(z, (np.asarray(x) - 0.1307) / 0.3081, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(lambda v: data.denormalize(v, mnist))(z), x, atol=1e-6)
  imagenet = data.normalization("imagenet")
  np.testing.assert_allclose(data.denormalize(data.normalize(x, imagenet), imagenet), x, atol=1e-6)
  assert (
    data.normalize(np.ones((1, 2, 2, 1)), data.normalization("none")).tolist()
    == np.ones((1, 2, 2, 1)).tolist()
  )


def test_normalization_errors():
  with pytest.raises(ValueError, match="unknown normalization"):
    data.normalization("svhn")
  with pytest.raises(ValueError, match="3 channel values but x has 1"):
    data.normalize(np.zeros((1, 2, 2, 1)), data.normalization("cifar100"))
  for bad in (data.Normalization((0.0,), (0.0,)), data.Normalization((np.nan,), (1.0,))):
    with pytest.raises(ValueError, match="finite means and positive stds"):  # inf or NaN pixels
      data.normalize(np.zeros((1, 2, 2, 1)), bad)
  np.testing.assert_allclose(data.normalize([[[[0.5]]]], data.normalization("mnist")),
                             [[[[(0.5 - 0.1307) / 0.3081]]]], rtol=1e-6)  # a nested list too


# Real data in the shared folder.


@needs_data
def test_mnist():
  ds = data.load("mnist")
  assert ds.x.shape == (10000, 28, 28, 1) and ds.x.dtype == np.float32 and ds.num_classes == 10
  assert ds.y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
  assert np.bincount(ds.y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
  assert abs(ds.x.mean() - 0.1325) < 1e-3 and abs(ds.x.std() - 0.3105) < 1e-3  # Known test-set statistics.
  assert data.load("mnist", indices=[3, 0]).y.tolist() == [0, 7]


@needs_data
def test_cifar10():
  ds = data.load("cifar10")
  assert ds.x.shape == (1017, 32, 32, 3) and ds.x.dtype == np.float32 and ds.num_classes == 10
  assert ds.y[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
  with np.load(Path(DATA_DIR) / "cifar10" / "cifar10_test_prefix.npz") as f:
    assert tuple(f["label_names"]) == ds.class_names == data.CIFAR10_CLASSES
    np.testing.assert_array_equal(ds.x[5] * 255, f["x"][5])
  with pytest.raises(ValueError, match="index 1017 out of range"):
    data.load("cifar10", indices=1017)


@needs_data
def test_cifar100_class_names_match_file_names():
  ds = data.load("cifar100", indices=[0, 1, 2], channels=1)
  assert ds.x.shape == (3, 32, 32, 1) and ds.num_classes == 100 and len(ds.class_names) == 100
  assert [ds.class_names[y] for y in ds.y] == ["mountain", "forest", "seal"]  # volcano, woods, seal.
  with np.load(Path(DATA_DIR) / "cifar100" / "cifar100_test_prefix.npz") as f:
    names, labels = f["filenames_all"], f["fine_all"]
  stems = np.array([n.split("_s_")[0] for n in names])
  named = np.isin(stems, data.CIFAR100_CLASSES)
  agree = [data.CIFAR100_CLASSES[y] == s for s, y in zip(stems[named], labels[named])]
  assert named.sum() > 3000 and np.mean(agree) > 0.999  # CIFAR-100 has a couple of label-noise files.


@needs_data
def test_lfw_labels_are_identities(monkeypatch):
  with tarfile.open(Path(DATA_DIR) / "lfw" / "lfw_5590_80px.tar") as tar:
    names = sorted(tar.getnames())
  k = names.index("lfw_5590/Aaron_Eckhart_0001.jpg")
  decoded = []
  real_decode = data._decode
  monkeypatch.setattr(data, "_decode", lambda *a: decoded.append(a[1]) or real_decode(*a))
  ds = data.load("lfw", indices=[k, 0, len(names) - 1])
  assert len(decoded) == 3  # Only the requested images are decoded.
  assert ds.x.shape == (3, 80, 80, 3) and ds.x.dtype == np.float32
  assert [ds.class_names[y] for y in ds.y] == ["Aaron_Eckhart", "AJ_Cook", "Zydrunas_Ilgauskas"]
  assert ds.num_classes == len(ds.class_names) == 4151  # Every person appears once in this set.


# File formats, with files written from real scikit-image photos.


def _cifar_rows(images):
  return np.stack([img.transpose(2, 0, 1).reshape(-1) for img in images])  # Channel-planar R, G, B.


@pytest.mark.parametrize("name, folder, file, key", [
    ("cifar10", "cifar-10-batches-py", "test_batch", b"labels"),
    ("cifar100", "cifar-100-python", "test", b"fine_labels"),
])  # fmt: skip
def test_cifar_pickle(tmp_path, name, folder, file, key):
  images = [_photo(p, 32) for p in ("chelsea", "coffee", "astronaut")]
  (tmp_path / folder).mkdir()
  with open(tmp_path / folder / file, "wb") as f:
    pickle.dump(
      {b"batch_label": b"testing batch", b"data": _cifar_rows(images), key: [3, 1, 0]}, f, protocol=2
    )
  ds = data.load(name, data_dir=str(tmp_path), indices=[2, 0])
  assert ds.y.tolist() == [0, 3]
  np.testing.assert_array_equal(ds.x * 255, np.stack([images[2], images[0]]))


def test_cifar_pickle_numpy1_module_names(tmp_path):
  # The canonical files were written by numpy 1, whose arrays refer to numpy.core.multiarray._reconstruct.
  images = [_photo("coffee", 32)]
  blob = pickle.dumps({b"data": _cifar_rows(images), b"labels": [7]}, protocol=2)
  (tmp_path / "cifar-10-batches-py").mkdir()
  (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(blob.replace(b"numpy._core.", b"numpy.core."))
  ds = data.load("cifar10", data_dir=str(tmp_path))
  assert ds.y.tolist() == [7]
  np.testing.assert_array_equal(ds.x * 255, np.stack(images))


def test_cifar_npz_corrupt(tmp_path):
  (tmp_path / "cifar100").mkdir()
  (tmp_path / "cifar100" / "cifar100_test_prefix.npz").write_bytes(b"PK\x03\x04 cut short")
  with pytest.raises(ValueError, match="cannot read .*cifar100_test_prefix.npz"):
    data.load("cifar100", data_dir=str(tmp_path))


def test_cifar_pickle_truncated(tmp_path):
  (tmp_path / "cifar-10-batches-py").mkdir()
  blob = pickle.dumps({b"data": _cifar_rows([_photo("rocket", 32)]), b"labels": [0]}, protocol=2)
  (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(blob[: len(blob) // 2])
  with pytest.raises(ValueError, match="corrupt or truncated pickle"):
    data.load("cifar10", data_dir=str(tmp_path))


class _Exploit:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"echo pwned > {self.marker}",))


def test_cifar_pickle_refuses_code(tmp_path):
  marker = tmp_path / "pwned"
  (tmp_path / "cifar-10-batches-py").mkdir()
  with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
    pickle.dump({b"data": _Exploit(marker), b"labels": [0]}, f, protocol=2)
  with pytest.raises(ValueError, match=r"refusing to read .*test_batch as data: it names (posix|nt|os)\.system"):
    data.load("cifar10", data_dir=str(tmp_path))
  assert not marker.exists()


@needs_data
def test_cifar_python2_batch_from_the_canonical_bytes(tmp_path):
  """The canonical test_batch is a Python 2 pickle (SHORT_BINSTRING keys, the pixels one BINSTRING).
  The shared prefix is cut inside the pixels: with them padded by zeros to the 10000 images its
  shape declares and its dict closed as the file closes it, it is a complete Python 2 batch,
  checked against Python's own unpickler and the .npz made from the same bytes."""
  prefix = (Path(DATA_DIR) / "cifar10" / "test_batch.prefix").read_bytes()
  size = 10000 * 3072
  at = prefix.index(b"\x89T" + struct.pack("<i", size)) + 1  # NEWFALSE (C order), BINSTRING
  pixels = prefix[at + 5:]
  n = len(pixels) // 3072
  blob = prefix[:at + 5] + pixels[:n * 3072] + bytes(size - n * 3072) + b"tbu."
  (tmp_path / "cifar-10-batches-py").mkdir()
  (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(blob)
  reference = pickle.loads(blob, encoding="bytes")  # our own bytes: trusted here, never in gradjax
  assert n == 1017 and reference[b"batch_label"] == b"testing batch 1 of 1"
  ds = data.load("cifar10", data_dir=str(tmp_path), indices=[0, 1016])
  rows = reference[b"data"][[0, 1016]].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  np.testing.assert_array_equal(ds.x * 255, rows)
  assert ds.y.tolist() == [reference[b"labels"][0], reference[b"labels"][1016]]
  with np.load(Path(DATA_DIR) / "cifar10" / "cifar10_test_prefix.npz") as npz:
    np.testing.assert_array_equal(ds.x * 255, npz["x"][[0, 1016]])


@needs_data
def test_cifar_batches_meta_reads_as_data():
  meta = pickled.arrays(Path(DATA_DIR) / "cifar10" / "batches.meta")
  assert [name.decode() for name in meta[b"label_names"]] == list(data.CIFAR10_CLASSES)
  assert meta[b"num_vis"] == 3072


def _idx(magic, array):
  return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def test_idx_parsing(tmp_path):
  images = np.stack([_photo(p, 28)[..., 0] for p in ("camera", "coins", "moon")])
  (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(2051, images)))
  (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(2049, np.array([5, 6, 7])))
  ds = data.load("mnist", data_dir=str(tmp_path), indices=[1, 2])
  assert ds.y.tolist() == [6, 7] and ds.x.shape == (2, 28, 28, 1)
  np.testing.assert_array_equal(ds.x[..., 0] * 255, images[1:])

  (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(2049, np.array([5, 6, 7]))[:-1])
  with pytest.raises(ValueError, match="corrupt IDX file .* 2 data bytes for shape \\(3,\\)"):
    data.load("mnist", data_dir=str(tmp_path))
  (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(2051, np.array([5, 6, 7])))
  with pytest.raises(ValueError, match="corrupt IDX file .* magic number 2049"):
    data.load("mnist", data_dir=str(tmp_path))
  (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(2051, images))[:-10])
  with pytest.raises(ValueError, match="corrupt IDX file"):
    data.load("mnist", data_dir=str(tmp_path))


def _save(path, array):
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(array).save(path)


def test_folder_with_classes(tmp_path):
  _save(tmp_path / "cats" / "chelsea.png", _photo("chelsea", 40))
  _save(tmp_path / "cats" / "chelsea_small.bmp", _photo("chelsea", 20))
  _save(tmp_path / "things" / "camera.png", _photo("camera", 30)[..., 0])  # Gray PNG.
  _save(tmp_path / "things" / "rocket.jpg", _photo("rocket", 36))
  (tmp_path / "things" / "notes.txt").write_text("not an image")
  ds = data.load("folder", data_dir=str(tmp_path), image_size=(24, 24), channels=3)
  assert ds.x.shape == (4, 24, 24, 3) and ds.y.tolist() == [0, 0, 1, 1]
  assert ds.num_classes == 2 and ds.class_names == ("cats", "things")
  gray = data.load("folder", data_dir=str(tmp_path), indices=2)
  assert gray.x.shape == (1, 30, 30, 1) and gray.y.tolist() == [1]
  np.testing.assert_array_equal(gray.x[0, ..., 0] * 255, _photo("camera", 30)[..., 0])
  with pytest.raises(ValueError, match="different shapes"):
    data.load("folder", data_dir=str(tmp_path))


def test_folder_flat_and_errors(tmp_path):
  _save(tmp_path / "b.png", _photo("coffee", 16))
  _save(tmp_path / "a.png", _photo("astronaut", 16))
  ds = data.load("folder", data_dir=str(tmp_path))
  assert ds.y.tolist() == [0, 0] and ds.num_classes == 1 and ds.class_names is None
  np.testing.assert_array_equal(ds.x[0] * 255, _photo("astronaut", 16))  # Sorted by name.
  (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
  with pytest.raises(ValueError, match="cannot decode image .*broken.jpg") as e:
    data.load("folder", data_dir=str(tmp_path))
  assert "BytesIO" not in str(e.value)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data.load("folder", data_dir=str(tmp_path / "missing"))
  # Its images are one class: a model needs the classes of its head given.
  (tmp_path / "broken.jpg").unlink()
  from gradjax.run import config, pipeline
  cfg = config.from_options({"data.dataset": "folder", "data.data_dir": str(tmp_path), "attack.iterations": 1})
  with pytest.raises(ValueError, match="one class .a folder without class subfolders.: give the model's classes"):
    pipeline.run(cfg)


def test_lfw_tar_rejects_unsafe_names(tmp_path):
  jpeg = tmp_path / "x.jpg"
  Image.fromarray(_photo("astronaut", 80)).save(jpeg)
  (tmp_path / "lfw").mkdir()
  with tarfile.open(tmp_path / "lfw" / "lfw_5590_80px.tar", "w") as tar:
    tar.add(jpeg, arcname="lfw_5590/Eileen_Collins_0001.jpg")
    tar.add(jpeg, arcname="../Eileen_Collins_0002.jpg")
  with pytest.raises(ValueError, match="unsafe member name '../Eileen_Collins_0002.jpg'"):
    data.load("lfw", data_dir=str(tmp_path))


@needs_data
def test_cifar10_train_jpegs_in_canonical_order():
  """The documented first training labels (6, 9, 9, 4, 1, 1), JPEG members mapped through the order
  file, and each image's class folder agreeing with its label."""
  ds = data.load("cifar10_train", indices=[0, 1, 2, 3, 4, 5, 49_999])
  assert ds.x.shape == (7, 32, 32, 3) and ds.x.dtype == np.float32 and ds.num_classes == 10
  assert ds.y[:6].tolist() == [6, 9, 9, 4, 1, 1]
  assert 0.0 <= ds.x.min() and ds.x.max() <= 1.0 and ds.x.std() > 0.05
  with np.load(Path(DATA_DIR) / "cifar10" / "cifar10_train_labels.npz") as f:
    assert ds.y[-1] == f["labels_all"][49_999]
  with pytest.raises(ValueError, match="out of range"):
    data.load("cifar10_train", indices=[50_000])
  assert data.count("cifar10_train") == 50_000 and data.count("cifar10") is None


def test_duplicate_label_batches():
  y = np.repeat(np.arange(6), 10)
  rng = np.random.default_rng(0)
  batches = data.duplicate_label_batches(y, 6, count=20, batch_size=8, classes_per_batch=3, rng=rng)
  assert batches.shape == (20, 8)
  for idx in batches:
    assert len(set(idx.tolist())) == 8                  # distinct images
    assert len(np.unique(y[idx])) <= 3                   # from 3 classes, so some label repeats
  again = data.duplicate_label_batches(y, 6, 20, 8, 3, np.random.default_rng(0))
  np.testing.assert_array_equal(batches, again)
  with pytest.raises(ValueError, match="classes have"):
    data.duplicate_label_batches(y, 6, 1, 11, 3, rng)


def test_sixteen_bit_and_float_images_and_corrupt_streams(tmp_path):
  """A 16-bit gray PNG is read as its values over 65535 (not clipped as 8 bits); a floating-point
  TIFF, whose range is unknown, is refused; a gzip stream with corrupt bytes is one line."""
  deep = (np.arange(24 * 24).reshape(24, 24) * 113 % 65536).astype(np.uint16)
  _save(tmp_path / "deep" / "a.png", deep)
  ds = data.load("folder", data_dir=str(tmp_path / "deep"))
  assert ds.x.shape == (1, 24, 24, 1)
  np.testing.assert_allclose(ds.x[0, ..., 0], deep / 65535, rtol=1e-6)
  rgb = data.load("folder", data_dir=str(tmp_path / "deep"), channels=3)
  np.testing.assert_allclose(rgb.x[0], np.repeat(deep[..., None] / 65535, 3, axis=-1), rtol=1e-6)
  _save(tmp_path / "float" / "a.tif", np.ones((8, 8), np.float32))
  with pytest.raises(ValueError, match="floating-point pixels"):
    data.load("folder", data_dir=str(tmp_path / "float"))
  images = np.random.default_rng(0).integers(0, 4, (3, 28, 28)).astype(np.uint8)
  packed = bytearray(gzip.compress(_idx(2051, images), compresslevel=9))
  packed[30:40] = b"\xff" * 10  # inside the deflate stream: zlib's error, not gzip's CRC check
  (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(bytes(packed))
  (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(2049, np.array([5, 6, 7])))
  with pytest.raises(ValueError, match="corrupt IDX file") as e:
    data.load("mnist", data_dir=str(tmp_path))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("labels, message", [
    (np.array([0.5, 1.0]), "labels must be integers in 0..9, got float64"),
    (np.array(["cat", "dog"]), "labels must be integers in 0..9"),
    (np.array([3, 10]), "labels must be integers in 0..9, got 10 at 1"),
    (np.array([-1, 3]), "labels must be integers in 0..9, got -1 at 0"),
])
def test_cifar_labels_that_are_no_classes_are_refused(tmp_path, labels, message):
  (tmp_path / "cifar10").mkdir()
  np.savez(tmp_path / "cifar10" / "cifar10_test_prefix.npz", x=np.zeros((2, 32, 32, 3), np.uint8), y=labels)
  with pytest.raises(ValueError, match=message):
    data.load("cifar10", data_dir=str(tmp_path))


def test_a_data_file_that_is_no_npz_or_holds_objects_is_refused_without_advice_to_unpickle(tmp_path):
  """NumPy's own message for a text file read as .npz advises allow_pickle; the loader's says what
  the file is not, and an object entry is refused as such; the training labels' file alike, and its
  float or empty labels (truncated to integers, or a reduction's error, before)."""
  folder = tmp_path / "cifar10"
  folder.mkdir()
  (folder / "cifar10_test_prefix.npz").write_text("not an archive")
  with pytest.raises(ValueError, match="not an .npz file") as e:
    data.load("cifar10", data_dir=str(tmp_path))
  assert "allow_pickle" not in str(e.value)
  np.savez(folder / "cifar10_test_prefix.npz", x=np.zeros((1, 32, 32, 3), np.uint8), y=np.array([object()]))
  with pytest.raises(ValueError, match="refusing to unpickle") as e:
    data.load("cifar10", data_dir=str(tmp_path))
  (folder / "cifar10_train_jpeg.tar.gz").write_bytes(b"")
  for labels, message in ((np.array([1.7, 2.0]), "got float64"), (np.zeros(0, np.int64), "not empty")):
    np.savez(folder / "cifar10_train_labels.npz", labels_all=labels, jpeg_index=np.arange(labels.size))
    with pytest.raises(ValueError, match=message):
      data.load("cifar10_train", data_dir=str(tmp_path), indices=[0])


def test_count_knows_skimage_without_loading_it():
  """data.count("skimage") is the number of photos data.load gives (what a sweep checks its
  range against before it runs)."""
  assert data.count("skimage") == len(data.load("skimage").y) == 16
