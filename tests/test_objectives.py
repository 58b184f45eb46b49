"""Tests for gradjax.distances and gradjax.objectives.

References: NumPy distances on random pytrees; for the gradient-matching objective, float64 central
finite differences on DLG's LeNet and a hand-derived NumPy backprop of the MLP (conftest).
"""

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import attacks, clients, compilation, distances, models, objectives, presets

# --- distances ----------------------------------------------------------------------------------------


def _random_trees(seed):
  rng = np.random.default_rng(seed)
  shapes = {"conv": {"kernel": (3, 3, 2, 4), "bias": (4,)}, "head": {"kernel": (8, 5), "bias": (5,)}}
  make = lambda: jax.tree.map(lambda s: rng.normal(size=s), shapes, is_leaf=lambda s: isinstance(s, tuple))
  return make(), make()


def _flat(tree):
  return np.concatenate([np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)])


@pytest.mark.parametrize("seed", [0, 1])
def test_euclidean_matches_numpy(seed):
  a, b = _random_trees(seed)
  want = np.sum((_flat(a) - _flat(b)) ** 2)
  with jax.enable_x64(True):
    ja, jb = jax.tree.map(jnp.asarray, a), jax.tree.map(jnp.asarray, b)
    np.testing.assert_allclose(float(distances.euclidean(ja, jb)), want, rtol=1e-13)
    np.testing.assert_allclose(float(distances.euclidean(ja, jb, scale=0.5)), 0.5 * want, rtol=1e-13)
    np.testing.assert_allclose(float(distances.get_distance("euclidean_half")(ja, jb)), 0.5 * want,
                               rtol=1e-13)
    np.testing.assert_allclose(float(distances.get_distance("euclidean")(ja, jb)), want, rtol=1e-13)
    # d/da of scale * ||a - b||^2 is 2 * scale * (a - b).
    grad = jax.grad(lambda t: distances.euclidean(t, jb, scale=0.5))(ja)
    np.testing.assert_allclose(_flat(grad), _flat(a) - _flat(b), rtol=1e-13)


@pytest.mark.parametrize("seed", [0, 1])
def test_cosine_matches_numpy(seed):
  a, b = _random_trees(seed)
  fa, fb = _flat(a), _flat(b)
  na, nb = np.linalg.norm(fa), np.linalg.norm(fb)
  want = 1 - fa @ fb / (na * nb)
  want_grad = -(fb / (na * nb) - (fa @ fb) * fa / (na**3 * nb))
  with jax.enable_x64(True):
    ja, jb = jax.tree.map(jnp.asarray, a), jax.tree.map(jnp.asarray, b)
    np.testing.assert_allclose(float(distances.cosine(ja, jb)), want, rtol=1e-10)
    np.testing.assert_allclose(float(distances.get_distance("cosine")(ja, jb)), want, rtol=1e-10)
    grad = jax.grad(distances.cosine)(ja, jb)
    np.testing.assert_allclose(_flat(grad), want_grad, rtol=1e-9, atol=1e-12)
    # Layers are pooled, not averaged per layer; scale invariance; extreme values.
    assert abs(float(distances.cosine(jax.tree.map(lambda x: 3.0 * x, ja), jb)) - want) < 1e-12
    assert abs(float(distances.cosine(ja, ja))) < 1e-12
    assert abs(float(distances.cosine(ja, jax.tree.map(jnp.negative, ja))) - 2) < 1e-12


def test_cosine_safe_at_zero_dummy():
  a, b = _random_trees(2)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), a)
  obs = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), b)
  value, grad = jax.jit(jax.value_and_grad(distances.cosine))(zeros, obs)
  assert np.isfinite(float(value)) and abs(float(value) - 1) < 1e-6
  g = _flat(grad)
  assert np.all(np.isfinite(g)) and np.any(g != 0)
  # The gradient at 0 points against the observed gradient (cosine distance decreases along +obs).
  cos = g @ _flat(b) / (np.linalg.norm(g) * np.linalg.norm(_flat(b)))
  assert cos < -0.999
  # Euclidean is finite there too, and both trees zero is fine for cosine.
  assert np.isfinite(np.asarray(jax.jit(jax.grad(distances.cosine))(zeros, zeros)["head"]["kernel"]).sum())


def test_unknown_distance():
  with pytest.raises(ValueError):
    distances.get_distance("manhattan")


# --- objectives on DLG's LeNet in float64 -----------------------------------------------------------------


