"""gradjax.integrations.flower.leakage_mod: a ClientApp mod that attacks the client's own update and withholds
it when the attack recovers the client's example; the gray-image baseline against scikit-image."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.metrics

flwr = pytest.importorskip("flwr")
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402

from gradjax import clients, data, defenses, interop, models  # noqa: E402
from gradjax.integrations.flower import (DECLARATIONS, GATE_METRICS, declarations,  # noqa: E402
                                         gray_baseline_psnr, leakage_mod)

from test_flower import LR, MODEL, SHAPE, net, run_identity, to_record  # noqa: E402,F401

pytestmark = pytest.mark.slow
CACHE = os.environ.get("GRADJAX_TEST_XLA_CACHE", "")  # the test run's compilation cache (conftest)


def _photo():
  return data.load("skimage", indices=[5], image_size=SHAPE[:2])


def _client(net, defense=None, dp_sgd=None, declares=False, photo=None):
  """``call_next`` of a ClientApp: one SGD step on scikit-image photo 5 (DP-SGD's with ``dp_sgd``,
  stated in its reply's declarations with ``declares``), the update pruned by ``defense`` (applied
  to W_t − W_{t+1}, as gradjax.defenses applies it to a FedAvg update)."""
  model, mapping = net

  def call_next(msg, context):
    sent = {k: a.numpy() for k, a in msg.content["arrays"].items()}
    variables = interop.variables_from_torch(sent, mapping, model.variables, "sent")
    example = _photo() if photo is None else photo
    obs = clients.fedavg(model.apply_fn, variables, example.x, example.y,
                         clients.LocalTraining(learning_rate=LR), dp_sgd=dp_sgd)
    if defense:
      obs = defenses.parse(defense).apply(obs)
    after = jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u), variables["params"], obs.gradient)
    content = RecordDict({"arrays": to_record(interop.params_to_torch(after, mapping)),
                          "metrics": MetricRecord({"num-examples": 1})})
    if declares:
      content[DECLARATIONS] = declarations(dp_sgd_max_norm=dp_sgd.max_norm,
                                           dp_sgd_noise_multiplier=dp_sgd.noise_multiplier)
    return Message(content, reply_to=msg)

  return call_next


def _train_message(net, server_round=1):
  model, mapping = net
  content = RecordDict({"arrays": to_record(interop.variables_to_torch(model.variables, mapping)),
                        "config": ConfigRecord({"lr": LR, "server-round": server_round})})
  return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def _context():
  return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def _examples(msg, context):
  photo = _photo()
  return photo.x, photo.y


def test_gray_baseline_against_scikit_image():
  x = _photo().x
  want = skimage.metrics.peak_signal_noise_ratio(x[0].astype(np.float64), np.full(x[0].shape, 0.5),
                                                 data_range=1.0)
  assert gray_baseline_psnr(x) == pytest.approx(want, rel=1e-9)


@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_a_leaking_update_is_withheld_and_a_defended_one_passes(net):
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 2000,
                                   "gate.threshold_db": 10.0}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net))
  assert reply.has_error() and "gradjax leakage_mod: update withheld" in reply.error.reason, \
      reply.error.reason if reply.has_error() else dict(reply.content["metrics"])
  # The attack stopped once it crossed the threshold, well before its 2000 iterations.
  iterations = int(re.search(r"in (\d+) iterations", reply.error.reason).group(1))
  assert iterations < 2000, reply.error.reason
  # Pruned at 70 %: the attack adapted to it does not recover the photo; the update goes out with
  # the score in its metrics.
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 2000,
                                   "gate.threshold_db": 10.0, "defense.spec": "prune:0.7"},
                     compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net, "prune:0.7"))
  assert not reply.has_error()
  metrics = dict(reply.content["metrics"])
  assert set(GATE_METRICS) <= set(metrics) and metrics["gradjax-audited"] == 1
  assert metrics["gradjax-leak-db"] < 10.0
  assert metrics["gradjax-leak-db"] == pytest.approx(metrics["gradjax-psnr"]
                                                     - gray_baseline_psnr(_photo().x), abs=1e-6)


@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_a_dp_sgd_client_that_only_clips_is_withheld_when_the_gate_knows_its_bound(net):
  """A client whose step clips its example's gradient (DP-SGD without noise, a bound well below the
  gradient's norm of about 23): told the bound, by the gate's options or by the client's own
  declaration in its reply, the gate's attack clips as the client does, recovers the photo and
  withholds the update; not told, it says it did not audit it."""
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 2000,
                                 "gate.threshold_db": 10.0, "defense.dp_sgd_max_norm": 0.05},
                     compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net, dp_sgd=clients.DPSGD(0.05)))
  assert reply.has_error() and "gradjax leakage_mod: update withheld" in reply.error.reason, \
      reply.error.reason if reply.has_error() else dict(reply.content["metrics"])
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 2000,
                                 "gate.threshold_db": 10.0}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(),
               _client(net, dp_sgd=clients.DPSGD(0.05), declares=True))
  assert reply.has_error() and "gradjax leakage_mod: update withheld" in reply.error.reason, \
      reply.error.reason if reply.has_error() else dict(reply.content["metrics"])
  # Not told: the update fails the capture's fidelity check (it is no plain step's), so the gate
  # says it did not audit it; it never scores it as safe.
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 2000,
                                 "gate.threshold_db": 10.0}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net, dp_sgd=clients.DPSGD(0.05)))
  assert not reply.has_error() and dict(reply.content["metrics"])["gradjax-audited"] == 0


def test_unaudited_rounds_and_failures_pass_the_update(net):
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 300,
                                   "gate.rounds": "every:2"}, compilation_cache=CACHE)
  reply = gate(_train_message(net, server_round=1), _context(), _client(net))
  assert not reply.has_error() and "gradjax-audited" not in dict(reply.content["metrics"])

  def broken(msg, context):
    raise OSError("no data here")

  gate = leakage_mod(broken, {"model.name": MODEL, "attack.iterations": 300},
                     compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net))
  assert not reply.has_error() and dict(reply.content["metrics"])["gradjax-audited"] == 0
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 300,
                                   "gate.time_budget_s": 0.5}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net))
  assert not reply.has_error() and dict(reply.content["metrics"])["gradjax-audited"] == 0



@pytest.mark.slow
@pytest.mark.parametrize("shape,defense", [(SHAPE, None), ((28, 28, 1), "none")])
def test_without_model_name_the_gate_reads_the_metadatas_model(shape, defense):
  """``metadata={"model": ...}`` alone names the client's model, and without ``input_shape`` the
  examples give its input's shape (before, the schema's lenet_zhu and 32x32x3 took their place: an
  MLP client's honest model was refused as not the declared one, and never trained); a client
  whose defense is ``none`` is audited as one without."""
  model = models.create("mlp", jax.random.key(0), input_shape=shape, num_classes=10)
  mlp = model, interop.zoo_mapping(model)
  photo = data.load("skimage", indices=[5], image_size=shape[:2], channels=shape[2])
  gate = leakage_mod(lambda msg, context: (photo.x, photo.y), {"attack.iterations": 50},
                     metadata={"model": "mlp"}, defense=(lambda context: defense),
                     compilation_cache=CACHE)
  reply = gate(_train_message(mlp), _context(), _client(mlp, photo=photo))
  # A ReLU MLP of one example: auto reads its first layer in closed form, exactly.
  assert reply.has_error() and reply.error.reason.startswith(
      "gradjax leakage_mod: update withheld: exclusive_neurons recovers"), \
      reply.error.reason if reply.has_error() else dict(reply.content["metrics"])
  # A defense= that returns a Defense object, not its spec: not audited, never scored as safe.
  gate = leakage_mod(lambda msg, context: (photo.x, photo.y), {"attack.iterations": 50},
                     metadata={"model": "mlp"}, defense=lambda context: defenses.parse("prune:0.7"),
                     compilation_cache=CACHE)
  reply = gate(_train_message(mlp), _context(), _client(mlp, photo=photo))
  assert not reply.has_error() and dict(reply.content["metrics"])["gradjax-audited"] == 0


def test_the_gate_refuses_options_it_does_not_read():
  with pytest.raises(ValueError, match="not training.epochs"):
    leakage_mod(_examples, {"training.epochs": 2})
  with pytest.raises(ValueError, match="gate.rounds"):
    leakage_mod(_examples, {"gate.rounds": "every:0"})
  with pytest.raises(ValueError, match="attack.preset='dlgg'"):
    leakage_mod(_examples, {"attack.preset": "dlgg"})
  with pytest.raises(TypeError, match="defense.spec"):
    leakage_mod(_examples, defense="prune:0.7")
  # Values that would leave every round unaudited: refused when the gate is built.
  model = {"model.name": MODEL}
  for options, metadata, match in (
      ({}, {}, "name the client's model"), ({"model.name": "lenet_zhuu"}, {}, "lenet_zhuu"),
      ({}, {"model": "lenet_zhuu"}, "lenet_zhuu"),
      ({**model, "defense.spec": "prunee:0.7"}, {}, "prunee"),
      ({**model, "data.normalization": "cifar100x"}, {}, "cifar100x"),
      ({**model, "attack.iterations": -5}, {}, "positive"),
      ({**model, "attack.iterations": 0}, {}, "positive"),
      ({**model, "attack.restarts": 0}, {}, "positive"),
      ({**model, "gate.threshold_db": float("nan")}, {}, "finite"),
      (model, {"input_shape": "32x32x3"}, "input_shape")):
    with pytest.raises(ValueError, match=match):
      leakage_mod(_examples, options, metadata=metadata)
  with pytest.raises(ValueError, match="not both"):
    leakage_mod(_examples, {**model, "defense.spec": "prune:0.7"}, defense=lambda context: None)


def test_a_zero_update_passes_audited_without_an_attack(net):
  """A client that sends back the weights it received (a round with nothing trained): the gate
  finds nothing to attack (not a ReLU's zeros), and the update passes, audited, with no leak."""
  def unchanged(msg, context):
    content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)

  def no_data(msg, context):
    raise AssertionError("a zero update needs no examples")

  gate = leakage_mod(no_data, {"model.name": MODEL, "attack.iterations": 300},
                     compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), unchanged)
  metrics = dict(reply.content["metrics"])
  assert not reply.has_error() and metrics["gradjax-audited"] == 1 and metrics["gradjax-leak"] == 0


