"""Resumable runs: a solver's :class:`~gradjax.driver.Snapshot` in a plain ``.npz`` file.

A :class:`Saver` is a :class:`gradjax.driver.Saver`: passed as ``Execution(saver=...)``,
it writes the run's snapshot every ``every_s`` seconds (atomically: a temporary file renamed over the
old one, so a kill at any moment leaves the previous snapshot or the new one), and with
``resume=True`` hands the saved snapshot back to :func:`gradjax.driver.run`, which continues from
that chunk. The steps that follow are the same compiled programs on the same values, so on one
machine a resumed run ends bit for bit where an uninterrupted one would.

File layout: one array per leaf of the stacked solver state under ``"state/<i>"`` (i in
``jax.tree.flatten`` order), ``"survivors"``, and ``"__metadata__"``: a uint8 array of JSON text
with the cursor (round, position, steps, stopped, strategy), the run's ``fingerprint`` (e.g. its
configuration) and the caller's ``extra`` (e.g. its progress history). It is read with
``allow_pickle=False`` and refused, with a one-line error, when it is corrupt, when its fingerprint
differs from the run's, or when its arrays do not have the shapes and dtypes of the run's state. PRNG
keys are not stored: the run derives them from its configuration (the seed is in the fingerprint).

Stopping. The first save comes after the first chunk (whose time includes compiling the step), later
ones every ``every_s``. After :func:`stop_on_signals`, SIGINT or SIGTERM asks every saver to save at
the end of the chunk being run and raise :class:`Interrupted`; nothing computed before that chunk is
lost, and a second signal stops at once.

Example::

  state = resume.StateFile("run/state.npz", every_s=60, resume=True)
  saver = state.saver({"seed": 0, "iterations": 2000})   # the run's fingerprint
  rec = attacks.reconstruct(..., execution=driver.Execution(saver=saver))
  state.remove()   # once the results are written
"""

import dataclasses
import hashlib
import io
import json
import logging
import os
import signal
import time
import zipfile
from typing import Any, Callable

import jax
import numpy as np

from gradjax import checkpoint, driver, files, solvers
from gradjax.run import processes, report

# 2 since 46ec9b1: a run's draws (HFGInv's dropout masks) come from its own seed, so a state
# saved before would go on under other masks than the run it began.
FORMAT = 2
# What a refused state file's message advises.
AFRESH = "start afresh with --overwrite in place of --resume"


def _first_difference(saved: Any, current: Any, where: str = "") -> str | None:
  """A phrase naming the first key whose value differs between two JSON trees, or None."""
  if isinstance(saved, dict) and isinstance(current, dict):
    for key in sorted(set(saved) | set(current)):
      if key not in saved or key not in current:
        return f"{where}{key} is set in only one of them"
      found = _first_difference(saved[key], current[key], f"{where}{key}.")
      if found:
        return found
    return None
  if saved != current:
    return f"{where.rstrip('.')} = {saved!r} there, {current!r} here"
  return None


class Interrupted(Exception):
  """A run stopped by a signal once its state was saved (``path``; None if the save failed):
  ``iteration``, the furthest restart's; ``signum``, the signal."""

  def __init__(self, iteration: int, signum: int, path: str | None):
    super().__init__(f"interrupted at iteration {iteration}")
    self.iteration, self.signum, self.path = iteration, signum, path


_stop_requested: list[int] = []  # the signals received since stop_on_signals()
_before_run: list[int] = []  # SIGINT received before it (interrupt_until_run)


def _ignored(signum, frame) -> None:
  del signum, frame


def ignore_further_signals() -> None:
  """For a run that saved its state on a signal and is leaving: SIGINT and SIGTERM do nothing (a
  second one would only break off an exit handler with a traceback). :func:`interrupt_until_run`
  undoes it for a next command of the same process."""
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, _ignored)


def interrupt_until_run() -> None:
  """Until :func:`stop_on_signals`: SIGINT raises ``KeyboardInterrupt`` as Python's own handler
  does, and is remembered, so that one raised where Python ignores exceptions (a garbage
  collector's callback prints it and goes on) still stops the program when its run begins. A
  SIGINT the process ignores (a background job of a shell without job control) stays ignored."""
  _before_run.clear()
  if signal.getsignal(signal.SIGTERM) is _ignored:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    return

  def handler(signum, frame):
    del frame
    _before_run.append(signum)
    raise KeyboardInterrupt

  signal.signal(signal.SIGINT, handler)


