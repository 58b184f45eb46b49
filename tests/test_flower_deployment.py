"""End to end on Flower's Deployment Runtime: a SuperLink and SuperNodes on 127.0.0.1 (free ports),
the example App (examples/flower_audit: PyTorch clients, FedAvg wrapped by AuditStrategy), then the
audit of what the server recorded.

Needs flwr and torch (marker ``deployment``). Every process the test starts is stopped, whatever
happens, by killing its process group (a SuperNode and the apps it launched).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import importlib.util

import numpy as np
import pytest
import skimage.metrics

from gradjax import data, interop, verdict
from gradjax.integrations import audit

# PyTorch is imported inside the test, which runs in a process of its own (marker ``isolated``):
# with torch loaded, a later XLA compilation in the same pytest process segfaulted.
pytestmark = [
    pytest.mark.deployment, pytest.mark.isolated,
    pytest.mark.usefixtures("optimised_step"),  # the gate's and the audit's 2000 iterations
    pytest.mark.skipif(importlib.util.find_spec("flwr") is None or importlib.util.find_spec("torch") is None,
                       reason="needs flwr and torch"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_audit")
BIN = os.path.dirname(sys.executable)
LR = 0.1
NO_INSTALL = "--disable-runtime-dependency-installation"


def free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def wait_for_port(port, process, log, timeout=60.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise RuntimeError(f"exited with {process.returncode}: {open(log).read()[-2000:]}")
    with socket.socket() as s:
      if s.connect_ex(("127.0.0.1", port)) == 0:
        return
    time.sleep(0.2)
  raise TimeoutError(f"nothing listens on {port} after {timeout:.0f} s: {open(log).read()[-2000:]}")


def stop(processes):
  """SIGTERM to every process group, then SIGKILL to whatever is left after 10 s."""
  for p in processes:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGTERM)
  deadline = time.monotonic() + 10
  for p in processes:
    try:
      p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass
  for p in processes:
    try:
      os.killpg(p.pid, signal.SIGKILL)  # the group: apps a SuperNode launched too
    except ProcessLookupError:
      pass
    p.wait(timeout=10)


@contextlib.contextmanager
def _federation(tmp_path, node_configs=("", "")):
  """A SuperLink and a SuperNode per entry of ``node_configs`` (extra node config of that node:
  partition k of len(node_configs)), each stopped with its process group at the end."""
  link, *nodes = free_ports(1 + len(node_configs))
  home = tmp_path / "flwr_home"
  home.mkdir()
  (home / "config.toml").write_text(
      '[superlink]\ndefault = "local-deployment"\n\n[superlink.local-deployment]\n'
      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
  env = {**os.environ, "FLWR_HOME": str(home), "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
  processes = []

  def launch(name, *args):
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as fh:
      p = subprocess.Popen([os.path.join(BIN, args[0]), *args[1:]], stdout=fh, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, env=env, cwd=tmp_path, start_new_session=True)
    processes.append(p)
    return p, str(log)

  try:
    # The ServerApp runs in this environment: the SuperLink would install the App's dependencies
    # (the latest torch) into a new one for every run (examples/flower_audit/README.md).
    p, log = launch("superlink", "flower-superlink", "--insecure", NO_INSTALL, "--host", "127.0.0.1",
                    "--port", str(link))
    wait_for_port(link, p, log)
    for k, port in enumerate(nodes):
      p, log = launch(f"supernode{k}", "flower-supernode", "--insecure", "--superlink",
                      f"127.0.0.1:{link}", "--port", str(port), "--node-config",
                      f"partition-id={k} num-partitions={len(nodes)} {node_configs[k]}".strip())
      wait_for_port(port, p, log)
    yield env
  finally:
    stop(processes)
    assert all(p.poll() is not None for p in processes)


def flwr_run(env, run_config, cwd):
  """``flwr run`` of the example App on the federation of ``env``; its completed process."""
  return subprocess.run([os.path.join(BIN, "flwr"), "run", APP, "local-deployment", "--stream",
                         "--run-config", run_config], env=env, capture_output=True, text=True,
                        timeout=480, cwd=cwd)


@pytest.mark.slow
def test_a_federation_recorded_audited_and_gated(tmp_path):
  """Three SuperNodes, one round, the run's ``gate = true``: each gated client attacks its own
  update before it leaves (gradjax.integrations.flower.leakage_mod). The first trains undefended:
  its reply is withheld (the server records a failed client and its reason). The second prunes
  70 % of its update and declares it: its reply goes out with its score. The third opts out of
  the gate (node config ``gate=false``): its reply goes out as trained. Every recorded reply is
  exactly what one PyTorch SGD step (then the declared pruning) from the recorded global model
  gives; ``audit --config.attack.adaptive=True``: no row fails, the withheld update is listed as
  withheld, every update is recomputed in JAX, the ungated client's example is recovered, and only
  the pruned client's row is adapted to its declared defense. Every process started is stopped,
  by its process group. (Rounds after the first and the global model recorded for each:
  test_flower, on the same strategy without the deployment's processes; a second round here cost
  45 s of one core.)"""
  import torch
  sys.path.insert(0, APP)
  try:
    from flower_audit import task
  finally:
    sys.path.remove(APP)
  with _federation(tmp_path, ("", "defense='prune:0.7'", "gate=false")) as env:
    audit_dir = tmp_path / "audit"
    proc = flwr_run(env, f"audit-dir='{audit_dir}' dataset='skimage' num-server-rounds=1 lr={LR} "
                    "batch-size=1 samples-per-client=1 local-epochs=1 model='lenet_zhu' gate=true "
                    "gate-threshold=10.0 gate-iterations=2000 gate-budget-s=240.0", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

  found = audit.captures(audit_dir)
  assert [c.round for c in found] == [1, 1, 1]
  withheld = next(c for c in found if c.error)
  assert audit.WITHHELD in withheld.error, withheld.info
  pruned = [c for c in found if c.info.get("declarations", {}).get("defense") == "prune:0.7"]
  assert len(pruned) == 1
  open_ = [c for c in found if c.client not in {withheld.client, pruned[0].client}]
  assert len(open_) == 1
  assert [c.info["data_indices"] for c in (*pruned, *open_)] == [[1], [2]]
  failures = json.loads((audit_dir / "round_001" / "round.json").read_text())["failures"]
  assert len(failures) == 1 and audit.WITHHELD in next(iter(failures.values()))
  for c in pruned:
    assert c.info["metrics"]["gradjax-audited"] == 1 and c.info["metrics"]["gradjax-leak-db"] < 10.0
  for c in pruned + open_:
    assert c.error is None
    sent = interop.read(os.path.join(c.folder, audit.WEIGHTS)).tensors
    net = task.build("lenet_zhu", 0)
    net.load_state_dict({k: torch.tensor(v) for k, v in sent.items()})
    x, y = task.load("skimage", None, c.info["data_indices"])
    task.train(net, x, y, epochs=1, batch_size=1, lr=LR)
    want = {k: v.numpy() for k, v in net.state_dict().items()}
    if c in pruned:
      want = task.defended(sent, want, "prune:0.7")
    got = interop.read(os.path.join(c.folder, audit.OBSERVATION))
    assert got.metadata["num_samples"] == "1" and float(got.metadata["local_lr"]) == LR
    for name, value in want.items():
      np.testing.assert_array_equal(got.tensors[name], value)

  settings = audit.settings(options={"data.dataset": "skimage", "data.image_size": 32,
                                     "output.lpips": "none", "attack.iterations": 2000,
                                     "attack.adaptive": True})
  rows = audit.audit(audit_dir, settings, log=lambda s: None)
  assert audit.failed_rows(rows) == [], rows
  assert (1, withheld.client) in {(r["round"], r["client"]) for r in rows if r.get("withheld")}
  attacked = [r for r in rows if not r.get("withheld")]
  assert len(attacked) == 2 and all(r["attack"] == "idlg" and r["label_accuracy"] == 1.0
                                    and r["verdict"] in verdict.STATUSES for r in attacked), rows
  index = json.loads((audit_dir / "index.json").read_text())
  assert index["rounds"][0]["withheld"] == [withheld.client] and index["rounds"][0]["failed"] == []
  assert [r.get("psnr") for r in index["rows"]] == [r.get("psnr") for r in rows]
  open_rows = [r for r in attacked if (r["round"], r["client"]) in {(c.round, c.client) for c in open_}]
  assert len(open_rows) == 1 and open_rows[0]["psnr"] > 20, rows
  truth = data.load("skimage", indices=open_[0].info["data_indices"], image_size=(32, 32))
  run = next(r["run"] for r in open_rows if r["round"] == open_[0].round)
  rec = np.load(audit_dir / run / "reconstruction.npy")
  assert rec.shape == truth.x.shape
  assert open_rows[0]["psnr"] == pytest.approx(skimage.metrics.peak_signal_noise_ratio(
      truth.x[0].astype(np.float64), rec[0].astype(np.float64), data_range=1), rel=1e-6)
  for r in attacked:
    metrics = json.loads((audit_dir / r["run"] / "metrics.json").read_text())
    # Every update, the pruned ones with their declared pruning, is the one recomputed in JAX.
    assert metrics["checks"]["fidelity"]["ok"], metrics["checks"]
    assert metrics["checks"]["fidelity"]["relative_error"] < 1e-4, metrics["checks"]
    client = next(c for c in found if (c.round, c.client) == (r["round"], r["client"]))
    assert bool(metrics["adaptation"]) == (client in pruned), (r, metrics["adaptation"])


@pytest.mark.slow
def test_a_malicious_server_is_refused_by_the_gated_client_and_read_out_of_the_other(tmp_path):
  """The example's ServerApp with ``malicious-bins=32``: it hides an imprint of 32 bins, thresholds
  from photos 8-15 (which it holds), in the first layer of the mlp-64 it sends, and records what it
  sent. The gated node (node config ``gate=true``) refuses the model before training; the other
  trains one step on its four photos. The audit lists the first as refused, not failed, and reads
  the imprint out of the second's reply before the honest attacks: its examples alone in their bins
  come back exactly (PSNR against the photos, by NumPy)."""
  with _federation(tmp_path, ("gate=true", "gate=false")) as env:
    audit_dir = tmp_path / "audit"
    proc = flwr_run(env, f"audit-dir='{audit_dir}' dataset='skimage' num-server-rounds=1 lr={LR} "
                    "batch-size=4 samples-per-client=4 local-epochs=1 model='mlp-64' malicious-bins=32 "
                    "server-images='8:16'", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  found = audit.captures(audit_dir)
  refused = [c for c in found if c.error]
  trained = [c for c in found if not c.error]
  assert len(refused) == 1 and audit.MODEL_REFUSED in refused[0].error, [c.info for c in found]
  assert len(trained) == 1 and trained[0].info["data_indices"] == [4, 5, 6, 7]
  rows = audit.audit(audit_dir, audit.settings(options={"data.dataset": "skimage",
                                                        "data.image_size": 32,
                                                        "output.lpips": "none",
                                                        "attack.iterations": 3}),
                     log=lambda s: None)
  assert audit.failed_rows(rows) == [], rows
  assert [(r.get("refused"), r["attack"]) for r in rows if r["client"] == refused[0].client] == [(True, None)]
  read = [r for r in rows if r["client"] == trained[0].client][0]
  assert read["attack"] == "imprint" and read["verdict"] == "leak", read
  truth = data.load("skimage", indices=[4, 5, 6, 7], image_size=(32, 32)).x.astype(np.float64)
  server = data.load("skimage", indices=range(8, 16), image_size=(32, 32)).x
  from gradjax import malicious
  thresholds = malicious.imprint_thresholds(server.reshape(8, -1).mean(1), 32)
  bins = np.searchsorted(thresholds, truth.reshape(4, -1).mean(1))
  alone = [k for k in range(4) if bins[k] > 0 and list(bins).count(bins[k]) == 1]
  rec = np.load(audit_dir / read["run"] / "reconstruction.npy").astype(np.float64)
  psnr = [10 * np.log10(1 / np.mean((r - t) ** 2)) for r, t in zip(rec, truth)]
  assert alone and all(psnr[k] > 60 for k in alone), (psnr, bins)
  index = json.loads((audit_dir / "index.json").read_text())
  assert index["rounds"][0]["refused"] == [refused[0].client] and index["rounds"][0]["failed"] == []
