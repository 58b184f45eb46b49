"""Defenses: pure ``Observation -> Observation`` transforms of the shared update, composed by :func:`chain`.

A :class:`Defense` holds ``apply(observation, key=None) -> Observation`` and a ``name``, the spec string
that :func:`parse` reads back (``parse(d.name)`` rebuilds ``d``). ``apply`` transforms
``observation.gradient`` only, leaf by leaf or over the whole tree, and returns the observation with the
same tree structure, shapes and dtypes. For a FedAvg-style observation the same field holds the weight
update (or the weights' difference); it is transformed the same way. ``key`` is a ``jax.random`` key;
deterministic defenses ignore it, random ones raise ``ValueError`` without it (noise of variance 0
draws nothing and needs none). The work is done by
module-level jitted functions (compiled once per gradient tree shape and defense parameters), and
``jax.jit(defense.apply)`` works too.

Notation: g_l is leaf l of the gradient (a kernel and its bias are separate leaves, "layers" below), n_l
its number of entries, ‖·‖ the L2 norm over the entries.

=========================  ======================================================================
``gaussian_noise(v)``      g + N(0, v) i.i.d. per entry
``laplacian_noise(v)``     g + Laplace(0, b), b = sqrt(v / 2) so that Var = v
``clip(C)``                g_l · min(1, C / ‖g_l‖) per leaf (or one global norm)
``dp(C, z)``               clip(C), then noise of standard deviation σ = z · C per entry
``prune(r)``               zero the ⌊r · n_l⌋ entries of smallest |g| per leaf (or over the tree)
``cast("float16")``        g → float16 / bfloat16 → original dtype
``quantize_int8()``        s · clip(round(g / s), −127, 127), s = max|g_l| / 127
``chain(d1, d2, ...)``     d1, then d2, ... with independent keys
``identity()``             unchanged
``parse(spec)``            the defense of a command-line spec, e.g. ``"clip:1.0,gaussian:1e-4"``
=========================  ======================================================================

References: Zhu, Liu & Han, "Deep Leakage from Gradients", NeurIPS 2019, §5 (Gaussian and Laplacian
noise of variance 1e-4 ... 1e-1, half precision, int8 quantisation, gradient pruning; their table states
the noise *variance*); Zhao, Luo & Ding (DLM / DLM+, leakage from FedAvg weight updates: per-layer
clipping then Gaussian or Laplacian noise, weight sparsification); Abadi et al., "Deep Learning with
Differential Privacy", CCS 2016 (clip to C, add N(0, σ²C²)).

Example::

  defense = gradjax.defenses.parse("clip:1.0,gaussian:1e-4")
  defended = defense.apply(observation, jax.random.key(0))
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gradjax.compilation import check_key, once
from gradjax.observation import Observation


class Part(NamedTuple):
  """One defense as its spec names it (:func:`parse`): the ``head`` (a key of :data:`DEFENSES`), its
  ``numbers`` in the spec's order and its ``options`` (``global``: over the whole update, not per
  layer; ``laplacian``: a ``dp``'s noise)."""

  head: str
  numbers: tuple[float, ...] = ()
  options: tuple[str, ...] = ()

  @property
  def whole_tree(self) -> bool:
    return "global" in self.options

  @property
  def spec(self) -> str:
    """The canonical spec of this part, which :func:`parse` reads back to the same defense."""
    return ":".join((self.head, *(_fmt(x) for x in self.numbers), *self.options))


class Defense(NamedTuple):
  """A defense: ``apply(observation, key=None) -> Observation``, its spec string ``name``, of a
  :func:`chain` its ``parts`` (defenses) in order, and of one of this module's defenses its
  :class:`Part` (:func:`parts` reads them)."""

  apply: Callable[..., Observation]
  name: str
  parts: tuple = ()
  part: Part | None = None

  def __call__(self, observation: Observation, key: jax.Array | None = None) -> Observation:
    return self.apply(observation, key)


# --- helpers --------------------------------------------------------------------------------------


def _number(value, what: str, *, low: float = 0.0, strict: bool = False, high: float | None = None):
  """``float(value)`` after checking it is finite, ≥ low (> low if strict) and < high."""
  if isinstance(value, (bool, np.bool_)):  # float(True) is 1.0: a flag in a number's place
    raise ValueError(f"{what} must be a number, got {value!r}")
  try:
    x = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{what} must be a number, got {value!r}") from None
  bad = not math.isfinite(x) or x < low or (strict and x == low) or (high is not None and x >= high)
  if bad:
    bound = f"{'>' if strict else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
    raise ValueError(f"{what} must be finite and {bound}, got {value!r}")
  return x


