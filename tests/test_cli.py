"""The experiment programs: outputs, the numbers they print, and one-line errors with exit code 2."""

import collections
import glob
import json
import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import jax
import pytest
import skimage.metrics
from PIL import Image

from gradjax import checkpoint, data, interop, lpips, models
from gradjax.run import config, pipeline
from conftest import assert_one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_program(name, *args, cwd=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "gradjax", name.removesuffix(".py").replace("_", "-"), *args],
                        capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


# Runs commands given as JSON ([argv, folder] pairs) one after the other in this one process, absl's
# flags reset between them, and prints [exit code, stdout, stderr] of each as JSON: an exception that
# would have ended the program puts its traceback in stderr, as the interpreter would.
_IN_ONE_PROCESS = """
import atexit, contextlib, io, json, os, sys, traceback
# Registered first, so it runs after the commands' own exit handlers (an empty output folder
# removed): the process then ends without the interpreter's teardown of JAX's objects (about 1 s).
atexit.register(os._exit, 0)
from absl import flags
from gradjax import cli
# gradjax's own exit handlers (a claim of the output folder released, a folder set aside by
# --overwrite restored) run after each command, as its own process would run them at its exit.
register, handlers = atexit.register, []
atexit.register = lambda fn, *a, **k: (handlers.append((fn, a, k)) if getattr(
    fn, "__module__", "").startswith("gradjax") else register(fn, *a, **k)) or fn
out = []
for argv, folder in json.loads(sys.argv[1]):
  flags.FLAGS.unparse_flags()
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:  # a case's --config.<path> flags
    delattr(flags.FLAGS, name)
  os.chdir(folder)
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      cli.main(argv)
      code = 0
    except SystemExit as e:
      code = 0 if e.code is None else e.code  # sys.exit() and sys.exit(None) exit 0
    except BaseException:
      traceback.print_exc()
      code = 1
    while handlers:
      fn, a, k = handlers.pop()
      fn(*a, **k)
  out.append([code, stdout.getvalue(), stderr.getvalue()])
print(json.dumps(out), flush=True)
"""


def run_in_one_process(cases):
  """``subprocess.CompletedProcess``-like results of the commands ``cases`` ([argv, folder] pairs,
  argv starting ``gradjax <command>``), run by one Python process (the startup paid once)."""
  proc = subprocess.run([sys.executable, "-c", _IN_ONE_PROCESS, json.dumps([[a, str(f)] for a, f in cases])],
                        capture_output=True, text=True, cwd=ROOT, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [subprocess.CompletedProcess(argv, code, stdout, stderr)
          for (argv, _), (code, stdout, stderr) in zip(cases, json.loads(proc.stdout.splitlines()[-1]))]


@pytest.mark.slow
def test_pipeline_metrics_match_scikit_image():
  cfg = config.from_options({
      "data.image_size": 16, "data.index": 4, "data.batch_size": 2, "attack.iterations": 40,
      "attack.preset": "dlg"
  })
  results, images = pipeline.run(cfg)
  gt, rec = images["ground_truth"].astype(np.float64), images["reconstruction"]
  psnr = [skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1) for g, r in zip(gt, rec)]
  ssim = [skimage.metrics.structural_similarity(g, r, data_range=1, channel_axis=-1)
          for g, r in zip(gt, rec)]
  np.testing.assert_allclose(results["psnr_per_image"], psnr, rtol=1e-9)
  np.testing.assert_allclose(results["psnr"], np.mean(psnr), rtol=1e-9)
  np.testing.assert_allclose(results["ssim"], np.mean(ssim), rtol=1e-9)
  np.testing.assert_allclose(results["mse"], np.mean((gt - rec) ** 2), rtol=1e-9)
  # The raw reconstruction (DLG is unboxed: pixels outside [0, 1]), in the ground truth's order, is
  # scored by 10 log10(1 / mse) unclamped (no normalisation here), no closer than its clamped image.
  assert cfg.data.normalization in (None, "none")
  raw = np.asarray(images["model_input"], np.float64)[np.asarray(results["order"])]
  assert raw.min() < 0 or raw.max() > 1
  np.testing.assert_allclose(results["psnr_unclamped_per_image"],
                             [10 * np.log10(1 / np.mean((r - g) ** 2)) for r, g in zip(raw, gt)],
                             rtol=1e-6)
  assert np.all(np.asarray(results["psnr_unclamped_per_image"]) <= np.asarray(psnr) + 1e-9)
  assert results["psnr_unclamped"] == pytest.approx(np.mean(results["psnr_unclamped_per_image"]))
  # The reported labels are those of the reconstruction, in ground-truth order.
  overlap = collections.Counter(results["labels_reconstructed"]) & collections.Counter(results["labels_true"])
  assert results["label_accuracy"] == pytest.approx(sum(overlap.values()) / 2)
  assert results["iterations"] == 40 and results["restarts"] == 1
  # The curves end at the result (the last iterate is scored after the last row was recorded).
  assert (results["history"][-1]["iteration"], results["history"][-1]["loss"],
          results["history"][-1]["psnr"]) == (40, results["loss"], pytest.approx(np.mean(psnr), rel=1e-9))


@pytest.mark.slow
def test_pipeline_scores_of_normalised_boxed_images_match_scikit_image_and_numpy():
  """Under CIFAR-10's normalisation, Inverting Gradients (boxed: its pixels stay in [0, 1]) at 32
  pixels: PSNR and SSIM against scikit-image, the unclamped PSNR against Inverting Gradients'
  per-channel measure written out in NumPy, LPIPS against the NumPy LPIPS of tests/test_lpips.py."""
  cfg = config.from_options({
      "data.image_size": 32, "data.index": 2, "data.batch_size": 2, "attack.iterations": 10,
      "attack.preset": "inverting_gradients", "model.name": "lenet_zhu",
      "data.normalization": "cifar10",
      "output.lpips": "alex" if lpips.available("alex") else "none"})
  results, images = pipeline.run(cfg)
  gt, rec = images["ground_truth"].astype(np.float64), images["reconstruction"].astype(np.float64)
  np.testing.assert_allclose(results["psnr_per_image"], [
      skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1) for g, r in zip(gt, rec)], rtol=1e-9)
  np.testing.assert_allclose(results["ssim_per_image"], [
      skimage.metrics.structural_similarity(g, r, data_range=1, channel_axis=-1)
      for g, r in zip(gt, rec)], rtol=1e-9)
  std = np.array([0.247, 0.2435, 0.2616])  # CIFAR-10's, as Inverting Gradients' code normalises
  for k in range(2):  # its metrics.psnr(output, truth, factor=1/ds) on normalised tensors, per channel
    error = np.mean(((rec[k] - gt[k]) / std) ** 2)
    want = np.mean([10 * np.log10((1 / std[c]) ** 2 / error) for c in range(3)])
    assert results["psnr_unclamped_per_image"][k] == pytest.approx(want, abs=1e-4)
  if lpips.available("alex"):
    from test_lpips import np_lpips
    np.testing.assert_allclose(results["lpips_per_image"], np_lpips(lpips.load("alex"), rec, gt),
                               rtol=2e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("permutations", [1, 2])
def test_restarts_diverged_counts_the_restarts_started_where_the_objective_is_nan(monkeypatch,
                                                                                  permutations):
  """``restarts_diverged`` is the number of restarts whose start this test made NaN (a dummy init
  that draws, per restart, whether its images are NaN, and says which it drew): each of them
  diverges at once, the others never do. With a permutation search each restart's start is shared
  by its label-order candidates, and it is still one restart (it was counted once per candidate)."""
  import jax.numpy as jnp
  from gradjax import dummy
  drawn = []

  def nan_or_normal(key, shape, lo, hi, dtype):
    bad = jax.random.bernoulli(jax.random.fold_in(key, 7))
    jax.debug.callback(lambda k, b: drawn.append((tuple(np.asarray(k).ravel().tolist()), bool(b))),
                       jax.random.key_data(key), bad)
    return jnp.where(bad, jnp.nan, jax.random.normal(key, shape, dtype))

  monkeypatch.setitem(dummy.INITS, "nan_or_normal", nan_or_normal)
  options = {"data.image_size": 8, "data.batch_size": 2, "attack.iterations": 3, "attack.restarts": 6,
             "attack.dummy_init": "nan_or_normal", "output.lpips": "none"}
  if permutations > 1:  # a FedAvg client of two local steps, its labels shared as a multiset
    options.update({"client.name": "fedavg", "client.local_batch_size": 1, "attack.label_source": "known",
                    "client.shared_labels": "multiset", "attack.matched": "replay",
                    "attack.permutations": permutations})
  results, _ = pipeline.run(config.from_options(options))
  starts = dict(drawn)  # restart's key -> whether its start is NaN (once per candidate run)
  assert len(drawn) == 6 * results["candidates"] and len(starts) == 6 and results["candidates"] == permutations
  nan = sum(starts.values())
  assert 0 < nan < 6  # some restarts diverge, some do not
  assert results["restarts"] == 6 and results["restarts_diverged"] == nan


@pytest.mark.slow
def test_a_closed_form_attack_runs_like_the_others():
  """--attack=exclusive_neurons on a batch of 16 photos through mlp-256: scored like any attack
  (PSNR against scikit-image's), each image and label exact, the verdict a leak, no optimisation."""
  cfg = config.from_options({
      "attack.preset": "exclusive_neurons", "model.name": "mlp-256", "data.batch_size": 16,
      "output.lpips": "none"
  })
  results, images = pipeline.run(cfg)
  gt, rec = images["ground_truth"].astype(np.float64), images["reconstruction"]
  psnr = [skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1) for g, r in zip(gt, rec)]
  np.testing.assert_allclose(results["psnr_per_image"], np.minimum(psnr, 100.0), rtol=1e-9)
  assert min(psnr) >= 80 and results["label_accuracy"] == 1.0
  assert results["separation"]["recovered"] == 16 and results["separation"]["rank"] == 16
  assert results["verdict"]["status"] == "leak" and results["residual"]["relative_error"] < 1e-5
  assert results["attack"] == {"closed_form": {"layer": "Dense_0", "tol": 1e-3, "rank_tol": 1e-5,
                                               "name": "exclusive_neurons"}}


