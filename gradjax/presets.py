"""The papers' attacks, each a function returning a built :class:`gradjax.attacks.Attack`.

Every preset's docstring says where its defaults come from; the seed studies under
``experiments/studies`` measure each against its paper (RESULTS.md gathers them). A preset's keyword
arguments are the knobs its paper varies; anything else is changed with
``dataclasses.replace`` (``dataclasses.replace(presets.dlg(), label_source=labels.known)``).

Iterations. One iteration here is one optax update; with L-BFGS that is one direction and a zoom line
search, where PyTorch's ``LBFGS.step()`` of the DLG code runs up to 20 inner iterations of a fixed step
(see :mod:`gradjax.solvers` on counting), so the budgets below are not the papers' step counts.
"""

import dataclasses
from typing import Callable

from gradjax import attacks
from gradjax import distances
from gradjax import labels
from gradjax import optimizers
from gradjax import priors
from gradjax.objectives import Gamma, Normalised, Replay, ScaledDifference, Stepwise

Attack = attacks.Attack
_DISTANCE = distances.DISTANCES
_PRIOR = priors.PRIORS


def dlg(iterations: int = 2000) -> Attack:
  """Deep Leakage from Gradients (Zhu et al., NeurIPS 2019; mit-han-lab/dlg).

  Distance Σ‖g' − g‖² (no 0.5), dummy data and dummy label logits ~ N(0, 1) optimised jointly with
  soft labels softmax(z'), L-BFGS lr 1 with history 100. The paper runs 300 ``LBFGS.step()`` calls of
  up to 20 inner iterations (up to 6000 objective evaluations); an iteration here takes about one
  evaluation, and the default budget is a third of the paper's evaluations.
  """
  return Attack(distance=_DISTANCE["euclidean"], optimizer=optimizers.Named("lbfgs", 1.0),
                iterations=iterations, label_source=labels.joint, name="dlg")


def idlg(iterations: int = 2000) -> Attack:
  """iDLG (Zhao et al., 2020): DLG with the label inferred first from the last layer's gradient
  (:func:`gradjax.labels.idlg`, batch 1); only the data is optimised."""
  return Attack(distance=_DISTANCE["euclidean"], optimizer=optimizers.Named("lbfgs", 1.0),
                iterations=iterations, label_source=labels.idlg, name="idlg")


def adam_dlg(iterations: int = 20_000) -> Attack:
  """SAPAG's "Adam-DLG" baseline (Wang et al.): DLG's Euclidean distance driven by AdamW lr 1e-3
  (SAPAG's ResNet-18 optimiser), 20 000 iterations."""
  return Attack(distance=_DISTANCE["euclidean"], optimizer=optimizers.Named("adamw", 1e-3),
                iterations=iterations, label_source=labels.joint, name="adam_dlg")


def inverting_gradients(iterations: int = 4800, *, tv: float = 1e-4) -> Attack:
  """Inverting Gradients (Geiping et al., NeurIPS 2020), the Table 1 protocol.

  1 − cosine over all layers, total variation mean|dx| + mean|dy| with weight ``tv``, Adam lr 0.1 on
  the sign of the gradient, lr ×0.1 at 3/8, 5/8 and 7/8 of the budget, iterates clamped to the image
  box, init N(0, 1) in normalised space, labels known. (The paper's README example runs 24 000
  iterations.) The paper's ResNets are torchvision's, drawn as ``init="torchvision"`` draws them,
  and its ConvNet as ``init="torch"`` (``gradjax.models.inits``), where the zoo's ResNets and ConvNet
  default to Flax's draw; its LeNet is DLG's, the zoo's ``lenet_zhu`` default.
  """
  return Attack(distance=_DISTANCE["cosine"], priors=(priors.Prior(_PRIOR["tv"], tv),),
                label_source=labels.known, optimizer=optimizers.Named("signed_adam", 0.1, schedule="step"),
                iterations=iterations, box=True, name="inverting_gradients")


