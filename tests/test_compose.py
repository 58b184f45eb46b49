"""Attacks composed of a user's own objects: a distance, a prior, an optax optimizer, a preset and a
model written here, outside gradjax, each run through the library unchanged."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradjax import attacks, clients, distances, driver, dummy, interop, labels, models, optimizers
from gradjax import presets, priors
from gradjax.models import spec


@pytest.fixture(scope="module")
def problem():
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3))
  x = np.asarray(jax.random.uniform(jax.random.key(1), (1, 8, 8, 3)))
  return model, clients.fedsgd(model.apply_fn, model.variables, x, np.array([3]))


def squared_error(dummy_grads, observed_grads):
  """Σ‖g' − g‖², as a user would write it."""
  return sum(jnp.sum((d - o) ** 2) for d, o in
             zip(jax.tree.leaves(dummy_grads), jax.tree.leaves(observed_grads)))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [optax.adam(0.05), optimizers.Named("lbfgs", 1.0)],
                         ids=["optax_adam", "lbfgs"])
def test_a_hand_written_distance_gives_the_built_in_reconstruction(problem, optimizer):
  model, obs = problem
  mine = attacks.Attack(distance=squared_error, optimizer=optimizer, iterations=40,
                        label_source=labels.idlg)
  built_in = dataclasses.replace(mine, distance=distances.DISTANCES["euclidean"])
  kw = dict(input_shape=(8, 8, 3), restarts=2)
  a = attacks.reconstruct(mine, model.apply_fn, obs, jax.random.key(2), **kw)
  b = attacks.reconstruct(built_in, model.apply_fn, obs, jax.random.key(2), **kw)
  np.testing.assert_allclose(a.x_restarts, b.x_restarts, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a.restart_losses, b.restart_losses, rtol=1e-5)
  assert a.loss < float(squared_error(obs.gradient, jax.tree.map(jnp.zeros_like, obs.gradient)))
  assert a.labels.tolist() == [3]  # iDLG's label


@pytest.mark.slow
def test_optax_own_lbfgs_is_driven_with_its_line_search(problem):
  """optax.lbfgs keeps a zoom line search's value in its state: the solver reuses it, so each
  iteration costs the line search's evaluations only (about one), not one more."""
  model, obs = problem
  attack = attacks.Attack(distance=squared_error, optimizer=optax.lbfgs(), iterations=30,
                          label_source=labels.idlg)
  assert optimizers.stores_value(optax.lbfgs().init({"x": jnp.zeros(3)}))
  assert not optimizers.stores_value(optax.adam(0.1).init({"x": jnp.zeros(3)}))
  rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), input_shape=(8, 8, 3))
  assert rec.iterations[0] == 30 and 30 <= rec.evaluations[0] < 2 * 30
  assert np.isfinite(rec.loss)


@pytest.mark.slow
def test_a_prior_of_ones_own(problem):
  """A prior written here, switched on at step 5: its term is weight · fn(x) from then on (NumPy),
  and an attack carrying it runs."""
  def mean_abs(x):
    return jnp.mean(x * jnp.sign(x))

  prior = priors.Prior(mean_abs, 0.3, start=5)
  x = np.random.default_rng(0).normal(size=(2, 4, 4, 3))
  assert float(prior(jnp.asarray(x), jnp.asarray(4))) == 0.0
  np.testing.assert_allclose(float(prior(jnp.asarray(x), jnp.asarray(5))), 0.3 * np.mean(np.abs(x)),
                             rtol=1e-6)
  model, obs = problem
  attack = dataclasses.replace(presets.inverting_gradients(30), priors=(prior,), label_source=labels.idlg)
  rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(0), input_shape=(8, 8, 3))
  assert np.isfinite(rec.loss)
  assert attacks.describe(attack)["priors"] == [["mean_abs", 0.3, 5]]


def cosine_dlg(iterations: int = 50) -> attacks.Attack:
  """A preset of one's own: DLG's joint labels with Inverting Gradients' distance and optimizer."""
  return dataclasses.replace(presets.inverting_gradients(iterations), label_source=labels.joint,
                             priors=(), name="cosine_dlg")


@pytest.mark.slow
def test_a_preset_of_ones_own_and_its_record(problem):
  model, obs = problem
  attack = cosine_dlg()
  rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(0), input_shape=(8, 8, 3))
  assert rec.dummy["label_logits"].shape == (1, 10)
  record = json.loads(json.dumps(attacks.describe(attack)))
  assert record["name"] == "cosine_dlg" and record["distance"] == "cosine"
  assert record["label_source"] == "joint" and record["optimizer"]["name"] == "signed_adam"
  assert record["optimizer"]["schedule"] == "step" and record["dummy_init"] == "normal"
  mine = json.loads(json.dumps(attacks.describe(attacks.Attack(
      distance=squared_error, optimizer=optax.sgd(0.1), dummy_init=dummy.uniform))))
  assert mine["distance"] == "squared_error" and mine["optimizer"] == {"name": "optax"}
  assert mine["dummy_init"] == "uniform"


