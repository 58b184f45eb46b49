"""Attacks adapted to a declared defense (gradjax.adaptive): the adapted objective against closed
forms in NumPy, zero at the client's true gradient, and float64 finite differences."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import adaptive, defenses, distances, presets
from gradjax.run import config
from gradjax.observation import Observation


def _tree(seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return {"dense": {"kernel": (scale * rng.normal(size=(6, 5))).astype(np.float32),
                    "bias": (scale * rng.normal(size=(5,))).astype(np.float32)},
          "head": {"kernel": (scale * rng.normal(size=(5, 3))).astype(np.float32)}}


def _defended(tree, spec, key=None):
  obs = Observation(gradient=jax.tree.map(jnp.asarray, tree), variables={}, labels=None)
  return jax.tree.map(np.asarray, defenses.parse(spec).apply(obs, key).gradient)


def _euclidean(spec):
  return adaptive.distance(distances.DISTANCES["euclidean"], defenses.parse(spec))


def test_parts_of_a_chain_and_dp():
  got = adaptive.steps(defenses.parse("dp:2.0:0.5:global,prune:0.3"))
  assert got == (adaptive.Step("clip", (2.0,), True), adaptive.Step("gaussian", (1.0,), False),
                 adaptive.Step("prune", (0.3,), False))
  assert adaptive.steps(defenses.parse("none")) == ()
  # A spec where a Defense goes, a Defense where a spec goes, a scale that is not positive.
  with pytest.raises(TypeError, match="defense"):
    adaptive.steps("prune:0.7")
  with pytest.raises(TypeError, match="defense_spec"):
    adaptive.adapt(presets.dlg(), defenses.parse("prune:0.7"))
  with pytest.raises(TypeError, match="spec string"):
    defenses.parse(defenses.Part("clip", (1.0,)))
  for scale in (0.0, -1.0, float("nan")):
    with pytest.raises(ValueError, match="update_scale"):
      adaptive.distance(distances.euclidean, defenses.parse("prune:0.7"), update_scale=scale)
  assert len(adaptive.assumptions(defenses.parse("prune:0.5,gaussian:1e-4"))) == 2


@pytest.mark.parametrize("spec", ["prune:0.5", "prune:0.5:global", "fp16", "bf16", "clip:0.5",
                                  "clip:1.0:global", "clip:0.5,prune:0.4"])
def test_the_true_gradient_explains_the_defended_update(spec):
  """The client's own gradient is consistent with what the defense made of it: adapted objective 0
  (to rounding), where the plain objective is not."""
  g = _tree(1)
  v = _defended(g, spec)
  plain = float(jax.jit(distances.euclidean)(g, v))  # jitted: eagerly each operation compiles alone
  assert plain > 1e-6
  assert float(jax.jit(_euclidean(spec))(g, v)) <= 1e-9 * plain


def _leaves(tree):
  return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("whole_tree", [False, True])
def test_pruned_entries_are_penalised_outside_the_smallest_kept_magnitude(whole_tree):
  g, u = _tree(2), _tree(3)
  spec = "prune:0.5" + (":global" if whole_tree else "")
  v = _defended(g, spec)
  vs = _leaves(v)
  bounds = [np.min(np.abs(x[x != 0])) for x in vs]
  if whole_tree:
    bounds = [min(bounds)] * len(vs)
  want = 0.0
  for a, b, t in zip(_leaves(u), vs, bounds):
    gap = np.where(b == 0, np.maximum(np.abs(a) - t, 0.0), a - b)
    want += np.sum(gap ** 2)
  np.testing.assert_allclose(float(_euclidean(spec)(u, v)), want, rtol=1e-5)


def test_int8_is_straight_through_and_fp16_cells_from_numpy():
  g, u = _tree(4), _tree(5, scale=1.01)
  v = _defended(g, "int8")
  np.testing.assert_allclose(float(_euclidean("int8")(u, v)), float(distances.euclidean(u, v)),
                             rtol=1e-6)
  v = _defended(g, "fp16")
  want = 0.0
  for a, b in zip(_leaves(u), _leaves(v)):
    h = b.astype(np.float16)
    lo = (b + np.nextafter(h, np.float16(-np.inf)).astype(np.float64)) / 2
    hi = (b + np.nextafter(h, np.float16(np.inf)).astype(np.float64)) / 2
    want += np.sum((a - np.clip(a, lo, hi)) ** 2)
  np.testing.assert_allclose(float(_euclidean("fp16")(u, v)), want, rtol=1e-4)


def test_clipping_is_applied_to_the_dummy():
  g, u = _tree(6, scale=3.0), _tree(7, scale=3.0)
  v = _defended(g, "clip:1.0")
  want = 0.0
  for a, b in zip(_leaves(u), _leaves(v)):
    want += np.sum((a * min(1.0, 1.0 / np.linalg.norm(a)) - b) ** 2)
  np.testing.assert_allclose(float(_euclidean("clip:1.0")(u, v)), want, rtol=1e-5)


def test_noise_weighs_each_leaf_by_its_signal_share():
  g, u = _tree(8), _tree(9)
  spec = "gaussian:0.5"
  v = _defended(g, spec, jax.random.key(0))
  want = 0.0
  for a, b in zip(_leaves(u), _leaves(v)):
    energy = np.sum(b ** 2)
    want += max(energy - b.size * 0.5, 0.0) / energy * np.sum((a - b) ** 2)
  np.testing.assert_allclose(float(_euclidean(spec)(u, v)), want, rtol=1e-5)
  # Noise hides pruning's zeros: pruning before it is not modelled, clipping still is.
  assert adaptive.steps(defenses.parse("prune:0.5,gaussian:0.5"))[0].head == "prune"
  both = _euclidean("clip:1.0,prune:0.5,gaussian:0.5")
  clipped_only = _euclidean("clip:1.0,gaussian:0.5")
  np.testing.assert_allclose(float(both(u, v)), float(clipped_only(u, v)), rtol=1e-6)
  want = 0.0  # the dummy clipped to norm 1 (as the client's leaves were), weighed as above
  for a, b in zip(_leaves(u), _leaves(v)):
    energy = np.sum(b ** 2)
    want += (max(energy - b.size * 0.5, 0.0) / energy
             * np.sum((a * min(1.0, 1.0 / np.linalg.norm(a)) - b) ** 2))
  np.testing.assert_allclose(float(both(u, v)), want, rtol=1e-5)


def test_noise_before_clipping_is_not_weighed_and_no_weights_never_zero_the_objective():
  """Noise the client clipped after adding it: the clipping rescales it by a factor the update does
  not tell, so the leaves are not weighed (the declared variance against the clipped update's energy
  gave every leaf a share of 0, an objective of 0 for every dummy); the dummy is still clipped.
  A variance larger than every leaf's energy: the leaves that hold energy weigh 1."""
  g, u = _tree(8), _tree(9)
  v = _defended(g, "gaussian:0.5,clip:0.1:global", jax.random.key(0))
  assert [r for _, r in adaptive.roles(defenses.parse("gaussian:0.5,clip:0.1:global"))] == [
      "unweighed", "clip"]
  got = float(_euclidean("gaussian:0.5,clip:0.1:global")(u, v))
  norm = np.sqrt(sum(np.sum(a ** 2) for a in _leaves(u)))
  want = sum(np.sum((a * min(1.0, 0.1 / norm) - b) ** 2) for a, b in zip(_leaves(u), _leaves(v)))
  assert got > 0 and got == pytest.approx(want, rel=1e-5)
  drowned = _euclidean("gaussian:1e6")
  want = sum(np.sum((a - b) ** 2) for a, b in zip(_leaves(u), _leaves(g)))
  assert float(drowned(u, g)) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("spec", ["prune:0.5", "fp16", "clip:0.8", "dp:0.8:0.1"])
