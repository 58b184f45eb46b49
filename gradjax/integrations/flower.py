"""Recording a live Flower federation for gradjax audits (the optional extra ``gradjax[flower]``).

:class:`AuditStrategy` wraps any strategy of Flower's message API (``flwr.serverapp.strategy``:
``FedAvg``, ``FedProx``, ``FedAdam``, ...). It passes every call through unchanged, so the model the
strategy aggregates is the same bit for bit, and on the side writes, for each audited round and
client, what an honest-but-curious server holds: the global arrays it sent, the arrays the client
returned (named as in the client's ``state_dict``), the ``num-examples`` it reported and the
training configuration it was sent, as the capture folders of :mod:`gradjax.integrations.audit`. In a ServerApp::

  from flwr.serverapp.strategy import FedAvg
  from gradjax.integrations.flower import AuditStrategy

  strategy = AuditStrategy(FedAvg(fraction_evaluate=0.0), "audit",
                           metadata={"model": "lenet_zhu", "input_shape": "32,32,3",
                                     "local_epochs": 1})
  strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=3,
                 train_config=ConfigRecord({"lr": 0.01, "batch-size": 1}))

then ``gradjax audit --audit_dir=audit`` (or ``attack=audit.settings()`` here, which
attacks each round in a separate process while the federation goes on). Recording never raises into
the federation: a failure is logged and that reply is skipped.

Failed clients are never silent: at the end of every round the strategy logs (through Flower's
logger, so ``flwr run --stream`` shows it) how many of the clients sent work failed and why (the
ClientApp raised, a malformed reply, no reply), keeps them in :attr:`AuditStrategy.failures`, and
writes them to ``round_NNN/round.json`` of the recorded rounds, which the audit's index reports.
:meth:`AuditStrategy.raise_if_failed` ends a ServerApp with an error when a round lost every client.
Neither are the other faults of a federation: a node that replies more than once in a round has each
reply recorded as a capture of its own (``client_<node>-reply2``, never merged into the first) and
named in ``round.json``; the nodes sent work each round are kept there too, so a SuperNode restarted
between rounds (it registers again, under a new node id) shows as a node gone and a new one in the
audit's round table (:func:`gradjax.integrations.audit.membership`).

What the server cannot see in an update, a client declares in its reply: a ``ConfigRecord`` under
:data:`DECLARATIONS` (:func:`declarations` builds it) with its model variant, normalisation, loss
reduction, local recipe and defense (a ``defense`` spec, and the DP-SGD its training ran:
``dp_sgd_max_norm``, ``dp_sgd_noise_multiplier``, ... as Opacus' ``make_private`` took them).
:class:`AuditStrategy` records them with each capture (they take
precedence over the server's ``metadata`` and config), so ``gradjax audit --config.attack.adaptive=True`` adapts to
each client's own defense, and :func:`leakage_mod` reads the same record on the client.
"""

import collections
import logging
import os
import time
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from gradjax import auto, data, defenses, fidelity, interop, models
from gradjax.integrations import audit
from gradjax.run import config as run_config

logger = logging.getLogger("flwr.gradjax")  # a child of Flower's logger: in the ServerApp's log


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
  """An ``ArrayRecord``'s arrays by name, as NumPy (its keys are the ``state_dict`` names)."""
  return {name: np.asarray(array.numpy()) for name, array in record.items()}


def _plain(record) -> dict[str, Any]:
  return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in dict(record).items()}


DECLARATIONS = "gradjax-declarations"  # the reply's ConfigRecord of what the client declares
# What a client may declare: capture metadata keys (gradjax.interop's file format).
DECLARABLE = ("model", "act", "normalization", "loss_reduction", "train", "defense", "local_lr",
              "local_epochs", "local_batch_size", "local_momentum", "input_shape", "num_classes",
              *interop.DP_SGD_KEYS)


def _check_declared(facts: dict[str, Any]) -> dict[str, Any]:
  unknown = sorted(set(facts) - set(DECLARABLE))
  if unknown:
    raise ValueError(f"unknown declaration(s) {', '.join(unknown)}; a client declares "
                     f"{', '.join(DECLARABLE)}")
  bad = [k for k, v in facts.items() if not isinstance(v, (str, int, float, bool))]
  if bad:
    raise ValueError(f"declaration {bad[0]!r} must be a string, number or bool, got "
                     f"{facts[bad[0]]!r} (an input shape is written '32,32,3')")
  interop.declared_dp_sgd(interop.metadata_strings(facts, "declarations"), "declarations")
  return facts


