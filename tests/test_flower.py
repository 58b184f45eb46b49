"""gradjax.integrations.flower and gradjax.integrations.audit: a Flower strategy recorded by AuditStrategy, against the plain
strategy on the same replies, and the audit of what it recorded.

The clients here are gradjax's own FedAvg clients behind an in-process grid (no network, no torch):
each node gets the global ``state_dict`` arrays, takes one SGD step on one scikit-image photo and
replies with its weights, ``num-examples`` and the photo's index.
"""

import json
import os

import jax
import numpy as np
import pytest
import skimage.metrics

flwr = pytest.importorskip("flwr")
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.exception import InconsistentMessageReplies  # noqa: E402
from flwr.serverapp.strategy import FedAvg, Strategy  # noqa: E402
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from gradjax import attacks, auto, clients, data, defenses, interop, metrics, models, presets, verdict  # noqa: E402
from gradjax.integrations import audit  # noqa: E402
from gradjax.run import pipeline  # noqa: E402
from gradjax.integrations.flower import DECLARATIONS, AuditStrategy, declarations, declared  # noqa: E402

MODEL = "lenet_zhu"
SHAPE = (32, 32, 3)
LR = 0.1


@pytest.fixture(autouse=True)
def run_identity(monkeypatch):
  """Messages need the run they belong to, which a real ServerApp process sets."""
  monkeypatch.setattr(TaskIdentity, "_run_id", 1)
  monkeypatch.setattr(TaskIdentity, "_task_id", 1)
  monkeypatch.setattr(TaskIdentity, "_node_id", 0)


@pytest.fixture(scope="module")
def net():
  model = models.create(MODEL, jax.random.key(0), input_shape=SHAPE, num_classes=10)
  return model, interop.zoo_mapping(model)


def to_record(tensors):
  return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in tensors.items()})


class Grid:
  """An in-process grid: nodes 11 and 12 (or ``nodes``), each a gradjax FedAvg client on photo
  ``node % 16``; ``spoil`` changes a node's reply to test malformed ones."""

  def __init__(self, net, nodes=(11, 12), spoil=None, samples=1, defenses=None, restarts=None,
               gated=None, dp_sgd=None):
    self.model, self.mapping = net
    self.nodes, self.spoil, self.samples = list(nodes), spoil or {}, samples
    self.defenses = defenses or {}  # node -> the defense it applies to its update and declares
    self.dp_sgd = dp_sgd or {}  # node -> the DP-SGD (clients.DPSGD) its step runs and it declares
    self.restarts = restarts or {}  # node -> the id it registers under after the first round
    self.gated = set(gated or ())  # nodes whose replies carry the gate's metrics (leakage_mod's)

  def get_node_ids(self):
    return list(self.nodes)

  def reply(self, message):
    node = message.metadata.dst_node_id
    if self.spoil.get(node) == "error":
      return Message(Error(code=0, reason="ClientApp crashed"), reply_to=message)
    sent = {k: a.numpy() for k, a in message.content["arrays"].items()}
    config = message.content["config"]
    local = clients.LocalTraining(batch_size=config.get("batch-size"), learning_rate=float(config["lr"]))
    try:
      variables = interop.variables_from_torch(sent, self.mapping, self.model.variables, "sent")
    except ValueError as e:  # e.g. a global model holding NaN: the client fails
      return Message(Error(code=0, reason=str(e)), reply_to=message)
    samples = self.samples.get(node, 1) if isinstance(self.samples, dict) else self.samples
    indices = [(node + k) % 16 for k in range(samples)]
    photo = data.load("skimage", indices=indices, image_size=SHAPE[:2])
    obs = clients.fedavg(self.model.apply_fn, variables, photo.x, photo.y, local,
                         dp_sgd=self.dp_sgd.get(node), key=jax.random.key(node))
    if node in self.defenses:
      obs = defenses.parse(self.defenses[node]).apply(obs)
    after = jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u), variables["params"], obs.gradient)
    returned = interop.params_to_torch(after, self.mapping)
    if self.spoil.get(node) == "nan":
      returned["fc.0.bias"] = np.full_like(returned["fc.0.bias"], np.nan)
    if self.spoil.get(node) == "missing":
      del returned["body.0.weight"]
    if self.spoil.get(node) == "shape":
      returned["fc.0.bias"] = returned["fc.0.bias"][:5]
    metrics = {"num-examples": samples, "data-indices": indices}
    if self.spoil.get(node) == "nan-loss":  # a diverged client: kept as it replied
      metrics["train-loss"] = float("nan")
    if self.spoil.get(node) == "nan-count":
      metrics["num-examples"] = float("nan")
    if node in self.gated:
      metrics.update({"gradjax-audited": 1, "gradjax-leak-db": 3.5, "gradjax-psnr": 14.0,
                      "gradjax-leak": 0})
    content = RecordDict({"arrays": to_record(returned), "metrics": MetricRecord(metrics)})
    if node in self.defenses:
      content[DECLARATIONS] = declarations(defense=self.defenses[node])
    if node in self.dp_sgd:  # as an Opacus client states what make_private took
      content[DECLARATIONS] = declarations(dp_sgd_max_norm=self.dp_sgd[node].max_norm,
                                           dp_sgd_noise_multiplier=self.dp_sgd[node].noise_multiplier,
                                           dp_sgd_sampling_rate=0.01, dp_sgd_steps=200)
    if self.spoil.get(node) == "declarations":
      content[DECLARATIONS] = ConfigRecord({"defence": "prune:0.5"})
    return Message(content, reply_to=message)

  def send_and_receive(self, messages, timeout=None):
    replies = []
    for m in messages:
      node = m.metadata.dst_node_id
      m.metadata.__dict__["_message_id"] = f"message-to-{node}"  # as a grid names what it sends
      if self.spoil.get(node) == "unavailable":  # the SuperLink replies for a node gone silent
        replies.append(create_message_error_unavailable_res_message(m.metadata, "node_unavail"))
      elif self.spoil.get(node) != "silent":
        replies += [self.reply(m)] * (2 if self.spoil.get(node) == "twice" else 1)
    # A SuperNode restarted between rounds registers again, under a new node id.
    self.nodes = [self.restarts.get(n, n) for n in self.nodes]
    return replies


