"""FedAvg clients against a hand-written NumPy loop of SGD steps (float64)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, models


def np_local_sgd(params, x, y, epochs, batch_size, lr, momentum, grads_fn):
  """Plain loop: for each epoch, for each in-order mini-batch, v = μv + g, W = W − ηv."""
  params = {k: {n: np.asarray(v, np.float64) for n, v in layer.items()} for k, layer in params.items()}
  velocity = {k: {n: np.zeros_like(v) for n, v in layer.items()} for k, layer in params.items()}
  for _ in range(epochs):
    for start in range(0, len(x), batch_size):
      _, g = grads_fn(params, x[start:start + batch_size], y[start:start + batch_size])
      for k in params:
        for n in params[k]:
          velocity[k][n] = momentum * velocity[k][n] + g[k][n]
          params[k][n] = params[k][n] - lr * velocity[k][n]
  return params


@pytest.fixture(scope="module")
def mlp64(photos, fill_variables):
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=1, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
  return apply_fn, variables


@pytest.mark.parametrize("epochs, batch_size, momentum", [(1, None, 0.0), (2, 2, 0.0), (3, 1, 0.9)])
def test_local_sgd_equals_numpy_loop(mlp64, photos, mlp_reference, epochs, batch_size, momentum):
  apply_fn, variables = mlp64
  x = np.asarray(photos[:4], np.float64)
  y = np.array([3, 1, 3, 7])
  local = clients.LocalTraining(epochs=epochs, batch_size=batch_size, learning_rate=0.1,
                                momentum=momentum)
  with jax.enable_x64(True):
    obs = clients.fedavg(apply_fn, variables, x, y, local)
  want = np_local_sgd(variables["params"], x, y, epochs, batch_size or 4, 0.1, momentum, mlp_reference)
  for k in want:
    for n in want[k]:
      update = np.asarray(variables["params"][k][n], np.float64) - want[k][n]
      np.testing.assert_allclose(obs.gradient[k][n], update, rtol=1e-10, atol=1e-14)
  assert obs.threat_model == "fedavg" and obs.local == local and obs.num_samples == 4
  assert local.steps(4) == epochs * (4 // (batch_size or 4))


def test_one_full_batch_step_is_lr_times_fedsgd(mlp64, photos):
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[:2], np.float64), np.array([0, 5])
  with jax.enable_x64(True):
    avg = clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(learning_rate=0.01))
    sgd = clients.fedsgd(apply_fn, variables, x, y)
  for a, g in zip(jax.tree.leaves(avg.gradient), jax.tree.leaves(sgd.gradient)):
    np.testing.assert_allclose(a, 0.01 * np.asarray(g), rtol=1e-12, atol=1e-16)


def test_update_as_gradient(mlp64, photos, mlp_reference):
  """One full-batch step (momentum too: its buffer starts at the gradient) divided by the lr is the
  NumPy gradient; several steps are refused."""
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[:2], np.float64), np.array([0, 5])
  params64 = {k: {n: np.asarray(v, np.float64) for n, v in layer.items()}
              for k, layer in variables["params"].items()}
  _, want = mlp_reference(params64, x, y)
  with jax.enable_x64(True):
    one = clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(learning_rate=0.05,
                                                                           momentum=0.9))
    grad = clients.update_as_gradient(one)
    two = clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(batch_size=1))
  assert grad.threat_model == "fedsgd" and grad.local is None and grad.num_samples == 2
  for k in want:
    for n in want[k]:
      np.testing.assert_allclose(grad.gradient[k][n], want[k][n], rtol=1e-9, atol=1e-14)
  with pytest.raises(ValueError, match="2 local SGD steps, not one"):
    clients.update_as_gradient(two)
  with pytest.raises(ValueError, match="not a scaled gradient"):
    clients.update_as_gradient(one.replace(local=None))


def test_aggregate_is_fedavgs_weighted_mean(mlp64, photos, mlp_reference):
  """Clients of 1, 2 and 3 examples: the aggregate is Σ_k (n_k / N) Δ_k (McMahan et al.'s FedAvg),
  each Δ_k the NumPy loop's; of FedSGD clients, the NumPy gradient of the mean loss over all six."""
  apply_fn, variables = mlp64
  local = clients.LocalTraining(epochs=1, batch_size=1, learning_rate=0.05)
  x, y = np.asarray(photos[:6], np.float64), np.array([0, 1, 2, 3, 4, 5])
  cuts = ((0, 1), (1, 3), (3, 6))
  params64 = {k: {n: np.asarray(v, np.float64) for n, v in layer.items()}
              for k, layer in variables["params"].items()}
  with jax.enable_x64(True):
    total = clients.aggregate([clients.fedavg(apply_fn, variables, x[a:b], y[a:b], local,
                                              share_labels=True) for a, b in cuts])
    pooled = clients.aggregate([clients.fedsgd(apply_fn, variables, x[a:b], y[a:b]) for a, b in cuts])
    again = clients.aggregate([total, clients.fedavg(apply_fn, variables, x[:2], y[:2], local)])
  ends = [np_local_sgd(variables["params"], x[a:b], y[a:b], 1, 1, 0.05, 0.0, mlp_reference)
          for a, b in cuts]
  _, gradient = mlp_reference(params64, x, y)
  for k in params64:
    for n in params64[k]:
      want = sum((b - a) / 6 * (params64[k][n] - end[k][n]) for (a, b), end in zip(cuts, ends))
      np.testing.assert_allclose(total.gradient[k][n], want, rtol=1e-10, atol=1e-15)
      np.testing.assert_allclose(pooled.gradient[k][n], gradient[k][n], rtol=1e-10, atol=1e-15)
  assert total.num_samples == 6 and total.clients == (1, 2, 3) and total.labels.tolist() == list(range(6))
  assert total.threat_model == "fedavg_aggregate"
  assert again.clients == (1, 2, 3, 2) and again.threat_model == "fedavg_aggregate"


def test_an_aggregates_replay_trains_each_client_apart(mlp64, photos, mlp_reference):
  """The replay of an aggregate of clients of several local steps is each client's NumPy loop on its
  own examples, weighed n_k / N: the objective is 0 at the clients' data (and the verdict's residual),
  where replaying them as one client of N examples is not."""
  from gradjax import distances, objectives, verdict
  apply_fn, variables = mlp64
  local = clients.LocalTraining(epochs=2, batch_size=1, learning_rate=0.1)
  x, y = np.asarray(photos[:5], np.float64), np.array([4, 1, 7, 1, 0])
  cuts = ((0, 2), (2, 5))
  with jax.enable_x64(True):
    obs = clients.aggregate([clients.fedavg(apply_fn, variables, x[a:b], y[a:b], local,
                                            share_labels=True) for a, b in cuts])
    objective = jax.jit(objectives.gradient_matching(apply_fn, distances.euclidean,
                                                     matched=objectives.Replay()))
    at_truth = float(objective({"x": jnp.asarray(x)}, obs, jnp.asarray(y)))
    as_one = float(objective({"x": jnp.asarray(x)}, obs.replace(clients=None), jnp.asarray(y)))
    replayed = clients.replayed_update(apply_fn, obs, jnp.asarray(x), jnp.asarray(y))
    residual = verdict.residual(apply_fn, obs, {"x": x}, y, matched="replay")
  ends = [np_local_sgd(variables["params"], x[a:b], y[a:b], 2, 1, 0.1, 0.0, mlp_reference)
          for a, b in cuts]
  for k in ends[0]:
    for n in ends[0][k]:
      sent = np.asarray(variables["params"][k][n], np.float64)
      want = sum((b - a) / 5 * (sent - end[k][n]) for (a, b), end in zip(cuts, ends))
      np.testing.assert_allclose(replayed[k][n], want, rtol=1e-10, atol=1e-15)
  norm = float(np.sum(_flat(obs.gradient) ** 2))
  assert at_truth < 1e-20 * norm and as_one > 1e-3 * norm
  assert residual.relative_error < 1e-9


def test_bad_local_training(mlp64, photos):
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[:3], np.float64), np.array([0, 1, 2])
  with jax.enable_x64(True):
    with pytest.raises(ValueError, match="batch size dividing"):
      clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(batch_size=2))
    with pytest.raises(ValueError, match="momentum"):
      clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(momentum=1.0))
  with pytest.raises(ValueError, match="at least one"):
    clients.aggregate([])


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(tree)])


