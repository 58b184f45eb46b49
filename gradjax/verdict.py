"""The verdict of an attack: ``leak``, ``no_leak_found`` or ``inconclusive``, with its reason.

A number alone is no audit's answer, and an attack that failed says nothing about the data's safety.
:func:`decide` turns what a run measured into one of three statuses:

* ``leak``: the reconstruction is recognisable against the ground truth (:func:`image_findings`,
  :func:`text_findings`), or, without a ground truth, the attack matched the update
  (:func:`residual` within :attr:`Thresholds.matched`): data that reproduce the update were found.
* ``inconclusive``: a check of the capture failed and the run was forced, or the attack did not
  match the update (the residual above :attr:`Thresholds.matched` overall or :attr:`Thresholds.matched_layer` in some layer), saying whether the
  objective was still falling when the budget ran out (:func:`still_improving`).
* ``no_leak_found``: the attack matched the update, its objective stopped falling, and it still
  recovered nothing recognisable; the
  reason names the attack and its budget ("no leak found by dlg with 2000 iterations and 1
  restart"). Never "safe": a stronger attack or a larger budget may find what this one did not.

Thresholds (:class:`Thresholds`), each measured (``tests/test_verdict.py`` reproduces them):

* An image is recognisable when it tells more than its own mean colour (PSNR at least 1 dB above
  that flat image's, :func:`mean_colour_psnr`) and reaches PSNR >= 20 dB (RMSE <= 0.1 on [0, 1]
  pixels), SSIM >= 0.5 or LPIPS (AlexNet) <= 0.2. Measured on CIFAR-10 test images 0-99: the mean
  colour alone reaches 23.5 dB and SSIM 0.81 on flat images (14.2 dB on average), hence the
  baseline; an 8×8 thumbnail (4×4-pixel blocks; 20.1 dB, SSIM 0.59, LPIPS 0.11 on average), a
  recognisable picture, is counted for 94 images by PSNR and SSIM alone; a 4×4 thumbnail (8×8-pixel
  blocks; 17.5 dB, SSIM 0.30), barely more than a colour layout, for 13. Inverting Gradients'
  reconstructions at 18-20 dB (their Table 1) are recognisable to a reader, which the SSIM and LPIPS
  thresholds catch where PSNR misses.
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
"""

import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import clients, fidelity, metrics
from gradjax.objectives import dummy_gradient
from gradjax.observation import Observation

STATUSES = ("leak", "no_leak_found", "inconclusive")


class Thresholds(NamedTuple):
  """Where a reconstruction counts as recognisable and an update as matched (see the module
  docstring for the measurements behind the defaults)."""

  psnr: float = 20.0          # dB, per image, at least
  ssim: float = 0.5           # per image, at least
  lpips: float = 0.2          # per image, at most
  label_chance: float = 0.01  # labels leak when a guess gets them all right less often than this
  matched: float = 5e-4       # residual over all layers, at most
  matched_layer: float = 1e-2  # residual in every layer, at most
  improving: float = 0.05     # relative fall of the objective over the last tenth of the run


THRESHOLDS = Thresholds()


