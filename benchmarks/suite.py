r"""The benchmark suite: step cost, memory, time-to-quality and restart scaling, against PyTorch eager.

Writes ``benchmark.json`` and ``benchmark.md`` to ``--output_dir``. Sections (``--sections``):

* ``steps``: per model (``--models``) and batch size (``--batch_sizes``), the median time of one plain
  forward+backward and of one gradient-matching step (value and gradient of the DLG objective w.r.t.
  the dummy data and labels), their ratio, the compile time of each, and the matching step's device
  memory: XLA's compiled footprint (arguments + outputs + temporaries, ``memory_analysis``) and, on
  devices that report it, the peak bytes in use. All with the backend's default convolutions
  (``conv="auto"``: mixed on CPU, XLA's on accelerators); the matching step is also timed with the
  other implementation, and the ratio given. With PyTorch installed the same step in PyTorch eager
  (ported in ``python -m benchmarks step``) and the ratio torch / JAX.
* ``ops``: the same matching step op by op (:mod:`benchmarks.op_profile`): XLA:CPU's thunks under
  ``jax.profiler`` and PyTorch's ATen ops under ``torch.profiler``, each filed as matmul, reduction,
  data movement or elementwise, with the matrix products' FLOP rate.
* ``convs``: one layer's share of a matching step per layer shape (``--conv_shapes``) with each CPU
  convolution (im2col, gather, split, mixed) and its compile seconds, and which one ``mixed`` takes: the measurement behind
  ``gradjax.models.layers.mixed_conv``'s rule; and split's weight gradient alone as a convolution and
  as matrix products, behind ``gradjax.models.layers.weight_gradient_by_products``.
* ``loops``: each step at a program's top level against the same step inside a loop (a
  ``lax.scan`` of ``--loop_steps`` steps, as a training epoch or a line search's ``while_loop`` runs
  it), per model (``--loop_models``) and convolution (xla, split, mixed): an SGD step at batch
  ``--loop_batch_size`` and a DLG evaluation (value and gradient w.r.t. the dummy) at batch 1.
* ``ttq``: time-to-quality of DLG on ``lenet_zhu`` (U(−0.5, 0.5) init, ``--ttq_images`` scikit-image
  photos at 32×32, batch 1): wall time until the best iterate's PSNR reaches ``--ttq_psnr``, checked
  every 10 iterations; the JAX run uses the ``dlg`` preset (L-BFGS, zoom line search) after a
  warm-up that compiles it. PyTorch runs ``torch.optim.LBFGS`` (lr 1, history 100) on the same weights
  and starting point, both as the DLG reference code does (20 fixed-size inner iterations per step)
  and with ``line_search_fn="strong_wolfe"``; the objective counts as checked after each ``step``.
  Then a fixed budget for Inverting Gradients on ``--ig_model``: ``--ig_iterations`` iterations of
  1 − cosine + TV with signed Adam, in JAX and in PyTorch eager.
* ``restarts``: wall time of ``--restart_iterations`` DLG iterations on ``lenet_zhu`` for each
  restart count in ``--restart_counts`` and each strategy (sequential, vmap, map with
  ``--restart_map_batch_size``), compilation excluded, as a ratio to one restart, and the FLOP rate of the
  objective evaluations the run made.
* ``clients``: ``--restart_iterations`` iterations of DLG and of Inverting Gradients on K clients of
  one ``lenet_zhu`` round (one photo each, one restart) for each K in ``--client_counts``: the K
  clients as one solver run (``attacks.reconstruct_clients``) under each strategy (sequential, vmap)
  against K calls of ``attacks.reconstruct`` one after another (what an audit did), compilation
  excluded, and the ratio to one client.
* ``profile``: where a vmapped DLG iteration's time goes, per restart count: the R vmapped
  evaluations of the objective (time, GFLOP/s by XLA's cost analysis, fraction of the core's measured
  float32 matmul peak), the R L-BFGS updates alone, the size of their stored pairs and the time two
  passes over them take at the measured memory bandwidth (``step.restart_profile``).
* ``linesearch``: what L-BFGS's zoom line search costs under ``vmap``: a vmapped while loop runs until
  the slowest restart's search ends, so every iteration of vmapped steps costs the maximum over
  restarts of the objective evaluations, and a loop of one trial a trip (``Solver.advance``, what the
  driver runs for batched restarts on an accelerator) the busiest restart's evaluations over the run. ``--restart_counts``' largest count of DLG restarts on ``lenet_zhu``, for each
  cap in ``--linesearch_caps`` (``max_linesearch_steps``): evaluations per restart and iteration (mean)
  against the per-iteration maximum (what vmapped steps pay, read from the per-restart counters
  after every iteration) and the busiest restart's per iteration (what one trial a trip pays; vmap
  on CPU runs steps), the same counts for as many clients of one round (one photo each), the wall time of the vmapped run, and the quality reached (best PSNR, and
  restarts at ≥ ``--ttq_psnr`` dB).

* ``startup``: the README's main job (``gradjax reconstruct``, LPIPS off as on a fresh install) as a whole
  process, timed from outside: once on an empty compilation cache, then ``--startup_runs`` times on
  the cache it filled, with the attack's own ``wall_time_s`` and PSNR beside. The processes inherit
  this one's CPU affinity (pin the benchmark with ``taskset`` for one core) and write Python's
  bytecode whatever ``PYTHONDONTWRITEBYTECODE`` says, as on a user's machine.
* ``codegen``: what the run-once programs' compiler options cost on this machine's cores: the model's
  draw (``--codegen_models``) and its client's gradient compiled under
  :data:`gradjax.compilation.ONCE` (one LLVM module) against the same options with XLA:CPU's parallel
  code generation (its default split of the module), median of ``--codegen_repeats`` compilations
  each, alternating, and their ratio. Behind ONCE's choice of one module (measured on one and two
  cores) and what an accelerator's host, with more cores, should take.
* ``anatomy``: where the compilation of an attack's first result goes, per ``--anatomy_jobs``
  (preset:model, one restart; preset:model:restarts:conv, that many vmapped with those
  convolutions): the solver's first state (with L-BFGS one value and gradient of the
  objective), one step, the chunk program an accelerator runs, and the same optimizer's step on a quadratic of
  the dummy data's shapes (the solver's own share; for L-BFGS also without its line search), each
  lowered and compiled ``--anatomy_repeats`` times, with the HLO instructions it has before and after XLA's passes (``step.compile_anatomy``).

  python -m benchmarks suite --output_dir=runs/benchmark_cpu
  python -m benchmarks suite --sections=restarts --restart_counts=1,8,64   # on a GPU
  python -m benchmarks suite --suite=gpu --parts=steps,restarts --output_dir=runs/gpu

``--suite=gpu`` runs the accelerator suite instead (``accelerator.py``: step time and memory,
restarts 1-256, 64-restart DLG, matmul precisions, Inverting Gradients on ResNet20-4, the FedAvg
replay, GradInversion against HFGInv at 15 000 iterations), part by part; ``--quick`` shrinks it to a CPU smoke test.
Its parts accumulate in one folder (``--output_dir``, default ``runs/benchmark_gpu``), call after call:
a part already written there is skipped unless ``--overwrite``.

This builds on ``python -m benchmarks step`` (its timing helpers, PyTorch ports and flags ``--models``,
``--repeats``, ``--warmup``, ``--max_seconds``, ``--torch`` and ``--seed``).
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks import accelerator, op_profile, torch_first_result, torch_ports
from benchmarks import step as bs
from gradjax import attacks, clients, compilation, driver, dummy, losses, metrics, models, presets
from gradjax.run import report
from gradjax.cli import common

GPU_FOLDER = "runs/benchmark_gpu"  # --suite=gpu without --output_dir
SECTIONS = ("steps", "ops", "convs", "loops", "ttq", "restarts", "clients", "profile", "linesearch",
            "startup", "codegen", "anatomy")
_SUITE = flags.DEFINE_enum("suite", "cpu", ["cpu", "gpu"], "cpu: the --sections below; gpu: the "
                           "accelerator suite's --parts.")
_PARTS = flags.DEFINE_list("parts", list(accelerator.PARTS), "Accelerator suite parts: "
                           f"{', '.join(accelerator.PARTS)}.")
_QUICK = flags.DEFINE_bool("quick", False, "Accelerator suite at toy sizes (a CPU smoke test).")
_SUITE_DATASET = flags.DEFINE_string("suite_dataset", "cifar10", "Images of the accelerator suite's "
                                     "ig and fedavg parts (CIFAR-10 test images 0-4 in the protocol).")
_IG_INIT = flags.DEFINE_string("ig_init", None, "Model draw of the accelerator suite's ig part "
                               "(gradjax.models.inits; unset: the zoo's default; torchvision: the "
                               "paper's ResNets).")
_DATA_DIR = common.define_fields("data.data_dir")["data.data_dir"]
_SECTIONS = flags.DEFINE_list("sections", list(SECTIONS), f"Which parts to run: {', '.join(SECTIONS)}.")
_BATCH_SIZES = common.define_batch_sizes_flag()  # of the steps section
common.define_output_flags(resumable=False)
_TTQ_IMAGES = flags.DEFINE_integer("ttq_images", 3, "Photos for the time-to-quality runs.")
_TTQ_PSNR = flags.DEFINE_float("ttq_psnr", 30.0, "Target PSNR (dB) of the time-to-quality runs.")
_TTQ_MAX_S = flags.DEFINE_float("ttq_max_seconds", 120.0, "Give up a time-to-quality run after this.")
_IG_MODEL = flags.DEFINE_string("ig_model", "resnet20-4", "Model of the fixed-budget IG measurement.")
_IG_ITERATIONS = flags.DEFINE_integer("ig_iterations", 20, "Iterations of the fixed-budget IG run.")
_RESTART_COUNTS = flags.DEFINE_list("restart_counts", ["1", "4", "16", "64", "256"], "Restart counts.")
_CLIENT_COUNTS = flags.DEFINE_list("client_counts", ["1", "4", "16"], "Client counts of the clients "
                                  "section.")
_RESTART_ITERATIONS = flags.DEFINE_integer("restart_iterations", 100, "DLG iterations per timing.")
_MAP_BATCH = flags.DEFINE_integer("restart_map_batch_size", 8, "Restarts vectorised together by lax.map in the restarts section.")
_LS_CAPS = flags.DEFINE_list("linesearch_caps", ["20", "8", "4", "2"],
                             "max_linesearch_steps values of the linesearch section.")
# One layer each, N:H:C:O:k:stride (batch, input size, channels in and out, kernel, stride): LeNet's
# and the CIFAR ResNets' and ConvNet's layers at batches 1 and 8.
CONV_SHAPES = ("1:32:3:12:5:2", "1:16:12:12:5:1", "8:32:3:12:5:2", "8:16:12:12:5:1", "1:32:3:64:3:1",
               "1:32:64:64:3:1", "1:16:128:128:3:1", "1:8:256:256:3:1", "1:4:512:512:3:1",
               "1:32:64:128:3:2", "1:32:64:128:1:2", "8:32:3:64:3:1", "8:32:64:64:3:1",
               "8:16:128:128:3:1", "8:8:256:256:3:1", "8:4:512:512:3:1", "8:32:64:128:3:2",
               "8:32:64:128:1:2", "8:32:64:128:3:1", "8:32:128:256:3:1", "8:32:256:256:3:1")
_CONV_SHAPES = flags.DEFINE_list("conv_shapes", list(CONV_SHAPES), "Layer shapes of the convs "
                                 "section, N:H:C:O:k:stride.")
_LOOP_MODELS = flags.DEFINE_list("loop_models", ["lenet_zhu", "resnet20", "resnet20-4"], "Models of "
                                 "the loops section.")
_LOOP_BATCH = flags.DEFINE_integer("loop_batch_size", 8, "Batch of the loops section's training step.")
_LOOP_STEPS = flags.DEFINE_integer("loop_steps", 3, "Steps per loop in the loops section.")
_STARTUP_RUNS = flags.DEFINE_integer("startup_runs", 3, "Warm-cache runs of the startup section.")
_LS_ITERATIONS = flags.DEFINE_integer("linesearch_iterations", 200, "DLG iterations of the linesearch section.")
_CODEGEN_MODELS = flags.DEFINE_list("codegen_models", ["lenet_zhu", "resnet20-4"], "Models of the "
                                    "codegen section.")
_CODEGEN_REPEATS = flags.DEFINE_integer("codegen_repeats", 3, "Compilations per program and options in "
                                        "the codegen section.")
_ANATOMY_JOBS = flags.DEFINE_list("anatomy_jobs", ["dlg:lenet_zhu", "inverting_gradients:resnet20-4"],
                                  "preset:model[:restarts[:conv]] of the anatomy section (one "
                                  "restart, auto's convolutions if not given).")
_ANATOMY_REPEATS = flags.DEFINE_integer("anatomy_repeats", 3, "Compilations per program in the anatomy "
                                        "section.")

CHECK_EVERY = 10  # iterations between PSNR checks in the time-to-quality runs


# --- steps ----------------------------------------------------------------------------------------


def section_steps(torch, timing: dict, seed: int) -> list[dict]:
  rows = []
  for batch in map(int, _BATCH_SIZES.value):
    images = bs.photos(batch)
    for name in bs._MODELS.value:
      row = dict(model=name, batch_size=batch)
      j = bs.benchmark_jax(name, images.x, images.y, seed=seed, **timing)
      other = "xla" if j["conv"] == "im2col" else "im2col"
      k = bs.benchmark_jax(name, images.x, images.y, seed=seed, conv=other, **timing)
      row.update(conv=j["conv"], other_conv=other, other_conv_match_ms=k["match"]["median_ms"],
                 other_over_default=k["match"]["median_ms"] / j["match"]["median_ms"])
      row.update(jax_plain_ms=j["plain"]["median_ms"], jax_match_ms=j["match"]["median_ms"],
                 compile_plain_s=j["compile_s"]["plain"], compile_match_s=j["compile_s"]["match"],
                 match_over_plain=j["match"]["median_ms"] / j["plain"]["median_ms"],
                 **bs.step_memory(name, batch, seed))
      if torch is not None:
        t = bs.benchmark_torch(name, images.x, images.y, seed=seed, **timing)
        row.update(torch_plain_ms=t["plain"]["median_ms"], torch_match_ms=t["match"]["median_ms"],
                   torch_over_jax=t["match"]["median_ms"] / j["match"]["median_ms"])
      print(f"steps {name} batch {batch}: {row}", flush=True)
      rows.append(row)
  return rows


# --- ops ------------------------------------------------------------------------------------------


def section_ops(torch, seed: int) -> list[dict]:
  """The matching step of each model and batch size, op by op (``op_profile``), in JAX and, with
  PyTorch installed, in PyTorch eager."""
  rows = []
  for batch in map(int, _BATCH_SIZES.value):
    images = bs.photos(batch)
    for name in bs._MODELS.value:
      _, _, _, match_step, match_args = bs.jax_steps(name, images.x, images.y, seed=seed)
      compiled, _ = bs.compile_ahead(match_step, *match_args)
      row = dict(model=name, batch_size=batch, jax=op_profile.jax_profile(compiled, match_args))
      if torch is not None:
        _, torch_match, _ = bs.torch_steps(name, images.x, images.y, seed=seed)
        row["torch"] = op_profile.torch_profile(torch_match)
      print(f"ops {name} batch {batch}: {row}", flush=True)
      rows.append(row)
  return rows


# --- convs ----------------------------------------------------------------------------------------


def section_convs(timing: dict, seed: int) -> list[dict]:
  """Per layer shape, one layer's share of a matching step with each CPU convolution: value and
  gradient w.r.t. x of ``||d/dW sum(tanh(conv(x, W))) - G||²`` (the weight gradient differentiated
  in the input, as gradient matching does), for im2col, gather, split and mixed (and which one mixed
  took), each program's compile seconds too."""
  rows = []
  dn = ("NHWC", "HWIO", "NHWC")
  for spec in _CONV_SHAPES.value:
    n, h, c, o, k, stride = map(int, spec.split(":"))
    keys = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(keys[0], (n, h, h, c))
    w = 0.05 * jax.random.normal(keys[1], (k, k, c, o))
    target = jax.random.normal(keys[2], w.shape)
    row = dict(shape=spec)
    for name in ("im2col", "gather", "split", "mixed"):
      conv = models.layers.conv_general_dilated(name)

      def objective(x, w, target, conv=conv):
        grad = jax.grad(lambda w: jnp.sum(jnp.tanh(conv(x, w, (stride, stride), "SAME",
                                                        dimension_numbers=dn))))(w)
        return jnp.sum((grad - target) ** 2)

      compiled, row[f"{name}_compile_s"] = bs.compile_ahead(jax.value_and_grad(objective), x, w, target)
      row[f"{name}_ms"] = bs.measure(lambda: jax.block_until_ready(compiled(x, w, target)),
                                     **timing)["median_ms"]
    jaxpr = str(jax.make_jaxpr(lambda x, w: models.layers.mixed_conv(
        x, w, (stride, stride), "SAME", dimension_numbers=dn))(x, w))
    row.update(split_over_im2col=row["split_ms"] / row["im2col_ms"],
               gather_over_im2col=row["gather_ms"] / row["im2col_ms"],
               gather_over_im2col_compile=row["gather_compile_s"] / row["im2col_compile_s"],
               mixed_takes="split" if "custom_vjp_call" in jaxpr else "im2col")
    # split's weight gradient alone, in its two forms.
    dy = jax.random.normal(keys[2], (n, -(-h // stride), -(-h // stride), o))
    for name in ("convolution", "products"):
      fn = getattr(models.layers, f"weight_gradient_{name}")
      compiled, _ = bs.compile_ahead(lambda x, dy, fn=fn: fn(x, dy, (k, k), (stride, stride), "SAME"), x, dy)
      row[f"wgrad_{name}_ms"] = bs.measure(lambda: jax.block_until_ready(compiled(x, dy)), **timing)["median_ms"]
    row.update(wgrad_convolution_over_products=row["wgrad_convolution_ms"] / row["wgrad_products_ms"],
               wgrad_takes="products" if models.layers.weight_gradient_by_products(dy.shape, c)
               else "convolution")
    print(f"convs {row}", flush=True)
    rows.append(row)
  return rows


# --- loops ----------------------------------------------------------------------------------------


def section_loops(timing: dict, seed: int) -> list[dict]:
  """Per model and convolution, the median ms of an SGD step (batch ``--loop_batch_size``) and of a
  DLG evaluation (batch 1), each at a program's top level and per step inside a ``lax.scan`` of
  ``--loop_steps`` steps that feeds every step's result to the next."""
  rows, k = [], _LOOP_STEPS.value
  for name in _LOOP_MODELS.value:
    for conv in ("xla", "split", "mixed"):
      row = dict(model=name, conv=conv)
      for kind, batch in (("sgd", _LOOP_BATCH.value), ("dlg", 1)):
        x = bs.photos(batch)
        _, plain, (variables, xb, yb), match, (dummy, obs) = bs.jax_steps(name, x.x, x.y, seed=seed, conv=conv)
        if kind == "sgd":
          def step(params, _, plain=plain, variables=variables, xb=xb, yb=yb):
            _, grad = plain({**variables, "params": params}, xb, yb)
            return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grad), None
          start = variables["params"]
        else:
          def step(d, _, match=match, obs=obs):
            _, grad = match(d, obs)
            return jax.tree.map(lambda a, g: a - 1e-3 * g, d, grad), None
          start = dummy
        top, _ = bs.compile_ahead(lambda s: step(s, None)[0], start)
        loop, _ = bs.compile_ahead(lambda s: jax.lax.scan(step, s, None, length=k)[0], start)
        row[f"{kind}_top_ms"] = bs.measure(lambda: jax.block_until_ready(top(start)), **timing)["median_ms"]
        row[f"{kind}_loop_ms"] = bs.measure(lambda: jax.block_until_ready(loop(start)),
                                            **timing)["median_ms"] / k
        row[f"{kind}_loop_over_top"] = row[f"{kind}_loop_ms"] / row[f"{kind}_top_ms"]
      print(f"loops {row}", flush=True)
      rows.append(row)
  return rows


# --- time to quality ------------------------------------------------------------------------------


def ttq_torch(torch, net, x_true, y, init: dict, line_search: str | None, target: float,
              max_s: float) -> dict:
  """DLG in PyTorch eager until PSNR >= target: the reference loop with ``optimizer.step(closure)``."""
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  params = list(net.parameters())
  x = torch.from_numpy(np.ascontiguousarray(x_true.transpose(0, 3, 1, 2)))
  observed = [g.detach() for g in torch.autograd.grad(F.cross_entropy(net(x), torch.from_numpy(y)), params)]
  dummy_x = torch.from_numpy(np.ascontiguousarray(init["x"].transpose(0, 3, 1, 2))).requires_grad_(True)
  dummy_y = torch.from_numpy(init["label_logits"].copy()).requires_grad_(True)
  opt = torch.optim.LBFGS([dummy_x, dummy_y], lr=1, history_size=100, line_search_fn=line_search)
  evaluations = 0

  def closure():
    nonlocal evaluations
    evaluations += 1
    opt.zero_grad()
    return torch_ports.torch_dlg_objective(net, params, observed, dummy_x, dummy_y)

  start, steps, psnr = time.perf_counter(), 0, 0.0
  while time.perf_counter() - start < max_s:
    opt.step(closure)
    steps += 1
    rec = dummy_x.detach().numpy().transpose(0, 2, 3, 1)
    if not np.all(np.isfinite(rec)):
      break
    psnr = float(metrics.psnr(rec, x_true)[0])
    if psnr >= target:
      return dict(seconds=time.perf_counter() - start, reached=True, psnr=psnr, steps=steps,
                  evaluations=evaluations)
  return dict(seconds=time.perf_counter() - start, reached=False, psnr=psnr, steps=steps,
              evaluations=evaluations)


def ttq_jax(model, obs, x_true, key, target: float, max_s: float) -> dict:
  attack = presets.dlg(10_000)
  start = time.perf_counter()
  reached = []

  def monitor(state):
    psnr = float(metrics.psnr(np.asarray(state.best_params["x"]), x_true)[0])
    reached.append(psnr)
    return psnr >= target or time.perf_counter() - start > max_s

  rec = attacks.reconstruct(attack, model.apply_fn, obs, key, input_shape=x_true.shape[1:],
                            execution=driver.Execution("sequential", chunk=CHECK_EVERY,
                                                        monitor=monitor))
  return dict(seconds=time.perf_counter() - start, reached=bool(reached and reached[-1] >= target),
              psnr=reached[-1] if reached else None, iterations=int(rec.iterations[0]),
              evaluations=int(rec.evaluations[0]))


def ig_fixed_budget(torch, name: str, iterations: int, seed: int) -> dict:
  """Seconds for ``iterations`` Inverting-Gradients iterations (1 − cosine, TV 1e-4, signed Adam, box)."""
  images = bs.photos(1)
  model = models.create(name, jax.random.key(seed), input_shape=images.x.shape[1:],
                        num_classes=bs.NUM_CLASSES)
  obs = clients.fedsgd(model.apply_fn, model.variables, images.x, images.y, share_labels=True)
  attack = presets.inverting_gradients(iterations)
  kw = dict(input_shape=images.x.shape[1:], execution=driver.Execution("sequential", chunk=iterations))
  attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(1), **kw)  # compiles
  start = time.perf_counter()
  attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), **kw)
  out = dict(model=name, iterations=iterations, jax_s=time.perf_counter() - start, torch_s=None)
  if torch is not None:
    import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
    torch.manual_seed(seed)
    net = torch_ports.build_torch_model(name, images.x.shape[1:], bs.NUM_CLASSES).eval()
    params = list(net.parameters())
    x = torch.from_numpy(np.ascontiguousarray(images.x.transpose(0, 3, 1, 2)))
    y = torch.from_numpy(np.asarray(images.y, np.int64))
    observed = [g.detach() for g in torch.autograd.grad(F.cross_entropy(net(x), y), params)]
    dummy = torch.randn(x.shape, requires_grad=True)
    start = time.perf_counter()
    torch_first_result.ig_loop(torch, net, y, observed, dummy, iterations)
    out["torch_s"] = time.perf_counter() - start
  out["torch_over_jax"] = None if out["torch_s"] is None else out["torch_s"] / out["jax_s"]
  print(f"ig {out}", flush=True)
  return out


