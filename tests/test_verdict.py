"""Verdicts (gradjax.verdict): the residual against NumPy float64, the label chance against an
enumeration, the mean-colour baseline against scikit-image, and the decision on hand-made inputs."""

import itertools
import os

import jax
import numpy as np
import pytest
import skimage.metrics
from scipy import ndimage

from gradjax import clients, compilation, data, fidelity, metrics, models, presets, verdict


def _lenet():
  return models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10,
                       conv="xla")


@pytest.mark.slow
def test_residual_is_the_sine_to_the_observation(photos):
  """The residual at the best common scale equals sin ∠(u, c) from NumPy, and is 0 for the data
  themselves even when the observation is scaled (DLM's and cosine distances leave it free)."""
  model = _lenet()
  y = np.array([1, 4])
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], y)
  scaled = obs.replace(gradient=jax.tree.map(lambda g: 7.0 * g, obs.gradient))
  exact = verdict.residual(model.apply_fn, scaled, {"x": photos[:2]}, y)
  assert exact.relative_error < 1e-5 and exact.scale == pytest.approx(7.0, rel=1e-5)
  # An update of the opposite sign (α* < 0): the cosines are ∠(u, c)'s, −1, not the scaled
  # update's (+1 before).
  negated = verdict.residual(model.apply_fn, obs.replace(gradient=jax.tree.map(lambda g: -g, obs.gradient)),
                             {"x": photos[:2]}, y)
  assert negated.relative_error < 1e-5 and negated.cosine == pytest.approx(-1.0, abs=1e-6)
  assert all(v["cosine"] == pytest.approx(-1.0, abs=1e-5) for v in negated.layers.values())
  other = photos[2:4]
  got = verdict.residual(model.apply_fn, obs, {"x": other}, y)
  u = np.concatenate([np.ravel(g) for g in jax.tree.leaves(
      clients.fedsgd(model.apply_fn, model.variables, other, y).gradient)]).astype(np.float64)
  c = np.concatenate([np.ravel(g) for g in jax.tree.leaves(obs.gradient)]).astype(np.float64)
  cos = u @ c / np.linalg.norm(u) / np.linalg.norm(c)
  assert got.relative_error == pytest.approx(np.sqrt(1 - cos ** 2), rel=1e-4)
  assert got.cosine == pytest.approx(cos, rel=1e-5)
  assert got.scale == pytest.approx(np.linalg.norm(c) / np.linalg.norm(u), rel=1e-5)
  # Each layer at the common scale α = ⟨u, c⟩ / ‖u‖², in NumPy.
  alpha = u @ c / (u @ u)
  floor = np.sqrt(np.finfo(np.float32).eps) * np.linalg.norm(c)  # a leaf's least denominator
  for (path, ui), ci in zip(jax.tree_util.tree_flatten_with_path(
      clients.fedsgd(model.apply_fn, model.variables, other, y).gradient)[0],
      jax.tree.leaves(obs.gradient)):
    ui, ci = np.ravel(ui).astype(np.float64), np.ravel(ci).astype(np.float64)
    layer = got.layers[jax.tree_util.keystr(path)]
    assert layer["relative_error"] == pytest.approx(
        np.linalg.norm(alpha * ui - ci) / max(np.linalg.norm(ci), floor), rel=1e-4)
    assert layer["cosine"] == pytest.approx(ui @ ci / np.linalg.norm(ui) / np.linalg.norm(ci), rel=1e-4)
  # Soft labels: the residual uses softmax(label_logits), as DLG's objective does.
  logits = np.where(np.arange(10) == y[:, None], 30.0, 0.0).astype(np.float32)
  assert verdict.residual(model.apply_fn, obs, {"x": photos[:2], "label_logits": logits},
                          None).relative_error < 1e-4
  # Soft targets that are not one-hot: u is the gradient of −Σ_c t_c log softmax(z)_c (mean over
  # the batch), written out here.
  logits = np.random.default_rng(0).normal(size=(2, 10)).astype(np.float32)
  t = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  soft = jax.grad(lambda p: -(t * jax.nn.log_softmax(model.apply_fn(
      {**model.variables, "params": p}, other), axis=-1)).sum(-1).mean())(model.variables["params"])
  u = np.concatenate([np.ravel(g) for g in jax.tree.leaves(soft)]).astype(np.float64)
  cos = u @ c / np.linalg.norm(u) / np.linalg.norm(c)
  got = verdict.residual(model.apply_fn, obs, {"x": other, "label_logits": logits}, None)
  assert got.relative_error == pytest.approx(np.sqrt(1 - cos ** 2), rel=1e-4)
  # A label the attack did not find (−1) adds nothing to u: the other example's gradient alone.
  alone = np.concatenate([np.ravel(g) for g in jax.tree.leaves(
      clients.fedsgd(model.apply_fn, model.variables, other[1:], y[1:]).gradient)]).astype(np.float64)
  cos = alone @ c / np.linalg.norm(alone) / np.linalg.norm(c)
  got = verdict.residual(model.apply_fn, obs, {"x": other}, np.array([-1, y[1]]))
  assert got.relative_error == pytest.approx(np.sqrt(1 - cos ** 2), rel=1e-4)
  # What would be a wrong residual without a word: a label beyond the classes, a batch of another size.
  for x, labels, message in ((other, np.array([1, 10]), r"must lie in \[0, 10\)"),
                             (other[:1], np.array([1]), "holds \\(1,\\) examples, the observation 2"),
                             (other, np.array([1.0, 2.0]), "must be int"),
                             (np.moveaxis(other, -1, 1), y, "does not fit the model")):
    with pytest.raises(ValueError, match=message):
      verdict.residual(model.apply_fn, obs, {"x": x}, labels)


