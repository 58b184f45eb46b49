"""PyTorch ports of zoo models and DLG's objective in PyTorch eager: the baselines that benchmark
programs and studies run beside gradjax. Defines no flags, so a study that needs a port imports it
without the benchmark harness's options. torch is imported only inside the functions that use it."""

import numpy as np

from gradjax import interop, models


def import_torch():
  """The torch module, or None when it is not installed."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return torch


def build_torch_model(name: str, input_shape, num_classes: int):
  """PyTorch port of zoo model ``name`` (same layers and parameter count; independent weights): its
  :class:`gradjax.models.spec.ModelSpec`'s ``torch_module``."""
  import torch  # pylint: disable=g-import-not-at-top

  spec = models.family(name)
  if spec is None or spec.torch_module is None:
    raise ValueError(f"no PyTorch port of model {name!r}")
  return spec.torch_module(spec.parse(name), torch, tuple(input_shape), num_classes)


def torch_lenet(model, torch, x: np.ndarray, tolerance: float = 1e-4):
  """The PyTorch port of ``lenet_zhu`` carrying the JAX model's weights (exported by
  :func:`gradjax.interop.variables_to_torch` and loaded strictly), checked on the images ``x``
  (N, H, W, C): returns ``(net, gap)``, gap the largest difference between its logits and the JAX
  model's; a gap above ``tolerance`` is a ValueError."""
  net = build_torch_model("lenet_zhu", model.input_shape, model.num_classes)
  tensors = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
  net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, strict=True)
  with torch.no_grad():
    logits = net(torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32).transpose(0, 3, 1, 2))))
  gap = float(np.max(np.abs(logits.numpy() - np.asarray(model.apply_fn(model.variables, x, False)))))
  if not gap <= tolerance:
    raise ValueError(f"the PyTorch port of lenet_zhu misses the JAX logits by {gap:.1e}")
  return net, gap


def torch_dlg_objective(model, params, observed, dummy_x, dummy_label):
  """The DLG objective in PyTorch eager, as the reference code computes it, with its gradient
  accumulated into ``dummy_x.grad`` and ``dummy_label.grad``: soft-label cross entropy
  ``mean(sum(-softmax(label) * log_softmax(pred), -1))``, its parameter gradient with
  ``create_graph=True``, the summed squared difference to ``observed``, then ``backward``."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  pred = model(dummy_x)
  dummy_loss = torch.mean(torch.sum(-F.softmax(dummy_label, -1) * F.log_softmax(pred, -1), -1))
  dummy_dy_dx = torch.autograd.grad(dummy_loss, params, create_graph=True)
  grad_diff = sum(((gx - gy) ** 2).sum() for gx, gy in zip(dummy_dy_dx, observed))
  grad_diff.backward(inputs=[dummy_x, dummy_label])
  return grad_diff