def start(strategy, net, grid, rounds=2, **config):
  model, mapping = net
  initial = to_record(interop.variables_to_torch(model.variables, mapping))
  return strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                        train_config=ConfigRecord({"lr": LR, **config}))


def fedavg():
  return FedAvg(fraction_evaluate=0.0)


@pytest.mark.slow
def test_aggregate_unchanged_and_files_exact(net, tmp_path):
  grid = Grid(net)
  plain = start(fedavg(), net, grid)
  wrapped = AuditStrategy(fedavg(), tmp_path / "audit",
                          metadata={"model": MODEL, "input_shape": "32,32,3"})
  recorded = start(wrapped, net, grid)
  want, got = plain.arrays, recorded.arrays
  assert list(want.keys()) == list(got.keys())
  for name in want.keys():
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())  # bit-identical

  found = audit.captures(wrapped.audit_dir)
  assert [(c.round, c.client) for c in found] == [(1, "11"), (1, "12"), (2, "11"), (2, "12")]
  # Round 2's files hold exactly what round 1's aggregate was and what the clients replied.
  model, mapping = net
  sent = interop.read(os.path.join(found[2].folder, audit.WEIGHTS)).tensors
  photo = data.load("skimage", indices=[11], image_size=SHAPE[:2])
  variables = interop.variables_from_torch(sent, mapping, model.variables, "sent")
  obs = clients.fedavg(model.apply_fn, variables, photo.x, photo.y, clients.LocalTraining(learning_rate=LR))
  after = interop.params_to_torch(jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u),
                                               variables["params"], obs.gradient), mapping)
  observation = interop.read(os.path.join(found[2].folder, audit.OBSERVATION))
  assert observation.tensors.keys() == after.keys()
  for name, value in after.items():
    np.testing.assert_array_equal(observation.tensors[name], value)
  assert observation.metadata["kind"] == "weights" and observation.metadata["num_samples"] == "1"
  assert float(observation.metadata["local_lr"]) == LR and observation.metadata["model"] == MODEL
  assert found[2].info["data_indices"] == [11] and found[2].info["config"]["server-round"] == 2
  # The import reads a capture back into the observation of one SGD step.
  imported = interop.load(os.path.join(found[2].folder, audit.WEIGHTS),
                          os.path.join(found[2].folder, audit.OBSERVATION))
  assert imported.observation.local == clients.LocalTraining(learning_rate=LR)
  for a, b in zip(jax.tree.leaves(imported.observation.gradient), jax.tree.leaves(obs.gradient)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


@pytest.mark.slow
def test_a_round_where_only_some_clients_run_the_gate_still_aggregates(net, tmp_path):
  """Node 11 runs the gate (its metrics carry GATE_METRICS), node 12 does not. Flower's FedAvg
  refuses replies whose metrics differ in keys; behind AuditStrategy the round aggregates to the
  model FedAvg gives when neither runs the gate, node 12's metrics completed as not audited."""
  plain = start(fedavg(), net, Grid(net), rounds=1)
  with pytest.raises(InconsistentMessageReplies, match="same keys"):
    fedavg().aggregate_train(1, [Grid(net, gated={11}).reply(m) for m in _train_messages(net)])
  wrapped = AuditStrategy(fedavg(), tmp_path / "audit",
                          metadata={"model": MODEL, "input_shape": "32,32,3"})
  mixed = start(wrapped, net, Grid(net, gated={11}), rounds=1)
  for name in plain.arrays.keys():
    np.testing.assert_array_equal(mixed.arrays[name].numpy(), plain.arrays[name].numpy())
  metrics = mixed.train_metrics_clientapp[1]
  assert metrics["gradjax-audited"] == 0.5 and metrics["gradjax-leak-db"] == 1.75, metrics
  found = audit.captures(wrapped.audit_dir)  # recorded as the clients replied
  assert [("gradjax-audited" in c.info["metrics"]) for c in found] == [True, False]
  # Recording nothing (audit_dir None), the round aggregates the same.
  unrecorded = AuditStrategy(fedavg(), None)
  bare = start(unrecorded, net, Grid(net, gated={11}), rounds=1)
  for name in plain.arrays.keys():
    np.testing.assert_array_equal(bare.arrays[name].numpy(), plain.arrays[name].numpy())
  assert unrecorded.audit_dir is None and unrecorded.failures == {1: {}}


@pytest.mark.slow
def test_clients_of_different_sizes_aggregate_and_keep_their_data_indices(net, tmp_path):
  """Clients of 1 and 2 examples whose replies carry their data indices: FedAvg's metric average
  cannot take lists of different lengths; behind AuditStrategy the indices are recorded and taken
  out of the metrics it aggregates, and the model is FedAvg's weighted mean (1/3, 2/3) of the
  clients' weights."""
  grid = Grid(net, samples={11: 1, 12: 2})
  with pytest.raises(ValueError):
    fedavg().aggregate_train(1, [grid.reply(m) for m in _train_messages(net)])
  wrapped = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL, "input_shape": "32,32,3"})
  result = start(wrapped, net, grid, rounds=1)
  found = audit.captures(wrapped.audit_dir)
  assert [c.info["data_indices"] for c in found] == [[11], [12, 13]]
  assert "data-indices" not in result.train_metrics_clientapp[1]
  returned = [interop.read(os.path.join(c.folder, audit.OBSERVATION)).tensors for c in found]
  for name in result.arrays.keys():
    np.testing.assert_allclose(result.arrays[name].numpy(),
                               (returned[0][name] + 2 * returned[1][name]) / 3, rtol=1e-6, atol=1e-7)


