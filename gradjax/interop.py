"""Weights and observed updates exchanged with PyTorch systems: safetensors or ``.npz`` files.

An audit starts from what a real federated system sent: the global model's weights and a client's
gradient (FedSGD) or its weights after local training (FedAvg). Those systems are mostly PyTorch, so
the files hold tensors named as in ``model.state_dict()`` / ``model.named_parameters()``, in PyTorch
layouts. This module maps them onto a gradjax model, builds the :class:`~gradjax.observation.Observation`
an attack takes, and writes gradjax's own weights and observations back in the same format, so a round
trip is exact. Nothing here imports torch, and nothing is ever unpickled.

File format
-----------
A file is either **safetensors** (any dtype but complex ones; brain float and 8-bit floats are read as
float32; metadata in its ``__metadata__`` header, a
str -> str map) or an **``.npz``** read with ``allow_pickle=False`` (metadata in an entry
``__metadata__``: a string or uint8 array holding a JSON object). Tensors are named as in PyTorch.

* weights file: ``model.state_dict()``: parameters and BatchNorm buffers (``running_mean``,
  ``running_var``; ``num_batches_tracked`` is accepted and ignored).
* observation file, metadata ``kind``:

  ``gradient``  each parameter's ``.grad`` (FedSGD), named as ``model.named_parameters()``;
  ``weights``   the client's weights after local training (FedAvg W_{t+1}; parameters, buffers
                optional); the observed update is W_t − W_{t+1}, with W_t from the weights file;
  ``update``    W_t − W_{t+1} directly (this sign), named as the parameters.

Metadata keys (all optional, values as strings in safetensors): ``kind`` (default ``gradient``),
``num_samples``, ``labels`` (``"3,8,8"``), ``label_order`` (``ordered`` or ``multiset``), ``train``
(``true`` when the client ran BatchNorm in training mode), ``local_lr``, ``local_epochs``,
``local_batch_size``, ``local_momentum`` (FedAvg local training), ``model`` (gradjax registry name),
``input_shape`` (``"32,32,3"``, H, W, C), ``layout`` (only ``torch`` is read), ``defense`` (the
spec of the defense the client applied to what it sent, :func:`gradjax.defenses.parse`: what an
attack adapts to, :mod:`gradjax.adaptive`), ``bn_momentum`` (PyTorch's BatchNorm momentum, 0.1 if unset:
a ``weights`` file of a training-mode client after one local step that holds the BatchNorm buffers
reveals its batch's moments, :func:`gradjax.clients.batch_moments`), and the DP-SGD the client's
training ran (:data:`DP_SGD_KEYS`, as Opacus' ``make_private`` takes them: ``dp_sgd_max_norm`` the
per-example clipping bound, ``dp_sgd_noise_multiplier``, and for its (ε, δ) ``dp_sgd_sampling_rate``,
``dp_sgd_steps``, ``dp_sgd_delta``; ``dp_sgd_poisson`` (``true``: Opacus' default
``poisson_sampling=True``, each step's batch drawn at ``dp_sgd_sampling_rate``) and
``dp_sgd_expected_batch_size`` (Opacus' ``optimizer.expected_batch_size``, the divisor of such a
step's sum; a FedSGD capture's ``num_samples`` is then the count its step drew);
:func:`declared_dp_sgd`).

Layouts (PyTorch -> gradjax, :class:`Entry`)
--------------------------------------------
``conv``   (O, I, kh, kw) -> (kh, kw, I, O)
``dense``  (out, in) -> (in, out)
``dense`` with ``chw=(C, H, W)``: a linear layer after ``x.view(N, -1)`` of an NCHW map: its input
           index c·HW + h·W + w becomes (h·W + w)·C + c, gradjax flattening NHWC maps.
``vector`` biases, BatchNorm weight (-> ``scale``), bias, running_mean (-> ``mean``), running_var
           (-> ``var``), unchanged.

Names of the zoo (:func:`zoo_mapping`; DLG's and Inverting Gradients' PyTorch code, the ResNets of
kuangliu/pytorch-cifar that DLG ships)::

  lenet_zhu, lenet5  body.{0,2,4[,6]}.{weight,bias}, fc.0.{weight,bias}
  convnet-W          model.conv{i}.*, model.bn{i}.*  (i = 0..7), model.linear.*
  mlp-H              fc1.*, fc2.*  (hidden, head)
  resnetD-W          conv1, bn1, layer{s}.{b}.{conv1,bn1,conv2,bn2,shortcut.0,shortcut.1}, linear
  gpt                embed, positions, blocks.{i}.{norm_0,attention.{query,key,value,out},norm_1,
                     ffn_0,ffn_1}, norm_f (the twin of gradjax.models.gpt; four nn.Linear per
                     attention, as Flax's heads: weight (heads·head_dim, d) <-> kernel (d, heads, head_dim))
  bert               embed, positions, norm_embed, blocks.{i}.* (as gpt's), transform, norm_head,
                     output_bias (the twin of gradjax.models.bert)

Other spellings of the same network (torchvision's ``downsample`` and ``fc``) are handled by
``rename`` rules, regular-expression substitutions applied to the file's names first, e.g.
``(("downsample", "shortcut"), (r"^fc\\.", "linear."))``. For an architecture of your own, build
the mapping with :func:`module_mapping` from (PyTorch module name, gradjax module path, kind) rows.
"""

import io
import json
import math
import os
import re
import struct
import zipfile
from collections.abc import Mapping as MappingABC
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from gradjax import clients, files, models, priors
from gradjax.compilation import device_array, prng_key
from gradjax.observation import Observation, check_observation

KINDS = ("gradient", "weights", "update")
LAYOUTS = ("conv", "dense", "vector", "heads_in", "heads_out", "heads_vector")
METADATA_KEY = "__metadata__"
IGNORED_BUFFERS = ("num_batches_tracked",)  # PyTorch BatchNorm counters: no gradjax counterpart


class Entry(NamedTuple):
  """One tensor: its PyTorch ``name``, the gradjax ``path`` in the variables (e.g. ``("params",
  "Conv_0", "kernel")``), its ``layout`` (one of :data:`LAYOUTS`) and, for a dense layer fed by a
  flattened NCHW map, that map's ``chw`` = (C, H, W); for an attention projection (``heads_*``
  layouts), its gradjax ``shape``."""

  name: str
  path: tuple[str, ...]
  layout: str
  chw: tuple[int, int, int] | None = None
  shape: tuple[int, ...] | None = None  # the gradjax shape, for the heads layouts


