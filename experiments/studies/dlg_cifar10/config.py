"""The recipes of this study's runs: ``--config=experiments/studies/dlg_cifar10/config.py:VARIANT``
runs VARIANT again (analysis.md says what each shows), with the command and arguments its
entry names; a sweep's recorded images are its ``get_sweep``, and ``--start``/``--count`` choose
others. Each run's resolved configuration is its folder's ``config.py``.
"""

from gradjax import config

BASE = {}  # options every variant sets (over gradjax.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/dlg_lenet_zhu_cifar10_0-19, runs/dlg_lenet_zhu_cifar10_500-519 (--start=500 --count=20)
    'dlg_lenet_zhu_cifar10': ('sweep', range(0, 20), {
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
    }),
}


def get_config(variant):
  if variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}; choose one of {', '.join(VARIANTS)}")
  return config.overridden({**BASE, **VARIANTS[variant][2]})


def get_sweep(variant):
  images = VARIANTS[variant][1]
  return None if images is None else config.sweep("data.index", images)
