"""Audits of recorded federated rounds: the capture folders a server writes, and the attacks on them.

A server that records what it sends and receives (:mod:`gradjax.integrations.flower` does it for Flower) leaves
one folder per round and client, in the import format of :mod:`gradjax.interop`::

  AUDIT_DIR/round_001/weights.safetensors                   W_t, the global model sent in round 1
  AUDIT_DIR/round_001/client_<id>/weights.safetensors       the same file (a hard link where possible)
  AUDIT_DIR/round_001/client_<id>/observation.safetensors   W_{t+1}, the client's reply (kind weights)
  AUDIT_DIR/round_001/client_<id>/capture.json              round, client, metadata, status
  AUDIT_DIR/round_001/round.json                            nodes sent work, which failed, replied twice
  AUDIT_DIR/round_001/client_<id>/rows.json                 an audit's rows of it (written as it ends)

Tensors keep their ``state_dict`` names and PyTorch layouts. The observation's metadata carry what
the server knew: ``num_samples`` (the reply's example count), the local training (``local_lr``,
``local_epochs``, ``local_batch_size``, ``local_momentum``), ``model`` and ``input_shape`` when
given. ``capture.json`` adds the configuration sent, the reply's metrics and, for audits of one's own
deployment, ``data_indices``: the dataset indices of the client's examples, used only to score. A
malformed reply leaves ``capture.json`` with its ``error`` and no tensors. Every folder appears
whole or not at all (written aside, then renamed).

:func:`audit` attacks every capture with the attacks its metadata support (:func:`gradjax.auto.for_metadata`)
and writes, per capture and attack, the files of :func:`gradjax.run.report.write_run`, plus
``index.json``, ``index.md`` and ``index.html`` over the whole federation: a row per capture and
attack, and a row per recorded round (clients sent work, failed, withheld, replying twice, nodes new
or gone). An audit a signal stopped (:class:`Stopped`) continues with ``resume``: the
captures whose ``rows.json`` holds rows of the same settings are read back, not attacked again.
"""

import html
import json
import logging
import os
import re
import shutil
import signal
import time
import uuid
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from gradjax import (auto, closed_forms, compilation, data, defenses, fidelity, files, interop, malicious,
                     models, presets)
from gradjax.run import config, pipeline
from gradjax.run import report

_LOG = logging.getLogger(__name__)
CAPTURE = "capture.json"
# How a client's leakage gate (gradjax.integrations.flower.leakage_mod) says it withheld its update: the server
# records a failed client with this in its reason, and an audit lists the round as withheld.
WITHHELD = "gradjax leakage_mod: update withheld"
# How a gated client says it refused to train on the model it received (it looked built to leak:
# received_findings); an audit lists that client as refused, not failed.
MODEL_REFUSED = "gradjax leakage_mod: model refused"
WEIGHTS = "weights.safetensors"
OBSERVATION = "observation.safetensors"


# --- the model a client received ---------------------------------------------------------------------


def _declared(sent: dict[str, np.ndarray], model: str, input_shape) -> models.Model:
  """A fresh draw of the zoo twin ``model`` with the classes of the head's rows in ``sent``."""
  probe = models.create(model, jax.random.key(0), input_shape=tuple(input_shape))
  head = next(e for e in interop.zoo_mapping(probe).entries if e.path == ("params", "head", "kernel"))
  if head.name in sent and np.ndim(sent[head.name]) == 2 and sent[head.name].shape[0] != probe.num_classes:
    probe = models.create(model, jax.random.key(0), input_shape=tuple(input_shape),
                          num_classes=int(sent[head.name].shape[0]))
  return probe


def received_findings(sent: dict[str, np.ndarray], model: str, input_shape=(32, 32, 3),
                      inputs=None) -> list[malicious.Finding]:
  """What looks built to leak in the model a client received (:func:`gradjax.malicious.inspect`):
  ``sent`` (PyTorch names -> arrays) against a fresh draw of the zoo twin ``model`` it declared
  (its classes from the head's rows sent). Tensors that are not the declared model's are one
  finding; otherwise its dense layers are checked for units sharing one direction and, given the
  client's ``inputs`` (N, H, W, C) as the model reads them, its input layers for trap weights."""
  return received_check(sent, model, input_shape, inputs)[0]


def received_check(sent: dict[str, np.ndarray], model: str, input_shape=(32, 32, 3),
                   inputs=None) -> tuple[list[malicious.Finding], dict[str, float]]:
  """(:func:`received_findings`, and where it finds nothing and ``inputs`` are given, the input
  layers whose units fire for few of them, :func:`gradjax.malicious.rarely_firing`: path -> mean
  rate), from one reading of ``sent`` as the declared model."""
  probe = _declared(sent, model, input_shape)
  try:
    variables = _as_declared(sent, probe)
  except ValueError as e:
    return [malicious.Finding("", f"not the declared {model}: {e}")], {}
  findings = malicious.inspect(variables, probe.variables, inputs=inputs)
  rare = {} if findings or inputs is None else malicious.rarely_firing(variables, inputs)
  return findings, rare


def _as_declared(sent: dict[str, np.ndarray], probe: models.Model):
  """``sent`` read as the variables of ``probe``'s architecture (ValueError where they are not)."""
  return interop.variables_from_torch(sent, interop.zoo_mapping(probe), probe.variables,
                                      "the received model")


def imprinted(sent: dict[str, np.ndarray], model: str, input_shape=(32, 32, 3),
              layer: str = "Dense_0") -> bool:
  """Whether the model a client received hides an imprint in its dense ``layer``
  (:func:`gradjax.malicious.imprint_units`), which the ``imprint`` closed form reads out."""
  try:
    params = _as_declared(sent, _declared(sent, model, input_shape))["params"]
  except ValueError:
    return False
  return layer in params and len(malicious.imprint_units(params[layer]["kernel"],
                                                         params[layer]["bias"])) > 0


# --- recording -------------------------------------------------------------------------------------

# The file by which a folder :func:`unique_dir` returned is its caller's: created exclusively, so of
# two programs that pick the same free folder at once, one takes the next.
OWNER = ".gradjax-owner"


def unique_dir(path) -> str:
  """``path`` when it does not exist or is an empty folder, else the first free ``path-1``,
  ``path-2``, ...: a new federation run never mixes with, or replaces, an earlier one's files. The
  folder is created and taken at once (:data:`OWNER` in it, made exclusively), so two runs started
  together never share one."""
  path = os.path.abspath(os.fspath(path))
  parent = os.path.dirname(path)
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:  # a file where a folder above it should be, no permission
    raise ValueError(f"cannot make the folder {parent} for {path}: {e.strerror or e}") from None
  candidate, k = path, 0
  while True:
    try:
      if os.path.isdir(candidate) or not os.path.exists(candidate):
        os.makedirs(candidate, exist_ok=True)
        if not os.listdir(candidate):
          fd = os.open(os.path.join(candidate, OWNER), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
          with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()}\n")
          return candidate
    except FileExistsError:  # a file of that name made just now, or taken by another run
      pass
    except OSError as e:  # e.g. no permission to write in it
      raise ValueError(f"cannot take the folder {candidate}: {e.strerror or e}") from None
    k += 1
    candidate = f"{path}-{k}"


def check_reply(sent: dict[str, np.ndarray], returned: dict[str, np.ndarray]) -> None:
  """Raises ``ValueError`` naming the first way ``returned`` (a client's weights) does not fit the
  ``sent`` ones: a missing or extra tensor, another shape or dtype, a NaN or infinity."""
  for name, value in sent.items():
    if name not in returned:
      raise ValueError(f"missing tensor {name!r}")
    got = returned[name]
    if got.shape != value.shape:
      raise ValueError(f"tensor {name!r} has shape {got.shape}, the server sent {value.shape}")
    if got.dtype != value.dtype:
      raise ValueError(f"tensor {name!r} has dtype {got.dtype}, the server sent {value.dtype}")
    if got.dtype.kind == "f" and not np.all(np.isfinite(got)):
      raise ValueError(f"tensor {name!r} holds NaN or infinity")
  extra = sorted(set(returned) - set(sent))
  if extra:
    raise ValueError(f"unexpected tensor {extra[0]!r}")


