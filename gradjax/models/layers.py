"""Small shared pieces of the model zoo."""

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

ACTIVATIONS: dict[str, Callable] = {
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jax.nn.tanh,
    "gelu": jax.nn.gelu,
    "leaky_relu": jax.nn.leaky_relu,
    "elu": jax.nn.elu,
    "softplus": jax.nn.softplus,
}


def activation(name: str) -> Callable:
  """The ``jax.nn`` activation called ``name``."""
  try:
    return ACTIVATIONS[name]
  except KeyError:
    raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}") from None


def batch_norm(train: bool, param_dtype) -> nn.BatchNorm:
  """BatchNorm with PyTorch's momentum and epsilon and the exact (two-pass) variance.

  ``use_fast_variance=False`` matters here: E[x^2] - E[x]^2 loses precision and its second derivative
  misleads gradient matching.
  """
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                      use_fast_variance=False, param_dtype=param_dtype, dtype=param_dtype)


def head(num_classes: int, inits, param_dtype) -> nn.Dense:
  """The zoo's last layer: a Dense named ``"head"`` (label inference and analytic recovery find it
  by that name)."""
  return nn.Dense(num_classes, name="head", param_dtype=param_dtype, dtype=param_dtype,
                  **inits._asdict())


# --- convolution implementations ---------------------------------------------------------------

CONVS = ("auto", "xla", "im2col", "split", "mixed")

# Flax's dimension numbers for NHWC inputs and HWIO kernels (lhs, rhs and out specs).
_NHWC_HWIO = jax.lax.ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1),
                                          out_spec=(0, 3, 1, 2))


def im2col_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
                dimension_numbers=None, feature_group_count: int = 1, precision=None,
                preferred_element_type=None):
  """``jax.lax.conv_general_dilated`` for 2-D NHWC/HWIO convolutions, as patches times a matrix.

  ``lhs``: (N, H, W, C); ``rhs``: (kh, kw, C, O); returns (N, Ho, Wo, O) with
  ``Ho = (H + pad_top + pad_bottom - kh) // stride_h + 1`` (likewise ``Wo``)::

    out[n, i, j, o] = sum_{a, b, c} x_pad[n, s_h i + a, s_w j + b, c] rhs[a, b, c, o]

  computed as ``P @ rhs.reshape(kh kw C, O)`` where ``P`` (N Ho Wo, kh kw C) holds the patches, built
  from ``kw`` strided column slices of the padded input, concatenated on channels, then ``kh``
  strided row slices of that, concatenated again (2 (kh + kw) slices in all, not kh kw).

  Why: the gradient-matching objective differentiates a convolution twice. XLA:CPU compiles the
  resulting transposed and dilated convolutions (input and weight gradients of a strided
  convolution, with batch and feature dimensions swapped) far slower than plain ones, while slices,
  pads and matrix products are cheap: the matching step runs 2-3x faster this way on CPU (the
  ``other conv`` column of ``experiments/benchmark.py``'s step table, in RESULTS.md). The price: the
  patches take kh kw times the input's memory, and a plain forward+backward of a wide network can
  be slower. On GPUs and TPUs the native convolution is the better choice. The result equals
  ``lax.conv_general_dilated`` up to floating-point summation order.

  Other cases (dilation, grouped convolutions, other layouts or ranks) go to
  ``jax.lax.conv_general_dilated`` unchanged, so this is a drop-in ``conv_general_dilated`` for
  ``flax.linen.Conv``.
  """
  native = (lhs.ndim != 4 or feature_group_count != 1
            or any(d != 1 for d in (lhs_dilation or ())) or any(d != 1 for d in (rhs_dilation or ()))
            or jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) != _NHWC_HWIO)
  if native:
    return jax.lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        precision=precision, preferred_element_type=preferred_element_type)
  n, h, w, c = lhs.shape
  kh, kw, _, out = rhs.shape
  sh, sw = window_strides
  if isinstance(padding, str):
    padding = jax.lax.padtype_to_pads((h, w), (kh, kw), (sh, sw), padding)
  (top, bottom), (left, right) = padding
  ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
  x = jax.lax.pad(lhs, jnp.zeros((), lhs.dtype),
                  ((0, 0, 0), (top, bottom, 0), (left, right, 0), (0, 0, 0)))
  if kh == kw == 1:
    patches = x[:, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, :]
  else:
    cols = jnp.concatenate([x[:, :, b:b + sw * (wo - 1) + 1:sw, :] for b in range(kw)], axis=-1)
    patches = jnp.concatenate([cols[:, a:a + sh * (ho - 1) + 1:sh] for a in range(kh)], axis=-1)
  y = jnp.matmul(patches.reshape(n * ho * wo, kh * kw * c), rhs.reshape(kh * kw * c, out),
                 precision=precision, preferred_element_type=preferred_element_type)
  return y.reshape(n, ho, wo, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _split(lhs, rhs, spec):
  return jax.lax.conv_general_dilated(lhs, rhs, **dict(spec))


def _split_fwd(lhs, rhs, spec):
  return _split(lhs, rhs, spec), (lhs, rhs)


def _split_bwd(spec, residuals, cotangent):
  lhs, rhs = residuals
  conv = functools.partial(jax.lax.conv_general_dilated, **dict(spec))
  lhs_grad, = jax.linear_transpose(lambda x: conv(x, rhs), lhs)(cotangent)
  return lhs_grad, _weight_gradient(lhs, cotangent, spec, jax.ShapeDtypeStruct(rhs.shape, rhs.dtype))


_split.defvjp(_split_fwd, _split_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _weight_gradient(lhs, cotangent, spec, rhs_like):
  """The kernel gradient of ``conv(lhs, rhs)`` at output cotangent ``cotangent`` (XLA's transposed
  convolution)."""
  conv = functools.partial(jax.lax.conv_general_dilated, **dict(spec))
  grad, = jax.linear_transpose(lambda w: conv(lhs, w), rhs_like)(cotangent)
  return grad


def _weight_gradient_fwd(lhs, cotangent, spec, rhs_like):
  return _weight_gradient(lhs, cotangent, spec, rhs_like), (lhs, cotangent)


def _weight_gradient_bwd(spec, rhs_like, residuals, c):
  # <dW(x, dy), C> = <conv(x, C), dy>: so d/dy = conv(x, C) and d/dx = conv(., C)'s transpose at dy,
  # both ordinary convolutions (XLA's own derivative of dW w.r.t. x is not).
  lhs, cotangent = residuals
  conv = functools.partial(jax.lax.conv_general_dilated, **dict(spec))
  lhs_grad, = jax.linear_transpose(lambda x: conv(x, c), lhs)(cotangent)
  return lhs_grad, _split(lhs, c, spec)


_weight_gradient.defvjp(_weight_gradient_fwd, _weight_gradient_bwd)


def split_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
               dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
               precision=None, preferred_element_type=None):
  """``jax.lax.conv_general_dilated`` whose second derivatives are ordinary convolutions.

  The value and the first derivatives are XLA's: ``y = conv(x, W)``, ``dx = conv(., W)ᵀ dy`` and
  ``dW = conv(x, .)ᵀ dy``. What changes is the derivative of ``dW`` w.r.t. ``x``, which the
  gradient-matching objective needs (it differentiates the observed weight gradient w.r.t. the dummy
  input): since ``dW`` is bilinear, ``<dW(x, dy), C> = <conv(x, C), dy>`` for any kernel-shaped
  ``C``, so it is ``conv(., C)ᵀ dy`` (an input gradient) and the derivative w.r.t. ``dy`` is
  ``conv(x, C)`` (a forward convolution). XLA's own transpose of the weight-gradient convolution
  runs far slower on XLA:CPU than either (a dilated convolution with batch and
  features swapped). Same arguments as ``jax.lax.conv_general_dilated``; differentiable in reverse
  mode to any order, not in forward mode (``jax.custom_vjp``).
  """
  spec = dict(window_strides=tuple(window_strides),
              padding=padding if isinstance(padding, str) else tuple(map(tuple, padding)),
              lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
              rhs_dilation=None if rhs_dilation is None else tuple(rhs_dilation),
              dimension_numbers=jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers),
              feature_group_count=feature_group_count, batch_group_count=batch_group_count,
              precision=precision, preferred_element_type=preferred_element_type)
  return _split(lhs, rhs, tuple(sorted(spec.items())))