def section_ttq(torch, seed: int) -> dict:
  images = bs.photos(_TTQ_IMAGES.value)
  rows = []
  warm = models.create("lenet_zhu", jax.random.key(999), input_shape=(32, 32, 3), num_classes=bs.NUM_CLASSES)
  warm_obs = clients.fedsgd(warm.apply_fn, warm.variables, images.x[:1], images.y[:1])
  attacks.reconstruct(presets.dlg(CHECK_EVERY), warm.apply_fn, warm_obs,
                      jax.random.key(0), input_shape=(32, 32, 3),
                      execution=driver.Execution("sequential", chunk=CHECK_EVERY))
  for i in range(len(images.x)):
    x, y = images.x[i:i + 1], images.y[i:i + 1]
    model = models.create("lenet_zhu", jax.random.key(seed + i), input_shape=(32, 32, 3),
                          num_classes=bs.NUM_CLASSES)
    obs = clients.fedsgd(model.apply_fn, model.variables, x, y)
    key = jax.random.key(seed + 100 + i)
    row = dict(image=i, jax=ttq_jax(model, obs, x, key, _TTQ_PSNR.value, _TTQ_MAX_S.value))
    if torch is not None:
      net, _ = torch_ports.torch_lenet(model, torch, x)
      init = jax.device_get(dummy.init_dummy(jax.random.split(key, 1)[0], dummy.normal, x.shape,
                                               bs.NUM_CLASSES))
      init = {k: np.asarray(v, np.float32) for k, v in init.items()}
      for label, ls in (("torch_reference", None), ("torch_strong_wolfe", "strong_wolfe")):
        row[label] = ttq_torch(torch, net, x, np.asarray(y, np.int64), init, ls, _TTQ_PSNR.value,
                               _TTQ_MAX_S.value)
    print(f"ttq {row}", flush=True)
    rows.append(row)
  ig = ig_fixed_budget(torch, _IG_MODEL.value, _IG_ITERATIONS.value, seed)
  return dict(dlg=rows, ig=ig)


