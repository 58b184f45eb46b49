"""The accelerator suite behind ``python -m benchmarks suite --suite=gpu``: every accelerator measurement, in parts
that each run in well under 10 minutes on one GPU, so a lent machine can run them one call at a time.

Parts (``--parts``), each written as ``gpu_<part>.json`` and ``gpu_<part>.md`` when it ends (a part
already written is skipped unless ``--overwrite``), then ``gpu.md`` assembles those present. A part
stopped by SIGINT (``timeout -s INT``) writes the rows it measured, marked ``complete: false``, and
runs again in the next call (``ig``, ``precision`` and ``flags`` from the rows they have,
:data:`RESUMABLE`):

* ``steps``: one plain step and one matching step per model and batch size (median ms, compile s,
  compiled and peak memory), as the suite's steps section; with torch (``--torch``, not ``off``)
  PyTorch eager's matching step on the same card beside it (its defaults: TF32 convolutions on
  cards that have them) and ``torch_over_jax``, its time over gradjax's.
* ``restarts``: 100 DLG iterations on ``lenet_zhu`` for R = 1, 4, 16, 64, 256 under each strategy
  (vmap, map with 8 at a time, sequential), compilation excluded, and the ratio to R = 1.
* ``im2col``: the same, vmapped, for R = 1, 64, 256 with the convolutions as im2col's matrix
  products (under vmap XLA's own become grouped convolutions, one group per restart).
* ``clients``: 100 iterations of DLG and of Inverting Gradients on K = 1, 4, 16, 64 clients of one
  ``lenet_zhu`` round, one vmapped solver run for the K clients against K runs one by one,
  compilation excluded, and the ratio to one client (issue 58: 64 clients at most 3x one); the
  convolutions as an audit resolves ``auto`` (batched ones for K > 1 together).
* ``clients64``: the whole DLG attack (2000 iterations, as ``dlg64``) on 64 clients of one round
  together against one client alone, each call's wall time with its compilation (the first of its
  program in the process: JAX's caches are cleared at the part's start) and without (a second
  call): issue 58's "64 clients at most 3x one" as ``dlg64`` judges 64 restarts. Then the same with
  the patches taken by one gather for both (``gather``: a shorter program to compile than
  im2col's, whose 64-wide program compiled in 14.8 s on an H100 against 4.2 s for one client).
* ``loops``: a chunk of 100 steps as the driver runs it on an accelerator, a while loop whose step
  count is an argument (one program for every chunk and budget), against the same steps in a loop
  with the count compiled in (a program per count, as before), and for L-BFGS the loop the driver
  runs, one line-search trial a trip (``Solver.advance``): compile seconds and ms an iteration,
  for DLG on ``lenet_zhu`` with 1 and 64 vmapped restarts and Inverting Gradients on ``resnet20-4``.
* ``anatomy``: where the compilation of a first result goes on the card, for the README's DLG on
  ``lenet_zhu`` and Inverting Gradients on ``resnet20-4``, one restart: the solver's first state
  (with L-BFGS one value and gradient of the objective), one step, the chunk program the driver runs
  (``solver_steps``), and the same optimizer's step on a quadratic of the dummy data's shapes (the
  solver's own share; for L-BFGS also without its line search), each compiled twice (the first with the autotuning), with its HLO
  instructions and fusions (kernels) (``step.compile_anatomy``).
* ``ttfr``: time to a first result, each a whole process timed from outside: the README's main job
  and Inverting Gradients on ``resnet20-4`` (60 iterations), ``gradjax reconstruct`` on an empty
  compilation cache (cold), then twice on the cache it filled (warm), beside Inverting Gradients in
  PyTorch eager on the same card and model (``torch_first_result.py``; its process time less
  importing the twin's definition from gradjax's zoo, which is JAX's cost, not PyTorch's).
* ``flags``: the ``ttfr`` part's cold runs (Inverting Gradients and the README's main job) under
  each of :data:`VARIANTS` (the convolutions as matrix products, the step compiled fast, the card's
  memory not preallocated).
* ``dlg64``: the whole DLG attack (2000 iterations, ``pipeline.run``) with 64 vmapped restarts against
  one: wall time (compilation included) and the best restart's PSNR, the convolutions as ``auto``
  resolves them (on an accelerator XLA's for one restart, im2col's for 64); then the same two with
  XLA's convolutions for both (im2col's on CPU), then with ``gather``'s for both.
* ``precision``: DLG on ``lenet_zhu`` (2000 iterations) and Inverting Gradients on ``resnet20-4``
  (1000 iterations) under each ``--config.execution.matmul_precision`` (float32, tensorfloat32, bfloat16, JAX's default):
  wall time and PSNR, on the scikit-image photo.
* ``ig``: Inverting Gradients (the preset: 4800 iterations) on ``resnet20-4``, CIFAR-10 test images
  0-4 (``--suite_dataset``), one restart each: PSNR, SSIM, wall time. ``--ig_init=torchvision``
  draws the ResNet as the paper's code does (the zoo's own draw otherwise; the rows say which).
* ``fedavg``: the FedAvg replay (``inverting_gradients_fedavg``, 1200 of its 4800 iterations) on
  ``convnet`` at width 64 drawn as the paper's PyTorch module (``init="torch"``,
  ``experiments/studies/ig_fedavg``), 4 images in 2 local steps of 2, labels known as a multiset with
  the permutation search.
* ``batch``: issue 12's batch inversion at the papers' budget, which the CPU cannot afford: GradInversion
  against HFGInv at 15 000 iterations on 10 CIFAR-10 batches of 8 with repeated labels, on the
  committed trained ResNet-20 (``gradjax batch-table --variants=bn,hfginv``). Its attacks are kept as they
  end; a call that reaches the 9-minute mark stops there and the next call of the part goes on.
  Needs the CIFAR-10 test images (``--data_dir``).
* ``convnet``: issue 54's batch of 8 on Geiping et al.'s ConvNet at its width 64, where the CPU
  affords width 16: the batches study's attack (``experiments/studies/batches/lenet.py``: Inverting
  Gradients, labels known, 2000 iterations, the head's input per example at weight 100, TV 5, the
  ConvNet-16 rows' best) on the unseen CIFAR-10 test images 500-515, two batches, beside the same
  attack on ConvNet-16 (``gradjax sweep``, kept and resumed across calls as ``batch``). Needs the
  CIFAR-10 test images.

The parts ``ttfr``, ``flags``, ``batch`` and ``convnet`` start processes of their own; when they run,
this process takes the card's memory as it needs it (:func:`leave_card`), so that theirs find the card as a
user's process would; it keeps what it grew to, so :func:`run` runs these parts before the others.

``--quick`` shrinks every size (tiny models, a few iterations, scikit-image photos) so the whole suite
runs in a CPU test and cannot rot; its numbers mean nothing.

``benchmarks/device_call.sh`` runs parts as one call of a lent machine: each in a process of its own
under a time limit, optionally under an added environment variable (``XLA_FLAGS``), every result
folder packed into one archive that a later call resumes from.
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Iterator

import jax

from benchmarks import step as bs
from gradjax import driver, files
from gradjax.run import config, pipeline, report

PARTS = ("steps", "restarts", "im2col", "clients", "clients64", "loops", "anatomy", "ttfr", "flags", "dlg64",
         "precision", "ig", "fedavg", "batch", "convnet")
# The committed trained ResNet-20, read from the clone's root (where the suite runs).
CHECKPOINT = os.path.join("experiments", "studies", "hfginv_batch", "runs", "train_resnet20_cifar10",
                          "epoch_5.npz")
BATCH_SECONDS = 540.0  # a call of the batch or convnet part stops here; the next one resumes
BATCHES_CONFIG = os.path.join("experiments", "studies", "batches", "lenet.py")
PRECISIONS = ("float32", "tensorfloat32", "bfloat16", "default")  # default: JAX's
# The parts that run gradjax (and PyTorch) in processes of their own, timed as a user's process.
PROCESS_PARTS = ("ttfr", "flags", "batch", "convnet")
# The parts whose rows are measured one independent of another, each row's identity: a stopped one
# goes on from the rows it has (as long as the sizes and the dataset are the same), so the paper's
# full protocol fits across calls of a few minutes each.
RESUMABLE = {"ig": lambda row: row["index"], "precision": lambda row: (row["attack"], row["precision"]),
             "flags": lambda row: (row["job"], row["variant"])}
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
# What the ``flags`` part tries on a first result, each alone after nothing: the model's convolutions
# as matrix products (``--config.model.conv=im2col``; XLA's own convolutions are what ``auto`` gives
# one restart on an accelerator), the step compiled as the run-once programs are
# (``GRADJAX_FAST_COMPILE``: LLVM's level 0; short runs may gain more compiling than they lose
# running), and JAX's client not taking 75 % of the card's memory at its start
# (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), the last two together, and XLA running every
# kernel on its own rather than as CUDA graphs (``--xla_gpu_enable_command_buffer=``: no graph to
# capture and instantiate at a program's first run), and the patches taken by one gather
# (``--config.model.conv=gather``: fewer operations to compile than im2col's slices). A key that
# starts with ``--`` is a flag of the run, any
# other an addition to the processes' environment. Measured on an H200 (2026-12-04,
# ``experiments/studies/accelerator_h100``) and dropped: XLA's flags for GEMMs by cuBLAS instead of
# Triton kernels and without autotuning (no shorter), the set-up on the card (3 s longer); jax
# 0.11.2's XLA has no ``--xla_gpu_enable_llvm_module_compilation_parallelism`` (a process given it
# exits at its start). A chunk of one step is no variant: every chunk is one program
# (:func:`gradjax.driver.repeat`).
VARIANTS = ({}, {"--config.model.conv": "im2col"}, {"GRADJAX_FAST_COMPILE": "1"}, {PREALLOCATE: "false"},
            {"GRADJAX_FAST_COMPILE": "1", PREALLOCATE: "false"},
            {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}, {"--config.model.conv": "gather"})


def leave_card(parts, environ) -> dict:
  """Called before this process starts its accelerator: where ``parts`` start processes of their own,
  sets ``environ`` so that this one takes the card's memory as it needs it (JAX's default takes 75 %
  of the card at its start, and a process started later would get what is left);
  returns the environment for those processes, who take theirs as a user's process does. A
  ``XLA_PYTHON_CLIENT_PREALLOCATE`` already in ``environ`` is left alone, here and there."""
  child = dict(environ)
  if PREALLOCATE not in environ and set(parts) & set(PROCESS_PARTS):
    environ[PREALLOCATE] = "false"
  return child


def sizes(quick: bool, dataset: str) -> dict:
  """Every size of the suite; ``quick``: the CPU test's."""
  if quick:
    # 32x32 everywhere, so the parts share compiled programs; vmapped restarts run in dlg64.
    return dict(models=["lenet_zhu"], batch_sizes=[1], restart_counts=[1, 2],
                strategies=("sequential",), client_strategies=("sequential",), im2col_restart_counts=[1, 2],
                restart_iterations=5, dlg_restarts=2, client_counts=[1, 2],
                loops=dict(jobs=[("dlg", "lenet_zhu", 1), ("dlg", "lenet_zhu", 2),
                                 ("inverting_gradients", "convnet-4", 1)], iterations=5),
                # The flags part: one variant of each kind (a flag of the run, the environment).
                anatomy=dict(jobs=[("dlg", "lenet_zhu"), ("inverting_gradients", "convnet-4")], repeats=1),
                ttfr=dict(model="convnet-4", iterations=3, warm_runs=1), variants=VARIANTS[1:3],
                dlg_iterations=20, ig_iterations=10, ig_model="convnet-4", ig_images=[0],
                image_size=32, dataset="skimage", fedavg_model="convnet-4", fedavg_init="torch", fedavg_iterations=10,
                precisions=PRECISIONS[:2], precision_attacks=("dlg",),
                batch=["--count=1", "--batch_size=2", "--config.sampling.classes_per_batch=1", "--config.sampling.pool=40",
                       "--config.attack.aux=4", "--iterations=3"],
                convnet=dict(widths=(4,), flags=["--count=1", "--batch_size=2", "--iterations=3"]),
                timing=dict(repeats=2, warmup=0, max_seconds=5.0))
  return dict(models=["lenet_zhu", "convnet", "resnet20-4", "resnet18"], batch_sizes=[1, 8, 32],
              restart_counts=[1, 4, 16, 64, 256], strategies=("vmap", "map", "sequential"),
              client_strategies=("vmap",),  # a sequence of clients costs what one by one does
              im2col_restart_counts=[1, 64, 256],
              restart_iterations=100, client_counts=[1, 4, 16, 64],
              loops=dict(jobs=[("dlg", "lenet_zhu", 1), ("dlg", "lenet_zhu", 64),
                               ("inverting_gradients", "resnet20-4", 1)], iterations=100),
              anatomy=dict(jobs=[("dlg", "lenet_zhu"), ("inverting_gradients", "resnet20-4")], repeats=2),
              ttfr=dict(model="resnet20-4", iterations=60, warm_runs=2), variants=VARIANTS,
              dlg_restarts=64, dlg_iterations=2000, ig_iterations=None,
              ig_model="resnet20-4", ig_images=[0, 1, 2, 3, 4], image_size=32, dataset=dataset,
              fedavg_model="convnet", fedavg_init="torch", precisions=PRECISIONS,
              # A quarter of the preset's 4800: the whole did not end in 150 s on an H100.
              fedavg_iterations=1200,
              precision_attacks=("dlg", "inverting_gradients"),
              batch=["--count=10", "--batch_size=8", "--iterations=15000"],
              convnet=dict(widths=(64, 16), flags=["--count=2", "--batch_size=8"]),
              timing=dict(repeats=20, warmup=3, max_seconds=20.0))


