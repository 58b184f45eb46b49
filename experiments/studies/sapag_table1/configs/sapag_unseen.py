"""SAPAG on LeNet-5, CIFAR-100, 2000 iterations: the rows of analysis.md's section on unseen images.

  gradjax sweep --config=configs/sapag_unseen.py:VARIANT --start=S --count=N

VARIANT (images S..S+N-1 as the runs' names give them):
  preset   the preset (−expm1 kernel, iDLG label), Xavier normal: 0-19, 60-79, 80-99
  uniform  the preset with U(-0.5, 0.5) init: 0-9, 60-69
  joint    DLG's joint labels, Xavier normal: 0-19, 20-29, 60-80 (the preset between 2c07203 and
           60b388d); the 2026-11-25 runs (60-69) used it too, but at 651e399, whose kernel was
           1 − exp(−x): today's code gives this variant's figures for them, not the recorded ones.
"""

from gradjax import config

VARIANTS = {"preset": {}, "uniform": {"init": "uniform"}, "joint": {"labels": "joint"}}


def get_config(variant="preset"):
  if variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}; choose one of {', '.join(VARIANTS)}")
  c = config.defaults()
  c.data.dataset = "cifar100"
  c.model.name = "lenet5"
  c.model.init = VARIANTS[variant].get("init", "xavier_normal")
  c.attack.preset = "sapag"
  c.attack.iterations = 2000
  c.attack.labels = VARIANTS[variant].get("labels")
  return c