def inverting_gradients_batch(iterations: int = 2000, *, tv: float = 0.2,
                              head_features: float = 100.0) -> Attack:
  """Inverting Gradients for a batch: :func:`inverting_gradients` with total variation ``tv`` 0.2
  (the default of breaching, the authors' later framework; on DLG's LeNet at batch 4, CIFAR-10 test
  images 0-39: 14.27 dB against 8.84 at the paper's 1e-4, 18.08 against 9.06 with head features)
  and each image pulled towards its own head input (``head_features``, weight 100; on the same
  images 30, 100 and 300 give 17.43, 18.08 and 18.50 dB, but 300 gives 0.76 dB less than 100 at
  batch 8 on images 500-539, which kept 100: those images then served the choice, so the images
  900.. are the ones none of it saw), for 2000 iterations: the setting of
  ``experiments/studies/batches`` (DLG's LeNet, batch 4 and 8: 6.3 and 6.0 dB above breaching's
  attacker at the same budget on images 500.., 7.6 and 7.3 on the comparison images 900..;
  most images of a batch of 8 recognisable)."""
  return dataclasses.replace(inverting_gradients(iterations, tv=tv), head_features=head_features,
                             name="inverting_gradients_batch")


def inverting_gradients_fedavg(iterations: int = 4800, *, tv: float = 1e-4,
                               learning_rate: float = 1.0) -> Attack:
  """Inverting Gradients against FedAvg (Geiping et al. 2020 §6).

  The client's local training is replayed on the dummy data and W_t − W'_{t+1} matched to the
  observed update with 1 − cosine, TV ``tv``, signed Adam with the step decay of
  :func:`inverting_gradients`, box, labels known; needs the schedule in ``observation.local``. The
  learning rate 1 is the paper's; the authors' ``rec_mult.py`` runs 0.1 unless told otherwise.
  The paper's ConvNet is a PyTorch module at PyTorch's default init: simulate it with
  ``init="torch"`` (``gradjax.models.inits``); the zoo's own default, Flax's, leaves the same replay
  3.8-6.9 dB lower on the images measured (experiments/studies/ig_fedavg).
  """
  return Attack(distance=_DISTANCE["cosine"], priors=(priors.Prior(_PRIOR["tv"], tv),),
                label_source=labels.known,
                optimizer=optimizers.Named("signed_adam", learning_rate, schedule="step"),
                iterations=iterations, matched=Replay(), box=True, name="inverting_gradients_fedavg")


def sapag(iterations: int = 2000, *, box: bool = True) -> Attack:
  """SAPAG (Wang et al., "SAPAG: A Self-Adaptive Privacy Attack From Gradients"), LeNet-5 protocol.

  Gaussian-kernel distance Σ_l Q_l (1 − exp(−‖Δ_l‖² / (n_l σ_l²))) with σ_l² = Var(observed ∇W_l),
  n_l the leaf's size and Q_l = 1/(l+1); L-BFGS lr 1; dummy data kept in [0, 1] (``box``). Three
  readings are ours, measured in experiments/studies/sapag_table1: the per-entry width n_l σ_l² (with
  the printed ‖Δ_l‖² / σ_l², ``distances.DISTANCES["gaussian_kernel"]``, every large leaf's term
  underflows at a random start); the budget (the paper's 500 iterations are ``LBFGS.step()`` calls,
  see :func:`dlg`); and the label by iDLG (batch 1, exact for the zoo's models): with DLG's jointly
  optimised label logits, which the paper's comparison uses, the bounded kernel gives L-BFGS tiny
  curvature in the logits and a fifth of the development images end on a wrong label, a plateau or a
  diverged step (``label_source=labels.joint``, ``--labels=joint``, restores them). On MNIST, whose digits lie
  on the box's lower edge, ``box=False`` reaches the paper's figure.
  """
  return Attack(distance=_DISTANCE["gaussian_kernel_mean"], optimizer=optimizers.Named("lbfgs", 1.0),
                iterations=iterations, label_source=labels.idlg, box=box, name="sapag")


