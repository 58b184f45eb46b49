# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax batch-table --checkpoint=experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz --data_dir=../shared/data --count=2 --iterations=1500 --variants=bn --pool=500 --batch_size=8 --train_mode --share_statistics --bn=1e-2 --output_dir=experiments/studies/hfginv_batch/runs/batch_table_moments_dev_bn1e-2
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.data_dir = '../shared/data'
  c.data.batch_size = 8
  c.model.checkpoint = 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz'
  c.client.train_mode = True
  c.client.share_statistics = True
  c.attack.iterations = 1500
  c.attack.aux = 40
  c.sampling.pool = 500
  c.sampling.classes_per_batch = 4
  return c
