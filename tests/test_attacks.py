"""DLG and iDLG end to end on real images, and the attack's input checks."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.metrics

from gradjax import (attacks, clients, data, distances, driver, dummy, labels, models, objectives,
                     optimizers, presets, priors)


def setup(index, image_size=16, channels=3, model="lenet_zhu", seed=0):
  batch = data.load("skimage", indices=[index], image_size=(image_size, image_size), channels=channels)
  net = models.create(model, jax.random.key(seed + index), input_shape=batch.x.shape[1:])
  obs = clients.fedsgd(net.apply_fn, net.variables, batch.x, batch.y)
  return batch, net, obs


@pytest.mark.parametrize("name", ["dlg", "idlg"])
@pytest.mark.slow
def test_reconstructs_real_photos(name):
  attack = presets.get_preset(name)(iterations=500)
  for index in (0, 3, 7):
    batch, net, obs = setup(index)
    rec = attacks.reconstruct(attack, net.apply_fn, obs, jax.random.key(100 + index),
                              input_shape=batch.x.shape[1:])
    x = np.clip(rec.x, 0, 1).astype(np.float64)
    psnr = skimage.metrics.peak_signal_noise_ratio(batch.x[0].astype(np.float64), x[0], data_range=1)
    assert psnr > 30, (name, index, psnr)
    np.testing.assert_array_equal(rec.labels, batch.y)
    assert rec.loss < 1e-3


@pytest.mark.slow
def test_restarts_pick_the_lowest_objective():
  batch, net, obs = setup(1)
  rec = attacks.reconstruct(presets.dlg(iterations=30), net.apply_fn, obs,
                            jax.random.key(0), input_shape=batch.x.shape[1:], restarts=3,
                            execution=driver.Execution("vmap"))
  assert rec.restart_losses.shape == (3,) and rec.x_restarts.shape == (3, 1, 16, 16, 3)
  assert rec.best_restart == int(np.argmin(rec.restart_losses))
  np.testing.assert_array_equal(rec.x, rec.x_restarts[rec.best_restart])
  assert len(set(np.round(rec.restart_losses, 8))) == 3  # independent initialisations
  assert np.all(rec.iterations == 30)


@pytest.mark.slow
def test_group_consistency_draws_the_restarts_together():
  """The group prior couples the restarts (one vmapped program, under the "auto" strategy too): from
  the same starts, the restarts end closer to their mean than without it; it refuses what cannot
  compare restarts."""
  batch, net, _ = setup(4)
  obs = clients.fedsgd(net.apply_fn, net.variables, batch.x, batch.y, share_labels=True)
  base = presets.inverting_gradients(iterations=20)
  grouped = dataclasses.replace(base, priors=base.priors + (priors.Prior(priors.PRIORS["group"], 0.05),))
  assert grouped.couples_restarts and not base.couples_restarts
  # With L-BFGS its runs keep one pace: no loop in which each searches on its own (Solver.advance).
  num_leaves = len(jax.tree.leaves(obs.gradient))
  for attack, own_pace in ((presets.dlg(iterations=20), True),
                           (dataclasses.replace(presets.dlg(iterations=20), priors=grouped.priors), False)):
    assert (attacks._solver(attack, net.apply_fn, num_leaves).advance is not None) == own_pace
  kw = dict(input_shape=batch.x.shape[1:], restarts=4)

  def spread(attack, execution):
    x = attacks.reconstruct(attack, net.apply_fn, obs, jax.random.key(5), execution=execution,
                            **kw).x_restarts
    return float(np.mean((x - x.mean(axis=0)) ** 2))

  assert spread(grouped, driver.Execution()) < 0.2 * spread(base, driver.Execution("vmap"))
  with pytest.raises(ValueError, match="several restarts"):
    attacks.reconstruct(grouped, net.apply_fn, obs, jax.random.key(5), input_shape=batch.x.shape[1:])
  with pytest.raises(ValueError, match="strategy 'vmap'"):
    attacks.reconstruct(grouped, net.apply_fn, obs, jax.random.key(5),
                        execution=driver.Execution("sequential"), **kw)


def test_known_labels_and_errors():
  batch, net, obs = setup(2)
  with pytest.raises(ValueError, match="carries none"):
    attacks.reconstruct(dataclasses.replace(presets.dlg(), label_source=labels.known), net.apply_fn, obs,
                        jax.random.key(0), input_shape=(16, 16, 3))
  two = data.load("skimage", indices=[0, 1], image_size=(16, 16))
  obs2 = clients.fedsgd(net.apply_fn, net.variables, two.x, two.y)
  with pytest.raises(ValueError, match="batch 1"):
    attacks.reconstruct(presets.idlg(), net.apply_fn, obs2, jax.random.key(0),
                        input_shape=(16, 16, 3))
  bad = obs.replace(gradient=jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), obs.gradient))
  with pytest.raises(ValueError, match="NaN"):
    attacks.reconstruct(presets.dlg(), net.apply_fn, bad, jax.random.key(0),
                        input_shape=(16, 16, 3))
  # A declared batch beyond the machine's memory (a capture's num_samples off by orders): refused
  # before anything is allocated, with the bytes it would need (10¹⁰ × 16·16·3 float32 = 28610.2 GiB).
  with pytest.raises(ValueError, match=re.escape("alone needs 28610.2 GiB")):
    attacks.reconstruct(presets.dlg(), net.apply_fn, obs.replace(num_samples=10**10), jax.random.key(0),
                        input_shape=(16, 16, 3))
  other = models.create("mlp", jax.random.key(0), input_shape=(16, 16, 3))
  mixed = obs.replace(variables=other.variables)
  with pytest.raises(ValueError, match="does not match"):
    attacks.reconstruct(presets.dlg(), net.apply_fn, mixed, jax.random.key(0),
                        input_shape=(16, 16, 3))
  # Labels the target would turn into a row of zeros (or a wrong count of rows), given with the
  # observation or made by the attack's label source, are refused before any work.
  known = dataclasses.replace(presets.dlg(), label_source=labels.known)
  for given, message in ((jnp.array([10]), r"must lie in \[0, 10\)"), (jnp.array([-1]), r"got \[-1, -1\]"),
                         (jnp.array([1.0]), "must be int"), (jnp.array([1, 2]), r"must be int \(1,\)")):
    with pytest.raises(ValueError, match=message):
      attacks.prepare(known, net.apply_fn, obs.replace(labels=given), jax.random.key(0),
                      input_shape=(16, 16, 3))
    with pytest.raises(ValueError, match="the attack's labels .*" + message):
      attacks.prepare(dataclasses.replace(known, label_source=lambda o, given=given: given),
                      net.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3))
  # A FedAvg update is no gradient (one step is, scaled: clients.update_as_gradient).
  steps = clients.fedavg(net.apply_fn, net.variables, two.x, two.y,
                         clients.LocalTraining(batch_size=1, learning_rate=0.1))
  with pytest.raises(ValueError, match="the gradient objective reads a FedSGD gradient"):
    attacks.prepare(presets.inverting_gradients(5), net.apply_fn, steps, jax.random.key(0),
                    input_shape=(16, 16, 3))
  for shape in ((3, 16, 16), (64, 64, 3)):  # the model reads neither
    with pytest.raises(ValueError, match="does not fit the model"):
      attacks.prepare(presets.dlg(), net.apply_fn, obs, jax.random.key(0), input_shape=shape)
  with pytest.raises(ValueError, match="one example, without the batch axis"):  # (Flax would read it)
    attacks.prepare(presets.dlg(), net.apply_fn, obs, jax.random.key(0), input_shape=(2, 16, 16, 3))
  with pytest.raises(ValueError, match=r"bounds must be \(lo, hi\), scalars or one per channel \(3\)"):
    attacks.prepare(presets.dlg(), net.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3),
                    bounds=((0.0, 0.0), (1.0, 1.0)))
  with pytest.raises(ValueError, match="restarts must be a positive integer"):
    attacks.prepare(presets.dlg(), net.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3),
                    restarts=1.5)
  with pytest.raises(ValueError, match="unknown attack"):
    presets.get_preset("deepleak")
  with pytest.raises(ValueError, match="unknown distance"):
    distances.get_distance("manhattan")
  with pytest.raises(ValueError, match="a distance is a function"):  # names resolve at the boundary only
    dataclasses.replace(presets.dlg(), distance="manhattan")


@pytest.mark.slow
def test_any_apply_fn_plugs_in():
  """A hand-written softmax regression (no Flax, no 'head') plugs into the attack, and the loss it
  reports is the gradient distance at the returned x, recomputed in NumPy from the closed form."""
  batch = data.load("lfw_subset", indices=[5])  # a 25x25 face

  def apply_fn(variables, x, train=False):
    del train
    p = variables["params"]
    return x.reshape(x.shape[0], -1) @ p["w"] + p["b"]

  rng = np.random.default_rng(3)
  variables = {"params": {"w": rng.uniform(-0.05, 0.05, (625, 3)).astype(np.float32),
                          "b": rng.uniform(-0.5, 0.5, 3).astype(np.float32)}}
  obs = clients.fedsgd(apply_fn, variables, batch.x, np.array([2]), share_labels=True)
  attack = dataclasses.replace(presets.dlg(iterations=100), label_source=labels.known)
  rec = attacks.reconstruct(attack, apply_fn, obs, jax.random.key(0), input_shape=batch.x.shape[1:])
  assert rec.labels.tolist() == [2]

  def numpy_gradient(x):
    w, b = (np.asarray(variables["params"][k], np.float64) for k in ("w", "b"))
    z = x.reshape(1, -1) @ w + b
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    r = p - np.eye(3)[[2]]
    return x.reshape(-1, 1) @ r, r[0]

  gw, gb = numpy_gradient(batch.x.astype(np.float64))
  gw2, gb2 = numpy_gradient(rec.x.astype(np.float64))
  expected = np.sum((gw2 - gw) ** 2) + np.sum((gb2 - gb) ** 2)
  np.testing.assert_allclose(rec.loss, expected, rtol=1e-3, atol=1e-9)
  assert rec.loss < 1e-6  # the problem is well posed with the label known


def test_inverting_gradients_reports_its_objective_at_the_returned_x():
  """Inverting Gradients' reported loss (1 − cosine over all layers + TV, at the best iterate,
  after the box projection and the learning-rate steps) is its objective at the returned x,
  recomputed in NumPy from the softmax regression's closed-form gradient and the TV formula."""
  batch = data.load("lfw_subset", indices=[5])
  rng = np.random.default_rng(4)
  w = rng.uniform(-0.05, 0.05, (625, 3)).astype(np.float32)
  b = rng.uniform(-0.5, 0.5, 3).astype(np.float32)

  def apply_fn(variables, x, train=False):
    del train
    return x.reshape(x.shape[0], -1) @ variables["params"]["w"] + variables["params"]["b"]

  variables = {"params": {"w": w, "b": b}}
  obs = clients.fedsgd(apply_fn, variables, batch.x, np.array([1]), share_labels=True)
  attack = presets.inverting_gradients(iterations=40, tv=0.05)
  rec = attacks.reconstruct(attack, apply_fn, obs, jax.random.key(1), input_shape=batch.x.shape[1:],
                            bounds=(np.zeros(1), np.ones(1)))

  def numpy_gradient(x):
    z = x.reshape(1, -1) @ w.astype(np.float64) + b
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    r = p - np.eye(3)[[1]]
    return np.concatenate([(x.reshape(-1, 1) @ r).ravel(), r[0]])

  x = rec.x.astype(np.float64)
  assert x.min() >= 0 and x.max() <= 1  # the box
  g, g_obs = numpy_gradient(x), numpy_gradient(batch.x.astype(np.float64))
  cosine = 1 - g @ g_obs / (np.linalg.norm(g) * np.linalg.norm(g_obs))
  tv = np.abs(np.diff(x, axis=2)).mean() + np.abs(np.diff(x, axis=1)).mean()
  np.testing.assert_allclose(rec.loss, cosine + 0.05 * tv, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_dummy_initialisations():
  key = jax.random.key(0)
  shape = (2, 10, 9, 3)
  lo, hi = np.array([-1.0, -2.0, 0.0]), np.array([1.0, 0.0, 4.0])
  x = dummy.init_dummy(key, dummy.uniform, shape, None, (lo, hi))["x"]
  assert x.shape == shape and np.all(x >= lo) and np.all(x <= hi)
  c = dummy.init_dummy(key, dummy.constant, shape, None, (lo, hi))["x"]
  np.testing.assert_allclose(c, np.broadcast_to((lo + hi) / 2, shape))
  p = np.asarray(dummy.init_dummy(key, dummy.pattern, shape, 5)["x"])
  size = dummy.PATTERN_SIZE
  np.testing.assert_array_equal(p[:, size:2 * size], p[:, :size])      # repeats down
  np.testing.assert_array_equal(p[:, :, size:2 * size], p[:, :, :size])  # and across
  assert not np.allclose(p[0], p[1])                                     # one tile per example
  d = dummy.init_dummy(key, dummy.normal, shape, 5)
  assert d["label_logits"].shape == (2, 5)
  with pytest.raises(ValueError, match="dummy init"):
    dummy.get_init("zeros")
  with pytest.raises(ValueError, match="images"):  # the pattern tiles images only
    dummy.init_dummy(key, dummy.pattern, (2, 10, 3), None)
  with pytest.raises(ValueError, match="dummy_init must be a function"):
    attacks.Attack(dummy_init="zeros")


@pytest.mark.slow
def test_one_sample_per_step_moves_only_that_sample():
  from gradjax import objectives
  two = data.load("skimage", indices=[0, 1], image_size=(16, 16))
  # conv="xla": the masking does not depend on the convolution, and XLA's compiles fastest on CPU.
  net = models.create("lenet_zhu", jax.random.key(0), input_shape=(16, 16, 3), conv="xla")
  obs = clients.fedsgd(net.apply_fn, net.variables, two.x, two.y)
  # With a prior (TV): it moves only that sample too.
  tv = lambda x, step, network: 0.1 * priors.total_variation(x)  # noqa: E731
  full = objectives.gradient_matching(net.apply_fn, distances.euclidean, prior=tv)
  masked = objectives.gradient_matching(net.apply_fn, distances.euclidean, prior=tv,
                                        one_sample_per_step=True)
  start = dummy.init_dummy(jax.random.key(1), dummy.normal, (2, 16, 16, 3), 10)
  g_full = jax.jit(jax.grad(full))(start, obs)
  value_and_grad = jax.jit(jax.value_and_grad(masked))  # the step traced, as the solver passes it
  for step in (0, 1, 2, 3):
    value, g = value_and_grad(start, obs, None, jnp.asarray(step))
    np.testing.assert_allclose(value, jax.jit(full)(start, obs), rtol=1e-6)
    i, other = step % 2, 1 - step % 2
    np.testing.assert_allclose(g["x"][i], g_full["x"][i], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(g["label_logits"][i], g_full["label_logits"][i], rtol=1e-5, atol=1e-8)
    assert not np.any(g["x"][other]) and not np.any(g["label_logits"][other])


@pytest.mark.slow
def test_box_keeps_reconstruction_in_range():
  batch, net, obs = setup(2)
  attack = dataclasses.replace(presets.dlg(iterations=50), box=True, optimizer=optimizers.Named("adam", 0.1))
  rec = attacks.reconstruct(attack, net.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3),
                            bounds=(0.2, 0.7))
  assert rec.x.min() >= 0.2 and rec.x.max() <= 0.7
  with pytest.raises(ValueError, match="lo < hi"):
    attacks.reconstruct(attack, net.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3),
                        bounds=(1.0, 0.0))


