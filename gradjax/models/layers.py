"""Small shared pieces of the model zoo."""

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
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


def activation(name: str, sharpness=None) -> Callable:
  """The ``jax.nn`` activation called ``name``; with a ``sharpness`` κ (a positive scalar, traced or
  not) ReLU is rounded to softplus_κ(x) = softplus(κx) / κ, which lies within log(2) / κ of it and has
  a second derivative (:func:`smooth_relu`). The other activations are smooth already and stay."""
  try:
    fn = ACTIVATIONS[name]
  except KeyError:
    raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}") from None
  if sharpness is None or name != "relu":
    return fn
  return lambda x: smooth_relu(x, sharpness)


def smooth_relu(x, sharpness):
  """softplus(κx) / κ, κ = ``sharpness``: ReLU as κ → ∞, within log(2) / κ of it everywhere."""
  return jax.nn.softplus(sharpness * x) / sharpness


def max_pool(x, window: int, sharpness=None):
  """``nn.max_pool(x, (window, window), strides=(window, window))`` (valid windows), or with a
  ``sharpness`` κ each window's softmax-weighted mean Σ_i softmax(κ v)_i v_i: the window's mean as
  κ → 0, its maximum as κ → ∞, with a second derivative in between. ``x``: (N, H, W, C) ->
  (N, H // window, W // window, C)."""
  pooled = nn.max_pool(x, (window, window), strides=(window, window))
  if sharpness is None:
    return pooled
  h, w = pooled.shape[1] * window, pooled.shape[2] * window
  x = x[:, :h, :w]
  # Softmax weights relative to each window's maximum, so exp never overflows.
  top = jnp.repeat(jnp.repeat(jax.lax.stop_gradient(pooled), window, 1), window, 2)
  e = jnp.exp(sharpness * (x - top))
  mean = lambda v: nn.avg_pool(v, (window, window), strides=(window, window))
  return mean(e * x) / mean(e)


def batch_norm(train: bool, param_dtype) -> nn.BatchNorm:
  """BatchNorm with PyTorch's momentum and epsilon and the exact (two-pass) variance.

  ``use_fast_variance=False`` matters here: E[x^2] - E[x]^2 loses precision and its second derivative
  misleads gradient matching.
  """
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                      use_fast_variance=False, param_dtype=param_dtype, dtype=param_dtype)


def layer_norm(name: str, param_dtype) -> nn.LayerNorm:
  """PyTorch's LayerNorm (epsilon 1e-5) with the two-pass variance, whose second derivative keeps its
  precision (see :func:`batch_norm`)."""
  return nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name=name, param_dtype=param_dtype,
                      dtype=param_dtype)


def causal_attention(x, heads: int, decode: bool, **kw):
  """Causal multi-head self-attention of ``x`` (N, T, d), the module named ``"attention"``; with
  ``decode``, one position per call from Flax's key/value cache (which masks the positions not yet
  written, so a call of one position takes no mask)."""
  stepping = decode and x.shape[1] == 1
  mask = None if stepping else nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
  return nn.MultiHeadDotProductAttention(num_heads=heads, decode=decode, name="attention", **kw)(
      x, x, mask=mask)


def head(num_classes: int, inits, param_dtype) -> nn.Dense:
  """The zoo's last layer: a Dense named ``"head"`` (label inference and analytic recovery find it
  by that name)."""
  return nn.Dense(num_classes, name="head", param_dtype=param_dtype, dtype=param_dtype,
                  **inits._asdict())


# --- convolution implementations ---------------------------------------------------------------

CONVS = ("auto", "xla", "im2col", "gather", "split", "mixed")

# Flax's dimension numbers for NHWC inputs and HWIO kernels (lhs, rhs and out specs).
_NHWC_HWIO = jax.lax.ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1),
                                          out_spec=(0, 3, 1, 2))


def _explicit_pads(padding, hw, kernel_hw, strides) -> tuple:
  """((before, after), ...) per spatial dimension for ``padding`` ('SAME', 'VALID' or explicit)."""
  if isinstance(padding, str):
    return tuple(jax.lax.padtype_to_pads(hw, kernel_hw, strides, padding))
  return tuple(tuple(p) for p in padding)


