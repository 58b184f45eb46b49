"""Tests for HFGInv's image side: stepwise matching with gradient dropout, the quantised sign update,
its step schedule, best-iterate tracking from a given step, and the presets.

References: the layer table of Ye et al.'s code (ResNet-34, 110 tensors), NumPy re-computations of the
quantiser and of the masked cosine (float64), closed forms of the schedules.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradjax import attacks, clients, distances, models, objectives, optimizers, presets, priors, solvers
from conftest import assert_one_line_error

# Models a test builds for itself take conv="xla" (one rebuilt to match the pipeline's keeps the
# default): what these tests check does not depend on the convolution, and XLA's compiles fastest
# on CPU (the implementations' equality is test_models' subject).


def test_stepwise_layer_counts_follow_the_authors_table():
  """ResNet-34 (110 tensors): tensors 100..110 first, 10 more every 500 iterations, floor tensor 25."""
  sw = objectives.Stepwise()
  steps = [0, 498, 499, 500, 999, 1000, 3499, 3500, 3999, 4000, 14_999]
  want = [11, 11, 11, 21, 21, 31, 71, 81, 81, 86, 86]
  assert [int(sw.num_matched(110, t)) for t in steps] == want
  assert int(objectives.Stepwise(first=0.01, grow=0.0).num_matched(20, 10_000)) == 1  # at least one leaf
  # The layer set settles at the first step where n(t) reaches its last value, by brute force.
  for leaves in (8, 21, 65, 110):
    n = [int(sw.num_matched(leaves, t)) for t in range(0, 15_000, 100)]
    assert sw.settled_from(leaves) == 100 * n.index(n[-1]), leaves
  assert objectives.Stepwise(first=0.5, grow=0.0).settled_from(10) == 0
  for bad in (dict(first=0.0), dict(first=0.5, last=0.4), dict(period=0), dict(dropout=1.0)):
    with pytest.raises(ValueError, match="stepwise"):
      objectives.Stepwise(**bad)


@pytest.mark.slow
def test_stepwise_masks_select_deep_leaves_and_drop_entries():
  params = {"a": {"kernel": jnp.ones((40, 50))}, "b": {"kernel": jnp.ones((30, 30))},
            "c": {"kernel": jnp.ones((60, 70))}, "d": {"bias": jnp.ones((5000,))}}
  positions = distances.leaf_positions(params)
  assert jax.tree.leaves(positions) == [0, 1, 2, 3]
  other = jax.tree.map(lambda v: 2.0 * v, params)
  sw = objectives.Stepwise(first=0.5, grow=0.25, last=0.75, period=10, dropout=0.0)
  kept = lambda tree: {k: float(jnp.mean(v[next(iter(v))])) for k, v in tree.items()}
  a, b = sw.apply(positions, 0, params, other)
  assert kept(a) == {"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0} and kept(b) == {"a": 0.0, "b": 0.0, "c": 2.0, "d": 2.0}
  a, _ = sw.apply(positions, 25, params, other)
  assert kept(a) == {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0}
  drop = dataclasses.replace(sw, dropout=0.3)
  key = jax.random.key(5)
  a, b = drop.apply(positions, 7, params, other, key=key)
  np.testing.assert_array_equal(2.0 * np.asarray(a["d"]["bias"]), np.asarray(b["d"]["bias"]))  # one mask
  assert abs(float(jnp.mean(a["d"]["bias"])) - 0.7) < 0.03
  mask = lambda step, key: np.asarray(drop.apply(positions, step, params, other, key=key)[0]["d"]["bias"])
  np.testing.assert_array_equal(np.asarray(a["d"]["bias"]), mask(7, key))
  assert not np.array_equal(mask(7, key), mask(8, key))  # anew every step
  assert not np.array_equal(mask(7, key), mask(7, jax.random.key(6)))  # each run its own
  assert float(jnp.max(a["a"]["kernel"])) == 0.0  # unmatched leaves stay zero under dropout
  with pytest.raises(ValueError, match="key"):
    drop.apply(positions, 7, params, other)


@pytest.mark.slow
def test_stepwise_objective_is_the_cosine_of_the_deepest_leaves():
  """Without dropout the objective is 1 − cos over the matched leaves (NumPy, float64)."""
  with jax.enable_x64(True):
    model = models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3), param_dtype=jnp.float64)
    x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3), jnp.float64)
    obs = clients.fedsgd(model.apply_fn, model.variables, x, jnp.array([1, 4]))
    sw = objectives.Stepwise(first=0.25, grow=0.25, last=0.75, period=3, dropout=0.0)
    objective = objectives.gradient_matching(model.apply_fn, distances.cosine, stepwise=sw)
    dummy = {"x": jax.random.normal(jax.random.key(2), x.shape, jnp.float64)}
    labels = jnp.array([1, 4])
    positions = distances.leaf_positions(model.variables["params"])
    g = jax.jit(lambda x: objectives.dummy_gradient(model.apply_fn, model.variables, x, labels))(
        dummy["x"])
    # One program for every step (the step a traced argument), not one per operation.
    at = jax.jit(lambda d, step: objective(d, obs, labels, step, positions=positions))
    paths = distances.layer_paths(model.variables["params"])
    get = lambda tree, path: np.asarray(tree[path[0]][path[1]], np.float64).ravel()
    for step in (0, 3, 6, 100):
      n = int(sw.num_matched(len(paths), step))
      deep = paths[len(paths) - n:]
      u = np.concatenate([get(g, p) for p in deep])
      v = np.concatenate([get(obs.gradient, p) for p in deep])
      want = 1 - u @ v / (np.linalg.norm(u) * np.linalg.norm(v))
      got = at(dummy, jnp.asarray(step))
      np.testing.assert_allclose(float(got), want, rtol=1e-6)
    with pytest.raises(ValueError, match="positions"):  # raised while tracing: nothing compiled
      jax.eval_shape(lambda d: objective(d, obs, labels, 0), dummy)


def test_each_restart_draws_its_own_dropout_masks():
  """Two restarts from the same dummy data: with their own seeds (what prepare gives) they drop other
  entries and part; with one seed they are the same run."""
  from gradjax import driver
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(16, 16, 3), conv="xla")
  x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, x, jnp.array([1, 4]), share_labels=True)
  attack = dataclasses.replace(presets.hfginv(iterations=4), priors=())
  problem = attacks.prepare(attack, model.apply_fn, obs, jax.random.key(2), input_shape=(16, 16, 3),
                            restarts=2)
  seeds = np.asarray(problem.restart_data.seed)
  assert seeds.shape == (2,) and seeds[0] != seeds[1]
  same_start = jax.tree.map(lambda a: jnp.stack([a[0], a[0]]), problem.init)
  run = lambda p: attacks.solve(attack, model.apply_fn, p, driver.Execution("sequential")).best_params["x"]
  own = run(problem._replace(init=same_start))
  assert not np.allclose(own[0], own[1])
  shared = problem.restart_data._replace(seed=jnp.stack([problem.restart_data.seed[0]] * 2))
  one = run(problem._replace(init=same_start, restart_data=shared))
  np.testing.assert_array_equal(one[0], one[1])
  np.testing.assert_array_equal(one[0], own[0])


def test_quantized_sign_matches_numpy():
  rng = np.random.default_rng(0)
  g = rng.normal(size=(3, 5, 5, 2)) * np.exp(rng.normal(size=(3, 5, 5, 2)))
  g[0, 0, 0, 0] = 0.0
  tx = optimizers.scale_by_quantized_sign()
  state = tx.init(jnp.zeros(1))
  s = 2.0 / (np.median(np.abs(g)) + 1e-10)
  want = 0.8 * np.clip(np.round(s * g) / 2, -1, 1) + 0.2 * np.sign(g)
  assert set(np.round(np.abs(want), 6).ravel()) <= {0.0, 0.2, 0.6, 1.0}
  for step in range(103):
    out, state = tx.update(jnp.asarray(g), state)
    np.testing.assert_allclose(np.asarray(out), want * (2.0 if step <= 100 else 1.0), rtol=1e-6)


def test_hfginv_step_schedule():
  tx = optimizers.learning_rate_schedule(0.1, "step_hfginv", iterations=15_000)
  for step, want in ((0, 0.1), (5623, 0.1), (5624, 0.033), (9374, 0.01089), (13_133, 0.01089),
                     (13_134, 0.0035937)):
    state = dataclasses.replace(tx.init(None), count=jnp.asarray(step, jnp.int32))
    assert -float(tx.update(jnp.ones(()), state)[0]) == pytest.approx(want, rel=1e-5), step


def test_best_iterate_is_tracked_from_track_from():
  """Early iterations score an artificially low objective; with track_from they cannot win."""
  value_fn = lambda p, data, step: jnp.sum((p["x"] - 1.0) ** 2) - jnp.where(step < 5, 100.0, 0.0)
  opt = optax.sgd(0.1)
  for track_from, data in ((0, None), (5, None), (lambda data: data, jnp.int32(5))):
    # The last: read from the solver's data, as an attack's is (one program for every budget).
    solver = solvers.make_solver(value_fn, opt, track_from=track_from)
    step = jax.jit(solver.step)
    state = solver.init({"x": jnp.zeros(2)}, data)
    for _ in range(8):
      state = step(state, data)
    state = solver.finalize(state, data)
    if track_from == 0:
      # step 4's iterate, the last with the −100 offset: x = 1 − 0.8⁴
      assert float(state.best_loss) == pytest.approx(2 * 0.8 ** 8 - 100.0, rel=1e-6)
    else:  # the lowest from step 5 on: the final iterate after 8 steps of x ← x + 0.2 (1 − x)
      final = 1.0 - 0.8 ** 8
      np.testing.assert_allclose(np.asarray(state.best_params["x"]), [final, final], rtol=1e-6)


@pytest.mark.slow
def test_step_counts_read_as_data_are_the_records_step_counts():
  """The objective reading its step counts from a :class:`gradjax.objectives.Schedule` (one program
  for every budget) equals the one compiled with those counts in its records, one step before, at
  and after each count: two priors switched on at 7 and 12, a layer set growing every 5 steps (its
  sizes change at multiples of 5), a smoothing until 9; and again at the counts of another budget
  (doubled) from the same program. Without a smoothing the two are bitwise equal; with one, κ's
  exponent t / until is a division by the data where the records' program multiplies by the
  constant's float32 reciprocal, which can round one unit in the last place apart."""
  model = models.create("mlp-16", jax.random.key(3), input_shape=(8, 8, 3))
  x = jax.random.uniform(jax.random.key(4), (2, 8, 8, 3))
  y = jnp.arange(2)
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
  dummy = {"x": jax.random.uniform(jax.random.key(5), x.shape)}
  positions = distances.leaf_positions(model.variables["params"])
  tv, l2 = priors.PRIORS["tv"], priors.PRIORS["l2"]
  key = jax.random.key(8)

  def build(starts, period, until):
    return objectives.gradient_matching(
        model.apply_fn, distances.cosine,
        prior=priors.combine([priors.Prior(tv, 0.3, starts[0]), priors.Prior(l2, 0.05, starts[1])]),
        stepwise=objectives.Stepwise(first=0.25, grow=0.25, last=1.0, period=period, dropout=0.2),
        smoothing=None if until is None else objectives.Smoothing(until=until, end=1e3))

  for smoothed in (False, True):
    placeholder = build((0, 0), 1, 1 if smoothed else None)
    read = jax.jit(lambda step, schedule, f=placeholder: f(dummy, obs, y, step, positions=positions,
                                                             schedule=schedule, key=key))
    for scale in (1, 2):
      (starts, period, until) = counts = ((7 * scale, 12 * scale), 5 * scale, 9 * scale)
      held = build(*counts[:2], until if smoothed else None)
      compiled = jax.jit(lambda step, f=held: f(dummy, obs, y, step, positions=positions, key=key))
      schedule = objectives.Schedule(tuple(jnp.int32(c) for c in starts), jnp.int32(period),
                                     jnp.int32(until) if smoothed else None)
      edges = [*starts, period, 2 * period, 3 * period] + ([until] if smoothed else [])
      for step in sorted({0} | {c + d for c in edges for d in (-1, 0, 1)}):
        got, want = read(jnp.int32(step), schedule), compiled(jnp.int32(step))
        if smoothed:
          np.testing.assert_allclose(float(got), float(want), rtol=1e-6, err_msg=step)
        else:
          assert float(got) == float(want), step
    assert read._cache_size() == 1


