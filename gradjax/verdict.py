"""The verdict of an attack: ``leak``, ``no_leak_found`` or ``inconclusive``, with its reason.

A number alone is no audit's answer, and an attack that failed says nothing about the data's safety.
:func:`decide` turns what a run measured into one of three statuses:

* ``leak``: the reconstruction is recognisable against the ground truth (:func:`image_findings`,
  :func:`text_findings`), or, without a ground truth, the attack matched the update
  (:func:`residual` within :attr:`Thresholds.matched`): data that reproduce the update were found,
  and the update has at least as many nonzero entries as the data have values (fewer, after heavy
  pruning or for a batch larger than the model, and other data reproduce it too: inconclusive).
* ``inconclusive``: a check of the capture failed and the run was forced, or the attack did not
  match the update (the residual above :attr:`Thresholds.matched` overall or :attr:`Thresholds.matched_layer` in some layer), saying whether the
  objective was still falling when the budget ran out (:func:`still_improving`).
* ``no_leak_found``: the attack matched the update, its objective stopped falling, and it still
  recovered nothing recognisable; the
  reason names the attack and its budget ("no leak found by dlg with 2000 iterations and 1
  restart"). Never "safe": a stronger attack or a larger budget may find what this one did not.

Thresholds (:class:`Thresholds`) and where they come from (``tests/test_verdict.py`` reproduces
the image thresholds' measurements; the residual's were measured by the runs named below):

* An image is recognisable when it tells more than its own mean colour (PSNR at least 1 dB above
  that flat image's, :func:`gradjax.metrics.mean_colour_psnr`) and reaches PSNR >= 20 dB (RMSE <= 0.1 on [0, 1]
  pixels), SSIM >= 0.5 or LPIPS (AlexNet) <= 0.2. Measured on CIFAR-10 test images 0-99: the mean
  colour alone reaches 23.5 dB and SSIM 0.81 on flat images (14.2 dB on average), hence the
  baseline; an 8×8 thumbnail (4×4-pixel blocks; 20.1 dB, SSIM 0.59, LPIPS 0.11 on average), a
  recognisable picture, is counted for 94 images by PSNR and SSIM alone; a 4×4 thumbnail (8×8-pixel
  blocks; 17.5 dB, SSIM 0.30), barely more than a colour layout, for 13. Inverting Gradients'
  reconstructions at 18-20 dB (their Table 1) are recognisable to a reader, which the SSIM and LPIPS
  thresholds catch where PSNR misses.
* LPIPS counts only for images of at least 48 pixels a side. Below that AlexNet's features hardly
  tell images apart: two unrelated CIFAR-10 test images (500-563, each against 7 others) score a
  median LPIPS of 0.21, 41 % of the pairs <= 0.2; unrelated scikit-image photos at 32 px 10 %, at
  48 px 1 % and at 64-128 px 0-1 % (``experiments/studies/batches``, ``lpips_chance.py``).
* Labels leak when the attack inferred them (the threat model did not share them) and recovered
  all N, where a uniform guess of N labels among K classes gets the multiset right with probability
  under 1 % (N! / Π m_c! / K^N; one label of 10 classes: 10 %, not evidence).
* The attack matched the update when the relative residual of its reconstruction's update, at the
  best common scale (:func:`residual`), is at most 5e-4 over all layers and 1e-2 in every layer.
  Measured with DLG and iDLG on DLG's LeNet, CIFAR-10 test images 0-7 (2000 iterations): the
  successes (28-53 dB) leave 2e-5 to 3.7e-4 over all layers and at most 1.3e-3 in a layer (a
  PyTorch client's gradient of scikit-image photo 5: 4.2e-4 and 5.8e-3 at 32 dB); DLG
  against a client that normalises its inputs (photo 5, 2000 and 6000 iterations) leaves 3.3e-3 and
  7.8e-4 at 17.5 and 20.4 dB, still falling; the same attack on a ReLU network's gradient read as
  sigmoid 0.87. A small residual is necessary for a faithful reconstruction, not sufficient: so
  ``no_leak_found`` also needs the objective to have stopped falling.
* The objective stopped falling when its best value fell by at most 5 % over the last tenth of the
  iterations (:func:`still_improving`): a rule of thumb, not a measurement; a run it calls still
  improving is inconclusive, never ``no_leak_found``.
"""

import collections
import functools
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import clients, compilation, defenses, fidelity, models, objectives
from gradjax.objectives import dummy_gradient
from gradjax.observation import Observation, check_labels

