"""The runs of this study, each a variant: ``--config=experiments/studies/hfginv_batch/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/batch_labels_fresh
    'batch_labels_fresh': ('batch-table --count=30 --variants=none --head=fresh', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_labels_fresh100
    'batch_labels_fresh100': ('batch-table --count=30 --variants=none --head_classes=100', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_labels_fresh1000_aux300
    'batch_labels_fresh1000_aux300': (
        'batch-table --count=30 --variants=none --head_classes=1000',
        None, {
        'attack.aux': 300,
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_labels_fresh1000_aux40
    'batch_labels_fresh1000_aux40': (
        'batch-table --count=30 --variants=none --head_classes=1000',
        None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_labels_trained
    'batch_labels_trained': ('batch-table --count=30 --variants=none --head=trained', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_table
    'batch_table': ('batch-table --count=10', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_table_hfginv_tracked: HFGInv's row again once the best iterate waits for its
    # BatchNorm prior (d4e8e74: before, iterates 400-499 of 1500, without the prior's term, could win)
    'batch_table_hfginv_tracked': ('batch-table --count=10 --variants=hfginv', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }),
    # runs/batch_table_unseen: the two presets on batches from images no setting was chosen on
    'batch_table_unseen': ('batch-table --count=5 --start=500 --variants=bn,hfginv', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 100,
    }),
    # runs/batch_table_unseen_hfginv_tracked: its HFGInv row again once the best iterate waits for
    # the BatchNorm prior (d4e8e74)
    'batch_table_unseen_hfginv_tracked': ('batch-table --count=5 --start=500 --variants=hfginv', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 100,
    }),
    # runs/batch_table_unseen_head: HFGInv with per-example head targets, batches 0-1 of the unseen five
    'batch_table_unseen_head': ('batch-table --count=2 --start=500 --variants=head', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 100,
    }),
    # Development batches 0-1 (the 'bn' variant, GradInversion): the TV weight, the client in
    # training mode, and the client returning its BatchNorm statistics with the prior's weight.
    # runs/batch_table_dev_tv*, runs/batch_table_train_dev*, runs/batch_table_moments_dev_*
    **{name: (f'batch-table --count=2 --variants=bn{flags}', None, {
        'attack.iterations': 1500,
        'client.share_statistics': 'moments' in name,
        'client.train_mode': 'train' in name or 'moments' in name,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 500,
    }) for name, flags in (
        ('batch_table_dev_tv0.1', ' --tv=0.1'), ('batch_table_dev_tv0.3', ' --tv=0.3'),
        ('batch_table_train_dev', ''), ('batch_table_train_dev_tv0.1', ' --tv=0.1'),
        ('batch_table_moments_dev_bn1e-4', ''), ('batch_table_moments_dev_bn1e-3', ' --bn=1e-3'),
        ('batch_table_moments_dev_bn1e-2', ' --bn=1e-2'),
        ('batch_table_moments_dev_bn1e-2_tv0.1', ' --bn=1e-2 --tv=0.1'))},
    # runs/batch_table_unseen_tv0.3: the two presets with the TV weight chosen on those
    'batch_table_unseen_tv0.3': ('batch-table --count=5 --start=500 --variants=bn,hfginv --tv=0.3', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 100,
    }),
    # runs/batch_table_unseen_tv0.3_hfginv_tracked: its HFGInv row again once the best iterate
    # waits for the BatchNorm prior (d4e8e74) and each run draws its own dropout masks (46ec9b1)
    'batch_table_unseen_tv0.3_hfginv_tracked': (
        'batch-table --count=5 --start=500 --variants=hfginv --tv=0.3', None, {
        'attack.iterations': 1500,
        'data.batch_size': 8,
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
        'sampling.pool': 100,
    }),
    # runs/train_resnet20_cifar10
    'train_resnet20_cifar10': (
        'train --output_dir=experiments/studies/hfginv_batch/runs/train_resnet20_cifar10',
        None, {
        'client.train_mode': True,
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'model.name': 'resnet20',
        'training.epochs': 5,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
    }),
}

# Runs of programs that take no configuration: run -> the command that made it.
PROGRAMS = {"batch_memory": "gradjax batch-memory --models=resnet18 --batch_sizes=8,16,32,64 "
                            "--output_dir=experiments/studies/hfginv_batch/runs/batch_memory"}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
