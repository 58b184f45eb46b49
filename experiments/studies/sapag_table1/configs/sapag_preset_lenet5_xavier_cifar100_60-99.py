"""SAPAG, LeNet-5, CIFAR-100, 2000 iterations: the preset on the unseen images 60-99 (runs/..._60-79 and _80-99)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.data.dataset = "cifar100"
  c.model.name = "lenet5"
  c.model.init = "xavier_normal"
  c.attack.preset = "sapag"
  c.attack.iterations = 2000
  return c


def get_sweep():
  return config.sweep("data.index", range(60, 100))
