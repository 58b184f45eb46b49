# runs/idlg_labels_cifar10_1000.json again: gradjax label-accuracy --config=experiments/studies/idlg_labels/configs/cifar10.py --count=1000 --output=<file>
# Recorded command: python experiments/label_accuracy.py --dataset=cifar10 --count=1000 --output=experiments/results/idlg_labels_cifar10_1000.json
"""A gradjax configuration (gradjax.config)."""

from gradjax import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.modality = 'image'
  c.data.dataset = 'cifar10'
  c.data.data_dir = None
  c.data.index = 0
  c.data.batch_size = 1
  c.data.image_size = None
  c.data.channels = None
  c.data.normalization = None
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.model.name = 'lenet_zhu'
  c.model.checkpoint = None
  c.model.weights = None
  c.model.rename = None
  c.model.init = None
  c.model.act = None
  c.model.num_classes = None
  c.model.conv = 'auto'
  c.model.text_dim = 200
  c.model.text_heads = 4
  c.model.text_ffn = 200
  c.model.text_layers = 2
  c.client.name = 'fedsgd'
  c.client.train_mode = False
  c.client.local_epochs = 1
  c.client.local_batch_size = None
  c.client.local_lr = 0.01
  c.client.local_momentum = 0.0
  c.client.shared_labels = 'ordered'
  c.client.observation = None
  c.client.num_samples = None
  c.client.force = False
  return c
