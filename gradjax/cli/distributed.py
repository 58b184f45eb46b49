"""One run over several processes: ``jax.distributed`` with CPU collectives, one writer, agreement
between processes, and faults that end every process in bounded time with one line.

A run over P processes is the same command started P times with the same flags, each with its
``--process_id`` (or none of the launch flags where JAX detects the cluster: SLURM, Open MPI, TPU
pods). Two kinds of runs:

* one attack (``--config.execution.shard=True``) splits its restarts and permutation candidates over every device of
  every process (after :func:`initialize` they are all in ``jax.devices()``, :mod:`gradjax.sharding`); every process computes the same host values, and only process 0
  (:func:`is_writer`) writes results, reports and the resume state;
* a campaign (``sweep``, the table programs, ``audit``) splits its experiments over the processes
  (:class:`gradjax.run.campaign.Items`, :func:`gather`): each process runs and writes its own, and
  process 0 reads the others' back as they are written and writes the table. Its processes share JAX's coordination
  service only (``initialize(collectives=False)``): each is a JAX of its own, with its own devices
  and the persistent compilation cache.

Every process must see the output folder (one machine, or a shared filesystem): process 0 chooses it
(:func:`agree`), the others read the state files and experiments written there.

Faults. The processes watch each other through JAX's coordination service: a process that dies
stops sending heartbeats, and after ``heartbeat_timeout_s`` every other process prints one line
naming it and exits (code 1); one that fails with an error of its own (a bad file, say) posts that
error first, so the others name it at once. A collective whose peer is gone fails at once (gloo
reports the closed connection), and the process waiting in it exits the same way. Nothing is left
half-written: every file gradjax writes is written to a temporary name and renamed. Rerunning the same
commands with ``--resume`` continues from the last saved state and skips finished experiments.
"""

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable

import jax

from gradjax.run import processes
from gradjax.run.processes import is_writer, process_count, process_index  # noqa: F401  (re-exported)

EXIT_FAULT = 1  # another process stopped; rerun with --resume
_FAILED = "gradjax/failed/"  # coordination-service keys: process -> the error it stopped with
_FINISHED = "gradjax/finished/"  # process -> "1" once it has done its part and leaves
_settings = {"heartbeat_timeout_s": 60.0}
_exiting = threading.Lock()  # held by the thread that ends the process (one line, once)


class Error(Exception):
  """A run over several processes could not start (one line)."""


def _initialized() -> bool:
  return jax.distributed.is_initialized()


def _client():
  if processes.launched:
    return processes.launched["client"]
  from jax._src import distributed as jd
  return jd.global_state.client


# Seconds without a heartbeat after which a process counts as stopped: a run whose coordinator is on
# this machine (127.0.0.1, localhost) notices a lost process in seconds; a cluster's network and
# schedulers get JAX's minute.
LOCAL_HEARTBEAT_TIMEOUT_S = 10
CLUSTER_HEARTBEAT_TIMEOUT_S = 60


