"""Tests for gradjax.defenses, each defense against an independent NumPy reference.

The gradients are a real FedSGD observation: DLG's LeNet on one 16x16 scikit-image photo. Noise is
checked statistically with tolerances of 5 standard errors of the estimator at the sample size used.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, data, defenses, models
from gradjax.observation import Observation

SPECS = ["none", "gaussian:1e-3", "laplacian:1e-2", "clip:1.0", "clip:0.5:global", "dp:1.0:0.1",
         "dp:0.5:0.2:laplacian:global", "prune:0.3", "prune:0.5:global", "fp16", "bf16", "int8",
         "int8:global", "clip:1.0,gaussian:1e-4"]


@pytest.fixture(scope="module")
def obs():
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(16, 16, 3))
  batch = data.load("skimage", indices=[0], image_size=(16, 16))
  return clients.fedsgd(model.apply_fn, model.variables, batch.x, batch.y)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def with_gradient(obs, gradient):
  return obs.replace(gradient=jax.tree.map(jnp.asarray, gradient))


def noise_of(defense, obs, key):
  """Defended minus clean gradient, all leaves, in float64."""
  out = defense.apply(obs, key)
  return [np.asarray(a, np.float64) - np.asarray(b, np.float64)
          for a, b in zip(leaves(out.gradient), leaves(obs.gradient))]


def head_noise(defense, obs, num_keys=16):
  """Noise on the head kernel (1920 entries) for ``num_keys`` keys: 30720 i.i.d. samples."""
  keys = jax.random.split(jax.random.key(42), num_keys)
  out = jax.jit(jax.vmap(lambda k: defense.apply(obs, k).gradient["head"]["kernel"]))(keys)
  return (np.asarray(out, np.float64) - np.asarray(obs.gradient["head"]["kernel"], np.float64)).ravel()


def kurtosis(x):
  x = x - x.mean()
  return np.mean(x ** 4) / np.mean(x ** 2) ** 2


# --- common contract ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_structure_dtypes_and_jit(obs, spec):
  defense = defenses.parse(spec)
  key = jax.random.key(3)
  out = defense.apply(obs, key)
  assert jax.tree.structure(out.gradient) == jax.tree.structure(obs.gradient)
  for a, b in zip(jax.tree.leaves(out.gradient), jax.tree.leaves(obs.gradient)):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.all(np.isfinite(np.asarray(a)))
  # Only the gradient changes.
  assert out.variables is obs.variables and out.num_samples == obs.num_samples
  assert out.threat_model == obs.threat_model
  for a, b in zip(leaves(out.gradient), leaves(defense(obs, key).gradient)):  # __call__ is apply
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spec", ["dp:0.5:0.2:laplacian:global", "prune:0.3", "int8",
                                  "clip:1.0,gaussian:1e-4"])
def test_jit(obs, spec):
  defense = defenses.parse(spec)
  key = jax.random.key(3)
  eager, jitted = defense.apply(obs, key), jax.jit(defense.apply)(obs, key)
  for a, b in zip(leaves(eager.gradient), leaves(jitted.gradient)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # XLA may fuse differently: ulps


@pytest.mark.parametrize("spec", SPECS[1:-1])
def test_dtypes_kept_for_float64_and_bfloat16_leaves(spec):
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    tree = {"a": jnp.asarray(rng.normal(0, 1, (6, 5)), jnp.float64),
            "b": jnp.asarray(rng.normal(0, 1, (7,)), jnp.bfloat16),
            "c": jnp.asarray(rng.normal(0, 1, (3, 4)), jnp.float32)}
    o = Observation(gradient=tree, variables={"params": tree})
    out = defenses.parse(spec).apply(o, jax.random.key(0))
    for k, leaf in tree.items():
      assert out.gradient[k].dtype == leaf.dtype and out.gradient[k].shape == leaf.shape


def test_identity_and_deterministic_defenses_need_no_key(obs):
  for spec in ["none", "clip:1.0", "prune:0.3", "fp16", "bf16", "int8"]:
    defenses.parse(spec).apply(obs)  # no key
  assert defenses.identity().apply(obs) is obs
  for spec in ["gaussian:1e-3", "laplacian:1e-3", "dp:1.0:0.1", "clip:1.0,gaussian:1e-4"]:
    with pytest.raises(ValueError, match="random"):
      defenses.parse(spec).apply(obs)
  # Noise of variance 0 draws nothing: dp(C, 0) is clip(C), without a key.
  assert defenses.gaussian_noise(0.0).apply(obs) is obs
  for a, b in zip(jax.tree.leaves(defenses.dp(0.5, 0.0).apply(obs).gradient),
                  jax.tree.leaves(defenses.clip(0.5).apply(obs).gradient)):
    np.testing.assert_array_equal(a, b)


# --- noise ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [defenses.gaussian_noise, defenses.laplacian_noise])
@pytest.mark.parametrize("variance", [1e-4, 1e-2])
def test_noise_mean_and_variance(obs, make, variance):
  noise = noise_of(make(variance), obs, jax.random.key(1))[-1]  # head kernel: last in sorted-key order
  assert noise.shape == (192, 10)
  n = noise.size
  # Mean: standard error sqrt(v / n). Variance: standard error v · sqrt((κ − 1) / n), κ = 3 or 6.
  assert abs(noise.mean()) < 5 * math.sqrt(variance / n)
  kappa = 3.0 if make is defenses.gaussian_noise else 6.0
  np.testing.assert_allclose(noise.var(), variance, rtol=5 * math.sqrt((kappa - 1) / n))


def test_noise_on_every_leaf_with_the_requested_variance(obs):
  variance = 1e-2
  noise = np.concatenate([x.ravel() for x in noise_of(defenses.gaussian_noise(variance), obs,
                                                      jax.random.key(5))])
  assert noise.size == sum(x.size for x in leaves(obs.gradient))
  assert np.all(noise != 0)
  np.testing.assert_allclose(noise.var(), variance, rtol=5 * math.sqrt(2 / noise.size))


def test_laplace_kurtosis_and_scale(obs):
  variance = 1e-2
  gauss = head_noise(defenses.gaussian_noise(variance), obs)
  lap = head_noise(defenses.laplacian_noise(variance), obs)
  n = gauss.size
  # Standard error of the sample kurtosis: sqrt(24 / n) for a Gaussian, sqrt(1188 / n) for a Laplace.
  assert abs(kurtosis(gauss) - 3.0) < 5 * math.sqrt(24 / n)
  assert abs(kurtosis(lap) - 6.0) < 5 * math.sqrt(1188 / n)
  # Scale b = sqrt(v / 2): E|ε| = b for Laplace(0, b), vs sqrt(2 v / π) for the Gaussian.
  b = math.sqrt(variance / 2)
  np.testing.assert_allclose(np.abs(lap).mean(), b, rtol=5 * math.sqrt(1 / n))
  np.testing.assert_allclose(np.abs(gauss).mean(), math.sqrt(2 * variance / math.pi),
                             rtol=5 * math.sqrt((math.pi / 2 - 1) / n))


@pytest.mark.parametrize("spec", ["gaussian:1e-3", "laplacian:1e-3", "dp:1.0:0.1"])
def test_noise_keys(obs, spec):
  defense = defenses.parse(spec)
  a = leaves(defense.apply(obs, jax.random.key(1)).gradient)
  b = leaves(defense.apply(obs, jax.random.key(1)).gradient)
  c = leaves(defense.apply(obs, jax.random.key(2)).gradient)
  for x, y, z in zip(a, b, c):
    np.testing.assert_array_equal(x, y)
    assert np.mean(x != z) > 0.99
  # Leaves get independent noise: Conv_1 and Conv_2 kernels have the same shape, uncorrelated noise.
  before_noise = defenses.clip(1.0).apply(obs) if spec.startswith("dp") else obs
  noise = [np.asarray(a, np.float64) - np.asarray(b, np.float64)
           for a, b in zip(a, leaves(before_noise.gradient))]
  conv1, conv2 = noise[3], noise[5]
  assert conv1.shape == conv2.shape == (5, 5, 12, 12)
  assert abs(np.corrcoef(conv1.ravel(), conv2.ravel())[0, 1]) < 5 / math.sqrt(conv1.size)


def test_zero_variance_is_identity(obs):
  for make in (defenses.gaussian_noise, defenses.laplacian_noise):
    out = make(0.0).apply(obs, jax.random.key(0))
    for a, b in zip(leaves(out.gradient), leaves(obs.gradient)):
      np.testing.assert_array_equal(a, b)


# --- clipping and DP ------------------------------------------------------------------------------


def np_clip(tree_leaves, c, per_layer=True):
  g = [np.asarray(x, np.float64) for x in tree_leaves]
  if per_layer:
    return [x * min(1.0, c / np.sqrt(np.sum(x ** 2))) if np.any(x) else x for x in g]
  total = np.sqrt(sum(np.sum(x ** 2) for x in g))
  return [x * min(1.0, c / total) for x in g]


def test_clip_per_layer_matches_numpy(obs):
  g = leaves(obs.gradient)
  norms = np.array([np.linalg.norm(x.astype(np.float64)) for x in g])
  c = float(np.median(norms))
  assert np.any(norms > c) and np.any(norms < c)
  out = leaves(defenses.clip(c).apply(obs).gradient)
  for got, want, orig, norm in zip(out, np_clip(g, c), g, norms):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
    assert np.linalg.norm(got.astype(np.float64)) <= c * (1 + 1e-6)
    if norm <= c:
      np.testing.assert_array_equal(got, orig)  # leaves under C untouched, bit for bit
    else:
      np.testing.assert_allclose(np.linalg.norm(got.astype(np.float64)), c, rtol=1e-6)


def test_clip_global_matches_numpy(obs):
  g = leaves(obs.gradient)
  total = math.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g))
  c = 0.5 * total
  out = leaves(defenses.clip(c, per_layer=False).apply(obs).gradient)
  for got, want in zip(out, np_clip(g, c, per_layer=False)):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
  np.testing.assert_allclose(math.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in out)), c,
                             rtol=1e-6)
  # A larger bound leaves the whole tree untouched.
  for got, orig in zip(leaves(defenses.clip(2 * total, per_layer=False).apply(obs).gradient), g):
    np.testing.assert_array_equal(got, orig)


def test_clip_is_safe_at_zero(obs):
  zeros = with_gradient(obs, jax.tree.map(jnp.zeros_like, obs.gradient))
  for per_layer in (True, False):
    defense = defenses.clip(1.0, per_layer=per_layer)
    out = defense.apply(zeros)
    assert all(np.all(x == 0) for x in leaves(out.gradient))
    total = lambda o, d=defense: sum(jnp.sum(x) for x in jax.tree.leaves(d.apply(o).gradient))
    grad = jax.grad(total)(zeros)
    assert all(np.all(np.isfinite(x)) for x in leaves(grad.gradient))


def test_dp_with_zero_multiplier_is_clip(obs):
  for per_layer in (True, False):
    for noise in ("gaussian", "laplacian"):
      got = leaves(defenses.dp(0.1, 0.0, per_layer, noise).apply(obs, jax.random.key(0)).gradient)
      want = leaves(defenses.clip(0.1, per_layer).apply(obs).gradient)
      for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("noise,kappa", [("gaussian", 3.0), ("laplacian", 6.0)])
def test_dp_noise_std_is_multiplier_times_norm(obs, noise, kappa):
  c, z = 0.1, 0.5
  defense = defenses.dp(c, z, noise=noise)
  clipped = defenses.clip(c).apply(obs)
  noisy = defense.apply(obs, jax.random.key(9))
  eps = np.concatenate([(np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
                        for a, b in zip(leaves(noisy.gradient), leaves(clipped.gradient))])
  n = eps.size
  np.testing.assert_allclose(eps.var(), (z * c) ** 2, rtol=5 * math.sqrt((kappa - 1) / n))
  assert abs(eps.mean()) < 5 * z * c / math.sqrt(n)


# --- pruning --------------------------------------------------------------------------------------


def np_prune(x, ratio):
  x = np.asarray(x)
  flat = x.ravel().copy()
  k = int(np.floor(round(ratio * flat.size, 9)))
  flat[np.argsort(np.abs(flat), kind="stable")[:k]] = 0
  return flat.reshape(x.shape)


@pytest.mark.parametrize("ratio", [0.3, 0.95])
def test_prune_per_layer_matches_numpy(obs, ratio):
  g = leaves(obs.gradient)
  assert all(np.all(x != 0) for x in g)
  out = leaves(defenses.prune(ratio).apply(obs).gradient)
  for got, orig in zip(out, g):
    np.testing.assert_array_equal(got, np_prune(orig, ratio))
    k = math.floor(ratio * orig.size + 1e-9)
    assert np.sum(got == 0) == k
    kept = got != 0
    np.testing.assert_array_equal(got[kept], orig[kept])  # survivors unchanged
    if 0 < k < orig.size:
      assert np.abs(orig[~kept]).max() <= np.abs(orig[kept]).min()


def test_prune_zero_ratio_is_identity(obs):
  for per_layer in (True, False):
    for got, orig in zip(leaves(defenses.prune(0.0, per_layer).apply(obs).gradient),
                         leaves(obs.gradient)):
      np.testing.assert_array_equal(got, orig)


def test_prune_global_matches_numpy(obs):
  ratio = 0.5
  g = leaves(obs.gradient)  # jax.tree.leaves order (sorted keys), as the documented tie rule
  flat = np_prune(np.concatenate([x.ravel() for x in g]), ratio)
  want = np.split(flat, np.cumsum([x.size for x in g])[:-1])
  out = leaves(defenses.prune(ratio, per_layer=False).apply(obs).gradient)
  for got, w, orig in zip(out, want, g):
    np.testing.assert_array_equal(got.ravel(), w)
  assert sum(np.sum(x == 0) for x in out) == math.floor(ratio * flat.size)
  # One threshold for the tree: the small conv gradients lose more than the head.
  frac = [np.mean(x == 0) for x in out]
  assert frac[1] > frac[-1] + 0.05  # Conv_0 kernel (small entries) vs head kernel


def test_prune_ties_and_rounding(obs):
  tree = {"a": np.array([[1.0, -1.0, 0.5], [-0.5, 2.0, 0.5]], np.float32),
          "b": np.linspace(-1, 1, 100).astype(np.float32)}
  o = with_gradient(obs, tree)
  out = defenses.prune(0.5).apply(o).gradient
  # 3 of 6 pruned: the three |0.5| entries, not the |1| ones.
  np.testing.assert_array_equal(out["a"], [[1.0, -1.0, 0.0], [0.0, 2.0, 0.0]])
  out = defenses.prune(1 / 3).apply(o).gradient
  # 2 of 6 pruned: the first two |0.5| entries in row-major order.
  np.testing.assert_array_equal(out["a"], [[1.0, -1.0, 0.0], [0.0, 2.0, 0.5]])
  np.testing.assert_array_equal(out["a"], np_prune(tree["a"], 1 / 3))
  # 0.29 · 100 = 28.999999999999996 in floating point: 29 entries are pruned, not 28.
  assert np.sum(np.asarray(defenses.prune(0.29).apply(o).gradient["b"]) == 0) == 29


# --- low precision --------------------------------------------------------------------------------


def np_bfloat16(x):
  """float32 -> bfloat16 -> float32 by round-to-nearest-even on the top 16 bits (finite inputs)."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return bits.astype(np.uint32).view(np.float32)


