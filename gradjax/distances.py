"""Distances between a dummy gradient and the observed one, over whole parameter pytrees.

A distance is ``distance(dummy_tree, observed_tree) -> scalar``; both trees have the parameters'
structure. Every distance takes an optional ``weights`` pytree of the same structure holding one scalar
per leaf (w_l ≥ 0; w_l = 0 drops leaf l, which is how layers are selected; ``None`` means all 1), see
:func:`depth_weights` and :func:`select_layers`. In the formulas l runs over leaves (parameter tensors:
a kernel and its bias are separate terms) and Δ_l = g'_l − g_l, with g' the dummy and g the observed
gradient.

Norms are written as ``sqrt(sum + eps)`` rather than ``jnp.linalg.norm`` because the attack
differentiates through them and the norm's gradient at 0 is NaN; |x| is written as x·sign(x), whose
derivative at 0 is sign(0) = 0 (``jnp.abs``'s is 1).

Conventions (they change published numbers, so they are explicit):

* ``euclidean``: D = scale · Σ_l w_l ‖Δ_l‖². The DLG code uses scale 1 (``"euclidean"``); breaching
  and other libraries use 0.5 (``"euclidean_half"``).
* ``cosine``: 1 − cosine similarity with inner products and norms pooled over all selected layers
  (Geiping et al., "Inverting Gradients", 2020); ``cosine_per_layer`` averages per-leaf cosines.
* ``gaussian_kernel``: SAPAG's Σ_l Q_l (1 − exp(−‖Δ_l‖² / σ_l²)), σ_l² the population variance of
  the observed leaf (``gaussian_kernel_mean`` divides by n_l σ_l², ``gaussian_kernel_annealed`` goes
  from that width to σ_l² over the first steps).

What an attack needs to know about a distance travels with it in a :class:`Distance` record: the
layer weights it is defined with, whether it reads the optimizer step (a keyword ``step``, which the
objective passes), and from which step its values are comparable. :data:`DISTANCES` names them.

Depth order: ``jax.tree`` flattening (and so ``jax.grad``, ``jax.jit`` and ``jax.tree.map`` outputs)
sorts dict keys, so "Conv_10" comes before "Conv_2" and "BatchNorm_0" before "Conv_0". :func:`layer_paths`
follows the dicts' insertion order, which is Flax's creation (call) order only for a tree that never
went through a transformation; ``models.create`` initialises in a compiled program, so its
``variables["params"]`` are sorted. :func:`module_call_order` reads the true call order from the model
itself (:func:`layer_index`, :func:`leaf_positions` and :func:`depth_weights` take it);
:func:`call_order` recovers it from the module names where they determine it (the LeNets, the MLP).
"""

import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

EPS = 1e-12
VAR_FLOOR = 1e-30  # σ² floor of gaussian_kernel; 1/VAR_FLOOR is finite in float32.

# --- trees and weights ----------------------------------------------------------------------------


