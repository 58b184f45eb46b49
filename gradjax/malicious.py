"""A server that cheats: it sends a model built to make the client's update give its data back.

**Imprint** (Robbing the Fed; Fowl et al., ICLR 2022). In front of the model the client believes it
trains, the server puts a block of k units that all measure one statistic of the input, s(x) = aᵀx
(x flattened to D values; ``"mean"``: a = 1/D, the mean brightness), against graded thresholds
c_0 < c_1 < … < c_(k−1):

    h_i = ReLU(aᵀx − c_i),        x' = x + (Σ_i h_i) w,

x' going on into the model (this residual pass-through is ours: the model still sees the image,
moved along one direction w that the server makes small). The imprint kernel's columns are all a,
its biases −c, and the block's output kernel has k equal rows w, so ∂L/∂h_(n,i) = g_n = ⟨∂L/∂x'_n, w⟩
does not depend on i. For the client's mean loss over N examples (any model behind the block),

    ∂L/∂W_i = (1/N) Σ_(n: s_n > c_i) g_n x_n,       ∂L/∂b_i = (1/N) Σ_(n: s_n > c_i) g_n,

so the difference of two neighbouring units holds only the examples whose statistic falls in
(c_i, c_(i+1)] (bin i; the last bin is (c_(k−1), ∞)), and a bin that holds one example gives it back
exactly (:func:`imprint_recover`):

    x_n = (∂L/∂W_i − ∂L/∂W_(i+1)) / (∂L/∂b_i − ∂L/∂b_(i+1)).

A bin with several examples gives their g-weighted mean (a collision); examples below c_0 or with
g_n = 0 give nothing. Gradients summed over clients (FedSGD aggregation, secure aggregation
included) are sums over all their examples, so the same read-out works on the aggregate. The server
places the thresholds at the quantiles of the statistic on data it has (:func:`imprint_thresholds`):
with the k + 1 cells (below c_0, and the k bins) equally likely, an example lies above c_0 and alone
in its bin with probability (k/(k+1))^N. The same units can also hide inside the first layer of an
MLP the client declared, every shape unchanged (:func:`imprint_layer`).

**Sparse bins** (the paper's sparse variant, ``structure="sparse"``). A ReLU unit's row moves with
every example above its threshold, so after one local step of a FedAvg client the rows below the
step's brightest example have all moved along its input, and later steps' examples no longer fall
into bins by their statistic (``experiments/studies/malicious``: the first mini-batch's examples
only). With k + 1 thresholds and a hard tanh, unit i fires on its own bin alone,

    h_i = clip(γ (aᵀx − c_i) / (c_(i+1) − c_i), 0, γ),

so ∂L/∂W_i and ∂L/∂b_i hold only the examples of bin i, (γ / (c_(i+1) − c_i)) Σ g_n (x_n, 1) / N,
and x_n = ∂L/∂W_i / ∂L/∂b_i. A local step moves only the units of its examples' bins; a moved
unit's window, narrowed to γ along a direction its example turned, rarely catches another example.
An update over any number of local steps is then read like one gradient of all the client's
examples: unit i holds an example exactly when it is the only one in bin i over every step (the
k + 2 cells equally likely: probability (k/(k+2)) ((k+1)/(k+2))^(N−1), :func:`server_row`). The gain
γ (small: :data:`SPARSE_GAIN`) keeps a float32 update's digits, as for the cumulative block.

**On the client** (:func:`inspect`): before it trains, a client can check what it received. Two
signs of an imprint: parameters that its declared architecture does not have (a block added in
front), and, inside a layer it does have, many units whose weight vectors point the same way
(|cos| above :data:`PARALLEL`), which a freshly drawn or trained layer does not show: an imprint's k
units all measure one statistic and differ only in their biases. Trap weights keep every shape and
direction honest; what gives them away is on the client's own examples: the layer's biases hold
its units' thresholds far out in the tail of its pre-activations (their median −b_u is a sizeable
share of the median |x_nᵀW_u|; a fresh or trained layer's biases are near zero against them,
:func:`bias_share`), so that each unit fires for few examples. A layer whose units fire rarely for
another reason, such as an honest layer whose units died in training (the Flower example's MLP after
its lr-0.1 training fires for 0.3-4.5 %), is no sign of a malicious server but leaks alike
(``experiments/studies/malicious``, trap check): :func:`rarely_firing` names it, and the Flower gate
audits the update it trains.

Shapes: inputs (N, H, W, C); the block's parameters ``imprint`` {kernel (D, k), bias (k,)} and
``imprint_out`` {kernel (k, D)}, the model's own under ``model``.
"""

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gradjax import compilation, models

