"""Tests for gradjax.labels: iDLG label inference on fresh random DLG LeNets and real photos.

The reference is the client's true label (Zhao et al. report 100 % for iDLG on LeNet).
"""

import dataclasses
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, data, labels, metrics, models, objectives
from gradjax.observation import Observation


@pytest.mark.parametrize("num_classes,runs", [(10, 30), (100, 10)])
@pytest.mark.slow
def test_idlg_recovers_label_on_fresh_lenets(photos, num_classes, runs):
  rng = np.random.default_rng(num_classes)
  keys = jax.random.split(jax.random.key(num_classes), runs)
  # Arbitrary labels (photos have no classes): every class 3 times for 10 classes, 10 distinct of 100.
  ys = rng.permutation(np.repeat(np.arange(10), 3)) if num_classes == 10 else rng.choice(100, runs, False)
  true, found = [], []
  for i in range(runs):
    model = models.create("lenet_zhu", keys[i], num_classes=num_classes)  # U(-0.5, 0.5), DLG's init
    image = photos[i % len(photos)][None]
    y = int(ys[i])
    obs = clients.fedsgd(model.apply_fn, model.variables, image, np.array([y]))
    label = labels.idlg(obs)
    assert label.shape == (1,) and jnp.issubdtype(label.dtype, jnp.integer)
    true.append(y)
    found.append(int(label[0]))
  assert found == true


def test_idlg_reads_last_layer_sign(photos):
  """With an observed head gradient built by hand, iDLG returns the one column with a negative sum."""
  model = models.create("lenet_zhu", jax.random.key(11))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([4]))
  g = jax.tree.map(np.array, obs.gradient)
  a = np.abs(np.random.default_rng(0).normal(size=768))       # non-negative features
  p = np.full(10, 0.1)
  t = np.eye(10)[6]
  g["head"]["kernel"] = np.outer(a, p - t).astype(np.float32)  # dL/dW[j, c] = a_j (p_c - y_c)
  assert int(labels.idlg(dataclasses.replace(obs, gradient=g))[0]) == 6
  np.testing.assert_array_equal(labels.last_layer_gradient(g), g["head"]["kernel"])


def test_idlg_reads_the_features_sign_from_the_bias(photos):
  """Head inputs whose sum is negative flip every column's sign: with the bias gradient p − y the
  true class is the one positive column (by hand), and a tanh LeNet's labels come out right on every
  photo (iDLG's argmin of the column sums named other classes on some of them), two classes too;
  a bias gradient that does not fit the columns (noise) leaves iDLG's rule."""
  model = models.create("lenet_zhu", jax.random.key(11))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([4]))
  g = jax.tree.map(np.array, obs.gradient)
  a = -np.abs(np.random.default_rng(0).normal(size=768))      # non-positive features
  beta = np.full(10, 0.1) - np.eye(10)[6]
  g["head"]["kernel"] = np.outer(a, beta).astype(np.float32)
  g["head"]["bias"] = beta.astype(np.float32)
  assert int(labels.idlg(dataclasses.replace(obs, gradient=g))[0]) == 6
  g["head"]["bias"] = np.random.default_rng(1).normal(size=10).astype(np.float32)  # unrelated
  assert int(labels.idlg(dataclasses.replace(obs, gradient=g))[0]) == int(np.argmin(
      g["head"]["kernel"].sum(axis=0)))
  for num_classes in (10, 2):
    tanh = models.create("lenet_zhu", jax.random.key(3), act="tanh", num_classes=num_classes)
    wrong_by_argmin = 0
    for i in range(10):
      y = i % num_classes
      o = clients.fedsgd(tanh.apply_fn, tanh.variables, photos[i:i + 1], np.array([y]))
      assert int(labels.idlg(o)[0]) == y
      wrong_by_argmin += int(np.argmin(np.sum(o.gradient["head"]["kernel"], axis=0))) != y
    assert wrong_by_argmin > 0  # the features' sum was negative somewhere: the case this covers


@pytest.fixture(scope="module")
def single(photos):
  model = models.create("lenet_zhu", jax.random.key(12))
  return model, clients.fedsgd(model.apply_fn, model.variables, photos[7:8], np.array([5]))


