"""A GPT-2-style decoder language model (Radford et al. 2019), at the sizes given.

GPT-2 small is width 768, 12 heads, feed-forward 3072, 12 blocks, 1024 positions and a 50 257-token
byte-pair vocabulary. This module keeps its structure and lets the sizes be chosen (``text_sizes``):
token embedding ``wte`` (V, dim) and learned positions ``wpe`` (context, dim), both N(0, 0.02²)
and N(0, 0.01²) as GPT-2 initialises them; pre-norm blocks with a causal mask,

    x ← x + MHA(LN(x)),     x ← x + W₂ GELU_tanh(W₁ LN(x)),

a final LayerNorm and logits tied to the embedding, ``logits = LN(x) wteᵀ`` (no separate head, so
the embedding's gradient is dense: it holds the output layer's too). Kernels N(0, 0.02²), biases zero,
LayerNorm epsilon 1e-5, no dropout (a client's dropout mask is random, no attacker could match it).

Inputs are token ids (N, T) int or embeddings (N, T, dim) float (the optimisation attacks), T at most
``context``. With ``decode=True`` the module runs one position per call from a key/value cache in
the ``cache`` collection (initialise it with the full (N, T) shape, as Flax's attention does), the
way a language model generates; the span attack extends sentences that way
(:mod:`gradjax.dager`).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from gradjax.models.inits import get_initializers
from gradjax.models.layers import causal_attention, layer_norm
from gradjax.models.spec import Options, ModelSpec, ZooName

CONTEXT = 128  # positions of the learned table (GPT-2: 1024); sentences here are at most 64 tokens


class Block(nn.Module):
  """Pre-norm causal self-attention block with a GELU (tanh) feed-forward."""

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
    x = x + causal_attention(layer_norm("norm_0", self.param_dtype)(x), self.heads, self.decode, **kw)
    h = nn.Dense(self.ffn, name="ffn_0", **kw)(layer_norm("norm_1", self.param_dtype)(x))
    return x + nn.Dense(self.dim, name="ffn_1", **kw)(jax.nn.gelu(h, approximate=True))


class GPT(nn.Module):
  """``x``: ids (N, T) or embeddings (N, T, dim) -> next-token logits (N, T, num_classes)."""

  num_classes: int
  dim: int = 768
  heads: int = 12
  ffn: int = 3072
  layers: int = 2
  context: int = CONTEXT
  weight_init: str | None = None
  init_scale: float = 0.5
  param_dtype: jnp.dtype = jnp.float32
  decode: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    if self.dim % self.heads:
      raise ValueError(f"the model width {self.dim} must be divisible by the {self.heads} heads")
    if self.weight_init is None:  # GPT-2's
      inits = (nn.initializers.normal(0.02), nn.initializers.zeros)
    else:
      inits = tuple(get_initializers(self.weight_init, self.init_scale))
    wte = nn.Embed(self.num_classes, self.dim, embedding_init=nn.initializers.normal(0.02),
                   param_dtype=self.param_dtype, dtype=self.param_dtype, name="embed")
    wpe = self.param("positions", nn.initializers.normal(0.01), (self.context, self.dim),
                     self.param_dtype)
    if jnp.issubdtype(x.dtype, jnp.integer):
      x = wte(x)
    elif x.ndim != 3 or x.shape[-1] != self.dim:
      raise ValueError(f"embeddings must be (N, T, {self.dim}), got {x.shape}")
    t = x.shape[1]
    if t > self.context:
      raise ValueError(f"sentences of {t} tokens exceed the model's {self.context} positions")
    if self.decode and self.has_variable("cache", "position"):
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      h = x + jax.lax.dynamic_slice_in_dim(wpe, position.value, t)
      position.value = position.value + t
    else:
      if self.decode:  # initialising the cache: the next call is position 0
        self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      h = x + wpe[:t]
    for i in range(self.layers):
      h = Block(self.dim, self.heads, self.ffn, *inits, param_dtype=self.param_dtype,
                decode=self.decode, name=f"block_{i}")(h)
    return wte.attend(layer_norm("norm_f", self.param_dtype)(h))


def _build(zoo: ZooName, o: Options) -> nn.Module:
  del zoo
  if o.act is not None:
    raise ValueError("model 'gpt' has a fixed GELU activation; drop --config.model.act")
  if min(o.text_sizes) < 1:
    raise ValueError(f"gpt sizes must be positive, got {o.text_sizes}")
  return GPT(num_classes=o.num_classes, **o.text_sizes._asdict(), weight_init=o.init,
             init_scale=o.init_scale, param_dtype=o.param_dtype)


def _torch_rows(zoo: ZooName, params, chw) -> list:
  """embed, positions, blocks.{i}.{norm_0, attention.{query,key,value,out}, norm_1, ffn_0, ffn_1},
  norm_f: the names of :func:`_torch_module`'s twin."""
  del zoo, chw
  blocks = sorted((k for k in params if k.startswith("block_")), key=lambda k: int(k[6:]))
  rows = [("embed", "embed", "embedding"), ("positions", "positions", "parameter")]
  for i, b in enumerate(blocks):
    rows += [(f"blocks.{i}.norm_0", f"{b}/norm_0", "layer_norm"),
             (f"blocks.{i}.attention", f"{b}/attention", "attention"),
             (f"blocks.{i}.norm_1", f"{b}/norm_1", "layer_norm"),
             (f"blocks.{i}.ffn_0", f"{b}/ffn_0", "dense"), (f"blocks.{i}.ffn_1", f"{b}/ffn_1", "dense")]
  return rows + [("norm_f", "norm_f", "layer_norm")]


