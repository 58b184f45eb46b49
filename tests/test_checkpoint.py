"""gradjax.checkpoint: .npz round trips without pickle, one-line errors, and rebuilding a model."""

import io
import re
import json
import os
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import checkpoint, files, models

META = {"model": "mlp-8", "init": None, "act": "sigmoid", "num_classes": 3, "input_shape": [5, 5, 1],
        "epoch": 2, "accuracy": 0.5, "note": "ünïcode"}


@pytest.fixture(scope="module")
def mlp():
  return models.create("mlp-8", jax.random.key(1), input_shape=(5, 5, 1), num_classes=3, act="sigmoid")


def one_line_error(excinfo):
  assert "\n" not in str(excinfo.value), str(excinfo.value)
  return str(excinfo.value)


def test_round_trip_keys_dtypes_and_metadata(tmp_path, mlp):
  variables = {**mlp.variables, "batch_stats": {"bn": {"mean": np.arange(3, dtype=np.float64),
                                                        "count": np.array([4, 5], np.int32)}}}
  path = tmp_path / "a" / "ckpt.npz"
  checkpoint.save(path, variables, META)
  assert os.listdir(tmp_path / "a") == ["ckpt.npz"]  # no temp file left behind
  with np.load(path, allow_pickle=False) as raw:  # the format, read independently
    assert sorted(raw.files) == ["__metadata__", "batch_stats/bn/count", "batch_stats/bn/mean",
                                 "params/Dense_0/bias", "params/Dense_0/kernel", "params/head/bias",
                                 "params/head/kernel"]
    assert raw["__metadata__"].dtype == np.uint8
    assert json.loads(raw["__metadata__"].tobytes().decode("utf-8")) == META
    np.testing.assert_array_equal(raw["params/head/kernel"], mlp.variables["params"]["head"]["kernel"])
  loaded, meta = checkpoint.load(path)
  assert meta == META
  assert jax.tree.structure(loaded) == jax.tree.structure(jax.tree.map(np.asarray, variables))
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(variables)):
    assert isinstance(a, np.ndarray) and a.dtype == np.asarray(b).dtype
    np.testing.assert_array_equal(a, b)
  checkpoint.save(path, mlp.variables, {"epoch": 3})  # overwrite in place
  assert checkpoint.load(path)[1] == {"epoch": 3}


def test_load_model_rebuilds_the_module(tmp_path, mlp):
  trained = jax.tree.map(lambda v: v + 0.25, mlp.variables)
  path = tmp_path / "m.npz"
  checkpoint.save(path, trained, META)
  model = checkpoint.load_model(path)
  assert (model.name, model.input_shape, model.num_classes) == ("mlp-8", (5, 5, 1), 3)
  x = np.random.default_rng(0).random((4, 5, 5, 1)).astype(np.float32)
  np.testing.assert_array_equal(model.apply_fn(model.variables, x), mlp.apply_fn(trained, x))
  assert isinstance(jax.tree.leaves(model.variables)[0], jax.Array)
  # The same weights under another activation give other logits: the metadata matter.
  relu = models.create("mlp-8", jax.random.key(1), input_shape=(5, 5, 1), num_classes=3)
  assert not np.allclose(relu.apply_fn(trained, x), model.apply_fn(model.variables, x))


@pytest.mark.parametrize("change, message", [
    ({"num_classes": 4}, "'params/head/bias' has shape (3,), the model expects (4,)"),
    ({"input_shape": [6, 6, 1]}, "'params/Dense_0/kernel' has shape (25, 8)"),
    ({"model": "lenet_zhu", "act": None}, "variables lack 'params/Conv_0/bias'"),
    ({"model": None}, "model must be a string"),
    ({"input_shape": "5x5"}, "input_shape must be a list"),
])
def test_load_model_mismatch(tmp_path, mlp, change, message):
  path = tmp_path / "m.npz"
  checkpoint.save(path, mlp.variables, {**META, **change})
  with pytest.raises(ValueError) as e:
    checkpoint.load_model(path)
  assert message in one_line_error(e)
  del_meta = {k: v for k, v in META.items() if k != "num_classes"}
  checkpoint.save(path, mlp.variables, del_meta)
  with pytest.raises(ValueError, match="lack num_classes"):
    checkpoint.load_model(path)


