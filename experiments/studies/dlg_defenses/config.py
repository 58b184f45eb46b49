"""The runs of this study, each a variant: ``--config=experiments/studies/dlg_defenses/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/defense_sweep_dlg_lenet_zhu
    'defense_sweep_dlg_lenet_zhu': ('defense-sweep --count=5 --utility --config.attack.adaptive=True', None, {
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
    }),
    # runs/defense_sweep_noise_rerun: two noise rows again once the defense draws from its own key
    # (d4e8e74), DLG as published only
    'defense_sweep_noise_rerun': ('defense-sweep --count=5 --defenses=gaussian:1e-6;gaussian:1e-4', None, {
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
    }),
    # runs/defense_sweep_dlg_lenet_zhu_unseen: the same sweep on CIFAR-10 test images 500-504
    'defense_sweep_dlg_lenet_zhu_unseen': ('defense-sweep --count=5 --start=500 --utility --config.attack.adaptive=True', None, {
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