STATISTICS = ("mean", "random")
STRUCTURES = ("cumulative", "sparse")

PARALLEL = 0.999
"""|cos| above which two units' weight vectors count as measuring one direction (:func:`inspect`)."""

MIN_UNITS = 4
"""Units of a layer sharing one direction from which :func:`inspect` calls the layer an imprint."""


class Imprinted(nn.Module):
  """``model`` behind an imprint block of ``bins`` units: (N, H, W, C) -> the model's logits. Units
  ReLU(z) (``ceiling`` None, cumulative bins) or clip(z, 0, ``ceiling``) (the hard tanh of sparse
  bins)."""

  model: nn.Module
  bins: int
  ceiling: float | None = None

  @nn.compact
  def __call__(self, x, train: bool = False):
    flat = x.reshape(x.shape[0], -1)
    z = nn.Dense(self.bins, name="imprint", dtype=x.dtype, param_dtype=x.dtype)(flat)
    h = nn.relu(z) if self.ceiling is None else jnp.clip(z, 0.0, self.ceiling)
    back = nn.Dense(flat.shape[1], use_bias=False, name="imprint_out", dtype=x.dtype,
                    param_dtype=x.dtype)(h)
    return self.model(x + back.reshape(x.shape), train)


def measurement(statistic: str, size: int, key: jax.Array | None = None) -> np.ndarray:
  """The vector a (D,) of ``statistic``: ``"mean"`` (1/D each: the mean brightness) or ``"random"``
  (a unit Gaussian direction drawn from ``key``)."""
  if statistic == "mean":
    return np.full(size, 1.0 / size)
  if statistic == "random":
    if key is None:
      raise ValueError("the 'random' statistic needs a key")
    a = np.asarray(compilation.normal(key, (size,)), np.float64)
    return a / np.linalg.norm(a)
  raise ValueError(f"unknown imprint statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")


def imprint_thresholds(statistics, bins: int) -> np.ndarray:
  """c (bins,): the quantiles (i + 1) / (bins + 1) of the statistic's values on the server's own
  data (``statistics`` (M,)), so that an example falls in each bin, and below c_0, with equal
  probability when its data are distributed as the server's. (A sparse block of k units takes
  k + 1 thresholds: ``imprint_thresholds(statistics, k + 1)``.)"""
  statistics = np.asarray(statistics, np.float64).reshape(-1)
  if bins < 1 or statistics.size < 2:
    raise ValueError(f"an imprint block needs bins >= 1 and at least 2 values, got {bins} and "
                     f"{statistics.size}")
  if not np.all(np.isfinite(statistics)):
    raise ValueError("the statistics an imprint block's thresholds come from contain NaN or inf")
  return np.quantile(statistics, np.arange(1, bins + 1) / (bins + 1))


def _sorted_thresholds(thresholds) -> np.ndarray:
  """``thresholds`` flattened and sorted ascending, float64; a one-line ValueError unless finite."""
  thresholds = np.sort(np.asarray(thresholds, np.float64).reshape(-1))
  if not np.all(np.isfinite(thresholds)):
    raise ValueError("an imprint block's thresholds must be finite numbers")
  return thresholds


