"""Checks of captured updates (gradjax.fidelity and fidelity.check_capture).

References: NumPy float64 (relative errors and cosines; DLG's LeNet forward written the PyTorch way
for the head's inputs), and clients simulated with a known mismatch, whose cause the check must name.
The PyTorch clients are in tests/test_verdict_pytorch.py.
"""

import jax
import numpy as np
import pytest

from gradjax import clients, data, defenses, fidelity, interop, models
from gradjax.losses import cross_entropy

from conftest import np_log_softmax
from test_interop import _with_random_stats, np_conv_nchw, np_lenet_zhu


def _model(name, act=None, key=0):
  kw = {} if act is None else {"act": act}
  return models.create(name, jax.random.key(key), input_shape=(32, 32, 3), num_classes=10,
                       conv="xla", **kw)


def test_compare_against_numpy():
  rng = np.random.default_rng(0)
  c = {"a": rng.normal(size=(3, 4)), "b": {"k": rng.normal(size=5)}}
  u = {"a": c["a"] + 0.1 * rng.normal(size=(3, 4)), "b": {"k": 2.0 * c["b"]["k"]}}
  got = fidelity.compare(u, c)
  uf = np.concatenate([u["a"].ravel(), u["b"]["k"]])
  cf = np.concatenate([c["a"].ravel(), c["b"]["k"]])
  assert got.relative_error == pytest.approx(np.linalg.norm(uf - cf) / np.linalg.norm(cf), rel=1e-12)
  assert got.cosine == pytest.approx(uf @ cf / np.linalg.norm(uf) / np.linalg.norm(cf), rel=1e-12)
  assert got.scale == pytest.approx(np.linalg.norm(cf) / np.linalg.norm(uf), rel=1e-12)
  assert got.layers["['b']['k']"]["relative_error"] == pytest.approx(1.0, rel=1e-12)
  assert got.layers["['b']['k']"]["cosine"] == pytest.approx(1.0, rel=1e-12)
  assert got.worst_layer()[0] == "['b']['k']" and not got.within()
  assert fidelity.compare(c, c).within()
  # A leaf whose captured part is 0 (and recomputed at rounding): read against float32's resolution
  # of the whole update, sqrt(eps) ‖c‖, not against its own norm.
  c0, u0 = {**c, "z": np.zeros(3)}, {**c, "z": np.full(3, 1e-7)}
  floor = np.sqrt(np.finfo(np.float32).eps) * np.linalg.norm(cf)
  got = fidelity.compare(u0, c0)
  assert got.layers["['z']"]["relative_error"] == pytest.approx(np.sqrt(3) * 1e-7 / floor, rel=1e-12)
  assert got.within()