@pytest.mark.slow
def test_a_closed_forms_console_line_counts_its_rounds_not_iterations(tmp_path):
  """The summary line of a closed form says what it counts (R-GAP's layers, the separation's rounds),
  as its verdict does: it optimises nothing, so no 'iterations'."""
  proc = run_program("reconstruct.py", "--attack=exclusive_neurons", "--model=mlp-256", "--batch_size=4",
                     "--lpips=none", f"--output_dir={tmp_path / 'run'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rounds = json.loads((tmp_path / "run" / "metrics.json").read_text())["iterations"]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("exclusive_neurons on mlp-256"))
  assert "iterations" not in line and f"{rounds} round" in line, line


@pytest.mark.slow
def test_a_closed_form_that_separates_few_examples_scores_the_rest_as_not_recovered(tmp_path):
  """mlp-32 on 16 photos: few first-layer units fire for one photo alone, so the separation reads
  few examples; the others' slots (label -1) count as labels not recovered (NumPy's multiset
  count), the console line and a sweep's table are written."""
  flags = ("--attack=exclusive_neurons", "--model=mlp-32", "--config.model.act=relu", "--batch_size=16",
           "--lpips=none")
  proc = run_program("reconstruct.py", *flags, f"--output_dir={tmp_path / 'run'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
  got, true = np.array(metrics["labels_by_slot"]), np.array(metrics["labels_true"])
  assert 0 < np.sum(got >= 0) < 16 and metrics["separation"]["recovered"] == np.sum(got >= 0)
  hits = sum(min(np.sum(got == c), np.sum(true == c)) for c in set(true.tolist()))
  assert metrics["label_accuracy"] == pytest.approx(hits / 16)
  assert metrics["findings"]["labels"]["unread"] == np.sum(got < 0)
  line = next(l for l in proc.stdout.splitlines() if l.startswith("exclusive_neurons on mlp-32"))
  assert f"{np.sum(got >= 0)} of 16" in line and f"label accuracy {hits / 16:.2f}" in line, line
  # the mean PSNR of the separated examples beside that of all 16 (the others are placeholders)
  psnr = np.asarray(metrics["psnr_per_image"])
  labels_gt_order = np.asarray(metrics["labels_reconstructed"])
  assert f"(PSNR {psnr[labels_gt_order >= 0].mean():.2f} dB over the {np.sum(got >= 0)} separated)" in line, line
  proc = run_program("sweep.py", *flags, "--count=1", f"--output_dir={tmp_path / 'sweep'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.loads((tmp_path / "sweep" / "results.json").read_text())["summary"]
  assert summary["label_accuracy"]["mean"] == pytest.approx(hits / 16)


@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # the step compiled as a user's run compiles it
def test_reconstruct_writes_metrics_and_grid(tmp_path):
  out = tmp_path / "run"
  proc = run_program("reconstruct.py", "--iterations=30", "--image_size=16", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  metrics = json.loads((out / "metrics.json").read_text())
  for key in ("psnr", "ssim", "mse", "label_accuracy", "wall_time_s", "iterations", "restarts",
              "config", "device"):
    assert key in metrics
  assert metrics["config"]["model"]["name"] == "lenet_zhu" and metrics["iterations"] == 30
  # The command as typed and the cores, which the studies quote.
  assert metrics["command"] == f"gradjax reconstruct --iterations=30 --image_size=16 --output_dir={out}"
  assert metrics["cores"] >= 1 and metrics["device"].startswith("CPU (")
  assert f"PSNR {metrics['psnr']:.2f} dB" in proc.stdout
  wrote = next(l for l in proc.stdout.splitlines() if l.startswith("wrote "))
  assert sorted(wrote.split(": ", 1)[1].split(", ")) == sorted(p.name for p in out.iterdir() if p.is_file())
  # The scores it printed and wrote, from the reconstruction it saved and the photo it attacked.
  from gradjax import data
  gt = data.load("skimage", indices=[0], image_size=(16, 16)).x[0].astype(np.float64)
  rec = np.load(out / "reconstruction.npy")[0].astype(np.float64)
  np.testing.assert_allclose(
      [metrics["psnr"], metrics["ssim"], metrics["mse"]],
      [skimage.metrics.peak_signal_noise_ratio(gt, rec, data_range=1),
       skimage.metrics.structural_similarity(gt, rec, data_range=1, channel_axis=-1),
       np.mean((gt - rec) ** 2)], rtol=1e-6)
  assert metrics["label_accuracy"] == float(metrics["labels_reconstructed"] == metrics["labels_true"])
  grid = np.asarray(Image.open(out / "reconstruction.png"))
  assert grid.shape == (2 * (16 * 4 + 2) + 2, 16 * 4 + 2 + 2, 3)


@pytest.mark.slow
def test_reconstruct_prints_and_reports_the_dp_sgd_clients_budget(tmp_path):
  """A DP-SGD client's run: the console and report.html give its (ε, δ) over its training, the ε of
  gradjax.privacy (tested against the defining integral and closed forms there) to 3 digits."""
  from gradjax import privacy
  out = tmp_path / "run"
  proc = run_program("reconstruct.py", "--iterations=2", "--image_size=16", f"--output_dir={out}",
                     "--config.defense.dp_sgd_max_norm=1", "--config.defense.dp_sgd_noise_multiplier=1.1",
                     "--config.defense.dp_sgd_sampling_rate=0.01", "--config.defense.dp_sgd_steps=1000")
  assert proc.returncode == 0, proc.stderr[-2000:]
  eps = privacy.epsilon(0.01, 1.1, 1000, 1e-5)
  line = next(l for l in proc.stdout.splitlines() if l.startswith("DP-SGD: "))
  assert f"({eps.epsilon:.3g}, 1e-05)-DP over 1000 steps at sampling rate 0.01" in line, line
  assert f"order {eps.order:g}" in line and "clipping bound 1, noise multiplier 1.1" in line
  assert proc.stdout.splitlines()[-1].startswith("verdict: ")
  assert f"DP-SGD ε</th><td>{eps.epsilon:.3g} (δ 1e-05)" in (out / "report.html").read_text()
  # A sweep whose experiments' clients all ran it says so under its table.
  proc = run_program("sweep.py", "--count=1", "--iterations=2", "--image_size=16",
                     f"--output_dir={tmp_path / 'sweep'}", "--config.defense.dp_sgd_max_norm=1",
                     "--config.defense.dp_sgd_noise_multiplier=1.1",
                     "--config.defense.dp_sgd_sampling_rate=0.01", "--config.defense.dp_sgd_steps=1000")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"({eps.epsilon:.3g}, 1e-05)-DP over 1000 steps" in (tmp_path / "sweep" / "results.md").read_text()


BAD_FLAGS = [
    (["--model=alexnet"], "unknown model"),
    (["--attack=idlg", "--batch_size=2"], "batch 1"),
    (["--dataset=mnist", "--data_dir=/nonexistent"], "mnist"),
    (["--dataset=imagenet21k"], "unknown dataset"),
    (["--modality=text", "--attack=auto"], "a text run names its attack"),
    (["--modality=text", "--labels=hfginv"], "a text run's targets are the next tokens"),
    (["--modality=text", "--config.client.train_mode=True"], "--config.client.train_mode is for images"),
    (["--seed=-2147483649"], "--seed must lie in a 32-bit integer's range"),
    (["--restarts=99999999999999999999"], "--restarts must lie in a 32-bit integer's range"),
    (["--no_such_flag=1"], "no_such_flag"),
    (["--iterations=abc"], "iterations"),
    (["--index=99"], "ndex"),
    (["--config.client.shared_labels=some"], "label sharing"),
    (["--config.attack.matched=weights"], "unknown matched part"),
    (["--config.attack.permutations=2"], "permutation search"),
    (["--config.execution.halving_rounds=0"], "halving_rounds must be a positive integer"),
    (["--config.execution.matmul_precision=fp8"], "matmul_precision"),
    (["--config.attack.learning_rate=nan"], "--config.attack.learning_rate must be a finite number"),
    (["--normalization=0.5,0.5/0.2"], "2 means but 1 stds"),
    (["--config=dlg", "--config.attack.iterationz=1"], "iterationz"),
    (["--config=/nonexistent/dlg.py"], "/nonexistent/dlg.py"),
    (["--attack=exclusive_neurons", "--model=mlp", "--iterations=10"], "is a closed form"),
    (["--attack=exclusive_neurons"], "first layer is a biased dense layer"),
    (["--attack=exclusive_neurons", "--model=mlp-64", "--restarts=2"], "in one pass: it needs --restarts=1"),
    (["--priors=tv:abc"], "name:weight"),
    (["--client=fedprox"], "unknown client"),
    (["--image_size=2"], "image_size must be at least 3"),
    (["--config.client.local_epochs=2"], "--config.client.local_epochs does not apply to --client=fedsgd"),
    (["--config.client.shared_labels=multiset"], "--config.client.shared_labels does not apply to --client=fedsgd"),
    (["--config.data.tokenizer=bpe:100"], "--config.data.tokenizer is for text"),
    (["--modality=text", "--model=transformer", "--attack=sapag", "--image_size=32"],
     "--image_size is for images"),
    (["--config.bogus.key=1"], "--config.bogus.key: no section or option 'bogus'"),
    (["--config.attack.bogus=1"], "--config.attack.bogus: no section or option 'bogus'"),
    (["--config.attack.iterationz=1"],
     "--config.attack.iterationz: no section or option 'iterationz' (did you mean 'iterations'? "),
    (["--config.model.rename=fc=linear"], "renames the tensors of captured files"),
    (["--config.defense.dp_sgd_max_norm=0"], "--config.defense.dp_sgd_max_norm must be a positive number"),
    (["--config.defense.dp_sgd_noise_multiplier=1"], "give --config.defense.dp_sgd_max_norm too"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.defense.dp_sgd_sampling_rate=0"],
     "dp_sgd_sampling_rate must lie in (0, 1]"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.client.train_mode=True", "--model=resnet20-4"],
     "a client in training mode"),
    (["--config.defense.dp_sgd_max_norm=1", "--modality=text", "--model=transformer", "--dataset=pydoc",
      "--config.attack.adaptive=True"], "a text attack matches the update as it is"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.attack.adaptive=True",
      "--config.attack.matched=dlm"], "models DP-SGD's per-example clipping"),
    (["--config.defense.dp_sgd_poisson=True"], "dp_sgd_poisson draws DP-SGD's batches: give"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.defense.dp_sgd_poisson=True",
      "--modality=text", "--model=transformer", "--dataset=pydoc"],
     "models an image client's Poisson-sampled steps"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.defense.dp_sgd_expected_batch_size=2"],
     "dp_sgd_expected_batch_size is a Poisson-sampled step's divisor"),
    (["--config.defense.dp_sgd_max_norm=1", "--config.defense.dp_sgd_poisson=True",
      "--config.defense.dp_sgd_expected_batch_size=2"], "is a captured client's divisor"),
    (["--flagfile=/nonexistent/flags.txt"], "--flagfile /nonexistent/flags.txt is not a readable file"),
    (["--flagfile", "/"], "--flagfile / is not a readable file"),
    (["--compilation_cache=/proc/gradjax_cache"], "cannot write to the --compilation_cache folder"),
    (["--compilation_cache_min_secs=-1"], "--compilation_cache_min_secs must be a number of seconds >= 0"),
]


@pytest.mark.slow
def test_bad_input_is_one_line_with_exit_2(tmp_path):
  """Bad names and numbers: one line and exit code 2 each (the cases share one process)."""
  cases = [(["gradjax", "reconstruct", *args, f"--output_dir={tmp_path / str(k)}"], ROOT)
           for k, (args, _) in enumerate(BAD_FLAGS)]
  for (args, message), proc in zip(BAD_FLAGS, run_in_one_process(cases)):
    _assert_one_line_error(proc, message, args)


_assert_one_line_error = assert_one_line_error


def _bad_files(tmp_path):
  """Files a user might hand the programs by mistake, keyed by what they are."""
  model = models.create("mlp", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  good = tmp_path / "good.npz"
  checkpoint.save(good, model.variables, {"model": "mlp", "init": None, "act": None,
                                          "num_classes": 10, "input_shape": [32, 32, 3]})
  (tmp_path / "truncated.npz").write_bytes(good.read_bytes()[:200])
  for name, meta in [("dp_declared", {"dp_sgd_max_norm": 1, "dp_sgd_noise_multiplier": 0.5}),
                     ("dp_no_bound", {"dp_sgd_noise_multiplier": 0.5}),
                     ("dp_bad_rate", {"dp_sgd_max_norm": 1, "dp_sgd_sampling_rate": 2})]:
    interop.write(tmp_path / f"{name}.safetensors", {"w": np.zeros(2, np.float32)}, meta)
  with open(tmp_path / "pickled.npz", "wb") as f:
    pickle.dump({"params": np.zeros(3)}, f)
  np.savez(tmp_path / "objects.npz", __metadata__=np.array([{"a": 1}], dtype=object))
  (tmp_path / "a_file").write_text("not a folder")
  (tmp_path / "a_sweep").mkdir()  # another program's run
  (tmp_path / "a_sweep" / "config.py").write_text("# The configuration of the run in this folder.\n"
                                                  "# Command: gradjax sweep --count=2\n")
  (tmp_path / "notes").mkdir()  # a user's folder
  (tmp_path / "notes" / "todo.txt").write_text("mine")
  locked = tmp_path / "locked"
  locked.mkdir()
  os.chmod(locked, 0o500)
  return tmp_path


BAD_FILES = [
    (["--output_dir=/proc/nope"], "cannot write to the output folder /proc/nope"),
    (["--output_dir={d}/a_file"], "is a file, not a folder"),
    (["--checkpoint={d}"], "is a directory, not a file"),
    (["--checkpoint={d}/missing.npz"], "does not exist"),
    (["--checkpoint={d}/truncated.npz"], "not an .npz file"),
    (["--checkpoint={d}/pickled.npz"], "not an .npz file"),
    (["--checkpoint={d}/objects.npz"], "refusing to unpickle"),
    (["--weights={d}/missing.safetensors", "--observation={d}/good.npz"], "does not exist"),
    (["--weights={d}/good.npz"], "need both --weights and --observation"),
    (["--batch_size=1000"], "the client's batch is images 0..999; index 16 out of range"),
    (["--restarts=0"], "restarts must be positive"),
    (["--defense=foo:1"], "unknown defense"),
    (["--defense=gaussian:abc"], "gaussian"),
    (["--priors=tv"], "bad prior"),
    (["--config.attack.distance=manhattan"], "unknown distance"),
    (["--lpips=vgg16"], "lpips"),
    (["--lpips=alex", "--dataset=lfw_subset"],
     "--lpips=alex needs images of at least 31 pixels a side, these are 25x25 (--lpips=vgg or none;"),
    (["--save_every_s=-1"], "save_every_s must be non-negative"),
    (["--resume", "--overwrite"], "give one of them"),
    (["--resume"], "no interrupted run"),
    (["--iterations=0"], "iterations must be a positive integer"),
    (["--image_size=-3"], "image_size must be at least 3"),
    (["--checkpoint={d}/good.npz", "--model=resnet18"], "holds a model with --model=mlp, not resnet18"),
    (["--checkpoint={d}/good.npz", "--config.model.act=tanh"], "holds a model with --config.model.act=its default"),
    (["--checkpoint={d}/good.npz", "--config.model.num_classes=5"], "--config.model.num_classes=10, not 5"),
    (["--weights={d}/good.npz", "--observation={d}/good.npz", "--batch_size=4"], "--batch_size is a simulated client's"),
    (["--weights={d}/good.npz", "--observation={d}/good.npz", "--config.model.rename=(=x"], "is no regular expression"),
    (["--resume", "--output_dir={d}/a_sweep"], "holds a run of gradjax sweep, not of gradjax reconstruct"),
    (["--resume", "--output_dir={d}/notes"], "holds files of no gradjax run"),
    (["--output_dir={d}/notes"], "holds files: todo.txt; pass --overwrite to write there"),
    (["--output_dir={d}/a_sweep"], "holds a run of gradjax sweep; choose another folder"),
    (["--config={d}"], "is a folder; give a Python file's path"),
    (["--compilation_cache={d}/a_file"], "--compilation_cache"),
    (["--coordinator_address=localhost", "--num_processes=2", "--process_id=0"], "must be host:port"),
    (["--config.model.num_classes=0"], "num_classes must be at least 2"),
    (["--weights={d}/good.npz", "--observation={d}/dp_declared.safetensors",
      "--config.defense.dp_sgd_max_norm=2"],
     "dp_declared.safetensors declares dp_sgd_max_norm=1.0, but --config.defense.dp_sgd_max_norm=2.0"),
    (["--weights={d}/good.npz", "--observation={d}/dp_no_bound.safetensors"],
     "metadata dp_sgd_noise_multiplier describe DP-SGD but not its clipping bound dp_sgd_max_norm"),
    (["--weights={d}/good.npz", "--observation={d}/dp_bad_rate.safetensors"],
     "declares DP-SGD the options refuse: --config.defense.dp_sgd_sampling_rate must lie in (0, 1]"),
    (["--weights={d}/good.npz", "--observation={d}/good.npz", "--client=fedavg"],
     "--client chooses a simulated client; a capture's update is what its file's metadata 'kind' says"),
    (["--weights={d}/good.npz", "--observation={d}/good.npz", "--index=5"],
     "--index chooses the capture's ground truth in --dataset; give --dataset too"),
    (["--weights={d}/good.npz", "--observation={d}/good.npz", "--dataset=skimage", "--image_size=16"],
     "good.npz declares input_shape 32x32x3, but the ground truth's images are 16x16x3"),
]


@pytest.mark.slow
def test_bad_input_table(tmp_path):
  """The CLI's bad inputs (names, numbers, missing, wrong-kind, corrupt and pickled files,
  unwritable folders) each give one line and exit 2 before anything is computed (the cases share
  one process, each run from a folder of its own)."""
  d = _bad_files(tmp_path)
  cases = []
  for k, (args, _) in enumerate(BAD_FILES):
    args = [a.format(d=d) for a in args]
    if not any(a.startswith("--output_dir") for a in args) and "--resume" not in args:
      args.append(f"--output_dir={d}/run{k}")
    (d / f"case{k}").mkdir()
    cases.append((["gradjax", "reconstruct", *args], d / f"case{k}"))
  for k, ((args, message), proc) in enumerate(zip(BAD_FILES, run_in_one_process(cases))):
    _assert_one_line_error(proc, message, args)
    assert not (d / f"run{k}").exists() and not any((d / f"case{k}").iterdir()), args  # nothing left behind


@pytest.mark.slow
def test_locked_folder_and_sweep_errors(tmp_path):
  d = _bad_files(tmp_path)
  if os.geteuid() != 0:  # root writes anywhere
    _assert_one_line_error(run_program("reconstruct.py", f"--output_dir={d}/locked/run"),
                           "cannot write to the output folder")
  zero, vgg = run_in_one_process([(["gradjax", "sweep", *args, f"--output_dir={d}/s"], tmp_path)
                                  for args in (["--count=0"], ["--model=vgg"])])
  _assert_one_line_error(zero, "count must be positive")
  _assert_one_line_error(vgg, "unknown model")
  channels = run_in_one_process([(["gradjax", "reconstruct", "--config.data.channels=2", "--print_config"],
                                  tmp_path)])[0]
  _assert_one_line_error(channels, "channels must be 1, 3")  # --print_config checks as a run would


@pytest.mark.slow
@pytest.mark.skipif(__import__("gradjax.data").data.default_data_dir() is None, reason="needs ../shared/data")
def test_an_image_range_past_the_dataset_is_refused_before_any_attack(tmp_path):
  """CIFAR-10's size is known by loading it: a sweep whose last batch runs past it and a label
  recovery whose pool starts past it are one line each, before any experiment ran."""
  n = len(data.load("cifar10").y)
  sweep = run_program("sweep.py", "--dataset=cifar10", "--batch_size=4", "--count=2",
                      f"--start={n - 7}", "--iterations=2", f"--output_dir={tmp_path / 's'}")
  labels = run_program("label_recovery.py", f"--start={n}", "--count=1", f"--output={tmp_path / 'l.json'}")
  _assert_one_line_error(sweep, f"reads image {n}")
  _assert_one_line_error(labels, "--start")
  assert not (tmp_path / "s").exists() and not (tmp_path / "l.json").exists()


@pytest.mark.slow
def test_runs_never_overwrite_each_other(tmp_path):
  """Default folders are named from what was attacked and made unique; an explicit folder holding
  files is refused unless --overwrite, which replaces this program's files there and nothing in
  its subfolders (another run's saved state), and only once the new run writes a result."""
  args = ["--iterations=5", "--image_size=16"]
  d = _bad_files(tmp_path / "files")
  runs = tmp_path / "runs"
  reconstruct = ["gradjax", "reconstruct", *args]
  # One process per command (each defines its own flags), its cases in order.
  first, second, ckpt, again = run_in_one_process([[argv, tmp_path] for argv in (
      reconstruct, [*reconstruct, "--seed=1"],
      # A checkpoint's model names the folder (not the --model default).
      [*reconstruct, f"--checkpoint={d}/good.npz", "--image_size=32"],
      [*reconstruct, f"--output_dir={runs / 'dlg_lenet_zhu_skimage_0'}"])])
  inner = runs / "dlg_lenet_zhu_skimage_0" / "inner"
  inner.mkdir()
  (inner / "state.npz").write_bytes(b"another run's saved state")
  forced, = run_in_one_process([[[*reconstruct, "--seed=2", "--overwrite",
                                  f"--output_dir={runs / 'dlg_lenet_zhu_skimage_0'}"], tmp_path]])
  sweep, = run_in_one_process([[["gradjax", "sweep", *args, "--count=1", f"--checkpoint={d}/good.npz",
                                 "--image_size=32"], tmp_path]])
  assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
  assert sorted(p.name for p in runs.iterdir()) == [
      "dlg_lenet_zhu_skimage_0", "dlg_lenet_zhu_skimage_0-2", "dlg_mlp_skimage_0", "sweep_dlg_mlp_skimage_0..0"]
  assert json.loads((runs / "dlg_lenet_zhu_skimage_0-2" / "metrics.json").read_text())["config"]["seed"] == 1
  assert "wrote runs/dlg_lenet_zhu_skimage_0-2" in second.stdout
  assert ckpt.returncode == 0, ckpt.stderr[-2000:]
  assert (runs / "dlg_mlp_skimage_0" / "metrics.json").exists()
  assert sweep.returncode == 0, sweep.stderr[-2000:]
  title = json.loads((runs / "sweep_dlg_mlp_skimage_0..0" / "results.json").read_text())["title"]
  assert title.startswith("dlg on mlp (checkpoint good.npz), skimage 0..0"), title
  _assert_one_line_error(again, "holds a run of gradjax reconstruct")
  assert forced.returncode == 0, forced.stderr[-2000:]
  assert json.loads((runs / "dlg_lenet_zhu_skimage_0" / "metrics.json").read_text())["config"]["seed"] == 2
  assert (inner / "state.npz").read_bytes() == b"another run's saved state"
  # --overwrite by a run that fails before its first result leaves the earlier run as it was.
  kept = {p.name: p.read_bytes() for p in (runs / "dlg_lenet_zhu_skimage_0").iterdir() if p.is_file()}
  failed, = run_in_one_process([[[*reconstruct, "--seed=3", "--overwrite", "--index=999",
                                  f"--output_dir={runs / 'dlg_lenet_zhu_skimage_0'}"], tmp_path]])
  _assert_one_line_error(failed, "out of range")
  assert {p.name: p.read_bytes() for p in (runs / "dlg_lenet_zhu_skimage_0").iterdir() if p.is_file()} == kept
  assert sorted(p.name for p in (runs / "dlg_lenet_zhu_skimage_0").iterdir() if p.is_dir()) == ["inner"]
  # A folder another run has just claimed (its claim, nothing written yet: two runs started
  # together) is taken by neither the next default nor an --output_dir; finished runs keep no claim.
  claimed = runs / "dlg_lenet_zhu_skimage_0-3"
  claimed.mkdir()
  (claimed / ".gradjax-claim").write_text("# Command: gradjax reconstruct --seed=9\n")
  next_free, into = run_in_one_process([[argv, tmp_path] for argv in (
      [*reconstruct, "--seed=4"], [*reconstruct, f"--output_dir={claimed}"])])
  assert "wrote runs/dlg_lenet_zhu_skimage_0-4" in next_free.stdout, next_free.stderr[-2000:]
  _assert_one_line_error(into, "holds a run of gradjax reconstruct")
  assert [p.name for p in claimed.iterdir()] == [".gradjax-claim"]
  assert [str(p.relative_to(runs)) for p in runs.glob("*/.gradjax-claim")] == [
      "dlg_lenet_zhu_skimage_0-3/.gradjax-claim"]
  # --overwrite replaces the program's files by name: a user's file beside them stays.
  table = runs / "sweep_dlg_mlp_skimage_0..0"
  (table / "results.xlsx").write_bytes(b"a user's own table")
  redone, = run_in_one_process([[["gradjax", "sweep", *args, "--count=1", f"--checkpoint={d}/good.npz",
                                  "--image_size=32", "--overwrite", f"--output_dir={table}"], tmp_path]])
  assert redone.returncode == 0, redone.stderr[-2000:]
  assert (table / "results.xlsx").read_bytes() == b"a user's own table"


def _killed_then_resumed(program, args, out, state_glob):
  """Runs ``program`` until a state file matching ``state_glob`` appears in ``out``, SIGKILLs it,
  then resumes it to the end; returns the resumed process."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-m", "gradjax", program.removesuffix(".py").replace("_", "-"), *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
  deadline = time.monotonic() + 240
  while not list(out.glob(state_glob)) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
  return run_program(program, *args, "--resume")


# The run the interrupted runs below must end as: one uninterrupted run per test module and worker
# (how often a run saves its state changes nothing it computes).
INTERRUPTED = ["--iterations=200", "--image_size=16", "--restarts=2", "--config.execution.chunk=10"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  out = tmp_path_factory.mktemp("uninterrupted") / "whole"
  whole = run_program("reconstruct.py", *INTERRUPTED, f"--output_dir={out}")
  assert whole.returncode == 0, whole.stderr[-2000:]
  return out


@pytest.mark.slow
def test_killed_run_resumes_bit_for_bit(tmp_path, uninterrupted):
  args = [*INTERRUPTED, "--save_every_s=0"]
  out = tmp_path / "killed"
  resumed = _killed_then_resumed("reconstruct.py", [*args, f"--output_dir={out}"], out, "state.npz")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "(resumed)" in resumed.stdout and not (out / "state.npz").exists()
  np.testing.assert_array_equal(np.load(out / "reconstruction.npy"),
                                np.load(uninterrupted / "reconstruction.npy"))
  a, b = (json.loads((p / "metrics.json").read_text()) for p in (out, uninterrupted))
  for key in ("psnr", "ssim", "loss", "labels_by_slot", "best_restart", "iterations", "evaluations"):
    assert a[key] == b[key], key
  assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
  assert a["resumed"] and not b["resumed"]
  again, other = run_in_one_process([[["gradjax", "reconstruct", *a, f"--output_dir={out}", "--resume"],
                                       tmp_path] for a in (args, [*args, "--seed=7"])])
  assert again.returncode == 0 and "nothing to resume" in again.stdout
  _assert_one_line_error(other, "holds a finished run of other options (--seed)")  # not a result


def _interrupted(args, wait_for: str):
  """Runs reconstruct.py until its stderr shows ``wait_for``, sends SIGINT, and returns (exit code,
  stderr)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-m", "gradjax", "reconstruct", *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
  seen = []
  try:
    for line in proc.stderr:
      seen.append(line)
      if wait_for in line:
        proc.send_signal(signal.SIGINT)
        break
    seen += proc.stderr.readlines()
    proc.wait(timeout=240)
  finally:
    if proc.poll() is None:
      proc.kill()
  return proc.returncode, "".join(seen)


@pytest.mark.slow
def test_an_interrupted_overwrite_keeps_the_run_it_replaces_until_it_finishes(tmp_path, uninterrupted):
  """--overwrite of a finished run stopped by Ctrl-C once it saved its state: the earlier run's files
  stay, byte for byte, in the hidden folder the last line names; the resume that finishes the new
  run removes them."""
  out = tmp_path / "run"
  shutil.copytree(uninterrupted, out)
  before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
  args = [*INTERRUPTED, "--seed=3", "--save_every_s=3600", f"--output_dir={out}"]
  code, stderr = _interrupted([*args, "--overwrite"], "compiling")
  assert code == 130 and "Traceback" not in stderr and (out / "state.npz").exists(), stderr[-2000:]
  aside, = out.glob(".overwritten-*")
  assert f"kept in {aside}" in stderr.strip().splitlines()[-1]
  assert {p.name: p.read_bytes() for p in aside.iterdir() if p.is_file()} == before
  resumed = run_program("reconstruct.py", *args, "--resume")
  assert resumed.returncode == 0 and "(resumed)" in resumed.stdout, resumed.stderr[-2000:]
  assert not list(out.glob(".overwritten-*")) and not (out / "state.npz").exists()
  assert json.loads((out / "metrics.json").read_text())["config"]["seed"] == 3


@pytest.mark.slow
def test_a_folder_a_running_process_writes_is_refused_and_a_dead_claim_named(tmp_path):
  """A folder whose claim names a gradjax process still running on this host: refused in one line
  for a plain run, --overwrite and --resume alike (the process would write over the new results).
  Once it ended (killed before it saved anything), the refusal says there is nothing to continue,
  and --resume says to start afresh with --overwrite."""
  import socket
  from gradjax.cli import common
  out = tmp_path / "busy"
  out.mkdir()
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  try:
    with open(f"/proc/{sleeper.pid}/stat") as fh:  # its start, field 22 (after the command's ")")
      start = fh.read().rsplit(")", 1)[1].split()[19]
    claim = lambda pid, start, host: (out / ".gradjax-claim").write_text(
        f"# Command: gradjax reconstruct --iterations=5\n# Process: {pid} {start} on {host}\n")
    claim(sleeper.pid, start, socket.gethostname())
    runs = run_in_one_process([(["gradjax", "reconstruct", "--iterations=5", f"--output_dir={out}",
                                 *extra], tmp_path) for extra in ([], ["--overwrite"], ["--resume"])])
    for proc in runs:
      _assert_one_line_error(proc, f"is being written by process {sleeper.pid} (gradjax reconstruct), "
                                   "which is still running")
    # The number given to a later process (another start), or a process of another host: not it.
    for other in ((sleeper.pid, str(int(start) + 1), socket.gethostname()),
                  (sleeper.pid, start, socket.gethostname() + "-other")):
      claim(*other)
      assert common.running(str(out)) is None
    claim(sleeper.pid, start, socket.gethostname())
    assert common.running(str(out)) == f"process {sleeper.pid} (gradjax reconstruct)"
  finally:
    sleeper.kill()
    sleeper.wait()
  plain, resumed = run_in_one_process([(["gradjax", "reconstruct", "--iterations=5",
                                         f"--output_dir={out}", *extra], tmp_path)
                                       for extra in ([], ["--resume"])])
  _assert_one_line_error(plain, "holds a run of gradjax reconstruct that saved nothing to continue; "
                                "pass --overwrite to replace it, or choose another folder")
  _assert_one_line_error(resumed, "start afresh there with --overwrite in place of --resume")


@pytest.mark.slow
def test_ctrl_c_saves_and_names_the_resume_command(tmp_path, uninterrupted):
  """SIGINT while the step compiles, before any save: the run saves at its first chunk, exits 130
  with one line naming the command that continues it, and that command ends where an uninterrupted
  run does. (A signal after the first save, when no save is due: tests/test_resume.py.)"""
  args = [*INTERRUPTED, "--save_every_s=3600"]
  out = tmp_path / "stopped"
  code, stderr = _interrupted([*args, f"--output_dir={out}"], "compiling")
  last = stderr.strip().splitlines()[-1]
  assert code == 130 and last.startswith("interrupted at iteration "), stderr[-2000:]
  assert "Traceback" not in stderr and (out / "state.npz").exists()
  command = shlex.split(last.split("resume with: ", 1)[1])
  assert command[:2] == ["gradjax", "reconstruct"] and "--resume" in command
  # A resume of other options is refused and leaves the claim naming the command that ran.
  # (Its process line names the last process that held the folder.)
  def claimed():
    return [l for l in (out / ".gradjax-claim").read_text().splitlines() if l.startswith("# Command:")]
  claim = claimed()
  other, = run_in_one_process([[["gradjax", "reconstruct", *args, "--seed=7", f"--output_dir={out}",
                                 "--resume"], tmp_path]])
  _assert_one_line_error(other, "belongs to another run")
  assert claimed() == claim and len(claim) == 1
  process, = [l for l in (out / ".gradjax-claim").read_text().splitlines() if l.startswith("# Process:")]
  assert re.match(r"# Process: \d+ \S+ on \S", process), process  # the last holder's
  resumed = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert resumed.returncode == 0 and "(resumed)" in resumed.stdout, resumed.stderr[-2000:]
  np.testing.assert_array_equal(np.load(out / "reconstruction.npy"),
                                np.load(uninterrupted / "reconstruction.npy"))


def test_resume_of_a_folder_without_state_is_an_error(tmp_path):
  proc = run_program("reconstruct.py", "--iterations=5", "--image_size=16", "--resume",
                     f"--output_dir={tmp_path / 'mistyped'}")
  assert proc.returncode == 2 and "holds no saved state" in proc.stderr
  assert "start afresh" in proc.stderr and not (tmp_path / "mistyped").exists()


@pytest.mark.slow
def test_killed_sweep_resumes(tmp_path):
  args = ["--count=3", "--iterations=200", "--image_size=16", "--config.execution.chunk=10", "--save_every_s=0"]
  whole = run_program("sweep.py", *args, f"--output_dir={tmp_path / 'whole'}")
  assert whole.returncode == 0, whole.stderr[-2000:]
  out = tmp_path / "killed"
  # Killed while the second image runs: the first is kept, the second continues from its state.
  resumed = _killed_then_resumed("sweep.py", [*args, f"--output_dir={out}"], out, "items/1.state.npz")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  a, b = (json.loads((p / "results.json").read_text()) for p in (out, tmp_path / "whole"))
  assert [r["psnr"] for r in a["rows"]] == [r["psnr"] for r in b["rows"]]
  assert [r["resumed"] for r in a["rows"]] == [False, True, False]
  assert not list(out.glob("items/*state.npz"))
  # Resumed with a narrower range, its table would drop a finished row: refused, the table kept.
  kept = (out / "results.json").read_bytes()
  narrower = run_program("sweep.py", *[a.replace("--count=3", "--count=2") for a in args], "--resume",
                         f"--output_dir={out}")
  _assert_one_line_error(narrower, "holds finished experiments this command does not run (2.json)")
  assert (out / "results.json").read_bytes() == kept


@pytest.mark.slow
def test_a_sweeps_finished_experiments_are_of_the_checkpoint_they_ran_on(tmp_path):
  """A sweep resumed after its checkpoint was replaced does not mix rows of two models: its
  finished experiments are refused in one line."""
  meta = {"model": "mlp", "init": None, "act": None, "num_classes": 10, "input_shape": [16, 16, 3]}
  ckpt = tmp_path / "ckpt.npz"
  checkpoint.save(ckpt, models.create("mlp", jax.random.key(0), input_shape=(16, 16, 3)).variables, meta)
  args = ["gradjax", "sweep", "--count=2", "--iterations=5", "--image_size=16", f"--checkpoint={ckpt}",
          f"--output_dir={tmp_path / 's'}"]
  first, = run_in_one_process([[args, tmp_path]])
  assert first.returncode == 0, first.stderr[-2000:]
  checkpoint.save(ckpt, models.create("mlp", jax.random.key(1), input_shape=(16, 16, 3)).variables, meta)
  same, = run_in_one_process([[[*args, "--resume"], tmp_path]])
  _assert_one_line_error(same, "0.json was computed from other contents of model.checkpoint")


@pytest.mark.slow
def test_sweep_table(tmp_path):
  """The table's statistics and grid; the same sweep with its two images (two model draws) attacked
  in one solver run gives the same rows."""
  args = ["gradjax", "sweep", "--count=2", "--iterations=20", "--image_size=16"]
  start = time.perf_counter()
  proc, together = run_in_one_process([
      (args + [f"--output_dir={tmp_path}"], tmp_path),
      (args + ["--config.execution.clients_per_run=2", f"--output_dir={tmp_path / 'together'}"],
       tmp_path)])
  elapsed = time.perf_counter() - start
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert together.returncode == 0, together.stderr[-2000:]
  result = json.loads((tmp_path / "results.json").read_text())
  shared = json.loads((tmp_path / "together" / "results.json").read_text())
  assert [r.get("clients_together") for r in shared["rows"]] == [2, 2]
  np.testing.assert_allclose([r["psnr"] for r in shared["rows"]], [r["psnr"] for r in result["rows"]],
                             rtol=1e-4)
  assert [r["index"] for r in result["rows"]] == [0, 1]
  # The summary from the saved images (scikit-image) and labels (multisets), not from the rows.
  saved = [np.load(tmp_path / "items" / f"{i}.npz") for i in (0, 1)]
  pairs = [(z["ground_truth"][0].astype(np.float64), z["reconstruction"][0].astype(np.float64)) for z in saved]
  psnr = np.array([skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1) for g, r in pairs])
  ssim = np.array([skimage.metrics.structural_similarity(g, r, data_range=1, channel_axis=-1) for g, r in pairs])
  mse = np.array([np.mean((g - r) ** 2) for g, r in pairs])
  labels = [json.loads((tmp_path / "items" / f"{i}.json").read_text()) for i in (0, 1)]
  accuracy = np.array([sum((collections.Counter(r["labels_true"]) & collections.Counter(r["labels_reconstructed"])).values())
                       / len(r["labels_true"]) for r in labels])
  summary = result["summary"]
  for name, want in (("psnr", psnr), ("ssim", ssim), ("mse", mse), ("label_accuracy", accuracy)):
    np.testing.assert_allclose([summary[name][k] for k in ("mean", "median", "std")],
                               [want.mean(), np.median(want), want.std()], rtol=1e-5, atol=1e-12)
  assert summary["successes"] == int(np.sum(psnr >= 30)) and summary["images"] == 2
  # The unclamped PSNR scores the attack's own iterate, which the saved (clamped) images are not:
  # each row's is NumPy's 10 log10(1 / MSE) at it (test_metrics); its summary is theirs.
  unclamped = np.array([r["psnr_unclamped"] for r in result["rows"]])
  assert np.all(unclamped <= psnr + 1e-4)  # clamping to the box only brings an image closer
  np.testing.assert_allclose([summary["psnr_unclamped"][k] for k in ("mean", "median", "std")],
                             [unclamped.mean(), np.median(unclamped), unclamped.std()], rtol=1e-6)
  total = summary["total_time_s"]  # within the process's time, the two experiments' inside it
  assert sum(r["wall_time_s"] for r in result["rows"]) <= total < elapsed
  line = (tmp_path / "results.md").read_text().splitlines()[-1]
  for number in (f"{psnr.mean():.2f} ± {psnr.std():.2f} dB", f"median {np.median(psnr):.2f}",
                 f"SSIM {ssim.mean():.3f} ± {ssim.std():.3f}", f"label accuracy {accuracy.mean():.3f}",
                 f"total {total:.1f} s ({np.mean([r['wall_time_s'] for r in result['rows']]):.1f} s per experiment"):
    assert number in line, (number, line)
  assert "| index |" in (tmp_path / "results.md").read_text()
  grid = np.asarray(Image.open(tmp_path / "reconstructions.png"))
  assert grid.shape == (2 * (16 * 2 + 2) + 2, 2 * (16 * 2 + 2) + 2, 3)


def test_parse_priors_and_image_bounds():
  from gradjax import priors
  assert config.parse_priors("tv:1e-4, l2:0.5:100") == (priors.Prior(priors.PRIORS["tv"], 1e-4, 0),
                                                          priors.Prior(priors.PRIORS["l2"], 0.5, 100))
  assert config.parse_priors("") == ()
  with pytest.raises(ValueError, match="name:weight"):
    config.parse_priors("tv")
  with pytest.raises(ValueError, match="unknown prior"):
    config.parse_priors("blur:1e-4")
  from gradjax import data
  norm = data.normalization("cifar10")
  lo, hi = pipeline.image_bounds(norm, 3)
  mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
  np.testing.assert_allclose(lo, -mean / std, rtol=1e-6)
  np.testing.assert_allclose(hi, (1 - mean) / std, rtol=1e-6)


def test_config_names_resolve_to_the_attacks_parts():
  """config.get_attack: the preset built at the budget, each name the configuration sets turned
  into its object, the optimizer's numbers replaced one by one."""
  import dataclasses

  from gradjax import distances, dummy, labels, optimizers, presets
  assert config.get_attack(config.from_options({"attack.preset": "dlg"})) == presets.dlg()
  cfg = config.from_options({
      "attack.preset": "sapag", "attack.iterations": 50, "attack.distance": "cosine",
      "attack.label_source": "llg", "attack.dummy_init": "uniform", "attack.optimizer": "adam",
      "attack.learning_rate": 0.01, "attack.schedule": "cosine", "attack.box": False,
      "attack.tol": 1e-9
  })
  attack = config.get_attack(cfg)
  assert attack.distance is distances.DISTANCES["cosine"] and attack.label_source is labels.llg
  assert attack.dummy_init is dummy.uniform and not attack.box and attack.tol == 1e-9
  assert attack.optimizer == optimizers.Named("adam", 0.01, schedule="cosine") and attack.iterations == 50
  assert attack == dataclasses.replace(presets.sapag(50), distance=distances.DISTANCES["cosine"],
                                       label_source=labels.llg, dummy_init=dummy.uniform, box=False, tol=1e-9,
                                       optimizer=optimizers.Named("adam", 0.01, schedule="cosine"))
  # The learning rate alone keeps the preset's optimizer; hfginv's labels are inferred, then known.
  ig = config.get_attack(
      config.from_options({"attack.preset": "inverting_gradients", "attack.learning_rate": 0.5}))
  assert ig.optimizer == optimizers.Named("signed_adam", 0.5, schedule="step")
  assert config.get_attack(
      config.from_options({"attack.preset": "dlg",
                           "attack.label_source": "hfginv"})).label_source is labels.known
  # SAPAG reads its image label by iDLG; a language model's targets have no head to read: joint.
  assert config.get_attack(config.from_options({"attack.preset": "sapag"})).label_source is labels.idlg
  text = {"attack.preset": "sapag", "data.modality": "text", "model.name": "transformer",
          "data.dataset": "pydoc"}
  assert config.get_attack(config.from_options(text)).label_source is labels.joint
  assert config.get_attack(config.from_options({**text,
                                                "attack.label_source": "known"})).label_source is labels.known
  with pytest.raises(ValueError, match="unknown distance"):
    config.get_attack(config.from_options({"attack.distance": "manhattan"}))
  with pytest.raises(ValueError, match="dummy init"):
    config.get_attack(config.from_options({"attack.dummy_init": "zeros"}))
  # --config.attack.smoothing is a fraction of the budget the preset is built at: steps once the budget is known.
  from gradjax.objectives import Smoothing
  smooth = config.get_attack(
      config.from_options({
          "attack.preset": "inverting_gradients_batch", "attack.iterations": 300,
          "attack.smoothing": "0.4,end=1e3"
      }))
  assert smooth.smoothing == Smoothing(until=120, start=2.0, end=1e3)
  for bad in ("1.5", "half", "0.5,until=3", "0.5,start=0", "0.5,end=x"):
    with pytest.raises(ValueError, match="smoothing"):
      config.get_attack(
          config.from_options(
              {"attack.preset": "inverting_gradients_batch", "attack.smoothing": bad}))


def test_flags_are_the_config_options():
  """Each option with a short flag is that flag (the same default, the option's help); every option
  is --config.<path>; parsed flags build the Config, the attack overrides and the one Execution
  record."""
  code = textwrap.dedent("""
      import json, sys
      from gradjax.cli import common
      from absl import flags
      from gradjax import config, dummy, priors
      # ml_collections defines the --config.<path> flags from sys.argv when --config is defined.
      sys.argv = ["prog", "--config.attack.learning_rate=0.5", "--config.execution.strategy=vmap",
                  "--config.execution.halving_rounds=2", "--config.execution.chunk=7",
                  "--iterations=9", "--config.attack.dummy_init=uniform", "--priors=tv:1e-3",
                  "--restarts=3"]
      common.define_flags(sections=tuple(config.SECTIONS))  # the attack's and the training's
      common.parse_flags(sys.argv)
      out = {"fields": []}
      for name, path in config.ALIASES.items():
        f, flag = config.option(path), flags.FLAGS[name]
        out["fields"].append([path, flag.name, flag.default == f.default, f.metadata["help"] in flag.help])
      out["absent"] = [p for p in config.paths() if config.alias(p) is None
                       and p.rpartition(".")[2] in flags.FLAGS
                       and p.rpartition(".")[2] not in config.ALIASES]
      cfg = common.config_from_flags()
      attack, ex = config.get_attack(cfg), cfg.execution.build()
      out["attack"] = [attack.optimizer.name, attack.optimizer.learning_rate, attack.iterations,
                       attack.dummy_init is dummy.uniform,
                       attack.priors == (priors.Prior(priors.PRIORS["tv"], 1e-3, 0),)]
      out["execution"] = [ex.strategy, ex.chunk, ex.halving_rounds, ex.halving_keep, ex.shard]
      out["restarts"] = cfg.attack.restarts
      print(json.dumps(out))
      """)
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.splitlines()[-1])
  assert len(out["fields"]) == len(config.ALIASES) >= 20
  assert all(same_default and same_help for _, _, same_default, same_help in out["fields"])
  assert out["absent"] == []  # an option without an alias has no flag of its key's name
  assert out["attack"] == ["lbfgs", 0.5, 9, True, True]
  assert out["execution"] == ["vmap", 7, 2, 0.5, False] and out["restarts"] == 3


@pytest.mark.skipif(__import__("gradjax.data").data.default_data_dir() is None, reason="needs ../shared/data")
@pytest.mark.slow
def test_label_recovery_program(tmp_path):
  out, moved = tmp_path / "labels.json", tmp_path / "moved.json"
  proc, moved_proc = run_in_one_process([(argv, tmp_path) for argv in (
      ["gradjax", "label-recovery", "--count=2", f"--output={out}"],
      ["gradjax", "label-recovery", "--count=2", "--start=500", "--config.sampling.pool=200",
       "--aux_size=0", f"--output={moved}"])])
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(out.read_text())
  for method in result["methods"].values():
    for pred, true, acc in zip(method["labels_per_batch"], result["batches"]["labels"],
                               method["accuracy_per_batch"]):
      overlap = collections.Counter(pred) & collections.Counter(true)
      assert acc == pytest.approx(sum(overlap.values()) / len(true))
    assert method["accuracy_mean"] == pytest.approx(np.mean(method["accuracy_per_batch"]))
    assert method["accuracy_std"] == pytest.approx(np.std(method["accuracy_per_batch"]))
    exact = [sorted(pred) == sorted(true) for pred, true in zip(method["labels_per_batch"],
                                                                result["batches"]["labels"])]
    assert method["exact_per_batch"] == exact and method["exact_batches"] == sum(exact)
  assert result["methods"]["bias_counts (oracle p̄)"]["accuracy_mean"] == 1.0
  distinct = [len(set(y)) / len(y) for y in result["batches"]["labels"]]
  assert result["distinct_label_upper_bound"] == pytest.approx(np.mean(distinct))
  # The table beside the JSON is the one printed, its rows the JSON's figures.
  table = (tmp_path / "labels.md").read_text()
  assert table in proc.stdout
  rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
  for name, method in result["methods"].items():
    assert (f"| {method['accuracy_mean']:.3f} ± {method['accuracy_std']:.3f} | "
            f"{method['exact_batches']}/2 |") in rows[name], (name, table)
  # --start moves the pool: the batches' images and labels are the dataset's from there.
  assert moved_proc.returncode == 0, moved_proc.stderr[-2000:]
  result = json.loads(moved.read_text())
  indices = np.asarray(result["batches"]["indices"])
  assert indices.min() >= 500 and indices.max() < 700 and result["config"]["start"] == 500
  from gradjax import data
  truth = data.load("cifar10", indices=indices.ravel().tolist()).y.reshape(indices.shape)
  np.testing.assert_array_equal(result["batches"]["labels"], truth)


# Runs ``gradjax <argv>`` with LLG's label inference made slower by known sleeps, one per batch in
# order: the durations the program times for it are those sleeps and LLG's own (about a millisecond).
_SLOWED_LLG = """
import json, sys, time
from gradjax import cli, labels
llg, sleeps = labels.METHODS["llg"], json.loads(sys.argv[2])
def slowed(observation):
  time.sleep(sleeps.pop(0))
  return llg(observation)
labels.METHODS["llg"] = slowed
cli.main(json.loads(sys.argv[1]))
"""


@pytest.mark.skipif(__import__("gradjax.data").data.default_data_dir() is None, reason="needs ../shared/data")
@pytest.mark.slow
def test_label_recovery_times_are_the_measured_durations(tmp_path):
  """The table's ms / batch is the median over batches of each method's measured time: with LLG
  slowed by 3.0, 0.1 and 1.0 s on batches 0, 1 and 2, its median is 1000 ms and some (not the mean,
  1367 ms, nor the least, 100 ms, nor seconds); every cell is the JSON's median; the wall time
  printed and written holds the sleeps and lies within the process's life."""
  out = tmp_path / "labels.json"
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", _SLOWED_LLG, json.dumps(
      ["gradjax", "label-recovery", "--count=3", "--aux_size=2", f"--output={out}"]), "[3.0, 0.1, 1.0]"],
      capture_output=True, text=True, cwd=tmp_path, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  elapsed = time.perf_counter() - start
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(out.read_text())
  medians = {name: method["median_time_ms"] for name, method in result["methods"].items()}
  assert 1000.0 <= medians["llg"] < 1300.0, medians
  assert all(0.0 < ms < 1e3 * result["wall_time_s"] for ms in medians.values()), medians
  rows = {line.split(" | ")[0][2:]: line for line in proc.stdout.splitlines() if line.startswith("| ")}
  for name, ms in medians.items():
    assert rows[name].endswith(f"| {ms:.1f} |"), (name, rows[name])
  assert 4.1 <= result["wall_time_s"] <= elapsed
  assert f"Wall time {result['wall_time_s']:.1f} s" in proc.stdout


