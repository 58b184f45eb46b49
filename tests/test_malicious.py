"""The malicious server's imprint block (gradjax.malicious): its forward pass and read-out against
NumPy on inputs whose bins are known, alone, in collision and aggregated over clients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, malicious, models
from gradjax.losses import cross_entropy

SHAPE = (8, 8, 3)


def _batch(means, seed=0):
  """Images whose mean brightness is ``means`` (a centred pattern added to each)."""
  rng = np.random.default_rng(seed)
  pattern = rng.uniform(-0.2, 0.2, size=(len(means), *SHAPE))
  pattern -= pattern.reshape(len(means), -1).mean(1)[:, None, None, None]
  return (pattern + np.asarray(means)[:, None, None, None]).astype(np.float32)


def _model():
  return models.create("lenet_zhu", jax.random.key(0), input_shape=SHAPE)


def test_the_imprinted_model_is_the_model_on_its_moved_input():
  """logits = model(x + scale Σ_i ReLU(mean(x) − c_i)), h computed in NumPy."""
  model = _model()
  thresholds = np.array([0.2, 0.4, 0.6])
  evil = malicious.imprint(model, thresholds, scale=1e-2)
  x = _batch([0.3, 0.5, 0.7])
  h = np.maximum(x.reshape(3, -1).astype(np.float64).mean(1)[:, None] - thresholds[None], 0)
  moved = x + 1e-2 * h.sum(1)[:, None, None, None]
  np.testing.assert_allclose(np.asarray(jax.jit(evil.apply_fn)(evil.variables, x)),
                             np.asarray(jax.jit(model.apply_fn)(model.variables, moved.astype(np.float32))),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_an_example_alone_in_its_bin_comes_back_exactly_and_a_collision_as_its_weighted_mean():
  """Means 0.25 | 0.45 | 0.62, 0.66 | 0.9 against thresholds 0.2, 0.4, 0.6, 0.8: three examples
  alone (read to 1e-5), two in one bin (their mean weighted by g_n = ⟨∂L/∂x'_n, w⟩ / N, from the
  model's own input gradient, NumPy for the mean), none below c_0."""
  model = _model()
  thresholds = np.array([0.2, 0.4, 0.6, 0.8])
  scale = 1e-3
  evil = malicious.imprint(model, thresholds, scale=scale)
  x = _batch([0.25, 0.45, 0.62, 0.66, 0.9])
  y = np.array([1, 2, 3, 4, 5])
  observation = clients.fedsgd(evil.apply_fn, evil.variables, x, y)
  rec = malicious.imprint_recover(observation.gradient, SHAPE)
  assert rec.bins.tolist() == [0, 1, 2, 3]
  for b, n in ((0, 0), (1, 1), (3, 4)):
    np.testing.assert_allclose(rec.x[rec.bins.tolist().index(b)], x[n], rtol=1e-4, atol=1e-5)
  # The collision: g_n from the gradient of the loss with respect to the model's input x'.
  h = np.maximum(x.reshape(5, -1).astype(np.float64).mean(1)[:, None] - thresholds[None], 0)
  moved = jnp.asarray(x + scale * h.sum(1)[:, None, None, None], jnp.float32)
  dx = np.asarray(jax.jit(jax.grad(lambda z: cross_entropy(model.apply_fn(model.variables, z), y)))(moved),
                  np.float64)
  g = dx.reshape(5, -1).sum(1) * scale
  want = (g[2] * x[2] + g[3] * x[3]) / (g[2] + g[3])
  np.testing.assert_allclose(rec.x[rec.bins.tolist().index(2)], want, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(rec.weights[rec.bins.tolist().index(2)], g[2] + g[3], rtol=1e-3)


def test_the_read_out_works_on_updates_summed_over_clients():
  """Two clients' FedSGD gradients added (what secure aggregation hands the server): each example
  alone in its bin over both batches comes back."""
  model = _model()
  thresholds = np.linspace(0.1, 0.9, 9)
  evil = malicious.imprint(model, thresholds)
  a, b = _batch([0.15, 0.55], seed=1), _batch([0.35, 0.75], seed=2)
  total = jax.tree.map(lambda u, v: u + v,
                       clients.fedsgd(evil.apply_fn, evil.variables, a, np.array([0, 1])).gradient,
                       clients.fedsgd(evil.apply_fn, evil.variables, b, np.array([2, 3])).gradient)
  rec = malicious.imprint_recover(total, SHAPE)
  truth = np.concatenate([a, b])
  assert len(rec.x) == 4
  for x in truth:
    assert np.abs(rec.x - x).reshape(4, -1).max(1).min() < 1e-4


def test_a_sparse_block_fires_each_unit_on_its_own_bin():
  """structure="sparse", 4 thresholds, 3 units: logits = model(x + scale Σ_i clip((s − c_i) /
  (c_(i+1) − c_i), 0, 1)) with s the mean brightness, h computed in NumPy, at gain 1 and 1e-3."""
  model = _model()
  edges = np.array([0.2, 0.4, 0.5, 0.8])
  x = _batch([0.1, 0.3, 0.45, 0.7, 0.9])
  s = x.reshape(5, -1).astype(np.float64).mean(1)[:, None]
  h = np.clip((s - edges[None, :-1]) / np.diff(edges)[None], 0, 1)
  moved = (x + 1e-2 * h.sum(1)[:, None, None, None]).astype(np.float32)
  want = np.asarray(jax.jit(model.apply_fn)(model.variables, moved))
  for gain in (1.0, 1e-3):
    evil = malicious.imprint(model, edges, structure="sparse", scale=1e-2, gain=gain)
    assert evil.variables["params"]["imprint"]["bias"].shape == (3,)
    np.testing.assert_allclose(np.asarray(jax.jit(evil.apply_fn)(evil.variables, x)), want, rtol=1e-4,
                               atol=1e-5)
  with pytest.raises(ValueError, match="all different"):
    malicious.imprint(model, [0.2, 0.2, 0.5], structure="sparse")
  with pytest.raises(ValueError, match="unknown imprint structure"):
    malicious.imprint(model, edges, structure="dense")


@pytest.mark.slow
def test_a_sparse_block_reads_every_local_step_of_a_fedavg_client():
  """Eight examples, one to a bin of a sparse block of 16 units (17 thresholds), gain 1e-3: after two
  local epochs of four mini-batch steps (SGD at 0.05, momentum 0.9) all eight come back (to 2e-4 of
  the true images), where a cumulative block of the same bins (gain 1e-2) loses the later steps'
  examples whose bins lie below an earlier step's example (its rows moved along it). FedSGD: two examples sharing a bin come back as their mean weighted by g_n =
  ⟨∂L/∂x'_n, w⟩ (NumPy from the model's own input gradient)."""
  model = _model()
  edges = np.linspace(0.1, 0.95, 17)
  means = (edges[:-1] + edges[1:])[::2] / 2
  x, y = _batch(means), np.arange(8)
  local = clients.LocalTraining(2, 2, 0.05, 0.9)
  sparse = malicious.imprint(model, edges, structure="sparse", gain=1e-3)
  update = clients.fedavg(sparse.apply_fn, sparse.variables, x, y, local).gradient
  rec = malicious.imprint_recover(update, SHAPE, structure="sparse")
  error = np.abs(rec.x[None] - x[:, None]).reshape(8, len(rec.x), -1).max(-1).min(1)
  assert error.max() < 2e-4, error
  cumulative = malicious.imprint(model, edges, gain=1e-2)
  update = clients.fedavg(cumulative.apply_fn, cumulative.variables, x, y, local).gradient
  rec = malicious.imprint_recover(update, SHAPE)
  error = np.abs(rec.x[None] - x[:, None]).reshape(8, len(rec.x), -1).max(-1).min(1)
  assert np.sum(error < 2e-4) < 8, error
  # A collision under FedSGD.
  scale = 1e-3
  x = _batch([0.3, 0.52, 0.55, 0.8])
  y = np.array([1, 2, 3, 4])
  edges = np.array([0.2, 0.4, 0.6, 0.9])
  sparse = malicious.imprint(model, edges, structure="sparse", scale=scale)
  rec = malicious.imprint_recover(clients.fedsgd(sparse.apply_fn, sparse.variables, x, y).gradient,
                                  SHAPE, structure="sparse")
  assert rec.bins.tolist() == [0, 1, 2]
  s = x.reshape(4, -1).astype(np.float64).mean(1)[:, None]
  h = np.clip((s - edges[None, :-1]) / np.diff(edges)[None], 0, 1)
  moved = jnp.asarray(x + scale * h.sum(1)[:, None, None, None], jnp.float32)
  dx = np.asarray(jax.jit(jax.grad(lambda z: cross_entropy(model.apply_fn(model.variables, z), y)))(moved),
                  np.float64)
  g = dx.reshape(4, -1).sum(1) * scale
  np.testing.assert_allclose(rec.x[1], (g[1] * x[1] + g[2] * x[2]) / (g[1] + g[2]), rtol=1e-3, atol=1e-4)
  for b, n in ((0, 0), (2, 3)):
    np.testing.assert_allclose(rec.x[b], x[n], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_shrunk_block_reads_a_fedavg_update_that_float32_blurs_at_full_size():
  """gain 1e-2 leaves the model's input as it was (logits to float32 rounding) and makes the rows
  move by 10⁴ more of themselves: a FedAvg client's W_0 − W_1 after one full-batch step gives all
  eight examples back (to 2e-4) where the full-size block loses some to float32 (error above 0.1);
  after two mini-batch steps of four, the first step's four come back."""
  model = _model()
  thresholds = np.linspace(0.1, 0.9, 17)
  x, y = _batch(np.linspace(0.12, 0.95, 8)), np.arange(8)
  full, shrunk = (malicious.imprint(model, thresholds, gain=g) for g in (1.0, 1e-2))
  np.testing.assert_allclose(np.asarray(shrunk.apply_fn(shrunk.variables, x)),
                             np.asarray(full.apply_fn(full.variables, x)), rtol=1e-4, atol=1e-5)

  def worst(evil, local, examples):
    update = clients.fedavg(evil.apply_fn, evil.variables, x, y, local).gradient
    rec = malicious.imprint_recover(update, SHAPE)
    return max(np.abs(rec.x - x[n]).reshape(len(rec.x), -1).max(1).min() for n in examples)

  one_step = clients.LocalTraining(1, None, 0.01)
  assert worst(shrunk, one_step, range(8)) < 2e-4
  assert worst(full, one_step, range(8)) > 0.1
  assert worst(shrunk, clients.LocalTraining(1, 4, 0.01), range(4)) < 2e-4
  with pytest.raises(ValueError, match="gain must be positive"):
    malicious.imprint(model, thresholds, gain=0.0)


def test_thresholds_and_bad_input():
  stats = np.random.default_rng(0).normal(size=1000)
  np.testing.assert_allclose(malicious.imprint_thresholds(stats, 3),
                             np.quantile(stats, [0.25, 0.5, 0.75]))
  with pytest.raises(ValueError, match="bins >= 1"):
    malicious.imprint_thresholds(stats, 0)
  with pytest.raises(ValueError, match="unknown imprint statistic"):
    malicious.imprint(_model(), [0.5], statistic="median")
  with pytest.raises(ValueError, match="no imprint block"):
    malicious.imprint_recover(_model().variables, SHAPE)
  a = malicious.measurement("random", 12, jax.random.key(1))
  assert a.shape == (12,) and np.isclose(np.linalg.norm(a), 1.0)


def test_the_readme_snippet_reads_the_photos_back(capsys):
  """The README's section "A server that sends a malicious model", run as written: its read-outs
  include photos recovered exactly (NumPy's distance to the nearest photo)."""
  import os
  from gradjax import data
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
  section = readme[readme.index("### A server that sends a malicious model"):]
  start = section.index("```python") + len("```python")
  scope = {}
  exec(compile(section[start:section.index("```", start)], "README.md", "exec"), scope)
  assert capsys.readouterr().out.endswith("read-outs for 16 photos\n")
  photos = data.load("skimage", image_size=(32, 32)).x.reshape(16, -1).astype(np.float64)
  found = scope["found"].x.reshape(len(scope["found"].x), -1)
  nearest = np.abs(photos[:, None] - found[None]).max(-1).min(1)
  assert np.sum(nearest < 1e-4) >= 12


def test_an_imprint_hidden_in_an_mlps_first_layer_reads_like_the_block():
  """imprint_layer on mlp-64: the shapes are the model's; the examples alone in their bins come
  back exactly from Dense_0's first k units."""
  model = models.create("mlp-64", jax.random.key(0), input_shape=SHAPE)
  thresholds = np.linspace(0.1, 0.9, 9)
  evil = malicious.imprint_layer(model, thresholds)
  assert jax.tree.map(np.shape, evil.variables) == jax.tree.map(np.shape, model.variables)
  x = _batch([0.15, 0.35, 0.55, 0.75])
  gradient = clients.fedsgd(evil.apply_fn, evil.variables, x, np.array([0, 1, 2, 3])).gradient
  rec = malicious.imprint_recover(gradient, SHAPE, layer="Dense_0", units=9)
  assert len(rec.x) == 4
  for example in x:
    assert np.abs(rec.x - example).reshape(4, -1).max(1).min() < 1e-4
  with pytest.raises(ValueError, match="one-hidden-layer MLP"):
    malicious.imprint_layer(_model(), thresholds)


def test_the_imprint_closed_form_finds_the_units_in_the_sent_model_and_reads_the_examples():
  """``--attack=imprint`` on an update of mlp-64 with an imprint of 9 bins hidden among its first
  layer's units (shuffled, so found by direction and ordered by threshold, not by position): the four
  examples, each alone in its bin (NumPy's count against the thresholds), come back to 1e-4, from the
  FedSGD gradient and from a one-step FedAvg update alike; an honest model is refused in one line."""
  from gradjax import closed_forms
  model = models.create("mlp-64", jax.random.key(0), input_shape=SHAPE)
  thresholds = np.linspace(0.1, 0.9, 9)
  evil = malicious.imprint_layer(model, thresholds)
  perm = np.random.default_rng(0).permutation(64)
  params = jax.tree.map(np.asarray, evil.variables["params"])
  shuffled = {"Dense_0": {"kernel": params["Dense_0"]["kernel"][:, perm], "bias": params["Dense_0"]["bias"][perm]},
              "head": {**params["head"], "kernel": params["head"]["kernel"][perm]}}
  evil = evil._replace(variables={"params": jax.tree.map(jnp.asarray, shuffled)})
  units = malicious.imprint_units(shuffled["Dense_0"]["kernel"], shuffled["Dense_0"]["bias"])
  np.testing.assert_array_equal(units, np.argsort(perm)[:9])  # the imprint's units, threshold order
  x = _batch([0.15, 0.35, 0.55, 0.75])
  bins = np.searchsorted(thresholds, x.reshape(4, -1).astype(np.float64).mean(1))
  assert len(set(bins)) == 4 and min(bins) > 0  # each alone in its bin, none below c_0
  y = np.array([0, 1, 2, 3])
  box = (np.zeros(3), np.ones(3))
  for observation in (clients.fedsgd(evil.apply_fn, evil.variables, x, y),
                      clients.update_as_gradient(clients.fedavg(
                          evil.apply_fn, evil.variables, x, y, clients.LocalTraining(1, None, 0.1, 0.0)))):
    rec, found = closed_forms.reconstruct(closed_forms.Imprint(), evil.apply_fn, observation, SHAPE, box)
    assert found["imprint"]["units"] == 9 and found["imprint"]["kept"] == 4
    for example in x:
      assert np.abs(rec.x - example).reshape(4, -1).max(1).min() < 1e-4
  honest = clients.fedsgd(model.apply_fn, model.variables, x, y)
  with pytest.raises(ValueError, match="holds no imprint"):
    closed_forms.reconstruct(closed_forms.Imprint(), model.apply_fn, honest, SHAPE, box)


@pytest.mark.parametrize("name", ["lenet_zhu", "lenet5", "convnet-16", "mlp-1024", "resnet20"])
def test_inspect_flags_the_malicious_models_and_not_the_honest_ones(name):
  """Fresh draws of the zoo model: nothing found. The imprint block in front: parameters outside
  the declared architecture and its units sharing one direction. For the MLP, the imprint inside
  its first layer: the shapes pass, the shared direction does not."""
  shape = (32, 32, 3)
  for seed in range(2):
    honest = models.create(name, jax.random.key(seed), input_shape=shape)
    assert malicious.inspect(honest.variables, honest.variables) == []
  evil = malicious.imprint(honest, np.linspace(0.2, 0.8, 16))
  found = malicious.inspect(evil.variables, honest.variables)
  reasons = " ".join(f.reason for f in found)
  assert "not in the declared architecture" in reasons and "16 of its 16 units" in reasons
  sparse = malicious.imprint(honest, np.linspace(0.2, 0.8, 17), structure="sparse", gain=1e-3)
  found = malicious.inspect(sparse.variables, honest.variables)
  assert any(f.path == "['imprint']['kernel']" and f.reason.startswith("16 of its 16 units") for f in found)
  if name.startswith("mlp"):
    hidden = malicious.imprint_layer(honest, np.linspace(0.2, 0.8, 16))
    found = malicious.inspect(hidden.variables, honest.variables)
    assert [(f.path, f.reason.split(" of ")[0]) for f in found] == [("['Dense_0']['kernel']", "16")]


def test_inspect_passes_a_zeroed_head_that_took_a_step_on_some_classes():
  """A zero-initialised head after one SGD step on six of ten classes: the other four classes' units
  move along one direction (NumPy: 4 of them at |cos| 1), which is no imprint's (the head gives the
  logits, not a ReLU's bins); the same parallel units in the first layer are still found."""
  model = models.create("mlp-64", jax.random.key(0), input_shape=(8, 8, 1))
  head = {k: np.zeros_like(v) for k, v in model.variables["params"]["head"].items()}
  variables = {**model.variables, "params": {**model.variables["params"], "head": head}}
  x = np.random.default_rng(0).uniform(size=(8, 8, 8, 1)).astype(np.float32)
  update = clients.fedavg(model.apply_fn, variables, x, np.array([0, 1, 2, 3, 4, 5, 0, 1]),
                          clients.LocalTraining(learning_rate=0.1)).gradient
  stepped = jax.tree.map(lambda w, u: np.asarray(w) - np.asarray(u), variables["params"], update)
  unseen = np.asarray(stepped["head"]["kernel"], np.float64)[:, 6:].T
  unseen /= np.linalg.norm(unseen, axis=1, keepdims=True)
  np.testing.assert_allclose(np.abs(unseen @ unseen.T), 1.0, rtol=1e-6)
  assert malicious.inspect({"params": stepped}, model.variables) == []
  kernel = np.array(stepped["Dense_0"]["kernel"])
  kernel[:, :4] = np.outer(kernel[:, 4], np.arange(1.0, 5.0))  # four units along one direction
  moved = {**stepped, "Dense_0": {**stepped["Dense_0"], "kernel": kernel}}
  assert [f.path for f in malicious.inspect({"params": moved}, model.variables)] == ["['Dense_0']['kernel']"]


@pytest.mark.slow
def test_inspect_finds_nothing_in_the_committed_trained_checkpoints():
  import os
  from gradjax import checkpoint
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for path in ("experiments/studies/hfginv_batch/runs/train_resnet20_cifar10/epoch_5.npz",
               "experiments/studies/ig_table1/runs/train_lenet_zhu_cifar10_normalized/epoch_20.npz"):
    model = checkpoint.load_model(os.path.join(root, path))
    assert malicious.inspect(model.variables) == [], path


@pytest.mark.slow
@pytest.mark.slow
def test_the_audits_row_is_what_a_sparse_imprint_recovers():
  """The attack itself, not a model of it: 150 FedSGD clients of 8 random images each, behind a
  sparse block of 16 bins whose 17 thresholds are quantiles of the server's own draws of such
  images (4 000); the examples read back exactly (to 1e-3 of every pixel) average server_row's
  expected count, 8 (16/18)(17/18)^7 = 4.77 (measured 4.80; the standard error of the mean is
  about 0.14)."""
  rng = np.random.default_rng(0)
  model = _model()
  n, k, trials = 8, 16, 150
  server = rng.uniform(0, 1, size=(4000, *SHAPE)).reshape(4000, -1).mean(1)
  sent = malicious.imprint(model, malicious.imprint_thresholds(server, k + 1), structure="sparse")
  exact = []
  for _ in range(trials):
    x = rng.uniform(0, 1, size=(n, *SHAPE)).astype(np.float32)
    update = clients.fedsgd(sent.apply_fn, sent.variables, x, rng.integers(0, 10, n)).gradient
    rec = malicious.imprint_recover(update, SHAPE, structure="sparse")
    error = np.abs(rec.x[None] - x[:, None]).reshape(n, len(rec.x), -1).max(-1)
    exact.append(int(np.sum(error.min(1, initial=np.inf) < 1e-3)))
  expected = malicious.server_row(n, k)["expected_exact"]
  assert expected == pytest.approx(8 * 16 / 18 * (17 / 18) ** 7)
  assert np.mean(exact) == pytest.approx(expected, abs=0.35), (np.mean(exact), np.std(exact))


def test_the_audits_row_is_the_expected_count_of_a_simulated_server():
  """server_row's N (k/(k+2)) ((k+1)/(k+2))^(N−1) against a NumPy simulation of N examples in k + 2
  equally likely cells (the two outer ones lost), 20 000 draws; and the row a run reports for its
  batch, a FedSGD client's and a FedAvg client's of two mini-batch steps alike."""
  rng = np.random.default_rng(0)
  for n, k in ((8, 16), (64, 512), (128, 1024)):
    cells = rng.integers(0, k + 2, size=(20_000, n))
    counts = np.stack([np.bincount(c, minlength=k + 2) for c in cells])
    alone = ((counts == 1)[:, 1:-1]).sum(axis=1).mean()
    row = malicious.server_row(n, k)
    assert row["expected_exact"] == pytest.approx(alone, rel=0.01) and row["examples"] == n
  from gradjax.run import config, pipeline
  for options in ({"attack.preset": "adam_dlg", "data.batch_size": 2},
                  {"attack.preset": "inverting_gradients_fedavg", "data.batch_size": 4,
                   "client.name": "fedavg", "client.local_batch_size": 2}):
    results, _ = pipeline.run(config.from_options({
        **options, "attack.iterations": 2, "model.name": "mlp-64", "data.image_size": 8,
        "output.lpips": "none"}))
    n = options["data.batch_size"]
    assert results["malicious_server"]["examples"] == n
    assert results["malicious_server"]["expected_exact"] == pytest.approx(
        n * 1024 / 1026 * (1025 / 1026) ** (n - 1))


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
@pytest.mark.slow
def test_no_honest_pytorch_model_is_refused():
  """The Flower example's PyTorch twins as a client receives them (state_dict arrays): DLG's LeNet,
  a CIFAR ResNet with BatchNorm and an MLP under PyTorch's own initialisation, three draws each
  pass received_findings (with the client's inputs, so the trap check runs too); the MLP after a
  few local SGD steps at the example's rate is not refused either, though its units fire so rarely
  that the gate audits its update (received_check's second part); the LeNet with an imprint's tensors
  added is refused."""
  import os
  import sys
  pytest.importorskip("torch")
  pytest.importorskip("flwr")
  from gradjax.integrations.audit import received_check
  from gradjax.integrations.flower import received_findings
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sys.path.insert(0, os.path.join(root, "examples", "flower_audit"))
  try:
    from flower_audit import task
  finally:
    sys.path.pop(0)
  x, y = task.load("skimage", None, list(range(16)))
  inputs = np.transpose(x.numpy(), (0, 2, 3, 1))
  for name in ("resnet8-4", "mlp-256", "lenet_zhu"):
    for seed in range(3):
      net = task.build(name, seed)
      sent = {k: v.detach().numpy() for k, v in net.state_dict().items()}
      assert received_findings(sent, name, inputs=inputs) == [], (name, seed)
  # Trained at the example's learning rate, most of the MLP's units die: its layer fires as rarely
  # as trap weights, but its biases stay small: not refused, its update audited.
  mlp = task.build("mlp-256", 0)
  task.train(mlp, x, y, epochs=3, batch_size=4, lr=0.1)
  sent_mlp = {k: v.detach().numpy() for k, v in mlp.state_dict().items()}
  found, rare = received_check(sent_mlp, "mlp-256", inputs=inputs)
  assert found == [] and received_findings(sent_mlp, "mlp-256", inputs=inputs) == []
  assert list(rare) == ["['Dense_0']['kernel']"] and rare["['Dense_0']['kernel']"] < malicious.TRAP_RATE
  sent["imprint.weight"] = np.full((16, 3072), 1 / 3072, np.float32)
  assert "not the declared lenet_zhu" in received_findings(sent, "lenet_zhu")[0].reason


def test_trap_weights_fire_for_their_share_of_the_servers_data_and_give_the_batch_back():
  """Each unit of the trapped layer is active for a share `rate` of the server's public data
  (NumPy), the shapes are the model's and inspect sees nothing; exclusive_neurons then reads most of
  a batch of 8 back exactly."""
  from gradjax import analytic
  rng = np.random.default_rng(0)
  public = rng.uniform(size=(400, *SHAPE)).astype(np.float32)
  model = models.create("mlp-256", jax.random.key(0), input_shape=SHAPE)
  sent = malicious.trap_weights(model, public, 1 / 8, jax.random.key(1))
  params = sent.variables["params"]["Dense_0"]
  z = public.reshape(400, -1).astype(np.float64) @ np.asarray(params["kernel"], np.float64)
  active = (z + np.asarray(params["bias"], np.float64) > 0).mean(axis=0)
  np.testing.assert_allclose(active, 1 / 8, atol=1 / 400 + 1e-9)
  assert jax.tree.map(np.shape, sent.variables) == jax.tree.map(np.shape, model.variables)
  assert malicious.inspect(sent.variables, model.variables) == []
  x = rng.uniform(size=(8, *SHAPE)).astype(np.float32)
  found = analytic.exclusive_neurons(clients.fedsgd(sent.apply_fn, sent.variables, x, np.arange(8)),
                                     sent.apply_fn, SHAPE)
  got = np.asarray(found.inputs).reshape(len(found.inputs), -1)
  exact = sum(np.abs(got - v).max(axis=1).min() < 1e-4 for v in x.reshape(8, -1)) if len(got) else 0
  assert exact >= 6
  with pytest.raises(ValueError, match="one-hidden-layer MLP"):
    malicious.trap_weights(_model(), public, 0.1, jax.random.key(0))


def test_the_client_sees_trap_weights_on_its_own_examples_and_not_an_honest_layer():
  """activation_rate and bias_share against the MLP's own hidden pre-activations (Flax's captured
  Dense_0 output, with and without its bias); inspect with the client's examples flags the trap
  (rate 1/32 on the server's data) and not the fresh draws of any initialisation, at batch 1 and 16;
  a layer whose weights turned away from the examples (every unit dead, biases as drawn) is not
  flagged, and rarely_firing names it."""
  rng = np.random.default_rng(0)
  public = rng.uniform(size=(400, *SHAPE)).astype(np.float32)
  x = rng.uniform(size=(16, *SHAPE)).astype(np.float32)
  for init in models.INITS:
    honest = models.create("mlp-256", jax.random.key(2), input_shape=SHAPE, init=init)
    _, state = honest.apply_fn.module.apply(honest.variables, x, capture_intermediates=True,
                                            mutable=["intermediates"])
    z = np.asarray(state["intermediates"]["Dense_0"]["__call__"][0])
    rate = malicious.activation_rate(honest.variables, x)
    assert list(rate) == ["['Dense_0']['kernel']"]  # the head does not read the input
    np.testing.assert_allclose(rate["['Dense_0']['kernel']"], np.mean(z > 0), atol=1e-6)
    b = np.asarray(honest.variables["params"]["Dense_0"]["bias"], np.float64)
    want = np.median(-b) / np.median(np.abs(z - b)) if np.any(z != b) else 0.0
    np.testing.assert_allclose(malicious.bias_share(honest.variables, x)["['Dense_0']['kernel']"], want,
                               rtol=1e-4, atol=1e-7)
    for batch in (x[:1], x):
      assert malicious.inspect(honest.variables, honest.variables, inputs=batch) == [], init
      assert malicious.rarely_firing(honest.variables, batch) == {}, init
  sent = malicious.trap_weights(honest, public, 1 / 32, jax.random.key(1))
  for batch in (x[:1], x):
    found = malicious.inspect(sent.variables, honest.variables, inputs=batch)
    assert [f.path for f in found] == ["['Dense_0']['kernel']"]
  params = honest.variables["params"]
  dead = {**params, "Dense_0": {**params["Dense_0"], "kernel": -jnp.abs(params["Dense_0"]["kernel"])}}
  assert malicious.inspect({"params": dead}, honest.variables, inputs=x) == []
  assert malicious.rarely_firing({"params": dead}, x) == {"['Dense_0']['kernel']": 0.0}