def sapag_adamw(iterations: int = 20_000) -> Attack:
  """SAPAG's ResNet-18 protocol: :func:`sapag`'s distance with AdamW lr 1e-3, 20 000 iterations."""
  return Attack(distance=_DISTANCE["gaussian_kernel_mean"], optimizer=optimizers.Named("adamw", 1e-3),
                iterations=iterations, label_source=labels.joint, box=True, name="sapag_adamw")


def dlm(iterations: int = 4000, *, gamma: Gamma = Gamma()) -> Attack:
  """DLM (Zhao, Luo, Ding, "Deep Leakage from Model in Federated Learning"), MLP protocol.

  From W_t and W_{t+1} after one local SGD step: ‖∇W' − γ (W_t − W_{t+1})‖² with γ learned
  (:class:`gradjax.objectives.Gamma`: start 1, optimised as log γ), Adam lr 0.1, 4000 iterations (the
  paper: 4000-5000). Labels by iDLG: the sign pattern of the update is that of the gradient, and with
  DLG's joint soft labels the dummy gradient can vanish (soft label = prediction) and γ with it. With
  iDLG's labels too the learned γ collapses towards 0 (:class:`gradjax.objectives.ScaledDifference`)
  and this preset succeeds on none of CIFAR-100 images 0-19 and 60-79 (the paper: 68 %). The
  paper leaves γ's start and step size unstated (``gamma``); the authors' released ``DLM.py`` starts
  γ at 200 (its runs 60-240) and moves γ itself on the data's Adam (lr 0.1), labels joint, 5000
  iterations. ``experiments/studies/dlm_table1`` measures γ's readings one at a time (from 1/lr or
  200, on the data's Adam or its own, held, fixed at 1/lr; iDLG labels at 4000 iterations, and joint
  labels with γ from 1/lr): none reaches the paper's row; the released code's whole combination was
  not run. For LeNet the paper uses L-BFGS lr 1, 200 iterations.
  """
  return Attack(matched=ScaledDifference(gamma), distance=_DISTANCE["euclidean"],
                label_source=labels.idlg, optimizer=optimizers.Named("adam", 0.1), iterations=iterations,
                name="dlm")


def dlm_plus(iterations: int = 4000) -> Attack:
  """DLM+ (same paper): ‖∇W'/‖∇W'‖ − ΔW/‖ΔW‖‖², learning-rate free, Adam lr 0.01, 4000 iterations.
  Scale-free, so it optimises labels jointly as DLG does; the dummy image is clamped to the box
  (``experiments/studies/dlm_table1`` measures both choices against iDLG labels and no box). The
  authors' released ``DLM_plus.py`` differs in three details: it divides each tree by the mean of
  its layers' norms rather than by the norm over all layers (both vanish where ∇W' ∝ ΔW), matches
  with the true label, and runs 5000 iterations unclamped (:func:`dlm_plus_released`)."""
  return Attack(matched=Normalised(), distance=_DISTANCE["euclidean"], label_source=labels.joint,
                optimizer=optimizers.Named("adam", 0.01), iterations=iterations, box=True,
                name="dlm_plus")


def dlm_plus_released(iterations: int = 5000) -> Attack:
  """DLM+ as the authors' released ``DLM_plus.py`` runs it on its MLP (github.com/Zihao-Kevin/DLM):
  each tree divided by the mean of its layers' norms (``Normalised(layer_mean=True)``), the true
  label, Adam lr 0.01 on the dummy image alone from N(0, 1), 5000 iterations, no clamp
  (``experiments/studies/dlm_table1`` measures it beside :func:`dlm_plus`)."""
  return Attack(matched=Normalised(layer_mean=True), distance=_DISTANCE["euclidean"],
                label_source=labels.known, optimizer=optimizers.Named("adam", 0.01),
                iterations=iterations, box=False, name="dlm_plus_released")