# --- restarts -------------------------------------------------------------------------------------


def section_restarts(seed: int) -> list[dict]:
  return list(bs.restart_timings([int(r) for r in _RESTART_COUNTS.value], _RESTART_ITERATIONS.value,
                                 ("sequential", "vmap", "map"), _MAP_BATCH.value, seed))


def section_clients(seed: int) -> list[dict]:
  return list(bs.client_timings([int(k) for k in _CLIENT_COUNTS.value], _RESTART_ITERATIONS.value,
                                ("sequential", "vmap"), seed))


def section_profile(seed: int) -> dict:
  return bs.restart_profile([int(r) for r in _RESTART_COUNTS.value], seed)


# --- line search under vmap -----------------------------------------------------------------------


def _trials(counts) -> dict:
  """Per-iteration evaluations from the runs' counters after each iteration: the mean over runs,
  the mean of each iteration's maximum (what vmapped steps pay) and the busiest run's (what a loop
  of one trial a trip pays: ``Solver.advance``, the driver's for batched runs on an accelerator)."""
  per_iteration = np.diff(np.stack(counts), axis=0)  # (iterations - 1, runs)
  row = dict(mean_evaluations=float(per_iteration.mean()),
             mean_max_evaluations=float(per_iteration.max(axis=1).mean()),
             busiest_evaluations=float(per_iteration.sum(axis=0).max() / len(per_iteration)))
  row["efficiency"] = row["mean_evaluations"] / row["mean_max_evaluations"]
  row["efficiency_one_trial_a_trip"] = row["mean_evaluations"] / row["busiest_evaluations"]
  return row


