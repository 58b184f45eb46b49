"""Which process of a run this is, for the library: the run over several processes is launched and
ended by the command line (:mod:`gradjax.cli.distributed`); what the attack core needs of it is here.

A run over P processes either shares JAX's collectives (one attack sharded over every device,
``jax.distributed``) or only JAX's coordination service (a campaign whose experiments are split over
the processes); the launcher records the latter in :data:`launched`. Process 0 writes the results.
"""

import jax
import numpy as np

# Set by the launcher of a campaign over several processes (gradjax.cli.distributed): the
# coordination-service client, the process count and this process's index. Empty otherwise.
launched: dict = {}
# "stopping": the run is stopping on a signal, so the other processes' leaving is no fault.
state = {"stopping": False}


def process_count() -> int:
  """P: the processes of this run (1 outside a run over several processes)."""
  if launched:
    return launched["count"]
  return jax.process_count() if jax.distributed.is_initialized() else 1


def process_index() -> int:
  """This process's index in ``range(process_count())``."""
  if launched:
    return launched["index"]
  return jax.process_index() if jax.distributed.is_initialized() else 0


def is_writer() -> bool:
  """Whether this process writes the run's results (process 0, or the only one)."""
  return process_index() == 0


def stopping() -> None:
  """This run is stopping on a signal (every process saves its state and exits): the others'
  leaving is then no fault."""
  state["stopping"] = True


def allgather_ints(values: list[int]) -> np.ndarray:
  """(P, len(values)) int32: every process's ``values`` (a collective: every process must call it)."""
  row = np.asarray(values, np.int32)[None]
  if process_count() == 1:
    return row
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(row[0])).reshape(process_count(), -1)