def _scores(results: dict) -> dict:
  return {k: results.get(k) for k in ("psnr", "ssim", "label_accuracy", "wall_time_s", "iterations",
                                      "loss")}


def part_steps(s: dict, seed: int) -> list[dict]:
  with driver.precision_scope("float32"):  # as the attacks run (gradjax.driver, Precision)
    return _steps(s, seed)


def _steps(s: dict, seed: int) -> list[dict]:
  rows = []
  for batch in s["batch_sizes"]:
    images = bs.photos(batch)
    x, y = images.x, images.y
    for name in s["models"]:
      j = bs.benchmark_jax(name, x, y, seed=seed, **s["timing"])
      rows.append(dict(model=name, batch_size=batch, conv=j["conv"], plain_ms=j["plain"]["median_ms"],
                       match_ms=j["match"]["median_ms"], compile_match_s=j["compile_s"]["match"],
                       match_over_plain=j["match"]["median_ms"] / j["plain"]["median_ms"],
                       **bs.step_memory(name, batch, seed)))
      if s["torch"] is not None:  # PyTorch eager's matching step on the same card, the baseline
        device = "cuda" if s["torch"].cuda.is_available() else "cpu"
        t = bs.benchmark_torch(name, x, y, seed=seed, device=device, **s["timing"])
        rows[-1].update(torch_device=device, torch_match_ms=t["match"]["median_ms"],
                        torch_over_jax=t["match"]["median_ms"] / j["match"]["median_ms"])
      print(f"steps {rows[-1]}", flush=True)
  return rows


