"""The runs of this study, each a variant: ``--config=experiments/studies/sapag_table1/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows.
"""

from gradjax.run import config

# Options every variant sets (over gradjax.run.config.defaults()).
BASE = {
    'data.normalization': 'none',
    'model.name': 'lenet5',
}

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/dlg_fixed_10000_lenet5_xavier_cifar100_0-19
    'dlg_fixed_10000_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 10000,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/dlg_fixed_box_lenet5_xavier_mnist_0-9
    'dlg_fixed_box_lenet5_xavier_mnist': ('sweep', range(0, 10), {
        'attack.box': True,
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'mnist',
        'model.init': 'xavier_normal',
    }),
    # runs/dlg_fixed_lenet5_uniform_cifar100_0-9
    'dlg_fixed_lenet5_uniform_cifar100': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'cifar100',
        'model.init': 'uniform',
    }),
    # runs/dlg_fixed_lenet5_uniform_lfw_0-9
    'dlg_fixed_lenet5_uniform_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'uniform',
        'model.num_classes': 100,
    }),
    # runs/dlg_fixed_lenet5_uniform_mnist_0-9
    'dlg_fixed_lenet5_uniform_mnist': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'mnist',
        'model.init': 'uniform',
    }),
    # runs/dlg_fixed_lenet5_xavier_cifar100_0-19
    'dlg_fixed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/dlg_fixed_lenet5_xavier_lfw_0-9
    'dlg_fixed_lenet5_xavier_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'xavier_normal',
        'model.num_classes': 100,
    }),
    # runs/dlg_fixed_lenet5_xavier_mnist_0-9, runs/dlg_fixed_lenet5_xavier_mnist_10-19
    'dlg_fixed_lenet5_xavier_mnist': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'data.dataset': 'mnist',
        'model.init': 'xavier_normal',
    }),
    # runs/dlg_lenet5_xavier_cifar100_0-9, runs/dlg_lenet5_xavier_cifar100_10-19
    'dlg_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_2000_lenet5_uniform_cifar100_0-9
    'sapag_2000_lenet5_uniform_cifar100': ('sweep', range(0, 10), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'uniform',
    }),
    # runs/sapag_2000_lenet5_uniform_lfw_0-9
    'sapag_2000_lenet5_uniform_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'uniform',
        'model.num_classes': 100,
    }),
    # runs/sapag_2000_lenet5_uniform_mnist_0-9
    'sapag_2000_lenet5_uniform_mnist': ('sweep', range(0, 10), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'uniform',
    }),
    # runs/sapag_2000_lenet5_xavier_cifar100_0-19
    'sapag_2000_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_2000_lenet5_xavier_lfw_0-9
    'sapag_2000_lenet5_xavier_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'xavier_normal',
        'model.num_classes': 100,
    }),
    # runs/sapag_2000_lenet5_xavier_mnist_0-9
    'sapag_2000_lenet5_xavier_mnist': ('sweep', range(0, 10), {
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_2000_nobox_lenet5_uniform_mnist_0-9
    'sapag_2000_nobox_lenet5_uniform_mnist': ('sweep', range(0, 10), {
        'attack.box': False,
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'uniform',
    }),
    # runs/sapag_2000_nobox_lenet5_xavier_cifar100_0-9
    'sapag_2000_nobox_lenet5_xavier_cifar100': ('sweep', range(0, 10), {
        'attack.box': False,
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_2000_nobox_lenet5_xavier_mnist_0-9, runs/sapag_2000_nobox_lenet5_xavier_mnist_10-19
    'sapag_2000_nobox_lenet5_xavier_mnist': ('sweep', range(0, 20), {
        'attack.box': False,
        'attack.iterations': 2000,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_annealed_lenet5_xavier_cifar100_0-19
    'sapag_annealed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.distance': 'gaussian_kernel_annealed',
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_fixed_10000_lenet5_xavier_cifar100_0-19
    'sapag_fixed_10000_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 10000,
        'attack.optimizer': 'lbfgs_fixed',
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_fixed_lenet5_xavier_cifar100_0-19
    'sapag_fixed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_lenet5_uniform_cifar100_0-9
    'sapag_lenet5_uniform_cifar100': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'uniform',
    }),
    # runs/sapag_lenet5_uniform_lfw_0-9
    'sapag_lenet5_uniform_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'uniform',
        'model.num_classes': 100,
    }),
    # runs/sapag_lenet5_uniform_mnist_0-9
    'sapag_lenet5_uniform_mnist': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'uniform',
    }),
    # runs/sapag_lenet5_xavier_cifar100_0-9, runs/sapag_lenet5_xavier_cifar100_10-19
    'sapag_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_lenet5_xavier_lfw_0-9
    'sapag_lenet5_xavier_lfw': ('sweep', range(0, 10), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'lfw',
        'data.image_size': 32,
        'model.init': 'xavier_normal',
        'model.num_classes': 100,
    }),
    # runs/sapag_lenet5_xavier_mnist_0-9, runs/sapag_lenet5_xavier_mnist_10-19
    'sapag_lenet5_xavier_mnist': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'mnist',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_literal_fixed_lenet5_xavier_cifar100_0-19
    'sapag_literal_fixed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.distance': 'gaussian_kernel',
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_nobox_fixed_lenet5_xavier_cifar100_0-19
    'sapag_nobox_fixed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.box': False,
        'attack.iterations': 500,
        'attack.optimizer': 'lbfgs_fixed',
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_nobox_lenet5_xavier_cifar100_0-19
    'sapag_nobox_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.box': False,
        'attack.iterations': 500,
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
    # runs/sapag_uniform_fixed_lenet5_xavier_cifar100_0-19
    'sapag_uniform_fixed_lenet5_xavier_cifar100': ('sweep', range(0, 20), {
        'attack.iterations': 500,
        'attack.depth_rule': 'uniform',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.preset': 'sapag',
        'data.dataset': 'cifar100',
        'model.init': 'xavier_normal',
    }),
}

