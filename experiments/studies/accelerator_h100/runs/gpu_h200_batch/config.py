# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax batch-table --checkpoint=experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz --variants=bn,hfginv --count=10 --batch_size=8 --iterations=15000 --resume --data_dir=.devdata --output_dir=/root/out/batch --batches=0,1
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.data_dir = '.devdata'
  c.data.batch_size = 8
  c.model.checkpoint = 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz'
  c.attack.iterations = 15000
  c.attack.aux = 40
  c.sampling.pool = 500
  c.sampling.classes_per_batch = 4
  return c