def test_head_features_are_the_flattened_activations(photos):
  """h = ∂L/∂W_:c / ∂L/∂b_c equals the head's input from a float64 NumPy forward pass."""
  model = _model("lenet_zhu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([3]))
  tensors = interop.variables_to_torch(model.variables, interop.zoo_mapping(model))
  t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
  h = np.transpose(np.asarray(photos[:1], np.float64), (0, 3, 1, 2))
  sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
  for i, stride in zip((0, 2, 4), (2, 2, 1)):
    h = sig(np_conv_nchw(h, t[f"body.{i}.weight"], t[f"body.{i}.bias"], stride, 2))
  want = np.transpose(h, (0, 2, 3, 1)).reshape(-1)  # gradjax flattens HWC
  got, zeros = fidelity.head_features(obs)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
  assert zeros == 0.0
  np.testing.assert_allclose(np_lenet_zhu(t, photos[:1]),
                             np.asarray(model.apply_fn(model.variables, photos[:1])), atol=1e-4)


@pytest.mark.parametrize("client_act, declared, fits", [
    ("sigmoid", "sigmoid", True), ("relu", "sigmoid", False), ("relu", "relu", True),
    ("tanh", "sigmoid", False), ("sigmoid", "relu", True),  # a sigmoid's outputs lie in a ReLU's range
])
def test_activation_check(photos, client_act, declared, fits):
  model = _model("lenet_zhu", client_act)
  for n in (1, 3):  # one example (the features' values) and a batch (their zeros)
    obs = clients.fedsgd(model.apply_fn, model.variables, photos[:n], np.arange(n))
    why = fidelity.activation_check(obs, declared)
    if n == 1 or client_act != "tanh":
      assert (why is None) == fits, why


def test_a_zero_update_is_its_own_finding(photos):
  """An update that carries nothing is found before the activation test reads its zeros: a zero
  gradient, and FedAvg weights sent back as received or cast to float16 and back (|u| <= 2⁻²³|w|
  fails there: the cast moves weights by up to 2⁻¹¹|w|, so it is an update) or to float64 and back."""
  model = _model("lenet_zhu", "relu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.arange(2))
  assert fidelity.zero_update(obs) is None
  zero = obs.replace(gradient=jax.tree.map(np.zeros_like, obs.gradient))
  assert "zero" in fidelity.zero_update(zero)
  with pytest.raises(fidelity.ZeroUpdate):  # declared sigmoid: no "as after a ReLU" diagnosis
    fidelity.check_capture(_model("lenet_zhu", "sigmoid"), zero, None, data.normalization("none"))
  w = [np.asarray(v, np.float32) for v in jax.tree.leaves(model.variables["params"])]
  assert fidelity.zero_arrays([np.zeros_like(v) for v in w], w)
  assert fidelity.zero_arrays([v - v.astype(np.float64).astype(np.float32) for v in w], w)
  assert fidelity.zero_arrays([v - v.astype(np.float16).astype(np.float32) for v in w], w) is None
  eps = np.finfo(np.float32).eps
  assert fidelity.zero_arrays([v * eps for v in w], w)  # within one rounding of every weight
  assert fidelity.zero_arrays([v * 4 * eps for v in w], w) is None
  assert fidelity.zero_arrays([v * eps for v in w], w, gradient=True) is None  # a small gradient


def _negative_bias_classes(model, x, y):
  """NumPy float64: the classes whose mean cross entropy bias gradient (1/N) Σ_n (p_nc − y_nc) is
  negative, from the model's logits."""
  z = np.asarray(model.apply_fn(model.variables, x), np.float64)
  p = np.exp(np_log_softmax(z))
  g = (p - np.eye(z.shape[1])[y]).mean(axis=0)
  return set(np.flatnonzero(g < 0).tolist())


@pytest.mark.parametrize("local", [None, clients.LocalTraining(2, 2, 0.1, momentum=0.9)])
def test_declared_labels_are_checked_against_the_head_bias(photos, local):
  """Without the client's examples, labels that miss a class of the batch are found from the head's
  bias (a class no example holds has a non-negative bias gradient; NumPy's from the logits names the
  classes), the right ones pass, a FedSGD gradient or FedAvg's update of 2 epochs of 2 mini-batches
  with momentum alike; under declared noise the labels are not checked."""
  model = _model("lenet_zhu", "relu")
  x, y = photos[:4], np.array([2, 2, 5, 7])
  negative = _negative_bias_classes(model, x, y)
  assert negative & {5, 7}  # the batch's classes the wrong labels below miss
  if local is None:
    obs = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True)
  else:
    obs = clients.fedavg(model.apply_fn, model.variables, x, y, local, share_labels=True)
  norm = data.normalization("none")
  assert fidelity.label_check(obs) is None
  checks, problems = fidelity.check_capture(model, obs, None, norm)
  assert checks["labels"]["ok"] and not problems
  wrong = obs.replace(labels=np.array([2, 2, 3, 4]))
  why = fidelity.label_check(wrong)
  if local is None:  # one gradient: exactly NumPy's negative classes the wrong labels lack
    assert f"class{'es' if len(negative - {2}) > 1 else ''} {', '.join(map(str, sorted(negative - {2})))}," in why
  else:
    assert why and ("5" in why or "7" in why)
  checks, problems = fidelity.check_capture(model, wrong, None, norm)
  assert checks["labels"]["ok"] is False and problems == [why]
  for noise in ("gaussian:1e-4", "Gauss:1e-4", "clip:10, laplace:1e-4"):  # any spelling parse reads
    checks, problems = fidelity.check_capture(model, wrong, None, norm, noise)
    assert "labels" not in checks and not problems
  assert fidelity.label_check(wrong.replace(labels=None)) is None
  # A head without a bias: nothing to read, so no check is reported (not "passed").
  unbiased = wrong.replace(gradient={**wrong.gradient, "head": {"kernel": wrong.gradient["head"]["kernel"]}})
  checks, problems = fidelity.check_capture(model, unbiased, None, norm)
  assert "labels" not in checks and not problems


def test_the_label_check_raises_no_false_alarm():
  """Random classifiers, batches with repeated labels and a class count near the batch's, summed
  and clipped gradients, FedAvg updates of several steps with momentum and float32 rounding of
  W_t − W_{t+1}: declared right, never refused."""
  rng = np.random.default_rng(0)
  for trial in range(12):
    model = models.create("mlp-16", jax.random.key(trial), input_shape=(4, 4, 1), num_classes=5,
                          init="uniform")
    n = int(rng.integers(1, 9))
    x = rng.uniform(size=(n, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 5, size=n)
    if trial % 3 == 0:
      obs = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True,
                           loss_fn=_sum_loss)
    elif trial % 3 == 1:
      from gradjax import defenses
      obs = defenses.parse("clip:0.01,fp16").apply(
          clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True))
    else:
      obs = clients.fedavg(model.apply_fn, model.variables, x, y,
                           clients.LocalTraining(3, 1, 10.0 ** rng.uniform(-4, 0), momentum=0.9),
                           share_labels=True)
    assert fidelity.label_check(obs) is None, (trial, fidelity.label_check(obs))