@pytest.mark.parametrize("label_method", ["known", "llg"])
@pytest.mark.slow
def test_batch_of_two_with_known_or_inferred_labels(label_method):
  """A batch-averaged gradient of two photos: both come back (after order matching) with their labels."""
  from gradjax.run import config, pipeline
  results, images = pipeline.run(
      config.from_options({
          "attack.preset": "dlg", "attack.label_source": label_method, "data.image_size": 16,
          "data.index": 4, "data.batch_size": 2, "attack.iterations": 1000
      }))
  psnr = [skimage.metrics.peak_signal_noise_ratio(g.astype(np.float64), r, data_range=1)
          for g, r in zip(images["ground_truth"], images["reconstruction"])]
  assert min(psnr) > 30, psnr
  assert sorted(results["labels_reconstructed"]) == sorted(results["labels_true"])


def test_describe_names_the_parts():
  """describe() gives a results file's JSON record: registered parts by their registry names, one's
  own parts by their function names."""
  import json

  import optax

  from gradjax import objectives, priors
  ig = attacks.describe(presets.inverting_gradients(iterations=100))
  assert json.loads(json.dumps(ig)) == ig
  assert ig == dict(
      name="inverting_gradients", objective="gradient", distance="cosine", depth_rule=None,
      priors=[["tv", 1e-4, 0]], label_source="known",
      optimizer=dict(name="signed_adam", learning_rate=0.1, schedule="step", warmup=0, weight_decay=0.01,
                     history=100, max_linesearch_steps=20),
      iterations=100, box=True, one_sample_per_step=False, dummy_init="normal", tol=0.0, remat=False,
      stepwise=None, track_from=0, gamma=dataclasses.asdict(objectives.Gamma()), head_features=0.0,
      smoothing=None)
  hf = attacks.describe(presets.hfginv(3000))
  assert hf["priors"] == [["tv", 1e-2, 600], ["bn_hfginv", 1e-4, 1000]] and hf["track_from"] == 0
  assert hf["stepwise"] == dataclasses.asdict(objectives.Stepwise(period=100))

  def my_distance(dummy_grads, observed_grads):
    return distances.euclidean(dummy_grads, observed_grads)

  own = attacks.Attack(distance=my_distance, optimizer=optax.adam(0.1), label_source=labels.llg,
                       dummy_init=dummy.uniform, priors=(priors.Prior(priors.l2_norm, 1e-6, 5),))
  d = attacks.describe(own)
  assert (d["name"], d["distance"], d["label_source"]) == ("custom", "my_distance", "llg")
  assert d["dummy_init"] == "uniform"
  assert d["priors"] == [["l2", 1e-6, 5]] and set(d["optimizer"]) == {"name"}


