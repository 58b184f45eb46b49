"""The PyTorch side: the models (state_dict names as gradjax's zoo twins expect), the clients' data
and their local training."""

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradjax import data


class LeNet(nn.Module):
  """DLG's LeNet (gradjax ``lenet_zhu``): three sigmoid convolutions and one linear layer."""

  def __init__(self, classes: int = 10):
    super().__init__()
    self.body = nn.Sequential(nn.Conv2d(3, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                              nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                              nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid())
    self.fc = nn.Sequential(nn.Linear(768, classes))

  def forward(self, x):
    return self.fc(self.body(x).flatten(1))


class Block(nn.Module):
  """A CIFAR ResNet basic block (kuangliu/pytorch-cifar's names)."""

  def __init__(self, cin: int, cout: int, stride: int):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(cout)
    self.shortcut = nn.Sequential()
    if stride != 1 or cin != cout:
      self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
  """CIFAR ResNet-(6n+2) of width factor w (gradjax ``resnet{6n+2}-{w}``), with BatchNorm."""

  def __init__(self, n: int, width: int, classes: int = 10):
    super().__init__()
    base = 16 * width
    self.conv1 = nn.Conv2d(3, base, 3, 1, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(base)
    cin = base
    for s in range(3):
      blocks = []
      for b in range(n):
        blocks.append(Block(cin, base * 2**s, 2 if s > 0 and b == 0 else 1))
        cin = base * 2**s
      setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
    self.linear = nn.Linear(cin, classes)

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    out = self.layer3(self.layer2(self.layer1(out)))
    return self.linear(out.mean(dim=(2, 3)))


class MLP(nn.Module):
  """One hidden ReLU layer of ``hidden`` units (gradjax ``mlp-H``): the flattened NCHW image, fc1, fc2."""

  def __init__(self, hidden: int, inputs: int = 3 * 32 * 32, classes: int = 10):
    super().__init__()
    self.fc1 = nn.Linear(inputs, hidden)
    self.fc2 = nn.Linear(hidden, classes)

  def forward(self, x):
    return self.fc2(F.relu(self.fc1(x.flatten(1))))


def build(name: str, seed: int) -> nn.Module:
  """The global model: LeNet with DLG's U(-0.5, 0.5) init, or a ResNet or an MLP with PyTorch's."""
  torch.manual_seed(seed)
  if name == "lenet_zhu":
    net = LeNet()
    with torch.no_grad():
      for p in net.parameters():
        p.uniform_(-0.5, 0.5)
    return net
  if m := re.fullmatch(r"resnet(\d+)-(\d+)", name):
    depth, width = int(m[1]), int(m[2])
    if (depth - 2) % 6:
      raise ValueError(f"a CIFAR ResNet has depth 6n+2, got {depth}")
    return ResNet((depth - 2) // 6, width)
  if m := re.fullmatch(r"mlp-([1-9]\d*)", name):
    return MLP(int(m[1]))
  raise ValueError(f"unknown model {name!r}; this app has lenet_zhu, resnet<6n+2>-<width> and mlp-<units>")


def has_batchnorm(net: nn.Module) -> bool:
  return any(isinstance(m, nn.BatchNorm2d) for m in net.modules())


def client_indices(partition: int, partitions: int, server_round: int, per_client: int) -> list[int]:
  """Fresh examples every round: round r, partition p takes a block of ``per_client`` indices."""
  start = ((server_round - 1) * partitions + partition) * per_client
  return list(range(start, start + per_client))


def load(dataset: str, data_dir: str | None, indices: list[int]):
  """(x, y): NCHW float32 images in [0, 1] and int64 labels."""
  ds = data.load(dataset, data_dir=data_dir or None, indices=indices, image_size=(32, 32), channels=3)
  return (torch.tensor(np.transpose(ds.x, (0, 3, 1, 2)).copy()),
          torch.tensor(np.asarray(ds.y), dtype=torch.int64))


def train(net: nn.Module, x, y, epochs: int, batch_size: int, lr: float) -> None:
  """Plain local SGD: ``epochs`` passes over (x, y) in order, mini-batches of ``batch_size``."""
  net.train()
  opt = torch.optim.SGD(net.parameters(), lr=lr)
  for _ in range(epochs):
    for start in range(0, len(x), batch_size):
      opt.zero_grad()
      F.cross_entropy(net(x[start:start + batch_size]), y[start:start + batch_size]).backward()
      opt.step()


def defended(sent: dict, trained: dict, spec: str) -> dict:
  """The weights a client replies when it applies the defense ``spec`` to its update W_t − W_{t+1}:
  ``prune:R`` zeroes the ⌊R·n⌋ entries of smallest magnitude of every tensor's update, ties by
  position (gradjax.defenses.prune's rule, written in NumPy here: the ClientApp runs PyTorch and
  leaves JAX to the gradjax process that audits it)."""
  head, _, ratio = spec.partition(":")
  if head != "prune" or not ratio:
    raise ValueError(f"this app's clients apply prune:R only, got defense {spec!r}")
  r = float(ratio)
  out = {}
  for name, w in sent.items():
    update = (w - trained[name]).ravel()
    k = min(update.size, int(np.floor(round(r * update.size, 9))))
    update[np.argsort(np.abs(update), kind="stable")[:k]] = 0
    out[name] = (w - update.reshape(w.shape)).astype(w.dtype)
  return out