def test_the_best_iterate_waits_for_the_last_prior(photos):
  """A prior switched on at step 20 (cosine, Adam, 2 restarts): iterates before it lack its term and
  read lower, so they must not be returned; each restart's reported loss is the objective with the
  prior (recomputed from its returned images), which before the fix came from step < 20."""
  from gradjax import driver, dummy, labels
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  y = np.array([3])
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], y, share_labels=True)
  attack = attacks.Attack(distance=distances.DISTANCES["cosine"], optimizer=optax.adam(0.05),
                          iterations=40, priors=(priors.Prior(priors.total_variation, 1.0, 20),),
                          label_source=labels.known, dummy_init=dummy.uniform)
  assert attacks.track_from(attack) == 20
  problem = attacks.prepare(attack, model.apply_fn, obs, jax.random.key(0), input_shape=(32, 32, 3),
                            restarts=2)
  rec = attacks.select(problem, attacks.solve(attack, model.apply_fn, problem,
                                              driver.Execution(strategy="sequential")))
  full = objectives.gradient_matching(model.apply_fn, attack.distance,
                                      prior=priors.combine(attack.priors))
  for r in range(2):
    value = float(full({"x": jnp.asarray(rec.x_restarts[r])}, obs, jnp.asarray(y), 40))
    assert float(rec.restart_losses[r]) == pytest.approx(value, rel=1e-4)
    assert value > float(priors.total_variation(jnp.asarray(rec.x_restarts[r])))  # TV counted in it