def declarations(**facts) -> ConfigRecord:
  """A client's declarations for its reply: ``reply.content[DECLARATIONS] = declarations(
  model="lenet_zhu", normalization="cifar10", defense="prune:0.7")``. Keys: :data:`DECLARABLE`
  (``None`` values are left out); values are strings, numbers or bools. A PyTorch client that does
  not import gradjax writes the same ``ConfigRecord`` itself."""
  return ConfigRecord(_check_declared({k: v for k, v in facts.items() if v is not None}))


def declared(content) -> dict[str, Any]:
  """The declarations in a reply's ``content`` (a ``RecordDict``; empty without them). Raises
  ``ValueError`` for keys or values :func:`declarations` would refuse."""
  if DECLARATIONS not in content.config_records:
    return {}
  return _check_declared(_plain(content.config_records[DECLARATIONS]))


class AuditStrategy(Strategy):
  """``strategy`` with every audited round's messages recorded under ``audit_dir``.

  Args:
    strategy: the Flower strategy that does the federated learning (unchanged by the wrapper; the
      replies it aggregates are the clients', but where only some of a round's clients run the
      gate (:func:`leakage_mod`) the others' metrics get the gate's, as not audited, so that the
      round aggregates: :data:`NOT_AUDITED`; and the data indices a client adds for the audit
      (``keys.data_indices``) are taken out of its metrics once read).
    audit_dir: where to record; a folder that exists and is not empty is left alone and the next
      free ``audit_dir-1``, ``-2``, ... is used instead (:attr:`audit_dir` says which, and a
      warning); the folder is created and taken at once (:func:`gradjax.integrations.audit.unique_dir`).
      ``None``: nothing is recorded; the failures are still counted and the gate's metrics
      completed (a federation where some clients run :func:`leakage_mod`).
    rounds: the rounds to record (``None``: all).
    clients: node ids to record, or an int: that many clients per round (the lowest node ids
      among the replies); ``None``: all.
    max_bytes: stop recording once the files would take more than this many bytes.
    metadata: facts the server knows and the messages do not carry, for every capture (e.g.
      ``model``, ``input_shape``, or ``local_epochs`` when clients read it from their run config).
    keys: where the app puts the local training in its ``ConfigRecord`` and the example count and
      data indices in its reply metrics (:class:`gradjax.integrations.audit.RecordKeys`).
    attack: :class:`gradjax.integrations.audit.Settings` (:func:`gradjax.integrations.audit.settings`) to
      attack each round as soon as it is recorded, in a separate process; ``None`` (default) only
      records.
  """

  def __init__(self, strategy: Strategy, audit_dir, *, rounds: Collection[int] | None = None,
               clients: int | Collection[int] | None = None, max_bytes: int | None = None,
               metadata: dict[str, Any] | None = None,
               keys: audit.RecordKeys = audit.RecordKeys(),
               attack: audit.Settings | None = None):
    if not isinstance(strategy, Strategy):
      raise TypeError(f"AuditStrategy wraps a flwr.serverapp.strategy.Strategy, got "
                      f"{type(strategy).__name__}")
    if isinstance(clients, int) and clients < 1:
      raise ValueError(f"clients must be positive, got {clients}")
    if max_bytes is not None and max_bytes < 1:
      raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if attack is not None and not isinstance(attack, audit.Settings):
      raise TypeError(f"attack= takes gradjax.integrations.audit.settings(...), got "
                      f"{type(attack).__name__}")
    metadata = audit.static_metadata(metadata, "AuditStrategy")
    self.strategy = strategy
    self.audit_dir = None if audit_dir is None else audit.unique_dir(audit_dir)
    if audit_dir is not None and self.audit_dir != os.path.abspath(os.fspath(audit_dir)):
      logger.warning("audit: %s holds another run's files; this federation is recorded in %s",
                     os.fspath(audit_dir), self.audit_dir)
    self.rounds = None if rounds is None else frozenset(int(r) for r in rounds)
    self.clients = clients if clients is None or isinstance(clients, int) else frozenset(clients)
    self.max_bytes = max_bytes
    self.metadata = dict(metadata or {})
    self.keys = keys
    self.attack = attack
    self.bytes_written = 0
    self.seconds_recording = 0.0  # time the federation waited for the recorder
    self.processes: list = []   # background attack processes (attack mode)
    self._full = False
    self._sent: dict[int, Any] = {}
    self._expected: list[int] = []  # the nodes sent work this round
    self._messages: list[Message] = []  # the messages that sent it
    self._sent_to: dict[str, int] = {}
    self.failures: dict[int, dict[int, str]] = {}  # round -> node -> why it failed
    self.clients_sent: dict[int, int] = {}  # round -> clients sent work
    self.nodes: dict[int, list[int]] = {}  # round -> the nodes sent work
    self.duplicates: dict[int, dict[int, int]] = {}  # round -> node -> replies, where more than one
    self.broken: dict[int, str] = {}  # round -> the first tensor of its global model holding NaN/inf

  # The Strategy interface: everything goes to the wrapped strategy.

  def __getattr__(self, name):  # the wrapped strategy's attributes (e.g. FedAvg's keys)
    if "strategy" not in self.__dict__:
      raise AttributeError(name)
    return getattr(self.__dict__["strategy"], name)

  def summary(self) -> None:
    self.strategy.summary()

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> Iterable[Message]:
    broken = _non_finite(arrays_to_numpy(arrays))
    if broken:  # e.g. the wrapped strategy averaged a reply that held NaN
      self.broken[server_round] = broken
      logger.error("round %d: the global model sent holds NaN or infinity (in %s): the clients train "
                   "on nothing from here on", server_round, broken)
    messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
    self._sent = {}
    self._messages = messages  # their ids are set when the grid sends them
    self._expected = [m.metadata.dst_node_id for m in messages]
    if self._audited(server_round):
      self._sent = {m.metadata.dst_node_id: m.content for m in messages}
    return messages

  def _node(self, reply: Message) -> int:
    """The node a reply answers for: its sender, or for an error the SuperLink sent in a node's
    place (a node that stopped sending heartbeats: sender ``SUPERLINK_NODE_ID``), the node its
    message went to."""
    node = reply.metadata.src_node_id
    if node in self._expected or not reply.has_error():
      return node
    return self._sent_to.get(reply.metadata.reply_to_message_id, node)

  def aggregate_train(self, server_round: int, replies: Iterable[Message]):
    replies = list(replies)
    self._sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in self._messages
                     if m.metadata.message_id}  # message id -> node, now that the grid sent them
    failed = {self._node(m): f"the client failed: {m.error.reason}" for m in replies if m.has_error()}
    replied = {self._node(m) for m in replies}
    failed.update({node: "no reply" for node in self._expected if node not in replied})
    self.failures[server_round] = failed
    self.clients_sent[server_round] = len(self._expected)
    self.nodes[server_round] = sorted(self._expected)
    counts = collections.Counter(self._node(m) for m in replies)
    self.duplicates[server_round] = {node: k for node, k in sorted(counts.items()) if k > 1}
    if self._sent:
      start = time.perf_counter()
      try:
        self._record(server_round, replies)
      except Exception as e:  # noqa: BLE001 - the audit must never break the federation
        logger.error("audit: recording round %d failed: %s", server_round, e)
      self._sent = {}
      self.seconds_recording += time.perf_counter() - start
    self._report(server_round)
    _complete_gate_metrics(replies)
    _drop_metrics(replies, self.keys.data_indices)
    return self.strategy.aggregate_train(server_round, replies)

  def _report(self, server_round: int) -> None:
    """Logs the round's failed clients (every round), and writes them to its ``round.json`` (the
    recorded rounds)."""
    failed, sent = self.failures[server_round], self.clients_sent[server_round]
    if failed:
      first = sorted(failed.items())[0]
      logger.warning("round %d: %d of %d clients failed (node %s: %s)", server_round, len(failed),
                     sent, first[0], first[1])
    else:
      logger.info("round %d: all %d clients replied", server_round, sent)
    for node, k in self.duplicates[server_round].items():
      logger.warning("round %d: node %d replied %d times; each reply is recorded, and the wrapped "
                     "strategy aggregates every one", server_round, node, k)
    earlier = [r for r in self.nodes if r < server_round]
    if earlier:  # a SuperNode that restarted registers again: a node gone and a new one
      before, now = set(self.nodes[max(earlier)]), set(self.nodes[server_round])
      if before != now:
        logger.info("round %d: nodes new since round %d: %s; gone: %s", server_round, max(earlier),
                    sorted(now - before) or "none", sorted(before - now) or "none")
    round_dir = os.path.join(self.audit_dir or "", f"round_{server_round:03d}")
    if self.audit_dir is not None and os.path.isdir(round_dir):
      try:
        audit.write_round_summary(round_dir, server_round, sent, failed,
                                  nodes=self.nodes[server_round],
                                  duplicates=self.duplicates[server_round])
      except OSError as e:
        logger.error("audit: round %d: summary not written: %s", server_round, e)

  def raise_if_failed(self) -> None:
    """Raises ``RuntimeError`` (one line) when some round lost every client it sent work to, or sent
    a global model holding NaN or infinity: a federation that trained on nothing must not end as a
    success."""
    if self.broken:
      first = min(self.broken)
      raise RuntimeError(f"the global model of round(s) {', '.join(map(str, sorted(self.broken)))} "
                         f"held NaN or infinity (round {first}: {self.broken[first]})")
    lost = [r for r, failed in sorted(self.failures.items())
            if failed and len(failed) >= self.clients_sent.get(r, 0)]
    if lost:
      reason = sorted(self.failures[lost[0]].items())[0][1]
      raise RuntimeError(f"every client failed in round(s) {', '.join(map(str, lost))} (e.g. "
                         f"{reason})")

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    return self.strategy.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
    return self.strategy.aggregate_evaluate(server_round, replies)

  # Recording.

  def _audited(self, server_round: int) -> bool:
    return (self.audit_dir is not None and not self._full
            and (self.rounds is None or server_round in self.rounds))

  def _selected(self, replies: list[Message]) -> list[Message]:
    if self.clients is None:
      return replies
    if isinstance(self.clients, int):
      keep = set(sorted(self._node(m) for m in replies)[:self.clients])
    else:
      keep = self.clients
    return [m for m in replies if self._node(m) in keep]

  def _fits(self, size: int) -> bool:
    if self.max_bytes is not None and self.bytes_written + size > self.max_bytes:
      if not self._full:
        logger.warning("audit: the %d-byte cap is reached after %d bytes; recording stops",
                       self.max_bytes, self.bytes_written)
      self._full = True
    return not self._full

  def _record(self, server_round: int, replies: list[Message]) -> None:
    round_dir = os.path.join(self.audit_dir, f"round_{server_round:03d}")
    array_key = getattr(self.strategy, "arrayrecord_key", "arrays")
    config_key = getattr(self.strategy, "configrecord_key", "config")
    written: dict[int, tuple[str, dict[str, np.ndarray]]] = {}  # sent ArrayRecord id -> file, arrays
    recorded = 0
    replies_of: collections.Counter = collections.Counter()  # node -> its replies so far
    for reply in self._selected(replies):
      node = self._node(reply)
      replies_of[node] += 1
      content = self._sent.get(node)
      if content is None or array_key not in content:
        logger.warning("audit: round %d: no message to node %d on record; reply skipped",
                       server_round, node)
        continue
      sent_arrays = content[array_key]
      config = _plain(content[config_key]) if config_key in content else {}
      if id(sent_arrays) not in written:
        arrays = arrays_to_numpy(sent_arrays)
        if not self._fits(sum(a.nbytes for a in arrays.values())):
          break
        weights_file = os.path.join(round_dir, f"weights-{len(written)}.safetensors"
                                    if written else audit.WEIGHTS)
        os.makedirs(round_dir, exist_ok=True)
        self.bytes_written += audit.write_round_weights(weights_file, arrays, self.metadata)
        written[id(sent_arrays)] = (weights_file, arrays)
      weights_file, arrays = written[id(sent_arrays)]
      info: dict[str, Any] = {"round": server_round, "client": node, "config": config}
      name = f"client_{node}"
      if replies_of[node] > 1:  # recorded as its own capture, never merged into the first
        info["reply"] = replies_of[node]
        name = f"client_{node}-reply{replies_of[node]}"
      returned, metrics = None, {}
      if reply.has_error():
        info["error"] = f"the client failed: {reply.error.reason}"
      else:
        for record in reply.content.metric_records.values():
          metrics.update(_plain(record))
        try:
          if array_key not in reply.content:
            raise ValueError(f"the reply holds no ArrayRecord {array_key!r}")
          returned = arrays_to_numpy(reply.content[array_key])
          audit.check_reply(arrays, returned)
        except Exception as e:  # noqa: BLE001 - whatever a client sent, it is reported, not raised
          info["error"] = f"malformed reply: {e}"
          returned = None
      info["metrics"] = metrics
      meta = dict(self.metadata)
      try:
        indices = audit.data_indices(metrics, self.keys)
        if indices is not None:
          info["data_indices"] = indices
        meta = audit.capture_metadata(self.metadata, config, metrics, self.keys)
      except (TypeError, ValueError, OverflowError) as e:  # e.g. num-examples NaN
        info.setdefault("error", f"malformed reply metrics: {e}")
        returned = None
      if not reply.has_error():
        try:  # what the client declares of itself comes last: it knows what it did
          info["declarations"] = declared(reply.content)
          meta.update(info["declarations"])
        except ValueError as e:
          info.setdefault("error", f"malformed declarations: {e}")
          returned = None
      size = 0 if returned is None else sum(a.nbytes for a in returned.values())
      if not self._fits(size):
        break
      if "error" in info:
        logger.warning("audit: round %d client %d: %s%s", server_round, node, info["error"],
                       "; the wrapped strategy receives the reply as it is" if returned is None
                       and not reply.has_error() else "")
        self.failures[server_round].setdefault(node, info["error"])
      try:
        self.bytes_written += audit.write_capture(
            os.path.join(round_dir, name), weights_file, returned, info, meta)
      except Exception as e:  # noqa: BLE001 - one client's record failing leaves the others'
        logger.error("audit: round %d client %d: not recorded: %s", server_round, node, e)
        continue
      recorded += 1
    if recorded and self.attack is not None:
      self.processes.append(audit.attack_in_background(self.audit_dir, server_round, self.attack))