def section_linesearch(seed: int, restarts: int) -> list[dict]:
  images = bs.photos(1)
  model = models.create("lenet_zhu", jax.random.key(seed), input_shape=(32, 32, 3),
                        num_classes=bs.NUM_CLASSES)
  obs = clients.fedsgd(model.apply_fn, model.variables, images.x, images.y)
  iterations = _LS_ITERATIONS.value
  rows = []
  for cap in map(int, _LS_CAPS.value):
    attack = presets.dlg(iterations)
    attack = dataclasses.replace(attack, optimizer=dataclasses.replace(attack.optimizer,
                                                                       max_linesearch_steps=cap))
    kw = dict(input_shape=(32, 32, 3), restarts=restarts)
    counts = []

    def monitor(state):
      counts.append(np.asarray(state.evaluations))
      return False

    # Accounting run: one iteration per chunk, the per-restart evaluation counters after each.
    attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2),
                        execution=driver.Execution("vmap", chunk=1, monitor=monitor), **kw)
    row = dict(cap=cap, restarts=restarts, iterations=iterations, **_trials(counts))
    # The same count of clients of one round (one photo each, one restart each), vmapped together.
    counts = []
    round_model, observations = bs.client_observations(restarts, seed)
    attacks.reconstruct_clients(attack, round_model.apply_fn, observations,
                                list(jax.random.split(jax.random.key(2), restarts)),
                                input_shape=(32, 32, 3),
                                execution=driver.Execution("vmap", chunk=1, monitor=monitor))
    row.update({f"clients_{k}": v for k, v in _trials(counts).items()})
    for strategy in ("vmap", "sequential"):
      execution = driver.Execution(strategy, chunk=iterations)
      attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(1), execution=execution,
                          **kw)  # compiles (vmap: one program per restart count)
      start = time.perf_counter()
      rec = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(2), execution=execution,
                                **kw)
      row[f"{strategy}_s"] = time.perf_counter() - start
    x_all = np.asarray(rec.x_restarts).reshape(restarts, *images.x.shape[1:])
    psnr = metrics.psnr(x_all, np.broadcast_to(images.x, x_all.shape))
    row.update(best_psnr=float(np.max(psnr)), reached=int(np.sum(psnr >= _TTQ_PSNR.value)))
    print(f"linesearch {row}", flush=True)
    rows.append(row)
  return rows


