"""Small shared pieces of the model zoo."""

from typing import Callable

import jax
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
