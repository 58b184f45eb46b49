"""DP-SGD against a PyTorch client that runs it as Opacus does (each example's gradient by its own
backward pass, clipped to C over all its parameters, summed, N(0, σ²C²) added, divided by the batch):
gradjax's simulated client gives its update, and a capture of it is audited with the client's
declared DP-SGD (the fidelity check not run, the residual of the client's own images recomputed with
its clipping)."""


import numpy as np
import pytest

pytestmark = [pytest.mark.isolated, pytest.mark.slow]  # imports torch (tests/conftest.py)


def _client(torch, x_nhwc, y, max_norm, sigma=0.0, seed=0):
  """DLG's LeNet in PyTorch (U(-0.5, 0.5)) and its DP-SGD gradient on (x, y), per parameter name."""
  import torch.nn.functional as F
  from torch import nn
  torch.manual_seed(seed)
  net = nn.Sequential()
  net.body = nn.Sequential(nn.Conv2d(3, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                           nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                           nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(), nn.Flatten())
  net.fc = nn.Sequential(nn.Linear(768, 10))
  for p in net.parameters():
    p.data.uniform_(-0.5, 0.5)
  names, params = zip(*net.named_parameters())
  x = torch.tensor(np.transpose(x_nhwc, (0, 3, 1, 2)))
  total = [torch.zeros_like(p) for p in params]
  for n in range(len(y)):
    g = torch.autograd.grad(F.cross_entropy(net(x[n:n + 1]), torch.tensor(y[n:n + 1])), params)
    norm = torch.sqrt(sum((a.double() ** 2).sum() for a in g))
    factor = min(1.0, max_norm / float(norm))
    total = [t + factor * a for t, a in zip(total, g)]
  gen = torch.Generator().manual_seed(seed)
  update = [(t + sigma * max_norm * torch.randn(t.shape, generator=gen)) / len(y) for t in total]
  return net, dict(zip(names, update))


def test_the_simulated_client_is_pytorchs_dp_sgd_step(photos):
  """Without noise, gradjax's DP-SGD client on the PyTorch model's weights gives the PyTorch loop's
  update, with a bound that clips some examples and not others."""
  import jax
  import torch
  from gradjax import clients, interop, models
  x, y = photos[:4], np.array([2, 7, 7, 0])
  net, _ = _client(torch, x, y, 1e9)
  norms = []
  for n in range(4):  # each example's gradient norm, to choose a bound between them
    _, g = _client(torch, x[n:n + 1], y[n:n + 1], 1e9)
    norms.append(float(torch.sqrt(sum((t.double() ** 2).sum() for t in g.values()))))
  bound = float(np.median(norms))
  assert min(norms) < bound < max(norms)
  _, want = _client(torch, x, y, bound)
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
  state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
  variables = interop.variables_from_torch(state, interop.zoo_mapping(model), model.variables)
  obs = clients.fedsgd(model.apply_fn, variables, x, y, dp_sgd=clients.DPSGD(bound))
  got = interop.params_to_torch(obs.gradient, interop.zoo_mapping(model))
  for name, tensor in want.items():
    np.testing.assert_allclose(np.asarray(got[name]), tensor.numpy(), rtol=2e-4,
                               atol=2e-6 * float(tensor.abs().max()), err_msg=name)


def test_a_dp_sgd_capture_is_audited_with_its_declared_clipping(tmp_path, photos):
  """A PyTorch DP-SGD client's capture (σ = 0): with --config.defense.dp_sgd_max_norm the run skips
  the fidelity check (said so) and its budget is infinite (no noise); the residual of the client's
  own images, recomputed with the clipping, is 0 up to float32, where without the declaration the
  capture fails its fidelity check. A capture whose metadata declare the bound is read the same."""
  import torch
  from safetensors.torch import save_file
  from gradjax.run import config, pipeline
  x, y = photos[5:7], np.array([3, 3])
  net, grads = _client(torch, x, y, 2.0)
  w, g = tmp_path / "w.safetensors", tmp_path / "g.safetensors"
  save_file({k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}, str(w),
            metadata={"model": "lenet_zhu", "input_shape": "32,32,3"})
  save_file({k: v.contiguous() for k, v in grads.items()}, str(g),
            metadata={"kind": "gradient", "num_samples": "2"})
  options = {"model.weights": str(w), "client.observation": str(g), "model.name": None,
             "output.lpips": "none", "data.dataset": "skimage", "data.image_size": 32,
             "data.index": 5, "attack.preset": "dlg", "attack.iterations": 2}
  with pytest.raises(ValueError, match="the capture does not fit the declared client"):
    pipeline.run(config.from_options(options))
  results, _ = pipeline.run(config.from_options({**options, "defense.dp_sgd_max_norm": 2.0}))
  assert results["checks"]["fidelity"]["ok"] is None and "DP-SGD" in results["checks"]["fidelity"]["explained"]
  assert results["privacy"]["epsilon"] is None
  # The same capture declaring its DP-SGD in its metadata (as an Opacus client of a Flower
  # federation does, gradjax.integrations.flower.DECLARATIONS) needs no option.
  declared = tmp_path / "g_declared.safetensors"
  save_file({k: v.contiguous() for k, v in grads.items()}, str(declared),
            metadata={"kind": "gradient", "num_samples": "2", "dp_sgd_max_norm": "2.0",
                      "dp_sgd_noise_multiplier": "0.0"})
  results, _ = pipeline.run(config.from_options({**options, "client.observation": str(declared)}))
  assert results["checks"]["fidelity"]["ok"] is None and results["privacy"]["max_norm"] == 2.0
  from gradjax import interop, verdict
  imported = interop.load(str(w), str(g))
  residual = verdict.residual(imported.model.apply_fn, imported.observation, {"x": x}, y, max_norm=2.0)
  assert residual.relative_error < 1e-5
