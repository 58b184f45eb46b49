"""DP-SGD against a PyTorch client that runs it as Opacus does (each example's gradient by its own
backward pass, clipped to C over all its parameters, summed, N(0, σ²C²) added, divided by the batch):
gradjax's simulated client gives its update, and a capture of it is audited with the client's
declared DP-SGD (the fidelity check not run, the residual of the client's own images recomputed with
its clipping). Then against Opacus itself (when installed): its DP-SGD steps, its noise and its RDP
accountant."""


import numpy as np
import pytest

pytestmark = [pytest.mark.isolated, pytest.mark.slow]  # imports torch (tests/conftest.py)


def _lenet(torch, seed=0):
  """DLG's LeNet in PyTorch, its weights U(-0.5, 0.5) (gradjax's lenet_zhu twin)."""
  from torch import nn
  torch.manual_seed(seed)
  net = nn.Sequential()
  net.body = nn.Sequential(nn.Conv2d(3, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                           nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                           nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(), nn.Flatten())
  net.fc = nn.Sequential(nn.Linear(768, 10))
  for p in net.parameters():
    p.data.uniform_(-0.5, 0.5)
  return net


def _client(torch, x_nhwc, y, max_norm, sigma=0.0, seed=0):
  """DLG's LeNet in PyTorch and its DP-SGD gradient on (x, y), per parameter name."""
  import torch.nn.functional as F
  net = _lenet(torch, seed)
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


def _opacus(torch, x_nhwc, y, *, batch_size, epochs, lr, max_norm, sigma, momentum=0.0, seed=0):
  """The LeNet of :func:`_lenet` trained by Opacus' DP-SGD (``PrivacyEngine.make_private``, fixed
  mini-batches in order: ``poisson_sampling=False``): (its weights W_0 by name, W_0 − W_T by
  parameter name)."""
  import torch.nn.functional as F
  opacus = pytest.importorskip("opacus")
  net = _lenet(torch, seed)
  before = {k: v.detach().clone() for k, v in net.state_dict().items()}
  data = torch.utils.data.TensorDataset(torch.tensor(np.transpose(x_nhwc, (0, 3, 1, 2))),
                                        torch.tensor(y))
  loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
  optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
  torch.manual_seed(seed + 1)  # Opacus draws its noise from torch's generator
  private, optimizer, loader = opacus.PrivacyEngine().make_private(
      module=net, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
      max_grad_norm=max_norm, poisson_sampling=False)
  for _ in range(epochs):
    for xb, yb in loader:
      optimizer.zero_grad()
      F.cross_entropy(private(xb), yb).backward()
      optimizer.step()
  after = dict(net.named_parameters())
  return before, {k: (before[k] - after[k]).detach() for k in after}


def _gradjax_twin(state):
  import jax
  from gradjax import interop, models
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
  mapping = interop.zoo_mapping(model)
  state = {k: v.numpy() for k, v in state.items()}
  return model, mapping, interop.variables_from_torch(state, mapping, model.variables)


@pytest.mark.parametrize("batch_size,epochs,momentum", [(4, 1, 0.0), (2, 2, 0.9)],
                         ids=["fedsgd", "fedavg"])
def test_opacus_clients_are_gradjaxs(photos, batch_size, epochs, momentum):
  """Opacus' own DP-SGD without noise (1.6, fixed mini-batches) trains the LeNet to gradjax's
  simulated client's weights: one step of the whole batch (FedSGD's gradient, learning rate 1), and
  two epochs of mini-batches of 2 with momentum 0.9 (a FedAvg client's W_0 − W_T), a bound that
  clips some examples and not others (Opacus divides C by the norm plus 1e-6, gradjax by the norm:
  the tolerance holds that)."""
  import torch
  from gradjax import clients
  x, y = photos[:4], np.array([2, 7, 7, 0])
  norms = [float(torch.sqrt(sum((t.double() ** 2).sum() for t in
                                _client(torch, x[n:n + 1], y[n:n + 1], 1e9)[1].values())))
           for n in range(4)]
  bound = float(np.median(norms))
  assert min(norms) < bound < max(norms)
  lr = 1.0 if epochs == 1 else 0.1
  before, want = _opacus(torch, x, y, batch_size=batch_size, epochs=epochs, lr=lr, max_norm=bound,
                         sigma=0.0, momentum=momentum)
  model, mapping, variables = _gradjax_twin(before)
  if epochs == 1 and batch_size == len(y):
    update = clients.fedsgd(model.apply_fn, variables, x, y, dp_sgd=clients.DPSGD(bound)).gradient
  else:
    local = clients.LocalTraining(epochs=epochs, batch_size=batch_size, learning_rate=lr,
                                  momentum=momentum)
    update = clients.fedavg(model.apply_fn, variables, x, y, local,
                            dp_sgd=clients.DPSGD(bound)).gradient
  got = interop_params(update, mapping)
  for name, tensor in want.items():
    np.testing.assert_allclose(got[name], tensor.numpy(), rtol=2e-4,
                               atol=2e-6 * float(tensor.abs().max()), err_msg=name)


def interop_params(tree, mapping):
  from gradjax import interop
  return {k: np.asarray(v) for k, v in interop.params_to_torch(tree, mapping).items()}


def test_opacus_noise_is_gradjaxs(photos):
  """Opacus' noise on one step of 4 examples (σ = 0.5, C = 1): what it adds to gradjax's noise-free
  clipped mean has mean 0 and standard deviation σC/4 over the LeNet's 15 k entries, as gradjax's
  own client adds (gradjax's noise is tested against σC/B in test_clients)."""
  import torch
  from gradjax import clients
  x, y = photos[:4], np.array([2, 7, 7, 0])
  before, want = _opacus(torch, x, y, batch_size=4, epochs=1, lr=1.0, max_norm=1.0, sigma=0.5)
  model, mapping, variables = _gradjax_twin(before)
  clean = interop_params(clients.fedsgd(model.apply_fn, variables, x, y,
                                        dp_sgd=clients.DPSGD(1.0)).gradient, mapping)
  noise = np.concatenate([(want[k].numpy() - clean[k]).ravel() for k in want])
  assert noise.size > 15_000
  assert abs(noise.mean()) < 4 * 0.125 / np.sqrt(noise.size)
  assert noise.std() == pytest.approx(0.5 * 1.0 / 4, rel=0.03)


def test_gradjax_privacy_is_opacus_accountant():
  """gradjax.privacy against Opacus' RDP accountant (opacus.accountants.analysis.rdp, an independent
  implementation): the Rényi DP of the sampled Gaussian at Opacus' orders, and ε at them, to 1e-6
  (Opacus stops its fractional orders' series at terms below e^-30, 1e-13 of A_α, which is 3e-8 of
  log A_α at q = 256/60000, α = 1.1; gradjax's value there agrees with a 50-digit quadrature to
  1e-12, and test_privacy holds it to float64 quadrature); at gradjax's own default orders, which
  reach further, the ε it reports is Opacus' at those orders too."""
  pytest.importorskip("opacus")
  from opacus.accountants.analysis import rdp as opacus_rdp
  from gradjax import privacy
  orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus' DEFAULT_ALPHAS
  for q, sigma, steps in [(256 / 60000, 1.1, 14070), (0.01, 2.0, 1000), (0.1, 0.8, 50),
                          (0.5, 3.0, 10), (1.0, 1.3, 100)]:
    want = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    np.testing.assert_allclose(steps * privacy.rdp(q, sigma, orders), want, rtol=1e-6)
    eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=want, delta=1e-5)
    assert privacy.epsilon(q, sigma, steps, 1e-5, orders).epsilon == pytest.approx(eps, rel=1e-6)
    mine = [float(a) for a in privacy.ORDERS]
    theirs, _ = opacus_rdp.get_privacy_spent(
        orders=mine, rdp=opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=mine),
        delta=1e-5)
    assert privacy.epsilon(q, sigma, steps, 1e-5).epsilon == pytest.approx(theirs, rel=1e-6)
    assert privacy.epsilon(q, sigma, steps, 1e-5).epsilon <= eps * (1 + 1e-12)


