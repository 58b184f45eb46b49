"""The ServerApp: FedAvg over the SuperNodes, wrapped by gradjax's AuditStrategy, which records every
round's global model and every client's reply for the audit (``record = false``: records nothing).

With ``malicious-bins = k`` (an MLP model only) the server cheats: every round it hides an imprint of
k bins in the first layer of the model it sends (:func:`gradjax.malicious.imprint_layer`, Robbing the
Fed), its thresholds the quantiles of the mean brightness of images it holds itself
(``server-images``, a range of ``dataset``'s indices the clients do not train on). The recorder sees
what the clients received; ``gradjax audit`` reads the imprint out of each reply."""

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from flower_audit import task
from gradjax import data, interop, malicious, models
from gradjax.integrations import audit
from gradjax.integrations.flower import AuditStrategy

app = ServerApp()


def imprinted(arrays: ArrayRecord, model: str, thresholds) -> ArrayRecord:
  """``arrays`` (the MLP's ``state_dict``) with an imprint of ``len(thresholds)`` bins in fc1."""
  import jax
  state = {k: np.asarray(v.numpy()) for k, v in arrays.items()}
  net = models.create(model, jax.random.key(0), input_shape=(32, 32, 3))
  mapping = interop.zoo_mapping(net)
  variables = interop.variables_from_torch(state, mapping, net.variables, "the global model")
  sent = interop.variables_to_torch(
      malicious.imprint_layer(net._replace(variables=variables), thresholds).variables, mapping)
  return ArrayRecord({k: Array(np.ascontiguousarray(sent[k], dtype=v.dtype)) for k, v in state.items()})


class ImprintingServer(Strategy):
  """``strategy`` sending, every round, the global model with an imprint (:func:`imprinted`)."""

  def __init__(self, strategy: Strategy, model: str, thresholds):
    self.strategy, self.model, self.thresholds = strategy, model, np.asarray(thresholds)

  def summary(self) -> None:
    self.strategy.summary()

  def configure_train(self, server_round, arrays, config, grid):
    return self.strategy.configure_train(server_round, imprinted(arrays, self.model, self.thresholds),
                                         config, grid)

  def aggregate_train(self, server_round, replies):
    return self.strategy.aggregate_train(server_round, replies)

  def configure_evaluate(self, server_round, arrays, config, grid):
    return self.strategy.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round, replies):
    return self.strategy.aggregate_evaluate(server_round, replies)


def _thresholds(cfg) -> np.ndarray:
  start, _, stop = str(cfg["server-images"]).partition(":")
  own = data.load(cfg["dataset"], data_dir=cfg["data-dir"] or None,
                  indices=range(int(start), int(stop)), image_size=(32, 32), channels=3)
  return malicious.imprint_thresholds(own.x.reshape(len(own.x), -1).mean(axis=1),
                                      int(cfg["malicious-bins"]))


@app.main()
def main(grid: Grid, context: Context) -> None:
  cfg = context.run_config
  net = task.build(cfg["model"], int(cfg["init-seed"]))
  strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
  if int(cfg["malicious-bins"]):  # inside the recorder: it records what the clients received
    strategy = ImprintingServer(strategy, cfg["model"], _thresholds(cfg))
  settings = None
  if cfg["attack"] and cfg["record"]:
    settings = audit.settings(options={"data.dataset": cfg["dataset"],
                                       "data.data_dir": cfg["data-dir"] or None,
                                       "data.image_size": 32})
  # Recording or not (audit_dir None), the wrapper counts failed clients and completes the metrics
  # of clients that opt out of the gate, so that FedAvg aggregates their round.
  strategy = AuditStrategy(
      strategy, cfg["audit-dir"] if cfg["record"] else None, attack=settings,
      # What the clients read from the run config, not from the messages:
      metadata={"model": cfg["model"], "input_shape": "32,32,3",
                "local_epochs": int(cfg["local-epochs"]), "train": task.has_batchnorm(net)})
  start = time.perf_counter()
  strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()),
                 num_rounds=int(cfg["num-server-rounds"]),
                 train_config=ConfigRecord({"lr": float(cfg["lr"]),
                                            "batch-size": int(cfg["batch-size"])}))
  wall = time.perf_counter() - start
  if cfg["record"]:
    print(f"federation wall time {wall:.2f} s, of which recording {strategy.seconds_recording:.3f} s "
          f"({strategy.bytes_written} bytes to {strategy.audit_dir})")
  else:
    print(f"federation wall time {wall:.2f} s (not recording)")
  strategy.raise_if_failed()  # a round whose every client failed ends the run as failed
