"""gradjax.training against hand-written NumPy SGD loops (float64), and gradjax train end to end."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gradjax import checkpoint, clients, data, defenses, models, training
from gradjax.defenses import Defense
from conftest import assert_one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def mlp64(fill_variables):
  """mlp-8 in float64 on (6, 6, 1) inputs, NumPy-filled weights, and 11 random examples."""
  with jax.enable_x64(True):
    module = models.get_module("mlp-8", num_classes=4, param_dtype=jnp.float64)
    variables = fill_variables(module, (6, 6, 1), seed=3, dtype=np.float64, scale=0.3)
    apply_fn = models.make_apply_fn(module)
  rng = np.random.default_rng(0)
  x = rng.random((11, 6, 6, 1))
  y = rng.integers(0, 4, 11)
  return apply_fn, variables, x, y


def np_params(params):
  return {k: {n: np.asarray(v, np.float64) for n, v in layer.items()} for k, layer in params.items()}


def np_sgd(params, x, y, orders, lr, momentum, grads_fn, defend=None, weight_decay=0.0,
           nesterov=False, augment=None):
  """Plain loop over the given batch orders: d = D(g) + λW, v = μv + d, W = W − η_t v (Nesterov:
  W = W − η_t (d + μv)); ``lr`` a float or a function of the step t, ``augment(xb, t)`` the batch's
  augmentation; returns (params, losses)."""
  params = np_params(params)
  velocity = {k: {n: np.zeros_like(v) for n, v in layer.items()} for k, layer in params.items()}
  losses, t = [], 0
  for order in orders:
    for idx in order:
      xb = x[idx] if augment is None else augment(x[idx], t)
      loss, g = grads_fn(params, xb, y[idx])
      if defend is not None:
        g = defend(g, t)
      losses.append(loss)
      eta = lr(t) if callable(lr) else lr
      for k in params:
        for n in params[k]:
          d = g[k][n] + weight_decay * params[k][n]
          velocity[k][n] = momentum * velocity[k][n] + d
          params[k][n] = params[k][n] - eta * (d + momentum * velocity[k][n] if nesterov else velocity[k][n])
      t += 1
  return params, losses


def np_augment(x, key, padding, flip, fill):
  """Pad, crop and flip in NumPy with the draws ``training.augment`` documents."""
  b, h, w, c = x.shape
  offsets = np.asarray(jax.random.randint(jax.random.fold_in(key, 0), (b, 2), 0, 2 * padding + 1))
  flips = (np.asarray(jax.random.bernoulli(jax.random.fold_in(key, 1), 0.5, (b,))) if flip
           else np.zeros(b, bool))
  out = np.empty_like(x)
  for n in range(b):
    padded = np.empty((h + 2 * padding, w + 2 * padding, c))
    padded[...] = np.broadcast_to(np.asarray(fill, np.float64), (c,))
    padded[padding:padding + h, padding:padding + w] = x[n]
    (i, j) = offsets[n]
    out[n] = padded[i:i + h, j:j + w]
    if flips[n]:
      out[n] = out[n][:, ::-1]
  return out


def assert_params_close(got, want, rtol=1e-10):
  for k in want:
    for n in want[k]:
      np.testing.assert_allclose(np.asarray(got[k][n]), want[k][n], rtol=rtol, atol=1e-13)


def orders_for(key, epochs, n, batch_size):
  shuffle = jax.random.fold_in(key, 0)
  return [np.asarray(training.batch_order(shuffle, e, n, batch_size)) for e in range(1, epochs + 1)]


def test_batch_order_is_a_fresh_permutation_per_epoch():
  key = jax.random.key(5)
  a, b = (np.asarray(training.batch_order(key, e, 11, 3)) for e in (1, 2))
  assert a.shape == b.shape == (3, 3)
  for o in (a, b):
    assert len(set(o.ravel().tolist())) == 9 and o.min() >= 0 and o.max() < 11
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, np.asarray(jax.random.permutation(jax.random.fold_in(key, 1), 11))[:9]
                                .reshape(3, 3))


@pytest.mark.parametrize("epochs, momentum, weight_decay", [(1, 0.0, 0.0), (2, 0.9, 0.0), (2, 0.9, 0.05)])
def test_fedsgd_equals_numpy_sgd_loop(mlp64, mlp_reference, epochs, momentum, weight_decay):
  apply_fn, variables, x, y = mlp64
  key = jax.random.key(7)
  with jax.enable_x64(True):
    got, history = training.train_fedsgd(apply_fn, variables, x, y, key=key, epochs=epochs,
                                         batch_size=3, learning_rate=0.2, momentum=momentum,
                                         weight_decay=weight_decay)
  want, losses = np_sgd(variables["params"], x, y, orders_for(key, epochs, 11, 3), 0.2, momentum,
                        mlp_reference, weight_decay=weight_decay)
  assert_params_close(got["params"], want)
  assert [r["epoch"] for r in history] == list(range(1, epochs + 1))
  assert [r["steps"] for r in history] == [3 * e for e in range(1, epochs + 1)]
  for e, r in enumerate(history):
    np.testing.assert_allclose(r["train_loss"], np.mean(losses[3 * e:3 * e + 3]), rtol=1e-10)
  # The first step moves the weights by exactly −η g on the first batch (no momentum yet).
  assert not np.allclose(np.asarray(got["params"]["head"]["kernel"]), variables["params"]["head"]["kernel"])


@pytest.mark.parametrize("padding, flip, fill", [(2, True, (0.25, -0.5, 1.5)), (3, False, -1.0), (0, True, 0.0)])
def test_augment_equals_numpy_pad_crop_flip(padding, flip, fill):
  x = np.random.default_rng(1).random((9, 5, 6, 3))
  key = jax.random.key(4)
  aug = training.Augmentation(padding=padding, flip=flip, fill=fill)
  augment = jax.jit(lambda x, key: training.augment(x, key, aug))  # eagerly each operation compiles alone
  with jax.enable_x64(True):
    got = np.asarray(augment(jnp.asarray(x), key))
    want = np_augment(x, key, padding, flip, fill)
    other = np.asarray(augment(jnp.asarray(x), jax.random.key(5)))
  np.testing.assert_array_equal(got, want)
  if padding:  # some crop reaches into the padding, and a fresh key draws other crops
    assert np.any(np.isin(got, np.atleast_1d(fill))) and not np.array_equal(got, other)
  if not padding and flip:  # only flips: every image is itself or its mirror, and both occur
    mirrored = [np.array_equal(g, xi[:, ::-1]) and not np.array_equal(g, xi) for g, xi in zip(got, x)]
    assert any(mirrored) and not all(mirrored)


def test_step_decay_is_multistep_lr_per_epoch():
  schedule = training.step_decay(0.1, (2, 5), steps_per_epoch=3, gamma=0.5)
  for t in range(24):
    epoch = t // 3  # 0-based epoch, PyTorch's MultiStepLR stepped after every epoch
    np.testing.assert_allclose(float(schedule(t)), 0.1 * 0.5 ** sum(epoch >= m for m in (2, 5)), rtol=1e-6)
  for bad in (dict(milestones=(3, 2)), dict(milestones=(0,)), dict(steps_per_epoch=0), dict(gamma=0.0)):
    with pytest.raises(ValueError):
      training.step_decay(**{**dict(learning_rate=0.1, milestones=(2,), steps_per_epoch=3), **bad})


@pytest.mark.parametrize("nesterov", [False, True])
def test_fedsgd_with_schedule_nesterov_and_augmentation_equals_numpy(mlp64, mlp_reference, nesterov):
  apply_fn, variables, x, y = mlp64
  key = jax.random.key(9)
  aug = training.Augmentation(padding=1, flip=True, fill=-0.5)
  schedule = training.step_decay(0.3, (1, 2), steps_per_epoch=3, gamma=0.2)
  with jax.enable_x64(True):
    got, _ = training.train_fedsgd(apply_fn, variables, x, y, key=key, epochs=3, batch_size=3,
                                   learning_rate=schedule, momentum=0.9, weight_decay=0.01,
                                   nesterov=nesterov, augmentation=aug)
    augment_key = jax.random.fold_in(key, 2)
    want, _ = np_sgd(variables["params"], x, y, orders_for(key, 3, 11, 3),
                     lambda t: 0.3 * 0.2 ** (t // 3), 0.9, mlp_reference, weight_decay=0.01,
                     nesterov=nesterov,
                     augment=lambda xb, t: np_augment(xb, jax.random.fold_in(augment_key, t), 1, True, -0.5))
  assert_params_close(got["params"], want)
  with jax.enable_x64(True):  # the augmentation acts: without it the parameters differ
    plain, _ = training.train_fedsgd(apply_fn, variables, x, y, key=key, epochs=3, batch_size=3,
                                     learning_rate=schedule, momentum=0.9, weight_decay=0.01,
                                     nesterov=nesterov)
  assert not np.allclose(np.asarray(plain["params"]["head"]["kernel"]), want["head"]["kernel"])


def test_bad_augmentations():
  for kwargs in (dict(padding=-1), dict(padding=1.5), dict(fill=np.nan), dict(fill=((1.0, 2.0),))):
    with pytest.raises(ValueError, match="augmentation"):
      training.Augmentation(**kwargs)
  with pytest.raises(ValueError, match="fill has 2 values for 3 channels"):
    training.augment(jnp.zeros((1, 4, 4, 3)), jax.random.key(0), training.Augmentation(fill=(0.0, 1.0)))
  with pytest.raises(ValueError, match=r"images \(B, H, W, C\)"):
    training.augment(jnp.zeros((4, 4, 3)), jax.random.key(0), training.Augmentation())


def test_defense_is_applied_to_every_step_with_its_key(mlp64, mlp_reference):
  apply_fn, variables, x, y = mlp64
  key = jax.random.key(8)
  defense = defenses.gaussian_noise(1e-3)
  noise_key = jax.random.fold_in(key, 1)

  def defend(g, t):  # the defense on the NumPy gradient, with the documented per-step key
    from gradjax.observation import Observation
    obs = Observation(gradient=jax.tree.map(jnp.asarray, g), variables=variables)
    return np_params(defense.apply(obs, jax.random.fold_in(noise_key, t)).gradient)

  with jax.enable_x64(True):
    got, _ = training.train_fedsgd(apply_fn, variables, x, y, key=key, epochs=2, batch_size=4,
                                   learning_rate=0.1, momentum=0.5, defense=defense)
    want, _ = np_sgd(variables["params"], x, y, orders_for(key, 2, 11, 4), 0.1, 0.5, mlp_reference,
                     defend)
  assert_params_close(got["params"], want)


def _scale(c):
  return Defense(lambda obs, key=None: obs.replace(gradient=jax.tree.map(lambda g: c * g, obs.gradient)),
                 f"scale:{c}")


@pytest.mark.slow
def test_zero_strength_defenses_change_nothing_and_the_defense_acts(mlp64):
  apply_fn, variables, x, y = mlp64
  kw = dict(key=jax.random.key(1), epochs=2, batch_size=5, learning_rate=0.3)
  with jax.enable_x64(True):
    plain, _ = training.train_fedsgd(apply_fn, variables, x, y, **kw)
    for d in (defenses.gaussian_noise(0.0), defenses.identity(), defenses.prune(0.0)):
      got, _ = training.train_fedsgd(apply_fn, variables, x, y, defense=d, **kw)
      assert_params_close(got["params"], np_params(plain["params"]), rtol=1e-13)
    frozen, _ = training.train_fedsgd(apply_fn, variables, x, y, defense=_scale(0.0), **kw)
    doubled, _ = training.train_fedsgd(apply_fn, variables, x, y, defense=_scale(2.0), **kw)
    double_lr, _ = training.train_fedsgd(apply_fn, variables, x, y, **{**kw, "learning_rate": 0.6})
  for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(variables)):
    np.testing.assert_array_equal(a, b)  # zeroed gradients: no step at all
  assert_params_close(doubled["params"], np_params(double_lr["params"]), rtol=1e-12)


def _blobs(n, seed, classes=3):
  """Linearly separable images: class c lights up pixel block c of a 4x4 image, plus noise."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n)
  x = rng.normal(0, 0.3, (n, 4, 4, 1)).astype(np.float32)
  for c in range(classes):
    x[y == c, c, :, 0] += 2.0
  return x, y


