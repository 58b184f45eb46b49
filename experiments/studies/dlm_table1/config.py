"""The runs of this study, each a variant: ``--config=experiments/studies/dlm_table1/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
BASE = {
    'attack.preset': 'dlm',
    'client.name': 'fedavg',
    'data.dataset': 'cifar100',
    'execution.chunk': 1000,
    'model.name': 'mlp',
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/dlm_gamma
    'dlm_gamma': ("dlm-table --count=20 '--methods=DLM;gamma'", None, {'attack.box': False}),
    # runs/dlm_gamma_box
    'dlm_gamma_box': ("dlm-table --count=20 '--methods=DLM;gamma'", None, {'attack.box': True}),
    # runs/dlm_gamma200_box; unseen, --start=60: runs/dlm_gamma200_box_60-79. γ as the authors' released
    # DLM.py starts and moves it (k_init 200, Adam lr 0.1 on k itself: 0.0005 on log γ at the start).
    'dlm_gamma200_box': ("dlm-table --count=20 '--methods=DLM, γ from 200 on Adam lr 0.0005'", None,
                         {'attack.box': True}),
    # runs/dlm_table
    'dlm_table': ('dlm-table --count=20', None, {'attack.box': False}),
    # runs/dlm_table_box
    'dlm_table_box': ('dlm-table --count=20', None, {'attack.box': True}),
    # runs/dlm_table_box_torch_init; unseen, --start=60: runs/dlm_table_box_torch_init_60-79.
    # The MLP drawn as an untrained PyTorch module (the paper's) instead of Flax's default.
    'dlm_table_box_torch_init': ('dlm-table --count=20', None, {'attack.box': True, 'model.init': 'torch'}),
    # runs/dlm_table_box_uniform_init; unseen, --start=60: runs/dlm_table_box_uniform_init_60-79.
    # The MLP drawn as the authors' released DLM.py draws it: DLG's weights_init, every weight and
    # bias U(-0.5, 0.5), applied over the module's own init.
    'dlm_table_box_uniform_init': ('dlm-table --count=20', None, {'attack.box': True, 'model.init': 'uniform'}),
    # runs/dlm_plus_released; unseen, --start=60: runs/dlm_plus_released_60-79. DLM+ beside DLM+ as the
    # authors' released DLM_plus.py runs it (mean of the layers' norms, true label, 5000 iterations),
    # both unclamped as that code.
    'dlm_plus_released': ("dlm-table --count=20 '--methods=DLM+;DLM+, released code'", None,
                          {'attack.box': False}),
    # runs/dlm_plus_released_box; unseen, --start=60: runs/dlm_plus_released_box_60-79. The same two
    # rows clamped, as the table's reproducing rows are.
    'dlm_plus_released_box': ("dlm-table --count=20 '--methods=DLM+;DLM+, released code'", None,
                              {'attack.box': True}),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