@pytest.mark.parametrize("y, cost", [([5, 2, 5, 9], 4 ** 4 * 10 - 1), ([5, 2, 7, 9], None)])
def test_head_targets_are_the_class_rows_without_the_solve(photos, monkeypatch, y, cost):
  """Where N⁴·K exceeds MAX_SOLVE_COST, or every example is alone in its class, the targets are
  the class rows, without the per-example solve; in the second case they are each photo's own head
  input (to float32 rounding)."""
  from gradjax import analytic
  model = models.create("lenet_zhu", jax.random.key(9), num_classes=10)
  y = np.array(y)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:4], y, share_labels=True)
  if cost is not None:
    monkeypatch.setattr(attacks, "MAX_SOLVE_COST", cost)
  monkeypatch.setattr(analytic, "head_inputs_per_example", lambda *a, **k: pytest.fail("solved"))
  t, w = attacks.head_targets(obs, y, jnp.float32, jax.random.key(0))
  p, g = model.variables["params"]["head"], obs.gradient["head"]
  found = analytic.head_inputs(p["kernel"], p["bias"], g["kernel"], g["bias"], y)
  rows = [list(found.classes).index(c) for c in y]
  np.testing.assert_allclose(t, found.features[rows], rtol=1e-6)
  np.testing.assert_array_equal(w, found.usable[rows].astype(np.float32))
  if cost is None:
    truth = np.asarray(objectives.head_input(model.apply_fn, model.variables, photos[:4]))
    assert np.all(np.asarray(w) == 1.0)
    np.testing.assert_allclose(t, truth, atol=1e-5 * np.abs(truth).max())


