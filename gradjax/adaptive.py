"""Attacks adapted to a declared defense: the objective models what the defense did to the update.

A defense T turns the client's update g into the observed v = T(g) (:mod:`gradjax.defenses`). The
plain attack matches D(g', v), as if v were g; against pruning it then drives the pruned entries of
its dummy gradient g' to 0, against clipping to a rescaled gradient, against noise into the noise.
The adapted attack matches

    D(F(g'), P(F(g')))      with weights w(v)

where F applies to g' the defense's deterministic parts that it can model exactly (clipping with the
declared bound; pruning's mask, read from the zeros of v), P projects onto the set of updates that
the last part maps to v (v itself but for an interval per entry after pruning or rounding: the
dummy is penalised only for leaving that interval), and w weighs each leaf by its share of signal
under declared noise. Each part says what it assumes the attacker knows (:func:`assumptions`); the
server in these threat models knows the defense its clients run (it is part of the protocol).

=================  ==========================================================================
part               adaptation
=================  ==========================================================================
``prune:r``        last part: entries of v that are 0 may hold any value of magnitude up to the
                   smallest kept |v| of their leaf (of the tree, ``:global``), the others are
                   exact; before another deterministic part: F zeroes the dummy where v is 0.
                   Assumes the pruned entries are the zeros of v (r is not needed).
``int8``           straight through (F = identity, v matched as it is): its cells [v − s/2,
                   v + s/2] (s = max|v_l| / 127) as intervals match worse, most entries falling in
                   the cell around 0, which then stops pulling them toward it
                   (experiments/studies/dlg_defenses).
``fp16``, ``bf16`` last part: g lies in v's rounding cell (half-way to its neighbours in that
                   format); before another part: straight through.
``clip:C``         F clips the dummy as the client clipped g (per leaf, or ``:global``): exact.
                   Per leaf at a bound below the leaves' norms the objective is Σ_l 2C²(1 −
                   cos_l), a flat landscape for DLG's L-BFGS (CIFAR-10 image 0 on DLG's LeNet,
                   C = 1: 6.3 dB after 2000 iterations, the objective still falling; ``:global``
                   53.5 dB; measured by hand 2026-12-07): its verdict is inconclusive, not a
                   defense that holds. Inverting Gradients' signed Adam minimises it: the
                   default photo (``gradjax reconstruct``'s) through C = 1 per leaf, 15.5 dB,
                   SSIM 0.67, a leak (residual 0.014, the defense applied to its update;
                   measured by hand 2026-12-07).
``gaussian:v``,    w_l = max(‖v_l‖² − n_l·var, 0) / ‖v_l‖²: a leaf's estimated share of signal,
``laplacian:v``    so leaves the noise drowns stop pulling the dummy (var declared; where it
                   would drown every leaf, each leaf holding energy weighs 1). Parts before the
                   noise are modelled by F only where they are clipping: the noise hides
                   pruning's zeros and rounding's cells. Noise that clipping follows is not
                   weighed: the clipping rescales it by a factor the update does not tell.
``dp:C:z``         clipping (F), then noise of variance (z·C)² (w).
=================  ==========================================================================

The adaptation needs only the observed update, which the distance receives as ``observed`` at run
time: an adapted attack is built once per defense and compiles once for every observation. Where
the defense acted on a multiple of what is matched (a one-step FedAvg update, lr times the
gradient it is matched as), the model runs at the defense's scale (``update_scale``); objectives
that learn the update's scale (DLM, DLM+) leave the parts bound to a scale (clipping, noise,
rounding cells) unmodelled. :func:`assumptions` lists what each part assumes.

Example::

  attack = gradjax.adaptive.adapt(gradjax.presets.dlg(), "prune:0.5")
"""

import dataclasses
import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from gradjax import attacks, defenses, distances

_ROUNDING = {"int8", "fp16", "bf16"}
_NOISE = {"gaussian", "laplacian"}
_LOW = {"fp16": jnp.float16, "bf16": jnp.bfloat16}


class Step(NamedTuple):
  """One step of a defense as it is applied (a ``dp`` part is two: its clipping, then its noise):
  the head, its numbers (a clipping bound, a pruning ratio; a noise's *variance*, which a ``dp``
  part states as a multiplier) and whether it acts over the whole tree (``:global``)."""

  head: str
  numbers: tuple[float, ...]
  whole_tree: bool


def steps(defense: defenses.Defense) -> tuple[Step, ...]:
  """The steps of ``defense`` (its parts, :func:`gradjax.defenses.parts`) in the order it applies
  them."""
  defenses.check(defense)
  found = []
  for p in defenses.parts(defense):
    if p.head == "dp":
      c, z = p.numbers
      noise = "laplacian" if "laplacian" in p.options else "gaussian"
      found += [Step("clip", (c,), p.whole_tree), Step(noise, ((z * c) ** 2,), False)]
    else:
      found.append(Step(p.head, p.numbers, p.whole_tree))
  return tuple(found)