def part_restarts(s: dict, seed: int) -> Iterator[dict]:
  return bs.restart_timings(s["restart_counts"], s["restart_iterations"], s["strategies"], 8, seed)


def part_im2col(s: dict, seed: int) -> Iterator[dict]:
  return bs.restart_timings(s["im2col_restart_counts"], s["restart_iterations"], ("vmap",), 8, seed,
                            conv="im2col")


def part_clients(s: dict, seed: int) -> Iterator[dict]:
  return bs.client_timings(s["client_counts"], s["restart_iterations"], s["client_strategies"], seed)


def part_clients64(s: dict, seed: int) -> Iterator[dict]:
  # Its first calls compile: no program another part of this process compiled serves them (the
  # ``clients`` part's are the same programs: the budget is not in them).
  for conv in ("auto", "gather"):
    jax.clear_caches()
    yield from bs.client_timings([1, s["dlg_restarts"]], s["dlg_iterations"], ("vmap",), seed,
                                 attack_names=("dlg",), conv=conv, one_by_one=False)


def part_loops(s: dict, seed: int) -> Iterator[dict]:
  return bs.loop_timings(s["loops"]["jobs"], s["loops"]["iterations"], seed)


def part_anatomy(s: dict, seed: int) -> Iterator[dict]:
  return bs.compile_anatomy(s["anatomy"]["jobs"], s["anatomy"]["repeats"], seed)