def test_gradient_against_float64_finite_differences(spec):
  g, u = _tree(10), _tree(11)
  v = _defended(g, spec, jax.random.key(1))
  with jax.enable_x64(True):
    # jitted: eagerly each operation compiles alone
    fn = jax.jit(adaptive.distance(distances.DISTANCES["euclidean"], defenses.parse(spec)))
    u64, v64 = (jax.tree.map(lambda x: np.asarray(x, np.float64), t) for t in (u, v))
    grad = jax.jit(jax.grad(fn))(u64, v64)
    leaf = ("dense", "kernel")
    direction = np.random.default_rng(0).normal(size=u[leaf[0]][leaf[1]].shape)
    h = 1e-6

    def at(s):
      moved = jax.tree.map(lambda x: x, u64)
      moved[leaf[0]] = {**moved[leaf[0]], leaf[1]: u64[leaf[0]][leaf[1]] + s * direction}
      return float(fn(moved, v64))

    numeric = (at(h) - at(-h)) / (2 * h)
    analytic = float(np.sum(np.asarray(grad[leaf[0]][leaf[1]]) * direction))
  np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-9)


def test_identity_is_the_base_distance_and_cosine_bases_work():
  g, u = _tree(12), _tree(13)
  for name in ("euclidean", "cosine"):
    base = distances.DISTANCES[name]
    np.testing.assert_allclose(float(adaptive.distance(base, defenses.parse("none"))(u, g)),
                               float(base(u, g)), rtol=1e-6)
  v = _defended(g, "prune:0.3")
  assert float(adaptive.distance(distances.DISTANCES["cosine"], defenses.parse("prune:0.3"))(g, v)) \
      < 1e-6


