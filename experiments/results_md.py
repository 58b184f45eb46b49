"""Assembles experiments/results_legacy.md (the results not yet moved into studies, linked from
RESULTS.md) from the tables the experiment programs wrote under experiments/results/.

Every figure in it is read from a program's output (results.json, metrics.json, results.md);
what is typed here is the papers' published numbers (from ../shared/PROTOCOLS.md, with their source),
the section structure and prose; where prose cites a measured figure (the SAPAG, DLM and batch
verdicts), a function computes it from the same outputs. A table not measured yet
is listed as such with the program that measures it. Under each table: the command, device, cores,
versions, date and wall time that the program recorded (``common.provenance``); results written
before programs recorded their device say so.

  python experiments/results_md.py            # writes experiments/results_legacy.md
  python experiments/results_md.py --check    # exit 1 if it is not what the outputs give
"""

import dataclasses
import json
import os
import sys
from typing import Callable

from absl import app, flags

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
RESULTS = os.path.join("experiments", "results")

LEGACY = os.path.join("experiments", "results_legacy.md")  # linked from RESULTS.md until every section is a study
flags.DEFINE_string("output", os.path.join(ROOT, LEGACY), "Where to write.")
flags.DEFINE_bool("check", False, "Compare with --output instead of writing it; exit 1 on a difference.")


def _path(rel: str) -> str:
  return os.path.join(ROOT, RESULTS, rel)


def load(rel: str) -> dict | None:
  """results.json (or the JSON file ``rel``) under experiments/results/, None if absent."""
  path = _path(rel)
  if os.path.isdir(path):
    for name in ("results.json", "metrics.json", "benchmark.json"):
      if os.path.exists(os.path.join(path, name)):
        path = os.path.join(path, name)
        break
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def program_table(rel: str) -> str | None:
  """A program's own Markdown (``rel``/results.md or the .md file ``rel``) without its title line;
  the title becomes an italic caption."""
  path = _path(rel)
  path = os.path.join(path, "results.md") if os.path.isdir(path) else path
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    lines = f.read().strip().splitlines()
  out = []
  for line in lines:
    if line.startswith("# "):
      out.append(f"*{line[2:].strip()}*")
    elif line.startswith("#"):
      out.append("#" + line)  # deeper than the section's own headings
    else:
      out.append(line)
  return "\n".join(out)


def _wall(d: dict) -> float | None:
  for key in ("total_time_s", "wall_time_s"):
    if isinstance(d.get(key), (int, float)):
      return float(d[key])
  summary = d.get("summary", {})
  return float(summary["total_time_s"]) if "total_time_s" in summary else None


