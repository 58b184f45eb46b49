"""Tests for gradjax.models: shapes, parameter counts by hand, initialisers, BatchNorm, errors.

Big models are only traced (``jax.eval_shape``) or run with NumPy-filled parameters on tiny inputs, so
the file stays fast on a CPU.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import compilation, models
from gradjax.models.inits import get_initializers

KEY = jax.random.key(0)


def _count(tree) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))


def _shapes(name, input_shape, num_classes, **kw):
  """Variables of ``models.create`` as ShapeDtypeStructs (traced, not computed)."""
  return jax.eval_shape(
      lambda k: models.create(name, k, input_shape=input_shape, num_classes=num_classes, **kw).variables,
      KEY)


# --- Registry: every name builds, for several input shapes and class counts --------------------------


@pytest.mark.parametrize("name", models.MODELS)
@pytest.mark.parametrize("input_shape,num_classes", [((32, 32, 3), 10), ((28, 28, 1), 100),
                                                     ((64, 64, 3), 100)])
def test_every_model_traces_to_logits(name, input_shape, num_classes):
  module = models.get_module(name, num_classes=num_classes)
  variables = _shapes(name, input_shape, num_classes)
  assert "params" in variables
  assert variables["params"]["head"]["kernel"].shape[-1] == num_classes
  out = jax.eval_shape(lambda v, x: module.apply(v, x), variables,
                       jax.ShapeDtypeStruct((3, *input_shape), jnp.float32))
  assert out.shape == (3, num_classes) and out.dtype == jnp.float32
  # BatchNorm only in the ConvNet and the ResNets.
  assert ("batch_stats" in variables) == (name.startswith("convnet") or name.startswith("resnet"))


@pytest.mark.parametrize("name", models.MODELS)
@pytest.mark.slow
def test_every_model_runs_finite(name, photos, photos28, fill_variables):
  """Real forward pass on real photos: (N, K) finite, non-constant logits.

  Parameters are NumPy-filled (jax.random initialisers compile slowly on CPU). The LeNets and the MLP
  run on full 32x32x3 and 28x28x1 photos with 10 and 100 classes; the ConvNet and the ResNets (whose
  shapes for every size are covered by the eval_shape test above) run on 9x9 crops, in eval mode and,
  for the ConvNet, train mode.
  """
  if name in ("lenet_zhu", "lenet5", "mlp"):
    runs = [(photos[:2], 10, (False,)), (photos28[:2], 100, (False,))]
  else:
    runs = [(photos[:2, :9, :9], 10, (False, True) if name == "convnet" else (False,))]
  for xs, k, modes in runs:
    module = models.get_module(name, num_classes=k)
    variables = fill_variables(module, xs.shape[1:])
    apply_fn = compilation.once(models.make_apply_fn(module), static_argnums=2)  # one call each
    for train in modes:
      logits = apply_fn(variables, jnp.asarray(xs), train)
      assert logits.shape == (2, k)
      assert np.all(np.isfinite(np.asarray(logits)))
      assert np.ptp(np.asarray(logits)) > 0  # Not a constant output.


def test_create_returns_model_record(photos):
  model = models.create("lenet_zhu", KEY)
  assert model.name == "lenet_zhu" and model.input_shape == (32, 32, 3) and model.num_classes == 10
  logits = jax.jit(model.apply_fn)(model.variables, jnp.asarray(photos[:3]))
  assert logits.shape == (3, 10) and np.all(np.isfinite(np.asarray(logits)))


def test_create_refuses_a_model_too_large_to_build_before_allocating_it():
  """A capture's metadata may state any shape: 65536 x 65536 RGB inputs (a 51 GB zero batch) or
  a billion classes are refused at once, the largest allowed shape is built."""
  with pytest.raises(ValueError, match="holds over 50331648 values"):
    models.create("lenet_zhu", KEY, input_shape=(65536, 65536, 3))
  with pytest.raises(ValueError, match="num_classes must lie in 2 .. 1048576"):
    models.create("lenet_zhu", KEY, num_classes=10**9)
  with pytest.raises(ValueError, match="holds over"):
    models.create("transformer", KEY, input_shape=(models.MAX_INPUT_SIZE + 1,))
  assert models.create("mlp", KEY, input_shape=(64, 64, 3), num_classes=models.MAX_CLASSES
                       ).num_classes == 2**20
  with pytest.raises(ValueError, match="integer sizes"):  # 8.7 had been built as 8
    models.create("lenet_zhu", KEY, input_shape=(8.7, 8, 3))
  model = models.create("mlp-16", KEY, input_shape=(8, 8, 3))
  assert models.output_shape(model.apply_fn, model.variables, (8, 8, 3), jnp.float32) == (1, 10)
  with pytest.raises(ValueError, match="sizes must be integers"):  # not (8, 8, 3)'s answer again
    models.output_shape(model.apply_fn, model.variables, (8.7, 8, 3), jnp.float32)
  with pytest.raises(ValueError, match="num_classes must be an integer"):
    models.create("lenet_zhu", KEY, num_classes=2.5)


def test_output_shape_is_traced_once_per_model_and_input():
  """(1, K) for an example, traced once for the same model, variables' shapes and input; an input
  the model does not read is one ValueError naming it."""
  model = models.create("lenet_zhu", KEY, input_shape=(8, 8, 3))
  traces = []

  def apply_fn(variables, x, train=False):
    traces.append(x.shape)
    return model.apply_fn(variables, x, train)

  for _ in range(3):
    assert models.output_shape(apply_fn, model.variables, (8, 8, 3), jnp.float32) == (1, 10)
  assert traces == [(1, 8, 8, 3)]
  with pytest.raises(ValueError, match=r"an input of shape \(3, 8, 8\) \(float32\) does not fit"):
    models.output_shape(apply_fn, model.variables, (3, 8, 8), jnp.float32)


# --- DLG LeNet: exact architecture ----------------------------------------------------------------------


def test_lenet_zhu_layers_and_count():
  params = _shapes("lenet_zhu", (32, 32, 3), 10)["params"]
  shapes = jax.tree.map(lambda a: a.shape, params)
  assert shapes == {
      "Conv_0": {"kernel": (5, 5, 3, 12), "bias": (12,)},
      "Conv_1": {"kernel": (5, 5, 12, 12), "bias": (12,)},
      "Conv_2": {"kernel": (5, 5, 12, 12), "bias": (12,)},
      "head": {"kernel": (768, 10), "bias": (10,)},
  }
  by_hand = (3 * 12 * 25 + 12) + 2 * (12 * 12 * 25 + 12) + (768 * 10 + 10)
  assert by_hand == 15826
  assert _count(params) == by_hand


@pytest.mark.parametrize("input_shape,features", [((28, 28, 1), 7 * 7 * 12), ((64, 64, 3), 16 * 16 * 12)])
def test_lenet_zhu_head_features_follow_strides(input_shape, features):
  # Strides 2, 2, 1 with pad 2: H -> ceil(H/2) -> ceil(H/4) -> same.
  params = _shapes("lenet_zhu", input_shape, 100)["params"]
  assert params["Conv_0"]["kernel"].shape == (5, 5, input_shape[-1], 12)
  assert params["head"]["kernel"].shape == (features, 100)


def _np_conv(x, w, b, stride, pad):
  """Plain NumPy cross-correlation, NHWC input, HWIO kernel, symmetric zero padding."""
  x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kh, kw = w.shape[:2]
  ho = (x.shape[1] - kh) // stride + 1
  wo = (x.shape[2] - kw) // stride + 1
  out = np.zeros((x.shape[0], ho, wo, w.shape[-1]))
  for i in range(kh):
    for j in range(kw):
      patch = x[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :]
      out += np.einsum("nhwc,cd->nhwd", patch, w[i, j])
  return out + b


def test_lenet_zhu_forward_matches_numpy(photos):
  """The DLG spec, written out in NumPy: conv(5, pad 2, stride 2/2/1) - sigmoid x3 - flatten - dense."""
  model = models.create("lenet_zhu", jax.random.key(3))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), model.variables["params"])
  x = photos[:3].astype(np.float64)
  sig = lambda a: 1.0 / (1.0 + np.exp(-a))
  h = x
  for layer, stride in (("Conv_0", 2), ("Conv_1", 2), ("Conv_2", 1)):
    h = sig(_np_conv(h, p[layer]["kernel"], p[layer]["bias"], stride, 2))
  assert h.shape == (3, 8, 8, 12)
  want = h.reshape(3, -1) @ p["head"]["kernel"] + p["head"]["bias"]
  got = np.asarray(jax.jit(model.apply_fn)(model.variables, jnp.asarray(photos[:3])))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- ResNets: parameter counts against closed forms -----------------------------------------------------


def _resnet_params_by_hand(stages, base, num_classes, in_channels=3):
  """CIFAR ResNet parameter count: 3x3 stem (no bias) + BN; basic blocks of two 3x3 convs (no bias)
  each followed by BN (2c params: scale, offset); a 1x1 conv + BN projection where the channel count
  changes; Dense head with bias on the globally pooled last stage."""
  total = 9 * in_channels * base + 2 * base
  c_in = base
  for s, blocks in enumerate(stages):
    c = base * 2**s
    for _ in range(blocks):
      total += 9 * c_in * c + 2 * c + 9 * c * c + 2 * c
      if c_in != c:
        total += c_in * c + 2 * c
      c_in = c
  return total + c_in * num_classes + num_classes


@pytest.mark.parametrize("name,stages,base,literal", [
    ("resnet18", (2, 2, 2, 2), 64, 11_173_962),     # the well-known CIFAR ResNet-18 count
    ("resnet34", (3, 4, 6, 3), 64, 21_282_122),     # CIFAR ResNet-34
    ("resnet20-4", (3, 3, 3), 64, 4_327_754),       # Geiping et al.'s ResNet20-4
    ("resnet32-10", (5, 5, 5), 160, None),
    ("resnet20", (3, 3, 3), 16, None),
])
def test_resnet_parameter_counts(name, stages, base, literal):
  by_hand = _resnet_params_by_hand(stages, base, 10)
  if literal is not None:
    assert by_hand == literal
  variables = _shapes(name, (32, 32, 3), 10)
  assert _count(variables["params"]) == by_hand
  # Two running statistics per BatchNorm channel, i.e. as many as BN scales and offsets together.
  bn_params = sum(int(np.prod(leaf.shape)) for path, leaf in
                  jax.tree_util.tree_flatten_with_path(variables["params"])[0]
                  if "BatchNorm" in jax.tree_util.keystr(path))
  assert _count(variables["batch_stats"]) == bn_params


def test_resnet18_hand_count_100_classes():
  variables = _shapes("resnet18", (32, 32, 3), 100)
  assert _count(variables["params"]) == 11_173_962 - (512 * 10 + 10) + (512 * 100 + 100)


def _block_outputs(module, variables, x):
  _, state = module.apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]
  return [inter[k]["__call__"][0] for k in sorted((k for k in inter if k.startswith("BasicBlock")),
                                                   key=lambda k: int(k.split("_")[1]))]


@pytest.mark.parametrize("stride1,final_hw", [(True, 32), (False, 4)])
def test_resnet18_stride1_keeps_resolution(stride1, final_hw):
  module = models.get_module("resnet18", num_classes=10, act="sigmoid", stride1=stride1)
  variables = _shapes("resnet18", (32, 32, 3), 10, act="sigmoid", stride1=stride1)
  outs = jax.eval_shape(lambda v, x: _block_outputs(module, v, x), variables,
                        jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32))
  assert len(outs) == 8
  assert [o.shape[-1] for o in outs] == [64, 64, 128, 128, 256, 256, 512, 512]
  assert outs[-1].shape == (1, final_hw, final_hw, 512)
  if stride1:
    assert all(o.shape[1:3] == (32, 32) for o in outs)


def test_resnet18_sigmoid_stride1_runs(photos, fill_variables):
  """A real run on a 6x6 crop: every block keeps the resolution and ends in a sigmoid."""
  x = jnp.asarray(photos[:2, :6, :6])
  # XLA's convolution: the subject is the activation and the strides, and the CPU default (mixed)
  # compiles about 3x longer (test_conv_implementations_compute_the_same_model holds them equal).
  module = models.get_module("resnet18", num_classes=10, act="sigmoid", stride1=True, conv="xla")
  variables = fill_variables(module, (6, 6, 3), seed=1)
  blocks, logits = jax.jit(lambda v, x: (_block_outputs(module, v, x), module.apply(v, x)))(variables, x)
  assert [b.shape for b in blocks] == [(2, 6, 6, c) for c in (64, 64, 128, 128, 256, 256, 512, 512)]
  assert logits.shape == (2, 10) and np.all(np.isfinite(np.asarray(logits)))
  values = np.concatenate([np.asarray(b).ravel() for b in blocks])
  # A sigmoid's range (a ReLU's would exceed 1); the residual sums of U(-0.5, 0.5) weights saturate
  # many units, but not all.
  assert values.min() >= 0 and values.max() <= 1
  assert np.mean((values > 0.01) & (values < 0.99)) > 0.01


# --- Initialisers -----------------------------------------------------------------------------------


def test_uniform_init_lenet_zhu():
  params = models.create("lenet_zhu", jax.random.key(1)).variables["params"]
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    a = np.asarray(leaf)
    assert a.min() >= -0.5 and a.max() <= 0.5, jax.tree_util.keystr(path)
    assert np.any(a != 0)  # Biases are random too (DLG's weights_init), not zero.
  head = np.asarray(params["head"]["kernel"])  # 7680 entries
  assert head.min() < -0.45 and head.max() > 0.45
  assert abs(head.mean()) < 0.02
  np.testing.assert_allclose(head.std(), 0.5 / math.sqrt(3), rtol=0.03)  # std of U(-a, a) = a / sqrt(3)
  # Biases of the three convs together (36 values) cover both signs.
  biases = np.concatenate([np.asarray(params[f"Conv_{i}"]["bias"]) for i in range(3)])
  assert biases.min() < -0.2 and biases.max() > 0.2


def test_uniform_init_scale():
  params = models.create("lenet_zhu", jax.random.key(1), init_scale=0.1).variables["params"]
  leaves = np.concatenate([np.asarray(a).ravel() for a in jax.tree.leaves(params)])
  assert leaves.min() >= -0.1 and leaves.max() <= 0.1
  assert leaves.min() < -0.095 and leaves.max() > 0.095


def test_uniform_init_direct_big_kernel():
  init = get_initializers("uniform", 0.25).kernel_init
  w = np.asarray(init(jax.random.key(2), (64, 1000)))
  assert w.min() >= -0.25 and w.max() <= 0.25
  assert w.min() < -0.249 and w.max() > 0.249
  # Flat histogram: each of 10 equal bins holds ~10 %.
  hist, _ = np.histogram(w, bins=10, range=(-0.25, 0.25))
  np.testing.assert_allclose(hist / w.size, 0.1, atol=0.01)


def test_xavier_normal_lenet5():
  params = models.create("lenet5", jax.random.key(4), init="xavier_normal").variables["params"]
  # Fans count the receptive field: fan_in = 5*5*in, fan_out = 5*5*out (PyTorch's xavier_normal_).
  z = []
  for i in range(1, 4):
    w = np.asarray(params[f"Conv_{i}"]["kernel"])
    assert w.shape == (5, 5, 12, 12)
    z.append(w.ravel() / math.sqrt(2.0 / (25 * 12 + 25 * 12)))
  z = np.concatenate(z)  # 10 800 standardised entries
  assert abs(z.std() - 1) < 0.05 and abs(z.mean()) < 0.05
  w0 = np.asarray(params["Conv_0"]["kernel"])
  np.testing.assert_allclose(w0.std(), math.sqrt(2.0 / (25 * 3 + 25 * 12)), rtol=0.1)  # 900 entries
  head = np.asarray(params["head"]["kernel"])
  assert head.shape == (32 * 32 * 12, 10)
  sigma = math.sqrt(2.0 / (32 * 32 * 12 + 10))
  np.testing.assert_allclose(head.std(), sigma, rtol=0.02)
  # Untruncated normal: ~4.55 % of draws beyond 2 sigma, and some beyond 4 sigma among 122 880.
  tail = np.mean(np.abs(head) > 2 * sigma)
  assert 0.040 < tail < 0.051
  assert np.abs(head).max() > 4 * sigma
  for layer in params.values():
    assert np.all(np.asarray(layer["bias"]) == 0)


def test_torch_init_convnet_matches_pytorch_defaults():
  """PyTorch's Conv2d/Linear defaults: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in
  = in x 3 x 3 (closed form; the same bound as torch.nn.init's kaiming_uniform_(a=sqrt(5)))."""
  variables = models.create("convnet-16", jax.random.key(7), init="torch").variables
  params = variables["params"]
  convs = [k for k in params if k.startswith("Conv_")]
  assert len(convs) == 8
  for name in convs + ["head"]:
    w, b = np.asarray(params[name]["kernel"]), np.asarray(params[name]["bias"])
    bound = 1 / math.sqrt(math.prod(w.shape[:-1]))
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    if w.size > 20_000:  # a flat U(-bound, bound): variance bound^2 / 3, the extremes reached
      np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.03)
      assert np.abs(w).max() > 0.99 * bound
    assert np.abs(b).max() > 0.5 * bound and abs(b.mean()) < bound  # drawn, not zero
  biases = np.concatenate([np.asarray(params[n]["bias"]) for n in convs]).ravel()
  assert len(np.unique(biases)) == biases.size  # each layer its own draw
  for name in [k for k in params if k.startswith("BatchNorm")]:  # BatchNorm keeps 1 and 0
    np.testing.assert_array_equal(params[name]["scale"], 1)
    np.testing.assert_array_equal(params[name]["bias"], 0)
  # Other inits draw as before: the torch init does not move the key of module.init.
  again = models.create("convnet-16", jax.random.key(7)).variables["params"]
  plain = models.get_module("convnet-16", num_classes=10).init(jax.random.key(7), jnp.zeros((1, 32, 32, 3)))
  np.testing.assert_array_equal(again["Conv_3"]["kernel"], plain["params"]["Conv_3"]["kernel"])


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
def test_torch_init_bound_equals_pytorchs():
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  conv = torch.nn.Conv2d(32, 64, 3)
  ours = np.asarray(models.create("convnet-32", jax.random.key(1), init="torch")
                    .variables["params"]["Conv_1"]["kernel"])  # (3, 3, 32, 64): the same layer
  theirs = conv.weight.detach().numpy()
  assert ours.size == theirs.size
  np.testing.assert_allclose(np.abs(ours).max(), np.abs(theirs).max(), rtol=0.01)
  np.testing.assert_allclose(ours.std(), theirs.std(), rtol=0.03)
  np.testing.assert_allclose(np.abs(conv.bias.detach().numpy()).max(), 1 / math.sqrt(32 * 9), rtol=0.1)