def residual(apply_fn, observation: Observation, dummy: dict, labels, *, mode: str = "gradient"
             ) -> fidelity.Comparison:
  """How well the attack's reconstruction reproduces the observed update.

  The update the client would have sent for the reconstruction (its gradient, or for ``mode``
  ``"replay"`` the replayed local training's W_t − W'_{t+1}), u, scaled by the best common factor
  α* = ⟨u, c⟩ / ‖u‖² (DLM's γ and cosine distances leave the scale free), against the observed c:
  relative error ‖α* u − c‖ / ‖c‖ over all layers (= sin ∠(u, c)) and per layer.

  Args:
    apply_fn, observation: as the attack's.
    dummy: the reconstruction's optimised variables (``"x"``, and ``"label_logits"`` when labels were
      optimised jointly: their softmax is the target).
    labels: (N,) int labels the attack used when ``dummy`` has no label logits.
    mode: the attack's objective mode (:data:`gradjax.objectives.MODES`).
  """
  x = jnp.asarray(dummy["x"])
  targets = (jax.nn.softmax(jnp.asarray(dummy["label_logits"]), axis=-1)
             if "label_logits" in dummy else jnp.asarray(labels))
  if mode == "replay":
    new = clients.local_sgd(apply_fn, observation.variables, x, targets, observation.local,
                            train=observation.train)
    u = jax.tree.map(jnp.subtract, observation.variables["params"], new)
  else:
    u = dummy_gradient(apply_fn, observation.variables, x, targets, train=observation.train)
  uu = sum(float(jnp.vdot(a, a)) for a in jax.tree.leaves(u))
  uc = sum(float(jnp.vdot(a, b)) for a, b in zip(jax.tree.leaves(u),
                                                 jax.tree.leaves(observation.gradient)))
  alpha = uc / uu if uu > 0 else 0.0
  return fidelity.compare(jax.tree.map(lambda a: alpha * np.asarray(a, np.float64), u),
                          observation.gradient)


def matched(comparison: fidelity.Comparison, thresholds: Thresholds = THRESHOLDS) -> bool:
  """Whether a :func:`residual` is within the thresholds (over all layers and in every layer)."""
  return comparison.within((thresholds.matched, thresholds.matched_layer))