@pytest.mark.slow  # compiles the per-example solver
def test_head_targets_follow_the_labels(photos):
  """Each slot's target is its own example's head input where the update pins it down, the two
  photos of class 5 included (matched within the class, as the gradient does not order them), with
  weight 1 there; the attack refuses head features with joint labels or another objective."""
  from scipy.optimize import linear_sum_assignment
  model = models.create("lenet_zhu", jax.random.key(9), num_classes=10)
  y = np.array([5, 2, 5, 9])
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:4], y, share_labels=True)
  t, w = attacks.head_targets(obs, y, jnp.float32, jax.random.key(0))
  truth = np.asarray(objectives.head_input(model.apply_fn, model.variables, photos[:4]))
  assert np.all(np.asarray(w) == 1.0)
  d = np.linalg.norm(np.asarray(t)[[0, 2]][:, None] - truth[[0, 2]][None], axis=-1)
  r, c = linear_sum_assignment(d)
  spread = np.mean(np.linalg.norm(truth - truth.mean(0), axis=1))
  assert d[r, c].max() < 0.05 * spread
  np.testing.assert_allclose(np.asarray(t)[[1, 3]], truth[[1, 3]], atol=0.05 * spread)
  with pytest.raises(ValueError, match="known or inferred labels"):
    dataclasses.replace(presets.dlg(), head_features=1.0)
  with pytest.raises(ValueError, match="non-negative"):
    dataclasses.replace(presets.inverting_gradients(), head_features=-1.0)