def imprint(model: models.Model, thresholds, *, structure: str = "cumulative", statistic: str = "mean",
            scale: float = 1e-3, gain: float | None = None, key: jax.Array | None = None) -> models.Model:
  """The model the server sends: ``model`` behind an imprint block with these ``thresholds``
  (sorted ascending), measuring ``statistic``; its output direction w has entries ``scale`` (the
  model's input moves by ``scale`` Σ_i h_i per pixel). The model's own variables are kept.

  ``structure``: ``"cumulative"``, one ReLU unit per threshold (k thresholds, k units, bin i read
  as the difference of units i and i + 1); ``"sparse"``, one hard-tanh unit per pair of neighbouring
  thresholds (k + 1 thresholds, k units, unit i firing on bin [c_i, c_(i+1)) alone: the block for a
  FedAvg client, see the module docstring).

  ``gain`` (default 1 for the cumulative block, :data:`SPARSE_GAIN` for the sparse one) < 1 shrinks
  the imprint kernel and biases to ``gain`` a and −``gain`` c (sparse: also the units' ceiling to
  ``gain``) and raises w to ``scale`` / ``gain``: the same bins, the same input to
  the model and the same read-out, but an update that changes the imprint rows by 1/``gain``² more
  relative to themselves. A FedAvg client sends W_0 − W_E in float32, which keeps about
  7 − log10(|W| / |W_0 − W_E|) digits of the update: rows of 1/D entries that move by 1e-7 of
  themselves keep none. (Cumulative rows then drift further from a during several local steps.)"""
  thresholds = _sorted_thresholds(thresholds)
  if models.is_text(model.name):
    raise ValueError("an imprint block reads images")
  if structure not in STRUCTURES:
    raise ValueError(f"unknown imprint structure {structure!r}; choose one of {', '.join(STRUCTURES)}")
  if gain is None:
    gain = SPARSE_GAIN if structure == "sparse" else 1.0
  if not gain > 0:
    raise ValueError(f"the imprint's gain must be positive, got {gain}")
  size = int(np.prod(model.input_shape))
  a = measurement(statistic, size, key)
  dtype = jax.tree.leaves(model.variables)[0].dtype
  if structure == "sparse":
    widths = np.diff(thresholds)
    if thresholds.size < 2 or not np.all(widths > 0):
      raise ValueError("a sparse imprint block needs at least 2 thresholds, all different (k + 1 "
                       "for k units)")
    kernel, bias, ceiling = a[:, None] / widths[None], -thresholds[:-1] / widths, gain
  else:
    kernel, bias, ceiling = np.repeat(a[:, None], thresholds.size, axis=1), -thresholds, None
  bins = bias.size
  block = Imprinted(model.apply_fn.module, bins, ceiling)
  params = {"imprint": {"kernel": jnp.asarray(gain * kernel, dtype), "bias": jnp.asarray(gain * bias, dtype)},
            "imprint_out": {"kernel": jnp.full((bins, size), scale / gain, dtype)},
            "model": model.variables["params"]}
  variables = {k: ({"model": v} if k != "params" else params) for k, v in model.variables.items()}
  variables["params"] = params
  return models.Model(models.make_apply_fn(block), variables, f"imprint({model.name})",
                      model.input_shape, model.num_classes)


def imprint_layer(model: models.Model, thresholds, *, statistic: str = "mean",
                  key: jax.Array | None = None) -> models.Model:
  """The model the server sends with an imprint hidden in the declared architecture: the first k
  units of an MLP's first layer (``Dense_0``, reading the flattened input, ReLU after it; k =
  len(``thresholds``)) measure ``statistic`` against the thresholds, and the head's rows for those
  units are made equal (their mean), so each unit's output gradient is the same g_n; the other
  units and the shapes are the model's own. Read the update with
  ``imprint_recover(..., layer="Dense_0", units=k)``."""
  thresholds = _sorted_thresholds(thresholds)
  params = model.variables["params"]
  if set(params) != {"Dense_0", "head"}:
    raise ValueError(f"imprint_layer rewrites a one-hidden-layer MLP (Dense_0, head), not {model.name}")
  kernel = np.array(params["Dense_0"]["kernel"])
  k = thresholds.size
  if k > kernel.shape[1]:
    raise ValueError(f"{k} bins do not fit the first layer's {kernel.shape[1]} units")
  kernel[:, :k] = measurement(statistic, kernel.shape[0], key)[:, None]
  bias = np.array(params["Dense_0"]["bias"])
  bias[:k] = -thresholds
  head = np.array(params["head"]["kernel"])
  head[:k] = head[:k].mean(axis=0)
  dtype = kernel.dtype
  changed = {"Dense_0": {"kernel": jnp.asarray(kernel, dtype), "bias": jnp.asarray(bias, dtype)},
             "head": {**params["head"], "kernel": jnp.asarray(head, dtype)}}
  return model._replace(variables={**model.variables, "params": changed})


