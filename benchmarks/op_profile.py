r"""Where one compiled step's time goes, op by op: XLA:CPU's thunks, and PyTorch eager's ATen ops.

XLA:CPU runs a compiled program as a sequence of thunks, one per instruction of the entry
computation (a fusion, a dot, a copy), and ``jax.profiler`` records each as a trace event named
after its instruction. :func:`jax_profile` runs a compiled program under the profiler, sums the
events per instruction, and files each instruction in one category by the opcodes it contains
(itself and the computations it calls, e.g. a fusion's body):

* ``matmul``: a ``dot`` or ``convolution`` (its FLOPs, ``2 · prod(output) · prod(contracted)``
  per dot and ``2 · prod(output) · prod(kernel) / output features`` per convolution, are counted
  from the HLO shapes, so the products' own FLOP rate can be read);
* ``reduction``: ``reduce``, ``reduce-window``, ``scatter``, ``select-and-scatter``;
* ``data movement``: ``pad``, ``slice``, ``concatenate``, ``copy``, ``transpose``,
  ``dynamic-slice``, ``dynamic-update-slice``, ``gather`` (im2col's patches and their transpose);
* ``elementwise``: everything else.

The first that applies wins, in that order. :func:`torch_profile` does the same for a PyTorch eager
callable with ``torch.profiler``: self CPU time per ATen op, filed as ``matmul`` (convolutions and
matrix products), ``reduction``, ``data movement`` or ``elementwise`` by the op's name.

Use: ``python -m benchmarks suite --sections=ops`` (the conv nets' batch-8 matching step).
"""

import collections
import glob
import gzip
import json
import math
import re
import tempfile
import time
from typing import Callable

import jax

CATEGORIES = ("matmul", "reduction", "data movement", "elementwise")
_MATMUL = {"dot", "convolution"}
_REDUCTION = {"reduce", "reduce-window", "scatter", "select-and-scatter"}
_MOVEMENT = {"pad", "slice", "concatenate", "copy", "transpose", "dynamic-slice",
             "dynamic-update-slice", "gather"}

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_ARRAY = re.compile(r"^[a-z]\w*\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


class Instruction:
  """One HLO instruction: its opcode, result dims, operand names, called computations, source op."""

  def __init__(self, line: str):
    match = _INSTRUCTION.match(line)
    self.name, shape, self.opcode, rest = match.groups()
    dims = _ARRAY.match(shape)
    self.dims = tuple(int(d) for d in dims.group(1).split(",") if d) if dims else None
    self.operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
    self.called = _CALLED.findall(rest) + [c.strip().lstrip("%") for found in _BRANCHES.findall(rest)
                                           for c in found.split(",")]
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
    self.lhs_contracting = tuple(int(d) for d in contracting.group(1).split(",") if d) if contracting else ()
    labels = re.search(r"dim_labels=\w+_(\w+)->", rest)
    self.rhs_labels = labels.group(1) if labels else ""
    op_name = _OP_NAME.search(rest)
    self.op_name = op_name.group(1) if op_name else ""


def parse_hlo(text: str) -> tuple[dict[str, dict[str, Instruction]], str]:
  """HLO module text -> ({computation: {instruction name: Instruction}}, entry computation's name)."""
  computations, entry, current = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = computations.setdefault(header.group(1), {})
      if line.startswith("ENTRY"):
        entry = header.group(1)
    elif line.startswith("}"):
      current = None
    elif current is not None and _INSTRUCTION.match(line):
      instruction = Instruction(line)
      current[instruction.name] = instruction
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return computations, entry


def _flops(instruction, symbols) -> float:
  """2 x multiply-adds of a ``dot`` (output size x contracted size) or a ``convolution`` (output size
  x the kernel's size over its output features); 0 for other ops or unknown operand shapes."""
  if instruction.opcode not in _MATMUL or len(instruction.operands) < 2 or instruction.dims is None:
    return 0.0
  lhs, rhs = (symbols.get(name) for name in instruction.operands[:2])
  if instruction.opcode == "dot":
    if lhs is None or lhs.dims is None:
      return 0.0
    return 2.0 * math.prod(instruction.dims) * math.prod(lhs.dims[d] for d in instruction.lhs_contracting)
  if rhs is None or rhs.dims is None or "o" not in instruction.rhs_labels:
    return 0.0
  return 2.0 * math.prod(instruction.dims) * math.prod(rhs.dims) / rhs.dims[instruction.rhs_labels.index("o")]


def _walk(computations, instruction, seen=None):
  """(opcodes, dot FLOPs) of an instruction and of every computation it calls, recursively."""
  seen = set() if seen is None else seen
  opcodes, flops = {instruction.opcode}, 0.0
  for name in instruction.called:
    if name in seen or name not in computations:
      continue
    seen.add(name)
    body = computations[name]
    for inner in body.values():
      flops += _flops(inner, body)
      sub_opcodes, sub_flops = _walk(computations, inner, seen)
      opcodes |= sub_opcodes
      flops += sub_flops
  return opcodes, flops


def categorize(opcodes) -> str:
  """The category (``CATEGORIES``) of an instruction that contains ``opcodes``."""
  for category, members in (("matmul", _MATMUL), ("reduction", _REDUCTION),
                            ("data movement", _MOVEMENT)):
    if members & set(opcodes):
      return category
  return "elementwise"


def entry_instructions(hlo_text: str) -> dict[str, dict]:
  """Every entry-computation instruction -> {"category", "flops", "op_name"} (the thunks XLA:CPU runs).

  A top-level ``dot`` or ``convolution`` counts its own FLOPs, a fusion those of the products in its
  body."""
  computations, entry = parse_hlo(hlo_text)
  body = computations[entry]
  out = {}
  for name, instruction in body.items():
    if instruction.opcode in ("parameter", "constant", "bitcast", "tuple", "get-tuple-element"):
      continue
    opcodes, flops = _walk(computations, instruction)
    flops += _flops(instruction, body)
    out[name] = dict(category=categorize(opcodes), flops=flops, op_name=instruction.op_name)
  return out


def _trace_events(directory: str) -> list[dict]:
  files = sorted(glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True))
  if not files:
    raise RuntimeError(f"jax.profiler wrote no trace under {directory}")
  with gzip.open(files[-1]) as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize(per_op_ms: dict[str, float], instructions: dict[str, dict], wall_ms: float,
              top: int = 8) -> dict:
  """Per-category milliseconds, the matrix products' GFLOP/s and the ``top`` slowest ops."""
  by_category = collections.Counter({c: 0.0 for c in CATEGORIES})
  flops = 0.0
  for name, info in instructions.items():
    by_category[info["category"]] += per_op_ms.get(name, 0.0)
    if info["category"] == "matmul":
      flops += info["flops"]
  matmul_ms = by_category["matmul"]
  slowest = sorted(per_op_ms, key=per_op_ms.get, reverse=True)[:top]
  return dict(
      wall_ms=wall_ms, ops_ms=sum(by_category.values()), categories=dict(by_category),
      matmul_flops=flops, matmul_gflops=flops / matmul_ms / 1e6 if matmul_ms > 0 else None,
      top=[dict(op=name, category=instructions[name]["category"], ms=per_op_ms[name],
                source=instructions[name]["op_name"].split("/")[-2:]) for name in slowest])