def part_ttfr(s: dict, seed: int, env: dict) -> Iterator[dict]:
  """Time to a first result, whole processes run in ``env`` (see the module docstring)."""
  t = s["ttfr"]
  jobs = [("README job", []),
          (f"inverting_gradients {t['model']} {t['iterations']} it",
           ["--attack=inverting_gradients", f"--model={t['model']}", f"--iterations={t['iterations']}"])]
  for job, args in jobs:
    done = bs.reconstruct_processes([*args, "--lpips=none", f"--seed={seed}"], 1 + t["warm_runs"],
                                    environ=env)
    for run, timed in enumerate(done):
      row = dict(job=job, runner="gradjax", cache="empty" if run == 0 else "warm", **timed)
      print(f"ttfr {row}", flush=True)
      yield row
  # gradjax's whole processes of the same job (Inverting Gradients), cold and warm, against each
  # PyTorch eager process: the ratios the comparison rests on, in the same part.
  cold, *warm = [r["process_s"] for r in done]
  script = os.path.join(os.path.dirname(__file__), "torch_first_result.py")
  for run in range(1 + t["warm_runs"]):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, script, f"--model={t['model']}",
                           f"--iterations={t['iterations']}", f"--seed={seed}"],
                          capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
      raise RuntimeError(f"torch_first_result.py exited with status {proc.returncode}: "
                         f"{bs.last_line(proc.stderr)}")
    torch_run = json.loads(proc.stdout.strip().splitlines()[-1])
    process_s = seconds - torch_run["twin_import_s"]
    row = dict(job=jobs[1][0], runner=f"PyTorch eager ({torch_run['device']})",
               cache="–", process_s=process_s, attack_s=torch_run["attack_s"], psnr=None,
               gradjax_cold_over_torch=cold / process_s,
               gradjax_warm_over_torch=statistics.median(warm) / process_s if warm else None)
    print(f"ttfr {row}", flush=True)
    yield row