# --- each mismatch named ---------------------------------------------------------------------------

def _files(tmp_path, model, tensors, metadata, name):
  """Writes the server's weights and a file of ``tensors`` (PyTorch layout) with ``metadata``."""
  mapping = interop.zoo_mapping(model)
  weights = tmp_path / "W.safetensors"
  interop.save_weights(weights, model, mapping)
  path = tmp_path / f"{name}.safetensors"
  interop.write(path, interop.params_to_torch(tensors, mapping), metadata)
  return weights, path


def _capture(tmp_path, model, obs, **meta):
  """Writes ``obs`` as a captured client would, its metadata updated by ``meta`` (None: dropped)."""
  metadata = {k: v for k, v in {**interop.observation_metadata(obs, model), **meta}.items()
              if v is not None}
  return interop.load(*_files(tmp_path, model, obs.gradient, metadata, "g"), conv="xla")


def _checks(imported, photos, n, norm="none"):
  batch = data.Dataset(photos[:n], np.arange(n) + 2, 10, "skimage")
  norm = data.normalization(imported.metadata.get("normalization", norm))
  return fidelity.check_capture(imported.model, imported.observation, batch, norm)


def _sum_loss(logits, y):
  return cross_entropy(logits, y) * logits.shape[0]


CASES = {
    # name: (model, client act, what the client does, metadata declared, the cause's declaration)
    "activation": ("lenet_zhu", "relu", {}, {"act": "sigmoid"}, "act=relu"),
    "normalisation": ("lenet_zhu", None, {"norm": "cifar10"}, {}, "normalization=cifar10"),
    # The widely copied CIFAR-10 std (0.2023, ...), declared as gradjax's cifar10 (0.2470, ...).
    "common std": ("lenet_zhu", None, {"norm": data.COMMON_NORMALIZATIONS[0]},
                   {"normalization": "cifar10"}, f"normalization={data.COMMON_NORMALIZATIONS[0]}"),
    "batchnorm": ("resnet8", None, {"train": True}, {"train": "false"}, "train=true"),
    "batchnorm eval": ("resnet8", None, {"train": False}, {"train": "true"}, "train=false"),
    "reduction": ("lenet_zhu", None, {"loss_fn": _sum_loss, "loss_reduction": "sum"},
                  {"loss_reduction": None}, "loss_reduction=sum"),
    "learning rate": ("lenet_zhu", None, {"local": clients.LocalTraining(1, None, 0.1)},
                      {"local_lr": "0.05"}, "local_lr=0.1"),
    # Four steps: no multiple of the rate; found by the secant on the update's norm.
    "learning rate, steps": ("lenet_zhu", None, {"local": clients.LocalTraining(2, 1, 0.1)},
                             {"local_lr": "0.01"}, "local_lr=0.1)"),
    "local steps": ("lenet_zhu", None, {"local": clients.LocalTraining(2, 1, 0.1)},
                    {"local_epochs": "1"}, "local_epochs=2"),
    "momentum": ("lenet_zhu", None, {"local": clients.LocalTraining(1, 1, 0.1, momentum=0.9)},
                 {"local_momentum": "0.0"}, "local_momentum=0.9"),
}