# --- report ---------------------------------------------------------------------------------------


def section_startup(runs: int) -> dict:
  """The README's main job as a whole process: once on an empty compilation cache (cold), then
  ``runs`` times on the cache it filled (warm); each process's wall time from outside, its attack's
  own ``wall_time_s`` and the PSNR it reports."""
  done = bs.reconstruct_processes(["--lpips=none"], 1 + runs)
  return dict(command="gradjax reconstruct --lpips=none", process_s=[r["process_s"] for r in done],
              attack_s=[r["attack_s"] for r in done], psnr=done[-1]["psnr"],
              cores=len(os.sched_getaffinity(0)))


def section_codegen(names: list[str], repeats: int, seed: int) -> list[dict]:
  """Per model of ``names`` and program (its draw, ``models._init``; its client's gradient,
  ``clients.gradient`` of one photo), the median seconds of ``repeats`` compilations under
  :data:`gradjax.compilation.ONCE` (``one_module_s``) and under the same options with XLA:CPU's own
  split of the module for parallel code generation (``split_s``), alternating; ``split_over_one``
  their ratio. Lowered and compiled afresh every time (no cache); the lowering is not timed. On the
  host's CPU where the default device is an accelerator, as gradjax runs these programs there
  (:func:`gradjax.compilation.setup_device`); ``platform``: where they compiled."""
  host = compilation.setup_device()
  with bs.compiled_afresh(), compilation.on_setup_device(host):
    return _codegen_rows(names, repeats, seed, host)


def _codegen_rows(names, repeats, seed, host) -> list[dict]:
  one = compilation.options(compilation.ONCE)
  split = {k: v for k, v in one.items() if k != "xla_cpu_parallel_codegen_split_count"}
  photo = bs.photos(1)
  rows = []
  for name in names:
    module = models.get_module(name, num_classes=bs.NUM_CLASSES)
    model = models.create(name, jax.random.key(seed), input_shape=(32, 32, 3),
                          num_classes=bs.NUM_CLASSES)
    programs = {
        "draw": lambda o: jax.jit(models._init.__wrapped__, static_argnums=0, compiler_options=o).lower(
            module, jax.random.key(seed), np.zeros((1, 32, 32, 3), np.float32)),
        "client gradient": lambda o: jax.jit(
            clients._gradient.__wrapped__, static_argnums=(3, 4, 5), compiler_options=o).lower(
                model.variables, photo.x, photo.y, model.apply_fn, False, losses.cross_entropy)}
    for program, lower in programs.items():
      seconds = {"one": [], "split": []}
      for _ in range(repeats):
        for kind, options in (("one", one), ("split", split)):
          jax.clear_caches()  # a lowering keeps the executable it compiled, and JAX the lowering
          lowered = lower(options)
          start = time.perf_counter()
          lowered.compile()
          seconds[kind].append(time.perf_counter() - start)
      row = dict(model=name, program=program, one_module_s=float(np.median(seconds["one"])),
                 split_s=float(np.median(seconds["split"])), repeats=repeats,
                 cores=len(os.sched_getaffinity(0)),
                 platform=(host or jax.devices()[0]).platform)
      row["split_over_one"] = row["split_s"] / row["one_module_s"]
      print(f"codegen {row}", flush=True)
      rows.append(row)
  return rows


