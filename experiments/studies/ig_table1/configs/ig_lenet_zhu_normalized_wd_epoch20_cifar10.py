# runs/ig_lenet_zhu_normalized_wd_epoch20_cifar10_0-19, runs/ig_lenet_zhu_normalized_wd_epoch20_cifar10_20-99 again: gradjax sweep --config=<this file>.
# Recorded: python experiments/sweep.py --attack=inverting_gradients --checkpoint=experiments/results/train_lenet_zhu_cifar10_normalized_wd/epoch_20.npz --normalization=cifar10 --dataset=cifar10 --start=0 --count=20 --output_dir=experiments/results/ig_lenet_zhu_normalized_wd_epoch20_cifar10_0-19 --overwrite
#           python experiments/sweep.py --attack=inverting_gradients --checkpoint=experiments/results/train_lenet_zhu_cifar10_normalized_wd/epoch_20.npz --normalization=cifar10 --dataset=cifar10 --start=20 --count=80 --output_dir=experiments/results/ig_lenet_zhu_normalized_wd_epoch20_cifar10_20-99 --overwrite
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
  c.data.normalization = 'cifar10'
  c.data.sequence_length = 15
  c.data.vocab_size = None
  c.model.name = 'lenet_zhu'
  c.model.checkpoint = 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized_wd/epoch_20.npz'
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
  c.defense.spec = None
  c.attack.preset = 'inverting_gradients'
  c.attack.iterations = None
  c.attack.objective = None
  c.attack.optimizer = None
  c.attack.learning_rate = None
  c.attack.schedule = None
  c.attack.tol = None
  c.attack.distance = None
  c.attack.layer_weights = None
  c.attack.priors = None
  c.attack.labels = None
  c.attack.aux = 40
  c.attack.box = None
  c.attack.dummy_init = None
  c.attack.one_sample_per_step = None
  c.attack.gamma = None
  c.attack.restarts = 1
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
  c.output.lpips = 'auto'
  return c


def get_sweep():
  return [
      {'data.index': 0},
      {'data.index': 1},
      {'data.index': 2},
      {'data.index': 3},
      {'data.index': 4},
      {'data.index': 5},
      {'data.index': 6},
      {'data.index': 7},
      {'data.index': 8},
      {'data.index': 9},
      {'data.index': 10},
      {'data.index': 11},
      {'data.index': 12},
      {'data.index': 13},
      {'data.index': 14},
      {'data.index': 15},
      {'data.index': 16},
      {'data.index': 17},
      {'data.index': 18},
      {'data.index': 19},
      {'data.index': 20},
      {'data.index': 21},
      {'data.index': 22},
      {'data.index': 23},
      {'data.index': 24},
      {'data.index': 25},
      {'data.index': 26},
      {'data.index': 27},
      {'data.index': 28},
      {'data.index': 29},
      {'data.index': 30},
      {'data.index': 31},
      {'data.index': 32},
      {'data.index': 33},
      {'data.index': 34},
      {'data.index': 35},
      {'data.index': 36},
      {'data.index': 37},
      {'data.index': 38},
      {'data.index': 39},
      {'data.index': 40},
      {'data.index': 41},
      {'data.index': 42},
      {'data.index': 43},
      {'data.index': 44},
      {'data.index': 45},
      {'data.index': 46},
      {'data.index': 47},
      {'data.index': 48},
      {'data.index': 49},
      {'data.index': 50},
      {'data.index': 51},
      {'data.index': 52},
      {'data.index': 53},
      {'data.index': 54},
      {'data.index': 55},
      {'data.index': 56},
      {'data.index': 57},
      {'data.index': 58},
      {'data.index': 59},
      {'data.index': 60},
      {'data.index': 61},
      {'data.index': 62},
      {'data.index': 63},
      {'data.index': 64},
      {'data.index': 65},
      {'data.index': 66},
      {'data.index': 67},
      {'data.index': 68},
      {'data.index': 69},
      {'data.index': 70},
      {'data.index': 71},
      {'data.index': 72},
      {'data.index': 73},
      {'data.index': 74},
      {'data.index': 75},
      {'data.index': 76},
      {'data.index': 77},
      {'data.index': 78},
      {'data.index': 79},
      {'data.index': 80},
      {'data.index': 81},
      {'data.index': 82},
      {'data.index': 83},
      {'data.index': 84},
      {'data.index': 85},
      {'data.index': 86},
      {'data.index': 87},
      {'data.index': 88},
      {'data.index': 89},
      {'data.index': 90},
      {'data.index': 91},
      {'data.index': 92},
      {'data.index': 93},
      {'data.index': 94},
      {'data.index': 95},
      {'data.index': 96},
      {'data.index': 97},
      {'data.index': 98},
      {'data.index': 99},
  ]