def _recordable(value):
  """A config or metric value as :func:`gradjax.run.report.save_json` takes it: bytes become a note of
  their length, non-finite floats their name (``"nan"``, ``"inf"``), so that what a client replied
  is kept as it was rather than refused."""
  if isinstance(value, bytes):
    return f"<{len(value)} bytes>"
  if isinstance(value, dict):
    return {k: _recordable(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    return _recordable(value.tolist())
  if isinstance(value, (list, tuple)):
    return [_recordable(v) for v in value]
  if isinstance(value, (float, np.floating)) and not np.isfinite(value):
    return str(float(value))
  return value


def write_round_weights(path, weights: dict[str, np.ndarray], metadata: dict[str, Any]) -> int:
  """Writes a round's global model (``kind=weights``, atomically); returns the bytes it takes."""
  interop.write(path, weights, {**metadata, "kind": "weights", "layout": "torch"})
  return os.path.getsize(path)


def write_capture(folder, round_weights: str, returned: dict[str, np.ndarray] | None,
                  info: dict[str, Any], metadata: dict[str, Any]) -> int:
  """Writes one client's capture folder whole, or not at all; returns the bytes it takes.

  Args:
    folder: the capture folder to create (must not exist).
    round_weights: the round's global weights file (linked, or copied where links fail).
    returned: the client's weights (``None`` for a failed or malformed reply: only ``capture.json``).
    info: JSON-ready facts for ``capture.json`` (round, client, config, metrics, data_indices, error).
    metadata: the observation file's metadata (num_samples, local training, model, input_shape).
  """
  folder = os.path.abspath(os.fspath(folder))
  tmp = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.{uuid.uuid4().hex}.tmp")
  os.makedirs(tmp)
  try:
    if returned is not None:
      try:
        os.link(round_weights, os.path.join(tmp, WEIGHTS))
      except OSError:
        shutil.copyfile(round_weights, os.path.join(tmp, WEIGHTS))
      interop.write(os.path.join(tmp, OBSERVATION), returned,
                    {**metadata, "kind": "weights", "layout": "torch"})
    report.save_json(os.path.join(tmp, CAPTURE), _recordable({**info, "metadata": metadata}))
    size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp) if f != WEIGHTS)
    os.rename(tmp, folder)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return size


ROUND_SUMMARY = "round.json"


def write_round_summary(round_dir, server_round: int, clients_sent: int,
                        failures: dict[Any, str], *, nodes: Sequence[Any] | None = None,
                        duplicates: dict[Any, int] | None = None) -> None:
  """``round.json`` of a recorded round: how many clients were sent work and which failed (node ->
  why: the ClientApp raised, a malformed reply, no reply); ``nodes``, the nodes sent work, and
  ``duplicates``, node -> replies for a node that replied more than once (each reply is recorded:
  ``client_<node>`` and ``client_<node>-reply<k>``)."""
  summary = {"round": server_round, "clients_sent": clients_sent,
             "failures": {str(k): v for k, v in failures.items()}}
  if nodes is not None:
    summary["nodes"] = [str(n) for n in nodes]
  if duplicates:
    summary["duplicates"] = {str(k): int(v) for k, v in duplicates.items()}
  report.save_json(os.path.join(os.fspath(round_dir), ROUND_SUMMARY), summary)


def round_summaries(audit_dir) -> dict[int, dict[str, Any]]:
  """Round -> its ``round.json`` (:func:`write_round_summary`), for the recorded rounds that have
  one (an unreadable one is left out)."""
  out = {}
  for rname in sorted(os.listdir(os.fspath(audit_dir))):
    path = os.path.join(os.fspath(audit_dir), rname, ROUND_SUMMARY)
    m = re.fullmatch(r"round_(\d+)", rname)
    if m and os.path.isfile(path):
      try:
        with open(path, encoding="utf-8") as fh:
          summary = json.load(fh)
      except (OSError, ValueError):
        summary = None
      problem = _malformed_summary(summary)
      if problem:
        _LOG.warning("%s is left out of the membership: %s", path, problem)
        continue
      out[int(m.group(1))] = summary
  return out


def _malformed_summary(summary) -> str | None:
  """What in a ``round.json`` :func:`write_round_summary` would not have written, or None."""
  if not isinstance(summary, dict):
    return "not a JSON object"
  sent = summary.get("clients_sent")
  if sent is not None and (not isinstance(sent, int) or isinstance(sent, bool) or sent < 0):
    return f"clients_sent {sent!r} is no count"
  failures = summary.get("failures", {})
  if not isinstance(failures, dict) or not all(isinstance(v, str) for v in failures.values()):
    return "failures are not node -> reason"
  duplicates = summary.get("duplicates") or {}
  if not isinstance(duplicates, dict) or not all(
      isinstance(v, int) and not isinstance(v, bool) for v in duplicates.values()):
    return "duplicates are not node -> replies"
  nodes = summary.get("nodes")
  if nodes is not None and not (isinstance(nodes, list) and all(isinstance(n, (str, int)) for n in nodes)):
    return "nodes are not a list of node ids"
  return None


def _failures(summary: dict[str, Any]) -> dict[str, str]:
  failures = summary.get("failures", {})
  return dict(failures) if isinstance(failures, dict) else {}


def round_failures(audit_dir) -> dict[int, dict[str, str]]:
  """Round -> client -> why it failed, from the recorded rounds' ``round.json``."""
  return {r: _failures(summary) for r, summary in round_summaries(audit_dir).items()}


def membership(audit_dir) -> list[dict[str, Any]]:
  """What happened in each recorded round, from its ``round.json``: clients sent work, failed,
  withheld by their gate, refused the model (their gate judged it built to leak), nodes that
  replied more than once, and the nodes new or gone since the
  previous recorded round (a SuperNode restarted between rounds registers again, under a new node
  id: one node gone, one new). Rounds recorded without node lists leave those fields out."""
  rows, previous = [], None
  for r, summary in sorted(round_summaries(audit_dir).items()):
    failures = _failures(summary)
    row = {"round": r, "clients_sent": summary.get("clients_sent"),
           "failed": sorted(str(k) for k, v in failures.items()
                            if WITHHELD not in str(v) and MODEL_REFUSED not in str(v)),
           "withheld": sorted(str(k) for k, v in failures.items() if WITHHELD in str(v)),
           "refused": sorted(str(k) for k, v in failures.items() if MODEL_REFUSED in str(v)),
           "duplicates": dict(summary.get("duplicates") or {})}
    nodes = summary.get("nodes")
    if isinstance(nodes, list):
      nodes = [str(n) for n in nodes]
      row["nodes"] = nodes
      if previous is not None:
        row["new"] = sorted(set(nodes) - set(previous[1]))
        row["gone"] = sorted(set(previous[1]) - set(nodes))
        row["since"] = previous[0]
      previous = (r, nodes)
    rows.append(row)
  return rows


class RecordKeys(NamedTuple):
  """Where a federated app states the local training and the client's examples: keys of the
  configuration the server sends (first key present wins) and of the metrics the client replies."""

  local_lr: tuple[str, ...] = ("lr", "learning-rate", "learning_rate", "local-lr")
  local_epochs: tuple[str, ...] = ("local-epochs", "local_epochs", "epochs")
  local_batch_size: tuple[str, ...] = ("batch-size", "batch_size", "local-batch-size")
  local_momentum: tuple[str, ...] = ("momentum", "local-momentum")
  num_samples: tuple[str, ...] = ("num-examples", "num_examples")
  data_indices: tuple[str, ...] = ("data-indices", "data_indices")


ScheduleKeys = RecordKeys  # its name before "schedule" meant the learning rate's only