def test_idlg_custom_path(single):
  _, obs = single
  g = dict(obs.gradient)
  g["classifier"] = g.pop("head")
  renamed = dataclasses.replace(obs, gradient=g)
  assert int(labels.idlg(renamed, path=("classifier", "kernel"))[0]) == 5
  with pytest.raises(ValueError):
    labels.idlg(renamed)  # No 'head' any more.


def test_idlg_rejects_batches(single, photos):
  model, _ = single
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))
  with pytest.raises(ValueError):
    labels.idlg(obs)


@pytest.mark.parametrize("path", [("head", "bias"), ("head", "weight"), ("Conv_0", "kernel"), ("head",)])
def test_idlg_rejects_bad_path(single, path):
  _, obs = single
  with pytest.raises(ValueError):
    labels.idlg(obs, path=path)



# --- Batch label inference: negative_bias, yin, llg, bias_counts -------------------------------------

BATCH = 8
UNIQUE_METHODS = ("negative_bias", "yin")
DUPLICATE_METHODS = ("llg", "bias_counts")
# Models on which every method's assumptions hold for batches of 8: non-negative features (ReLU or
# sigmoid), a biased head, and 100 classes, so the untrained model's mean probabilities stay << 1/8.
FRIENDLY = [("mlp", None), ("lenet_zhu", "xavier_normal")]


class Batch(NamedTuple):
  model: models.Model
  x: np.ndarray
  y: np.ndarray
  obs: Observation


def _batches(images, name, init, num_classes, *, duplicates, count=6, seed=0):
  """``count`` client batches of 8 real images, each attacked on a fresh untrained model.

  Without duplicates the 8 labels are distinct; with duplicates they are drawn with replacement from
  3 classes, so at most 3 of the 8 labels are distinct and some class repeats.
  """
  rng = np.random.default_rng(seed)
  out = []
  for b in range(count):
    idx = rng.choice(len(images), BATCH, replace=False)
    if duplicates:
      y = rng.choice(rng.choice(num_classes, 3, replace=False), BATCH)
    else:
      y = rng.choice(num_classes, BATCH, replace=False)
    model = models.create(name, jax.random.key(1000 * seed + b), num_classes=num_classes, init=init)
    x = images[idx]
    out.append(Batch(model, x, y, clients.fedsgd(model.apply_fn, model.variables, x, y)))
  return out


def _sorted(a):
  return sorted(np.asarray(a).tolist())


def _hand_obs(n, kernel=None, bias=None):
  """An Observation whose head gradient is given by hand (kernel (features, K) and/or bias (K,))."""
  head = {}
  if kernel is not None:
    head["kernel"] = jnp.asarray(kernel, jnp.float32)
  if bias is not None:
    head["bias"] = jnp.asarray(bias, jnp.float32)
  return Observation(gradient={"head": head}, variables={"params": jax.tree.map(jnp.zeros_like, {"head": head})},
                     num_samples=n)


@pytest.mark.parametrize("name,init", FRIENDLY)
def test_every_method_recovers_unique_label_batches(photos, name, init):
  for batch in _batches(photos, name, init, 100, duplicates=False, count=4, seed=1):
    for method in UNIQUE_METHODS + DUPLICATE_METHODS:
      got = labels.infer(batch.obs, method)
      assert got.shape == (BATCH,) and jnp.issubdtype(got.dtype, jnp.integer), method
      assert _sorted(got) == _sorted(batch.y), (method, _sorted(batch.y), _sorted(got))


@pytest.mark.parametrize("name,init,num_classes", [("mlp", None, 10), *[(n, i, 100) for n, i in FRIENDLY]])
def test_duplicate_aware_methods_beat_unique_methods_on_duplicates(photos, name, init, num_classes):
  acc = {m: [] for m in UNIQUE_METHODS + DUPLICATE_METHODS}
  for batch in _batches(photos, name, init, num_classes, duplicates=True, seed=3):
    distinct = len(set(batch.y.tolist()))
    assert distinct < BATCH
    for method in acc:
      got = np.asarray(labels.infer(batch.obs, method))
      acc[method].append(metrics.label_accuracy(got, batch.y))
      if method in UNIQUE_METHODS:  # Distinct labels: at most one hit per distinct true class.
        assert len(set(got.tolist())) == BATCH and acc[method][-1] <= distinct / BATCH
  best_unique = max(np.mean(acc[m]) for m in UNIQUE_METHODS)
  for method in DUPLICATE_METHODS:
    assert np.mean(acc[method]) >= best_unique + 0.3, {m: np.mean(a) for m, a in acc.items()}
  if num_classes == 100:
    # Near-uniform p (1/K ≪ 1/N): both rules are nearly always exact. They miss a repeat when p̄_c strays
    # from 1/K by over 1/(2N) (bias_counts) or when the examples' feature sums differ a lot (LLG uses one
    # impact m for every example).
    for method in DUPLICATE_METHODS:
      assert np.mean(acc[method]) >= 0.95, acc