def mixed_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
               dimension_numbers=None, feature_group_count: int = 1, precision=None,
               preferred_element_type=None):
  """:func:`split_conv` for a convolution with a large output and enough input channels,
  :func:`im2col_conv` otherwise, chosen per call from the shapes.

  Split when the kernel is larger than 1x1, the input has at least 16 channels and the output at
  least 256 positions per example (16x16): there XLA:CPU's own convolutions beat patches times a
  matrix in the matching step, while im2col wins on small maps, few channels and 1x1 kernels
  (``experiments/benchmark.py --sections=convs`` measures both per layer shape; RESULTS.md).
  """
  kwargs = dict(lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
                precision=precision, preferred_element_type=preferred_element_type)
  numbers = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  if lhs.ndim == 4 and numbers == _NHWC_HWIO:
    _, h, w, c = lhs.shape
    kh, kw = rhs.shape[:2]
    pads = (jax.lax.padtype_to_pads((h, w), (kh, kw), window_strides, padding)
            if isinstance(padding, str) else padding)
    ho, wo = ((size + sum(pad) - k) // stride + 1
              for size, pad, k, stride in zip((h, w), pads, (kh, kw), window_strides))
    if kh * kw > 1 and c >= 16 and ho * wo >= 256:
      return split_conv(lhs, rhs, window_strides, padding, **kwargs)
  return im2col_conv(lhs, rhs, window_strides, padding, **kwargs)


def resolve_conv(conv: str) -> str:
  """``"auto"`` -> ``"mixed"`` on CPU, ``"xla"`` on accelerators; other names are checked and kept."""
  if conv not in CONVS:
    raise ValueError(f"unknown convolution implementation {conv!r}; choose one of {', '.join(CONVS)}")
  if conv == "auto":
    return "mixed" if jax.default_backend() == "cpu" else "xla"
  return conv


def conv_general_dilated(conv: str):
  """The ``conv_general_dilated`` argument of ``flax.linen.Conv`` for implementation ``conv``
  (``None``: Flax's default, ``jax.lax.conv_general_dilated``)."""
  return {"im2col": im2col_conv, "split": split_conv, "mixed": mixed_conv}.get(resolve_conv(conv))
