r"""L-BFGS's inverse-Hessian product as a few matrix products: no loop over the history.

``optax.scale_by_lbfgs`` computes the L-BFGS direction with the two-loop recursion (Nocedal & Wright,
"Numerical Optimization", 2nd ed., Algorithm 7.4): two ``lax.scan`` of ``memory_size`` steps, each
reading one stored pair (s_i, y_i) at a traced index. Under ``vmap`` over restarts that index is
batched, every read becomes a gather, and the loop runs as ``2 m`` dependent steps: vmapped restarts
of DLG ran slower per restart than the same restarts one after another, where Adam, which has no
such loop, gains from ``vmap`` (``python -m benchmarks suite``, linesearch section).

:func:`scale_by_lbfgs` is a drop-in replacement with the same state updates, the same
preconditioner and the same result up to rounding, written with dense products. With the stored
pairs in time order (oldest first; empty slots have s = y = 0 and ρ = 0), ρ_i = 1 / (y_i · s_i) and
γ the identity scale, the two loops are two triangular systems::

  first loop   α_i = ρ_i s_i · (g − Σ_{j>i} α_j y_j)        ⇔  (I + diag(ρ) U) α = diag(ρ) S g
  middle       r₀ = γ (g − Yᵀ α)
  second loop  β_i = ρ_i y_i · (r₀ + Σ_{j<i} (α_j − β_j) s_j) ⇔  (I + diag(ρ) L) β = diag(ρ) (Y r₀ + L α)
  direction    H g = r₀ + Sᵀ (α − β)

with S, Y (m × n) the stacked pairs, U_ij = s_i · y_j for j > i (strictly upper) and L_ij = y_i · s_j
for j < i (strictly lower), both read from the Gram matrix G_ij = s_i · y_j that the state keeps up to
date (one row and one column per iteration: 2 m n flops). The triangular matrices have a unit
diagonal, so empty slots (ρ = 0) need no special case. This is the two-loop recursion written as
forward substitution; Byrd, Nocedal & Schnabel ("Representations of quasi-Newton matrices and their
use in limited memory methods", Math. Programming 63, 1994) derive the related compact form.

Cost per iteration: about 6 m n flops in matrix-vector products plus O(m²) for the solves, against
4 m n in 2 m sequential steps for the recursion; on accelerators and under vmap the products win.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByLBFGSState(NamedTuple):
  """State of :func:`scale_by_lbfgs`: optax's fields (``count``, ``params``, ``updates``, the
  circular ``diff_params_memory`` / ``diff_updates_memory`` of (m, ...) leaves, ``weights_memory``
  ρ), ``gram`` (m, m), ``gram[i, j] = s_i · y_j`` for the slots i, j of the buffers, and
  ``identity_scale`` γ of the newest stored pair. ``count`` counts the stored pairs (plus the first
  call): a pair skipped by the curvature test leaves it unchanged."""

  count: jax.Array
  params: optax.Params
  updates: optax.Updates
  diff_params_memory: optax.Updates
  diff_updates_memory: optax.Updates
  weights_memory: jax.Array
  gram: jax.Array
  identity_scale: jax.Array


def _stacked_dots(stacked, trees) -> jax.Array:
  """(m, k) dot products of each slot of ``stacked`` (leaves (m, ...)) with each of ``trees`` (k
  trees shaped like one slot): one pass over the stacked buffers for all k."""
  leaves = [jax.tree.leaves(t) for t in trees]
  parts = []
  for i, a in enumerate(jax.tree.leaves(stacked)):
    b = jnp.stack([t[i] for t in leaves], axis=-1).reshape(-1, len(trees))
    parts.append(a.reshape(a.shape[0], -1) @ b.astype(a.dtype))
  return sum(parts[1:], parts[0])


def _combine(coefficients, stacked):
  """Σ_i coefficients[i] · slot i of ``stacked``: a tree shaped like one slot."""
  return jax.tree.map(lambda a: jnp.tensordot(coefficients.astype(a.dtype), a, axes=1), stacked)


class _Memory(NamedTuple):
  """The stored pairs after this call's pair enters slot ``slot``, read from the buffers of before.

  Every product below reads ``old`` (the state's buffers) and patches slot ``slot`` with ``new``, so
  the buffers' only other use is the one ``.at[slot].set`` that becomes the next state: in a step
  that donates its state and compiles with :data:`gradjax.compilation.STEP` (``BATCHED_STEP`` under
  ``vmap``) XLA updates them in place. Products with the updated buffers made XLA:CPU copy every
  (m, ...) buffer several times per call.
  """

  old: optax.Updates   # leaves (m, ...)
  new: optax.Updates   # shaped like one slot
  slot: jax.Array

  def dots(self, *trees) -> jax.Array:
    """(m, k) dot products of each stored vector with each of ``trees``."""
    out = _stacked_dots(self.old, trees)
    fresh = jnp.stack([optax.tree.vdot(self.new, t) for t in trees]).astype(out.dtype)
    return out.at[self.slot].set(fresh)

  def combine(self, coefficients):
    """Σ_i coefficients[i] v_i over the stored vectors v_i."""
    old_slot = jax.tree.map(lambda a: a[self.slot], self.old)
    patch = optax.tree.scale(coefficients[self.slot], optax.tree.sub(self.new, old_slot))
    return optax.tree.add(_combine(coefficients, self.old), patch)

  def stored(self):
    """The buffers with the new vector in its slot (the next state's)."""
    return jax.tree.map(lambda a, b: a.at[self.slot].set(b), self.old, self.new)


def precondition(updates, s_g, s_memory: _Memory, y_memory: _Memory, weights_memory, gram,
                 identity_scale, memory_idx):
  """H g for the stored pairs (see the module docstring); ``s_g`` (m,) holds s_i · g by slot and
  ``memory_idx`` is the oldest slot."""
  m = weights_memory.shape[0]
  order = (memory_idx + jnp.arange(m)) % m             # slots, oldest first
  rho = weights_memory[order]
  g_ = gram[order][:, order]                           # g_[i, j] = s_i · y_j in time order
  upper = jnp.triu(g_, 1)
  lower = jnp.tril(g_.T, -1)                           # lower[i, j] = y_i · s_j, j < i
  eye = jnp.eye(m, dtype=g_.dtype)
  s_g = s_g[order]
  alpha = jax.scipy.linalg.solve_triangular(eye + rho[:, None] * upper, rho * s_g, lower=False,
                                            unit_diagonal=True)
  alpha_slots = jnp.zeros_like(alpha).at[order].set(alpha)
  q = optax.tree.add_scale(updates, -1.0, y_memory.combine(alpha_slots))
  r0 = optax.tree.scale(identity_scale, q)
  y_r = y_memory.dots(r0)[order, 0]
  beta = jax.scipy.linalg.solve_triangular(eye + rho[:, None] * lower, rho * (y_r + lower @ alpha),
                                           lower=True, unit_diagonal=True)
  diff = jnp.zeros_like(alpha).at[order].set(alpha - beta)
  return optax.tree.cast_like(optax.tree.add(r0, s_memory.combine(diff)), updates)


def scale_by_lbfgs(memory_size: int = 10, scale_init_precond: bool = True,
                   min_curvature: float | None = None) -> optax.GradientTransformation:
  """``optax.scale_by_lbfgs`` with the direction from :func:`precondition` (dense products).

  Same arguments and semantics: the pair (s, y) = (params − previous params, updates − previous
  updates) enters the memory at every call after the first, ρ = 1 / (y · s) (0 where y · s = 0),
  and γ = (s · y) / (y · y) of the newest pair (min(1, 1 / ‖g‖) at the first call) when
  ``scale_init_precond``, else 1. Real parameters only.

  ``min_curvature``: a pair enters the memory only if s · y > min_curvature; otherwise the direction
  uses the memory (and γ) as they were. PyTorch's ``torch.optim.LBFGS`` does this with 1e-10: without
  a line search that enforces the Wolfe conditions, a pair of negative curvature would make the
  inverse-Hessian estimate indefinite and the next step an ascent of unbounded length. ``None``
  (optax's behaviour) stores every finite pair; a pair with a non-finite s · y (a diverged run)
  is skipped in either case, where optax would store it and every later direction would be NaN.
  """
  if memory_size < 1:
    raise ValueError("memory_size must be >= 1")

  def init_fn(params):
    stacked = jax.tree.map(lambda leaf: jnp.zeros((memory_size, *leaf.shape), leaf.dtype), params)
    dtype = jnp.result_type(*jax.tree.leaves(params)) if jax.tree.leaves(params) else jnp.float32
    return ScaleByLBFGSState(
        count=jnp.zeros((), jnp.int32), params=optax.tree.zeros_like(params),
        updates=optax.tree.zeros_like(params), diff_params_memory=stacked,
        diff_updates_memory=stacked, weights_memory=jnp.zeros(memory_size, dtype),
        gram=jnp.zeros((memory_size, memory_size), dtype), identity_scale=jnp.ones((), dtype))

  def update_fn(updates, state, params):
    slot = (state.count - 1) % memory_size              # where the newest pair goes
    first = state.count == 0
    s = optax.tree.sub(params, state.params)
    y = optax.tree.sub(updates, state.updates)
    s_y = optax.tree.vdot(y, s)
    y_y = optax.tree.norm(y, squared=True)
    weight = jnp.where(s_y == 0.0, 0.0, 1.0 / s_y)
    s, y, weight = jax.tree.map(lambda a: jnp.where(first, jnp.zeros_like(a), a), (s, y, weight))
    # A non-finite pair (s · y is NaN or inf: a restart that diverged) never enters the memory.
    keep = first | (jnp.isfinite(s_y) if min_curvature is None else s_y > min_curvature)
    # A skipped pair: its slot keeps what it held and the recursion reads the memory in the order
    # of the last stored pair, so the direction is the one of the memory as it was.
    s, y = (jax.tree.map(lambda new, old: jnp.where(keep, new, old[slot]), v, buffer)
            for v, buffer in ((s, state.diff_params_memory), (y, state.diff_updates_memory)))
    weight = jnp.where(keep, weight, state.weights_memory[slot])
    memory_idx = jnp.where(keep, state.count, state.count - 1) % memory_size  # the oldest slot
    s_memory = _Memory(state.diff_params_memory, s, slot)
    y_memory = _Memory(state.diff_updates_memory, y, slot)
    weights_memory = state.weights_memory.at[slot].set(weight.astype(state.weights_memory.dtype))
    # Row ``slot``: s · y_j for every stored y; column ``slot``: s_i · y.
    row = y_memory.dots(s)[:, 0].astype(state.gram.dtype)
    s_dots = s_memory.dots(y, updates)          # one pass over the s buffers: s_i · y and s_i · g
    col = s_dots[:, 0].astype(state.gram.dtype)
    gram = state.gram.at[slot, :].set(row).at[:, slot].set(col)
    if scale_init_precond:
      identity_scale = jnp.where(y_y > 0.0, s_y / y_y, 1.0)  # the first call's is replaced below
      identity_scale = jnp.where(keep, identity_scale, state.identity_scale)
      capped = jnp.minimum(1.0, 1.0 / optax.tree.norm(jax.lax.stop_gradient(updates)))
      identity_scale = jnp.where(first, capped, identity_scale).astype(state.identity_scale.dtype)
    else:
      identity_scale = jnp.ones_like(state.identity_scale)
    direction = precondition(updates, s_dots[:, 1], s_memory, y_memory, weights_memory, gram,
                             identity_scale, memory_idx)
    return direction, ScaleByLBFGSState(
        count=jnp.where(keep, optax.safe_increment(state.count), state.count), params=params,
        updates=updates, diff_params_memory=s_memory.stored(), diff_updates_memory=y_memory.stored(),
        weights_memory=weights_memory, gram=gram, identity_scale=identity_scale)

  return optax.GradientTransformation(init_fn, update_fn)


def links(learning_rate: float | None = None, memory_size: int = 10, scale_init_precond: bool = True,
          min_curvature: float | None = None) -> tuple[optax.GradientTransformation, ...]:
  """The transformations L-BFGS chains before its line search: the direction
  (:func:`scale_by_lbfgs`), then −``learning_rate`` (−1 if None)."""
  scaling = optax.scale(-1.0) if learning_rate is None else optax.scale_by_learning_rate(learning_rate)
  return scale_by_lbfgs(memory_size, scale_init_precond, min_curvature), scaling


def lbfgs(learning_rate: float | None = None, memory_size: int = 10, scale_init_precond: bool = True,
          linesearch: optax.GradientTransformation | None = None,
          min_curvature: float | None = None) -> optax.GradientTransformation:
  """``optax.lbfgs`` with :func:`scale_by_lbfgs`: :func:`links`, then ``linesearch`` (none if
  None), chained as optax chains them."""
  return optax.chain(*links(learning_rate, memory_size, scale_init_precond, min_curvature),
                     optax.identity() if linesearch is None else linesearch)