@pytest.mark.parametrize("spec", ["clip:0.5", "prune:0.6", "fp16", "clip:0.5,fp16"])
def test_the_residual_under_a_declared_defense_is_that_of_what_the_client_sent(photos, spec):
  """The client's own data reproduce a defended update exactly once the declared defense is applied
  to their update (0 up to float32 rounding), where without it the defense's change is left (per-layer
  clipping rescales each layer; pruning zeroes entries; fp16 rounds them): the residual of a
  deterministic defense, which a verdict must read. One local step's update matched as its gradient
  (the defense acted on lr times it): the same at ``defense_scale`` = lr."""
  from gradjax import defenses
  model = _lenet()
  y = np.array([1, 4])
  defense = defenses.parse(spec)
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], y)
  sent = defense.apply(obs)
  plain = verdict.residual(model.apply_fn, sent, {"x": photos[:2]}, y)
  assert plain.relative_error > 1e-4  # the defense's change (fp16: float16's relative rounding)
  assert verdict.residual(model.apply_fn, sent, {"x": photos[:2]}, y,
                          defense=defense).relative_error < 1e-6
  lr = 0.05
  local = clients.LocalTraining(epochs=1, batch_size=None, learning_rate=lr)
  step = defense.apply(clients.fedavg(model.apply_fn, model.variables, photos[:2], y, local))
  as_gradient = clients.update_as_gradient(step)
  # W_t − W_{t+1}'s float32 rounding moves a few entries across fp16's cells: well within the
  # verdict's bound (Thresholds.matched, 5e-4), where the plain residual is the defense's change.
  assert verdict.residual(model.apply_fn, as_gradient, {"x": photos[:2]}, y, defense=defense,
                          defense_scale=lr).relative_error < 1e-4
  # A spec where the Defense goes, or a defense that adds noise: refused, naming it.
  with pytest.raises(TypeError, match="defense"):
    verdict.residual(model.apply_fn, sent, {"x": photos[:2]}, y, defense=spec)
  with pytest.raises(ValueError, match="gaussian:0.01 adds noise"):
    verdict.residual(model.apply_fn, sent, {"x": photos[:2]}, y,
                     defense=defenses.parse(f"{spec},gaussian:1e-2"))


def test_residual_of_replayed_local_training(photos):
  model = _lenet()
  local = clients.LocalTraining(epochs=2, batch_size=1, learning_rate=0.1)
  y = np.array([3, 5])
  obs = clients.fedavg(model.apply_fn, model.variables, photos[:2], y, local)
  assert verdict.residual(model.apply_fn, obs, {"x": photos[:2]}, y,
                          matched="replay").relative_error < 1e-5
  assert verdict.residual(model.apply_fn, obs, {"x": photos[2:4]}, y,
                          matched="replay").relative_error > verdict.THRESHOLDS.matched
  # The attack's own matched part reads as its name; an unknown one, or a replay of a FedSGD
  # gradient, is refused (either read silently as the gradient gave a wrong residual).
  replay = presets.inverting_gradients_fedavg(10).matched
  assert verdict.residual(model.apply_fn, obs, {"x": photos[:2]}, y,
                          matched=replay).relative_error < 1e-5
  with pytest.raises(ValueError, match="unknown matched part 'Replay'"):
    verdict.residual(model.apply_fn, obs, {"x": photos[:2]}, y, matched="Replay")
  gradient = clients.fedsgd(model.apply_fn, model.variables, photos[:2], y)
  with pytest.raises(ValueError, match="FedSGD observation"):
    verdict.residual(model.apply_fn, gradient, {"x": photos[:2]}, y, matched="replay")