def _train_messages(net):
  model, mapping = net
  initial = to_record(interop.variables_to_torch(model.variables, mapping))
  return [Message(RecordDict({"arrays": initial, "config": ConfigRecord({"lr": LR})}),
                  dst_node_id=node, message_type="train") for node in (11, 12)]


@pytest.mark.slow
def test_existing_audit_dir_is_never_reused(net, tmp_path):
  (tmp_path / "audit").mkdir()
  (tmp_path / "audit" / "earlier.txt").write_text("a previous run")
  strategy = AuditStrategy(fedavg(), tmp_path / "audit")
  assert strategy.audit_dir == str(tmp_path / "audit-1")
  start(strategy, net, Grid(net), rounds=1)
  assert (tmp_path / "audit" / "earlier.txt").read_text() == "a previous run"
  assert len(audit.captures(tmp_path / "audit-1")) == 2


class Keep(Strategy):
  """A strategy that aggregates nothing: malformed replies reach the recorder as they are."""

  def __init__(self):
    self.inner = FedAvg(fraction_evaluate=0.0)

  def configure_train(self, server_round, arrays, config, grid):
    return self.inner.configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round, replies):
    return None, None

  def configure_evaluate(self, server_round, arrays, config, grid):
    return []

  def aggregate_evaluate(self, server_round, replies):
    return None

  def summary(self):
    pass


def test_declarations_are_checked():
  record = declarations(model="lenet_zhu", defense="prune:0.7", local_lr=0.1, train=None)
  assert dict(record) == {"model": "lenet_zhu", "defense": "prune:0.7", "local_lr": 0.1}
  assert declared(RecordDict({DECLARATIONS: record})) == dict(record)
  assert declared(RecordDict({"config": ConfigRecord({"defense": "prune:0.7"})})) == {}
  with pytest.raises(ValueError, match="unknown declaration"):
    declarations(defence="prune:0.7")
  with pytest.raises(ValueError, match="input shape is written"):
    declarations(input_shape=(32, 32, 3))
  assert dict(declarations(dp_sgd_max_norm=1.0, dp_sgd_steps=50)) == {"dp_sgd_max_norm": 1.0,
                                                                      "dp_sgd_steps": 50}
  with pytest.raises(ValueError, match="'dp_sgd_steps' must be an integer"):
    declarations(dp_sgd_max_norm=1.0, dp_sgd_steps=2.5)
  with pytest.raises(ValueError, match="not its clipping bound"):
    declarations(dp_sgd_noise_multiplier=1.0)
  poisson = dict(dp_sgd_max_norm=1.0, dp_sgd_sampling_rate=0.25, dp_sgd_poisson=True)
  assert dict(declarations(**poisson)) == poisson  # Opacus' default sampling, its rate
  with pytest.raises(ValueError, match="not its rate dp_sgd_sampling_rate"):
    declarations(dp_sgd_max_norm=1.0, dp_sgd_poisson=True)


@pytest.mark.slow
def test_each_client_declares_its_defense_and_the_audit_adapts_to_it(net, tmp_path):
  """Two clients, one pruning its update at 70 % and declaring it in its reply: the server records
  each client's own declaration (in its capture's files too), the pruned capture passes its fidelity
  check with the declared defense applied, and ``--config.attack.adaptive=True`` adapts that row alone."""
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net, defenses={12: "prune:0.7"}), rounds=1)
  found = {c.client: c for c in audit.captures(strategy.audit_dir)}
  assert found["12"].info["declarations"] == {"defense": "prune:0.7"}
  assert found["12"].info["metadata"]["defense"] == "prune:0.7"
  observation = interop.read(os.path.join(found["12"].folder, audit.OBSERVATION))
  assert observation.metadata["defense"] == "prune:0.7"
  assert "defense" not in found["11"].info["metadata"] and found["11"].info["declarations"] == {}
  settings = audit.settings(options={"data.dataset": "skimage", "data.image_size": 32,
                                     "attack.iterations": 5, "output.lpips": "none",
                                     "attack.adaptive": True})
  rows = {r["client"]: r for r in audit.audit(strategy.audit_dir, settings, log=lambda s: None)}
  assert all(r.get("error") is None and r["verdict"] in verdict.STATUSES for r in rows.values()), rows
  adaptation = {c: json.loads((tmp_path / "audit" / r["run"] / "metrics.json").read_text())["adaptation"]
                for c, r in rows.items()}
  assert adaptation["11"] is None and adaptation["12"], adaptation


