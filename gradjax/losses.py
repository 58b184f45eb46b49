"""Client losses.

The clients of the FL simulation train with the mean cross entropy over their batch; the DLG family
differentiates exactly this loss (once for the dummy gradient, twice for the attack objective).
"""

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean cross entropy: -(1/N) Σ_n Σ_k t_nk log softmax(z_n)_k.

  Args:
    logits: (N, K).
    targets: int labels (N,) or a probability (soft-label) matrix (N, K). DLG optimises soft labels
      ``softmax(label_logits)`` (``cross_entropy_for_onehot`` of the DLG code).

  Returns:
    Scalar loss.
  """
  log_p = jax.nn.log_softmax(logits, axis=-1)
  if jnp.issubdtype(targets.dtype, jnp.integer):
    targets = jax.nn.one_hot(targets, logits.shape[-1], dtype=log_p.dtype)
  return -jnp.mean(jnp.sum(targets * log_p, axis=-1))
