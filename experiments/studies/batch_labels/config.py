"""The runs of this study, each a variant: ``--config=experiments/studies/batch_labels/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

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
    # runs/label_recovery_lenet_zhu_cifar10_b8_unseen.json: CIFAR-10 training images 0-999, outside
    # the first row's pool (test images 0-999)
    'label_recovery_lenet_zhu_cifar10_b8_unseen': (
        'label-recovery --count=20 --aux_size=16 --output=experiments/studies/batch_labels/runs/label_recovery_lenet_zhu_cifar10_b8_unseen.json',
        None, {
        'data.batch_size': 8,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'none',
        'model.init': 'uniform',
        'model.num_classes': 10,
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
