"""Batch inversion on a trained BatchNorm network (``gradjax batch-table``), HFGInv's setting (Ye et
al., batches with repeated labels) at CPU scale: batches of 8 CIFAR-10 test images whose labels come
from 4 classes, drawn from the first 500 test images; HFGInv's feature profile from the 40 images
after them (the paper's count); every ablation variant at 1500 iterations, the presets' 15 000
scaled by a tenth. The attack options other than ``--iterations`` do not apply (the table builds its
variants)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.data.batch_size = 8
  c.sampling.pool = 500
  c.sampling.classes_per_batch = 4
  c.attack.aux = 40
  c.attack.iterations = 1500
  return c