def trap_weights(model: models.Model, public, rate: float, key: jax.Array) -> models.Model:
  """The model the server sends with trap weights in an MLP's first layer (after Boenisch et al.,
  "When the Curious Abandon Honesty", EuroS&P 2023, who scale each unit's negative weights so that
  few inputs activate it; here each unit keeps a fresh Gaussian direction and its bias is set so
  that a share ``rate`` of the server's own ``public`` examples (M, H, W, C), as the client's model
  reads them, activate it). With rate about 1/N, most units fire for one example of a batch of N or
  none, and the update gives each such example back exactly
  (:func:`gradjax.analytic.exclusive_neurons`); shapes are the model's own, and no two units share
  a direction, so :func:`inspect` sees it only on the client's examples (:func:`bias_share`)."""
  params = model.variables["params"]
  if set(params) != {"Dense_0", "head"}:
    raise ValueError(f"trap_weights rewrites a one-hidden-layer MLP (Dense_0, head), not {model.name}")
  if not 0 < rate < 1:
    raise ValueError(f"the activation rate must lie in (0, 1), got {rate}")
  kernel = np.array(compilation.normal(key, params["Dense_0"]["kernel"].shape), np.float64)  # a copy
  kernel /= np.linalg.norm(kernel, axis=0, keepdims=True)
  z = np.asarray(public, np.float64).reshape(len(public), -1) @ kernel  # (M, units)
  bias = -np.quantile(z, 1 - rate, axis=0)
  dtype = params["Dense_0"]["kernel"].dtype
  changed = {**params, "Dense_0": {"kernel": jnp.asarray(kernel, dtype), "bias": jnp.asarray(bias, dtype)}}
  return model._replace(variables={**model.variables, "params": changed})


class Imprints(NamedTuple):
  """What :func:`imprint_recover` reads.

  Attributes:
    x: (K, H, W, C) the bins' read-outs, one per bin that holds weight (an example alone in its bin
      exactly; a collision's weighted mean otherwise).
    bins: (K,) their bin indices.
    weights: (K,) the bin's bias gradient: ∂L/∂b_i − ∂L/∂b_(i+1) = Σ g_n / N (cumulative),
      ∂L/∂b_i = (γ / (c_(i+1) − c_i)) Σ g_n / N (sparse).
  """

  x: np.ndarray
  bins: np.ndarray
  weights: np.ndarray


def imprint_recover(gradient, input_shape, *, layer: str = "imprint", units=None,
                    structure: str = "cumulative", tolerance: float = 1e-6) -> Imprints:
  """The examples of an imprinted model's update (FedSGD gradient, a sum of them over clients, or a
  FedAvg update against a sparse block), bin by bin (see the module docstring), from the dense
  ``layer`` whose units ``units`` are the imprint: an int k for its first k (:func:`imprint`:
  ``"imprint"``, all; :func:`imprint_layer`: ``"Dense_0"`` and its k), or their indices in the
  order of their thresholds (:func:`imprint_units`). ``structure`` as the block was built:
  ``"cumulative"`` reads bin i from units i and i + 1, ``"sparse"`` from unit i alone. A bin counts
  when its bias gradient exceeds ``tolerance`` times the largest |∂b| in magnitude. Computed in
  float64 from the update's values; the read-out is a ratio, so an update of one local SGD step
  (the gradient times the learning rate) reads the same."""
  if structure not in STRUCTURES:
    raise ValueError(f"unknown imprint structure {structure!r}; choose one of {', '.join(STRUCTURES)}")
  if not isinstance(gradient, Mapping):
    raise ValueError(f"the update is a tree of parameters (an observation's .gradient), got "
                     f"{type(gradient).__name__}")
  params = gradient["params"] if "params" in gradient else gradient
  if layer not in params:
    raise ValueError(f"the update holds no imprint block (params {layer!r})")
  kernel = np.asarray(params[layer]["kernel"], np.float64)
  if int(np.prod(input_shape)) != kernel.shape[0]:
    raise ValueError(f"the imprint block reads {kernel.shape[0]} inputs, an example of shape "
                     f"{tuple(input_shape)} has {int(np.prod(input_shape))}")
  take = slice(units) if units is None or isinstance(units, (int, np.integer)) else np.asarray(units)
  if not isinstance(take, slice) and (take.ndim != 1 or not np.issubdtype(take.dtype, np.integer)
                                      or take.size and not 0 <= take.min() <= take.max() < kernel.shape[1]):
    raise ValueError(f"units must be indices in [0, {kernel.shape[1]}) of the block's units, got "
                     f"{np.asarray(units).tolist()}")
  dw = kernel.T[take]                                           # (k, D)
  db = np.asarray(params[layer]["bias"], np.float64)[take]      # (k,)
  if not (np.all(np.isfinite(dw)) and np.all(np.isfinite(db))):
    raise ValueError(f"the update's imprint block ({layer!r}) contains NaN or inf")
  if structure == "sparse":
    dw_bins, db_bins = dw, db
  else:
    dw_bins = dw - np.concatenate([dw[1:], np.zeros_like(dw[:1])])
    db_bins = db - np.concatenate([db[1:], [0.0]])
  scale = np.abs(db).max(initial=0.0)
  if not scale > 0:
    return Imprints(np.zeros((0, *input_shape)), np.zeros(0, np.int64), np.zeros(0))
  held = np.flatnonzero(np.abs(db_bins) > tolerance * scale)
  x = dw_bins[held] / db_bins[held, None]
  return Imprints(x.reshape(len(held), *input_shape), held, db_bins[held])


