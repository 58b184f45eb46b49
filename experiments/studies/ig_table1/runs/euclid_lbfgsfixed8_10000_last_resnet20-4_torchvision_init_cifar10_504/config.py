# The configuration of the run in this folder: --config=<this file> reproduces it.
# Command: gradjax sweep --config=experiments/studies/ig_table1/config.py:euclid_lbfgsfixed8_10000_last_resnet20-4_torchvision_init_cifar10 --start=504 --count=1 --lpips=none --output_dir=experiments/studies/ig_table1/runs/euclid_lbfgsfixed8_10000_last_resnet20-4_torchvision_init_cifar10_504
"""A gradjax configuration (gradjax.run.config)."""

from gradjax.run import config


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
  c.data.normalization = 'cifar10'
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.data.tokenizer = 'words'
  c.model.name = 'resnet20-4'
  c.model.checkpoint = None
  c.model.weights = None
  c.model.rename = None
  c.model.init = 'torchvision'
  c.model.act = None
  c.model.num_classes = None
  c.model.conv = 'auto'
  c.model.text_dim = 200
  c.model.text_heads = 4
  c.model.text_ffn = 200
  c.model.text_layers = 2
  c.client.name = 'fedsgd'
  c.client.train_mode = False
  c.client.share_statistics = False
  c.client.local_epochs = 1
  c.client.local_batch_size = None
  c.client.local_lr = 0.01
  c.client.local_momentum = 0.0
  c.client.shared_labels = 'ordered'
  c.client.observation = None
  c.client.num_samples = None
  c.client.force = False
  c.defense.spec = None
  c.attack.preset = 'dlg'
  c.attack.adaptive = False
  c.attack.iterations = 10000
  c.attack.matched = None
  c.attack.optimizer = 'lbfgs_fixed'
  c.attack.learning_rate = None
  c.attack.schedule = None
  c.attack.tol = None
  c.attack.distance = None
  c.attack.depth_rule = None
  c.attack.priors = None
  c.attack.label_source = 'known'
  c.attack.aux = 40
  c.attack.box = None
  c.attack.dummy_init = None
  c.attack.one_sample_per_step = None
  c.attack.gamma = None
  c.attack.head_features = None
  c.attack.smoothing = None
  c.attack.iterate = 'last'
  c.attack.restarts = 8
  c.attack.budget = None
  c.attack.permutations = 1
  c.attack.text_search = 'embeddings'
  c.attack.restrict_tokens = True
  c.execution.strategy = 'auto'
  c.execution.map_batch_size = None
  c.execution.halving_rounds = 1
  c.execution.halving_keep = 0.5
  c.execution.shard = False
  c.execution.chunk = 100
  c.execution.matmul_precision = 'float32'
  c.execution.remat = None
  c.execution.clients_per_run = None
  c.output.lpips = 'none'
  return c


def get_sweep():
  return [
      {'data.index': 504},
  ]