# Today's preset (−expm1 kernel, iDLG label) on Table I's settings: images by --start/--count, the
# development ones (0-19; uniform and LFW 0-9) and the unseen ones (60-99; MNIST 60-79; uniform and
# LFW 60-69): runs/sapag_preset_*. The sapag_2000_* entries above ran the 2026-11-25 preset (1 − exp
# kernel, DLG's joint labels); at today's code they give this one. sapag_expm1_joint_*: the kernel
# fixed, DLG's joint labels (runs/sapag_expm1_joint_*). The DLG baseline's unseen rows are the
# dlg_fixed_* entries with --start=60.
_SETTINGS = {"cifar100": {}, "mnist": {"attack.box": False},  # MNIST as Table I's rows: no box
             "lfw": {"data.image_size": 32, "model.num_classes": 100}}
_INITS = {"xavier": "xavier_normal", "uniform": "uniform"}
for _init, _dataset in [(i, d) for i in _INITS for d in _SETTINGS]:
  VARIANTS[f"sapag_preset_lenet5_{_init}_{_dataset}"] = ("sweep", None, {
      "attack.iterations": 2000, "attack.preset": "sapag", "data.dataset": _dataset,
      "model.init": _INITS[_init], **_SETTINGS[_dataset]})
VARIANTS["sapag_expm1_joint_lenet5_xavier_cifar100"] = ("sweep", None, {
    **VARIANTS["sapag_preset_lenet5_xavier_cifar100"][2], "attack.label_source": "joint"})


# runs/dlg_fixed_10000_lenet5_uniform_cifar100_60-69: DLG's baseline at the paper's budget read as
# iterations (500 LBFGS.step calls of up to 20), on the unseen images.
VARIANTS["dlg_fixed_10000_lenet5_uniform_cifar100"] = ("sweep", range(60, 70), {
    'attack.iterations': 10000,
    'attack.optimizer': 'lbfgs_fixed',
    'data.dataset': 'cifar100',
    'model.init': 'uniform',
})

# Runs of programs that take no configuration: run -> the command that made it.
PROGRAMS = {"dlg_torch_lenet5_uniform_cifar100_60-69":
            "python experiments/studies/sapag_table1/dlg_torch.py --data_dir=../shared/data "
            "--output_dir=experiments/studies/sapag_table1/runs/dlg_torch_lenet5_uniform_cifar100_60-69"}

get_config, get_sweep = config.recipes(BASE, VARIANTS)