@pytest.mark.parametrize("case", [  # the FedAvg and BatchNorm cases compile more (slow)
    pytest.param(c, marks=pytest.mark.slow) if "local" in CASES[c][2] or "batchnorm" in c else c
    for c in CASES])
def test_each_mismatch_is_named(tmp_path, photos, case):
  name, act, client, declared, cause = CASES[case]
  model = _with_random_stats(_model(name, act))  # so the two BatchNorm modes differ
  n = 2
  x = photos[:n]
  if "norm" in client:
    x = data.normalize(x, data.normalization(client["norm"]))
  y = np.arange(n) + 2
  if "local" in client:
    obs = clients.fedavg(model.apply_fn, model.variables, x, y, client["local"])
  else:
    obs = clients.fedsgd(model.apply_fn, model.variables, x, y, train=client.get("train", False),
                         loss_fn=client.get("loss_fn", cross_entropy))
  # Declared right: the recomputed update is the capture to float32 rounding.
  right = _capture(tmp_path, model, obs, normalization=client.get("norm"), act=act,
                   loss_reduction=client.get("loss_reduction"))
  checks, problems = _checks(right, photos, n)
  assert problems == [] and checks["fidelity"]["ok"]
  assert checks["fidelity"]["relative_error"] < 1e-5
  # Declared wrong: refused, the cause named among those that reproduce the capture.
  wrong = _capture(tmp_path, model, obs, **{"act": act, **declared})
  checks, problems = _checks(wrong, photos, n)
  assert problems and checks["fidelity"]["ok"] is False
  assert any(cause in c for c in checks["fidelity"]["causes"]), checks["fidelity"]["causes"]


def test_labels_not_the_ground_truths(tmp_path, photos):
  model = _model("lenet_zhu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([2, 3]),
                       share_labels=True)
  imported = _capture(tmp_path, model, obs, labels="5,6")
  checks, problems = _checks(imported, photos, 2)
  assert len(problems) == 1 and checks["fidelity"]["ok"]  # the update is the images' with [2, 3]


def test_flatten_order_is_named(tmp_path, photos):
  """A client whose linear layer reads its features flattened (H, W, C), e.g. after
  ``x.permute(0, 2, 3, 1).flatten(1)``, exported as is: the import's (C, H, W) reading is named."""
  model = _model("lenet_zhu")
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([2]))
  mapping = interop.zoo_mapping(model)
  weights = interop.variables_to_torch(model.variables, mapping)
  gradient = interop.params_to_torch(obs.gradient, mapping)
  weights["fc.0.weight"] = np.asarray(model.variables["params"]["head"]["kernel"]).T.copy()
  gradient["fc.0.weight"] = np.asarray(obs.gradient["head"]["kernel"]).T.copy()
  interop.write(tmp_path / "w.safetensors", weights, {"model": "lenet_zhu"})
  interop.write(tmp_path / "g.safetensors", gradient, {"kind": "gradient"})
  imported = interop.load(tmp_path / "w.safetensors", tmp_path / "g.safetensors", conv="xla")
  batch = data.Dataset(photos[:1], np.array([2]), 10, "skimage")
  checks, problems = fidelity.check_capture(imported.model, imported.observation, batch,
                                            data.normalization("none"))
  assert problems and any("(H, W, C) order" in c for c in checks["fidelity"]["causes"])


@pytest.mark.slow
def test_a_declared_deterministic_defense_is_applied_to_the_recomputed_update():
  """A one-step update pruned by 70 % whose capture declares it: the update recomputed from the
  client's photo and pruned the same way matches; declared without its defense, the check fails;
  under declared noise nothing is recomputed."""
  from gradjax import defenses
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  photo = data.load("skimage", indices=[5], image_size=(32, 32))
  obs = clients.fedavg(model.apply_fn, model.variables, photo.x, photo.y,
                       clients.LocalTraining(learning_rate=0.1))
  pruned = defenses.parse("prune:0.7").apply(obs)
  norm = data.normalization("none")
  checks, problems = fidelity.check_capture(model, pruned, photo, norm, "prune:0.7")
  assert problems == [] and checks["fidelity"]["ok"] and checks["activation"]["ok"] is None
  assert fidelity.check_capture(model, pruned, photo, norm)[1]
  noisy = defenses.parse("gaussian:1e-4").apply(obs, jax.random.key(0))
  checks, problems = fidelity.check_capture(model, noisy, photo, norm, "gaussian:1e-4")
  assert problems == [] and checks["fidelity"]["ok"] is None


