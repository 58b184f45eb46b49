"""Writing a file so that a crash or a kill never leaves half of it: every file gradjax writes (results,
checkpoints, captured updates, solver states) goes through :func:`atomic_write`; a file's digest,
which tells one content from another whatever its path (:func:`sha256`); and whether a value read back
from such a file is a number (:func:`is_number`)."""

import hashlib
import math
import os
import uuid
from typing import Any, Callable


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
  """The hex SHA-256 digest of the file at ``path`` (read in blocks of 1 MiB)."""
  digest = hashlib.sha256()
  with open(path, "rb") as fh:
    for block in iter(lambda: fh.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def is_number(value) -> bool:
  """Whether ``value``, read back from a JSON file gradjax wrote, is a finite number (an int or a
  float; JSON's true and false are no numbers, though Python's bool is an int)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