def test_fp16_matches_numpy(obs):
  for spec in ("fp16", "float16"):
    out = leaves(defenses.parse(spec).apply(obs).gradient)
    for got, orig in zip(out, leaves(obs.gradient)):
      assert got.dtype == np.float32
      np.testing.assert_array_equal(got, orig.astype(np.float16).astype(np.float32))
  assert defenses.cast("float16").name == "fp16"


def test_bf16_matches_numpy_round_to_nearest_even(obs):
  out = leaves(defenses.cast("bfloat16").apply(obs).gradient)
  for got, orig in zip(out, leaves(obs.gradient)):
    np.testing.assert_array_equal(got, np_bfloat16(orig))
    assert not np.array_equal(got, orig.astype(np.float16).astype(np.float32))
  # The reference itself: ties go to the even mantissa.
  x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9], np.float32)
  np.testing.assert_array_equal(np_bfloat16(x), [1.0, 1 + 2 ** -6, 1.0])


def np_int8(x, scale=None):
  x = np.asarray(x, np.float32)
  s = np.float32(np.abs(x).max()) / np.float32(127) if scale is None else scale
  if s == 0:
    return np.zeros_like(x), s
  q = np.clip(np.round(x / s), -127, 127)
  return (q * s).astype(np.float32), s


def test_int8_matches_numpy(obs):
  out = leaves(defenses.quantize_int8().apply(obs).gradient)
  for got, orig in zip(out, leaves(obs.gradient)):
    want, s = np_int8(orig)
    np.testing.assert_array_equal(np.round(got / s), np.round(want / s))  # the same integer codes
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert len(np.unique(got)) <= 255
    assert np.abs(got - orig).max() <= s / 2 * (1 + 1e-5)
    np.testing.assert_allclose(np.abs(got).max(), np.abs(orig).max(), rtol=1e-6)