def part_flags(s: dict, seed: int, env: dict, done=frozenset()) -> Iterator[dict]:
  """The ``ttfr`` part's first results on an empty compilation cache under each of
  ``s["variants"]`` (:data:`VARIANTS`: flags of the run, additions to the environment, ``XLA_FLAGS``
  to its flags), variant by variant:
  Inverting Gradients, then the README's main job; a flag this XLA does not know is a row with its
  error. Its rows but those ``done`` (their :data:`RESUMABLE` identities: each row is a process of
  its own)."""
  t = s["ttfr"]
  jobs = [(f"inverting_gradients {t['model']} {t['iterations']} it",
           ["--attack=inverting_gradients", f"--model={t['model']}", f"--iterations={t['iterations']}"]),
          ("README job", [])]
  for variant in s["variants"]:
    flags = [f"{k}={v}" for k, v in variant.items() if k.startswith("--")]
    added = {k: v for k, v in variant.items() if not k.startswith("--")}
    name = " ".join(f"{k}={v}" for k, v in variant.items()) or "none"
    for job, args in jobs:
      if (job, name) in done:
        continue
      flagged = {**env, **added}
      try:
        timed = bs.reconstruct_processes([*args, *flags, "--lpips=none", f"--seed={seed}"], 1,
                                         environ=flagged)[0]
      except RuntimeError as e:
        timed = dict(error=str(e)[-300:])
      row = dict(job=job, variant=name, cache="empty", **timed)
      print(f"flags {row}", flush=True)
      yield row


def part_dlg64(s: dict, seed: int) -> Iterator[dict]:
  # The default's convolutions (``auto``: batched ones for the vmapped restarts), then one kind for both.
  for conv in ("auto", "im2col" if jax.default_backend() == "cpu" else "xla", "gather"):
    one = None
    for restarts in (1, s["dlg_restarts"]):
      # Every row with its compilation: the second kind's one restart would otherwise reuse the
      # first's program (``auto`` resolves one restart to it), and be set against a 64 that compiles.
      jax.clear_caches()
      cfg = config.from_options({
          "attack.restarts": restarts, "attack.iterations": s["dlg_iterations"],
          "execution.strategy": "vmap", "data.image_size": s["image_size"], "seed": seed,
          "model.conv": conv, "output.lpips": "none"
      })
      results, _ = pipeline.run(cfg)
      row = dict(restarts=restarts, conv=results["conv"], **_scores(results))
      one = one or row["wall_time_s"]
      row["time_over_one"] = row["wall_time_s"] / one
      print(f"dlg64 {row}", flush=True)
      yield row