class TorchMapping(NamedTuple):
  """The tensors of one model: ``entries`` in PyTorch registration order, and ``ignored``: buffer
  names a file may hold (``num_batches_tracked``) that gradjax does not use."""

  entries: tuple[Entry, ...]
  ignored: tuple[str, ...] = ()

  def params(self) -> tuple[Entry, ...]:
    """The entries of trainable parameters (what a gradient or update holds)."""
    return tuple(e for e in self.entries if e.path[0] == "params")


# --- layouts -------------------------------------------------------------------------------------

def chw_permutation(chw) -> np.ndarray:
  """perm[j] = the NCHW flat index of NHWC flat index j, for a (C, H, W) map."""
  c, h, w = chw
  return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)


def to_gradjax(entry: Entry, array: np.ndarray) -> np.ndarray:
  """``array`` in PyTorch layout -> gradjax layout (see the module docstring)."""
  if entry.layout in ("heads_in", "heads_out"):  # a Linear's (out, in) -> Flax's DenseGeneral
    return np.transpose(array).reshape(entry.shape)
  if entry.layout == "heads_vector":
    return np.reshape(array, entry.shape)
  if entry.layout == "conv":
    return np.transpose(array, (2, 3, 1, 0))
  if entry.layout == "dense":
    kernel = np.transpose(array)
    return kernel if entry.chw is None else kernel[chw_permutation(entry.chw)]
  return array


def to_torch(entry: Entry, array: np.ndarray) -> np.ndarray:
  """``array`` in gradjax layout -> PyTorch layout (the inverse of :func:`to_gradjax`), a writable
  copy (``torch.as_tensor`` warns on a read-only array, as a ``jax.Array``'s view is)."""
  array = np.array(array)
  if entry.layout == "heads_in":  # (in, heads, head_dim) -> (heads·head_dim, in)
    return np.ascontiguousarray(array.reshape(array.shape[0], -1).T)
  if entry.layout == "heads_out":  # (heads, head_dim, out) -> (out, heads·head_dim)
    return np.ascontiguousarray(array.reshape(-1, array.shape[-1]).T)
  if entry.layout == "heads_vector":
    return np.ascontiguousarray(array.reshape(-1))
  if entry.layout == "conv":
    return np.ascontiguousarray(np.transpose(array, (3, 2, 0, 1)))
  if entry.layout == "dense":
    if entry.chw is not None:
      array = array[np.argsort(chw_permutation(entry.chw))]
    return np.ascontiguousarray(np.transpose(array))
  return np.ascontiguousarray(array)


def torch_shape(entry: Entry, shape: Sequence[int]) -> tuple[int, ...]:
  """The PyTorch shape of a tensor whose gradjax shape is ``shape``."""
  shape = tuple(shape)
  if entry.layout == "heads_in":
    return (math.prod(shape[1:]), shape[0])
  if entry.layout == "heads_out":
    return (shape[-1], math.prod(shape[:-1]))
  if entry.layout == "heads_vector":
    return (math.prod(shape),)
  if entry.layout == "conv":
    return (shape[3], shape[2], shape[0], shape[1])
  if entry.layout == "dense":
    return (shape[1], shape[0])
  return shape


# --- mappings ------------------------------------------------------------------------------------

MODULE_KINDS = ("conv", "dense", "batch_norm", "layer_norm", "embedding", "attention", "parameter")


def module_mapping(variables, modules: Sequence[tuple], ignored: Sequence[str] = IGNORED_BUFFERS
                   ) -> TorchMapping:
  """A :class:`TorchMapping` from (PyTorch module name, gradjax module path, kind[, chw]) rows.

  Args:
    variables: the gradjax model's variables (biases are mapped where the module has one).
    modules: rows ``(torch_name, path, kind)`` or ``(torch_name, path, "dense", (C, H, W))``:
      ``torch_name`` the PyTorch module (``"features.0"``), ``path`` the gradjax module's path in
      ``variables["params"]`` (a tuple, or a '/'-joined string), ``kind`` one of
      :data:`MODULE_KINDS`. A BatchNorm row maps weight, bias, running_mean and running_var.
    ignored: buffer suffixes accepted in files and skipped (``module.num_batches_tracked``).

  Example, a torch ``nn.Sequential(Conv2d(3, 8, 3), ReLU(), Flatten(), Linear(8 * 30 * 30, 10))``
  against a Flax model with modules ``Conv_0`` and ``head``::

    module_mapping(variables, [("0", "Conv_0", "conv"), ("3", "head", "dense", (8, 30, 30))])
  """
  params = variables["params"]
  entries, skip = [], []
  for row in modules:
    if len(row) not in (3, 4):
      raise ValueError(f"mapping row {row!r} must be (torch_name, path, kind[, chw])")
    name, path, kind = row[:3]
    chw = tuple(int(d) for d in row[3]) if len(row) == 4 and row[3] is not None else None
    path = tuple(path.split("/")) if isinstance(path, str) else tuple(path)
    if kind not in MODULE_KINDS:
      raise ValueError(f"mapping row {name!r}: unknown kind {kind!r}; choose one of "
                       f"{', '.join(MODULE_KINDS)}")
    if chw is not None and kind != "dense":
      raise ValueError(f"mapping row {name!r}: chw applies to dense layers only")
    node = params
    for part in path:
      if not isinstance(node, MappingABC) or part not in node:
        raise ValueError(f"mapping row {name!r}: the model has no module {'/'.join(path)!r}")
      node = node[part]
    if kind == "layer_norm":
      entries += [Entry(f"{name}.weight", ("params", *path, "scale"), "vector"),
                  Entry(f"{name}.bias", ("params", *path, "bias"), "vector")]
      continue
    if kind == "embedding":
      entries.append(Entry(f"{name}.weight", ("params", *path, "embedding"), "vector"))
      continue
    if kind == "parameter":  # a bare tensor (nn.Parameter), the same layout in both
      entries.append(Entry(name, ("params", *path), "vector"))
      continue
    if kind == "attention":  # Flax's MultiHeadDotProductAttention; the twin's four nn.Linear
      for part in ("query", "key", "value", "out"):
        layout = "heads_out" if part == "out" else "heads_in"
        entries.append(Entry(f"{name}.{part}.weight", ("params", *path, part, "kernel"), layout,
                             shape=tuple(node[part]["kernel"].shape)))
        if "bias" in node[part]:
          bias = node[part]["bias"]
          entries.append(Entry(f"{name}.{part}.bias", ("params", *path, part, "bias"),
                               "vector" if part == "out" else "heads_vector",
                               shape=tuple(bias.shape)))
      continue
    if kind == "batch_norm":
      entries += [Entry(f"{name}.weight", ("params", *path, "scale"), "vector"),
                  Entry(f"{name}.bias", ("params", *path, "bias"), "vector"),
                  Entry(f"{name}.running_mean", ("batch_stats", *path, "mean"), "vector"),
                  Entry(f"{name}.running_var", ("batch_stats", *path, "var"), "vector")]
      skip += [f"{name}.{b}" for b in ignored]
      continue
    entries.append(Entry(f"{name}.weight", ("params", *path, "kernel"), kind, chw))
    if "bias" in node:
      entries.append(Entry(f"{name}.bias", ("params", *path, "bias"), "vector"))
  mapping = TorchMapping(tuple(entries), tuple(skip))
  _check_covers(mapping, variables)
  return mapping