def test_int8_global_scale_and_zero_leaf(obs):
  g = leaves(obs.gradient)
  s = np.float32(max(np.abs(x).max() for x in g)) / np.float32(127)
  out = leaves(defenses.quantize_int8(per_layer=False).apply(obs).gradient)
  for got, orig in zip(out, g):
    want, _ = np_int8(orig, s)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  assert len(np.unique(np.concatenate([x.ravel() for x in out]))) <= 255
  zeros = with_gradient(obs, {"a": np.zeros((3, 4), np.float32), "b": np.ones(2, np.float32)})
  for per_layer in (True, False):
    out = defenses.quantize_int8(per_layer).apply(zeros).gradient
    np.testing.assert_array_equal(out["a"], 0)
    np.testing.assert_array_equal(out["b"], 1)


# --- chain ----------------------------------------------------------------------------------------


def test_chain_order_and_key_splitting(obs):
  clip, noise = defenses.clip(0.05), defenses.gaussian_noise(1e-2)
  key = jax.random.key(7)
  k0, k1 = jax.random.split(key)
  got = leaves(defenses.chain(clip, noise).apply(obs, key).gradient)
  want = leaves(noise.apply(clip.apply(obs, k0), k1).gradient)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  reverse = leaves(defenses.chain(noise, clip).apply(obs, key).gradient)
  assert any(not np.allclose(a, b) for a, b in zip(got, reverse))
  # Noise then clip respects the bound; clip then noise does not.
  assert all(np.linalg.norm(x) <= 0.05 * (1 + 1e-6) for x in reverse)
  assert any(np.linalg.norm(x) > 0.05 for x in got)
  # Keys are split: the same noise twice in a chain draws two different noises.
  twice = defenses.chain(noise, noise).apply(obs, key)
  eps = np.asarray(twice.gradient["head"]["kernel"], np.float64) - obs.gradient["head"]["kernel"]
  np.testing.assert_allclose(eps.var(), 2e-2, rtol=5 * math.sqrt(2 / eps.size))


