r"""Zoom line search (strong Wolfe) with one objective evaluation per trial step.

The search is Algorithms 3.5 (bracketing) and 3.6 (zoom) of Nocedal & Wright, "Numerical
Optimization" (2nd ed., 2006), with the approximate sufficient decrease of Hager & Zhang
("Algorithm 851: CG_DESCENT", ACM TOMS 32, 2006, eq. 23), as ``optax.scale_by_zoom_linesearch``
runs it: same criteria, trial steps, interval updates and fallback, hence the same steps.

What differs is the loop body. optax's body is ``lax.cond(interval found, zoom, bracket)`` and both
branches evaluate the objective, so the objective is compiled twice into every L-BFGS program, and
under ``vmap`` (restarts), where a batched ``cond`` runs both branches, every trial costs two
evaluations. Here the body first computes the trial step from the state (the extrapolated step
while bracketing, the interpolated one while zooming: scalar arithmetic), evaluates once, then
updates the state as either phase would and selects by phase.

Along the direction u from w with value f₀ and slope f₀' = ∇f(w) · u < 0, a trial step η with value
f(η) and slope f'(η) = ∇f(w + ηu) · u is accepted when both errors are ≤ ``tol``:

  decrease   min(f(η) − f₀ − c₁ η f₀',  max(f'(η) − (2c₁ − 1) f₀',  f(η) − f₀ − ε |f₀|))
  curvature  |f'(η)| − c₂ |f₀'|

(each clipped at 0, NaN read as +inf), c₁ = ``slope_rtol``, c₂ = ``curv_rtol``, ε =
``approx_dec_rtol`` (None: Armijo's decrease alone). Bracketing doubles the step (``increase_factor``)
from the guess until the interval [low, high] holds an acceptable step; zooming takes the minimiser of
the cubic through (low, f, f'), (high, f) and the previous endpoint, else of the quadratic through
(low, f, f'), (high, f), else the midpoint. After ``max_linesearch_steps`` trials, or once the
interval is shorter than ``stepsize_precision`` with a decreasing step known, the search ends on the
lowest step that satisfied the decrease criterion (the last trial if none did).
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

# The transformation's state and diagnostics are optax's, so code that reads ``value``, ``grad``
# or ``num_linesearch_steps`` from an L-BFGS state (optax.tree.get) reads them from either search.
ScaleByZoomLinesearchState = optax.ScaleByZoomLinesearchState
ZoomLinesearchInfo = optax.ZoomLinesearchInfo


class _Trial(NamedTuple):
  """The search's state after a trial: the trial itself, the bracket and the best decreasing step."""

  count: jax.Array            # trials made
  stepsize: jax.Array         # the last trial η and its value, gradient and slope
  value: jax.Array
  grad: optax.Updates
  slope: jax.Array
  decrease_error: jax.Array
  curvature_error: jax.Array
  interval_found: jax.Array   # bracketing is over, zooming has begun
  done: jax.Array             # the last trial is accepted
  failed: jax.Array           # out of trials or interval: the fallback step is taken
  low: jax.Array              # the bracket's endpoints (low has the lower value) ...
  value_low: jax.Array
  slope_low: jax.Array
  high: jax.Array
  value_high: jax.Array
  slope_high: jax.Array
  cubic_ref: jax.Array        # ... and the third point of the cubic interpolation
  value_cubic_ref: jax.Array
  safe_stepsize: jax.Array    # the lowest step so far with sufficient decrease (0: none)
  safe_value: jax.Array
  safe_grad: optax.Updates
  value_init: jax.Array       # f₀ and f₀' at the search's start
  slope_init: jax.Array


class Search(NamedTuple):
  """The search in pieces, so that a caller can advance it one trial at a time: ``start(params,
  updates, value, grad)`` the state before the first trial (``value``, ``grad`` at ``params``;
  ``updates`` the direction u), ``trial(t, value_and_grad_fn, params, updates, guess)`` one trial
  (one evaluation of ``value_and_grad_fn`` at params + η u), ``over(t)`` whether it ended (accepted,
  or the fallback taken). :func:`zoom_linesearch`'s search is ``trial`` until ``over``."""

  start: Callable
  trial: Callable
  over: Callable


class Pieces(NamedTuple):
  """A zoom line search transformation's parts (:func:`scale_by_zoom_linesearch`): its
  :class:`Search`, ``guess(state)`` the first trial step and ``finish(t, updates, state)`` the
  updates scaled by the accepted step and the transformation's new state."""

  search: Search
  guess: Callable
  finish: Callable