def jax_profile(compiled, args, *, repeats: int = 5, top: int = 8) -> dict:
  """Runs ``compiled(*args)`` ``repeats`` times under ``jax.profiler`` and returns, per call, the
  milliseconds of each category (:func:`summarize`), the wall time of an unprofiled call and the
  matrix products' FLOP rate. ``compiled``: a ``jax.stages.Compiled`` (its ``as_text()`` names the
  thunks)."""
  instructions = entry_instructions(compiled.as_text())
  jax.block_until_ready(compiled(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(compiled(*args))
  wall_ms = (time.perf_counter() - start) / repeats * 1e3
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    try:
      for _ in range(repeats):
        jax.block_until_ready(compiled(*args))
    finally:
      jax.profiler.stop_trace()
    events = _trace_events(directory)
  per_op = collections.Counter()
  for event in events:
    if event.get("ph") == "X" and event.get("name") in instructions:
      per_op[event["name"]] += event.get("dur", 0) / 1e3 / repeats
  if not per_op:
    raise RuntimeError("the trace holds no event named after an instruction of the program")
  return summarize(per_op, instructions, wall_ms, top)


_TORCH_REDUCTION = ("sum", "mean", "max", "min", "amax", "amin", "norm", "softmax", "log_softmax")
_TORCH_MOVEMENT = ("copy", "clone", "cat", "pad", "constant_pad", "slice", "transpose", "permute",
                   "contiguous", "index", "select", "narrow", "expand", "view", "reshape", "zero",
                   "fill", "empty", "as_strided", "unsqueeze", "squeeze", "stack", "flatten")


def torch_category(op: str) -> str:
  """The category of ATen op ``op`` (e.g. ``aten::convolution_backward`` -> matmul)."""
  name = op.split("::")[-1].lstrip("_")
  if any(k in name for k in ("conv", "mm", "matmul", "linear")):
    return "matmul"
  if name.startswith(_TORCH_REDUCTION):
    return "reduction"
  if name in ("t", "to", "detach", "alias") or name.startswith(_TORCH_MOVEMENT):
    return "data movement"
  return "elementwise"


def torch_profile(fn: Callable[[], object], *, repeats: int = 5, top: int = 8) -> dict:
  """Self CPU milliseconds per call of ``fn`` per category and for the ``top`` ATen ops
  (``torch.profiler``), with the wall time of an unprofiled call."""
  import torch  # pylint: disable=g-import-not-at-top

  fn()
  start = time.perf_counter()
  for _ in range(repeats):
    fn()
  wall_ms = (time.perf_counter() - start) / repeats * 1e3
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(repeats):
      fn()
  per_op = {e.key: e.self_cpu_time_total / 1e3 / repeats for e in prof.key_averages()
            if e.key.startswith("aten::")}
  by_category = collections.Counter({c: 0.0 for c in CATEGORIES})
  for op, ms in per_op.items():
    by_category[torch_category(op)] += ms
  slowest = sorted(per_op, key=per_op.get, reverse=True)[:top]
  return dict(wall_ms=wall_ms, ops_ms=sum(by_category.values()), categories=dict(by_category),
              top=[dict(op=op, category=torch_category(op), ms=per_op[op]) for op in slowest])


def markdown(rows: list[dict]) -> str:
  """One table: per model and framework, the wall time and each category's milliseconds (share of
  the profiled total), and the matrix products' GFLOP/s."""
  lines = ["| model | batch | framework | wall ms | " + " | ".join(CATEGORIES) + " | matmul GFLOP/s |",
           "|---|---|---|---|" + "---|" * len(CATEGORIES) + "---|"]
  for row in rows:
    for framework in ("jax", "torch"):
      p = row.get(framework)
      if p is None:
        continue
      cells = [f"{p['categories'][c]:.1f} ({p['categories'][c] / p['ops_ms']:.0%})" for c in CATEGORIES]
      rate = p.get("matmul_gflops")
      lines.append(f"| {row['model']} | {row['batch_size']} | {framework} | {p['wall_ms']:.1f} | "
                   + " | ".join(cells) + f" | {'-' if rate is None else f'{rate:.1f}'} |")
  return "\n".join(lines)
