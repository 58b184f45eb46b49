"""breaching 0.1.2's Inverting Gradients attacker on gradjax's LeNet(Zhu), for the side-by-side scripts
of the studies (batches/, ig_table1/). Imported only in an environment with breaching and torch;
gradjax never imports it.
"""

import time


def lenet_zhu(saved):
  """gradjax's lenet_zhu in PyTorch layout, its weights from an export's ``w:<name>`` arrays."""
  import torch

  class LeNetZhu(torch.nn.Module):  # names as gradjax.interop exports them
    def __init__(self):
      super().__init__()
      self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 12, 5, 2, 2), torch.nn.Sigmoid(),
                                      torch.nn.Conv2d(12, 12, 5, 2, 2), torch.nn.Sigmoid(),
                                      torch.nn.Conv2d(12, 12, 5, 1, 2), torch.nn.Sigmoid())
      self.fc = torch.nn.Sequential(torch.nn.Linear(768, 10))

    def forward(self, x):
      return self.fc(self.body(x).flatten(1))

  model = LeNetZhu()
  model.load_state_dict({k[2:]: torch.as_tensor(saved[k]) for k in saved.files if k.startswith("w:")})
  return model


def attack_config(iterations: int, tv: float):
  """breaching's ``invertinggradients`` attack at ``iterations`` with total variation ``tv``."""
  import breaching
  cfg = breaching.get_attack_config("invertinggradients")
  cfg.optim.max_iterations = iterations
  cfg.optim.callback = iterations
  cfg.regularization.total_variation.scale = tv
  return cfg


def reconstruct(model, x, y, cfg, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)):
  """breaching's reconstruction (N, C, H, W, in the model's input space) of the batch ``x`` (N, C, H, W,
  as the model takes it) with labels ``y`` known, from its cross-entropy gradient, and the seconds
  the attack took."""
  import breaching
  import torch

  class Shape:  # the data description breaching's attacker reads
    shape, modality = tuple(x.shape[1:]), "vision"

  Shape.mean, Shape.std = tuple(mean), tuple(std)
  loss = torch.nn.CrossEntropyLoss()
  grads = torch.autograd.grad(loss(model(x), y), list(model.parameters()))
  attacker = breaching.attacks.prepare_attack(model, loss, cfg, dict(dtype=torch.float,
                                                                        device=torch.device("cpu")))
  payload = [dict(parameters=[p.detach() for p in model.parameters()], buffers=None, metadata=Shape)]
  shared = [dict(gradients=[g.detach() for g in grads], buffers=None,
                 metadata=dict(num_data_points=len(y), labels=y, local_hyperparams=None))]
  start = time.perf_counter()
  rec, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
  return rec["data"].detach(), time.perf_counter() - start