@pytest.mark.parametrize("strategy, name", [("sequential", "inverting_gradients"), ("vmap", "dlg"),
                                            ("vmap", "hfginv")])
@pytest.mark.slow
def test_clients_in_one_run_equal_each_client_alone(strategy, name):
  """K clients of one model (a round's) in one solver run, in sequence (Adam) and vmapped (L-BFGS,
  whose line searches end at different steps per run; HFGInv, whose runs draw their own dropout
  masks): client k's reconstruction, restarts, labels and counts are those of attacking it alone
  with its key."""
  batch = data.load("skimage", indices=range(6), image_size=(16, 16))
  net = models.create("lenet_zhu", jax.random.key(3), input_shape=batch.x.shape[1:])
  observations = [clients.fedsgd(net.apply_fn, net.variables, batch.x[i:i + 2], batch.y[i:i + 2],
                                 share_labels=True) for i in (0, 2, 4)]
  keys = jax.random.split(jax.random.key(7), 3)
  attack = presets.get_preset(name)(iterations=8)
  if name == "hfginv":  # LeNet has no BatchNorm statistics for its prior
    attack = dataclasses.replace(attack, priors=())
  kw = dict(input_shape=batch.x.shape[1:], restarts=2)
  together = attacks.reconstruct_clients(attack, net.apply_fn, observations, keys,
                                         execution=driver.Execution(strategy, chunk=4), **kw)
  assert len(together) == 3
  for obs, key, got in zip(observations, keys, together):
    alone = attacks.reconstruct(attack, net.apply_fn, obs, key,
                                execution=driver.Execution("sequential", chunk=4), **kw)
    # A vmapped convolution sums in another order: float32 rounding, grown over 8 steps.
    np.testing.assert_allclose(got.x_restarts, alone.x_restarts, rtol=0,
                               atol=1e-6 if strategy == "sequential" else 1e-3)
    np.testing.assert_allclose(got.restart_losses, alone.restart_losses, rtol=1e-3)
    assert got.best_restart == alone.best_restart
    np.testing.assert_array_equal(got.labels, alone.labels)
    np.testing.assert_array_equal(got.iterations, alone.iterations)
  assert len({float(r.loss) for r in together}) == 3  # three clients, three objectives