@pytest.mark.slow
def test_text_table_times_are_the_measured_durations(tmp_path):
  """text-table's time (s) column: each row's seconds the sum of its sentences' attack times as its
  kept experiments hold them; each of those within the time between the files written before and
  after it (its attack ran between the two) and the attack phase's own clock; the total printed and
  written within the process's life and above the rows' sum. Resumed, every experiment read back,
  the rows are the same and the total counts the earlier runs' time."""
  out = tmp_path / "table"
  args = ["--count=2", "--config.attack.iterations=2", "--methods=SAPAG", "--searches=tokens",
          f"--output_dir={out}"]
  started = time.time()
  proc = run_program("text-table", *args)
  elapsed = time.time() - started
  assert proc.returncode == 0, proc.stderr[-2000:]
  res = json.loads((out / "results.json").read_text())
  (t,) = res["table"]
  written = started  # the experiments run one after the other, each written as it ends
  for row in t["rows"]:
    item = out / "items" / f"untrained_SAPAG_tokens_{row['index']}.json"
    kept = json.loads(item.read_text())
    assert row["wall_time_s"] == kept["wall_time_s"]
    assert 0 < row["wall_time_s"] <= item.stat().st_mtime - written
    assert row["wall_time_s"] == pytest.approx(kept["time"]["phases"]["attack"]["seconds"], abs=0.05)
    written = item.stat().st_mtime
  seconds = sum(row["wall_time_s"] for row in t["rows"])
  assert t["wall_time_s"] == pytest.approx(seconds, rel=1e-12)
  assert seconds <= res["total_time_s"] <= elapsed
  md = (out / "results.md").read_text()
  (line,) = [line for line in md.splitlines() if line.startswith("| untrained | SAPAG | tokens |")]
  assert line.endswith(f"| {seconds:.0f} |"), line
  assert f"total {res['total_time_s']:.0f} s." in md
  started = time.time()
  again = run_program("text-table", *args, "--resume")
  elapsed = time.time() - started
  assert again.returncode == 0, again.stderr[-2000:]
  resumed = json.loads((out / "results.json").read_text())
  assert resumed["table"] == res["table"]
  assert seconds <= resumed["total_time_s"] <= seconds + elapsed