# --- the client side: a mod that holds back updates that leak ---------------------------------------

GATE_METRICS = ("gradjax-audited", "gradjax-leak-db", "gradjax-psnr", "gradjax-leak")
# The gate's metrics of an update it did not audit.
NOT_AUDITED = {"gradjax-audited": 0, "gradjax-leak-db": 0.0, "gradjax-psnr": 0.0, "gradjax-leak": 0}


def _complete_gate_metrics(replies) -> None:
  """Adds :data:`NOT_AUDITED` to the metrics of the round's replies that lack the gate's, when
  another reply carries them: Flower's strategies aggregate only replies whose metrics have the
  same keys, so a federation where some clients run :func:`leakage_mod` and others do not would
  otherwise skip the round's aggregation (FedAvg: ``InconsistentMessageReplies``)."""
  ok = [m for m in replies if not m.has_error()]
  gated = [any(GATE_METRICS[0] in r for r in m.content.metric_records.values()) for m in ok]
  if any(gated):
    for m, g in zip(ok, gated):
      if not g:
        _add_metrics(m, NOT_AUDITED)


def _non_finite(arrays: dict[str, np.ndarray]) -> str | None:
  """The name of the first floating-point array of ``arrays`` that holds NaN or infinity, or None."""
  return next((name for name, a in arrays.items()
               if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a))), None)