def test_one_adapted_attack_per_preset_and_defense_and_the_configuration_needs_a_defense():
  attack = adaptive.adapt(presets.dlg(), "prune:0.2")
  assert attack.name == "dlg+adaptive" and attack.optimizer == presets.dlg().optimizer
  assert adaptive.adapt(presets.dlg(), "prune:0.2") is attack  # compiled once for every observation
  assert attack.distance.fn.__name__ == "euclidean|prune:0.2"
  cfg = config.from_options({"attack.preset": "dlg", "attack.adaptive": True})
  with pytest.raises(ValueError, match="--config.attack.adaptive=True adapts the attack"):
    config.check(cfg)
  config.check(config.replace(cfg, {"defense.spec": "prune:0.2"}))


def test_a_defense_on_the_update_is_modelled_at_the_update_s_scale():
  """A one-step FedAvg update U = lr·g, clipped and rounded to fp16 as an update, is matched as the
  gradient U / lr: with update_scale = lr the client's true gradient still has objective 0."""
  lr, g = 0.05, _tree(14, scale=30.0)
  update = jax.tree.map(lambda x: lr * x, g)
  for spec in ("clip:0.5", "fp16", "clip:0.5,prune:0.5"):
    v = jax.tree.map(lambda x: np.asarray(x) / lr, _defended(update, spec))
    fn = adaptive.distance(distances.DISTANCES["euclidean"], defenses.parse(spec), update_scale=lr)
    plain = float(distances.euclidean(g, v))
    assert float(fn(g, v)) <= 1e-6 * plain, spec  # float32 rounding of lr·(U / lr) at the cells' edges
  # DLM learns the update's scale: clipping and rounding cells are not modelled there.
  assert [r for _, r in adaptive.roles(defenses.parse("clip:1.0,fp16"), "dlm")] == ["unscaled"] * 2
  assert [r for _, r in adaptive.roles(defenses.parse("clip:1.0,prune:0.5"), "dlm_plus")] == \
      ["unscaled", "bound"]


