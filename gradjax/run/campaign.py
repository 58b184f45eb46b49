"""The store of a campaign: a table program's experiments (a sweep's images, a table's rows), each kept
in ``<out>/items/<key>.json`` (its results) and ``.npz`` (its images) as it ends, so an interrupted
campaign continues where it stopped and a campaign over several processes splits its experiments.

The processes are the command line's (:mod:`gradjax.cli.distributed`), passed in as ``peers``: an
object with ``process_count()``, ``process_index()``, ``is_writer()``, ``finished()`` and
``wait_for(ready)``.
"""

import hashlib
import json
import logging
import os
import re
from typing import Any, Callable

import numpy as np

from gradjax import files
from gradjax.run import config, pipeline, report, resume, text_run
from gradjax.run.config import Config

STATE_FILE = "state.npz"  # a run's solver state, which --resume continues from
_LOG = logging.getLogger(__name__)


class _OneProcess:
  """``peers`` of a campaign run by one process."""

  @staticmethod
  def process_count() -> int:
    return 1

  @staticmethod
  def process_index() -> int:
    return 0

  @staticmethod
  def is_writer() -> bool:
    return True

  @staticmethod
  def finished() -> None:
    pass

  @staticmethod
  def wait_for(ready: Callable[[], bool]) -> None:
    if not ready():
      raise RuntimeError("one process waits for nobody")


