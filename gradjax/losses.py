"""Client losses.

The clients of the FL simulation train with the mean cross entropy over their batch; the DLG family
differentiates exactly this loss (once for the dummy gradient, twice for the attack objective).
"""

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean cross entropy: -(1/M) Σ_n Σ_k t_nk log softmax(z_n)_k over the M kept rows.

  Args:
    logits: (..., K), e.g. (N, K) of a classifier or (N, T, K) of a language model.
    targets: int labels (...), or a probability (soft-label) matrix (..., K). DLG optimises soft
      labels ``softmax(label_logits)`` (``cross_entropy_for_onehot`` of the DLG code). A negative
      int label marks a row without a target (the unmasked positions of a masked language model):
      it is left out of the sum and of M, as PyTorch's ``cross_entropy(ignore_index=...)`` does.
      With soft labels every row is kept.

  Returns:
    Scalar loss (0 when no row is kept).
  """
  log_p = jax.nn.log_softmax(logits, axis=-1)
  if jnp.issubdtype(targets.dtype, jnp.integer):
    kept = jnp.sum(targets >= 0).astype(log_p.dtype)
    targets = jax.nn.one_hot(targets, logits.shape[-1], dtype=log_p.dtype)  # zero rows where < 0
    return -jnp.sum(targets * log_p) / jnp.maximum(kept, 1)
  return -jnp.mean(jnp.sum(targets * log_p, axis=-1))


def masked_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """A masked language model's loss with targets that may be soft and may be absent.

  Args:
    logits: (..., K).
    targets: int labels (...), negative where a position has no target (:func:`cross_entropy`'s
      rule: the client's loss, BERT's masked positions only); or soft targets (..., K + 1), a
      distribution over the K classes and *no target* (the last column), as an attack optimises
      them when it does not know which positions the client masked.

  Returns:
    −Σ_n Σ_{k<K} t_nk log softmax(z_n)_k / Σ_n Σ_{k<K} t_nk: each row weighs by its share of
    targets, so one-hot rows give the int labels' loss exactly (a 'no target' row counts in neither
    sum). 0 when no row holds a target.
  """
  if jnp.issubdtype(targets.dtype, jnp.integer):
    return cross_entropy(logits, targets)
  if targets.shape[-1] != logits.shape[-1] + 1:
    raise ValueError(f"soft masked-LM targets have the {logits.shape[-1]} classes and 'no target': "
                     f"{logits.shape[-1] + 1} columns, got {targets.shape[-1]}")
  log_p = jax.nn.log_softmax(logits, axis=-1)
  words = targets[..., :-1]
  return -jnp.sum(words * log_p) / jnp.maximum(jnp.sum(words), jnp.finfo(log_p.dtype).tiny)