def test_residual_of_replayed_local_training_against_numpy(photos, mlp_reference):
  """The replay residual of a two-layer MLP client (2 epochs of single-example SGD steps) against
  NumPy: the update replayed on the candidate images by hand-derived backpropagation, scaled by
  ⟨u, c⟩ / ‖u‖², its error relative to the observed update."""
  model = models.create("mlp-16", jax.random.key(2), input_shape=(8, 8, 3))
  x, y = photos[:2, :8, :8], np.array([3, 5])
  local = clients.LocalTraining(epochs=2, batch_size=1, learning_rate=0.1)
  obs = clients.fedavg(model.apply_fn, model.variables, x, y, local)
  sent = jax.tree.map(lambda w: np.asarray(w, np.float64), model.variables["params"])

  def replay(images):  # W_0 − W_4 after the steps on examples 0, 1, 0, 1
    w = sent
    for _ in range(2):
      for i in range(2):
        g = mlp_reference(w, images[i:i + 1], y[i:i + 1])[1]
        w = jax.tree.map(lambda a, b: a - 0.1 * b, w, g)
    return np.concatenate([np.ravel(a - b) for a, b in zip(jax.tree.leaves(sent), jax.tree.leaves(w))])

  c = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(obs.gradient)])
  np.testing.assert_allclose(replay(x), c, rtol=1e-4, atol=1e-7)  # the client is the NumPy one
  for images in (x, photos[2:4, :8, :8]):
    u = replay(images)
    want = np.linalg.norm(u @ c / (u @ u) * u - c) / np.linalg.norm(c)
    got = verdict.residual(model.apply_fn, obs, {"x": images}, y, matched="replay").relative_error
    assert got == pytest.approx(want, rel=1e-3, abs=1e-5)
  assert want > verdict.THRESHOLDS.matched  # the other photos do not reproduce the update


def test_residual_is_one_program(photos, caplog):
  """The residual's update and its inner products compile as one program, not one per operation
  (run op by op they were about 130 small programs, 4 s of a 12 s first run of the README's job)."""
  model = models.create("lenet_zhu", jax.random.key(5), input_shape=(12, 12, 3), num_classes=7)
  x, y = photos[:2, :12, :12], np.array([1, 4])
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
  with caplog.at_level("WARNING"), jax.log_compiles():
    verdict.residual(model.apply_fn, obs, {"x": x[::-1]}, y)
  compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
  assert len(compiled) <= 3, compiled


def test_a_simulated_clients_residual_makes_no_program(photos):
  """The residual of a reconstruction with a FedSGD client's shapes runs the client's own gradient
  program, which its update compiled (its inner products on the host): no program of its own."""
  model = models.create("lenet_zhu", jax.random.key(5), input_shape=(12, 12, 3), num_classes=7)
  x, y = photos[:2, :12, :12], np.array([1, 4])
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
  with compilation.Recorder() as made:
    verdict.residual(model.apply_fn, obs, {"x": x[::-1]}, y)
  assert made.programs == []


@pytest.mark.parametrize("labels, k", [([3], 10), ([1, 2], 3), ([0, 0, 2], 3), ([1, 1, 1, 0], 2)])
def test_label_chance_against_enumeration(labels, k):
  want = sorted(labels)
  hits = sum(sorted(g) == want for g in itertools.product(range(k), repeat=len(labels)))
  assert verdict.label_chance(labels, k) == pytest.approx(hits / k ** len(labels), rel=1e-12)


def test_mean_colour_psnr_against_skimage(photos):
  got = metrics.mean_colour_psnr(photos[:3])
  for i in range(3):
    flat = np.broadcast_to(photos[i].astype(np.float64).mean(axis=(0, 1)), photos[i].shape)
    want = skimage.metrics.peak_signal_noise_ratio(photos[i].astype(np.float64), flat, data_range=1)
    assert got[i] == pytest.approx(want, rel=1e-9)


def _scores(psnr, ssim, lpips=None, flat=None, acc=None, labels=None, got=None):
  return {"psnr_per_image": psnr, "ssim_per_image": ssim, "lpips_per_image": lpips,
          "psnr_mean_colour_per_image": flat, "label_accuracy": acc, "labels_true": labels,
          "labels_reconstructed": labels if got is None else got}


@pytest.mark.parametrize("labels, k", [([3], 10), ([1, 2], 3), ([0, 0, 2], 3), ([1, 1, 1, 0], 4)])
def test_composition_chance_against_enumeration(labels, k):
  want = set(labels)
  hits = sum(set(g) == want for g in itertools.product(range(k), repeat=len(labels)))
  assert verdict.composition_chance(labels, k) == pytest.approx(hits / k ** len(labels), rel=1e-12)


def test_chances_and_findings_refuse_inputs_that_would_give_no_probability():
  """Labels beyond the classes (a 'probability' of 1.5 had come out), no classes, score lists of
  unequal lengths (zip had dropped images) or none."""
  for fn in (verdict.label_chance, verdict.composition_chance):
    for labels, k in (([0, 1, 2, 3], 2), ([1, 12], 10), ([0], 0), ([], 10), ([-1], 10)):
      with pytest.raises(ValueError, match="a label chance needs labels in"):
        fn(labels, k)
  for scores in (_scores([30.0, 30.0], [0.9]), _scores([], [])):
    with pytest.raises(ValueError, match="one score of each kind per image"):
      verdict.image_findings(scores, labels_inferred=False, num_classes=10)


