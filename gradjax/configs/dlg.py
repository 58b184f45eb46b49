"""DLG (Zhu et al., NeurIPS 2019; mit-han-lab/dlg): their LeNet, every weight U(-0.5, 0.5), sigmoid,
on one CIFAR-10 image in [0, 1] without normalisation; the attack is ``presets.dlg()``.

Their figures use CIFAR-100, MNIST, LFW and SVHN images; ``--dataset`` changes it.
"""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "dlg"
  c.model.name = "lenet_zhu"
  c.data.dataset = "cifar10"
  return c