def test_check_compatible(mlp):
  like = mlp.variables
  checkpoint.check_compatible(jax.tree.map(np.asarray, like), like)
  bad_shape = {"params": {**like["params"], "head": {**like["params"]["head"], "kernel": np.zeros((8, 4))}}}
  bad_dtype = jax.tree.map(lambda v: np.asarray(v, np.float16), like)
  extra = {**like, "batch_stats": {"x": np.zeros(2)}}
  missing = {"params": {"head": like["params"]["head"]}}
  cases = [(bad_shape, "'params/head/kernel' has shape (8, 4), the model expects (8, 3)"),
           (bad_dtype, "'params/Dense_0/bias' has dtype float16, the model expects float32"),
           (extra, "variables have 'batch_stats/x'"), (missing, "lack 'params/Dense_0/bias'"),
           ([1, 2], "nested dict")]
  for variables, message in cases:
    with pytest.raises(ValueError) as e:
      checkpoint.check_compatible(variables, like)
    assert message in one_line_error(e)


def _write_npz(path, **arrays):
  with open(path, "wb") as f:
    np.savez(f, **arrays)


class _Boom:
  """Unpickling this object would create the file named in it."""

  def __init__(self, target):
    self.target = target

  def __reduce__(self):
    return (open, (self.target, "w"))


def test_load_errors(tmp_path):
  meta = np.frombuffer(json.dumps({"epoch": 1}).encode(), np.uint8)
  good = {"params/w": np.ones(2, np.float32), "__metadata__": meta}
  with pytest.raises(FileNotFoundError):
    checkpoint.load(tmp_path / "missing.npz")
  cases = []
  (tmp_path / "text.npz").write_text("not a zip")
  cases.append(("text.npz", "not an .npz"))
  np.save(tmp_path / "array.npy", np.ones(3))
  cases.append(("array.npy", "not an .npz"))
  target = tmp_path / "pwned"
  _write_npz(tmp_path / "objects.npz", **good, evil=np.array([_Boom(str(target))], dtype=object))
  cases.append(("objects.npz", "holds Python objects"))
  _write_npz(tmp_path / "nometa.npz", **{"params/w": np.ones(2)})
  cases.append(("nometa.npz", "no '__metadata__'"))
  _write_npz(tmp_path / "badjson.npz", **{**good, "__metadata__": np.frombuffer(b"{epoch", np.uint8)})
  cases.append(("badjson.npz", "invalid metadata JSON"))
  _write_npz(tmp_path / "nanjson.npz", **{**good, "__metadata__": np.frombuffer(b'{"a": NaN}', np.uint8)})
  cases.append(("nanjson.npz", "invalid metadata JSON"))
  _write_npz(tmp_path / "list.npz", **{**good, "__metadata__": np.frombuffer(b"[1]", np.uint8)})
  cases.append(("list.npz", "JSON object"))
  _write_npz(tmp_path / "f32meta.npz", **{**good, "__metadata__": np.ones(3, np.float32)})
  cases.append(("f32meta.npz", "uint8"))
  _write_npz(tmp_path / "inf.npz", **{**good, "params/w": np.array([1.0, np.inf])})
  cases.append(("inf.npz", "'params/w' contains NaN or inf"))
  _write_npz(tmp_path / "clash.npz", **good, **{"params/w/x": np.ones(1)})
  cases.append(("clash.npz", "nests under an array"))
  _write_npz(tmp_path / "strings.npz", **good, s=np.array(["a"]))
  cases.append(("strings.npz", "unsupported dtype"))
  with zipfile.ZipFile(tmp_path / "raw.npz", "w") as z:
    buf = io.BytesIO()
    np.save(buf, meta)
    z.writestr("__metadata__.npy", buf.getvalue())
    z.writestr("params/w.npy", b"garbage")
  cases.append(("raw.npz", "entry 'params/w' is not a NumPy array"))
  with zipfile.ZipFile(tmp_path / "truncated.npz", "w") as z:
    buf = io.BytesIO()
    np.save(buf, meta)
    z.writestr("__metadata__.npy", buf.getvalue())
    buf = io.BytesIO()
    np.save(buf, np.ones(100))
    z.writestr("params/w.npy", buf.getvalue()[:200])
  cases.append(("truncated.npz", "entry 'params/w' is corrupt"))
  for name, message in cases:
    with pytest.raises(ValueError) as e:
      checkpoint.load(tmp_path / name)
    assert message in one_line_error(e), (name, str(e.value))
  assert not target.exists()  # nothing was unpickled
  _write_npz(tmp_path / "ok.npz", **good)
  assert checkpoint.load(tmp_path / "ok.npz")[1] == {"epoch": 1}