@pytest.mark.slow
def test_each_client_declares_its_dp_sgd_and_the_audit_reads_it(net, tmp_path):
  """Two clients, one running DP-SGD (clipping bound 0.05 against a gradient norm of about 23, noise
  multiplier 1e-6) and declaring it in its reply: the server records the declaration; the audit,
  told nothing of DP-SGD, attacks that client clipped as it clipped (its fidelity check skipped, as
  no plain step's), reports that client's own (ε, δ) (gradjax.privacy's) and the other's capture
  plainly (its fidelity check passed)."""
  from gradjax import privacy
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net, dp_sgd={12: clients.DPSGD(0.05, 1e-6)}), rounds=1)
  found = {c.client: c for c in audit.captures(strategy.audit_dir)}
  assert found["12"].info["declarations"] == {"dp_sgd_max_norm": 0.05, "dp_sgd_noise_multiplier": 1e-6,
                                              "dp_sgd_sampling_rate": 0.01, "dp_sgd_steps": 200}
  assert interop.read(os.path.join(found["12"].folder, audit.OBSERVATION)).metadata[
      "dp_sgd_max_norm"] == "0.05"
  settings = audit.settings(("dlg",), {"data.dataset": "skimage", "data.image_size": 32,
                                       "attack.iterations": 2, "output.lpips": "none",
                                       "attack.adaptive": True})
  rows = {r["client"]: r for r in audit.audit(strategy.audit_dir, settings, log=lambda s: None)}
  assert all(r.get("error") is None for r in rows.values()), rows
  got = {c: json.loads((tmp_path / "audit" / r["run"] / "metrics.json").read_text())
         for c, r in rows.items()}
  assert got["12"]["attack"]["objective"] == "clipped_gradient"
  assert got["12"]["checks"]["fidelity"]["ok"] is None
  assert got["12"]["privacy"]["epsilon"] == privacy.epsilon(0.01, 1e-6, 200, 1e-5).epsilon
  assert got["11"]["attack"]["objective"] == "gradient" and got["11"]["privacy"] is None
  assert got["11"]["checks"]["fidelity"]["ok"] is True


@pytest.mark.slow
def test_a_global_model_holding_nan_is_said_and_fails_the_run(net, tmp_path):
  """FedAvg aggregates node 11's reply that holds NaN: round 2's global model holds NaN; the wrapper
  records which tensor and raise_if_failed fails the run (one client trained in each round)."""
  strategy = AuditStrategy(fedavg(), tmp_path / "audit")
  start(strategy, net, Grid(net, spoil={11: "nan"}), rounds=2)
  sent = interop.read(tmp_path / "audit" / "round_002" / audit.WEIGHTS).tensors
  assert not np.all(np.isfinite(sent["fc.0.bias"]))  # what FedAvg made of the reply
  assert strategy.broken == {2: "fc.0.bias"}
  with pytest.raises(RuntimeError, match=r"global model of round\(s\) 2 held NaN"):
    strategy.raise_if_failed()


@pytest.mark.slow
def test_malformed_replies_are_reported_not_fatal(net, tmp_path):
  spoil = {11: "nan", 12: "missing", 13: "shape", 14: "error", 16: "nan-loss", 17: "nan-count",
           18: "declarations"}
  grid = Grid(net, nodes=(11, 12, 13, 14, 15, 16, 17, 18), spoil=spoil)
  strategy = AuditStrategy(Keep(), tmp_path / "audit")
  start(strategy, net, grid, rounds=1)
  errors = {c.client: c.error for c in audit.captures(strategy.audit_dir)}
  assert errors["11"] == "malformed reply: tensor 'fc.0.bias' holds NaN or infinity"
  assert errors["12"] == "malformed reply: missing tensor 'body.0.weight'"
  assert errors["13"] == "malformed reply: tensor 'fc.0.bias' has shape (5,), the server sent (10,)"
  assert errors["14"] == "the client failed: ClientApp crashed"
  assert errors["15"] is None and errors["16"] is None
  assert errors["17"].startswith("malformed reply metrics: ")
  assert errors["18"].startswith("malformed declarations: unknown declaration(s) defence")
  found = {c.client: c for c in audit.captures(strategy.audit_dir)}
  assert found["16"].info["metrics"]["train-loss"] == "nan"
  for client in ("11", "12", "13", "14", "17", "18"):
    folder = os.path.join(strategy.audit_dir, "round_001", f"client_{client}")
    assert sorted(os.listdir(folder)) == [audit.CAPTURE]
  rows = audit.audit(strategy.audit_dir, audit.settings(options={"attack.iterations": 2}),
                     log=lambda s: None)
  assert [r["client"] for r in rows if r.get("error")] == ["11", "12", "13", "14", "17", "18"]
  assert [r["attack"] for r in rows if not r.get("error")] == ["idlg", "idlg"]