def test_opacus_weighs_a_masked_token_models_examples_as_gradjax(photos):
  """A token model (embedding, linear head) whose examples mask 1, 2 and 4 positions, its loss the
  mean over the batch's masked positions (``ignore_index``): Opacus' DP-SGD step (per-sample
  gradients of that mean, N times each example's terms) equals gradjax's client, whose
  ``clients.example_weights`` weigh each example's own mean by N M_n / Σ M; a bound that clips
  some examples and not others."""
  import jax.numpy as jnp
  import torch
  import torch.nn.functional as F
  from torch import nn
  from gradjax import clients
  opacus = pytest.importorskip("opacus")
  vocab, dim = 11, 6
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab - 1, (3, 8))
  targets = np.full((3, 8), -1)
  for n, positions in enumerate(([2], [0, 5], [1, 3, 4, 7])):
    targets[n, positions] = tokens[n, positions]
    tokens[n, positions] = vocab - 1  # <mask>
  torch.manual_seed(0)
  net = nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, vocab))
  params = {"embed": net[0].weight.detach().numpy().copy(),
            "kernel": net[1].weight.detach().numpy().T.copy(), "bias": net[1].bias.detach().numpy().copy()}

  def apply_fn(variables, x, train=False):
    p = variables["params"]
    return p["embed"][x] @ p["kernel"] + p["bias"]

  def loss(model, x, t):
    return F.cross_entropy(model(x).reshape(-1, vocab), t.reshape(-1), ignore_index=-1)

  xs, ts = torch.tensor(tokens), torch.tensor(targets)
  norms = []
  for n in range(3):  # Opacus' per-sample gradient norms: N times the example's terms in the mean
    g = torch.autograd.grad(3 * loss(net, xs[n:n + 1], ts[n:n + 1]) * (ts[n] >= 0).sum()
                            / (ts >= 0).sum(), list(net.parameters()))
    norms.append(float(torch.sqrt(sum((a.double() ** 2).sum() for a in g))))
  bound = float(np.median(norms))
  assert min(norms) < bound < max(norms)
  before = [p.detach().clone() for p in net.parameters()]
  loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ts), batch_size=3)
  private, optimizer, loader = opacus.PrivacyEngine().make_private(
      module=net, optimizer=torch.optim.SGD(net.parameters(), lr=1.0), data_loader=loader,
      noise_multiplier=0.0, max_grad_norm=bound, poisson_sampling=False)
  for xb, tb in loader:
    optimizer.zero_grad()
    loss(private, xb, tb).backward()
    optimizer.step()
  embed, weight, bias = (b - p.detach() for b, p in zip(before, net.parameters()))
  got = clients.fedsgd(apply_fn, {"params": jax_tree(params, jnp)}, jnp.asarray(tokens),
                       jnp.asarray(targets), dp_sgd=clients.DPSGD(bound)).gradient
  for mine, want in ((got["embed"], embed), (got["kernel"], weight.T), (got["bias"], bias)):
    np.testing.assert_allclose(np.asarray(mine), want.numpy(), rtol=1e-4,
                               atol=1e-6 * float(want.abs().max()))
  np.testing.assert_allclose(np.asarray(clients.example_weights(jnp.asarray(targets))),
                             [3 * 1 / 7, 3 * 2 / 7, 3 * 4 / 7], rtol=1e-6)