def test_clients_in_one_run_share_what_is_the_same_and_carry_what_differs(monkeypatch):
  """The round's model, the same for every client, reaches the driver once (shared data); what
  differs (the updates; here also the model, for one client over two rounds) each run carries. Both
  ways a client's reconstruction is the one of attacking it alone."""
  batch = data.load("skimage", indices=range(4), image_size=(16, 16))
  net = models.create("lenet_zhu", jax.random.key(3), input_shape=batch.x.shape[1:])
  later = models.create("lenet_zhu", jax.random.key(4), input_shape=batch.x.shape[1:])
  seen = []
  run = driver.run
  monkeypatch.setattr(driver, "run", lambda *a, **k: seen.append((a[2], k["restart_data"])) or run(*a, **k))
  attack = presets.inverting_gradients(iterations=4)
  kw = dict(input_shape=batch.x.shape[1:], restarts=2)
  keys = jax.random.split(jax.random.key(7), 2)
  weights = lambda tree: sum(int(np.prod(np.shape(a))) for a in jax.tree.leaves(tree))
  params = weights(net.variables["params"])
  for models_of in ((net, net), (net, later)):
    observations = [clients.fedsgd(m.apply_fn, m.variables, batch.x[2 * i:2 * i + 2],
                                   batch.y[2 * i:2 * i + 2], share_labels=True)
                    for i, m in enumerate(models_of)]
    together = attacks.reconstruct_clients(attack, net.apply_fn, observations, keys,
                                           execution=driver.Execution("vmap", chunk=4), **kw)
    shared, (own, _) = seen[-1]
    if models_of[1] is net:  # the model once; each of the 4 runs its client's update (as big)
      assert weights(shared) >= params and 4 * params <= weights(own) < 5 * params
    else:  # each run its client's model and update
      assert weights(own) >= 8 * params
    for obs, key, got in zip(observations, keys, together):
      alone = attacks.reconstruct(attack, net.apply_fn, obs, key,
                                  execution=driver.Execution("sequential", chunk=4), **kw)
      np.testing.assert_allclose(got.x_restarts, alone.x_restarts, rtol=0, atol=1e-3)
      np.testing.assert_allclose(got.restart_losses, alone.restart_losses, rtol=1e-3)


def _contractions(compiled) -> list[str]:
  """The compiled program's matrix products and convolutions, each with its result shape and how it
  contracts (batch and contracting dimensions, window, groups), sorted: what a GPU spends a matching
  step on."""
  ops = []
  for line in compiled.as_text().splitlines():
    op = re.search(r"= (\S+) (dot|convolution)\([^)]*\), (.*?)(, metadata=|$)", line)
    if op:
      result, kind, how = op.group(1, 2, 3)
      how = re.sub(r",? ?control-predecessors=\{[^}]*\}", "", how)  # scheduling, not work
      ops.append(f"{kind} {result.split('{')[0]} {how}")
  return sorted(ops)


