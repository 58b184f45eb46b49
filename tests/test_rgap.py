"""gradjax.rgap: one example's input and hidden activations from the gradient of a ReLU chain.

References: the chain's forward pass in NumPy float64 (PyTorch's convolution written out,
tests/test_interop.py), the photos themselves (scikit-image's PSNR)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.metrics

from gradjax import clients, closed_forms, data, models, rgap

from test_interop import np_conv_nchw


def _photo(index, size):
  return data.load("skimage", indices=[index], image_size=(size, size))


def _np_relu_lenet(params, x_nhwc):
  """The outputs of DLG's LeNet's three convolutions with ReLU, NumPy float64, NHWC."""
  h = np.transpose(np.asarray(x_nhwc, np.float64), (0, 3, 1, 2))
  out = []
  for i, stride in enumerate((2, 2, 1)):
    w = np.transpose(np.asarray(params[f"Conv_{i}"]["kernel"], np.float64), (3, 2, 0, 1))  # HWIO->OIHW
    h = np.maximum(np_conv_nchw(h, w, np.asarray(params[f"Conv_{i}"]["bias"], np.float64), stride, 2), 0)
    out.append(np.transpose(h, (0, 2, 3, 1)))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 5])
def test_relu_lenet_hidden_layers_exact_and_the_photo_recognisable(index):
  """DLG's LeNet with ReLU, one 16×16 photo: every hidden activation comes back to float32 rounding
  (against NumPy's forward pass), the label exactly, and the photo, where the first layer leaves
  the system underdetermined, at more than 20 dB."""
  photo = _photo(index, 16)
  model = models.create("lenet_zhu", jax.random.key(index), input_shape=(16, 16, 3), act="relu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photo.x, photo.y)
  found = rgap.rgap(obs, closed_forms.chain(model.apply_fn.module), (16, 16, 3))
  want = _np_relu_lenet(model.variables["params"], photo.x)
  for got, ref in zip(found.activations, want, strict=True):
    assert np.linalg.norm(got - ref) <= 1e-4 * np.linalg.norm(ref)
  assert found.label == int(photo.y[0])
  assert [d["name"] for d in found.layers] == ["Conv_0", "Conv_1", "Conv_2"]
  # The report per layer: its unknowns are its input (the photo, then each ReLU output), its
  # equations the kernel gradient's entries and one forward equation per active output unit
  # (NumPy's forward pass says which), the rank at most the unknowns.
  inputs = [photo.x[0], *want[:2]]
  for i, (layer, inp, out) in enumerate(zip(found.layers, inputs, want)):
    kernel = np.asarray(model.variables["params"][f"Conv_{i}"]["kernel"])
    assert layer["unknowns"] == inp.size and layer["active"] == int(np.sum(out > 0))
    assert layer["equations"] == kernel.size + layer["active"]
    assert layer["rank"] <= layer["unknowns"] and 0 <= layer["residual"] < 1e-5
  psnr = skimage.metrics.peak_signal_noise_ratio(photo.x[0].astype(np.float64),
                                                 np.clip(found.x[0], 0, 1).astype(np.float64),
                                                 data_range=1.0)
  assert psnr > 20, psnr


@pytest.mark.slow
def test_relu_mlp_input_exact():
  """An MLP's dense ReLU layers are determined layer by layer: the photo comes back exactly."""
  photo = _photo(3, 8)
  model = models.create("mlp-64", jax.random.key(1), input_shape=(8, 8, 3), num_classes=10)
  obs = clients.fedsgd(model.apply_fn, model.variables, photo.x, photo.y)
  found = rgap.rgap(obs, closed_forms.chain(model.apply_fn.module), (8, 8, 3))
  np.testing.assert_allclose(found.x.reshape(photo.x.shape), photo.x, atol=1e-4)


def test_a_chain_on_flat_inputs_is_inverted_without_tv():
  """A hand-built dense ReLU chain on 12 flat inputs (no image: TV has no neighbours to compare),
  its gradient by NumPy's backprop: the input comes back exactly."""
  rng = np.random.default_rng(5)
  params = {"Dense_0": {"kernel": rng.normal(0, 0.5, (12, 40)), "bias": rng.normal(0, 0.1, 40)},
            "head": {"kernel": rng.normal(0, 0.5, (40, 5)), "bias": rng.normal(0, 0.1, 5)}}
  x, label = rng.uniform(0, 1, (1, 12)), 3
  a = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
  h = np.maximum(a, 0)
  z = h @ params["head"]["kernel"] + params["head"]["bias"]
  dz = np.exp(z - z.max()) / np.exp(z - z.max()).sum() - np.eye(5)[[label]]
  dh = dz @ params["head"]["kernel"].T * (a > 0)
  grads = {"Dense_0": {"kernel": x.T @ dh, "bias": dh[0]}, "head": {"kernel": h.T @ dz, "bias": dz[0]}}
  from gradjax.observation import Observation
  obs = Observation(gradient=grads, variables={"params": params}, num_samples=1)
  found = rgap.rgap(obs, [rgap.Layer("Dense_0")], (12,))
  np.testing.assert_allclose(found.x.reshape(1, 12), x, atol=1e-6)
  assert found.label == label


def test_refusals(photos):
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), act="relu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.arange(2))
  with pytest.raises(ValueError, match="one example"):
    rgap.rgap(obs, closed_forms.chain(model.apply_fn.module), (32, 32, 3))
  sigmoid = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
  with pytest.raises(ValueError, match="activation is 'sigmoid'"):
    closed_forms.chain(sigmoid.apply_fn.module)
  # A model outside the zoo is named as such first (declaring act=relu would not make it one).
  convnet = models.create("convnet-4", jax.random.key(0), input_shape=(32, 32, 3), act="relu")
  with pytest.raises(ValueError, match="not ConvNet.*rgap.rgap with its rgap.Layer list"):
    closed_forms.chain(convnet.apply_fn.module)
  with pytest.raises(ValueError, match="not this model"):
    closed_forms.chain(None)
  one = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.arange(1))
  with pytest.raises(ValueError, match="biased layer 'Conv_9'"):
    rgap.rgap(one, [rgap.Layer("Conv_9", (1, 1))], (32, 32, 3))