class Items:
  """A campaign's experiments, each kept in ``<out>/items/<key>.json`` (its results) and ``.npz`` (its
  images; text experiments have none) as it ends. With ``resume``, :meth:`run` reads a finished
  experiment back instead of running it again, and continues an interrupted one from
  ``items/<key>.state.npz`` (saved every ``save_every_s`` seconds). A signal that stops an experiment
  raises :class:`gradjax.run.resume.Interrupted`, first handed to ``interrupted`` when given (the
  command line's names the command that resumes and exits)."""

  def __init__(self, out: str, *, resume: bool = False, save_every_s: float = 60.0, peers: Any = _OneProcess,
               interrupted: Callable[[resume.Interrupted], Any] | None = None):
    self.out, self.resume, self.save_every_s = out, resume, save_every_s
    self.peers, self.interrupted = peers, interrupted
    self.earlier_s = 0.0  # wall time of the experiments read back (their runs' own)
    self._owner: dict[str, int] = {}  # over several processes: experiment -> the process running it
    self._ran: dict[str, tuple[dict, dict]] = {}  # this process's share, run ahead by plan()
    folder = os.path.join(out, "items")
    if os.path.lexists(folder) and not os.path.isdir(folder):
      raise ValueError(f"{folder} is not a folder; the table keeps its experiments in one of that name")

  def _path(self, key: str) -> str:
    return os.path.join(self.out, "items", re.sub(r"[^A-Za-z0-9._=+-]", "_", key))

  def plan(self, experiments: list[tuple[str, Config]]) -> bool:
    """Over several processes, experiment k of ``experiments`` (every experiment the program will
    :meth:`run`, in order) belongs to process k mod P: each process runs its share here, writing
    each experiment as it ends; returns whether this process goes on to assemble the table
    (process 0, whose :meth:`run` then waits for the others' experiments to be written and reads
    them back). One process: runs nothing ahead, returns True.

    Resuming, raises a one-line ``ValueError`` where the folder holds finished experiments that are
    not among ``experiments``: the table written would leave them out."""
    if self.resume:
      planned = {os.path.basename(self._path(key)) + ".json" for key, _ in experiments}
      folder = os.path.join(self.out, "items")
      left_out = sorted(n for n in (os.listdir(folder) if os.path.isdir(folder) else ())
                        if n.endswith(".json") and n not in planned)
      if left_out:
        raise ValueError(
            f"--resume: {folder} holds finished experiments this command does not run "
            f"({', '.join(left_out[:3])}{', ...' if len(left_out) > 3 else ''}), which its table "
            "would leave out: resume with the options that ran them, or start afresh with --overwrite")
    count, me = self.peers.process_count(), self.peers.process_index()
    if count == 1:
      self._run_together(experiments)
      return True
    self._owner = {key: k % count for k, (key, _) in enumerate(experiments)}
    for k, (key, cfg) in enumerate(experiments):
      if k % count == me:
        results, images, done = self.run(key, cfg)
        self._ran[key] = (results, images)
        _LOG.info("experiment %d/%d (%s) on process %d%s", k + 1, len(experiments), key, me,
                     " (saved earlier)" if done else "")
    if not self.peers.is_writer():
      self.peers.finished()
      _LOG.info("process %d: its %d experiments are written; process 0 writes the table", me,
                   sum(owner == me for owner in self._owner.values()))
      return False
    return True

  def _run_together(self, experiments: list[tuple[str, Config]]) -> None:
    """The image experiments whose configuration asks for several to a solver run
    (``execution.clients_per_run`` above 1; unset, a campaign runs one at a time, each saving its
    solver state), not finished and with no solver state to continue: run ahead here that many at
    a time in order (:func:`gradjax.run.pipeline.run_clients`), each written as its block ends.
    Their solver states are not saved mid-run: a block that a signal stops runs again whole."""
    todo = [(key, cfg) for key, cfg in experiments
            if cfg.data.modality == "image" and cfg.attack.preset != "auto"
            and (cfg.execution.clients_per_run or 1) > 1
            and not (self.resume and os.path.exists(self._path(key) + ".json"))
            and not os.path.exists(f"{self._path(key)}.{STATE_FILE}")]
    if len(todo) < 2:
      return
    size = todo[0][1].execution.clients_per_run
    for start in range(0, len(todo), size):
      block = todo[start:start + size]
      inputs = [pipeline.input_digests(c) for _, c in block]  # the files as the attacks read them
      for (key, cfg), outcome, read in zip(block, pipeline.run_clients([c for _, c in block]), inputs):
        if isinstance(outcome, Exception):  # raised where run() is asked for it
          self._ran[key] = outcome
          continue
        self._write(self._path(key), cfg, *outcome, read)
        self._ran[key] = outcome
        _LOG.info("experiment %s: in a solver run of %d", key, outcome[0].get("clients_together", 1))

  def _write(self, base: str, cfg: Config, results: dict, images: dict, inputs: dict) -> None:
    results = {**results, "input_sha256": inputs}  # what _read compares
    if cfg.data.modality != "text":
      files.atomic_write(base + ".npz", lambda fh: np.savez(
          fh, ground_truth=np.asarray(images["ground_truth"], np.float32),
          reconstruction=np.asarray(images["reconstruction"], np.float32)), binary=True)
      results["images_sha256"] = files.sha256(base + ".npz")  # the images of these results
    report.save_json(base + ".json", results)  # last: its presence marks the experiment finished

  def run(self, key: str, cfg: Config, **kw) -> tuple[dict, dict, bool]:
    """(results, images, whether they were saved by an earlier run) of experiment ``cfg``."""
    base = self._path(key)
    if key in self._ran:  # run ahead by plan()
      ran = self._ran[key]
      if isinstance(ran, Exception):
        raise ran
      return (*ran, False)
    owner = self._owner.get(key, self.peers.process_index())
    if owner != self.peers.process_index():  # another process's: read once it is written
      self.peers.wait_for(lambda: os.path.exists(base + ".json"))
      return (*self._read(base, cfg), False)
    if self.resume and os.path.exists(base + ".json"):
      results, images = self._read(base, cfg)
      self.earlier_s += float(results.get("wall_time_s", 0.0))
      return results, images, True
    path = f"{base}.{STATE_FILE}"
    state = resume.StateFile(path, self.save_every_s, self.resume, afresh=(
        f"delete {path} to attack that experiment afresh (the finished ones are kept)"))
    resume.stop_on_signals()
    inputs = pipeline.input_digests(cfg)  # the files as the attack reads them
    try:
      if cfg.data.modality == "text":  # the sentences are in the results
        results, images = text_run.run_text(cfg, state=state, **kw), {}
      else:
        results, images = pipeline.run(cfg, state=state, **kw)
    except resume.Interrupted as e:
      if self.interrupted is not None:
        self.interrupted(e)
      raise
    self._write(base, cfg, results, images, inputs)
    state.remove()
    return results, images, False

  @staticmethod
  def _read(base: str, cfg: Config) -> tuple[dict, dict]:
    redo = (f"delete {os.path.basename(base)}.* from {os.path.dirname(base)} to run that experiment "
            "again (the others are kept), or start afresh with --overwrite")
    mine = config.fingerprint(config.with_declared(cfg))  # as the run recorded it
    try:
      with open(base + ".json", encoding="utf-8") as fh:
        results = json.load(fh, parse_constant=_non_finite)
      _check_item(results, cfg.data.modality)
      # An option the saved configuration lacks was added since, with the default that keeps what
      # it did.
      recorded = config.recorded(results["config"])
      saved = config.canonical({p: recorded.get(p, config.option(p).default) for p in mine})
      images = {}
      if cfg.data.modality != "text":
        with open(base + ".npz", "rb") as fh:
          data = fh.read()
        digest = results.get("images_sha256")  # absent in experiments kept before 2026-12-07
        if digest is not None and digest != hashlib.sha256(data).hexdigest():
          raise ValueError(f"{base}.npz holds other images than its results were computed with")
        arrays = files.npz_arrays(data, base + ".npz")
        images = {"ground_truth": arrays["ground_truth"], "reconstruction": arrays["reconstruction"]}
        truth, found = images["ground_truth"], images["reconstruction"]
        if (truth.ndim != 4 or truth.shape != found.shape or truth.dtype.kind != "f"
            or found.dtype.kind != "f" or not (np.all(np.isfinite(truth)) and np.all(np.isfinite(found)))):
          raise ValueError(f"{base}.npz holds no two finite image batches of one shape")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
      raise ValueError(f"{base}.json is unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                       f"{redo}") from None
    if saved != mine:
      differs = next(f"{config.flag(p)} = {saved[p]!r} there, {mine[p]!r} here" for p in mine
                     if saved[p] != mine[p])
      raise ValueError(f"{base}.json was computed with other settings ({differs}); resume with "
                       f"that run's settings, or {redo}")
    # Experiments kept before 2026-12-07 carry no digests of their inputs.
    kept = results.pop("input_sha256", None)
    results.pop("images_sha256", None)  # the rows as an experiment run now gives them
    digests = pipeline.input_digests(cfg) if kept is not None else {}
    if kept is not None and kept != digests:
      kept = kept if isinstance(kept, dict) else {}
      changed = sorted(p for p in set(digests) | set(kept) if digests.get(p) != kept.get(p))
      raise ValueError(f"{base}.json was computed from other contents of {', '.join(changed)} "
                       f"(a file replaced since); {redo}")
    return results, images


def _non_finite(name):
  raise ValueError(f"a non-finite number {name}")


# What the table programs read of a finished experiment, by modality: numbers (None allowed for
# the scores an attack may not have).
_ITEM_NUMBERS = {"image": ("psnr", "ssim", "mse", "wall_time_s", "iterations"),
                 "text": ("token_accuracy", "bag_recall", "wall_time_s")}
_ITEM_OPTIONAL = ("label_accuracy", "loss", "gamma", "psnr_unclamped", "lpips")


def _check_item(results, modality: str) -> None:
  """ValueError naming the first field of a finished experiment's results that the tables could not
  read (a file edited, or written by something else)."""
  if not isinstance(results, dict) or not isinstance(results.get("config"), dict):
    raise ValueError("not an experiment's results (no configuration)")
  for key in _ITEM_NUMBERS[modality]:
    if not files.is_number(results.get(key)):
      raise ValueError(f"{key} is {results.get(key)!r}, not a number")
  for key in _ITEM_OPTIONAL:
    if results.get(key) is not None and not files.is_number(results[key]):
      raise ValueError(f"{key} is {results[key]!r}, not a number")
  if modality == "image" and "loss" not in results:
    raise ValueError("it has no objective (loss: a number, or null for a closed form)")
  verdict = results.get("verdict")
  if not isinstance(verdict, dict) or not isinstance(verdict.get("status"), str):
    raise ValueError("its verdict is not a status")