def test_scope_variants_take_one_part_the_other_way():
  assert fidelity.scope_variants("CLIP:1") == ["clip:1.0:global"]
  variants = fidelity.scope_variants("clip:1:global,half,prune:0.5")
  assert variants == ["clip:1.0,fp16,prune:0.5", "clip:1.0:global,fp16,prune:0.5:global"]
  P = defenses.Part
  assert [defenses.parts(defenses.parse(v)) for v in variants] == [
      (P("clip", (1.0,)), P("fp16"), P("prune", (0.5,))),
      (P("clip", (1.0,), ("global",)), P("fp16"), P("prune", (0.5,), ("global",)))]
  assert fidelity.scope_variants("gaussian:1e-4") == [] and fidelity.scope_variants(None) == []


@pytest.mark.slow
def test_a_clipping_declared_per_layer_that_clipped_the_whole_is_named():
  """A gradient clipped over the whole update (PyTorch's clip_grad_norm_) but declared ``clip:C``
  (gradjax's per-layer clipping) fails the check, which names the global form as its cause."""
  from gradjax import defenses
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  photo = data.load("skimage", indices=[5], image_size=(32, 32))
  obs = clients.fedsgd(model.apply_fn, model.variables, photo.x, photo.y)
  norm = float(np.sqrt(sum(np.sum(np.square(v)) for v in jax.tree.leaves(obs.gradient))))
  bound = 0.5 * norm
  clipped = defenses.parse(f"clip:{bound}:global").apply(obs)
  checks, problems = fidelity.check_capture(model, clipped, photo, data.normalization("none"),
                                            f"clip:{bound}")
  assert checks["fidelity"]["ok"] is False
  assert f"reproduced by: the defense clip:{bound}:global (declare defense=clip:{bound}:global)" in problems[0]


@pytest.mark.slow
def test_biases_in_front_of_a_training_mode_batchnorm_are_no_mismatch(tmp_path, photos):
  """A convolution's bias in front of BatchNorm in training mode has a gradient of 0 but for
  rounding; another framework's rounding (PyTorch's: about 1e-6 against 2 in the head, measured)
  is no mismatch of that leaf: the capture passes, declared right."""
  model = _with_random_stats(_model("convnet-4", None))
  x, y = photos[:2], np.arange(2) + 2
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, train=True)
  rng = np.random.default_rng(0)
  rounded = {layer: {name: (v + 1e-6 * rng.normal(size=np.shape(v)) if name == "bias" and
                            layer.startswith("Conv") else v) for name, v in leaves.items()}
             for layer, leaves in obs.gradient.items()}
  assert max(float(np.max(np.abs(v["bias"]))) for k, v in rounded.items() if k.startswith("Conv")) < 1e-5
  captured = _capture(tmp_path, model, obs.replace(gradient=rounded), train="true")
  checks, problems = _checks(captured, photos, 2)
  assert problems == [] and checks["fidelity"]["ok"], checks["fidelity"]["explained"]


@pytest.mark.slow
def test_a_client_that_shuffled_its_examples_is_named_or_not_checked(tmp_path, photos):
  """A FedAvg client of two mini-batches that took its examples in another order than the ground
  truth's: the mismatch names the training order as a cause; declared label_order=multiset (the
  order unknown), the update is not recomputed (its order decides it)."""
  model = _model("lenet_zhu", None)
  x, y = photos[:2], np.arange(2) + 2
  local = clients.LocalTraining(1, 1, 0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, x[::-1], y[::-1], local)
  checks, problems = _checks(_capture(tmp_path, model, obs), photos, 2)
  assert checks["fidelity"]["ok"] is False and len(problems) == 1
  assert "or the order the client took its examples in (a shuffling data loader)" in problems[0]
  unordered = _capture(tmp_path, model, obs, labels=",".join(map(str, y[::-1])), label_order="multiset")
  checks, problems = fidelity.check_capture(  # as the pipeline calls it, from the file's metadata
      unordered.model, unordered.observation, data.Dataset(photos[:2], y, 10, "skimage"),
      data.normalization("none"), order_known=unordered.metadata.get("label_order") != "multiset")
  assert problems == [] and checks["fidelity"]["ok"] is None
  assert "label_order=multiset" in checks["fidelity"]["explained"]