def _path_strings(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def check_trees(dummy, observed, weights=None) -> None:
  """Raises ``ValueError`` unless ``dummy`` (and ``weights``) match ``observed``.

  Compares ``jax.tree.structure`` (dict key order does not matter), leaf shapes of ``dummy``, and that
  every weight is a scalar, finite and non-negative, not all zero (value checks skip traced weights).
  Runs at trace time, so it costs nothing inside ``jit``.
  """
  want = jax.tree.structure(observed)
  if want.num_leaves == 0:
    raise ValueError("the observed gradient tree has no leaves")
  for name, tree in (("dummy", dummy), ("weights", weights)):
    if (tree is not None or name == "dummy") and jax.tree.structure(tree) != want:
      got, ref = set(_path_strings(tree)), set(_path_strings(observed))
      raise ValueError(f"{name} tree does not match the observed gradient (missing "
                       f"{sorted(ref - got)[:3]}, unexpected {sorted(got - ref)[:3]})")
  for path, d, o in zip(_path_strings(observed), jax.tree.leaves(dummy), jax.tree.leaves(observed)):
    if jnp.shape(d) != jnp.shape(o):
      raise ValueError(f"dummy leaf {path} has shape {jnp.shape(d)}, observed {jnp.shape(o)}")
  if weights is None:
    return
  leaves = jax.tree.leaves(weights)
  if any(jnp.ndim(w) != 0 for w in leaves):
    raise ValueError("weights must hold one scalar per leaf")
  concrete = [np.asarray(w, np.float64) for w in leaves if not isinstance(w, jax.core.Tracer)]
  if any(not np.isfinite(w) or w < 0 for w in concrete):
    raise ValueError("weights must be finite and non-negative")
  if len(concrete) == len(leaves) and not any(w > 0 for w in concrete):
    raise ValueError("weights select no layer (all zero)")


def _terms(dummy, observed, weights):
  """Checks the trees; returns (w, g', g) per leaf, leaves with a concrete weight 0 left out."""
  check_trees(dummy, observed, weights)
  obs = jax.tree.leaves(observed)
  ws = [1.0] * len(obs) if weights is None else jax.tree.leaves(weights)
  return [(w, d, o) for w, d, o in zip(ws, jax.tree.leaves(dummy), obs)
          if isinstance(w, jax.core.Tracer) or float(w) != 0.0]


def _abs(x):
  return x * jnp.sign(x)  # |x| with derivative sign(x), 0 at 0


def _children(node):
  """(name, child) pairs of a dict / list / tuple in its own order; None for a leaf."""
  if isinstance(node, Mapping):
    return [(str(k), v) for k, v in node.items()]
  if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
    return [(str(i), v) for i, v in enumerate(node)]
  return None


def layer_paths(params) -> list[tuple[str, ...]]:
  """Leaf paths of ``params`` in depth order: the dicts' insertion order, not JAX's sorted order.

  Example: LeNet-5's variables as Flax's ``init`` returns them give [("Conv_0", "kernel"),
  ("Conv_0", "bias"), ("Conv_1", "kernel"), ..., ("head", "kernel"), ("head", "bias")]: modules in
  call order, leaves in ``self.param`` order. Variables that went through a pytree transformation
  (``jax.jit``, ``jax.tree.map``; :func:`gradjax.models.create`'s) have their keys sorted:
  ("Conv_0", "bias") before ("Conv_0", "kernel"), and modules alphabetically, which is not the call
  order of every model (:func:`module_call_order` reads that from the model).
  """
  out = []

  def walk(node, path):
    children = _children(node)
    if children is None:
      if node is not None:
        out.append(path)
      return
    for name, child in children:
      walk(child, path + (name,))

  walk(params, ())
  return out


def _key(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _map_paths(fn, params):
  """``fn(path)`` for every leaf, as a tree of ``params``' structure; checks the path walk."""
  paths = set(layer_paths(params))
  keys = [_key(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  if set(keys) != paths or len(keys) != len(paths):
    raise ValueError("parameter tree must be nested dicts / lists of arrays")
  return jax.tree_util.tree_map_with_path(lambda p, _: fn(_key(p)), params)


def _module_ranks(paths, order) -> dict:
  """Module path -> depth rank: the modules' place in ``order`` (their call order), or the dicts'
  insertion order without one; modules ``order`` does not name keep their insertion order after it."""
  modules = list(dict.fromkeys(path[:-1] for path in paths))
  if order:
    rank = {path: i for i, path in enumerate(order)}
    modules.sort(key=lambda m: rank.get(m, len(rank)))
  return {m: i for i, m in enumerate(modules)}


def layer_index(params, order: Sequence[tuple[str, ...]] | None = None) -> PyTree:
  """Tree of ``params``' structure holding each leaf's layer index l = 0, 1, ... in depth order.

  A layer is a module: the leaves of one dict (``Conv_0/kernel`` and ``Conv_0/bias``) share an index;
  nested modules count separately (ResNet: Conv_0, BatchNorm_0, BasicBlock_0/Conv_0,
  BasicBlock_0/BatchNorm_0, ...). The last index is L − 1 ("head" for gradjax models). ``order``: the
  modules' call order (:func:`module_call_order`); without it the dicts' insertion order is taken,
  which is the call order only for a tree that never went through a JAX transformation.
  """
  index = _module_ranks(layer_paths(params), order)
  return _map_paths(lambda path: index[path[:-1]], params)


def module_call_order(apply_fn: Callable, variables, x) -> list[tuple[str, ...]]:
  """Module paths in the order the model calls them on ``x`` (each at its first call): the depth
  order of its layers whatever the order of the dicts in ``variables`` (a tree that went through
  ``jit`` comes back with sorted keys: "BasicBlock_0" before the stem's "Conv_0"). Read from the
  module calls (:func:`gradjax.models.taps.intercept`) during ``jax.eval_shape``, so nothing is
  computed."""
  from gradjax.models import taps  # noqa: PLC0415 (only this function reads module calls)
  order = []

  def first_calls(call, proceed):
    if call.method == "__call__" and call.path not in order:
      order.append(call.path)
    return proceed()

  with taps.intercept(first_calls):
    jax.eval_shape(lambda v, x: apply_fn(v, x, False), variables, x)
  return order


_WEIGHT_FIRST = {"kernel": 0, "scale": 0, "embedding": 0, "bias": 1}


def leaf_positions(params, order: Sequence[tuple[str, ...]] | None = None) -> PyTree:
  """Tree of ``params``' structure holding each leaf's position 0..L−1 in depth order (one per
  parameter tensor, as PyTorch's ``model.parameters()`` counts them; :func:`layer_index` counts
  modules).

  ``order``: the modules' call order (:func:`module_call_order`); leaves follow their module's place in it,
  and within a module the weight (kernel, scale, embedding) comes before the bias. Without it, the
  dicts' insertion order is taken, which is the call order only for a tree that never went through a
  JAX transformation."""
  paths = layer_paths(params)
  if order:
    rank = _module_ranks(paths, order)
    paths = sorted(paths, key=lambda p: (rank[p[:-1]], _WEIGHT_FIRST.get(p[-1], 2), p[-1]))
  index = {path: i for i, path in enumerate(paths)}
  return _map_paths(lambda path: index[path], params)


DEPTH_RULES = ("inverse", "linear", "exp", "uniform")


def depth_weights(params, rule: str = "inverse", *, decay: float = 0.5,
                  order: Sequence[tuple[str, ...]] | None = None) -> PyTree:
  """Per-leaf weights Q_l decreasing with depth, as a tree of ``params``' structure (Python floats).

  With l the layer index of :func:`layer_index` (in the modules' call ``order``, or the insertion
  order of ``params`` without one) and L the number of layers::

    inverse  Q_l = 1 / (l + 1)     (SAPAG-style default of :func:`gaussian_kernel`)
    linear   Q_l = (L − l) / L
    exp      Q_l = decay ** l
    uniform  Q_l = 1               (every layer alike: the unweighted distance, kept explicit)

  Pass the model's parameters with ``order=module_call_order(...)`` (a model built under ``jit``, as
  ``models.create`` does, and any gradient from ``jax.grad`` have their keys sorted). Combine with
  :func:`select_layers` by ``jax.tree.map(operator.mul, q, s)``.
  """
  if rule not in DEPTH_RULES:
    raise ValueError(f"unknown depth rule {rule!r}; choose one of {', '.join(DEPTH_RULES)}")
  if not (np.isfinite(decay) and decay > 0):
    raise ValueError(f"decay must be positive, got {decay}")
  index = layer_index(params, order)
  num = max(jax.tree.leaves(index), default=-1) + 1
  rule = {"inverse": lambda l: 1.0 / (l + 1), "linear": lambda l: (num - l) / num,
          "exp": lambda l: float(decay) ** l, "uniform": lambda l: 1.0}[rule]
  return jax.tree.map(lambda l: float(rule(l)), index)


def select_layers(params, include: Sequence[str] | str | None = None,
                  exclude: Sequence[str] | str | None = None) -> PyTree:
  """0/1 weights (Python floats, tree of ``params``' structure) selecting layers by module name.

  A name is a "/"-joined path prefix: "Conv_0" (a module and everything in it), "BasicBlock_1/Conv_0"
  (a nested module) or "head/kernel" (one leaf). A leaf is selected when ``include`` is None or one of
  its names matches, and none of ``exclude`` does. Unknown names and empty selections raise
  ``ValueError``.
  """
  prefixes = {"/".join(p[:k]) for p in layer_paths(params) for k in range(1, len(p) + 1)}

  def names(arg):
    arg = () if arg is None else (arg,) if isinstance(arg, str) else tuple(arg)
    unknown = [n for n in arg if n not in prefixes]
    if unknown:
      raise ValueError(f"unknown layer names {unknown}; the tree has e.g. {sorted(prefixes)[:6]}")
    return arg

  inc, exc = names(include), names(exclude)
  hit = lambda path, group: any("/".join(path[:k]) in group for k in range(1, len(path) + 1))
  weights = _map_paths(lambda p: float((include is None or hit(p, inc)) and not hit(p, exc)), params)
  if not any(jax.tree.leaves(weights)):
    raise ValueError("include / exclude select no layer")
  return weights


_AUTO_NAME = re.compile(r"(.*\D)_(\d+)")


def call_order(tree):
  """``tree`` with its module dicts rebuilt in Flax call order, inferred from the module names alone.

  For trees whose key order was lost: anything returned by ``jax.grad``, ``jax.jit``, ``eval_shape``
  or ``jax.tree.map`` has its dict keys sorted. The names determine the order when the submodules of
  each module are ``Prefix_0, Prefix_1, ...`` of one class (Flax numbers them per class in call order),
  plus optionally "head", last (gradjax's naming): the LeNets and the MLP. Otherwise, e.g. Conv_0 next
  to BatchNorm_0 (ConvNet, ResNets), the interleaving is lost and this raises ``ValueError``: build the
  weights from the model's own ``variables["params"]`` outside ``jit`` instead.
  Example: ``depth_weights(call_order(observed_gradient))``.
  """
  children = _children(tree)
  if children is None or not any(_children(c) is not None for _, c in children):
    return tree
  if not isinstance(tree, Mapping):
    raise ValueError("cannot infer the depth order of this gradient tree; pass weights")
  matches = {k: _AUTO_NAME.fullmatch(k) for k, _ in children if k != "head"}
  if not all(matches.values()) or len({m[1] for m in matches.values()}) > 1:
    raise ValueError(f"cannot infer the depth order of modules {sorted(matches)[:4]} from a "
                     "gradient tree (JAX sorts keys); pass weights=depth_weights(params, order=...)")
  order = sorted(matches, key=lambda k: int(matches[k][2])) + (["head"] if "head" in tree else [])
  key = {str(k): k for k in tree}
  return {key[k]: call_order(tree[key[k]]) for k in order}


# --- distances ------------------------------------------------------------------------------------


def euclidean(dummy, observed, *, scale: float = 1.0, weights=None) -> jax.Array:
  """D = scale · Σ_l w_l ‖g'_l − g_l‖² (DLG, Zhu et al. 2019, with scale 1)."""
  return scale * sum(w * jnp.sum(jnp.square(d - o)) for w, d, o in _terms(dummy, observed, weights))


def euclidean_half(dummy, observed, *, weights=None) -> jax.Array:
  """D = 0.5 · Σ_l w_l ‖g'_l − g_l‖² (breaching's convention)."""
  return euclidean(dummy, observed, scale=0.5, weights=weights)


def l1(dummy, observed, *, weights=None) -> jax.Array:
  """D = Σ_l w_l Σ_i |g'_li − g_li|; its derivative is w_l·sign(Δ), 0 where Δ = 0."""
  return sum(w * jnp.sum(_abs(d - o)) for w, d, o in _terms(dummy, observed, weights))


def cosine(dummy, observed, *, eps: float = EPS, weights=None) -> jax.Array:
  """D = 1 − Σ_l w_l ⟨g'_l, g_l⟩ / (sqrt(Σ_l w_l ‖g'_l‖² + eps) · sqrt(Σ_l w_l ‖g_l‖² + eps)).

  One cosine over all selected layers together (Geiping et al., "Inverting Gradients", NeurIPS 2020);
  in [0, 2]. Finite, with a finite gradient, when either gradient is all zero (then D = 1).
  """
  terms = _terms(dummy, observed, weights)
  dot = sum(w * jnp.sum(d * o) for w, d, o in terms)
  norm_d = jnp.sqrt(sum(w * jnp.sum(jnp.square(d)) for w, d, _ in terms) + eps)
  norm_o = jnp.sqrt(sum(w * jnp.sum(jnp.square(o)) for w, _, o in terms) + eps)
  return 1.0 - dot / (norm_d * norm_o)


def cosine_per_layer(dummy, observed, *, eps: float = EPS, weights=None) -> jax.Array:
  """D = Σ_l w_l (1 − ⟨g'_l, g_l⟩ / (sqrt(‖g'_l‖² + eps) · sqrt(‖g_l‖² + eps))) / Σ_l w_l.

  The weighted mean of per-leaf cosine distances (each in [0, 2]); an all-zero leaf contributes 1, with
  a finite gradient.
  """
  terms = _terms(dummy, observed, weights)
  total = sum(w * (1.0 - jnp.sum(d * o) / (jnp.sqrt(jnp.sum(jnp.square(d)) + eps)
                                             * jnp.sqrt(jnp.sum(jnp.square(o)) + eps)))
              for w, d, o in terms)
  return total / sum(w for w, _, _ in terms)


def gaussian_kernel(dummy, observed, *, weights=None, per_entry: bool = False, anneal: int = 0,
                    step=0) -> jax.Array:
  """SAPAG's distance D = Σ_l Q_l · (1 − exp(−‖g'_l − g_l‖² / (s_l σ_l²))), s_l = 1, n_l or n_l^e(t).

  Wang et al., "SAPAG: A Self-Adaptive Privacy Attack From Gradients", arXiv:2009.06228, 2020: σ_l
  from the variance of the observed gradient of layer l, Q_l decreasing with depth. Choices made here
  (not checked against the authors' code):

  * a term l is one parameter tensor (a kernel and its bias are separate terms; biases included), as
    when iterating over a PyTorch model's parameter gradients;
  * σ_l² = Var(g_l), the population variance (ddof 0) of the observed leaf's entries, floored at
    ``VAR_FLOOR`` = 1e-30 so an all-zero or one-entry leaf stays finite (that term is then 0 where
    Δ_l = 0 and ≈ Q_l elsewhere, with a zero gradient);
  * Q_l = ``weights``; with ``None``, Q_l = 1 / (l + 1) over module depth l (:func:`depth_weights`,
    "inverse"). The depth order is then inferred from the module names by :func:`call_order`, which
    only works when each module's submodules are one auto-named class (Conv_0, Conv_1, ..., then
    "head": the LeNets, the MLP) and raises otherwise; then pass
    ``weights=depth_weights(params, order=module_call_order(apply_fn, variables, x))``, built
    outside ``jit``.

  Each term lies in [0, Q_l), so D is bounded and the gradient of a far-off layer vanishes. With
  the literal width (``per_entry=False``, s_l = 1) a random start has ‖Δ_l‖² ≈ n_l σ_l² for a leaf of
  n_l entries, so exp(−‖Δ_l‖²/σ_l²) underflows for all but the smallest leaves and only those steer
  the attack. ``per_entry=True`` (s_l = n_l, registered as ``"gaussian_kernel_mean"``) compares the
  mean squared difference with σ_l², which keeps every term in its sensitive range.

  ``anneal`` = T > 0 narrows the kernel over the optimizer's first T steps (registered as
  ``"gaussian_kernel_annealed"``, T = 250, half of SAPAG's LeNet-5 budget): s_l = n_l^e(t) with
  e(t) = max(0, 1 − t/T), the per-entry width at ``step`` 0, the literal one from step T on. A wide
  kernel first draws every layer in, the printed one then weighs the residual as the paper does
  (a reading we measured, not a recommendation: on CIFAR-100 it falls below the per-entry width, ``experiments/studies/sapag_table1``).
  """
  if anneal < 0:
    raise ValueError(f"the kernel's annealing steps must be non-negative, got {anneal}")
  if anneal and per_entry:
    raise ValueError("an annealed kernel starts at the per-entry width itself; leave per_entry off")
  if weights is None:
    weights = depth_weights(call_order(observed))

  def width(o):  # s_l
    if anneal:
      exponent = jnp.maximum(0.0, 1.0 - jnp.asarray(step, o.dtype) / anneal)
      return jnp.asarray(o.size, o.dtype) ** exponent
    return o.size if per_entry else 1

  terms = _terms(dummy, observed, weights)
  # 1 − exp(−x) as −expm1(−x): equal, but 1 − exp(−x) rounds to 0 in float32 once x < 2⁻²⁴ and
  # carries an absolute error of ~6e-8 before that, so a converging attack's objective turns to
  # noise at about 1e-6 and L-BFGS stops there.
  return sum(w * -jnp.expm1(-jnp.sum(jnp.square(d - o))
                            / (width(o) * jnp.maximum(jnp.var(o), VAR_FLOOR)))
             for w, d, o in terms)


@dataclasses.dataclass(frozen=True)
class Distance:
  """A distance and what an attack needs to know about it, travelling together.

  Attributes:
    fn: ``fn(dummy, observed) -> scalar``; it may take a keyword ``weights`` (per-leaf weights, see
      above), and a keyword ``step`` when ``reads_step``.
    depth_rule: the depth rule (:func:`depth_weights`) an attack weighs the layers by when it
      names none: SAPAG's kernel is defined with Q_l = 1/(l + 1) (``"inverse"``); ``None``: unweighted.
    reads_step: ``fn`` takes the optimizer step (keyword ``step``), as an annealed kernel does.
    settled_from: the first step from which ``fn``'s value no longer changes with the step (an
      annealed kernel's T); objective values of earlier steps are not comparable with later ones, so
      an attack tracks its best iterate from there on.

  Calling it, ``distance(dummy, observed, weights=None, step=0)``, passes ``fn`` only what it takes.
  Any plain function is one (:func:`as_distance`).
  """

  fn: Callable[..., jax.Array]
  depth_rule: str | None = None
  reads_step: bool = False
  settled_from: int = 0

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"a distance is a function (dummy, observed) -> scalar, got {self.fn!r}")
    if self.depth_rule is not None and self.depth_rule not in DEPTH_RULES:
      raise ValueError(f"unknown depth rule {self.depth_rule!r}; choose one of "
                       f"{', '.join(DEPTH_RULES)}")
    if self.depth_rule is not None:
      self.check_weighted(self.depth_rule)
    if self.settled_from < 0:
      raise ValueError(f"settled_from must be non-negative, got {self.settled_from}")

  def check_weighted(self, depth_rule: str) -> None:
    """Raises a one-line ``ValueError`` unless ``fn`` takes the keyword ``weights`` a depth rule
    gives (or ``**kwargs``; a function whose signature cannot be read is trusted)."""
    try:
      parameters = inspect.signature(self.fn).parameters
    except (TypeError, ValueError):
      return
    if "weights" not in parameters and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
      name = getattr(self.fn, "__name__", repr(self.fn))
      raise ValueError(f"depth rule {depth_rule!r} weighs the layers, but the distance {name} takes "
                       "no keyword 'weights' (per-leaf weights, a pytree of the parameters' structure)")

  def __call__(self, dummy, observed, *, weights=None, step=0) -> jax.Array:
    kwargs = {} if weights is None else {"weights": weights}
    if self.reads_step:
      kwargs["step"] = step
    return self.fn(dummy, observed, **kwargs)


def as_distance(fn: Callable | Distance) -> Distance:
  """``fn`` as a :class:`Distance` (a plain function: unweighted by default, step-free)."""
  return fn if isinstance(fn, Distance) else Distance(fn)


DISTANCES: dict[str, Distance] = {
    "euclidean": Distance(euclidean),            # DLG code: Σ‖g' − g‖²
    "euclidean_half": Distance(euclidean_half),  # breaching: 0.5·Σ‖g' − g‖²
    "l1": Distance(l1),
    "cosine": Distance(cosine),                  # Inverting Gradients
    "cosine_per_layer": Distance(cosine_per_layer),
    "gaussian_kernel": Distance(gaussian_kernel, depth_rule="inverse"),  # SAPAG, Q_l = 1/(l+1)
    "gaussian_kernel_mean": Distance(functools.partial(gaussian_kernel, per_entry=True),
                                     depth_rule="inverse"),
    "gaussian_kernel_annealed": Distance(functools.partial(gaussian_kernel, anneal=250),
                                         depth_rule="inverse", reads_step=True, settled_from=250),
}


def get_distance(name: str, **kwargs) -> Distance:
  """The :class:`Distance` registered as ``name``, with ``kwargs`` bound to its function.

  Example: ``get_distance("cosine", weights=select_layers(params, exclude=["head"]))``. Without
  kwargs the registered record itself is returned (stable identity for caches).
  """
  try:
    distance = DISTANCES[name]
  except KeyError:
    raise ValueError(f"unknown distance {name!r}; choose one of {', '.join(DISTANCES)}") from None
  if not kwargs:
    return distance
  allowed = [p for p in inspect.signature(distance.fn).parameters
             if p not in ("dummy", "observed", "step")]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"distance {name!r} takes no {unknown}; its options are {allowed}")
  return dataclasses.replace(distance, fn=functools.partial(distance.fn, **kwargs))