@pytest.mark.slow
def test_rounds_clients_and_disk_cap(net, tmp_path):
  strategy = AuditStrategy(fedavg(), tmp_path / "a", rounds=[2], clients=1)
  start(strategy, net, Grid(net, nodes=(12, 11, 13)), rounds=2)
  assert [(c.round, c.client) for c in audit.captures(strategy.audit_dir)] == [(2, "11")]
  capped = AuditStrategy(fedavg(), tmp_path / "b", max_bytes=400_000)  # about 6.5 files of 61 kB
  start(capped, net, Grid(net), rounds=3)
  files = {os.stat(os.path.join(d, f)).st_ino: os.path.getsize(os.path.join(d, f))
           for d, _, names in os.walk(capped.audit_dir) for f in names}  # hard links once
  assert capped.bytes_written <= capped.max_bytes and sum(files.values()) <= capped.max_bytes
  assert 0 < len(audit.captures(capped.audit_dir)) < 6
  with pytest.raises(ValueError, match="clients must be positive"):
    AuditStrategy(fedavg(), tmp_path / "c", clients=0)
  with pytest.raises(TypeError, match="wraps a flwr.serverapp.strategy.Strategy"):
    AuditStrategy(object(), tmp_path / "c")


@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_attack_recorded_updates_in_background(net, tmp_path):
  """One SGD step of batch 1 is lr times a gradient: iDLG from the recorded files alone, attacked in
  a separate process while the federation goes on, scored on the photos the clients reported. It
  must do as well as iDLG on the exact FedSGD gradient of the same model, photo and key."""
  settings = audit.settings(options={"data.dataset": "skimage", "data.image_size": 32,
                                     "output.lpips": "none", "attack.iterations": 2000})
  one = FedAvg(fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1)
  strategy = AuditStrategy(one, tmp_path / "audit", attack=settings,
                           metadata={"model": MODEL, "input_shape": "32,32,3"})
  nodes = (12,)  # one client (an index of several clients: test_audit_program)
  start(strategy, net, Grid(net, nodes=nodes), rounds=1)
  assert len(strategy.processes) == 1
  assert strategy.processes[0].wait(timeout=600) == 0
  index = json.loads((tmp_path / "audit" / "round_001" / "index.json").read_text())["rows"]
  assert [(r["client"], r["attack"]) for r in index] == [("12", "idlg")]
  model, _ = net
  for node, row in zip(nodes, index):
    photo = data.load("skimage", indices=[node % 16], image_size=SHAPE[:2])
    exact = clients.fedsgd(model.apply_fn, model.variables, photo.x, photo.y)
    ref = attacks.reconstruct(presets.idlg(iterations=2000), model.apply_fn, exact,
                              pipeline.experiment_keys(0, 0)[1], input_shape=SHAPE,
                              bounds=pipeline.image_bounds(data.normalization("none"), 3))
    want = float(metrics.psnr(np.clip(np.asarray(ref.x, np.float64), 0, 1), photo.x)[0])
    # As well as the exact gradient's attack, within the spread that 2000 L-BFGS iterations give
    # two processes whose XLA reduction orders differ (measured: up to 1.4 dB either way).
    assert row.get("error") is None and row["psnr"] > 20 and row["psnr"] > want - 2.0, (row, want)
    run = tmp_path / "audit" / row["run"]
    assert (run / "report.html").is_file() and (run / "reconstruction.npy").is_file()
    rec = np.load(run / "reconstruction.npy").astype(np.float64)[0]
    np.testing.assert_allclose(skimage.metrics.peak_signal_noise_ratio(photo.x[0].astype(np.float64), rec,
                                                                       data_range=1.0), row["psnr"], atol=1e-3)
    np.testing.assert_allclose(skimage.metrics.structural_similarity(
        photo.x[0].astype(np.float64), rec, data_range=1.0, channel_axis=-1), row["ssim"], atol=1e-5)
  page = (tmp_path / "audit" / "round_001" / "index.html").read_text()
  assert 'href="client_12/idlg/report.html"' in page


@pytest.mark.slow
def test_audit_program(net, tmp_path):
  """gradjax audit over a recorded federation: the index, and one-line errors with exit 2 (the
  commands in one process)."""
  from test_cli import run_in_one_process
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net), rounds=2)
  (tmp_path / "a_file").write_text("")
  refused = [(["--audit_dir=" + str(tmp_path / "none")], "does not exist"),
             (["--audit_dir=" + str(tmp_path / "a_file")], "is a file, not a folder"),
             ([f"--audit_dir={strategy.audit_dir}", "--attacks=blur"], "--attacks takes"),
             ([f"--audit_dir={strategy.audit_dir}", "--attacks=idlg,idlg"], "distinct names"),
             ([f"--audit_dir={strategy.audit_dir}", "--attacks=idlg,,dlg"], "distinct names"),
             ([f"--audit_dir={strategy.audit_dir}", "--rounds=1,,2"], "--rounds takes"),
             ([f"--audit_dir={strategy.audit_dir}", "--rounds=x"], "--rounds takes"),
             ([f"--audit_dir={strategy.audit_dir}", "--rounds=7"], "no captures of rounds")]
  proc, *bad = run_in_one_process([(["gradjax", "audit", *args], tmp_path) for args in [
      [f"--audit_dir={strategy.audit_dir}", "--rounds=2", "--attacks=dlg,dlm_plus", "--iterations=3",
       "--lpips=none"], *(args for args, _ in refused)]])
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = json.loads((tmp_path / "audit" / "index.json").read_text())["rows"]
  assert [(r["round"], r["client"], r["attack"]) for r in rows] == [
      (2, "11", "dlg"), (2, "11", "dlm_plus"), (2, "12", "dlg"), (2, "12", "dlm_plus")]
  assert all(r.get("error") is None and r["psnr"] is None and np.isfinite(r["loss"]) for r in rows)
  assert "| 2 | 12 | dlm_plus |" in proc.stdout
  for (args, message), p in zip(refused, bad, strict=True):
    assert p.returncode == 2 and message in p.stderr.strip().splitlines()[-1], (args, p.stderr[-500:])


