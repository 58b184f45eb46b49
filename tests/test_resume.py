"""Resumable runs: a run interrupted after any chunk and resumed from its state file ends bit for bit
where the uninterrupted run does; state files are refused when they belong to another run or are
corrupt, truncated or pickled."""

import hashlib
import json
import os
import pickle
import re
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import driver, optimizers, progress, solvers
from gradjax.run import resume


def _value(params, data, step):
  return jnp.sum((params["x"] - data) ** 2 * jnp.arange(1, 7)) + 0.1 * jnp.sum(jnp.sin(3 * params["x"]))


class Kill(Exception):
  pass


def _killed_after(calls: int):
  seen = [0]

  def callback(progress):
    seen[0] += 1
    if seen[0] == calls:
      raise Kill
  return callback


def _run(solver, execution, **kw):
  init = {"x": jax.random.normal(jax.random.key(0), (5, 6))}
  return jax.device_get(driver.run(solver, init, jnp.linspace(-1.0, 1.0, 6), iterations=60,
                                    execution=execution, **kw))


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("optimizer, strategy, rounds", [
    ("lbfgs", "sequential", 1), ("lbfgs", "sequential", 3), ("lbfgs", "vmap", 3),
    ("adam", "map", 1), ("adam", "vmap", 3)])
@pytest.mark.slow
def test_interrupted_run_resumes_bit_for_bit(tmp_path, optimizer, strategy, rounds):
  tx = optimizers.make_optimizer(optimizer, 0.1 if optimizer == "adam" else 1.0)
  solver = solvers.make_solver(_value, tx)
  plain = driver.Execution(strategy=strategy, chunk=7, halving_rounds=rounds)
  reference = _run(solver, plain)
  path = tmp_path / "state.npz"
  # Interrupted after the 1st (compilation notice: nothing saved yet), 3rd, 6th and 8th report.
  for calls in (1, 3, 6, 8):
    if path.exists():
      path.unlink()
    saver = resume.Saver(path, fingerprint={"run": 1}, every_s=0)
    with pytest.raises(Kill):
      _run(solver, driver.Execution(strategy=strategy, chunk=7, halving_rounds=rounds,
                                     callback=_killed_after(calls), saver=saver))
    assert path.exists() == (calls > 1)
    again = resume.Saver(path, fingerprint={"run": 1}, every_s=0, resume=True)
    _assert_same(_run(solver, driver.Execution(strategy=strategy, chunk=7, halving_rounds=rounds,
                                                saver=again)), reference)


def test_saves_are_spaced_by_time(tmp_path):
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  saver = resume.Saver(tmp_path / "s.npz", fingerprint={}, every_s=3600)
  _run(solver, driver.Execution(strategy="vmap", chunk=7, saver=saver))
  assert saver.saves == 2  # after the first chunk, then the final state
  every = resume.Saver(tmp_path / "s2.npz", fingerprint={}, every_s=0)
  _run(solver, driver.Execution(strategy="vmap", chunk=7, saver=every))
  assert every.saves == 10  # after each of the ceil(60 / 7) chunks, and the final state


def test_a_signal_after_the_first_save_saves_at_the_next_chunk_and_stops(tmp_path, monkeypatch):
  """Ctrl-C mid-run with saves an hour apart: the chunk being run ends, the state is saved though no
  save is due (Interrupted names it), and the saved run continues to the uninterrupted result."""
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  reference = _run(solver, driver.Execution(strategy="vmap", chunk=7))
  monkeypatch.setattr(resume, "_stop_requested", [])
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  calls = [0]

  def ctrl_c_at_the_fourth_report(progress):
    calls[0] += 1
    if calls[0] == 4:
      os.kill(os.getpid(), signal.SIGINT)

  path = tmp_path / "state.npz"
  saver = resume.Saver(path, fingerprint={"run": 1}, every_s=3600)
  try:
    resume.stop_on_signals()
    with pytest.raises(resume.Interrupted) as stopped:
      _run(solver, driver.Execution(strategy="vmap", chunk=7, saver=saver,
                                     callback=ctrl_c_at_the_fourth_report))
  finally:
    for s, h in handlers.items():
      signal.signal(s, h)
  assert saver.saves == 2 and stopped.value.path == str(path) and stopped.value.signum == signal.SIGINT
  assert 0 < stopped.value.iteration < 60
  again = resume.Saver(path, fingerprint={"run": 1}, every_s=3600, resume=True)
  monkeypatch.setattr(resume, "_stop_requested", [])
  _assert_same(_run(solver, driver.Execution(strategy="vmap", chunk=7, saver=again)), reference)