def test_torchvision_init_draws_convolutions_by_fan_out():
  """torchvision's ResNet draw: convolution kernels ~ N(0, 2 / fan_out), fan_out = out x kh x kw,
  untruncated (closed form of kaiming_normal_(mode='fan_out', nonlinearity='relu')); the head and
  convolution biases as PyTorch's defaults, U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm 1 and 0."""
  params = models.create("resnet20", jax.random.key(3), init="torchvision").variables["params"]
  kernels = {}

  def collect(tree, path=""):
    for k, v in tree.items():
      if isinstance(v, dict):
        collect(v, f"{path}/{k}")
      elif k == "kernel" and v.ndim == 4:
        kernels[f"{path}/{k}"] = np.asarray(v)
      elif k == "scale":
        np.testing.assert_array_equal(v, 1)
        np.testing.assert_array_equal(tree["bias"], 0)

  collect(params)
  assert len(kernels) == 21  # the stem, 18 in the blocks, two 1x1 shortcuts
  for name, w in kernels.items():
    sigma = math.sqrt(2.0 / (w.shape[0] * w.shape[1] * w.shape[3]))
    np.testing.assert_allclose(w.std(), sigma, rtol=4 / math.sqrt(w.size) + 0.01, err_msg=name)
  big = kernels["/BasicBlock_8/Conv_1/kernel"]  # (3, 3, 64, 64): 36 864 draws
  sigma = math.sqrt(2.0 / (9 * 64))
  assert 0.040 < np.mean(np.abs(big) > 2 * sigma) < 0.051 and np.abs(big).max() > 3 * sigma  # untruncated (Flax's truncated normal stops at 2 sigma)
  w, b = np.asarray(params["head"]["kernel"]), np.asarray(params["head"]["bias"])
  bound = 1 / math.sqrt(w.shape[0])
  assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and np.abs(b).max() > 0.5 * bound
  np.testing.assert_allclose(w.var(), bound**2 / 3, rtol=0.2)  # 640 draws of U(-bound, bound)
  # A model whose convolutions have biases: the kernels by fan_out, the biases PyTorch's.
  conv = models.create("convnet-16", jax.random.key(3), init="torchvision").variables["params"]["Conv_4"]
  kernel, bias = np.asarray(conv["kernel"]), np.asarray(conv["bias"])  # (3, 3, 64, 64)
  np.testing.assert_allclose(kernel.std(), math.sqrt(2.0 / (9 * 64)), rtol=0.03)
  assert 0.5 / math.sqrt(9 * 64) < np.abs(bias).max() <= 1 / math.sqrt(9 * 64)


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
def test_torchvision_init_spread_equals_kaiming_normal_fan_out():
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  conv = torch.nn.Conv2d(16, 32, 3, bias=False)  # the first 3x3 of resnet20's second stage
  torch.nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
  theirs = conv.weight.detach().numpy()
  ours = np.asarray(models.create("resnet20", jax.random.key(1), init="torchvision")
                    .variables["params"]["BasicBlock_3"]["Conv_0"]["kernel"])
  assert ours.shape == (3, 3, 16, 32) and theirs.shape == (32, 16, 3, 3)
  np.testing.assert_allclose(ours.std(), theirs.std(), rtol=0.05)  # 4 608 draws each