def heartbeat_timeout(coordinator_address: str | None) -> int:
  """:data:`LOCAL_HEARTBEAT_TIMEOUT_S` for a coordinator on the loopback interface (``127.*``,
  ``localhost``, ``::1``), else :data:`CLUSTER_HEARTBEAT_TIMEOUT_S` (also when the cluster is
  detected: ``None``)."""
  if not coordinator_address:
    return CLUSTER_HEARTBEAT_TIMEOUT_S
  host = coordinator_address.rsplit(":", 1)[0].strip("[]").lower()
  local = host == "localhost" or host.startswith("127.") or host == "::1"
  return LOCAL_HEARTBEAT_TIMEOUT_S if local else CLUSTER_HEARTBEAT_TIMEOUT_S


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: list[int] | None = None, *,
               initialization_timeout_s: int = 300, heartbeat_timeout_s: int | None = None,
               collectives: bool = True) -> None:
  """Joins the run: ``jax.distributed.initialize`` with its arguments (detected from the cluster's
  environment where omitted) and CPU collectives over gloo. Call before anything touches a device.

  ``collectives=False`` (a campaign: every experiment runs on one process): the processes share the
  coordination service (who runs what, failures, liveness) but JAX stays one process per process,
  its devices the local ones, and no process waits in a collective for another's experiment.

  JAX's coordination service, which process 0 hosts, runs here in a child process of process 0
  (:func:`_serve`), in JAX's recoverable mode: when a process dies (process 0 too), the service
  outlives it and the others learn which one is gone (:func:`lost_peer`), instead of being
  aborted by JAX with a C++ stack trace. The child ignores Ctrl-C (the processes save their state
  on it) and exits a second after process 0 has.

  ``heartbeat_timeout_s``: seconds without a heartbeat after which a process counts as stopped
  (``None``: :func:`heartbeat_timeout` of the coordinator's address).

  Raises:
    Error: the arguments are incomplete and no cluster was detected, the run did not form within
      ``initialization_timeout_s`` (the coordinator cannot be reached, a process is missing), or
      the process was already initialized.
  """
  if heartbeat_timeout_s is None:
    heartbeat_timeout_s = heartbeat_timeout(coordinator_address)
  _settings["heartbeat_timeout_s"] = float(heartbeat_timeout_s)
  if not collectives:
    return _coordinate_only(coordinator_address, num_processes, process_id, local_device_ids,
                            initialization_timeout_s, heartbeat_timeout_s)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_enable_recoverability", True)
  from jax._src import distributed as jd
  runtime = getattr(jd, "_jax", None)
  start_service = getattr(runtime, "get_distributed_runtime_service", None)
  if start_service is not None:  # JAX offers no public way to host its service elsewhere
    runtime.get_distributed_runtime_service = _service_in_child
  timer = _formation_deadline(coordinator_address, num_processes, process_id,
                              initialization_timeout_s)
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id, local_device_ids,
                               initialization_timeout=int(initialization_timeout_s) + 60,
                               heartbeat_timeout_seconds=int(heartbeat_timeout_s))
  except (RuntimeError, ValueError, TypeError) as e:
    text = " ".join(str(e).split())
    if "should be defined" in text or "must be defined" in text:
      raise Error(_incomplete(coordinator_address, num_processes, process_id)) from None
    if "DEADLINE_EXCEEDED" in text or "timed out" in text.lower() or "registration" in text:
      raise Error(_not_formed_message(coordinator_address, num_processes, process_id,
                                      initialization_timeout_s)) from None
    raise Error(f"jax.distributed.initialize failed: {_short(text, 300)}") from None
  finally:
    timer.cancel()
    if start_service is not None:
      runtime.get_distributed_runtime_service = start_service
  if jax.process_index() != 0 and jax.default_backend() == "cpu":
    _write_own_cache_entries()