@pytest.mark.slow
def test_defense_sweep_table(tmp_path):
  """Its table per defense, the LPIPS column where AlexNet's LPIPS is installed, every attack kept
  and read back by --resume instead of attacked again (the table the same, the kept files
  untouched), an unknown defense refused."""
  sweep = ["gradjax", "defense-sweep", "--defenses=none;prune:0.5", "--count=1", "--iterations=10",
           "--image_size=32", f"--output_dir={tmp_path}"]
  proc = run_program(*sweep[1:])
  assert proc.returncode == 0, proc.stderr[-2000:]
  table = json.loads((tmp_path / "results.json").read_text())["table"]
  assert [row["defense"] for row in table] == ["none", "prune:0.5"]
  markdown = (tmp_path / "results.md").read_text()
  for row in table:  # label accuracy: the multiset overlap of the item's labels, over N
    item = json.loads((tmp_path / "items" / f"{row['defense'].replace(':', '_')}_0.json").read_text())
    overlap = collections.Counter(item["labels_reconstructed"]) & collections.Counter(item["labels_true"])
    accuracy = sum(overlap.values()) / len(item["labels_true"])
    assert row["summary"]["label_accuracy"]["mean"] == pytest.approx(accuracy)
    assert f"| {accuracy:.2f} |" in markdown
  if lpips.available("alex"):  # 32x32 images are large enough for AlexNet's LPIPS
    from test_lpips import np_lpips
    metric = lpips.load("alex")
    assert "| LPIPS |" in markdown
    for row in table:  # the NumPy LPIPS of the item's kept images
      images = np.load(tmp_path / "items" / f"{row['defense'].replace(':', '_')}_0.npz")
      want = np_lpips(metric, images["reconstruction"], images["ground_truth"])
      assert row["summary"]["lpips"]["mean"] == pytest.approx(float(want.mean()), rel=2e-4, abs=1e-5)
      assert f"| {row['summary']['lpips']['mean']:.3f} |" in markdown
  else:
    assert "LPIPS" not in markdown
  kept = {p: p.stat().st_mtime_ns for p in tmp_path.glob("items/*")}
  assert len([p for p in kept if p.suffix == ".json"]) == 2 and not list(tmp_path.glob("items/*state*"))
  again, bad = run_in_one_process([(argv, tmp_path) for argv in (
      [*sweep, "--resume"],
      ["gradjax", "defense-sweep", "--defenses=blur:3", "--count=1", f"--output_dir={tmp_path / 'bad'}"])])
  assert again.returncode == 0, again.stderr[-2000:]
  assert json.loads((tmp_path / "results.json").read_text())["table"] == table
  assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("items/*")} == kept
  assert bad.returncode == 2 and "unknown defense" in bad.stderr


