# Trains the text model of runs/text_table again: gradjax train --config=<this file>
# --output_dir=runs/train_transformer_pydoc_fedsgd (its epoch_1.npz, 5.9 MB, is not kept: 16 s on one core).
# Recorded: python experiments/train.py --modality=text --epochs=1 --lr=0.1
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.modality = 'text'
  c.data.dataset = 'pydoc'
  c.data.data_dir = None
  c.data.batch_size = 32
  c.data.image_size = None
  c.data.channels = None
  c.data.normalization = None
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.model.name = 'transformer'
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
  c.training.train_count = None
  c.training.test_count = None
  c.training.data_seed = 0
  c.training.test_dataset = None
  c.training.epochs = 1
  c.training.lr = 0.1
  c.training.momentum = 0.9
  c.training.weight_decay = 0.0
  c.training.nesterov = False
  c.training.lr_milestones = ''
  c.training.lr_gamma = 0.1
  c.training.augment = False
  c.training.clients = 1
  return c
