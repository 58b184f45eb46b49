"""Inverting Gradients' proposed attack (the preset) on LeNet(Zhu), normalised CIFAR-10, the unseen
images 500-599 (../shared/PROTOCOLS.md): runs/ig_lenet_zhu_{normalized_epoch0,recipe_epoch120}_cifar10_500-599.

  gradjax sweep --config=configs/ig_lenet_zhu_unseen.py:untrained --start=500 --count=100
  (or :trained, the paper's recipe)
"""

from gradjax import config

CHECKPOINTS = {"untrained": "train_lenet_zhu_cifar10_normalized/epoch_0.npz",
               "trained": "train_lenet_zhu_cifar10_recipe/epoch_120.npz"}


def get_config(model="untrained"):
  if model not in CHECKPOINTS:
    raise ValueError(f"model {model!r}; choose one of {', '.join(CHECKPOINTS)}")
  c = config.defaults()
  c.data.dataset = "cifar10"
  c.data.normalization = "cifar10"
  c.model.name = "lenet_zhu"
  c.model.checkpoint = f"experiments/studies/ig_table1/runs/{CHECKPOINTS[model]}"
  c.attack.preset = "inverting_gradients"
  return c