STATUSES = ("leak", "no_leak_found", "inconclusive")


class Thresholds(NamedTuple):
  """Where a reconstruction counts as recognisable and an update as matched (see the module
  docstring for the measurements behind the defaults)."""

  psnr: float = 20.0          # dB, per image, at least
  ssim: float = 0.5           # per image, at least
  lpips: float = 0.2          # per image, at most
  lpips_min_side: int = 48    # pixels a side, at least, for LPIPS to count
  label_chance: float = 0.01  # labels leak when a guess gets them all right less often than this
  matched: float = 5e-4       # residual over all layers, at most
  matched_layer: float = 1e-2  # residual in every layer, at most
  improving: float = 0.05     # relative fall of the objective over the last tenth of the run


THRESHOLDS = Thresholds()


def residual(apply_fn, observation: Observation, dummy: dict, labels, *,
             matched: "str | objectives.Matched" = "gradient",
             max_norm: float | None = None,
             sampling_rate: float | None = None,
             expected_batch_size: float | None = None,
             defense: defenses.Defense | None = None,
             defense_scale: float = 1.0) -> fidelity.Comparison:
  """How well the attack's reconstruction reproduces the observed update.

  The update the client would have sent for the reconstruction (its gradient, or for ``matched``
  ``"replay"`` the replayed local training's W_t − W'_{t+1}), u, scaled by the best common factor
  α* = ⟨u, c⟩ / ‖u‖² (DLM's γ and cosine distances leave the scale free), against the observed c:
  relative error ‖α* u − c‖ / ‖c‖ over all layers (= sin ∠(u, c)) and per layer; cosine ∠(u, c);
  scale ‖c‖ / ‖u‖, of u as the reconstruction gives it (≠ 1 where the reconstruction's update is
  right up to a factor: a learning rate, a loss summed rather than averaged).

  Args:
    apply_fn, observation: as the attack's.
    dummy: the reconstruction's optimised variables (``"x"``, and ``"label_logits"`` when labels were
      optimised jointly: their softmax is the target).
    labels: (N,) int labels the attack used when ``dummy`` has no label logits (−1 where it found
      none: that example adds nothing to u).
    matched: what the attack's objective matched: its name (:data:`gradjax.objectives.MATCHED`, or
      ``"clipped_gradient"``) or the attack's ``matched`` part itself; ``"replay"`` recomputes the
      replayed local training (a FedAvg observation's), every other part the gradient.
    max_norm: the client ran DP-SGD with this clipping bound: u is the mean of the examples' own
      gradients each clipped to it (:func:`gradjax.clients.clipped_gradient`), or the local
      training replayed with such steps; its noise is not recomputed.
    sampling_rate: those steps were Poisson-sampled at this rate: the replayed local training's
      steps are their expectation over the draws (:class:`gradjax.objectives.Replay`), so the
      residual of the client's own data is not zero; a gradient's scale is fitted, so the expected
      batch size a FedSGD step divides by changes nothing.
    expected_batch_size: the replayed steps' divisor E where it is not q·n (Opacus' ``int(q·n)``,
      :class:`gradjax.objectives.Replay`).
    defense: the deterministic defense (clipping, pruning, rounding; no noise: a
      :class:`gradjax.defenses.Defense`) the client applied to what it sent: u is compared as
      T(s·u)/s, what the client would have sent, with s = ``defense_scale`` (the learning rate
      where the observation is one local step's update matched as its gradient, which the defense
      acted on). Without it, the residual of the client's own data under such a defense is the
      defense's change.

  Raises ValueError for a batch of another size than the observation's, inputs the model does
  not read, labels outside the model's classes.
  """
  if defense is not None:
    defenses.check(defense)
    noisy = [p.spec for p in defenses.parts(defense) if p.head in defenses.NOISY]
    if noisy:
      raise ValueError(f"the residual recomputes what a deterministic defense sent; {noisy[0]} adds "
                       "noise, which no recomputation matches: leave it out of defense")
  matched = getattr(matched, "name", matched)
  if matched not in (*objectives.MATCHED, objectives.ClippedGradient.name):
    raise ValueError(f"unknown matched part {matched!r}; choose one of "
                     f"{', '.join((*objectives.MATCHED, objectives.ClippedGradient.name))}")
  if matched == "replay" and observation.local is None:
    raise ValueError("matched='replay' replays the client's local training, which a FedSGD "
                     "observation does not hold: match its 'gradient'")
  logits = dummy.get("label_logits")
  x = compilation.device_array(dummy["x"])
  if x.ndim < 1 or x.shape[0] != observation.num_samples:
    raise ValueError(f"the reconstruction holds {x.shape[:1]} examples, the observation "
                     f"{observation.num_samples}")
  out = models.output_shape(apply_fn, observation.variables, x.shape[1:], x.dtype,
                            observation.train, what="a reconstructed example")
  if logits is None:  # −1: an example whose label the attack did not find (it adds nothing to u)
    check_labels(labels, (x.shape[0], *out[1:-1]), out[-1], "the reconstruction's labels",
                 absent=True)
  elif jnp.shape(logits)[0] != observation.num_samples:
    raise ValueError(f"label_logits {jnp.shape(logits)} are not one row per example of the "
                     f"observation's {observation.num_samples}")
  if logits is None and matched != "replay" and max_norm is None:
    # The client's own gradient program: a simulated client's set-up compiled it for these shapes.
    u = clients.gradient(apply_fn, observation.variables, x, compilation.device_array(labels),
                         train=observation.train)
  else:
    u = _update(apply_fn, observation, x, compilation.device_array(labels if logits is None else logits),
                matched=matched, soft=logits is not None,
                max_norm=None if max_norm is None else float(max_norm),
                sampling_rate=(None if sampling_rate is None or matched != "replay"  # a gradient's
                               else float(sampling_rate)),  # scale is fitted: no rate to compile in
                expected_batch_size=(None if expected_batch_size is None or sampling_rate is None
                                     or matched != "replay" else float(expected_batch_size)))
  if defense is not None:
    sent = defense.apply(observation.replace(gradient=jax.tree.map(lambda a: defense_scale * a, u)))
    u = jax.tree.map(lambda a: a / defense_scale, sent.gradient)
  u = jax.tree.map(lambda a: np.asarray(a, np.float64), jax.device_get(u))
  unscaled = fidelity.compare(u, observation.gradient)
  alpha = unscaled.cosine * unscaled.scale  # ⟨u, c⟩ / ‖u‖² (0 where u or c is 0)
  # The errors at α*; the cosines and the scale of u itself (after α* < 0 every cosine's sign would
  # flip, and the scale would be 1 / |cos|, saying nothing more).
  scaled = fidelity.compare(jax.tree.map(lambda a: alpha * a, u), observation.gradient)
  return scaled._replace(
      cosine=unscaled.cosine, scale=unscaled.scale,
      layers={k: {**v, "cosine": unscaled.layers[k]["cosine"]} for k, v in scaled.layers.items()})