def _drop_metrics(replies, keys) -> None:
  """Takes ``keys`` (the data indices a client adds for the audit, which it has read) out of the
  replies' metrics: averaging them means nothing, and lists of different lengths (clients of
  different sizes) stop Flower's metric aggregation."""
  for m in replies:
    if not m.has_error():
      for record in m.content.metric_records.values():
        for key in keys:
          if key in record:
            del record[key]


def gray_baseline_psnr(x: np.ndarray) -> float:
  """Mean PSNR (dB) of a uniform 0.5 gray image against the images ``x`` (N, H, W, C) in [0, 1]:
  what a reconstruction that knows nothing of the data scores on them."""
  from gradjax import metrics
  return float(np.mean(metrics.psnr(np.full_like(np.asarray(x, np.float64), 0.5), x)))


MODEL_REFUSED = audit.MODEL_REFUSED
received_findings = audit.received_findings


# The options the gate reads (dotted paths of :mod:`gradjax.run.config`), and the defaults it sets
# over the schema's: it attacks with ``auto`` (the schema's default attack is DLG's), and the model
# is the metadata's unless ``model.name`` names it (the schema's default is lenet_zhu).
GATE_OPTIONS = ("model.name", "data.normalization", "defense.spec", "defense.dp_sgd_max_norm",
                "defense.dp_sgd_noise_multiplier", "attack.preset", "attack.iterations",
                "attack.restarts", "gate.threshold_db", "gate.rounds", "gate.time_budget_s",
                "gate.refuse_malicious")
