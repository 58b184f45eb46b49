"""The recipes of this study's runs: ``--config=experiments/studies/idlg_labels/config.py:VARIANT``
runs VARIANT again (analysis.md says what each shows), with the command and arguments its
entry names; a sweep's recorded images are its ``get_sweep``, and ``--start``/``--count`` choose
others. Each run's resolved configuration is its folder's ``config.py``.
"""

from gradjax import config

BASE = {}  # options every variant sets (over gradjax.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/idlg_labels_cifar10_1000.json
    'idlg_labels_cifar10': (
        'label-accuracy --count=1000 --output=experiments/studies/idlg_labels/runs/idlg_labels_cifar10_1000.json',
        None, {
        'data.dataset': 'cifar10',
    }),
    # runs/idlg_labels_cifar100_148.json
    'idlg_labels_cifar100': (
        'label-accuracy --count=148 --output=experiments/studies/idlg_labels/runs/idlg_labels_cifar100_148.json',
        None, {
        'data.dataset': 'cifar100',
    }),
    # runs/idlg_labels_lfw_1000.json
    'idlg_labels_lfw': (
        'label-accuracy --count=1000 --output=experiments/studies/idlg_labels/runs/idlg_labels_lfw_1000.json',
        None, {
        'data.dataset': 'lfw',
        'data.image_size': 32,
    }),
    # runs/idlg_labels_mnist_1000.json
    'idlg_labels_mnist': (
        'label-accuracy --count=1000 --output=experiments/studies/idlg_labels/runs/idlg_labels_mnist_1000.json',
        None, {
        'data.dataset': 'mnist',
    }),
}


def get_config(variant):
  if variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}; choose one of {', '.join(VARIANTS)}")
  return config.overridden({**BASE, **VARIANTS[variant][2]})


def get_sweep(variant):
  images = VARIANTS[variant][1]
  return None if images is None else config.sweep("data.index", images)