AUDIT_BINS = 1024
"""The imprint block an audit reports against (:func:`server_row`): two 3072 x 1024 matrices on
CIFAR-sized images, about half a ResNet-18's weights."""

SPARSE_GAIN = 1e-3
"""The sparse block's gain unless one is given (:func:`imprint`), and the audit's row's. Measured (``experiments/studies/malicious``, batch 64,
512 bins, DLG's LeNet behind the block): FedAvg clients of 1 to 40 local steps at learning rates 0.01
and 0.1 give back 52-62 of 64 examples exactly (momentum 0.9: 55), against 56.4 expected; at gain 1,
0.1 and 0.01 the same client of four steps gives 0, 1 and 29."""


def server_row(examples: int, bins: int = AUDIT_BINS) -> dict:
  """The audit's row for a malicious server: of a client's N ``examples``, the number a sparse
  imprint block of k ``bins`` (:func:`imprint` with ``structure="sparse"``, k + 1 equally likely
  thresholds, gain :data:`SPARSE_GAIN`) recovers exactly in expectation, FedSGD or FedAvg (measured
  at 1-40 local steps at learning rates 0.01-0.1, :data:`SPARSE_GAIN`'s table; many steps with
  momentum or a large learning rate recover fewer, ``experiments/studies/malicious``):

      N (k/(k+2)) ((k+1)/(k+2))^(N−1)

  (an example is recovered when it lies in one of the k bins, not in the two outer cells, and no
  other of the N lies in its bin; for FedSGD the cumulative block's N (k/(k+1))^N differs from it
  by less than 0.2 example for k = 1024 and N <= 256)."""
  if examples < 1 or bins < 1:
    raise ValueError(f"examples and bins must be positive, got {examples} and {bins}")
  expected = examples * bins / (bins + 2) * ((bins + 1) / (bins + 2)) ** (examples - 1)
  return {"attack": "imprint", "structure": "sparse", "bins": bins, "examples": examples,
          "expected_exact": expected,
          "reason": f"a server that sends an imprint block of {bins} bins (Robbing the Fed, sparse) "
                    f"in front of this model recovers about {expected:.1f} of the client's "
                    f"{examples} examples exactly, from a FedSGD gradient or FedAvg's local steps "
                    "(fewer after many steps with momentum or a large learning rate), summed over "
                    "clients too; gradjax.integrations.flower.leakage_mod refuses such a model"}


TRAP_RATE = 0.15
"""Mean activation rate of an input layer's units on the client's examples below which
:func:`rarely_firing` names it (fresh layers: about 0.5; trap weights for batches of N: about 1/N;
honest layers whose units died in training: as low). Set between the first two before measuring."""

TRAP_SHARE = 0.25
""":func:`bias_share` above which :func:`inspect` calls an input layer trap weights (with units
firing for less than half the client's examples). Set once, before the trap check's table, between
a first measurement's honest MLPs (at most 0.072 with |b_u| for −b_u) and trap weights (at least
0.81). The table (``experiments/studies/malicious``, trap check: honest MLPs fresh under the zoo's
three initialisations, trained here, the Flower example's PyTorch MLPs after its training; traps for
batches of 8 to 128; inputs in [0, 1] or normalised; client batches of 1 to 128) then measured
−0.022 to 0.014 on honest layers and 0.41 to 5.6 on traps."""


def _input_layers(params, width: int):
  """(path of the kernel, kernel, bias) of every dense layer of ``params`` that reads the flattened
  input: a 2-D ``kernel`` of ``width`` rows beside a ``bias``."""
  found = []

  def visit(node, path):
    kernel = node.get("kernel")
    if np.ndim(kernel) == 2 and np.shape(kernel)[0] == width and "bias" in node:
      found.append((path + "['kernel']", np.asarray(kernel, np.float32), np.asarray(node["bias"], np.float32)))
    for name, child in node.items():
      if hasattr(child, "items"):
        visit(child, f"{path}['{name}']")

  visit(params.get("params", params), "")
  return found