def test_a_stop_after_the_last_save_names_the_saved_state(tmp_path, monkeypatch):
  """Work after the solver's final save (a text run's settling) checks for a stop: asked for, it
  raises Interrupted at the saved iteration, naming the state a resumed run restores."""
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  path = tmp_path / "state.npz"
  saver = resume.Saver(path, fingerprint={"run": 1}, every_s=3600)
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=saver))
  monkeypatch.setattr(resume, "_stop_requested", [])
  saver.stop_point()  # nothing asked: goes on
  monkeypatch.setattr(resume, "_stop_requested", [signal.SIGTERM])
  with pytest.raises(resume.Interrupted) as stopped:
    saver.stop_point()
  assert stopped.value.path == str(path) and stopped.value.signum == signal.SIGTERM
  assert stopped.value.iteration == 60


def test_state_files_of_other_runs_and_bad_files_are_refused(tmp_path):
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  path = tmp_path / "state.npz"
  saver = resume.Saver(path, fingerprint={"iterations": 60, "seed": 0}, every_s=0,
                       extra=lambda: {"history": [1.5, 2.5]})
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=saver))
  restored = []
  ok = resume.Saver(path, fingerprint={"iterations": 60, "seed": 0}, resume=True,
                    on_restore=restored.append)
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=ok))
  assert restored == [{"history": [1.5, 2.5]}]

  def refused(fingerprint, match, strategy="vmap"):
    s = resume.Saver(path, fingerprint=fingerprint, resume=True)
    with pytest.raises(ValueError, match=match):
      _run(solver, driver.Execution(strategy=strategy, chunk=30, saver=s))

  refused({"iterations": 60, "seed": 1}, "another run .seed = 0 there, 1 here")
  refused({"iterations": 60, "seed": 0, "tol": 0.0}, "tol is set in only one of them")
  # A key the state holds and this run no longer fingerprints (iterations, here) does not refuse it.
  later, before = [], path.read_bytes()
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
      path, fingerprint={"seed": 0}, resume=True, on_restore=later.append)))
  assert len(later) == 1  # restored
  path.write_bytes(before)
  # An option renamed since the state was saved (iterations -> budget, here) continues under its new
  # name and value; another value under the new name is refused.
  renamed = []
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
      path, fingerprint={"budget": 60, "seed": 0}, resume=True, on_restore=renamed.append,
      renamed={"iterations": "budget"})))
  assert len(renamed) == 1
  path.write_bytes(before)
  with pytest.raises(ValueError, match="another run .budget = 60 there, 61 here"):
    _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
        path, fingerprint={"budget": 61, "seed": 0}, resume=True, renamed={"iterations": "budget"})))
  # A saved fingerprint read through the run's canonical form (a value spelt out that is the
  # unset one's, here iterations 60 read as unset) continues a run that leaves it unset.
  canonical = []
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
      path, fingerprint={"iterations": None, "seed": 0}, resume=True, on_restore=canonical.append,
      canonical=lambda fp: {**fp, "iterations": None} if fp.get("iterations") == 60 else fp)))
  assert len(canonical) == 1
  path.write_bytes(before)
  refused({"iterations": None, "seed": 0}, "iterations")
  refused({"iterations": 60, "seed": 0}, "strategy 'vmap'", strategy="sequential")
  good = path.read_bytes()
  path.write_bytes(good[: len(good) // 2])
  refused({"iterations": 60, "seed": 0}, "not an .npz file")
  with open(path, "wb") as f:
    pickle.dump({"x": 1}, f)
  refused({"iterations": 60, "seed": 0}, "not an .npz file")
  np.savez(path, **{"state/00000": np.array([object()], dtype=object), "survivors": np.arange(5),
                    "__metadata__": np.frombuffer(b"{}", np.uint8)})
  refused({"iterations": 60, "seed": 0}, "refusing to unpickle")
  path.write_bytes(good)
  with pytest.raises(ValueError, match="state array 0 is float"):
    other = {"x": jnp.zeros((5, 7))}
    driver.run(solver, other, jnp.zeros(7), iterations=60, execution=driver.Execution(
        strategy="vmap", saver=resume.Saver(path, fingerprint={"iterations": 60, "seed": 0},
                                                 resume=True)))
  os.mkdir(tmp_path / "dir.npz")
  with pytest.raises(ValueError, match="is a directory"):
    resume.load(tmp_path / "dir.npz", None)
  for extra in ({"history": "not rows"}, {"wall_time_s": "slow"}, {"wall_time_s": -1e9}):
    _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
        path, fingerprint={"iterations": 60, "seed": 0}, every_s=0, extra=lambda: extra)))
    refused({"iterations": 60, "seed": 0}, "malformed extras")
  # A cursor or fingerprint of the wrong JSON type: refused by name, not read as bool("false") or
  # int(1.5), nor printed whole.
  _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.Saver(
      path, fingerprint={"iterations": 60, "seed": 0}, every_s=0)))
  with np.load(path, allow_pickle=False) as raw:
    entries = {k: raw[k] for k in raw.files}
  header = json.loads(entries["__metadata__"].tobytes())
  for change, match in ((("cursor", "stopped", "false"), "stopped 'false'"),
                        (("cursor", "steps", 1.5), "steps 1.5"), (("cursor", "round", -1), "round -1"),
                        (("cursor", None, [1]), "malformed cursor: not a JSON object"),
                        (("fingerprint", None, None), "malformed fingerprint")):
    section, key, value = change
    edited = json.loads(json.dumps(header))
    del edited["digest"]  # as a state saved before states kept one: each field is checked
    if key is None:
      edited[section] = value
    else:
      edited[section][key] = value
    np.savez(path, **{**entries, "__metadata__": np.frombuffer(json.dumps(edited).encode(), np.uint8)})
    refused({"iterations": 60, "seed": 0}, re.escape(match))
  # A table's experiment's state advises deleting it (the finished experiments are kept).
  np.savez(path, **{**entries, "__metadata__": np.frombuffer(json.dumps(header).encode(), np.uint8)})
  with pytest.raises(ValueError, match="another run .seed = 0 there, 1 here.; run with the saved "
                                       "settings, or delete it"):
    _run(solver, driver.Execution(strategy="vmap", chunk=30, saver=resume.StateFile(
        str(path), resume=True, afresh="delete it").saver({"iterations": 60, "seed": 1})))
  # Fields of the right type, edited (the cursor's steps, a history row, an array): the digest.
  for section, key, value in (("cursor", "steps", 59), ("extra", "history", [{"iteration": 1}])):
    edited = json.loads(json.dumps(header))
    edited[section][key] = value
    np.savez(path, **{**entries, "__metadata__": np.frombuffer(json.dumps(edited).encode(), np.uint8)})
    refused({"iterations": 60, "seed": 0}, "was changed after it was saved")
  np.savez(path, **{**entries, "state/00000": entries["state/00000"] + 1})
  refused({"iterations": 60, "seed": 0}, "was changed after it was saved")


