"""Model zoo and registry.

A model, to an attack, is two things: ``apply_fn(variables, x, train=False) -> logits`` and its
``variables`` pytree. :func:`create` builds both from a registry name; attacks never import Flax
classes, so any model that provides the pair plugs in. What some attacks read inside a forward
pass (BatchNorm inputs, the head's features, attention inputs, the layers' order) they read
through :mod:`gradjax.models.taps`, which knows how a Flax linen model calls its modules.

Names::

  lenet_zhu            DLG LeNet (init "uniform" by default)
  lenet5               SAPAG LeNet-5 (init "uniform" by default)
  convnet[-W]          Geiping et al.'s ConvNet, width W (64)
  mlp[-H]              DLM MLP with one hidden layer of H units (32)
  resnetD[-W]          CIFAR ResNet: D = 18, 34 or 6n+2, width factor W (1); e.g. resnet20-4
  transformer          SAPAG's Transformer language model (text; sizes from ``text_sizes``)
  gpt                  a GPT-2-style decoder (text; sizes from ``text_sizes``, logits tied to the embedding)
  bert                 a BERT-style encoder with a masked-LM head (text; sizes from ``text_sizes``)

Every image model's last layer is a Dense named ``"head"`` (label inference reads its gradient). Image models
take (N, H, W, C) inputs; text models (:data:`TEXT_MODELS`) take token ids (N, T) or embeddings
(N, T, dim) and return (N, T, V) logits.
"""

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gradjax.compilation import check_key, once
from gradjax.models import bert, convnet, gpt, lenet, mlp, resnet, transformer
from gradjax.models.inits import INITS, TORCH_INITS, get_initializers, torch_biases
from gradjax.models.layers import ACTIVATIONS, CONVS, resolve_conv
from gradjax.models.spec import Options, ModelSpec, ZooName

# The zoo: one ModelSpec per family (gradjax.models.spec), in the order names are tried.
FAMILIES: tuple[ModelSpec, ...] = (lenet.LENET_ZHU, lenet.LENET5, convnet.SPEC, mlp.SPEC, resnet.SPEC,
                              transformer.SPEC, gpt.SPEC, bert.SPEC)
MODELS = tuple(n for f in FAMILIES if not f.text for n in f.examples)
TEXT_MODELS = tuple(n for f in FAMILIES if f.text for n in f.examples)
# The largest model :func:`create` builds, checked before anything is allocated (a capture's
# metadata may state any shape): 4096 x 4096 RGB pixels (or as many tokens) and 2**20 classes.
MAX_INPUT_SIZE = 4096 * 4096 * 3
MAX_CLASSES = 2**20


class TextSizes(NamedTuple):
  """Sizes of the ``transformer``: model width (embedding size), attention heads, feed-forward width,
  encoder layers. The defaults are SAPAG's (4 heads, feed-forward 200, 2 encoder layers) with the
  width of PyTorch's word_language_model example (200)."""

  dim: int = 200
  heads: int = 4
  ffn: int = 200
  layers: int = 2


def is_text(name: str) -> bool:
  """Whether model ``name`` reads token sequences rather than images."""
  spec = family(name)
  return spec is not None and spec.text


def is_masked_lm(name: str) -> bool:
  """Whether text model ``name`` predicts masked tokens (its client's targets are
  :func:`gradjax.corpus.masked_lm_pairs`) rather than the next token."""
  spec = family(name)
  return spec is not None and spec.masked_lm

ApplyFn = Callable[..., jax.Array]


class Model(NamedTuple):
  """What an attack needs of a model.

  Attributes:
    apply_fn: ``apply_fn(variables, x, train=False) -> logits``; ``x`` is (N, H, W, C) images, or for
      text models (N, T) token ids or (N, T, dim) embeddings.
    variables: Flax variables, ``{"params": ..., ["batch_stats": ...]}``.
    name: registry name.
    input_shape: (H, W, C) of one example, or (T,) for text models.
    num_classes: number of logits (the vocabulary size of text models).
  """

  apply_fn: ApplyFn
  variables: Any
  name: str
  input_shape: tuple[int, ...]
  num_classes: int


def family(name: str) -> ModelSpec | None:
  """The :class:`~gradjax.models.spec.ModelSpec` of the family that answers to ``name``, or None."""
  return next((f for f in FAMILIES if f.parse(name)), None)


def check_name(name, where: str | None = None) -> ModelSpec:
  """The :class:`~gradjax.models.spec.ModelSpec` of zoo name ``name``; ValueError for anything
  else, after ``where`` (the option or the key the name came from) when given."""
  spec = family(name) if isinstance(name, str) else None
  if spec is None:
    raise ValueError(f"{where + ': ' if where else ''}unknown model {name!r}; choose one of "
                     f"{', '.join(MODELS + TEXT_MODELS)} (convnet-W, mlp-H, resnetD-W variants "
                     "allowed, W and H positive)")
  return spec