@pytest.fixture(scope="module")
def lenet64(fill_variables, photos):
  """LeNet (DLG) in float64 with U(-0.5, 0.5) weights and biases, and the FedSGD observation of two
  real photos with labels 3 and 7."""
  with jax.enable_x64(True):
    module = models.get_module("lenet_zhu", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=7, dtype=np.float64, scale=0.5)
    apply_fn = models.make_apply_fn(module)
    x = jnp.asarray(photos[[1, 2]], jnp.float64)  # chelsea, coffee
    y = jnp.asarray([3, 7])
    obs = clients.fedsgd(apply_fn, variables, x, y)
    objective = jax.jit(objectives.gradient_matching(apply_fn, distances.euclidean))
  return apply_fn, variables, x, y, obs, objective


def _fd_check(objective, dummy, obs, labels, keys, seed, h=1e-5, tol=1e-6):
  """Directional derivatives of the objective along random directions in ``keys`` vs central differences."""
  grad = jax.grad(objective)(dummy, obs, labels)
  rng = np.random.default_rng(seed)
  for _ in range(3):
    d = {k: (jnp.asarray(rng.standard_normal(v.shape)) if k in keys else jnp.zeros_like(v))
         for k, v in dummy.items()}
    plus = {k: dummy[k] + h * d[k] for k in dummy}
    minus = {k: dummy[k] - h * d[k] for k in dummy}
    fd = (float(objective(plus, obs, labels)) - float(objective(minus, obs, labels))) / (2 * h)
    got = sum(float(jnp.vdot(grad[k], d[k])) for k in dummy)
    assert abs(got) > 1e-8
    assert abs(got - fd) <= tol * abs(fd), (got, fd)


@pytest.mark.slow
def test_objective_gradient_wrt_x_matches_finite_differences(lenet64, photos):
  _, _, x, y, obs, objective = lenet64
  with jax.enable_x64(True):
    dummy = {"x": jnp.asarray(photos[[5, 9]], jnp.float64)}  # other photos as the dummy
    assert float(objective(dummy, obs, y)) > 1e-3
    _fd_check(objective, dummy, obs, y, ("x",), seed=0)
    near = {"x": x + 0.01 * jnp.asarray(np.random.default_rng(1).standard_normal(x.shape))}
    _fd_check(objective, near, obs, y, ("x",), seed=1)


@pytest.mark.slow
def test_objective_joint_labels_matches_finite_differences(lenet64, photos):
  _, _, _, _, obs, objective = lenet64
  rng = np.random.default_rng(2)
  with jax.enable_x64(True):
    dummy = {"x": jnp.asarray(photos[[5, 9]], jnp.float64),
             "label_logits": jnp.asarray(rng.standard_normal((2, 10)))}
    _fd_check(objective, dummy, obs, None, ("label_logits",), seed=3)
    _fd_check(objective, dummy, obs, None, ("x", "label_logits"), seed=4)
    # Labels passed alongside label_logits are ignored: the soft labels win.
    np.testing.assert_allclose(float(objective(dummy, obs, jnp.asarray([0, 0]))),
                               float(objective(dummy, obs, None)), rtol=1e-14)


@pytest.mark.slow
def test_objective_zero_only_at_truth(lenet64, photos):
  apply_fn, variables, x, y, obs, objective = lenet64
  with jax.enable_x64(True):
    at_truth = float(objective({"x": x}, obs, y))
    assert 0 <= at_truth < 1e-20
    assert float(objective({"x": x + 1e-3}, obs, y)) > 1e-10
    assert float(objective({"x": x}, obs, jnp.asarray([3, 8]))) > 1e-3   # wrong label
    assert float(objective({"x": x[::-1]}, obs, y)) > 1e-3               # swapped images
    assert float(objective({"x": jnp.asarray(photos[[5, 9]], jnp.float64)}, obs, y)) > 1e-3
    # The dummy gradient at the true data is the client's gradient.
    g = jax.jit(lambda x, y: objectives.dummy_gradient(apply_fn, variables, x, y))(x, y)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(obs.gradient)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-15)
    # With soft labels, (nearly) one-hot logits at the truth give (nearly) zero objective.
    sharp = {"x": x, "label_logits": 40.0 * jax.nn.one_hot(y, 10, dtype=jnp.float64)}
    assert float(objective(sharp, obs)) < 1e-25