def _statistics(params, inputs) -> dict[str, tuple[float, float]]:
  """(:func:`activation_rate`, :func:`bias_share`) of every input layer, from one product each."""
  x = np.asarray(inputs, np.float32).reshape(len(inputs), -1)
  found = {}
  for path, kernel, bias in _input_layers(params, x.shape[1]):
    z = x @ kernel
    scale = float(np.median(np.abs(z)))
    found[path] = (float(np.mean(z + bias > 0)), float(np.median(-bias)) / scale if scale > 0 else 0.0)
  return found


def activation_rate(params, inputs) -> dict[str, float]:
  """For every dense layer of ``params`` that reads the flattened input (a 2-D ``kernel`` of
  D = H·W·C rows with its ``bias``): the share of (example, unit) pairs with a positive
  pre-activation on ``inputs`` (N, H, W, C), as the model reads them::

    rate = (1 / (N·U)) Σ_n Σ_u [x_nᵀ W_u + b_u > 0]

  A unit of a freshly drawn layer fires for about half the examples; trap weights set each unit's
  bias so that it fires for about 1/N of them. Keyed by the kernel's path; computed in NumPy float32
  (one N × D by D × U product per layer)."""
  return {path: rate for path, (rate, _) in _statistics(params, inputs).items()}


def bias_share(params, inputs) -> dict[str, float]:
  """For every dense layer of ``params`` that reads the flattened input: how far its biases hold
  its units' thresholds out against its pre-activations on ``inputs`` (N, H, W, C)::

    share = median_u(−b_u) / median_(n,u) |x_nᵀ W_u|

  Trap weights set every b_u so that a unit fires for 1/N of the server's examples, far out in the
  tail: a share near 1 or above; a fresh layer's biases are zero or small and a trained one's stay
  small against its pre-activations. Keyed by the kernel's path (0 where every pre-activation is 0)."""
  return {path: share for path, (_, share) in _statistics(params, inputs).items()}


def rarely_firing(params, inputs) -> dict[str, float]:
  """The input layers of ``params`` whose units fire, on the client's ``inputs`` (N, H, W, C), at a
  mean rate below :data:`TRAP_RATE` (:func:`activation_rate`): path -> rate. Whoever set such a
  layer, trap weights or training that killed its units, most examples have units of their own and
  the update gives them back (:func:`gradjax.analytic.exclusive_neurons`): not a finding against
  the server, a reason to audit the update."""
  return {path: rate for path, rate in activation_rate(params, inputs).items() if rate < TRAP_RATE}


class Finding(NamedTuple):
  """One sign that a received model was built to leak: ``path`` (a parameter path) and ``reason``
  (one line)."""

  path: str
  reason: str