def test_torch_init_refused_by_text_models():
  with pytest.raises(ValueError, match="image models"):
    models.get_module("transformer", num_classes=100, init="torch")
  with pytest.raises(ValueError, match="image models"):
    models.get_module("transformer", num_classes=100, init="torchvision")


# --- BatchNorm: train mode uses batch statistics, apply_fn stays pure -----------------------------------


@pytest.fixture(scope="module")
def convnet(fill_variables):
  module = models.get_module("convnet-4", num_classes=10)
  variables = fill_variables(module, (12, 12, 3), seed=2)
  return module, variables


@pytest.mark.slow
def test_batchnorm_train_uses_batch_statistics(convnet, photos):
  module, variables = convnet
  x = jnp.asarray(photos[:4, :12, :12])
  eps = 1e-5
  apply = jax.jit(lambda v, x, train: module.apply(v, x, train=train, capture_intermediates=True,
                                                   mutable=["intermediates", "batch_stats"]),
                  static_argnums=2)  # eagerly each operation compiles alone
  for train in (True, False):
    _, state = apply(variables, x, train)
    inter = state["intermediates"]
    c = np.asarray(inter["Conv_0"]["__call__"][0], np.float64)
    got = np.asarray(inter["BatchNorm_0"]["__call__"][0], np.float64)
    scale = np.asarray(variables["params"]["BatchNorm_0"]["scale"])
    bias = np.asarray(variables["params"]["BatchNorm_0"]["bias"])
    if train:
      mean, var = c.mean(axis=(0, 1, 2)), c.var(axis=(0, 1, 2))  # biased batch variance
    else:
      mean = np.asarray(variables["batch_stats"]["BatchNorm_0"]["mean"])
      var = np.asarray(variables["batch_stats"]["BatchNorm_0"]["var"])
    want = (c - mean) / np.sqrt(var + eps) * scale + bias
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_apply_fn_train_mode_is_pure(convnet, photos):
  module, variables = convnet
  # Jitted, as every caller runs it (each primitive of the eager call compiles alone: 172 programs),
  # at level 0 as the library's run-once programs; a mutation of ``variables`` would still show, at
  # tracing.
  apply_fn = compilation.once(models.make_apply_fn(module), static_argnames="train")
  before = jax.tree.map(np.array, variables)
  x = jnp.asarray(photos[:4, :12, :12])
  train1 = np.asarray(apply_fn(variables, x, train=True))
  train2 = np.asarray(apply_fn(variables, x, train=True))
  evals = np.asarray(apply_fn(variables, x))
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, variables), before)
  np.testing.assert_array_equal(train1, train2)
  assert np.max(np.abs(train1 - evals)) > 1e-3
  # Batch statistics couple the examples in train mode only.
  sub_train = np.asarray(apply_fn(variables, x[:2], train=True))
  sub_eval = np.asarray(apply_fn(variables, x[:2]))
  assert np.max(np.abs(sub_train - train1[:2])) > 1e-3
  np.testing.assert_allclose(sub_eval, evals[:2], rtol=1e-5, atol=1e-5)