def test_progress_says_compiling_and_rates_exclude_it():
  """The first report announces the compilation; the first chunk (which includes it) gets no rate,
  later ones a finite rate and an ETA consistent with it."""
  reports = []
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  _run(solver, driver.Execution(strategy="vmap", chunk=20, callback=reports.append))
  assert [p.iteration for p in reports] == [0, 20, 40, 60]
  assert reports[0].compiling and "compiling" in reports[0].line()
  assert np.isnan(reports[1].its_per_s) and "with compilation" in reports[1].line()
  for p in reports[2:]:
    assert np.isfinite(p.its_per_s) and p.eta_s == pytest.approx((60 - p.iteration) / p.its_per_s)
    assert f"{p.iteration}/60" in p.line() and ("it/s" in p.line() or "s/it" in p.line())


def test_progress_gives_a_slow_step_in_seconds():
  """By hand: 0.25 it/s is 4.0 s per iteration (not "0 it/s"); 2.34 it/s keeps a decimal."""
  p = progress.Progress(restart=None, iteration=10, iterations=20, best_loss=1.0, alive=1,
                       its_per_s=0.25, eta_s=40.0)
  assert p.line().endswith("alive 1  4.0 s/it  ETA 40.0s")
  assert p._replace(its_per_s=2.34).line().endswith("alive 1  2.3 it/s  ETA 40.0s")
  assert p._replace(its_per_s=1234.6).line().endswith("alive 1  1235 it/s  ETA 40.0s")