def jax_tree(params, jnp):
  return {k: jnp.asarray(v) for k, v in params.items()}


def test_opacus_poisson_sampled_clients_are_gradjaxs(photos):
  """Opacus' default, Poisson sampling (``make_private(poisson_sampling=True)``: q = 1/len(loader) =
  1/2 over 4 examples, 2 epochs of 2 steps, momentum 0.9, no noise): each step sums its draw's
  clipped gradients over Opacus' expected batch size qn = 2. The draws Opacus made (read from an
  index the data set carries) given to gradjax's client (``local_sgd(..., draws=...)``) give
  Opacus' update, steps of another size than 2 among them (with torch 2.13's generator at this seed,
  4, 0, 4 and 1: an empty step, which momentum still moves)."""
  import torch
  import torch.nn.functional as F
  from gradjax import clients
  opacus = pytest.importorskip("opacus")
  x, y = photos[:4], np.array([2, 7, 7, 0])
  bound = 1.0
  net = _lenet(torch, 0)
  before = {k: v.detach().clone() for k, v in net.state_dict().items()}
  data = torch.utils.data.TensorDataset(torch.tensor(np.transpose(x, (0, 3, 1, 2))),
                                        torch.tensor(y), torch.arange(4))
  loader = torch.utils.data.DataLoader(data, batch_size=2)
  torch.manual_seed(3)  # Opacus' sampler draws from torch's generator
  private, optimizer, loader = opacus.PrivacyEngine().make_private(
      module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
      data_loader=loader, noise_multiplier=0.0, max_grad_norm=bound, poisson_sampling=True)
  draws = []
  for _ in range(2):
    for xb, yb, ib in loader:
      draws.append(np.isin(np.arange(4), ib.numpy()))
      optimizer.zero_grad()
      F.cross_entropy(private(xb), yb).backward()
      optimizer.step()
  assert optimizer.expected_batch_size == 2 and len(draws) == 4
  sizes = [int(d.sum()) for d in draws]
  assert any(s != 2 for s in sizes), sizes
  want = {k: (before[k] - v).detach() for k, v in net.named_parameters()}
  model, mapping, variables = _gradjax_twin(before)
  local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.1, momentum=0.9)
  new = clients.local_sgd(model.apply_fn, variables, x, y, local,
                          dp_sgd=clients.DPSGD(bound, 0.0, 0.5), draws=np.stack(draws))
  import jax
  got = interop_params(jax.tree.map(lambda a, b: a - b, variables["params"], new), mapping)
  for name, tensor in want.items():
    np.testing.assert_allclose(got[name], tensor.numpy(), rtol=2e-4,
                               atol=2e-6 * float(tensor.abs().max()), err_msg=name)