def test_save_errors_leave_the_old_file(tmp_path, mlp):
  path = tmp_path / "c.npz"
  checkpoint.save(path, mlp.variables, {"epoch": 0})
  before = path.read_bytes()
  cases = [
      (mlp.variables, {"accuracy": float("nan")}, "JSON"),
      (mlp.variables, {"x": object()}, "JSON"),
      (mlp.variables, [1], "must be a dict"),
      ({"params": {"a/b": np.ones(1)}}, {}, "without '/'"),
      ({"params": {}}, {}, "empty dict"),
      ({"params": {"w": np.array([np.nan], np.float32)}}, {}, "'params/w' contains NaN"),
      ({"params": {"w": jnp.ones(2, jnp.bfloat16)}}, {}, "dtype bfloat16"),
      ({"params": {"w": np.array(["a"])}}, {}, "dtype <U1"),
      # A list would come back as one stacked array, not as the list.
      ({"params": [np.ones((2, 3), np.float32)] * 2}, {}, "'params' is a list"),
  ]
  for variables, meta, message in cases:
    with pytest.raises(ValueError) as e:
      checkpoint.save(path, variables, meta)
    assert message in one_line_error(e)
  assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.npz"]


@pytest.mark.slow
def test_pipeline_attacks_the_checkpointed_model(tmp_path):
  """Saving the model the pipeline would create and attacking it from the checkpoint gives the same
  run; a checkpoint for other inputs is refused in one line."""
  from gradjax import models
  from gradjax.run import config, pipeline
  cfg = config.from_options({"data.image_size": 16, "data.index": 1, "attack.iterations": 15})
  key_model = pipeline.experiment_keys(cfg.seed, cfg.data.index).model
  model = models.create("lenet_zhu", key_model, input_shape=(16, 16, 3), num_classes=10)
  path = tmp_path / "same.npz"
  checkpoint.save(path, model.variables, {"model": "lenet_zhu", "num_classes": 10,
                                          "input_shape": [16, 16, 3]})
  fresh, _ = pipeline.run(cfg)
  loaded, _ = pipeline.run(
      config.from_options({
          "data.image_size": 16, "data.index": 1, "attack.iterations": 15,
          "model.checkpoint": str(path), "model.name": "mlp"
      }))
  assert loaded["model"] == "lenet_zhu"
  np.testing.assert_allclose(loaded["loss"], fresh["loss"], rtol=1e-6)
  np.testing.assert_allclose(loaded["psnr"], fresh["psnr"], rtol=1e-6)
  other = models.create("lenet_zhu", key_model, input_shape=(8, 8, 3), num_classes=10)
  checkpoint.save(tmp_path / "other.npz", other.variables,
                  {"model": "lenet_zhu", "num_classes": 10, "input_shape": [8, 8, 3]})
  with pytest.raises(ValueError, match="holds a model for"):
    pipeline.run(
        config.from_options({
            "data.image_size": 16, "attack.iterations": 2,
            "model.checkpoint": str(tmp_path / "other.npz")
        }))
  checkpoint.save(tmp_path / "norm.npz", model.variables,
                  {"model": "lenet_zhu", "num_classes": 10, "input_shape": [16, 16, 3],
                   "normalization": "cifar10"})
  with pytest.raises(ValueError, match="normalization 'cifar10'"):
    pipeline.run(
        config.from_options({
            "data.image_size": 16, "attack.iterations": 2,
            "model.checkpoint": str(tmp_path / "norm.npz")
        }))