def stop_on_signals(signums=(signal.SIGINT, signal.SIGTERM)) -> None:
  """Makes the first of ``signums`` ask the running :class:`Saver` to save and stop (raising
  :class:`Interrupted` after the chunk being run); the signal's default action comes back, so a
  second one stops at once. For programs whose runs save their state. Raises
  ``KeyboardInterrupt`` where :func:`interrupt_until_run` saw a SIGINT that did not stop the
  program."""
  if _before_run:
    _before_run.clear()
    raise KeyboardInterrupt

  def handler(signum, frame):
    del frame
    _stop_requested.append(signum)
    for s in signums:
      signal.signal(s, signal.SIG_DFL if s == signal.SIGTERM else signal.default_int_handler)

  for s in signums:
    signal.signal(s, handler)


def stop_requested() -> int | None:
  """The signal that asked the run to stop, or None."""
  return _stop_requested[0] if _stop_requested else None


class Saver:
  """Saves a run's :class:`~gradjax.driver.Snapshot` to ``path`` and restores it.

  Args:
    path: the ``.npz`` state file.
    fingerprint: JSON-ready dict of everything that determines the run's result (its
      configuration); a saved state with another fingerprint is refused.
    every_s: seconds between saves (0: after every chunk of ``Execution.chunk`` iterations).
    resume: whether :meth:`restore` reads ``path`` (if it exists) or the run starts afresh.
    extra: called at every save; its JSON-ready dict is stored beside the state.
    on_restore: called with that dict when a saved state is restored.
    renamed: keys of the fingerprint renamed since a state was saved, old -> new (a state saved under
      the old names continues).
    collective: whether every process of a run over several processes runs this saver together
      (one attack sharded over all of them, :mod:`gradjax.cli.distributed`): then they decide each save
      together (a save is due when it is due on any of them, and a signal to any stops them all),
      every process takes the snapshot (gathering the sharded state is a collective) and process 0
      alone writes the file. Every process reads it to resume.
    afresh: what the message of a refused state advises (:data:`AFRESH`).

  ``saves`` and ``seconds`` count the saves made and the time they took. A save that fails (a full
  disk, a folder removed) is logged and remembered in ``error``; the run goes on, since losing the
  ability to resume must not cost the run itself. The first save comes at the first call (after the
  first chunk), the next ones every ``every_s``; once a stop is requested (:func:`stop_on_signals`)
  the next call saves and raises :class:`Interrupted`.
  """

  def __init__(self, path, *, fingerprint: dict, every_s: float = 60.0, resume: bool = False,
               extra: Callable[[], dict] | None = None,
               on_restore: Callable[[dict], None] | None = None, collective: bool = False,
               renamed: dict[str, str] | None = None, afresh: str = AFRESH,
               canonical: Callable[[dict], dict] | None = None):
    if every_s < 0:
      raise ValueError(f"seconds between saves must be non-negative, got {every_s}")
    self.path, self.fingerprint, self.every_s, self.resume = os.fspath(path), fingerprint, every_s, resume
    self._extra, self._on_restore, self.collective = extra, on_restore, collective
    self.renamed, self.afresh, self.canonical = dict(renamed or {}), afresh, canonical
    self._fingerprint_json = json.loads(json.dumps(fingerprint, sort_keys=True))
    self._last = time.monotonic()
    self._called = False
    self.saves, self.seconds, self.error = 0, 0.0, None
    self.iteration = 0  # the furthest restart's iteration at the last snapshot
    if os.path.isdir(os.path.dirname(self.path) or ".") and (not collective or processes.is_writer()):
      remove_stale_saves(self.path)  # of an earlier run of this state killed while it saved

  def __call__(self, snapshot: Callable[[], driver.Snapshot], *, final: bool = False) -> None:
    signum = stop_requested()
    first, self._called = not self._called, True
    due = final or first or signum is not None or time.monotonic() - self._last >= self.every_s
    if self.collective:
      each = processes.allgather_ints([int(due), -1 if signum is None else signum])
      due, signum = bool(each[:, 0].any()), (int(each[:, 1].max()) if each[:, 1].max() >= 0 else None)
      due = due or signum is not None
      if signum is not None:
        processes.stopping()
    if not due:
      return
    start = time.perf_counter()
    snap, saved = None, False
    try:
      snap = snapshot()
      self.iteration = int(np.max(snap.state.iterations))
      if not self.collective or processes.is_writer():
        save(self.path, snap, self.fingerprint, {} if self._extra is None else self._extra())
      self.saves, saved = self.saves + 1, True
    except OSError as e:
      if self.error is None:
        logging.getLogger(__name__).warning("cannot save the run's state to %s (%s); the run goes "
                                            "on but cannot be resumed from here", self.path, e)
      self.error = f"{type(e).__name__}: {e}"
    self._last = time.monotonic()
    self.seconds += time.perf_counter() - start
    if signum is not None:
      iteration = -1 if snap is None else int(np.max(snap.state.iterations))
      raise Interrupted(iteration, signum, self.path if saved else None)

  def stop_point(self) -> None:
    """Raises :class:`Interrupted` where a stop was requested: for work after the solver's last
    save (e.g. :func:`gradjax.text.settle_tokens`), which a resumed run does again from that save.
    Not in a run over several processes, whose stops are agreed at the saves."""
    signum = stop_requested()
    if signum is not None and not self.collective:
      raise Interrupted(self.iteration, signum, self.path if os.path.exists(self.path) else None)

  def restore(self, like: Callable[[], solvers.SolverState]) -> driver.Snapshot | None:
    if not self.resume or not os.path.exists(self.path):
      return None
    snap, extra = load(self.path, like(), self._fingerprint_json, self.renamed, afresh=self.afresh,
                       canonical=self.canonical)
    if self._on_restore is not None:
      self._on_restore(extra)
    self._last = time.monotonic()
    return snap


