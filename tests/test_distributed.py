"""Runs over several processes on this machine: two ``gradjax`` processes on 127.0.0.1 (free ports,
gloo CPU collectives) against the same run in one process; a killed process; a run that never forms.
Every process a test starts is stopped when it ends, whether it passed or not."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from gradjax.cli import distributed
from conftest import assert_one_line_error

pytestmark = pytest.mark.slow
# The test run's persistent compilation cache (conftest): each process loads what another compiled
# (every process writes its own entries, gradjax.distributed). The one-process run of a comparison
# goes first: the two processes then start on its entries. Measured on one core, the sweep and
# batch-table tests 57.9 and 58.2 s -> 48.2 and 51.0 s, audit and label-accuracy 50.4 -> 41.7 s.
CACHE = os.environ.get("GRADJAX_TEST_XLA_CACHE", "")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _gradjax(args, **kw):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True, **kw)


@contextlib.contextmanager
def _processes(args, n=2, heartbeat_s=None, per_process=None):
  """``n`` processes of ``gradjax args`` joined at a free port; yields the Popen objects; kills every
  one still running (and its process group: process 0's coordination-service child) at the end."""
  port = _free_port()
  procs = []
  try:
    for k in range(n):
      launch = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={n}",
                f"--process_id={k}", "--initialization_timeout_s=60",
                *([] if heartbeat_s is None else [f"--heartbeat_timeout_s={heartbeat_s}"])]
      procs.append(_gradjax([*args, *launch, *((per_process or {}).get(k, []))]))
    yield procs
  finally:
    for p in procs:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
      with contextlib.suppress(Exception):
        p.communicate(timeout=10)


def _finish(procs, timeout=300):
  return [(p.wait(timeout=timeout), *p.communicate()) for p in procs]


def _service_children(port_hint: str, wait_s: float = 10) -> list[str]:
  """Process 0's coordination-service children still running after ``wait_s`` (they leave a second
  after process 0)."""
  deadline = time.monotonic() + wait_s
  while True:
    out = subprocess.run(["pgrep", "-af", "gradjax.cli.distributed"], capture_output=True,
                         text=True).stdout
    left = [line for line in out.splitlines() if port_hint in line]
    if not left or time.monotonic() > deadline:
      return left
    time.sleep(0.2)


def test_one_sharded_attack_over_two_processes_equals_one_process(tmp_path):
  # Successive halving too: after 20 iterations the best 2 of 4 restarts (ranked on every process
  # from the gathered objectives) continue, split over the devices again. An MLP and Adam: what is
  # compared is the split, whose programs each process compiles afresh (L-BFGS's sharded runs over
  # two processes in the killed-process test below).
  args = ["reconstruct", "--model=mlp-64", "--image_size=16", "--attack=adam_dlg", "--iterations=40", "--restarts=4", "--config.execution.shard=True", "--config.execution.halving_rounds=2",
          "--lpips=none", "--seed=3"]
  with _processes([*args, f"--output_dir={tmp_path / 'two'}"]) as procs:
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
  assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
  assert "wrote" in out0 and "wrote" not in out1  # process 0 alone writes
  # One process with two CPU devices runs the same programs on the same per-device restarts.
  one = subprocess.run([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}",
                        f"--output_dir={tmp_path / 'one'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(
                           [os.environ.get("XLA_FLAGS", ""),
                            "--xla_force_host_platform_device_count=2"]).strip()), timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  two, single = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("two", "one"))
  assert (two["devices"], two["processes"], single["devices"], single["processes"]) == (2, 2, 2, 1)
  assert two["best_restart"] == single["best_restart"]
  np.testing.assert_allclose([two["psnr"], two["loss"]], [single["psnr"], single["loss"]],
                             rtol=1e-6)
  np.testing.assert_allclose(np.load(tmp_path / "two" / "reconstruction.npy"),
                             np.load(tmp_path / "one" / "reconstruction.npy"), atol=1e-6)


def test_sweep_splits_its_images_over_two_processes(tmp_path):
  args = ["sweep", "--count=2", "--iterations=20", "--lpips=none"]
  one = subprocess.run([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}",
                        f"--output_dir={tmp_path / 'one'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  with _processes([*args, f"--output_dir={tmp_path / 'two'}"]) as procs:
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
  assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
  assert "experiment 2/2 (1) on process 1" in err1 and "writes the table" in err1
  assert not list((tmp_path / "two" / "items").glob("*state*"))  # each process removed its states
  two, single = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("two", "one"))
  assert two["processes"] == 2 and single["processes"] == 1
  for a, b in zip(two["rows"], single["rows"], strict=True):  # each image ran alone on a process
    assert a["index"] == b["index"]
    np.testing.assert_allclose([a["psnr"], a["loss"]], [b["psnr"], b["loss"]], rtol=1e-6)