GATE_DEFAULTS = {"attack.preset": auto.AUTO, "model.name": None}


def leakage_mod(examples, options: dict[str, Any] | None = None, *,
                metadata: dict[str, Any] | None = None, defense=None,
                keys: audit.RecordKeys = audit.RecordKeys(),
                compilation_cache: str | None = None):
  """A ClientApp mod (``ClientApp(mods=[leakage_mod(...)])``) that attacks the client's own outgoing
  update and withholds it when the attack recovers the client's examples::

    leakage_mod(examples, {"model.name": "lenet_zhu", "defense.spec": "prune:0.7",
                           "gate.threshold_db": 10.0})

  On the training rounds it audits (``gate.rounds``), after the ClientApp has replied: the update
  (the weights the server sent against those the client returns, with the local training the
  server's config and the reply's metrics state, as :class:`AuditStrategy` records it) is attacked as a
  server would attack it (:func:`gradjax.integrations.audit.attack_capture`, in a process of its
  own, the attack adapted to the client's defense, stopping once it crosses the threshold), the best
  reconstruction is scored against the client's examples, and its leak score is its PSNR minus what a uniform gray image scores on the
  same examples (:func:`gray_baseline_psnr`: dB above knowing nothing, so one threshold means the
  same on any data). At or above ``gate.threshold_db`` the reply is replaced by an error (code
  ``MOD_FAILED_PRECONDITION``, reason ``gradjax leakage_mod: update withheld ...``): the strategy
  counts a failed client and the update never leaves. Otherwise the reply goes out with
  :data:`GATE_METRICS` added to its metrics (audited 1 or 0, leak score and PSNR in dB, leak
  verdict 1 or 0 of :mod:`gradjax.verdict`). An update that carries nothing (the weights come back
  as sent, :func:`gradjax.fidelity.zero_arrays`) passes unattacked, audited, with a leak score of 0.
  An attack that fails or runs past ``gate.time_budget_s`` passes the update with
  ``gradjax-audited = 0`` and a warning in the log: the mod never fails a client or holds a round
  beyond its budget. With ``gate.refuse_malicious`` (the default) it first checks the model the
  server sent (:func:`received_findings`: tensors other than the declared model's, dense units that
  share one direction as an imprint's do) and refuses to train on one built to leak: the reply is
  an error naming why (``gradjax leakage_mod: model refused ...``), on every training round; trap
  weights are seen on the round's ``examples`` (their biases). An input layer whose units fire for
  few of those examples for another reason (an honest layer whose units died in training:
  :func:`gradjax.malicious.rarely_firing`) is no sign against the server but gives examples back:
  it is logged, the client trains, and the update's own audit after training decides, in that
  round whatever ``gate.rounds`` says.

  Args:
    examples: ``examples(message, context) -> (x, y)``: the examples the client trained on in this
      round, images (N, H, W, C) in [0, 1] before any normalisation, and their labels.
    options: dotted path -> value, the options of :mod:`gradjax.run.config` the gate reads
      (:data:`GATE_OPTIONS`; the ``gate`` section is its own): ``model.name`` the gradjax zoo twin
      of the client's model (default ``metadata["model"]``), ``data.normalization``,
      ``defense.spec`` the defense the client applies (a reply's declared defense,
      :data:`DECLARATIONS`, takes precedence), ``defense.dp_sgd_max_norm`` and
      ``defense.dp_sgd_noise_multiplier`` the DP-SGD its training runs (Opacus' clipping bound and
      noise multiplier: the attack then clips its examples as the client does; a reply's declared
      ``dp_sgd_*`` take precedence), the attack's ``attack.preset`` (default ``auto``:
      :func:`gradjax.auto.for_metadata`'s first), ``attack.iterations`` and ``attack.restarts``.
      ValueError for another option or a value its section refuses.
    metadata: capture metadata (:mod:`gradjax.interop`: ``input_shape``, ``normalization``, the
      local training where the server's config does not state it).
    defense: ``defense(context) -> spec or None``, the defense of a client that chooses its own
      (the ``Context`` says which); it takes precedence over ``defense.spec``.
    keys: where the server's config and the reply's metrics state the local training.
    compilation_cache: the attack's persistent compilation cache (default gradjax's, the
      command line's; '' : none): rounds after the first load the attack's programs.
  """
  given = dict(options or {})
  outside = [p for p in given if p not in GATE_OPTIONS]
  if outside:
    raise ValueError(f"leakage_mod reads the options {', '.join(GATE_OPTIONS)}; not "
                     f"{', '.join(outside)}")
  if defense is not None and not callable(defense):
    raise TypeError("leakage_mod: defense= is a function of the Flower context; a fixed defense "
                    "is the option defense.spec")
  built = run_config.sections({**GATE_DEFAULTS, **given},
                              ("model", "data", "defense", "attack", "gate"))
  gate, attack = built["gate"], built["attack"].preset
  if attack != auto.AUTO and attack not in audit.ATTACKS:
    raise ValueError(f"attack.preset={attack!r}: choose auto or one of {', '.join(audit.ATTACKS)}")
  iterations, restarts = built["attack"].iterations, built["attack"].restarts
  normalization = built["data"].normalization
  import shutil
  import tempfile
  from flwr.app import Error, MessageType
  from flwr.common.constant import ErrorCode
  from gradjax import compilation
  cache = compilation.DEFAULT_CACHE if compilation_cache is None else compilation_cache

  static = audit.static_metadata(metadata, "leakage_mod")
  if built["model"].name is not None:
    static["model"] = built["model"].name
  _check_gate(built, static, defense)

  def score(msg, reply, context, config, server_round):
    metrics: dict[str, Any] = {}
    for record in reply.content.metric_records.values():
      metrics.update(_plain(record))
    own = declared(reply.content)  # what the server's record holds too
    spec = own.get("defense") or (defense(context) if defense else built["defense"].spec)
    if spec is not None and not isinstance(spec, str):
      raise TypeError(f"the client's defense is a spec string (gradjax.defenses.parse), got "
                      f"{type(spec).__name__}")
    meta = audit.capture_metadata({**static, **({"defense": spec} if spec else {})}, config,
                                  metrics, keys)
    meta.update(own)
    sent = arrays_to_numpy(next(iter(msg.content.array_records.values())))
    returned = arrays_to_numpy(next(iter(reply.content.array_records.values())))
    if sent.keys() == returned.keys():
      zero = fidelity.zero_arrays([sent[k] - returned[k] for k in sent], list(sent.values()))
      if zero:  # nothing to attack, and no activation to read off zeros
        return {"attack": None, "psnr": None, "verdict": "no_leak_found", "reason": zero}, None
    x, y = examples(msg, context)
    x = np.asarray(x, np.float32)
    truth = data.Dataset(x, np.asarray(y, np.int64), int(max(np.max(y) + 1, 10)), "client")
    gray = gray_baseline_psnr(x)
    tmp = tempfile.mkdtemp(prefix="gradjax_gate_")
    try:
      weights = os.path.join(tmp, audit.WEIGHTS)
      audit.write_round_weights(weights, sent, static)
      folder = os.path.join(tmp, "capture")
      audit.write_capture(folder, weights, returned, {"round": server_round, "client": "self",
                                                       "config": config}, meta)
      chosen = attack if attack != auto.AUTO else auto.for_metadata(meta, meta.get("model"))[0]
      settings = audit.settings((chosen,), {
          "model.name": meta.get("model"), "attack.iterations": iterations,
          "attack.restarts": restarts, "data.normalization": normalization,
          "output.lpips": "none", "attack.adaptive": True,
          "defense.dp_sgd_max_norm": built["defense"].dp_sgd_max_norm,
          "defense.dp_sgd_noise_multiplier": built["defense"].dp_sgd_noise_multiplier})
      # The attack stops once it crosses the threshold: the update is withheld then, and no sooner.
      rows = audit.attack_in_process(folder, settings, truth=truth, timeout_s=gate.time_budget_s,
                                     compilation_cache=cache, target_psnr=gray + gate.threshold_db)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    scored = [r for r in rows if r.get("psnr") is not None]
    if not scored:
      raise RuntimeError(next((r["error"] for r in rows if r.get("error")), "no attack was scored"))
    best = max(scored, key=lambda r: r["psnr"])
    return best, best["psnr"] - gray

  def mod(msg, context, call_next):
    suspicious = False  # the received model's input layer fires rarely: this round's update is audited
    if msg.metadata.message_type == MessageType.TRAIN and msg.content.array_records:
      broken = _non_finite(arrays_to_numpy(next(iter(msg.content.array_records.values()))))
      if broken:  # the server's own failure (an aggregate of a broken reply), not a model built to leak
        reason = (f"gradjax leakage_mod: the received model holds NaN or infinity (in {broken}); "
                  "nothing to train on")
        logger.warning("%s", reason)
        return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)
    if (gate.refuse_malicious and msg.metadata.message_type == MessageType.TRAIN
        and static.get("model") and msg.content.array_records):
      sent = arrays_to_numpy(next(iter(msg.content.array_records.values())))
      try:  # the client's examples, as the model reads them, for the trap-weight check
        x, _ = examples(msg, context)
        norm = data.normalization(normalization or static.get("normalization") or "none")
        inputs = np.asarray(data.normalize(np.asarray(x, np.float32), norm))
      except Exception as e:  # noqa: BLE001 - the weights are still checked
        logger.warning("leakage_mod: the round's examples were not read for the check (%s)", str(e)[:300])
        inputs = None
      try:  # the examples' shape where the metadata state none
        shape = static.get("input_shape") or (None if inputs is None else inputs.shape[1:])
        if shape is None:
          raise ValueError("no input_shape in the metadata and no examples to read it from")
        if isinstance(shape, str):
          shape = interop.parse_shape(shape, "metadata input_shape")
        findings, rare = audit.received_check(sent, static["model"], tuple(shape), inputs=inputs)
      except Exception as e:  # noqa: BLE001 - a check that cannot run never fails the client
        logger.warning("leakage_mod: the received model was not checked (%s)", str(e)[:300])
        findings, rare = [], {}
      for path, rate in rare.items():
        suspicious = True
        logger.warning("leakage_mod: the received model's %s: its units fire for %.1f%% of this "
                       "round's examples, so most examples have units of their own; the update is "
                       "audited after training", path, 100 * rate)
      if findings:
        reason = (f"{MODEL_REFUSED}: {findings[0].reason}"
                  + (f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""))
        logger.warning("%s", reason)
        return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)
    reply = call_next(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
      return reply
    config = {}
    for record in msg.content.config_records.values():
      config.update(_plain(record))
    server_round = int(config.get("server-round", 0))
    if not (gate.audits(server_round) or suspicious):
      return reply
    start = time.monotonic()
    try:
      best, leak_db = score(msg, reply, context, config, server_round)
    except Exception as e:  # noqa: BLE001 - the gate never fails the client: the update passes
      logger.warning("leakage_mod: round %d: not audited (%s); the update passes", server_round,
                     " ".join(str(e).split())[:300])
      _add_metrics(reply, NOT_AUDITED)
      return reply
    seconds = time.monotonic() - start
    if leak_db is None:
      logger.info("leakage_mod: round %d: update passes: %s", server_round, best["reason"])
      _add_metrics(reply, {"gradjax-audited": 1, "gradjax-leak-db": 0.0, "gradjax-psnr": 0.0,
                           "gradjax-leak": 0})
      return reply
    leak = int(best.get("verdict") == "leak")
    if leak_db >= gate.threshold_db:
      # (No verdict here: the attack stopped where it crossed the threshold, below what the
      # verdict's rule needs to call an image recognisable.)
      reason = (f"{audit.WITHHELD}: {best['attack']} recovers the client's "
                f"examples at {best['psnr']:.1f} dB, {leak_db:.1f} dB above a gray image "
                f"(threshold {gate.threshold_db:g} dB), in {best.get('iterations')} iterations")
      logger.warning("round %d: %s (%.0f s)", server_round, reason, seconds)
      return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)
    logger.info("leakage_mod: round %d: update passes: %s at %.1f dB, %.1f dB above a gray image "
                "(threshold %g dB; %.0f s)", server_round, best["attack"], best["psnr"], leak_db,
                gate.threshold_db, seconds)
    _add_metrics(reply, {"gradjax-audited": 1, "gradjax-leak-db": float(leak_db),
                         "gradjax-psnr": float(best["psnr"]), "gradjax-leak": leak})
    return reply

  return mod