def _check_file(weights, path, defense=None):
  imported = interop.load(weights, path)
  return fidelity.check_capture(imported.model, imported.observation, None, data.normalization("none"),
                                defense, kind=imported.metadata["kind"])


def test_a_file_of_another_kind_than_declared_is_named(photos, tmp_path):
  """Weights after local training saved without ``kind`` (read as the default gradient) or as an
  update, and a gradient declared ``kind=weights``, are refused naming the kind they hold, from the
  distance, norm ratio and cosine of the file and the weights sent (NumPy float64); the right
  declarations pass, a FedAvg client of 3 epochs with momentum too, and a noisy file declared
  weights is not read by its cosine."""
  model = _model("lenet_zhu")
  x, y = photos[:2], np.array([3, 5])
  flat = lambda t: np.concatenate([np.ravel(a) for a in jax.tree.leaves(t)]).astype(np.float64)  # noqa: E731
  w = flat(model.variables["params"])
  grad = clients.fedsgd(model.apply_fn, model.variables, x, y).gradient
  meta = {"labels": "3,5", "num_samples": "2"}
  weights, path = _files(tmp_path, model, grad, {**meta, "kind": "weights"}, "g_as_weights")
  checks, problems = _check_file(weights, path)
  g = flat(grad)
  ratio, cosine = np.linalg.norm(g) / np.linalg.norm(w), g @ w / np.linalg.norm(g) / np.linalg.norm(w)
  assert abs(cosine) < fidelity.KIND_COSINE  # what refuses it here: a gradient of a norm near W's
  assert problems == [checks["kind"]["explained"]] and checks["kind"]["ok"] is False
  assert f"({ratio:.2g} times their norm, cosine {cosine:.2g})" in problems[0]
  assert "kind=gradient" in problems[0] and "activation" not in checks  # nothing else read it
  weights, path = _files(tmp_path, model, grad, {**meta, "kind": "gradient"}, "g")
  checks, problems = _check_file(weights, path)
  assert checks["kind"]["ok"] and not problems

  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  after = {"local_lr": "0.1", "local_epochs": "1", **meta}
  update = clients.fedavg(model.apply_fn, model.variables, x, y, local).gradient
  new = jax.tree.map(lambda a, u: np.asarray(a) - np.asarray(u), model.variables["params"], update)
  distance = np.linalg.norm(flat(new) - w) / np.linalg.norm(w)
  for kind in (None, "update"):
    weights, path = _files(tmp_path, model, new, {**after, **({"kind": kind} if kind else {})}, "w")
    checks, problems = _check_file(weights, path)
    assert checks["kind"]["declared"] == (kind or "gradient") and len(problems) == 1
    assert f"kind={kind or 'gradient'} lies within {distance:.2g} (relative)" in problems[0]
    assert "declare kind=weights" in problems[0]
  weights, path = _files(tmp_path, model, new, {**after, "kind": "weights"}, "w")
  checks, problems = _check_file(weights, path)
  assert checks["kind"]["ok"] and not problems
  long = clients.LocalTraining(epochs=3, batch_size=1, learning_rate=0.1, momentum=0.9)
  update = clients.fedavg(model.apply_fn, model.variables, x, y, long).gradient
  new = jax.tree.map(lambda a, u: np.asarray(a) - np.asarray(u), model.variables["params"], update)
  assert np.linalg.norm(flat(update)) > 0.1 * np.linalg.norm(w)  # a large round, still weights
  weights, path = _files(tmp_path, model, new, {"local_lr": "0.1", "local_epochs": "3",
                                                "local_batch_size": "1", "local_momentum": "0.9",
                                                "kind": "weights", **meta}, "w3")
  assert _check_file(weights, path)[0]["kind"]["ok"]

  # A round that diverged: weights of 3 times the norm sent, turned away from them (cosine -1), are
  # still weights (the cosine is read up to KIND_NORMS times the norm).
  imported = interop.load(weights, path)
  w_t = imported.observation.variables["params"]
  blown = imported.observation.replace(gradient=jax.tree.map(lambda a: 4.0 * np.asarray(a), w_t))
  assert fidelity.kind_check(blown, "weights") is None
  # Weights under noise larger than themselves: the cosine falls, which noise explains, so only the
  # norm is read; the distance check of a gradient file is kept under noise.
  rng = np.random.default_rng(0)
  noisy = jax.tree.map(lambda a: np.asarray(a) + rng.normal(0, 2 * np.abs(a).max(), np.shape(a)), new)
  weights, path = _files(tmp_path, model, noisy, {**after, "kind": "weights"}, "noisy")
  assert not _check_file(weights, path, "gaussian:1")[1]
  assert _check_file(weights, path)[1]  # undeclared, the cosine refuses it
  weights, path = _files(tmp_path, model, new, after, "w_noise")
  assert _check_file(weights, path, "gaussian:1e-4")[1]