@pytest.mark.parametrize("name", ["dlg", "inverting_gradients"])
@pytest.mark.slow
def test_k_clients_in_one_run_cost_what_k_restarts_of_one_cost(monkeypatch, name):
  """A round's K clients vmapped in one solver run make the step program that K restarts of one
  client make: the same matrix products and convolutions, of the same shapes (the round's model
  shared, not batched into per-client weights; im2col as on an accelerator). So on a GPU 64
  clients cost what 64 restarts cost (issue 58: at most 3x one client)."""
  batch = data.load("skimage", indices=range(4), image_size=(16, 16))
  net = models.create("lenet_zhu", jax.random.key(3), input_shape=batch.x.shape[1:], conv="im2col")
  observations = [clients.fedsgd(net.apply_fn, net.variables, batch.x[i:i + 1], batch.y[i:i + 1],
                                 share_labels=True) for i in range(4)]
  runs = []
  run = driver.run
  monkeypatch.setattr(driver, "run", lambda *a, **k: runs.append((a, k)) or run(*a, **k))
  attack = presets.get_preset(name)(iterations=2)
  execution = driver.Execution("vmap", chunk=2)
  kw = dict(input_shape=batch.x.shape[1:], execution=execution)
  attacks.reconstruct_clients(attack, net.apply_fn, observations, jax.random.split(jax.random.key(7), 4),
                              **kw)
  attacks.reconstruct(attack, net.apply_fn, observations[0], jax.random.key(7), restarts=4, **kw)
  programs = [driver._step_program(solver, "vmap", None, init, data_, k.get("restart_data"), 2, 1)
              for (solver, init, data_), k in runs]
  together, restarts = map(_contractions, programs)
  assert together and together == restarts


def test_clients_in_one_run_refuse_what_would_mix_them():
  batch = data.load("skimage", indices=range(3), image_size=(16, 16))
  net = models.create("lenet_zhu", jax.random.key(3), input_shape=batch.x.shape[1:])
  one = clients.fedsgd(net.apply_fn, net.variables, batch.x[:1], batch.y[:1], share_labels=True)
  two = clients.fedsgd(net.apply_fn, net.variables, batch.x[1:], batch.y[1:], share_labels=True)
  keys = jax.random.split(jax.random.key(0), 2)
  kw = dict(input_shape=batch.x.shape[1:], restarts=2)
  attack = presets.inverting_gradients(iterations=2)
  with pytest.raises(ValueError, match="client 1 differs from client 0"):
    attacks.reconstruct_clients(attack, net.apply_fn, [one, two], keys, **kw)
  with pytest.raises(ValueError, match="one key per client"):
    attacks.reconstruct_clients(attack, net.apply_fn, [one, one], keys[:1], **kw)
  with pytest.raises(ValueError, match="successive halving"):
    attacks.reconstruct_clients(attack, net.apply_fn, [one, one], keys,
                                execution=driver.Execution(halving_rounds=2), **kw)
  grouped = dataclasses.replace(attack, priors=attack.priors + (priors.Prior(priors.PRIORS["group"], 0.05),))
  with pytest.raises(ValueError, match="group consistency"):
    attacks.reconstruct_clients(grouped, net.apply_fn, [one, one], keys, **kw)


