"""DLM (Zhao, Luo, Ding, "Deep Leakage from Model in Federated Learning"), Table 1: the MLP
3072-32-100 with ReLU, one CIFAR-100 image, the server sees W_t and W_t+1 after one local SGD step
(lr 0.01); the attack is ``presets.dlm()`` (learned gamma, Adam lr 0.1, 4000 iterations)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "dlm"
  c.model.name = "mlp"
  c.data.dataset = "cifar100"
  c.client.name = "fedavg"
  c.client.local_lr = 0.01
  c.attack.box = False  # as the paper's rows: no clamp (the dlm_plus preset clamps)
  c.execution.chunk = 1000  # progress every 1000 of the rows' 4000 iterations: fewer host trips
  return c
