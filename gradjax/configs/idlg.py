"""iDLG (Zhao et al., 2020): DLG's LeNet with the label read off the last layer's gradient, on one
MNIST image (their label-accuracy runs: MNIST, CIFAR-100, LFW, a fresh random model each)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "idlg"
  c.model.name = "lenet_zhu"
  c.data.dataset = "mnist"
  return c
