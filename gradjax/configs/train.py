"""gradjax train's default: DLG's LeNet (``lenet_zhu``) trained on scikit-image's ``lfw_subset`` (200
25×25 face / non-face patches: a labelled dataset that needs no data folder), FedSGD on mini-batches
of 32 with SGD at lr 0.02 and momentum 0.9 (the training section's defaults), 150 training and 50
test images, 10 epochs. A quick model to attack, not a paper's recipe (Inverting Gradients' is in
``gradjax train --help``)."""

from gradjax.run import config


def get_config():
  c = config.defaults()
  c.data.dataset = "lfw_subset"
  c.data.batch_size = 32
  return c
