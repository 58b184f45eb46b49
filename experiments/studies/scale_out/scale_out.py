"""Measures gradjax over two processes on this machine against one process, in one script.

  python experiments/studies/scale_out/scale_out.py --output_dir=experiments/studies/scale_out/runs/cpu_2cores

1. One attack: ``gradjax reconstruct`` (DLG, lenet_zhu, scikit-image photo 0) with 8 restarts and one
   seed, run as (a) one process on one core, restarts one after another (the CPU default), (b) one
   process on one core, the 8 restarts vectorised (``--config.execution.shard=True`` on one device), (c) one process on
   one core with two virtual devices (``--config.execution.shard=True``, 4 restarts each: the programs of (d) in one
   process), (d) two processes, each pinned to its own core (``taskset``), 4 restarts each.
2. A 10-image sweep: one process on one core, one process on both cores, two processes on one core
   each (each runs 5 images).
3. Faults: two processes of a long attack; one is killed once the state is saved; the time until the
   other exits, its message; then both again with ``--resume``.

Every timed run is a second run of its commands, the first having filled a persistent compilation
cache (as the default ``--compilation_cache`` is after any earlier run of the same programs). The
machine's ceiling for two processes is measured too: two independent copies of the one-core run at
once, one per core (on a machine whose cores share caches, memory bandwidth or a physical core, two
cores do less than twice one core's work).

Writes ``results.json`` (every run's command, wall time, PSNR, best restart) and ``results.md`` (the
tables, ratios against the one-process runs of the same script).
"""

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

GRADJAX = [sys.executable, "-m", "gradjax"]


def read_json(path):
  with open(path, encoding="utf-8") as fh:
    return json.load(fh)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


CACHE = []  # the persistent compilation cache of this script's runs (a scratch folder)


def launch(args, cores, env=None):
  """``gradjax args`` pinned to ``cores`` (a list of core numbers), started now."""
  cmd = ["taskset", "-c", ",".join(map(str, cores)), *GRADJAX, *args,
         f"--compilation_cache={CACHE[0]}"]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
                          start_new_session=True)


def timed(commands, out_flag):
  """Runs ``commands`` once into a scratch folder (filling the compilation cache, as any earlier
  run of the same programs does), then again into the real one; (seconds of the second, outputs)."""
  scratch = os.path.join(CACHE[0], "scratch", str(time.time_ns()))
  run_all(fresh_port([([*a, f"--output_dir={scratch}"], c, e) for a, c, e in commands]))
  return run_all(fresh_port([([*a, out_flag], c, e) for a, c, e in commands]))


def fresh_port(commands):
  """``commands`` with a new free port in their --coordinator_address (one per launch)."""
  port = free_port()
  return [([f"--coordinator_address=127.0.0.1:{port}" if x.startswith("--coordinator_address=")
            else x for x in a], c, e) for a, c, e in commands]


def run_all(commands):
  """Starts every (args, cores, env) at once, waits for all; (seconds, [(rc, stdout, stderr)])."""
  start = time.perf_counter()
  procs = [launch(*c) for c in commands]
  outs = [(p.wait(), *p.communicate()) for p in procs]
  seconds = time.perf_counter() - start
  for (rc, _, err), c in zip(outs, commands):
    if rc != 0:
      sys.exit(f"failed ({rc}): {shlex.join(c[0])}\n{err[-3000:]}")
  return seconds, outs


def over(n: int, args, port=None):
  """(args, core, env) of the n processes of one run over n processes, process k on core k."""
  port = port or free_port()
  return [([*args, f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={n}",
            f"--process_id={k}"], [k], None) for k in range(n)]


