"""Compiled memory of the HFGInv matching step for large batches, with and without jax.checkpoint.

For each model and batch size the step of the ``hfginv`` attack (value and gradient of the stepwise
cosine objective with TV and the BatchNorm prior, labels known) is compiled for the default backend
and XLA's memory analysis read: arguments + outputs + temporaries, in MB. ``remat`` checkpoints every
ResNet block (``models.get_module(..., remat=True)``): the double backward pass then keeps one
activation per block and recomputes the rest. Nothing is run, so a GPU's figure can be read without
the memory it reports (a model without BatchNorm: the step without the BatchNorm prior, the rows'
``bn_prior`` false). The issue's target: ResNet-18, batch 32 at 32×32, within a 16 GB GPU.

  python -m benchmarks memory --models=resnet18 --batch_sizes=8,16,32,64   # the issue's measurement

Writes results.json and results.md to --output_dir.
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from gradjax.cli import common
from gradjax import attacks, clients, distances, files, models, presets, priors
from gradjax.run import report

common.define_models_flag()
common.define_batch_sizes_flag()
flags.DEFINE_integer("input_size", 32, "Side of the square inputs (zeros: nothing is run).")
common.define_output_flags(resumable=False)
flags.adopt_module_key_flags(common)


def compiled_mb(name: str, batch: int, size: int, remat: bool) -> dict:
  """XLA's memory analysis of hfginv's matching step (MB) and the compile time (s)."""
  model = models.create(name, jax.random.key(0), input_shape=(size, size, 3), remat=remat)
  x = jnp.zeros((batch, size, size, 3))
  y = jnp.arange(batch) % 10
  obs = clients.fedsgd(model.apply_fn, model.variables, x, y, share_labels=True)
  attack = presets.hfginv()
  missing = [p for p in attack.priors if isinstance(p.fn, priors.NetworkPrior)
             and not set(p.fn.needs) <= set(model.variables)]
  if missing:  # a model without BatchNorm: the step without the BatchNorm prior
    attack = dataclasses.replace(attack, priors=tuple(p for p in attack.priors if p not in missing))
  solver = attacks._solver(attack, model.apply_fn, len(jax.tree.leaves(obs.gradient)))
  data = attacks.MatchingData(obs, y, (jnp.zeros(3), jnp.ones(3)), None, None,
                              jax.tree.map(lambda i: jnp.asarray(i, jnp.int32),
                                           distances.leaf_positions(model.variables["params"])))
  data = attacks.scheduled(attack, data, len(jax.tree.leaves(obs.gradient)))
  params = {"x": x}
  run = attacks.RunData(jnp.arange(batch), jnp.uint32(0))  # one run: its label order and seed
  state = solver.init(params, (data, run))
  start = time.perf_counter()
  compiled = jax.jit(solver.step).lower(state, (data, run)).compile()
  seconds = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {"compiled_mb": None, "temp_mb": None, "compile_s": seconds, "bn_prior": not missing}
  total = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
  return {"compiled_mb": total / 2**20, "temp_mb": analysis.temp_size_in_bytes / 2**20,
          "compile_s": seconds, "bn_prior": not missing}


def main(argv):
  if len(argv) > 1:
    common.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  try:
    names = [m.strip() for m in f.models if m.strip()]
    batches = [int(b) for b in f.batch_sizes if b.strip()]
    for name in names:
      models.get_module(name, num_classes=10)
    if not names or not batches or min(batches) < 1 or f.input_size < 8:
      raise ValueError("need models, positive batch sizes and --input_size >= 8")
  except ValueError as e:
    common.fail(str(e))
  out = common.output_folder("batch_memory", own=("results.*",))
  rows = []
  for name in names:
    for batch in batches:
      for remat in (False, True):
        row = {"model": name, "batch": batch, "remat": remat,
               **compiled_mb(name, batch, f.input_size, remat)}
        rows.append(row)
        print(f"{name} batch {batch} remat {remat}: {row['compiled_mb']:.0f} MB "
              f"(compiled in {row['compile_s']:.0f} s)", flush=True)
  info = {**common.provenance(), "input_size": f.input_size}
  report.save_json(os.path.join(out, "results.json"), {"rows": rows, **info})
  lines = [f"# Compiled memory of the hfginv matching step ({f.input_size}×{f.input_size})", "",
           f"`{info['command']}`", "", f"{info['device']}; jax {info['jax']}.", "",
           "| model | batch | MB, plain | MB, remat | remat / plain |", "|---|---|---|---|---|"]
  for name in names:
    for batch in batches:
      plain, remat = (next(r for r in rows if (r["model"], r["batch"], r["remat"]) == (name, batch, m))
                      for m in (False, True))
      if plain["compiled_mb"] is None:
        lines.append(f"| {name} | {batch} | n/a | n/a | |")
        continue
      lines.append(f"| {name} | {batch} | {plain['compiled_mb']:.0f} | {remat['compiled_mb']:.0f} | "
                   f"{remat['compiled_mb'] / plain['compiled_mb']:.2f} |")
  md = "\n".join(lines) + "\n"
  files.atomic_write(os.path.join(out, "results.md"), lambda fh: fh.write(md), binary=False)
  print(md)


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