@pytest.mark.slow
def test_several_local_steps_get_replay_and_dlm_plus(net, tmp_path):
  """Two photos in two local steps (batch 1): the capture states the schedule, so the audit replays
  it (labels inferred with LLG: FedAvg clients share none) and runs DLM+; scored on both photos."""
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net, nodes=(3, 9), samples=2), rounds=1, **{"batch-size": 1})
  capture = audit.captures(strategy.audit_dir)[0]
  meta = capture.info["metadata"]
  assert (meta["num_samples"], meta["local_batch_size"]) == (2, 1)
  assert auto.for_metadata(meta) == ("inverting_gradients_fedavg", "dlm_plus")
  rows = audit.attack_capture(capture, audit.settings(options={"data.dataset": "skimage",
                                                               "data.image_size": 32,
                                                               "attack.iterations": 5,
                                                               "output.lpips": "none"}),
                              log=lambda s: None)
  assert [r["attack"] for r in rows] == ["inverting_gradients_fedavg", "dlm_plus"]
  for row in rows:
    assert row.get("error") is None and row["num_samples"] == 2 and np.isfinite(row["psnr"]), row
  metrics_ = json.loads((tmp_path / "audit" / rows[0]["run"] / "metrics.json").read_text())
  assert metrics_["config"]["attack"]["label_source"] == "llg_star" and metrics_[
      "threat_model"] == "fedavg"


@pytest.mark.slow
def test_failed_clients_are_counted_reported_and_fail_the_audit(net, tmp_path):
  """Failed clients: counted per round in the strategy and round.json, a ServerApp that lost every
  client raises, and the audit's index lists them and audit.py ends with exit 1 (one line)."""
  import subprocess
  import sys
  grid = Grid(net, nodes=(11, 12, 13), spoil={12: "error", 13: "silent"})
  strategy = AuditStrategy(Keep(), tmp_path / "audit")
  start(strategy, net, grid, rounds=1)
  assert strategy.failures == {1: {12: "the client failed: ClientApp crashed", 13: "no reply"}}
  summary = json.loads((tmp_path / "audit" / "round_001" / audit.ROUND_SUMMARY).read_text())
  assert summary == {"round": 1, "clients_sent": 3, "nodes": ["11", "12", "13"],
                     "failures": {"12": "the client failed: ClientApp crashed", "13": "no reply"}}
  strategy.raise_if_failed()  # one client trained: not a lost round
  program = ["-m", "gradjax", "audit"]
  proc = subprocess.run([sys.executable, *program, f"--audit_dir={strategy.audit_dir}",
                         "--iterations=3", "--lpips=none"], capture_output=True, text=True, timeout=600)
  rows = json.loads((tmp_path / "audit" / "index.json").read_text())["rows"]
  assert [(r["client"], r.get("error")) for r in rows] == [
      ("11", None), ("12", "the client failed: ClientApp crashed"), ("13", "no reply")]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 1 and len(errors) == 1 and "2 of 3 rows failed" in errors[0]
  lost = AuditStrategy(Keep(), tmp_path / "lost")
  start(lost, net, Grid(net, spoil={11: "error", 12: "error"}), rounds=1)
  with pytest.raises(RuntimeError, match="every client failed in round"):
    lost.raise_if_failed()


@pytest.mark.slow
def test_a_node_the_superlink_reports_unavailable_is_counted_once_by_its_id(net, tmp_path):
  """A node that stops sending heartbeats: the SuperLink replies in its place (sender the
  SuperLink's id); it is the node's failure, counted once, and the round is not lost."""
  strategy = AuditStrategy(Keep(), tmp_path / "audit")
  start(strategy, net, Grid(net, spoil={12: "unavailable"}), rounds=1)
  assert list(strategy.failures[1]) == [12] and "Node Unavailable" in strategy.failures[1][12]
  strategy.raise_if_failed()
  summary = json.loads((tmp_path / "audit" / "round_001" / audit.ROUND_SUMMARY).read_text())
  assert summary["clients_sent"] == 2 and list(summary["failures"]) == ["12"]
  assert sorted(c.info["client"] for c in audit.captures(tmp_path / "audit")) == [11, 12]