# --- Errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kwargs", [
    ("lenet6", {}),
    ("resnet19", {}),
    ("resnet", {}),
    ("convnet-x", {}),
    ("lenet_zhu", {"init": "he_normal"}),
    ("convnet", {"init": "kaiming"}),
    ("mlp", {"act": "swish"}),
    ("resnet18", {"act": "Relu"}),
    ("lenet_zhu", {"act": "Relu"}),
    ("lenet_zhu", {"input_shape": (32, 32)}),
    ("lenet_zhu", {"input_shape": (0, 32, 3)}),
    ("lenet_zhu", {"input_shape": (3, 32, 32)}),  # PyTorch's (C, H, W)
    ("mlp", {"input_shape": (1, 28, 28)}),
    ("lenet_zhu", {"num_classes": 1}),
])
def test_bad_configuration_raises(name, kwargs):
  with pytest.raises(ValueError):
    models.create(name, KEY, **kwargs)


@pytest.mark.parametrize("name,kwargs", [
    ("convnet", {"input_shape": (8, 8, 3)}),
    ("convnet", {"input_shape": (8, 8, 3), "init": "uniform"}),
    ("mlp-0", {"init": "uniform"}),
    ("convnet-0", {}),
    ("resnet18-0", {"init": "uniform"}),
])
def test_degenerate_configuration_raises(name, kwargs):
  with pytest.raises(ValueError):
    jax.eval_shape(lambda k: models.create(name, k, **kwargs).variables, KEY)


