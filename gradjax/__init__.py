"""gradjax: gradient inversion attacks on federated learning, in JAX."""

__version__ = "0.1.0"