@pytest.mark.slow
def test_audit_merges_into_the_index_and_needs_its_dataset(net, tmp_path):
  """Auditing one round again keeps the other rounds' rows; a --dataset that cannot be loaded is a
  one-line error (exit 2) before any attack, and a ground truth not loaded is a row's error."""
  import subprocess
  import sys
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net), rounds=2)
  settings = audit.settings(options={"attack.iterations": 3, "output.lpips": "none"})
  audit.audit(strategy.audit_dir, settings, log=lambda s: None)
  rows = audit.audit(strategy.audit_dir, settings, rounds=[2], log=lambda s: None)
  assert [(r["round"], r["client"]) for r in rows] == [(1, "11"), (1, "12"), (2, "11"), (2, "12")]
  index = json.loads((tmp_path / "audit" / "index.json").read_text())["rows"]
  assert [(r["round"], r["client"]) for r in index] == [(r["round"], r["client"]) for r in rows]
  assert all(r["verdict"] in verdict.STATUSES for r in index)
  program = ["-m", "gradjax", "audit"]
  proc = subprocess.run([sys.executable, *program, f"--audit_dir={strategy.audit_dir}",
                         "--dataset=cifar10", f"--data_dir={tmp_path / 'nowhere'}"],
                        capture_output=True, text=True, timeout=600)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and "--dataset=cifar10" in errors[0], proc.stderr
  proc = subprocess.run([sys.executable, *program, f"--audit_dir={strategy.audit_dir}", "--model=resnet18"],
                        capture_output=True, text=True, timeout=600)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1 and f"declares model {MODEL}" in errors[0], proc.stderr
  rows = audit.attack_capture(audit.captures(strategy.audit_dir)[0],
                              audit.settings(options={"data.dataset": "cifar10",
                                                      "data.data_dir": str(tmp_path / "nowhere"),
                                                      "attack.iterations": 3}), log=lambda s: None)
  assert rows[0]["attack"] is None and rows[0]["error"].startswith("ground truth from cifar10")


@pytest.mark.slow
def test_audit_refuses_a_misdeclared_capture_unless_forced(net, tmp_path):
  """The clients did not normalise their inputs; an audit told they did (CIFAR-10's statistics)
  finds the recomputed update differs and names the normalisation that reproduces it; forced, the
  attack runs and its verdict is inconclusive."""
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net), rounds=1)
  capture = audit.captures(strategy.audit_dir)[0]
  options = {"data.dataset": "skimage", "data.image_size": 32, "data.normalization": "cifar10",
             "attack.iterations": 3, "output.lpips": "none"}
  row, = audit.attack_capture(capture, audit.settings(options=options), log=lambda s: None)
  assert "verdict" not in row and "declare normalization=none" in row["error"], row
  row, = audit.attack_capture(capture, audit.settings(options={**options, "client.force": True}),
                              log=lambda s: None)
  assert row.get("error") is None and row["verdict"] == "inconclusive"


@pytest.mark.slow
def test_a_node_that_replies_twice_and_a_restarted_node_are_recorded_not_merged(net, tmp_path):
  """Node 12 replies twice in each round: both replies are captures of their own, named in
  round.json and the index; node 12 then restarts between rounds under id 13: the round table
  shows node 12 gone and node 13 new. (Flower's FedAvg aggregates every reply it is given.)"""
  grid = Grid(net, spoil={12: "twice"}, restarts={12: 13})
  strategy = AuditStrategy(Keep(), tmp_path / "audit")
  start(strategy, net, grid, rounds=2)
  found = audit.captures(strategy.audit_dir)
  assert [(c.round, c.client, c.info.get("reply")) for c in found] == [
      (1, "11", None), (1, "12", None), (1, "12-reply2", 2), (2, "11", None), (2, "13", None)]
  first, second = (interop.read(os.path.join(c.folder, audit.OBSERVATION)).tensors for c in found[1:3])
  for name in first:  # the same reply twice, each kept whole
    np.testing.assert_array_equal(first[name], second[name])
  assert strategy.duplicates == {1: {12: 2}, 2: {}} and strategy.nodes == {1: [11, 12], 2: [11, 13]}
  summary = json.loads((tmp_path / "audit" / "round_001" / audit.ROUND_SUMMARY).read_text())
  assert summary["duplicates"] == {"12": 2} and summary["nodes"] == ["11", "12"]
  rounds = audit.membership(strategy.audit_dir)
  assert [(r["round"], r["duplicates"], r.get("new"), r.get("gone"), r.get("since")) for r in rounds] == [
      (1, {"12": 2}, None, None, None), (2, {}, ["13"], ["12"], 1)]
  rows = audit.audit(strategy.audit_dir, audit.settings(("idlg",), {"attack.iterations": 3,
                                                                    "output.lpips": "none"}),
                     log=lambda s: None)
  assert [(r["round"], r["client"], r.get("reply")) for r in rows] == [
      (1, "11", None), (1, "12", None), (1, "12-reply2", 2), (2, "11", None), (2, "13", None)]
  index = json.loads((tmp_path / "audit" / "index.json").read_text())
  assert index["rounds"] == rounds
  table = (tmp_path / "audit" / "index.md").read_text()
  assert "| 1 | 2 | – | – | – | 12 (2 replies) | – | – |" in table
  assert "| 2 | 2 | – | – | – | – | 13 (since round 1) | 12 (since round 1) |" in table


