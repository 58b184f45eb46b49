"""SAPAG, LeNet-5, CIFAR-100, 2000 iterations: the preset of 2026-11-25 on the unseen images 60-69. It ran at 651e399, whose kernel was
1 − exp(−x); today's code computes −expm1(−x), so this file gives the expm1 + joint figures, not the
recorded ones."""

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
  return config.sweep("data.index", range(60, 70))
