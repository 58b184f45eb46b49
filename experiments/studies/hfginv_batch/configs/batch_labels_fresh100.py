# runs/batch_labels_fresh100 again: gradjax batch-table --config=<this file> --count=30 --variants=none --head_classes=100
# Recorded: python experiments/batch_table.py --checkpoint=experiments/results/train_resnet20_cifar10/epoch_5.npz --count=30 --variants=none --head_classes=100 --output_dir=experiments/results/batch_labels_fresh100 --overwrite
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.data_dir = None
  c.data.batch_size = 8
  c.model.checkpoint = 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz'
  c.attack.iterations = 1500
  c.attack.aux = 40
  c.sampling.pool = 500
  c.sampling.classes_per_batch = 4
  return c
