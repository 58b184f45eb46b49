"""The library's entry points refuse input they would otherwise misread (a NaN gradient, a wrong
score, a key JAX would reject deep inside a trace) with one ValueError that names the problem:
the library's counterpart of test_cli's tables of bad flags and files."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import analytic, attacks, clients, dager, data, labels, malicious, metrics, models, presets, priors, text


@pytest.fixture(scope="module")
def lenet():
  model = models.create("lenet_zhu", jax.random.key(0))
  x = np.random.default_rng(0).random((1, 32, 32, 3), np.float32)
  return model, clients.fedsgd(model.apply_fn, model.variables, x, np.array([1]))


@pytest.fixture(scope="module")
def language_model():
  return models.create("transformer", jax.random.key(0), input_shape=(6,), num_classes=20)


def _lm_observation(lm):
  ids = np.arange(1, 7)[None]
  return clients.fedsgd(lm.apply_fn, lm.variables, ids, np.roll(ids, -1, axis=1))


def _as(obs, **fields):
  return obs.replace(**fields)


CASES = {
    "token ids past the vocabulary": (
        lambda m, obs, lm: clients.fedsgd(lm.apply_fn, lm.variables, np.arange(6)[None] + 16,
                                          np.zeros((1, 6), int)),
        "token ids must lie in [0, 20)"),
    "negative token ids": (
        lambda m, obs, lm: clients.fedsgd(lm.apply_fn, lm.variables, -np.ones((1, 6), int),
                                          np.zeros((1, 6), int)),
        "token ids must lie in [0, 20)"),
    "8-bit client images": (
        lambda m, obs, lm: clients.fedsgd(m.apply_fn, m.variables, np.zeros((1, 32, 32, 3), np.uint8),
                                          np.array([1])),
        "client images must be floating point"),
    "an empty client batch": (
        lambda m, obs, lm: clients.fedsgd(m.apply_fn, m.variables, np.zeros((0, 32, 32, 3), np.float32),
                                          np.zeros((0,), int)),
        "empty batch"),
    "8-bit reconstructions scored": (
        lambda m, obs, lm: metrics.score(np.zeros((1, 8, 8, 3), np.uint8), np.zeros((1, 8, 8, 3))),
        "x must be floating-point images"),
    "an int key": (
        lambda m, obs, lm: attacks.reconstruct(presets.dlg(1), m.apply_fn, obs, 1, input_shape=(32, 32, 3)),
        "key must be one PRNG key"),
    "two keys for one": (
        lambda m, obs, lm: attacks.reconstruct(presets.dlg(1), m.apply_fn, obs,
                                               jax.random.split(jax.random.key(0)), input_shape=(32, 32, 3)),
        "key must be one PRNG key"),
    "one key for the clients": (
        lambda m, obs, lm: attacks.reconstruct_clients(presets.dlg(1), m.apply_fn, [obs], jax.random.key(0),
                                                       input_shape=(32, 32, 3)),
        "one PRNG key per client"),
    "a model from an int key": (lambda m, obs, lm: models.create("lenet_zhu", 0), "key must be one PRNG key"),
    "a noise defense's int key": (
        lambda m, obs, lm: __import__("gradjax").defenses.parse("gaussian:1e-3").apply(obs, 3),
        "key must be one PRNG key"),
    "the gradient for the observation": (
        lambda m, obs, lm: attacks.reconstruct(presets.dlg(1), m.apply_fn, obs.gradient, jax.random.key(0),
                                               input_shape=(32, 32, 3)),
        "an attack reads an Observation"),
    "an integer gradient": (
        lambda m, obs, lm: attacks.reconstruct(
            presets.dlg(1), m.apply_fn, _as(obs, gradient=jax.tree.map(lambda a: a.astype(jnp.int32), obs.gradient)),
            jax.random.key(0), input_shape=(32, 32, 3)),
        "must be floating point"),
    "a NaN in the sent model": (
        lambda m, obs, lm: attacks.reconstruct(
            presets.dlg(1), m.apply_fn, _as(obs, variables=jax.tree.map(lambda a: a * np.nan, obs.variables)),
            jax.random.key(0), input_shape=(32, 32, 3)),
        "the sent model's parameter"),
    "NaN statistics for an imprint": (lambda m, obs, lm: malicious.imprint_thresholds(np.full(9, np.nan), 4),
                                      "contain NaN"),
    "NaN thresholds for an imprint": (lambda m, obs, lm: malicious.imprint(m, [0.1, np.nan, 0.5]),
                                      "thresholds must be finite"),
    "a NaN in an imprinted update": (
        lambda m, obs, lm: malicious.imprint_recover(
            {"imprint": {"kernel": np.full((12, 3), np.nan), "bias": np.ones(3)}}, (2, 2, 3)),
        "contains NaN"),
    "an imprint read as another shape": (
        lambda m, obs, lm: malicious.imprint_recover(
            {"imprint": {"kernel": np.ones((12, 3)), "bias": np.ones(3)}}, (4, 4, 3)),
        "reads 12 inputs"),
    "imprint units past the block": (
        lambda m, obs, lm: malicious.imprint_recover(
            {"imprint": {"kernel": np.ones((12, 3)), "bias": np.ones(3)}}, (2, 2, 3), units=[0, 9]),
        "units must be indices in [0, 3)"),
    "an observation for an imprinted update": (
        lambda m, obs, lm: malicious.imprint_recover(obs, (32, 32, 3)), "the update is a tree"),
    "a span of no length": (
        lambda m, obs, lm: dager.recover(lm.apply_fn, lm.variables, jax.tree.map(jnp.ones_like, lm.variables["params"]),
                                         length=0),
        "sentence length must be a positive integer"),
    "a NaN update's span": (
        lambda m, obs, lm: dager.span(np.full((4, 3), np.nan)), "NaN or inf"),
    "an end-of-sentence id past the table": (
        lambda m, obs, lm: text.reconstruct(presets.dlg(1), lm.apply_fn, _lm_observation(lm),
                                            jax.random.key(0), length=6, eos=5000),
        "end-of-sentence id 5000 is not a row"),
    "a sentence length of 6.0": (
        lambda m, obs, lm: text.reconstruct(presets.dlg(1), lm.apply_fn, _lm_observation(lm),
                                            jax.random.key(0), length=6.0, eos=0),
        "sentence length must be a positive integer"),
    "an input_shape with the batch axis": (
        lambda m, obs, lm: attacks.reconstruct(presets.dlg(1), m.apply_fn, obs, jax.random.key(0),
                                               input_shape=(1, 32, 32, 3)),
        "input_shape must be the shape of one example, without the batch axis"),
    "an image without its batch axis": (
        lambda m, obs, lm: clients.fedsgd(m.apply_fn, m.variables, np.zeros((32, 32, 3), np.float32),
                                          np.array([1])),
        "(x (32, 32, 3): 32 examples, the batch axis first)"),
    "NCHW auxiliary images for HFGInv's profile": (
        lambda m, obs, lm: labels.feature_profile(m.apply_fn, m.variables, np.zeros((4, 3, 32, 32), np.float32)),
        "an auxiliary input (M, H, W, C, in the model's input space), one example of shape (3, 32, 32)"),
    "NCHW auxiliary images for LLG's statistics": (
        lambda m, obs, lm: labels.llg_statistics(m.apply_fn, m.variables, np.zeros((4, 3, 32, 32), np.float32), 1),
        "an auxiliary input (M, H, W, C, in the model's input space), one example of shape (3, 32, 32)"),
    "NCHW reconstructions scored": (  # SSIM's window would run over the channels
        lambda m, obs, lm: metrics.score(np.zeros((1, 3, 8, 8)), np.zeros((1, 3, 8, 8))),
        "x of shape (1, 3, 8, 8) looks channel-first (N, C, H, W)"),
    "restarts=True": (
        lambda m, obs, lm: attacks.reconstruct(presets.dlg(1), m.apply_fn, obs, jax.random.key(0),
                                               input_shape=(32, 32, 3), restarts=True),
        "restarts must be a positive integer, got True"),
    "one prior for the tuple of priors": (
        lambda m, obs, lm: attacks.Attack(priors=priors.Prior(priors.total_variation, 0.1)),
        "priors is a tuple of priors.Prior records: write priors=(prior,)"),
    "a prior's weight of an array of one value per image": (
        lambda m, obs, lm: priors.Prior(priors.total_variation, np.array([0.1])),
        "a prior's weight must be a finite number >= 0"),
    "a dense layer named by the other keyword": (
        lambda m, obs, lm: analytic.exclusive_neurons(obs, m.apply_fn, (32, 32, 3), layer="nope"),
        "pass layer=..."),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_library_input_is_one_clear_value_error(lenet, language_model, name):
  call, message = CASES[name]
  model, obs = lenet
  with pytest.raises(ValueError, match=__import__("re").escape(message)) as error:
    call(model, obs, language_model)
  assert "\n" not in str(error.value)


def test_a_prior_weight_held_in_an_array_is_a_number():
  """A 0-d array (NumPy's or JAX's) is the number it holds: the attack, whose fields key its
  compiled programs, runs with it (an unhashable jax.Array failed after set-up)."""
  for weight in (np.array(0.25), jnp.asarray(0.25)):
    prior = priors.Prior(priors.total_variation, weight)
    assert type(prior.weight) is float and prior.weight == 0.25
    hash(attacks.Attack(priors=(prior,)))


def test_an_int_image_size_is_a_square():
  """data.load's image_size given as one int resizes to a square, as (s, s) does."""
  square = data.load("skimage", indices=0, image_size=16)
  pair = data.load("skimage", indices=0, image_size=(16, 16))
  np.testing.assert_array_equal(square.x, pair.x)
  assert square.x.shape == (1, 16, 16, 3)
