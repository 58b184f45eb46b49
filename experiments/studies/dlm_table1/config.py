"""The recipes of this study's runs: ``--config=experiments/studies/dlm_table1/config.py:VARIANT``
runs VARIANT again (analysis.md says what each shows), with the command and arguments its
entry names; a sweep's recorded images are its ``get_sweep``, and ``--start``/``--count`` choose
others. Each run's resolved configuration is its folder's ``config.py``.
"""

from gradjax import config

# Options every variant sets (over gradjax.config.defaults()).
BASE = {
    'attack.preset': 'dlm',
    'client.name': 'fedavg',
    'data.dataset': 'cifar100',
    'model.name': 'mlp',
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/dlm_gamma
    'dlm_gamma': ("dlm-table --count=20 '--methods=DLM;gamma'", None, {'attack.box': False}),
    # runs/dlm_gamma_box
    'dlm_gamma_box': ("dlm-table --count=20 '--methods=DLM;gamma'", None, {'attack.box': True}),
    # runs/dlm_table
    'dlm_table': ('dlm-table --count=20', None, {'attack.box': False}),
    # runs/dlm_table_box
    'dlm_table_box': ('dlm-table --count=20', None, {'attack.box': True}),
}


def get_config(variant):
  if variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}; choose one of {', '.join(VARIANTS)}")
  return config.overridden({**BASE, **VARIANTS[variant][2]})


def get_sweep(variant):
  images = VARIANTS[variant][1]
  return None if images is None else config.sweep("data.index", images)