class _Pieced(optax.GradientTransformationExtraArgs):
  """An optax transformation (a NamedTuple of ``init`` and ``update``, for optax) that also carries
  the parts it is made of: ``pieces`` (:class:`Pieces`), and for :func:`chained` ``links``, the
  transformations before the search. A wrapper optax puts around it drops them; the transformation
  itself is unchanged."""


def _real_dtype(params):
  """The real dtype of ``params``' first leaf (float32 for complex64): the search's scalars."""
  return jnp.real(jnp.empty((), jax.tree.leaves(params)[0].dtype)).dtype


def cubic_minimiser(a, fa, fpa, b, fb, c, fc):
  """Critical point a + (−B + √(B² − 3AC)) / (3A) of the cubic A(x−a)³ + B(x−a)² + C(x−a) + D through
  (a, fa), (b, fb), (c, fc) with slope ``fpa`` at a (NaN where it has none)."""
  db, dc = b - a, c - a
  rb, rc = fb - fa - fpa * db, fc - fa - fpa * dc
  denominator = (db * dc) ** 2 * (db - dc)
  cubic = (dc**2 * rb - db**2 * rc) / denominator
  square = (-(dc**3) * rb + db**3 * rc) / denominator
  return a + (-square + jnp.sqrt(square * square - 3.0 * cubic * fpa)) / (3.0 * cubic)


def quadratic_minimiser(a, fa, fpa, b, fb):
  """Critical point a − fpa / (2B) of the quadratic B(x−a)² + fpa (x−a) + fa through (b, fb)."""
  db = b - a
  return a - fpa / (2.0 * (fb - fa - fpa * db) / db**2)


