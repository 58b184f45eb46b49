"""The runs of this study, each a variant: ``--config=experiments/studies/dlg_batch/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.

DLG on CIFAR-10, five batches of B images (B = 1, 2, 4, 8: runs/dlg_batch_<B>), and at B = 2 and 4 one
change each (runs/dlg_batch_<B>_<change>): CIFAR-100's 100 classes, fixed-step L-BFGS, labels known,
one sample per step, and eight restarts (at B = 2 only); runs/dlg_batch_<B>_unseen: the same on images
500.. (CIFAR-10 test), which no setting was chosen on.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
BASE = {
    'attack.iterations': 8000,
    'attack.tol': 1e-05,
    'data.dataset': 'cifar10',
    'data.normalization': 'none',
}

CHANGES = {
    'cifar100': {'data.dataset': 'cifar100'},
    'fixed': {'attack.optimizer': 'lbfgs_fixed'},
    'known': {'attack.label_source': 'known'},
    'one_sample': {'attack.one_sample_per_step': True},
    'restarts8': {'attack.restarts': 8},
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE).
VARIANTS = {f'dlg_batch_{b}': ('sweep', range(0, 5 * b, b), {'data.batch_size': b}) for b in (1, 2, 4, 8)}
VARIANTS['dlg_batch_1'] = ('sweep', range(0, 5), {})  # batch 1 is the default
for _b in (2, 4):
  for _name, _options in CHANGES.items():
    if _name == 'restarts8' and _b == 4:  # not run
      continue
    VARIANTS[f'dlg_batch_{_b}_{_name}'] = ('sweep', range(0, 5 * _b, _b), {'data.batch_size': _b, **_options})

# The same five batches per size on CIFAR-10 test images no setting was chosen on (500..).
for _b in (1, 2, 4, 8):
  VARIANTS[f'dlg_batch_{_b}_unseen'] = ('sweep', range(500, 500 + 5 * _b, _b), {'data.batch_size': _b})

get_config, get_sweep = config.recipes(BASE, VARIANTS)
