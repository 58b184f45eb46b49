# runs/batch_table again: gradjax batch-table --config=<this file> --count=10
# (pool and aux were the program's defaults then, 500 and 40)
# Recorded: python experiments/batch_table.py --checkpoint=experiments/results/train_resnet20_cifar10/epoch_5.npz --count=10 --iterations=1500 --output_dir=runs/batch_table --resume
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