def test_update_objectives_against_numpy(mlp64, photos, mlp_reference):
  """replay, DLM and DLM+ values on a two-step client, against NumPy backprop and SGD; DLM+ also
  as the authors' released code normalises (each tree over the mean of its tensors' norms)."""
  from gradjax import distances, objectives
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[5:7], np.float64), np.array([2, 9])
  x_dummy = np.asarray(photos[8:10], np.float64)
  local = clients.LocalTraining(epochs=2, batch_size=None, learning_rate=0.05)
  with jax.enable_x64(True):
    obs = clients.fedavg(apply_fn, variables, x, y, local)
    values = {mode: float(jax.jit(objectives.gradient_matching(  # eagerly each operation compiles alone
        apply_fn, distances.euclidean, matched=objectives.matched(mode)))(
        {"x": jnp.asarray(x_dummy), "log_gamma": jnp.asarray(np.log(3.0))}, obs, jnp.asarray(y)))
        for mode in ("replay", "dlm", "dlm_plus")}
    values["released"] = float(jax.jit(objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.Normalised(layer_mean=True)))(
        {"x": jnp.asarray(x_dummy)}, obs, jnp.asarray(y)))
  observed = _flat(obs.gradient)
  replayed = np_local_sgd(variables["params"], x_dummy, y, 2, 2, 0.05, 0.0, mlp_reference)
  u = _flat(variables["params"]) - _flat(replayed)
  np.testing.assert_allclose(values["replay"], np.sum((u - observed) ** 2), rtol=1e-9)
  g = _flat(mlp_reference(variables["params"], x_dummy, y)[1])
  np.testing.assert_allclose(values["dlm"], np.sum((g - 3.0 * observed) ** 2), rtol=1e-9)
  unit = lambda v: v / np.linalg.norm(v)
  np.testing.assert_allclose(values["dlm_plus"], np.sum((unit(g) - unit(observed)) ** 2), rtol=1e-9)
  tensors = lambda tree: [np.asarray(v, np.float64) for v in jax.tree.leaves(tree)]  # noqa: E731
  mean_norm = lambda tree: np.mean([np.linalg.norm(t) for t in tensors(tree)])  # noqa: E731
  g_tree = mlp_reference(variables["params"], x_dummy, y)[1]
  np.testing.assert_allclose(values["released"], np.sum(
      (g / mean_norm(g_tree) - observed / mean_norm(obs.gradient)) ** 2), rtol=1e-9)