@pytest.mark.parametrize("init", ["uniform", "default"])  # no fan / a fan-based init's zero fan-in
def test_an_input_too_small_for_the_pooling_is_named(init):
  kwargs = {} if init == "default" else {"init": init}
  with pytest.raises(ValueError, match=r"input \(8, 8, 3\) is too small for convnet"):
    models.create("convnet", KEY, input_shape=(8, 8, 3), **kwargs)


# --- Convolution implementations: im2col equals the native convolution -------------------------------


def _np_conv_asym(x, w, stride, pads):
  """NumPy cross-correlation with per-side zero padding ((top, bottom), (left, right)) and strides."""
  x = np.pad(x, ((0, 0), *pads, (0, 0)))
  kh, kw = w.shape[:2]
  ho, wo = (x.shape[1] - kh) // stride[0] + 1, (x.shape[2] - kw) // stride[1] + 1
  out = np.zeros((x.shape[0], ho, wo, w.shape[-1]))
  for i in range(kh):
    for j in range(kw):
      patch = x[:, i:i + stride[0] * ho:stride[0], j:j + stride[1] * wo:stride[1], :]
      out += np.einsum("nhwc,cd->nhwd", patch, w[i, j])
  return out


@pytest.mark.parametrize("kernel,stride,pads,hw", [
    ((5, 5), (2, 2), ((2, 2), (2, 2)), (32, 32)),   # lenet_zhu's strided layers
    ((5, 5), (1, 1), ((2, 2), (2, 2)), (8, 8)),
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (7, 9)),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (9, 8)),      # ResNet downsampling, odd size
    ((1, 1), (2, 2), ((0, 0), (0, 0)), (8, 7)),      # ResNet projection shortcut
    ((3, 2), (1, 3), ((0, 2), (1, 0)), (6, 10)),     # asymmetric everything
])
@pytest.mark.parametrize("impl", ["im2col_conv", "gather_conv", "split_conv", "mixed_conv"])
@pytest.mark.slow
def test_conv_implementations_match_numpy_and_xla(kernel, stride, pads, hw, impl):
  """Values, first and second derivatives (float64) equal NumPy and ``lax.conv_general_dilated``."""
  from gradjax.models import layers
  im2col_conv = getattr(layers, impl)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, *hw, 3))
  w = rng.normal(size=(*kernel, 3, 4))
  dn = ("NHWC", "HWIO", "NHWC")
  with jax.enable_x64(True):  # jitted, as the models run them (eagerly each operation compiles alone)
    conv = jax.jit(lambda x, w: im2col_conv(x, w, stride, pads, dimension_numbers=dn))
    got = conv(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(got), _np_conv_asym(x, w, stride, pads), rtol=1e-12, atol=1e-12)

    def second_order(conv):
      # A gradient-matching-like scalar: the squared weight gradient of a loss, differentiated in x.
      def loss(w, x):
        return jnp.sum(jnp.tanh(conv(x, w, stride, pads, dimension_numbers=dn)) ** 2)
      outer = jax.jit(jax.grad(lambda x, w: jnp.sum(jax.grad(loss)(w, x) ** 2)))
      return outer(jnp.asarray(x), jnp.asarray(w))

    np.testing.assert_allclose(np.asarray(second_order(im2col_conv)),
                               np.asarray(second_order(jax.lax.conv_general_dilated)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel,stride,pads,hw", [
    ((5, 5), (2, 2), ((2, 2), (2, 2)), (12, 12)),
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (7, 9)),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (9, 8)),      # rows the strided window never reaches
    ((3, 2), (1, 3), ((0, 2), (1, 0)), (6, 10)),
])
@pytest.mark.parametrize("form", ["convolution", "products"])
def test_weight_gradient_forms_match_numpy(kernel, stride, pads, hw, form):
  """split_conv's kernel gradient in either form equals NumPy's sum over the batch and the output
  positions of the padded input's window times the output cotangent (float64)."""
  from gradjax.models import layers
  rng = np.random.default_rng(2)
  x = rng.normal(size=(3, *hw, 4))
  xp = np.pad(x, ((0, 0), *pads, (0, 0)))
  ho, wo = (xp.shape[1] - kernel[0]) // stride[0] + 1, (xp.shape[2] - kernel[1]) // stride[1] + 1
  dy = rng.normal(size=(3, ho, wo, 5))
  want = np.zeros((*kernel, 4, 5))
  for a in range(kernel[0]):
    for b in range(kernel[1]):
      window = xp[:, a:a + stride[0] * (ho - 1) + 1:stride[0], b:b + stride[1] * (wo - 1) + 1:stride[1]]
      want[a, b] = np.einsum("nijc,nijo->co", window, dy)
  with jax.enable_x64(True):
    gradient = getattr(layers, f"weight_gradient_{form}")
    got = jax.jit(lambda x, dy: gradient(x, dy, kernel, stride, pads))(jnp.asarray(x), jnp.asarray(dy))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_weight_gradient_takes_products_on_large_layers():
  """split_conv's weight gradient is the products form for ConvNet-64's 32x32 layers at batch 8 and
  the convolution form for thin layers or few rows (the rule the convs benchmark measured); the
  model's matching gradient is the same either way."""
  from gradjax.models import layers
  assert layers.weight_gradient_by_products((8, 32, 32, 128), 64)
  assert not layers.weight_gradient_by_products((8, 32, 32, 64), 64)
  assert not layers.weight_gradient_by_products((1, 32, 32, 256), 256)
  assert not layers.weight_gradient_by_products((8, 32, 32, 128), 32)
  dn = ("NHWC", "HWIO", "NHWC")
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(4, 32, 32, 64)), jnp.float32)
  w = jnp.asarray(0.05 * rng.normal(size=(3, 3, 64, 128)), jnp.float32)

  def matching(conv):
    def objective(x):
      g = jax.grad(lambda w: jnp.sum(jnp.tanh(conv(x, w, (1, 1), "SAME", dimension_numbers=dn)) ** 2))(w)
      return jnp.sum(g ** 2)
    return jax.jit(jax.value_and_grad(objective))(x)

  (value, grad), (want_value, want_grad) = matching(layers.split_conv), matching(jax.lax.conv_general_dilated)
  np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(want_grad))))


