"""Inverting Gradients (Geiping et al., NeurIPS 2020), Table 1: ResNet20-4 (untrained), one CIFAR-10
validation image, normalised inputs; the attack is ``presets.inverting_gradients()`` (cosine over all
layers, TV 1e-4, signed Adam lr 0.1 with step decay, 4800 iterations, labels known)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "inverting_gradients"
  c.model.name = "resnet20-4"
  c.data.dataset = "cifar10"
  c.data.normalization = "cifar10"
  return c
