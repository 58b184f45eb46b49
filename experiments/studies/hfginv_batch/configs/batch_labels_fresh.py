# runs/batch_labels_fresh again: gradjax batch-table --config=<this file> --count=30 --variants=none --head=fresh
# Recorded: python experiments/batch_table.py --checkpoint=experiments/results/train_resnet20_cifar10/epoch_5.npz --count=30 --variants=none --head=fresh --output_dir=experiments/results/batch_labels_fresh --overwrite
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