@pytest.mark.slow
@pytest.mark.parametrize("kernel,stride,pads,hw", [
    ((3, 3), (1, 1), "SAME", (8, 8)),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (9, 8)),      # odd size: rows the strided window never reaches
    ((5, 5), (2, 2), ((2, 2), (2, 2)), (12, 12)),
    ((3, 2), (1, 3), ((0, 2), (1, 0)), (6, 10)),
])
def test_split_conv_third_order_through_two_layers(kernel, stride, pads, hw):
  """Two stacked split convolutions: the gradient-matching gradient (which runs the second layer's
  input gradient and its own derivatives) and its derivative w.r.t. the weights equal lax's in float64."""
  from gradjax.models.layers import split_conv
  rng = np.random.default_rng(1)
  dn = ("NHWC", "HWIO", "NHWC")
  x = rng.normal(size=(2, *hw, 3))
  w1, w2 = rng.normal(size=(*kernel, 3, 4)), rng.normal(size=(*kernel, 4, 2))
  with jax.enable_x64(True):
    def matching(conv):
      def loss(ws, x):
        h = jnp.tanh(conv(x, ws[0], stride, pads, dimension_numbers=dn))
        return jnp.sum(jnp.tanh(conv(h, ws[1], (1, 1), "SAME", dimension_numbers=dn)) ** 2)

      def objective(x, ws):  # a matching objective of the dummy input, its weights differentiable too
        return sum(jnp.sum(g ** 2) for g in jax.grad(loss)(ws, x))
      return jax.grad(objective, argnums=(0, 1))

    args = jnp.asarray(x), (jnp.asarray(w1), jnp.asarray(w2))
    for got, want in zip(jax.tree.leaves(jax.jit(matching(split_conv))(*args)),
                         jax.tree.leaves(jax.jit(matching(jax.lax.conv_general_dilated))(*args))):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


def test_split_conv_derivatives_are_forward_layout_convolutions():
  """Every convolution in split_conv's first, second and third derivatives has the forward NHWC/HWIO
  layout: XLA:CPU turns its own transposed forms into that layout at a program's top level but not
  inside a loop body (a ``lax.scan`` of training steps, a line search's ``while_loop``), where it
  compiles them to slow loop nests."""
  from gradjax.models.layers import split_conv
  dn = ("NHWC", "HWIO", "NHWC")
  forward = jax.lax.conv_dimension_numbers((1, 9, 9, 3), (3, 3, 3, 4), dn)
  x, w = jnp.ones((2, 9, 9, 3)), jnp.ones((3, 3, 3, 4))

  def loss(x, w):
    return jnp.sum(jnp.tanh(split_conv(x, w, (2, 2), "SAME", dimension_numbers=dn)) ** 2)

  def matching(x, w):
    return jnp.sum(jax.grad(loss, argnums=1)(x, w) ** 2)

  def convolutions(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        yield eqn.params["dimension_numbers"]
      for value in eqn.params.values():
        for inner in value if isinstance(value, (tuple, list)) else (value,):
          inner = getattr(inner, "jaxpr", inner)
          if hasattr(inner, "eqns"):
            yield from convolutions(inner)

  for fn in (jax.grad(loss, argnums=(0, 1)), jax.grad(matching, argnums=(0, 1)),
             jax.grad(lambda x, w: jnp.sum(jax.grad(matching)(x, w) ** 2))):
    found = list(convolutions(jax.make_jaxpr(fn)(x, w).jaxpr))
    assert found and all(d == forward for d in found), found


def test_mixed_conv_splits_large_maps_with_enough_channels():
  """mixed_conv takes split_conv (a custom VJP) for a 3x3 kernel on 16 channels and a 16x16 output,
  im2col_conv for fewer channels, a smaller map or a 1x1 kernel; all equal lax's convolution."""
  from gradjax.models.layers import mixed_conv
  dn = ("NHWC", "HWIO", "NHWC")
  for shape, kernel, stride, split in (((1, 16, 16, 16), (3, 3, 16, 8), (1, 1), True),
                                       ((1, 32, 32, 16), (3, 3, 16, 8), (2, 2), True),
                                       ((1, 16, 16, 15), (3, 3, 15, 8), (1, 1), False),
                                       ((1, 15, 16, 16), (3, 3, 16, 8), (1, 1), False),
                                       ((1, 16, 16, 16), (1, 1, 16, 8), (1, 1), False)):
    x, w = jnp.ones(shape), jnp.ones(kernel)
    jaxpr = str(jax.make_jaxpr(lambda x, w: mixed_conv(x, w, stride, "SAME", dimension_numbers=dn))(x, w))
    assert ("custom_vjp_call" in jaxpr) == split, (shape, kernel, stride)
    np.testing.assert_allclose(np.asarray(mixed_conv(x, w, stride, "SAME", dimension_numbers=dn)),
                               np.asarray(jax.lax.conv_general_dilated(x, w, stride, "SAME", dimension_numbers=dn)),
                               rtol=1e-6)


@pytest.mark.parametrize("impl", ["im2col_conv", "gather_conv"])
def test_patch_convs_defer_unsupported_cases_to_xla(impl):
  """Dilations, groups, string padding and other layouts give exactly lax's result."""
  from gradjax.models import layers
  im2col_conv = getattr(layers, impl)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(1, 9, 9, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, 2, 6)), jnp.float32)
  dn = ("NHWC", "HWIO", "NHWC")
  lax_conv = jax.lax.conv_general_dilated
  for kwargs in (dict(feature_group_count=2), dict(rhs_dilation=(2, 2), feature_group_count=2),
                 dict(lhs_dilation=(2, 1), feature_group_count=2)):
    pads = ((1, 1), (1, 1))
    np.testing.assert_array_equal(np.asarray(im2col_conv(x, w, (1, 1), pads, dimension_numbers=dn, **kwargs)),
                                  np.asarray(lax_conv(x, w, (1, 1), pads, dimension_numbers=dn, **kwargs)))
  w4 = jnp.asarray(rng.normal(size=(3, 3, 4, 5)), jnp.float32)
  for padding in ("SAME", "VALID"):
    np.testing.assert_allclose(np.asarray(im2col_conv(x, w4, (2, 2), padding, dimension_numbers=dn)),
                               np.asarray(lax_conv(x, w4, (2, 2), padding, dimension_numbers=dn)),
                               rtol=1e-5, atol=1e-5)
  x_nchw = jnp.transpose(x, (0, 3, 1, 2))
  w_oihw = jnp.transpose(w4, (3, 2, 0, 1))
  np.testing.assert_array_equal(np.asarray(im2col_conv(x_nchw, w_oihw, (1, 1), "SAME")),
                                np.asarray(lax_conv(x_nchw, w_oihw, (1, 1), "SAME")))


