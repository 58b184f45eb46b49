"""Model checkpoints as plain ``.npz`` files: arrays and a JSON header, never pickle.

A checkpoint holds the model variables, a nested dict of arrays (``{"params": {...}, ["batch_stats":
{...}]}``, as :func:`gradjax.models.create` makes them), one array per leaf under the key of its
'/'-joined path (``"params/Dense_0/kernel"``), and the key ``"__metadata__"``: a uint8 array of the
UTF-8 bytes of a JSON object (model name, init, activation, number of classes, input shape, epoch,
accuracy, ... whatever the writer passes). Reading uses ``np.load(allow_pickle=False)``, so a file can
only ever yield numeric arrays.

Example::

  checkpoint.save("runs/m/epoch_3.npz", model.variables,
                  {"model": "mlp", "init": None, "act": None, "num_classes": 10,
                   "input_shape": [28, 28, 1], "epoch": 3})
  model = checkpoint.load_model("runs/m/epoch_3.npz")   # a gradjax.models.Model
"""

import io
import json
import os
import zipfile
import zlib
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import files, models

METADATA_KEY = "__metadata__"
_SEP = "/"


def _flatten(tree, prefix: str = "", what: str = "variables") -> dict[str, object]:
  """{'/'-joined path: leaf} of a nested dict; one-line ValueError for keys that cannot be stored."""
  if not isinstance(tree, Mapping):
    raise ValueError(f"{what} must be a nested dict of arrays, got {type(tree).__name__}")
  if not tree:
    raise ValueError(f"{what} has an empty dict at {prefix or 'the top level'!r}, which an .npz "
                     "cannot hold")
  out = {}
  for key, value in tree.items():
    if not isinstance(key, str) or not key or _SEP in key or key == METADATA_KEY:
      raise ValueError(f"{what} key {key!r} under {prefix or 'the top level'!r} must be a non-empty "
                       f"string without {_SEP!r} and not {METADATA_KEY!r}")
    path = f"{prefix}{_SEP}{key}" if prefix else key
    if isinstance(value, Mapping):
      out.update(_flatten(value, path, what))
    else:
      out[path] = value
  return out


def _unflatten(flat: dict[str, np.ndarray], where: str) -> dict:
  """Nested dicts from {'a/b/c': array}; ValueError when a path is both a leaf and a folder."""
  tree: dict = {}
  for path in sorted(flat):
    parts = path.split(_SEP)
    if not all(parts):
      raise ValueError(f"{where}: bad array key {path!r} (empty path component)")
    node = tree
    for part in parts[:-1]:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise ValueError(f"{where}: key {path!r} nests under an array")
    if parts[-1] in node:
      raise ValueError(f"{where}: key {path!r} is both an array and a group of arrays")
    node[parts[-1]] = flat[path]
  return tree


def _host_array(path: str, leaf) -> np.ndarray:
  if not isinstance(leaf, (np.ndarray, np.generic, jax.Array, int, float, bool)):
    # A list or tuple would be stacked into one array and come back as that array.
    raise ValueError(f"variable {path!r} is a {type(leaf).__name__}; checkpoints hold nested dicts "
                     "of arrays (give a list's items keys)")
  arr = np.asarray(leaf)
  if arr.dtype.kind not in "biuf":
    raise ValueError(f"variable {path!r} has dtype {arr.dtype}; checkpoints hold bool, int and "
                     "float arrays only")
  return arr


def _check_finite(path: str, arr: np.ndarray, where: str) -> None:
  if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{where}: variable {path!r} contains NaN or inf")


def save(path, variables, metadata: dict) -> None:
  """Writes ``variables`` and ``metadata`` to the ``.npz`` file ``path``, atomically.

  Args:
    path: target file; written as given (no ``.npz`` is appended). Parent folders are created. The
      data go to a temporary file in the same folder, which then replaces ``path`` (``os.replace``), so
      a reader never sees a half-written checkpoint.
    variables: nested dict of arrays (numpy or JAX; bool, int or float, finite). Keys must be
      non-empty strings without ``"/"``; empty sub-dicts cannot be stored.
    metadata: a JSON-serialisable dict (finite numbers only), stored as the ``"__metadata__"`` entry.

  Raises:
    ValueError: (one line) for anything that cannot be stored faithfully.
  """
  if not isinstance(metadata, Mapping):
    raise ValueError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}")
  try:
    header = json.dumps(dict(metadata), sort_keys=True, allow_nan=False)
  except (TypeError, ValueError) as e:
    raise ValueError(f"checkpoint metadata is not JSON-serialisable: {e}") from None
  arrays = {}
  for key, leaf in _flatten(variables).items():
    arrays[key] = _host_array(key, leaf)
    _check_finite(key, arrays[key], "save")
  arrays[METADATA_KEY] = np.frombuffer(header.encode("utf-8"), np.uint8)
  files.atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)


