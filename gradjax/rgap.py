"""R-GAP through ReLU layers: one example's input, layer by layer, from its gradient.

A chain of layers z_l = A_l(a_{l−1}; W_l) + b_l, a_l = relu(z_l) (A_l a convolution or a dense
product, a_0 the input), then a dense head z = a_L W + b, trained on one example with the cross
entropy. The head's gradient gives its input a_L = ∂L/∂W[:, c] / ∂L/∂b_c and the error
e = ∂L/∂b = p − y (the label is the one negative entry). Going down the chain with
δ_l = ∂L/∂z_l known (δ_L = [a_L > 0] ⊙ W e), every layer's input solves a linear system:

* ∂L/∂W_l = ∂/∂W ⟨δ_l, A_l(a_{l−1}; W)⟩, linear in a_{l−1}: one equation per weight;
* where a_l > 0 the unit is active and z_l = a_l: A_l(a_{l−1}; W_l) = a_l − b_l, one equation per
  active unit;

solved by least squares (each block scaled by its right-hand side's norm; where that leaves some
directions free, under a_{l−1} >= 0 and the constraint below on the inactive units). The active
set of the
recovered a_{l−1} is read off its values: above ten times the largest negative value, the solve's
noise, since a ReLU never outputs a negative number; then δ_{l−1} = [a_{l−1} > 0] ⊙ A_lᵀ δ_l. The
input layer usually has fewer equations than unknowns (DLG's LeNet: 900 weights and the active
half of 3072 units for 3072 pixels; R-GAP's rank condition fails there), so the input is the
solution of the convex problem (τ = 0 where the equations determine it)::

  min_x ‖equations‖² + ‖relu(z_1(x)) on the inactive units‖² / s² + τ TV(x),   lo ≤ x ≤ hi

(the inactive units' pre-activations are at most 0; TV in its isotropic form,
:func:`gradjax.priors.total_variation`), solved by L-BFGS-B in float64.

Reference: Zhu and Blaschko, "R-GAP: Recursive Gradient Attack on Privacy", ICLR 2021 (the
recursion, for one example, and its rank analysis). They invert through the activation's
derivative at the recovered pre-activation; with ReLU that derivative is the active set, which is
what makes each step linear here. The active-set rule, the inactive-unit constraint and the
regularised solve of the first layer are gradjax's.
"""

import functools
from math import prod
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gradjax import compilation, priors
from gradjax.observation import Observation


class Layer(NamedTuple):
  """One layer of the chain, named as in the model's ``params``.

  strides: a convolution's (NHWC input, HWIO kernel), or ``None`` for a dense layer (its input
    flattened). padding: a convolution's ((top, bottom), (left, right)).
  """

  name: str
  strides: tuple[int, int] | None = None
  padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))


class Recursion(NamedTuple):
  """What :func:`rgap` recovered.

  x: (1, *input_shape) the input. label: the example's label.
  activations: the recovered outputs a_1 .. a_L of the chain's layers (a_L the head's input).
  layers: per layer, input first: ``name``, ``unknowns`` (its input's size), ``equations`` (weights
    plus active units), ``rank`` of the system, ``residual`` (its relative residual at the
    solution) and ``active`` (the units of its output read as active).
  """

  x: np.ndarray
  label: int
  layers: list[dict]
  activations: list[np.ndarray]


