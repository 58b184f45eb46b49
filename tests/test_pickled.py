"""gradjax.pickled: a pickle's plain data and NumPy arrays, read without unpickling.

The reference is Python's own pickle of objects built here (what was written is what must come
back); the refusals use files that would run code, build objects or lie about their sizes."""

import os
import pickle
import struct

import numpy as np
import pytest

from gradjax import pickled


def _equal(a, b) -> bool:
  """Equal values of equal types, arrays by dtype, shape and contents."""
  if isinstance(a, (np.ndarray, np.generic)):
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
  if isinstance(a, dict):
    return type(b) is dict and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)):
    return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
  return type(a) is type(b) and a == b


def _data():
  rng = np.random.default_rng(0)
  shared = np.arange(3.0)
  return {
    b"batch_label": b"testing batch 1 of 1",
    "text": "h\u00e9llo \u2603",
    b"data": rng.integers(0, 256, (5, 3072), dtype=np.uint8),
    "fortran": np.asfortranarray(rng.normal(size=(3, 4))).astype(">f4", order="F"),
    "strided": rng.normal(size=(4, 6))[:, ::2],
    "complex": (1 + 2j) * np.ones(3, np.complex64),
    "bool": np.array([True, False]),
    "int16": np.array([-3, 7], "<i2"),
    "empty": np.zeros((0, 3)),
    "scalars": [np.float64(2.5), np.int64(-7), np.float32(0.5)],
    "numbers": [0, 1, -5, 2**70, -(2**40), 3.5, float("inf"), None, True, False],
    "empty_bytes": b"",
    "nested": [[{"k": (1, 2)}], (), [], {}],
    "shared": [shared, shared],
  }


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_reads_back_what_was_pickled(tmp_path, protocol):
  value = _data()
  path = tmp_path / "batch"
  path.write_bytes(pickle.dumps(value, protocol=protocol))
  back = pickled.arrays(path)
  assert _equal(value, back)
  assert back["fortran"].flags.f_contiguous and back["fortran"].dtype == np.dtype(">f4")
  assert back["shared"][0] is back["shared"][1]  # a memo reference stays one array
  back[b"data"][0, 0] += 1  # the arrays are the caller's, not views of the file's bytes


def test_python2_bytes_and_numpy1_names(tmp_path):
  """Python 2 wrote str as BINSTRING and NumPy 1 named numpy.core: read as bytes and arrays."""
  value = {b"data": np.arange(6, dtype=np.uint8).reshape(2, 3), b"labels": [1, 2]}
  blob = pickle.dumps(value, protocol=2).replace(b"numpy._core.", b"numpy.core.")
  path = tmp_path / "old"
  path.write_bytes(blob)
  assert _equal(value, pickled.arrays(path))
  # A hand-written Python 2 pickle: {'a': 'xy'} with SHORT_BINSTRING keys and values.
  path.write_bytes(b"\x80\x02}q\x00U\x01aU\x02xys.")
  assert pickled.arrays(path) == {b"a": b"xy"}


class _Exploit:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"echo pwned > {self.marker}",))


class _Plain:
  pass


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("make, names", [
    (lambda marker: {b"data": _Exploit(marker)}, r"(posix|nt|os)\.system"),
    (lambda marker: [_Plain()], r"copy_reg\._reconstructor|test_pickled\._Plain"),
    (lambda marker: np.array([1, "x"], dtype=object), r"dtype object|only booleans and numbers"),
    (lambda marker: np.zeros(2, [("a", "f4"), ("b", "i4")]), r"dtype|no plain numeric type"),
    (lambda marker: {1, 2}, r"opcode EMPTY_SET|(__builtin__|builtins)\.set"),
])  # fmt: skip
def test_code_objects_and_object_arrays_are_refused(tmp_path, protocol, make, names):
  marker = tmp_path / "pwned"
  path = tmp_path / "batch"
  path.write_bytes(pickle.dumps(make(marker), protocol=protocol))
  with pytest.raises(ValueError, match=rf"refusing to read .*batch as data: .*({names})") as e:
    pickled.arrays(path)
  assert "\n" not in str(e.value)
  assert not marker.exists()


def _ndarray_opcodes(shape_opcodes: bytes, raw: bytes) -> bytes:
  """A protocol-2 pickle of one uint8 array as NumPy writes it, with ``shape`` and ``raw`` given."""
  dtype = b"cnumpy\ndtype\nU\x02u1\x89\x88\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
  return (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
          + b"(K\x01" + shape_opcodes + dtype + b"\x89T" + struct.pack("<i", len(raw)) + raw + b"tb.")


def test_hand_written_numpy_opcodes_are_read(tmp_path):
  path = tmp_path / "a"
  path.write_bytes(_ndarray_opcodes(b"K\x02K\x03\x86", bytes(range(6))))
  assert _equal(pickled.arrays(path), np.arange(6, dtype=np.uint8).reshape(2, 3))