@pytest.mark.slow
def test_objective_vmaps_over_restarts(lenet64, photos):
  _, _, _, y, obs, objective = lenet64
  with jax.enable_x64(True):
    xs = jnp.asarray(np.stack([photos[[5, 9]], photos[[0, 3]], photos[[1, 2]]]), jnp.float64)
    batched = jax.vmap(lambda xx: objective({"x": xx}, obs, y))(xs)
    single = [float(objective({"x": xx}, obs, y)) for xx in xs]
  np.testing.assert_allclose(np.asarray(batched), single, rtol=1e-12, atol=1e-24)
  assert single[2] < 1e-20 < single[0]


# --- objective values against NumPy (MLP, hand-derived backprop) ----------------------------------------


@pytest.mark.parametrize("joint", [False, True])
def test_objective_value_matches_numpy_mlp(photos, fill_variables, mlp_reference, log_softmax_reference,
                                          joint):
  rng = np.random.default_rng(8)
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=9, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
    x_true = photos[[3, 11]].astype(np.float64)
    y = np.array([6, 2])
    obs = clients.fedsgd(apply_fn, variables, x_true, y)
    x_dummy = photos[[12, 0]].astype(np.float64)
    dummy = {"x": jnp.asarray(x_dummy)}
    targets = y
    if joint:
      logits = rng.standard_normal((2, 10))
      dummy["label_logits"] = jnp.asarray(logits)
      targets = np.exp(log_softmax_reference(logits))
    for name, np_distance in (
        ("euclidean", lambda a, b: np.sum((a - b) ** 2)),
        ("euclidean_half", lambda a, b: 0.5 * np.sum((a - b) ** 2)),
        ("cosine", lambda a, b: 1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
    ):
      objective = objectives.gradient_matching(apply_fn, distances.get_distance(name))
      got = float(jax.jit(lambda d: objective(d, obs, jnp.asarray(y)))(dummy))  # eagerly: op by op
      _, g_true = mlp_reference(variables["params"], x_true, y)
      _, g_dummy = mlp_reference(variables["params"], x_dummy, targets)
      want = np_distance(_flat(g_dummy), _flat(g_true))
      assert want > 1e-6
      np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=name)


@pytest.mark.parametrize("where", ["model", "replay"])
@pytest.mark.slow
def test_remat_changes_memory_not_values(where):
  """jax.checkpoint (ResNet blocks, or the replayed local steps) recomputes activations: value and
  gradient equal the plain objective's (float64)."""
  from gradjax import clients, distances, models
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(2, 8, 8, 3)), np.array([1, 3])
    dummy = {"x": jnp.asarray(rng.normal(size=x.shape))}
    out = []
    for remat in (False, True):
      # The replay's remat wraps each local step whatever the model: a small MLP compiles fast.
      model = models.create("resnet8" if where == "model" else "mlp-16", jax.random.key(0),
                            input_shape=(8, 8, 3), num_classes=4, param_dtype=jnp.float64,
                            remat=remat and where == "model", conv="xla")
      local = clients.LocalTraining(epochs=2, batch_size=1, learning_rate=0.1)
      obs = (clients.fedsgd(model.apply_fn, model.variables, x, y) if where == "model" else
             clients.fedavg(model.apply_fn, model.variables, x, y, local))
      objective = objectives.gradient_matching(
          model.apply_fn, distances.cosine,
          matched=objectives.Gradient() if where == "model" else objectives.Replay(remat))
      out.append(compilation.once(jax.value_and_grad(objective))(dummy, obs, jnp.asarray(y)))
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12)
  np.testing.assert_allclose(out[1][1]["x"], out[0][1]["x"], rtol=1e-10, atol=1e-14)


