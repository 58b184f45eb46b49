"""Restarts over devices: a 1-D ``"restarts"`` mesh over every device of every process, placing a
stacked pytree's leading axis on it, and gathering it back to the host."""

from typing import Any

import jax
import numpy as np

PyTree = Any

# The name of the vmapped restart axis inside the restart driver's programs (gradjax.driver, strategy
# "vmap"): an objective reduces over the restarts with e.g. ``jax.lax.pmean(x, RESTART_AXIS)``
# (gradjax.priors.group_consistency).
RESTART_AXIS = "restart"


def restart_mesh(devices=None) -> jax.sharding.Mesh:
  """A 1-D mesh named ``"restarts"`` over ``devices`` (default: every device of every process)."""
  devices = jax.devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("a restart mesh needs at least one device")
  return jax.sharding.Mesh(np.asarray(devices), ("restarts",))


def shard_restarts(tree: PyTree, mesh: jax.sharding.Mesh | None = None) -> PyTree:
  """Places every leaf's leading (restart) axis across ``mesh`` (:func:`restart_mesh` by default).

  The restart count R is padded to a multiple of the device count D by repeating the last restart
  (the caller drops the padding: ``[:R]``), so device d holds restarts d·⌈R/D⌉ .. (d+1)·⌈R/D⌉ − 1.
  Every process must pass the same host values (they are, when derived from the same PRNG key);
  each contributes the shards of its own devices (``jax.make_array_from_callback``).
  """
  mesh = restart_mesh() if mesh is None else mesh
  devices = mesh.devices.size
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("restarts"))

  def place(x):
    x = np.asarray(x)
    pad = -x.shape[0] % devices
    if pad:
      x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(place, tree)


def fetch(tree: PyTree) -> PyTree:
  """``tree`` as host NumPy arrays, gathering the shards of other processes where a leaf has some
  (a collective then: every process must call it). Leaves this process holds whole, e.g. of an
  experiment it runs alone, are read locally."""
  if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(tree)):
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)