def test_names_are_not_parts():
  with pytest.raises(ValueError, match="a distance is a function"):
    attacks.Attack(distance="cosine")
  with pytest.raises(ValueError, match="optax GradientTransformation"):
    attacks.Attack(optimizer="adam")
  with pytest.raises(ValueError, match="priors.Prior"):
    attacks.Attack(priors=(("tv", 1e-4, 0),))
  with pytest.raises(ValueError, match="must be a function"):
    attacks.Attack(label_source="known")


class TwoLayer(nn.Module):
  """A model of one's own: flatten, Dense(hidden), sigmoid, the head (iDLG reads non-negative
  head inputs)."""

  num_classes: int
  hidden: int

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    h = jax.nn.sigmoid(nn.Dense(self.hidden)(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes, name="head")(h)


TWO_LAYER = spec.ModelSpec(
    "two_layer", r"two_layer(?:-([1-9]\d*))?", ("two_layer",),
    lambda zoo, o: TwoLayer(o.num_classes, zoo.width),
    torch_rows=lambda zoo, params, chw: [("fc1", "Dense_0", "dense", chw), ("fc2", "head", "dense")],
    flatten_chw=lambda zoo, shape: (shape[2], shape[0], shape[1]), default_width=16)


def test_a_model_is_one_spec(monkeypatch):
  """A family added by one ModelSpec in models.FAMILIES: named, built, attacked and mapped to PyTorch
  names (fc1.weight is (hidden, C·H·W) in PyTorch's layout)."""
  monkeypatch.setattr(models, "FAMILIES", models.FAMILIES + (TWO_LAYER,))
  assert models.parse_name("two_layer-8") == models.ZooName("two_layer", width=8)
  model = models.create("two_layer-8", jax.random.key(0), input_shape=(4, 4, 3))
  assert model.variables["params"]["Dense_0"]["kernel"].shape == (48, 8)
  mapping = interop.zoo_mapping(model)
  tensors = interop.params_to_torch(model.variables["params"], mapping)
  assert tensors["fc1.weight"].shape == (8, 48) and tensors["fc2.weight"].shape == (10, 8)
  obs = clients.fedsgd(model.apply_fn, model.variables, np.zeros((1, 4, 4, 3), np.float32),
                       np.array([1]))
  rec = attacks.reconstruct(presets.idlg(20), model.apply_fn, obs, jax.random.key(0),
                            input_shape=(4, 4, 3))
  assert rec.labels.tolist() == [1]


@pytest.mark.slow
def test_the_readme_library_snippets_run():
  """The README's "As a library" snippets, run as written but for their budgets: a preset, then an
  attack of a distance written inline and optax's Adam."""
  import os
  import re
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
  section = text[text.index("## As a library"):text.index("### Text")]
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) == 2 and "optax.adam(0.1)" in blocks[1] and "def squared_error" in blocks[1]
  scope = {}
  exec(compile(blocks[0].replace("presets.dlg()", "presets.dlg(20)"), "README.md", "exec"), scope)
  exec(compile(blocks[1].replace("iterations=1000", "iterations=20"), "README.md", "exec"), scope)
  assert scope["rec"].x.shape == (1, 32, 32, 3) and np.isfinite(scope["rec"].loss)


@pytest.mark.parametrize("precision, traced", [(None, "float32"), ("bfloat16", "bfloat16"),
                                               ("default", None)])
def test_attacks_trace_at_float32_matmul_precision_unless_told(problem, precision, traced):
  """On a GPU, JAX's default precision rounds float32 products and DLG fell from 45 to 16 dB
  (experiments/studies/accelerator_h100): the attack's programs are traced at float32 unless told."""
  model, obs = problem
  seen = []

  def recording(dummy_grads, observed_grads):
    seen.append(jax.config.jax_default_matmul_precision)  # read while the objective is traced
    return squared_error(dummy_grads, observed_grads)

  attack = attacks.Attack(distance=recording, optimizer=optax.adam(0.05), iterations=2,
                          label_source=labels.idlg)
  kw = {} if precision is None else dict(matmul_precision=precision)
  attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), input_shape=(8, 8, 3),
                      execution=driver.Execution(**kw))
  assert seen and set(seen) == {traced}
  assert jax.config.jax_default_matmul_precision is None  # the caller's setting is left alone
