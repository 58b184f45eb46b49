"""Inverting Gradients' proposed attack (the preset) on LeNet(Zhu) untrained, normalised CIFAR-10,
the unseen images 500-599 (../shared/PROTOCOLS.md)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.data.dataset = "cifar10"
  c.data.normalization = "cifar10"
  c.model.name = "lenet_zhu"
  c.model.checkpoint = "experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz"
  c.attack.preset = "inverting_gradients"
  return c


def get_sweep():
  return config.sweep("data.index", range(500, 600))