@pytest.mark.slow
def test_auto_runs_rgap_first_on_a_relu_lenet():
  """--attack=auto at batch 1 on DLG's LeNet with ReLU: R-GAP runs first; its input, regularised
  where the first layer leaves it free, does not reproduce the update to the matching bound, so
  Inverting Gradients runs after it, and the reconstruction that matches the update better is kept
  (R-GAP's);
  scored against scikit-image's PSNR, the verdict a leak."""
  from gradjax.run import config, pipeline
  results, images = pipeline.run(
      config.from_options({
          "attack.preset": "auto", "model.act": "relu", "data.index": 2, "output.lpips": "none",
          "attack.iterations": 200
      }))  # Inverting Gradients' budget
  tried = results["auto"]["tried"]
  assert [t["attack"] for t in tried] == ["rgap", "inverting_gradients_batch"]
  assert results["auto"]["chosen"] == min(tried, key=lambda t: t["residual"])["attack"] == "rgap"
  psnr = skimage.metrics.peak_signal_noise_ratio(images["ground_truth"][0].astype(np.float64),
                                                 images["reconstruction"][0], data_range=1.0)
  assert results["psnr"] == pytest.approx(psnr, rel=1e-6) and psnr > 25
  assert results["verdict"]["status"] == "leak" and results["label_accuracy"] == 1.0
  assert [d["name"] for d in results["recursion"]] == ["Conv_0", "Conv_1", "Conv_2"]


CIFAR = os.path.join(data.default_data_dir() or "", "cifar10")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(CIFAR), reason="needs ../shared/data/cifar10")
def test_a_sweep_skips_an_update_that_is_zero(tmp_path):
  """CIFAR-10 test image 7 through the sweep's ReLU LeNet: the model gives its label probability 1
  in float32, so the gradient is zero in every tensor (checked here against NumPy's softmax of the
  model's logits); the sweep says so, skips it and attacks image 8, also when the two are given to
  one solver run (``clients_per_run=2``: the zero update is found as the run is prepared)."""
  from gradjax.run.pipeline import experiment_keys
  image = data.load("cifar10", indices=[7])
  model = models.create("lenet_zhu", experiment_keys(0, 7)[0], input_shape=(32, 32, 3), act="relu")
  logits = np.asarray(model.apply_fn(model.variables, image.x, False), np.float64)[0]
  assert np.argmax(logits) == image.y[0] and np.sort(logits)[-1] - np.sort(logits)[-2] > 104
  # The zero gradient is found before any attack: iDLG for a few steps on image 8 is enough.
  from test_cli import run_in_one_process
  args = ["gradjax", "sweep", "--attack=idlg", "--config.model.act=relu", "--iterations=5",
          "--dataset=cifar10", "--start=7", "--count=2", "--lpips=none"]
  for proc in run_in_one_process([(args + [f"--output_dir={tmp_path / 'sweep'}"], tmp_path), (
      args + ["--config.execution.clients_per_run=2", f"--output_dir={tmp_path / 'together'}"],
      tmp_path)]):
    assert proc.returncode == 0, proc.stderr[-2000:]
  for folder in ("sweep", "together"):
    results = json.loads((tmp_path / folder / "results.json").read_text())
    assert [r["index"] for r in results["rows"]] == [8]
    assert [s["experiment"] for s in results["skipped"]] == ["7"]