def test_objective_passes_its_step_to_an_annealed_kernel(photos, fill_variables, mlp_reference):
  """SAPAG's annealed kernel (width n_l^(1 - t/250) σ_l², Q_l = 1/(l+1)) inside the objective, against
  NumPy on the MLP's hand-derived gradients: the objective hands the distance its step."""
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=3, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
    x_true, y = photos[[4, 7]].astype(np.float64), np.array([1, 5])
    obs = clients.fedsgd(apply_fn, variables, x_true, y)
    x_dummy = x_true + 0.02 * np.random.default_rng(5).standard_normal(x_true.shape)
    objective = jax.jit(objectives.gradient_matching(
        apply_fn, distances.get_distance("gaussian_kernel_annealed")))
    _, g_true = mlp_reference(variables["params"], x_true, y)
    _, g_dummy = mlp_reference(variables["params"], x_dummy, y)
    depth = {"Dense_0": 0, "head": 1}
    values = []
    for step in (0, 125, 250, 1000):
      e = max(0.0, 1 - step / 250)
      want = sum((1 / (1 + depth[layer])) * (1 - np.exp(-np.sum((g_dummy[layer][k] - g_true[layer][k]) ** 2)
                                                        / (g_true[layer][k].size ** e * np.var(g_true[layer][k]))))
                 for layer in depth for k in ("kernel", "bias"))
      got = float(objective({"x": jnp.asarray(x_dummy)}, obs, jnp.asarray(y), jnp.asarray(step)))
      np.testing.assert_allclose(got, want, rtol=1e-9)
      values.append(got)
  assert values[0] < values[1] < values[2] == values[3]  # the kernel narrows, then stays


# --- the head-feature term ----------------------------------------------------------------------------


def test_head_input_is_the_hidden_layer(photos, mlp_reference):
  """The head's input read by the interceptor is relu(x W1 + b1), computed by NumPy."""
  model = models.create("mlp-16", jax.random.key(2), num_classes=10)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), model.variables["params"])
  want = np.maximum(photos[:3].reshape(3, -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
  got = objectives.head_input(model.apply_fn, model.variables, photos[:3])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="no module named 'fc'"):
    objectives.head_input(model.apply_fn, model.variables, photos[:3], layer="fc")


@pytest.mark.slow
def test_head_feature_term(photos):
  """λ Σ w ‖h(x') − t‖² / Σ w ‖t‖²: zero at the client's data with its own head inputs as targets,
  NumPy's value elsewhere; only the weighted examples count."""
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10)
  x, y = photos[:3], np.array([1, 4, 7])
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
  # Jitted, as a solver evaluates them: unjitted, each operation would be compiled on its own.
  plain = jax.jit(objectives.gradient_matching(model.apply_fn, distances.euclidean))
  term = jax.jit(objectives.gradient_matching(model.apply_fn, distances.euclidean, head_features=10.0))
  head_input = jax.jit(lambda x: objectives.head_input(model.apply_fn, model.variables, x))
  t = head_input(x)
  w = jnp.asarray([1.0, 0.0, 1.0])
  assert float(term({"x": x}, obs, y, head_targets=(t, w))) == pytest.approx(0.0, abs=1e-9)
  other = photos[3:6]
  h = np.asarray(head_input(other), np.float64)
  tn, wn = np.asarray(t, np.float64), np.asarray(w, np.float64)
  want = 10.0 * np.sum(wn[:, None] * (h - tn) ** 2) / np.sum(wn[:, None] * tn ** 2)
  got = float(term({"x": other}, obs, y, head_targets=(t, w))) - float(plain({"x": other}, obs, y))
  assert got == pytest.approx(want, rel=1e-4)
  with pytest.raises(ValueError, match="targets"):
    term({"x": other}, obs, y)