def static_metadata(metadata: dict[str, Any] | None, where: str) -> dict[str, Any]:
  """``metadata``, the facts a server or a client gives every capture (:func:`capture_metadata`'s
  ``static``), checked when it is given: NumPy's numbers as Python's, every value a string, a number,
  a bool or a list of them, ``model`` a zoo name and ``input_shape`` a shape
  (:func:`gradjax.interop.parse_shape`). ``where`` names the caller in the errors.

  Raises:
    TypeError: a value of another type. ValueError: an unknown model or a malformed shape.
  """
  out = {}
  for key, value in dict(metadata or {}).items():
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, (list, tuple)):
      value = [v.item() if isinstance(v, np.generic) else v for v in value]
    plain = (str, int, float, bool)
    if not isinstance(key, str) or not (isinstance(value, plain) or (
        isinstance(value, list) and all(isinstance(v, plain) for v in value))):
      raise TypeError(f"{where}: metadata[{key!r}] must be a string, a number, a bool or a list of "
                      f"them, got {type(value).__name__}")
    out[key] = value
  if "model" in out:
    models.check_name(out["model"], f"{where}: metadata['model']")
  if "input_shape" in out:
    shape = out["input_shape"]
    if isinstance(shape, str):
      interop.parse_shape(shape, f"{where}: metadata input_shape")
    elif not (isinstance(shape, list) and len(shape) == 3
              and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
      raise ValueError(f"{where}: metadata input_shape must be H,W,C, got {shape!r}")
  return out


def capture_metadata(static: dict[str, Any], config: dict[str, Any], metrics: dict[str, Any],
                     keys: RecordKeys = RecordKeys()) -> dict[str, Any]:
  """The observation metadata of one reply: the ``static`` facts the server gives (e.g. ``model``,
  ``input_shape``, ``local_epochs`` read by the clients from their run config), then the local
  training found in the ``config`` sent, then ``num_samples`` from the reply's ``metrics``."""
  meta = dict(static)
  for field in ("local_lr", "local_epochs", "local_batch_size", "local_momentum"):
    for key in getattr(keys, field):
      if key in config:
        meta[field] = config[key]
        break
  for key in keys.num_samples:
    if key in metrics:
      meta["num_samples"] = int(metrics[key])
      break
  return meta


def data_indices(metrics: dict[str, Any], keys: RecordKeys = RecordKeys()) -> list[int] | None:
  """The dataset indices a client reported in its metrics (audits of one's own deployment)."""
  for key in keys.data_indices:
    if key in metrics:
      return [int(v) for v in np.atleast_1d(np.asarray(metrics[key]))]
  return None


# --- reading and attacking -------------------------------------------------------------------------

class Capture(NamedTuple):
  """One recorded client reply."""

  round: int
  client: str
  folder: str
  info: dict[str, Any]   # capture.json

  @property
  def error(self) -> str | None:
    return self.info.get("error")


def _check_capture_info(info: dict[str, Any]) -> None:
  """``ValueError`` (one line) where a ``capture.json`` read back holds a field of another type than
  :func:`write_capture` writes: ``error`` a string, ``metadata`` an object of strings and numbers,
  ``reply`` an integer, ``data_indices`` a list of integers."""
  def bad(key, want):
    raise ValueError(f"its {key!r} must be {want}, got {json.dumps(info[key])[:60]}")
  if info.get("error") is not None and not isinstance(info["error"], str):
    bad("error", "a string")
  if info.get("metadata") is not None:
    if not isinstance(info["metadata"], dict):
      bad("metadata", "an object")
    interop.metadata_strings(info["metadata"], "metadata")
  if info.get("reply") is not None and (not isinstance(info["reply"], int) or isinstance(info["reply"], bool)):
    bad("reply", "an integer")
  indices = info.get("data_indices")
  if indices is not None and not (isinstance(indices, list) and all(
      isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices)):
    bad("data_indices", "a list of example indices")


def captures(audit_dir) -> list[Capture]:
  """Every capture under ``audit_dir``, by round then client; ``ValueError`` when there is none."""
  audit_dir = os.fspath(audit_dir)
  if not os.path.isdir(audit_dir):
    raise ValueError(f"audit folder {audit_dir} " + ("is a file, not a folder" if os.path.exists(audit_dir)
                                                     else "does not exist"))
  found, named = [], {}
  for rname in sorted(os.listdir(audit_dir)):
    m = re.fullmatch(r"round_(\d+)", rname)
    if not m or not os.path.isdir(os.path.join(audit_dir, rname)):
      continue
    if int(m.group(1)) in named:  # round_1 beside round_001: whose captures are round 1's?
      raise ValueError(f"{audit_dir} holds two folders of round {int(m.group(1))}, "
                       f"{named[int(m.group(1))]} and {rname}: move one away")
    named[int(m.group(1))] = rname
    for cname in sorted(os.listdir(os.path.join(audit_dir, rname))):
      folder = os.path.join(audit_dir, rname, cname)
      if not cname.startswith("client_") or not os.path.isdir(folder):
        continue
      if not os.path.isfile(os.path.join(folder, CAPTURE)):  # written whole, so never by a recording
        found.append(Capture(int(m.group(1)), cname[len("client_"):], folder,
                             {"error": f"no {CAPTURE} in the capture folder"}))
        continue
      try:
        with open(os.path.join(folder, CAPTURE), encoding="utf-8") as fh:
          info = json.load(fh)
        if not isinstance(info, dict):
          raise ValueError("not a JSON object")
        _check_capture_info(info)
      except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        info = {"error": f"unreadable {CAPTURE}: {type(e).__name__ if isinstance(e, RecursionError) else e}"}
      found.append(Capture(int(m.group(1)), cname[len("client_"):], folder, info))
  if not found:
    raise ValueError(f"no captures (round_*/client_*/{CAPTURE}) under {audit_dir}")
  return found


# An audit asks what a patient server recovers, so DLG and iDLG run their papers' whole budget: 300
# PyTorch ``LBFGS.step()`` calls of up to 20 iterations each (mit-han-lab/dlg), where the presets run
# a third of it (:mod:`gradjax.attacks`). Other attacks run their presets' budgets.
# The attacks an audit runs by name (or ``auto``, gradjax.auto's choice per capture).
ATTACKS = (*presets.PRESETS, *closed_forms.CLOSED_FORMS)
AUDIT_ITERATIONS = {"dlg": 6000, "idlg": 6000}


class Settings(NamedTuple):
  """How :func:`audit` attacks the captures: the attacks, and the sections of the configuration
  (:mod:`gradjax.run.config`) whose options :data:`OPTIONS` it reads. Build them with
  :func:`settings`, whose defaults are those of captured files (:data:`gradjax.run.config.CAPTURED`:
  the model from the captures, no scoring); a section built by hand holds the schema's defaults
  instead (``config.DataConfig()``'s dataset is skimage, ``config.ModelConfig()``'s model lenet_zhu).

  attacks: attack names (:data:`ATTACKS`), or ``("auto",)`` for :func:`gradjax.auto.for_metadata`.
  model: ``name``, the zoo model of captures whose metadata name none (``None``: theirs, else
    lenet_zhu); ``rename``, rules for the captured tensors' names.
  data: ``dataset``, ``data_dir``, ``image_size``: where the clients' examples are, to score
    captures that carry ``data_indices`` (dataset ``None``: no scoring); ``normalization``: how the
    clients preprocessed them (``None``: the captures' metadata).
  attack: ``iterations`` per attack (``None``: :data:`AUDIT_ITERATIONS`, else the preset's),
    ``restarts``; ``adaptive``: attack a capture whose metadata declare the client's ``defense``
    with the attack adapted to it (:mod:`gradjax.adaptive`); captures that declare none are attacked
    plainly.
  client: ``force``, attack a capture that fails its checks (:func:`gradjax.fidelity.check_capture`;
    without it that is a row's error).
  defense: ``dp_sgd_*``, the DP-SGD every client ran (``dp_sgd_max_norm`` ``None``: none): each run
    reports its (ε, δ), its residual recomputes the clipping, ``attack.adaptive`` adapts the attack
    to it. A capture whose metadata declare the client's own DP-SGD
    (:func:`gradjax.interop.declared_dp_sgd`; a Flower client's declarations) is attacked with those
    values instead, key by key.
  execution: ``clients_per_run``, captures attacked in one solver run when they share the model and
    the attack (``None``: :func:`gradjax.run.pipeline.clients_per_run`, 64 on an accelerator, 1 on
    CPU).
  output: ``lpips``; seed: the attacks' seed.
  """

  attacks: tuple[str, ...] = (auto.AUTO,)
  model: config.ModelConfig = config.ModelConfig(name=None)
  data: config.DataConfig = config.DataConfig(dataset=None)
  attack: config.AttackConfig = config.AttackConfig()
  client: config.ClientConfig = config.ClientConfig()
  defense: config.DefenseConfig = config.DefenseConfig()
  execution: config.ExecutionConfig = config.ExecutionConfig()
  output: config.OutputConfig = config.OutputConfig()
  seed: int = 0

  def options(self) -> dict[str, Any]:
    """Dotted path -> value of the options the audit reads (:data:`OPTIONS`)."""
    return {p: getattr(self, p) if p == "seed" else getattr(getattr(self, config.section(p)),
                                                            p.partition(".")[2])
            for p in OPTIONS}

  def to_json(self) -> dict[str, Any]:
    """The attacks and :meth:`options` as JSON values: what ``rows.json`` and ``index.json`` record,
    and what a process of its own reads back (:func:`from_json`)."""
    return json.loads(json.dumps({"attacks": list(self.attacks), "options": self.options()}))


# The options of the configuration an audit reads (dotted paths; the sections of :class:`Settings`).
OPTIONS = ("model.name", "model.rename", "data.dataset", "data.data_dir", "data.image_size",
           "data.normalization", "attack.iterations", "attack.restarts", "attack.adaptive",
           "client.force", "execution.clients_per_run", "output.lpips", "seed",
           *(f"defense.dp_sgd_{k}" for k in ("max_norm", "noise_multiplier", "sampling_rate", "steps",
                                             "delta", "poisson", "expected_batch_size")))
SECTIONS = tuple(f for f in Settings._fields if f not in ("attacks", "seed"))


def settings(attacks: Sequence[str] = (auto.AUTO,),
             options: dict[str, Any] | None = None) -> Settings:
  """The :class:`Settings` of ``attacks`` with ``options`` (dotted path -> value, of
  :data:`OPTIONS`) set over the defaults of captured files (the model from the captures, no ground
  truth: :data:`gradjax.run.config.CAPTURED`)::

    audit.settings(("dlg",), {"data.dataset": "cifar10", "attack.iterations": 300})

  Raises:
    ValueError: an option the audit does not read, or a value its section refuses.
  """
  if isinstance(attacks, (str, dict)) or not all(isinstance(a, str) for a in attacks):
    raise TypeError(f"audit.settings takes a sequence of attack names first, got {attacks!r}")
  attacks = tuple(attacks)
  unknown = [a for a in attacks if a not in ATTACKS and a != auto.AUTO]
  if (not attacks or unknown or len(set(attacks)) != len(attacks)
      or (auto.AUTO in attacks and len(attacks) > 1)):
    raise ValueError(f"attacks: 'auto' alone or distinct names from {', '.join(ATTACKS)}; got "
                     f"{list(attacks)}")
  given = dict(options or {})
  outside = [p for p in given if p not in OPTIONS]
  if outside:
    raise ValueError(f"an audit reads the options {', '.join(OPTIONS)}; not {', '.join(outside)}")
  seed = given.pop("seed", 0)
  config.check_type("seed", seed)
  seed = int(seed)  # NumPy's too: the settings travel as JSON (rows.json, a process of its own)
  sections = config.sections({**config.CAPTURED, **given}, SECTIONS)
  if sections["attack"].iterations is not None and sections["attack"].iterations < 1:
    raise ValueError(f"attack.iterations must be positive (None: the preset's), got "
                     f"{sections['attack'].iterations}")
  d = sections["data"]
  if d.dataset is not None and not (d.dataset in data.DATASETS or d.dataset.startswith("tfds:")):
    raise ValueError(f"data.dataset={d.dataset!r}: choose one of {', '.join(data.DATASETS)} (or "
                     "tfds:<name>), or None for no scoring")
  if d.image_size is not None and d.dataset is None:
    raise ValueError(f"data.image_size={d.image_size}: it sizes the data.dataset images that score "
                     "the captures (whose own shape their metadata declare); give data.dataset, or "
                     "drop it")
  return Settings(tuple(attacks), seed=seed, **sections)


def _check_settings(settings: Any) -> None:
  if not isinstance(settings, Settings):
    raise TypeError(f"the audit's settings are audit.settings(attacks, options), got "
                    f"{type(settings).__name__}")


def from_json(value: dict[str, Any]) -> Settings:
  """The :class:`Settings` that :meth:`Settings.to_json` wrote."""
  return settings(value["attacks"], value["options"])


def _truth(capture: Capture, settings: Settings) -> data.Dataset | None:
  indices = capture.info.get("data_indices")
  d = settings.data
  if d.dataset is None or not indices:
    return None
  size = None if d.image_size is None else (d.image_size, d.image_size)
  return data.load(d.dataset, data_dir=d.data_dir, indices=indices, image_size=size)


SUMMARY_KEYS = ("loss", "psnr", "ssim", "lpips", "label_accuracy", "iterations", "wall_time_s")


def _sent_imprinted(capture: Capture, model: str, meta: dict[str, Any]) -> bool:
  """:func:`imprinted` of the model recorded as sent to ``capture``'s client (False when it cannot
  be read as the declared ``model``)."""
  try:
    sent = interop.read(os.path.join(capture.folder, WEIGHTS)).tensors
    shape = meta.get("input_shape") or (32, 32, 3)
    shape = interop.parse_shape(shape) if isinstance(shape, str) else tuple(int(s) for s in shape)
    return imprinted(sent, model, shape)
  except (ValueError, FileNotFoundError, KeyError, TypeError):
    return False


def attack_capture(capture: Capture, settings: Settings, log: Callable[[str], None] = print, *,
                   truth: data.Dataset | None = None,
                   target_psnr: float | None = None) -> list[dict[str, Any]]:
  """Runs the attacks on one capture; writes each one's run files into ``<capture>/<attack>/``
  (``<attack>-1``, ``-2``, ... where an earlier audit's are: they are never replaced).

  ``truth``: the client's examples to score against (images in [0, 1]); default: loaded from
  ``settings.data.dataset`` at the capture's ``data_indices``. ``target_psnr``: with a truth, each
  attack stops once its reconstruction reaches this PSNR (dB; a leak is established).

  Returns one row per attack (round, client, attack, the summary metrics, the run folder, or
  ``error``). A capture or an attack that fails gives a row with its one-line error, not an
  exception: one bad client never stops an audit. An update its client's gate withheld
  (:data:`WITHHELD`) gives one row with ``withheld``, not an error, and a client whose gate refused
  the server's model (:data:`MODEL_REFUSED`) one with ``refused``. With the auto attacks, a sent
  model that hides an imprint (:func:`imprinted`) is read out first (the ``imprint`` closed form: what
  that server recovers). An update that carries nothing
  (:func:`gradjax.fidelity.zero_update`) gives one row, ``no_leak_found`` with ``zero_update``.
  """
  return attack_round([capture], settings, log, truths=[truth], target_psnr=target_psnr)[0]


def _disagreement(capture: Capture, meta: dict[str, Any]) -> str | None:
  """Where ``capture.json``'s metadata (which choose the attacks) and the update file's (which the
  attacks read) differ, the first difference; :func:`write_capture` writes the same to both."""
  path = os.path.join(capture.folder, OBSERVATION)
  if not os.path.isfile(path):
    return None
  try:
    held, said = interop.read_metadata(path), interop.metadata_strings(meta, CAPTURE)
  except ValueError:  # an unreadable file: the attack's load says why
    return None
  for key in sorted(said):
    if held.get(key) != said[key]:
      return (f"{CAPTURE}'s metadata disagree with {OBSERVATION}'s: {key} is {said[key]!r} in the "
              f"one, {held.get(key)!r} in the other")
  return None


class _Plan(NamedTuple):
  """What :func:`attack_round` attacks in one capture: its rows' common fields, the attacks in
  order, the ground truth, the capture's metadata, whether ``auto`` chose the attacks, the DP-SGD
  the client declares of itself (``defense.*`` options) and whether it declares a defense."""

  base: dict[str, Any]
  names: tuple[str, ...]
  truth: data.Dataset | None
  meta: dict[str, Any]
  chosen: bool
  dp_sgd: dict[str, Any]
  defended: bool


def _plan(capture: Capture, settings: Settings, log, truth) -> _Plan | list[dict[str, Any]]:
  """The capture's :class:`_Plan`, or its final rows when nothing is attacked (an error, a withheld
  update, a refused model, a ground truth that did not load)."""
  base = {"round": capture.round, "client": capture.client}
  if capture.info.get("reply"):  # the k-th reply of a node that replied more than once
    base["reply"] = capture.info["reply"]
  error = one_line(capture.error) if capture.error else None  # a recorded reason may span lines
  if error and WITHHELD in error:  # the client's gate kept it: nothing was sent
    return [{**base, "attack": None, "withheld": True, "reason": error}]
  if error and MODEL_REFUSED in error:  # the client's gate refused the server's model
    return [{**base, "attack": None, "refused": True, "reason": error}]
  if error:
    return [{**base, "attack": None, "error": error}]
  names = settings.attacks
  chosen = tuple(names) == (auto.AUTO,)  # auto also sets what depends on the model family
  meta = capture.info.get("metadata", {})
  differ = _disagreement(capture, meta)
  if differ:  # what chooses the attacks and what they read must be the same client's
    log(f"round {capture.round} client {capture.client}: error: {differ}")
    return [{**base, "attack": None, "error": differ}]
  try:  # the client's own DP-SGD and defense, as the update file holds them
    dp_sgd = {f"defense.{k}": v for k, v in interop.declared_dp_sgd(
        interop.metadata_strings(meta, CAPTURE), CAPTURE).items()}
    defended = bool(defenses.parts(_declared_defense(meta)))
  except ValueError as e:
    error = one_line(str(e))
    log(f"round {capture.round} client {capture.client}: error: {error}")
    return [{**base, "attack": None, "error": error}]
  config = capture.info.get("config")
  stated = {k: v for k, v in capture_metadata({}, config, {}).items()
            if k not in meta} if isinstance(config, dict) else {}
  if stated and "local_lr" not in meta:  # a capture written by hand: say what is not read
    log(f"round {capture.round} client {capture.client}: capture.json's config states "
        f"{', '.join(f'{k}={v}' for k, v in stated.items())}, which the capture's metadata lack; the "
        "attacks read the metadata alone (write them with gradjax.integrations.audit.capture_metadata)")
  if chosen:
    try:
      names = auto.for_metadata(meta, settings.model.name)
    except (ValueError, TypeError) as e:  # a metadata value of another type than interop writes
      error = f"{CAPTURE}: metadata do not describe an update: {str(e).splitlines()[0]}"
      log(f"round {capture.round} client {capture.client}: error: {error}")
      return [{**base, "attack": None, "error": error}]
    model = settings.model.name or meta.get("model")
    if model and _sent_imprinted(capture, model, meta):  # a malicious server: its own read-out first
      names = ("imprint", *names)
  try:
    truth = _truth(capture, settings) if truth is None else truth
  except (ValueError, FileNotFoundError) as e:  # asked for and not loaded: an error, not a blank score
    error = f"ground truth from {settings.data.dataset} not loaded: {str(e).splitlines()[0]}"
    log(f"round {capture.round} client {capture.client}: error: {error}")
    return [{**base, "attack": None, "error": error}]
  if truth is None and settings.data.dataset is not None:
    log(f"round {capture.round} client {capture.client}: not scored: its {CAPTURE} has no "
        "data_indices (the dataset indices of the client's examples)")
  return _Plan(base, tuple(names), truth, meta, chosen, dp_sgd, defended)


def _declared_defense(meta: dict[str, Any]) -> defenses.Defense:
  """The defense a capture's metadata declare (none: the identity); ValueError naming the field."""
  try:
    return defenses.parse(str(meta.get("defense") or "none"))
  except ValueError as e:
    raise ValueError(f"{CAPTURE}: metadata 'defense': {e}") from None


def _attack_config(capture: Capture, settings: Settings, name: str, plan: _Plan) -> config.Config:
  """The experiment of attack ``name`` on ``capture``."""
  meta = plan.meta
  # FedAvg clients do not share labels: inferred from the update's last layer.
  labels = pipeline.capture_label_source(name, meta)
  closed = name in closed_forms.CLOSED_FORMS  # no budget, restarts or adaptation to set
  # The DP-SGD a client declares of itself (its capture's metadata) over what the settings say of
  # every client.
  dp_sgd = bool(plan.dp_sgd) or settings.defense.dp_sgd_max_norm is not None
  # Adapted where there is a defense to adapt to; DLM+, which cannot model DP-SGD's clipping, runs
  # as it is beside the attacks that can.
  adaptive = (not closed and settings.attack.adaptive and (plan.defended or dp_sgd)
              and (not dp_sgd or pipeline.models_dp_sgd(presets.get_preset(name)())))
  return config.from_options({
      **settings.options(), **plan.dp_sgd, "attack.preset": name,
      "model.weights": os.path.join(capture.folder, WEIGHTS),
      "client.observation": os.path.join(capture.folder, OBSERVATION),
      "data.dataset": None,  # the truth is scored here, loaded once for the capture's attacks
      "data.data_dir": None,
      "attack.iterations": (None if closed else
                            settings.attack.iterations or AUDIT_ITERATIONS.get(name)),
      "attack.restarts": 1 if closed else settings.attack.restarts, "attack.label_source": labels,
      "attack.adaptive": adaptive,
      **(auto.settings(name, settings.model.name or meta.get("model")) if plan.chosen else {})})


def attack_round(found: Sequence[Capture], settings: Settings, log: Callable[[str], None] = print, *,
                 truths: Sequence[data.Dataset | None] | None = None,
                 target_psnr: float | None = None) -> list[list[dict[str, Any]]]:
  """:func:`attack_capture` of each capture of ``found`` (e.g. a round's clients), their rows in
  order; each attack runs on every capture that has it in one call of
  :func:`gradjax.run.pipeline.run_clients`, so captures of one model attacked alike share one solver
  run where ``settings.execution.clients_per_run`` (or the device) says so (:func:`gradjax.run.pipeline.clients_per_run`),
  each with its own results, run folder and verdict. ``truths``: each capture's ground truth
  (default: loaded from ``settings.data.dataset``); ``target_psnr``: as :func:`attack_capture`'s."""
  _check_settings(settings)
  truths = [None] * len(found) if truths is None else list(truths)
  plans = [_plan(c, settings, log, t) for c, t in zip(found, truths)]
  rows: list[list[dict[str, Any]]] = [p if isinstance(p, list) else [] for p in plans]
  live = [k for k, p in enumerate(plans) if isinstance(p, _Plan)]
  slot = 0
  while live:
    todo = [k for k in live if slot < len(plans[k].names)]
    if not todo:
      break
    cfgs, asked = [], []
    for k in todo:
      name = plans[k].names[slot]
      try:
        cfgs.append(_attack_config(found[k], settings, name, plans[k]))
        asked.append(k)
      except (ValueError, FileNotFoundError) as e:
        rows[k].append(_failed_row(found[k], plans[k].base, name, e, log))
    outcomes = pipeline.run_clients(cfgs, [plans[k].truth for k in asked], target_psnr)
    for k, outcome in zip(asked, outcomes):
      capture, plan, name = found[k], plans[k], plans[k].names[slot]
      if isinstance(outcome, fidelity.ZeroUpdate):  # a finding of the capture: one row for all
        rows[k].append({**plan.base, "attack": None, "verdict": "no_leak_found",
                        "reason": str(outcome), "zero_update": True})
        log(f"round {capture.round} client {capture.client}: {outcome}")
        live.remove(k)
      elif isinstance(outcome, Exception):
        rows[k].append(_failed_row(capture, plan.base, name, outcome, log))
      else:
        try:
          rows[k].append(_attacked_row(capture, plan.base, name, *outcome, log))
        except (ValueError, OSError) as e:  # its run folder could not be written
          rows[k].append(_failed_row(capture, plan.base, name, e, log))
    live = [k for k in live if slot + 1 < len(plans[k].names)]
    slot += 1
  return rows


def _failed_row(capture: Capture, base: dict, name: str, error: Exception, log) -> dict[str, Any]:
  message = one_line(str(error).splitlines()[0] if str(error).strip() else type(error).__name__)
  log(f"round {capture.round} client {capture.client} {name}: error: {message}")
  return {**base, "attack": name, "error": message}


def _attacked_row(capture: Capture, base: dict, name: str, results: dict, images: dict,
                  log) -> dict[str, Any]:
  """The row of attack ``name`` on ``capture``, its run files written into ``<capture>/<name>/``."""
  out = unique_dir(os.path.join(capture.folder, name))  # an earlier audit's files stay as they were
  report.write_run(out, results, images, f"{name}, round {capture.round}, client {capture.client}")
  os.remove(os.path.join(out, OWNER))  # the run's files hold the folder now
  row = {**base, "attack": name, **{k: results.get(k) for k in SUMMARY_KEYS},
         "run": os.path.relpath(out, os.path.dirname(os.path.dirname(capture.folder))),
         "num_samples": results.get("num_samples"), "verdict": results["verdict"]["status"],
         "reason": results["verdict"]["reason"]}
  if results.get("privacy") is not None:  # the client's DP-SGD and its (ε, δ)
    row["privacy"] = results["privacy"]
  if results.get("clients_together", 1) > 1:
    row["clients_together"] = results["clients_together"]
  scored = "" if row["psnr"] is None else f", PSNR {row['psnr']:.2f} dB"
  objective = "no objective" if row["loss"] is None else f"objective {row['loss']:.4g}"
  log(f"round {capture.round} client {capture.client} {name}: {objective}{scored}"
      f", verdict {row['verdict']}")
  return row


def audit(audit_dir, settings: Settings = Settings(), *, rounds: Sequence[int] | None = None,
          index_dir=None, log: Callable[[str], None] = print,
          resume: bool = False) -> list[dict[str, Any]]:
  """Attacks every capture under ``audit_dir`` (of ``rounds``, all when ``None``) and writes the
  index of those (``index.json``, ``index.md``, ``index.html``) into ``index_dir`` (default
  ``audit_dir``); returns its rows. ``resume``: captures already attacked with these ``settings``
  are read back (:func:`attack_captures`)."""
  found = select(audit_dir, rounds)
  return index(audit_dir, attack_captures(found, settings, log, resume=resume), settings, found,
               rounds=rounds, index_dir=index_dir)


def select(audit_dir, rounds: Sequence[int] | None = None) -> list[Capture]:
  """The captures under ``audit_dir`` of ``rounds`` (all when ``None``), ordered by round and client.

  Raises:
    ValueError: there are none.
  """
  found = [c for c in captures(audit_dir) if rounds is None or c.round in set(rounds)]
  if not found:
    raise ValueError(f"no captures of rounds {sorted(rounds)} under {audit_dir}")
  return found


ROWS = "rows.json"  # a capture's rows and the settings they were attacked with, as each capture ends


class Stopped(Exception):
  """An audit a signal stopped: ``rows`` of the ``done`` captures of ``total`` (each also kept in
  its ``rows.json``, so ``resume`` reads them back); ``signum``, the signal. The first signal stops
  it between captures; a second (``KeyboardInterrupt`` in the block of captures being attacked) at
  once, that block's attacks lost (a resume attacks them again, beside any run folder they had
  written)."""

  def __init__(self, rows: list[dict[str, Any]], done: int, total: int, signum: int):
    super().__init__(f"stopped after {done} of {total} captures (signal {signum})")
    self.rows, self.done, self.total, self.signum = rows, done, total, signum


# The settings as rows.json and index.json recorded them before they were the configuration's
# sections (until 2026-12-07): a flat record, its field -> the option's dotted path.
_FLAT_SETTINGS = {"model": "model.name", "dataset": "data.dataset", "data_dir": "data.data_dir",
                  "image_size": "data.image_size", "normalization": "data.normalization",
                  "iterations": "attack.iterations", "restarts": "attack.restarts", "seed": "seed",
                  "lpips": "output.lpips", "rename": "model.rename", "force": "client.force",
                  "adaptive": "attack.adaptive", "clients_per_run": "execution.clients_per_run",
                  **{f"dp_sgd_{k}": f"defense.dp_sgd_{k}"
                     for k in ("max_norm", "noise_multiplier", "sampling_rate", "steps", "delta",
                               "poisson", "expected_batch_size")}}


def _recorded_settings(kept: Any) -> Any:
  """The settings a rows.json recorded, in :meth:`Settings.to_json`'s form (an earlier audit's
  flat record translated; anything else as it is, to compare unequal)."""
  if (isinstance(kept, dict) and "options" not in kept and "attacks" in kept
      and set(kept) == {"attacks", *_FLAT_SETTINGS}):
    return {"attacks": kept["attacks"],
            "options": {path: kept[name] for name, path in _FLAT_SETTINGS.items()}}
  return kept


def kept_rows(capture: Capture, settings: Settings) -> list[dict[str, Any]] | None:
  """The rows an earlier audit with the same ``settings`` left in the capture's ``rows.json``
  (``None``: none, other settings, or unreadable)."""
  try:
    with open(os.path.join(capture.folder, ROWS), encoding="utf-8") as fh:
      kept = json.load(fh)
  except (OSError, ValueError, RecursionError):
    return None
  if not isinstance(kept, dict) or _recorded_settings(kept.get("settings")) != settings.to_json():
    return None
  rows = kept.get("rows")
  if not (isinstance(rows, list) and rows and all(_valid_row(r) for r in rows)):
    return None
  # Rows of this capture only: a file copied from another client's folder is attacked again.
  mine = all(r["round"] == capture.round and str(r["client"]) == str(capture.client) for r in rows)
  return rows if mine else None


def attack_captures(found: Sequence[Capture], settings: Settings,
                    log: Callable[[str], None] = print, *, resume: bool = False,
                    stop: Callable[[], int | None] = lambda: None) -> list[dict[str, Any]]:
  """:func:`attack_capture` of each capture in turn (in blocks of
  :func:`gradjax.run.pipeline.clients_per_run` consecutive captures, :func:`attack_round`): their
  rows. Each capture's rows are kept in its ``rows.json`` as it (its block) ends; with ``resume``, a
  capture whose ``rows.json`` holds rows of the same ``settings`` is not attacked again. ``stop`` is
  asked between blocks: a signal number raises :class:`Stopped` with the rows so far, and so does a
  ``KeyboardInterrupt`` in a block after ``stop`` has reported a signal (a second Ctrl-C, where
  :func:`gradjax.run.resume.stop_on_signals` handles the first), with the rows of the captures
  before that block; any other ``KeyboardInterrupt`` propagates."""
  _check_settings(settings)
  rows, done = [], 0
  try:
    for new in _rows_by_capture(found, settings, log, resume):
      if new is not None:
        rows.extend(new)
        done += 1
      elif (signum := stop()) is not None:
        raise Stopped(rows, done, len(found), signum)
  except KeyboardInterrupt:
    if stop() is None:  # not a second signal: no audit's handler saw a first one
      raise
    raise Stopped(rows, done, len(found), signal.SIGINT) from None
  return rows


def _rows_by_capture(found, settings, log, resume):
  """:func:`attack_captures`' loop: yields each capture's rows, in order, and None before each
  block (where a signal stops the audit)."""
  start = time.perf_counter()
  together = pipeline.clients_per_run(config.Config(execution=settings.execution))
  k = 0
  while k < len(found):
    yield None
    kept = kept_rows(found[k], settings) if resume else None
    if kept is not None:
      yield kept
      log(f"capture {k + 1}/{len(found)} (round {found[k].round} client {found[k].client}): kept "
          f"from its {ROWS}")
      k += 1
      continue
    block = [found[k]]  # with the captures after it that a resume does not keep, up to `together`
    while (len(block) < together and k + len(block) < len(found)
           and not (resume and kept_rows(found[k + len(block)], settings) is not None)):
      block.append(found[k + len(block)])
    for capture, new in zip(block, attack_round(block, settings, log)):
      try:
        report.save_json(os.path.join(capture.folder, ROWS),
                         {"settings": settings.to_json(), "rows": new})
      except OSError as e:  # the rows still reach the index; only a resume would attack it again
        log(f"round {capture.round} client {capture.client}: {ROWS} not written: {e}")
      yield new
    k += len(block)
    log(f"capture {k}/{len(found)} done, {time.perf_counter() - start:.0f} s")


def index(audit_dir, rows: list[dict[str, Any]], settings: Settings, found: Sequence[Capture], *,
          rounds: Sequence[int] | None = None, index_dir=None) -> list[dict[str, Any]]:
  """Writes the index of an audit's ``rows`` (of the captures ``found``) into ``index_dir``
  (default ``audit_dir``): with a row for every client of ``rounds`` that never replied (no
  capture), merged with the rows of an earlier index there (:func:`merged_rows`), and what
  happened in each recorded round (:func:`membership`). Returns its rows."""
  recorded = {(c.round, c.client) for c in found}
  for r, failed in round_failures(audit_dir).items():  # clients that never replied: no capture
    if rounds is None or r in set(rounds):
      rows = rows + [{"round": r, "client": str(client), "attack": None, "error": one_line(str(why))}
                     for client, why in failed.items() if (r, str(client)) not in recorded]
  index_dir = audit_dir if index_dir is None else index_dir
  earlier = read_index(index_dir)
  kept = _keep_unread_index(index_dir, len(earlier))
  if kept:
    _LOG.warning("%s", kept)
  for line in replaced_verdicts(earlier, rows):
    _LOG.warning("%s", line)
  rows = merged_rows(earlier, rows)
  write_index(index_dir, rows, settings, audit_dir, rounds=membership(audit_dir))
  return rows


def _keep_unread_index(index_dir, read: int) -> str | None:
  """Where ``index_dir``'s ``index.json`` holds rows :func:`read_index` could not read (``read`` of
  them read; a truncated file, a row of other types), a copy of it beside it, never replaced by the
  new index; the line that says so (None: nothing unread)."""
  path = os.path.join(os.fspath(index_dir), "index.json")
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as fh:
      rows = json.load(fh).get("rows")
    total = len(rows) if isinstance(rows, list) else None
  except (OSError, ValueError, AttributeError, RecursionError):
    total = None
  if total == read:
    return None
  k = 0
  while True:  # taken exclusively: two audits at once never write one copy
    copy = path + (".unread" if k == 0 else f".unread-{k}")
    try:
      fd = os.open(copy, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      break
    except FileExistsError:
      k += 1
  with os.fdopen(fd, "wb") as out, open(path, "rb") as earlier:
    shutil.copyfileobj(earlier, out)
  what = (f"{total - read} of its {total} rows are unreadable" if total is not None
          else "it is unreadable")
  return (f"{path}: {what}, so the new index leaves them out; the earlier file is kept as {copy} "
          "(the runs' folders stay)")


def read_index(index_dir) -> list[dict[str, Any]]:
  """The rows of an earlier ``index.json`` in ``index_dir`` ([] when there is none or it is not an
  index)."""
  path = os.path.join(os.fspath(index_dir), "index.json")
  try:
    with open(path, encoding="utf-8") as fh:
      rows = json.load(fh).get("rows", [])
  except (OSError, ValueError, AttributeError, RecursionError):
    return []
  return [r for r in rows if _valid_row(r)] if isinstance(rows, list) else []


def _valid_row(row: Any) -> bool:
  """Whether ``row``, read back from a file (``index.json``, ``rows.json``), has the types an audit
  writes: an integer round, a client, text where there is text and numbers for the scores."""
  if not (isinstance(row, dict) and isinstance(row.get("round"), int) and not isinstance(row["round"], bool)
          and isinstance(row.get("client"), (str, int))):
    return False
  numbers = all(row.get(k) is None or files.is_number(row[k]) for k in SUMMARY_KEYS)
  texts = all(row.get(k) is None or isinstance(row[k], str)
              for k in ("attack", "error", "reason", "verdict", "run"))
  privacy = row.get("privacy")
  dp_sgd = privacy is None or (
      isinstance(privacy, dict) and isinstance(privacy.get("delta"), (int, float))
      and (privacy.get("epsilon") is None or isinstance(privacy["epsilon"], (int, float))))
  return numbers and texts and dp_sgd


def one_line(text: str) -> str:
  """``text`` on one line (a recorded reason may hold newlines: Flower's ClientAppException's)."""
  return " ".join(str(text).split())


def replaced_verdicts(earlier: list[dict], new: list[dict]) -> list[str]:
  """One line for each (round, client, attack) whose verdict in ``new`` differs from the one in
  the ``earlier`` index it replaces (e.g. a smaller budget), and for each earlier attack of a
  (round, client) that ``new`` covers without running it (:func:`merged_rows` drops it): an audit
  again never changes an index silently (the earlier runs' folders stay)."""
  before = {(r["round"], str(r["client"]), r.get("attack")): r for r in earlier}
  lines = []
  for r in new:
    old = before.get((r["round"], str(r["client"]), r.get("attack")))
    if old is not None and old.get("verdict") != r.get("verdict"):
      lines.append(f"round {r['round']} client {r['client']} {r.get('attack')}: {old.get('verdict')} "
                   f"({old.get('iterations')} iterations) replaced by {r.get('verdict')} "
                   f"({r.get('iterations')} iterations); the earlier run stays at {old.get('run')}")
  # The earlier rows of a covered (round, client) that no new row answers: dropped from the index.
  covered = {(r["round"], str(r["client"])) for r in new}
  answered = {(r["round"], str(r["client"]), r.get("attack")) for r in new}
  for key, old in before.items():
    if key[:2] in covered and key not in answered and old.get("verdict") is not None:
      lines.append(f"round {key[0]} client {key[1]} {key[2]}: {old['verdict']} "
                   f"({old.get('iterations')} iterations) left out of the index, this audit not "
                   f"running {key[2]}; the earlier run stays at {old.get('run')}")
  return lines


def merged_rows(earlier: list[dict], new: list[dict]) -> list[dict]:
  """``new`` rows, with the ``earlier`` index's rows of every (round, client) that ``new`` does not
  cover kept: auditing some rounds again never drops the others. Sorted by round, then client."""
  covered = {(r["round"], str(r["client"])) for r in new}
  kept = [r for r in earlier if (r["round"], str(r["client"])) not in covered]
  return sorted(kept + new, key=lambda r: (r["round"], str(r["client"])))


TRUTH = "truth.npz"  # the client's own examples, written beside a capture by a client auditing itself


def attack_in_process(folder, settings: Settings, *, truth: data.Dataset | None = None,
                      timeout_s: float | None = None,
                      compilation_cache: str = compilation.DEFAULT_CACHE,
                      target_psnr: float | None = None) -> list[dict[str, Any]]:
  """:func:`attack_capture` of the capture in ``folder``, run in a Python process of its own (a
  client's process holds PyTorch, whose company a JAX compilation has not always survived) that is
  killed after ``timeout_s``; its rows.

  ``truth``: the client's examples to score against, passed through ``folder/truth.npz``.
  ``compilation_cache``: the persistent compilation cache of that process ('' : none), so that
  attacks after the first load their programs. ``target_psnr``: as :func:`attack_capture`'s.

  Raises:
    TimeoutError: the attack did not finish within ``timeout_s``.
    RuntimeError: the process failed (its last line of output).
  """
  import subprocess
  import sys
  folder = os.fspath(folder)
  if truth is not None:
    np.savez(os.path.join(folder, TRUTH), x=np.asarray(truth.x, np.float32),
             y=np.asarray(truth.y, np.int64), num_classes=np.int64(truth.num_classes))
  code = ("import json, sys; from gradjax import compilation; from gradjax.integrations import audit; "
          "compilation.use_persistent_cache(sys.argv[3]); "
          "print(json.dumps(audit._attack_folder(sys.argv[1], audit.from_json(json.loads(sys.argv[2])), "
          "json.loads(sys.argv[4]))))")
  try:
    proc = subprocess.run([sys.executable, "-c", code, folder, json.dumps(settings.to_json()),
                           compilation_cache, json.dumps(target_psnr)],
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired:
    raise TimeoutError(f"the attack took longer than {timeout_s:g} s") from None
  if proc.returncode != 0:
    raise RuntimeError((proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _attack_folder(folder: str, settings: Settings,
                   target_psnr: float | None = None) -> list[dict[str, Any]]:
  """:func:`attack_capture` of the capture in ``folder``, scored on its ``truth.npz`` when there
  is one (``target_psnr``: as :func:`attack_capture`'s); the log goes to stderr (stdout carries
  the rows)."""
  import sys
  with open(os.path.join(folder, CAPTURE), encoding="utf-8") as fh:
    info = json.load(fh)
  capture = Capture(int(info.get("round", 0)), str(info.get("client", "")), folder, info)
  truth = None
  if os.path.exists(os.path.join(folder, TRUTH)):
    with open(os.path.join(folder, TRUTH), "rb") as fh:
      arrays = np.load(fh, allow_pickle=False)
      truth = data.Dataset(arrays["x"], arrays["y"], int(arrays["num_classes"]), "client")
  rows = attack_capture(capture, settings, lambda line: print(line, file=sys.stderr), truth=truth,
                        target_psnr=target_psnr)
  return json.loads(json.dumps(rows, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def attack_in_background(audit_dir, round_: int, settings: Settings) -> "subprocess.Popen":
  """Starts :func:`audit` of one round in a separate Python process (its own session, its output in
  ``round_<r>/audit.log``, its index in the round folder) and returns at once: the federation never
  waits for, or fails with, the attack."""
  import subprocess
  import sys
  round_dir = os.path.join(os.fspath(audit_dir), f"round_{round_:03d}")
  code = ("import json, sys; from gradjax.integrations import audit; "
          "audit.audit(sys.argv[1], audit.from_json(json.loads(sys.argv[3])), "
          "rounds=[int(sys.argv[2])], index_dir=sys.argv[4])")
  log = open(os.path.join(round_dir, "audit.log"), "ab")
  try:
    return subprocess.Popen([sys.executable, "-c", code, os.fspath(audit_dir), str(round_),
                             json.dumps(settings.to_json()), round_dir],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
  finally:
    log.close()


# --- the index over the federation -----------------------------------------------------------------

def _fmt(value, spec: str) -> str:
  return "–" if value is None else format(value, spec)


def _status(row: dict[str, Any]) -> str:
  if row.get("error"):
    return row["error"]
  if row.get("withheld"):
    return "withheld by the client's gate"
  return "the server's model refused by the client's gate" if row.get("refused") else "ok"


def _cell(text: str) -> str:
  """``text`` as one Markdown table cell: on one line, its bars escaped."""
  return one_line(text).replace("|", "\\|")


def index_markdown(rows: list[dict[str, Any]]) -> str:
  """Rows as a Markdown table: round, client, attack, verdict, objective, PSNR, SSIM, LPIPS, time,
  the ε of the client's DP-SGD (where some row's client ran it), status."""
  private = _any_dp_sgd(rows)
  lines = ["| round | client | attack | verdict | objective | PSNR (dB) | SSIM | LPIPS | time (s) | "
           + ("DP-SGD ε | " if private else "") + "status |",
           "|---|---|---|---|---|---|---|---|---|" + ("---|" if private else "") + "---|"]
  for r in rows:
    lines.append(f"| {r['round']} | {r['client']} | {r.get('attack') or '–'} | "
                 f"{r.get('verdict') or '–'} | "
                 f"{_fmt(r.get('loss'), '.4g')} | {_fmt(r.get('psnr'), '.2f')} | "
                 f"{_fmt(r.get('ssim'), '.3f')} | {_fmt(r.get('lpips'), '.3f')} | "
                 f"{_fmt(r.get('wall_time_s'), '.1f')} | "
                 + (f"{_epsilon(r)} | " if private else "")
                 + f"{_cell(_status(r))} |")
  return "\n".join(lines) + "\n"


def _any_dp_sgd(rows: list[dict[str, Any]]) -> bool:
  """Whether some row's client ran DP-SGD (the index then has a column of their ε)."""
  return any(isinstance(r.get("privacy"), dict) for r in rows)


def _epsilon(row: dict[str, Any]) -> str:
  """The ε of a row's client's DP-SGD (:func:`gradjax.run.pipeline.dp_sgd_privacy`) and its δ;
  ∞ for DP-SGD without noise; – for a client without DP-SGD."""
  privacy = row.get("privacy")
  if not isinstance(privacy, dict):
    return "–"
  if privacy.get("noise_multiplier_declared") is False:
    return "∞ (no noise declared)"
  if privacy.get("epsilon") is None:
    return "∞ (no noise)"
  return f"{privacy['epsilon']:.3g} (δ {privacy['delta']:g})"


def failed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The rows of captures that failed (a client that failed or sent a malformed reply, no reply,
  a ground truth not loaded) or attacks that raised; not the updates a client's gate withheld, nor
  the clients whose gate refused the server's model."""
  return [r for r in rows if r.get("error")]


def _nodes(values) -> str:
  return ", ".join(values) if values else "–"


ROUND_COLUMNS = ("round", "clients sent", "failed", "withheld", "refused the model", "replied twice or more",
                 "new nodes", "nodes gone")


def _round_cells(r: dict[str, Any]) -> list[str]:
  since = f" (since round {r['since']})" if "since" in r else ""
  return [str(r["round"]), _fmt(r.get("clients_sent"), "d"), _nodes(r["failed"]), _nodes(r["withheld"]),
          _nodes(r.get("refused")), _nodes([f"{n} ({k} replies)" for n, k in sorted(r["duplicates"].items())]),
          _nodes(r.get("new")) + (since if r.get("new") else ""),
          _nodes(r.get("gone")) + (since if r.get("gone") else "")]


def rounds_markdown(rounds: list[dict[str, Any]]) -> str:
  """:func:`membership` as a Markdown table."""
  lines = ["| " + " | ".join(ROUND_COLUMNS) + " |", "|" + "---|" * len(ROUND_COLUMNS)]
  lines += ["| " + " | ".join(_round_cells(r)) + " |" for r in rounds]
  return "\n".join(lines) + "\n"


def _rounds_html(rounds: list[dict[str, Any]]) -> str:
  if not rounds:
    return ""
  head = "".join(f"<th>{c}</th>" for c in ROUND_COLUMNS)
  body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _round_cells(r)) + "</tr>"
                 for r in rounds)
  return f"<h2>Rounds</h2><table><tr>{head}</tr>{body}</table>"


def write_index(index_dir, rows: list[dict[str, Any]], settings: Settings, audit_dir=None, *,
                rounds: list[dict[str, Any]] | None = None) -> None:
  """``index.json`` (rows, settings and ``rounds``), ``index.md`` and ``index.html`` in
  ``index_dir``: one table row per capture and attack, with the reconstruction as a thumbnail and a
  link to the run's ``report.html`` (row ``run`` paths are relative to ``audit_dir``, default
  ``index_dir``), then one row per recorded round (:func:`membership`)."""
  index_dir = os.fspath(index_dir)
  audit_dir = index_dir if audit_dir is None else os.fspath(audit_dir)
  rounds = rounds or []
  report.save_json(os.path.join(index_dir, "index.json"),
                   {"rows": rows, "settings": settings.to_json(), "rounds": rounds})
  title = f"Audit of {os.path.basename(os.path.abspath(index_dir))}"
  failed = failed_rows(rows)
  note = (f"{len(failed)} of {len(rows)} rows failed (see their status)" if failed else "")
  round_table = f"\n## Rounds\n\n{rounds_markdown(rounds)}" if rounds else ""
  files.atomic_write(os.path.join(index_dir, "index.md"),
                      lambda f: f.write(f"# {title}\n\n" + (f"**{note}**\n\n" if note else "")
                                        + index_markdown(rows) + round_table), binary=False)
  failures = f"<p style='color:#b00020'><b>{html.escape(note)}</b></p>" if note else ""
  private = _any_dp_sgd(rows)
  cells = []
  for r in rows:
    status = html.escape(_status(r))
    verdict = r.get("verdict")
    verdict_cell = "–" if not verdict else (
        f"<b style='color:{report.VERDICT_COLOURS.get(verdict, '#333')}'>"
        f"{html.escape(verdict.replace('_', ' '))}</b><br><small>{html.escape(r.get('reason', ''))}"
        "</small>")
    image = link = ""
    if r.get("run"):
      run = os.path.relpath(os.path.join(audit_dir, r["run"]), index_dir)
      run = html.escape(run.replace(os.sep, "/"))
      image = f'<img src="{run}/reconstruction.png" alt="reconstruction">'
      link = f'<a href="{run}/report.html">report</a>'
    cells.append(
        f"<tr><td>{r['round']}</td><td>{html.escape(str(r['client']))}</td>"
        f"<td>{html.escape(r.get('attack') or '–')}</td><td style='text-align:left;max-width:28em'>"
        f"{verdict_cell}</td><td>{_fmt(r.get('loss'), '.4g')}</td>"
        f"<td>{_fmt(r.get('psnr'), '.2f')}</td><td>{_fmt(r.get('ssim'), '.3f')}</td>"
        f"<td>{_fmt(r.get('lpips'), '.3f')}</td><td>{image}</td><td>{link}</td>"
        + (f"<td>{html.escape(_epsilon(r))}</td>" if private else "") + f"<td>{status}</td></tr>")
  page = (
      "<!DOCTYPE html><html><head><meta charset='utf-8'>"
      f"<title>{html.escape(title)}</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
      "img{image-rendering:pixelated;height:64px}</style></head><body>"
      f"<h1>{html.escape(title)}</h1><p>What an honest-but-curious server reconstructs from each "
      "recorded client update. PSNR, SSIM and LPIPS only where the client's examples were given "
      "for scoring. The verdict: <i>leak</i> (a recognisable reconstruction, or without ground "
      "truth data that reproduce the update), <i>inconclusive</i> (the attack did not match the "
      "update, or the capture failed its checks) or <i>no leak found</i> (by that attack and "
      f"budget; never a proof of safety).</p>{failures}"
      "<table><tr><th>round</th><th>client</th><th>attack</th><th>verdict</th><th>objective</th>"
      "<th>PSNR (dB)</th><th>SSIM</th><th>LPIPS</th><th>reconstruction</th><th>run</th>"
      + ("<th>DP-SGD ε</th>" if private else "") + "<th>status</th></tr>" + "".join(cells) + "</table>" + _rounds_html(rounds)
      + "</body></html>\n")
  files.atomic_write(os.path.join(index_dir, "index.html"), lambda f: f.write(page), binary=False)