def _leaf_paths(tree, prefix=()) -> list[tuple[str, ...]]:
  if isinstance(tree, MappingABC):
    return [p for k, v in tree.items() for p in _leaf_paths(v, (*prefix, k))]
  return [prefix]


def _get(tree, path):
  for part in path:
    tree = tree[part]
  return tree


def _check_covers(mapping: TorchMapping, variables) -> None:
  """Every variable is mapped exactly once, and every entry's path exists."""
  want = set(_leaf_paths({k: v for k, v in variables.items() if k in ("params", "batch_stats")}))
  seen: set = set()
  for e in mapping.entries:
    if e.path not in want:
      raise ValueError(f"mapping entry {e.name!r} points at {'/'.join(e.path)!r}, which the model "
                       "does not have")
    if e.path in seen:
      raise ValueError(f"mapping maps {'/'.join(e.path)!r} twice")
    seen.add(e.path)
  if want - seen:
    raise ValueError(f"mapping leaves model variable {'/'.join(sorted(want - seen)[0])!r} unmapped")
  names = [e.name for e in mapping.entries] + list(mapping.ignored)
  if len(set(names)) != len(names):
    raise ValueError("mapping uses a PyTorch name twice")


def flatten_chw(name: str, input_shape) -> tuple[int, int, int] | None:
  """(C, H, W) of the map that zoo model ``name`` flattens before a dense layer (its
  :class:`~gradjax.models.spec.ModelSpec`'s ``flatten_chw``), or ``None``: the LeNets flatten their last
  convolution's map, the ConvNet its second pooling's, the MLP its input; ResNets pool globally."""
  spec = models.family(name)
  return None if spec is None else spec.flatten_chw(spec.parse(name), tuple(input_shape))


def zoo_mapping(model: models.Model) -> TorchMapping:
  """The PyTorch names of a zoo model (its :class:`~gradjax.models.spec.ModelSpec`'s ``torch_rows``; see
  the module docstring for the naming).

  Args:
    model: a :class:`gradjax.models.Model` (its ``name``, ``input_shape`` and ``variables``).
  """
  spec = models.family(model.name)
  if spec is None or spec.torch_rows is None:
    raise ValueError(f"no PyTorch naming for model {model.name!r}; build one with "
                     "gradjax.interop.module_mapping")
  rows = spec.torch_rows(spec.parse(model.name), model.variables["params"],
                         flatten_chw(model.name, model.input_shape))
  return module_mapping(model.variables, rows)


# --- files ---------------------------------------------------------------------------------------

class TensorFile(NamedTuple):
  """A file's tensors (name -> NumPy array, as stored) and its metadata (str -> str)."""

  tensors: dict[str, np.ndarray]
  metadata: dict[str, str]


def _is_pickle(data: bytes) -> bool:
  return data[:1] == b"\x80" and len(data) > 1 and 2 <= data[1] <= 5


def read(path) -> TensorFile:
  """Reads a safetensors or ``.npz`` file (by content, whatever its extension).

  Raises:
    FileNotFoundError: no such file. IsADirectoryError is reported as a ValueError.
    ValueError: (one line) a pickle or a ``torch.save`` archive (never unpickled), a truncated or
      corrupt file, an entry that is not a numeric array, or metadata that is not a string map.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    raise ValueError(f"{path} is a directory, not a safetensors or .npz file")
  with open(path, "rb") as fh:
    data = fh.read()
  if len(data) >= 9 and data[8:9] == b"{" and struct.unpack("<Q", data[:8])[0] < 1 << 32:
    return _read_safetensors(path, data)
  if _is_pickle(data):
    raise ValueError(f"{path} is a pickle (torch.save?); refusing to unpickle: save it with "
                     "safetensors (see the README)")
  if data[:4] == b"PK\x03\x04":
    return _read_npz(path, data)
  raise ValueError(f"{path} is neither a safetensors nor an .npz file"
                   + (" (empty)" if not data else ""))


def read_metadata(path) -> dict[str, str]:
  """The metadata of a file :func:`read` reads, without reading a safetensors file's tensors (its
  header only); ValueError (one line) as :func:`read`."""
  path = os.fspath(path)
  with open(path, "rb") as fh:
    head = fh.read(8)
    size = struct.unpack("<Q", head)[0] if len(head) == 8 else None
    if size is not None and size < 1 << 32 and fh.read(1) == b"{":
      fh.seek(0)
      data = fh.read(8 + size)  # the header: a file's tensors follow it
      if len(data) == 8 + size:
        where = f"safetensors file {path}"
        return metadata_strings(_safetensors_header(data[8:], where).get(METADATA_KEY) or {}, where)
  return read(path).metadata  # an .npz, or a file read's one line describes


def _safetensors_header(raw: bytes, where: str) -> dict:
  """A safetensors file's JSON header (its bytes after the size); one line where it is corrupt."""
  try:
    header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{where} has a corrupt header: {e}") from None
  if not isinstance(header, dict):
    raise ValueError(f"{where} has a corrupt header (not a JSON object)")
  return header


def metadata_strings(raw: Any, where: str) -> dict[str, str]:
  """A file's metadata as the str -> str map safetensors holds: numbers as text, lists (of numbers,
  strings or booleans) joined by commas, booleans as ``true``/``false``, ``None`` values dropped;
  ``ValueError`` (one line, prefixed by ``where``) for anything else."""
  if not isinstance(raw, dict):
    raise ValueError(f"{where}: metadata must be a JSON object, got {type(raw).__name__}")

  def text(v):
    if isinstance(v, bool):
      return "true" if v else "false"
    if not isinstance(v, (str, int, float)):
      raise ValueError(f"{where}: metadata {k!r} must be a string, number or boolean, or a list of "
                       f"them, got {type(v).__name__}")
    return str(v)

  out = {}
  for k, v in raw.items():
    if v is None:
      continue
    out[str(k)] = ",".join(text(x) for x in v) if isinstance(v, (list, tuple)) else text(v)
  return out