@pytest.mark.slow
def test_head_feature_term_with_a_clipped_gradient(photos):
  """Under DP-SGD's clipped objective the head-feature term is the same NumPy value (the features
  read by a forward pass of their own); the head targets keep only a class of one's row there (a
  clipping factor of each example's own would bias the per-example solve), and an attack takes head
  features with the clipped objective."""
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10)
  x, y = photos[:3], np.array([1, 4, 1])
  clipped = objectives.ClippedGradient(max_norm=0.5)
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, dp_sgd=clients.DPSGD(0.5),
                       share_labels=True)
  plain = jax.jit(objectives.gradient_matching(model.apply_fn, distances.euclidean, matched=clipped))
  term = jax.jit(objectives.gradient_matching(model.apply_fn, distances.euclidean, matched=clipped,
                                              head_features=10.0))
  t = objectives.head_input(model.apply_fn, model.variables, x)
  w = jnp.asarray([0.0, 1.0, 0.0])
  assert float(term({"x": x}, obs, y, head_targets=(t, w))) == pytest.approx(0.0, abs=1e-9)
  other = photos[3:6]
  h = np.asarray(objectives.head_input(model.apply_fn, model.variables, other), np.float64)
  tn = np.asarray(t, np.float64)
  want = 10.0 * np.sum((h[1] - tn[1]) ** 2) / np.sum(tn[1] ** 2)
  got = float(term({"x": other}, obs, y, head_targets=(t, w))) - float(plain({"x": other}, obs, y))
  assert got == pytest.approx(want, rel=1e-4)
  targets, weights = attacks.head_targets(obs, y, jnp.float32, jax.random.key(0), per_example=False)
  np.testing.assert_array_equal(np.asarray(weights), [0.0, 1.0, 0.0])
  np.testing.assert_allclose(np.asarray(targets)[1], np.asarray(t)[1],
                             atol=0.05 * float(np.linalg.norm(tn[1])))
  attack = dataclasses.replace(presets.inverting_gradients_batch(10), matched=clipped)
  assert attack.head_features > 0
  # Every class present: the clipped weights are not determined, no row is trusted.
  three = models.create("lenet_zhu", jax.random.key(3), num_classes=3)
  every = clients.fedsgd(three.apply_fn, three.variables, x, np.array([0, 1, 2]),
                         dp_sgd=clients.DPSGD(0.5))
  _, weights = attacks.head_targets(every, np.array([0, 1, 2]), jnp.float32, jax.random.key(0),
                                    per_example=False)
  np.testing.assert_array_equal(np.asarray(weights), [0.0, 0.0, 0.0])
  # DLM's scaled model difference is no gradient: it takes no head features.
  with pytest.raises(ValueError, match="head features"):
    dataclasses.replace(presets.dlm(), head_features=1.0, label_source=presets.idlg().label_source)


# --- DP-SGD's clipped gradient ---------------------------------------------------------------------------


@pytest.mark.parametrize("joint", [False, True])
def test_clipped_gradient_objective_matches_numpy_mlp(photos, fill_variables, mlp_reference,
                                                      log_softmax_reference, joint):
  """DP-SGD's matched part: the distance between the mean of the dummy examples' gradients, each
  clipped to C over all parameters (NumPy backprop per example, soft targets too), and the observed
  one; 0 at a DP-SGD client's own data, where the plain gradient's objective is not."""
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=9, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
    x_true, y = photos[[3, 11, 5]].astype(np.float64), np.array([6, 2, 2])
    norms = [np.linalg.norm(_flat(mlp_reference(variables["params"], x_true[i:i + 1], y[i:i + 1])[1]))
             for i in range(3)]
    bound = float(np.median(norms))
    obs = clients.fedsgd(apply_fn, variables, x_true, y, dp_sgd=clients.DPSGD(bound))
    x_dummy = photos[[12, 0, 7]].astype(np.float64)
    dummy, targets = {"x": jnp.asarray(x_dummy)}, np.eye(10)[y]
    if joint:
      logits = rng.standard_normal((3, 10))
      dummy["label_logits"] = jnp.asarray(logits)
      targets = np.exp(log_softmax_reference(logits))
    objective = jax.jit(objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.ClippedGradient(bound)))
    per = [_flat(mlp_reference(variables["params"], x_dummy[i:i + 1], targets[i:i + 1])[1])
           for i in range(3)]
    u = np.mean([g * min(1.0, bound / np.linalg.norm(g)) for g in per], axis=0)
    want = np.sum((u - _flat(obs.gradient)) ** 2)
    assert want > 1e-6
    np.testing.assert_allclose(float(objective(dummy, obs, jnp.asarray(y))), want, rtol=1e-9)
    assert float(objective({"x": jnp.asarray(x_true)}, obs, jnp.asarray(y))) < 1e-25
    plain = objectives.gradient_matching(apply_fn, distances.euclidean)
    assert float(plain({"x": jnp.asarray(x_true)}, obs, jnp.asarray(y))) > 1e-8
  with pytest.raises(ValueError, match="clipping bound"):
    objectives.ClippedGradient(0.0)


@pytest.mark.slow
def test_clipped_gradient_objective_matches_finite_differences(lenet64, photos):
  """The clipped objective's gradient w.r.t. the dummy images and label logits on DLG's LeNet in
  float64, against central differences, with a bound that clips one example of two."""
  apply_fn, variables, x, y, obs, _ = lenet64
  with jax.enable_x64(True):
    per = [objectives.dummy_gradient(apply_fn, variables, x[i:i + 1], y[i:i + 1]) for i in range(2)]
    norms = [float(jnp.sqrt(sum(jnp.sum(a ** 2) for a in jax.tree.leaves(g)))) for g in per]
    bound = float(np.mean(norms))
    objective = jax.jit(objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.ClippedGradient(bound)))
    dummy = {"x": jnp.asarray(photos[[5, 9]], jnp.float64),
             "label_logits": jnp.asarray(np.random.default_rng(5).standard_normal((2, 10)))}
    _fd_check(objective, dummy, obs, None, ("x", "label_logits"), seed=6)


