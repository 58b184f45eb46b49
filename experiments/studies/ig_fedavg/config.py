"""The runs of this study, each a variant: ``--config=experiments/studies/ig_fedavg/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
BASE = {
    'attack.label_source': 'known',
    'attack.preset': 'inverting_gradients_fedavg',
    'client.name': 'fedavg',
    'data.dataset': 'cifar10',
    'data.normalization': 'cifar10',
    'execution.chunk': 200,
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/fedavg_replay_1img_5steps
    'fedavg_replay_1img_5steps': ('reconstruct', None, {
        'attack.iterations': 2400,
        'client.local_batch_size': 1,
        'client.local_epochs': 5,
        'client.local_lr': 0.0001,
        'model.name': 'convnet-8',
    }),
    # runs/fedavg_replay_1img_5steps_convnet64 (image 0); unseen, --index=500 --lpips=none:
    # runs/fedavg_replay_1img_5steps_convnet64_500
    'fedavg_replay_1img_5steps_convnet64': ('reconstruct', None, {
        'attack.iterations': 4800,
        'client.local_batch_size': 1,
        'client.local_epochs': 5,
        'client.local_lr': 0.0001,
        'model.name': 'convnet',
    }),
    # runs/fedavg_replay_1img_5steps_convnet64_lr0.1
    'fedavg_replay_1img_5steps_convnet64_lr0.1': ('reconstruct', None, {
        'attack.iterations': 4800,
        'attack.learning_rate': 0.1,
        'client.local_batch_size': 1,
        'client.local_epochs': 5,
        'client.local_lr': 0.0001,
        'model.name': 'convnet',
    }),
    # runs/fedavg_replay_1img_5steps_convnet64_torch_init (image 0); unseen, --index=500 --lpips=none:
    # runs/fedavg_replay_1img_5steps_convnet64_torch_init_500 (and at --iterations=1200:
    # runs/fedavg_replay_1img_5steps_convnet64_torch_init_500_1200).
    # The authors' ConvNet is a PyTorch module left at PyTorch's default init (weights and biases
    # U(±1/sqrt(fan_in))); the rows above draw Flax's (LeCun normal, zero biases).
    'fedavg_replay_1img_5steps_convnet64_torch_init': ('reconstruct', None, {
        'attack.iterations': 4800,
        'client.local_batch_size': 1,
        'client.local_epochs': 5,
        'client.local_lr': 0.0001,
        'model.init': 'torch',
        'model.name': 'convnet',
    }),
    # runs/fedavg_replay_4img_b2_convnet64 (images 0-3); unseen, --index=500 --lpips=none:
    # runs/fedavg_replay_4img_b2_convnet64_500-503
    'fedavg_replay_4img_b2_convnet64': ('reconstruct', None, {
        'attack.iterations': 4800,
        'client.local_batch_size': 2,
        'client.local_lr': 0.0001,
        'data.batch_size': 4,
        'model.name': 'convnet',
    }),
    # The row above with the authors' init (PyTorch's default), unseen, --index=500 --lpips=none:
    # runs/fedavg_replay_4img_b2_convnet64_torch_init_500-503
    'fedavg_replay_4img_b2_convnet64_torch_init': ('reconstruct', None, {
        'attack.iterations': 4800,
        'client.local_batch_size': 2,
        'client.local_lr': 0.0001,
        'data.batch_size': 4,
        'model.init': 'torch',
        'model.name': 'convnet',
    }),
    # runs/fedavg_replay_4img_b2_multiset
    'fedavg_replay_4img_b2_multiset': ('reconstruct', None, {
        'attack.iterations': 1200,
        'client.local_batch_size': 2,
        'client.local_lr': 0.1,
        'client.shared_labels': 'multiset',
        'data.batch_size': 4,
        'model.name': 'convnet-8',
    }),
    # runs/fedavg_replay_4img_b2_ordered
    'fedavg_replay_4img_b2_ordered': ('reconstruct', None, {
        'attack.iterations': 1200,
        'client.local_batch_size': 2,
        'client.local_lr': 0.1,
        'data.batch_size': 4,
        'model.name': 'convnet-8',
    }),
    # runs/fedavg_replay_4img_b2_search
    'fedavg_replay_4img_b2_search': ('reconstruct', None, {
        'attack.iterations': 1200,
        'attack.permutations': 6,
        'client.local_batch_size': 2,
        'client.local_lr': 0.1,
        'client.shared_labels': 'multiset',
        'data.batch_size': 4,
        'execution.halving_keep': 0.2,
        'execution.halving_rounds': 3,
        'model.name': 'convnet-8',
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
