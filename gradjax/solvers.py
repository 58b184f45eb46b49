"""One restart's solver: optax-driven optimisation of dummy data with best-iterate tracking and
divergence isolation.

A solver minimises ``value_fn(params, data, step) -> scalar`` over ``params`` (the dummy data) for
fixed ``data`` (what the attacker observed). The loop body is one pure ``step(state, data) -> state``;
the restart driver (:mod:`gradjax.driver`) runs many of them, in jitted chunks.

Iteration counting. One iteration here is one optax update. With L-BFGS that is one search direction
plus a zoom line search (usually one or two objective evaluations); PyTorch's ``LBFGS.step()`` instead
runs up to 20 inner iterations with a fixed step and no line search, so "300 outer steps" of the DLG
code can be up to 6000 of its iterations. :class:`SolverState` counts both iterations and objective
evaluations (one evaluation = one value-and-gradient of ``value_fn``) so budgets can be compared.

Divergence. A restart whose objective or iterate becomes NaN/inf is frozen at its last finite state
and flagged ``alive=False``; other restarts continue. A restart whose best loss reaches ``tol`` is
frozen too (converged). A frozen restart's L-BFGS line search is handed a flat problem (zero
gradient, objective 0) and ends at its first trial, so under ``vmap`` the live restarts never wait
on a search that runs to its cap on NaN.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gradjax import linesearch, optimizers

PyTree = Any


class SolverState(NamedTuple):
  """State of one restart. Scalars become (R,) arrays when restarts are stacked."""

  params: PyTree
  opt_state: PyTree
  best_params: PyTree
  best_loss: jax.Array      # lowest objective seen (inf before the first evaluation)
  iterations: jax.Array     # optimizer updates taken
  evaluations: jax.Array    # value-and-gradient evaluations of the objective
  alive: jax.Array          # False once the objective or the iterate went non-finite


class Solver(NamedTuple):
  """Pure functions of one restart: ``init(params, data)``, ``step(state, data)``, ``finalize``, and
  ``tol``: a restart whose best objective reaches it is frozen, and :func:`gradjax.driver.run` stops once every
  live restart has (``None``: never); ``track_from``: the first iteration whose iterate can be the
  best, or a function of the solver's data giving it (:func:`make_solver`); ``projected``: whether
  every iterate is projected (``project``).

  ``advance(state, data, n)``, where the optimizer's line search can be run one trial at a time
  (L-BFGS with :func:`gradjax.linesearch.chained`; None otherwise): ``n`` iterations (``n`` may be
  traced) as one loop whose every trip makes one trial, one evaluation of the objective, the same
  iterates as ``n`` steps (a restart frozen or ended keeps its optimizer state, which ``step`` runs
  on unread). Under ``vmap`` each restart then searches on its own: a loop of ``n``
  steps, each with its line search's loop inside, makes at every step as many trials as the
  restart that needs most (the batched loop runs until every restart's search ends), so K restarts
  pay the sum over steps of the most trials; this loop pays the most trials of a restart over the
  steps (64 DLG clients on LeNet, 2000 iterations: 2.04 trials an iteration against 1.10 for the
  busiest client and 1.07 on average; ``experiments/studies/speed_cpu``)."""

  init: Callable[[PyTree, PyTree], SolverState]
  step: Callable[[SolverState, PyTree], SolverState]
  finalize: Callable[[SolverState, PyTree], SolverState]
  tol: float | None = None
  track_from: int | Callable[[PyTree], Any] = 0
  projected: bool = False
  advance: Callable[[SolverState, PyTree, Any], SolverState] | None = None


def tracks_from(solver: Solver, data) -> Any:
  """``solver.track_from`` for the solver's ``data`` (an int, or an int scalar read from ``data``)."""
  return solver.track_from(data) if callable(solver.track_from) else solver.track_from


def scores_by_step(solver: Solver, state: SolverState, data) -> bool:
  """Whether one more ``step`` of the finished ``state`` (one restart's or stacked) scores its final
  iterate as ``solver.finalize`` would (:func:`from_step`), so that the driver runs the program it
  compiled for the steps instead of compiling another evaluation of the objective. A step's first
  act is to evaluate the objective at the iterate it starts from and keep it where it is the best;
  it does so for live restarts not frozen by ``tol`` and past ``track_from``, ``finalize`` for every
  live one. So: where no line search stored the value there (``finalize`` then reads it) and every
  restart is live, unfrozen and past ``track_from`` (read from the state: a few scalars a restart;
  ``data``: the solver's, where ``track_from`` reads it)."""
  if optimizers.stores_value(state.opt_state):
    return False
  threshold = -np.inf if solver.tol is None else solver.tol
  return bool(np.all(np.asarray(state.alive)) and np.all(np.asarray(state.best_loss) > threshold)
              and np.all(np.asarray(state.iterations) >= np.asarray(tracks_from(solver, data))))


def scores_stored(solver: Solver, state: SolverState) -> bool:
  """Whether ``solver.finalize`` reads the final iterate's objective from the line search's store
  (an L-BFGS state, no projection): :func:`finalize_stored` then does what it does on the host."""
  return optimizers.stores_value(state.opt_state) and not solver.projected


def finalize_stored(state: SolverState) -> SolverState:
  """``finalize`` of a host (NumPy) ``state``, one restart's or stacked, where the line search stored
  the final iterate's objective (:func:`scores_stored`): the iterate becomes the best where it is
  live, finite and lower, with no evaluation, so nothing is compiled for it."""
  value = np.asarray(optax.tree.get(state.opt_state, "value"))
  best_loss = np.asarray(state.best_loss)
  improved = np.asarray(state.alive) & np.isfinite(value) & (value < best_loss)

  def select(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.where(improved.reshape(improved.shape + (1,) * (a.ndim - improved.ndim)), a, b)

  return state._replace(best_params=jax.tree.map(select, state.params, state.best_params),
                        best_loss=np.where(improved, value, best_loss))


def from_step(state: SolverState, stepped: SolverState) -> SolverState:
  """``state`` finished: its best and evaluation count from ``stepped`` (one more ``step`` of it,
  which scored ``state.params``), the rest as it was (:func:`scores_by_step` says when)."""
  return state._replace(best_params=stepped.best_params, best_loss=stepped.best_loss,
                        evaluations=stepped.evaluations)


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _select(pred, on_true, on_false):
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _flat_unless(live, value_and_grad):
  """The function whose value and gradient are ``value_and_grad(params)`` where ``live``; elsewhere
  the constant 0 with a zero gradient, free of any NaN that the function's value or derivatives hold
  there (a ``custom_vjp``: a plain ``jnp.where`` would send a zero cotangent through the function's
  backward pass, and 0 · NaN is NaN)."""

  @jax.custom_vjp
  def flat(params, live):  # the line search differentiates it: this is traced, not evaluated (and
    # where it were, XLA drops the unused gradient of the inlined call)
    return jnp.where(live, value_and_grad(params)[0], 0.0)

  def forward(params, live):
    value, grad = value_and_grad(params)
    return jnp.where(live, value, 0.0), _select(live, grad, optax.tree.zeros_like(grad))

  def backward(grad, cotangent):
    return optax.tree.scale(cotangent, grad), None

  flat.defvjp(forward, backward)
  return lambda params: flat(params, live)


def make_solver(value_fn: Callable[[PyTree, PyTree, jax.Array], jax.Array],
                optimizer: optax.GradientTransformation, *,
                tol: float | None = None,
                project: Callable[[PyTree, PyTree], PyTree] | None = None,
                track_from: int | Callable[[PyTree], jax.Array] = 0,
                independent: bool = True) -> Solver:
  """Builds the step functions minimising ``value_fn(params, data, step)``.

  Args:
    value_fn: scalar objective; ``step`` (int32 scalar, the iteration about to be taken) lets an
      objective schedule its terms (a prior switched on at step T). With L-BFGS the value the line
      search stored at the end of iteration k is reused at iteration k + 1 (and, for the last
      iterate, by ``finalize`` when there is no ``project``).
    optimizer: any optax transformation (:mod:`gradjax.optimizers`). One whose state holds a zoom
      line search's value and gradient (:func:`gradjax.optimizers.stores_value`: gradjax's and optax's
      L-BFGS) is handed them, so each step evaluates the objective only in its line search.
    tol: a restart stops (is frozen) once its best objective is <= tol; None never stops early.
    project: optional ``project(params, data)`` applied to the iterate after every update (e.g. a box
      constraint) and to the initial iterate.
    track_from: the best iterate is the lowest objective among iterations >= ``track_from`` (and the
      final one): for objectives whose terms change over the run (a growing set of matched layers),
      whose early values are not comparable with the late ones; or ``track_from(data)``, an int
      scalar read from the data (so that one program serves every value: a budget's).
    independent: whether each run's objective reads its own iterate alone. An objective that
      reduces over the vmapped runs (group consistency's consensus) must see them at the same
      iteration, so its solver has no ``advance`` (whose runs search at their own pace).
  """
  tx = optax.with_extra_args_support(optimizer)
  threshold = -jnp.inf if tol is None else tol
  # Jitted, so the objective and its gradient are traced once and the trace reused wherever they
  # are evaluated (the first evaluation in ``init``, the line search inside ``step``).
  value_and_grad = jax.jit(jax.value_and_grad(value_fn))

  def init(params, data):
    if project is not None:
      params = project(params, data)
    opt_state = tx.init(params)
    evaluations = jnp.zeros((), jnp.int32)
    if optimizers.stores_value(opt_state):
      # Seed the line search's stored value and gradient so every step can read them without a
      # lax.cond (which under vmap would evaluate the objective a second time).
      value, grad = value_and_grad(params, data, jnp.zeros((), jnp.int32))
      opt_state = optax.tree.set(opt_state, value=value, grad=grad)
      evaluations += 1
    inf = jnp.asarray(jnp.inf, jax.tree.leaves(params)[0].dtype)
    return SolverState(params, opt_state, params, inf, jnp.zeros((), jnp.int32), evaluations,
                       jnp.ones((), bool))

  def is_active(state):  # neither ended nor frozen by ``tol``
    return state.alive & (state.best_loss > threshold)

  def searched_start(state):
    """What a step with a line search starts from: the stored value and gradient at the iterate,
    whether the restart is live, and the flat problem's where it is not (see ``step``)."""
    active = is_active(state)
    value, grad = optax.tree.get(state.opt_state, "value"), optax.tree.get(state.opt_state, "grad")
    # A frozen restart (converged, diverged, or about to be found so) is handed a flat problem: a
    # zero gradient, so a zero direction, on an objective that is 0 everywhere. Its line search
    # then accepts the first trial: under vmap the search runs until every restart's ends, and
    # one restart searching on NaN to the cap made all of them pay the cap at every iteration.
    live = active & jnp.isfinite(value) & _all_finite(grad)
    value_ls = jnp.where(live, value, 0.0).astype(value.dtype)
    grad_ls = _select(live, grad, optax.tree.zeros_like(grad))
    return active, value, grad, live, value_ls, grad_ls

  def advanced(state, data, active, value, grad, updates, opt_state, used):
    """The state after an update: the iterate moved (and projected), the best and the counts kept,
    a restart that went non-finite stalled, a frozen one left as it was. ``value``, ``grad``: the
    objective at ``state.params``."""
    params = optax.apply_updates(state.params, updates)
    if project is not None:
      params = project(params, data)
    searched = optimizers.stores_value(state.opt_state)
    if searched:
      used = optax.tree.get(opt_state, "num_linesearch_steps").astype(jnp.int32)
    # ``value`` is the objective at ``state.params`` (before this update), ``grad`` its gradient.
    value_ok = jnp.isfinite(value)
    improved = value_ok & (value < state.best_loss) & (
        state.iterations >= (track_from(data) if callable(track_from) else track_from))
    best_params = _select(improved, state.params, state.best_params)
    best_loss = jnp.where(improved, value, state.best_loss)
    # A non-finite gradient at a finite value ends the restart too: its line search was handed the
    # flat problem, whose value 0 it would store as the next iterate's.
    alive = state.alive & value_ok & _all_finite(grad) & _all_finite(params)
    moved = SolverState(params, opt_state, best_params, best_loss, state.iterations + 1,
                        state.evaluations + used, alive)
    # A restart that just went non-finite keeps its last finite iterate and best so far.
    stalled = state._replace(best_params=best_params, best_loss=best_loss, alive=alive)
    new = _select(active, _select(alive, moved, stalled), state)
    # The optimizer state is taken as advanced even for a restart that is frozen (converged or
    # diverged), whose state is never read again: selecting it would copy every buffer each step
    # (L-BFGS's history is (m, ...) per restart), which under vmap on CPU cost more than the step.
    # Only the line search's value and gradient at the iterate are kept (finalize reads them).
    if searched:
      opt_state = optax.tree.set(
          opt_state, value=jnp.where(active, optax.tree.get(opt_state, "value"), value),
          grad=_select(active, optax.tree.get(opt_state, "grad"), grad))
    return new._replace(opt_state=opt_state)

  def step(state, data):
    at = lambda params: value_and_grad(params, data, state.iterations)
    if optimizers.stores_value(state.opt_state):
      active, value, grad, live, value_ls, grad_ls = searched_start(state)
      updates, opt_state = tx.update(grad_ls, state.opt_state, state.params, value=value_ls,
                                     grad=grad_ls, value_fn=_flat_unless(live, at))
      return advanced(state, data, active, value, grad, updates, opt_state, None)
    active = is_active(state)
    value, grad = at(state.params)
    updates, opt_state = tx.update(grad, state.opt_state, state.params, value=value, grad=grad,
                                   value_fn=functools.partial(value_fn, data=data,
                                                              step=state.iterations))
    return advanced(state, data, active, value, grad, updates, opt_state, jnp.ones((), jnp.int32))

  def advance(state, data, n):
    """``n`` iterations (``n`` may be traced) as one loop whose every trip makes one line-search
    trial, one objective evaluation; see :class:`Solver`."""
    links, pieces = split

    def trip(carry):
      state, t, taken = carry
      at = lambda params: value_and_grad(params, data, state.iterations)
      active, value, grad, live, value_ls, grad_ls = searched_start(state)
      # The direction, from the iteration's state: recomputed at each of its trials (the same
      # each time, and cheaper to make than to carry L-BFGS's history in the loop).
      direction, states = grad_ls, []
      for link, link_state in zip(links, state.opt_state[:-1]):
        direction, link_state = link.update(direction, link_state, state.params)
        states.append(link_state)
      fresh = pieces.search.start(state.params, direction, value_ls, grad_ls)
      t = optax.tree.where(pieces.search.over(t), fresh, t)  # the last search ended: a new one
      t = pieces.search.trial(t, jax.value_and_grad(_flat_unless(live, at)), state.params,
                              direction, pieces.guess(state.opt_state[-1]))
      over = pieces.search.over(t)
      updates, search_state = pieces.finish(t, direction, state.opt_state[-1])
      after = advanced(state, data, active, value, grad, updates, (*states, search_state), None)
      return _select(over, after, state), t, taken + over.astype(taken.dtype)

    def going(carry):
      state, t, taken = carry
      return (taken < n) & (~pieces.search.over(t) | is_active(state))

    # A search marked over (its fields only give the loop's shapes): the first trip starts one.
    _, _, _, _, value_ls, grad_ls = searched_start(state)
    ended = pieces.search.start(state.params, grad_ls, value_ls, grad_ls)._replace(
        done=jnp.ones((), bool))
    return jax.lax.while_loop(going, trip, (state, ended, jnp.zeros((), jnp.int32)))[0]

  def finalize(state, data):
    """Scores the final iterate too, so the best covers every point the run reached. With L-BFGS
    and no projection, the line search's value there (as ``step`` reads it); otherwise one more
    evaluation (a projected iterate is not the point the search evaluated)."""
    if optimizers.stores_value(state.opt_state) and project is None:
      value, evaluated = optax.tree.get(state.opt_state, "value"), 0
    else:
      value, evaluated = value_fn(state.params, data, state.iterations), 1
    improved = state.alive & jnp.isfinite(value) & (value < state.best_loss)
    return state._replace(best_params=_select(improved, state.params, state.best_params),
                          best_loss=jnp.where(improved, value, state.best_loss),
                          evaluations=state.evaluations + evaluated)

  split = linesearch.pieces_of(optimizer) if independent else None
  return Solver(init, step, finalize, tol, track_from, project is not None,
                None if split is None else advance)
