"""The runs of this study, each a variant: ``--config=experiments/studies/dlg_cifar10/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/dlg_lenet_zhu_cifar10_0-19, runs/dlg_lenet_zhu_cifar10_500-519 (--start=500 --count=20)
    'dlg_lenet_zhu_cifar10': ('sweep', range(0, 20), {
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
