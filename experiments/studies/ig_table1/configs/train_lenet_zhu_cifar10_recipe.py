# Trains runs/train_lenet_zhu_cifar10_recipe again: gradjax train --config=<this file> --output_dir=<folder>.
# Recorded: python experiments/train.py --model=lenet_zhu --dataset=cifar10_train --train_count=50000 --test_dataset=cifar10 --test_count=1017 --batch_size=128 --lr=0.1 --momentum=0.9 --nesterov --weight_decay=5e-4 --epochs=120 --lr_milestones=44,75,105 --augment --normalization=cifar10 --output_dir=experiments/results/train_lenet_zhu_cifar10_recipe --overwrite
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.modality = 'image'
  c.data.dataset = 'cifar10_train'
  c.data.data_dir = None
  c.data.batch_size = 128
  c.data.image_size = None
  c.data.channels = None
  c.data.normalization = 'cifar10'
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.model.name = 'lenet_zhu'
  c.model.init = None
  c.model.act = None
  c.model.conv = 'auto'
  c.model.text_dim = 200
  c.model.text_heads = 4
  c.model.text_ffn = 200
  c.model.text_layers = 2
  c.client.name = 'fedsgd'
  c.client.train_mode = False
  c.client.local_epochs = 1
  c.client.local_batch_size = None
  c.client.local_lr = 0.02
  c.client.local_momentum = 0.0
  c.defense.spec = None
  c.training.train_count = 50000
  c.training.test_count = 1017
  c.training.data_seed = 0
  c.training.test_dataset = 'cifar10'
  c.training.epochs = 120
  c.training.lr = 0.1
  c.training.momentum = 0.9
  c.training.weight_decay = 0.0005
  c.training.nesterov = True
  c.training.lr_milestones = '44,75,105'
  c.training.lr_gamma = 0.1
  c.training.augment = True
  c.training.clients = 1
  return c