def test_another_budget_is_the_same_solver():
  """The budget makes no other solver, so its compiled programs serve an audit's probes and its run
  in one process: Inverting Gradients' step schedule is spread over each run's budget by the driver
  (``tests/test_solvers.py``); the step counts a budget moves (HFGInv's prior starts and stepwise
  period, a smoothing's end, the last-iterate rule's track_from) are the solver's data
  (:func:`gradjax.attacks.scheduled`). Another weight or prior is another solver."""
  apply_fn = lambda variables, x, train: x
  ig = presets.inverting_gradients
  assert attacks._solver(ig(300), apply_fn, 8) is attacks._solver(ig(4800), apply_fn, 8)
  smoothed = lambda n: dataclasses.replace(ig(n), smoothing=objectives.Smoothing(until=n // 2))
  assert attacks._solver(smoothed(300), apply_fn, 8) is attacks._solver(smoothed(4800), apply_fn, 8)
  last = lambda n: dataclasses.replace(ig(n), track_from=n)
  assert attacks._solver(last(300), apply_fn, 8) is attacks._solver(last(4800), apply_fn, 8)
  assert attacks._solver(presets.hfginv(300), apply_fn, 8) is attacks._solver(presets.hfginv(), apply_fn, 8)
  assert attacks._solver(presets.hfginv(), apply_fn, 8) is not attacks._solver(
      presets.hfginv(tv=0.3), apply_fn, 8)
  assert attacks._solver(ig(300), apply_fn, 8) is not attacks._solver(smoothed(300), apply_fn, 8)


@pytest.mark.parametrize("strategy", ["sequential", "vmap"])
def test_the_last_iterate_rule_reads_its_step_from_the_data(strategy):
  """``track_from`` = the budget (``--config.attack.iterate=last``) reaches the solver as data
  (:func:`gradjax.attacks.scheduled`) and the run's last-iterate scoring (on CPU one more step, whose
  rule is read on the host): each restart's reconstruction is its final iterate, where the default
  rule keeps an earlier one (a prior that adds 100·‖x‖² from step 6 on makes the early iterates
  the lowest)."""
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(1), (1, 8, 8, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, x, jnp.array([3]), share_labels=True)
  late = priors.Prior(priors.PRIORS["l2"], lambda step: jnp.where(step < 6, 0.0, 100.0))
  attack = dataclasses.replace(presets.inverting_gradients(iterations=12), priors=(late,))
  problem = attacks.prepare(attack, model.apply_fn, obs, jax.random.key(2), input_shape=(8, 8, 3),
                            restarts=2)
  execution = driver.Execution(strategy)
  best = attacks.solve(attack, model.apply_fn, problem, execution)
  last = attacks.solve(dataclasses.replace(attack, track_from=12), model.apply_fn, problem, execution)
  np.testing.assert_array_equal(best.params["x"], last.params["x"])  # the same run
  assert np.all(best.best_loss < 1.0)  # an early iterate, before the prior
  assert not np.array_equal(best.best_params["x"], best.params["x"])
  np.testing.assert_array_equal(last.best_params["x"], last.params["x"])
  assert np.all(last.best_loss > 1.0)


@pytest.mark.slow
def test_reconstruct_matches_with_the_clients_own_loss(photos):
  """A client that trained on a squared error of its softmax: started at its photo, the attack
  that computes the dummy gradient with that loss matches the update (objective 0 up to rounding,
  one iteration: L-BFGS stays there), the default cross entropy does not; reconstruct_clients
  takes it too."""
  def mse(logits, y):
    return jnp.mean(jnp.square(jax.nn.softmax(logits) - jax.nn.one_hot(y, logits.shape[-1])))

  model = models.create("lenet_zhu", jax.random.key(2), input_shape=(16, 16, 3), num_classes=10)
  x = np.asarray(jax.image.resize(photos[:1], (1, 16, 16, 3), "linear"))
  obs = clients.fedsgd(model.apply_fn, model.variables, x, np.array([3]), loss_fn=mse,
                       share_labels=True)
  at_truth = dataclasses.replace(presets.idlg(1), dummy_init=lambda key, shape, lo, hi, dtype:
                                 jnp.asarray(x, dtype).reshape(shape),
                                 label_source=labels.known)
  own = attacks.reconstruct(at_truth, model.apply_fn, obs, jax.random.key(0), input_shape=(16, 16, 3),
                            loss_fn=mse)
  other = attacks.reconstruct(at_truth, model.apply_fn, obs, jax.random.key(0),
                              input_shape=(16, 16, 3))
  assert own.loss < 1e-12 < other.loss
  both = attacks.reconstruct_clients(at_truth, model.apply_fn, [obs], [jax.random.key(0)],
                                     input_shape=(16, 16, 3), loss_fn=mse)
  assert both[0].loss < 1e-12


def test_a_zero_update_is_refused(photos):
  """An update that is 0 everywhere is reproduced by any data: refused, not matched at objective 0."""
  model = models.create("lenet_zhu", jax.random.key(2), input_shape=(16, 16, 3), num_classes=10)
  x = np.asarray(jax.image.resize(photos[:1], (1, 16, 16, 3), "linear"))
  obs = clients.fedsgd(model.apply_fn, model.variables, x, np.array([3]))
  zero = obs.replace(gradient=jax.tree.map(jnp.zeros_like, obs.gradient))
  with pytest.raises(ValueError, match="0 everywhere"):
    attacks.prepare(presets.dlg(5), model.apply_fn, zero, jax.random.key(0), input_shape=(16, 16, 3))