def test_replay_of_dp_sgd_steps_is_zero_at_the_clients_data(photos, fill_variables):
  """A FedAvg client trained with DP-SGD's clipped steps (no noise): the replay objective with its
  bound is 0 at the client's images; the plain replay's is not."""
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=4, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
    x, y = jnp.asarray(photos[[2, 6, 9, 1]], jnp.float64), jnp.asarray([1, 1, 4, 7])
    local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.1, momentum=0.9)
    per = [objectives.dummy_gradient(apply_fn, variables, x[i:i + 1], y[i:i + 1]) for i in range(4)]
    bound = float(np.median([np.sqrt(sum(float(jnp.sum(a ** 2)) for a in jax.tree.leaves(g)))
                             for g in per]))
    obs = clients.fedavg(apply_fn, variables, x, y, local, dp_sgd=clients.DPSGD(bound))
    clipped = objectives.gradient_matching(apply_fn, distances.euclidean,
                                           matched=objectives.Replay(max_norm=bound))
    plain = objectives.gradient_matching(apply_fn, distances.euclidean, matched=objectives.Replay())
    assert float(clipped({"x": x}, obs, y)) < 1e-25 < 1e-8 < float(plain({"x": x}, obs, y))
  with pytest.raises(ValueError, match="clipping bound"):
    objectives.Replay(max_norm=-1.0)


def test_poisson_sampled_steps_objectives(photos, fill_variables):
  """Poisson-sampled DP-SGD (no noise). FedSGD: ClippedGradient with the client's expected batch
  size qN is 0 at the examples the step drew (one dummy each), where the mean of their clipped
  gradients (the fixed-batch reading) is not. FedAvg: Replay with the sampling rate matches the
  local training whose every step is the clipped mean over all the examples (draws of q, tested
  against NumPy in test_clients), not the client's own draws."""
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=10, param_dtype=jnp.float64)
    variables = fill_variables(module, (32, 32, 3), seed=4, dtype=np.float64, scale=0.05)
    apply_fn = models.make_apply_fn(module)
    x, y = jnp.asarray(photos[[2, 6, 9, 1, 5, 3]], jnp.float64), jnp.asarray([1, 1, 4, 7, 0, 2])
    dp, key = clients.DPSGD(0.3, 0.0, 0.5), jax.random.key(12)
    draws = clients.drawn(dp, key, 6)[0]
    assert 0 < draws.sum() != 3
    obs = clients.fedsgd(apply_fn, variables, x, y, dp_sgd=dp, key=key, share_labels=True)
    obs = obs.replace(num_samples=int(draws.sum()))
    poisson = objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.ClippedGradient(0.3, 3.0))
    fixed = objectives.gradient_matching(
        apply_fn, distances.euclidean, matched=objectives.ClippedGradient(0.3))
    drawn = {"x": x[draws]}
    assert float(poisson(drawn, obs, obs.labels)) < 1e-25 < 1e-8 < float(fixed(drawn, obs, obs.labels))

    local = clients.LocalTraining(epochs=1, batch_size=2, learning_rate=0.1, momentum=0.9)
    sampled = clients.fedavg(apply_fn, variables, x, y, local, dp_sgd=dp, key=key)
    expected = sampled.replace(gradient=jax.tree.map(jnp.subtract, variables["params"], clients.local_sgd(
        apply_fn, variables, x, y, local, dp_sgd=dp, draws=np.full((3, 6), 0.5))))
    replay = objectives.gradient_matching(apply_fn, distances.euclidean,
                                          matched=objectives.Replay(max_norm=0.3, sampling_rate=0.5))
    assert float(replay({"x": x}, expected, y)) < 1e-25 < 1e-10 < float(replay({"x": x}, sampled, y))
  with pytest.raises(ValueError, match="expected batch size"):
    objectives.ClippedGradient(1.0, 0.0)
  with pytest.raises(ValueError, match="clipping bound"):
    objectives.Replay(sampling_rate=0.5)
  with pytest.raises(ValueError, match="sampling_rate"):
    objectives.Replay(max_norm=1.0, sampling_rate=2.0)
