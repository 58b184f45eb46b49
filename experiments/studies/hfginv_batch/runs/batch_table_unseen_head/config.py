# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax batch-table --count=5 --start=500 --variants=head --config=experiments/studies/hfginv_batch/config.py:batch_table_unseen --output_dir=experiments/studies/hfginv_batch/runs/batch_table_unseen_head
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
  c.sampling.pool = 100
  c.sampling.classes_per_batch = 4
  return c