def _recorded_federation(folder, clients_=(11, 12, 13), lost=14, lr=0.1):
  """A recorded round 1 (the capture format of :mod:`gradjax.integrations.audit`): lenet_zhu's initial weights,
  and from each of ``clients_`` the weights after one SGD step on scikit-image photo ``client %
  16``; client ``lost`` never replied."""
  import jax
  from gradjax import clients, data, interop, models
  from gradjax.integrations import audit
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  mapping = interop.zoo_mapping(model)
  round_dir = folder / "round_001"
  round_dir.mkdir(parents=True)
  weights = str(round_dir / "weights.safetensors")
  audit.write_round_weights(weights, interop.variables_to_torch(model.variables, mapping),
                            {"model": "lenet_zhu"})
  for node in clients_:
    photo = data.load("skimage", indices=[node % 16], image_size=(32, 32))
    obs = clients.fedavg(model.apply_fn, model.variables, photo.x, photo.y,
                         clients.LocalTraining(learning_rate=lr))
    after = jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u), model.variables["params"],
                         obs.gradient)
    audit.write_capture(round_dir / f"client_{node}", weights, interop.params_to_torch(after, mapping),
                        {"round": 1, "client": str(node), "data_indices": [node % 16]},
                        {"model": "lenet_zhu", "num_samples": 1, "local_lr": lr, "local_epochs": 1,
                         "input_shape": "32,32,3"})
  audit.write_round_summary(round_dir, 1, len(clients_) + 1, {lost: "no reply"})


