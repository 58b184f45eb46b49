"""``--attack=auto``: the attacks an update supports, chosen from what the server knows of it.

What decides (no ground truth is used, so an audit of a real system chooses the same way):

* **What the update is.** A gradient, or one full-batch local step of known learning rate (lr times
  a gradient): gradient matching. Several local steps with a known schedule: the replayed local
  training (Inverting Gradients' FedAvg attack, ``inverting_gradients_fedavg``) and DLM+. An update
  whose schedule is unknown: DLM+ alone, which needs no learning rate.
* **The model.** A first layer that is dense and followed by a ReLU (``mlp``): first the closed form
  that separates a batch there (``exclusive_neurons``, :mod:`gradjax.closed_forms`; exact up to
  batch 64 on an untrained ``mlp-1024``, ``experiments/studies/batches``). A dense first layer with
  more units than the batch has examples, whatever its activation: then the Cocktail Party Attack
  (``cocktail_party``, :mod:`gradjax.cocktail`), which separates centred batches that exclusive
  neurons cannot (exactly up to 64 on ``mlp-1024``, ``experiments/studies/cocktail_party``).
* **A ReLU chain at batch 1** (``lenet_zhu`` or ``lenet5`` with ``act=relu``): R-GAP's recursion
  (``rgap``, :mod:`gradjax.rgap`), then Inverting Gradients with TV and head features, where iDLG
  reaches 7 dB and that attack 13 on CIFAR-10 test images 500-509 (``experiments/studies/batches``).
* **The batch size.** One example: iDLG (labels from the last layer's sign, then DLG's L-BFGS
  matching). Several: Inverting Gradients with each image pulled towards its label's head input
  (``inverting_gradients_batch``), where DLG never converges (``experiments/studies/dlg_batch``).
* **Geiping et al.'s ConvNet** (``convnet``, ReLU and BatchNorm): Inverting Gradients at any batch
  size, with total variation 5 (:func:`settings`) where the preset has 0.2: chosen on CIFAR-10 test
  images 0-3 at batch 1 for the highest mean PSNR (16.28 against 12.86 dB; 1 of 4 images
  recognisable against none, without LPIPS at 32 px), and at batch 8 on the images 500-515 15.45
  against 12.19 dB (``experiments/studies/batches``, ConvNet-16; images 500-503 had served to try
  other TV weights at batch 1, so they are not wholly unseen); DLG's L-BFGS matches nothing there
  (image 0 at batch 1: relative residual 0.45).

:func:`choose` returns the names in the order they are tried; the pipeline runs every one and keeps
the reconstruction that matches the update best (:func:`gradjax.verdict.residual`), and the verdict
names every attack tried.
"""

from typing import Any

from gradjax import clients, models

AUTO = "auto"


def choose(*, num_samples: int, steps: int | None, model: str | None = None,
           act: str | None = None) -> tuple[str, ...]:
  """The attacks, in the order tried, for an update of ``num_samples`` examples over ``steps`` local
  steps (1 for a gradient, ``None`` when the schedule is unknown) of ``model`` (a zoo name) with
  activation ``act`` (``None``: the model's own)."""
  if steps is None:
    return ("dlm_plus",)
  if steps > 1:
    return ("inverting_gradients_fedavg", "dlm_plus")
  family = models.family(model or "")
  dense_relu = family is not None and family.family == "mlp" and act in (None, "relu")
  relu_chain = family is not None and family.family in ("lenet_zhu", "lenet5") and act == "relu"
  if num_samples == 1 and relu_chain:  # iDLG's L-BFGS fails there (7 dB); IG with TV does better
    return ("rgap", "inverting_gradients_batch")
  if family is not None and family.family == "convnet":
    return ("inverting_gradients_batch",)
  if num_samples == 1:
    return ("exclusive_neurons",) * dense_relu + ("idlg",)
  zoo = models.parse_name(model or "")
  mixes = zoo is not None and zoo.family == "mlp" and num_samples < zoo.width  # ICA can unmix it
  return (("exclusive_neurons",) * dense_relu + ("cocktail_party",) * mixes
          + ("inverting_gradients_batch",))


# Settings of an attack that depend on the model family, measured in experiments/studies/batches
# (see the module docstring): {(attack, family): {option path: value}}.
SETTINGS = {("inverting_gradients_batch", "convnet"): {"attack.priors": "tv:5"}}


def settings(attack: str, model: str | None) -> dict[str, Any]:
  """The options (dotted paths of :mod:`gradjax.run.config`) ``auto`` sets for ``attack`` on
  ``model`` (a zoo name) beyond the preset's (an option the user set keeps the user's value); empty
  for most."""
  family = models.family(model or "")
  return dict(SETTINGS.get((attack, family.family if family is not None else None), {}))


def for_metadata(metadata: dict[str, Any], model: str | None = None) -> tuple[str, ...]:
  """:func:`choose` for a captured update described by its ``metadata`` (:mod:`gradjax.interop`'s
  keys: ``num_samples``, ``local_lr``, ``local_epochs``, ``local_batch_size``, ``local_momentum``,
  ``model``, ``act``); ``model`` overrides the metadata's. An update without ``local_lr`` has an
  unknown schedule, unless its ``kind`` says it is a gradient."""
  def number(key, cast):
    return None if metadata.get(key) is None else cast(metadata[key])
  n = number("num_samples", int) or 1
  lr = number("local_lr", float)
  if lr is None:
    steps = 1 if metadata.get("kind") == "gradient" else None
  else:
    steps = clients.LocalTraining(epochs=number("local_epochs", int) or 1,
                                  batch_size=number("local_batch_size", int), learning_rate=lr,
                                  momentum=number("local_momentum", float) or 0.0).steps(n)
  return choose(num_samples=n, steps=steps, model=model or metadata.get("model"),
                act=metadata.get("act"))