# Objectives that rescale the observed update by a learned factor (DLM's γ, DLM+'s norm): what a
# defense did at a scale (a clipping bound, a noise level, a rounding grid) is not modelled there.
LEARNED_SCALE = ("dlm", "dlm_plus")

_SAYS = {  # role of a part -> what the adapted attack assumes of it
    "clip": "{head}: the bound C = {number:g}{where} (declared); the dummy is clipped the same way",
    "noise": "{head} noise: its variance {number:g} (declared); each leaf weighed by its signal share",
    "unweighed": "{head} noise: not weighed (the clipping after it scales the noise by a factor the "
                 "update does not tell)",
    "mask": "prune: the pruned entries are the zeros of the update",
    "bound": "prune: the pruned entries are the zeros of the update, each smaller than the smallest "
             "kept one{where}",
    "cells": "{head}: the update's values are rounded to the format's grid",
    "straight": "{head}: straight through (matched as it is)",
    "hidden": "{head}: not modelled (the noise after it hides what it did)",
    "unscaled": "{head}: not modelled (the objective learns the update's scale)",
}


def roles(defense: defenses.Defense, objective: str = "gradient") -> list[tuple[Step, str]]:
  """Each step of ``defense`` (:func:`steps`) with how the adapted attack treats it (a key of the
  module's table: clip, noise, unweighed, mask, bound, cells, straight, hidden, unscaled)."""
  ps, found = steps(defense), []
  for i, p in enumerate(ps):
    last, noisy_after = i == len(ps) - 1, any(q.head in _NOISE for q in ps[i + 1:])
    scaled = objective not in LEARNED_SCALE
    if p.head == "prune":
      role = "hidden" if noisy_after else "bound" if last else "mask"
    elif p.head == "clip":
      role = "clip" if scaled else "unscaled"
    elif p.head in _NOISE:
      clipped_after = any(q.head == "clip" for q in ps[i + 1:])
      role = "unscaled" if not scaled else "unweighed" if clipped_after else "noise"
    elif p.head in _ROUNDING:
      if noisy_after:
        role = "hidden"
      elif last and p.head in _LOW:
        role = "cells" if scaled else "unscaled"
      else:
        role = "straight"
    else:
      raise ValueError(f"no adaptation is known for the defense part {p.head!r}")
    found.append((p, role))
  return found


def assumptions(defense: defenses.Defense, objective: str = "gradient") -> list[str]:
  """What the attack adapted to ``defense`` assumes the attacker knows, one line per part."""
  return [_SAYS[role].format(head=p.head, number=p.numbers[0] if p.numbers else 0.0,
                             where=" over the whole update" if p.whole_tree else " per leaf")
          for p, role in roles(defense, objective)]


# --- what each part does to the dummy gradient and where the true one lies ---------------------------


def _mask_zeros(u, v):
  return [jnp.where(b == 0, 0.0, a) for a, b in zip(u, v)]


def _clip(u, v, *, max_norm, whole_tree):
  del v
  return defenses.clip_leaves(u, max_norm, per_layer=not whole_tree)


def _prune_interval(v, *, whole_tree):
  """(lo, hi) per leaf: 0 entries within ± the smallest kept magnitude, the others exact."""
  big = jnp.finfo(jnp.float32).max

  def smallest_kept(leaf):
    a = jnp.abs(leaf)
    return jnp.min(jnp.where(a > 0, a, big))

  tops = [smallest_kept(leaf) for leaf in v]
  if whole_tree:
    tops = [jnp.min(jnp.stack(tops))] * len(v)
  tops = [jnp.where(t < big, t, 0.0) for t in tops]  # an all-zero leaf: nothing kept, no bound known
  lo = [jnp.where(leaf == 0, -t, leaf) for leaf, t in zip(v, tops)]
  hi = [jnp.where(leaf == 0, t, leaf) for leaf, t in zip(v, tops)]
  return lo, hi


def _cast_interval(v, *, low):
  lo, hi = [], []
  for leaf in v:
    x = leaf.astype(low)
    down = jnp.nextafter(x, jnp.asarray(-jnp.inf, low)).astype(leaf.dtype)
    up = jnp.nextafter(x, jnp.asarray(jnp.inf, low)).astype(leaf.dtype)
    lo.append((leaf + down) / 2)
    hi.append((leaf + up) / 2)
  return lo, hi


