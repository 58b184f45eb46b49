# runs/label_recovery_lenet_zhu_cifar10_b8.json again: gradjax label-recovery --config=<this file>
# --count=20 --aux_size=16 --output=<file>.json
# Recorded: python experiments/label_recovery.py --output=experiments/results/label_recovery_lenet_zhu_cifar10_b8.json
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.modality = 'image'
  c.data.dataset = 'cifar10'
  c.data.data_dir = None
  c.data.index = 0
  c.data.batch_size = 8
  c.data.image_size = None
  c.data.channels = None
  c.data.normalization = 'none'
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.model.name = 'lenet_zhu'
  c.model.checkpoint = None
  c.model.weights = None
  c.model.rename = None
  c.model.init = 'uniform'
  c.model.act = None
  c.model.num_classes = 10
  c.model.conv = 'auto'
  c.model.text_dim = 200
  c.model.text_heads = 4
  c.model.text_ffn = 200
  c.model.text_layers = 2
  c.sampling.pool = 1000
  c.sampling.classes_per_batch = 4
  return c