@dataclasses.dataclass(frozen=True)
class StateFile:
  """Where a run keeps its state, how often it saves it, and whether it continues a saved one: what a
  program hands :func:`gradjax.run.pipeline.run`, which builds the :class:`Saver` with its fingerprint."""

  path: str
  every_s: float = 60.0
  resume: bool = False
  afresh: str = AFRESH  # the advice of a refusal (a table's: delete this experiment's state)

  def saver(self, fingerprint: dict, **kw) -> Saver:
    return Saver(self.path, fingerprint=fingerprint, every_s=self.every_s, resume=self.resume,
                 afresh=self.afresh, **kw)

  def remove(self) -> None:
    """Deletes the state file, once the run's results are written, and any temporary file a save
    killed midway left beside it (:func:`gradjax.files.atomic_write`'s ``<path>.<hex>.tmp``)."""
    if os.path.exists(self.path):
      os.remove(self.path)
    remove_stale_saves(self.path)


def remove_stale_saves(path: str) -> None:
  """Deletes the temporary files of saves of ``path`` that were killed before their rename."""
  folder, name = os.path.split(os.fspath(path))
  for entry in os.scandir(folder or "."):
    rest = entry.name[len(name) + 1:-len(".tmp")] if entry.name.startswith(name + ".") else ""
    if entry.name.endswith(".tmp") and len(rest) == 32 and all(c in "0123456789abcdef" for c in rest):
      os.remove(entry.path)


def save(path, snap: driver.Snapshot, fingerprint: dict, extra: dict | None = None) -> None:
  """Writes ``snap`` with ``fingerprint`` and ``extra`` (JSON-ready dicts) to ``path`` atomically."""
  leaves = jax.tree.leaves(snap.state)
  arrays = {f"state/{i:05d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
  for key, value in arrays.items():
    if value.dtype.kind not in "biuf":
      raise ValueError(f"solver state leaf {key} has dtype {value.dtype}, which a state file cannot hold")
  arrays["survivors"] = np.asarray(snap.survivors, np.int64)
  header = report._to_python(
      {"format": FORMAT, "fingerprint": fingerprint, "extra": extra or {},
       "cursor": {"round": int(snap.round), "position": int(snap.position),
                  "steps": int(snap.steps), "stopped": bool(snap.stopped), "strategy": snap.strategy}},
      "")
  header["digest"] = _digest(header, arrays)
  text = json.dumps(header, sort_keys=True, allow_nan=False)
  arrays[checkpoint.METADATA_KEY] = np.frombuffer(text.encode("utf-8"), np.uint8)
  files.atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)


def _digest(header: dict, arrays: dict[str, np.ndarray]) -> str:
  """SHA-256 of a state file's contents: its header (without the digest) as canonical JSON, then
  every array's name, dtype, shape and bytes in name order; a file edited by hand (its cursor, its
  history, an array) no longer matches it."""
  digest = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "digest"},
                                     sort_keys=True, allow_nan=False).encode("utf-8"))
  for name in sorted(arrays):
    a = np.ascontiguousarray(arrays[name])
    digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode("utf-8"))
    digest.update(a.tobytes())
  return digest.hexdigest()