@functools.partial(compilation.once,
                   static_argnames=("apply_fn", "matched", "soft", "max_norm", "sampling_rate",
                                    "expected_batch_size"))
def _update(apply_fn, observation: Observation, x, targets, *, matched: str, soft: bool,
            max_norm: float | None = None, sampling_rate: float | None = None,
            expected_batch_size: float | None = None):
  """The update u the client would have sent for ``x`` and ``targets`` (label logits when ``soft``:
  their softmax is the target; the replayed local training for ``matched`` ``"replay"``; DP-SGD's
  steps, before their noise, with the clipping bound ``max_norm``): one program, not one per
  operation."""
  if soft:
    targets = jax.nn.softmax(targets, axis=-1)
  if matched == "replay":
    u = clients.replayed_update(apply_fn, observation, x, targets, max_norm=max_norm,
                                sampling_rate=sampling_rate, expected_batch_size=expected_batch_size)
  elif max_norm is not None:
    u = clients.clipped_gradient(apply_fn, observation.variables, x, targets, max_norm,
                                 train=observation.train)
  else:
    u = dummy_gradient(apply_fn, observation.variables, x, targets, train=observation.train)
  return u


def matched(comparison: fidelity.Comparison, thresholds: Thresholds = THRESHOLDS) -> bool:
  """Whether a :func:`residual` is within the thresholds (over all layers and in every layer)."""
  return comparison.within((thresholds.matched, thresholds.matched_layer))