def test_a_failing_save_is_reported_not_fatal(tmp_path):
  solver = solvers.make_solver(_value, optimizers.make_optimizer("adam", 0.1))
  reference = _run(solver, driver.Execution(strategy="vmap", chunk=7))
  blocked = tmp_path / "a_file"
  blocked.write_text("")
  saver = resume.Saver(blocked / "state.npz", fingerprint={}, every_s=0)  # its folder is a file
  _assert_same(_run(solver, driver.Execution(strategy="vmap", chunk=7, saver=saver)), reference)
  assert saver.saves == 0 and "a_file" in saver.error


def test_items_read_back_runs_saved_before_a_config_field_existed(tmp_path):
  """A table's item saved before an option was added (its config lacks the key) is read back
  when the option has its default, and refused when it does not."""
  import json

  from gradjax.run import campaign, config
  cfg = config.from_options({
      "data.modality": "text", "model.name": "transformer", "data.dataset": "pydoc",
      "attack.iterations": 3
  })
  saved = config.fingerprint(cfg)
  del saved["attack.aux"]  # an option added after this item was saved
  item = {"config": saved, "wall_time_s": 1.0, "token_accuracy": 0.5, "bag_recall": 0.75,
          "verdict": {"status": "leak"}}
  (tmp_path / "item.json").write_text(json.dumps(item))
  results, images = campaign.Items._read(str(tmp_path / "item"), cfg)
  assert results["wall_time_s"] == 1.0 and images == {}
  with pytest.raises(ValueError, match="computed with other settings"):
    campaign.Items._read(str(tmp_path / "item"), config.replace(cfg, {"attack.aux": 8}))
  # A finished item edited or damaged: refused in one line naming the field, and the advice keeps
  # the other items (--overwrite would throw every finished one away).
  for change, message in (({"token_accuracy": None}, "token_accuracy is None, not a number"),
                          ({"bag_recall": "high"}, "bag_recall is 'high', not a number"),
                          ({"loss": [1]}, "loss is [1], not a number"),
                          ({"verdict": 5}, "its verdict is not a status")):
    (tmp_path / "item.json").write_text(json.dumps({**item, **change}))
    with pytest.raises(ValueError, match=re.escape(message)) as e:
      campaign.Items._read(str(tmp_path / "item"), cfg)
    assert "delete item.* from" in str(e.value) and "\n" not in str(e.value)
  (tmp_path / "item.json").write_text(json.dumps(item).replace("0.5", "NaN"))
  with pytest.raises(ValueError, match="a non-finite number NaN"):
    campaign.Items._read(str(tmp_path / "item"), cfg)
  # An image item whose arrays are not two finite batches of one shape.
  image_cfg = config.from_options({"attack.iterations": 3})
  image_item = {"config": config.fingerprint(image_cfg), "psnr": 10.0, "ssim": 0.1, "mse": 0.1,
                "wall_time_s": 1.0, "iterations": 3, "loss": 0.5, "verdict": {"status": "no_leak_found"}}
  (tmp_path / "image.json").write_text(json.dumps(image_item))
  for truth, found in ((np.zeros((1, 4, 4, 3)), np.zeros((1, 4, 4))), (np.zeros((1, 4, 4, 3)), np.full((1, 4, 4, 3), np.nan))):
    np.savez(tmp_path / "image.npz", ground_truth=truth.astype(np.float32), reconstruction=found.astype(np.float32))
    with pytest.raises(ValueError, match="holds no two finite image batches of one shape"):
      campaign.Items._read(str(tmp_path / "image"), image_cfg)
  # Fields the tables read, missing; the images of another item copied over this one's.
  np.savez(tmp_path / "image.npz", ground_truth=np.zeros((1, 4, 4, 3), np.float32),
           reconstruction=np.ones((1, 4, 4, 3), np.float32))
  for drop, message in (("iterations", "iterations is None, not a number"), ("loss", "it has no objective")):
    (tmp_path / "image.json").write_text(json.dumps({k: v for k, v in image_item.items() if k != drop}))
    with pytest.raises(ValueError, match=message):
      campaign.Items._read(str(tmp_path / "image"), image_cfg)
  digest = hashlib.sha256((tmp_path / "image.npz").read_bytes()).hexdigest()
  (tmp_path / "image.json").write_text(json.dumps({**image_item, "images_sha256": digest}))
  assert campaign.Items._read(str(tmp_path / "image"), image_cfg)[0]["psnr"] == 10.0
  np.savez(tmp_path / "image.npz", ground_truth=np.zeros((1, 4, 4, 3), np.float32),
           reconstruction=np.zeros((1, 4, 4, 3), np.float32))
  with pytest.raises(ValueError, match="image.npz holds other images than its results were computed with"):
    campaign.Items._read(str(tmp_path / "image"), image_cfg)