def _recognisable(findings):
  return [r["recognisable"] for r in findings["images"]["per_image"]]


def test_the_scores_carry_the_mean_colour_floor_the_findings_need(photos):
  """metrics.score gives each true image's mean-colour PSNR (against NumPy), so its scores of a
  reconstruction that is the mean colour leak nothing; scores without the floor are refused."""
  x = np.asarray(photos[:2], np.float64)
  flat = np.broadcast_to(x.mean(axis=(1, 2), keepdims=True), x.shape)
  scores = metrics.score(flat, x)
  mse = ((flat - x) ** 2).mean(axis=(1, 2, 3))
  np.testing.assert_allclose(scores["psnr_mean_colour_per_image"], 10 * np.log10(1 / mse), rtol=1e-6)
  findings = verdict.image_findings(scores, labels_inferred=False, num_classes=10, side=32)
  assert not findings["images"]["leak"]
  with pytest.raises(ValueError, match="psnr_mean_colour_per_image"):
    verdict.image_findings({k: v for k, v in scores.items() if k != "psnr_mean_colour_per_image"},
                           labels_inferred=False, num_classes=10)


def test_image_findings():
  t = verdict.THRESHOLDS
  none = dict(labels_inferred=False, num_classes=10)
  assert verdict.leaks(verdict.image_findings(_scores([t.psnr - 1], [t.ssim - 0.1]), **none)) == []
  got = verdict.image_findings(_scores([12.0, t.psnr], [0.1, 0.1]), **none)
  assert _recognisable(got) == [False, True] and verdict.leaks(got) == ["images"]
  assert got["images"]["recognisable"] == 1 and got["images"]["share"] == 0.5
  assert got["images"]["median_psnr"] == pytest.approx((12.0 + t.psnr) / 2)
  three = verdict.image_findings(_scores([12.0, 30.0, 20.0], [0.7, 0.1, 0.4], lpips=[0.5, 0.2, 0.9]),
                                 side=t.lpips_min_side, **none)["images"]
  assert (three["median_psnr"], three["median_ssim"], three["median_lpips"]) == (20.0, 0.4, 0.5)
  assert _recognisable(verdict.image_findings(_scores([12.0], [t.ssim]), **none)) == [True]
  lpips_only = _scores([12.0], [0.1], lpips=[t.lpips])
  assert _recognisable(verdict.image_findings(lpips_only, side=t.lpips_min_side, **none)) == [True]
  # Smaller images, or of an unknown size: LPIPS decides nothing.
  assert _recognisable(verdict.image_findings(lpips_only, side=t.lpips_min_side - 1, **none)) == [False]
  assert _recognisable(verdict.image_findings(lpips_only, **none)) == [False]
  # No better than the image's own mean colour: not recognisable, whatever the thresholds say, and
  # the finding counts it.
  flat = verdict.image_findings(_scores([23.0, 21.0], [0.8, 0.8], flat=[22.5, 10.0]), **none)
  assert _recognisable(flat) == [False, True] and flat["images"]["below_mean_colour"] == 1
  # Labels: shared by the threat model, nothing to find.
  labels = _scores([10.0] * 3, [0.0] * 3, acc=1.0, labels=[1, 2, 3])
  shared = verdict.image_findings(labels, **none)
  assert verdict.leaks(shared) == [] and shared["labels"]["inferred"] is False
  # Inferred, all recovered, and a guess unlikely to get them (3 distinct of 10: 0.6 %): labels
  # leak; the images do not, and the composition is subsumed.
  found = verdict.image_findings(labels, labels_inferred=True, num_classes=10)
  assert verdict.leaks(found) == ["labels"] and found["composition"]["leak"]
  one = _scores([10.0], [0.0], acc=1.0, labels=[4])  # one label of 10: a guess gets it 10 % of the time
  assert verdict.leaks(verdict.image_findings(one, labels_inferred=True, num_classes=10)) == []
  # The counts wrong but every class present and no other: the composition leaks on its own, and the
  # contradicting labels are named.
  counts = _scores([10.0] * 4, [0.0] * 4, acc=0.75, labels=[1, 1, 2, 3], got=[1, 2, 2, 3])
  found = verdict.image_findings(counts, labels_inferred=True, num_classes=10)
  assert verdict.leaks(found) == ["composition"]
  assert found["labels"]["missing"] == {"1": 1} and found["labels"]["extra"] == {"2": 1}
  # Slots the attack read no label for (-1, a closed form's unseparated examples) are missing
  # labels, neither a class recovered nor one that contradicts; none read: no composition either.
  part = _scores([10.0] * 4, [0.0] * 4, acc=0.5, labels=[1, 1, 2, 3], got=[1, 3, -1, -1])
  found = verdict.image_findings(part, labels_inferred=True, num_classes=10)
  assert found["labels"]["unread"] == 2 and found["labels"]["extra"] == {}
  assert found["labels"]["missing"] == {"1": 1, "2": 1} and found["composition"]["recovered"] == [1, 3]
  unread = verdict.image_findings(_scores([10.0] * 2, [0.0] * 2, acc=0.0, labels=[1, 2], got=[-1, -1]),
                                  labels_inferred=True, num_classes=10)
  assert unread["labels"]["unread"] == 2 and "composition" not in unread and verdict.leaks(unread) == []