@pytest.mark.slow
def test_an_attack_adapted_to_dp_sgd_matches_clipped_examples_and_weighs_its_noise(photos):
  """--config.defense.dp_sgd_max_norm with --config.attack.adaptive=True: the attack's objective is
  the mean of its examples' clipped gradients (objective 'clipped_gradient') and its distance weighs
  the leaves by their signal share under the noise's variance (σC/N)² (the gaussian part), both
  listed as assumptions; the run reports the client's (ε, δ) as gradjax.privacy gives it."""
  from gradjax import privacy
  from gradjax.run import pipeline
  cfg = config.from_options({
      "attack.preset": "dlg", "attack.iterations": 2, "attack.adaptive": True, "data.batch_size": 2,
      "defense.dp_sgd_max_norm": 0.5, "defense.dp_sgd_noise_multiplier": 0.8,
      "defense.dp_sgd_sampling_rate": 0.02, "defense.dp_sgd_steps": 500})
  results, _ = pipeline.run(cfg)
  assert results["attack"]["objective"] == "clipped_gradient"
  assert results["attack"]["distance"] == f"euclidean|gaussian:{(0.8 * 0.5 / 2) ** 2:.8g}"
  assert len(results["adaptation"]) == 2 and results["adaptation"][0].startswith("dp_sgd: the bound C = 0.5")
  assert results["adaptation"][0].endswith("(its noise: the gaussian part)")  # the variance's part
  budget = privacy.epsilon(0.02, 0.8, 500, 1e-5)
  assert results["privacy"] == {"max_norm": 0.5, "noise_multiplier": 0.8, "sampling_rate": 0.02,
                                "steps": 500, "delta": 1e-5, "epsilon": budget.epsilon,
                                "order": budget.order}
  plain, _ = pipeline.run(config.replace(cfg, {"attack.adaptive": False,
                                               "defense.dp_sgd_noise_multiplier": 0.0}))
  assert plain["attack"]["objective"] == "gradient" and plain["adaptation"] is None
  assert plain["privacy"]["epsilon"] is None


@pytest.mark.slow
def test_an_attack_adapted_to_a_dp_sgd_fedavg_client_replays_clipped_steps():
  """A FedAvg client whose local steps are DP-SGD's: the adapted replay clips its examples in every
  replayed step, and weighs the layers by the noise variance the steps leave in the update
  (gradjax.run.pipeline.dp_sgd_variance, checked against the client's noise in test_clients)."""
  from gradjax import clients
  from gradjax.run import pipeline
  cfg = config.from_options({
      "attack.preset": "inverting_gradients_fedavg", "attack.iterations": 2, "attack.adaptive": True,
      "client.name": "fedavg", "client.local_batch_size": 1, "client.local_lr": 0.1,
      "data.batch_size": 2, "model.name": "convnet-8", "output.lpips": "none",
      "defense.dp_sgd_max_norm": 1.0, "defense.dp_sgd_noise_multiplier": 0.5})
  results, _ = pipeline.run(cfg)
  assert results["attack"]["objective"] == "replay"
  local = clients.LocalTraining(1, 1, 0.1, 0.0)
  variance = (0.1 * 0.5 * 1.0 / 1) ** 2 * local.steps(2)
  assert results["attack"]["distance"] == f"cosine|gaussian:{variance:.8g}"
  assert "in every replayed step" in results["adaptation"][0]


@pytest.mark.slow
def test_auto_adapted_to_dp_sgd_runs_dlm_plus_as_it_is():
  """--attack=auto with --config.attack.adaptive=True against a DP-SGD FedAvg client of two local
  steps: the replay is adapted to the clipping; DLM+, which cannot model it, runs unadapted beside
  it (it stopped the run with an error)."""
  from gradjax.run import pipeline
  cfg = config.from_options({
      "attack.preset": "auto", "attack.iterations": 2, "attack.adaptive": True,
      "client.name": "fedavg", "client.local_batch_size": 1, "client.local_lr": 0.1,
      "data.batch_size": 2, "output.lpips": "none", "defense.dp_sgd_max_norm": 1.0})
  results, _ = pipeline.run(cfg)
  tried = {t["attack"]: t for t in results["auto"]["tried"]}
  assert list(tried) == ["inverting_gradients_fedavg", "dlm_plus"]
  assert tried["dlm_plus"]["settings"] == {"attack.adaptive": False}
  assert tried["inverting_gradients_fedavg"]["settings"] == {}


