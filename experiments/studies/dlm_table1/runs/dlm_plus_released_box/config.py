# The rows' common configuration of the run in this folder: the command below reproduces it (with --config=<this file>, give that command's own flags too: the table's rows and counts).
# Command: gradjax dlm-table --config=config.py:dlm_plus_released_box --count=20 '--methods=DLM+;DLM+, released code' --data_dir=../../../../shared/data --output_dir=runs/dlm_plus_released_box
"""A gradjax configuration (gradjax.run.config)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.seed = 0
  c.data.modality = 'image'
  c.data.dataset = 'cifar100'
  c.data.data_dir = '../../../../shared/data'
  c.data.batch_size = 1
  c.data.image_size = None
  c.data.channels = None
  c.data.normalization = None
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.data.tokenizer = 'words'
  c.model.name = 'mlp'
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
  c.client.name = 'fedavg'
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
  c.defense.dp_sgd_max_norm = None
  c.defense.dp_sgd_noise_multiplier = 0.0
  c.defense.dp_sgd_sampling_rate = 1.0
  c.defense.dp_sgd_steps = 1
  c.defense.dp_sgd_delta = 1e-05
  c.defense.dp_sgd_poisson = False
  c.defense.dp_sgd_expected_batch_size = None
  c.attack.preset = 'dlm'
  c.attack.adaptive = False
  c.attack.iterations = None
  c.attack.matched = None
  c.attack.optimizer = None
  c.attack.learning_rate = None
  c.attack.schedule = None
  c.attack.tol = None
  c.attack.distance = None
  c.attack.depth_rule = None
  c.attack.priors = None
  c.attack.label_source = None
  c.attack.aux = 40
  c.attack.box = True
  c.attack.dummy_init = None
  c.attack.one_sample_per_step = None
  c.attack.gamma = None
  c.attack.head_features = None
  c.attack.smoothing = None
  c.attack.iterate = None
  c.attack.restarts = 1
  c.attack.budget = None
  c.attack.permutations = 1
  c.attack.text_search = 'embeddings'
  c.attack.restrict_tokens = True
  c.execution.strategy = 'auto'
  c.execution.map_batch_size = None
  c.execution.halving_rounds = 1
  c.execution.halving_keep = 0.5
  c.execution.shard = False
  c.execution.chunk = 1000
  c.execution.matmul_precision = 'float32'
  c.execution.remat = None
  c.execution.clients_per_run = None
  c.output.lpips = 'auto'
  return c
