"""SAPAG (Wang et al.), Table I: their LeNet-5 (4 sigmoid convolutions, kernel 5, 12 channels) with
uniform U(-0.5, 0.5) init, one MNIST image; the attack is ``presets.sapag()`` (Gaussian-kernel
distance, L-BFGS lr 1, box)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "sapag"
  c.model.name = "lenet5"
  c.model.init = "uniform"
  c.data.dataset = "mnist"
  return c