def test_chain_names_and_empty_chain(obs):
  d = defenses.chain(defenses.clip(1.0), defenses.prune(0.2), defenses.cast("bf16"))
  assert d.name == "clip:1.0,prune:0.2,bf16"
  # Identities leave no trace in the name, which parse reads back.
  for d in (defenses.chain(defenses.identity(), defenses.clip(1.0)), defenses.chain(defenses.identity())):
    assert defenses.parse(d.name).name == d.name in ("clip:1.0", "none")
  assert defenses.chain().apply(obs, jax.random.key(0)) is obs
  with pytest.raises(TypeError, match="Defense"):
    defenses.chain(defenses.clip(1.0), "gaussian:1e-3")



def test_parse_of_a_chains_name_rebuilds_it_keys_included(obs):
  """A chain built by hand, nested or holding identities or one part, and parse of its name draw the
  same noise from the same key (its parts flattened, the identities left out)."""
  noise, laplace, clip = defenses.gaussian_noise(1e-3), defenses.laplacian_noise(1e-3), defenses.clip(0.5)
  key = jax.random.key(3)
  for d in (defenses.chain(noise), defenses.chain(defenses.identity(), noise),
            defenses.chain(defenses.chain(clip, noise), laplace),
            defenses.chain(clip, defenses.chain(defenses.identity(), noise, laplace))):
    for a, b in zip(leaves(d.apply(obs, key).gradient),
                    leaves(defenses.parse(d.name).apply(obs, key).gradient)):
      np.testing.assert_array_equal(a, b)