@pytest.mark.slow
def test_each_layers_residual_is_the_misfit_of_its_equations_at_the_recovered_input():
  """R-GAP's per-layer residual, against float64 written out here, on an update with noise added
  (so that no input fits it exactly): at the input the layer recovered (the photo, or the ReLU
  output below), the misfit of its kernel gradient (patches times the layer's output error) to the
  observed one and of its pre-activations at the active units to the recovered output less the
  bias, each relative to its target; the residual is their root mean square. The errors as R-GAP
  defines them: the head's weights times its bias gradient, then down each layer's transposed
  convolution (lax's vjp), kept at the units the recovered output holds active."""
  photo = _photo(0, 16)
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(16, 16, 3), act="relu")
  clean = clients.fedsgd(model.apply_fn, model.variables, photo.x, photo.y)
  rng = np.random.default_rng(0)
  noisy = jax.tree.map(lambda g: np.asarray(g, np.float64) * (1 + 1e-3 * rng.normal(size=np.shape(g))),
                       clean.gradient)
  obs = clean.replace(gradient=noisy)
  chain = closed_forms.chain(model.apply_fn.module)
  found = rgap.rgap(obs, chain, (16, 16, 3))
  params = jax.tree.map(lambda v: np.asarray(v, np.float64), model.variables["params"])
  dn = ("NHWC", "HWIO", "NHWC")
  error = noisy["head"]["bias"]
  delta_out = (params["head"]["kernel"] @ error).reshape(found.activations[-1].shape)
  inputs = [found.x, *found.activations[:-1]]
  residuals, ranks = [], {}
  for k in range(len(chain) - 1, -1, -1):
    layer, a, out = chain[k], np.asarray(inputs[k], np.float64), np.asarray(found.activations[k], np.float64)
    kernel = params[layer.name]["kernel"]
    active = out > 10 * max(-out.min(), 1e-12 * out.max(), 0.0)  # the rule rgap documents
    delta = delta_out * active
    (top, bottom), (left, right) = layer.padding
    xp = np.pad(a, ((0, 0), (top, bottom), (left, right), (0, 0)))
    (ho, wo), (sh, sw), (kh, kw) = delta.shape[1:3], layer.strides, kernel.shape[:2]
    g = np.zeros(kernel.shape)
    for i in range(kh):
      for j in range(kw):
        window = xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
        g[i, j] = np.einsum("nhwc,nhwo->co", window, delta)
    observed = noisy[layer.name]["kernel"]
    weight_misfit = np.linalg.norm(g - observed) / np.linalg.norm(observed)
    z = np.transpose(np_conv_nchw(np.transpose(xp, (0, 3, 1, 2)), np.transpose(kernel, (3, 2, 0, 1)),
                                  np.zeros(kernel.shape[-1]), sh, 0), (0, 2, 3, 1))
    target = (out - params[layer.name]["bias"])[active]
    unit_misfit = np.linalg.norm(z[active] - target) / np.linalg.norm(target)
    residuals.append((layer.name, np.sqrt((weight_misfit ** 2 + unit_misfit ** 2) / 2)))
    # The rank of the same equations as a matrix in the input's entries (one basis image each: the
    # kernel gradient and the active pre-activations are linear in it), each block scaled by its
    # target's norm as R-GAP scales it, by NumPy's SVD rule; the spectrum has a clear gap there.
    basis = np.eye(a.size).reshape(a.size, *a.shape[1:])
    bp = np.pad(basis, ((0, 0), (top, bottom), (left, right), (0, 0)))
    columns_w = np.zeros((a.size, *kernel.shape))
    for i in range(kh):
      for j in range(kw):
        columns_w[:, i, j] = np.einsum("bhwc,hwo->bco", bp[:, i:i + sh * (ho - 1) + 1:sh,
                                                          j:j + sw * (wo - 1) + 1:sw], delta[0])
    zb = np.transpose(np_conv_nchw(np.transpose(bp, (0, 3, 1, 2)), np.transpose(kernel, (3, 2, 0, 1)),
                                   np.zeros(kernel.shape[-1]), sh, 0), (0, 2, 3, 1))
    matrix = np.vstack([columns_w.reshape(a.size, -1).T / np.linalg.norm(observed),
                        zb[:, active[0]].T / np.linalg.norm(target)])
    singular = np.linalg.svd(matrix, compute_uv=False)
    rank = int(np.sum(singular > singular[0] * max(matrix.shape) * np.finfo(np.float64).eps))
    ranks[layer.name] = rank
    if rank < singular.size:
      assert singular[rank - 1] > 1e3 * singular[rank], (layer.name, singular[rank - 1:rank + 1])
    with jax.enable_x64(True):
      conv = lambda v, layer=layer, kernel=kernel: jax.lax.conv_general_dilated(
          v, kernel, layer.strides, layer.padding, dimension_numbers=dn)
      delta_out = np.asarray(jax.vjp(conv, jnp.asarray(a))[1](jnp.asarray(delta))[0])
  got = {report["name"]: report["residual"] for report in found.layers}
  for name, want in residuals:
    assert want > 1e-4 and got[name] == pytest.approx(want, rel=1e-3), (name, got[name], want)
  assert {report["name"]: report["rank"] for report in found.layers} == ranks