def _apply(layer: Layer, a, kernel):
  if layer.strides is None:
    return a.reshape(a.shape[0], -1) @ kernel
  return jax.lax.conv_general_dilated(a, kernel, layer.strides, layer.padding,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _active(a: np.ndarray) -> np.ndarray:
  """The units of a recovered ReLU output that are active: above ten times the solve's noise (the
  largest negative value) and above 1e-11 of the largest value (ten times 1e-12 of it)."""
  return a > 10.0 * max(-float(a.min()), 1e-12 * float(a.max()), 0.0)


def _jacobians(layer: Layer, shape, kernel, delta):
  """The two linear maps of one layer's equations, as matrices over its input a (shape ``shape``):
  a -> ∂L/∂W = vjp of the layer in W at a, applied to δ (the weight block), and a -> the layer's
  output before the bias (the unit block). One program per layer and shape (:func:`_jacobians_jit`)."""
  zero = jnp.zeros(shape, kernel.dtype)

  def weight_equations(a):
    return jax.vjp(lambda k: _apply(layer, a, k), kernel)[1](delta)[0].ravel()

  def unit_equations(a):
    return _apply(layer, a, kernel).ravel()

  n = prod(shape)
  return (jax.jacfwd(weight_equations)(zero).reshape(-1, n),
          jax.jacfwd(unit_equations)(zero).reshape(-1, n))


@functools.cache
def _jacobians_jit():
  """:func:`_jacobians` jitted with the optimisation step's compiler options: it runs once, but
  as one forward-mode pass per input unit (3072 for a 32x32x3 image), which code compiled at
  LLVM's level 0 runs several times slower."""
  return jax.jit(_jacobians, static_argnums=(0, 1),
                 compiler_options=compilation.options(compilation.STEP))


def _system(layer: Layer, kernel, bias, shape, delta, kernel_grad, out, active):
  """(matrix, right-hand side, scale of the unit block) of one layer's equations in its input."""
  gw, fw = (np.asarray(m) for m in _jacobians_jit()(layer, tuple(shape), kernel, delta))
  fw = fw[active]
  rhs_w = np.asarray(kernel_grad, np.float64).ravel()
  rhs_f = (np.asarray(out).reshape(-1, np.asarray(bias).size) - np.asarray(bias)).ravel()[active]
  sw, sf = max(np.linalg.norm(rhs_w), 1e-300), max(np.linalg.norm(rhs_f), 1e-300)
  return np.vstack([gw / sw, fw / sf]), np.concatenate([rhs_w / sw, rhs_f / sf]), sf


def _least_squares(matrix: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, int]:
  """The minimum-norm least-squares solution of ``matrix @ a = rhs`` and the matrix's rank (singular
  values below eps · max(m, n) of the largest count as zero, NumPy's rule). LAPACK's complete
  orthogonal factorisation (gelsy) where the system is about square, the SVD (gelsd) where it is
  tall: the same solution and rank, each the faster of the two there."""
  import scipy.linalg  # here, not at the top: scipy is slow to import and most runs never get here
  m, n = matrix.shape
  a, _, rank, _ = scipy.linalg.lstsq(matrix, rhs, cond=np.finfo(np.float64).eps * max(m, n),
                                     lapack_driver="gelsy" if m < 2 * n else "gelsd")
  return a, int(rank)


def _constrained(layer, kernel, bias, matrix, rhs, start, scale, inactive, shape, bounds, tv,
                 iterations):
  """A layer's input from its equations under the box ``bounds``, the inactive units' constraint
  and ``tv`` (the module docstring's convex problem), solved by L-BFGS-B from the least-squares
  solution ``start`` clipped to the box."""
  import scipy.optimize
  lo, hi = (np.broadcast_to(np.asarray(b, np.float64), shape[-1:]) for b in bounds)
  m, r, off = jnp.asarray(matrix), jnp.asarray(rhs), jnp.asarray(inactive.reshape(-1))

  def objective(flat):
    x = flat.reshape(shape)
    z = (_apply(layer, x, kernel) + bias).ravel()
    value = jnp.sum(jnp.square(m @ flat - r)) + jnp.sum(jnp.square(jnp.where(off, jax.nn.relu(z),
                                                                            0.0))) / scale**2
    if not tv or x.ndim != 4 or min(x.shape[1:3]) < 2:  # TV is an image's (N, H, W, C)
      return value
    return value + tv * priors.total_variation(x, form="isotropic")

  # Called up to ``iterations`` times: the optimisation step's compiler options.
  value_and_grad = jax.jit(jax.value_and_grad(objective),
                           compiler_options=compilation.options(compilation.step_options()))
  box = list(zip(np.broadcast_to(lo, shape).ravel(), np.broadcast_to(hi, shape).ravel()))
  solved = scipy.optimize.minimize(
      lambda f: tuple(np.asarray(v, np.float64) for v in value_and_grad(jnp.asarray(f))),
      np.clip(start, [b[0] for b in box], [b[1] for b in box]), jac=True, method="L-BFGS-B",
      bounds=box, options={"maxiter": iterations})
  return solved.x


def rgap(observation: Observation, layers: Sequence[Layer], input_shape, *, bounds=(0.0, 1.0),
         tv: float = 0.03, head: str = "head", iterations: int = 5000) -> Recursion:
  """The input of one example from the gradient of a ReLU chain and a dense head (module
  docstring).

  Args:
    observation: a gradient (or one local step's update: a scaled gradient) of one example.
    layers: the chain from the input up (:class:`Layer`), each followed by a ReLU; the last one's
      output, flattened, is the ``head``'s input.
    input_shape: one example's shape, e.g. (H, W, C).
    bounds: (lo, hi), scalars or per channel: the input's box.
    tv: τ, the weight of total variation in the input layer's problem.
    iterations: L-BFGS-B iterations of that problem.
  """
  if observation.num_samples != 1:
    raise ValueError(f"R-GAP's recursion inverts one example; this update holds "
                     f"{observation.num_samples}")
  params, grads = observation.variables["params"], observation.gradient
  missing = [name for name in (*(l.name for l in layers), head)
             if not isinstance(grads, Mapping) or name not in grads or "bias" not in grads[name]]
  if missing or not layers:
    raise ValueError(f"R-GAP needs a chain of biased layers and a dense head; the model has no "
                     f"biased layer {missing[0] if missing else '(none given)'!r}")
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), params)
    shapes = [(1, *tuple(input_shape))]
    for layer in layers:
      shapes.append(jax.eval_shape(lambda a, k, layer=layer: _apply(layer, a, k), jnp.zeros(shapes[-1]),
                                   p64[layer.name]["kernel"]).shape)
    error = np.asarray(grads[head]["bias"], np.float64)
    c = int(np.argmax(np.abs(error)))
    if error[c] == 0:
      raise ValueError("the head's bias gradient is zero: the update carries nothing to invert")
    out = (np.asarray(grads[head]["kernel"], np.float64)[:, c] / error[c]).reshape(shapes[-1])
    delta_out = (np.asarray(p64[head]["kernel"]) @ error).reshape(shapes[-1])
    report, recovered = [], [out]
    for i in range(len(layers) - 1, -1, -1):
      layer, kernel, bias = layers[i], p64[layers[i].name]["kernel"], p64[layers[i].name]["bias"]
      active = _active(np.asarray(out)).ravel()
      delta = jnp.asarray(delta_out.ravel() * active).reshape(shapes[i + 1])
      matrix, rhs, scale = _system(layer, kernel, bias, shapes[i], delta,
                                   grads[layer.name]["kernel"], out, active)
      a, rank = _least_squares(matrix, rhs)
      if not i:  # the box, the inactive units and, where the equations leave it free, TV
        a = _constrained(layer, kernel, bias, matrix, rhs, a, scale, ~active, shapes[0], bounds,
                         tv if rank < a.size else 0.0, iterations)
      elif rank < a.size:  # a ReLU output: non-negative, and the inactive units' constraint
        a = _constrained(layer, kernel, bias, matrix, rhs, a, scale, ~active, shapes[i],
                         (0.0, np.inf), 0.0, iterations)
      residual = float(np.linalg.norm(matrix @ a - rhs) / max(np.linalg.norm(rhs), 1e-300))
      report.append({"name": layer.name, "unknowns": int(a.size), "equations": int(matrix.shape[0]),
                     "rank": int(rank), "residual": residual, "active": int(active.sum())})
      a = a.reshape(shapes[i])
      if i:
        delta_out = np.asarray(jax.vjp(lambda v: _apply(layer, v, kernel), jnp.asarray(a))[1](delta)[0])
        recovered.append(a)
      out = a
  label = int(np.argmin(error))
  return Recursion(np.asarray(out, np.float32), label, report[::-1],
                   [np.asarray(a, np.float32) for a in recovered[::-1]])