def test_replay_needs_the_schedule(mlp64, photos):
  from gradjax import distances, objectives
  apply_fn, variables = mlp64
  with jax.enable_x64(True):
    obs = clients.fedavg(apply_fn, variables, np.asarray(photos[:1], np.float64), np.array([1]),
                         share_local=False)
    objective = objectives.gradient_matching(apply_fn, distances.euclidean,
                                             matched=objectives.Replay())
    with pytest.raises(ValueError, match="local training"):
      objective({"x": jnp.asarray(photos[:1], jnp.float64)}, obs, jnp.array([1]))


def test_dlm_gamma_converges_to_one_over_lr_on_an_easy_case():
  """One full-batch SGD step (lr 0.01) of a small MLP; dummy data started 0.05 from the client's
  image, γ from 1: Adam on (x', log γ) drives γ to 1/lr = 100 and x' to the image. (From a random
  start γ collapses towards 0 instead: the objective's trivial minimum, see the README.)"""
  from gradjax import distances, driver, objectives, optimizers, solvers
  with jax.enable_x64(True):
    model = models.create("mlp-16", jax.random.key(0), input_shape=(4, 4, 3), num_classes=5,
                          param_dtype=jnp.float64)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(1, 4, 4, 3)), np.array([3])
    obs = clients.fedavg(model.apply_fn, model.variables, x, y, clients.LocalTraining(learning_rate=0.01))
    objective = objectives.gradient_matching(model.apply_fn, distances.euclidean,
                                             matched=objectives.ScaledDifference())
    solver = solvers.make_solver(lambda d, data, step: objective(d, obs, jnp.asarray(y), step),
                                 optimizers.make_optimizer("adam", 0.05))
    init = {"x": jnp.asarray(x + 0.05 * rng.normal(size=x.shape))[None],
            "log_gamma": jnp.zeros((1,))}
    state = driver.run(solver, init, None, iterations=3000,
                        execution=driver.Execution("sequential", chunk=1000))
  np.testing.assert_allclose(np.exp(state.best_params["log_gamma"][0]), 100.0, rtol=1e-4)
  np.testing.assert_allclose(state.best_params["x"][0], x, atol=1e-6)


def test_labels_shared_as_a_multiset_are_sorted(mlp64, photos):
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[:4], np.float64), np.array([7, 1, 3, 1])
  local = clients.LocalTraining(batch_size=2)
  with jax.enable_x64(True):
    ordered = clients.fedavg(apply_fn, variables, x, y, local, share_labels="ordered")
    multiset = clients.fedavg(apply_fn, variables, x, y, local, share_labels="multiset")
    with pytest.raises(ValueError, match="share_labels"):
      clients.fedavg(apply_fn, variables, x, y, local, share_labels="some")
  np.testing.assert_array_equal(ordered.labels, y)
  np.testing.assert_array_equal(multiset.labels, [1, 1, 3, 7])



