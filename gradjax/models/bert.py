"""A BERT-style encoder with a masked-language-model head (Devlin et al. 2019), at the sizes given.

BERT-base is width 768, 12 heads, feed-forward 3072, 12 blocks, 512 positions and a 30 522-token
WordPiece vocabulary; DLG (Zhu et al. 2019, §4.2) attacks its masked-LM gradient. This module keeps
its structure and lets the sizes be chosen (``text_sizes``): token embedding ``embed`` (V, dim) and
learned positions ``positions`` (context, dim), both N(0, 0.02²); their sum through a LayerNorm
``norm_embed``; post-norm blocks with bidirectional attention,

    x ← LN(x + MHA(x)),     x ← LN(x + W₂ GELU(W₁ x)),

and the masked-LM head ``logits = LN(GELU(x W_t + b_t)) Eᵀ + b_o`` (the ``transform`` Dense,
``norm_head``, the decoder tied to the embedding E and its own bias ``output_bias``). Kernels
N(0, 0.02²), biases zero, exact (erf) GELU, LayerNorm epsilon 1e-5 (BERT's is 1e-12, which changes
nothing at these scales), no dropout and no segment embedding (one segment: BERT adds the same
vector to every position). The client's loss is the cross entropy at the masked positions only
(:func:`gradjax.corpus.masked_lm_pairs`, targets -1 elsewhere, as PyTorch's ``ignore_index``).

Inputs are token ids (N, T) int or embeddings (N, T, dim) float, T at most ``context``. Every
position attends to every other, so there is no decode mode: the span attack reads a batch of one
from the first block alone and searches a batch of several whole against the second block
(:mod:`gradjax.dager`).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.gpt import torch_attention
from gradjax.models.inits import get_initializers
from gradjax.models.layers import layer_norm
from gradjax.models.spec import Options, ModelSpec, ZooName

CONTEXT = 128  # positions of the learned table (BERT: 512); sentences here are at most 64 tokens


class Block(nn.Module):
  """Post-norm bidirectional self-attention block with a GELU (erf) feed-forward."""

  dim: int
  heads: int
  ffn: int
  kernel_init: nn.initializers.Initializer
  bias_init: nn.initializers.Initializer
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    kw = dict(kernel_init=self.kernel_init, bias_init=self.bias_init, param_dtype=self.param_dtype,
              dtype=self.param_dtype)
    a = nn.MultiHeadDotProductAttention(num_heads=self.heads, name="attention", **kw)(x, x)
    x = layer_norm("norm_0", self.param_dtype)(x + a)
    h = nn.Dense(self.ffn, name="ffn_0", **kw)(x)
    h = nn.Dense(self.dim, name="ffn_1", **kw)(jax.nn.gelu(h, approximate=False))
    return layer_norm("norm_1", self.param_dtype)(x + h)


class BERT(nn.Module):
  """``x``: ids (N, T) or embeddings (N, T, dim) -> masked-LM logits (N, T, num_classes)."""

  num_classes: int
  dim: int = 768
  heads: int = 12
  ffn: int = 3072
  layers: int = 2
  context: int = CONTEXT
  weight_init: str | None = None
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    if self.dim % self.heads:
      raise ValueError(f"the model width {self.dim} must be divisible by the {self.heads} heads")
    if self.weight_init is None:  # BERT's
      inits = (nn.initializers.normal(0.02), nn.initializers.zeros)
    else:
      inits = tuple(get_initializers(self.weight_init, self.init_scale))
    embed = nn.Embed(self.num_classes, self.dim, embedding_init=nn.initializers.normal(0.02),
                     param_dtype=self.param_dtype, dtype=self.param_dtype, name="embed")
    positions = self.param("positions", nn.initializers.normal(0.02), (self.context, self.dim),
                           self.param_dtype)
    if jnp.issubdtype(x.dtype, jnp.integer):
      x = embed(x)
    elif x.ndim != 3 or x.shape[-1] != self.dim:
      raise ValueError(f"embeddings must be (N, T, {self.dim}), got {x.shape}")
    t = x.shape[1]
    if t > self.context:
      raise ValueError(f"sentences of {t} tokens exceed the model's {self.context} positions")
    h = layer_norm("norm_embed", self.param_dtype)(x + positions[:t])
    for i in range(self.layers):
      h = Block(self.dim, self.heads, self.ffn, *inits, param_dtype=self.param_dtype,
                name=f"block_{i}")(h)
    h = nn.Dense(self.dim, name="transform", kernel_init=inits[0], bias_init=inits[1],
                 param_dtype=self.param_dtype, dtype=self.param_dtype)(h)
    h = layer_norm("norm_head", self.param_dtype)(jax.nn.gelu(h, approximate=False))
    bias = self.param("output_bias", nn.initializers.zeros, (self.num_classes,), self.param_dtype)
    return embed.attend(h) + bias


def _build(zoo: ZooName, o: Options) -> nn.Module:
  del zoo
  if o.act is not None:
    raise ValueError("model 'bert' has a fixed GELU activation; drop --config.model.act")
  if min(o.text_sizes) < 1:
    raise ValueError(f"bert sizes must be positive, got {o.text_sizes}")
  return BERT(num_classes=o.num_classes, **o.text_sizes._asdict(), weight_init=o.init,
              init_scale=o.init_scale, param_dtype=o.param_dtype)


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """embed, positions, norm_embed, blocks.{i}.{attention.{query,key,value,out}, norm_0, ffn_0, ffn_1,
  norm_1}, transform, norm_head, output_bias: the names of :func:`_torch_module`'s twin."""
  del zoo, chw
  blocks = sorted((k for k in params if k.startswith("block_")), key=lambda k: int(k[6:]))
  rows = [("embed", "embed", "embedding"), ("positions", "positions", "parameter"),
          ("norm_embed", "norm_embed", "layer_norm")]
  for i, b in enumerate(blocks):
    rows += [(f"blocks.{i}.attention", f"{b}/attention", "attention"),
             (f"blocks.{i}.norm_0", f"{b}/norm_0", "layer_norm"),
             (f"blocks.{i}.ffn_0", f"{b}/ffn_0", "dense"), (f"blocks.{i}.ffn_1", f"{b}/ffn_1", "dense"),
             (f"blocks.{i}.norm_1", f"{b}/norm_1", "layer_norm")]
  return rows + [("transform", "transform", "dense"), ("norm_head", "norm_head", "layer_norm"),
                 ("output_bias", "output_bias", "parameter")]


