"""SAPAG, LeNet-5, CIFAR-100, 2000 iterations: −expm1 kernel with DLG's joint labels (the preset between 2c07203 and 60b388d) on 0-19, 20-29 and 60-80 (that run stopped after 21 images)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.data.dataset = "cifar100"
  c.model.name = "lenet5"
  c.model.init = "xavier_normal"
  c.attack.preset = "sapag"
  c.attack.iterations = 2000
  c.attack.labels = "joint"
  return c


def get_sweep():
  return config.sweep("data.index", [*range(0, 30), *range(60, 81)])
