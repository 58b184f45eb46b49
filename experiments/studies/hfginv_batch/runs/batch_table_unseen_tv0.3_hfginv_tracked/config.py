# The rows' common configuration of the run in this folder: the command below reproduces it (with --config=<this file>, give that command's own flags too: the table's rows and counts).
# Command: gradjax batch-table --config=experiments/studies/hfginv_batch/config.py:batch_table_unseen_tv0.3_hfginv_tracked --count=5 --start=500 --variants=hfginv --tv=0.3 --data_dir=../shared/data --output_dir=experiments/studies/hfginv_batch/runs/batch_table_unseen_tv0.3_hfginv_tracked
"""A gradjax configuration (gradjax.run.config)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.data_dir = '../shared/data'
  c.data.batch_size = 8
  c.model.checkpoint = 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz'
  c.client.train_mode = False
  c.client.share_statistics = False
  c.attack.iterations = 1500
  c.attack.aux = 40
  c.sampling.pool = 100
  c.sampling.classes_per_batch = 4
  return c
