"""Candidate assignments of known labels to dummy slots, for the permutation search.

In FedAvg the client's n images are split into local mini-batches of size B in an order the server
does not see (:class:`gradjax.clients.LocalTraining`: batch b holds examples b·B .. b·B + B − 1).
When the attacker knows the client's labels only as a multiset (inferred from the update, or
revealed without order), the replay of local training still depends on which labels share a
mini-batch and in which step each mini-batch is used. Two orders of the labels give the same replay
exactly when every mini-batch receives the same multiset of labels (the batch loss is a mean), so
the distinct candidates are the ordered partitions of the label multiset into n / B blocks of B:
at most n! / (B!)^(n/B) of them (6 for n = 4, B = 2 with distinct labels; 1 for one full batch).

:func:`candidates` enumerates them (or samples ``count`` of them, always keeping the given order);
:func:`gradjax.attacks.reconstruct` runs one dummy optimisation per candidate and restart and keeps
the lowest objective. For FedSGD (one batch) there is nothing to search.
"""

import itertools

import numpy as np

MAX_ENUMERATED = 8  # n! orders are enumerated up to this many labels, sampled beyond


def _canonical(labels: np.ndarray, order: tuple[int, ...], batch_size: int) -> tuple:
  """The replay-equivalence class of ``labels[order]``: each mini-batch's sorted labels."""
  seq = labels[list(order)]
  return tuple(tuple(sorted(seq[i:i + batch_size])) for i in range(0, len(seq), batch_size))


def _check(n: int, b: int) -> None:
  if n < 1 or b < 1 or n % b:
    raise ValueError(f"the mini-batch size must divide the number of labels, got n = {n}, B = {b}")


def candidates(labels, batch_size: int | None, count: int, seed: int = 0) -> np.ndarray:
  """Up to ``count`` distinct label orders, as index arrays.

  Args:
    labels: (n,) int, the known labels in the order the attacker has them.
    batch_size: the client's local mini-batch size B (None: one batch of n).
    count: how many candidates at most; the given order (the identity) is always the first.
    seed: seed of the random choice when there are more than ``count`` distinct assignments.

  Returns:
    (K, n) int32, K = min(count, distinct assignments); row k is a permutation π with
    ``labels[π]`` the k-th candidate assignment, rows pairwise non-equivalent.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be (n,), got shape {labels.shape}")
  n = labels.shape[0]
  b = batch_size or n
  _check(n, b)
  if count < 1:
    raise ValueError(f"the candidate count must be positive, got {count}")
  identity = tuple(range(n))
  found = {_canonical(labels, identity, b): identity}
  if n <= MAX_ENUMERATED:
    pool = []
    for p in itertools.permutations(range(n)):
      c = _canonical(labels, p, b)
      if c not in found:
        found[c] = p
        pool.append(p)
    rng = np.random.default_rng(seed)
    chosen = [pool[i] for i in sorted(rng.permutation(len(pool))[:count - 1])] if pool else []
  else:
    rng = np.random.default_rng(seed)
    chosen, tries = [], 0
    while len(chosen) < count - 1 and tries < 100 * count:
      tries += 1
      p = tuple(int(i) for i in rng.permutation(n))
      c = _canonical(labels, p, b)
      if c not in found:
        found[c] = p
        chosen.append(p)
  return np.asarray([identity, *chosen][:count], np.int32)
