"""The runs of this study, each a variant: ``--config=experiments/studies/idlg_labels/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

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


get_config, get_sweep = config.recipes(BASE, VARIANTS)
