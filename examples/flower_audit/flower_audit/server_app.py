"""The ServerApp: FedAvg over the SuperNodes, wrapped by gradjax's AuditStrategy, which records every
round's global model and every client's reply for the audit (``record = false``: plain FedAvg)."""

import time

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flower_audit import task
from gradjax.integrations import audit
from gradjax.integrations.flower import AuditStrategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
  cfg = context.run_config
  net = task.build(cfg["model"], int(cfg["init-seed"]))
  strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
  if cfg["record"]:
    settings = None
    if cfg["attack"]:
      settings = audit.Settings(dataset=cfg["dataset"], data_dir=cfg["data-dir"] or None,
                                image_size=32)
    strategy = AuditStrategy(
        strategy, cfg["audit-dir"], attack=settings,
        # What the clients read from the run config, not from the messages:
        metadata={"model": cfg["model"], "input_shape": "32,32,3",
                  "local_epochs": int(cfg["local-epochs"]),
                  "train": task.has_batchnorm(net)})
  start = time.perf_counter()
  strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()),
                 num_rounds=int(cfg["num-server-rounds"]),
                 train_config=ConfigRecord({"lr": float(cfg["lr"]),
                                            "batch-size": int(cfg["batch-size"])}))
  wall = time.perf_counter() - start
  if cfg["record"]:
    print(f"federation wall time {wall:.2f} s, of which recording {strategy.seconds_recording:.3f} s "
          f"({strategy.bytes_written} bytes to {strategy.audit_dir})")
    strategy.raise_if_failed()  # a round whose every client failed ends the run as failed
  else:
    print(f"federation wall time {wall:.2f} s (not recording)")