def test_text_findings_count_from_the_corpus_guess_halfway_to_one():
  results = {"token_accuracy_per_sentence": [0.6, 0.9], "token_accuracy_chance_per_sentence": [0.3, 0.0],
             "bag_recall": 0.6, "bag_recall_chance": 0.35}
  found = verdict.text_findings(results)
  # sentence 0: 0.6 < (1 + 0.3) / 2 = 0.65; sentence 1: 0.9 >= 0.5; the bag: 0.6 < 0.675
  assert (found["sentences"]["leak"], found["sentences"]["count"]) == (True, 1)
  assert found["sentences"]["recovered"] == [1] and found["sentences"]["rougeL_bar"] is None
  assert found["sentences"]["token_accuracy_bar"] == [pytest.approx(0.65), pytest.approx(0.5)]
  assert not found["bag"]["leak"] and found["bag"]["bar"] == pytest.approx(0.675)
  assert (found["bag"]["measure"], found["bag"]["recall"], found["bag"]["chance"]) == ("bag_recall", 0.6, 0.35)
  assert verdict.text_findings({**results, "bag_recall": 0.7})["bag"]["leak"]
  plain = verdict.text_findings({"token_accuracy_per_sentence": [0.5], "bag_recall": 0.5})
  assert plain["sentences"]["leak"] and plain["bag"]["leak"]  # no chance known: the bar is 0.5
  assert verdict.halfway(0.0) == 0.5 and verdict.halfway(1.0) == 1.0
  # A guess that gets everything (every word <unk>): a perfect reconstruction shows nothing more.
  saturated = verdict.text_findings({"token_accuracy_per_sentence": [1.0],
                                     "token_accuracy_chance_per_sentence": [1.0],
                                     "bag_recall": 1.0, "bag_recall_chance": 1.0})
  assert verdict.leaks(saturated) == []
  # A set of words found without their places is measured against as many frequent words: a set
  # that holds the whole vocabulary recalls everything, and so does the guess of that size.
  words = {"token_accuracy_per_sentence": [0.0], "bag_recall": 0.0, "bag_recall_chance": 0.3,
           "words": ["a", "b", "c"], "word_recall": 0.9, "word_recall_chance": 0.6}
  found = verdict.text_findings(words)["bag"]  # 0.9 >= (1 + 0.6) / 2
  assert found["leak"] and found["measure"] == "word_recall" and found["bar"] == pytest.approx(0.8)
  assert not verdict.text_findings({**words, "word_recall": 0.75})["bag"]["leak"]
  assert not verdict.text_findings({**words, "word_recall": 1.0, "word_recall_chance": 1.0})["bag"]["leak"]
  # The token search's own bag recall counts too, where the spans' words alone do not pass.
  searched = verdict.text_findings({**words, "word_recall": 0.75, "bag_recall": 0.9})["bag"]
  assert searched["leak"] and searched["measure"] == "bag_recall"
  assert (searched["recall"], searched["bar"]) == (0.9, pytest.approx(0.65))
  uniform = verdict.text_findings({**words, "word_guess": "uniform", "word_guess_size": 3})["bag"]
  assert (uniform["guess"], uniform["guess_size"], uniform["chance"]) == ("uniform", 3, 0.6)
  assert "3 words drawn at random" in uniform["reason"]  # what the guess was, named


