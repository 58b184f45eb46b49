"""Import and export of PyTorch-layout weights and observations (gradjax.interop).

References: a plain NumPy forward pass of DLG's LeNet written the PyTorch way (NCHW, OIHW kernels,
CHW flattening) on the file's tensors, and, when torch is installed, PyTorch itself.
"""

import json
import os
import pickle
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, interop, models
from gradjax.observation import Observation
from conftest import assert_one_line_error

ZOO = ["lenet_zhu", "lenet5", "convnet-2", "mlp-8", "resnet8", "resnet20-2"]


def np_conv_nchw(x, w, b, stride, pad):
  """PyTorch's Conv2d in NumPy: x (N, C, H, W), w (O, C, kh, kw)."""
  n, c, h, wd = x.shape
  o, _, kh, kw = w.shape
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
  out = np.zeros((n, o, ho, wo))
  for a in range(kh):
    for bb in range(kw):
      patch = xp[:, :, a:a + stride * (ho - 1) + 1:stride, bb:bb + stride * (wo - 1) + 1:stride]
      out += np.einsum("nchw,oc->nohw", patch, w[:, :, a, bb])
  return out + b[None, :, None, None]


def np_lenet_zhu(t, x_nhwc):
  """DLG's LeNet forward (mit-han-lab/dlg) on PyTorch-named float64 tensors ``t``."""
  h = np.transpose(np.asarray(x_nhwc, np.float64), (0, 3, 1, 2))
  sig = lambda v: 1 / (1 + np.exp(-v))
  for i, stride in zip((0, 2, 4), (2, 2, 1)):
    h = sig(np_conv_nchw(h, t[f"body.{i}.weight"], t[f"body.{i}.bias"], stride, 2))
  return h.reshape(h.shape[0], -1) @ t["fc.0.weight"].T + t["fc.0.bias"]


def _model(name, key=0, classes=10, shape=(32, 32, 3)):
  return models.create(name, jax.random.key(key), input_shape=shape, num_classes=classes, conv="xla")


def _with_random_stats(model, seed=0):
  """Non-trivial BatchNorm statistics, so a swapped mean/var would show."""
  rng = np.random.default_rng(seed)
  if "batch_stats" not in model.variables:
    return model
  stats = jax.tree_util.tree_map_with_path(
      lambda p, v: jnp.asarray(rng.uniform(-0.2, 0.2, v.shape) if p[-1].key == "mean"
                               else rng.uniform(0.5, 1.5, v.shape), v.dtype),
      model.variables["batch_stats"])
  return model._replace(variables={**model.variables, "batch_stats": stats})


def test_lenet_import_matches_numpy_pytorch_forward(tmp_path, photos):
  model = _model("lenet_zhu")
  path = tmp_path / "w.safetensors"
  interop.save_weights(path, model)
  tensors = {k: v.astype(np.float64) for k, v in interop.read(path).tensors.items()}
  assert tensors["body.0.weight"].shape == (12, 3, 5, 5) and tensors["fc.0.weight"].shape == (10, 768)
  want = np_lenet_zhu(tensors, photos[:3])
  got = model.apply_fn(model.variables, jnp.asarray(photos[:3]))
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_chw_permutation_against_explicit_indices():
  c, h, w = 3, 2, 4
  perm = interop.chw_permutation((c, h, w))
  for hh in range(h):
    for ww in range(w):
      for cc in range(c):
        assert perm[(hh * w + ww) * c + cc] == cc * h * w + hh * w + ww
  entry = interop.Entry("fc.weight", ("params", "head", "kernel"), "dense", (c, h, w))
  torch_w = np.random.default_rng(0).normal(size=(5, c * h * w))
  back = interop.to_torch(entry, interop.to_gradjax(entry, torch_w))
  np.testing.assert_array_equal(back, torch_w)


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_write_keeps_shapes_and_metadata_and_refuses_the_reserved_name(tmp_path, fmt):
  """A scalar tensor comes back 0-d and a transposed one as written; booleans in lists are
  written true/false; the metadata's entry name, or metadata nested deeper than a list, refused."""
  path = tmp_path / f"t.{fmt}"
  w = np.arange(6, dtype=np.float32).reshape(2, 3).T
  interop.write(path, {"s": np.float32(3.0), "w": w}, {"flags": [True, False], "shape": (32, 32, 3)})
  back = interop.read(path)
  assert back.tensors["s"].shape == () and float(back.tensors["s"]) == 3.0
  np.testing.assert_array_equal(back.tensors["w"], w)
  assert (back.metadata["flags"], back.metadata["shape"]) == ("true,false", "32,32,3")
  with pytest.raises(ValueError, match="other than '__metadata__'"):
    interop.write(path, {"__metadata__": np.ones(2, np.float32)})
  with pytest.raises(ValueError, match="must be a string, number or boolean, or a list of them"):
    interop.write(path, {"w": w}, {"nested": [[1, 2], [3]]})