def test_an_annealed_distance_tracks_the_best_iterate_once_it_settles():
  """The annealed kernel's values before step 250 are not comparable with later ones: the solver's
  data tracks the best iterate from 250 (or the attack's own, where later)."""
  data = attacks.MatchingData(None, None, (0.0, 1.0), None)
  own = distances.Distance(distances.euclidean, settled_from=7)  # a distance of one's own settling at 7
  for distance, track_from, want in ((distances.DISTANCES["gaussian_kernel_annealed"], 0, 250),
                                     (distances.DISTANCES["gaussian_kernel_annealed"], 400, 400),
                                     (distances.DISTANCES["gaussian_kernel_mean"], 0, 0),
                                     (own, 0, 7), (own, 9, 9)):
    attack = dataclasses.replace(presets.sapag(), distance=distance, track_from=track_from)
    assert int(attacks.scheduled(attack, data, 8).track_from) == want == attacks.track_from(attack), distance


def test_presets_and_rescaled():
  tv, bn, bn_hfginv = priors.PRIORS["tv"], priors.PRIORS["bn"], priors.PRIORS["bn_hfginv"]
  hf = presets.hfginv()
  assert hf.stepwise == objectives.Stepwise() and hf.iterations == 15_000
  # Once ResNet-34's 110 tensors' layer set stops growing (4000) and the BatchNorm prior is on (5000).
  assert attacks.track_from(hf, 110) == 5000
  assert hf.priors == (priors.Prior(tv, 1e-2, 3000), priors.Prior(bn_hfginv, 1e-4, 5000))
  small = attacks.rescaled(hf, 3000)
  assert small.priors == (priors.Prior(tv, 1e-2, 600), priors.Prior(bn_hfginv, 1e-4, 1000))
  assert small.stepwise.period == 100 and attacks.track_from(small, 110) == 1000
  assert small.iterations == 3000
  with pytest.raises(ValueError, match="num_leaves"):
    attacks.track_from(small)
  assert presets.hfginv(3000) == small  # the preset's budget scales its step counts
  gi = presets.gradinversion()
  assert gi.stepwise is None and priors.Prior(bn, 1e-4, 0) in gi.priors
  with pytest.raises(ValueError, match="iterations"):
    attacks.rescaled(hf, 0)
  # The command line's --iterations scales the preset's steps; explicit --priors are taken as given.
  from gradjax.run import config
  assert config.get_attack(
      config.from_options({"attack.preset": "hfginv", "attack.iterations": 3000})) == small
  assert config.get_attack(
      config.from_options(
          {"attack.preset": "hfginv", "attack.iterations": 3000,
           "attack.priors": "tv:0.1:7"})).priors == (priors.Prior(tv, 0.1, 7),)
  ig = presets.inverting_gradients()
  assert config.get_attack(config.from_options({"attack.preset": "inverting_gradients", "attack.iterations": 100})) == \
      dataclasses.replace(ig, iterations=100)