def _reject_constant(name):
  raise ValueError(f"non-finite number {name}")


def parse_metadata(raw, where: str) -> dict:
  if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
    raise ValueError(f"{where}: {METADATA_KEY!r} must be a 1-D uint8 array of JSON text")
  try:
    metadata = json.loads(raw.tobytes().decode("utf-8"), parse_constant=_reject_constant)
  except (UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{where}: invalid metadata JSON: {e}") from None
  if not isinstance(metadata, dict):
    raise ValueError(f"{where}: metadata must be a JSON object, got {type(metadata).__name__}")
  return metadata


def load(path) -> tuple[dict, dict]:
  """Reads a checkpoint written by :func:`save`.

  Returns:
    ``(variables, metadata)``: nested dicts of NumPy arrays (host memory; the dtypes as saved) and the
    metadata dict.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: (one line) the file is not an ``.npz``, an entry holds Python objects (pickled data is
      never loaded) or is not an array, the metadata are missing or not a JSON object, or a weight is
      NaN or inf.
  """
  path = os.fspath(path)
  with open(path, "rb") as fh:
    data = fh.read()
  where = f"checkpoint {path}"
  if not zipfile.is_zipfile(io.BytesIO(data)):
    raise ValueError(f"{where} is not an .npz file (not a zip archive)")
  _refuse_torch(data, where)
  flat, metadata = {}, None
  for key, value in files.npz_arrays(data, where).items():
    if key == METADATA_KEY:
      metadata = parse_metadata(value, where)
      continue
    if value.dtype.kind not in "biuf":
      raise ValueError(f"{where}: entry {key!r} has unsupported dtype {value.dtype}")
    if not value.dtype.isnative:  # another byte order (a big-endian writer): JAX reads native only
      value = value.astype(value.dtype.newbyteorder("="))
    _check_finite(key, value, where)
    flat[key] = value
  if metadata is None:
    raise ValueError(f"{where} has no {METADATA_KEY!r} entry")
  if not flat:
    raise ValueError(f"{where} holds no variables")
  return _unflatten(flat, where), metadata


def read_metadata(path) -> dict:
  """The metadata of the checkpoint ``path``, without reading its arrays.

  Raises:
    FileNotFoundError, or ValueError (one line) as :func:`load`."""
  path = os.fspath(path)
  where = f"checkpoint {path}"
  if not zipfile.is_zipfile(path):
    raise ValueError(f"{where} is not an .npz file (not a zip archive)")
  try:
    _refuse_torch(path, where)
    files.check_npy_headers(path, where, keys={METADATA_KEY})
  except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
    raise ValueError(f"{where} is corrupt: {type(e).__name__}: {e}") from None
  try:
    with np.load(path, allow_pickle=False) as npz:
      raw = npz[METADATA_KEY] if METADATA_KEY in npz.files else None
  except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as e:
    raise ValueError(f"{where} is corrupt: {type(e).__name__}: {e}") from None
  except ValueError as e:
    if "allow_pickle" in str(e) or "Object arrays" in str(e):
      raise ValueError(f"{where}: entry {METADATA_KEY!r} holds Python objects; refusing to unpickle") from None
    raise ValueError(f"{where}: entry {METADATA_KEY!r} is corrupt: {e}") from None
  if raw is None:
    raise ValueError(f"{where} has no {METADATA_KEY!r} entry")
  return parse_metadata(raw, where)


def _refuse_torch(source, where: str) -> None:
  """The one line for a ``torch.save`` archive (a zip holding ``data.pkl``) given as a checkpoint:
  named as such, never unpickled (its weights are read with --weights, saved as safetensors)."""
  try:
    with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as archive:
      names = archive.namelist()
  except (zipfile.BadZipFile, OSError):
    return  # a corrupt archive: the reader names it
  if any(n.endswith("data.pkl") for n in names):
    raise ValueError(f"{where} is a torch.save archive (pickled), not a gradjax checkpoint; refusing "
                     "to unpickle: give PyTorch weights with --weights, saved as safetensors")


def check_compatible(variables, like) -> None:
  """Raises a one-line ``ValueError`` unless ``variables`` has the tree, shapes and dtypes of ``like``.

  Both are nested dicts of arrays (e.g. loaded variables and a freshly created model's). Paths are
  compared in sorted order; the error names the first missing or unexpected path, or the first path
  whose shape or dtype differs.
  """
  got = _flatten(variables, what="variables")
  want = _flatten(like, what="reference variables")
  for path in sorted(set(got) | set(want)):
    if path not in got:
      raise ValueError(f"variables lack {path!r} of the model (shape {tuple(jnp.shape(want[path]))})")
    if path not in want:
      raise ValueError(f"variables have {path!r}, which the model does not")
    a, b = got[path], want[path]
    if tuple(jnp.shape(a)) != tuple(jnp.shape(b)):
      raise ValueError(f"variable {path!r} has shape {tuple(jnp.shape(a))}, the model expects "
                       f"{tuple(jnp.shape(b))}")
    if jnp.result_type(a) != jnp.result_type(b):
      raise ValueError(f"variable {path!r} has dtype {jnp.result_type(a)}, the model expects "
                       f"{jnp.result_type(b)}")


# Metadata read by load_model, and the models.create keyword each one feeds.
_CREATE_KEYS = {"init": "init", "act": "act", "init_scale": "init_scale", "stride1": "stride1"}
# The JSON type each of them must have (bool is no number here, though Python's bool is an int).
_CREATE_TYPES = {"init": (str, "a string"), "act": (str, "a string"),
                 "init_scale": ((int, float), "a number"), "stride1": (bool, "true or false")}


def model_from_metadata(metadata: dict, key: jax.Array | None = None, **module_kwargs) -> models.Model:
  """A freshly initialised :class:`gradjax.models.Model` as described by checkpoint ``metadata``.

  Reads ``model`` (registry name), ``num_classes``, ``input_shape`` ([H, W, C], or [T] for text), and
  if present ``init``, ``act``, ``init_scale``, ``stride1``, ``text_sizes`` (a dict of
  :class:`gradjax.models.TextSizes`) and ``param_dtype`` (default "float32"); ``None``
  values mean the model's default. The variables are initialised from ``key`` (default
  ``jax.random.key(0)``). ``module_kwargs`` choose how the model is computed, not what it is
  (``remat``, ``conv``; see :func:`gradjax.models.get_module`).
  """
  missing = [k for k in ("model", "num_classes", "input_shape") if k not in metadata]
  if missing:
    raise ValueError(f"checkpoint metadata lack {', '.join(missing)} (needed to rebuild the model)")
  kwargs = {arg: metadata[k] for k, arg in _CREATE_KEYS.items() if metadata.get(k) is not None}
  for k, (kind, name) in _CREATE_TYPES.items():
    value = metadata.get(k)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
      raise ValueError(f"checkpoint metadata: {k} must be {name}, got {value!r}")
  dtype = metadata.get("param_dtype") or "float32"
  try:
    kwargs["param_dtype"] = jnp.dtype(dtype)
  except TypeError:
    raise ValueError(f"checkpoint metadata: unknown param_dtype {dtype!r}") from None
  if not jnp.issubdtype(kwargs["param_dtype"], jnp.floating):
    raise ValueError(f"checkpoint metadata: param_dtype must be a float dtype, got {dtype!r}")
  shape = metadata["input_shape"]
  if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
    raise ValueError(f"checkpoint metadata: input_shape must be a list of ints, got {shape!r}")
  classes = metadata["num_classes"]
  if not isinstance(classes, int) or isinstance(classes, bool) or not isinstance(metadata["model"], str):
    raise ValueError("checkpoint metadata: model must be a string and num_classes an int")
  if metadata.get("text_sizes") is not None:
    sizes = metadata["text_sizes"]
    if not isinstance(sizes, dict) or set(sizes) != set(models.TextSizes._fields) \
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
      raise ValueError(f"checkpoint metadata: text_sizes must map {', '.join(models.TextSizes._fields)} "
                       "to ints")
    kwargs["text_sizes"] = models.TextSizes(**sizes)
  key = jax.random.key(0) if key is None else key
  return models.create(metadata["model"], key, input_shape=tuple(shape),
                       num_classes=metadata["num_classes"], **kwargs, **module_kwargs)


def load_model(path, **module_kwargs) -> models.Model:
  """The model of checkpoint ``path`` with its trained variables.

  Rebuilds the module with :func:`model_from_metadata` (``module_kwargs`` go there), checks the loaded variables against the fresh
  ones (:func:`check_compatible`) and returns the ``Model`` with the loaded variables as JAX arrays.
  ``load(path)[1]`` gives the metadata (normalisation, epoch, accuracy, ...).
  """
  variables, metadata = load(path)
  model = model_from_metadata(metadata, **module_kwargs)
  try:
    check_compatible(variables, model.variables)
  except ValueError as e:
    raise ValueError(f"checkpoint {os.fspath(path)} does not fit model {metadata['model']!r}: {e}") from None
  return model._replace(variables=jax.tree.map(jnp.asarray, variables))
