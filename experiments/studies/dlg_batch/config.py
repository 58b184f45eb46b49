"""The runs of this study, each a variant: ``--config=experiments/studies/dlg_batch/config.py:VARIANT``
(gradjax.config.recipes); analysis.md says what each shows.
"""

from gradjax import config

# Options every variant sets (over gradjax.config.defaults()).
BASE = {
    'attack.iterations': 8000,
    'attack.tol': 1e-05,
    'data.normalization': 'none',
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_1
    'dlg_batch_1': ('sweep', range(0, 5), {'data.dataset': 'cifar10'}),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2
    'dlg_batch_2': ('sweep', range(0, 9, 2), {'data.batch_size': 2, 'data.dataset': 'cifar10'}),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2_cifar100
    'dlg_batch_2_cifar100': ('sweep', range(0, 9, 2), {
        'data.batch_size': 2,
        'data.dataset': 'cifar100',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2_fixed
    'dlg_batch_2_fixed': ('sweep', range(0, 9, 2), {
        'attack.optimizer': 'lbfgs_fixed',
        'data.batch_size': 2,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2_known
    'dlg_batch_2_known': ('sweep', range(0, 9, 2), {
        'attack.labels': 'known',
        'data.batch_size': 2,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2_one_sample
    'dlg_batch_2_one_sample': ('sweep', range(0, 9, 2), {
        'attack.one_sample_per_step': True,
        'data.batch_size': 2,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_2_restarts8
    'dlg_batch_2_restarts8': ('sweep', range(0, 9, 2), {
        'attack.restarts': 8,
        'data.batch_size': 2,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_4
    'dlg_batch_4': ('sweep', range(0, 17, 4), {'data.batch_size': 4, 'data.dataset': 'cifar10'}),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_4_cifar100
    'dlg_batch_4_cifar100': ('sweep', range(0, 17, 4), {
        'data.batch_size': 4,
        'data.dataset': 'cifar100',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_4_fixed
    'dlg_batch_4_fixed': ('sweep', range(0, 17, 4), {
        'attack.optimizer': 'lbfgs_fixed',
        'data.batch_size': 4,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_4_known
    'dlg_batch_4_known': ('sweep', range(0, 17, 4), {
        'attack.labels': 'known',
        'data.batch_size': 4,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_4_one_sample
    'dlg_batch_4_one_sample': ('sweep', range(0, 17, 4), {
        'attack.one_sample_per_step': True,
        'data.batch_size': 4,
        'data.dataset': 'cifar10',
    }),
    # Runs experiments/studies/dlg_batch/runs/dlg_batch_8
    'dlg_batch_8': ('sweep', range(0, 33, 8), {'data.batch_size': 8, 'data.dataset': 'cifar10'}),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