def test_auto_reads_a_file_without_kind_as_a_gradient(photos, tmp_path):
  """A capture without ``kind`` is a gradient (interop's default), also to ``--attack=auto``, which
  chose the replay attacks of an unknown schedule for it (the weights file's ``kind=weights`` leaked
  into the merged metadata)."""
  from gradjax.run import config, pipeline
  model = _model("lenet_zhu")
  grad = clients.fedsgd(model.apply_fn, model.variables, photos[:1], np.array([3])).gradient
  weights, path = _files(tmp_path, model, grad, {"labels": "3"}, "g")
  assert interop.load(weights, path).metadata["kind"] == "gradient"
  cfg = config.from_options({"attack.preset": "auto", "model.weights": str(weights),
                             "client.observation": str(path)})
  with_kind = tmp_path / "g_kind.safetensors"
  interop.write(with_kind, interop.read(path).tensors, {"labels": "3", "kind": "gradient"})
  assert pipeline.auto_attacks(cfg) == pipeline.auto_attacks(
      config.replace(cfg, {"client.observation": str(with_kind)}))
  assert not any(a.startswith("dlm") or "replay" in a for a in pipeline.auto_attacks(cfg))
  # The weights after a local step, saved without kind: the run refuses them before any attack.
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=0.1)
  update = clients.fedavg(model.apply_fn, model.variables, photos[:1], np.array([3]), local).gradient
  new = jax.tree.map(lambda a, u: np.asarray(a) - np.asarray(u), model.variables["params"], update)
  weights, path = _files(tmp_path, model, new, {"labels": "3", "local_lr": "0.1"}, "w")
  with pytest.raises(fidelity.CaptureMismatch, match="declare kind=weights"):
    pipeline.run(config.replace(cfg, {"attack.preset": "dlg", "client.observation": str(path)}))


@pytest.mark.slow
def test_auto_infers_the_labels_a_capture_does_not_hold(photos, tmp_path):
  """A batch of 4 captured with its count but no labels: --attack=auto's known-label attack takes
  LLG*'s labels (the audit's rule), where it refused the capture; labels the capture holds stay
  known."""
  from gradjax.run import config, pipeline
  model = _model("lenet_zhu")
  x, y = photos[:4], np.array([3, 8, 8, 0])
  grad = clients.fedsgd(model.apply_fn, model.variables, x, y).gradient
  weights, path = _files(tmp_path, model, grad, {"num_samples": "4"}, "batch")
  options = {"attack.preset": "auto", "model.weights": str(weights), "client.observation": str(path),
             "attack.iterations": 2, "data.dataset": None}
  results, _ = pipeline.run(config.from_options(options))
  tried = results["auto"]["tried"]
  assert [t["settings"].get("attack.label_source") for t in tried] == ["llg_star"] * len(tried)
  alone, _ = pipeline.run(config.from_options({**options, "attack.preset": tried[0]["attack"],
                                               "attack.label_source": "llg_star"}))
  assert sorted(results["labels_by_slot"]) == sorted(alone["labels_by_slot"])
  assert pipeline.capture_label_source(tried[0]["attack"], {"labels": "3,8,8,0"}) is None
  assert pipeline.capture_label_source("idlg", {"num_samples": "1"}) is None  # infers its own
  assert pipeline.capture_label_source("inverting_gradients", {}) == "idlg"