def still_improving(history: Sequence[dict], iterations: int,
                    thresholds: Thresholds = THRESHOLDS) -> bool:
  """Whether the best objective fell by more than ``thresholds.improving`` (relative) over the last
  tenth of the ``iterations``. ``history``: rows ``{"restart", "iteration", "loss"}`` of the best so
  far (:class:`gradjax.pipeline.Trace`); restarts run one after another are read apart, and the one
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


def label_chance(true_labels: Sequence[int], num_classes: int) -> float:
  """The probability that N labels drawn uniformly from ``num_classes`` form the multiset of
  ``true_labels``: N! / Π_c m_c! / K^N."""
  n = len(true_labels)
  counts = np.unique(np.asarray(true_labels), return_counts=True)[1]
  log_p = math.lgamma(n + 1) - sum(math.lgamma(int(m) + 1) for m in counts) - n * math.log(num_classes)
  return math.exp(log_p)


def mean_colour_psnr(x_true) -> np.ndarray:
  """(N,) PSNR of each image's own mean colour against it: what a reconstruction that knows
  nothing but the average colour scores (:func:`gradjax.metrics.psnr`)."""
  x_true = np.asarray(x_true, np.float64)
  flat = np.broadcast_to(x_true.mean(axis=(1, 2), keepdims=True), x_true.shape)
  return metrics.psnr(flat, x_true)


def image_findings(scores: dict, *, labels_inferred: bool, num_classes: int,
                   thresholds: Thresholds = THRESHOLDS) -> list[str]:
  """What a scored image reconstruction reveals: one phrase per kind of leak, empty when none.

  An image is recognisable when its PSNR beats the image's own mean colour
  (``psnr_mean_colour_per_image``, :func:`mean_colour_psnr`) by at least 1 dB and it meets one of
  the thresholds. ``scores``: ``psnr_per_image``, ``ssim_per_image``, optional
  ``lpips_per_image``, ``label_accuracy`` and ``labels_true`` (:func:`gradjax.metrics.score` and the
  pipeline's results).
  """
  n = len(scores["psnr_per_image"])
  lpips = scores.get("lpips_per_image") or [None] * n
  flat = scores.get("psnr_mean_colour_per_image") or [-np.inf] * n
  hits = []
  for i, (p, s, l, f) in enumerate(zip(scores["psnr_per_image"], scores["ssim_per_image"], lpips,
                                       flat)):
    if p < f + 1.0:
      continue
    why = [f"PSNR {p:.1f} dB >= {thresholds.psnr:g}"] if p >= thresholds.psnr else []
    why += [f"SSIM {s:.2f} >= {thresholds.ssim:g}"] if s >= thresholds.ssim else []
    why += [f"LPIPS {l:.2f} <= {thresholds.lpips:g}"] if l is not None and l <= thresholds.lpips else []
    if why:
      hits.append((i, why))
  findings = []
  if hits:
    i, why = hits[0]
    findings.append(f"{len(hits)} of {n} images recognisable (image {i}: {', '.join(why)})")
  if labels_inferred and scores.get("label_accuracy") == 1.0 and scores.get("labels_true") is not None:
    chance = label_chance(scores["labels_true"], num_classes)
    if chance < thresholds.label_chance:
      findings.append(f"all {n} labels recovered (a guess: {chance:.2g})")
  return findings


def text_findings(results: dict) -> list[str]:
  """What a text reconstruction reveals: sentences with at least half their tokens in place, and
  the bag of words (recall >= 0.5) the embedding gradient gives away."""
  findings = []
  acc = results.get("token_accuracy_per_sentence") or []
  good = [i for i, a in enumerate(acc) if a >= 0.5]
  if good:
    findings.append(f"{len(good)} of {len(acc)} sentences with at least half their tokens in place "
                    f"(sentence {good[0]}: {acc[good[0]]:.2f})")
  if results.get("bag_recall", 0.0) >= 0.5:
    findings.append(f"the sentences' words (bag-of-words recall {results['bag_recall']:.2f})")
  return findings


def budget(attack: str, iterations: int, restarts: int) -> str:
  """"dlg with 2000 iterations and 1 restart"."""
  return (f"{attack} with {iterations} iterations and {restarts} restart"
          + ("s" if restarts != 1 else ""))


def closed_form_budget(attack: str, rounds: int) -> str:
  """"exclusive_neurons (a closed form, 3 rounds)"."""
  return f"{attack} (a closed form, {rounds} round" + ("s)" if rounds != 1 else ")")


def decide(*, findings: list[str] | None, residual: fidelity.Comparison | None,
           improving: bool, budget: str, problems: Sequence[str] = (),
           thresholds: Thresholds = THRESHOLDS) -> dict:
  """``{"status", "reason"}`` of a run (see the module docstring).

  Args:
    findings: :func:`image_findings` or :func:`text_findings` when there is a ground truth, else
      ``None``.
    residual: the reconstruction's :func:`residual` (``None`` when it could not be computed).
    improving: :func:`still_improving` of the run.
    budget: :func:`budget` of the run.
    problems: checks of the capture that failed (the run was forced past them).
  """
  if findings:
    return {"status": "leak", "reason": f"{budget} recovered " + "; ".join(findings)}
  if problems:
    return {"status": "inconclusive", "reason": "the capture failed its checks, so the attack ran "
            "against a model that did not produce it: " + "; ".join(problems)}
  if residual is None:
    return {"status": "inconclusive", "reason": "the reconstruction's update could not be recomputed"}
  res = f"relative residual {residual.relative_error:.2g}"
  if not matched(residual, thresholds):
    path, err = residual.worst_layer()
    why = (f"{budget} did not match the update ({res} over all layers, bound {thresholds.matched:g}; "
           f"{err:.2g} in {path}, bound {thresholds.matched_layer:g})")
    if improving:
      why += "; the objective was still falling when the budget ran out: more iterations may match it"
    else:
      why += ("; a stronger attack, more restarts, or a model or recipe other than declared "
              "(a defense also keeps attacks from matching)")
    return {"status": "inconclusive", "reason": why}
  if findings is None:
    return {"status": "leak", "reason": f"{budget} found data that reproduce the update ({res}, "
            f"bound {thresholds.matched:g}); no ground truth to score them against"}
  if improving:
    return {"status": "inconclusive", "reason": f"{budget} matched the update ({res}) without "
            "recovering anything recognisable, but its objective was still falling when the budget "
            "ran out: more iterations may recover the data"}
  return {"status": "no_leak_found", "reason": f"no leak found by {budget}: it matched the update "
          f"({res}) but recovered nothing recognisable; a stronger attack or a larger budget may"}