@pytest.mark.parametrize("name,input_shape,convs", [
    ("lenet_zhu", (16, 16, 3), ("im2col", "gather", "split", "mixed")),
    ("lenet5", (8, 8, 1), ("im2col", "gather", "split", "mixed")),
    ("convnet-2", (9, 9, 3), ("mixed",)), ("resnet8", (16, 16, 3), ("mixed",))])
@pytest.mark.slow
def test_conv_implementations_compute_the_same_model(name, input_shape, convs):
  """Each of im2col, split and mixed and ``conv="xla"`` have the same parameters, logits and DLG
  objective gradient (resnet8 at 16x16: mixed splits its first stage, 16 channels on 16x16 maps,
  and takes im2col after it; the deeper models are checked with mixed only, which holds both)."""
  from gradjax import clients, distances
  from gradjax.objectives import gradient_matching
  rng = np.random.default_rng(2)
  with jax.enable_x64(True):
    kw = dict(input_shape=input_shape, num_classes=10, param_dtype=jnp.float64)
    native = models.create(name, KEY, conv="xla", **kw)
    x = jnp.asarray(rng.uniform(size=(2, *input_shape)))
    dummy = {"x": jnp.asarray(rng.normal(size=x.shape)),
             "label_logits": jnp.asarray(rng.normal(size=(2, 10)))}

    def outputs(model):  # programs that run once: compiled as the library compiles those
      obs = clients.fedsgd(model.apply_fn, model.variables, x, np.array([1, 7]))
      return (np.asarray(compilation.once(model.apply_fn)(model.variables, x)),
              compilation.once(jax.grad(gradient_matching(model.apply_fn, distances.euclidean)))(
                  dummy, obs))

    logits, grads = outputs(native)
    for conv in convs:
      other = models.create(name, KEY, conv=conv, **kw)
      assert jax.tree.structure(native.variables) == jax.tree.structure(other.variables)
      same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                          native.variables, other.variables)
      assert all(jax.tree.leaves(same)), conv
      other_logits, other_grads = outputs(other)
      np.testing.assert_allclose(other_logits, logits, rtol=1e-10, atol=1e-12, err_msg=conv)
      for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-8, atol=1e-12, err_msg=conv)


@pytest.mark.parametrize("conv", ["im2col", "gather"])
def test_patch_convs_vmapped_over_runs_match_xla(conv):
  """Runs vmapped together (restarts, clients: what ``auto`` gives patch convolutions for on an
  accelerator): the matching objective's gradient per run equals XLA's convolutions' (float64)."""
  from gradjax import clients, distances
  from gradjax.objectives import gradient_matching
  rng = np.random.default_rng(4)
  with jax.enable_x64(True):
    kw = dict(input_shape=(12, 12, 3), num_classes=10, param_dtype=jnp.float64)
    native, other = (models.create("lenet_zhu", KEY, conv=c, **kw) for c in ("xla", conv))
    x = jnp.asarray(rng.uniform(size=(1, 12, 12, 3)))
    dummies = {"x": jnp.asarray(rng.normal(size=(3, 1, 12, 12, 3))),
               "label_logits": jnp.asarray(rng.normal(size=(3, 1, 10)))}

    def per_run(model):
      obs = clients.fedsgd(model.apply_fn, model.variables, x, np.array([4]))
      grad = jax.grad(gradient_matching(model.apply_fn, distances.euclidean))
      return jax.jit(jax.vmap(grad, in_axes=(0, None)))(dummies, obs)

    for a, b in zip(jax.tree.leaves(per_run(native)), jax.tree.leaves(per_run(other))):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-9, atol=1e-12)


def test_conv_auto_resolves_per_backend(monkeypatch):
  """``auto``: mixed on CPU; on an accelerator XLA's for one run, im2col for runs vmapped together,
  which an experiment's configuration asks for with more than one restart, label order or client
  outside a sequence."""
  from gradjax.models.layers import resolve_conv
  from gradjax.run import config, pipeline
  assert resolve_conv("auto") == ("mixed" if jax.default_backend() == "cpu" else "xla")
  assert resolve_conv("xla") == "xla" and resolve_conv("xla", batched=True) == "xla"
  with pytest.raises(ValueError, match="unknown convolution implementation"):
    models.create("lenet_zhu", KEY, conv="winograd")
  cfg = lambda **o: config.from_options(o)
  if jax.default_backend() == "cpu":
    assert resolve_conv("auto", batched=True) == "mixed"
    assert pipeline.model_conv(cfg(**{"attack.restarts": 4, "execution.strategy": "vmap"})) == "mixed"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert resolve_conv("auto") == "xla" and resolve_conv("auto", batched=True) == "im2col"
  assert pipeline.model_conv(cfg()) == "xla"
  assert pipeline.model_conv(cfg(), together=8) == "im2col"
  assert pipeline.model_conv(cfg(**{"attack.restarts": 4})) == "im2col"  # auto: vmap on a GPU
  assert pipeline.model_conv(cfg(**{"attack.permutations": 6})) == "im2col"
  assert pipeline.model_conv(cfg(**{"attack.restarts": 4, "execution.strategy": "sequential"})) == "xla"
  assert pipeline.model_conv(cfg(**{"attack.restarts": 4, "model.conv": "split"})) == "split"