@pytest.mark.slow
def test_an_attack_adapted_to_poisson_sampled_dp_sgd():
  """--config.defense.dp_sgd_poisson: a FedSGD client's step draws its examples at q (seed 3 draws
  one of two, image 1); the run is scored against the one drawn, the adapted objective divides the
  dummy's clipped sum by qN = 1 and the noise's variance is (σC/qN)². A draw of none (seed 0) is
  refused. A FedAvg client (local batches of 1, so q = 1/2 and qn = 1): the replay is the steps'
  expectation, its noise (ησC/qn)² over the 2 steps."""
  from gradjax import clients
  from gradjax.run import pipeline
  options = {"attack.preset": "dlg", "attack.iterations": 2, "attack.adaptive": True,
             "data.batch_size": 2, "seed": 3, "defense.dp_sgd_max_norm": 0.5,
             "defense.dp_sgd_noise_multiplier": 0.8, "defense.dp_sgd_sampling_rate": 0.5,
             "defense.dp_sgd_poisson": True, "output.lpips": "none"}
  key = pipeline.experiment_keys(3, 0).client
  draws = clients.drawn(clients.DPSGD(0.5, 0.8, 0.5), key, 2)[0]
  assert draws.tolist() == [False, True]
  results, images = pipeline.run(config.from_options(options))
  assert results["attack"]["objective"] == "clipped_gradient"
  assert results["attack"]["distance"] == f"euclidean|gaussian:{(0.8 * 0.5 / 1.0) ** 2:.8g}"
  assert any(line.startswith("poisson:") and "qn = 1" in line for line in results["adaptation"])
  batch = pipeline.load_batch(config.from_options(options))
  np.testing.assert_array_equal(images["ground_truth"], batch.x[1:2])
  with pytest.raises(ValueError, match="holds none"):
    pipeline.run(config.from_options({**options, "seed": 0}))
  fedavg, _ = pipeline.run(config.from_options({
      **options, "attack.preset": "inverting_gradients_fedavg", "client.name": "fedavg",
      "client.local_batch_size": 1, "client.local_lr": 0.1, "model.name": "convnet-8"}))
  assert fedavg["attack"]["objective"] == "replay"
  assert fedavg["attack"]["distance"] == f"cosine|gaussian:{(0.1 * 0.8 * 0.5 / 1.0) ** 2 * 2:.8g}"
  assert any("q = 0.5" in line for line in fedavg["adaptation"])


