"""The ClientApp: trains the global model on this node's CIFAR-10 examples and replies with its
weights (``state_dict`` names), the example count and, for scoring the audit, the examples' indices.

A node whose config sets ``defense`` (``prune:R``) prunes its update before replying, and declares it
in the reply (``gradjax.integrations.flower.declarations``), where the server's record and the gate read it. With the run
option ``gate = true`` every client audits its own update before it leaves
(``gradjax.integrations.flower.leakage_mod``, the attack adapted to the node's defense) and withholds it when
the attack recovers its examples ``gate-threshold`` dB above a gray image, and refuses to train on a
model that looks built to leak (``gradjax.integrations.flower.MODEL_REFUSED``). A node's config
``gate`` (true or false) overrides the run option for that node."""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_audit import task
from gradjax import data
from gradjax.integrations.flower import DECLARATIONS, declarations, leakage_mod


def _indices(msg: Message, context: Context) -> list[int]:
  return task.client_indices(int(context.node_config["partition-id"]),
                             int(context.node_config["num-partitions"]),
                             int(msg.content["config"]["server-round"]),
                             int(context.run_config["samples-per-client"]))


def _defense(context: Context) -> str | None:
  return str(context.node_config.get("defense") or "") or None


def _examples(msg: Message, context: Context):
  """What the client trained on this round, as the gate scores it: NHWC images in [0, 1]."""
  cfg = context.run_config
  ds = data.load(cfg["dataset"], data_dir=cfg["data-dir"] or None, indices=_indices(msg, context),
                 image_size=(32, 32), channels=3)
  return ds.x, ds.y


def gate(msg: Message, context: Context, call_next) -> Message:
  """The leakage gate when the run asks for it (``gate = true``; a node's config ``gate`` overrides
  the run's), else the ClientApp as it is."""
  cfg = context.run_config
  if not context.node_config.get("gate", cfg.get("gate")):
    return call_next(msg, context)
  mod = leakage_mod(_examples, {"model.name": cfg["model"],
                                "gate.threshold_db": float(cfg["gate-threshold"]),
                                "attack.iterations": int(cfg["gate-iterations"]) or None,
                                "gate.time_budget_s": float(cfg["gate-budget-s"])},
                    metadata={"input_shape": "32,32,3", "local_epochs": int(cfg["local-epochs"])},
                    defense=_defense)
  return mod(msg, context, call_next)


app = ClientApp(mods=[gate])


@app.train()
def train(msg: Message, context: Context) -> Message:
  cfg = context.run_config
  net = task.build(cfg["model"], int(cfg["init-seed"]))
  sent_record = msg.content["arrays"]
  net.load_state_dict(sent_record.to_torch_state_dict())
  sent = msg.content["config"]
  indices = _indices(msg, context)
  x, y = task.load(cfg["dataset"], cfg["data-dir"], indices)
  task.train(net, x, y, int(cfg["local-epochs"]), int(sent["batch-size"]), float(sent["lr"]))
  weights = ArrayRecord(net.state_dict())
  if _defense(context):
    before = {k: np.asarray(a.numpy()) for k, a in sent_record.items()}
    after = {k: np.asarray(a.numpy()) for k, a in weights.items()}
    weights = ArrayRecord({k: Array(np.ascontiguousarray(v))
                           for k, v in task.defended(before, after, _defense(context)).items()})
  metrics = MetricRecord({"num-examples": len(indices), "data-indices": indices})
  content = RecordDict({"arrays": weights, "metrics": metrics,
                        DECLARATIONS: declarations(model=cfg["model"], defense=_defense(context))})
  return Message(content, reply_to=msg)