def part_precision(s: dict, seed: int, done=frozenset()) -> Iterator[dict]:
  """Its rows but those ``done`` (their :data:`RESUMABLE` identities)."""
  runs = [("dlg", "lenet_zhu", s["dlg_iterations"]),
          ("inverting_gradients", s["ig_model"], s["ig_iterations"] or 1000)]
  items = [(run, precision) for run in runs if run[0] in s["precision_attacks"]
           for precision in s["precisions"]]
  for (attack, model, iterations), precision in items:
    if (attack, precision) in done:
      continue
    cfg = config.from_options({
        "attack.preset": attack, "model.name": model, "attack.iterations": iterations,
        "execution.matmul_precision": precision, "data.image_size": s["image_size"], "seed": seed,
        "output.lpips": "none"
    })
    results, _ = pipeline.run(cfg)
    row = dict(attack=attack, model=model, precision=precision, **_scores(results))
    print(f"precision {row}", flush=True)
    yield row


def part_ig(s: dict, seed: int, data_dir: str | None, done=frozenset()) -> Iterator[dict]:
  """Its rows (one an image) but those ``done`` (their :data:`RESUMABLE` identities)."""
  for index in s["ig_images"]:
    if index in done:
      continue
    cfg = config.from_options({
        "attack.preset": "inverting_gradients", "model.name": s["ig_model"], "model.init": s["ig_init"],
        "data.dataset": s["dataset"], "data.data_dir": data_dir, "data.index": index,
        "data.image_size": s["image_size"], "attack.iterations": s["ig_iterations"],
        "data.normalization": s["dataset"] if s["dataset"].startswith("cifar") else "none",
        "seed": seed, "output.lpips": "none"
    })
    results, _ = pipeline.run(cfg)
    row = dict(index=index, init=s["ig_init"] or "default", **_scores(results))
    print(f"ig {row}", flush=True)
    yield row


def part_fedavg(s: dict, seed: int, data_dir: str | None) -> list[dict]:
  cfg = config.from_options({
      "attack.preset": "inverting_gradients_fedavg", "model.name": s["fedavg_model"],
      "model.init": s["fedavg_init"], "data.dataset": s["dataset"], "data.data_dir": data_dir, "client.name": "fedavg",
      "data.batch_size": 4, "client.local_batch_size": 2, "client.shared_labels": "multiset",
      "attack.permutations": 6, "data.image_size": s["image_size"],
      "attack.iterations": s["fedavg_iterations"], "seed": seed, "output.lpips": "none"
  })
  results, _ = pipeline.run(cfg)
  row = dict(model=s["fedavg_model"], init=s["fedavg_init"], images=4, local_steps=2,
             candidates=results["candidates"],
             **_scores(results))
  print(f"fedavg {row}", flush=True)
  return [row]


def _resumed(part: str, args: list[str], folder: str, seed: int, data_dir: str | None,
             seconds: float, env: dict) -> dict | None:
  """``gradjax ARGS`` resuming into ``folder`` in ``env``, stopped after ``seconds``: its results.json,
  or None when it ran out of time (what it finished stays in ``folder``/items for the next call)."""
  cmd = [sys.executable, "-m", "gradjax", *args, f"--seed={seed}", "--resume", f"--output_dir={folder}"]
  cmd += [f"--data_dir={data_dir}"] if data_dir else []
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(seconds, 1.0), env=env)
  except subprocess.TimeoutExpired:
    print(f"{part}: stopped after {BATCH_SECONDS:.0f} s; run the part again to go on", flush=True)
    return None
  if proc.returncode != 0:
    raise RuntimeError(f"gradjax {args[0]} exited with status {proc.returncode} (negative: killed by "
                       f"that signal); its last line: {bs.last_line(proc.stderr)}")
  with open(os.path.join(folder, "results.json"), encoding="utf-8") as fh:
    return json.load(fh)


def part_batch(s: dict, seed: int, data_dir: str | None, out: str, env: dict) -> list[dict] | None:
  """The ablation's two last rows at full budget; None when this call ran out of time (the
  attacks done so far are kept in ``out``/batch/items and the next call resumes)."""
  folder = os.path.join(out, "batch")
  if not os.path.exists(CHECKPOINT):
    raise FileNotFoundError(f"the batch part attacks {CHECKPOINT}: run it from the clone's root")
  result = _resumed("batch", ["batch-table", f"--checkpoint={CHECKPOINT}", "--variants=bn,hfginv",
                                *s["batch"]], folder, seed, data_dir, BATCH_SECONDS, env)
  if result is None:
    return None
  rows = [dict(variant=r["variant"], iterations=result["iterations"], batches=result["count"],
               psnr_mean=r["psnr_mean"], psnr_std=r["psnr_std"], ssim_mean=r["ssim_mean"],
               lpips_mean=r.get("lpips_mean"), time_s=r["time_s"]) for r in result["ablation"]]
  print(f"batch {rows}", flush=True)
  return rows