def test_items_read_back_under_another_restart_strategy(tmp_path):
  """An item finished on an accelerator (strategy auto) is read back by a run that resumes the
  table's unfinished item on a CPU with --config.execution.strategy=vmap (how restarts are scheduled is not what they
  compute); another attack setting is still refused."""
  import json

  from gradjax.run import campaign, config
  cfg = config.from_options({"attack.iterations": 3})
  (tmp_path / "item.json").write_text(json.dumps({"config": config.fingerprint(cfg), "psnr": 30.0, "ssim": 0.9,
                                                  "mse": 0.001, "wall_time_s": 1.0, "iterations": 3,
                                                  "loss": 0.1, "verdict": {"status": "leak"}}))
  np.savez(tmp_path / "item.npz", ground_truth=np.zeros((1, 2, 2, 3)), reconstruction=np.ones((1, 2, 2, 3)))
  for other in ({"execution.strategy": "vmap"},
                {"execution.strategy": "map", "execution.map_batch_size": 4}):
    results, _ = campaign.Items._read(str(tmp_path / "item"), config.replace(cfg, other))
    assert results["psnr"] == 30.0
  with pytest.raises(ValueError, match=r"computed with other settings \(--iterations = 3 there, 4 "
                                       r"here\); resume with that run's settings, or delete item\.\*"):
    campaign.Items._read(str(tmp_path / "item"), config.replace(cfg, {"attack.iterations": 4}))