@pytest.mark.slow
def test_a_captures_labels_are_the_servers(photos, tmp_path):
  """Labels a capture declares were shared with the server: an attack that optimises its own (DLG)
  is not credited with recovering them, and the run says it left them aside; iDLG-style known labels
  take them."""
  from gradjax.run import config, pipeline
  model = _model("lenet_zhu")
  x, y = photos[:2], np.array([0, 1])  # skimage's classes: their index
  grad = clients.fedsgd(model.apply_fn, model.variables, x, y).gradient
  weights, path = _files(tmp_path, model, grad, {"labels": "0,1"}, "batch")
  options = {"attack.preset": "dlg", "model.weights": str(weights), "client.observation": str(path),
             "attack.iterations": 2, "data.dataset": "skimage", "data.index": 0}
  results, _ = pipeline.run(config.from_options(options))
  assert results["shared_labels_unused"] is True
  assert results["findings"]["labels"]["inferred"] is False and "labels" not in results["verdict"]["leaks"]
  known, _ = pipeline.run(config.from_options({**options, "attack.label_source": "known"}))
  assert known["shared_labels_unused"] is False and known["labels_by_slot"] == [0, 1]


def test_a_batch_read_as_fewer_examples_is_refused(photos, tmp_path):
  """A batch of 4 captured without ``num_samples`` or labels is read as one example; its head bias
  names the batch's classes (NumPy's from the logits), more than one, so the capture is refused
  before any attack, saying how many examples it holds at least; through the command line too.
  Declared 4, it passes; a single example's gradient passes; under declared noise it is not read."""
  model = _model("lenet_zhu", "relu")
  x, y = photos[:4], np.array([0, 1, 6, 6])
  negative = _negative_bias_classes(model, x, y)
  assert len(negative) > 1
  grad = clients.fedsgd(model.apply_fn, model.variables, x, y).gradient
  weights, path = _files(tmp_path, model, grad, {"act": "relu"}, "g")
  imported = interop.load(weights, path)
  assert imported.observation.num_samples == 1
  checks, problems = fidelity.check_capture(imported.model, imported.observation, None,
                                            data.normalization("none"), kind="gradient",
                                            count_declared=False)
  assert problems == [checks["count"]["explained"]] and "activation" not in checks
  assert f"negative for {len(negative)} classes ({', '.join(map(str, sorted(negative)))})" in problems[0]
  assert f"at least {len(negative)} examples, not 1" in problems[0]
  from gradjax.run import config, pipeline
  cfg = config.from_options({"attack.preset": "dlg", "attack.iterations": 2, "output.lpips": "none",
                             "model.weights": str(weights), "client.observation": str(path)})
  with pytest.raises(fidelity.CaptureMismatch, match=f"at least {len(negative)} examples"):
    pipeline.run(cfg)
  assert not fidelity.check_capture(imported.model, imported.observation, None,
                                    data.normalization("none"), "gaussian:1e-6", count_declared=False)[1]
  weights, path = _files(tmp_path, model, grad, {"act": "relu", "num_samples": "4"}, "g4")
  imported = interop.load(weights, path)
  checks, problems = fidelity.check_capture(imported.model, imported.observation, None,
                                            data.normalization("none"), count_declared=False)
  assert checks["count"]["ok"] and not problems
  # A count declared is taken as given (a file below float32 or weight decay can turn an absent
  # class's bias negative): 1 declared is not second-guessed.
  weights, path = _files(tmp_path, model, grad, {"act": "relu", "num_samples": "1"}, "g1d")
  imported = interop.load(weights, path)
  checks, problems = fidelity.check_capture(imported.model, imported.observation, None,
                                            data.normalization("none"))
  assert "count" not in checks
  one = clients.fedsgd(model.apply_fn, model.variables, x[:1], y[:1]).gradient
  weights, path = _files(tmp_path, model, one, {"act": "relu"}, "g1")
  imported = interop.load(weights, path)
  assert fidelity.count_check(imported.observation) is None