def _flag(value, what: str) -> bool:
  """``value`` where it is a bool, else a one-line ValueError (``"global"`` is truthy)."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{what} must be True or False, got {value!r}")
  return bool(value)


# The largest noise variance: beyond it float32 noise (|ξ| up to about 6 standard deviations)
# would overflow to inf, where the defended gradient means nothing.
MAX_VARIANCE = 1e60


def _fmt(x: float) -> str:
  return repr(float(x))


def _leaves(observation: Observation):
  leaves, treedef = jax.tree.flatten(observation.gradient)
  for g in leaves:
    if not jnp.issubdtype(jnp.result_type(g), jnp.floating):
      raise ValueError(f"defenses act on floating-point gradients, got a {jnp.result_type(g)} leaf")
  return leaves, treedef


def _transform(observation: Observation, fn, *args, **static) -> Observation:
  """The observation with gradient leaves ``fn(leaves, *args, **static)`` (a jitted list function)."""
  leaves, treedef = _leaves(observation)
  if not leaves:
    return observation
  return observation.replace(gradient=jax.tree.unflatten(treedef, fn(leaves, *args, **static)))


def _wide(g):
  """g in at least float32, for norms and scales of low-precision leaves."""
  return jnp.asarray(g, jnp.promote_types(jnp.result_type(g), jnp.float32))


def _need_key(key, name):
  if key is None:
    raise ValueError(f"defense {name!r} is random: pass a jax.random key")
  check_key(key, f"defense {name!r}'s key")


@once(static_argnames=("kind",))  # one draw per experiment: compiled for speed of compilation
def _noise_leaves(leaves, key, std, *, kind):
  """g + std · ξ, ξ = sample(key, (n,)) for the n entries of the whole tree in one draw.

  The draw is split among the leaves in ``jax.tree.leaves`` order (sorted keys, row-major within a
  leaf): one random call compiles much faster than one per leaf. It is made in the widest leaf dtype
  (at least float32) and the sum is cast back to each leaf's dtype.
  """
  wide = [_wide(g) for g in leaves]
  sizes = [w.size for w in wide]
  flat = _SAMPLERS[kind](key, (sum(sizes),), jnp.result_type(*wide))
  out, start = [], 0
  for g, w, size in zip(leaves, wide, sizes):
    noise = jnp.reshape(flat[start:start + size], w.shape)
    out.append(jnp.asarray(w + std * noise, jnp.result_type(g)))
    start += size
  return out


def _add_noise(observation: Observation, key, kind: str, std: float, name: str) -> Observation:
  if std == 0:  # nothing drawn: no key needed (dp(C, 0) is clip(C))
    return observation
  _need_key(key, name)
  return _transform(observation, _noise_leaves, key, std, kind=kind)


def _sample_gaussian(key, shape, dtype):
  return jax.random.normal(key, shape, dtype)  # variance 1


def _sample_laplacian(key, shape, dtype):
  return jax.random.laplace(key, shape, dtype) / math.sqrt(2.0)  # Laplace(0, 1/√2): variance 1


_SAMPLERS = {"gaussian": _sample_gaussian, "laplacian": _sample_laplacian}


# --- defenses -------------------------------------------------------------------------------------


def identity() -> Defense:
  """No defense: returns the observation unchanged (spec ``"none"``)."""
  return Defense(lambda observation, key=None: observation, "none", part=Part("none"))


def gaussian_noise(variance: float) -> Defense:
  """g + ε, ε ~ N(0, variance) i.i.d. per entry: standard deviation sqrt(variance).

  DLG (Zhu et al. 2019, §5) states the *variance*: 1e-4 and 1e-3 do not defend LeNet, ≥ 1e-2 does.
  One draw of n = Σ_l n_l values from ``key`` is split among the leaves in ``jax.tree.leaves`` order.
  """
  variance = _number(variance, "gaussian noise variance", high=MAX_VARIANCE)
  part = Part("gaussian", (variance,))
  name, std = part.spec, math.sqrt(variance)
  return Defense(lambda observation, key=None: _add_noise(observation, key, "gaussian", std,
                                                          name), name, part=part)


def laplacian_noise(variance: float) -> Defense:
  """g + ε, ε ~ Laplace(0, b) i.i.d. per entry, scale b = sqrt(variance / 2): Var(ε) = 2b² = variance.

  Density exp(−|ε| / b) / (2b). The argument is the variance, as in DLG's defense table (Zhu et al. 2019,
  §5), not the scale b. The draw is shared among the leaves as in :func:`gaussian_noise`.
  """
  variance = _number(variance, "laplacian noise variance", high=MAX_VARIANCE)
  part = Part("laplacian", (variance,))
  name, std = part.spec, math.sqrt(variance)  # std = √2 · b
  return Defense(lambda observation, key=None: _add_noise(observation, key, "laplacian", std,
                                                          name), name, part=part)


@functools.partial(jax.jit, static_argnames=("per_layer",))
def clip_leaves(leaves, max_norm, *, per_layer):
  """The leaves (a list of arrays) clipped as :func:`clip` clips a gradient; differentiable (an
  attack adapted to clipping applies it to its dummy gradient, :mod:`gradjax.adaptive`)."""
  wide = [_wide(g) for g in leaves]
  squares = [jnp.sum(jnp.square(w)) for w in wide]
  if not per_layer:
    squares = [sum(squares)] * len(wide)

  def factor(sq):
    # min(1, C / ‖g‖), exactly 1 for ‖g‖ ≤ C (g = 0 included); the inner where keeps sqrt away from 0,
    # so the derivative is finite too.
    over = sq > max_norm ** 2
    return jnp.where(over, max_norm / jnp.sqrt(jnp.where(over, sq, max_norm ** 2)), 1.0)

  return [jnp.asarray(w * factor(sq), jnp.result_type(g)) for g, w, sq in zip(leaves, wide, squares)]


def _clip_gradient(observation: Observation, max_norm: float, per_layer: bool) -> Observation:
  return _transform(observation, clip_leaves, max_norm, per_layer=per_layer)


def clip(max_norm: float, per_layer: bool = True) -> Defense:
  """L2 clipping: g_l ← g_l · min(1, C / ‖g_l‖) for every leaf l (C = ``max_norm``).

  ``per_layer=False`` uses one norm over the whole tree, ‖g‖ = sqrt(Σ_l ‖g_l‖²), and scales every leaf
  by min(1, C / ‖g‖) (Abadi et al. 2016 clip the whole gradient, and discuss per-layer clipping). Leaves
  (or trees) with norm ≤ C, zero included, are returned unchanged. Norms are computed in at least
  float32. Deterministic: the key is ignored.
  """
  max_norm = _number(max_norm, "clip max_norm", strict=True)
  per_layer = _flag(per_layer, "clip per_layer")
  part = Part("clip", (max_norm,), () if per_layer else ("global",))
  return Defense(lambda observation, key=None: _clip_gradient(observation, max_norm, per_layer),
                 part.spec, part=part)


def dp(max_norm: float, noise_multiplier: float, per_layer: bool = True,
       noise: str = "gaussian") -> Defense:
  """Clipping then noise, as in DP-SGD (Abadi et al. 2016) and DLM's defense (Zhao, Luo & Ding).

  g ← clip(g, C) (see :func:`clip`, per leaf or global), then g + σ · ξ with ξ i.i.d. per entry of zero
  mean and unit variance and σ = ``noise_multiplier`` · C:

    gaussian   ξ ~ N(0, 1): noise N(0, σ²) = N(0, z²C²), as in Abadi et al.
    laplacian  ξ ~ Laplace(0, 1/√2), i.e. noise Laplace(0, b) with b = z·C / √2, standard deviation z·C

  Both noises have standard deviation σ = z·C, whatever ``per_layer``. This clips the shared update of
  one client (client-level clipping), not per-example gradients as DP-SGD does; no privacy accounting is
  done. ``noise_multiplier = 0`` gives :func:`clip`.
  """
  max_norm = _number(max_norm, "dp max_norm", strict=True)
  noise_multiplier = _number(noise_multiplier, "dp noise_multiplier", high=math.sqrt(MAX_VARIANCE))
  per_layer = _flag(per_layer, "dp per_layer")
  if noise not in _SAMPLERS:
    raise ValueError(f"dp noise must be one of {', '.join(_SAMPLERS)}, got {noise!r}")
  part = Part("dp", (max_norm, noise_multiplier),
              (*(() if noise == "gaussian" else (noise,)), *(() if per_layer else ("global",))))
  name, std = part.spec, noise_multiplier * max_norm

  def apply(observation, key=None):
    clipped = _clip_gradient(observation, max_norm, per_layer)
    return _add_noise(clipped, key, noise, std, name)

  return Defense(apply, name, part=part)


def _num_pruned(ratio: float, size: int) -> int:
  # ⌊ratio · n⌋ of the product rounded to 9 decimals first: 0.29 · 100 = 28.999999999999996 gives 29.
  return min(size, math.floor(round(ratio * size, 9)))


def _zero_smallest(flat, k: int):
  """flat with its k entries of smallest |·| set to 0; ties: the lower index is pruned first."""
  if k == 0:
    return flat
  order = jnp.argsort(jnp.abs(flat), stable=True)
  return flat.at[order[:k]].set(0)


@functools.partial(jax.jit, static_argnames=("ratio", "per_layer"))
def _prune_leaves(leaves, *, ratio, per_layer):
  if per_layer:
    return [jnp.reshape(_zero_smallest(jnp.ravel(g), _num_pruned(ratio, jnp.size(g))), jnp.shape(g))
           for g in leaves]
  flat = jnp.concatenate([jnp.ravel(_wide(g)) for g in leaves])
  flat = _zero_smallest(flat, _num_pruned(ratio, flat.size))
  parts = jnp.split(flat, np.cumsum([jnp.size(g) for g in leaves])[:-1])
  return [jnp.asarray(jnp.reshape(p, jnp.shape(g)), jnp.result_type(g)) for p, g in zip(parts, leaves)]


def prune(ratio: float, per_layer: bool = True) -> Defense:
  """Magnitude pruning (sparsification): zero the k = ⌊ratio · n_l⌋ entries of smallest |g| of each leaf.

  DLG (Zhu et al. 2019, §5) prunes per layer and reports pruning above ~20 % defending LeNet; against
  an attack that knows the pruning it does not (``experiments/studies/dlg_defenses``). Ties are broken
  by position: among equal |g| the entry with the lower row-major (C-order) index is pruned first, so exactly
  k entries are zeroed (entries already 0 count among them). ``ratio`` ∈ [0, 1); ratio 0 is the identity.
  ``per_layer=False`` ranks all entries of the tree together (n = total size; ties by position in the
  concatenation of the leaves in ``jax.tree.leaves`` order, i.e. sorted keys). The product ratio · n is
  rounded to 9 decimals before the floor, so 0.29 · 100 prunes 29, not 28. Deterministic.
  """
  ratio = _number(ratio, "prune ratio", high=1.0)
  per_layer = _flag(per_layer, "prune per_layer")
  part = Part("prune", (ratio,), () if per_layer else ("global",))
  return Defense(lambda observation, key=None: _transform(observation, _prune_leaves, ratio=ratio,
                                                          per_layer=per_layer), part.spec, part=part)


_CAST_DTYPES = {"float16": jnp.float16, "fp16": jnp.float16, "half": jnp.float16,
                "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}


def cast(dtype: str = "float16") -> Defense:
  """Low-precision round trip g → dtype → original dtype.

  ``dtype``: ``"float16"`` (``"fp16"``, ``"half"``) or ``"bfloat16"`` (``"bf16"``), or the jnp dtype.
  Rounds to the nearest representable value, ties to even (XLA's conversion). DLG (Zhu et al. 2019,
  §5): half precision does not defend. float16 overflows to ±inf above 65504 in magnitude, as a real
  float16 transmission would, and flushes below its subnormal range to 0; bfloat16 keeps float32's range
  with 8 significant bits. Deterministic.
  """
  key = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
  if key not in _CAST_DTYPES:
    raise ValueError(f"cast dtype must be float16 or bfloat16, got {dtype!r}")
  low = _CAST_DTYPES[key]
  part = Part("fp16" if low == jnp.float16 else "bf16")
  return Defense(lambda observation, key=None: _transform(observation, _cast_leaves, dtype=low),
                 part.spec, part=part)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _cast_leaves(leaves, *, dtype):
  return [g.astype(dtype).astype(jnp.result_type(g)) for g in leaves]


@functools.partial(jax.jit, static_argnames=("per_layer",))
def _quantize_leaves(leaves, *, per_layer):
  wide = [_wide(g) for g in leaves]
  if per_layer:
    scales = [jnp.max(jnp.abs(w)) / 127 if w.size else 0.0 for w in wide]
  else:
    tops = [jnp.max(jnp.abs(w)) for w in wide if w.size]
    top = jnp.max(jnp.stack(tops)) if tops else 0.0
    scales = [top / 127] * len(wide)
  out = []
  for g, w, s in zip(leaves, wide, scales):
    safe = jnp.where(s > 0, s, 1.0)  # s = 0 only for an all-zero leaf: q = 0, output 0
    q = jnp.clip(jnp.round(w / safe), -127, 127)
    out.append(jnp.asarray(q * s, jnp.result_type(g)))
  return out


def quantize_int8(per_layer: bool = True) -> Defense:
  """Symmetric int8 round trip: s = max|g_l| / 127, q = clip(round(g / s), −127, 127), g ← s · q.

  ``round`` is to nearest, ties to even (``jnp.round``); q takes at most 255 values, the error is at most
  s / 2 per entry and the largest |g| is kept exactly (up to rounding of s · 127). An all-zero leaf stays
  zero. ``per_layer=False`` uses one scale s = max over the whole tree / 127. Scales are computed in at
  least float32. DLG (Zhu et al. 2019, §5): int8 defends. Deterministic.
  """
  per_layer = _flag(per_layer, "int8 per_layer")
  part = Part("int8", (), () if per_layer else ("global",))
  return Defense(lambda observation, key=None: _transform(observation, _quantize_leaves,
                                                          per_layer=per_layer), part.spec, part=part)


def chain(*defenses: Defense) -> Defense:
  """Applies ``defenses`` in order: their parts (a chain's own parts, :func:`identity` left out),
  part i with ``jax.random.split(key, n)[i]`` of the n parts; a chain of one part is that part.

  Order matters: ``chain(clip(1.0), gaussian_noise(1e-4))`` clips then adds noise (the result can exceed
  the norm C), the reverse clips the noisy gradient. With ``key=None`` every defense gets ``None`` (fine
  when all are deterministic). Its name: the parts' names joined by commas (``"none"`` if none is
  left), so that :func:`parse` of it rebuilds the chain, keys included.
  """
  for d in defenses:
    if not isinstance(d, Defense):
      raise TypeError(f"chain takes Defense objects, got {type(d).__name__}")
  parts = tuple(p for d in defenses for p in (d.parts or (d,)) if p.name != "none")
  if not parts:
    return identity()
  if len(parts) == 1:
    return parts[0]

  def apply(observation, key=None):
    keys = [None] * len(parts) if key is None else list(jax.random.split(key, len(parts)))
    for d, k in zip(parts, keys):
      observation = d.apply(observation, k)
    return observation

  return Defense(apply, ",".join(p.name for p in parts), parts)


NOISY = ("gaussian", "laplacian", "dp")  # the heads of parts that add noise: no recomputation matches


def check(defense: Defense, name: str = "defense") -> None:
  """TypeError unless ``defense`` is a :class:`Defense` (a spec is :func:`parse`'s to read),
  naming the argument ``name``."""
  if not isinstance(defense, Defense):
    raise TypeError(f"{name} is a gradjax.defenses.Defense (defenses.parse(spec)), got "
                    f"{type(defense).__name__}")


def parts(defense: Defense) -> tuple[Part, ...]:
  """The :class:`Part` of each defense ``defense`` applies, in order (none for :func:`identity`).
  A defense built elsewhere (``Defense(apply, name)``) is read by its name: the parts of
  :func:`parse` of it where it is a spec, else one part whose head is the name."""
  found = []
  for d in defense.parts or (defense,):
    if d.part is not None:
      found.append(d.part)
      continue
    try:
      found.extend(parts(parse(d.name)))
    except ValueError:  # a name of its own
      found.append(Part(d.name))
  return tuple(p for p in found if p.head != "none")


# --- command line ---------------------------------------------------------------------------------


class Form(NamedTuple):
  """One entry of :data:`DEFENSES`: the spec forms it accepts and a builder from the spec's fields."""

  usage: str
  build: Callable[[list[str]], Defense]


def _options(fields: list[str], allowed: set[str], usage: str) -> set[str]:
  opts = set(fields)
  if len(opts) != len(fields) or not opts <= allowed:
    raise ValueError(f"bad options {fields} (use {usage})")
  return opts


def _args(fields, count, usage):
  if len(fields) < count:
    raise ValueError(f"missing arguments (use {usage})")
  return fields[:count], fields[count:]


def _build_noise(fn, usage):
  def build(fields):
    (v,), rest = _args(fields, 1, usage)
    _options(rest, set(), usage)
    return fn(v)
  return build


def _build_clip(fields):
  usage = DEFENSES["clip"].usage
  (c,), rest = _args(fields, 1, usage)
  return clip(c, per_layer="global" not in _options(rest, {"global"}, usage))


def _build_dp(fields):
  usage = DEFENSES["dp"].usage
  (c, z), rest = _args(fields, 2, usage)
  opts = _options(rest, {"global", "gaussian", "laplacian"}, usage)
  if {"gaussian", "laplacian"} <= opts:
    raise ValueError(f"choose one noise (use {usage})")
  return dp(c, z, per_layer="global" not in opts, noise="laplacian" if "laplacian" in opts else "gaussian")


def _build_prune(fields):
  usage = DEFENSES["prune"].usage
  (r,), rest = _args(fields, 1, usage)
  return prune(r, per_layer="global" not in _options(rest, {"global"}, usage))


def _build_fixed(make, usage, allowed=frozenset()):
  def build(fields):
    return make(_options(fields, set(allowed), usage))
  return build


# The command-line registry: spec head -> Form. parse() also accepts the _ALIASES heads.
DEFENSES: dict[str, Form] = {
    "none": Form("none", _build_fixed(lambda o: identity(), "none")),
    "gaussian": Form("gaussian:VARIANCE", _build_noise(gaussian_noise, "gaussian:VARIANCE")),
    "laplacian": Form("laplacian:VARIANCE", _build_noise(laplacian_noise, "laplacian:VARIANCE")),
    "clip": Form("clip:MAX_NORM[:global]", _build_clip),
    "dp": Form("dp:MAX_NORM:NOISE_MULTIPLIER[:laplacian][:global]", _build_dp),
    "prune": Form("prune:RATIO[:global]", _build_prune),
    "fp16": Form("fp16", _build_fixed(lambda o: cast("float16"), "fp16")),
    "bf16": Form("bf16", _build_fixed(lambda o: cast("bfloat16"), "bf16")),
    "int8": Form("int8[:global]", _build_fixed(lambda o: quantize_int8("global" not in o),
                                               "int8[:global]", {"global"})),
}
_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "gauss": "gaussian",
            "laplace": "laplacian", "identity": "none"}