def test_bias_counts_exact_with_true_mean_probabilities(photos, log_softmax_reference):
  """k_c = N (p̄_c − ∂L/∂b_c) is exact given p̄, here computed by NumPy from the model's logits.

  On DLG's LeNet with its U(-0.5, 0.5) init the softmax is far from uniform, so the rules that
  assume p ≈ 1/K fail there (checked), and only the known p̄ recovers the counts.
  """
  uniform_exact = []
  for name in ("lenet_zhu", "mlp"):
    for batch in _batches(photos, name, None, 10, duplicates=True, count=4, seed=2):
      logits = np.asarray(jax.jit(batch.model.apply_fn)(batch.model.variables, batch.x), np.float64)
      p_bar = np.exp(log_softmax_reference(logits)).mean(axis=0)
      got = labels.bias_counts(batch.obs, probs=p_bar)
      assert got.shape == (BATCH,) and _sorted(got) == _sorted(batch.y), name
      if name == "lenet_zhu":
        uniform_exact.append(_sorted(labels.bias_counts(batch.obs)) == _sorted(batch.y))
        assert np.max(p_bar) > 0.3  # far from 1/K
  assert not all(uniform_exact)


def test_head_bias_gradient_and_counts_match_numpy_float64(photos, log_softmax_reference):
  """∂L/∂b = mean_n (p_n − y_n) against a NumPy forward pass, and N (p̄ − ∂L/∂b) = counts, in float64."""
  y = np.array([3, 3, 3, 0, 7, 7, 1, 3])
  x = photos[2:10].astype(np.float64)
  with jax.enable_x64(True):
    model = models.create("mlp", jax.random.key(7), num_classes=10, param_dtype=jnp.float64)
    obs = clients.fedsgd(model.apply_fn, model.variables, jnp.asarray(x), jnp.asarray(y))
    params = jax.tree.map(np.asarray, model.variables["params"])
    h = np.maximum(x.reshape(BATCH, -1) @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"], 0)
    z = h @ params["head"]["kernel"] + params["head"]["bias"]
    p = np.exp(log_softmax_reference(z))
    gb = np.asarray(labels.last_layer_bias_gradient(obs.gradient))
    np.testing.assert_allclose(gb, np.mean(p - np.eye(10)[y], axis=0), rtol=1e-10, atol=1e-15)
    counts = BATCH * (p.mean(axis=0) - gb)
    np.testing.assert_allclose(counts, np.bincount(y, minlength=10), atol=1e-12)
    assert _sorted(labels.bias_counts(obs, probs=p.mean(axis=0))) == _sorted(y)


@pytest.mark.skipif(data.default_data_dir() is None, reason="no data folder (GRADJAX_DATA_DIR or ../shared/data)")
def test_llg_on_cifar10_duplicate_batches_with_dlg_lenet():
  """CIFAR-10 test images, 10 classes, DLG's LeNet (U(-0.5, 0.5)): LLG beats the unique-label rules."""
  ds = data.load("cifar10", indices=range(200))
  acc = {m: [] for m in ("negative_bias", "yin", "llg")}
  for batch in _batches(ds.x, "lenet_zhu", None, 10, duplicates=True, count=6, seed=4):
    for method in acc:
      acc[method].append(metrics.label_accuracy(np.asarray(labels.infer(batch.obs, method)), batch.y))
  assert np.mean(acc["llg"]) >= max(np.mean(acc["negative_bias"]), np.mean(acc["yin"])) + 0.2, acc


# --- The rules on hand-built head gradients -----------------------------------------------------------


def test_negative_bias_fills_and_truncates():
  bias = np.array([0.3, -0.2, 0.1, -0.5, 0.05, 0.2])
  # Two negatives for four slots: then the next most negative classes, none repeated.
  assert labels.negative_bias(_hand_obs(4, bias=bias)).tolist() == [3, 1, 4, 2]
  # Two negatives for one slot: the most negative.
  assert labels.negative_bias(_hand_obs(1, bias=bias)).tolist() == [3]


def test_yin_ranks_classes_by_their_smallest_entry():
  kernel = np.array([[0.1, -0.3, 0.2, 0.0],
                     [0.2, 0.1, -0.1, 0.4],
                     [-0.05, 0.3, 0.1, 0.2]])
  # Column minima: -0.05, -0.3, -0.1, 0.0.
  assert labels.yin(_hand_obs(3, kernel=kernel)).tolist() == [1, 2, 0]
  # The column sums would pick class 3 or 0 before class 2 (sums 0.25, 0.1, 0.2, 0.6): yin does not.
  assert labels.yin(_hand_obs(2, kernel=kernel)).tolist() == [1, 2]


def _head_gradient(a, p, y, num_classes):
  """∂L/∂W = (1/N) Σ_n a_n (p_n − y_n)ᵀ with features a (N, F) and probabilities p (N, K), NumPy."""
  t = np.eye(num_classes)[y]
  return a.T @ (p - t) / len(y)


def test_llg_counts_repeated_labels():
  """Equal feature sums and uniform p: LLG's estimated impact recovers a batch with repeats."""
  rng = np.random.default_rng(0)
  y = np.array([1, 1, 1, 4, 4, 7, 2, 2])
  a = rng.uniform(0, 1, (BATCH, 30))
  a *= 10 / a.sum(axis=1, keepdims=True)  # every feature sum is 10
  kernel = _head_gradient(a, np.full((BATCH, 20), 1 / 20), y, 20)
  got = labels.llg(_hand_obs(BATCH, kernel=kernel))
  assert _sorted(got) == _sorted(y)
  # The unique-label rule loses the repeats.
  assert len(set(labels.yin(_hand_obs(BATCH, kernel=kernel)).tolist())) == BATCH


def test_llg_with_exact_impact_and_offset():
  """Given the true per-example impact −s/N and offset s/K, LLG recovers even a lopsided batch."""
  y = np.array([5, 5, 5, 5, 5, 5, 0, 9])
  a = np.full((BATCH, 4), 2.5)  # feature sum s = 10
  kernel = _head_gradient(a, np.full((BATCH, 10), 0.1), y, 10)
  obs = _hand_obs(BATCH, kernel=kernel)
  got = labels.llg(obs, impact=-10 / BATCH, offset=np.full(10, 1.0))
  assert _sorted(got) == _sorted(y)
  with pytest.raises(ValueError, match="negative"):
    labels.llg(obs, impact=0.5)
  with pytest.raises(ValueError, match="offset"):
    labels.llg(obs, offset=np.zeros(3))
  with pytest.raises(ValueError, match="zero"):
    labels.llg(_hand_obs(BATCH, kernel=np.zeros((4, 10))))


def test_bias_counts_rounds_by_largest_remainder():
  k, n = 5, 8
  uniform = np.full(k, 1 / k)
  # Real-valued counts k_c = N (1/K − ∂L/∂b_c).
  counts = np.array([2.6, 0.3, 3.7, 1.4, 0.0])
  got = labels.bias_counts(_hand_obs(n, bias=uniform - counts / n))
  assert np.bincount(np.asarray(got), minlength=k).tolist() == [3, 0, 4, 1, 0]
  # Negative estimates are clipped and the rest rescaled to N: [0, 4.5, 4] * 8 / 8.5.
  counts = np.array([-0.5, 4.5, 4.0, 0.0, 0.0])
  got = labels.bias_counts(_hand_obs(n, bias=uniform - counts / n))
  assert np.bincount(np.asarray(got), minlength=k).tolist() == [0, 4, 4, 0, 0]
  with pytest.raises(ValueError, match="probs"):
    labels.bias_counts(_hand_obs(n, bias=uniform), probs=np.ones(3) / 3)


# --- Attacker-side estimates (LLG+ / LLG*, Geng et al.) ------------------------------------------------


def test_llg_statistics_match_per_class_gradients(photos):
  model = models.create("lenet_zhu", jax.random.key(21))
  aux = photos[8:12]
  impact, offset = labels.llg_statistics(model.apply_fn, model.variables, aux, BATCH)
  rows = np.stack([np.asarray(labels.last_layer_gradient(clients.fedsgd(
      model.apply_fn, model.variables, aux, np.full(4, c)).gradient)).sum(axis=0) for c in range(10)])
  np.testing.assert_allclose(float(impact), np.mean(np.diag(rows)) / BATCH * 1.1, rtol=1e-5)
  np.testing.assert_allclose(offset, (rows.sum(axis=0) - np.diag(rows)) / 9, rtol=1e-5, atol=1e-7)
  assert impact < 0 and np.all(np.asarray(offset) > 0)  # sigmoid features: absent classes push up


def test_llg_star_counts_repeated_labels_through_the_servers_model(photos):
  """--labels=llg_star (pipeline.llg_star_labels): the multiset of a batch of 8 with repeats, read off
  an untrained LeNet's update with the impact measured on dummy images; attacked as known labels."""
  from gradjax.run import config, pipeline
  y = np.array([1, 1, 3, 3, 3, 5, 7, 7])
  hits = []
  for seed in range(3):
    model = models.create("lenet_zhu", jax.random.key(30 + seed))
    obs = clients.fedsgd(model.apply_fn, model.variables, photos[:8], y)
    got = pipeline.llg_star_labels(model, obs, data.normalization("none"), jax.random.key(seed))
    hits.append(metrics.label_accuracy(np.asarray(got), y))
  assert np.mean(hits) >= 7 / 8, hits
  assert config.get_attack(config.from_options({"attack.preset": "inverting_gradients", "attack.label_source": "llg_star"})).label_source \
      is labels.known


def test_mean_probs_matches_numpy(photos, log_softmax_reference):
  model = models.create("mlp", jax.random.key(22))
  logits = np.asarray(model.apply_fn(model.variables, photos[:5]), np.float64)
  np.testing.assert_allclose(labels.mean_probs(model.apply_fn, model.variables, photos[:5]),
                             np.exp(log_softmax_reference(logits)).mean(axis=0), rtol=1e-5)


# --- Registry, dispatcher and errors -------------------------------------------------------------------


def test_registry_and_dispatch(single):
  _, obs = single
  assert tuple(labels.METHODS) == ("idlg", "negative_bias", "yin", "llg", "bias_counts")
  assert labels.infer(obs, "idlg").tolist() == labels.idlg(obs).tolist() == [5]
  for method in labels.METHODS:  # Every method handles batch 1; all agree here.
    assert labels.infer(obs, method).tolist() == [5], method
  with pytest.raises(ValueError, match="unknown label method") as e:
    labels.infer(obs, "dlg")
  assert "\n" not in str(e.value)


def test_errors():
  kernel_only = _hand_obs(2, kernel=np.ones((3, 10)))
  for method in (labels.negative_bias, labels.bias_counts):
    with pytest.raises(ValueError, match="bias"):
      method(kernel_only)
  too_many = _hand_obs(12, kernel=np.ones((3, 10)), bias=np.zeros(10))
  for method in (labels.negative_bias, labels.yin):
    with pytest.raises(ValueError, match="batch"):
      method(too_many)
  with pytest.raises(ValueError, match="M, H, W, C"):
    labels.mean_probs(lambda v, x, t: x, {}, np.zeros((3, 4)))
  # NaN would read as confident labels; probabilities that are none would give counts anyway.
  nan = _hand_obs(2, kernel=np.full((3, 10), np.nan), bias=np.full(10, np.nan))
  for method in (labels.negative_bias, labels.yin, labels.llg, labels.bias_counts):
    with pytest.raises(ValueError, match="contains NaN or inf"):
      method(nan)
  fine = _hand_obs(2, kernel=np.ones((3, 10)), bias=np.zeros(10))
  for probs in (np.full(10, np.nan), np.full(10, 0.5), np.eye(10)[0] * 2 - 0.5):
    with pytest.raises(ValueError, match="probs must be class probabilities"):
      labels.bias_counts(fine, probs=probs)


# --- HFGInv: counts by an evolutionary search ----------------------------------------------------------


def _profile_case(rng, y, num_classes=10, features=64, aux=40, noise=0.05):
  """A trained-model case built by hand: every image's features are one sorted profile in a random
  order (times 1 ± noise), the model gives 0.9 + 0.01 to the true class and 0.01 to the others."""
  prof = np.sort(rng.gamma(2.0, 0.5, features))
  draw = lambda m: np.stack([rng.permutation(prof) * (1 + noise * rng.normal(size=features))
                             for _ in range(m)])
  n = len(y)
  onehot = np.eye(num_classes)[y]
  kernel = draw(n).T @ (0.9 * onehot + 0.01 - onehot) / n  # ∂L/∂W = (1/N) Σ_n a_n (p_n − y_n)ᵀ
  return _hand_obs(n, kernel=kernel), draw(aux)


def _numpy_profile(features, positions):
  s = np.sort(np.asarray(features, np.float64), axis=1)
  mean = s.mean(axis=0)
  with np.errstate(divide="ignore", invalid="ignore"):  # ReLU features that are always 0
    cv = np.where(mean > 0, s.std(axis=0, ddof=1) / mean, np.inf)
  return mean, np.argsort(cv, kind="stable")[:positions]


@pytest.mark.slow
def test_hfginv_finds_known_counts_with_duplicates():
  rng = np.random.default_rng(0)
  for trial in range(6):
    y = rng.choice(rng.choice(10, 3, replace=False), 8)  # 8 labels from 3 classes: repeats
    obs, aux = _profile_case(rng, y)
    mean, positions = _numpy_profile(aux, 20)
    profile = labels.FeatureProfile(jnp.asarray(mean, jnp.float32), jnp.asarray(positions))
    got = np.asarray(labels.hfginv(obs, profile, jax.random.key(trial)))
    assert got.tolist() == sorted(y.tolist()), trial


@pytest.mark.slow
def test_evolve_counts_reaches_the_brute_force_optimum():
  """On random targets the search ends at the best of all count vectors (enumerated in NumPy)."""
  rng = np.random.default_rng(1)
  n, k, p = 9, 6, 5
  candidates = np.array([True, False, True, True, False, True])
  c = np.flatnonzero(candidates)
  for trial in range(3):
    target = np.where(candidates[:, None], rng.uniform(0.1, 1.0, (k, p)), 0.0)
    values = rng.uniform(0.5, 1.5, p)
    best = -np.inf
    for split in itertools.product(range(1, n + 1), repeat=len(c)):
      if sum(split) != n:
        continue
      v = np.zeros((k, p))
      v[c] = np.asarray(split)[:, None] / n * values
      best = max(best, float(np.sum(v * target) / (np.linalg.norm(v) * np.linalg.norm(target))))
    counts, fit = labels.evolve_counts(jax.random.key(trial), jnp.asarray(target, jnp.float32),
                                       jnp.asarray(values, jnp.float32), jnp.asarray(candidates), n=n)
    counts = np.asarray(counts)
    assert counts.sum() == n and np.all(counts[c] >= 1) and np.all(counts[~candidates] == 0)
    assert float(fit) == pytest.approx(best, rel=1e-5)


@pytest.mark.slow
def test_feature_profile_matches_numpy(photos):
  model = models.create("convnet-4", jax.random.key(0), input_shape=photos.shape[1:], conv="xla")
  x = photos[:6]
  feats = objectives.head_input(model.apply_fn, model.variables, x)
  # The head's input, independently: the head applied to it gives the logits.
  head = model.variables["params"]["head"]
  np.testing.assert_allclose(np.asarray(feats) @ np.asarray(head["kernel"]) + np.asarray(head["bias"]),
                             jax.jit(model.apply_fn)(model.variables, x), rtol=1e-4, atol=1e-5)
  profile = labels.feature_profile(model.apply_fn, model.variables, x, positions=7)
  mean, positions = _numpy_profile(feats, 7)
  np.testing.assert_allclose(np.asarray(profile.mean), mean, rtol=1e-5)
  assert np.asarray(profile.positions).tolist() == positions.tolist()
  with pytest.raises(ValueError, match="M ≥ 2"):
    labels.feature_profile(model.apply_fn, model.variables, x[:1])
  with pytest.raises(ValueError, match="positions"):
    labels.feature_profile(model.apply_fn, model.variables, x, positions=10_000)
  with pytest.raises(ValueError, match="profile has"):
    labels.hfginv(_hand_obs(2, kernel=np.ones((3, 10))), profile, jax.random.key(0))