# --- parse ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,name", [
    ("none", "none"), ("gaussian:1e-3", "gaussian:0.001"), ("laplacian:1e-2", "laplacian:0.01"),
    ("prune:0.3", "prune:0.3"), ("prune:0.3:global", "prune:0.3:global"), ("fp16", "fp16"),
    ("float16", "fp16"), ("BF16", "bf16"), ("bfloat16", "bf16"), ("int8", "int8"),
    ("int8:global", "int8:global"), ("clip:1.0", "clip:1.0"), ("clip:2:global", "clip:2.0:global"),
    ("dp:1.0:0.1", "dp:1.0:0.1"), ("dp:1:0.1:gaussian", "dp:1.0:0.1"),
    ("dp:1:0.1:laplacian", "dp:1.0:0.1:laplacian"), ("dp:1:0.1:global:laplacian",
                                                     "dp:1.0:0.1:laplacian:global"),
    ("clip:1.0,gaussian:1e-4", "clip:1.0,gaussian:0.0001"), (" clip:1 , int8 ", "clip:1.0,int8"),
])
def test_parse_forms(obs, spec, name):
  d = defenses.parse(spec)
  assert isinstance(d, defenses.Defense) and d.name == name
  again = defenses.parse(d.name)
  assert again.name == name
  key = jax.random.key(11)
  for a, b in zip(leaves(d.apply(obs, key).gradient), leaves(again.apply(obs, key).gradient)):
    np.testing.assert_array_equal(a, b)