def still_improving(history: Sequence[dict], iterations: int,
                    thresholds: Thresholds = THRESHOLDS) -> bool:
  """Whether the best objective fell by more than ``thresholds.improving`` (relative) over the last
  tenth of the ``iterations``. ``history``: rows ``{"restart", "iteration", "loss"}`` of the best so
  far (:class:`gradjax.run.pipeline.Trace`); restarts run one after another are read apart, and the one
  that ends lowest decides."""
  runs: dict = {}
  for r in history:
    if r.get("loss") is not None and math.isfinite(r["loss"]):
      runs.setdefault(r.get("restart"), []).append(r)
  if not runs:
    return False
  rows = min(runs.values(), key=lambda rs: rs[-1]["loss"])
  last = rows[-1]
  earlier = [r for r in rows if r["iteration"] <= last["iteration"] - max(1, iterations // 10)]
  if not earlier:
    return False
  before = min(r["loss"] for r in earlier)
  return before > 0 and (before - last["loss"]) / before > thresholds.improving


def _classes(true_labels: Sequence[int], num_classes: int) -> list[int]:
  """``true_labels`` as ints, or a one-line ValueError unless they are classes of ``num_classes``
  (at least one), which a chance is computed over."""
  labels = [int(c) for c in true_labels]
  if num_classes < 1 or not labels or min(labels) < 0 or max(labels) >= num_classes:
    raise ValueError(f"a label chance needs labels in [0, {num_classes}), got {labels}")
  return labels


def label_chance(true_labels: Sequence[int], num_classes: int) -> float:
  """The probability that N labels drawn uniformly from ``num_classes`` form the multiset of
  ``true_labels``: N! / Π_c m_c! / K^N."""
  n = len(_classes(true_labels, num_classes))
  counts = np.unique(np.asarray(true_labels), return_counts=True)[1]
  log_p = math.lgamma(n + 1) - sum(math.lgamma(int(m) + 1) for m in counts) - n * math.log(num_classes)
  return math.exp(log_p)


def composition_chance(true_labels: Sequence[int], num_classes: int) -> float:
  """The probability that N labels drawn uniformly from ``num_classes`` hit exactly the classes of
  ``true_labels`` (m distinct): the onto maps of N draws onto those m classes over K^N,
  Σ_j (−1)^j C(m, j) (m − j)^N / K^N."""
  n, m = len(true_labels), len(set(_classes(true_labels, num_classes)))
  onto = sum((-1) ** j * math.comb(m, j) * (m - j) ** n for j in range(m + 1))
  return onto / num_classes ** n


RULE = ("recognisable: PSNR >= {psnr:g} dB, SSIM >= {ssim:g} or LPIPS <= {lpips:g} (images of "
        "{lpips_min_side} px a side or more), and 1 dB above its own mean colour")


def _image_rule(p, s, l, f, t: Thresholds) -> tuple[bool, str]:
  """(recognisable, the rule that decided) of one image's scores (PSNR, SSIM, LPIPS or None, the
  PSNR of its mean colour)."""
  if p < f + 1.0:
    return False, f"PSNR {p:.1f} dB is not 1 dB above its mean colour's {f:.1f} dB"
  why = [f"PSNR {p:.1f} dB >= {t.psnr:g}"] if p >= t.psnr else []
  why += [f"SSIM {s:.2f} >= {t.ssim:g}"] if s >= t.ssim else []
  why += [f"LPIPS {l:.2f} <= {t.lpips:g}"] if l is not None and l <= t.lpips else []
  if why:
    return True, ", ".join(why)
  return False, (f"PSNR {p:.1f} dB < {t.psnr:g}, SSIM {s:.2f} < {t.ssim:g}"
                 + (f", LPIPS {l:.2f} > {t.lpips:g}" if l is not None else ""))


def _multiset_difference(a, b) -> dict:
  """{class: count} of the labels in ``a`` beyond those in ``b`` (multisets)."""
  extra = collections.Counter(int(c) for c in a) - collections.Counter(int(c) for c in b)
  return {str(c): k for c, k in sorted(extra.items())}


def image_findings(scores: dict, *, labels_inferred: bool, num_classes: int, side: int | None = None,
                   thresholds: Thresholds = THRESHOLDS) -> dict:
  """What a scored image reconstruction reveals, one finding per kind of leak.

  ``scores``: ``psnr_per_image``, ``ssim_per_image``, ``psnr_mean_colour_per_image``
  (:func:`gradjax.metrics.mean_colour_psnr`; None: the mean-colour floor is not applied) and optional
  ``lpips_per_image``, in ground-truth order after the optimal assignment (as
  :func:`gradjax.metrics.score` returns them); ``label_accuracy``, ``labels_true`` and
  ``labels_reconstructed`` where labels were scored. ``side``: the images' smaller side in pixels;
  below ``thresholds.lpips_min_side`` (or unknown) LPIPS decides nothing.

  Returns ``{"images": ..., "labels": ..., "composition": ...}``, each with ``leak`` (bool) and
  ``reason`` (the rule that decided):

  * ``images``: each image is recognisable by :data:`RULE` (``per_image``: its verdict and the rule
    that decided it); ``recognisable`` (count), ``of``, ``share``, ``median_psnr``,
    ``median_ssim`` (and ``median_lpips``), ``below_mean_colour`` (images no better than their own
    mean colour); a leak when at least one image is recognisable.
  * ``labels`` (when labels were inferred, not shared by the threat model): the multiset of labels
    recovered whole where a uniform guess gets it with probability below ``label_chance``
    (:func:`label_chance`); ``missing`` and ``extra``: {class: count} of the true labels not recovered
    and of the recovered labels that contradict them; ``unread``: the slots whose label the attack
    did not read (−1, e.g. a closed form's examples it did not separate), counted as not recovered.
    Where it read none: no leak and no ``composition``.
  * ``composition``: the classes present, recovered exactly (every class and no other), where a
    guess hits that set with probability below ``label_chance`` (:func:`composition_chance`): what an
    attacker learns even when the counts are off.
  """
  t = thresholds
  n = len(scores["psnr_per_image"])
  lpips = scores.get("lpips_per_image") or [None] * n
  counted = lpips if side is not None and side >= t.lpips_min_side else [None] * n
  if "psnr_mean_colour_per_image" not in scores:
    raise ValueError("image findings need psnr_mean_colour_per_image (gradjax.metrics.score gives "
                     "it; None to skip the mean-colour floor)")
  flat = scores["psnr_mean_colour_per_image"] or [-np.inf] * n
  if n == 0 or any(len(v) != n for v in (scores["ssim_per_image"], lpips, flat)):
    raise ValueError("image findings need one score of each kind per image, got "
                     f"{n} PSNR, {len(scores['ssim_per_image'])} SSIM, {len(lpips)} LPIPS and "
                     f"{len(flat)} mean-colour values")
  per_image, below = [], []
  for i, (p, s, l, f) in enumerate(zip(scores["psnr_per_image"], scores["ssim_per_image"], counted, flat)):
    ok, rule = _image_rule(p, s, l, f, t)
    per_image.append({"recognisable": ok, "rule": rule})
    if p < f + 1.0:
      below.append(i)
  hits = [i for i, r in enumerate(per_image) if r["recognisable"]]
  images = {"leak": bool(hits), "recognisable": len(hits), "of": n, "share": len(hits) / n,
            "median_psnr": float(np.median(scores["psnr_per_image"])),
            "median_ssim": float(np.median(scores["ssim_per_image"])),
            "below_mean_colour": len(below), "rule": RULE.format(**t._asdict()),
            "per_image": per_image}
  if lpips[0] is not None:
    images["median_lpips"] = float(np.median(lpips))
  median = f"median PSNR {images['median_psnr']:.1f} dB, SSIM {images['median_ssim']:.2f}"
  if hits:
    images["reason"] = (f"{len(hits)} of {n} images recognisable ({median}; image {hits[0]}: "
                        f"{per_image[hits[0]]['rule']})")
  else:
    images["reason"] = (f"no image recognisable ({median}" + (
        f"; {len(below)} of {n} no better than their own mean colour, e.g. image {below[0]}: "
        f"{per_image[below[0]]['rule']}" if below else "") + ")")

  truth, got = scores.get("labels_true"), scores.get("labels_reconstructed")
  out = {"images": images}
  if truth is None or got is None:
    return out
  if not labels_inferred:
    out["labels"] = {"leak": False, "inferred": False, "reason": "labels shared by the threat model"}
    return out
  chance = label_chance(truth, num_classes)
  read = [int(c) for c in got if int(c) >= 0]  # a slot's -1: the attack read no label there
  if not read:
    out["labels"] = {"leak": False, "inferred": True, "accuracy": scores.get("label_accuracy"),
                     "chance": chance, "unread": n, "reason": "the attack read no label"}
    return out
  whole = scores.get("label_accuracy") == 1.0
  missing, extra = _multiset_difference(truth, got), _multiset_difference(read, truth)
  labels = {"leak": bool(whole and chance < t.label_chance), "inferred": True,
            "accuracy": scores.get("label_accuracy"), "chance": chance, "missing": missing,
            "extra": extra, "unread": len(got) - len(read)}
  if labels["leak"]:
    labels["reason"] = f"all {n} labels recovered (a guess: {chance:.2g})"
  elif whole:
    labels["reason"] = f"all {n} labels recovered, but a guess gets them {chance:.2g} of the time"
  else:
    labels["reason"] = (f"{sum(missing.values())} of {n} labels not recovered ("
                        + (f"{labels['unread']} not read; " if labels["unread"] else "")
                        + f"recovered but not there: {extra or 'none'})")
  out["labels"] = labels
  classes = sorted(set(int(c) for c in truth))
  hit = sorted(set(read)) == classes
  cchance = composition_chance(truth, num_classes)
  out["composition"] = {"leak": bool(hit and cchance < t.label_chance), "classes": classes,
                        "recovered": sorted(set(read)), "chance": cchance,
                        "reason": (f"the classes present, {classes}, recovered exactly (a guess: "
                                   f"{cchance:.2g})" if hit else "the classes present not recovered exactly")}
  return out


def halfway(chance: float, ceiling: float = 1.0) -> float:
  """The least score that counts as found, for a score in [0, ``ceiling``] whose guess without the
  update reaches ``chance``: halfway from chance to the ceiling, (ceiling + chance) / 2, i.e. a
  chance-corrected score (score − chance) / (ceiling − chance) of at least 1/2 (0.5 where nothing
  can be guessed and everything recovered). The ceiling is below 1 where some of the truth cannot
  be recovered by any attack (words outside the model's vocabulary, read as ``<unk>``)."""
  ceiling = min(max(float(ceiling), 0.0), 1.0)
  return (ceiling + min(max(float(chance), 0.0), ceiling)) / 2.0


def _upto(ceiling: float) -> str:
  """How a bar's ceiling reads in a reason: "1", or the share of the words the vocabulary holds."""
  return "1" if ceiling >= 1 else f"{ceiling:.2f}, the share of the words in the model's vocabulary"


def text_findings(results: dict) -> dict:
  """What a text reconstruction reveals, each finding with ``leak`` and ``reason``:

  * ``sentences``: those with their tokens in place at least :func:`halfway` from what the corpus's
    position guess gets of them (``token_accuracy_chance_per_sentence``, from
    :func:`gradjax.run.text_run.chance`) to 1, or, where ``rougeL_per_sentence`` is given, with a
    ROUGE-L (their longest common subsequence) at least halfway from a guess's
    (``rougeL_chance_per_sentence``: the position guess's or the sentence's own words' in random
    order) to 1: one token inserted or dropped moves every later one out of place, not out of order;
  * ``bag``: the batch's words, when the bag-of-words recall is at least halfway from the corpus's
    bag guess (``bag_recall_chance``) to 1; where the attack found a set of words without their
    places (``word_recall``, the span attack's position sets), also its word recall at least
    halfway from that of a guess of as many words (``word_recall_chance``: the corpus's most
    frequent, or words drawn at random without a corpus) to 1; either counts.

  Without chance levels in ``results`` the bar is 0.5 for both. Where the guess already gets all of
  it (chance 1: e.g. a vocabulary that makes every word ``<unk>``), a reconstruction shows nothing
  the corpus does not, and counts for no leak.

  Besides ``leak`` and ``reason``, the numbers the finding rests on: ``sentences`` has ``recovered``
  (the sentences counted), ``token_accuracy_bar`` (N,) and, with ROUGE-L, ``rougeL_bar`` (N,);
  ``bag`` has ``measure`` (``bag_recall`` or ``word_recall``, the latter with its ``guess``,
  ``uniform`` or ``frequent``, and ``guess_size``), ``recall``, ``chance`` and ``bar``."""
  acc = results.get("token_accuracy_per_sentence") or []
  acc_chance = results.get("token_accuracy_chance_per_sentence") or [0.0] * len(acc)
  known = results.get("known_share_per_sentence") or [1.0] * len(acc)
  bars = [halfway(c, m) for c, m in zip(acc_chance, known)]
  placed = {i for i, (a, bar, c, m) in enumerate(zip(acc, bars, acc_chance, known))
            if a >= bar and c < m}
  lcs = results.get("rougeL_per_sentence")
  lcs_chance = results.get("rougeL_chance_per_sentence") or [0.0] * len(acc)
  ordered = set() if lcs is None else {i for i, (r, c) in enumerate(zip(lcs, lcs_chance))
                                       if r >= halfway(c) and c < 1}
  good = sorted(placed | ordered)
  if not good:
    why = ("no sentence with its tokens in place halfway from the corpus's position guess to 1"
           + ("" if lcs is None else ", nor with its ROUGE-L halfway from the guess's to 1"))
  elif good[0] in placed:
    why = (f"{len(good)} of {len(acc)} sentences recovered (sentence {good[0]}: {acc[good[0]]:.2f} "
           f">= {bars[good[0]]:.2f} of its tokens in place, halfway from the corpus's position guess, "
           f"{acc_chance[good[0]]:.2f}, to {_upto(known[good[0]])})")
  else:
    why = (f"{len(good)} of {len(acc)} sentences recovered (sentence {good[0]}: ROUGE-L "
           f"{lcs[good[0]]:.2f} >= {halfway(lcs_chance[good[0]]):.2f}, halfway from a guess's, "
           f"{lcs_chance[good[0]]:.2f}, to 1; its tokens in place {acc[good[0]]:.2f})")
  out = {"sentences": {"leak": bool(good), "count": len(good), "of": len(acc), "reason": why,
                       "recovered": good, "token_accuracy_bar": bars,
                       "rougeL_bar": None if lcs is None else [halfway(c) for c in lcs_chance]}}
  ceiling = results.get("known_share", 1.0)
  out["bag"] = {"measure": "bag_recall", **_recall_finding(
      results.get("bag_recall", 0.0), results.get("bag_recall_chance", 0.0), "bag-of-words recall",
      "the corpus's bag guess", ceiling)}
  if "word_recall" in results:  # words found without their places: against a guess of as many
    k = results.get("word_guess_size", len(results.get("words") or []))
    guess = (f"{k} words drawn at random" if results.get("word_guess") == "uniform"
             else f"the corpus's {k} most frequent words")
    words = {"measure": "word_recall", "guess": results.get("word_guess", "frequent"),
             "guess_size": k, **_recall_finding(results["word_recall"],
                                                results.get("word_recall_chance", 0.0),
                                                "word recall of the words found", guess, ceiling)}
    if words["leak"] or not out["bag"]["leak"]:  # the bag's own recall counts where it passes
      out["bag"] = words
  return out


def _recall_finding(recall: float, chance: float, measure: str, guess: str,
                    ceiling: float = 1.0) -> dict:
  """The ``bag`` finding of a recall against its guess's: a leak at least :func:`halfway` from the
  guess's recall to the ``ceiling`` (the words any attack can recover), none where the guess gets
  every one of them."""
  bar = halfway(chance, ceiling)
  found = recall >= bar and chance < ceiling
  return {"leak": found, "recall": recall, "chance": chance, "bar": bar, "reason": (
      f"the sentences' words ({measure} {recall:.2f} >= {bar:.2f}, halfway from {guess}, "
      f"{chance:.2f}, to {_upto(ceiling)})" if found else
      "the model's vocabulary holds none of the sentences' words" if ceiling <= 0 else
      f"a guess ({guess}) already gets every word (recall {chance:.2f})" if chance >= ceiling else
      f"{measure} {recall:.2f} < {bar:.2f} (halfway from {guess}, {chance:.2f}, to {_upto(ceiling)})")}


def leaks(findings: dict | None) -> list[str]:
  """The kinds of leak among ``findings`` (:func:`image_findings`, :func:`text_findings`), e.g.
  ``["images", "labels"]``; labels subsume the composition."""
  kinds = [k for k, v in (findings or {}).items() if v.get("leak")]
  return [k for k in kinds if not (k == "composition" and "labels" in kinds)]


def budget(attack: str, iterations: int, restarts: int) -> str:
  """"dlg with 2000 iterations and 1 restart"."""
  return (f"{attack} with {iterations} iterations and {restarts} restart"
          + ("s" if restarts != 1 else ""))


def closed_form_steps(attack: str, rounds: int, separated: tuple[int, int] | None = None) -> str:
  """What a closed form counts where an optimisation counts iterations: "a closed form, 3 rounds"
  (exclusive_neurons), "3 layers" (rgap), "32 positions" (dager), "1 read-out" (imprint); with
  ``separated`` (k, N), ", k of N examples separated" (exclusive_neurons: each read from a unit
  that example alone reached) or, of cocktail_party, ", k components unmixed for N examples" (the
  update's rank: a noised update has N whatever it gives away; the residual says whether they are
  the batch)."""
  unit = {"rgap": "layer", "dager": "position", "imprint": "read-out"}.get(attack, "round")
  counted = ("" if separated is None
             else f", {separated[0]} components unmixed for {separated[1]} examples"
             if attack == "cocktail_party"
             else f", {separated[0]} of {separated[1]} examples separated")
  return f"a closed form, {rounds} {unit}" + ("s" if rounds != 1 else "") + counted


def closed_form_budget(attack: str, rounds: int, separated: tuple[int, int] | None = None) -> str:
  """"exclusive_neurons (a closed form, 3 rounds)"; "rgap (a closed form, 3 layers)"."""
  return f"{attack} ({closed_form_steps(attack, rounds, separated)})"


def decide(*, findings: dict | None, residual: fidelity.Comparison | None,
           improving: bool, budget: str, problems: Sequence[str] = (),
           constraints: tuple[int, int] | None = None, thresholds: Thresholds = THRESHOLDS) -> dict:
  """``{"status", "reason", "leaks"}`` of a run (see the module docstring); ``leaks``: the kinds of
  leak found (:func:`leaks`).

  Args:
    findings: :func:`image_findings` or :func:`text_findings` when there is a ground truth, else
      ``None``.
    residual: the reconstruction's :func:`residual` (``None`` when it could not be computed).
    improving: :func:`still_improving` of the run.
    budget: :func:`budget` of the run.
    problems: checks of the capture that failed (the run was forced past them).
    constraints: (the update's nonzero entries, the values of the data matched to it): with fewer
      entries than values (heavy pruning, or a batch larger than the model), data that reproduce the
      update are not determined by it, so without a ground truth a match is no leak.
  """
  kinds = leaks(findings)
  out = _decide(findings, kinds, residual, improving, budget, problems, thresholds, constraints)
  return {**out, "leaks": kinds}


def _decide(findings, kinds, residual, improving, budget, problems, thresholds, constraints) -> dict:
  if kinds:
    reason = f"{budget} found: " + "; ".join(findings[k]["reason"] for k in kinds)
    if "images" in findings and "images" not in kinds:
      reason += f"; {findings['images']['reason']}"
    return {"status": "leak", "reason": reason}
  # Nothing leaked: what the images scored says why, beside what the attack did.
  seen = f"; {findings['images']['reason']}" if findings and "images" in findings else ""
  if problems:
    return {"status": "inconclusive", "reason": "the capture failed its checks, so the attack ran "
            "against a model that did not produce it: " + "; ".join(problems) + seen}
  if residual is None:
    return {"status": "inconclusive",
            "reason": "the reconstruction's update could not be recomputed" + seen}
  res = f"relative residual {residual.relative_error:.2g}"
  if not matched(residual, thresholds):
    path, err = residual.worst_layer()
    why = (f"{budget} did not match the update ({res} over all layers, bound {thresholds.matched:g}; "
           f"{err:.2g} in {path}, bound {thresholds.matched_layer:g})")
    if improving:
      why += "; the objective was still falling when the budget ran out: more iterations may match it"
    else:
      why += ("; a stronger attack, more restarts, or a model or recipe other than declared "
              "(where the update was noised, no attack matches it; a deterministic defense, "
              "where declared, is applied to the reconstruction's update)")
    return {"status": "inconclusive", "reason": why + seen}
  if findings is None:
    if constraints is not None and constraints[0] < constraints[1]:
      return {"status": "inconclusive", "reason": (
          f"{budget} found data that reproduce the update ({res}, bound {thresholds.matched:g}), but "
          f"the update holds {constraints[0]} nonzero entries for the {constraints[1]} values of the "
          "data: other data reproduce it too, so these need not be the client's (score them "
          "against the client's data)")}
    return {"status": "leak", "reason": f"{budget} found data that reproduce the update ({res}, "
            f"bound {thresholds.matched:g}); no ground truth to score them against"}
  if improving:
    return {"status": "inconclusive", "reason": f"{budget} matched the update ({res}) without "
            "recovering anything recognisable, but its objective was still falling when the budget "
            "ran out: more iterations may recover the data" + seen}
  return {"status": "no_leak_found", "reason": f"no leak found by {budget}: it matched the update "
          f"({res}) but recovered nothing recognisable{seen}; a stronger attack or a larger budget may"}