def _signal_share(v, variance):
  """max(‖v_l‖² − n_l·var, 0) / ‖v_l‖² per leaf: the share of leaf l's energy that is not noise;
  where the declared variance would leave no leaf any (all shares 0: the objective would be 0 for
  every dummy), 1 for every leaf that holds energy."""
  shares, held = [], []
  for leaf in v:
    energy = jnp.sum(jnp.square(leaf))
    shares.append(jnp.where(energy > 0, jnp.maximum(energy - leaf.size * variance, 0.0)
                            / jnp.where(energy > 0, energy, 1.0), 0.0))
    held.append(jnp.where(energy > 0, 1.0, 0.0))
  none = sum(jnp.sum(s) for s in shares) == 0
  return [jnp.where(none, h, s) for s, h in zip(shares, held)]


class _Model(NamedTuple):
  forward: tuple[Callable, ...]         # (u_leaves, v_leaves) -> u_leaves, in order
  interval: Callable | None             # v_leaves -> (lo_leaves, hi_leaves)
  variance: float                       # declared noise variance per entry (summed)


def _model(defense: defenses.Defense, objective: str) -> _Model:
  forward, interval, variance = [], None, 0.0
  for p, role in roles(defense, objective):
    if role == "clip":
      forward.append(functools.partial(_clip, max_norm=p.numbers[0], whole_tree=p.whole_tree))
    elif role == "noise":
      variance += p.numbers[0]
    elif role == "mask":
      forward.append(_mask_zeros)
    elif role == "bound":
      interval = functools.partial(_prune_interval, whole_tree=p.whole_tree)
    elif role == "cells":
      interval = functools.partial(_cast_interval, low=_LOW[p.head])
  return _Model(tuple(forward), interval, variance)


def distance(base: distances.Distance, defense: defenses.Defense, *, update_scale: float = 1.0,
             objective: str = "gradient") -> distances.Distance:
  """``base`` adapted to ``defense``: D(F(g'), P(F(g'))) with the leaves weighted by their signal
  share (module docstring); the same as ``base`` for ``defenses.identity()``.

  ``update_scale``: k where the defense acted on k times what the distance compares (the learning
  rate, when a one-step FedAvg update is matched as the gradient it scales): the model runs on
  k·g' and k·v and compares the results divided by k. ``objective``: the attack's
  (:data:`LEARNED_SCALE` objectives leave the scale-bound parts unmodelled).
  """
  base = distances.as_distance(base)
  defenses.check(defense)
  k = float(update_scale)
  if not (math.isfinite(k) and k > 0):
    raise ValueError(f"update_scale must be a positive finite number, got {update_scale!r}")
  model = _model(defense, objective)

  def adapted(dummy, observed, weights=None, step=0):
    treedef = jax.tree.structure(observed)
    u, v = jax.tree.leaves(dummy), jax.tree.leaves(observed)
    if k != 1.0:  # into the space the defense acted in
      u, v = [k * a for a in u], [k * b for b in v]
    for f in model.forward:
      u = f(u, v)
    target = v
    if model.interval is not None:
      lo, hi = model.interval(v)
      target = [jnp.clip(a, low, high) for a, low, high in zip(u, lo, hi)]
    if model.variance > 0:
      share = jax.tree.unflatten(treedef, _signal_share(v, model.variance))
      weights = share if weights is None else jax.tree.map(jnp.multiply, weights, share)
    if k != 1.0:
      u, target = [a / k for a in u], [b / k for b in target]
    return base(jax.tree.unflatten(treedef, u), jax.tree.unflatten(treedef, target),
                weights=weights, step=step)

  fn = base.fn.func if isinstance(base.fn, functools.partial) else base.fn
  adapted.__name__ = f"{getattr(fn, '__name__', type(fn).__name__)}|{defense.name}"  # in reports
  return distances.Distance(adapted, depth_rule=base.depth_rule, reads_step=True,
                            settled_from=base.settled_from)


@functools.lru_cache(maxsize=None)
def adapt(attack: attacks.Attack, defense_spec: str, update_scale: float = 1.0) -> attacks.Attack:
  """``attack`` with its distance adapted to the defense ``defense_spec`` (a spec of
  :func:`gradjax.defenses.parse`; ``update_scale`` as in :func:`distance`), named
  ``<attack>+adaptive``. Built once per attack, spec and scale, so that runs against the same
  defense share their compiled programs."""
  if not isinstance(defense_spec, str):
    raise TypeError(f"defense_spec is a spec string (gradjax.defenses.parse's), got "
                    f"{type(defense_spec).__name__}")
  defense = defenses.parse(defense_spec)
  return dataclasses.replace(
      attack, distance=distance(attack.distance, defense, update_scale=update_scale,
                                objective=attack.matched.name),
      name=f"{attack.name}+adaptive")
