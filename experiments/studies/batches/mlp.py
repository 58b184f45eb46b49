"""The batches study's MLP rows: gradjax's exclusive_neurons closed form (gradjax.analytic) on an
untrained mlp-1024 (Flax's default init), CIFAR-10 test images; the study's program sets the width,
the normalisation, the batch size and the images."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "exclusive_neurons"
  c.model.name = "mlp-1024"
  c.data.dataset = "cifar10"
  return c