def zoom_linesearch(max_linesearch_steps: int, *, max_learning_rate: float | None = None,
                    tol: float = 0.0, increase_factor: float = 2.0, slope_rtol: float = 1e-4,
                    curv_rtol: float = 0.9, approx_dec_rtol: float | None = 1e-6,
                    stepsize_precision: float = 1e-5) -> Search:
  """The search as :class:`Search`'s pieces (see the module docstring for the arguments' meaning);
  :func:`run_search` runs them to the end."""

  def errors(stepsize, value, slope, value_init, slope_init):
    decrease = value - value_init - slope_rtol * stepsize * slope_init
    if approx_dec_rtol is not None:
      approximate = jnp.maximum(slope - (2 * slope_rtol - 1.0) * slope_init,
                                value - value_init - approx_dec_rtol * jnp.abs(value_init))
      decrease = jnp.minimum(approximate, decrease)
    curvature = jnp.abs(slope) - curv_rtol * jnp.abs(slope_init)
    clip = lambda e: jnp.where(jnp.isnan(e), jnp.inf, jnp.maximum(e, 0.0))
    return clip(decrease), clip(curvature)

  def bracket_trial(t, guess):
    """Algorithm 3.5's next step: the guess first, then ``increase_factor`` × the last one."""
    stepsize = jnp.where(t.count == 0, guess, increase_factor * t.stepsize)
    return stepsize if max_learning_rate is None else jnp.minimum(stepsize, max_learning_rate)

  def zoom_trial(t):
    """Algorithm 3.6's next step inside [low, high]: cubic, else quadratic, else bisection."""
    width = jnp.abs(t.high - t.low)
    left, right = jnp.minimum(t.high, t.low), jnp.maximum(t.high, t.low)
    cubic = cubic_minimiser(t.low, t.value_low, t.slope_low, t.high, t.value_high, t.cubic_ref,
                            t.value_cubic_ref)
    use_cubic = (cubic > left + 0.2 * width) & (cubic < right - 0.2 * width)
    quadratic = quadratic_minimiser(t.low, t.value_low, t.slope_low, t.high, t.value_high)
    use_quadratic = ~use_cubic & (quadratic > left + 0.1 * width) & (quadratic < right - 0.1 * width)
    return jnp.where(use_cubic, cubic,
                     jnp.where(use_quadratic, quadratic, (t.low + t.high) / 2.0))

  def after_bracket(t, stepsize, value, grad, slope, decrease, curvature):
    """Algorithm 3.5's update once the trial is evaluated."""
    error, last = jnp.maximum(decrease, curvature), t.count + 1 >= max_linesearch_steps
    reached_max = jnp.zeros((), bool) if max_learning_rate is None else stepsize >= max_learning_rate
    safe = decrease <= tol
    to_high = (decrease > 0.0) | ((value >= t.value) & (t.count > 0))
    to_low = (slope >= 0.0) & ~to_high
    # The interval is [previous, trial] unless the trial's slope turned upward first.
    low, value_low, slope_low, high, value_high, slope_high = jax.tree.map(
        lambda new, old: jnp.where(to_low, new, old),
        (stepsize, value, slope, t.stepsize, t.value, t.slope),
        (t.stepsize, t.value, t.slope, stepsize, value, slope))
    found = to_high | to_low | (error <= tol)
    # At the largest step allowed without an interval, curvature cannot be met: take that step.
    done = (error <= tol) | (reached_max & ~found)
    return _Trial(t.count + 1, stepsize, value, grad, slope, decrease, curvature, found,
                  done, last & ~done, low, value_low, slope_low, high, value_high, slope_high,
                  low, value_low, jnp.where(safe, stepsize, t.safe_stepsize),
                  jnp.where(safe, value, t.safe_value),
                  optax.tree.where(safe, grad, t.safe_grad), t.value_init, t.slope_init)

  def after_zoom(t, stepsize, value, grad, slope, decrease, curvature):
    """Algorithm 3.6's update once the trial is evaluated."""
    error, last = jnp.maximum(decrease, curvature), t.count + 1 >= max_linesearch_steps
    safer = (decrease <= tol) & (value < t.safe_value)
    safe_stepsize = jnp.where(safer, stepsize, t.safe_stepsize)
    done = error <= tol
    to_high = (decrease > 0.0) | (value >= t.value_low)
    low_to_high = (slope * (t.high - t.low) >= 0.0) & ~to_high
    pick = lambda c, new, old: jnp.where(c, new, old)
    high = pick(low_to_high, t.low, pick(to_high, stepsize, t.high))
    value_high = pick(low_to_high, t.value_low, pick(to_high, value, t.value_high))
    slope_high = pick(low_to_high, t.slope_low, pick(to_high, slope, t.slope_high))
    moved_high = to_high | low_to_high
    too_small = jnp.abs(t.high - t.low) <= stepsize_precision
    failed = (last | (too_small & (safe_stepsize > 0.0))) & ~done
    return _Trial(t.count + 1, stepsize, value, grad, slope, decrease, curvature, t.interval_found,
                  done, failed,
                  pick(to_high, t.low, stepsize), pick(to_high, t.value_low, value),
                  pick(to_high, t.slope_low, slope), high, value_high, slope_high,
                  pick(moved_high, t.high, t.low), pick(moved_high, t.value_high, t.value_low),
                  safe_stepsize, jnp.where(safer, value, t.safe_value),
                  optax.tree.where(safer, grad, t.safe_grad), t.value_init, t.slope_init)

  def fallback(t):
    """The step taken on failure: the best decreasing one, or the last trial if none (or if the
    last trial left the objective's domain, where the safe step, possibly 0, is kept)."""
    safe = (t.safe_stepsize > 0.0) | jnp.isinf(t.decrease_error)
    return t._replace(stepsize=jnp.where(safe, t.safe_stepsize, t.stepsize),
                      value=jnp.where(safe, t.safe_value, t.value),
                      grad=optax.tree.where(safe, t.safe_grad, t.grad))

  def start(params, updates, value_init, grad_init):
    real = _real_dtype(params)
    scalar = lambda x: jnp.asarray(x, real)
    value_init = scalar(value_init)
    slope_init = scalar(optax.tree.real(optax.tree.vdot(updates, grad_init)))
    zero, inf = scalar(0.0), scalar(jnp.inf)
    return _Trial(jnp.zeros((), jnp.int32), zero, value_init, grad_init, slope_init, inf, inf,
                  jnp.zeros((), bool), jnp.zeros((), bool), jnp.zeros((), bool),
                  zero, value_init, slope_init, zero, value_init, slope_init, zero, value_init,
                  zero, value_init, grad_init, value_init, slope_init)

  def trial(t, value_and_grad_fn, params, updates, guess):
    scalar = lambda x: jnp.asarray(x, t.stepsize.dtype)
    stepsize = scalar(jnp.where(t.interval_found, zoom_trial(t), bracket_trial(t, guess)))
    value, grad = value_and_grad_fn(optax.tree.add_scale(params, stepsize, updates))
    value = scalar(value)
    slope = scalar(optax.tree.real(optax.tree.vdot(optax.tree.conj(grad), updates)))
    decrease, curvature = errors(stepsize, value, slope, t.value_init, t.slope_init)
    tried = (stepsize, value, grad, slope, decrease, curvature)
    new = optax.tree.where(t.interval_found, after_zoom(t, *tried), after_bracket(t, *tried))
    return optax.tree.where(new.failed, fallback(new), new)

  return Search(start, trial, lambda t: t.done | t.failed)