def test_training_raises_accuracy_on_a_separable_problem():
  x, y = _blobs(240, 0)
  xt, yt = _blobs(200, 1)
  model = models.create("mlp-16", jax.random.key(0), input_shape=(4, 4, 1), num_classes=3)
  before = training.evaluate(model.apply_fn, model.variables, xt, yt)
  seen = []
  cb = lambda e, v, r: seen.append((e, r["train_loss"])) or {"accuracy": training.evaluate(model.apply_fn, v, xt, yt)}
  variables, history = training.train_fedsgd(model.apply_fn, model.variables, x, y, key=jax.random.key(1),
                                             epochs=3, batch_size=16, learning_rate=0.1,
                                             momentum=0.9, callback=cb)
  after = training.evaluate(model.apply_fn, variables, xt, yt)
  assert before < 0.6 and after > 0.97
  assert history[-1]["accuracy"] == after and [e for e, _ in seen] == [1, 2, 3]
  assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_evaluate_equals_numpy_argmax_count(mlp64):
  apply_fn, variables, x, _ = mlp64
  rng = np.random.default_rng(4)
  x = rng.random((30, 6, 6, 1))
  y = rng.integers(0, 4, 30)
  p = np_params(variables["params"])
  h = np.maximum(x.reshape(30, -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
  want = np.sum(np.argmax(h @ p["head"]["kernel"] + p["head"]["bias"], -1) == y) / 30
  with jax.enable_x64(True):
    for b in (7, 30, 500):
      assert training.evaluate(apply_fn, variables, x, y, batch_size=b) == want
  assert 0 < want < 1
  with pytest.raises(ValueError, match="evaluate needs"):
    training.evaluate(apply_fn, variables, x[:0], y[:0])


def test_fedavg_one_client_one_round_is_the_clients_update(mlp64):
  apply_fn, variables, x, y = mlp64
  x, y = x[:10], y[:10]
  local = clients.LocalTraining(epochs=2, batch_size=5, learning_rate=0.1, momentum=0.5)
  with jax.enable_x64(True):
    got, history = training.train_fedavg(apply_fn, variables, x, y, key=jax.random.key(0), rounds=1,
                                         clients=1, local=local)
    update = clients.fedavg(apply_fn, variables, x, y, local).gradient
  want = jax.tree.map(lambda p, u: np.asarray(p) - np.asarray(u), variables["params"], update)
  assert_params_close(got["params"], np_params(want), rtol=1e-12)
  assert history[0]["round"] == 1
  np.testing.assert_allclose(history[0]["update_norm"],
                             np.sqrt(sum(np.sum(np.asarray(u) ** 2) for u in jax.tree.leaves(update))))


def test_fedavg_rounds_average_the_defended_client_updates(mlp64):
  apply_fn, variables, x, y = mlp64  # 11 examples, 2 clients of 5: the last one is unused
  local = clients.LocalTraining(epochs=1, batch_size=5, learning_rate=0.2)
  defense = defenses.chain(defenses.clip(0.05), defenses.gaussian_noise(1e-4))
  key = jax.random.key(3)
  with jax.enable_x64(True):
    got, history = training.train_fedavg(apply_fn, variables, x, y, key=key, rounds=2, clients=2,
                                         local=local, defense=defense)
    v = variables
    for r in (1, 2):
      ups = [defense.apply(clients.fedavg(apply_fn, v, x[5 * k:5 * k + 5], y[5 * k:5 * k + 5], local),
                           jax.random.fold_in(jax.random.fold_in(key, r), k)).gradient for k in (0, 1)]
      v = {**v, "params": jax.tree.map(lambda p, a, b: p - (a + b) / 2, v["params"], *ups)}
  assert_params_close(got["params"], np_params(v["params"]), rtol=1e-10)
  assert [h["round"] for h in history] == [1, 2]


class _TinyBN(nn.Module):
  """flatten - Dense(8) - BatchNorm - Dense('head'): a small model with batch statistics."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(8)(x.reshape(x.shape[0], -1))
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(3, name="head")(nn.relu(x))


@pytest.mark.slow
def test_batch_stats_are_kept_and_divergence_is_reported():
  module = _TinyBN()
  x, y = _blobs(12, 2)
  variables = module.init(jax.random.key(0), x[:1])
  stats = {"mean": jnp.full((8,), 0.2), "var": jnp.full((8,), 2.0)}
  variables = {**variables, "batch_stats": {"BatchNorm_0": stats}}
  apply_fn = models.make_apply_fn(module)
  kw = dict(key=jax.random.key(0), epochs=1, batch_size=4, learning_rate=0.01)
  got, _ = training.train_fedsgd(apply_fn, variables, x, y, **kw)
  np.testing.assert_array_equal(got["batch_stats"]["BatchNorm_0"]["mean"], stats["mean"])
  np.testing.assert_array_equal(got["batch_stats"]["BatchNorm_0"]["var"], stats["var"])
  assert not np.array_equal(got["params"]["head"]["kernel"], variables["params"]["head"]["kernel"])
  nan = Defense(lambda obs, key=None: obs.replace(gradient=jax.tree.map(lambda g: g * jnp.nan, obs.gradient)),
                "nan")
  with pytest.raises(FloatingPointError, match="epoch 1"):
    training.train_fedsgd(apply_fn, variables, x, y, defense=nan, **kw)


@pytest.mark.parametrize("kwargs, message", [
    (dict(epochs=0), "epochs"), (dict(batch_size=12), "batch size"), (dict(learning_rate=0.0), "learning rate"),
    (dict(momentum=1.0), "momentum"), (dict(weight_decay=-1e-4), "weight decay"),
    (dict(nesterov=True), "Nesterov's momentum needs momentum > 0"),
])
def test_bad_fedsgd_settings(mlp64, kwargs, message):
  apply_fn, variables, x, y = mlp64
  base = dict(key=jax.random.key(0), epochs=1, batch_size=2, learning_rate=0.1)
  with jax.enable_x64(True), pytest.raises(ValueError, match=message):
    training.train_fedsgd(apply_fn, variables, x, y, **{**base, **kwargs})


def test_bad_fedavg_settings_and_data(mlp64):
  apply_fn, variables, x, y = mlp64
  local = clients.LocalTraining(batch_size=2)
  with jax.enable_x64(True):
    with pytest.raises(ValueError, match="clients"):
      training.train_fedavg(apply_fn, variables, x, y, key=jax.random.key(0), rounds=1, clients=12, local=local)
    with pytest.raises(ValueError, match="batch size dividing n = 5"):
      training.train_fedavg(apply_fn, variables, x, y, key=jax.random.key(0), rounds=1, clients=2,
                            local=clients.LocalTraining(batch_size=2))
    with pytest.raises(ValueError, match="labels must lie"):
      training.train_fedsgd(apply_fn, variables, x, y + 4, key=jax.random.key(0), epochs=1, batch_size=2,
                            learning_rate=0.1)


def test_split():
  ds = data.Dataset(np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1), np.arange(10) % 3, 3, "toy")
  s = training.split(ds, 6, 3)
  assert s.train_indices.tolist() == list(range(6)) and s.test_indices.tolist() == [6, 7, 8]
  np.testing.assert_array_equal(s.test.x.ravel(), [6, 7, 8])
  p = training.split(ds, 6, 4, seed=1)
  assert sorted(p.train_indices.tolist() + p.test_indices.tolist()) == list(range(10))
  np.testing.assert_array_equal(p.train.y, ds.y[p.train_indices])
  assert p.train_indices.tolist() != list(range(6))
  with pytest.raises(ValueError, match="train \\+ test count"):
    training.split(ds, 8, 3)
  # What load_split does with a large source (data.count known): only the split's images are read,
  # in the order of split_indices, and split again in that order: the same split.
  train, test = training.split_indices(10, 6, 4, seed=1)
  read = np.concatenate([train, test])
  q = training.split(ds._replace(x=ds.x[read], y=ds.y[read]), 6, 4)
  np.testing.assert_array_equal(q.train.x, p.train.x)
  np.testing.assert_array_equal(q.test.y, p.test.y)
  np.testing.assert_array_equal(train, p.train_indices)
  np.testing.assert_array_equal(test, p.test_indices)


# --- gradjax train ---------------------------------------------------------------------


def run_train(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "gradjax", "train", *args],
                        capture_output=True, text=True, env=env, timeout=300)


def _refused(tmp_path, cases):
  """Each ``gradjax train`` of ``cases`` ([args, message] pairs; one process for all of them) ends
  with one error line holding its message, exit 2, and no output folder."""
  from test_cli import run_in_one_process
  procs = run_in_one_process([(["gradjax", "train", *args, f"--output_dir={tmp_path / 'bad'}"], tmp_path)
                              for args, _ in cases])
  for (args, message), bad in zip(cases, procs, strict=True):
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and message in errors[0], (args, bad.stderr[-2000:])
    assert not (tmp_path / "bad").exists(), args


@pytest.mark.slow
def test_train_program_writes_checkpoints_that_rebuild_the_model(tmp_path):
  proc = run_train("--model=mlp", "--epochs=2", "--config.training.lr=0.05", f"--output_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((tmp_path / "results.json").read_text())
  assert sorted(os.listdir(tmp_path)) == ["config.py", "epoch_0.npz", "epoch_1.npz", "epoch_2.npz",
                                         "results.json"]
  ds = data.load("lfw_subset")
  test_idx = np.array(result["test_indices"])
  assert len(test_idx) == 50 and not set(test_idx) & set(result["train_indices"])
  for record in result["history"]:
    model = checkpoint.load_model(tmp_path / f"epoch_{record['epoch']}.npz")
    _, meta = checkpoint.load(tmp_path / f"epoch_{record['epoch']}.npz")
    assert (model.name, model.input_shape, model.num_classes) == ("mlp", (25, 25, 1), 2)
    assert meta["normalization"] == "none" and meta["epoch"] == record["epoch"]
    acc = training.evaluate(model.apply_fn, model.variables, ds.x[test_idx], ds.y[test_idx])
    assert acc == record["accuracy"] == meta["accuracy"]
  assert result["history"][-1]["accuracy"] > 0.8
  assert f"test accuracy {result['history'][-1]['accuracy']:.4f}" in proc.stdout
  # Its config.py trains the same model again, bit for bit.
  again = run_train(f"--config={tmp_path / 'config.py'}", f"--output_dir={tmp_path / 'again'}")
  assert again.returncode == 0, again.stderr[-2000:]
  first, _ = checkpoint.load(tmp_path / "epoch_2.npz")
  second, _ = checkpoint.load(tmp_path / "again" / "epoch_2.npz")
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_train_program_fedavg_and_bad_flags(tmp_path):
  proc = run_train("--model=mlp", "--client=fedavg", "--config.training.clients=3", "--config.client.local_batch_size=10",
                   "--epochs=1", "--defense=clip:1.0", "--config.training.data_seed=-1", f"--output_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((tmp_path / "results.json").read_text())
  assert result["train_indices"] == list(range(150)) and result["history"][1]["update_norm"] > 0
  _refused(tmp_path, [
      (["--model=alexnet"], "unknown model"), (["--config.training.clients=3"], "--config.training.clients"),
      (["--config.training.train_count=190"], "train + test count"),
      (["--config.training.data_seed=-2"], "--config.training.data_seed must be >= 0 or -1"),
      (["--config.client.local_lr=0.5"], "--config.client.local_lr does not apply to --client=fedsgd"),
      (["--config.defense.dp_sgd_max_norm=1"], "not DP-SGD's per-example clipping"),
      (["--client=fedavg", "--config.training.lr=0.5", "--config.training.momentum=0.5"],
       "--config.training.lr, --config.training.momentum do not apply to --client=fedavg")])


@pytest.mark.slow
def test_train_program_recipe_flags_train_as_the_library(tmp_path):
  """--config.training.nesterov=True, --config.training.lr_milestones, --config.training.lr_gamma and --config.training.augment=True reach gradjax.training as the step decay,
  Nesterov's SGD and the crops padded with normalised black (the library's own NumPy checks are
  above); they are recorded, and misused they are one-line errors."""
  out = tmp_path / "run"
  proc = run_train("--model=mlp", "--epochs=2", "--config.training.lr=0.05", "--config.training.momentum=0.9", "--config.training.nesterov=True",
                   "--config.training.lr_milestones=1", "--config.training.lr_gamma=0.5", "--config.training.augment=True", "--normalization=mnist",
                   f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((out / "results.json").read_text())
  config = result["config"]["training"]
  assert (config["nesterov"], config["lr_milestones"], config["lr_gamma"], config["augment"]) == (
      True, "1", 0.5, True)
  ds = data.load("lfw_subset")
  x = ((ds.x[result["train_indices"]].astype(np.float64) - 0.1307) / 0.3081).astype(np.float32)
  model = checkpoint.load_model(out / "epoch_0.npz")
  with jax.enable_x64(False):  # the program's mode (test_solvers turns x64 on for the session)
    want, _ = training.train_fedsgd(
        model.apply_fn, model.variables, x, ds.y[result["train_indices"]],
        key=jax.random.split(jax.random.key(0))[1], epochs=2, batch_size=32,
        learning_rate=training.step_decay(0.05, (1,), 150 // 32, 0.5), momentum=0.9, nesterov=True,
        augmentation=training.Augmentation(4, True, -0.1307 / 0.3081))
  got = checkpoint.load_model(out / "epoch_2.npz").variables
  for a, b in zip(jax.tree.leaves(got["params"]), jax.tree.leaves(want["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  _refused(tmp_path, [
      (["--client=fedavg", "--config.training.augment=True"], "--config.training.augment does not apply to --client=fedavg"),
      (["--config.training.lr_milestones=3,2"], "milestones must be increasing"),
      (["--config.training.lr_milestones=abc"], "lr_milestones must be comma-separated epochs"),
      (["--config.training.train_count=0"], "train_count must be positive"),
      (["--modality=text", "--config.training.augment=True"], "--config.training.augment=True is for images"),
      (["--modality=text", "--client=fedavg"], "trains a text model with FedSGD steps (--client=fedsgd)")])


@pytest.mark.slow
def test_train_program_normalization_is_trained_on_kept_and_required(tmp_path):
  """--normalization: the model trains and is tested on (x - mean) / std (its recorded accuracy equals
  a NumPy-normalised evaluation of the checkpoint), the checkpoint keeps the name, an attack on it
  must name the same one, and a normalisation that does not fit the images is a one-line error."""
  out = tmp_path / "run"
  proc = run_train("--model=mlp", "--epochs=1", "--config.training.lr=0.05", "--normalization=mnist", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((out / "results.json").read_text())
  assert result["config"]["data"]["normalization"] == "mnist" and result["cores"] >= 1
  assert result["command"].startswith("gradjax train --model=mlp")
  ds = data.load("lfw_subset")
  test_idx = np.array(result["test_indices"])
  x_test = ((ds.x[test_idx].astype(np.float64) - 0.1307) / 0.3081).astype(np.float32)
  model = checkpoint.load_model(out / "epoch_1.npz")
  assert checkpoint.load(out / "epoch_1.npz")[1]["normalization"] == "mnist"
  acc = training.evaluate(model.apply_fn, model.variables, x_test, ds.y[test_idx])
  assert acc == result["history"][-1]["accuracy"]
  raw = training.evaluate(model.apply_fn, model.variables, ds.x[test_idx], ds.y[test_idx])
  assert raw != acc  # the [0, 1] images are not what it was tested on
  from test_cli import run_in_one_process
  attack = ["gradjax", "reconstruct",
            f"--checkpoint={out / 'epoch_1.npz'}", "--dataset=lfw_subset", "--iterations=2",
            "--lpips=none", f"--output_dir={tmp_path / 'attack'}"]
  bad, good = run_in_one_process([(attack, tmp_path), ([*attack, "--normalization=mnist"], tmp_path)])
  assert_one_line_error(bad, "was trained with normalization 'mnist', not 'none'")
  assert good.returncode == 0, good.stderr[-2000:]
  _refused(tmp_path, [(["--model=mlp", "--normalization=cifar10"], "3 channel values but x has 1 channels"),
                      (["--model=mlp", "--normalization=zca"], "unknown normalization 'zca'")])


@pytest.mark.slow
@pytest.mark.slow
def test_train_mode_updates_batch_norm_running_statistics():
  """One step in train mode: the running mean and variance of every BatchNorm move by PyTorch's
  momentum toward the batch's moments (NumPy, from the captured inputs of each layer); the
  parameters' step uses the batch-statistics forward pass (checked against the same step computed
  with Flax's own train-mode loss)."""
  with jax.enable_x64(True):
    model = models.create("resnet8", jax.random.key(0), input_shape=(8, 8, 3), param_dtype=jnp.float64,
                           conv="xla")
    module = model.apply_fn.module
    rng = np.random.default_rng(0)
    x, y = rng.random((6, 8, 8, 3)), rng.integers(0, 10, 6)
    key = jax.random.key(1)
    got, _ = training.train_fedsgd(model.apply_fn, model.variables, x, y, key=key, epochs=1,
                                   batch_size=6, learning_rate=0.1, train_mode=True)
    order = np.asarray(training.batch_order(jax.random.fold_in(key, 0), 1, 6, 6))[0]
    xb, yb = x[order], y[order]
    _, state = jax.jit(lambda v, x: module.apply(v, x, train=True, capture_intermediates=True,
                                                 mutable=["intermediates", "batch_stats"]))(
                                                     model.variables, xb)
    conv = np.asarray(state["intermediates"]["BasicBlock_0"]["Conv_1"]["__call__"][0], np.float64)
    h = conv.reshape(-1, conv.shape[-1])
    running = got["batch_stats"]["BasicBlock_0"]["BatchNorm_1"]
    np.testing.assert_allclose(np.asarray(running["mean"]), 0.1 * h.mean(0), rtol=1e-6, atol=1e-9)  # stored in float32
    np.testing.assert_allclose(np.asarray(running["var"]), 0.9 + 0.1 * h.var(0), rtol=1e-6)

    def loss(p):
      logits, _ = module.apply({**model.variables, "params": p}, xb, train=True, mutable=["batch_stats"])
      return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(6), yb])
    grad = jax.jit(jax.grad(loss))(model.variables["params"])
    want = jax.tree.map(lambda p, g: p - 0.1 * g, model.variables["params"], grad)
    for a, b in zip(jax.tree.leaves(got["params"]), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13)
    # Evaluation mode (the default) leaves the running statistics as they were.
    frozen, _ = training.train_fedsgd(model.apply_fn, model.variables, x, y, key=key, epochs=1,
                                      batch_size=6, learning_rate=0.1)
    for a, b in zip(jax.tree.leaves(frozen["batch_stats"]), jax.tree.leaves(model.variables["batch_stats"])):
      np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_split_convolutions_train_as_xla_convolutions():
  """Two epochs of momentum SGD in train mode on a strided BatchNorm ResNet (the epoch is a
  ``lax.scan``): ``conv="split"``, the training program's default, gives XLA's parameters and
  running statistics (float64)."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 9, 9, 3)), rng.integers(0, 10, 8)
    runs = {}
    for conv in ("split", "xla"):
      model = models.create("resnet8", jax.random.key(0), input_shape=(9, 9, 3), param_dtype=jnp.float64,
                            conv=conv)
      runs[conv], _ = training.train_fedsgd(model.apply_fn, model.variables, x, y, key=jax.random.key(1),
                                            epochs=2, batch_size=4, learning_rate=0.1, momentum=0.9,
                                            train_mode=True)
    for a, b in zip(jax.tree.leaves(runs["split"]), jax.tree.leaves(runs["xla"])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