def test_parts_are_what_the_spec_says_in_order():
  """The structured parts other modules read (the adapted attack, the fidelity check's variants)
  in place of the spec's text: heads, numbers and options in order, an identity left out, a
  defense built by hand its name alone; each part's spec parses back to that part."""
  P = defenses.Part
  got = defenses.parts(defenses.parse("DP:2:0.5:global:laplacian, half ,prune:0.3"))
  assert got == (P("dp", (2.0, 0.5), ("laplacian", "global")), P("fp16"), P("prune", (0.3,)))
  assert got[0].whole_tree and not got[2].whole_tree
  for p in got:
    assert defenses.parts(defenses.parse(p.spec)) == (p,)
  assert defenses.parts(defenses.parse("none")) == ()
  assert defenses.parts(defenses.chain(defenses.identity(), defenses.quantize_int8(False))) == (
      P("int8", (), ("global",)),)
  mine = defenses.Defense(lambda observation, key=None: observation, "mine")
  assert defenses.parts(mine) == (P("mine"),)
  # Built by hand under a spec's name (or None's): read as that spec.
  named = defenses.Defense(lambda observation, key=None: observation, "CLIP:1,half")
  assert defenses.parts(named) == (P("clip", (1.0,)), P("fp16"))
  assert defenses.parts(defenses.Defense(lambda observation, key=None: observation, "None")) == ()