def test_a_sentence_with_a_token_inserted_counts_by_its_rouge_l():
  """One token inserted at the front of a 10-token sentence: one token in place (0.1), a longest
  common subsequence of 9 (ROUGE-L F = 2·0.9·0.9/1.8 = 0.9, by hand), against a position guess at
  0.2: the sentence counts by its ROUGE-L, not by its tokens in place."""
  from gradjax import metrics
  true = np.arange(1, 11)[None]
  pred = np.concatenate([[1], np.arange(1, 10)])[None]
  scores = metrics.score_text(pred, true)
  assert scores["token_accuracy_per_sentence"] == [0.1]
  assert scores["rougeL_per_sentence"] == [pytest.approx(0.9)]
  results = {**scores, "token_accuracy_chance_per_sentence": [0.2], "rougeL_chance_per_sentence": [0.2]}
  found = verdict.text_findings(results)["sentences"]
  assert found["leak"] and found["count"] == 1 and found["recovered"] == [0]
  assert found["rougeL_bar"] == [pytest.approx(0.6)] and found["token_accuracy_bar"] == [pytest.approx(0.6)]
  assert not verdict.text_findings({**results, "rougeL_chance_per_sentence": [0.9]})["sentences"]["leak"]
  assert not verdict.text_findings({k: v for k, v in results.items()
                                    if k != "rougeL_per_sentence"})["sentences"]["leak"]


def test_still_improving():
  flat = [{"iteration": i, "loss": 1.0} for i in range(100, 1001, 100)]
  falling = [{"iteration": i, "loss": 1.0 / i} for i in range(100, 1001, 100)]
  assert not verdict.still_improving(flat, 1000)
  assert verdict.still_improving(falling, 1000)
  assert not verdict.still_improving(falling[:1], 1000)
  # Restarts run one after another: the one that ends lowest decides, whatever came before it.
  stalled = [{**r, "restart": 1, "loss": 10.0} for r in flat]
  assert verdict.still_improving([{**r, "restart": 0} for r in falling] + stalled, 1000)
  assert not verdict.still_improving([{**r, "restart": 0, "loss": 100.0} for r in falling] + stalled,
                                     1000)


def test_still_improving_reads_the_last_tenth_against_five_percent():
  """Over the last tenth of 1000 iterations (from iteration 900 to the last, 1000): a best objective
  that fell 4 % there is done, 6 % still improving; a fall of 10x at iteration 900 (the window's
  edge) or earlier, flat after, is done, one at 901 is not."""
  def history(drop_at, after, last=None):
    rows = [{"iteration": i, "loss": 1.0 if i < drop_at else after} for i in range(1, 1001)]
    if last is not None:
      rows[-1] = {"iteration": 1000, "loss": last}
    return rows
  assert not verdict.still_improving(history(2000, 1.0, last=0.96), 1000)
  assert verdict.still_improving(history(2000, 1.0, last=0.94), 1000)
  assert not verdict.still_improving(history(100, 0.1), 1000)
  assert not verdict.still_improving(history(900, 0.1), 1000)
  assert verdict.still_improving(history(901, 0.1), 1000)
  # rows recorded every 50 iterations read the same; the window is a tenth of the budget given
  assert verdict.still_improving(history(2000, 1.0, last=0.94)[49::50], 1000)
  assert verdict.still_improving(history(975, 0.1), 1000)
  assert not verdict.still_improving(history(975, 0.1), 200)


def _comparison(overall, layer):
  return fidelity.Comparison(overall, 1.0, 1.0, {"['head']['kernel']": {"relative_error": layer,
                                                                          "cosine": 1.0}})


_LEAK = {"images": {"leak": True, "reason": "r"}}
_NONE = {"images": {"leak": False, "reason": "r"}}


@pytest.mark.parametrize("findings, residual, problems, status", [
    (_LEAK, _comparison(0.9, 0.9), ["p"], "leak"),            # recognisable: a leak, whatever else
    (_NONE, _comparison(1e-4, 1e-4), [], "no_leak_found"),     # matched, nothing recognisable
    (_NONE, _comparison(1e-3, 1e-3), [], "inconclusive"),      # not matched
    (_NONE, _comparison(1e-4, 2e-2), [], "inconclusive"),      # one layer not matched
    (_NONE, _comparison(1e-4, 1e-4), ["p"], "inconclusive"),   # forced past a failed check
    (None, _comparison(1e-4, 1e-4), [], "leak"),               # no truth, matched
    (None, _comparison(1e-3, 1e-3), [], "inconclusive"),       # no truth, not matched
    (None, None, [], "inconclusive"),
])
def test_decide(findings, residual, problems, status):
  got = verdict.decide(findings=findings, residual=residual, improving=False,
                       budget=verdict.budget("dlg", 2000, 1), problems=problems)
  assert got["status"] == status and got["reason"]
  assert got["leaks"] == (["images"] if findings is _LEAK else [])
  # An objective still falling never gives "no leak found".
  still = verdict.decide(findings=findings, residual=residual, improving=True,
                         budget=verdict.budget("dlg", 2000, 1), problems=problems)
  assert still["status"] == ("inconclusive" if status == "no_leak_found" else status)


