"""The runs of this study, each a variant: ``--config=experiments/studies/text_sapag/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
BASE = {
    'data.dataset': 'pydoc',
    'data.modality': 'text',
    'model.name': 'transformer',
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/text_sapag_readings
    'text_sapag_readings': (
        "text-table '--methods=SAPAG;SAPAG-literal;SAPAG-uniform' --searches=tokens --count=3",
        None, {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'output.lpips': 'none',
    }),
    # runs/text_table
    'text_table': ('text-table --count=20', None, {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'model.checkpoint': 'experiments/studies/text_sapag/runs/train_transformer_pydoc_fedsgd/epoch_1.npz',
        'output.lpips': 'none',
    }),
    # runs/text_table_unseen: DLG with the token search (the table's best row) on sentences 20-39,
    # which no setting was chosen on
    'text_table_unseen': ("text-table --methods=DLG --searches=tokens --start=20 --count=20", None, {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'output.lpips': 'none',
    }),
    # runs/text_table_unseen_embeddings: the three embedding-search rows on the same sentences 20-39
    'text_table_unseen_embeddings': (
        "text-table '--methods=DLG;SAPAG;cosine' --searches=embeddings --start=20 --count=20", None, {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'output.lpips': 'none',
    }),
    # runs/train_transformer_pydoc_fedsgd (not kept: its epoch_1.npz, 5.9 MB, takes 16 s on one core)
    'train_transformer_pydoc': (
        'train --output_dir=experiments/studies/text_sapag/runs/train_transformer_pydoc_fedsgd',
        None, {
        'data.batch_size': 32,
        'training.epochs': 1,
        'training.lr': 0.1,
        'training.test_count': None,
        'training.train_count': None,
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