def test_audit_splits_its_captures_over_two_processes(tmp_path):
  """Captures 0 and 2 on process 0, capture 1 on process 1: the index process 0 writes equals the
  one-process audit's, the client that never replied is a failed row there too (exit 1)."""
  for name in ("one", "two"):
    _recorded_federation(tmp_path / name)
  args = ["audit", "--attacks=dlg", "--iterations=20", "--lpips=none", "--dataset=skimage",
          "--image_size=32"]
  one = subprocess.run([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}",
                        f"--audit_dir={tmp_path / 'one'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert one.returncode == 1, one.stderr[-2000:]
  with _processes([*args, f"--audit_dir={tmp_path / 'two'}"]) as procs:
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
  assert rc1 == 0 and "attacked 1 of 3 captures" in out1, err1[-2000:]
  assert rc0 == 1 and "1 of 4 rows failed" in err0.strip().splitlines()[-1], err0[-2000:]
  two, single = (json.loads((tmp_path / d / "index.json").read_text())["rows"] for d in ("two", "one"))
  assert [(r["client"], r["attack"]) for r in two] == [("11", "dlg"), ("12", "dlg"), ("13", "dlg"),
                                                       ("14", None)]
  assert [(r["client"], r["attack"], r.get("error")) for r in two] == \
      [(r["client"], r["attack"], r.get("error")) for r in single]
  for a, b in zip(two[:3], single[:3]):  # each capture attacked alone on its process
    np.testing.assert_allclose([a["psnr"], a["loss"]], [b["psnr"], b["loss"]], rtol=1e-6)
    assert (tmp_path / "two" / a["run"] / "report.html").is_file()


def test_batch_table_splits_its_attacks_over_two_processes(tmp_path):
  """The ablation's attacks (variant tv on batches 0 and 1: batch 0 on process 0, batch 1 on
  process 1) over two processes: the tables process 0 writes equal the one-process run's."""
  import jax
  from gradjax import checkpoint, data, models
  if data.default_data_dir() is None:
    pytest.skip("no shared data folder (CIFAR-10)")
  meta = {"model": "resnet8", "num_classes": 10, "input_shape": [32, 32, 3], "normalization": "none"}
  model = models.create("resnet8", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  checkpoint.save(tmp_path / "resnet8.npz", model.variables, meta)  # BatchNorm statistics at init
  args = ["batch-table", f"--checkpoint={tmp_path / 'resnet8.npz'}", "--count=2", "--batch_size=2",
          "--config.sampling.classes_per_batch=1", "--config.sampling.pool=40", "--config.attack.aux=4", "--iterations=3", "--variants=tv"]
  one = subprocess.run([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}",
                        f"--output_dir={tmp_path / 'one'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  with _processes([*args, f"--output_dir={tmp_path / 'two'}"]) as procs:
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
  assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
  assert "process 0 writes the tables" in err1
  two, single = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("two", "one"))
  assert two["labels"] == single["labels"] and two["batches"] == single["batches"]
  for key in ("tv",):
    a, b = two["ablation_rows"][key], single["ablation_rows"][key]
    assert [r["batch"] for r in a] == [r["batch"] for r in b] == [0, 1]
    np.testing.assert_allclose([r["psnr"] for r in a], [r["psnr"] for r in b], rtol=1e-6)
    np.testing.assert_allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=1e-6)


def test_label_accuracy_splits_its_clients_over_two_processes(tmp_path):
  """Clients k on process k mod 2: process 0 writes what one process writes. (label-recovery
  splits its batches and gathers them the same way.)"""
  args = ["label-accuracy", "--count=5", "--dataset=skimage"]
  one = subprocess.run([sys.executable, "-m", "gradjax", *args, f"--compilation_cache={CACHE}",
                        f"--output={tmp_path / 'one.json'}"], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  with _processes([*args, f"--output={tmp_path / 'two.json'}"]) as procs:
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
  assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
  assert out1 == ""  # process 0 prints the result
  two, single = (json.loads((tmp_path / f"{d}.json").read_text()) for d in ("two", "one"))
  assert two["correct"] == single["correct"] and len(two["correct"]) == 5
  assert two["accuracy"] == single["accuracy"]


def test_a_run_on_one_machine_notices_a_lost_process_in_seconds():
  assert distributed.heartbeat_timeout("127.0.0.1:1234") == distributed.LOCAL_HEARTBEAT_TIMEOUT_S == 10
  for local in ("localhost:80", "127.0.1.1:5", "[::1]:7"):
    assert distributed.heartbeat_timeout(local) == 10
  for cluster in ("node-3:1234", "10.0.0.7:80", None):  # None: SLURM, Open MPI or a TPU pod detected
    assert distributed.heartbeat_timeout(cluster) == distributed.CLUSTER_HEARTBEAT_TIMEOUT_S == 60


def test_a_killed_process_stops_the_other_and_resume_finishes(tmp_path):
  out = tmp_path / "run"
  args = ["reconstruct", "--model=mlp-64", "--image_size=16", "--iterations=300", "--config.execution.chunk=10", "--restarts=2", "--config.execution.shard=True",
          "--lpips=none", "--save_every_s=0", f"--output_dir={out}"]
  with _processes(args) as procs:  # the default heartbeat timeout of a run on one machine
    deadline = time.monotonic() + 120
    while not (out / "state.npz").exists():
      assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()[1][-2000:]
      time.sleep(0.1)
    port = [a for a in procs[0].args if a.startswith("--coordinator_address")][0].rsplit(":", 1)[1]
    os.killpg(procs[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    rc, _, err = _finish(procs[:1], timeout=60)[0]
    took = time.monotonic() - killed
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    print(f"process 0 exited {took:.1f} s after process 1 was killed: {errors}")
    assert rc == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith("error: process 0 of 2: process 1 stopped") and "--resume" in errors[0]
    assert took < distributed.LOCAL_HEARTBEAT_TIMEOUT_S + 10
    assert not _service_children(f"127.0.0.1:{port}")
  assert (out / "state.npz").exists() and not (out / "metrics.json").exists()
  # Another number of processes would split the restarts otherwise: refused in one line.
  alone = subprocess.run([sys.executable, "-m", "gradjax", *args, "--resume",
                          f"--compilation_cache={CACHE}"],
                         capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                         timeout=300)
  assert_one_line_error(alone, "'2 devices of 2 processes' there, '1 devices of 1 processes' here")
  with _processes([*args, "--resume"]) as procs:
    (rc0, out0, err0), (rc1, _, err1) = _finish(procs)
  assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
  results = json.loads((out / "metrics.json").read_text())
  assert results["resumed"] and results["iterations"] == 300 and not (out / "state.npz").exists()


@pytest.mark.parametrize("mistake, message", [
    (["--dataset=cifar10", "--data_dir=/nonexistent"], "error:"),
    (["--local_device_ids=3"], "error: --local_device_ids=3 chooses accelerators; this process runs on the CPU"),
    # Another image and defense on process 1: its flags, which process 0's results would not record.
    (["--index=1", "--defense=gaussian:1"],
     "error: process 1 was started with other flags than process 0: --defense=gaussian:1 (process 0: ")])
def test_an_error_on_one_process_is_named_by_the_others(tmp_path, mistake, message):
  with _processes(["reconstruct", "--iterations=5", "--config.execution.shard=True", f"--output_dir={tmp_path}"],
                  per_process={1: mistake}) as procs:
    (rc0, _, err0), (rc1, _, err1) = _finish(procs, timeout=120)
  assert rc1 == 2 and err1.strip().splitlines()[-1].startswith(message), err1[-2000:]
  last = err0.strip().splitlines()[-1]
  assert rc0 == 2 and last.startswith("error: process 0 of 2: process 1 stopped with an error:"), err0
  assert "Traceback" not in err0 + err1


@pytest.mark.parametrize("process_id", [0, 1])  # the coordinator's, or one that cannot reach it
def test_a_run_that_does_not_form_is_one_line(process_id):
  port = _free_port()
  proc = _gradjax(["reconstruct", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                   f"--process_id={process_id}", "--initialization_timeout_s=3"])
  try:
    rc = proc.wait(timeout=120)
    _, err = proc.communicate()
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert rc == 2 and len(errors) == 1 and "did not form within 3 s" in errors[0], err[-2000:]
  assert "Traceback" not in err
  assert not _service_children(f"127.0.0.1:{port}")


@pytest.mark.parametrize("program, given, missing", [
    ("reconstruct", ["--coordinator_address=127.0.0.1:1", "--num_processes=2"], "--process_id missing"),
    ("sweep", ["--coordinator_address=127.0.0.1:1", "--process_id=1"], "--num_processes missing"),
])  # fmt: skip
def test_launch_flags_given_in_part_name_what_is_missing(program, given, missing):
  """Outside a cluster, some of the three launch flags: one line naming the others (JAX's own
  'no cluster detected' reads as if none was given), exit 2."""
  proc = subprocess.run([sys.executable, "-m", "gradjax", program, *given], capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and missing in errors[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
