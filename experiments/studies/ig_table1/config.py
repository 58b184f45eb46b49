"""The runs of this study, each a variant: ``--config=experiments/studies/ig_table1/config.py:VARIANT``
(gradjax.run.config.recipes); analysis.md says what each shows. The unseen rows (runs/*_cifar10_500-599,
*_500-529) are the development rows' variants with --start=500: ig_lenet_zhu_normalized_epoch0_cifar10
(untrained), ig_lenet_zhu_recipe_epoch120_cifar10 (trained, the paper's recipe) and their
euclid_lbfgs16_* twins; the ResNet20-4 ones (runs/ig_resnet20-4_*_5*) ran on an accelerator, except
those drawn as torchvision's (runs/*resnet20-4*_torchvision_init_*, CPU; their trained model is
runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init).
"""

from gradjax.run import config

BASE = {}  # options every variant sets (over gradjax.run.config.defaults())

# VARIANT: (the command and its arguments, the images of a sweep, options over BASE); the
# comment names the runs/ folders it made.
VARIANTS = {
    # runs/euclid_lbfgs16_6000_lenet_zhu_fresh_normalized_cifar10_0-9, runs/euclid_lbfgs16_6000_lenet_zhu_fresh_normalized_cifar10_10-19
    'euclid_lbfgs16_6000_lenet_zhu_fresh_normalized_cifar10': ('sweep', range(0, 20), {
        'attack.iterations': 6000,
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
    }),
    # runs/euclid_lbfgs16_6000_lenet_zhu_normalized_epoch0_cifar10_500-519: Table 1's one model, at
    # the 6000 iterations that closed the gap on fresh models, on the unseen images
    'euclid_lbfgs16_6000_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(500, 520), {
        'attack.iterations': 6000,
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_epoch0_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_epoch0_cifar10_10-19
    'euclid_lbfgs16_lenet_zhu_epoch0_cifar10': ('sweep', range(0, 20), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10/epoch_0.npz',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_epoch2_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_epoch2_cifar10_10-19
    'euclid_lbfgs16_lenet_zhu_epoch2_cifar10': ('sweep', range(0, 20), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10/epoch_2.npz',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_fresh_normalized_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_fresh_normalized_cifar10_10-19, runs/euclid_lbfgs16_lenet_zhu_fresh_normalized_cifar10_20-99
    'euclid_lbfgs16_lenet_zhu_fresh_normalized_cifar10': ('sweep', range(0, 100), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_normalized_epoch0_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_normalized_epoch0_cifar10_10-19, runs/euclid_lbfgs16_lenet_zhu_normalized_epoch0_cifar10_20-99
    'euclid_lbfgs16_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 100), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_normalized_wd_epoch20_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_normalized_wd_epoch20_cifar10_10-19, runs/euclid_lbfgs16_lenet_zhu_normalized_wd_epoch20_cifar10_20-99
    'euclid_lbfgs16_lenet_zhu_normalized_wd_epoch20_cifar10': ('sweep', range(0, 100), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized_wd/epoch_20.npz',
    }),
    # runs/euclid_lbfgs16_lenet_zhu_recipe_epoch120_cifar10_0-9, runs/euclid_lbfgs16_lenet_zhu_recipe_epoch120_cifar10_10-19, runs/euclid_lbfgs16_lenet_zhu_recipe_epoch120_cifar10_20-99
    'euclid_lbfgs16_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(0, 100), {
        'attack.label_source': 'known',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # The two LeNet rows as the authors' code runs them (torch.optim.LBFGS's fixed steps, 500 outer
    # steps of 20 = 10 000 iterations, each restart's last iterate), unseen (--start=500 --count=10,
    # then --start=510): runs/euclid_lbfgsfixed16_10000_last_lenet_zhu_normalized_epoch0_cifar10_500-509
    # and _510-519, runs/euclid_lbfgsfixed16_10000_last_lenet_zhu_recipe_epoch120_cifar10_500-509 and _510-519
    'euclid_lbfgsfixed16_10000_last_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(500, 520), {
        'attack.iterate': 'last',
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    'euclid_lbfgsfixed16_10000_last_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(500, 520), {
        'attack.iterate': 'last',
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 16,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # runs/euclid_lbfgsfixed8_resnet20-4_cifar10_0, runs/euclid_lbfgsfixed8_resnet20-4_cifar10_1;
    # unseen (--start=500 --count=2): runs/euclid_lbfgsfixed8_resnet20-4_cifar10_500-501
    'euclid_lbfgsfixed8_resnet20-4_cifar10': ('sweep', range(0, 2), {
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.name': 'resnet20-4',
    }),
    # The row above drawn as the paper's torchvision ResNet, unseen (--start=500 --count=1 and
    # --start=501 --count=1): runs/euclid_lbfgsfixed8_resnet20-4_torchvision_init_cifar10_500, _501; 500 again
    # with the unclamped PSNR reported: runs/euclid_lbfgsfixed8_resnet20-4_torchvision_init_cifar10_500_unclamped
    'euclid_lbfgsfixed8_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 2), {
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # The row above with the authors' released Euclidean command's TV (reconstruct_image.py --optim=zhu
    # adds --tv's default 1e-4), unseen (--start=500 --count=1):
    # runs/euclid_lbfgsfixed8_tv1e-4_resnet20-4_torchvision_init_cifar10_500
    'euclid_lbfgsfixed8_tv1e-4_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 2), {
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.priors': 'tv:1e-4',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # The untrained row above at the authors' released budget: reconstruct_image.py --optim=zhu runs 500
    # torch.optim.LBFGS steps of up to 20 iterations each (10 000 iterations when none stops early),
    # unseen (--start=500 --count=1): runs/euclid_lbfgsfixed8_10000_resnet20-4_torchvision_init_cifar10_500
    'euclid_lbfgsfixed8_10000_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 2), {
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # The untrained row above keeping each restart's last iterate, as the authors' code returns it
    # (the restart with the lowest final objective wins), at the preset's 2000 iterations, unseen
    # (--start=500 --count=1): runs/euclid_lbfgsfixed8_last_resnet20-4_torchvision_init_cifar10_500
    'euclid_lbfgsfixed8_last_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 2), {
        'attack.iterate': 'last',
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # The untrained row at the authors' budget (10 000 iterations) keeping each restart's last
    # iterate: their released code's whole rule, unseen (--start=501 --count=1):
    # runs/euclid_lbfgsfixed8_10000_last_resnet20-4_torchvision_init_cifar10_501
    'euclid_lbfgsfixed8_10000_last_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 2), {
        'attack.iterate': 'last',
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # runs/euclid_lbfgsfixed8_resnet20-4_normalized_wd_epoch1_cifar10_0;
    # unseen (--start=500 --count=1): runs/euclid_lbfgsfixed8_resnet20-4_normalized_wd_epoch1_cifar10_500,
    # again with the unclamped PSNR reported: runs/euclid_lbfgsfixed8_resnet20-4_normalized_wd_epoch1_cifar10_500_unclamped
    'euclid_lbfgsfixed8_resnet20-4_normalized_wd_epoch1_cifar10': ('sweep', [0], {
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd/epoch_1.npz',
    }),
    # The row above at the authors' released budget (10 000 iterations, as the untrained one),
    # unseen (--start=500 --count=1): runs/euclid_lbfgsfixed8_10000_resnet20-4_normalized_wd_epoch1_cifar10_500
    'euclid_lbfgsfixed8_10000_resnet20-4_normalized_wd_epoch1_cifar10': ('sweep', [0], {
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd/epoch_1.npz',
    }),
    # The row above keeping each restart's last iterate, as the authors' code returns it, at the
    # preset's 2000 iterations, unseen (--start=500 --count=1):
    # runs/euclid_lbfgsfixed8_last_resnet20-4_normalized_wd_epoch1_cifar10_500
    'euclid_lbfgsfixed8_last_resnet20-4_normalized_wd_epoch1_cifar10': ('sweep', [0], {
        'attack.iterate': 'last',
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd/epoch_1.npz',
    }),
    # The row above at the authors' budget (10 000 iterations): their released code's whole rule,
    # on the two unseen images that had not run off at 2000 (--start=502 and 504 --count=1):
    # runs/euclid_lbfgsfixed8_10000_last_resnet20-4_normalized_wd_epoch1_cifar10_502, _504
    'euclid_lbfgsfixed8_10000_last_resnet20-4_normalized_wd_epoch1_cifar10': ('sweep', [0], {
        'attack.iterate': 'last',
        'attack.iterations': 10000,
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd/epoch_1.npz',
    }),
    # The row above on the model trained from torchvision's draw (not kept in git: run
    # train_resnet20-4_cifar10_normalized_wd_torchvision_init first), unseen (--start=500 --count=1):
    # runs/euclid_lbfgsfixed8_resnet20-4_normalized_wd_torchvision_init_epoch1_cifar10_500
    'euclid_lbfgsfixed8_resnet20-4_normalized_wd_torchvision_init_epoch1_cifar10': ('sweep', [0], {
        'attack.label_source': 'known',
        'attack.optimizer': 'lbfgs_fixed',
        'attack.restarts': 8,
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init/epoch_1.npz',
    }),
    # runs/ig_24000_lenet_zhu_normalized_epoch0_cifar10_0-19
    'ig_24000_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 20), {
        'attack.iterations': 24000,
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/ig_lenet_zhu_epoch0_cifar10_0-19, runs/ig_lenet_zhu_epoch0_cifar10_20-99
    'ig_lenet_zhu_epoch0_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10/epoch_0.npz',
    }),
    # runs/ig_lenet_zhu_epoch2_cifar10_0-19, runs/ig_lenet_zhu_epoch2_cifar10_20-99
    'ig_lenet_zhu_epoch2_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10/epoch_2.npz',
    }),
    # runs/ig_lenet_zhu_fresh_normalized_cifar10_0-19, runs/ig_lenet_zhu_fresh_normalized_cifar10_20-99
    'ig_lenet_zhu_fresh_normalized_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
    }),
    # runs/ig_lenet_zhu_normalized_epoch0_cifar10_0-19, runs/ig_lenet_zhu_normalized_epoch0_cifar10_20-99
    'ig_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch10_cifar10_0-19
    'ig_lenet_zhu_normalized_epoch10_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_10.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch15_cifar10_0-19
    'ig_lenet_zhu_normalized_epoch15_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_15.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch1_cifar10_0-19
    'ig_lenet_zhu_normalized_epoch1_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_1.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch20_cifar10_0-19, runs/ig_lenet_zhu_normalized_epoch20_cifar10_20-99
    'ig_lenet_zhu_normalized_epoch20_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch2_cifar10_0-19
    'ig_lenet_zhu_normalized_epoch2_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_2.npz',
    }),
    # runs/ig_lenet_zhu_normalized_epoch5_cifar10_0-19
    'ig_lenet_zhu_normalized_epoch5_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_5.npz',
    }),
    # runs/ig_lenet_zhu_normalized_wd_epoch20_cifar10_0-19, runs/ig_lenet_zhu_normalized_wd_epoch20_cifar10_20-99
    'ig_lenet_zhu_normalized_wd_epoch20_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized_wd/epoch_20.npz',
    }),
    # runs/ig_lenet_zhu_recipe_epoch120_cifar10_0-19, runs/ig_lenet_zhu_recipe_epoch120_cifar10_20-99
    'ig_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(0, 100), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # runs/ig_resnet20-4_cifar10_0-2, runs/ig_resnet20-4_cifar10_3-4, runs/ig_resnet20-4_cifar10_5;
    # unseen (--start=500 --count=5 and so on): runs/ig_resnet20-4_cifar10_500-504, _505-509, _510-511, _515-516
    'ig_resnet20-4_cifar10': ('sweep', range(0, 6), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.name': 'resnet20-4',
    }),
    # The row above drawn as the paper's torchvision ResNet (kaiming normal, fan_out), unseen
    # (--start=500 --count=5 and so on): runs/ig_resnet20-4_torchvision_init_cifar10_500-504, _505-511,
    # _515-516
    'ig_resnet20-4_torchvision_init_cifar10': ('sweep', range(0, 6), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
    }),
    # runs/ig_resnet20-4_cifar10_2
    'ig_resnet20-4_cifar10_2': ('reconstruct', None, {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.index': 2,
        'data.normalization': 'cifar10',
        'execution.chunk': 200,
        'model.name': 'resnet20-4',
    }),
    # runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_0, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_1, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_2, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_3, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_4, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_5, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_6, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_7, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_8, runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_9
    # unseen: runs/ig_resnet20-4_normalized_wd_epoch1_cifar10_500-504, _505-506, _510-511, _515-516
    'ig_resnet20-4_normalized_wd_epoch1_cifar10': ('sweep', range(0, 10), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd/epoch_1.npz',
    }),
    # The row above on the model trained from torchvision's draw (its checkpoint records the draw and
    # is not kept in git: run train_resnet20-4_cifar10_normalized_wd_torchvision_init first),
    # unseen (--start=500 --count=5 and so on): runs/ig_resnet20-4_normalized_wd_torchvision_init_epoch1_cifar10_500-504,
    # _505-506, _510-511, _515-516
    'ig_resnet20-4_normalized_wd_torchvision_init_epoch1_cifar10': ('sweep', range(0, 10), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init/epoch_1.npz',
    }),
    # runs/ig_resnet20_cifar10_0-4
    'ig_resnet20_cifar10_0-4': ('sweep', range(0, 5), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'execution.chunk': 200,
        'model.name': 'resnet20',
    }),
    # runs/ig_resnet20_cifar10_2
    'ig_resnet20_cifar10_2': ('reconstruct', None, {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.index': 2,
        'data.normalization': 'cifar10',
        'execution.chunk': 400,
        'model.name': 'resnet20',
    }),
    # runs/ig_resnet20_cifar10_5-19
    'ig_resnet20_cifar10_5-19': ('sweep', range(5, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.name': 'resnet20',
    }),
    # runs/ig_resnet20_epoch5_cifar10_0-4, runs/ig_resnet20_epoch5_cifar10_5-19
    'ig_resnet20_epoch5_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'data.dataset': 'cifar10',
        'data.normalization': 'none',
        'model.checkpoint': 'experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz',
    }),
    # runs/ig_tv1e-1_lenet_zhu_normalized_epoch0_cifar10_0-19
    'ig_tv1e-1_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-1',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/ig_tv1e-1_lenet_zhu_normalized_epoch20_cifar10_0-19
    'ig_tv1e-1_lenet_zhu_normalized_epoch20_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-1',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz',
    }),
    # runs/ig_tv1e-1_lenet_zhu_recipe_epoch120_cifar10_0-19
    'ig_tv1e-1_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-1',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # runs/ig_tv1e-2_lenet_zhu_normalized_epoch0_cifar10_0-19
    'ig_tv1e-2_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-2',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/ig_tv1e-2_lenet_zhu_normalized_epoch20_cifar10_0-19
    'ig_tv1e-2_lenet_zhu_normalized_epoch20_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-2',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz',
    }),
    # runs/ig_tv1e-2_lenet_zhu_recipe_epoch120_cifar10_0-19
    'ig_tv1e-2_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-2',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # runs/ig_tv1e-3_lenet_zhu_normalized_epoch0_cifar10_0-19
    'ig_tv1e-3_lenet_zhu_normalized_epoch0_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-3',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_0.npz',
    }),
    # runs/ig_tv1e-3_lenet_zhu_normalized_epoch20_cifar10_0-19
    'ig_tv1e-3_lenet_zhu_normalized_epoch20_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-3',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz',
    }),
    # runs/ig_tv1e-3_lenet_zhu_recipe_epoch120_cifar10_0-19
    'ig_tv1e-3_lenet_zhu_recipe_epoch120_cifar10': ('sweep', range(0, 20), {
        'attack.preset': 'inverting_gradients',
        'attack.priors': 'tv:1e-3',
        'data.dataset': 'cifar10',
        'data.normalization': 'cifar10',
        'model.checkpoint': 'experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe/epoch_120.npz',
    }),
    # runs/train_lenet_zhu_cifar10
    'train_lenet_zhu_cifar10': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10',
        None, {
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'training.epochs': 2,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
    }),
    # runs/train_lenet_zhu_cifar10_normalized
    'train_lenet_zhu_cifar10_normalized': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized',
        None, {
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'cifar10',
        'training.epochs': 20,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
    }),
    # runs/train_lenet_zhu_cifar10_normalized_wd
    'train_lenet_zhu_cifar10_normalized_wd': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized_wd',
        None, {
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'cifar10',
        'training.epochs': 20,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
        'training.weight_decay': 0.0005,
    }),
    # runs/train_lenet_zhu_cifar10_recipe
    'train_lenet_zhu_cifar10_recipe': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_recipe',
        None, {
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'cifar10',
        'training.augment': True,
        'training.epochs': 120,
        'training.lr': 0.1,
        'training.lr_milestones': '44,75,105',
        'training.nesterov': True,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
        'training.weight_decay': 0.0005,
    }),
    # runs/train_resnet20-4_cifar10_normalized_wd
    'train_resnet20-4_cifar10_normalized_wd': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd',
        None, {
        'client.train_mode': True,
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'cifar10',
        'model.name': 'resnet20-4',
        'training.epochs': 1,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
        'training.weight_decay': 0.0005,
    }),
    # runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init: the model above drawn as the
    # paper's torchvision ResNet before its one epoch
    'train_resnet20-4_cifar10_normalized_wd_torchvision_init': (
        'train --output_dir=experiments/studies/ig_table1/runs/train_resnet20-4_cifar10_normalized_wd_torchvision_init',
        None, {
        'client.train_mode': True,
        'data.batch_size': 128,
        'data.dataset': 'cifar10_train',
        'data.normalization': 'cifar10',
        'model.init': 'torchvision',
        'model.name': 'resnet20-4',
        'training.epochs': 1,
        'training.lr': 0.1,
        'training.test_count': 1017,
        'training.test_dataset': 'cifar10',
        'training.train_count': 50000,
        'training.weight_decay': 0.0005,
    }),
}


get_config, get_sweep = config.recipes(BASE, VARIANTS)