def part_convnet(s: dict, seed: int, data_dir: str | None, out: str, env: dict) -> list[dict] | None:
  """ConvNet-W at batch 8 per width of ``s["convnet"]``; None when this call ran out of time (the
  batches done are kept in ``out``/convnet_W/items and the next call resumes)."""
  deadline = time.perf_counter() + BATCH_SECONDS
  rows = []
  for width in s["convnet"]["widths"]:
    result = _resumed("convnet", ["sweep", f"--config={BATCHES_CONFIG}", f"--model=convnet-{width}",
                                  "--config.attack.head_features=100", "--priors=tv:5", "--start=500",
                                  *s["convnet"]["flags"]],
                      os.path.join(out, f"convnet_{width}"), seed, data_dir,
                      deadline - time.perf_counter(), env)
    if result is None:
      return None
    psnr = [p for r in result["rows"] for p in r["psnr_per_image"]]
    recognisable = sum(r["findings"]["images"]["recognisable"] for r in result["rows"])
    rows.append(dict(model=f"convnet-{width}", batches=len(result["rows"]), images=len(psnr),
                     psnr_mean=sum(psnr) / len(psnr), recognisable=recognisable,
                     leaks=sum(r["verdict"]["status"] == "leak" for r in result["rows"]),
                     seconds_per_batch=sum(r["wall_time_s"] for r in result["rows"]) / len(result["rows"])))
    print(f"convnet {rows[-1]}", flush=True)
  return rows


def table(rows: list[dict]) -> str:
  """A Markdown table of ``rows`` (the union of their keys, in first-seen order)."""
  keys = list(dict.fromkeys(k for r in rows for k in r))

  def cell(v):
    if isinstance(v, float):
      return f"{v:.4g}"
    return "-" if v is None else str(v)

  return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
                   + ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows])


def kept_draw_conflict(parts, out: str, ig_init: str | None) -> str | None:
  """The error when ``out`` already holds an ``ig`` part drawn otherwise than ``ig_init`` asks (a
  kept part would be reported as that draw's); None when there is none. Rows written before the
  draw was recorded were drawn with the zoo's default."""
  path = os.path.join(out, "gpu_ig.json")
  if "ig" not in parts or not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as fh:
      kept = {row.get("init", "default") for row in json.load(fh).get("rows", [])}
  except (OSError, ValueError, AttributeError) as e:
    return f"{path} cannot be read as a suite part ({e}); give another --output_dir"
  wanted = ig_init or "default"
  if kept and kept != {wanted}:
    return (f"{path} holds ig rows drawn with init {', '.join(sorted(kept))}, not {wanted}: "
            "give another --output_dir (or --overwrite to replace them)")
  return None