def attack(out, restarts, iterations, seed):
  rows = []
  base = ["reconstruct", f"--restarts={restarts}", f"--iterations={iterations}", f"--seed={seed}",
          "--lpips=none"]
  two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  runs = [("one process, one core, sequential", [([*base], [0], None)]),
          ("one process, one core, vmap (--config.execution.shard=True, 1 device)", [([*base, "--config.execution.shard=True"], [0], None)]),
          ("one process, one core, 2 devices (--config.execution.shard=True)", [([*base, "--config.execution.shard=True"], [0], two_devices)]),
          ("two processes, one core each (--config.execution.shard=True)", over(2, [*base, "--config.execution.shard=True"]))]
  for name, commands in runs:
    folder = os.path.join(out, "attack", f"run_{len(rows)}")
    seconds, outs = timed(commands, f"--output_dir={folder}")
    metrics = read_json(os.path.join(folder, "metrics.json"))
    # Process 0's last progress line: iterations per second of all its restarts together, after the
    # first chunk (which compiles the step); the sequential strategy reports one restart at a time.
    rates = re.findall(r"(\d+(?:\.\d+)?) it/s", outs[0][2])
    rows.append({"run": name, "seconds": seconds, "attack_s": metrics["wall_time_s"],
                 "iterations_per_s": float(rates[-1]) if rates and "sequential" not in name else None,
                 "psnr": metrics["psnr"], "loss": metrics["loss"],
                 "best_restart": metrics["best_restart"], "devices": metrics["devices"],
                 "processes": metrics["processes"],
                 "commands": [shlex.join(["taskset", "-c", ",".join(map(str, c)), "gradjax", *a])
                              for a, c, _ in commands]})
    print(rows[-1], flush=True)
  for r in rows:
    r["speedup_over_sequential"] = rows[0]["seconds"] / r["seconds"]
    r["speedup_over_vmap"] = rows[1]["seconds"] / r["seconds"]
    if r["iterations_per_s"] is not None:
      r["rate_over_vmap"] = r["iterations_per_s"] / rows[1]["iterations_per_s"]
  # The same runs at half the iterations (same programs: the cache is warm): the difference of the
  # two wall times is the cost of the second half of the iterations alone, without start-up and
  # compilation. (Far beyond convergence L-BFGS's line search runs ever more evaluations: 8000
  # iterations of the sequential run took 13x as long as 2000.)
  shorter = [f"--iterations={iterations // 2}" if x.startswith("--iterations=") else x for x in base]
  for r, (name, commands) in zip(rows, runs):
    if "2 devices" in name:
      continue
    commands = [([*shorter, *a[len(base):]], c, e) for a, c, e in commands]
    folder = os.path.join(CACHE[0], "shorter", name.replace(" ", "_").replace(",", ""))
    r["seconds_half"], _ = run_all(fresh_port([([*a, f"--output_dir={folder}"], c, e)
                                               for a, c, e in commands]))
    r["marginal_s"] = r["seconds"] - r["seconds_half"]  # start-up and compilation cancel
    print(name, r["seconds_half"], flush=True)
  for r in rows:
    if "marginal_s" in r:
      r["marginal_speedup_over_sequential"] = rows[0]["marginal_s"] / r["marginal_s"]
      r["marginal_speedup_over_vmap"] = rows[1]["marginal_s"] / r["marginal_s"]
  # The machine's own ceiling: two independent copies of the one-core vmap run at once, one per core.
  pair = [([*base, "--config.execution.shard=True", f"--output_dir={os.path.join(CACHE[0], 'pair', str(k))}"], [k], None)
          for k in range(2)]
  run_all(pair)
  both, _ = run_all([([*a[:-1], a[-1] + "b"], c, e) for a, c, e in pair])
  ceiling = {"run": "two independent one-core vmap runs at once (no communication)",
             "seconds": both, "ceiling": 2 * rows[1]["seconds"] / both}
  print(ceiling, flush=True)
  return rows, ceiling


def sweep(out, count, iterations):
  rows = []
  base = ["sweep", f"--count={count}", f"--iterations={iterations}", "--lpips=none"]
  runs = [("one process, one core", [(base, [0], None)]),
          ("one process, two cores", [(base, [0, 1], None)]),
          ("two processes, one core each", over(2, base))]
  for name, commands in runs:
    folder = os.path.join(out, "sweep", f"run_{len(rows)}")
    seconds, _ = timed(commands, f"--output_dir={folder}")
    result = read_json(os.path.join(folder, "results.json"))
    rows.append({"run": name, "seconds": seconds, "psnr": [r["psnr"] for r in result["rows"]],
                 "psnr_mean": result["summary"]["psnr"]["mean"],
                 "commands": [shlex.join(["taskset", "-c", ",".join(map(str, c)), "gradjax", *a])
                              for a, c, _ in commands]})
    print(rows[-1], flush=True)
  for r in rows:
    r["speedup_over_one_core"] = rows[0]["seconds"] / r["seconds"]
    r["same_table_as_one_process"] = r["psnr"] == rows[0]["psnr"]
  return rows


def fault(out, heartbeat_s):
  folder = os.path.join(out, "fault")
  args = ["reconstruct", "--iterations=1000", "--config.execution.chunk=10", "--restarts=2", "--config.execution.shard=True",
          "--lpips=none", "--save_every_s=0", f"--heartbeat_timeout_s={heartbeat_s}",
          f"--output_dir={folder}"]
  commands = over(2, args)
  procs = [launch(*c) for c in commands]
  state = os.path.join(folder, "state.npz")
  while not os.path.exists(state):
    time.sleep(0.05)
  os.killpg(procs[1].pid, signal.SIGKILL)
  killed = time.perf_counter()
  rc = procs[0].wait()
  exit_s = time.perf_counter() - killed
  _, err = procs[0].communicate()
  procs[1].communicate()
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  resumed_s, _ = run_all([([*a, "--resume"], c, e) for a, c, e in over(2, args)])
  metrics = read_json(os.path.join(folder, "metrics.json"))
  row = {"heartbeat_timeout_s": heartbeat_s, "exit_s_after_kill": exit_s, "exit_code": rc,
         "stderr_errors": errors, "resume_s": resumed_s, "resumed": metrics["resumed"],
         "iterations": metrics["iterations"], "psnr": metrics["psnr"],
         "commands": [shlex.join(["gradjax", *a]) for a, _, _ in commands]}
  print(row, flush=True)
  return row