def _write_own_cache_entries() -> None:
  """Lets this process (not process 0) write its programs to the persistent compilation cache.

  Under the multi-process runtime JAX writes the cache from process 0 alone, expecting the others
  to load the same entries; on CPU a program's cache key holds the process's own device topology,
  so the other processes never find process 0's entries and compiled every program in every run
  (measured: process 1 of a two-process DLG attack compiled all 160 of its programs, 11 s, against
  process 0's 0.5 s of cache loads). Their keys are their own, so writing them contends with no
  other process. JAX has no public switch for it: this wraps its private ``_cache_write`` and
  leaves JAX as it is where that is not there."""
  from jax._src import compilation_cache, compiler
  write = getattr(compiler, "_cache_write", None)
  put = getattr(compilation_cache, "put_executable_and_time", None)
  if write is None or put is None or getattr(write, "_gradjax", False):
    return

  def write_own(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if host_callbacks or compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
      return  # as JAX: programs with host callbacks, or too quick to be worth an entry
    try:
      put(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception:  # noqa: BLE001  (a cache that cannot be written only costs a compilation)
      pass

  write_own._gradjax = True
  compiler._cache_write = write_own


def _coordinate_only(coordinator_address, num_processes, process_id, local_device_ids,
                     initialization_timeout_s, heartbeat_timeout_s) -> None:
  """:func:`initialize` without collectives: the coordination service and a client of it, as JAX
  would start them, kept here."""
  from jax._src import clusters
  from jax._src import distributed as jd
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if None in (coordinator_address, num_processes, process_id):
    coordinator_address, num_processes, process_id, local_device_ids = (
        clusters.ClusterEnv.auto_detect_unset_distributed_params(
            coordinator_address, num_processes, process_id, local_device_ids, None,
            initialization_timeout_s))
  if None in (coordinator_address, num_processes, process_id):
    raise Error(_incomplete(coordinator_address, num_processes, process_id))
  if not 0 <= process_id < num_processes:
    raise Error(f"--process_id must lie in 0 .. {num_processes - 1}, got {process_id}")
  if local_device_ids:
    ids = ",".join(str(i) for i in local_device_ids)
    jax.config.update("jax_cuda_visible_devices", ids)
    jax.config.update("jax_rocm_visible_devices", ids)
  service = None
  if process_id == 0:
    service = _service_in_child("[::]:" + coordinator_address.rsplit(":", 1)[1], num_processes,
                                heartbeat_timeout_s, 300)
  timer = _formation_deadline(coordinator_address, num_processes, process_id,
                              initialization_timeout_s)
  client = jd._jax.get_distributed_runtime_client(  # pylint: disable=protected-access
      coordinator_address, process_id, init_timeout=int(initialization_timeout_s) + 60,
      heartbeat_timeout=int(heartbeat_timeout_s), use_compression=True)
  try:
    client.connect()
  except Exception as e:  # noqa: BLE001
    raise Error(f"cannot join the run at {coordinator_address}: {_short(' '.join(str(e).split()))}") from None
  finally:
    timer.cancel()
  processes.launched.update(client=client, count=int(num_processes), index=int(process_id),
                            service=service)


_NO_CLUSTER = ("no cluster detected (SLURM, Open MPI, TPU): give --coordinator_address, "
               "--num_processes and --process_id")


def _incomplete(coordinator_address, num_processes, process_id) -> str:
  """Why a run cannot form from these launch arguments (no cluster detected to fill them in)."""
  missing = [f"--{name}" for name, value in (("coordinator_address", coordinator_address),
                                            ("num_processes", num_processes),
                                            ("process_id", process_id)) if value is None]
  if len(missing) == 3:
    return _NO_CLUSTER
  return (f"{' and '.join(missing)} missing (no cluster detected to give {'them' if len(missing) > 1 else 'it'}): "
          "a run over several processes needs --coordinator_address, --num_processes and "
          "--process_id on every process")


def _not_formed_message(coordinator_address, num_processes, process_id, timeout_s) -> str:
  return (f"process {process_id} of {num_processes}: the run did not form within {timeout_s} s: "
          f"the coordinator at {coordinator_address} cannot be reached, or not every process "
          "started (the same --coordinator_address and --num_processes on each, --process_id "
          "0 .. n-1)")


def _formation_deadline(*where) -> threading.Timer:
  """A started timer that, unless cancelled within the timeout (``where``'s last item), prints
  :func:`_not_formed_message` and exits 2: JAX itself aborts a process whose run does not form in
  time, with a C++ fatal error and a stack trace."""

  def expire():
    print(f"error: {_not_formed_message(*where)}", file=sys.stderr, flush=True)
    os._exit(2)

  timer = threading.Timer(where[-1], expire)
  timer.daemon = True
  timer.start()
  return timer


class _ChildService:
  """What process 0 keeps in place of JAX's service object: the child process that hosts it."""

  def __init__(self, proc):
    self.proc = proc

  def shutdown(self):
    pass  # the child leaves by itself once this process has exited (_serve)


def _service_in_child(address: str, num_nodes: int, heartbeat_timeout: int | None = None,
                      shutdown_timeout: int | None = None, recoverable: bool | None = None,
                      **kw) -> _ChildService:
  """Stands in for ``get_distributed_runtime_service`` in process 0: starts :func:`_serve`."""
  import subprocess
  del recoverable, kw
  cmd = [sys.executable, "-m", "gradjax.cli.distributed", address, str(num_nodes),
         str(heartbeat_timeout or 60), str(shutdown_timeout or 300), str(os.getpid())]
  # Its output goes nowhere (it holds no terminal or pipe of this process open after it exits),
  # but for its first line: "ready", or why the service could not start.
  proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
  first = proc.stdout.readline().strip()
  proc.stdout.close()
  if first != "ready":
    raise Error(f"the coordination service could not start on {address}: "
                f"{first or 'it exited (is the port in use?)'}")
  return _ChildService(proc)


def _serve(address: str, num_nodes: int, heartbeat_timeout: int, shutdown_timeout: int,
           parent: int, grace_s: float = 1.0) -> None:
  """The child of process 0 that hosts JAX's coordination service, until ``grace_s`` after process
  0 (``parent``) has exited."""
  import signal
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  from jax._src import distributed as jd
  try:
    service = jd._jax.get_distributed_runtime_service(  # pylint: disable=protected-access
        address, num_nodes, heartbeat_timeout=heartbeat_timeout, shutdown_timeout=shutdown_timeout,
        recoverable=True)
  except Exception as e:  # noqa: BLE001  (e.g. the port is taken)
    print(_short(" ".join(str(e).split()), 300), flush=True)
    os._exit(2)
  print("ready", flush=True)
  with contextlib.suppress(OSError):
    sys.stdout.close()
  while os.getppid() == parent:  # re-parented once process 0 is gone
    time.sleep(0.2)
  time.sleep(grace_s)
  del service
  os._exit(0)


def watch(every_s: float = 1.0) -> None:
  """Starts a thread that checks the other processes every ``every_s`` and ends this one, naming
  the process, once one posted an error or stopped without saying it finished: so a process
  blocked in a collective or in gloo's rendezvous with a process that is gone never hangs."""
  def loop():
    while not _watch_done.wait(every_s):
      if not processes.state["stopping"]:
        _check_peers()

  thread = threading.Thread(target=loop, name="gradjax-peers", daemon=True)
  thread.start()
  _settings["watch"] = thread


_watch_done = threading.Event()


def _stop_watching() -> None:
  """Ends the watchdog thread before the interpreter does (a daemon thread caught inside a call
  into the coordination service at exit aborts the process)."""
  _watch_done.set()
  thread = _settings.get("watch")
  if thread is not None and thread is not threading.current_thread():
    thread.join(timeout=30)


def _live() -> list[int] | None:
  """The processes the coordination service counts alive (None if it cannot be asked)."""
  try:
    return sorted(_client().get_live_nodes(list(range(process_count()))))
  except Exception:  # noqa: BLE001
    return None


def _short(text: str, width: int = 160) -> str:
  return text if len(text) <= width else text[:width - 3] + "..."


def _exit(what: str, code: int = EXIT_FAULT, resume_hint: bool = True) -> None:
  """``error: process i of P: <what>; ...`` on stderr and exit, skipping JAX's shutdown (which
  would wait for the lost process)."""
  if not _exiting.acquire(blocking=False):  # another thread is printing its line and exiting
    while True:
      time.sleep(1)
  hint = ": rerun the same commands with --resume to continue" if resume_hint else ""
  print(f"error: process {process_index()} of {process_count()}: {what}; every process of the run "
        f"stops{hint}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(code)


def _check_peers() -> None:
  """Exits naming the process that posted its failure, or that the service no longer counts."""
  posted = _posted_failures()
  if posted:
    _exit_naming(posted)
  live = _live()
  if live is not None and len(live) < process_count():
    gone = sorted(set(range(process_count())) - set(live) - _finished())
    if gone:
      _exit(f"process{'es' if len(gone) > 1 else ''} {', '.join(map(str, gone))} stopped "
            f"(no heartbeat for {_settings['heartbeat_timeout_s']:g} s)")


def finished() -> None:
  """Tells the other processes that this one has done its part and leaves: its leaving is then no
  fault (:func:`_check_peers`). Process 0, whose child hosts the coordination service, then waits
  (up to the heartbeat timeout) until the others have left, so that their own shutdown, which
  goes through the service, finds it there."""
  if process_count() > 1 and not _settings.get("finished"):
    _settings["finished"] = True
    _stop_watching()
    try:
      _client().key_value_set(f"{_FINISHED}{process_index()}", "1")
    except Exception:  # noqa: BLE001  (the coordinator is gone: nobody is left to tell)
      return
    if process_index() == 0:  # hosts the service: the others shut down through it first
      deadline = time.monotonic() + _settings["heartbeat_timeout_s"] + 5
      while time.monotonic() < deadline:
        live = _live()
        if live is None or set(live) <= {0}:
          break
        time.sleep(0.1)
    if processes.launched:  # JAX shuts its own client down at exit; this one is ours
      with contextlib.suppress(Exception):
        processes.launched["client"].shutdown()


def _finished() -> set[int]:
  try:
    return {int(key.rsplit("/", 1)[-1]) for key, _ in _client().key_value_dir_get(_FINISHED)}
  except Exception:  # noqa: BLE001
    return set()


def _posted_failures() -> dict[int, str]:
  """{process: its error} posted by processes that stopped with an error of their own."""
  try:
    entries = _client().key_value_dir_get(_FAILED)
  except Exception:  # the coordinator itself is gone  # noqa: BLE001
    return {}
  out = {}
  for key, value in entries:
    try:
      out[int(key.rsplit("/", 1)[-1])] = value
    except ValueError:
      continue
  return out


def _exit_naming(posted: dict[int, str]) -> None:
  """Exits naming the first process that posted an error of its own (with that error's code)."""
  k = min(posted)
  code, _, message = posted[k].partition(":")
  _exit(f"process {k} stopped with an error: {_short(message.strip())}", int(code),
        resume_hint=False)


def fail(message: str, code: int, line: str | None = None) -> None:
  """Ends this process after an error of its own: prints ``line`` (if given) on stderr, posts
  ``message``, so the other processes name it at once, and exits with ``code`` without JAX's
  shutdown barrier."""
  if not _exiting.acquire(blocking=False):  # the peers watchdog is ending the process
    while True:
      time.sleep(1)
  if line is not None:
    print(line, file=sys.stderr, flush=True)
  try:
    _client().key_value_set(f"{_FAILED}{process_index()}", f"{code}: {message}")
  except Exception:  # noqa: BLE001
    pass
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def is_collective_failure(e: BaseException) -> bool:
  """Whether ``e`` is a collective that failed because a peer process is gone."""
  text = str(e)
  return process_count() > 1 and any(s in text for s in ("Gloo", "gloo", "Connection closed",
                                                         "Connection reset", "UNAVAILABLE"))


def lost_peer(e: BaseException) -> None:
  """After a collective failed (``e``): waits up to the heartbeat timeout for the coordination
  service to say which process is gone, and exits naming it."""
  deadline = time.monotonic() + _settings["heartbeat_timeout_s"] + 10
  while time.monotonic() < deadline:
    _check_peers()
    time.sleep(0.5)
  _exit(f"a collective failed ({_short(' '.join(str(e).split()))})")


def wait_for(ready: Callable[[], bool], poll_s: float = 0.2) -> None:
  """Blocks until ``ready()``; exits naming a process that stopped meanwhile."""
  checked = time.monotonic()
  while not ready():
    if time.monotonic() - checked > 1.0:
      _check_peers()
      checked = time.monotonic()
    time.sleep(poll_s)


def agree(fn: Callable[[], Any]) -> Any:
  """``fn()``'s JSON-ready result as process 0 computed it, on every process (``fn`` runs on process
  0 only)."""
  if process_count() == 1:
    return fn()
  _counter[0] += 1
  key = f"gradjax/agree/{_counter[0]}"
  if is_writer():  # an error in fn() is posted by common.fail; the others' wait names it
    value = fn()
    _client().key_value_set(key, json.dumps(value))
    return value
  return json.loads(_get(key))


def gather(value: Any) -> list[Any] | None:
  """Every process's JSON-ready ``value`` (numpy scalars allowed), in process order, on process 0
  once all have given theirs; ``None`` on the others, which do not wait."""
  if process_count() == 1:
    return [value]
  _counter[0] += 1
  key = f"gradjax/gather/{_counter[0]}"
  _client().key_value_set(f"{key}/{process_index()}",
                          json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
  if not is_writer():
    return None
  return [json.loads(_get(f"{key}/{k}")) for k in range(process_count())]


_counter = [0]  # agreements and gatherings so far: every process makes the same ones in order


def _get(key: str) -> str:
  """The coordination service's value of ``key`` once some process set it."""
  client, found = _client(), []

  def ready():
    try:
      found.append(client.key_value_try_get(key))
      return True
    except Exception:  # noqa: BLE001  (not set yet)
      return False

  wait_for(ready, poll_s=0.05)
  return found[0]


if __name__ == "__main__":  # the child of process 0 that hosts the coordination service
  _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
