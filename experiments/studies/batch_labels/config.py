"""The recipes of this study's runs: ``--config=experiments/studies/batch_labels/config.py:VARIANT``
runs VARIANT again (analysis.md says what each shows), with the command and arguments its
entry names; a sweep's recorded images are its ``get_sweep``, and ``--start``/``--count`` choose
others. Each run's resolved configuration is its folder's ``config.py``.
"""

from gradjax import config

BASE = {}  # options every variant sets (over gradjax.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/label_recovery_lenet_zhu_cifar10_b8.json
    'label_recovery_lenet_zhu_cifar10_b8': (
        'label-recovery --count=20 --aux_size=16 --output=experiments/studies/batch_labels/runs/label_recovery_lenet_zhu_cifar10_b8.json',
        None, {
        'data.batch_size': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.init': 'uniform',
        'model.num_classes': 10,
    }),
}


def get_config(variant):
  if variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}; choose one of {', '.join(VARIANTS)}")
  return config.overridden({**BASE, **VARIANTS[variant][2]})


def get_sweep(variant):
  images = VARIANTS[variant][1]
  return None if images is None else config.sweep("data.index", images)