def parse_name(name: str) -> ZooName | None:
  """The :class:`ZooName` of a zoo name (``"resnet20-4"`` -> ``ZooName("resnet", 20, 4)``), or
  ``None`` for a name outside the grammar (the ResNet depth itself is checked when it is built)."""
  spec = family(name)
  return None if spec is None else spec.parse(name)


# Ten parameters: the name, then the fields of models.spec.Options, each a keyword with a default.
def get_module(name: str, *, num_classes: int, init: str | None = None, init_scale: float = 0.5,
               act: str | None = None, stride1: bool = False,
               param_dtype: jnp.dtype = jnp.float32, remat: bool = False, conv: str = "auto",
               text_sizes: TextSizes = TextSizes()) -> nn.Module:
  """The Flax module called ``name`` (see module docstring); ``init=None`` picks the model's default.

  ``remat`` (ResNets): ``jax.checkpoint`` each residual block, so the attack's double backward keeps
  only block inputs and recomputes the rest: less memory for deep models and large batches.

  ``conv`` (models with convolutions): how convolutions are computed, one of ``CONVS``: ``"xla"``
  (``lax.conv_general_dilated``), ``"im2col"`` (patches times a matrix,
  :func:`gradjax.models.layers.im2col_conv`: gradient matching faster than xla on XLA:CPU,
  more memory, plain training steps of wide networks slower), ``"gather"`` (the same products,
  the patches taken by one gather: :func:`gradjax.models.layers.gather_conv`), ``"split"`` (XLA's convolutions with
  the second derivatives XLA:CPU computes slowly given as ordinary convolutions,
  :func:`gradjax.models.layers.split_conv`), ``"mixed"`` (split on large feature maps, im2col
  elsewhere, :func:`gradjax.models.layers.mixed_conv`) or ``"auto"`` (mixed on CPU, xla on
  accelerators).
  The parameters and the function computed are the same; only rounding differs.

  ``text_sizes``: the ``transformer``'s sizes (:class:`TextSizes`)."""
  if init is not None and init not in INITS:
    get_initializers(init)  # raises the one-line error
  if act is not None and act not in ACTIVATIONS:
    raise ValueError(f"unknown activation {act!r}; choose one of {', '.join(ACTIVATIONS)}")
  if conv not in CONVS:
    resolve_conv(conv)  # raises the one-line error
  spec = check_name(name)
  if init in TORCH_INITS and spec.text:
    raise ValueError(f"init {init!r} (PyTorch's Conv2d and Linear draws) is for the image models; "
                     f"{name} takes {', '.join(i for i in INITS if i not in TORCH_INITS)}")
  return spec.build(spec.parse(name), Options(
      num_classes=num_classes, init=init, init_scale=init_scale, act=act, stride1=stride1,
      param_dtype=param_dtype, remat=remat, conv=resolve_conv(conv), text_sizes=text_sizes))


@functools.lru_cache(maxsize=64)
def make_apply_fn(module: nn.Module) -> ApplyFn:
  """``apply_fn(variables, x, train=False, sharpness=None) -> logits`` for a Flax module.

  Cached per (hashable, immutable) module, so models with equal configuration share one ``apply_fn``
  and the attacks compiled for it are reused across fresh random initialisations.

  With ``train=True`` BatchNorm uses the batch statistics (as a client does during local training);
  the updated running statistics are discarded so the function stays pure. ``apply_fn.module`` is the
  module, for code that needs Flax's own ``apply`` (e.g. collections, :mod:`gradjax.priors`).
  ``sharpness`` κ (a scalar, traced or not; modules with a ``sharpness`` field, :func:`smoothable`):
  the model with its ReLUs and max pools rounded (:func:`gradjax.models.layers.smooth_relu`,
  :func:`gradjax.models.layers.max_pool`), for attacks that anneal κ towards the model itself.
  """

  def apply_fn(variables, x, train: bool = False, sharpness=None):
    net = module if sharpness is None else module.clone(sharpness=sharpness)
    if train and "batch_stats" in variables:
      logits, _ = net.apply(variables, x, train=True, mutable=["batch_stats"])
      return logits
    return net.apply(variables, x, train=train)

  apply_fn.module = module
  return apply_fn