def markdown(result) -> str:
  lines = [f"# Two processes against one ({result['machine']})", "",
           f"`{result['command']}`", "", "## One attack: 8 restarts of DLG", "",
           "| run | wall s (process) | attack s | PSNR (dB) | best restart | × sequential | × vmap "
           "| iterations/s after compiling | × vmap |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in result["attack"]:
    rate = ("– | –" if r["iterations_per_s"] is None
            else f"{r['iterations_per_s']:.0f} | {r['rate_over_vmap']:.2f}")
    lines.append(f"| {r['run']} | {r['seconds']:.1f} | {r['attack_s']:.1f} | {r['psnr']:.4f} | "
                 f"{r['best_restart']} | {r['speedup_over_sequential']:.2f} | "
                 f"{r['speedup_over_vmap']:.2f} | {rate} |")
  lines += ["", "The iterations alone: each run again at half the iterations; the difference of "
            "the two wall times (the second half of the iterations, start-up and compilation "
            "cancelling):", "",
            "| run | wall s at half | difference s | × sequential | × vmap |", "|---|---|---|---|---|"]
  for r in result["attack"]:
    if "marginal_s" in r:
      lines.append(f"| {r['run']} | {r['seconds_half']:.1f} | {r['marginal_s']:.1f} | "
                   f"{r['marginal_speedup_over_sequential']:.2f} | "
                   f"{r['marginal_speedup_over_vmap']:.2f} |")
  c = result["ceiling"]
  lines += ["", f"The machine's ceiling: {c['run']}: {c['seconds']:.1f} s for both, "
            f"{c['ceiling']:.2f}× the one-core vmap run's throughput (2.00 if the cores shared "
            "nothing).", "", "Wall times are whole processes (start, data, compilation loaded from "
            "a warm persistent cache, attack, scoring, writing)."]
  lines += ["", f"## A sweep of {len(result['sweep'][0]['psnr'])} images", "",
            "| run | wall s | PSNR mean (dB) | same table as one process | × one core |",
            "|---|---|---|---|---|"]
  for r in result["sweep"]:
    lines.append(f"| {r['run']} | {r['seconds']:.1f} | {r['psnr_mean']:.3f} | "
                 f"{r['same_table_as_one_process']} | {r['speedup_over_one_core']:.2f} |")
  f = result["fault"]
  lines += ["", "## A killed process", "",
            f"Heartbeat timeout {f['heartbeat_timeout_s']} s: process 0 exited "
            f"{f['exit_s_after_kill']:.1f} s after process 1 was killed (exit code {f['exit_code']}), "
            f"printing: `{f['stderr_errors'][0] if f['stderr_errors'] else ''}`. Both again with "
            f"`--resume`: {f['iterations']} iterations, resumed {f['resumed']}, "
            f"{f['resume_s']:.1f} s.", ""]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", required=True)
  parser.add_argument("--restarts", type=int, default=8)
  parser.add_argument("--iterations", type=int, default=2000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sweep_count", type=int, default=10)
  parser.add_argument("--sweep_iterations", type=int, default=2000)
  parser.add_argument("--heartbeat_timeout_s", type=int, default=10)
  a = parser.parse_args()
  if os.path.exists(a.output_dir):
    sys.exit(f"error: {a.output_dir} exists; choose another --output_dir")
  os.makedirs(a.output_dir)
  if len(os.sched_getaffinity(0)) < 2:
    sys.exit("error: needs two cores")
  from gradjax.cli import common
  import tempfile
  CACHE.append(tempfile.mkdtemp(prefix="scale_out_"))
  rows, ceiling = attack(a.output_dir, a.restarts, a.iterations, a.seed)
  result = {"command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
            "machine": f"CPU ({common.cpu_model()}), {os.cpu_count()} cores",
            "attack": rows, "ceiling": ceiling,
            "sweep": sweep(a.output_dir, a.sweep_count, a.sweep_iterations),
            "fault": fault(a.output_dir, a.heartbeat_timeout_s)}
  with open(os.path.join(a.output_dir, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(result, fh, indent=1)
  text = markdown(result)
  with open(os.path.join(a.output_dir, "results.md"), "w", encoding="utf-8") as fh:
    fh.write(text)
  print(text)


if __name__ == "__main__":
  main()