def inspect(received, declared=None, inputs=None) -> list[Finding]:
  """What in the ``received`` variables (a Flax tree) was built to leak (empty: nothing found).

  Args:
    received: the variables the server sent.
    declared: the variables of the architecture the client declared (e.g. a fresh
      :func:`gradjax.models.create` of it, or last round's model), or None to skip that check.
    inputs: the client's examples (N, H, W, C) as the model reads them, or None to skip the check
      of trap weights: one finding for every layer reading the input whose :func:`bias_share` on
      them exceeds :data:`TRAP_SHARE` while its units fire for less than half of them.

  Returns one finding for the parameters that ``declared`` lacks, one for those it holds with
  another shape, one for those missing, and one for every dense kernel (2-D, (inputs, units),
  named ``kernel``; not the ``head``'s, whose units give the logits) of which at least
  :data:`MIN_UNITS` units share one direction: units sorted by their projection on a fixed random
  direction, each compared (|cos| ≥ :data:`PARALLEL`) with the next three, the largest chain so
  linked counted (a layer's cost: one pass over its weights).

  Limits (``experiments/studies/malicious``, detection): the test is of one exact direction, so an
  imprint whose units carry a few per cent of noise orthogonal to it passes (at 6 % of each unit's
  norm, |cos| 0.998), while its read-out still recovers most examples; a looser test would refuse
  honest layers (an MLP's first layer after training at a learning rate of 0.1 holds units at 0.93
  of one direction). Trap weights are found by the layer's median bias: traps in part of its units
  pass. What the check misses, the audit of the client's update after training (the Flower gate's)
  still sees.
  """
  found = []
  flat = {jax.tree_util.keystr(p): np.asarray(v) for p, v in
          jax.tree_util.tree_leaves_with_path(received.get("params", received))}
  if declared is not None:
    want = {jax.tree_util.keystr(p): np.shape(v) for p, v in
            jax.tree_util.tree_leaves_with_path(declared.get("params", declared))}
    extra = [p for p in flat if p not in want]
    reshaped = [p for p in flat if p in want and want[p] != flat[p].shape]
    missing = sorted(set(want) - set(flat))
    for paths, what in ((extra, "not in the declared architecture"),
                        (reshaped, "shaped otherwise than in the declared architecture"),
                        (missing, "of the declared architecture missing")):
      if paths:
        found.append(Finding(paths[0], f"{len(paths)} parameter(s) {what}, e.g. {paths[0]}"))
  for path, value in flat.items():
    # Not the head: its units give the logits, not a ReLU's bins, and an honest one can hold parallel
    # units (a zero-initialised head's classes that no example of the training had keep one direction).
    if (value.ndim != 2 or value.shape[1] < MIN_UNITS or not path.endswith("['kernel']")
        or path.startswith("['head']")):
      continue
    shared = _largest_parallel_group(value.T)
    if shared >= MIN_UNITS:
      found.append(Finding(path, f"{shared} of its {value.shape[1]} units measure one direction "
                           f"(|cos| >= {PARALLEL}): an imprint's bins"))
  if inputs is not None:
    for path, (rate, share) in _statistics(received, inputs).items():
      if share > TRAP_SHARE and rate < 0.5:
        found.append(Finding(path, f"its biases hold its units' thresholds out at {share:.2f} of their "
                             f"pre-activations' scale (fresh or trained layers: under {TRAP_SHARE}), so "
                             f"they fire for {rate:.1%} of the client's examples: trap weights"))
  return found


def imprint_units(kernel, bias) -> np.ndarray:
  """The imprint in a dense layer the server sent (``kernel`` (D, k), ``bias`` (k,)): the indices of
  its largest group of units whose weight vectors share one direction and sign (:func:`inspect`'s
  test), in the ascending order of the thresholds they measure (unit i fires when
  aᵀx > −b_i / s_i, w_i = s_i a); empty when fewer than :data:`MIN_UNITS` share one."""
  units = np.asarray(kernel, np.float64).T
  group = _parallel_group(units, signed=True)
  if len(group) < MIN_UNITS:
    return np.zeros(0, np.int64)
  scale = np.linalg.norm(units[group], axis=1)
  return group[np.argsort(-np.asarray(bias, np.float64)[group] / scale, kind="stable")]


def _parallel_group(units: np.ndarray, signed: bool = False, reach: int = 3) -> np.ndarray:
  """The indices of the largest set of rows of ``units`` (n, d) linked by cos ≥ PARALLEL between
  neighbours in the order of their projection on a fixed random direction; ``signed=False``: ±u
  count as one direction (|cos|)."""
  units = np.asarray(units, np.float32)
  norms = np.linalg.norm(units, axis=1)
  kept = np.flatnonzero(norms > 0)
  units = units[kept] / norms[kept, None]
  n = len(units)
  if n < 2:
    return kept
  direction = np.random.default_rng(0).normal(size=units.shape[1]).astype(np.float32)
  projection = units @ direction
  if not signed:
    units = units * np.where(projection < 0, -1.0, 1.0).astype(np.float32)[:, None]  # ±u: one direction
    projection = np.abs(projection)
  order = np.argsort(projection, kind="stable")
  units = units[order]
  parent = np.arange(n)

  def root(i):
    while parent[i] != i:
      parent[i] = parent[parent[i]]
      i = parent[i]
    return i

  for step in range(1, min(reach, n - 1) + 1):
    close = np.flatnonzero(np.sum(units[:-step] * units[step:], axis=1) >= PARALLEL)
    for i in close:
      parent[root(i)] = root(i + step)
  roots = np.array([root(i) for i in range(n)])
  largest = np.bincount(roots).argmax()
  return np.sort(kept[order[roots == largest]])


def _largest_parallel_group(units: np.ndarray) -> int:
  """The size of :func:`_parallel_group` (±u one direction)."""
  return len(_parallel_group(units))