def _valid_forms() -> str:
  return ", ".join(f.usage for f in DEFENSES.values())


def parse(spec: str) -> Defense:
  """The defense of a command-line spec; comma-separated specs give a :func:`chain`.

  Forms (fields separated by ":"): ``none``, ``gaussian:VARIANCE``, ``laplacian:VARIANCE``,
  ``clip:MAX_NORM[:global]``, ``dp:MAX_NORM:NOISE_MULTIPLIER[:laplacian][:global]``,
  ``prune:RATIO[:global]``, ``fp16``, ``bf16``, ``int8[:global]``; e.g. ``"clip:1.0,gaussian:1e-4"``.
  Names are case-insensitive; ``float16``/``half`` and ``bfloat16`` are accepted for fp16 / bf16.
  Raises ``ValueError`` (one line, listing the valid forms) on an unknown name or a bad argument.
  """
  if not isinstance(spec, str):
    raise TypeError(f"parse takes a defense spec string, got {type(spec).__name__}")
  if not spec.strip():
    raise ValueError(f"empty defense spec; valid forms: {_valid_forms()}")
  parts = [p.strip() for p in spec.split(",")]
  if len(parts) > 1 and any(p.split(":")[0].strip().lower() == "none" for p in parts):
    raise ValueError(f"'none' is no defense to combine in {spec!r} (several specs are a table's: "
                     "defense-sweep --defenses separates them with ';')")
  defenses = []
  for part in parts:
    fields = [f.strip() for f in part.split(":")]
    head = fields[0].lower()
    head = _ALIASES.get(head, head)
    if head not in DEFENSES:
      raise ValueError(f"unknown defense {fields[0]!r} in {spec!r}; valid forms: {_valid_forms()}")
    rest = [f.lower() for f in fields[1:]]
    try:
      defenses.append(DEFENSES[head].build(rest))
    except ValueError as e:
      raise ValueError(f"bad defense {part!r}: {e}; valid forms: {_valid_forms()}") from None
  return defenses[0] if len(defenses) == 1 else chain(*defenses)

