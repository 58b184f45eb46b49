"""Batch label recovery with repeated labels (``gradjax label-recovery``): batches of 8 CIFAR-10 test
images drawn from 4 classes each, one FedSGD gradient of DLG's untrained LeNet; the protocol of the
label-count attacks' evaluations (LLG, Wainakh et al.; Geng et al.'s bias estimate) at CIFAR-10 size.
The attack options do not apply to it (the labels are read off the gradient)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.data.dataset = "cifar10"
  c.data.batch_size = 8
  c.model.name = "lenet_zhu"
  return c
