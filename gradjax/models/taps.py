"""What a model computes on its way to the logits, read (or changed) without changing the model: its
module calls, seen one at a time.

Attacks read models as ``apply_fn`` and ``variables`` alone; some also need what a forward pass
computes inside: the inputs of the BatchNorm layers (the BatchNorm prior), of the dense head (head
features), of the attention blocks (DAGER), the order in which the layers run (layer weights). They
read it here, through :func:`intercept`, and never import Flax: this module is the one place that
knows how a Flax linen model calls its modules (``flax.linen.intercept_methods``), and the one to
extend for models of another kind.

  def first_inputs(call, proceed):
    if call.kind == taps.BATCH_NORM and call.method == "__call__":
      seen.append(call.args[0])
    return proceed()

  with taps.intercept(first_inputs):
    apply_fn(variables, x)
"""

import contextlib
from typing import Any, Callable, Iterator, NamedTuple

from flax import linen as nn

# What a module is, as the attacks ask.
BATCH_NORM = "batch_norm"  # a BatchNorm layer
ATTENTION = "attention"  # a self-attention block (its input: the block's queries, keys and values)
ATTENTION_OUTPUT = "attention_output"  # an attention block's output projection
OTHER = "other"


class Call(NamedTuple):
  """One method call of a module during a forward pass.

  Attributes:
    path: the module's place in the model (its parameters' path in ``variables["params"]``).
    name: the module's own name (the last entry of ``path``; ``None`` for the top module).
    kind: :data:`BATCH_NORM`, :data:`ATTENTION`, :data:`ATTENTION_OUTPUT` or :data:`OTHER`.
    method: the method called (``"__call__"`` for the layer's computation).
    args, kwargs: its arguments (``args[0]``: the layer's input).
    record: ``record(collection, name, value)`` keeps ``value`` in the model's variable collection
      ``collection`` under the module (Flax's ``sow``: what the model's ``apply`` with that
      collection mutable returns; it also works where the module runs inside a lifted transform
      such as ``nn.remat``, where a value kept on the side would leak a tracer). Each field is
      built while JAX traces the model, never per step of a compiled program.
  """

  path: tuple[str, ...]
  name: str | None
  kind: str
  method: str
  args: tuple
  kwargs: dict
  record: Callable[[str, str, Any], None]


def _kind(module) -> str:
  if isinstance(module, nn.BatchNorm):
    return BATCH_NORM
  if isinstance(module, nn.MultiHeadDotProductAttention):
    return ATTENTION
  if (isinstance(module, nn.DenseGeneral) and module.name == "out"
      and isinstance(module.parent, nn.MultiHeadDotProductAttention)):
    return ATTENTION_OUTPUT
  return OTHER


@contextlib.contextmanager
def intercept(around: Callable[[Call, Callable[[], Any]], Any]) -> Iterator[None]:
  """Within it, every module method call of a model that runs goes through
  ``around(call, proceed)``, whose return value is the call's: ``proceed()`` runs the call as made
  (return it unchanged, or change it), and ``around`` may return something else without running
  it. ``around`` may raise to end the forward pass."""

  def interceptor(next_fun, args, kwargs, context):
    module = context.module

    def record(collection, name, value):
      module.sow(collection, name, value, init_fn=lambda: None, reduce_fn=lambda _, new: new)

    path = tuple(module.scope.path) if module.scope is not None else ()
    call = Call(path, module.name, _kind(module), context.method_name, tuple(args), dict(kwargs),
                record)
    return around(call, lambda: next_fun(*args, **kwargs))

  with nn.intercept_methods(interceptor):
    yield