@pytest.mark.parametrize("name, want", [
    ("lenet_zhu", models.ZooName("lenet_zhu")), ("convnet", models.ZooName("convnet", width=64)),
    ("convnet-8", models.ZooName("convnet", width=8)), ("mlp", models.ZooName("mlp", width=32)),
    ("mlp-16", models.ZooName("mlp", width=16)), ("resnet20-4", models.ZooName("resnet", 20, 4)),
    ("resnet18", models.ZooName("resnet", 18, 1)), ("convnet-0", None), ("convnet-08", None),
    ("resnet", None), ("resnet0", None), ("alexnet", None),
])
def test_one_name_grammar(name, want):
  """models.parse_name is the grammar get_module, interop and the benchmark's PyTorch twins read."""
  assert models.parse_name(name) == want


@pytest.mark.slow
def test_convnet_average_pooling_against_numpy(photos):
  """``ConvNet(pool="avg")`` (the batches study's diagnosis of max pooling): its logits are the
  head applied, in NumPy, to the 3x3 block means of the last block's activations (captured after
  its BatchNorm, ReLU applied here); with ``pool="max"`` they are not."""
  from gradjax.models.convnet import ConvNet
  x = jnp.asarray(photos[:2])
  module = ConvNet(num_classes=10, width=2, pool="avg")
  # Whole programs, not one per operation; the initialisation's random draws at LLVM's level 0
  # (at the default level they took XLA:CPU 25 s to compile).
  variables = jax.jit(module.init, compiler_options=compilation.ONCE)(jax.random.key(0), x)
  logits, state = jax.jit(lambda v, x: module.apply(v, x, capture_intermediates=True,
                                                    mutable=["intermediates"]))(variables, x)
  z = np.maximum(np.asarray(state["intermediates"]["BatchNorm_7"]["__call__"][0], np.float64), 0.0)
  n, h, w, c = z.shape  # 10x10 after the first pooling
  pooled = z[:, :h // 3 * 3, :w // 3 * 3].reshape(n, h // 3, 3, w // 3, 3, c).mean(axis=(2, 4))
  head = variables["params"]["head"]
  want = pooled.reshape(n, -1) @ np.asarray(head["kernel"], np.float64) + np.asarray(head["bias"])
  np.testing.assert_allclose(np.asarray(logits, np.float64), want, rtol=1e-4, atol=1e-5)
  other = jax.jit(ConvNet(num_classes=10, width=2, pool="max").apply)(variables, x)
  assert not np.allclose(np.asarray(other), np.asarray(logits))
  with pytest.raises(ValueError, match="max or avg"):
    ConvNet(num_classes=10, width=2, pool="sum").init(jax.random.key(0), x)


def test_a_pytorch_input_shape_is_named_with_its_gradjax_order():
  with pytest.raises(ValueError, match=r"\(C, H, W\) = \(1, 28, 28\) is \(28, 28, 1\)"):
    models.create("lenet_zhu", KEY, input_shape=(1, 28, 28))
  assert models.create("mlp-4", KEY, input_shape=(3, 32, 8)).input_shape == (3, 32, 8)  # not square


@pytest.mark.slow
def test_taps_see_every_module_call_by_kind_and_path_and_may_change_its_output():
  """gradjax.models.taps: a ResNet's BatchNorm calls are those its batch statistics hold (by path),
  a Transformer's attention blocks and their output projections those of its parameters; a call's
  output changed on its way changes the logits (the head's bias shifted by 1 shifts every logit by
  1), and one answered without running it (the head returning its input's first 10 features)
  replaces it."""
  from gradjax.models import taps
  resnet = models.create("resnet8", jax.random.key(0), input_shape=(16, 16, 3))
  calls = []

  def seen(call, proceed):
    calls.append(call)
    return proceed()

  x = jnp.asarray(np.random.default_rng(0).uniform(size=(2, 16, 16, 3)), jnp.float32)
  with taps.intercept(seen):
    logits = resnet.apply_fn(resnet.variables, x)
  norms = {c.path for c in calls if c.kind == taps.BATCH_NORM and c.method == "__call__"}
  stats = {path[:-1] for path, _ in jax.tree_util.tree_flatten_with_path(
      resnet.variables["batch_stats"])[0] for path in [tuple(k.key for k in path)]}
  assert norms == stats and len(norms) > 2
  assert all(c.name == c.path[-1] for c in calls if c.path)

  def shifted(call, proceed):
    out = proceed()
    return out + 1.0 if call.name == "head" and call.method == "__call__" else out

  with taps.intercept(shifted):
    np.testing.assert_allclose(resnet.apply_fn(resnet.variables, x), logits + 1.0, rtol=1e-6)

  def cut(call, proceed):
    return call.args[0][:, :10] if call.name == "head" and call.method == "__call__" else proceed()

  with taps.intercept(cut):
    features = resnet.apply_fn(resnet.variables, x)
  assert features.shape == logits.shape and not np.allclose(features, logits)
  text = models.create("transformer", jax.random.key(1), input_shape=(5,), num_classes=20,
                       text_sizes=models.TextSizes(dim=8, heads=2, ffn=8, layers=2))
  calls.clear()
  with taps.intercept(seen):
    text.apply_fn(text.variables, jnp.zeros((1, 5), jnp.int32))
  attention = [c.path for c in calls if c.kind == taps.ATTENTION and c.method == "__call__"]
  outputs = [c.path for c in calls if c.kind == taps.ATTENTION_OUTPUT and c.method == "__call__"]
  assert len(attention) == 2 and outputs == [p + ("out",) for p in attention]
  params = text.variables["params"]
  for path in outputs:
    node = params
    for key in path:
      node = node[key]
    assert "kernel" in node