@pytest.mark.parametrize("blob, message", [
    (_ndarray_opcodes(b"K\x04K\x03\x86", bytes(range(6))), r"shape \(4, 3\) and uint8 holds 6 bytes, not 12"),
    (_ndarray_opcodes(b"J\xff\xff\xff\x7fJ\xff\xff\xff\x7f\x86", b""), "holds 0 bytes, not"),
    (b"\x80\x02T\xff\xff\xff\x7fab.", r"expected 2147483647 bytes .* but only"),
    (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"ab.", "but only"),
    (b"\x80\x02]q\x00h\x05.", "KeyError"),
    (b"\x80\x02]]e.", "needs a MARK"),
    (b"\x80\x02}]]s.", "TypeError"),
    (b"\x80\x02]K\x01s.", "adds to a dict, with none below it"),
    (b"\x80\x02K\x01K\x02.", "does not hold one object"),
    (b"\x80\x02\xff", "opcode"),
    (b"", "exhausted before seeing STOP"),
    (b"\x80\x02]", "no STOP opcode|exhausted"),
])  # fmt: skip
def test_corrupt_or_lying_files_are_refused_without_allocating_what_they_declare(tmp_path, blob, message):
  _refused(tmp_path, blob, rf"batch.*({message})")


def _refused(tmp_path, blob: bytes, pattern: str) -> None:
  """``blob`` as a file is refused in one line matching ``pattern``."""
  path = tmp_path / "batch"
  path.write_bytes(blob)
  with pytest.raises(ValueError, match=pattern) as e:
    pickled.arrays(path)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("blob, message", [
    (b"\x80\x02cnumpy\ndtype\nU\x02u1\x89\x88\x87R.", "NumPy dtype without its state"),
    (b"\x80\x02cnumpy\nndarray\n.", "numpy.ndarray left unbuilt"),
    (b"\x80\x02}(U\x01acnumpy\nndarray\nu.", "unbuilt"),
    (b"\x80\x02}}b.", "BUILD of a dict"),
    (b"\x80\x02cnumpy\nndarray\n)\x81.", "opcode NEWOBJ"),
    (b"\x80\x02cbuiltins\nbytes\nU\x01a\x85R.", "a call of builtins.bytes"),
    (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00utf-8\x86R.", "_codecs.encode"),
])  # fmt: skip
def test_names_are_only_ever_compared_never_called(tmp_path, blob, message):
  _refused(tmp_path, blob, rf"refusing to read .*batch as data: .*{message}")


def test_a_missing_file_is_one_line(tmp_path):
  with pytest.raises(ValueError, match=r"cannot read .*nothing"):
    pickled.arrays(tmp_path / "nothing")


def test_reading_never_calls_pickle(tmp_path, monkeypatch):
  """The module's code does not reach pickle's loaders at all (they are made to fail here)."""
  path = tmp_path / "batch"
  path.write_bytes(pickle.dumps(_data(), protocol=2))
  for name in ("load", "loads", "Unpickler", "_Unpickler"):
    monkeypatch.setattr(pickle, name, None)
  assert isinstance(pickled.arrays(path), dict)


@pytest.mark.parametrize("blob, message", [
    (b"\x80\x02}N" + b"\x85" * 1_000_000 + b"Ns.", "a dict key nested more than 64 deep"),
    (b"\x80\x02N" + b"\x85" * 1_000_000 + b".", "containers nested more than 64 deep"),
    (b"\x80\x02]q\x00h\x00a.", "a container that holds itself"),
])  # fmt: skip
def test_nesting_that_would_crash_or_loop_a_reader_is_refused(tmp_path, blob, message):
  """A tuple nested a million deep crashes Python when hashed as a dict key (C recursion), and a
  list that holds itself has no end: both refused as they are read, in one line."""
  _refused(tmp_path, blob, rf"refusing to read .*batch as data: {message}")


def test_mutated_files_are_data_or_one_line_refusals(tmp_path):
  """2000 random mutations (bytes changed, cut, inserted, repeated) of pickles of every protocol:
  each reads as data or raises one one-line ValueError, never another exception."""
  import random
  rng = random.Random(0)
  value = {b"data": np.arange(60, dtype=np.uint8).reshape(2, 30), b"labels": [1, 2],
           "f": np.ones((2, 3), ">f4"), "s": np.float64(1.5), "t": ("a", b"b", None, True, 2**70)}
  blobs = [pickle.dumps(value, protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
  path = tmp_path / "batch"
  for _ in range(2000):
    b = bytearray(rng.choice(blobs))
    for _ in range(rng.randint(1, 4)):
      k, op = rng.randrange(len(b)), rng.random()
      if op < 0.5:
        b[k] = rng.randrange(256)
      elif op < 0.7:
        del b[k:k + rng.randint(1, 8)]
      elif op < 0.85:
        b[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
      else:
        b[k:k] = b[rng.randrange(len(b)):][:rng.randint(1, 30)]
    path.write_bytes(bytes(b))
    try:
      pickled.arrays(path)
    except ValueError as e:
      assert "\n" not in str(e) and str(path) in str(e), str(e)