# safetensors' dtype names. Brain float and the 8-bit floats (ml_dtypes, which JAX installs) are read as
# float32, which holds each of their values exactly: NumPy's dtype kind of theirs is not "f".
_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
    "U8": np.uint8, "BOOL": np.bool_, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2}


def _read_safetensors(path: str, data: bytes) -> TensorFile:
  """The safetensors format (a little-endian u64 header size, a JSON header of ``{name: {dtype,
  shape, data_offsets}}`` and ``__metadata__``, then the tensors' bytes), read here rather than by
  ``safetensors.numpy``, which has no brain float."""
  where = f"safetensors file {path}"
  (size,) = struct.unpack("<Q", data[:8])
  if 8 + size > len(data):
    raise ValueError(f"{where} is truncated (its header needs {size} bytes)")
  header = _safetensors_header(data[8:8 + size], where)
  metadata = metadata_strings(header.pop(METADATA_KEY, None) or {}, where)
  body = memoryview(data)[8 + size:]
  tensors, spans = {}, []
  for name, info in header.items():
    try:
      dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
      if not (all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end))
              and isinstance(dtype, str)):
        raise TypeError
    except (TypeError, KeyError, ValueError):
      raise ValueError(f"{where} has a corrupt header: tensor {name!r} needs a dtype, a shape and "
                       "two data offsets") from None
    if dtype not in _SAFETENSORS_DTYPES:
      raise ValueError(f"{where}: tensor {name!r} has dtype {dtype}, which gradjax does not read "
                       f"(it reads {', '.join(_SAFETENSORS_DTYPES)})")
    kind = np.dtype(_SAFETENSORS_DTYPES[dtype]).newbyteorder("<")
    if end > len(body) or begin > end:
      raise ValueError(f"{where} is corrupt or truncated: tensor {name!r} lies at bytes "
                       f"{begin}-{end} of {len(body)}")
    if end - begin != math.prod(shape) * kind.itemsize:
      raise ValueError(f"{where} is corrupt: tensor {name!r} of shape {tuple(shape)} and dtype "
                       f"{dtype} needs {math.prod(shape) * kind.itemsize} bytes, its offsets give "
                       f"{end - begin}")
    array = np.frombuffer(body[begin:end], kind).reshape(shape)
    tensors[name] = (array.astype(np.float32) if array.dtype.kind == "V"
                     else array.astype(array.dtype.newbyteorder("="), copy=True))
    spans.append((begin, end, name))
  # As the format requires: the tensors tile the body, no byte shared, none left over (overlapping
  # offsets read one tensor's bytes as another's; a tail is data no tensor names).
  at = 0
  for begin, end, name in sorted(spans):
    if begin != at:
      raise ValueError(f"{where} is corrupt: tensor {name!r} starts at byte {begin} of the data, "
                       f"{'inside another tensor' if begin < at else 'after a gap'} (at {at})")
    at = end
  if at != len(body):
    raise ValueError(f"{where} is corrupt: its tensors end at byte {at} of the data, which has "
                     f"{len(body)}")
  return TensorFile(tensors, metadata)


def _read_npz(path: str, data: bytes) -> TensorFile:
  where = f".npz file {path}"
  try:
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
  except zipfile.BadZipFile as e:
    raise ValueError(f"{where} is corrupt or truncated: {e}") from None
  if any(n.endswith("data.pkl") for n in names):
    raise ValueError(f"{path} is a torch.save archive (pickled); refusing to unpickle: save it "
                     "with safetensors (see the README)")
  tensors, metadata = {}, {}
  for key, value in files.npz_arrays(data, where).items():
    if key != METADATA_KEY:
      tensors[key] = value
      continue
    try:
      if value.dtype.kind == "U" and value.ndim == 0:
        text = str(value)
      elif value.dtype == np.uint8 and value.ndim == 1:
        text = value.tobytes().decode("utf-8")
      else:
        raise ValueError(f"{METADATA_KEY!r} must be a JSON string")
      raw = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
      raise ValueError(f"{where}: invalid metadata: {e}") from None
    metadata = metadata_strings(raw, where)  # its errors name the file once
  return TensorFile(tensors, metadata)


def file_format(path) -> str:
  """``"npz"`` for a ``.npz`` path, else ``"safetensors"``."""
  return "npz" if os.fspath(path).lower().endswith(".npz") else "safetensors"


def write(path, tensors: dict[str, np.ndarray], metadata: dict[str, Any] | None = None) -> None:
  """Writes ``tensors`` and ``metadata`` (values become strings) atomically; the format follows the
  extension (``.npz``, else safetensors)."""
  arrays = {}
  for name, value in tensors.items():
    if not isinstance(name, str) or not name or name == METADATA_KEY:
      raise ValueError(f"tensor names must be non-empty strings other than {METADATA_KEY!r} (the "
                       f"metadata's entry), got {name!r}")
    arr = np.asarray(value)
    arr = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)  # a scalar stays 0-d
    if arr.dtype.kind not in "biuf":
      raise ValueError(f"tensor {name!r} has dtype {arr.dtype}; only numeric arrays can be written")
    arrays[name] = arr
  meta = metadata_strings(dict(metadata or {}), "write")
  if file_format(path) == "npz":
    arrays[METADATA_KEY] = np.asarray(json.dumps(meta, sort_keys=True))
    files.atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)
  else:
    from safetensors.numpy import save
    blob = save(arrays, metadata=meta)
    files.atomic_write(path, lambda f: f.write(blob), binary=True)


# --- tensors <-> variables -----------------------------------------------------------------------

def apply_renames(tensors: dict, rename: Sequence[tuple[str, str]] = ()) -> dict:
  """``tensors`` with every name passed through the ``(pattern, replacement)`` regex rules in order."""
  if not rename:
    return dict(tensors)
  out = {}
  for name, value in tensors.items():
    new = name
    for pattern, repl in rename:
      try:
        new = re.sub(pattern, repl, new)
      except re.error as e:
        raise ValueError(f"bad rename pattern {pattern!r}: {e}") from None
    if new in out:
      raise ValueError(f"rename maps two tensors onto {new!r}")
    out[new] = value
  return out


def parse_renames(spec: str | None) -> tuple[tuple[str, str], ...]:
  """``"downsample=shortcut,^fc\\.=linear."`` -> ``(("downsample", "shortcut"), ("^fc\\.", "linear."))``."""
  out = []
  for item in filter(None, (s.strip() for s in (spec or "").split(","))):
    if "=" not in item:
      raise ValueError(f"bad rename rule {item!r}: use pattern=replacement")
    pattern, repl = item.split("=", 1)
    try:
      re.compile(pattern)
    except re.error as e:
      raise ValueError(f"bad rename rule {item!r}: {pattern!r} is no regular expression ({e})") from None
    out.append((pattern, repl))
  return tuple(out)