def _torch_module(zoo: ZooName, torch, input_shape, num_classes: int, *, dim: int = 768,
                  heads: int = 12, ffn: int = 3072, layers: int = 2, context: int = CONTEXT):
  """The PyTorch twin: the same blocks with four ``nn.Linear`` per attention (query, key, value,
  out), erf GELU, LayerNorm epsilon 1e-5, logits ``norm_head(gelu(transform(h))) @ embed.weight.T +
  output_bias``; BERT's init."""
  del zoo, input_shape
  nn_ = torch.nn

  class Block(nn_.Module):
    def __init__(self):
      super().__init__()
      self.attention = torch_attention(torch, dim, heads, causal=False)
      self.norm_0 = nn_.LayerNorm(dim)
      self.ffn_0, self.ffn_1, self.norm_1 = nn_.Linear(dim, ffn), nn_.Linear(ffn, dim), nn_.LayerNorm(dim)

    def forward(self, x):
      x = self.norm_0(x + self.attention(x))
      return self.norm_1(x + self.ffn_1(nn_.functional.gelu(self.ffn_0(x))))

  class BERTTwin(nn_.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn_.Embedding(num_classes, dim)
      self.positions = nn_.Parameter(torch.randn(context, dim) * 0.02)
      self.norm_embed = nn_.LayerNorm(dim)
      self.blocks = nn_.ModuleList(Block() for _ in range(layers))
      self.transform, self.norm_head = nn_.Linear(dim, dim), nn_.LayerNorm(dim)
      self.output_bias = nn_.Parameter(torch.zeros(num_classes))
      for m in self.modules():
        if isinstance(m, (nn_.Linear, nn_.Embedding)):
          nn_.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn_.Linear):
          nn_.init.zeros_(m.bias)

    def forward(self, ids):
      h = self.norm_embed(self.embed(ids) + self.positions[:ids.shape[1]])
      for block in self.blocks:
        h = block(h)
      h = self.norm_head(nn_.functional.gelu(self.transform(h)))
      return h @ self.embed.weight.T + self.output_bias

  return BERTTwin()


SPEC = ModelSpec("bert", "bert", ("bert",), _build, _torch_rows, torch_module=_torch_module, text=True,
                 masked_lm=True)