def gradinversion(iterations: int = 15_000, *, tv: float = 1e-2, bn: float = 1e-4) -> Attack:
  """GradInversion as HFGInv's ablation builds it (the baseline HFGInv is compared with): cosine over
  every layer, TV ``tv`` and GradInversion's BatchNorm prior ``bn`` (first layer ×10, after
  DeepInversion) from the start, signed Adam lr 0.1 with Inverting Gradients' step decay, 15 000
  iterations, box, labels known (Yin et al., CVPR 2021, who also add an l2 prior and group
  consistency over restarts). ``tv`` 1e-2 is set for 224-px images; on 32-px CIFAR-10 batches of 8
  of a trained ResNet-20 with a fresh 10-class head, ``tv=0.3`` scores 1.4 dB higher in PSNR and
  slightly worse in LPIPS (``experiments/studies/hfginv_batch``)."""
  return Attack(distance=_DISTANCE["cosine"],
                priors=(priors.Prior(_PRIOR["tv"], tv), priors.Prior(_PRIOR["bn"], bn)),
                label_source=labels.known, optimizer=optimizers.Named("signed_adam", 0.1, schedule="step"),
                iterations=iterations, box=True, name="gradinversion")


HFGINV_ITERATIONS = 15_000  # the budget the step counts of hfginv() are given for


def hfginv(iterations: int = HFGINV_ITERATIONS, *, tv: float = 1e-2, bn: float = 1e-4) -> Attack:
  """HFGInv (Ye et al., "High-Fidelity Gradient Inversion in Distributed Learning", AAAI 2024; the
  schedule from their code, ResNet-34 protocol).

  One cosine over a growing set of layers, deep to shallow, with gradient dropout 0.3
  (:class:`gradjax.objectives.Stepwise`: the deepest tenth of the parameter tensors at first, a tenth
  more every 500 iterations, up to the deepest 86/110); TV ``tv`` from iteration 3000 (the paper;
  their code 5e-3) and the BatchNorm prior ``bn`` from 5000 (stem ×1.3, next layer ×3); Adam lr 0.1
  on the quantised sign (:func:`gradjax.optimizers.quantized_adam`), ×0.33 at 3/8, 5/8 and 7/8 of
  the budget; box; labels known (or from :func:`gradjax.labels.hfginv`, which needs auxiliary
  images). The best iterate is taken once the objective has its last term: the BatchNorm prior's
  (iteration 5000; the layer set stops growing at 4000 for ResNet-34's 110 tensors,
  :meth:`gradjax.objectives.Stepwise.settled_from`; their code resets its best every 500). Every
  step count scales with ``iterations`` (:func:`gradjax.attacks.rescaled`). At 32 px (a fresh
  10-class head) ``tv=0.3`` does better than the paper's 1e-2 (+1.0 dB PSNR on 5 of 5 unseen
  CIFAR-10 batches of 8, ``experiments/studies/hfginv_batch``).
  """
  paper = Attack(distance=_DISTANCE["cosine"],
                 priors=(priors.Prior(_PRIOR["tv"], tv, 3000), priors.Prior(_PRIOR["bn_hfginv"], bn, 5000)),
                 label_source=labels.known,
                 optimizer=optimizers.Named("quantized_adam", 0.1, schedule="step_hfginv"),
                 iterations=HFGINV_ITERATIONS, box=True, stepwise=Stepwise(),
                 name="hfginv")
  return paper if iterations == HFGINV_ITERATIONS else attacks.rescaled(paper, iterations)


PRESETS: dict[str, Callable[..., Attack]] = {
    "dlg": dlg, "idlg": idlg, "adam_dlg": adam_dlg, "inverting_gradients": inverting_gradients,
    "inverting_gradients_batch": inverting_gradients_batch,
    "dlm": dlm, "dlm_plus": dlm_plus, "dlm_plus_released": dlm_plus_released,
    "inverting_gradients_fedavg": inverting_gradients_fedavg,
    "sapag": sapag, "sapag_adamw": sapag_adamw, "gradinversion": gradinversion, "hfginv": hfginv,
}


def get_preset(name: str) -> Callable[..., Attack]:
  """The preset function registered as ``name``."""
  if name not in PRESETS:
    raise ValueError(f"unknown attack {name!r}; choose one of {', '.join(PRESETS)}")
  return PRESETS[name]