@pytest.mark.parametrize("name, fmt", [(name, "safetensors") for name in ZOO] + [("convnet-2", "npz")])
@pytest.mark.slow
def test_round_trip_is_exact(tmp_path, name, fmt):
  model = _with_random_stats(_model(name))
  y = np.array([3, 7])
  rng = np.random.default_rng(1)
  gradient = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), model.variables["params"])
  obs = Observation(gradient=gradient, variables=model.variables, labels=y, num_samples=2)
  w_path, g_path = tmp_path / f"w.{fmt}", tmp_path / f"g.{fmt}"
  mapping = interop.zoo_mapping(model)
  interop.save_weights(w_path, model, mapping)
  interop.save_observation(g_path, obs, mapping, model)
  imported = interop.load(w_path, g_path)
  assert imported.model.name == name and imported.model.num_classes == 10
  for a, b in zip(jax.tree.leaves(imported.model.variables), jax.tree.leaves(model.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert jax.tree.structure(imported.model.variables) == jax.tree.structure(model.variables)
  for a, b in zip(jax.tree.leaves(imported.observation.gradient), jax.tree.leaves(obs.gradient)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  o = imported.observation
  assert (o.num_samples, o.threat_model, o.train, o.local) == (2, "fedsgd", False, None)
  np.testing.assert_array_equal(np.asarray(o.labels), y)


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_a_text_models_capture_round_trips_through_load(tmp_path, name):
  """save_weights and save_observation of a text model, read back by interop.load with no argument:
  the sentences' length and the sizes (its heads are in no tensor's shape) from the metadata, the
  vocabulary from the embedding; the gradient exact. Without the sizes, or with a text client's
  (N, T) labels, one line."""
  from gradjax import corpus
  sizes = models.TextSizes(32, 4, 64, 2)
  model = models.create(name, jax.random.key(0), input_shape=(8,), num_classes=60, text_sizes=sizes)
  ids = np.random.default_rng(0).integers(2, 58, size=(2, 8)).astype(np.int32)
  x, y = corpus.language_model_pairs(ids, 1)
  observation = clients.fedsgd(model.apply_fn, model.variables, x, y)
  mapping = interop.zoo_mapping(model)
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "g.safetensors", observation, mapping, model)
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "g.safetensors")
  assert (imported.model.name, imported.model.input_shape, imported.model.num_classes) == (name, (8,), 60)
  assert [getattr(imported.model.apply_fn.module, f) for f in sizes._fields] == list(sizes)
  for a, b in zip(jax.tree.leaves(imported.observation.gradient), jax.tree.leaves(observation.gradient)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for kind in ("w", "g"):  # files whose metadata name the model and its length only
    bare = interop.read(tmp_path / f"{kind}.safetensors")
    interop.write(tmp_path / f"bare_{kind}.safetensors", bare.tensors,
                  {"model": name, "input_shape": "8", "num_samples": "2"})
  with pytest.raises(ValueError, match="heads are not in its tensors' shapes"):
    interop.load(tmp_path / "bare_w.safetensors", tmp_path / "bare_g.safetensors")
  assert interop.load(tmp_path / "bare_w.safetensors", tmp_path / "bare_g.safetensors",
                      text_sizes=sizes).model.input_shape == (8,)
  shared = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True)
  with pytest.raises(ValueError, match="not written"):
    interop.save_observation(tmp_path / "s.safetensors", shared, mapping, model)


def test_fedavg_weights_after_and_update(tmp_path, photos):
  model = _model("lenet_zhu")
  local = clients.LocalTraining(epochs=2, batch_size=1, learning_rate=0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, photos[:2], np.array([1, 2]), local,
                       share_labels=True)
  mapping = interop.zoo_mapping(model)
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "u.safetensors", obs, mapping, model)
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "u.safetensors")
  assert imported.observation.local == local and imported.observation.threat_model == "fedavg"
  for a, b in zip(jax.tree.leaves(imported.observation.gradient), jax.tree.leaves(obs.gradient)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The same client as a PyTorch system reports it: the weights after local training.
  after = jax.tree.map(jnp.subtract, model.variables["params"], obs.gradient)
  tensors = interop.variables_to_torch({**model.variables, "params": after}, mapping)
  interop.write(tmp_path / "after.npz", tensors,
                {"kind": "weights", "local_lr": 0.1, "local_epochs": 2, "local_batch_size": 1,
                 "labels": "1,2"})
  got = interop.load(tmp_path / "w.safetensors", tmp_path / "after.npz").observation
  assert got.local == local and got.num_samples == 2
  for a, b in zip(jax.tree.leaves(got.gradient), jax.tree.leaves(obs.gradient)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_rename_rules_read_torchvision_names(tmp_path):
  model = _with_random_stats(_model("resnet8"))
  tensors = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
  tv = {k.replace("shortcut", "downsample").replace("linear.", "fc."): v for k, v in tensors.items()}
  interop.write(tmp_path / "w.safetensors", tv, {"model": "resnet8"})
  interop.write(tmp_path / "g.safetensors",
                {k: v for k, v in tv.items() if "running" not in k and "num_batches" not in k})
  with pytest.raises(ValueError, match="missing tensor 'linear.weight'"):
    interop.load(tmp_path / "w.safetensors", tmp_path / "g.safetensors")
  rules = interop.parse_renames(r"downsample=shortcut,^fc\.=linear.")
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "g.safetensors", rename=rules)
  for a, b in zip(jax.tree.leaves(imported.model.variables), jax.tree.leaves(model.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rename_rules_read_inversefeds_resnet_names(tmp_path):
  """Inverting Gradients' code (inversefed) keeps its stages in ``layers.{0,1,2}`` and names the
  shortcut ``downsample`` and the head ``fc``: the README's rules read it as the zoo's ResNet."""
  model = _with_random_stats(_model("resnet8"))
  tensors = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
  theirs = {}
  for k, v in tensors.items():
    for s in (1, 2, 3):
      k = k.replace(f"layer{s}.", f"layers.{s - 1}.") if k.startswith(f"layer{s}.") else k
    theirs[k.replace("shortcut", "downsample").replace("linear.", "fc.")] = v
  assert "layers.2.0.downsample.0.weight" in theirs and "fc.weight" in theirs
  interop.write(tmp_path / "w.safetensors", theirs, {"model": "resnet8"})
  interop.write(tmp_path / "g.safetensors",
                {k: v for k, v in theirs.items() if "running" not in k and "num_batches" not in k})
  rules = interop.parse_renames(r"^layers\.0\.=layer1.,^layers\.1\.=layer2.,^layers\.2\.=layer3.,"
                                r"downsample=shortcut,^fc\.=linear.")
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "g.safetensors", rename=rules)
  for a, b in zip(jax.tree.leaves(imported.model.variables), jax.tree.leaves(model.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_module_mapping_for_a_custom_model():
  import flax.linen as nn

  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      x = nn.relu(nn.Conv(4, (3, 3), padding="VALID")(x))
      return nn.Dense(5, name="head")(x.reshape(x.shape[0], -1))

  variables = Tiny().init(jax.random.key(0), jnp.zeros((1, 6, 6, 2)))
  mapping = interop.module_mapping(variables, [("0", "Conv_0", "conv"), ("3", "head", "dense", (4, 4, 4))])
  assert [e.name for e in mapping.entries] == ["0.weight", "0.bias", "3.weight", "3.bias"]
  with pytest.raises(ValueError, match="no module 'Dense_0'"):
    interop.module_mapping(variables, [("0", "Conv_0", "conv"), ("3", "Dense_0", "dense")])
  with pytest.raises(ValueError, match="unmapped"):
    interop.module_mapping(variables, [("0", "Conv_0", "conv")])


# --- malformed files -----------------------------------------------------------------------------

@pytest.fixture
def lenet_files(tmp_path, photos):
  model = _model("lenet_zhu")
  # Photo 0 with its label in that source, so --dataset=skimage is this client's ground truth.
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([0]))
  mapping = interop.zoo_mapping(model)
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "g.safetensors", obs, mapping, model)
  return tmp_path / "w.safetensors", tmp_path / "g.safetensors"


def _rewrite(src, dst, change):
  f = interop.read(src)
  tensors, meta = change(dict(f.tensors), dict(f.metadata))
  interop.write(dst, tensors, meta)
  return dst


def _nan(t, m):
  t["body.2.bias"] = t["body.2.bias"].copy()
  t["body.2.bias"][1] = np.nan
  return t, m


@pytest.mark.parametrize("change, message", [
    (lambda t, m: ({k: v for k, v in t.items() if k != "body.2.weight"}, m), "missing tensor 'body.2.weight'"),
    (lambda t, m: ({**t, "body.9.weight": t["body.0.weight"]}, m),
     "unexpected tensor 'body.9.weight'.*the file has tensors the model does not: body.9.weight"),
    (lambda t, m: ({**t, "body.4.weight": t["body.4.weight"][:, :, :3]}, m), r"'body.4.weight' has shape \(12, 12, 3, 5\)"),
    (lambda t, m: ({**t, "fc.0.bias": t["fc.0.bias"].astype(np.int32)}, m), "'fc.0.bias' has dtype int32"),
    (_nan, "'body.2.bias' contains NaN"),
    (lambda t, m: (t, {**m, "kind": "delta"}), "kind 'delta'"),
    (lambda t, m: (t, {**m, "labels": "1,2", "num_samples": "1"}), "2 labels for 1 samples"),
    (lambda t, m: (t, {**m, "labels": "x"}), "comma-separated integers"),
    (lambda t, m: (t, {**m, "labels": "99999999999999999999"}), "labels must be 32-bit integers"),
    (lambda t, m: (t, {**m, "input_shape": "32,x"}), r"bad.safetensors: metadata input_shape"),  # not the weights'
    (lambda t, m: (t, {**m, "layout": "gradjax"}), "layout 'gradjax'"),
    (lambda t, m: (t, {**m, "labels": "42"}), "label 42 is not a class of the model, which has 10"),
    (lambda t, m: (t, {**m, "loss_reduction": "max"}), "loss_reduction must be mean or sum"),
    (lambda t, m: ({("fc.1" + k[4:] if k.startswith("fc.0") else k): v for k, v in t.items()}, m),
     "the model expects fc.0.bias, fc.0.weight, the file has fc.1.bias, fc.1.weight instead"),
])
def test_malformed_observation_one_line(lenet_files, tmp_path, change, message):
  w, g = lenet_files
  bad = _rewrite(g, tmp_path / "bad.safetensors", change)
  with pytest.raises(ValueError, match=message) as e:
    interop.load(w, bad)
  assert "\n" not in str(e.value)


def _torch_save_like(path):
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
    z.writestr("archive/version", "3")


def _truncate(src, dst, keep):
  data = open(src, "rb").read()
  open(dst, "wb").write(data[:keep(len(data))])


@pytest.mark.parametrize("make, message", [
    (lambda src, dst: open(dst, "wb").write(pickle.dumps({"fc.0.bias": np.zeros(10)})), "refusing to unpickle"),
    (lambda src, dst: _torch_save_like(dst), "torch.save archive"),
    (lambda src, dst: _truncate(src, dst, lambda n: n - 100), "truncated"),
    (lambda src, dst: _truncate(src, dst, lambda n: 50), "truncated"),
    (lambda src, dst: open(dst, "wb").write(b"hello world, not tensors"), "neither a safetensors nor an .npz"),
    (lambda src, dst: np.savez(open(dst, "wb"), x=np.array([{"a": 1}], dtype=object)), "Python objects"),
    (lambda src, dst: open(dst, "wb").write(open(str(src).replace("g.safetensors", "g.npz"), "rb").read()[:300]), "corrupt or truncated"),
])
def test_corrupt_files_one_line(lenet_files, tmp_path, make, message):
  w, g = lenet_files
  interop.write(tmp_path / "g.npz", interop.read(g).tensors, interop.read(g).metadata)
  bad = tmp_path / "bad.bin"
  make(g, bad)
  with pytest.raises(ValueError, match=message) as e:
    interop.load(w, bad)
  assert "\n" not in str(e.value)


def test_directory_and_wrong_model(lenet_files, tmp_path):
  w, g = lenet_files
  with pytest.raises(ValueError, match="is a directory"):
    interop.load(tmp_path, g)
  with pytest.raises(ValueError, match="missing tensor 'linear.weight'.*resnet20 state_dict") as e:
    interop.load(w, g, model="resnet20")
  # The names it expects and those the file has, and where another architecture's mapping is built.
  assert "the model expects bn1.bias" in str(e.value) and "the file has body.0.bias" in str(e.value)
  assert "gradjax.interop.module_mapping" in str(e.value) and "\n" not in str(e.value)


# --- PyTorch itself ------------------------------------------------------------------------------

def readme_snippet() -> str:
  """The PyTorch export snippet of the README (section "Auditing a PyTorch system"), run as written."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
  section = text[text.index("## Auditing a PyTorch system"):]
  return section[section.index("```python\n") + 10:section.index("```\n", section.index("```python"))]


def _torch_models():
  """torch, and the PyTorch twins of lenet_zhu and the CIFAR ResNets that the Flower example's
  clients train (examples/flower_audit/flower_audit/task.py): DLG's LeNet and kuangliu's names."""
  torch = pytest.importorskip("torch")
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                      "flower_audit", "flower_audit", "task.py")
  spec = importlib.util.spec_from_file_location("flower_audit_task", path)
  task = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(task)
  return torch, task.LeNet, task.ResNet


def _export_with_snippet(torch, model, x_nhwc, y, tmp_path, name):
  namespace = {}
  exec(readme_snippet(), namespace)
  x = torch.tensor(np.transpose(x_nhwc, (0, 3, 1, 2)))
  w, g = tmp_path / f"{name}_w.safetensors", tmp_path / f"{name}_g.safetensors"
  namespace["export"](model, x, torch.tensor(y, dtype=torch.int64), str(w), str(g), name)
  return w, g


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
@pytest.mark.parametrize("which", ["lenet_zhu", "resnet8-2"])
@pytest.mark.slow
def test_pytorch_gradient_equals_gradjax(tmp_path, photos, which):
  torch, LeNet, ResNet = _torch_models()
  torch.manual_seed(0)
  net = LeNet(10) if which == "lenet_zhu" else ResNet(1, 2, 10)  # resnet8-2: n = 1, width 2
  if which != "lenet_zhu":  # trained-looking BatchNorm statistics and affine parameters
    for m in net.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.running_mean.uniform_(-0.2, 0.2), m.running_var.uniform_(0.5, 1.5)
        m.weight.data.uniform_(0.8, 1.2), m.bias.data.uniform_(-0.1, 0.1)
  x, y = photos[:2], np.array([3, 5])
  w, g = _export_with_snippet(torch, net, x, y, tmp_path, which)
  imported = interop.load(w, g, conv="xla")
  model = imported.model
  with torch.no_grad():
    want = net.eval()(torch.tensor(np.transpose(x, (0, 3, 1, 2)))).numpy()
  np.testing.assert_allclose(np.asarray(model.apply_fn(model.variables, jnp.asarray(x))), want,
                             rtol=1e-4, atol=1e-4)
  own = clients.fedsgd(model.apply_fn, model.variables, x, y)
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(own.gradient),
                        jax.tree.leaves(own.gradient), jax.tree.leaves(imported.observation.gradient)):
    scale = float(np.abs(np.asarray(a)).max()) + 1e-12
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5 * scale + 1e-7,
                               err_msg=jax.tree_util.keystr(path[0]))
  np.testing.assert_array_equal(np.asarray(imported.observation.labels), y)


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
@pytest.mark.slow
def test_zoo_twins_load_the_exported_weights_strictly_and_give_the_same_logits(photos):
  """Each image model's PyTorch twin (its ModelSpec's torch_module, used by the benchmarks' baselines)
  is named as interop exports the model: ``load_state_dict(strict=True)`` takes
  ``variables_to_torch`` whole, and PyTorch's forward pass of those weights gives gradjax's logits."""
  torch = pytest.importorskip("torch")
  x = photos[:2]
  for name in ZOO:
    model = _with_random_stats(_model(name))
    spec = models.family(name)
    twin = spec.torch_module(spec.parse(name), torch, (32, 32, 3), 10)
    tensors = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
    twin.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in tensors.items()}, strict=True)
    with torch.no_grad():
      want = twin.eval()(torch.tensor(np.transpose(x, (0, 3, 1, 2)))).numpy()
    np.testing.assert_allclose(np.asarray(model.apply_fn(model.variables, jnp.asarray(x))), want,
                               rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.isolated  # imports torch
@pytest.mark.slow
@pytest.mark.usefixtures("optimised_step")  # a long optimisation (tests/conftest.py)
def test_dlg_on_pytorch_gradient_reaches_30db(tmp_path, photos):
  from gradjax import attacks, metrics, presets
  torch, LeNet, _ = _torch_models()
  torch.manual_seed(1)
  net = LeNet(10)
  for p in net.parameters():  # DLG's weights_init: U(-0.5, 0.5)
    p.data.uniform_(-0.5, 0.5)
  x, y = photos[5:6], np.array([2])
  w, g = _export_with_snippet(torch, net, x, y, tmp_path, "lenet_zhu")
  imported = interop.load(w, g)
  obs = imported.observation.replace(labels=None)  # the gradient alone
  rec = attacks.reconstruct(presets.dlg(), imported.model.apply_fn, obs,
                            jax.random.key(0), input_shape=(32, 32, 3))
  psnr = metrics.score(np.clip(np.asarray(rec.x), 0, 1), x)["psnr"]
  print(f"DLG from a PyTorch gradient: {psnr:.2f} dB")
  assert psnr >= 30


# --- the command line ----------------------------------------------------------------------------

def _cli(*args):
  import subprocess
  import sys
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "gradjax", "reconstruct", *args],
                        capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_cli_attacks_captured_files(lenet_files, tmp_path, photos):
  import skimage.metrics
  w, g = lenet_files
  out = tmp_path / "blind"
  proc = _cli(f"--weights={w}", f"--observation={g}", "--iterations=200", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((out / "metrics.json").read_text())
  assert "psnr" not in results and results["num_samples"] == 1 and results["model"] == "lenet_zhu"
  assert "no ground truth" in proc.stdout and f"objective {results['loss']:.3e}" in proc.stdout
  rec = np.load(out / "reconstruction.npy", allow_pickle=False)
  assert rec.shape == (1, 32, 32, 3) and rec.dtype == np.float32 and 0 <= rec.min() <= rec.max() <= 1
  page = (out / "report.html").read_text()
  assert "data:image/svg+xml;base64," in page and f"{results['loss']:.4g}" in page
  # With the client's image (the fixture's: skimage photo 0) as ground truth, the printed PSNR is
  # scikit-image's on the written reconstruction.
  out = tmp_path / "scored"
  proc = _cli(f"--weights={w}", f"--observation={g}", "--iterations=200", "--dataset=skimage",
              "--image_size=32", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((out / "metrics.json").read_text())
  rec = np.load(out / "reconstruction.npy").astype(np.float64)
  want = skimage.metrics.peak_signal_noise_ratio(photos[0].astype(np.float64), rec[0], data_range=1)
  assert results["psnr"] == pytest.approx(want, rel=1e-6)
  assert f"PSNR {results['psnr']:.2f} dB" in proc.stdout


BAD_CAPTURES = [
    (lambda w, g, bad: open(bad, "wb").write(pickle.dumps({"fc.0.bias": np.zeros(10)})), "refusing to unpickle"),
    (lambda w, g, bad: open(bad, "wb").write(open(g, "rb").read()[:-50]), "truncated"),
    (lambda w, g, bad: _rewrite(g, bad, _nan), "contains NaN"),
    (lambda w, g, bad: _rewrite(g, bad, lambda t, m: ({k: v for k, v in t.items() if k != "fc.0.bias"}, m)),
     "missing tensor 'fc.0.bias'"),
    (lambda w, g, bad: os.mkdir(bad), "is a directory"),
    # A count of 0 local epochs is no schedule, not the default's one epoch.
    (lambda w, g, bad: _rewrite(g, bad, lambda t, m: (t, {**m, "kind": "update", "local_lr": "0.1",
                                                          "local_epochs": "0"})), "epochs >= 1"),
    (lambda w, g, bad: None, "does not exist"),
]


def test_cli_bad_captured_files_exit_2(lenet_files, tmp_path):
  """Each bad capture: exit 2 and one ``error:`` line naming what is wrong, no traceback (the cases
  share one process)."""
  from test_cli import run_in_one_process
  w, g = lenet_files
  cases = []
  for k, (make, _) in enumerate(BAD_CAPTURES):
    bad = tmp_path / f"bad{k}.safetensors"
    make(w, g, bad)
    cases.append((["gradjax", "reconstruct", f"--weights={w}", f"--observation={bad}",
                   f"--output_dir={tmp_path / f'out{k}'}"], tmp_path))
  for (_, message), proc in zip(BAD_CAPTURES, run_in_one_process(cases), strict=True):
    assert proc.returncode == 2, (message, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, (message, proc.stderr[-2000:])


def test_a_channel_count_that_contradicts_the_capture_is_refused(tmp_path, photos):
  """--config.data.channels=1 on a capture of a 3-channel model: refused by name, not ignored and recorded."""
  from gradjax.run import config, pipeline
  model = _model("lenet_zhu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([1]))
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "g.safetensors", obs, interop.zoo_mapping(model), model)
  cfg = config.from_options({
      "model.weights": str(tmp_path / "w.safetensors"),
      "client.observation": str(tmp_path / "g.safetensors"), "data.channels": 1
  })
  with pytest.raises(ValueError, match="--config.data.channels=1, but the captured model takes 3-channel inputs"):
    pipeline._captured(cfg, None, "auto")
  assert pipeline._captured(
      config.from_options({
          "model.weights": cfg.model.weights, "client.observation": cfg.client.observation,
          "data.channels": 3
      }), None, "auto")[0].input_shape[-1] == 3


@pytest.mark.isolated  # imports torch
@pytest.mark.slow
def test_pytorch_client_returning_its_batch_norm_buffers_reveals_its_moments(tmp_path, photos):
  """A PyTorch client trains a BatchNorm ResNet in training mode for one SGD step and returns its
  whole state_dict: the import reads the batch's moments off the running statistics (PyTorch's
  momentum, unbiased variance), equal to those of gradjax's own client on the same batch."""
  torch, _, ResNet = _torch_models()
  torch.manual_seed(0)
  net = ResNet(1, 2, 10)
  for m in net.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
      m.running_mean.uniform_(-0.2, 0.2), m.running_var.uniform_(0.5, 1.5)
  sent = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
  x, y = photos[:4], np.array([3, 5, 5, 1])
  net.train()
  optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
  loss = torch.nn.functional.cross_entropy(net(torch.tensor(np.transpose(x, (0, 3, 1, 2)))),
                                           torch.tensor(y))
  optimizer.zero_grad(), loss.backward(), optimizer.step()
  after = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
  meta = {"model": "resnet8-2", "kind": "weights", "train": "true", "local_lr": "0.05",
          "labels": "3,5,5,1"}
  interop.write(tmp_path / "w.safetensors", sent, {"model": "resnet8-2"})
  interop.write(tmp_path / "after.safetensors", after, meta)
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "after.safetensors", conv="xla")
  model = imported.model
  own = clients.fedavg(model.apply_fn, model.variables, x, y, clients.LocalTraining(learning_rate=0.05),
                       train=True, share_statistics=True)
  assert imported.observation.moments is not None
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(own.moments),
                        jax.tree.leaves(own.moments), jax.tree.leaves(imported.observation.moments)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5,
                               err_msg=jax.tree_util.keystr(path[0]))
  # Buffers as sent (a client in evaluation mode) or a state without them: no moments.
  interop.write(tmp_path / "no_buffers.safetensors",
                {k: v for k, v in after.items() if "running" not in k and "num_batches" not in k}, meta)
  assert interop.load(tmp_path / "w.safetensors", tmp_path / "no_buffers.safetensors",
                      conv="xla").observation.moments is None
  some = {k: v for k, v in after.items() if k != "bn1.running_var"}
  interop.write(tmp_path / "some.safetensors", some, meta)
  with pytest.raises(ValueError, match="all or none"):
    interop.load(tmp_path / "w.safetensors", tmp_path / "some.safetensors", conv="xla")