def test_a_match_of_an_update_with_fewer_entries_than_the_data_is_no_leak_without_truth():
  """A 99 % pruned LeNet update keeps about 158 of its 15 826 entries for a 32x32x3 image's 3072
  values: other images reproduce it too. Without a ground truth the match is inconclusive; with as many
  entries as values it is a leak; with a ground truth the scores decide as before."""
  matched, budget = _comparison(1e-5, 1e-5), verdict.budget("dlg", 2000, 1)
  decide = lambda findings, constraints: verdict.decide(
      findings=findings, residual=matched, improving=False, budget=budget, constraints=constraints)
  assert decide(None, (158, 3072))["status"] == "inconclusive"
  assert decide(None, (3072, 3072))["status"] == "leak"
  assert decide(_NONE, (158, 3072))["status"] == "no_leak_found"
  assert decide(_LEAK, (158, 3072))["status"] == "leak"


CIFAR = os.path.join(data.default_data_dir() or "", "cifar10")


@pytest.mark.skipif(not os.path.isdir(CIFAR), reason="needs ../shared/data/cifar10")
def test_thresholds_against_trivial_images():
  """The measurements the thresholds rest on (the module docstring): on CIFAR-10 test images 0-99
  an image's mean colour is never recognisable, its 8×8 thumbnail (4×4-pixel blocks) mostly is; noise
  that knows nothing of the image but its mean colour (white, or smoothed over 2 pixels, of standard
  deviation 0.05-0.3) and another CIFAR-10 image are never recognisable (scores by scikit-image)."""
  x = data.load("cifar10", indices=range(100)).x.astype(np.float64)
  rng = np.random.default_rng(0)
  flat = np.broadcast_to(x.mean(axis=(1, 2), keepdims=True), x.shape)
  blocks = np.broadcast_to(x.reshape(100, 8, 4, 8, 4, 3).mean(axis=(2, 4), keepdims=True),
                           (100, 8, 4, 8, 4, 3)).reshape(x.shape)
  smooth = ndimage.gaussian_filter(rng.normal(size=x.shape), (0, 2, 2, 0))
  noise = [flat + rng.normal(0, sd, x.shape) for sd in (0.05, 0.1, 0.2, 0.3)]
  noise += [flat + smooth / smooth.std() * sd for sd in (0.05, 0.1, 0.2, 0.3)]
  baseline = metrics.mean_colour_psnr(x).tolist()
  none = dict(labels_inferred=False, num_classes=10)

  def recognised(candidate):
    candidate = np.clip(candidate, 0.0, 1.0)
    psnr = [skimage.metrics.peak_signal_noise_ratio(x[i], candidate[i], data_range=1) for i in range(100)]
    ssim = [skimage.metrics.structural_similarity(x[i], candidate[i], data_range=1, channel_axis=-1)
            for i in range(100)]
    return verdict.image_findings(_scores(psnr, ssim, flat=baseline), **none)["images"]["recognisable"]

  assert recognised(flat) == 0 and 80 <= recognised(blocks) <= 100
  assert recognised(np.roll(x, 1, axis=0)) == 0
  for candidate in noise:
    assert recognised(candidate) == 0


@pytest.mark.slow
def test_lpips_tells_unrelated_images_apart_only_from_48_pixels():
  """The measurement behind ``Thresholds.lpips_min_side``: unrelated scikit-image photos (each of 16
  against 4 others) score LPIPS <= 0.2 in 17 % of the pairs at 32 px, 1 of 64 at 48 px (the batches
  study's lpips_chance.py measures all pairs, more sizes and CIFAR-10)."""
  from gradjax import lpips
  if not lpips.available("alex"):
    pytest.skip("needs the lpips extra")
  metric, t = lpips.load("alex"), verdict.THRESHOLDS

  def share_below(side):
    x = data.load("skimage", indices=range(16), image_size=(side, side)).x.astype(np.float32)
    others = np.concatenate([np.roll(x, k, axis=0) for k in range(1, 5)])  # one call: one program
    return float(np.mean(lpips.distance(metric, others, np.tile(x, (4, 1, 1, 1))) <= t.lpips))

  assert share_below(32) >= 0.1 and share_below(t.lpips_min_side) <= 0.05