def test_a_gated_client_refuses_a_model_built_to_leak_and_trains_an_honest_one(net):
  """Before training, the mod checks what the server sent: an imprint block in front of the
  declared LeNet (tensors the declared model lacks) is refused without training, the reply naming
  why; the honest model trains (the mod's attack off: gate.rounds empty). received_findings on an MLP whose
  first layer hides an imprint: its shared direction. Trap weights, seen on the round's examples:
  refused. A layer whose units died: trained, and its update audited."""
  from gradjax import malicious
  from gradjax.integrations.flower import MODEL_REFUSED, received_findings
  model, mapping = net
  trained = []

  def call_next(msg, context):
    trained.append(msg)
    return _client(net)(msg, context)

  gate = leakage_mod(_examples, {"model.name": MODEL, "gate.rounds": ""},
                     compilation_cache=CACHE)
  evil = malicious.imprint(model, np.linspace(0.2, 0.8, 32))
  sent = interop.variables_to_torch(model.variables, mapping)
  sent.update({"imprint.weight": np.asarray(evil.variables["params"]["imprint"]["kernel"]).T,
               "imprint.bias": np.asarray(evil.variables["params"]["imprint"]["bias"])})
  msg = Message(content=RecordDict({"arrays": to_record(sent),
                                    "config": ConfigRecord({"lr": LR, "server-round": 1})}),
                dst_node_id=1, message_type=MessageType.TRAIN)
  reply = gate(msg, _context(), call_next)
  assert reply.has_error() and reply.error.reason.startswith(MODEL_REFUSED) and not trained
  assert "imprint.weight" in reply.error.reason
  reply = gate(_train_message(net), _context(), call_next)
  assert not reply.has_error() and len(trained) == 1
  # A model holding NaN (the server aggregated a broken reply): not trained on, a failure of the
  # round, not a model refused as built to leak.
  broken = interop.variables_to_torch(model.variables, mapping)
  broken["fc.0.bias"] = np.full_like(broken["fc.0.bias"], np.nan)
  reply = gate(Message(content=RecordDict({"arrays": to_record(broken),
                                           "config": ConfigRecord({"lr": LR, "server-round": 1})}),
                       dst_node_id=1, message_type=MessageType.TRAIN), _context(), call_next)
  assert reply.has_error() and MODEL_REFUSED not in reply.error.reason and len(trained) == 1
  assert "NaN or infinity (in fc.0.bias)" in reply.error.reason
  mlp = models.create("mlp-256", jax.random.key(0), input_shape=SHAPE)
  hidden = malicious.imprint_layer(mlp, np.linspace(0.2, 0.8, 16))
  found = received_findings(interop.variables_to_torch(hidden.variables, interop.zoo_mapping(mlp)),
                            "mlp-256", SHAPE)
  assert [f.reason.split(" of ")[0] for f in found] == ["16"]
  assert received_findings(interop.variables_to_torch(mlp.variables, interop.zoo_mapping(mlp)),
                           "mlp-256", SHAPE) == []
  # Trap weights (every shape and direction honest): seen on the client's own examples, refused.
  public = np.random.default_rng(0).uniform(size=(200, *SHAPE)).astype(np.float32)
  trap = malicious.trap_weights(mlp, public, 1 / 32, jax.random.key(1))
  sent = interop.variables_to_torch(trap.variables, interop.zoo_mapping(mlp))
  assert received_findings(sent, "mlp-256", SHAPE) == []
  found = received_findings(sent, "mlp-256", SHAPE, inputs=_photo().x)
  assert [f.path for f in found] == ["['Dense_0']['kernel']"]
  mlp_gate = leakage_mod(_examples, {"model.name": "mlp-256", "gate.rounds": ""}, compilation_cache=CACHE)
  before = len(trained)

  def message(arrays):
    return Message(content=RecordDict({"arrays": to_record(arrays),
                                       "config": ConfigRecord({"lr": LR, "server-round": 1})}),
                   dst_node_id=1, message_type=MessageType.TRAIN)

  def train(m, c):
    trained.append(m)
    return Message(RecordDict(), reply_to=m)

  reply = mlp_gate(message(sent), _context(), train)
  assert reply.has_error() and reply.error.reason.startswith(MODEL_REFUSED) and len(trained) == before
  # A layer whose units died (every weight turned away from the examples, biases as drawn) fires as
  # rarely but is no sign against the server: the gate trains and audits the update, though
  # gate.rounds names no round (this reply holds none: not audited).
  params = mlp.variables["params"]
  dead = {"params": {**params, "Dense_0": {**params["Dense_0"],
                                           "kernel": -jnp.abs(params["Dense_0"]["kernel"])}}}
  reply = mlp_gate(message(interop.variables_to_torch(dead, interop.zoo_mapping(mlp))), _context(), train)
  assert not reply.has_error() and len(trained) == before + 1
  assert dict(reply.content["metrics"])["gradjax-audited"] == 0
  assert received_findings(interop.variables_to_torch(mlp.variables, interop.zoo_mapping(mlp)),
                           "mlp-256", SHAPE, inputs=_photo().x) == []