def test_parse_builds_the_documented_defense(obs):
  key = jax.random.key(4)
  pairs = [("gaussian:1e-3", defenses.gaussian_noise(1e-3)),
           ("laplacian:1e-2", defenses.laplacian_noise(1e-2)),
           ("dp:0.5:0.2:laplacian:global", defenses.dp(0.5, 0.2, per_layer=False, noise="laplacian")),
           ("prune:0.4:global", defenses.prune(0.4, per_layer=False)),
           ("clip:1.0,gaussian:1e-4", defenses.chain(defenses.clip(1.0),
                                                     defenses.gaussian_noise(1e-4)))]
  for spec, d in pairs:
    for a, b in zip(leaves(defenses.parse(spec).apply(obs, key).gradient),
                    leaves(d.apply(obs, key).gradient)):
      np.testing.assert_array_equal(a, b)
  assert set(defenses.DEFENSES) >= {"none", "gaussian", "laplacian", "clip", "dp", "prune", "fp16",
                                    "bf16", "int8"}


@pytest.mark.parametrize("spec,match", [
    ("", "empty"), ("foo", "unknown defense 'foo'"), ("gaussian", "missing"),
    ("gaussian:abc", "must be a number"), ("gaussian:-1e-3", ">= 0"), ("laplacian:inf", "finite"),
    ("gaussian:1e-3:2", "bad options"), ("prune:1", "< 1"), ("prune:-0.1", ">= 0"),
    ("clip:0", "> 0"), ("clip:1:local", "bad options"), ("dp:1", "missing"), ("dp:1:-1", ">= 0"),
    ("dp:1:0.1:gaussian:laplacian", "one noise"), ("int8:8", "bad options"), ("fp16:1", "bad options"),
    ("clip:1.0,,int8", "unknown defense ''"), ("clip:1.0;gaussian:1e-4", "bad options"),
])
def test_parse_errors(spec, match):
  with pytest.raises(ValueError, match=match) as info:
    defenses.parse(spec)
  message = str(info.value)
  assert "\n" not in message
  assert "valid forms:" in message and "dp:MAX_NORM:NOISE_MULTIPLIER" in message


@pytest.mark.parametrize("build", [
    lambda: defenses.gaussian_noise(-1e-3), lambda: defenses.laplacian_noise(float("nan")),
    lambda: defenses.clip(0.0), lambda: defenses.clip(-1.0), lambda: defenses.dp(0.0, 0.1),
    lambda: defenses.dp(1.0, -0.1), lambda: defenses.dp(1.0, 0.1, noise="uniform"),
    lambda: defenses.prune(1.0), lambda: defenses.prune(-0.01), lambda: defenses.cast("int8"),
    # Overflowing noise (its std beyond float32's range), a flag for a number, a word for a flag.
    lambda: defenses.gaussian_noise(1e300), lambda: defenses.dp(1.0, 1e300),
    lambda: defenses.clip(True), lambda: defenses.clip(1.0, per_layer="global"),
    lambda: defenses.prune(0.2, per_layer=0), lambda: defenses.quantize_int8(per_layer="no"),
])
def test_constructor_validation(build):
  with pytest.raises(ValueError):
    build()
