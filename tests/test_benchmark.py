"""The benchmark programs (python -m benchmarks), PyTorch off: the sections behind the README's claims
and the accelerator suite's part not yet run on a device run, and record their command, device and
measurements."""

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_benchmark_harness_lists_its_programs_and_refuses_others():
  """python -m benchmarks (from the clone's root): its programs, an unknown one in one line, exit 2."""
  import benchmarks
  harness = [sys.executable, "-m", "benchmarks"]
  listed = subprocess.run([*harness, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert listed.returncode == 0 and all(name in listed.stdout for name in benchmarks.PROGRAMS)
  bad = subprocess.run([*harness, "suit"], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
      f"error: unknown command 'suit'; choose one of {', '.join(benchmarks.PROGRAMS)}"]
  # A section's job that is not a preset on an image model: one line, exit 2.
  for job in ("dlg:gpt2", "dlg:lenet_zhu:0", "dlg:lenet_zhu:4:winograd", "dlg:lenet_zhu:4:xla:1"):
    bad_job = subprocess.run([*harness, "suite", "--sections=anatomy", f"--anatomy_jobs={job}"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert bad_job.returncode == 2 and len(bad_job.stderr.strip().splitlines()) == 1, bad_job.stderr
    assert "--anatomy_jobs" in bad_job.stderr
  # The accelerator suite's --parts given to the CPU suite (which ran every section instead).
  cpu_parts = subprocess.run([*harness, "suite", "--parts=bogus"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert cpu_parts.returncode == 2 and len(cpu_parts.stderr.strip().splitlines()) == 1, cpu_parts.stderr
  assert "--parts chooses what the accelerator suite runs" in cpu_parts.stderr


@pytest.mark.slow
def test_the_memory_benchmark_reads_xla_memory_analysis(tmp_path):
  """benchmarks memory on mlp-16 at batch 3 of 8x8 inputs: each row's compiled memory holds at least
  the step's arguments that NumPy counts (the model's variables, the observed gradient of the same
  size, the dummy batch), its temporaries are part of it, and the table's ratio is the rows' own."""
  import numpy as np
  proc = subprocess.run([sys.executable, "-m", "benchmarks", "memory", "--models=mlp-16", "--batch_sizes=3",
                         "--input_size=8", f"--output_dir={tmp_path}"], capture_output=True, text=True,
                        timeout=300, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Finished: its claim of the folder went with the process (a benchmark writes no config.py).
  assert sorted(os.listdir(tmp_path)) == ["results.json", "results.md"]
  rows = json.loads((tmp_path / "results.json").read_text())["rows"]
  assert [(r["model"], r["batch"], r["remat"]) for r in rows] == [("mlp-16", 3, False), ("mlp-16", 3, True)]
  weights = 8 * 8 * 3 * 16 + 16 + 16 * 10 + 10  # Dense_0 and the head, float32
  floor = (2 * weights + 3 * 8 * 8 * 3) * np.dtype(np.float32).itemsize / 2**20
  assert all(r["compiled_mb"] >= floor and 0 <= r["temp_mb"] <= r["compiled_mb"] and not r["bn_prior"]
             for r in rows), (rows, floor)
  line = (tmp_path / "results.md").read_text().splitlines()[-1]
  assert line.endswith(f"| {rows[1]['compiled_mb'] / rows[0]['compiled_mb']:.2f} |"), line


def test_a_benchmark_programs_help_lists_every_flag_it_reads():
  """`python -m benchmarks step --help` names its options taken from the configuration's schema
  (--batch_size, --seed) beside its own flags."""
  proc = subprocess.run([sys.executable, "-m", "benchmarks", "step", "--help"], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", proc.stdout, re.M))
  assert listed == {"batch_size", "seed", "max_seconds", "repeats", "warmup", "torch", "models",
                    "output", "overwrite"}


def test_hlo_counts_agree_with_the_modules_xla_holds():
  """The anatomy's instruction and fusion counts, read from a program's text, equal those of the
  HLO modules XLA hands back (its Python API), before and after its passes, for a loop with
  fusions and a convolution's gradient."""
  code = (
      "import json, jax, jax.numpy as jnp\n"
      "from benchmarks import step\n"
      "def counted(module):\n"
      "  ops = [str(i.opcode) for c in module.computations() for i in c.instructions()]\n"
      "  return [len(ops), sum(o.endswith('kFusion') for o in ops)]\n"
      "loop = lambda x: jax.lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) * 2.0 + y.sum(), x)\n"
      "conv = jax.grad(lambda w, x: jnp.sum(jax.lax.conv(x, w, (1, 1), 'SAME') ** 2))\n"
      "out = []\n"
      "for fn, args in ((loop, (jnp.ones(3),)), (conv, (jnp.ones((4, 3, 3, 3)), jnp.ones((2, 3, 8, 8))))):\n"
      "  lowered = jax.jit(fn).lower(*args)\n"
      "  compiled = lowered.compile()\n"
      "  out.append([list(step.hlo_counts(lowered.as_text(dialect='hlo'))),\n"
      "              counted(lowered.compiler_ir('hlo').as_hlo_module()),\n"
      "              list(step.hlo_counts(compiled.as_text())),\n"
      "              counted(compiled.runtime_executable().hlo_modules()[0])])\n"
      "print(json.dumps(out))\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr[-2000:]
  for text_before, xla_before, text_after, xla_after in json.loads(proc.stdout):
    assert text_before[0] == xla_before[0] > 0 and text_after == xla_after and text_after[1] > 0


@pytest.mark.slow
def test_the_cpu_suite_records_its_command_device_and_measurements(tmp_path):
  """The CPU suite's sections behind the README's claims (one step against its plain
  forward-backward, the op profile) and the run-once programs' code generation, at tiny sizes, PyTorch off: the command, the device and the
  versions are recorded, and every section wrote rows measured by the program, its baseline
  included (the other sections, convolutions, time to quality, loops, restarts, profile, linesearch
  and the main job's whole process, share their machinery or run the README's command as it is,
  and are run by hand before a study quotes them)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks", "suite", "--torch=off", "--sections=steps,ops,codegen",
       "--models=lenet_zhu", "--batch_sizes=1", "--repeats=2", "--warmup=0",
       "--codegen_models=lenet_zhu", "--codegen_repeats=1", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "benchmark.json").read_text())
  sections = ("steps", "ops", "codegen")
  assert set(result["section_seconds"]) == set(sections) and all(result[s] for s in sections)
  env_record = result["environment"]
  assert "benchmarks suite" in result["command"] and env_record["platform"] == "cpu"
  # The command as one would type it again (not the harness's quoted program name).
  assert shlex.split(result["command"])[1:5] == ["-m", "benchmarks", "suite", "--torch=off"]
  assert env_record["jax"] and env_record["cpu_model"] and env_record.get("torch") is None
  assert env_record["ml_dtypes"] and env_record["numpy"]
  if os.path.isdir(os.path.join(ROOT, ".git")):  # the code measured: git's HEAD, + where it differs
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert env_record["commit"].rstrip("+") == head.stdout.strip()
  assert all(r["jax_match_ms"] > 0 and r["jax_plain_ms"] > 0 for r in result["steps"])
  # The printed ratios are the rows' own times' (the tables print them).
  assert all(r["match_over_plain"] == pytest.approx(r["jax_match_ms"] / r["jax_plain_ms"])
             for r in result["steps"])
  # Compiled, not loaded from a cache: a program of LeNet takes more than a millisecond.
  assert [r["program"] for r in result["codegen"]] == ["draw", "client gradient"]
  assert all(r["one_module_s"] > 1e-3 and r["split_s"] > 1e-3 for r in result["codegen"])
  assert all(r["split_over_one"] == pytest.approx(r["split_s"] / r["one_module_s"]) for r in result["codegen"])


@pytest.mark.slow
def test_accelerator_suite_quick(tmp_path):
  """``--suite=gpu --quick`` runs on CPU the parts that have not yet run on an accelerator in full
  (``fedavg``, ``flags``, ``loops``, ``clients64``, ``anatomy``; the others ran on an H100 and an H200, and are all rerun ``--quick`` before
  a device is used) and ``ig`` with torchvision's draw (the paper's, on the quick sizes' ConvNet), and records
  its command, device and rows (an unknown draw: one line, exit 2, nothing written); a second call
  keeps the parts already written, and one asking for another draw of the kept ``ig`` rows is
  refused in one line, exit 2, the rows untouched (an unreadable kept part too)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "benchmarks", "suite", "--suite=gpu", "--quick", "--parts=fedavg,flags,ig,loops,clients64,anatomy",
         "--ig_init=torchvision", "--torch=off", f"--output_dir={tmp_path}"]
  bad = subprocess.run([*cmd, "--ig_init=kaiming"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=ROOT)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr[-2000:]
  assert "unknown --ig_init 'kaiming'" in bad.stderr and not list(tmp_path.iterdir())
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  part = json.loads((tmp_path / "gpu_fedavg.json").read_text())
  assert part["quick"] and part["rows"] and part["rows"][0]["psnr"] is not None
  assert part["rows"][0]["init"] == "torch"  # the paper's ConvNet draw
  flags = json.loads((tmp_path / "gpu_flags.json").read_text())
  assert flags["complete"] and [r["variant"] for r in flags["rows"]] == [
      "--config.model.conv=im2col", "--config.model.conv=im2col",
      "GRADJAX_FAST_COMPILE=1", "GRADJAX_FAST_COMPILE=1"]
  assert all(r["process_s"] > r["attack_s"] > 0 and "error" not in r for r in flags["rows"])
  # A flags part cut short goes on from its rows (each row a process of its own); so does one
  # written whole that lacks a row (a variant added since it ran).
  for complete in (False, True):
    (tmp_path / "gpu_flags.json").write_text(json.dumps(dict(flags, complete=complete, rows=flags["rows"][:3])))
    cut = subprocess.run([c.replace("--parts=fedavg,flags,ig,loops,clients64,anatomy", "--parts=flags")
                          for c in cmd], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert cut.returncode == 0 and "flags: going on from the 3 rows" in cut.stdout, cut.stderr[-2000:]
    resumed = json.loads((tmp_path / "gpu_flags.json").read_text())
    assert resumed["complete"] and resumed["rows"][:3] == flags["rows"][:3]
    assert [r["variant"] for r in resumed["rows"]] == [r["variant"] for r in flags["rows"]]
  loops = json.loads((tmp_path / "gpu_loops.json").read_text())["rows"]
  # Inverting Gradients' job reads the label the observation shares (the H100 run stopped there).
  # DLG's L-BFGS also in the loop the driver runs for it (one line-search trial a trip).
  lbfgs, adam = ("count compiled in", "count as data", "one trial a trip"), ("count compiled in", "count as data")
  assert [(r["attack"], r["restarts"], r["loop"]) for r in loops] == [
      (a, r, loop) for a, r, kinds in (("dlg", 1, lbfgs), ("dlg", 2, lbfgs), ("inverting_gradients", 1, adam))
      for loop in kinds]
  assert all(r["compile_s"] > 0 and r["ms_per_iteration"] > 0 for r in loops)
  assert [r["over_constant"] is None for r in loops] == [True, False, False] * 2 + [True, False]
  clients = json.loads((tmp_path / "gpu_clients64.json").read_text())["rows"]
  assert [(r["conv"], r["clients"], r["iterations"]) for r in clients] == [
      ("mixed", 1, 20), ("mixed", 2, 20), ("gather", 1, 20), ("gather", 2, 20)]  # auto is mixed on CPU
  assert [r["one_by_one_s"] is None for r in clients] == [False, True] * 2
  assert all(r["together_cold_s"] > r["together_s"] > 0 and r["over_one_cold"] > 0 for r in clients)
  assert clients[3]["one_cold_s"] != clients[1]["one_cold_s"]  # each kind's one client compiles its own
  for one, two in (clients[:2], clients[2:]):  # the printed ratios, from the rows' own times
    for r in (one, two):
      assert r["over_one"] == pytest.approx(r["together_s"] / one["one_by_one_s"])
      assert r["over_one_cold"] == pytest.approx(r["together_cold_s"] / r["one_cold_s"])
    assert one["speedup"] == pytest.approx(one["one_by_one_s"] / one["together_s"]) and two["speedup"] is None
  # Where the first result's compilation goes: the step holds the first state's evaluation and the
  # solver's own (L-BFGS); Adam's first state evaluates nothing.
  anatomy = json.loads((tmp_path / "gpu_anatomy.json").read_text())["rows"]
  programs = ["first state", "step", "chunk", "step, quadratic objective"]
  assert [(r["attack"], r["program"]) for r in anatomy] == (
      [("dlg", p) for p in programs + ["step, quadratic objective, no line search"]]
      + [("inverting_gradients", p) for p in programs])
  assert all(r["compile_s"] > 0 and r["lower_s"] > 0 and 0 < r["fusions"] <= r["compiled_ops"] for r in anatomy)
  ops = {(r["attack"], r["program"]): r["hlo_ops"] for r in anatomy}
  assert ops["dlg", "step"] > max(ops["dlg", "first state"], ops["dlg", "step, quadratic objective"])
  assert ops["inverting_gradients", "first state"] < ops["inverting_gradients", "step, quadratic objective"]
  assert ops["dlg", "chunk"] > ops["dlg", "step"]
  assert ops["dlg", "step, quadratic objective, no line search"] < ops["dlg", "step, quadratic objective"]
  ig = json.loads((tmp_path / "gpu_ig.json").read_text())["rows"]
  assert ig and ig[0]["init"] == "torchvision" and ig[0]["psnr"] is not None
  assert "--suite=gpu" in part["command"] and part["environment"]["device_kind"]
  assert "## fedavg" in (tmp_path / "gpu.md").read_text()
  # (In a process of its own: the benchmark programs define absl flags that the test process's
  # in-process command tests define too.)
  again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
  assert again.returncode == 0 and "fedavg: kept" in again.stdout and "ig: kept" in again.stdout, \
      again.stderr[-2000:]
  kept = (tmp_path / "gpu_ig.json").read_bytes()
  other = subprocess.run([c.replace("--ig_init=torchvision", "--ig_init=torch") for c in cmd],
                         capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
  assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr[-2000:]
  assert "gpu_ig.json" in other.stderr and "torchvision" in other.stderr
  assert (tmp_path / "gpu_ig.json").read_bytes() == kept
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "gpu_ig.json").write_text("{not json")
  unread = subprocess.run([*cmd[:-1], f"--output_dir={broken}"], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
  assert unread.returncode == 2 and len(unread.stderr.strip().splitlines()) == 1, unread.stderr[-2000:]
  assert [p.name for p in broken.iterdir()] == ["gpu_ig.json"]


def test_accelerator_suite_leaves_the_card_to_the_processes_it_starts():
  """Where a part starts processes of its own, the suite's process stops JAX preallocating its card;
  the processes get the environment as it was, and a value the user set is kept for both."""
  code = (
      "import json\n"
      "from benchmarks import accelerator\n"
      "out = []\n"
      "for parts, environ in [(['ttfr'], {'A': '1'}), (['steps', 'convnet'], {}), (['steps', 'restarts'], {}),\n"
      "                       (['batch'], {'XLA_PYTHON_CLIENT_PREALLOCATE': 'true'})]:\n"
      "  child = accelerator.leave_card(parts, environ)\n"
      "  out.append([environ, child])\n"
      "print(json.dumps(out))\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
  (ttfr, ttfr_child), (convnet, convnet_child), (steps, steps_child), (user, user_child) = json.loads(
      proc.stdout.strip().splitlines()[-1])
  assert ttfr == {"A": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"} and ttfr_child == {"A": "1"}
  assert convnet == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} and convnet_child == {}
  assert steps == {} and steps_child == {}
  assert user == user_child == {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}


def _suite_script(code: str, out) -> object:
  """What ``code`` (run in a process of its own with ``out`` as its argument) prints last, as JSON."""
  proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                        cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_resumable_part_goes_on_from_the_rows_it_has(tmp_path):
  """``ig`` (one row an image) stopped after two of five images goes on at the third in a later
  call at the same sizes, the rows of both calls kept in order; a call at other sizes (``--quick``
  against not) or with ``overwrite`` starts over."""
  code = (
      "import json, sys\n"
      "from benchmarks import accelerator\n"
      "out = sys.argv[1]\n"
      "header = dict(command='test', environment=dict(device_kind='cpu'))\n"
      "asked = []\n"
      "def stopping(stop_after):\n"
      "  def part(s, seed, data_dir, done=frozenset()):\n"
      "    asked.append(sorted(done))\n"
      "    for n, index in enumerate(i for i in range(5) if i not in done):\n"
      "      if n == stop_after:\n"
      "        raise KeyboardInterrupt\n"
      "      yield dict(index=index, psnr=float(index))\n"
      "  return part\n"
      "seen = []\n"
      "for stop_after, quick, overwrite in [(2, True, False), (1, False, False), (9, True, False),\n"
      "                                     (1, True, True)]:\n"
      "  accelerator.part_ig = stopping(stop_after)\n"
      "  try:\n"
      "    accelerator.run(['ig'], out, quick=quick, dataset='skimage', data_dir=None, seed=0,\n"
      "                    overwrite=overwrite, header=header)\n"
      "  except KeyboardInterrupt:\n"
      "    pass\n"
      "  with open(out + '/gpu_ig.json') as fh:\n"
      "    part = json.load(fh)\n"
      "  seen.append([[r['index'] for r in part['rows']], part['complete'], part['quick']])\n"
      "print(json.dumps([seen, asked]))\n")
  seen, asked = _suite_script(code, tmp_path)
  # Two rows; full sizes start over and, stopped with fewer rows, keep those two; the quick sizes go
  # on from them to the fifth; overwrite starts over and, stopped, keeps the whole part.
  assert seen == [[[0, 1], False, True], [[0, 1], False, True],
                  [[0, 1, 2, 3, 4], True, True], [[0, 1, 2, 3, 4], True, True]], seen
  assert asked == [[], [], [0, 1], []], asked


def test_accelerator_suite_keeps_the_rows_of_a_part_stopped_midway(tmp_path):
  """A part stopped by an interrupt writes the rows it measured, marked incomplete, and the interrupt
  goes on; a later call runs the part again, keeps the earlier rows if it is stopped with fewer, and
  replaces them once it finishes."""
  code = (
      "import json, sys\n"
      "from benchmarks import accelerator\n"
      "out = sys.argv[1]\n"
      "header = dict(command='test', environment=dict(device_kind='cpu'))\n"
      "def stopping(n, stop):\n"
      "  def part(s, seed):\n"
      "    for i in range(n):\n"
      "      yield dict(restarts=i)\n"
      "    if stop:\n"
      "      raise KeyboardInterrupt\n"
      "  return part\n"
      "seen = []\n"
      "for n, stop in [(2, True), (1, True), (3, False), (5, True)]:\n"
      "  accelerator.part_restarts = stopping(n, stop)\n"
      "  try:\n"
      "    accelerator.run(['restarts'], out, quick=True, dataset='skimage', data_dir=None, seed=0,\n"
      "                    overwrite=False, header=header)\n"
      "    went_on = False\n"
      "  except KeyboardInterrupt:\n"
      "    went_on = True\n"
      "  with open(out + '/gpu_restarts.json') as fh:\n"
      "    part = json.load(fh)\n"
      "  seen.append([went_on, len(part['rows']), part['complete']])\n"
      "print(json.dumps(seen))\n")
  # The fourth call finds the part complete and keeps it without running it.
  assert _suite_script(code, tmp_path) == [
      [True, 2, False], [True, 2, False], [False, 3, True], [False, 3, True]]
  assert "stopped after 2 rows" not in (tmp_path / "gpu_restarts.md").read_text()
  assert "## restarts" in (tmp_path / "gpu.md").read_text()


@pytest.mark.slow
def test_a_device_call_packs_each_part_under_its_environment_and_resumes_from_the_pack(tmp_path):
  """``benchmarks/device_call.sh`` (one lent machine's call): a part under an added ``XLA_FLAGS``
  runs into a folder named by the value, records the variable in its JSON and its table's command,
  and comes back in one archive; a call given that archive back keeps the part written."""
  flag = "--xla_cpu_enable_fast_math=false"
  env = dict(os.environ, JAX_PLATFORMS="cpu", SUITE_ARGS="--quick",
             PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
  env.pop("XLA_FLAGS", None)
  script = os.path.join(ROOT, "benchmarks", "device_call.sh")
  first, second = tmp_path / "first", tmp_path / "second"
  for out, results, extra in ((first, tmp_path / "r1", {}),
                              (second, tmp_path / "r2", {"RESUME": str(first / "results.tar.gz")})):
    out.mkdir()
    proc = subprocess.run(["bash", script, f"clients64:300:XLA_FLAGS={flag}"], capture_output=True,
                          text=True, env=dict(env, OUT=str(out), RESULTS=str(results), **extra),
                          timeout=400, cwd=ROOT)
    log = (out / "log.txt").read_text()
    assert proc.returncode == 0 and f"PART clients64:300:XLA_FLAGS={flag} exit 0" in log, log[-3000:]
    with tarfile.open(out / "results.tar.gz") as tar:
      names = set(tar.getnames())
      part = json.load(tar.extractfile("./clients64-__xla_cpu_enable_fast_math_false/gpu_clients64.json"))
      table = tar.extractfile("./clients64-__xla_cpu_enable_fast_math_false/gpu_clients64.md").read().decode()
    assert part["environment"]["variables"]["XLA_FLAGS"] == flag and part["rows"]
    assert f"XLA_FLAGS={flag} " in table.splitlines()[2]  # the command line
  assert "clients64: kept" in log and names == {
      ".", "./clients64-__xla_cpu_enable_fast_math_false",
      *(f"./clients64-__xla_cpu_enable_fast_math_false/{f}" for f in ("gpu.md", "gpu_clients64.json",
                                                                      "gpu_clients64.md"))}


@pytest.mark.isolated  # benchmarks.suite defines absl flags other modules' share names
def test_the_startup_table_prints_each_runs_process_over_attack():
  """The start-up section's table: the cold run's whole process over its attack, and the median of
  the warm runs' own ratios (worked out here from the recorded seconds)."""
  from benchmarks import suite
  env = dict(platform="cpu", device_kind="cpu", cpu_model="x", jax="0", numpy="0", ml_dtypes="0",
             torch="off", torch_threads=0)
  startup = dict(command="gradjax reconstruct --lpips=none", process_s=[12.0, 6.0, 5.0, 9.0],
                 attack_s=[8.0, 4.0, 4.0, 4.5], psnr=43.8, cores=1)
  table = suite.markdown({"environment": env, "command": "c", "startup": startup})
  cold = next(line for line in table.splitlines() if line.startswith("| empty |"))
  warm = next(line for line in table.splitlines() if line.startswith("| warm |"))
  assert cold.endswith(f"| {12.0 / 8.0:.2f} |")
  assert warm.endswith(f"| {sorted([6.0 / 4.0, 5.0 / 4.0, 9.0 / 4.5])[1]:.2f} |")


@pytest.mark.isolated  # benchmarks.step defines absl flags other modules' share names
def test_the_flop_count_behind_the_gflops_is_twice_the_multiply_adds():
  """The steps' GFLOP/s divide XLA's cost analysis (``benchmarks.step._flops``) by the time: for a
  matmul and a padded convolution it is 2 × their multiply-adds, counted here in closed form (the
  convolution's taps that fall inside the image only, as SAME padding adds zeros)."""
  import jax
  import jax.numpy as jnp
  from benchmarks import step
  matmul = jax.jit(lambda x, w: x @ w).lower(jnp.ones((8, 16)), jnp.ones((16, 32))).compile()
  assert step._flops(matmul) == 2 * 8 * 16 * 32
  conv = jax.jit(lambda x, k: jax.lax.conv_general_dilated(
      x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))).lower(
          jnp.ones((2, 8, 8, 3)), jnp.ones((5, 5, 3, 12))).compile()
  taps = sum(1 for i in range(8) for di in range(-2, 3) if 0 <= i + di < 8)  # per axis
  assert step._flops(conv) == 2 * 2 * taps * taps * 3 * 12


@pytest.mark.isolated  # benchmarks.suite defines absl flags other modules' share names
def test_the_line_search_trials_are_counted_from_the_runs_counters():
  """The linesearch section's trials per iteration from each run's evaluation counter after each
  iteration, counted here in plain Python: the mean over runs and iterations, the mean of each
  iteration's most (what vmapped steps pay) and the busiest run's mean (one trial a trip)."""
  import numpy as np
  from benchmarks import suite
  counts = [[0, 0, 0], [1, 3, 2], [2, 4, 6], [5, 5, 7]]  # after iterations 0..3, three runs
  steps = [[after - before for before, after in zip(counts[i], counts[i + 1])] for i in range(3)]
  mean = sum(map(sum, steps)) / 9
  most = sum(map(max, steps)) / 3
  busiest = max(sum(step[r] for step in steps) for r in range(3)) / 3
  row = suite._trials([np.asarray(c) for c in counts])
  assert row == pytest.approx(dict(mean_evaluations=mean, mean_max_evaluations=most,
                                   busiest_evaluations=busiest, efficiency=mean / most,
                                   efficiency_one_trial_a_trip=mean / busiest))
  assert (mean, most, busiest) == (17 / 9, 10 / 3, 7 / 3)


@pytest.mark.isolated  # benchmarks.suite defines absl flags other modules' share names
def test_the_time_to_quality_table_prints_pytorch_over_jax_where_both_reached_it():
  from benchmarks import suite
  env = dict(platform="cpu", device_kind="cpu", cpu_model="x", jax="0", numpy="0", ml_dtypes="0",
             torch="2", torch_threads=1)
  run = lambda seconds, reached, **count: dict(seconds=seconds, reached=reached, psnr=31.0, **count)
  ttq = {"dlg": [dict(image=0, jax=run(2.0, True, iterations=90),
                      torch_reference=run(13.0, True, steps=40), torch_strong_wolfe=run(9.0, False, steps=5)),
                 dict(image=1, jax=run(120.0, False, iterations=9000), torch_reference=run(7.0, True, steps=9))],
         "ig": dict(iterations=10, model="convnet", jax_s=1.0, torch_s=None, torch_over_jax=None)}
  table = suite.markdown({"environment": env, "command": "c", "config": {"ttq_psnr": 30.0}, "ttq": ttq})
  first, second = [line for line in table.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
  assert first.endswith(f"| {13.0 / 2.0:.1f}× | - |") and second.endswith("| - | - |")


@pytest.mark.isolated  # imports torch (see tests/conftest.py)
def test_the_accelerator_steps_part_times_pytorch_eager_beside_gradjax():
  """With torch, the steps part times PyTorch eager's matching step of the same model on the same
  device (here the CPU) and gives its time over gradjax's."""
  torch = pytest.importorskip("torch")
  from benchmarks import accelerator
  s = dict(accelerator.sizes(True, "skimage"), torch=torch, models=["lenet_zhu"], batch_sizes=[1])
  row, = accelerator._steps(s, 0)
  assert row["torch_device"] == "cpu" and row["torch_match_ms"] > 0
  assert row["torch_over_jax"] == pytest.approx(row["torch_match_ms"] / row["match_ms"])