def run_search(search: Search, value_and_grad_fn, params, updates, value, grad, guess):
  """``search`` from ``params`` along ``updates`` until it is over (a while loop): the final
  :class:`_Trial`, its ``stepsize``, ``value`` and ``grad`` the accepted step's."""
  return jax.lax.while_loop(
      lambda t: ~search.over(t),
      lambda t: search.trial(t, value_and_grad_fn, params, updates, guess),
      search.start(params, updates, value, grad))


# Nine parameters: optax.scale_by_zoom_linesearch's own, so it stays a drop-in replacement.
def scale_by_zoom_linesearch(max_linesearch_steps: int, *, max_learning_rate: float | None = None,
                             tol: float = 0.0, increase_factor: float = 2.0,
                             slope_rtol: float = 1e-4, curv_rtol: float = 0.9,
                             approx_dec_rtol: float | None = 1e-6,
                             stepsize_precision: float = 1e-5,
                             initial_guess_strategy: str = "keep"
                             ) -> optax.GradientTransformationExtraArgs:
  """``optax.scale_by_zoom_linesearch`` with one objective evaluation per trial (module docstring).

  Same arguments, state (:class:`optax.ScaleByZoomLinesearchState`: the accepted step as
  ``learning_rate``, the objective's ``value`` and ``grad`` there, ``info.num_linesearch_steps``)
  and call: ``update(updates, state, params, value=f(params), grad=∇f(params), value_fn=f,
  **extra_args)`` scales ``updates`` by the accepted step, with ``extra_args`` passed to
  ``value_fn``. ``initial_guess_strategy``: ``"one"`` tries step 1 first, ``"keep"`` the last
  accepted step.
  """
  if initial_guess_strategy not in ("one", "keep"):
    raise ValueError(f"unknown initial guess strategy {initial_guess_strategy!r}; choose one or keep")
  search = zoom_linesearch(max_linesearch_steps, max_learning_rate=max_learning_rate, tol=tol,
                           increase_factor=increase_factor, slope_rtol=slope_rtol,
                           curv_rtol=curv_rtol, approx_dec_rtol=approx_dec_rtol,
                           stepsize_precision=stepsize_precision)

  def init_fn(params):
    # Typed as update_fn's output (not weakly typed, as optax's are): a jitted step that takes
    # either state then compiles once.
    real = _real_dtype(params)
    inf = jnp.asarray(jnp.inf, real)
    return ScaleByZoomLinesearchState(
        learning_rate=jnp.asarray(1.0, real), value=inf, grad=optax.tree.zeros_like(params),
        info=ZoomLinesearchInfo(num_linesearch_steps=jnp.zeros((), jnp.int32), decrease_error=inf,
                                curvature_error=inf))

  def guess(state):
    return jnp.ones_like(state.learning_rate) if initial_guess_strategy == "one" else state.learning_rate

  def finish(final, updates, state):
    new = ScaleByZoomLinesearchState(
        learning_rate=final.stepsize, value=final.value, grad=final.grad,
        info=ZoomLinesearchInfo(num_linesearch_steps=final.count,
                                decrease_error=final.decrease_error,
                                curvature_error=final.curvature_error))
    return (optax.tree.scale(final.stepsize, updates),
            optax.tree.cast_like(new, other_tree=state))

  def update_fn(updates, state, params, *, value, grad, value_fn: Callable[..., Any],
                **extra_args):
    value_and_grad_fn = jax.value_and_grad(functools.partial(value_fn, **extra_args))
    final = run_search(search, value_and_grad_fn, params, updates, value, grad, guess(state))
    return finish(final, updates, state)

  tx = _Pieced(init_fn, update_fn)
  tx.pieces = Pieces(search, guess, finish)
  return tx


def chained(links, search: optax.GradientTransformationExtraArgs) -> optax.GradientTransformationExtraArgs:
  """``optax.chain(*links, search)`` (same state: a tuple of the links' states, then the search's),
  carrying ``links`` and the search's :class:`Pieces` where ``search`` is
  :func:`scale_by_zoom_linesearch`'s, so that a solver can run one trial at a time
  (:func:`gradjax.solvers.make_solver`)."""
  tx = _Pieced(*optax.chain(*links, search))
  if hasattr(search, "pieces"):
    tx.links, tx.pieces = tuple(links), search.pieces
  return tx


def pieces_of(tx) -> tuple[tuple, Pieces] | None:
  """(links, :class:`Pieces`) of a :func:`chained` transformation, else None."""
  return (tx.links, tx.pieces) if hasattr(tx, "links") and hasattr(tx, "pieces") else None