def torch_attention(torch, dim: int, heads: int, *, causal: bool):
  """The PyTorch twin of Flax's ``MultiHeadDotProductAttention`` as the zoo's text models use it:
  four ``nn.Linear`` (query, key, value, out), softmax(q kᵀ / sqrt(head_dim)), causally masked or
  not."""
  nn_ = torch.nn

  class Attention(nn_.Module):
    def __init__(self):
      super().__init__()
      self.query, self.key, self.value, self.out = (nn_.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
      n, t, _ = x.shape
      split = lambda y: y.view(n, t, heads, dim // heads).transpose(1, 2)  # (n, heads, t, hd)
      q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
      scores = q @ k.transpose(-1, -2) / (dim // heads) ** 0.5
      if causal:
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
      a = torch.softmax(scores, dim=-1)
      return self.out((a @ v).transpose(1, 2).reshape(n, t, dim))

  return Attention()


def _torch_module(zoo: ZooName, torch, input_shape, num_classes: int, *, dim: int = 768,
                  heads: int = 12, ffn: int = 3072, layers: int = 2, context: int = CONTEXT):
  """The PyTorch twin: the same blocks with four ``nn.Linear`` per attention (query, key, value,
  out), tanh GELU, LayerNorm epsilon 1e-5, logits ``norm_f(h) @ embed.weight.T``; GPT-2's init."""
  del zoo, input_shape
  nn_ = torch.nn

  class Block(nn_.Module):
    def __init__(self):
      super().__init__()
      self.norm_0, self.norm_1 = nn_.LayerNorm(dim), nn_.LayerNorm(dim)
      self.attention = torch_attention(torch, dim, heads, causal=True)
      self.ffn_0, self.ffn_1 = nn_.Linear(dim, ffn), nn_.Linear(ffn, dim)

    def forward(self, x):
      x = x + self.attention(self.norm_0(x))
      return x + self.ffn_1(nn_.functional.gelu(self.ffn_0(self.norm_1(x)), approximate="tanh"))

  class GPTTwin(nn_.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn_.Embedding(num_classes, dim)
      self.positions = nn_.Parameter(torch.randn(context, dim) * 0.01)
      self.blocks = nn_.ModuleList(Block() for _ in range(layers))
      self.norm_f = nn_.LayerNorm(dim)
      for m in self.modules():
        if isinstance(m, (nn_.Linear, nn_.Embedding)):
          nn_.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn_.Linear):
          nn_.init.zeros_(m.bias)

    def forward(self, ids):
      h = self.embed(ids) + self.positions[:ids.shape[1]]
      for block in self.blocks:
        h = block(h)
      return self.norm_f(h) @ self.embed.weight.T

  return GPTTwin()


SPEC = ModelSpec("gpt", "gpt", ("gpt",), _build, _torch_rows, torch_module=_torch_module, text=True)