def load(path, like: solvers.SolverState, fingerprint: dict | None = None,
         renamed: dict[str, str] | None = None, *,
         afresh: str = AFRESH, canonical: Callable[[dict], dict] | None = None
         ) -> tuple[driver.Snapshot, dict]:
  """Reads a state file against ``like`` (the run's stacked state, arrays or
  ``jax.ShapeDtypeStruct``) and, when given, the run's ``fingerprint`` (the saved one's keys read
  through ``renamed``, old -> new, then ``canonical``: e.g. an option spelt out at the value it
  takes when unset read as unset, as the run's own is); returns (snapshot, extra).

  Raises:
    ValueError: (one line) the file is corrupt, holds Python objects, is of another format, was saved
      with another fingerprint, or its arrays differ in number, shape or dtype from ``like``'s.
  """
  path = os.fspath(path)
  where = f"state file {path}"
  try:
    with open(path, "rb") as fh:
      data = fh.read()
  except IsADirectoryError:
    raise ValueError(f"{where} is a directory") from None
  if not zipfile.is_zipfile(io.BytesIO(data)):
    raise ValueError(f"{where} is not an .npz file (truncated or corrupt)")
  arrays = files.npz_arrays(data, where)
  if checkpoint.METADATA_KEY not in arrays or "survivors" not in arrays:
    raise ValueError(f"{where} is not a gradjax state file")
  header = checkpoint.parse_metadata(arrays.pop(checkpoint.METADATA_KEY), where)
  if header.get("format") != FORMAT:
    raise ValueError(f"{where} has state format {header.get('format')!r}; this gradjax reads {FORMAT} "
                     f"({AFRESH})")
  # States saved before 2026-12-07 carry no digest.
  if "digest" in header and header["digest"] != _digest(header, arrays):
    raise ValueError(f"{where} was changed after it was saved (its contents do not match their "
                     f"digest): {afresh}")
  if not isinstance(header.get("cursor"), dict):
    raise ValueError(f"{where} has a malformed cursor: not a JSON object")
  if fingerprint is not None:
    saved = header.get("fingerprint")
    if isinstance(fingerprint, dict) and not isinstance(saved, dict):
      raise ValueError(f"{where} has a malformed fingerprint (not a JSON object): {afresh}")
    if isinstance(saved, dict) and isinstance(fingerprint, dict):
      saved = {(renamed or {}).get(k, k): v for k, v in saved.items()}
      # A key this run does not fingerprint does not determine its result (this gradjax stopped
      # counting it, e.g. the restart strategy): states saved with it continue.
      saved = {k: v for k, v in saved.items() if k in fingerprint}
      if canonical is not None:
        saved = canonical(saved)
    difference = _first_difference(saved, fingerprint)
    if difference:
      raise ValueError(f"{where} belongs to another run ({difference}); run with the saved "
                       f"settings, or {afresh}")
  want, treedef = jax.tree.flatten(like)
  got = [arrays.get(f"state/{i:05d}") for i in range(len(want))]
  if len(arrays) - 1 != len(want) or any(g is None for g in got):
    raise ValueError(f"{where} holds {len(arrays) - 1} state arrays, this run's state has {len(want)}")
  for i, (g, w) in enumerate(zip(got, want)):
    if g.shape != tuple(w.shape) or g.dtype != w.dtype:
      raise ValueError(f"{where}: state array {i} is {g.dtype}{list(g.shape)}, this run's is "
                       f"{w.dtype}{list(w.shape)} (another model, batch or restart count?)")
  c = header["cursor"]
  counts = {k: c.get(k) for k in ("round", "position", "steps")}
  bad = [k for k, v in counts.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0]
  if bad or not isinstance(c.get("stopped"), bool) or not isinstance(c.get("strategy"), str):
    what = f"{bad[0]} {counts[bad[0]]!r}" if bad else f"stopped {c.get('stopped')!r}, strategy {c.get('strategy')!r}"
    raise ValueError(f"{where} has a malformed cursor: {what} (counts are non-negative integers, "
                     "stopped true or false)")
  snap = driver.Snapshot(jax.tree.unflatten(treedef, got), c["round"], arrays["survivors"],
                         c["position"], c["steps"], c["stopped"], c["strategy"])
  restarts = jax.tree.leaves(like)[0].shape[0]
  s = snap.survivors
  if (s.ndim != 1 or s.dtype.kind not in "iu" or len(set(s.tolist())) != len(s)
      or (len(s) and not (0 <= s.min() and s.max() < restarts))):
    raise ValueError(f"{where} has malformed survivors {s.tolist()}")
  if snap.strategy not in driver.STRATEGIES:
    raise ValueError(f"{where} has a malformed cursor: strategy {snap.strategy!r}")
  extra = header.get("extra", {})
  history = extra.get("history", []) if isinstance(extra, dict) else None
  if (not isinstance(history, list)
      or not (files.is_number(extra.get("wall_time_s", 0.0)) and extra.get("wall_time_s", 0.0) >= 0)):
    raise ValueError(f"{where} has malformed extras (its history and time)")
  return snap, extra
