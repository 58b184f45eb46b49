# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax train --config=experiments/studies/ig_table1/config.py:train_resnet20-4_cifar10_normalized_wd_torchvision_init --output_dir=experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init
"""A gradjax configuration (gradjax.run.config)."""

from gradjax.run import config


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
  c.data.tokenizer = 'words'
  c.model.name = 'resnet20-4'
  c.model.init = 'torchvision'
  c.model.act = None
  c.model.conv = 'auto'
  c.model.text_dim = 200
  c.model.text_heads = 4
  c.model.text_ffn = 200
  c.model.text_layers = 2
  c.client.name = 'fedsgd'
  c.client.train_mode = True
  c.client.share_statistics = False
  c.client.local_epochs = 1
  c.client.local_batch_size = None
  c.client.local_lr = 0.01
  c.client.local_momentum = 0.0
  c.defense.spec = None
  c.training.train_count = 50000
  c.training.test_count = 1017
  c.training.data_seed = 0
  c.training.test_dataset = 'cifar10'
  c.training.epochs = 1
  c.training.lr = 0.1
  c.training.momentum = 0.9
  c.training.weight_decay = 0.0005
  c.training.nesterov = False
  c.training.lr_milestones = ''
  c.training.lr_gamma = 0.1
  c.training.augment = False
  c.training.clients = 1
  return c
