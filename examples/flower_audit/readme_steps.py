"""Runs this folder's README as a reader would: its bash blocks, unchanged and in order, in one shell.

  python readme_steps.py --clone=/tmp/anywhere/gradjax [--data=/path/to/shared/data] [--simulation]

``--clone``: a fresh clone of the repository (``git clone``), anywhere; its environment is this
Python's (gradjax installed with the flower extra, and PyTorch). The blocks run in
``<clone>/examples/flower_audit`` in one ``bash`` (job control on, as in a terminal): the Deployment
Runtime (SuperLink, two SuperNodes, ``flwr run``, ``gradjax audit``), then the leakage gate (the
second SuperNode replaced by a pruning one, a gated run, ``gradjax audit --config.attack.adaptive=True``), then the
malicious server (a gated and an ungated SuperNode, ``malicious-bins``, ``gradjax audit``), then the
stop; the Simulation Runtime's block with ``--simulation`` (it needs ``flwr[simulation]``). The one
change to the text: ``--data`` replaces the placeholder of ``export DATA=/path/to/shared/data``
(without it that block is left out, and the clients find the data beside the clone, if there).

Prints, and writes to ``<clone>/examples/flower_audit/readme_steps.json``: each command with its
wall time (bash's trace, ``$EPOCHREALTIME`` at each command), the exit status of every command that
failed, the audits' exit codes and their indexes' round tables, the versions, and the process groups
left running afterwards (none, when the README's stop block does its job).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

MARK = "+@"  # bash's trace prefix: "+@<epoch seconds> <command>"


def blocks(readme: str) -> dict[str, list[str]]:
  """The README's ```bash blocks, by the heading of the section they stand in."""
  out, heading = {}, ""
  for m in re.finditer(r"^(#+ [^\n]*)$|^```bash\n(.*?)^```", readme, re.M | re.S):
    if m.group(1):
      heading = m.group(1).lstrip("#").strip()
    else:
      out.setdefault(heading, []).append(m.group(2))
  return out


def script(sections: dict[str, list[str]], data: str | None, simulation: bool) -> str:
  order = ["Where the data lie", "Deployment Runtime on one machine", "Holding back updates that leak",
           "A server that cheats", "Stopping the federation"] + (["Simulation Runtime"] if simulation else [])
  missing = [s for s in order if s not in sections]
  if missing:
    raise SystemExit(f"error: the README has no bash block under {', '.join(missing)}")
  text = []
  for name in order:
    for block in sections[name]:
      if name == "Where the data lie":
        if data is None:
          continue
        block = block.replace("/path/to/shared/data", data)
      text.append(f": '=== {name}'\n{block}")
  # Exit statuses of failing commands, then the README's text as it stands.
  return ("set -m\nPS4='+@${EPOCHREALTIME} '\n"
          "trap 'echo \"[readme_steps] exit $? of: $BASH_COMMAND\" >&2' ERR\nset -x\n"
          + "\n".join(text) + "\nset +x\n")


def steps(trace: str) -> list[dict]:
  """Commands of the trace (top level: one ``+``) with their wall time: to the next command."""
  rows = []
  for line in trace.splitlines():
    m = re.match(r"^\+@(\d+\.\d+) (.*)$", line)
    if m:
      rows.append({"start": float(m.group(1)), "command": m.group(2)})
  for a, b in zip(rows, rows[1:]):
    a["seconds"] = round(b["start"] - a["start"], 2)
  return [r for r in rows if "seconds" in r]


def versions() -> dict:
  out = {"python": sys.version.split()[0]}
  for name in ("flwr", "torch", "jax", "flax", "optax"):
    try:
      out[name] = __import__(name).__version__
    except ImportError:
      out[name] = None
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clone", required=True, help="A fresh clone of the repository.")
  parser.add_argument("--data", help="The shared data folder (replaces the README's placeholder).")
  parser.add_argument("--simulation", action="store_true", help="Also the Simulation Runtime block.")
  args = parser.parse_args()
  folder = os.path.join(os.path.abspath(args.clone), "examples", "flower_audit")
  if not os.path.isfile(os.path.join(folder, "README.md")):
    raise SystemExit(f"error: {folder} holds no README.md: give --clone a clone of the repository")
  text = script(blocks(open(os.path.join(folder, "README.md"), encoding="utf-8").read()), args.data,
                args.simulation)
  env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  start = time.monotonic()
  proc = subprocess.run(["bash", "-c", text], cwd=folder, env=env, capture_output=True, text=True,
                        timeout=3600)
  wall = time.monotonic() - start
  log = proc.stdout + proc.stderr
  with open(os.path.join(folder, "readme_steps.log"), "w", encoding="utf-8") as fh:
    fh.write(log)
  rows = steps(proc.stderr)
  failed = re.findall(r"^\[readme_steps\] exit (\d+) of: (.*)$", proc.stderr, re.M)
  audits = {}
  for name in ("audit", "audit-gate", "audit-malicious", "audit-sim"):
    index = os.path.join(folder, name, "index.json")
    if os.path.isfile(index):
      with open(index, encoding="utf-8") as fh:
        kept = json.load(fh)
      audits[name] = {"rows": [{k: r.get(k) for k in ("round", "client", "attack", "verdict", "psnr",
                                                       "withheld", "refused", "zero_update", "error")}
                               for r in kept["rows"]], "rounds": kept.get("rounds")}
  deadline = time.monotonic() + 30  # the stop block's SIGTERMs take a few seconds to end them
  while True:
    left = subprocess.run(["pgrep", "-af", "flower-super|flwr-"], capture_output=True, text=True).stdout
    if not left.strip() or time.monotonic() > deadline:
      break
    time.sleep(0.5)
  result = {"steps": rows, "failed": [{"exit": int(c), "command": cmd} for c, cmd in failed],
            "wall_s": round(wall, 1), "audits": audits, "versions": versions(),
            "left_running": [line for line in left.splitlines() if "pgrep" not in line]}
  with open(os.path.join(folder, "readme_steps.json"), "w", encoding="utf-8") as fh:
    json.dump(result, fh, indent=1)
  for r in rows:
    if r["seconds"] >= 0.5:
      print(f"{r['seconds']:8.1f} s  {r['command'][:150]}")
  print(f"whole: {wall:.1f} s; failed commands: {failed or 'none'}; left running: "
        f"{result['left_running'] or 'none'}")

  def status(r):
    if r["withheld"]:
      return "withheld"
    return "refused the model" if r["refused"] else r["verdict"] or r["error"]

  for name, a in audits.items():
    print(f"{name}: " + "; ".join(f"round {r['round']} client {r['client']}: {status(r)}"
                                  for r in a["rows"]))


if __name__ == "__main__":
  main()