def _names_list(names, most: int = 6) -> str:
  names = sorted(names)
  shown = ", ".join(names[:most])
  return shown + (f" and {len(names) - most} more" if len(names) > most else "") if names else "none"


def _name_mismatch(expected: set, found: set) -> str:
  """The model's names the file lacks and the file's names the model lacks: a --rename where the
  file lacks some of the model's, another model where it only has more."""
  missing, extra = expected - found, found - expected
  if not missing:
    return (f"the file has tensors the model does not: {_names_list(extra)} (layers the zoo's twin "
            "lacks: the client's model is another one; README, 'The zoo's PyTorch twins')")
  return (f"the model expects {_names_list(missing)}, the file has {_names_list(extra)} instead "
          "(--config.model.rename maps names)")


def _to_tree(mapping: TorchMapping, tensors: dict[str, np.ndarray], like, entries, where: str,
             allowed_extra: Sequence[str] = ()):
  """The variables tree of ``entries`` read from ``tensors`` (validated against ``like``)."""
  known = {e.name for e in entries}
  extra_ok = set(mapping.ignored) | set(allowed_extra)
  for name in tensors:
    if name not in known and name not in extra_ok:
      raise ValueError(f"{where}: unexpected tensor {name!r} (the model has no such tensor); "
                       + _name_mismatch(known, set(tensors) - extra_ok))
  for name in mapping.ignored:
    if name in tensors:
      arr = tensors[name]
      if arr.dtype.kind not in "iu" or arr.size != 1:
        raise ValueError(f"{where}: {name!r} must be one integer, got {arr.dtype} {arr.shape}")
  tree: dict = {}
  for e in entries:
    if e.name not in tensors:
      raise ValueError(f"{where}: missing tensor {e.name!r}; "
                       + _name_mismatch(known, set(tensors) - extra_ok))
    arr = tensors[e.name]
    ref = _get(like, e.path)
    want = torch_shape(e, np.shape(ref))
    if arr.shape != want:
      raise ValueError(f"{where}: tensor {e.name!r} has shape {arr.shape}, the model expects {want}")
    if arr.dtype.kind != "f":
      raise ValueError(f"{where}: tensor {e.name!r} has dtype {arr.dtype}, expected a float dtype")
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"{where}: tensor {e.name!r} contains NaN or inf")
    value = to_gradjax(e, arr).astype(jnp.result_type(ref), copy=False)
    node = tree
    for part in e.path[:-1]:
      node = node.setdefault(part, {})
    node[e.path[-1]] = value
  return tree


def variables_from_torch(tensors: dict[str, np.ndarray], mapping: TorchMapping, like,
                         where: str = "weights") -> dict:
  """gradjax variables (``{"params", ["batch_stats"]}``, NumPy arrays in ``like``'s dtypes) from a
  PyTorch ``state_dict``'s tensors; a one-line ValueError names the first missing or unexpected
  tensor, wrong shape, wrong dtype or non-finite value."""
  return _to_tree(mapping, tensors, like, mapping.entries, where)


def params_from_torch(tensors: dict[str, np.ndarray], mapping: TorchMapping, like_params,
                      where: str = "gradient", allow_buffers: bool = False) -> dict:
  """A tree like ``like_params`` (the model's ``params``) from tensors named as
  ``model.named_parameters()`` (a gradient or an update). ``allow_buffers`` accepts, and skips, the
  BatchNorm buffers of a full ``state_dict`` (weights after local training)."""
  buffers = [e.name for e in mapping.entries if e.path[0] != "params"] if allow_buffers else []
  return _to_tree(mapping, tensors, {"params": like_params}, mapping.params(), where, buffers)["params"]


def variables_to_torch(variables, mapping: TorchMapping) -> dict[str, np.ndarray]:
  """A PyTorch ``state_dict`` (name -> NumPy array) from gradjax variables; BatchNorm's
  ``num_batches_tracked`` is written as 0 so ``load_state_dict(strict=True)`` accepts it."""
  out = {e.name: to_torch(e, _get(variables, e.path)) for e in mapping.entries}
  out.update({name: np.zeros((), np.int64) for name in mapping.ignored})
  return out


def params_to_torch(params, mapping: TorchMapping) -> dict[str, np.ndarray]:
  """Tensors named as ``model.named_parameters()`` from a params-shaped tree (a gradient)."""
  return {e.name: to_torch(e, _get({"params": params}, e.path)) for e in mapping.params()}


# --- observations --------------------------------------------------------------------------------

def _int(meta: dict, key: str, where: str) -> int | None:
  if key not in meta:
    return None
  try:
    return int(meta[key])
  except ValueError:
    raise ValueError(f"{where}: metadata {key!r} must be an integer, got {meta[key]!r}") from None


def _float(meta: dict, key: str, where: str) -> float | None:
  if key not in meta:
    return None
  try:
    value = float(meta[key])
  except ValueError:
    value = math.nan
  if not math.isfinite(value):
    raise ValueError(f"{where}: metadata {key!r} must be a finite number, got {meta[key]!r}")
  return value


# The metadata of a client that trained with DP-SGD, each the option ``defense.<key>`` of
# :mod:`gradjax.run.config` (:func:`declared_dp_sgd`).
DP_SGD_KEYS = ("dp_sgd_max_norm", "dp_sgd_noise_multiplier", "dp_sgd_sampling_rate", "dp_sgd_steps",
               "dp_sgd_delta", "dp_sgd_poisson", "dp_sgd_expected_batch_size")


def declared_dp_sgd(meta: dict, where: str) -> dict[str, float | int]:
  """The DP-SGD a file's metadata declare (:data:`DP_SGD_KEYS` present, as numbers, ``dp_sgd_poisson``
  as a bool; empty when it declares none). ValueError (one line) for a value that is not a number
  (or true/false), a noise multiplier or budget without the clipping bound they belong to, Poisson
  sampling without its rate, or an expected batch size without Poisson sampling (a fixed batch's
  sum is divided by its own size); ranges are the configuration's to check."""
  found: dict[str, float | int | bool] = {}
  for key in DP_SGD_KEYS:
    value = (_int(meta, key, where) if key == "dp_sgd_steps" else
             _bool(meta, key, where) if key == "dp_sgd_poisson" else _float(meta, key, where))
    if value is not None:
      found[key] = value
  if found and "dp_sgd_max_norm" not in found:
    raise ValueError(f"{where}: metadata {', '.join(found)} describe DP-SGD but not its clipping "
                     "bound dp_sgd_max_norm")
  if found.get("dp_sgd_poisson") and "dp_sgd_sampling_rate" not in found:
    raise ValueError(f"{where}: metadata dp_sgd_poisson=true describes Poisson-sampled DP-SGD but "
                     "not its rate dp_sgd_sampling_rate (Opacus' 1 / len(data_loader))")
  if "dp_sgd_expected_batch_size" in found and not found.get("dp_sgd_poisson"):
    raise ValueError(f"{where}: metadata dp_sgd_expected_batch_size divides a Poisson-sampled "
                     "step's sum: declare dp_sgd_poisson=true too (a fixed batch's is divided by its size)")
  return found


