"""The ClientApp: trains the global model on this node's CIFAR-10 examples and replies with its
weights (``state_dict`` names), the example count and, for scoring the audit, the examples' indices."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_audit import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
  cfg = context.run_config
  net = task.build(cfg["model"], int(cfg["init-seed"]))
  net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
  sent = msg.content["config"]
  indices = task.client_indices(int(context.node_config["partition-id"]),
                                int(context.node_config["num-partitions"]),
                                int(sent["server-round"]), int(cfg["samples-per-client"]))
  x, y = task.load(cfg["dataset"], cfg["data-dir"], indices)
  task.train(net, x, y, int(cfg["local-epochs"]), int(sent["batch-size"]), float(sent["lr"]))
  metrics = MetricRecord({"num-examples": len(indices), "data-indices": indices})
  return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}),
                 reply_to=msg)