@pytest.mark.slow
def test_readme_batch_example_runs(capsys):
  """The README's batch snippet (section "Batches on a trained BatchNorm network"), 3 iterations, on
  resnet8 for its resnet20 (the same code; half the compilation): HFGInv runs on a BatchNorm network,
  its labels printed, its reconstruction inside the box."""
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
  section = readme[readme.index("### Batches on a trained BatchNorm network"):]
  start = section.index("```python") + len("```python")
  code = section[start:section.index("```", start)]
  assert "presets.hfginv(3000)" in code and '"resnet20"' in code
  code = code.replace("3000)", "3)").replace('"resnet20"', '"resnet8"')
  scope = {}
  exec(compile(code, "README.md", "exec"), scope)
  printed = capsys.readouterr().out
  assert printed.startswith("[") and len(printed.split("]")[0].split()) == 8
  rec = scope["rec"]
  assert rec.x.shape == scope["x"].shape and np.isfinite(rec.loss) and int(rec.iterations[0]) == 3
  assert float(rec.x.min()) >= 0.0 and float(rec.x.max()) <= 1.0  # the box


@pytest.mark.slow
def test_train_and_batch_table_programs(tmp_path):
  """train.py --config.client.train_mode=True on the CIFAR-10 training JPEGs, then batch_table.py on that checkpoint:
  the printed label accuracies and PSNRs recomputed from what the program saved (scikit-image PSNR
  of the saved reconstructions, order-free label accuracy of the saved labels)."""
  import json
  import os
  import subprocess
  import sys

  import skimage.metrics

  from gradjax import checkpoint, data, metrics
  if data.default_data_dir() is None:
    pytest.skip("no shared data folder")
  from test_cli import run_in_one_process  # a command's runs in one process
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = lambda name, *args: subprocess.run(
      [sys.executable, "-m", "gradjax", name.removesuffix(".py").replace("_", "-"), *args],
      capture_output=True, text=True, env=env, timeout=600)
  train_dir, table_dir = tmp_path / "train", tmp_path / "table"
  proc, bad = run_in_one_process([(["gradjax", "train", *args], tmp_path) for args in (
      ["--model=resnet8", "--config.model.conv=im2col", "--dataset=cifar10_train", "--config.training.train_count=64",
       "--config.training.test_dataset=cifar10", "--config.training.test_count=32", "--config.client.train_mode=True",
       "--batch_size=32", "--epochs=1", f"--output_dir={train_dir}"],
      ["--config.client.train_mode=True", "--client=fedavg", f"--output_dir={tmp_path / 'bad'}"])])
  assert proc.returncode == 0, proc.stderr[-2000:]
  ckpt = train_dir / "epoch_1.npz"
  variables, meta = checkpoint.load(ckpt)
  assert meta["train_mode"] and meta["test_dataset"] == "cifar10"
  first = variables["batch_stats"]["BatchNorm_0"]["mean"]
  assert np.any(np.asarray(first) != 0)  # running statistics were trained
  assert_one_line_error(bad, "--config.client.train_mode=True is for --client=fedsgd")
  proc = run("batch_table.py", f"--checkpoint={ckpt}", "--count=2", "--batch_size=4",
             "--config.sampling.classes_per_batch=2", "--start=20", "--config.sampling.pool=100", "--config.attack.aux=8", "--iterations=3",
             "--variants=tv,hfginv", f"--output_dir={table_dir}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads((table_dir / "results.json").read_text())
  images = data.load("cifar10", indices=range(120))  # result["batches"] holds test-image indices
  assert (result["start"], result["pool"], result["aux"]) == (20, 100, 8)
  assert all(20 <= i < 120 for idx in result["batches"] for i in idx)
  for summary in result["labels"]:
    rows = result["label_rows"][summary["method"]]
    want = [metrics.label_accuracy(r["labels"], images.y[idx]) if "labels" in r else 0.0
            for r, idx in zip(rows, result["batches"])]
    assert summary["accuracy_mean"] == pytest.approx(np.mean(want))
    assert summary["exact"] == sum("labels" in r and sorted(r["labels"]) == sorted(images.y[idx].tolist())
                                   for r, idx in zip(rows, result["batches"]))
    assert [r["truth"] for r in rows] == [sorted(images.y[idx].tolist()) for idx in result["batches"]]
    assert f"| {summary['method']}" in proc.stdout
  from gradjax import lpips
  for summary in result["ablation"]:
    psnr, ssim, lpips_per_batch = [], [], []
    for b, idx in enumerate(result["batches"]):
      rec = np.load(table_dir / "items" / f"{summary['key']}_{b}.npz")["reconstruction"]
      pairs = [(images.x[i].astype(np.float64), r.astype(np.float64)) for i, r in zip(idx, rec)]
      psnr += [skimage.metrics.peak_signal_noise_ratio(g, r, data_range=1) for g, r in pairs]
      ssim += [skimage.metrics.structural_similarity(g, r, data_range=1, channel_axis=-1) for g, r in pairs]
      if lpips.available("alex"):  # AlexNet's LPIPS in NumPy on the batch's images
        from test_lpips import np_lpips
        lpips_per_batch.append(np_lpips(lpips.load("alex"), rec, images.x[idx]).mean())
    if lpips.available("alex"):
      assert summary["lpips_mean"] == pytest.approx(np.mean(lpips_per_batch), rel=2e-4, abs=1e-5)
      assert f"| {summary['lpips_mean']:.3f} |" in proc.stdout
    else:
      assert "lpips_mean" not in summary
    per_batch = np.asarray(psnr).reshape(2, 4).mean(1)  # a row per batch: its images' mean
    assert summary["psnr_mean"] == pytest.approx(per_batch.mean(), rel=1e-5)
    assert summary["psnr_std"] == pytest.approx(per_batch.std(), rel=1e-4, abs=1e-6)
    assert summary["ssim_mean"] == pytest.approx(np.mean(np.asarray(ssim).reshape(2, 4).mean(1)), rel=1e-4)
    assert f"{summary['psnr_mean']:.2f} ± {summary['psnr_std']:.2f}" in proc.stdout
  # One batch of the same table, read back from items/: its row is that batch's alone; and the
  # usage errors (the same process).
  table = ["gradjax", "batch-table"]
  proc, *bad = run_in_one_process([[argv, tmp_path] for argv in (
      [*table, f"--checkpoint={ckpt}", "--count=2", "--batch_size=4", "--config.sampling.classes_per_batch=2",
       "--start=20", "--config.sampling.pool=100", "--config.attack.aux=8", "--iterations=3", "--variants=tv",
       "--batches=1", "--resume", f"--output_dir={table_dir}"],
      [*table, "--count=1", f"--output_dir={tmp_path / 'bad2'}"],
      [*table, f"--checkpoint={ckpt}", "--start=-1", f"--output_dir={tmp_path / 'bad4'}"],
      [*table, f"--checkpoint={ckpt}", "--head_classes=5", f"--output_dir={tmp_path / 'bad3'}"],
      # Items of 3 iterations are not read back as those of 4.
      [*table, f"--checkpoint={ckpt}", "--count=2", "--batch_size=4", "--config.sampling.classes_per_batch=2",
       "--start=20", "--config.sampling.pool=100", "--config.attack.aux=8", "--iterations=4", "--variants=tv",
       "--resume", f"--output_dir={table_dir}"],
      [*table, f"--checkpoint={ckpt}", "--variants=tv", "--bn=0.5", f"--output_dir={tmp_path / 'bad5'}"],
      [*table, f"--checkpoint={ckpt}", "--variants=", f"--output_dir={tmp_path / 'bad6'}"],
      [*table, f"--checkpoint={ckpt}", "--variants=tv", "--config.sampling.pool=100000",
       f"--output_dir={tmp_path / 'bad7'}"])])
  assert proc.returncode == 0, proc.stderr[-2000:]
  part = json.loads((table_dir / "results.json").read_text())
  assert part["attacked"] == [1] and "batches 1 only" in proc.stdout
  tv = next(r for r in result["ablation_rows"]["tv"] if r["batch"] == 1)
  assert [r["batch"] for r in part["ablation_rows"]["tv"]] == [1]
  assert part["ablation"][0]["psnr_mean"] == pytest.approx(tv["psnr"])
  for refused, message in zip(bad, ("--checkpoint is required", "--start must be non-negative",
                                     "--head_classes needs --head=fresh and at least",
                                     "was computed with other settings", "--bn weighs the BN prior",
                                     "--variants: choose from",
                                     "--config.sampling.pool 100000 and --config.attack.aux"), strict=True):
    assert_one_line_error(refused, message)
  assert not any((tmp_path / f"bad{k}").exists() for k in (3, 5, 6, 7))  # a refused table leaves no folder
  assert json.loads((table_dir / "results.json").read_text()) == part  # nor rewrites the earlier one


def test_leaf_positions_follow_the_call_order_not_the_sorted_keys():
  """A created model's params come back from jit with sorted keys ("BasicBlock_0" before the stem's
  "Conv_0"); the call order puts the leaves as PyTorch's model.parameters() lists them."""
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  order = distances.module_call_order(model.apply_fn, model.variables, jnp.zeros((1, 8, 8, 3)))
  positions = distances.leaf_positions(model.variables["params"], order)
  flat = sorted((int(v), "/".join(str(k.key) for k in path))
                for path, v in jax.tree_util.tree_flatten_with_path(positions)[0])
  names = [name for _, name in flat]
  want = ["Conv_0/kernel", "BatchNorm_0/scale", "BatchNorm_0/bias"]
  for b, shortcut in ((0, False), (1, True), (2, True)):
    for k in (0, 1) + ((2,) if shortcut else ()):
      want += [f"BasicBlock_{b}/Conv_{k}/kernel", f"BasicBlock_{b}/BatchNorm_{k}/scale",
               f"BasicBlock_{b}/BatchNorm_{k}/bias"]
  assert names == want + ["head/kernel", "head/bias"]
  assert [v for v, _ in flat] == list(range(len(want) + 2))


def test_depth_weights_follow_the_call_order():
  """SAPAG's Q_l = 1/(l+1) over modules in the order the model calls them (stem first, head last),
  not in the jit-sorted key order, and the attack builds them that way for a ResNet."""
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  order = distances.module_call_order(model.apply_fn, model.variables, jnp.zeros((1, 8, 8, 3)))
  modules = ["Conv_0", "BatchNorm_0"]
  for b, shortcut in ((0, False), (1, True), (2, True)):
    for k in (0, 1) + ((2,) if shortcut else ()):
      modules += [f"BasicBlock_{b}/Conv_{k}", f"BasicBlock_{b}/BatchNorm_{k}"]
  modules.append("head")
  want = {m: 1.0 / (i + 1) for i, m in enumerate(modules)}
  for q in (distances.depth_weights(model.variables["params"], order=order),
            attacks.layer_weights(presets.sapag(), clients.Observation(
                gradient=model.variables["params"], variables=model.variables), order)):
    got = {"/".join(str(k.key) for k in path[:-1]): float(v)
           for path, v in jax.tree_util.tree_flatten_with_path(q)[0]}
    assert got == pytest.approx(want)
  sorted_q = distances.depth_weights(model.variables["params"])  # the sorted keys: the stem is not first
  assert float(sorted_q["Conv_0"]["kernel"]) != 1.0


def test_reconstruct_weights_layers_in_call_order(monkeypatch):
  model = models.create("resnet8", jax.random.key(0), conv="xla", input_shape=(8, 8, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, jnp.full((1, 8, 8, 3), 0.5), jnp.array([1]))
  seen = {}

  def stop(solver, init, data, **kwargs):
    seen["weights"] = data.weights
    raise RuntimeError("stop")

  monkeypatch.setattr(attacks.driver, "run", stop)
  with pytest.raises(RuntimeError, match="stop"):
    attacks.reconstruct(presets.sapag(), model.apply_fn, obs, jax.random.key(1),
                        input_shape=(8, 8, 3))
  assert float(seen["weights"]["Conv_0"]["kernel"]) == 1.0
  assert float(seen["weights"]["BatchNorm_0"]["scale"]) == 0.5
  assert float(seen["weights"]["head"]["kernel"]) == pytest.approx(1 / 19)  # 18 modules before it


@pytest.mark.slow
def test_pipeline_labels_hfginv_reads_the_images_after_the_batch():
  """--labels=hfginv: the profile from --config.attack.aux images after the batch, the labels HFGInv's, then the
  attack with them known; too few images is a one-line error."""
  from gradjax import data, labels
  from gradjax.run import config, pipeline
  cfg = config.from_options({
      "model.name": "mlp-64", "data.image_size": 16, "data.batch_size": 2, "data.index": 3, "attack.aux": 4,
      "attack.label_source": "hfginv", "attack.iterations": 2, "output.lpips": "none"
  })
  results, _ = pipeline.run(cfg)
  batch = data.load("skimage", indices=range(3, 5), image_size=(16, 16))
  aux = data.load("skimage", indices=range(5, 9), image_size=(16, 16))
  keys = pipeline.experiment_keys(cfg.seed, cfg.data.index)
  key_model = keys.model
  model = models.create("mlp-64", key_model, input_shape=batch.x.shape[1:], num_classes=batch.num_classes)
  obs = clients.fedsgd(model.apply_fn, model.variables, jnp.asarray(batch.x), jnp.asarray(batch.y))
  want = labels.hfginv(obs, labels.feature_profile(model.apply_fn, model.variables, jnp.asarray(aux.x)),
                       keys.server)
  assert sorted(results["labels_reconstructed"]) == sorted(np.asarray(want).tolist())
  assert results["config"]["attack"]["label_source"] == "hfginv"
  with pytest.raises(ValueError, match="--config.attack.aux 40 images after the batch"):
    pipeline.run(config.replace(cfg, {"attack.aux": 40}))