def _duration(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 7200:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


def command_from_config(config: dict) -> str:
  """``gradjax reconstruct``'s command line for a metrics.json's ``config``: the fields that
  differ from :class:`gradjax.config.Config`'s defaults, as their flags."""
  from gradjax import config as config_lib
  parts = ["gradjax", "reconstruct"]
  for field in dataclasses.fields(config_lib.Config):
    if field.name in config and config[field.name] != field.default:
      value = config[field.name]
      flag = field.metadata["flag"] or field.name
      parts.append(f"--{flag}" if value is True else f"--no{flag}" if value is False
                   else f"--{flag}={value}")
  return " ".join(parts)


def provenance(rel: str, command: str | None = None) -> str:
  """One line: how ``rel`` was made. ``command`` is the section's record of it for outputs written
  before the programs kept their command line."""
  d = load(rel) or {}
  d = {**d.get("environment", {}), **d}  # benchmark.json keeps it under "environment"
  parts = []
  cmd = d.get("command") if isinstance(d.get("command"), str) else command
  if cmd:
    parts.append(f"`{cmd}`")
  elif isinstance(d.get("config"), dict) and "attack" in d["config"]:
    parts.append(f"`{command_from_config(d['config'])}` (rebuilt from its recorded configuration)")
  if "cores" in d:
    parts.append(f"{d['device']}, {d['cores']} core{'s' if d['cores'] != 1 else ''}")
  elif "cpu_model" in d:
    parts.append(f"CPU ({d['cpu_model']}), {d.get('cpu_affinity') or d.get('cpu_count')} core(s)")
  else:
    parts.append("device not recorded (written before the programs kept it)")
  versions = [f"{k} {d[k]}" for k in ("jax", "flax", "optax") if isinstance(d.get(k), str)]
  if not versions and isinstance(d.get("jax_version"), str):
    versions = [f"jax {d['jax_version']}"]
  parts += versions
  if d.get("date"):
    parts.append(d["date"])
  wall = _wall(d)
  if wall is not None:
    parts.append(f"wall time {_duration(wall)}"
                 + (" over several processes (`--resume`; the device, cores and date are the last's)"
                    if d.get("resumed") is True else ""))
  return "Run: " + "; ".join(parts) + "."


# ---------------------------------------------------------------------------------------------------
# Renderers for outputs without a table of their own.


# SAPAG's Table I row on CIFAR-100, one reading per row: (label, sweep folders, the paper's PSNR).


FEDAVG_WIDE_4 = "fedavg_replay_4img_b2_convnet64"
"""The paper's second FedAvg protocol: ConvNet width 64, one local epoch of 4 images in batches of 2
at lr 1e-4, 4800 iterations, attack lr 1 (:data:`FEDAVG_WIDE_4_PROGRAM`)."""
FEDAVG_WIDE_4_PROGRAM = (
    "experiments/reconstruct.py --attack=inverting_gradients_fedavg --model=convnet "
    "--dataset=cifar10 --normalization=cifar10 --client=fedavg --local_lr=1e-4 --labels=known "
    "--batch_size=4 --local_batch_size=2 --iterations=4800 --chunk=200 "
    f"--output_dir=experiments/results/{FEDAVG_WIDE_4}")


# SAPAG's Table I beyond CIFAR-100 with Xavier-normal init: (dataset and init, model init flag,
# dataset, image ranges, paper's DLG and SAPAG PSNR, whether the preset runs with its box there: the
# preset's docstring has MNIST run with ``--nobox``). Each dataset's rows run on the same images.


# The box on MNIST, whose digits lie on its lower edge: the preset with it (the rows above run
# without it), and DLG with it. (label, sweep folders, paper's PSNR).


# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Section:
  """A part of RESULTS.md: the paper's numbers, ours (``body``, rendered when the file is written)
  and the provenance of each output it reads."""

  title: str
  paper: str
  body: Callable[[], str]
  sources: tuple[tuple[str, str | None], ...] = ()  # (output, command if the output lacks one)


def _captioned(caption: str, table: str | None) -> str | None:
  """``caption`` above ``table``, or None where the table has not been measured."""
  return None if table is None else f"{caption}\n\n{table}"


def speed_note(rel: str = "benchmark_steps_1core") -> str:
  """The matching step against PyTorch eager per conv net at the largest batch, and against the
  previous CPU default (im2col), from the step benchmark's JSON; with the op profile's split of the
  JAX step where it was measured."""
  d = load(rel)
  if not d or not d.get("steps") or "torch_over_jax" not in d["steps"][0]:
    return ""
  batch = max(r["batch_size"] for r in d["steps"])
  rows = [r for r in d["steps"] if r["batch_size"] == batch and r["model"] != "lenet_zhu"]
  ratios = "; ".join(f"{r['model']} {r['torch_over_jax']:.2f}× ({r['other_over_default']:.2f}× "
                     f"faster than im2col)" for r in rows)
  ops = {(r["model"], r["batch_size"]): r for r in d.get("ops", [])}
  shares = "; ".join(
      f"{m} {o['jax']['categories']['data movement'] / o['jax']['ops_ms']:.0%} against "
      f"{o['torch']['categories']['data movement'] / o['torch']['ops_ms']:.0%}"
      for (m, b), o in ops.items() if b == batch and "torch" in o and m != "lenet_zhu")
  text = (f"Batch {batch}, PyTorch eager's matching step over gradjax's (above 1: gradjax faster): "
          f"{ratios}.")
  if shares:
    text += (f" Share of the profiled step spent moving data (pads, slices, concatenations, "
             f"copies), gradjax against PyTorch: {shares}.")
  return text


def loops_note(rel: str = "benchmark_loops_1core") -> str:
  """From the loops benchmark: per model, what a loop body costs XLA's own convolutions against the
  same step at a program's top level, and split's cost in the loop against XLA's."""
  d = load(rel)
  if not d or not d.get("loops"):
    return ""
  rows = {(r["model"], r["conv"]): r for r in d["loops"]}
  parts = []
  for model in dict.fromkeys(r["model"] for r in d["loops"]):
    xla, split = rows.get((model, "xla")), rows.get((model, "split"))
    if xla and split:
      parts.append(f"{model} {xla['sgd_loop_over_top']:.1f}× (SGD step) and "
                   f"{xla['dlg_loop_over_top']:.1f}× (DLG evaluation), and in the loop split is "
                   f"{xla['sgd_loop_ms'] / split['sgd_loop_ms']:.1f}× and "
                   f"{xla['dlg_loop_ms'] / split['dlg_loop_ms']:.1f}× faster")
  if not parts:
    return ""
  return ("Inside a loop, a step with XLA's own convolutions takes this many times its top-level "
          "time: " + "; ".join(parts) + ". XLA:CPU rewrites the transposed convolutions of a backward pass into the forward layout "
          "at a program's top level but not inside a loop body, where it compiles them to plain loop "
          "nests; `split_conv` writes every derivative in the forward layout itself. Training "
          "(`train.py`, an epoch is a `lax.scan`) runs `--conv=split` by default, and the attacks' "
          "line searches (a `while_loop` of objective evaluations) and FedAvg replays (a `lax.scan` "
          "of local steps) run `mixed`, whose large layers are split.")


def restarts_note(rel: str = "benchmark_restarts_1core", restarts: int = 64,
                  target: float = 16.0) -> str:
  """From the restart benchmark: one restart's iteration against its matching step, the floor
  under ``restarts`` restarts' iteration (their evaluations at the measured matmul peak plus two
  passes over their L-BFGS pairs at the measured bandwidth) against ``target`` times one restart's
  iteration, and the FLOP rate that budget asks of the evaluations against the best one measured."""
  d = load(rel)
  if not d or "restarts" not in d or "profile" not in d:
    return ""
  p = d["profile"]
  one = next(r for r in d["restarts"] if r["strategy"] == "sequential" and r["restarts"] == 1)
  step = next(r for r in p["rows"] if r["restarts"] == 1)["step_ms"]
  text = (f"One restart's DLG iteration takes {one['ms_per_iteration']:.2f} ms against "
          f"{step:.2f} ms for its matching step alone ({one['ms_per_iteration'] / step:.2f}×).")
  r = next((x for x in p["rows"] if x["restarts"] == restarts), None)
  if r is None:
    return text
  compute = 1e3 * restarts * p["flops_per_evaluation"] / p["peak_flops"]
  floor, budget = compute + r["floor_ms"], target * one["ms_per_iteration"]
  text += (f" At R={restarts}, the evaluations at the measured matmul peak take {compute:.1f} ms and "
           f"two passes over the restarts' L-BFGS pairs ({r['history_mb']:.0f} MB) at the measured "
           f"bandwidth {r['floor_ms']:.1f} ms: {floor:.1f} ms per iteration at the least, against "
           f"{target:g}× one restart's iteration, {budget:.1f} ms.")
  rate = lambda x: x["restarts"] * p["flops_per_evaluation"] / (1e-3 * x["step_ms"])
  best = max(p["rows"], key=rate)
  need = restarts * p["flops_per_evaluation"] / (1e-3 * budget)
  text += (f" Even with no L-BFGS work at all, {target:g}× one restart's iteration asks the "
           f"{restarts} evaluations for {need / 1e9:.1f} GFLOP/s ({need / p['peak_flops']:.0%} of the "
           f"peak), {need / rate(best):.1f}× the best rate the objective reaches here "
           f"({rate(best) / 1e9:.1f} GFLOP/s, at R={best['restarts']}).")
  if floor > budget:
    text += (f" With L-BFGS's history of {p['history']} pairs, {restarts} restarts cannot cost "
             f"{target:g}× one on this core whatever the objective's FLOP rate; the sequential "
             f"strategy, the CPU default, keeps one restart's pairs in cache at a time.")
  return text


def _join(*parts) -> str:
  return "\n\n".join(p for p in parts if p)


SECTIONS = (
    Section(
        "Speed against PyTorch eager (CPU)",
        "No paper: gradjax against the same attacks in PyTorch 2.13 eager, in the same script.",
        lambda: _join(
            program_table("benchmark_steps_1core/benchmark.md"), speed_note(),
            _captioned("The same steps at a program's top level and inside a loop, on one core:",
                       program_table("benchmark_loops_1core/benchmark.md")), loops_note(),
            "On CPU, convolutions run as `mixed_conv` by default (`--conv`): XLA's own convolutions "
            "on layers with at least 16 input channels and 16×16 outputs, with every derivative "
            "written as an ordinary convolution (`split_conv`: XLA:CPU computes the weight "
            "gradient's derivative w.r.t. the input slowly, and inside a loop body every transposed "
            "form, below), and patches × matrix (`im2col_conv`) elsewhere; "
            "the `other conv` column is im2col alone, the default before, and the per-layer table "
            "is the measurement behind the rule. lenet_zhu runs the same program under both (all "
            "its layers take im2col), so its two columns differ by timing noise only. The "
            "accelerator suite (`python experiments/benchmark.py --suite=gpu`) has not run yet: "
            "no GPU has been lent to this work.",
            _captioned("Time to quality against PyTorch eager:",
                       program_table("benchmark_ttq_1core/benchmark.md")),
            _captioned("Restarts on one core, with the profile of a vmapped DLG iteration (the "
                       "objective's FLOP rate against the measured matmul peak; L-BFGS's stored "
                       "pairs against the measured memory bandwidth), measured while another "
                       "single-core job ran on the machine's second core:",
                       program_table("benchmark_restarts_1core/benchmark.md")), restarts_note(),
            _captioned("Start-up, on one core of an otherwise idle machine:",
                       program_table("benchmark_startup_1core/benchmark.md"))),
        (("benchmark_steps_1core", None), ("benchmark_loops_1core", None), ("benchmark_ttq_1core", None),
         ("benchmark_restarts_1core", None), ("benchmark_startup_1core", None))),
)


def render() -> str:
  out = ["# gradjax results not yet in a study",
         "",
         "Generated by `python experiments/results_md.py` from the programs' outputs under "
         "[results/](results/); do not edit by hand. Each section gives the "
         "paper's published numbers and protocol, ours, and how they were run. PSNR is on images "
         "clamped to [0, 1]; std is the population std over images. The sections move into "
         "studies ([../RESULTS.md](../RESULTS.md)) one by one.",
         ""]
  out += ["## Contents", ""] + [f"- {s.title}" for s in SECTIONS] + [""]
  for s in SECTIONS:
    out += [f"## {s.title}", "", f"**Published.** {s.paper}", "", s.body().strip(), ""]
    listed = set()
    for rel, command in s.sources:
      if rel in listed:
        continue
      listed.add(rel)
      if load(rel) is not None or program_table(rel) is not None:
        out += [f"- `{os.path.join(RESULTS, rel)}`: {provenance(rel, command)}"]
    out.append("")
  return "\n".join(out).rstrip() + "\n"


def main(argv):
  if len(argv) > 1:
    print(f"unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
    sys.exit(2)
  text = render()
  f = flags.FLAGS
  if f.check:
    with open(f.output) as fh:
      if fh.read() != text:
        print(f"{f.output} differs from what experiments/results gives; run "
              "python experiments/results_md.py", file=sys.stderr)
        sys.exit(1)
    print(f"{f.output} is up to date")
    return
  with open(f.output, "w") as fh:
    fh.write(text)
  print(f"wrote {f.output}")


if __name__ == "__main__":
  app.run(main)