def _bool(meta: dict, key: str, where: str) -> bool | None:
  if key not in meta:
    return None
  value = meta[key].strip().lower()
  if value not in ("true", "false", "1", "0"):
    raise ValueError(f"{where}: metadata {key!r} must be true or false, got {meta[key]!r}")
  return value in ("true", "1")


def parse_labels(text: str, where: str = "labels") -> np.ndarray:
  """``"3,8,8"`` or ``"[3, 8, 8]"`` -> int32 array."""
  items = [s for s in text.strip().strip("[]").replace(" ", ",").split(",") if s]
  try:
    values = [int(s) for s in items]
  except ValueError:
    raise ValueError(f"{where} must be comma-separated integers, got {text!r}") from None
  if any(not -2**31 <= v < 2**31 for v in values):
    raise ValueError(f"{where} must be 32-bit integers, got {text if len(text) < 80 else text[:77] + '...'!r}")
  return np.asarray(values, np.int32)


def parse_shape(text: str, where: str = "input_shape") -> tuple[int, int, int]:
  shape = tuple(int(v) for v in parse_labels(text, where))
  if len(shape) != 3 or min(shape) < 1:
    raise ValueError(f"{where} must be H,W,C with positive sizes, got {text!r}")
  return shape


def _check_count(n: int | None, where: str) -> None:
  if n is not None and not -2**31 <= n < 2**31:  # the attacks count in 32-bit integers
    raise ValueError(f"{where}: num_samples {n} is past a 32-bit integer's range")


def metadata_num_samples(meta: dict[str, str], where: str = "observation") -> int | None:
  """The number of examples an observation file's metadata state: ``num_samples``, else the count of
  ``labels``, else ``None``."""
  n = _int(meta, "num_samples", where)
  _check_count(n, where)
  if n is None and "labels" in meta:
    n = len(parse_labels(meta["labels"], f"{where}: metadata labels"))
  return n


# Nine parameters: the server's variables and the file, then one keyword per metadata key the caller
# may override (None: the file's).
def observation_from_files(variables, params_tree_like, observation: TensorFile, mapping: TorchMapping,
                           *, where: str = "observation", num_samples: int | None = None,
                           labels=None, train: bool | None = None,
                           local: clients.LocalTraining | None = None) -> Observation:
  """The :class:`Observation` of a read observation file, against the server's ``variables``.

  Keyword arguments override the file's metadata (``None``: the file's value, then the default:
  one sample, no labels, evaluation mode, schedule from ``local_*`` keys if any).
  """
  meta = observation.metadata
  kind = meta.get("kind", "gradient")
  if kind not in KINDS:
    raise ValueError(f"{where}: metadata kind {kind!r} is not one of {', '.join(KINDS)}")
  layout = meta.get("layout", "torch")
  if layout != "torch":
    raise ValueError(f"{where}: layout {layout!r} is not supported (only torch)")
  tree = params_from_torch(observation.tensors, mapping, params_tree_like, where,
                           allow_buffers=kind == "weights")
  if kind == "weights":
    tree = jax.tree.map(lambda before, after: np.asarray(before) - after, variables["params"], tree)
  if labels is None and "labels" in meta:
    labels = parse_labels(meta["labels"], f"{where}: metadata labels")
  if labels is not None:
    labels = np.asarray(labels, np.int32)
    if meta.get("label_order", "ordered") == "multiset":
      labels = np.sort(labels)
    elif meta.get("label_order", "ordered") != "ordered":
      raise ValueError(f"{where}: metadata label_order must be ordered or multiset")
  n = num_samples if num_samples is not None else _int(meta, "num_samples", where)
  if n is None:
    n = len(labels) if labels is not None else 1
  if n < 1:
    raise ValueError(f"{where}: num_samples must be positive, got {n}")
  _check_count(n, where)
  if labels is not None and len(labels) != n:
    raise ValueError(f"{where}: {len(labels)} labels for {n} samples")
  if train is None:
    train = bool(_bool(meta, "train", where))
  if local is None and kind != "gradient" and any(k.startswith("local_") for k in meta):
    lr = _float(meta, "local_lr", where)
    if lr is None:
      raise ValueError(f"{where}: local training needs local_lr")
    epochs, momentum = _int(meta, "local_epochs", where), _float(meta, "local_momentum", where)
    local = clients.LocalTraining(epochs=1 if epochs is None else epochs,
                                  batch_size=_int(meta, "local_batch_size", where),
                                  learning_rate=lr, momentum=0.0 if momentum is None else momentum)
  reduction = meta.get("loss_reduction", "mean")
  if reduction not in ("mean", "sum"):
    raise ValueError(f"{where}: metadata loss_reduction must be mean or sum, got {reduction!r}")
  if reduction == "sum":  # Σ_n L_n is N times the mean: the mean's gradient, or a larger step
    if kind == "gradient":
      tree = jax.tree.map(lambda g: np.asarray(g) / n, tree)
    elif local is not None:
      local = local._replace(learning_rate=local.learning_rate * (local.batch_size or n))
  if local is not None:
    clients.check_local_training(local, n)
  obs = Observation(gradient=jax.tree.map(device_array, tree),
                    variables=jax.tree.map(device_array, variables),
                    labels=None if labels is None else device_array(labels), num_samples=int(n),
                    threat_model="fedsgd" if kind == "gradient" else "fedavg", train=bool(train),
                    local=local)
  check_observation(obs)
  return obs