# Ten parameters: jax.lax.conv_general_dilated's, so it replaces it unchanged.
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
  pads and matrix products are cheap: the matching step runs faster this way on CPU (the
  ``other conv`` column of ``python -m benchmarks suite``'s step table, ``experiments/studies/speed_cpu``). The price: the
  patches take kh kw times the input's memory, and a plain forward+backward of a wide network can
  be slower. On GPUs and TPUs the native convolution is the better choice. The result equals
  ``lax.conv_general_dilated`` up to floating-point summation order.

  Other cases (dilation, grouped convolutions, other layouts or ranks) go to
  ``jax.lax.conv_general_dilated`` unchanged, so this is a drop-in ``conv_general_dilated`` for
  ``flax.linen.Conv``.
  """
  return _by_patches(_sliced_patches, lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                     dimension_numbers, feature_group_count, precision, preferred_element_type)


def _by_patches(patches_of, lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                dimension_numbers, feature_group_count, precision, preferred_element_type):
  """A plain 2-D NHWC/HWIO convolution as ``patches_of(x_pad, (kh, kw), strides, (Ho, Wo))``
  ((N, Ho, Wo, kh kw C), ordered (a, b, c) as the kernel's (kh, kw, C)) times the kernel; any other
  (dilated, grouped, another layout or rank) by ``jax.lax.conv_general_dilated`` unchanged."""
  if (lhs.ndim != 4 or feature_group_count != 1
      or any(d != 1 for d in (lhs_dilation or ())) or any(d != 1 for d in (rhs_dilation or ()))
      or jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) != _NHWC_HWIO):
    return jax.lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        precision=precision, preferred_element_type=preferred_element_type)
  n, h, w, _ = lhs.shape
  kh, kw, _, out = rhs.shape
  sh, sw = window_strides
  (top, bottom), (left, right) = _explicit_pads(padding, (h, w), (kh, kw), (sh, sw))
  x = jax.lax.pad(lhs, jnp.zeros((), lhs.dtype),
                  ((0, 0, 0), (top, bottom, 0), (left, right, 0), (0, 0, 0)))
  ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
  patches = patches_of(x, (kh, kw), (sh, sw), (ho, wo))
  y = jnp.matmul(patches.reshape(n * ho * wo, -1), rhs.reshape(-1, out),
                 precision=precision, preferred_element_type=preferred_element_type)
  return y.reshape(n, ho, wo, out)


def _sliced_patches(x, kernel_hw, strides, out_hw):
  """im2col's patches: ``kw`` strided column slices concatenated on channels, then ``kh`` strided
  row slices of that."""
  (kh, kw), (sh, sw), (ho, wo) = kernel_hw, strides, out_hw
  if kh == kw == 1:
    return x[:, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, :]
  cols = jnp.concatenate([x[:, :, b:b + sw * (wo - 1) + 1:sw, :] for b in range(kw)], axis=-1)
  return jnp.concatenate([cols[:, a:a + sh * (ho - 1) + 1:sh] for a in range(kh)], axis=-1)


@functools.cache
def _patch_index(hw, kernel_hw, strides, out_hw) -> np.ndarray:
  """(Ho Wo kh kw,) int32: the flat position in the padded (H, W) map of patch (i, j)'s entry (a, b),
  ``(s_h i + a) W + s_w j + b``, in the patches' order (i, j, a, b)."""
  (_, w), (kh, kw), (sh, sw), (ho, wo) = hw, kernel_hw, strides, out_hw
  rows = sh * np.arange(ho)[:, None, None, None] + np.arange(kh)[None, None, :, None]
  cols = sw * np.arange(wo)[None, :, None, None] + np.arange(kw)[None, None, None, :]
  return (rows * w + cols).astype(np.int32).reshape(-1)


# Ten parameters: jax.lax.conv_general_dilated's, so it replaces it unchanged.
def gather_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
                dimension_numbers=None, feature_group_count: int = 1, precision=None,
                preferred_element_type=None):
  """:func:`im2col_conv` with the patches taken by one gather of precomputed positions::

    P[n, (i, j, a, b), c] = x_pad[n, s_h i + a, s_w j + b, c],  out = P (N Ho Wo, kh kw C) @ rhs

  where im2col's 2 (kh + kw) strided slices and their concatenations become one gather, whose
  derivative is one scatter-add (and its derivative a gather again): the gradient-matching
  objective, which differentiates every convolution twice, lowers to fewer operations and compiles
  faster, while a CPU runs it slower (its scatter-add is slow): ``experiments/studies/speed_cpu``.
  ``auto`` does not choose it: it is there to measure the compilation of batched programs on an
  accelerator, where im2col's (several runs vmapped) compiled far longer than one run's. Other cases
  go to ``jax.lax.conv_general_dilated`` unchanged, as for :func:`im2col_conv`."""
  return _by_patches(_gathered_patches, lhs, rhs, window_strides, padding, lhs_dilation,
                     rhs_dilation, dimension_numbers, feature_group_count, precision,
                     preferred_element_type)


def _gathered_patches(x, kernel_hw, strides, out_hw):
  """The patches by one gather of :func:`_patch_index`'s positions."""
  n, hp, wp, c = x.shape
  index = _patch_index((hp, wp), tuple(kernel_hw), tuple(strides), tuple(out_hw))
  patches = x.reshape(n, hp * wp, c).at[:, jnp.asarray(index)].get(mode="promise_in_bounds")
  return patches.reshape(n, *out_hw, -1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _split(lhs, rhs, spec):
  return jax.lax.conv_general_dilated(lhs, rhs, **dict(spec))


def _split_fwd(lhs, rhs, spec):
  return _split(lhs, rhs, spec), (lhs, rhs)


def _split_bwd(spec, residuals, cotangent):
  lhs, rhs = residuals
  return (_input_gradient(cotangent, rhs, spec, _like(lhs)),
          _weight_gradient(lhs, cotangent, spec, _like(rhs)))


_split.defvjp(_split_fwd, _split_bwd)


def _like(a) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _forward_layout(lhs_ndim: int, spec: dict) -> bool:
  """Whether the derivatives of ``conv(lhs, .)`` can be written as convolutions in the forward
  NHWC/HWIO layout: a 2-D convolution without dilation or groups."""
  return (lhs_ndim == 4 and spec["dimension_numbers"] == _NHWC_HWIO
          and spec["feature_group_count"] == 1 and spec["batch_group_count"] == 1
          and all(d == 1 for d in spec["lhs_dilation"] or ())
          and all(d == 1 for d in spec["rhs_dilation"] or ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _input_gradient(cotangent, rhs, spec, lhs_like):
  """The input gradient of ``conv(lhs, rhs)`` at output cotangent ``cotangent``.

  Forward layout: dx = conv(dy dilated by the strides, W flipped in space with its channels swapped)
  with padding (k - 1 - p_before, k - 1 - p_after + r) per side, r = H + p_before + p_after - k -
  s (Ho - 1) the input rows the strided window never reached."""
  s = dict(spec)
  if not _forward_layout(len(lhs_like.shape), s):
    grad, = jax.linear_transpose(lambda x: jax.lax.conv_general_dilated(x, rhs, **s), lhs_like)(cotangent)
    return grad
  kernel_hw = rhs.shape[:2]
  in_hw, out_hw = lhs_like.shape[1:3], cotangent.shape[1:3]
  pads = tuple((k - 1 - before, size + before - stride * (out - 1) - 1)
               for (before, _), k, size, out, stride in zip(
                   _explicit_pads(s["padding"], in_hw, kernel_hw, s["window_strides"]), kernel_hw, in_hw,
                   out_hw, s["window_strides"]))
  grad = jax.lax.conv_general_dilated(
      cotangent, jnp.transpose(jnp.flip(rhs, (0, 1)), (0, 1, 3, 2)), (1, 1), pads,
      lhs_dilation=s["window_strides"], dimension_numbers=("NHWC", "HWIO", "NHWC"),
      precision=s["precision"], preferred_element_type=s["preferred_element_type"])
  return grad.astype(lhs_like.dtype)


def _input_gradient_fwd(cotangent, rhs, spec, lhs_like):
  return _input_gradient(cotangent, rhs, spec, lhs_like), (cotangent, rhs)


def _input_gradient_bwd(spec, lhs_like, residuals, c):
  # <dx(dy, W), C> = <dy, conv(C, W)> = <dW(C, dy), W>.
  cotangent, rhs = residuals
  return _split(c, rhs, spec), _weight_gradient(c, cotangent, spec, _like(rhs))


_input_gradient.defvjp(_input_gradient_fwd, _input_gradient_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _weight_gradient(lhs, cotangent, spec, rhs_like):
  """The kernel gradient of ``conv(lhs, rhs)`` at output cotangent ``cotangent``: by
  :func:`weight_gradient_products` where :func:`weight_gradient_by_products` says so, else by
  :func:`weight_gradient_convolution`."""
  s = dict(spec)
  if not _forward_layout(lhs.ndim, s):
    grad, = jax.linear_transpose(lambda w: jax.lax.conv_general_dilated(lhs, w, **s), rhs_like)(cotangent)
    return grad
  by_products = weight_gradient_by_products(cotangent.shape, lhs.shape[3])
  fn = weight_gradient_products if by_products else weight_gradient_convolution
  return fn(lhs, cotangent, rhs_like.shape[:2], s["window_strides"], s["padding"],
            precision=s["precision"], preferred_element_type=s["preferred_element_type"]).astype(rhs_like.dtype)


def weight_gradient_by_products(out_shape, in_channels: int) -> bool:
  """Whether :func:`weight_gradient_products` computes the kernel gradient of a convolution with
  output (N, Ho, Wo, O) and ``in_channels`` inputs: N Ho Wo >= 4096, C >= 64 and O >= 128. There
  its products run at XLA:CPU's matrix product rate, about twice the convolution form's (ConvNet-64's
  32x32 layers at batch 8); on thinner layers or fewer rows the convolution form is as fast or
  faster (``python -m benchmarks suite --sections=convs``, its weight-gradient table)."""
  n, ho, wo, out = out_shape
  return n * ho * wo >= 4096 and in_channels >= 64 and out >= 128


def weight_gradient_convolution(lhs, cotangent, kernel_hw, strides, padding, **precision):
  """dW (kh, kw, C, O) of a 2-D NHWC/HWIO convolution of ``lhs`` (N, H, W, C) with output
  cotangent ``cotangent`` (N, Ho, Wo, O), as a convolution: x with channels as its batch and the
  batch as its features, by dy dilated by the strides, cut to the kernel's extent::

    dW[a, b, c, o] = sum_{n, i, j} x_pad[n, s_h i + a, s_w j + b, c] dy[n, i, j, o]
  """
  kh, kw = kernel_hw
  grad = jax.lax.conv_general_dilated(
      jnp.transpose(lhs, (3, 1, 2, 0)), jnp.transpose(cotangent, (1, 2, 0, 3)), (1, 1),
      _explicit_pads(padding, lhs.shape[1:3], (kh, kw), strides), rhs_dilation=strides,
      dimension_numbers=("NHWC", "HWIO", "NHWC"), **precision)
  return jnp.transpose(grad[:, :kh, :kw, :], (1, 2, 0, 3))


def weight_gradient_products(lhs, cotangent, kernel_hw, strides, padding, **precision):
  """The same dW as :func:`weight_gradient_convolution`, as kh kw matrix products: for each offset
  (a, b) the window's strided slice of x_pad, (N Ho Wo, C), transposed times dy, (N Ho Wo, O)."""
  kh, kw = kernel_hw
  (sh, sw), (n, ho, wo, out) = strides, cotangent.shape
  (top, bottom), (left, right) = _explicit_pads(padding, lhs.shape[1:3], (kh, kw), strides)
  x = jax.lax.pad(lhs, jnp.zeros((), lhs.dtype), ((0, 0, 0), (top, bottom, 0), (left, right, 0), (0, 0, 0)))
  dy = cotangent.reshape(n * ho * wo, out)
  grad = jnp.stack([
      jax.lax.dot_general(x[:, a:a + sh * (ho - 1) + 1:sh, b:b + sw * (wo - 1) + 1:sw].reshape(-1, x.shape[3]),
                          dy, (((0,), (0,)), ((), ())), **precision)
      for a in range(kh) for b in range(kw)])
  return grad.reshape(kh, kw, lhs.shape[3], out)


def _weight_gradient_fwd(lhs, cotangent, spec, rhs_like):
  return _weight_gradient(lhs, cotangent, spec, rhs_like), (lhs, cotangent)


def _weight_gradient_bwd(spec, rhs_like, residuals, c):
  # <dW(x, dy), C> = <conv(x, C), dy>: so d/dy = conv(x, C) and d/dx = conv(., C)'s transpose at dy,
  # both ordinary convolutions (XLA's own derivative of dW w.r.t. x is not).
  lhs, cotangent = residuals
  return _input_gradient(cotangent, c, spec, _like(lhs)), _split(lhs, c, spec)


_weight_gradient.defvjp(_weight_gradient_fwd, _weight_gradient_bwd)


# Eleven parameters: jax.lax.conv_general_dilated's, so it replaces it unchanged.
def split_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
               dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
               precision=None, preferred_element_type=None):
  """``jax.lax.conv_general_dilated`` whose derivatives, to any order, are ordinary convolutions.

  The value is XLA's ``y = conv(x, W)``. The input gradient ``dx = conv(dy dilated by the strides,
  W flipped with its channels swapped)`` and the weight gradient ``dW = conv(x with batch and
  channels swapped, dy dilated by the strides)`` (on large layers kh kw matrix products instead,
  :func:`weight_gradient_by_products`) are written as forward convolutions in the same NHWC/HWIO
  layout, and so are all their derivatives, since the three maps are bilinear:
  ``<dW(x, dy), C> = <conv(x, C), dy> = <x, dx(dy, C)>``. The gradient-matching objective
  differentiates ``dW`` w.r.t. the dummy input, which XLA's own rules give as a dilated convolution
  with batch and features swapped that XLA:CPU runs far slower; and inside a loop body (a
  ``lax.scan`` of training steps, a line search's ``while_loop``) XLA:CPU leaves even the first
  derivatives in their transposed layouts and compiles them to plain loop nests, tens of times
  slower than at a program's top level. Same arguments as ``jax.lax.conv_general_dilated`` (the
  derivatives take XLA's own rules for dilated, grouped or other-layout convolutions);
  differentiable in reverse mode to any order, not in forward mode (``jax.custom_vjp``).
  """
  spec = dict(window_strides=tuple(window_strides),
              padding=padding if isinstance(padding, str) else tuple(map(tuple, padding)),
              lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
              rhs_dilation=None if rhs_dilation is None else tuple(rhs_dilation),
              dimension_numbers=jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers),
              feature_group_count=feature_group_count, batch_group_count=batch_group_count,
              precision=precision, preferred_element_type=preferred_element_type)
  return _split(lhs, rhs, tuple(sorted(spec.items())))


# Ten parameters: jax.lax.conv_general_dilated's, so it replaces it unchanged.
def mixed_conv(lhs, rhs, window_strides: Sequence[int], padding, lhs_dilation=None, rhs_dilation=None,
               dimension_numbers=None, feature_group_count: int = 1, precision=None,
               preferred_element_type=None):
  """:func:`split_conv` for a convolution with a large output and enough input channels,
  :func:`im2col_conv` otherwise, chosen per call from the shapes.

  Split when the kernel is larger than 1x1, the input has at least 16 channels and the output at
  least 256 positions per example (16x16): there XLA:CPU's own convolutions beat patches times a
  matrix in the matching step, while im2col wins on small maps, few channels and 1x1 kernels
  (``python -m benchmarks suite --sections=convs`` measures both per layer shape; ``experiments/studies/speed_cpu``).
  """
  kwargs = dict(lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
                precision=precision, preferred_element_type=preferred_element_type)
  numbers = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  if lhs.ndim == 4 and numbers == _NHWC_HWIO:
    _, h, w, c = lhs.shape
    kh, kw = rhs.shape[:2]
    pads = _explicit_pads(padding, (h, w), (kh, kw), window_strides)
    ho, wo = ((size + sum(pad) - k) // stride + 1
              for size, pad, k, stride in zip((h, w), pads, (kh, kw), window_strides))
    if kh * kw > 1 and c >= 16 and ho * wo >= 256:
      return split_conv(lhs, rhs, window_strides, padding, **kwargs)
  return im2col_conv(lhs, rhs, window_strides, padding, **kwargs)


def resolve_conv(conv: str, batched: bool = False) -> str:
  """``"auto"`` -> ``"mixed"`` on CPU; on accelerators ``"im2col"`` where ``batched`` (several runs
  vmapped in one program: restarts, label orders or clients), else ``"xla"``. Other names are checked
  and kept.

  Vmapped, the runs' weight-gradient convolutions of the matching step become grouped convolutions,
  slow on a GPU, where im2col makes them batched matrix products (64 DLG restarts on ``lenet_zhu``
  against one, each way: ``experiments/studies/accelerator_h100``, ``gpu_dlg64.md``).
  """
  if conv not in CONVS:
    raise ValueError(f"unknown convolution implementation {conv!r}; choose one of {', '.join(CONVS)}")
  if conv == "auto":
    if jax.default_backend() == "cpu":
      return "mixed"
    return "im2col" if batched else "xla"
  return conv


def conv_general_dilated(conv: str):
  """The ``conv_general_dilated`` argument of ``flax.linen.Conv`` for implementation ``conv``
  (``None``: Flax's default, ``jax.lax.conv_general_dilated``)."""
  return {"im2col": im2col_conv, "gather": gather_conv, "split": split_conv,
          "mixed": mixed_conv}.get(resolve_conv(conv))
