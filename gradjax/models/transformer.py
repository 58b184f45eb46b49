"""A small Transformer language model: the text model of SAPAG (Wang et al.) and DLG's text experiments.

SAPAG attacks "a Transformer with positional encoding, 2 encoder layers and 1 decoder layer, 4 heads,
feed-forward 200, GELU". We read it as the language model of PyTorch's ``word_language_model``
example, which SAPAG's text experiment builds on: token embedding, sinusoidal positional encoding,
``layers`` post-norm encoder layers with a causal mask (x ← LN(x + MHA(x)), x ← LN(x + FFN(x)),
FFN = Dense(ffn) – GELU – Dense(dim)), and one linear decoder from the model width to the vocabulary
(the Dense ``"head"``). No dropout: a client's dropout mask is random, so no attacker could match it.

Inputs are token ids (N, T) int, or embeddings (N, T, dim) float: the text attacks optimise dummy
embeddings and feed them in place of the lookup, so both paths compute
``h_0 = E[ids] + PE`` (or ``h_0 = e + PE``), with E the ``embed`` table (V, dim) initialised N(0, 1) as
PyTorch's ``nn.Embedding``. Logits are (N, T, V): position t predicts token t + 1. With ``decode=True`` the module runs one position
per call from a key/value cache (the ``cache`` collection, initialised with the full (N, T) shape as
Flax's attention does), as :class:`gradjax.models.gpt.GPT` does.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import causal_attention, head, layer_norm
from gradjax.models.spec import Options, ModelSpec, ZooName


def positional_encoding(length: int, dim: int) -> np.ndarray:
  """Vaswani et al.'s sinusoids, (length, dim): PE[t, 2i] = sin(t / 10000^(2i/dim)),
  PE[t, 2i+1] = cos(t / 10000^(2i/dim))."""
  position = np.arange(length, dtype=np.float64)[:, None]
  rate = np.exp(-np.log(10000.0) * np.arange(0, dim, 2, dtype=np.float64) / dim)
  pe = np.zeros((length, dim))
  pe[:, 0::2] = np.sin(position * rate)
  pe[:, 1::2] = np.cos(position * rate[: dim // 2])
  return pe


class EncoderLayer(nn.Module):
  """Post-norm self-attention block with a causal mask (PyTorch's ``TransformerEncoderLayer``)."""

  dim: int
  heads: int
  ffn: int
  kernel_init: nn.initializers.Initializer
  bias_init: nn.initializers.Initializer
  param_dtype: jnp.dtype = jnp.float32
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    kw = dict(kernel_init=self.kernel_init, bias_init=self.bias_init, param_dtype=self.param_dtype,
              dtype=self.param_dtype)
    x = layer_norm("norm_0", self.param_dtype)(x + causal_attention(x, self.heads, self.decode, **kw))
    h = nn.Dense(self.ffn, name="ffn_0", **kw)(x)
    h = nn.Dense(self.dim, name="ffn_1", **kw)(jax.nn.gelu(h, approximate=False))
    return layer_norm("norm_1", self.param_dtype)(x + h)


class TransformerLM(nn.Module):
  """``x``: ids (N, T) or embeddings (N, T, dim) -> next-token logits (N, T, num_classes).

  ``num_classes`` is the vocabulary size V; ``weight_init`` initialises the attention, feed-forward and
  decoder layers (:mod:`gradjax.models.inits`), the embedding is N(0, 1)."""

  num_classes: int
  dim: int = 200
  heads: int = 4
  ffn: int = 200
  layers: int = 2
  weight_init: str = "default"
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  decode: bool = False
  context: int = 512  # positions a decode cache may reach

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    if self.dim % self.heads or self.dim % 2:
      raise ValueError(f"the model width {self.dim} must be even and divisible by the {self.heads} heads")
    inits = get_initializers(self.weight_init, self.init_scale)
    embed = nn.Embed(self.num_classes, self.dim, embedding_init=nn.initializers.normal(1.0),
                     param_dtype=self.param_dtype, dtype=self.param_dtype, name="embed")
    if jnp.issubdtype(x.dtype, jnp.integer):
      x = embed(x)
    elif x.ndim != 3 or x.shape[-1] != self.dim:
      raise ValueError(f"embeddings must be (N, T, {self.dim}), got {x.shape}")
    if self.decode and self.has_variable("cache", "position"):
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      table = jnp.asarray(positional_encoding(self.context, self.dim), x.dtype)
      h = x + jax.lax.dynamic_slice_in_dim(table, position.value, x.shape[1])
      position.value = position.value + x.shape[1]
    else:
      if self.decode:  # initialising the cache: the next call is position 0
        self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      h = x + jnp.asarray(positional_encoding(x.shape[1], self.dim), x.dtype)
    for i in range(self.layers):
      h = EncoderLayer(self.dim, self.heads, self.ffn, *inits, param_dtype=self.param_dtype,
                       decode=self.decode, name=f"block_{i}")(h)
    return head(self.num_classes, inits, self.param_dtype)(h)


# --- zoo entry -------------------------------------------------------------------------------------


def _build(zoo: ZooName, o: Options) -> nn.Module:
  del zoo
  if o.act is not None:
    raise ValueError("model 'transformer' has a fixed GELU activation; drop --config.model.act")
  if min(o.text_sizes) < 1:
    raise ValueError(f"transformer sizes must be positive, got {o.text_sizes}")
  return TransformerLM(num_classes=o.num_classes, **o.text_sizes._asdict(),
                       weight_init=o.init or "default", init_scale=o.init_scale,
                       param_dtype=o.param_dtype)


SPEC = ModelSpec("transformer", "transformer", ("transformer",), _build, text=True)