def _check_gate(built: dict[str, Any], static: dict[str, Any], defense) -> None:
  """What would leave every round of a gate unaudited, refused when it is built (ValueError): no
  model or an unknown one, a defense spec that does not parse or one given twice, iterations that
  are not positive (the sections check the rest: :func:`gradjax.run.config.check_values`)."""
  if not static.get("model"):
    raise ValueError("leakage_mod: name the client's model (the option model.name, or "
                     "metadata['model']): a gradjax zoo name")
  if built["model"].name is not None:
    models.check_name(built["model"].name, "leakage_mod: model.name")
  if built["defense"].spec is not None:
    if defense is not None:
      raise ValueError("leakage_mod: the client's defense is defense.spec or defense=, not both")
    defenses.parse(built["defense"].spec)
  if built["attack"].iterations is not None and built["attack"].iterations < 1:
    raise ValueError(f"leakage_mod: attack.iterations must be positive (None: the preset's), got "
                     f"{built['attack'].iterations}")


def _add_metrics(reply, values: dict[str, float]) -> None:
  """``values`` added to the reply's (first) MetricRecord, or to a new one named ``metrics``."""
  records = reply.content.metric_records
  if records:
    record = next(iter(records.values()))
    for k, v in values.items():
      record[k] = v
  else:
    reply.content["metrics"] = MetricRecord(values)