def test_trace_scores_the_best_restarts_images_in_their_best_order():
  """The PSNR of a trace row (curves.svg): of the restart with the least objective, its images
  denormalised and clipped, each set against the true image SciPy's assignment gives it, by
  scikit-image's PSNR."""
  from types import SimpleNamespace

  import scipy.optimize
  import skimage.metrics

  from gradjax import data
  from gradjax.run import pipeline
  rng = np.random.default_rng(0)
  truth = rng.uniform(0, 1, (3, 4, 4, 3))
  norm = data.Normalization((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
  mean, std = np.asarray(norm.mean), np.asarray(norm.std)
  found = np.clip(truth[[2, 0, 1]] + rng.normal(0, 0.1, truth.shape), -0.2, 1.2)  # shuffled, some outside [0, 1]
  stacked = np.stack([(rng.uniform(0, 1, truth.shape) - mean) / std, (found - mean) / std])
  trace = pipeline.Trace(truth=truth, norm=norm)
  trace.progress(progress.Progress(None, 10, 10, 0.2, 2, 1.0, 1.0))
  trace.monitor(SimpleNamespace(best_params={"x": stacked}, best_loss=np.array([0.5, 0.2])))
  clipped = np.clip(found, 0, 1)
  psnr = np.array([[skimage.metrics.peak_signal_noise_ratio(t, r, data_range=1) for r in clipped] for t in truth])
  rows, cols = scipy.optimize.linear_sum_assignment(-psnr)
  assert list(cols) == [1, 2, 0]
  assert trace.rows[0]["psnr"] == pytest.approx(psnr[rows, cols].mean(), rel=1e-6)  # float32 statistics


def test_trace_rows_start_at_the_first_best_iterate(tmp_path):
  """Before an attack's ``track_from`` its best objective is inf: the trace makes no row for it (the
  rows go into JSON state files, which refuse inf) and scores none. PSNR of a 0.5 image against 0:
  10 log10(1 / 0.25) = 6.0206 dB."""
  from types import SimpleNamespace

  from gradjax import data
  from gradjax.run import pipeline, report
  trace = pipeline.Trace(truth=np.zeros((1, 2, 2, 1)), norm=data.Normalization((0.0,), (1.0,)))
  state = SimpleNamespace(best_params={"x": np.full((1, 2, 2, 1), 0.5)}, best_loss=np.array(np.inf))
  for iteration, best in ((100, np.inf), (200, np.inf)):
    trace.progress(progress.Progress(None, iteration, 300, best, 1, 1.0, 1.0))
    trace.monitor(state)
  assert trace.rows == []
  trace.progress(progress.Progress(None, 300, 300, 0.25, 1, 1.0, 1.0))
  trace.monitor(state)
  assert trace.rows[0]["iteration"] == 300 and trace.rows[0]["loss"] == 0.25
  assert trace.rows[0]["psnr"] == pytest.approx(10 * np.log10(4.0), rel=1e-12)
  trace.progress(progress.Progress(None, 400, 300, np.inf, 0, 1.0, 1.0))  # every restart diverged
  trace.monitor(state)
  assert len(trace.rows) == 1
  report.save_json(tmp_path / "history.json", {"history": trace.rows})


def test_a_save_killed_midway_leaves_no_temporary_file_behind(tmp_path):
  """The temporary file of a save killed before its rename (``<state>.<32 hex>.tmp``) goes when the
  next run of that state starts saving, and when a finished run removes its state; other files stay."""
  stale = tmp_path / f"state.npz.{'0a' * 16}.tmp"
  others = [tmp_path / "state.npz.notes.tmp", tmp_path / f"other.npz.{'0a' * 16}.tmp"]
  for path in (stale, *others):
    path.write_bytes(b"x")
  resume.Saver(tmp_path / "state.npz", fingerprint={})
  assert not stale.exists() and all(p.exists() for p in others)
  stale.write_bytes(b"x")
  resume.StateFile(str(tmp_path / "state.npz")).remove()
  assert not stale.exists() and all(p.exists() for p in others)


def test_an_interrupt_a_callback_swallowed_stops_the_run_when_it_begins():
  """A SIGINT received before the run saves on signals, which Python ignored (raised inside a
  garbage collector's callback), makes stop_on_signals raise KeyboardInterrupt once; the handlers
  are Python's again afterwards."""
  before = signal.getsignal(signal.SIGINT)
  try:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a program starts (not ignored)
    resume.interrupt_until_run()
    try:
      signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
      pass  # what a callback would have swallowed
    with pytest.raises(KeyboardInterrupt):
      resume.stop_on_signals()
    resume.stop_on_signals()  # once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a shell without job control
    resume.interrupt_until_run()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, before)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