def _f(v, fmt="{:.2f}"):
  return "-" if v is None else fmt.format(v)


def markdown(result: dict) -> str:
  env = result["environment"]
  lines = [f"# gradjax benchmarks on {env['platform']} ({env['device_kind']}, {env['cpu_model']})", "",
           f"`{result['command']}`", "",
           f"jax {env['jax']}, numpy {env['numpy']}, ml_dtypes {env['ml_dtypes']}, torch {env['torch']} "
           f"({env['torch_threads']} threads).", ""]
  if "steps" in result:
    lines += ["## One step (median ms)", "",
              f"Convolutions: {result['steps'][0]['conv'] if result['steps'] else '-'} (the backend's "
              "default); the other implementation's matching step and its time over the default's.", "",
              "| model | batch | plain | matching | matching/plain | compile s (plain/matching) | "
              "memory MB (compiled / peak) | matching, other conv (×) | PyTorch matching | PyTorch/JAX |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["steps"]:
      mem = f"{_f(r['compiled_bytes'] and r['compiled_bytes'] / 2**20, '{:.1f}')} / " \
            f"{_f(r['peak_bytes_in_use'] and r['peak_bytes_in_use'] / 2**20, '{:.1f}')}"
      lines.append(f"| {r['model']} | {r['batch_size']} | {r['jax_plain_ms']:.3f} | "
                   f"{r['jax_match_ms']:.3f} | {r['match_over_plain']:.1f}× | "
                   f"{r['compile_plain_s']:.2f} / {r['compile_match_s']:.2f} | {mem} | "
                   f"{r['other_conv_match_ms']:.3f} ({r['other_over_default']:.2f}×) | "
                   f"{_f(r.get('torch_match_ms'), '{:.3f}')} | {_f(r.get('torch_over_jax'))}× |")
    lines.append("")
  if "ops" in result:
    lines += ["## The matching step op by op (ms per step; share of the profiled ops)", "",
              "XLA:CPU's thunks (jax.profiler) and PyTorch's ATen ops (torch.profiler, self time), "
              "filed by `benchmarks.op_profile`: matmul (dots, convolutions), reduction, data "
              "movement (pad, slice, concatenate, copy, transpose: im2col's patches and their "
              "transpose), elementwise. matmul GFLOP/s: the dots' and convolutions' FLOPs from the "
              "HLO shapes over their time.", "", op_profile.markdown(result["ops"]), "", "Slowest ops:", ""]
    for r in result["ops"]:
      for framework in ("jax", "torch"):
        if framework in r:
          ops = "; ".join(f"{o['op']}{' (' + '/'.join(o['source']) + ')' if o.get('source') else ''} "
                          f"{o['ms']:.3g}" for o in r[framework]["top"][:3])
          lines.append(f"- {r['model']}, batch {r['batch_size']}, {framework}: {ops}")
    lines.append("")
  if "convs" in result:
    lines += ["## One layer's matching step per convolution (median ms)", "",
              "Value and gradient w.r.t. x of ‖∂/∂W Σ tanh(conv(x, W)) − G‖² for one layer of shape "
              "N:H:C:O:k:stride ('SAME' padding).", "",
              "| shape | im2col | gather | gather/im2col | compile s: im2col, gather | split | split/im2col "
              "| mixed | mixed takes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["convs"]:
      gather = (f"{r['gather_ms']:.2f} | {r['gather_over_im2col']:.2f} | "
                f"{r['im2col_compile_s']:.2f}, {r['gather_compile_s']:.2f}" if "gather_ms" in r else "- | - | -")
      lines.append(f"| {r['shape']} | {r['im2col_ms']:.2f} | {gather} | {r['split_ms']:.2f} | "
                   f"{r['split_over_im2col']:.2f} | {r['mixed_ms']:.2f} | {r['mixed_takes']} |")
    if "wgrad_products_ms" in result["convs"][0]:
      lines += ["", "split's weight gradient alone (median ms): as a convolution (x with batch and channels "
                "swapped) and as kh·kw matrix products, and which one split takes "
                "(`gradjax.models.layers.weight_gradient_by_products`).", "",
                "| shape | convolution | products | convolution/products | split takes |", "|---|---|---|---|---|"]
      for r in result["convs"]:
        lines.append(f"| {r['shape']} | {r['wgrad_convolution_ms']:.2f} | {r['wgrad_products_ms']:.2f} | "
                     f"{r['wgrad_convolution_over_products']:.2f} | {r['wgrad_takes']} |")
    lines.append("")
  if "loops" in result:
    lines += ["## Top level against inside a loop (median ms per step)", "",
              f"An SGD step at batch {result['config']['loop_batch_size']} and a DLG evaluation at batch 1, "
              f"each compiled alone and as a `lax.scan` of {result['config']['loop_steps']} steps.", "",
              "| model | convolutions | SGD step: top | in a loop | loop/top | DLG evaluation: top | "
              "in a loop | loop/top |", "|---|---|---|---|---|---|---|---|"]
    for r in result["loops"]:
      lines.append(f"| {r['model']} | {r['conv']} | {r['sgd_top_ms']:.2f} | {r['sgd_loop_ms']:.2f} | "
                   f"{r['sgd_loop_over_top']:.1f}× | {r['dlg_top_ms']:.2f} | {r['dlg_loop_ms']:.2f} | "
                   f"{r['dlg_loop_over_top']:.1f}× |")
    lines.append("")
  if "ttq" in result:
    lines += [f"## Time to PSNR ≥ {result['config']['ttq_psnr']:g} dB, DLG on lenet_zhu (s)", "",
              "| image | JAX (iterations) | PyTorch reference LBFGS (steps) | PyTorch strong-Wolfe LBFGS (steps) "
              "| reference/JAX | strong-Wolfe/JAX |", "|---|---|---|---|---|---|"]
    for r in result["ttq"]["dlg"]:
      def cell(d, count):
        if d is None:
          return "-"
        return (f"{d['seconds']:.2f} ({d[count]})" if d["reached"]
                else f"not reached in {d['seconds']:.0f} s ({_f(d['psnr'])} dB)")

      def ratio(d, jax_run=r["jax"]):  # where both reached the target
        if d is None or not (d["reached"] and jax_run["reached"]):
          return "-"
        return f"{d['seconds'] / jax_run['seconds']:.1f}×"
      lines.append(f"| {r['image']} | {cell(r['jax'], 'iterations')} | "
                   f"{cell(r.get('torch_reference'), 'steps')} | {cell(r.get('torch_strong_wolfe'), 'steps')} | "
                   f"{ratio(r.get('torch_reference'))} | {ratio(r.get('torch_strong_wolfe'))} |")
    ig = result["ttq"]["ig"]
    lines += ["", f"Inverting Gradients, {ig['iterations']} iterations on {ig['model']}: JAX "
              f"{ig['jax_s']:.2f} s, PyTorch eager {_f(ig['torch_s'])} s "
              f"(PyTorch/JAX {_f(ig['torch_over_jax'])}×).", ""]
  if "restarts" in result:
    lines += [f"## Restarts: {result['config']['restart_iterations']} DLG iterations on lenet_zhu (s; ratio to 1 restart)",
              "", "| strategy | " + " | ".join(f"R={r}" for r in result["config"]["restart_counts"]) + " |",
              "|---|" + "---|" * len(result["config"]["restart_counts"])]
    for strategy in ("sequential", "vmap", "map"):
      cells = [f"{r['seconds']:.2f} ({_f(r['over_one'], '{:.1f}')}×)" for r in result["restarts"]
               if r["strategy"] == strategy]
      lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    lines += ["", "The objective's FLOP rate in those runs (GFLOP/s: evaluations × XLA's count for one "
              "over the wall time):", "",
              "| strategy | " + " | ".join(f"R={r}" for r in result["config"]["restart_counts"]) + " |",
              "|---|" + "---|" * len(result["config"]["restart_counts"])]
    for strategy in ("sequential", "vmap", "map"):
      cells = [f"{r['gflops']:.1f}" for r in result["restarts"] if r["strategy"] == strategy]
      lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    lines.append("")
  if "clients" in result:
    lines += [f"## Clients: {result['config']['restart_iterations']} iterations on K clients of one "
              "lenet_zhu round (s; ratio to one client alone)", "",
              "| attack | strategy | K | K clients in one run | K runs one by one | one by one / "
              "together | together / one client | first call together / alone (compiling) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["clients"]:
      lines.append(f"| {r['attack']} | {r['strategy']} | {r['clients']} | {r['together_s']:.2f} | "
                   f"{r['one_by_one_s']:.2f} | {r['speedup']:.2f}× | {_f(r['over_one'], '{:.1f}')}× | "
                   f"{r['together_cold_s']:.2f} / {r['one_cold_s']:.2f} |")
    lines.append("")
  if "profile" in result:
    p = result["profile"]
    lines += ["## Where a vmapped DLG iteration goes on lenet_zhu", "",
              f"Measured here: float32 matmul peak {p['peak_flops'] / 1e9:.1f} GFLOP/s (`jnp.dot` "
              f"1024²), memory read bandwidth {p['bandwidth'] / 1e9:.1f} GB/s (a sum over 256 MB); one "
              f"evaluation {p['flops_per_evaluation'] / 1e6:.2f} MFLOP (XLA's cost analysis); L-BFGS "
              f"history {p['history']}.", "",
              "| R | evaluations: ms | GFLOP/s | of peak | L-BFGS updates: ms | stored pairs MB | "
              "two passes at the bandwidth: ms |", "|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
      lines.append(f"| {r['restarts']} | {r['step_ms']:.2f} | {r['gflops']:.1f} | "
                   f"{100 * r['peak_fraction']:.0f} % | {r['lbfgs_ms']:.2f} | {r['history_mb']:.1f} | "
                   f"{r['floor_ms']:.2f} |")
    lines.append("")
  if "startup" in result:
    st = result["startup"]
    warm, warm_attack = st["process_s"][1:], st["attack_s"][1:]
    lines += ["## Start-up: the README's main job as a whole process (s)", "",
              f"`{st['command']}` on {st['cores']} core(s), timed from outside; the attack's own "
              f"`wall_time_s` beside. PSNR {st['psnr']:.2f} dB.", "",
              "| compilation cache | runs | whole process (median) | each run | attack | process / attack |",
              "|---|---|---|---|---|---|",
              f"| empty | 1 | {st['process_s'][0]:.2f} | {st['process_s'][0]:.2f} | {st['attack_s'][0]:.2f} | "
              f"{st['process_s'][0] / st['attack_s'][0]:.2f} |"]
    if warm:
      ratios = [p / a for p, a in zip(warm, warm_attack)]  # each run's own: the median of the ratios
      lines.append(f"| warm | {len(warm)} | {np.median(warm):.2f} | {', '.join(f'{v:.2f}' for v in warm)} | "
                   f"{np.median(warm_attack):.2f} | {np.median(ratios):.2f} |")
    lines.append("")
  if "anatomy" in result:
    rows = result["anatomy"]
    lines += [f"## Where a first result's compilation goes ({rows[0]['platform']}, "
              f"{rows[0]['repeats']} compilation(s) a program)", "", *bs.anatomy_markdown(rows), ""]
  if "codegen" in result:
    rows = result["codegen"]
    lines += [f"## Run-once programs: one LLVM module against XLA's parallel split ({rows[0]['cores']} "
              f"core(s), median of {rows[0]['repeats']} compilations, s)", "",
              "| model | program | one module (ONCE) | split | split / one |", "|---|---|---|---|---|"]
    for r in rows:
      lines.append(f"| {r['model']} | {r['program']} | {r['one_module_s']:.3f} | {r['split_s']:.3f} | "
                   f"{r['split_over_one']:.2f} |")
    lines.append("")
  if "linesearch" in result:
    rows = result["linesearch"]
    lines += [f"## L-BFGS line search under vmap: {rows[0]['restarts']} DLG restarts on lenet_zhu, "
              f"{rows[0]['iterations']} iterations", "",
              "| max_linesearch_steps | evaluations / restart / iteration (mean) | per-iteration max "
              "(paid by vmapped steps) | mean/max | busiest restart's (paid by one trial a trip) | "
              "mean/busiest | vmap s | sequential s | best PSNR | restarts ≥ "
              f"{result['config']['ttq_psnr']:g} dB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
      lines.append(f"| {r['cap']} | {r['mean_evaluations']:.2f} | {r['mean_max_evaluations']:.2f} | "
                   f"{r['efficiency']:.2f} | {r['busiest_evaluations']:.2f} | "
                   f"{r['efficiency_one_trial_a_trip']:.2f} | {r['vmap_s']:.2f} | {r['sequential_s']:.2f} | "
                   f"{r['best_psnr']:.2f} | {r['reached']}/{r['restarts']} |")
    lines += ["", "The same count of clients of one round (one photo each), vmapped together:", "",
              "| max_linesearch_steps | evaluations / client / iteration (mean) | per-iteration max | "
              "mean/max | busiest client's | mean/busiest |", "|---|---|---|---|---|---|"]
    for r in rows:
      lines.append(f"| {r['cap']} | {r['clients_mean_evaluations']:.2f} | "
                   f"{r['clients_mean_max_evaluations']:.2f} | {r['clients_efficiency']:.2f} | "
                   f"{r['clients_busiest_evaluations']:.2f} | {r['clients_efficiency_one_trial_a_trip']:.2f} |")
    lines.append("")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    bs.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  unknown = [s for s in _SECTIONS.value if s not in SECTIONS]
  if unknown:
    bs.fail(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
  try:
    batch_sizes = [int(b) for b in _BATCH_SIZES.value]
    counts = [int(r) for r in _RESTART_COUNTS.value]
    client_counts = [int(k) for k in _CLIENT_COUNTS.value]
    caps = [int(c) for c in _LS_CAPS.value]
  except ValueError:
    bs.fail("--batch_sizes, --restart_counts and --linesearch_caps take integers")
  if (min(batch_sizes + counts + client_counts + caps) < 1 or _TTQ_IMAGES.value < 1 or _IG_ITERATIONS.value < 1
      or _LS_ITERATIONS.value < 2 or _STARTUP_RUNS.value < 0 or _LOOP_BATCH.value < 1
      or _LOOP_STEPS.value < 1):
    bs.fail("batch sizes, restart and client counts, line-search caps, --ttq_images and --ig_iterations must be "
            "positive, --linesearch_iterations at least 2, --startup_runs not negative, --loop_batch_size and "
            "--loop_steps positive")
  if (error := bs.check_flags()) is not None:
    bs.fail(error)
  anatomy_jobs = [tuple(j.split(":")) for j in _ANATOMY_JOBS.value]
  image_model = lambda name: models.family(name) is not None and not models.family(name).text
  job_ok = lambda j: (2 <= len(j) <= 4 and j[0] in presets.PRESETS and image_model(j[1])
                      and (len(j) < 3 or (j[2].isdigit() and int(j[2]) > 0))
                      and (len(j) < 4 or j[3] in models.CONVS))
  if _ANATOMY_REPEATS.value < 1 or not all(map(job_ok, anatomy_jobs)):
    bs.fail("--anatomy_jobs takes preset:model[:restarts[:conv]] of gradjax's presets, image models, "
            f"a positive count and one of {', '.join(models.CONVS)}; --anatomy_repeats a positive count")
  if _SUITE.value != "gpu":
    given = [name for name in ("parts", "ig_init") if flags.FLAGS[name].present]
    if given:
      bs.fail(f"--{given[0]} chooses what the accelerator suite runs (--suite=gpu); the CPU suite "
              "runs all its sections (--sections chooses them)")
  if _SUITE.value == "gpu":
    unknown = [p for p in _PARTS.value if p not in accelerator.PARTS]
    if unknown or not _PARTS.value:
      bs.fail(f"unknown parts {unknown}; choose from {', '.join(accelerator.PARTS)}")
    if _IG_INIT.value is not None and _IG_INIT.value not in models.INITS:
      bs.fail(f"unknown --ig_init {_IG_INIT.value!r}; choose one of {', '.join(models.INITS)}")
    out = flags.FLAGS.output_dir or GPU_FOLDER  # its parts accumulate there, call after call
    if not flags.FLAGS.overwrite and (error := accelerator.kept_draw_conflict(_PARTS.value, out, _IG_INIT.value)):
      bs.fail(error)
    env = accelerator.leave_card(_PARTS.value, os.environ)  # before jax starts the accelerator
    torch = bs.torch_baseline()
    header = dict(command=bs.command_line(), environment=bs.environment(torch))
    print(accelerator.run(_PARTS.value, out, quick=_QUICK.value,
                          dataset=_SUITE_DATASET.value, data_dir=_DATA_DIR.value,
                          seed=bs._SEED.value, overwrite=flags.FLAGS.overwrite, header=header,
                          ig_init=_IG_INIT.value, env=env, torch=torch))
    print(f"wrote {out}: gpu.md and gpu_<part>.json/.md")
    return
  out = common.output_folder("benchmark", own=("benchmark.*",))
  torch = bs.torch_baseline()
  seed = bs._SEED.value
  timing = dict(repeats=bs._REPEATS.value, warmup=bs._WARMUP.value, max_seconds=bs._MAX_SECONDS.value)
  result = dict(command=bs.command_line(), environment=bs.environment(torch),
                config=dict(models=bs._MODELS.value, batch_sizes=batch_sizes, ttq_psnr=_TTQ_PSNR.value,
                            ttq_images=_TTQ_IMAGES.value, restart_counts=counts,
                            client_counts=client_counts,
                            restart_iterations=_RESTART_ITERATIONS.value, linesearch_caps=caps,
                            linesearch_iterations=_LS_ITERATIONS.value, loop_models=_LOOP_MODELS.value,
                            loop_batch_size=_LOOP_BATCH.value, loop_steps=_LOOP_STEPS.value, seed=seed))
  run_section = dict(
      steps=lambda: section_steps(torch, timing, seed), ops=lambda: section_ops(torch, seed),
      convs=lambda: section_convs(timing, seed), loops=lambda: section_loops(timing, seed),
      ttq=lambda: section_ttq(torch, seed), restarts=lambda: section_restarts(seed),
      clients=lambda: section_clients(seed),
      profile=lambda: section_profile(seed), linesearch=lambda: section_linesearch(seed, max(counts)),
      startup=lambda: section_startup(_STARTUP_RUNS.value),
      codegen=lambda: section_codegen(_CODEGEN_MODELS.value, _CODEGEN_REPEATS.value, seed),
      anatomy=lambda: list(bs.compile_anatomy(anatomy_jobs, _ANATOMY_REPEATS.value, seed)))
  result["section_seconds"] = {}
  for section in SECTIONS:  # in the suite's order, whatever order --sections names them
    if section in _SECTIONS.value:
      start = time.perf_counter()
      result[section] = run_section[section]()
      result["section_seconds"][section] = time.perf_counter() - start
  text = markdown(result)
  report.save_json(os.path.join(out, "benchmark.json"), result)
  with open(os.path.join(out, "benchmark.md"), "w") as fh:
    fh.write(text)
  print(text)


if __name__ == "__main__":
  app.run(main, flags_parser=common.parse_flags)
