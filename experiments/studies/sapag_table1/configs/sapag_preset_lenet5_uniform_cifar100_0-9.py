"""SAPAG, LeNet-5, CIFAR-100, 2000 iterations: the preset with U(-0.5, 0.5) init on the development images 0-9."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.data.dataset = "cifar100"
  c.model.name = "lenet5"
  c.model.init = "uniform"
  c.attack.preset = "sapag"
  c.attack.iterations = 2000
  return c


def get_sweep():
  return config.sweep("data.index", range(0, 10))