def _returned_moments(net: models.Model, mapping: TorchMapping, obs_file: TensorFile,
                      observation: Observation, where: str):
  """The batch's BatchNorm moments from the running statistics a training-mode client returned with
  its weights after one local step (PyTorch's update: ``momentum`` from the metadata key
  ``bn_momentum``, PyTorch's default 0.1, and the unbiased variance,
  :func:`gradjax.clients.batch_moments`); ``None`` where the file holds no buffers, the client ran in
  evaluation mode (they are then as sent) or took several steps (they mix several batches)."""
  entries = [e for e in mapping.entries if e.path[0] == "batch_stats"]
  present = [e for e in entries if e.name in obs_file.tensors]
  if obs_file.metadata.get("kind") != "weights" or not present:
    return None
  if len(present) != len(entries):
    raise ValueError(f"{where}: holds {len(present)} of the model's {len(entries)} BatchNorm running "
                     "statistics; a state_dict holds all or none")
  n = observation.num_samples
  if not observation.train or observation.local is None or observation.local.steps(n) != 1:
    return None
  momentum = _float(obs_file.metadata, "bn_momentum", where)
  momentum = 0.1 if momentum is None else momentum
  if not 0 < momentum <= 1:
    raise ValueError(f"{where}: metadata bn_momentum (PyTorch's BatchNorm momentum) must lie in (0, 1], "
                     f"got {momentum}")
  returned = _to_tree(mapping, {e.name: obs_file.tensors[e.name] for e in present}, net.variables,
                      present, where)["batch_stats"]
  counts = priors.batch_norm_counts(net.apply_fn, net.variables, (n, *net.input_shape))
  count = jax.tree_util.tree_map_with_path(lambda path, _: counts[tuple(k.key for k in path[:-1])],
                                           net.variables["batch_stats"])
  return clients.batch_moments(net.variables["batch_stats"], returned, momentum=1 - momentum,
                               count=count)


class Imported(NamedTuple):
  """A model rebuilt from a PyTorch weights file and the observation against it."""

  model: models.Model
  mapping: TorchMapping
  observation: Observation
  metadata: dict[str, str]   # the observation file's, then the weights file's metadata


# Eleven parameters: the two files, then one keyword per metadata key a caller may override (None: the
# files'), as the command line's flags do.
def load(weights_path, observation_path, *, model: str | None = None, input_shape=None,
         num_classes: int | None = None, rename: Sequence[tuple[str, str]] = (),
         num_samples: int | None = None, labels=None, train: bool | None = None,
         local: clients.LocalTraining | None = None, **module_kwargs) -> Imported:
  """Imports a zoo model's PyTorch weights and an observed gradient or update.

  Args:
    weights_path: the server's weights W_t (``model.state_dict()``).
    observation_path: the client's gradient, weights after local training, or update.
    model: zoo name (default: the files' ``model`` metadata, else ``lenet_zhu``).
    input_shape: (H, W, C) (default: the files' ``input_shape``, else 32 × 32 with the channels of
      the first convolution or dense layer); of a text model (``gpt``, ``bert``), (T,), the
      sentences' tokens (default: the metadata's), its vocabulary the embedding's rows and its
      sizes ``text_sizes`` (a :class:`gradjax.models.TextSizes` in ``module_kwargs``, default the
      metadata's ``text_sizes``: :func:`save_weights` writes them).
    num_classes: default: the rows of the head's weight in the file.
    rename: regex rules applied to both files' names (:func:`apply_renames`).
    num_samples, labels, train, local: override the observation file's metadata.
    module_kwargs: how the model is computed (``conv``, ``remat``, ``act``, ``init`` for the
      activation of models that take one; the init only shapes the throw-away initial values).

  Example::

    imported = interop.load("W.safetensors", "G.safetensors", model="lenet_zhu")
    rec = attacks.reconstruct(presets.dlg(), imported.model.apply_fn,
                              imported.observation, jax.random.key(0),
                              input_shape=imported.model.input_shape)
  """
  weights = read(weights_path)
  obs_file = read(observation_path)
  weights = weights._replace(tensors=apply_renames(weights.tensors, rename))
  obs_file = obs_file._replace(tensors=apply_renames(obs_file.tensors, rename))
  # The observation's kind is its own (default gradient), never the weights file's ``weights``.
  meta = {**weights.metadata, **obs_file.metadata, "kind": obs_file.metadata.get("kind", "gradient")}
  if weights.metadata.get("kind") not in (None, "weights"):
    raise ValueError(f"{weights_path} is marked kind={weights.metadata['kind']!r}; the weights file "
                     "must hold the model the server sent")
  name = model or meta.get("model") or "lenet_zhu"
  where = f"weights {os.fspath(weights_path)}"
  if models.is_text(name):
    net = _text_model(name, weights, meta, input_shape, num_classes, module_kwargs, where)
    mapping = zoo_mapping(net)
  else:
    net, mapping = _image_model(name, weights, obs_file, meta, weights_path, observation_path,
                                input_shape, num_classes, module_kwargs)
  variables = variables_from_torch(weights.tensors, mapping, net.variables, where)
  net = net._replace(variables=jax.tree.map(device_array, variables))
  observation = observation_from_files(
      variables, net.variables["params"], obs_file, mapping,
      where=f"observation {os.fspath(observation_path)}", num_samples=num_samples, labels=labels,
      train=train, local=local)
  moments = _returned_moments(net, mapping, obs_file, observation,
                               f"observation {os.fspath(observation_path)}")
  if moments is not None:
    observation = observation.replace(moments=moments)
    check_observation(observation)
  if observation.labels is not None:
    bad = [int(v) for v in np.asarray(observation.labels) if not 0 <= v < net.num_classes]
    if bad:
      raise ValueError(f"observation {os.fspath(observation_path)}: label {bad[0]} is not a class of "
                       f"the model, which has {net.num_classes} (0..{net.num_classes - 1})")
  return Imported(net, mapping, observation, meta)