def test_the_gates_psnr_is_scikit_images_of_the_reconstruction_it_scored(net, tmp_path, monkeypatch):
  """The PSNR the gate reports (``gradjax-psnr`` of an update it passes; in the reason of one it
  withholds, with the leak score) is scikit-image's of the reconstruction its attack wrote, kept
  here instead of deleted, against the client's photo; the leak score is it minus scikit-image's
  of a gray image."""
  import glob
  import shutil
  import tempfile
  made, mkdtemp, rmtree = [], tempfile.mkdtemp, shutil.rmtree

  def kept_dir(*args, **kwargs):
    made.append(mkdtemp(*args, **{**kwargs, "dir": str(tmp_path)}))
    return made[-1]

  monkeypatch.setattr(tempfile, "mkdtemp", kept_dir)
  monkeypatch.setattr(shutil, "rmtree", lambda path, *a, **k: None if path in made else rmtree(path, *a, **k))
  photo = _photo().x[0].astype(np.float64)
  gray = skimage.metrics.peak_signal_noise_ratio(photo, np.full(photo.shape, 0.5), data_range=1.0)

  def scored():
    (found,) = glob.glob(os.path.join(made[-1], "capture", "*", "reconstruction.npy"))
    rec = np.load(found)[0].astype(np.float64)
    return skimage.metrics.peak_signal_noise_ratio(photo, rec, data_range=1.0)

  # A threshold no attack reaches: the update passes, its PSNR in the metrics.
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 20,
                                 "gate.threshold_db": 100.0}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net))
  assert not reply.has_error()
  metrics = dict(reply.content["metrics"])
  assert metrics["gradjax-audited"] == 1
  psnr = scored()
  assert metrics["gradjax-psnr"] == pytest.approx(psnr, abs=1e-4)
  assert metrics["gradjax-leak-db"] == pytest.approx(psnr - gray, abs=1e-4)
  # A threshold below a gray image's: withheld at once, the reason's PSNR and score to 0.1 dB.
  gate = leakage_mod(_examples, {"model.name": MODEL, "attack.iterations": 20,
                                 "gate.threshold_db": -100.0}, compilation_cache=CACHE)
  reply = gate(_train_message(net), _context(), _client(net))
  assert reply.has_error()
  said = re.search(r"at (-?[0-9.]+) dB, (-?[0-9.]+) dB above a gray image", reply.error.reason)
  psnr = scored()
  assert float(said.group(1)) == pytest.approx(psnr, abs=0.051)
  assert float(said.group(2)) == pytest.approx(psnr - gray, abs=0.051)
