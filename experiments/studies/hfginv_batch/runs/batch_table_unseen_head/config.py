# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax batch-table --config=experiments/studies/hfginv_batch/config.py:batch_table_unseen --count=2 --start=500 --variants=head --output_dir=/tmp/unseen_head
"""A gradjax configuration (gradjax.run.config)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.data_dir = None
  c.data.batch_size = 8
  c.model.checkpoint = 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz'
  c.client.train_mode = False
  c.client.share_statistics = False
  c.attack.iterations = 1500
  c.attack.aux = 40
  c.sampling.pool = 100
  c.sampling.classes_per_batch = 4
  return c