def test_a_batch_size_that_contradicts_the_capture_is_refused(tmp_path, photos):
  """--batch_size=2 beside a one-sample capture and its ground truth: refused by name, not ignored
  (the ground truth is the capture's count of images from --index)."""
  from gradjax.run import config, pipeline
  model = _model("lenet_zhu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([1]))
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "g.safetensors", obs, interop.zoo_mapping(model), model)
  cfg = config.from_options({
      "model.weights": str(tmp_path / "w.safetensors"), "client.observation": str(tmp_path / "g.safetensors"),
      "data.dataset": "skimage", "data.image_size": 32, "data.index": 3, "data.batch_size": 2,
      "output.lpips": "none"
  })
  with pytest.raises(ValueError, match=r"--batch_size=2, but the capture holds 1 sample: its ground truth is images 3..3"):
    pipeline.run(cfg)


def _safetensors_bytes(entries, metadata=None):
  """A safetensors file built by hand from (name, dtype name, array) rows, as the format's
  specification lays it out: u64 header size, JSON header, then the tensors' bytes in order."""
  header, body = {}, b""
  for name, dtype, array in entries:
    raw = np.ascontiguousarray(array).tobytes()
    header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [len(body), len(body) + len(raw)]}
    body += raw
  if metadata is not None:
    header["__metadata__"] = metadata
  text = json.dumps(header).encode()
  return len(text).to_bytes(8, "little") + text + body