def output_shape(apply_fn, variables, example_shape, dtype, train: bool = False, *,
                 what: str = "an input") -> tuple[int, ...]:
  """The shape of ``apply_fn``'s output for one example of ``example_shape`` and ``dtype``, (1, K)
  or (1, T, V) (traced: nothing is computed; remembered per model, variables' shapes and input, as
  a run asks for it several times and a ResNet's trace takes a tenth of a second or more), or a
  one-line ValueError naming ``what`` where the model cannot read such an example (Flax's own
  shape errors span pages)."""
  if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in example_shape):
    raise ValueError(f"{what} of shape {tuple(example_shape)}: its sizes must be integers")
  leaves, tree = jax.tree.flatten(variables)
  key = (apply_fn, tree, tuple((jnp.shape(v), jnp.result_type(v)) for v in leaves),
         tuple(int(d) for d in example_shape), jnp.dtype(dtype), bool(train))
  if key not in _OUTPUT_SHAPES:
    if len(_OUTPUT_SHAPES) >= 256:  # a program that makes a fresh model per client
      _OUTPUT_SHAPES.clear()
    try:
      _OUTPUT_SHAPES[key] = jax.eval_shape(
          lambda: apply_fn(variables, jnp.zeros((1, *example_shape), dtype), train)).shape
    except Exception as e:  # noqa: BLE001  (whatever the model raised, it could not read the input)
      raise ValueError(f"{what} of shape {tuple(example_shape)} ({jnp.dtype(dtype).name}) does not "
                       f"fit the model: {str(e).splitlines()[0][:200]}") from None
  return _OUTPUT_SHAPES[key]


_OUTPUT_SHAPES: dict = {}


def smoothable(apply_fn) -> bool:
  """Whether ``apply_fn`` (of :func:`make_apply_fn`) takes a ``sharpness``: its module has a
  ``sharpness`` field (the zoo's ConvNet, ResNets, MLPs and LeNets)."""
  module = getattr(apply_fn, "module", None)
  return module is not None and "sharpness" in getattr(type(module), "__dataclass_fields__", {})


def create(name: str, key: jax.Array, *, input_shape=(32, 32, 3), num_classes: int = 10,
           **module_kwargs) -> Model:
  """Builds model ``name`` and initialises its variables from ``key``.

  ``input_shape`` is one example's (H, W, C) (NHWC images), or (T,) for a text model. A shape
  (1 or 3, S, S) with S >= 8 is refused as PyTorch's (C, H, W) order.

  Example::

    model = gradjax.models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
    logits = model.apply_fn(model.variables, jnp.zeros((1, 32, 32, 3)))
  """
  check_key(key)
  if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in input_shape):
    raise ValueError(f"input_shape must be integer sizes, got {tuple(input_shape)}")
  if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool):
    raise ValueError(f"num_classes must be an integer, got {num_classes!r}")
  input_shape = tuple(int(d) for d in input_shape)
  rank = 1 if is_text(name) else 3
  if len(input_shape) != rank or min(input_shape) < 1:
    raise ValueError(f"input_shape must be {'(T,)' if rank == 1 else '(H, W, C)'} with positive sizes "
                     f"for {name}, got {input_shape}")
  if rank == 3 and input_shape[0] in (1, 3) and input_shape[1] == input_shape[2] >= 8:
    h, w, c = input_shape
    raise ValueError(f"input_shape {input_shape} reads as {h} px high with {c} channels: gradjax "
                     f"images are (H, W, C), so a PyTorch (C, H, W) = {input_shape} is "
                     f"{(w, c, h)}")
  if math.prod(input_shape) > MAX_INPUT_SIZE:
    raise ValueError(f"input_shape {input_shape} holds over {MAX_INPUT_SIZE} values (4096 x 4096 RGB "
                     "pixels), more than a model here takes")
  if not 2 <= num_classes <= MAX_CLASSES:
    raise ValueError(f"num_classes must lie in 2 .. {MAX_CLASSES}, got {num_classes}")
  module = get_module(name, num_classes=num_classes, **module_kwargs)
  if rank == 1:
    variables = _init(module, key, np.zeros((1, *input_shape), np.int32))
    return Model(make_apply_fn(module), variables, name, input_shape, num_classes)
  dtype = module_kwargs.get("param_dtype", jnp.float32)
  too_small = ValueError(f"input {input_shape} is too small for {name}: its pooling leaves no features")
  try:
    variables = _init(module, key, np.zeros((1, *input_shape), dtype))
  except ZeroDivisionError:  # a fan-based initialiser of a head without inputs, or another cause:
    # a shape-only trace with the uniform init (no fan) tells which.
    traced = module.clone(weight_init="uniform") if hasattr(module, "weight_init") else module
    if jax.eval_shape(lambda: traced.init(key, jnp.zeros((1, *input_shape), dtype)))[
        "params"]["head"]["kernel"].shape[0] == 0:
      raise too_small from None
    raise
  if variables["params"]["head"]["kernel"].shape[0] == 0:
    raise too_small
  return Model(make_apply_fn(module), variables, name, input_shape, num_classes)


@functools.partial(once, static_argnums=0)
def _init(module: nn.Module, key: jax.Array, x: jax.Array):
  """``module.init`` as one program (compiled once per module and input shape), the biases drawn
  by :func:`gradjax.models.inits.torch_biases` under the ``"torch"`` and ``"torchvision"`` inits."""
  variables = module.init(key, x, train=False)
  if getattr(module, "weight_init", None) in TORCH_INITS:
    variables = {**variables, "params": torch_biases(variables["params"], jax.random.fold_in(key, 1))}
  return variables