def _kept(path: str) -> dict | None:
  """The part written at ``path``, its ``complete`` set (parts written before it was recorded are
  complete); None when there is none."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as fh:
      kept = json.load(fh)
    return dict(kept, rows=list(kept["rows"]), complete=kept.get("complete", True))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} cannot be read as a suite part ({e!r}); give another --output_dir") from None


def _write_part(path: str, result: dict) -> None:
  """``result`` as ``path`` and its Markdown table beside it (``.md``)."""
  report.save_json(path, result)
  rows, quick = result["rows"], result["quick"]
  variables = result["environment"].get("variables", {})
  command = " ".join([*(shlex.quote(f"{k}={v}") for k, v in variables.items()), result["command"]])
  text = (f"## {result['part']}\n\n`{command}` on {result['environment']['device_kind']}, "
          f"{result['seconds']:.0f} s{' (quick sizes: not measurements)' if quick else ''}"
          f"{'' if result['complete'] else f' (stopped after {len(rows)} rows)'}\n\n{table(rows)}\n")
  files.atomic_write(path[:-5] + ".md", lambda fh: fh.write(text), binary=False)


def run(parts, out: str, *, quick: bool, dataset: str, data_dir: str | None, seed: int,
        overwrite: bool, header: dict, ig_init: str | None = None, env: dict | None = None,
        torch=None) -> str:
  """Runs ``parts`` into ``out``, those of ``PROCESS_PARTS`` first (skipping those already written
  whole unless ``overwrite``); returns the assembled Markdown. A part stopped by an interrupt (SIGINT:
  ``timeout -s INT``) writes the rows it measured, marked ``complete: false``, unless an earlier call
  wrote more or the whole part (also under ``overwrite``); the interrupt then goes on. The next call
  runs that part again, from its start, or for one of :data:`RESUMABLE` at the same sizes and
  dataset, from the rows it has (without ``overwrite``; also a part written whole, for the rows
  it lacks, e.g. a variant added since). ``ig_init``: the ``ig`` part's model draw (None: the zoo's
  default); ``env``: the environment of the processes the parts start (:func:`leave_card`; None:
  this one's); ``torch``: the torch module where PyTorch eager is the ``steps`` part's baseline
  (None: no baseline)."""
  s = dict(sizes(quick, dataset), ig_init=ig_init, torch=torch)
  env = dict(os.environ) if env is None else env
  run_part = dict(steps=lambda: part_steps(s, seed), restarts=lambda: part_restarts(s, seed),
                  im2col=lambda: part_im2col(s, seed),
                  clients=lambda: part_clients(s, seed), clients64=lambda: part_clients64(s, seed),
                  loops=lambda: part_loops(s, seed), anatomy=lambda: part_anatomy(s, seed),
                  ttfr=lambda: part_ttfr(s, seed, env),
                  flags=lambda done: part_flags(s, seed, env, done),
                  dlg64=lambda: part_dlg64(s, seed),
                  precision=lambda done: part_precision(s, seed, done),
                  ig=lambda done: part_ig(s, seed, data_dir, done),
                  fedavg=lambda: part_fedavg(s, seed, data_dir),
                  batch=lambda: part_batch(s, seed, data_dir, out, env),
                  convnet=lambda: part_convnet(s, seed, data_dir, out, env))
  for part in sorted(parts, key=lambda p: p not in PROCESS_PARTS):  # before this process holds memory
    path = os.path.join(out, f"gpu_{part}.json")
    kept = _kept(path)
    # A resumable part kept whole still runs the rows it lacks (a variant added since, say).
    resumed = (part in RESUMABLE and kept is not None and not overwrite and kept.get("quick") == quick
               and kept.get("dataset") == dataset)
    if kept is not None and kept["complete"] and not overwrite and not resumed:
      print(f"{part}: kept {path}", flush=True)
      continue
    start, rows, earlier = time.perf_counter(), [], 0.0
    if resumed:
      rows, earlier = list(kept["rows"]), kept.get("seconds", 0.0)
      print(f"{part}: going on from the {len(rows)} rows in {path}", flush=True)
    try:
      if part in RESUMABLE:
        produced = run_part[part](frozenset(RESUMABLE[part](r) for r in rows))
      else:
        produced = run_part[part]()
      if produced is None:  # out of time: nothing to write yet
        continue
      rows.extend(produced)  # a generator's rows one by one, so an interrupt keeps those measured
    except KeyboardInterrupt:
      if rows and (kept is None or ((resumed or not kept["complete"]) and len(rows) > len(kept["rows"]))):
        _write_part(path, dict(header, part=part, quick=quick, dataset=dataset, complete=False,
                               seconds=earlier + time.perf_counter() - start, rows=rows))
        print(f"{part}: stopped; wrote the {len(rows)} rows measured to {path}", flush=True)
      _assemble(out)
      raise
    if resumed and kept["complete"] and len(rows) == len(kept["rows"]):
      print(f"{part}: kept {path} (every row was there)", flush=True)
      continue
    _write_part(path, dict(header, part=part, quick=quick, dataset=dataset, complete=True,
                           seconds=earlier + time.perf_counter() - start, rows=rows))
  return _assemble(out)


def _assemble(out: str) -> str:
  """``out``/gpu.md: the parts' tables written so far, in :data:`PARTS` order; returns its text."""
  assembled = ["# gradjax accelerator suite", ""]
  for part in PARTS:
    md = os.path.join(out, f"gpu_{part}.md")
    if os.path.exists(md):
      with open(md, encoding="utf-8") as fh:
        assembled.append(fh.read())
  text = "\n".join(assembled)
  files.atomic_write(os.path.join(out, "gpu.md"), lambda fh: fh.write(text), binary=False)
  return text
