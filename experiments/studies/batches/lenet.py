"""The batches study's LeNet rows: Inverting Gradients (cosine over all layers, signed Adam, box,
labels known) against DLG's LeNet (sigmoid, every weight U(-0.5, 0.5)) on CIFAR-10 test images in
[0, 1], 2000 iterations and total variation 0.2: the setting of the issue's comparison with
breaching 0.1.2's Inverting Gradients attacker, whose TV weight is 0.2. The study's program adds the
head-feature weight, the batch size and the images."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.attack.preset = "inverting_gradients"
  c.attack.iterations = 2000
  c.attack.priors = "tv:0.2"
  c.model.name = "lenet_zhu"
  c.data.dataset = "cifar10"
  return c