@pytest.mark.slow
def test_permutation_search_from_the_command_line(tmp_path):
  """FedAvg client with 2 images in 2 local steps, labels revealed as a multiset: 2 candidates."""
  proc = run_program("reconstruct.py", "--client=fedavg", "--batch_size=2", "--config.client.local_batch_size=1",
                     "--labels=known", "--config.client.shared_labels=multiset", "--config.attack.matched=replay",
                     "--config.attack.permutations=4", "--restarts=2", "--config.execution.halving_rounds=2", "--iterations=10",
                     "--image_size=8", f"--output_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  metrics = json.loads((tmp_path / "metrics.json").read_text())
  assert metrics["candidates"] == 2 and metrics["config"]["attack"]["permutations"] == 4
  assert sorted(metrics["labels_reconstructed"]) == sorted(metrics["labels_true"])
  assert sorted(metrics["labels_by_slot"]) == sorted(metrics["labels_true"])


@pytest.mark.slow
def test_compilation_cache_is_written_and_reused(tmp_path):
  cache = tmp_path / "cache"
  # Every program is cached (threshold 0, the default, passed to keep the test independent of it),
  # so the second run must find all of them; with a positive threshold, which programs pass it
  # would depend on the machine's load.
  args = ["--iterations=5", "--image_size=8", f"--compilation_cache={cache}",
          "--compilation_cache_min_secs=0", f"--output_dir={tmp_path / 'run'}"]
  first = run_program("reconstruct.py", *args)
  assert first.returncode == 0, first.stderr[-2000:]
  entries = sorted(p.name for p in cache.iterdir())
  assert entries, "no compiled program was cached"
  second = run_program("reconstruct.py", *args, "--overwrite")
  assert second.returncode == 0, second.stderr[-2000:]
  assert sorted(p.name for p in cache.iterdir()) == entries  # every program came from the cache


@pytest.mark.slow
@pytest.mark.parametrize("attack", [
    ["--attack=dlg", "--image_size=8"], ["--attack=inverting_gradients", "--image_size=8"],
    ["--attack=inverting_gradients", "--image_size=8", "--config.attack.iterate=last"],
    ["--attack=hfginv", "--model=convnet-4", "--image_size=16"]],
    ids=["dlg", "inverting_gradients", "last_iterate", "hfginv"])
def test_another_budget_save_interval_or_chunk_compiles_nothing_new(tmp_path, attack):
  """A second run that changes only the budget, the save interval and the chunk loads every program
  from the persistent cache: Inverting Gradients' learning-rate milestones sit at fractions of the
  budget, the last-iterate rule tracks from it, HFGInv's prior starts and stepwise period scale
  with it."""
  cache = tmp_path / "cache"
  common = [*attack, f"--compilation_cache={cache}", "--compilation_cache_min_secs=0", "--lpips=none"]
  first = run_program("reconstruct.py", *common, "--iterations=6", f"--output_dir={tmp_path / 'a'}")
  assert first.returncode == 0, first.stderr[-2000:]
  entries = sorted(p.name for p in cache.iterdir())
  second = run_program("reconstruct.py", *common, "--iterations=11", "--save_every_s=0",
                       "--config.execution.chunk=4", f"--output_dir={tmp_path / 'b'}")
  assert second.returncode == 0, second.stderr[-2000:]
  new = sorted(set(p.name for p in cache.iterdir()) - set(entries))
  assert new == [], new
  spent = json.loads((tmp_path / "b" / "metrics.json").read_text())["time"]
  assert spent["programs_loaded"] == spent["programs"] - len(new) > 0, spent


SWEEP_CONFIG = """
from gradjax import config

def get_config():
  c = config.defaults()
  c.data.image_size = 8
  c.attack.iterations = 4
  c.output.lpips = "none"
  return c

def get_sweep():
  return config.product(config.sweep("data.index", [0, 1]),
                        config.sweep("defense.spec", [None, "prune:0.5"]))
"""


# Configuration files that give no configuration, and what each says in its one line.
BAD_CONFIG_FILES = {
    # First: one process runs these, and ml_collections' loader would find an earlier file's get_config.
    "no_get.py": ("x = 1\n", "defines no get_config()"),
    "syntax.py": ("def get_config(:\n  pass\n", "syntax.py line 1: invalid syntax"),
    "notes.txt": ("hello world\n", "notes.txt line 1: invalid syntax"),
    "raises.py": ("def get_config():\n  raise RuntimeError('boom')\n",
                  "get_config() failed: RuntimeError: boom"),
    "needs_arg.py": ("from gradjax.run import config\ndef get_config(arg):\n  return config.defaults()\n",
                     "missing 1 required positional argument"),
    "wrong_type.py": ("from gradjax.run import config\ndef get_config():\n  c = config.defaults()\n"
                      "  c.attack.iterations = 'ten'\n  return c\n", "Could not override field 'iterations'"),
    "a_bool.py": ("from gradjax.run import config\ndef get_config():\n  c = config.defaults()\n"
                  "  c.attack.restarts = True\n  return c\n", "attack.restarts takes int, got True"),
    "number.py": ("def get_config():\n  return 3\n", "get_config() returned int, not a configuration"),
    "none.py": ("def get_config():\n  pass\n", "get_config() returned NoneType, not a configuration"),
    "exits.py": ("import sys\ndef get_config():\n  sys.exit(0)\n",
                 "get_config() exited (code 0) instead of returning the options"),  # it exited 0, silently
    "nul.py": ("def get_config():\n  return None\x00\n", "nul.py: source code string cannot contain null bytes"),
}


def test_bad_configuration_files_and_outputs_are_one_line(tmp_path):
  """A --config file that gives no configuration, an option given twice with two values, and a
  results file that is a folder or exists: one line and exit 2 each, no traceback; an explicit
  --config.<path> equal to the schema's default is kept over what a mode would choose."""
  for name, (text, _) in BAD_CONFIG_FILES.items():
    (tmp_path / name).write_text(text)
  (tmp_path / "taken.json").write_text("{}")
  cases = [([f"--config={tmp_path / name}"], message) for name, (_, message) in BAD_CONFIG_FILES.items()]
  cases += [(["--iterations=5", "--config.attack.iterations=7"], "set one option to two values"),
            (["--config.attack.iterations=7", "--iterations=5"], "set one option to two values"),
            (["--config=dlg:variant"], "get_config() takes 0 positional arguments"),
            (["--attack=bogus"], "unknown attack 'bogus'")]  # checked before it is printed
  results = run_in_one_process(
      [(["gradjax", "reconstruct", *args, "--print_config"], tmp_path) for args, _ in cases]
      + [(["gradjax", "reconstruct", "--modality=text", "--config.model.name=lenet_zhu",
           "--print_config"], tmp_path),
         (["gradjax", "reconstruct", "--iterations=5", "--config.attack.iterations=5", "--print_config"],
          tmp_path)])
  for (args, message), proc in zip(cases, results):
    _assert_one_line_error(proc, message, args)
  # lenet_zhu is the schema's default model: given explicitly, text mode does not replace it.
  _assert_one_line_error(results[len(cases)], "needs a text model", "text with lenet_zhu")
  assert results[-1].returncode == 0 and "c.attack.iterations = 5" in results[-1].stdout
  outputs = [(tmp_path, "a folder"), (tmp_path / "taken.json", "exists"),
             (tmp_path / "missing" / "out.json", "no folder")]
  if os.path.isdir("/proc"):  # a folder no file can be made in, even by root (os.access says yes)
    outputs.append(("/proc/out.json", "cannot write to /proc"))
  *refused, replaced = run_in_one_process(
      [(["gradjax", "label-accuracy", "--count=1", f"--output={path}"], tmp_path) for path, _ in outputs]
      + [(["gradjax", "label-accuracy", "--count=1", f"--output={tmp_path / 'taken.json'}",
           "--overwrite"], tmp_path)])
  for (path, message), proc in zip(outputs, refused, strict=True):
    _assert_one_line_error(proc, message, path)
  assert replaced.returncode == 0, replaced.stderr[-2000:]
  assert json.loads((tmp_path / "taken.json").read_text())["count"] == 1


@pytest.mark.slow
def test_label_accuracy_is_the_closed_form_of_the_heads_gradient(tmp_path):
  """iDLG's label, argmin_c Σ_j ∂L/∂W[j, c] = argmin_c (Σ_j h_j)(p_c − y_c) where the head's input h
  sums above zero, argmax where below (the sign read from the bias gradient), is the true one for
  every client of the sigmoid LeNet and of an MLP with tanh, some of whose hidden layers (NumPy,
  float64, from the run's own model) sum below zero."""
  from gradjax import data
  out = tmp_path / "tanh.json"
  common = ["--dataset=skimage", "--image_size=16", "--count=12"]
  tanh, lenet = run_in_one_process([
      (["gradjax", "label-accuracy", *common, "--model=mlp", "--config.model.act=tanh",
        f"--output={out}"], tmp_path),
      (["gradjax", "label-accuracy", *common], tmp_path)])
  assert tanh.returncode == 0 and lenet.returncode == 0, tanh.stderr[-2000:] + lenet.stderr[-2000:]
  assert "100.0 % (12/12)" in lenet.stdout
  x = data.load("skimage", indices=range(12), image_size=(16, 16)).x.reshape(12, -1).astype(np.float64)
  want = []
  for k in range(12):
    model = models.create("mlp", pipeline.experiment_keys(0, k)[0], input_shape=(16, 16, 3),
                          act="tanh", num_classes=data.load("skimage", indices=[0]).num_classes)
    dense = model.variables["params"]["Dense_0"]
    h = np.tanh(x[k] @ np.asarray(dense["kernel"], np.float64) + np.asarray(dense["bias"], np.float64))
    want.append(bool(h.sum() > 0))
  assert not all(want)  # some hidden layers sum below zero: argmin alone would miss them
  result = json.loads(out.read_text())
  assert result["correct"] == [True] * 12 and result["accuracy"] == 1.0
  assert "100.0 % (12/12)" in tanh.stdout


@pytest.mark.slow
def test_label_accuracy_counts_the_clients_it_misses(tmp_path):
  """With iDLG's label made wrong wherever it is even (it is right on these clients: the test
  above), the table counts the clients whose true label is odd, as data.load gives them."""
  from gradjax import data
  code = ("import sys; from gradjax import cli, labels; idlg = labels.idlg; "
          "labels.idlg = lambda obs: [int(c) + 1 if int(c) % 2 == 0 else int(c) for c in idlg(obs)]; "
          "cli.main(sys.argv[1:])")
  out = tmp_path / "result.json"
  proc = subprocess.run([sys.executable, "-c", code, "gradjax", "label-accuracy", "--dataset=skimage",
                         "--image_size=16", "--start=1", "--count=7", f"--output={out}"],
                        capture_output=True, text=True, cwd=tmp_path, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  y = data.load("skimage", indices=range(1, 8), image_size=(16, 16)).y
  want = [bool(c % 2) for c in y]
  assert 0 < sum(want) < len(want)
  result = json.loads(out.read_text())
  assert result["correct"] == want and result["accuracy"] == pytest.approx(sum(want) / 7)
  assert f"{100 * sum(want) / 7:.1f} % ({sum(want)}/7)" in proc.stdout


@pytest.mark.slow
def test_a_sweep_declared_in_a_config_file(tmp_path):
  """gradjax sweep runs one experiment per item of the file's get_sweep(), each equal to the single
  run of its options (reconstruct with them as flags); its config.py declares the sweep and runs it
  again to the same table; misused, one line and exit 2."""
  (tmp_path / "grid.py").write_text(SWEEP_CONFIG)
  (tmp_path / "bad.py").write_text(SWEEP_CONFIG.replace('"defense.spec", [None', '"defense.nope", [None'))
  (tmp_path / "twice.py").write_text(SWEEP_CONFIG.replace('[0, 1]', '[0, 0]'))
  (tmp_path / "broken.py").write_text(SWEEP_CONFIG.replace("return config.product(", "return 1 / 0 + ("))
  first, single = tmp_path / "first", tmp_path / "single"
  errors = [([f"--config={tmp_path / 'grid.py'}", "--count=3"], "a sweep over other options"),
            ([f"--config={tmp_path / 'broken.py'}"], "get_sweep() failed: ZeroDivisionError"),
            ([f"--config={tmp_path / 'bad.py'}"], "unknown option 'defense.nope'"),
            ([f"--config={tmp_path / 'twice.py'}"], "repeats an experiment")]
  # One process runs the sweeps in this order (the first one's config.py exists when the second
  # starts); the single run has a process of its own (a process defines one command's flags).
  sweep, again, *bad_runs = run_in_one_process([
      (["gradjax", "sweep", f"--config={tmp_path / 'grid.py'}", f"--output_dir={first}"], tmp_path),
      (["gradjax", "sweep", f"--config={first / 'config.py'}", f"--output_dir={tmp_path / 'again'}"],
       tmp_path),
      *[(["gradjax", "sweep", *args, f"--output_dir={tmp_path / 'bad'}"], tmp_path)
        for args, _ in errors]])
  reconstruct = run_program("reconstruct", f"--config={tmp_path / 'grid.py'}", "--index=1",
                            "--defense=prune:0.5", f"--output_dir={single}")
  for proc in (sweep, reconstruct, again):
    assert proc.returncode == 0, proc.stderr[-2000:]
  rows = json.loads((first / "results.json").read_text())["rows"]
  assert [r["options"] for r in rows] == [
      {"data.index": i, "defense.spec": d} for i in (0, 1) for d in (None, "prune:0.5")]
  assert [(r["config"]["data"]["index"], r["config"]["defense"]["spec"]) for r in rows] == [
      (i, d) for i in (0, 1) for d in (None, "prune:0.5")]
  assert json.loads((single / "metrics.json").read_text())["psnr"] == rows[3]["psnr"]
  again = json.loads((tmp_path / "again" / "results.json").read_text())["rows"]
  assert [r["psnr"] for r in again] == [r["psnr"] for r in rows]
  for (args, message), bad in zip(errors, bad_runs, strict=True):
    lines = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(lines) == 1 and message in lines[0], (args, bad.stderr[-2000:])
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_run_folder_config_reproduces_the_run(tmp_path):
  """--config=<name> with short flags beside it; the run's config.py, read with --config, gives the
  same configuration and the same reconstruction; --config.<path> overrides an option;
  --print_config shows the resolved options and runs nothing; --help groups them by section."""
  first, second = tmp_path / "first", tmp_path / "second"
  proc = run_program("reconstruct.py", "--config=dlg", "--dataset=skimage", "--image_size=16",
                     "--iterations=20", f"--output_dir={first}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  # The run again in a process of its own, then --print_config and --help in one process.
  proc, printed, helped = run_in_one_process([
      (["gradjax", "reconstruct", f"--config={first / 'config.py'}", f"--output_dir={second}"], tmp_path),
      (["gradjax", "reconstruct", f"--config={first / 'config.py'}", "--config.attack.iterations=5",
        "--config.attack.learning_rate=0.5", "--print_config", f"--output_dir={tmp_path / 'never'}"],
       tmp_path),
      (["gradjax", "reconstruct", "--help"], tmp_path)])
  assert proc.returncode == 0, proc.stderr[-2000:]
  options = [(d / "config.py").read_text().split('"""', 1)[1] for d in (first, second)]
  assert options[0] == options[1]
  runs = [json.loads((d / "metrics.json").read_text()) for d in (first, second)]
  assert runs[0]["config"] == runs[1]["config"] and runs[0]["config"]["attack"]["iterations"] == 20
  assert runs[0]["psnr"] == runs[1]["psnr"]
  np.testing.assert_array_equal(np.load(first / "reconstruction.npy"),
                                np.load(second / "reconstruction.npy"))  # bit for bit

  assert printed.returncode == 0, printed.stderr[-2000:]
  assert "c.attack.iterations = 5" in printed.stdout and "c.attack.learning_rate = 0.5" in printed.stdout
  assert not (tmp_path / "never").exists()

  assert helped.returncode == 0
  headers = [line for line in helped.stdout.splitlines() if line.endswith(" options:")]
  assert headers[:3] == ["experiment options:", "data options:", "model options:"], headers
  assert "attack options:" in headers and "--config.attack.iterations" in helped.stdout



@pytest.mark.slow
def test_the_gradjax_command_and_its_subcommands():
  """python -m gradjax: the list of commands (exit 0 with --help, 2 without a command) and an unknown
  command in one line with exit 2 (each command's --help: the examples test)."""
  from gradjax import cli
  gradjax = [sys.executable, "-m", "gradjax"]
  listed = subprocess.run([*gradjax, "--help"], capture_output=True, text=True, timeout=60)
  assert listed.returncode == 0 and all(name in listed.stdout for name in cli.COMMANDS)
  assert subprocess.run(gradjax, capture_output=True, text=True, timeout=60).returncode == 2
  proc = subprocess.run([*gradjax, "reconstruc"], capture_output=True, text=True, timeout=60)
  _assert_one_line_error(proc, "unknown command 'reconstruc'")


def test_the_command_leaves_with_the_interpreters_status_after_every_exit_handler():
  """gradjax.cli's end of process (the interpreter's teardown skipped): the status Python would
  give (0; sys.exit's code; 1 for a message or an uncaught exception, its traceback printed),
  exit handlers registered during the run still run, buffered output is flushed; an interrupt
  before the run handles signals itself is one line and status 130."""
  cases = {
      "pass": (0, "", ""),
      "sys.exit(3)": (3, "", ""),
      "sys.exit('no such capture')": (1, "", "no such capture"),
      "1 / 0": (1, "", "ZeroDivisionError"),
      "atexit.register(lambda: print('handler ran')); print('buffered', end='')": (0, "bufferedhandler ran\n", ""),
      "raise KeyboardInterrupt": (130, "", "error: interrupted"),  # one line
  }
  for body, (code, out, err) in cases.items():
    program = ("import atexit, sys\nfrom gradjax.cli import _run_and_leave\ndef run():\n  "
               f"{body}\n_run_and_leave(run)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert (proc.returncode, proc.stdout) == (code, out) and err in proc.stderr, (body, proc)


@pytest.mark.slow
def test_an_installed_package_runs_without_the_clone(tmp_path):
  """A non-editable build of the package (its wheel's files only, configs included) runs the README's
  main job's configuration from a folder outside the clone."""
  site = tmp_path / "site"
  build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          f"--target={site}", ROOT], capture_output=True, text=True, timeout=600)
  if build.returncode != 0 and "No matching distribution" in build.stderr:
    pytest.skip("no package index to fetch the build backend from")
  assert build.returncode == 0, build.stderr[-2000:]
  assert not (site / "experiments").exists() and (site / "gradjax" / "configs" / "dlg.py").exists()
  assert not (site / "benchmarks").exists()  # measurements live in the clone, not in the wheel
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(site))
  proc = subprocess.run([sys.executable, "-m", "gradjax", "reconstruct", "--config=dlg", "--dataset=skimage",
                         "--print_config"], capture_output=True, text=True, env=env, cwd=tmp_path,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "c.attack.preset = 'dlg'" in proc.stdout
  imported = subprocess.run([sys.executable, "-c", "import gradjax.cli; print(gradjax.cli.__file__)"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
  assert imported.stdout.strip().startswith(str(site)), imported.stdout


# --config's default names each table's protocol (its packaged configuration): a default by design.
PER_PROGRAM = {"config"}

# The options of each module given (JSON list) as JSON: module -> option -> [repr(default), help]. One
# process imports them in turn, taking each one's flags and modules out before the next.
_FLAGS_OF = """
import importlib, json, sys
from absl import flags
out, base = {}, set(flags.FLAGS)
for name in json.loads(sys.argv[1]):
  importlib.import_module(name)
  out[name] = {f.name: [repr(f.default), f.help] for module, fl in flags.FLAGS.flags_by_module_dict().items()
               if not module.startswith("absl") for f in fl}
  for flag in set(flags.FLAGS) - base:
    delattr(flags.FLAGS, flag)
  for module in [m for m in sys.modules if m.startswith(("gradjax.cli", "benchmarks"))]:
    del sys.modules[module]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_each_option_has_one_name_default_and_help_across_commands():
  """Every command's options, the benchmark programs' too: one default and one help per name."""
  import benchmarks
  from gradjax import cli
  seen = {}  # option -> (default, help) -> commands
  modules = {name: f"gradjax.cli.{m}" for name, (m, _) in cli.COMMANDS.items()}
  modules.update({f"benchmarks {name}": f"benchmarks.{m}" for name, (m, _) in benchmarks.PROGRAMS.items()})
  proc = subprocess.run([sys.executable, "-c", _FLAGS_OF, json.dumps(sorted(modules.values()))],
                        capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-1000:]
  options_of = json.loads(proc.stdout)
  for name in sorted(modules):
    for option, (default, help_text) in options_of[modules[name]].items():
      if option not in PER_PROGRAM:
        seen.setdefault(option, {}).setdefault((default, help_text), []).append(name)
  differ = {option: list(v.values()) for option, v in seen.items() if len(v) > 1}
  assert not differ, differ
  assert {"start", "count", "iterations", "dataset", "output_dir"} <= set(seen)


@pytest.mark.slow
def test_the_tables_take_their_protocol_from_a_configuration(tmp_path):
  """dlm-table and text-table read their packaged configuration unless given another; short flags
  override it."""
  proc = run_program("dlm_table.py", "--count=1", "--methods=DLM+", "--iterations=3", "--dataset=skimage",
                     "--print_config")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "c.client.name = 'fedavg'" in proc.stdout and "c.model.name = 'mlp'" in proc.stdout
  assert "c.data.dataset = 'skimage'" in proc.stdout and "c.attack.iterations = 3" in proc.stdout
  # (A run of text-table writing its rows: tests/test_studies.py, text_sapag's recipe.)
  from gradjax import configs
  from gradjax.run import config, text_run
  pool = text_run.load_sentences(config.from_dict(configs.get("sapag_text"))).pool
  (tmp_path / "a_file").write_text("")
  proc, bad, beyond, past, last, twice = run_in_one_process([(["gradjax", "text-table", *args], tmp_path) for args in (
      ["--count=1", "--methods=DLG", "--iterations=2", "--print_config"],
      ["--modality=image", "--model=lenet_zhu", "--dataset=skimage", f"--output_dir={tmp_path / 'bad'}"],
      # More sentences than the corpus has of that length: refused before any is attacked; the
      # last one accepted (refused next for its --output_dir, a file).
      ["--count=100000", "--methods=SAPAG", "--searches=tokens", f"--output_dir={tmp_path / 'beyond'}"],
      [f"--start={pool - 1}", "--count=2", "--methods=SAPAG", f"--output_dir={tmp_path / 'past'}"],
      [f"--start={pool - 1}", "--count=1", "--methods=SAPAG", f"--output_dir={tmp_path / 'a_file'}"],
      ["--count=1", "--methods=SAPAG", "--searches=tokens,tokens", f"--output_dir={tmp_path / 'twice'}"])])
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "c.data.modality = 'text'" in proc.stdout and "c.data.dataset = 'pydoc'" in proc.stdout
  assert "c.attack.iterations = 2" in proc.stdout
  _assert_one_line_error(bad, "text")
  _assert_one_line_error(beyond, "--count=100000")
  _assert_one_line_error(past, f"--start={pool - 1} --count=2: the client's batch is sentences {pool}..{pool}, "
                         f"but corpus 'pydoc' has {pool} distinct sentences")
  _assert_one_line_error(last, "is a file, not a folder")
  _assert_one_line_error(twice, "distinct searches")
  assert not (tmp_path / "beyond").exists() and not (tmp_path / "twice").exists()


def test_a_sweeps_print_config_holds_the_experiments_it_would_run(tmp_path):
  """``gradjax sweep --print_config``: the printed file's get_sweep() is the declared sweep (a product
  of images and defenses), and for an image sweep the images --start and --count choose."""
  import runpy
  path = tmp_path / "product.py"
  path.write_text("from gradjax.run import config\n\ndef get_config():\n  return config.defaults()\n\n"
                  "def get_sweep():\n  return config.product(config.sweep('data.index', range(2)),\n"
                  "                        config.sweep('defense.spec', [None, 'prune:0.2']))\n")
  product, images = run_in_one_process([(["gradjax", "sweep", *args, "--print_config"], tmp_path) for args in (
      [f"--config={path}"], ["--start=4", "--count=3"])])
  for k, proc in enumerate((product, images)):
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp_path / f"printed_{k}.py").write_text(proc.stdout)
  declared = runpy.run_path(str(path))["get_sweep"]()
  assert runpy.run_path(str(tmp_path / "printed_0.py"))["get_sweep"]() == declared
  assert runpy.run_path(str(tmp_path / "printed_1.py"))["get_sweep"]() == [
      {"data.index": i} for i in (4, 5, 6)]


def test_config_file_of_a_variant_is_the_file(tmp_path):
  """``--config=file.py:arg`` (get_config(arg)'s variant): sweep reads get_sweep() from file.py."""
  from absl import flags
  from ml_collections import config_flags
  from gradjax.cli import common
  path = tmp_path / "variants.py"
  path.write_text("from gradjax import config\n\n\ndef get_config(v='a'):\n  return config.defaults()\n")
  for value in (str(path), f"{path}:b"):
    holder = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=holder)
    holder(["prog", f"--config={value}"])
    assert common.config_file(holder["config"]) == str(path)
    assert common.config_variant(holder["config"]) == (None if value == str(path) else "b")


VARIANT_CONFIG = """
from gradjax import config


def get_config(variant):
  return config.overridden({"data.dataset": "skimage", "data.image_size": 16, "attack.iterations": 2,
                            "output.lpips": "none", "attack.preset": variant.split("-")[0]})


def get_sweep(variant):
  return config.sweep("data.index", [0, 1]) if variant.endswith("-both") else None
"""


@pytest.mark.slow
def test_a_study_recipe_variant_chooses_its_sweep(tmp_path):
  """``--config=file.py:arg`` gives ``arg`` to get_sweep as to get_config; a variant without a sweep
  (None) takes --start/--count, and --start/--count replace a declared sweep over images."""
  path = tmp_path / "recipe.py"
  path.write_text(VARIANT_CONFIG)
  cases = [("idlg-both", [], [0, 1], "idlg"), ("idlg-both", ["--start=1", "--count=1"], [1], "idlg"),
           ("dlg-none", ["--count=1"], [0], "dlg")]
  procs = run_in_one_process([(["gradjax", "sweep", f"--config={path}:{variant}", *extra,
                                f"--output_dir={tmp_path / f'{variant}{len(extra)}'}"], tmp_path)
                              for variant, extra, _, _ in cases])
  for (variant, extra, indices, attack), proc in zip(cases, procs, strict=True):
    out = tmp_path / f"{variant}{len(extra)}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["index"] for r in rows] == indices and rows[0]["config"]["attack"]["preset"] == attack


# Files an example names that the user writes or an earlier example makes.
PLACEHOLDERS = ("my_sweep.py", "runs/dlg_lenet_zhu_skimage_0/config.py")


def _examples():
  """Every ``gradjax <command> ...`` line of the commands' docstrings and of the README's code
  blocks (continuations joined, comments dropped): (where, argv)."""
  texts = []
  for path in sorted(glob.glob(os.path.join(ROOT, "gradjax", "cli", "*.py"))):
    with open(path, encoding="utf-8") as fh:
      source = fh.read()
    if source.startswith('"""'):
      texts.append((os.path.basename(path), source.split('"""')[1]))
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
    readme = fh.read()
  texts.append(("README.md", "\n".join(readme.split("```")[1::2])))  # inside code blocks only
  out = []
  for where, text in texts:
    for line in text.replace("\\\\\n", " ").replace("\\\n", " ").splitlines():
      line = line.strip()
      if re.match(r"gradjax [a-z-]+( |$)", line):
        argv = shlex.split(line, comments=True)
        if not any(p in a for a in argv for p in PLACEHOLDERS) and argv not in [a for _, a in out]:
          out.append((where, argv))  # an example shown twice runs once
  return out


@pytest.mark.slow
def test_every_command_helps_and_every_example_and_study_variant_parses():
  """Each command's ``--help`` exits 0 with its options grouped; each example of the help and the
  README, as shown, and each variant of each study's config.py, with its command's recorded
  arguments, resolves its configuration (``--print_config``: nothing runs) from the clone's root: an
  example that names a missing file or an unknown flag fails here, and a variant that sets an option
  its command does not read is refused (not recorded and ignored). The cases of one command share a
  process."""
  import runpy
  from gradjax import cli
  by_command = collections.defaultdict(list)
  for where, argv in _examples():
    by_command[argv[1]].append((where, [*argv, "--print_config"]))
  assert len(by_command) >= 8 and sum(map(len, by_command.values())) >= 30
  recipes = sorted(glob.glob(os.path.join(ROOT, "experiments", "studies", "*", "config.py")))
  for path in recipes:
    for name, (command, _, _) in runpy.run_path(path)["VARIANTS"].items():
      program, *args = shlex.split(command)
      by_command[program].append((f"{os.path.relpath(path, ROOT)}:{name}", [
          "gradjax", program, *args, f"--config={os.path.relpath(path, ROOT)}:{name}", "--print_config"]))
  assert recipes and set(by_command) <= set(cli.COMMANDS), set(by_command) - set(cli.COMMANDS)
  failed = []
  for name in cli.COMMANDS:
    cases = [("--help", ["gradjax", name, "--help"]), *by_command[name]]
    for (where, argv), proc in zip(cases, run_in_one_process([(a, ROOT) for _, a in cases])):
      if where == "--help":
        grouped = "run settings:" in proc.stdout or "program options:" in proc.stdout
        if proc.returncode != 0 or not grouped or "Traceback" in proc.stderr:
          failed.append((name, "--help", proc.returncode, proc.stderr[-500:]))
        listed = re.findall(r"^  (--\S+?):", proc.stdout, flags=re.M)
        if len(listed) != len(set(listed)):  # each flag listed once
          failed.append((name, "--help lists twice", sorted(f for f in set(listed) if listed.count(f) > 1)))
        if name == "reconstruct":  # the flags and the registries' choices
          assert all(f in proc.stdout for f in ("--attack", "--model", "--resume", "--overwrite",
                                                "--output_dir", "--restarts")), proc.stdout[-2000:]
          assert "gaussian_kernel_mean" in proc.stdout and "resnetD-W" in proc.stdout
      elif proc.returncode != 0 or "def get_config():" not in proc.stdout:
        failed.append((where, shlex.join(argv), proc.returncode, proc.stderr[-500:]))
  assert not failed, failed


@pytest.mark.slow
def test_help_shows_the_defaults_the_program_runs():
  """Each option's default in ``--help`` is the value ``--print_config`` resolves with nothing given
  (a table program's packaged protocol, not the schema's default); where that is None, the help
  shows no default or says where the value comes from (a program of captures: their files)."""
  from gradjax import cli
  checked = 0
  for name in cli.COMMANDS:  # a command's cases share a process
    helped, printed = run_in_one_process([(["gradjax", name, flag], ROOT)
                                          for flag in ("--help", "--print_config")])
    if printed.returncode != 0 or "def get_config():" not in printed.stdout:
      continue  # a program that needs arguments to resolve (e.g. --audit_dir): its help only
    values = dict(re.findall(r"^  c\.(\S+) = (.*)$", printed.stdout, flags=re.M))
    text = re.sub(r"\n {4,}", " ", helped.stdout)  # absl's wrapped lines joined
    for path, default in re.findall(r"--config\.(\S+?): .*?(?:\(default: (.*?)\))?$", text, flags=re.M):
      if path not in values:
        continue
      if values[path] == "None":
        assert not default or not default[0] in "'\"0123456789-[(", (name, path, default)
      else:
        assert default == values[path], (name, path, default, values[path])
        checked += 1
  assert checked > 100


@pytest.mark.slow
def test_a_missing_configuration_or_an_override_without_one_reads_as_the_user_meant(tmp_path):
  """--config naming no file: one line naming the file and the packaged names; --config.<path> without
  --config overrides the defaults (the packaged ``defaults``)."""
  missing, shown = run_in_one_process([(argv, tmp_path) for argv in (
      ["gradjax", "reconstruct", "--config=configs/nope.py", f"--output_dir={tmp_path / 'a'}"],
      ["gradjax", "reconstruct", "--config.attack.iterations=5", "--print_config"])])
  _assert_one_line_error(missing, "no file configs/nope.py")
  assert "inverting_gradients" in missing.stderr and "Relative path" not in missing.stderr
  assert shown.returncode == 0 and "c.attack.iterations = 5" in shown.stdout, shown.stderr[-1000:]


def test_the_lpips_hint_is_the_readmes(monkeypatch):
  """The messages that ask for the lpips extra give the README's command (lpips.INSTALL)."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
    assert lpips.INSTALL in fh.read()
  monkeypatch.setattr(lpips, "available", lambda net: False)
  assert lpips.INSTALL in pipeline.lpips_absent("alex", object(), (64, 64))
  with pytest.raises(ValueError, match=re.escape(lpips.INSTALL)):
    config.check(config.from_options({"output.lpips": "alex"}))


@pytest.mark.slow
def test_the_tables_refuse_what_they_would_ignore_or_overwrite(tmp_path):
  """Options a program does not read, empty items, a resume into another program's folder and a
  file beside the results file: one line and exit 2 each, and the user's files as they were."""
  (tmp_path / "a_run").mkdir()  # a finished reconstruct run
  (tmp_path / "a_run" / "config.py").write_text("# Command: gradjax reconstruct\n")
  (tmp_path / "a_run" / "metrics.json").write_text("{}")
  (tmp_path / "labels.md").write_text("my notes")
  (tmp_path / "itemsfile").mkdir()  # a file where a table keeps its items/ folder
  (tmp_path / "itemsfile" / "items").write_text("mine")
  (tmp_path / "stopped").mkdir()  # an interrupted reconstruct run: its saved state, no config.py yet
  (tmp_path / "stopped" / "state.npz").write_bytes(b"a reconstruct's state")
  (tmp_path / "a_stopped_sweep").mkdir()  # an interrupted sweep: its claim and items, no config.py yet
  (tmp_path / "a_stopped_sweep" / ".gradjax-claim").write_text("# Command: gradjax sweep --count=4\n")
  (tmp_path / "a_stopped_sweep" / "items").mkdir()
  _bad_files(tmp_path)  # good.npz: an image model's checkpoint
  (tmp_path / "swept.py").write_text("from gradjax.run import config\ndef get_config():\n"
                                     "  return config.defaults()\ndef get_sweep():\n  return [{'seed': 1}]\n")
  mnist = models.create("mlp", jax.random.key(0), input_shape=(28, 28, 1), num_classes=10)
  checkpoint.save(tmp_path / "mnist.npz", mnist.variables, {
      "model": "mlp", "num_classes": 10, "input_shape": [28, 28, 1], "dataset": "mnist"})
  cases = [
      (["label-accuracy", "--count=1", "--checkpoint=x.npz"], "Unknown command line flag 'checkpoint'"),
      (["label-accuracy", "--count=1", "--weights=w.safetensors"], "Unknown command line flag 'weights'"),
      (["label-recovery", "--count=1", "--index=5"], "Unknown command line flag 'index'"),
      (["label-recovery", "--count=1", "--model=gpt"], "gradjax label-recovery reads image models"),
      (["label-recovery", "--count=1", f"--output={tmp_path / 'labels.json'}"], "labels.md exists"),
      (["label-recovery", "--count=1", f"--output={tmp_path / 'labels.md'}", "--overwrite"],
       "name the results' file .json"),
      (["defense-sweep", "--count=1", "--defense=prune:0.3"], "Unknown command line flag 'defense'"),
      (["defense-sweep", "--count=1", "--defenses=none;;prune:0.3"], "without empty ones"),
      (["defense-sweep", "--count=1", "--defenses=none,prune:0.3"], "'none' is no defense to combine"),
      (["dlm-table", "--count=1", "--attack=idlg"], "the table's attacks are its --methods"),
      (["dlm-table", "--count=1", "--psnr_threshold=-5"], "--psnr_threshold must be positive"),
      (["dlm-table", "--count=1", "--modality=text"], "for text use gradjax text-table"),
      (["audit", f"--audit_dir={tmp_path}", "--config.execution.clients_per_run=0"],
       "clients_per_run must be at least 1"),
      (["audit", f"--audit_dir={tmp_path}", "--config.model.rename=(=x"], "bad rename rule"),
      (["defense-sweep", "--count=1", "--modality=text"], "for text use gradjax text-table"),
      (["defense-sweep", "--count=1", "--config.utility.epochs=3"], "which only --utility trains"),
      (["defense-sweep", "--count=1", "--utility", "--config.utility.model=transformer"],
       "the utility model trains on the table's images"),
      (["sweep", "--count=1", "--index=5"], "a sweep's images are --start and --count"),
      (["sweep", "--count=1", "--resume", f"--output_dir={tmp_path / 'a_run'}"],
       "holds a run of gradjax reconstruct, not of gradjax sweep"),
      (["sweep", "--count=1", "--resume", f"--output_dir={tmp_path / 'nothing'}"], "holds no saved state"),
      (["sweep", "--count=1", "--resume", f"--output_dir={tmp_path / 'stopped'}"],
       "holds an interrupted run of another program"),
      (["defense-sweep", "--count=1", "--resume", f"--output_dir={tmp_path / 'a_stopped_sweep'}"],
       "holds a run of gradjax sweep, not of gradjax defense-sweep"),
      (["reconstruct", "--overwrite", f"--output_dir={tmp_path / 'a_stopped_sweep'}"],
       "holds a run of gradjax sweep, not of gradjax reconstruct"),
      (["sweep", "--count=1", "--modality=text"], "for text use gradjax text-table"),
      (["sweep", "--count=1", "--overwrite", f"--output_dir={tmp_path / 'itemsfile'}"],
       "items is not a folder; the table keeps its experiments in one of that name"),
      (["sweep", "--count=1", "--seed=2147483648"], "--seed must lie in a 32-bit integer's range"),
      (["text-table", "--count=1", "--modality=image"], "reads text: add --modality=text"),
      (["text-table", "--count=1", "--attack=dager"], "the table's attacks are its --methods"),
      (["text-table", "--count=1", "--batch_size=2"], "the table's clients hold one sentence each"),
      (["text-table", "--count=1", "--index=3"], "the table's sentences are --start and --count"),
      (["text-table", "--count=1", "--examples=-1"], "--examples=-1"),
      (["text-table", "--count=1", f"--checkpoint={tmp_path / 'good.npz'}", "--output_dir=tt"],
       "holds no text model's vocabulary"),
      (["train", "--config.training.lr_gamma=0.5"], "give them too"),
      (["train", "--dataset=cifar10", "--config.training.test_dataset=cifar10"], "is the training set"),
      (["train", f"--config={tmp_path / 'swept.py'}"], "declares a sweep (get_sweep()): gradjax sweep runs it"),
      (["train", "--epochs=2", "--config.training.lr_milestones=2"], "lie after the last of --epochs=2"),
      (["train", "--config.client.share_statistics=True"], "share_statistics=True is for attacks"),
      (["train", "--config.client.train_mode=True", "--model=lenet_zhu", "--dataset=skimage",
        "--config.training.train_count=8", "--config.training.test_count=4", "--batch_size=4",
        "--output_dir=tm"], "updates BatchNorm statistics, which lenet_zhu has none of"),
      (["batch-table", f"--checkpoint={tmp_path / 'good.npz'}", "--variants=none", "--tv=0.1"],
       "which --variants=none skips"),
      (["batch-table", f"--checkpoint={tmp_path / 'good.npz'}", "--head=trained", "--output_dir=bt"],
       "use --head=fresh"),
      (["batch-table", f"--checkpoint={tmp_path / 'mnist.npz'}", "--output_dir=bt"],
       "batch-table attacks CIFAR-10's 32x32x3 images"),
  ]
  for program in dict.fromkeys(args[0] for args, _ in cases):  # one process per program (its flags)
    mine = [(args, message) for args, message in cases if args[0] == program]
    results = run_in_one_process([(["gradjax", *args], tmp_path) for args, _ in mine])
    for (args, message), proc in zip(mine, results, strict=True):
      _assert_one_line_error(proc, message, args)
  assert (tmp_path / "labels.md").read_text() == "my notes"
  assert (tmp_path / "itemsfile" / "items").read_text() == "mine"
  assert sorted(os.listdir(tmp_path / "a_run")) == ["config.py", "metrics.json"]
  assert os.listdir(tmp_path / "stopped") == ["state.npz"]
  assert sorted(os.listdir(tmp_path / "a_stopped_sweep")) == [".gradjax-claim", "items"]
  assert not (tmp_path / "nothing").exists() and not (tmp_path / "runs").exists()
  assert not (tmp_path / "tt").exists()  # refused before the untrained rows ran
  assert not (tmp_path / "tm").exists() and not (tmp_path / "bt").exists()


BAD_SWEEPS = {  # get_sweep()'s items -> the one line gradjax sweep refuses them with
    "[{'data.index': 1.5}]": "data.index takes int, got 1.5",
    "[{'data.index': True}]": "data.index takes int, got True",
    "[{}]": "an empty sweep item",
    "[{'training.lr': 0.1}]": "sets training.lr, which gradjax sweep does not read",
    "[{'client.local_epochs': 3}]": "--config.client.local_epochs does not apply to --client=fedsgd",
    "[{'data.index': 0, 'seed': 1}, {'seed': 1, 'data.index': 0}]": "the sweep repeats an experiment",
}


@pytest.mark.slow
def test_a_declared_sweeps_bad_items_and_the_flags_they_would_override_are_refused(tmp_path):
  cases = []
  for k, (items, message) in enumerate(BAD_SWEEPS.items()):
    (tmp_path / f"s{k}.py").write_text(
        "from gradjax.run import config\ndef get_config():\n  return config.defaults()\n"
        f"def get_sweep():\n  return {items}\n")
    cases.append(([f"--config={tmp_path / f's{k}.py'}"], message))
  (tmp_path / "seeds.py").write_text("from gradjax.run import config\ndef get_config():\n"
                                     "  return config.defaults()\ndef get_sweep():\n"
                                     "  return [{'seed': 1}, {'seed': 2}]\n")
  cases.append(([f"--config={tmp_path / 'seeds.py'}", "--seed=7"], "--seed: the configuration's get_sweep() sets it"))
  results = run_in_one_process([(["gradjax", "sweep", *args, f"--output_dir={tmp_path / f'out{k}'}"], tmp_path)
                                for k, (args, _) in enumerate(cases)])
  for k, ((args, message), proc) in enumerate(zip(cases, results, strict=True)):
    _assert_one_line_error(proc, message, args)
    assert not (tmp_path / f"out{k}").exists()


def test_a_folder_where_a_program_writes_its_file_is_refused_before_it_runs(tmp_path):
  """--overwrite into a folder whose results.json is a folder: one line and exit 2 before any
  attack (it crashed after all of them)."""
  out = tmp_path / "sweep"
  (out / "results.json").mkdir(parents=True)
  proc = run_program("sweep", "--count=1", "--iterations=2", "--lpips=none", "--overwrite",
                     f"--output_dir={out}")
  _assert_one_line_error(proc, "results.json is a folder where the program writes its file")
  assert "restart 0" not in proc.stdout + proc.stderr


def test_overwrite_never_replaces_another_programs_run(tmp_path):
  """--overwrite into a folder that holds another program's run (its config.py names gradjax
  sweep): one line and exit 2, the sweep's files as they were (reconstruct replaced its config.py
  and left its results beside its own)."""
  out = tmp_path / "sweep"
  out.mkdir()
  (out / "config.py").write_text("# Command: gradjax sweep --count=1\n")
  (out / "results.json").write_text("{}")
  proc = run_program("reconstruct", "--iterations=2", "--lpips=none", "--overwrite", f"--output_dir={out}")
  _assert_one_line_error(proc, "holds a run of gradjax sweep, not of gradjax reconstruct")
  assert sorted(p.name for p in out.iterdir()) == ["config.py", "results.json"]
  assert (out / "config.py").read_text() == "# Command: gradjax sweep --count=1\n"


def test_a_sweep_past_the_dataset_is_refused_before_its_first_experiment(tmp_path):
  """scikit-image has 16 photos: --start=15 --count=3 reads past them; one line before any
  experiment (the first ran, then the sweep failed, leaving its items)."""
  proc = run_program("sweep", "--start=15", "--count=3", "--iterations=2", "--lpips=none",
                     f"--output_dir={tmp_path / 'past'}")
  _assert_one_line_error(proc, "reads image 17, past the 16 images of skimage")
  assert not (tmp_path / "past").exists()


@pytest.mark.parametrize("name, args, message", [
    ("defense_sweep", ["--defenses=none;gaussian:0.01;none"], "--defenses repeats 'none'"),
    ("defense_sweep", ["--defenses=gaussian:0.01;gaussian:1e-2"], "repeats 'gaussian:0.01' (as 'gaussian:1e-2')"),
    ("dlm_table", ["--methods=DLG;DLG"], "--methods repeats 'DLG'"),
])
def test_a_table_refuses_a_row_given_twice(tmp_path, name, args, message):
  """A table's row list naming one row twice (the same spec, or one defense spelt two ways): one
  line, exit 2, before anything runs (the row was printed twice, read back from one item)."""
  proc = run_program(name, "--count=1", "--iterations=2", *args, f"--output_dir={tmp_path / 'table'}")
  _assert_one_line_error(proc, message)


def test_images_too_small_to_score_are_refused_before_the_attack(tmp_path):
  """A folder of 2x40-pixel images at their native size: SSIM cannot score them, said in one line
  before anything is compiled (the whole attack ran first, leaving its state)."""
  from PIL import Image
  folder = tmp_path / "thin"
  folder.mkdir()
  Image.fromarray(np.zeros((2, 40, 3), np.uint8)).save(folder / "a.png")
  out = tmp_path / "run"
  proc = run_program("reconstruct", "--dataset=folder", f"--data_dir={folder}", "--model=mlp",
                     "--config.model.num_classes=2", "--iterations=2", "--lpips=none",
                     f"--output_dir={out}")
  _assert_one_line_error(proc, "SSIM needs images of at least 3x3 pixels, got 2x40")
  assert "restart 0" not in proc.stderr and not out.exists()


def test_an_interrupt_before_the_run_is_one_line_and_status_130(tmp_path):
  """Ctrl-C while the program imports or sets up (before the run saves on signals itself), also
  when an extension module's import turns it into an ImportError: one line, status 130, the exit
  handlers run (a claimed folder is released)."""
  code = textwrap.dedent("""
      import atexit, os, sys
      from gradjax.cli import _run_and_leave
      def run():
        atexit.register(lambda: os.remove(sys.argv[2]))  # the run's own exit handler
        if sys.argv[1] == "import":
          try:
            raise KeyboardInterrupt
          except KeyboardInterrupt:
            raise ImportError("numpy.core.multiarray failed to import")
        raise KeyboardInterrupt
      _run_and_leave(run)
      """)
  for how in ("plain", "import"):
    claim = tmp_path / f"claim_{how}"
    claim.write_text("")
    proc = subprocess.run([sys.executable, "-c", code, how, str(claim)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130 and proc.stderr.strip().splitlines() == [
        "error: interrupted"], proc.stderr
    assert not claim.exists()


def test_a_folder_is_claimed_by_one_run_and_its_claim_names_the_command(tmp_path, monkeypatch):
  """Of two runs claiming one folder at once, the second's exclusive claim fails (its caller then
  takes the next default folder, or refuses an --output_dir); the claim records the command, which
  recorded_command reads until config.py records it."""
  from gradjax.cli import common  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, "argv", ["gradjax", "--count=4"])
  monkeypatch.setattr(common, "PROGRAM", ["gradjax", "sweep"])
  assert common._claim(str(tmp_path)) and not common._claim(str(tmp_path))
  assert common.recorded_command(str(tmp_path)) == ["gradjax", "sweep", "--count=4"]
  (tmp_path / "config.py").write_text("# Command: gradjax sweep --count=5\nc = 1\n")
  assert common.recorded_command(str(tmp_path)) == ["gradjax", "sweep", "--count=5"]
  common._leave(str(tmp_path), created=False)  # a finished run's folder keeps no claim
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.py"]