@pytest.mark.slow
def test_an_interrupted_audit_resumes_where_it_stopped(net, tmp_path):
  """Ctrl-C during ``gradjax audit``: the capture under attack finishes, the index holds the
  captures done, one line names the command that continues (exit 130); that command reads the
  finished captures back (their run files untouched) and attacks the rest."""
  import signal
  import subprocess
  import sys
  import time
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net, nodes=(11, 12, 13, 14)), rounds=1)
  args = [sys.executable, "-m", "gradjax", "audit", f"--audit_dir={strategy.audit_dir}",
          "--attacks=idlg", "--iterations=50", "--lpips=none"]
  proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  first = tmp_path / "audit" / "round_001" / "client_11" / audit.ROWS
  deadline = time.monotonic() + 300
  while not first.exists():
    assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1][-2000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  lines = [line for line in err.splitlines() if line.startswith("interrupted")]
  assert proc.returncode == 130 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
  done = sorted(p.parent.name for p in (tmp_path / "audit" / "round_001").glob(f"client_*/{audit.ROWS}"))
  assert 1 <= len(done) < 4 and lines[0].startswith(f"interrupted after {len(done)} of 4 captures")
  indexed = json.loads((tmp_path / "audit" / "index.json").read_text())["rows"]
  assert [f"client_{r['client']}" for r in indexed] == done
  kept = {name: (tmp_path / "audit" / "round_001" / name / "idlg" / "metrics.json").stat().st_mtime_ns
          for name in done}
  command = lines[0].split("resume with: ", 1)[1]
  assert command.endswith(" --resume")
  again = subprocess.run([sys.executable, "-m", "gradjax", *command.split()[1:]], capture_output=True,
                         text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.count(f"kept from its {audit.ROWS}") == len(done)
  rows = json.loads((tmp_path / "audit" / "index.json").read_text())["rows"]
  assert [r["client"] for r in rows] == ["11", "12", "13", "14"] and all(r["verdict"] for r in rows)
  for name, mtime in kept.items():
    assert (tmp_path / "audit" / "round_001" / name / "idlg" / "metrics.json").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_a_rounds_clients_attacked_in_one_run_give_the_rows_of_one_at_a_time(net, tmp_path):
  """Four clients over two rounds, one pruning its update and declaring it, one whose reply is
  spoiled: with ``clients_per_run=8`` the audit attacks the alike captures in one solver run (the
  two clients' four updates of two global models; the pruned client's adapted attack in a run of its
  own; the spoiled reply is its error row), and every row is the one it gives one capture at a time
  (CPU: the runs advance in sequence; in a fresh process every number is the same. After other
  tests in the process (a pytest-xdist worker) the two ways have been seen to differ by float32
  rounding, which 20 L-BFGS steps grow: 0.2 % of a PSNR, 2-3 % of a loss near convergence (0.017,
  a difference of terms a thousand times larger, so its rounding is absolute: 4-5e-4))."""
  strategy = AuditStrategy(fedavg(), tmp_path / "audit", metadata={"model": MODEL})
  start(strategy, net, Grid(net, nodes=(11, 12, 13, 14), defenses={13: "prune:0.7"},
                            spoil={14: "error"}), rounds=2)
  found = audit.captures(strategy.audit_dir)
  assert len(found) == 8 and [c.client for c in found if c.error] == ["14", "14"]
  options = {"data.dataset": "skimage", "data.image_size": 32, "attack.iterations": 20,
             "output.lpips": "none", "attack.adaptive": True}
  alone = audit.attack_captures(found, audit.settings(("idlg",), options), log=lambda s: None)
  together = audit.attack_captures(
      found, audit.settings(("idlg",), {**options, "execution.clients_per_run": 8}),
      log=lambda s: None)
  assert [(r["round"], r["client"], r["attack"]) for r in together] == [
      (r["round"], r["client"], r["attack"]) for r in alone]
  shared = {(r["round"], r["client"]): r.get("clients_together") for r in together}
  assert shared == {(1, "11"): 4, (1, "12"): 4, (2, "11"): 4, (2, "12"): 4,
                    (1, "13"): 2, (2, "13"): 2, (1, "14"): None, (2, "14"): None}, shared
  for a, b in zip(alone, together):
    assert a.get("error") == b.get("error")
    if a.get("error"):
      continue
    assert a["verdict"] == b["verdict"] and a["iterations"] == b["iterations"]
    assert a["label_accuracy"] == b["label_accuracy"]
    np.testing.assert_allclose(b["psnr"], a["psnr"], rtol=5e-3)
    np.testing.assert_allclose(b["ssim"], a["ssim"], atol=1e-3)
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=2e-2, atol=2e-3)


def test_audit_strategy_checks_its_attack_and_metadata_when_built(tmp_path):
  """What would fail every round's recording or audit later (a dict or a function in the
  settings' place, metadata of other types, an unknown model) is refused when the strategy is
  built; NumPy's numbers in the metadata are kept as Python's."""
  for attack in ({"data.dataset": "skimage"}, audit.settings, True):
    with pytest.raises(TypeError, match="audit.settings"):
      AuditStrategy(fedavg(), tmp_path / "a", attack=attack)
  with pytest.raises(TypeError, match="metadata\\['train'\\]"):
    AuditStrategy(fedavg(), tmp_path / "a", metadata={"train": {"mode": 1}})
  with pytest.raises(ValueError, match="lenet_zhuu"):
    AuditStrategy(fedavg(), tmp_path / "a", metadata={"model": "lenet_zhuu"})
  strategy = AuditStrategy(fedavg(), None, metadata={"model": MODEL, "local_epochs": np.int64(1)})
  assert strategy.metadata == {"model": MODEL, "local_epochs": 1}
  assert type(strategy.metadata["local_epochs"]) is int