def test_residual_of_a_dp_sgd_client_against_numpy(photos, mlp_reference):
  """A DP-SGD client's residual (its noise left out): u the mean of the candidate examples'
  gradients each clipped to C over all parameters, by hand-derived backpropagation in NumPy, at the
  best scale against the observed update; 0 up to rounding at the client's own images without noise,
  and what the plain gradient would say differs."""
  model = models.create("mlp-16", jax.random.key(2), input_shape=(8, 8, 3))
  x, y = photos[:3, :8, :8], np.array([3, 5, 5])
  params = jax.tree.map(lambda w: np.asarray(w, np.float64), model.variables["params"])
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])
  per = [flat(mlp_reference(params, x[i:i + 1], y[i:i + 1])[1]) for i in range(3)]
  bound = float(np.median([np.linalg.norm(g) for g in per]))

  def clipped(images):
    gs = [flat(mlp_reference(params, images[i:i + 1], y[i:i + 1])[1]) for i in range(3)]
    return np.mean([g * min(1.0, bound / np.linalg.norm(g)) for g in gs], axis=0)

  clean = clients.fedsgd(model.apply_fn, model.variables, x, y, dp_sgd=clients.DPSGD(bound))
  noisy = clients.fedsgd(model.apply_fn, model.variables, x, y, dp_sgd=clients.DPSGD(bound, 0.3),
                         key=jax.random.key(1))
  for obs in (clean, noisy):
    c = flat(jax.tree.map(lambda a: np.asarray(a, np.float64), obs.gradient))
    for images in (x, photos[3:6, :8, :8]):
      u = clipped(images)
      want = np.linalg.norm(u @ c / (u @ u) * u - c) / np.linalg.norm(c)
      got = verdict.residual(model.apply_fn, obs, {"x": images}, y, max_norm=bound)
      assert got.relative_error == pytest.approx(want, rel=1e-3, abs=1e-5)
  assert verdict.residual(model.apply_fn, clean, {"x": x}, y, max_norm=bound).relative_error < 1e-5
  assert verdict.residual(model.apply_fn, clean, {"x": x}, y).relative_error > verdict.THRESHOLDS.matched


def test_replay_residual_of_a_dp_sgd_fedavg_client_against_numpy(photos, mlp_reference):
  """A FedAvg client whose local steps are DP-SGD's (no noise): the replay residual with its bound
  replays the steps clipping each example's NumPy-backprop gradient; 0 at the client's images."""
  model = models.create("mlp-16", jax.random.key(2), input_shape=(8, 8, 3))
  x, y = photos[:2, :8, :8], np.array([3, 5])
  local = clients.LocalTraining(epochs=2, batch_size=2, learning_rate=0.1)
  sent = jax.tree.map(lambda w: np.asarray(w, np.float64), model.variables["params"])
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])
  bound = 0.5 * min(np.linalg.norm(flat(mlp_reference(sent, x[i:i + 1], y[i:i + 1])[1])) for i in range(2))
  obs = clients.fedavg(model.apply_fn, model.variables, x, y, local, dp_sgd=clients.DPSGD(bound))

  def replay(images):  # two steps on the batch of both, each example's gradient clipped
    w = sent
    for _ in range(2):
      gs = [flat(mlp_reference(w, images[i:i + 1], y[i:i + 1])[1]) for i in range(2)]
      step = np.mean([g * min(1.0, bound / np.linalg.norm(g)) for g in gs], axis=0)
      w = jax.tree.unflatten(jax.tree.structure(w), [
          a - 0.1 * b.reshape(a.shape) for a, b in zip(jax.tree.leaves(w), np.split(
              step, np.cumsum([a.size for a in jax.tree.leaves(w)])[:-1]))])
    return flat(sent) - flat(w)

  c = flat(jax.tree.map(lambda a: np.asarray(a, np.float64), obs.gradient))
  np.testing.assert_allclose(replay(x), c, rtol=1e-4, atol=1e-7)  # the client is the NumPy one
  for images in (x, photos[2:4, :8, :8]):
    u = replay(images)
    want = np.linalg.norm(u @ c / (u @ u) * u - c) / np.linalg.norm(c)
    got = verdict.residual(model.apply_fn, obs, {"x": images}, y, matched="replay", max_norm=bound)
    assert got.relative_error == pytest.approx(want, rel=1e-3, abs=1e-5)
  assert want > verdict.THRESHOLDS.matched


def test_words_outside_the_vocabulary_lower_the_bar_to_what_can_be_recovered():
  """A sentence half of whose words the model read as <unk> (-1 in the truth): every recoverable
  token in place scores 0.5, which counts, halfway from the position guess (0.1) to that share
  (bar (0.1 + 0.5) / 2 = 0.3 by hand); without the share given, the bar is halfway to 1."""
  assert verdict.halfway(0.1, 0.5) == pytest.approx(0.3) and verdict.halfway(0.1) == pytest.approx(0.55)
  results = {"token_accuracy_per_sentence": [0.5], "token_accuracy_chance_per_sentence": [0.1],
             "known_share_per_sentence": [0.5], "bag_recall": 0.5, "bag_recall_chance": 0.2,
             "known_share": 0.5}
  found = verdict.text_findings(results)
  assert found["sentences"]["leak"] and "0.50 >= 0.30" in found["sentences"]["reason"]
  assert found["bag"]["leak"]  # 0.5 >= (0.2 + 0.5) / 2
  plain = {k: v for k, v in results.items() if not k.startswith("known_share")}
  assert not verdict.text_findings(plain)["sentences"]["leak"]
  assert not verdict.text_findings({**results, "token_accuracy_chance_per_sentence": [0.5]})[
      "sentences"]["leak"]  # the guess gets all the vocabulary holds
