"""The runs of this study, each a variant: ``--config=experiments/studies/dlm_table1/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
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
    # runs/dlm_table_box_torch_init; unseen, --start=60: runs/dlm_table_box_torch_init_60-79.
    # The MLP drawn as an untrained PyTorch module (the paper's) instead of Flax's default.
    'dlm_table_box_torch_init': ('dlm-table --count=20', None, {'attack.box': True, 'model.init': 'torch'}),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
