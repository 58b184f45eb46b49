"""Writing a file so that a crash or a kill never leaves half of it: every file gradjax writes (results,
checkpoints, captured updates, solver states) goes through :func:`atomic_write`; a file's digest,
which tells one content from another whatever its path (:func:`sha256`); reading an ``.npz`` back
without unpickling or allocating what a corrupt header declares (:func:`npz_arrays`); and whether a
value read back from such a file is a number (:func:`is_number`)."""

import functools
import hashlib
import io
import math
import os
import uuid
import zipfile
import zlib
from typing import Any, Callable

import numpy as np


def atomic_write(path, write: Callable[[Any], None], binary: bool) -> None:
  """Writes via ``write(file)`` to a fresh temp file next to ``path``, then renames it over."""
  path = os.path.abspath(os.fspath(path))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # Same directory, so os.replace is atomic.
  try:
    with open(tmp, "xb" if binary else "x", encoding=None if binary else "utf-8") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def sha256(path) -> str:
  """The hex SHA-256 digest of the file at ``path`` (read in blocks of 1 MiB; a file read before,
  unchanged since by its inode, size and times, is not read again)."""
  stat = os.stat(path)
  return _sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns,
                 stat.st_ino)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, *stat) -> str:
  del stat  # the cache's key: a file replaced or written since has another
  digest = hashlib.sha256()
  with open(path, "rb") as fh:
    for block in iter(lambda: fh.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def is_number(value) -> bool:
  """Whether ``value``, read back from a JSON file gradjax wrote, is a finite number (an int or a
  float; JSON's true and false are no numbers, though Python's bool is an int)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return False
  try:
    return math.isfinite(value)
  except OverflowError:  # an integer past a float's range
    return False


def check_npy_headers(data, where: str, keys=None) -> None:
  """Reads each ``.npy`` entry's header (of ``keys`` only, unless None) and checks that the entry
  holds the bytes its shape and dtype need, before NumPy allocates them (a corrupt header may
  declare terabytes). ``data``: the archive's bytes or its path."""
  with zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data) as archive:
    for info in archive.infolist():
      if not info.filename.endswith(".npy"):
        continue
      key = info.filename[:-4]
      if keys is not None and key not in keys:
        continue
      with archive.open(info) as fh:
        if fh.read(6) != b"\x93NUMPY":
          continue  # not an array: reported below, by name
        fh.seek(0)
        try:
          version = np.lib.format.read_magic(fh)
          read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
          shape, _, dtype = read(fh)
          header = fh.tell()
        except Exception as e:  # NumPy's header parser raises ValueError, SyntaxError, TokenError...
          raise ValueError(f"{where}: entry {key!r} is corrupt: its header: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
      if dtype.hasobject:
        continue  # np.load refuses it below, by name
      need = int(np.prod(shape, dtype=object)) * dtype.itemsize
      if info.file_size - header != need:
        raise ValueError(f"{where}: entry {key!r} is corrupt: its shape {shape} and dtype {dtype} "
                         f"need {need} bytes, it holds {info.file_size - header}")


def npz_arrays(data: bytes, where: str) -> dict[str, np.ndarray]:
  """Every entry of the ``.npz`` bytes ``data``, read with ``allow_pickle=False``.

  Raises:
    ValueError: (one line, prefixed by ``where``) an entry that holds Python objects (never
      unpickled), or a corrupt or truncated archive.
  """
  out = {}
  try:
    check_npy_headers(data, where)
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      for key in npz.files:
        try:
          out[key] = npz[key]
        except ValueError as e:
          if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise ValueError(f"{where}: entry {key!r} holds Python objects; refusing to unpickle") from None
          raise ValueError(f"{where}: entry {key!r} is corrupt: {e}") from None
        if not isinstance(out[key], np.ndarray):
          raise ValueError(f"{where}: entry {key!r} is not a NumPy array")
  except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as e:
    raise ValueError(f"{where} is corrupt: {type(e).__name__}: {e}") from None
  return out