def test_safetensors_of_every_width_are_read_and_brain_floats_become_float32(tmp_path):
  import ml_dtypes
  from safetensors.numpy import save
  values = np.array([[0.1, -2.5, 3.0e4], [1e-3, 0.0, -7.25]])
  entries = [("bf16", "BF16", values.astype(ml_dtypes.bfloat16)),
             ("e4m3", "F8_E4M3", np.clip(values, -448, 448).astype(ml_dtypes.float8_e4m3fn)),
             ("e5m2", "F8_E5M2", values.astype(ml_dtypes.float8_e5m2)),
             ("f16", "F16", values.astype(np.float16)), ("f64", "F64", values),
             ("i64", "I64", np.arange(6, dtype=np.int64).reshape(2, 3)),
             ("u8", "U8", np.arange(3, dtype=np.uint8)), ("empty", "F32", np.zeros((0, 4), np.float32))]
  path = tmp_path / "widths.safetensors"
  path.write_bytes(_safetensors_bytes(entries, {"kind": "gradient"}))
  read = interop.read(path)
  assert read.metadata == {"kind": "gradient"}
  for name, _, array in entries:
    want = array.astype(np.float32) if array.dtype.kind == "V" else array  # ml_dtypes' exact widening
    assert read.tensors[name].dtype == want.dtype and np.array_equal(read.tensors[name], want), name
  # What safetensors' own writer writes reads back the same.
  arrays = {"a": values.astype(np.float32), "b": np.arange(4, dtype=np.int32)}
  (tmp_path / "own.safetensors").write_bytes(save(arrays, metadata={"x": "1"}))
  again = interop.read(tmp_path / "own.safetensors")
  assert again.metadata == {"x": "1"} and all(np.array_equal(again.tensors[k], v) for k, v in arrays.items())


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["a"].update(dtype="C64"), "has dtype C64, which gradjax does not read"),
    (lambda h: h["a"].update(data_offsets=[0, 10 ** 9]), "lies at bytes 0-1000000000"),
    (lambda h: h["a"].update(shape=[5, 5]), "needs 100 bytes, its offsets give 24"),
    (lambda h: h["a"].pop("dtype"), "needs a dtype, a shape and two data offsets"),
    (lambda h: h["a"].update(shape=[-1]), "needs a dtype, a shape and two data offsets"),
])
def test_a_corrupt_safetensors_header_is_one_line(tmp_path, edit, message):
  data = _safetensors_bytes([("a", "F32", np.ones((2, 3), np.float32))])
  size = int.from_bytes(data[:8], "little")
  header = json.loads(data[8:8 + size])
  edit(header)
  text = json.dumps(header).encode()
  (tmp_path / "bad.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
  with pytest.raises(ValueError, match=message) as e:
    interop.read(tmp_path / "bad.safetensors")
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_capture_replaced_since_its_state_was_saved_is_another_run(lenet_files, tmp_path):
  """A saved state records the digests of the files attacked: the same command on a file of the
  same name and other content does not continue it; the file as it was does."""
  import signal
  import subprocess
  import sys
  import time
  w, g = lenet_files
  original = g.read_bytes()
  out = tmp_path / "run"
  args = [f"--weights={w}", f"--observation={g}", "--iterations=3000", "--save_every_s=0",
          "--config.execution.chunk=10", f"--output_dir={out}"]
  proc = subprocess.Popen([sys.executable, "-m", "gradjax", "reconstruct", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  deadline = time.monotonic() + 240
  while not (out / "state.npz").exists() and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
  _rewrite(g, g, lambda t, m: ({k: v * 2 for k, v in t.items()}, m))
  refused = _cli(*args, "--resume")
  assert_one_line_error(refused, "belongs to another run (input_sha256")
  g.write_bytes(original)
  resumed = _cli(*args, "--resume")
  assert resumed.returncode == 0 and "(resumed)" in resumed.stdout, resumed.stderr[-2000:]


def _raw_header(path, edit, tail=b""):
  """The safetensors file at ``path`` with its JSON header changed by ``edit`` (a dict in place) and
  ``tail`` appended to its data, written beside it as bytes (the format's own writer would refuse)."""
  data = path.read_bytes()
  size = int.from_bytes(data[:8], "little")
  header = json.loads(data[8:8 + size])
  edit(header)
  text = json.dumps(header).encode()
  out = path.with_name("raw_" + path.name)
  out.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:] + tail)
  return out


@pytest.mark.parametrize("edit, tail, message", [
    # The last bias made to read the first tensor's bytes: its own are then data no tensor names.
    (lambda h: h["fc.0.bias"].update(data_offsets=[0, 40]), b"", "inside another tensor"),
    (lambda h: None, b"\0" * 7, "its tensors end at byte"),
    (lambda h: h.pop("fc.0.bias"), b"", "after a gap"),
])
def test_safetensors_whose_tensors_do_not_tile_the_data_are_refused(lenet_files, edit, tail, message):
  """The format requires the tensors' byte ranges to cover the data exactly, once: overlapping ranges
  or bytes no tensor names are a corrupt (or crafted) file, not numbers to attack."""
  _, g = lenet_files
  with pytest.raises(ValueError, match=message) as e:
    interop.read(_raw_header(g, edit, tail))
  assert "\n" not in str(e.value)


def test_read_metadata_is_the_files_metadata_without_its_tensors(lenet_files, tmp_path):
  """A safetensors file's metadata from its header alone (the tensors after it cut off here, so a
  read of them would fail), an .npz's as read() gives them."""
  w, g = lenet_files
  for path in (w, g):
    assert interop.read_metadata(path) == interop.read(path).metadata
  data = g.read_bytes()
  header = 8 + int.from_bytes(data[:8], "little")
  (tmp_path / "head.safetensors").write_bytes(data[:header])
  assert interop.read_metadata(tmp_path / "head.safetensors") == interop.read(g).metadata
  f = interop.read(g)
  interop.write(tmp_path / "g.npz", f.tensors, f.metadata)
  assert interop.read_metadata(tmp_path / "g.npz") == f.metadata


def test_a_capture_declaring_its_dp_sgd_sets_the_options(lenet_files, tmp_path):
  """Metadata ``dp_sgd_*`` (strings in safetensors) are read as the numbers they write and set the
  configuration's DP-SGD options (gradjax.run.config.with_declared); the same values given as
  options agree, options left at their defaults take the declaration, one set to another value is
  refused, and a capture that declares none leaves the configuration as it was."""
  from gradjax.run import config
  w, g = lenet_files
  declared = _rewrite(g, tmp_path / "dp.safetensors", lambda t, m: (t, {
      **m, "dp_sgd_max_norm": 1.5, "dp_sgd_noise_multiplier": 0.75, "dp_sgd_steps": 300}))
  assert interop.declared_dp_sgd(interop.read_metadata(declared), "dp") == {
      "dp_sgd_max_norm": 1.5, "dp_sgd_noise_multiplier": 0.75, "dp_sgd_steps": 300}
  cfg = config.from_options({"model.weights": str(w), "client.observation": str(declared)})
  got = config.with_declared(cfg).defense
  assert (got.dp_sgd_max_norm, got.dp_sgd_noise_multiplier, got.dp_sgd_steps,
          got.dp_sgd_sampling_rate) == (1.5, 0.75, 300, 1.0)
  same = config.replace(cfg, {"defense.dp_sgd_max_norm": 1.5, "defense.dp_sgd_noise_multiplier": 0.75,
                              "defense.dp_sgd_steps": 300, "defense.dp_sgd_sampling_rate": 0.1})
  assert config.with_declared(same) == same
  # An option left at its default takes the declaration; one set otherwise is refused.
  bound = config.with_declared(config.replace(cfg, {"defense.dp_sgd_max_norm": 1.5})).defense
  assert (bound.dp_sgd_noise_multiplier, bound.dp_sgd_steps) == (0.75, 300)
  with pytest.raises(ValueError, match="declares dp_sgd_steps=300, but --config.defense.dp_sgd_steps=100"):
    config.with_declared(config.replace(cfg, {"defense.dp_sgd_steps": 100}))
  # The noise multiplier alone, agreeing with the capture's, which gives the bound: accepted; another
  # one is the capture's contradiction; without a capture's bound it needs one.
  noise = config.replace(cfg, {"defense.dp_sgd_noise_multiplier": 0.75})
  assert config.with_declared(noise).defense == got
  with pytest.raises(ValueError, match="declares dp_sgd_noise_multiplier=0.75, but"):
    config.with_declared(config.replace(cfg, {"defense.dp_sgd_noise_multiplier": 2.0}))
  plain = config.from_options({"model.weights": str(w), "client.observation": str(g)})
  assert config.with_declared(plain) is plain
  with pytest.raises(ValueError, match="give --config.defense.dp_sgd_max_norm too .or a capture"):
    config.with_declared(config.replace(plain, {"defense.dp_sgd_noise_multiplier": 1.0}))
  # A defense the capture declares that is none: the file is named.
  from gradjax.run import pipeline
  bad = _rewrite(g, tmp_path / "bad_defense.safetensors", lambda t, m: (t, {**m, "defense": "prune:2"}))
  with pytest.raises(ValueError, match="bad_defense.safetensors: its metadata 'defense': bad defense 'prune:2'"):
    pipeline.run(config.from_options({"model.weights": str(w), "client.observation": str(bad),
                                      "data.dataset": None}))
  with pytest.raises(ValueError, match="metadata 'dp_sgd_steps' must be an integer"):
    interop.declared_dp_sgd({"dp_sgd_max_norm": "1", "dp_sgd_steps": "many"}, "dp")


@pytest.mark.slow
def test_the_verdict_counts_a_pruned_captures_nonzero_entries_against_the_datas_values(
    lenet_files, tmp_path, monkeypatch):
  """Without a ground truth the verdict weighs the update's nonzero entries against the values of
  the data matched to it (``verdict.decide``'s constraints): NumPy's count over the capture file's
  tensors, 99 % of each pruned to zero, and N·H·W·C of the reconstruction."""
  from gradjax import verdict
  from gradjax.run import config, pipeline
  w, g = lenet_files

  def prune(tensors, meta):
    kept = {}
    for name, t in tensors.items():
      cut = np.quantile(np.abs(t), 0.99)
      kept[name] = np.where(np.abs(t) > cut, t, 0).astype(t.dtype)
    return kept, meta

  pruned = _rewrite(g, tmp_path / "pruned.safetensors", prune)
  entries = sum(int(np.count_nonzero(t)) for t in interop.read(pruned).tensors.values())
  seen, decide = [], verdict.decide
  monkeypatch.setattr(verdict, "decide", lambda **kw: seen.append(kw["constraints"]) or decide(**kw))
  results, images = pipeline.run(config.from_options({
      "model.weights": str(w), "client.observation": str(pruned), "data.dataset": None,
      "attack.iterations": 2, "output.lpips": "none",
      "client.force": True}))  # (the pruned layers read as a ReLU's zeros)
  assert seen == [(entries, int(np.size(images["reconstruction"])))] == [(entries, 32 * 32 * 3)]
  assert 0 < entries < 32 * 32 * 3


def test_a_capture_declaring_a_bound_and_no_noise_is_read_as_clipping_only_and_said_so(lenet_files, tmp_path):
  """A capture declaring ``dp_sgd_max_norm`` alone: its privacy is read with noise multiplier 0 (no
  guarantee) and marked as not declared; declared 0 explicitly, or noise declared, it is not."""
  from gradjax.run import config, pipeline
  w, g = lenet_files
  for extra, undeclared in (({}, True), ({"dp_sgd_noise_multiplier": 0.0}, False),
                            ({"dp_sgd_noise_multiplier": 0.5}, False)):
    declared = _rewrite(g, tmp_path / "dp.safetensors", lambda t, m: (t, {
        **m, "dp_sgd_max_norm": 1.5, **extra}))
    cfg = config.with_declared(config.from_options(
        {"model.weights": str(w), "client.observation": str(declared)}))
    privacy = pipeline.dp_sgd_privacy(cfg)
    assert privacy["noise_multiplier"] == extra.get("dp_sgd_noise_multiplier", 0.0)
    assert (privacy.get("noise_multiplier_declared") is False) == undeclared
    assert (privacy["epsilon"] is None) == (privacy["noise_multiplier"] == 0)


def test_a_capture_declaring_poisson_sampling_sets_the_options(lenet_files, tmp_path):
  """``dp_sgd_poisson`` (true/false) and ``dp_sgd_expected_batch_size`` (Opacus' divisor) are read
  and set ``defense.dp_sgd_poisson`` and ``defense.dp_sgd_expected_batch_size``; Poisson sampling
  without its rate, a divisor without Poisson sampling, and a bool that is neither are refused."""
  from gradjax.run import config
  w, g = lenet_files
  declared = _rewrite(g, tmp_path / "dp.safetensors", lambda t, m: (t, {
      **m, "dp_sgd_max_norm": 1.5, "dp_sgd_sampling_rate": 0.25, "dp_sgd_poisson": True,
      "dp_sgd_expected_batch_size": 3}))
  assert interop.declared_dp_sgd(interop.read_metadata(declared), "dp") == {
      "dp_sgd_max_norm": 1.5, "dp_sgd_sampling_rate": 0.25, "dp_sgd_poisson": True,
      "dp_sgd_expected_batch_size": 3.0}
  got = config.with_declared(config.from_options(
      {"model.weights": str(w), "client.observation": str(declared)})).defense
  assert (got.dp_sgd_poisson, got.dp_sgd_expected_batch_size, got.dp_sgd().sampling_rate) == (True, 3.0, 0.25)
  for meta, message in (({"dp_sgd_poisson": "true"}, "not its rate dp_sgd_sampling_rate"),
                        ({"dp_sgd_expected_batch_size": "2"}, "declare dp_sgd_poisson=true too"),
                        ({"dp_sgd_poisson": "false", "dp_sgd_expected_batch_size": "2"},
                         "declare dp_sgd_poisson=true too"),
                        ({"dp_sgd_poisson": "yes", "dp_sgd_sampling_rate": "0.5"},
                         "metadata 'dp_sgd_poisson' must be true or false")):
    with pytest.raises(ValueError, match=message):
      interop.declared_dp_sgd({"dp_sgd_max_norm": "1", **meta}, "dp")


@pytest.mark.slow
def test_a_run_of_a_capture_declaring_its_dp_sgd_prints_it_and_is_found_finished(lenet_files, tmp_path):
  """reconstruct on a capture whose metadata declare DP-SGD, no option given: the run prints the
  client's DP-SGD line and records the declared bound; --resume in its folder finds it finished
  (the declaration is applied before the saved configuration is compared, as the run applied it)."""
  w, g = lenet_files
  declared = _rewrite(g, tmp_path / "dp.safetensors", lambda t, m: (t, {
      **m, "dp_sgd_max_norm": 1.5}))
  out = tmp_path / "run"
  args = (f"--weights={w}", f"--observation={declared}", "--iterations=2", f"--output_dir={out}",
          "--lpips=none")
  proc = _cli(*args)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert any(line.startswith("DP-SGD: clipping bound 1.5") for line in proc.stdout.splitlines())
  assert json.loads((out / "metrics.json").read_text())["privacy"]["max_norm"] == 1.5
  proc = _cli(*args, "--resume")
  assert proc.returncode == 0 and "nothing to resume" in proc.stdout, proc.stderr[-2000:]