def _image_model(name, weights: TensorFile, obs_file: TensorFile, meta: dict, weights_path,
                 observation_path, input_shape, num_classes, module_kwargs
                 ) -> tuple[models.Model, TorchMapping]:
  """The zoo image model ``name`` of a weights file and its mapping: the input shape from the
  argument or the metadata, else 32 × 32 with the first layer's channels; the classes from the
  head's rows."""
  if "act" in meta and "act" not in module_kwargs:
    module_kwargs["act"] = meta["act"]
  if "input_shape" in meta:  # the update file's over the weights file's
    named = observation_path if "input_shape" in obs_file.metadata else weights_path
    declared = parse_shape(meta["input_shape"], f"{named}: metadata input_shape")
    if input_shape is not None and tuple(input_shape) != tuple(declared):
      raise ValueError(f"{named} declares input_shape {'x'.join(map(str, declared))}, but the "
                       f"ground truth's images are {'x'.join(map(str, input_shape))} (--image_size "
                       "sets their size)")
    input_shape = declared
  # A throw-away instance names the tensors; the head's rows and the first layer's input channels
  # in the file then size the real one.
  probe = models.create(name, prng_key(0), input_shape=tuple(input_shape or (32, 32, 3)),
                        num_classes=num_classes or 10, **module_kwargs)
  probe_map = zoo_mapping(probe)
  head = next(e for e in probe_map.entries if e.path == ("params", "head", "kernel"))
  first = probe_map.entries[0]
  where = f"weights {os.fspath(weights_path)}"
  for e in (head, first):
    if e.name not in weights.tensors:
      raise ValueError(f"{where}: missing tensor {e.name!r}: is this a {name} state_dict? "
                       + _name_mismatch({p.name for p in probe_map.entries},
                                        set(weights.tensors) - set(probe_map.ignored))
                       + "; an architecture the zoo lacks needs its mapping, "
                       "gradjax.interop.module_mapping (the library)")
    if weights.tensors[e.name].ndim != len(torch_shape(e, np.shape(_get(probe.variables, e.path)))):
      raise ValueError(f"{where}: tensor {e.name!r} has shape {weights.tensors[e.name].shape}, "
                       f"not that of a {name} {e.layout} weight")
  if num_classes is None:
    num_classes = int(weights.tensors[head.name].shape[0])
  if input_shape is None:
    channels = int(weights.tensors[first.name].shape[1])
    if first.chw is not None:  # an MLP: the flattened input has C·H·W entries
      channels = probe.input_shape[-1]
    input_shape = (32, 32, channels)
  if (tuple(input_shape), num_classes) == (probe.input_shape, probe.num_classes):
    net, mapping = probe, probe_map
  else:
    net = models.create(name, prng_key(0), input_shape=tuple(input_shape),
                        num_classes=num_classes, **module_kwargs)
    mapping = zoo_mapping(net)
  return net, mapping


def _text_model(name: str, weights: TensorFile, meta: dict, input_shape, num_classes, module_kwargs,
                where: str) -> models.Model:
  """The zoo text model ``name`` of a weights file: T from ``input_shape`` (the argument's, else the
  metadata's one number), the vocabulary from the embedding's rows, the sizes from
  ``module_kwargs["text_sizes"]`` or the metadata's ``text_sizes`` (dim, heads, ffn, layers)."""
  if input_shape is None and "input_shape" in meta:
    input_shape = tuple(int(v) for v in parse_labels(meta["input_shape"], f"{where}: metadata input_shape"))
  if input_shape is None or len(tuple(input_shape)) != 1 or int(tuple(input_shape)[0]) < 1:
    raise ValueError(f"{where}: a text model reads sentences of T tokens: give input_shape=(T,) "
                     f"or the metadata input_shape T, got {input_shape!r}")
  sizes = module_kwargs.pop("text_sizes", None)
  if sizes is None and "text_sizes" in meta:
    values = parse_labels(meta["text_sizes"], f"{where}: metadata text_sizes")
    if len(values) != len(models.TextSizes._fields):
      raise ValueError(f"{where}: metadata text_sizes must be {','.join(models.TextSizes._fields)}, "
                       f"got {meta['text_sizes']!r}")
    sizes = models.TextSizes(*(int(v) for v in values))
  if sizes is None:
    raise ValueError(f"{where}: a text model's heads are not in its tensors' shapes: give "
                     "text_sizes=gradjax.models.TextSizes(dim, heads, ffn, layers) or the metadata "
                     "text_sizes")
  embedding = weights.tensors.get("embed.weight")
  if embedding is None or embedding.ndim != 2:
    raise ValueError(f"{where}: missing tensor 'embed.weight' (vocabulary, dim): is this a {name} "
                     "state_dict?")
  vocabulary = int(embedding.shape[0])
  if num_classes is not None and num_classes != vocabulary:
    raise ValueError(f"{where}: a language model's classes are its vocabulary, the embedding's "
                     f"{vocabulary} rows, not {num_classes}")
  return models.create(name, prng_key(0), input_shape=(int(tuple(input_shape)[0]),),
                       num_classes=vocabulary, text_sizes=sizes, **module_kwargs)


def observation_metadata(observation: Observation, model: models.Model | None = None) -> dict:
  """The metadata that describe ``observation`` in a file (see the module docstring)."""
  meta: dict[str, Any] = {"layout": "torch", "num_samples": observation.num_samples,
                          "train": observation.train,
                          "kind": "gradient" if observation.local is None and
                          not observation.threat_model.startswith("fedavg") else "update"}
  if observation.labels is not None and np.ndim(observation.labels) != 1:
    raise ValueError(f"labels of shape {tuple(np.shape(observation.labels))} (a text client's next "
                     "tokens) are not written: a file holds one label per example (simulate the "
                     "client without share_labels)")
  if observation.labels is not None:
    meta["labels"] = [int(v) for v in np.asarray(observation.labels)]
  if observation.local is not None:
    local = observation.local
    meta.update(local_lr=repr(float(local.learning_rate)), local_epochs=local.epochs,
                local_momentum=repr(float(local.momentum)))
    if local.batch_size is not None:
      meta["local_batch_size"] = local.batch_size
  if model is not None:
    meta.update(_model_metadata(model))
  return meta


def _model_metadata(model: models.Model) -> dict:
  """``model`` and ``input_shape`` of ``model``, and a text model's ``text_sizes`` (dim, heads,
  ffn, layers: its heads are not in its tensors' shapes)."""
  meta = {"model": model.name, "input_shape": list(model.input_shape)}
  if models.is_text(model.name):
    module = model.apply_fn.module
    meta["text_sizes"] = [int(getattr(module, f)) for f in models.TextSizes._fields]
  return meta


def save_observation(path, observation: Observation, mapping: TorchMapping,
                     model: models.Model | None = None) -> None:
  """Writes ``observation``'s gradient (FedSGD) or update W_t − W_{t+1} (FedAvg) in PyTorch layout,
  with its metadata; :func:`load` reads it back exactly. An aggregate of FedAvg clients is refused:
  a file is one client's update, and the aggregate's replay needs its clients' sizes."""
  if observation.local is not None and len(observation.clients or ()) > 1:
    raise ValueError(f"an aggregate of {len(observation.clients)} FedAvg clients' updates is no "
                     "one client's update: save each client's")
  write(path, params_to_torch(observation.gradient, mapping), observation_metadata(observation, model))


def save_weights(path, model: models.Model, mapping: TorchMapping | None = None) -> None:
  """Writes ``model.variables`` as a PyTorch ``state_dict`` (with ``model`` and ``input_shape``
  metadata, and a text model's ``text_sizes``), e.g. so a PyTorch client can start from the same
  weights."""
  mapping = mapping or zoo_mapping(model)
  write(path, variables_to_torch(model.variables, mapping),
        {"kind": "weights", "layout": "torch", **_model_metadata(model)})