@pytest.mark.slow
def test_an_attack_adapted_to_a_poisson_sampled_capture(photos, tmp_path):
  """A capture whose metadata declare Opacus' Poisson sampling (dp_sgd_poisson, its rate, and for
  FedSGD dp_sgd_expected_batch_size E with num_samples the count drawn): the adapted objective
  divides the dummy's clipped sum by E and is 0 at the examples the step drew (read back from the
  file), the noise's variance is (σC/E)²; without E the run is refused in one line. A FedAvg
  capture: the expected replay at q, each step divided by the declared E (q·n without one); one
  local step read as a gradient: the clipped mean over all the dummies (its expectation), and a
  declared E other than q·n sent to the replay in one line."""
  from gradjax import clients, interop, models, objectives
  from gradjax.run import pipeline
  model = models.create("lenet_zhu", jax.random.key(3), num_classes=10, input_shape=(32, 32, 3),
                        conv="xla")
  mapping = interop.zoo_mapping(model)
  x, y = photos[:4], np.array([0, 1, 2, 3])
  dp, key = clients.DPSGD(0.5, 0.8, 0.5), jax.random.key(0)
  draws = clients.drawn(dp, key, 4)[0]
  assert draws.sum() == 3  # E = q·4 = 2 is not the count drawn
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, dp_sgd=dp, key=key)
  clean = clients.fedsgd(model.apply_fn, model.variables, x, y, dp_sgd=dp._replace(noise_multiplier=0.0),
                         key=key)  # the same draws, no noise
  interop.save_weights(tmp_path / "w.safetensors", model, mapping)
  meta = {**interop.observation_metadata(obs.replace(num_samples=int(draws.sum())), model),
          "dp_sgd_max_norm": 0.5, "dp_sgd_noise_multiplier": 0.8, "dp_sgd_sampling_rate": 0.5,
          "dp_sgd_poisson": True}
  gradient = interop.params_to_torch(obs.gradient, mapping)
  interop.write(tmp_path / "bare.safetensors", gradient, meta)
  interop.write(tmp_path / "g.safetensors", gradient, {**meta, "dp_sgd_expected_batch_size": 2})
  interop.write(tmp_path / "clean.safetensors", interop.params_to_torch(clean.gradient, mapping),
                {**meta, "dp_sgd_noise_multiplier": 0.0, "dp_sgd_expected_batch_size": 2})
  options = {"model.weights": str(tmp_path / "w.safetensors"), "attack.preset": "dlg",
             "attack.iterations": 2, "attack.adaptive": True, "output.lpips": "none"}
  results, _ = pipeline.run(config.from_options(
      {**options, "client.observation": str(tmp_path / "g.safetensors")}))
  assert results["attack"]["objective"] == "clipped_gradient"
  assert results["attack"]["distance"] == f"euclidean|gaussian:{(0.8 * 0.5 / 2) ** 2:.8g}"
  assert any(line.startswith("poisson:") and "qn = 2" in line for line in results["adaptation"])
  read = interop.load(tmp_path / "w.safetensors", tmp_path / "clean.safetensors").observation
  assert read.num_samples == draws.sum()
  matched = objectives.gradient_matching(model.apply_fn, distances.euclidean,
                                         matched=objectives.ClippedGradient(0.5, 2.0))
  fixed = objectives.gradient_matching(model.apply_fn, distances.euclidean,
                                       matched=objectives.ClippedGradient(0.5))
  truth, labels = {"x": jnp.asarray(x[draws])}, jnp.asarray(y[draws])
  assert float(matched(truth, read, labels)) < 1e-10 < 1e-6 < float(fixed(truth, read, labels))
  with pytest.raises(ValueError, match="declare dp_sgd_expected_batch_size"):
    pipeline.run(config.from_options({**options, "client.observation": str(tmp_path / "bare.safetensors")}))

  local = clients.LocalTraining(1, 2, 0.1, 0.0)
  update = clients.fedavg(model.apply_fn, model.variables, x, y, local, dp_sgd=dp, key=key)
  meta = {**interop.observation_metadata(update, model), "dp_sgd_max_norm": 0.5,
          "dp_sgd_sampling_rate": 0.5, "dp_sgd_poisson": True, "labels": [0, 1, 2, 3]}
  interop.write(tmp_path / "u.safetensors", interop.params_to_torch(update.gradient, mapping), meta)
  interop.write(tmp_path / "u3.safetensors", interop.params_to_torch(update.gradient, mapping),
                {**meta, "dp_sgd_expected_batch_size": 3})
  fedavg = {**options, "attack.preset": "inverting_gradients_fedavg"}
  results, _ = pipeline.run(config.from_options({**fedavg, "client.observation": str(tmp_path / "u.safetensors")}))
  assert results["attack"]["objective"] == "replay"
  assert any("q = 0.5" in line and line.endswith("the clipped mean over all the dummy examples")
             for line in results["adaptation"])
  results, _ = pipeline.run(config.from_options({**fedavg, "client.observation": str(tmp_path / "u3.safetensors")}))
  assert any(line.endswith("divided by E = 3") for line in results["adaptation"])
  plain, _ = pipeline.run(config.from_options({**fedavg, "attack.adaptive": False,
                                               "client.observation": str(tmp_path / "u3.safetensors")}))
  assert plain["residual"]["relative_error"] > 0  # not refused: its replay divides by E too

  one = clients.fedavg(model.apply_fn, model.variables, x, y, clients.LocalTraining(1, None, 0.1, 0.0),
                       dp_sgd=dp, key=key)
  meta = {**interop.observation_metadata(one, model), "dp_sgd_max_norm": 0.5,
          "dp_sgd_sampling_rate": 0.5, "dp_sgd_poisson": True, "labels": [0, 1, 2, 3]}
  for name, extra in (("one.safetensors", {}), ("one3.safetensors", {"dp_sgd_expected_batch_size": 3})):
    interop.write(tmp_path / name, interop.params_to_torch(one.gradient, mapping), {**meta, **extra})
  results, _ = pipeline.run(config.from_options({**options, "client.observation": str(tmp_path / "one.safetensors")}))
  assert results["attack"]["objective"] == "clipped_gradient"
  assert not any(line.startswith("poisson:") for line in results["adaptation"])  # the mean over all n
  with pytest.raises(ValueError, match="attack it with a replay"):
    pipeline.run(config.from_options({**options, "client.observation": str(tmp_path / "one3.safetensors")}))