@pytest.mark.slow
def test_dlm_gamma_held_then_released_matches_the_closed_form(mlp64, photos, mlp_reference):
  """d/ds ‖g' − e^s v‖² = −2 e^s ⟨g' − e^s v, v⟩ (NumPy, float64) from step ``frozen`` on; 0 before."""
  from gradjax import distances, objectives
  apply_fn, variables = mlp64
  x, y = np.asarray(photos[:1], np.float64), np.array([2])
  x_dummy = np.asarray(photos[1:2], np.float64)
  s = np.log(7.0)
  with jax.enable_x64(True):
    obs = clients.fedavg(apply_fn, variables, x, y, clients.LocalTraining(learning_rate=0.01))
    objective = objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.ScaledDifference(objectives.Gamma(frozen=5)))
    # one program for both steps (a traced argument, as in an attack), not one per operation
    at = jax.jit(lambda d, step: jax.grad(lambda d: objective(d, obs, jnp.asarray(y), step))(d))
    grad = lambda step: float(at({"x": jnp.asarray(x_dummy), "log_gamma": jnp.asarray(s)},
                                 jnp.asarray(step))["log_gamma"])
    before, after = grad(4), grad(5)
  v = _flat(obs.gradient)
  g = _flat(mlp_reference(variables["params"], x_dummy, y)[1])
  assert before == 0.0
  np.testing.assert_allclose(after, -2 * np.exp(s) * np.dot(g - np.exp(s) * v, v), rtol=1e-9)


def test_dlm_gamma_start_and_learning_rate_of_its_own():
  """γ starts at Gamma.init; with a learning rate of its own, log γ's first Adam step is −lr·sign(∂)
  while the data's is the attack's lr (Adam's first step is lr·g/(|g| + ε))."""
  from gradjax import attacks, dummy, objectives, presets
  start = dummy.init_dummy(jax.random.key(0), dummy.normal, (1, 4, 4, 3), None, gamma=100.0)
  np.testing.assert_allclose(float(start["log_gamma"]), np.log(100.0), rtol=1e-6)
  attack = presets.dlm(gamma=objectives.Gamma(init=100.0, learning_rate=1e-3))
  tx = attacks.build_optimizer(attack)
  params = {"x": jnp.ones((1, 2)), "log_gamma": jnp.zeros(())}
  grads = {"x": jnp.array([[3.0, -0.5]]), "log_gamma": jnp.asarray(-2.0)}
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["x"], [[-0.1, 0.1]], rtol=1e-5)
  np.testing.assert_allclose(float(updates["log_gamma"]), 1e-3, rtol=1e-5)


def test_dlm_gamma_settings_are_checked():
  from gradjax import objectives, optimizers, presets
  from gradjax.run import config
  assert config.parse_gamma("init=100, lr=0.01,frozen=500") == objectives.Gamma(100.0, 0.01, 500)
  assert config.parse_gamma("") == objectives.Gamma()
  for bad in ("init=0", "frozen=-1", "lr=0", "gamma=3", "init=", "frozen=1.5"):
    with pytest.raises(ValueError, match="gamma"):
      config.parse_gamma(bad)
  with pytest.raises(ValueError, match="--config.attack.matched=dlm only"):
    config.get_attack(config.from_options({"attack.preset": "dlg", "attack.gamma": "init=2"}))
  with pytest.raises(ValueError, match="objectives.Gamma"):
    objectives.ScaledDifference(gamma=2.0)
  with pytest.raises(ValueError, match="first-order"):
    dataclasses.replace(presets.dlm(gamma=objectives.Gamma(learning_rate=0.1)),
                        optimizer=optimizers.Named("lbfgs", 0.1))
  with pytest.raises(ValueError, match="first-order"):  # any transformation that stores the value
    dataclasses.replace(presets.dlm(gamma=objectives.Gamma(learning_rate=0.1)),
                        optimizer=optimizers.lbfgs(1.0))


def test_an_aggregate_of_equal_clients_is_their_plain_mean_and_is_one_file_of_none(mlp64, photos):
  """Equal sizes: the plain mean Σ Δ_k / K to the bit (simulated FedAvg training's rounds as they
  were); an aggregate of FedAvg clients is not written as one client's update file, nor replayed
  with one client's declared expected batch size."""
  from gradjax import interop  # pylint: disable=g-import-not-at-top
  apply_fn, variables = mlp64
  local = clients.LocalTraining(epochs=1, batch_size=1, learning_rate=0.05)
  x, y = np.asarray(photos[:6], np.float64), np.array([0, 1, 2, 3, 4, 5])
  with jax.enable_x64(True):
    parts = [clients.fedavg(apply_fn, variables, x[a:a + 2], y[a:a + 2], local) for a in (0, 2, 4)]
    total = clients.aggregate(parts)
    for got, *each in zip(jax.tree.leaves(total.gradient), *(jax.tree.leaves(p.gradient) for p in parts)):
      np.testing.assert_array_equal(got, sum(each) / 3)
    with pytest.raises(ValueError, match="one client's divisor"):
      clients.replayed_update(apply_fn, total, jnp.asarray(x), jnp.asarray(y), max_norm=1.0,
                              sampling_rate=0.5, expected_batch_size=1.0)
  with pytest.raises(ValueError, match="aggregate of 3 FedAvg clients' updates is no one client's"):
    interop.save_observation("never.safetensors", total, None)