def _npy(header: bytes, data: bytes = b"") -> bytes:
  """An .npy entry (format 1.0) with ``header`` as its dictionary, padded as NumPy pads it."""
  header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
  return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


@pytest.mark.parametrize("header, data, message", [
    # A shape of 4 TB in a file of 16 bytes: refused before NumPy allocates it.
    (b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", b"\0" * 16,
     "shape (1000000000000,) and dtype float32 need 4000000000000 bytes, it holds 16"),
    (b"{'descr': garbage", b"", "is corrupt: its header"),
    (b"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", b"\0" * 16,
     "need 24 bytes, it holds 16"),
])
def test_an_npz_entry_whose_header_lies_is_refused_before_it_is_read(header, data, message):
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    z.writestr("params/w.npy", _npy(header, data))
  with pytest.raises(ValueError, match=re.escape(message)) as e:
    files.npz_arrays(buf.getvalue(), "test")
  assert "\n" not in str(e.value) and "entry 'params/w'" in str(e.value)


def test_read_metadata_checks_the_metadata_entrys_header_first(tmp_path):
  """A metadata entry that declares a terabyte is refused before NumPy allocates it (``load``
  checked it; ``read_metadata``, which the programs call first, did not)."""
  path = tmp_path / "huge.npz"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("__metadata__.npy", _npy(b"{'descr': '|u1', 'fortran_order': False, "
                                         b"'shape': (1000000000000,), }", b"{}"))
  with pytest.raises(ValueError, match=re.escape("need 1000000000000 bytes, it holds 2")) as e:
    checkpoint.read_metadata(path)
  assert one_line_error(e).count("is corrupt") == 1


def test_weights_of_another_byte_order_load_as_native_values(tmp_path, mlp):
  """Big-endian arrays (another machine's writer) come back as the same numbers, native, which
  JAX takes."""
  checkpoint.save(tmp_path / "c.npz", mlp.variables, META)
  with np.load(tmp_path / "c.npz", allow_pickle=False) as raw:
    entries = {k: raw[k] for k in raw.files}
  big = {k: v if k == "__metadata__" else v.astype(v.dtype.newbyteorder(">")) for k, v in entries.items()}
  np.savez(tmp_path / "big.npz", **big)
  model = checkpoint.load_model(tmp_path / "big.npz")
  for a, b in zip(jax.tree.leaves(model.variables), jax.tree.leaves(mlp.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("key, value, message", [
    ("act", ["relu"], "act must be a string"), ("init", 5, "init must be a string"),
    ("init_scale", "big", "init_scale must be a number"), ("init_scale", True, "init_scale must be a number"),
    ("stride1", "yes", "stride1 must be true or false"), ("num_classes", True, "num_classes an int"),
    ("input_shape", [True, True, True], "input_shape must be a list of ints"),
])
def test_metadata_of_the_wrong_json_type_is_refused_in_one_line(key, value, message):
  with pytest.raises(ValueError, match=re.escape(message)) as e:
    checkpoint.model_from_metadata({**META, key: value})
  one_line_error(e)


def test_a_torch_save_archive_is_named_as_such(tmp_path):
  """A torch.save file (a zip holding data.pkl) given as a checkpoint: refused as what it is, never
  unpickled, by both readers."""
  path = tmp_path / "model.pt"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    z.writestr("archive/version", b"3\n")
  for read in (checkpoint.read_metadata, checkpoint.load):
    with pytest.raises(ValueError, match="is a torch.save archive .pickled., not a gradjax checkpoint") as e:
      read(path)
    one_line_error(e)


def test_input_files_that_are_no_regular_files_are_refused(tmp_path):
  """A FIFO would block the read forever and a link loop is no missing file: each named as it is."""
  from gradjax.run import config
  os.mkfifo(tmp_path / "fifo")
  os.symlink(tmp_path / "b", tmp_path / "a")
  os.symlink(tmp_path / "a", tmp_path / "b")
  for path, kind, message in ((tmp_path / "fifo", ValueError, "is not a regular file"),
                              (tmp_path / "a", FileNotFoundError, "is a link that leads to no file")):
    with pytest.raises(kind, match=message):
      config.check(config.from_options({"model.checkpoint": str(path)}))
