"""Set-up and scoring on the host, the attack on the default device: two fake CPU devices stand for
the host's CPU (device 1) and an accelerator (device 0).

Runs in a subprocess because the device count is fixed when JAX starts
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from gradjax import compilation
    from gradjax.run import config, pipeline

    seen = {}
    prepare, placed = pipeline._prepare, pipeline._placed

    def devices(tree):
      return sorted({d.id for leaf in jax.tree.leaves(tree) for d in leaf.devices()})

    def spy_prepare(*a, **k):
      p = prepare(*a, **k)
      seen.setdefault("setup", []).append(devices((p.model.variables, p.observation)))
      return p

    def spy_placed(p, device):
      q = placed(p, device)
      seen.setdefault("attack", []).append(devices((q.model.variables, q.observation)))
      return q

    pipeline._prepare, pipeline._placed = spy_prepare, spy_placed

    # The attack's programs that run once: the dummy data's draw and the solver's first state.
    from gradjax import attacks, driver
    draw, compiled = attacks.prepare, driver._compiled

    def spy_draw(*a, **k):
      problem = draw(*a, **k)
      seen.setdefault("draw", []).append(devices(problem.init))
      return problem

    def spy_compiled(*a, **k):
      init, advance, finalize = compiled(*a, **k)
      def first(*b):
        state = init(*b)
        seen.setdefault("first", []).append(devices(state))
        return state
      return first, advance, finalize

    attacks.prepare, driver._compiled = spy_draw, spy_compiled
    out = {}
    runs = {"dlg": {"attack.iterations": 30},
            "inverting_gradients": {"attack.preset": "inverting_gradients", "attack.iterations": 20}}
    for host in (False, True):
      compilation.setup_device = (lambda: jax.devices()[1]) if host else (lambda: None)
      for name, options in runs.items():
        with compilation.Recorder() as made:
          results, _ = pipeline.run(config.from_options({**options, "output.lpips": "none"}))
        out[f"{name} {host}"] = [results["psnr"], results["loss"], results["verdict"]["status"]]
        out[f"{name} {host} steps"] = [p.name for p in made.programs].count("jit(solver_steps)")
      cfgs = [config.from_options({"attack.iterations": 20, "output.lpips": "none", "data.index": i,
                                   "execution.strategy": "vmap", "execution.clients_per_run": 2})
              for i in range(2)]
      out[f"clients {host}"] = [[r["psnr"], r["loss"], r["clients_together"]]
                                for r, _ in pipeline.run_clients(cfgs)]
    out["seen"] = seen
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_set_up_and_scoring_on_the_host_the_attack_on_the_default_device():
  """The model, the client's update and the scores are made on the set-up device, the attack takes
  them on the default device, and a run ends where it does with everything on one device: DLG,
  Inverting Gradients, and two clients in one solver run."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                 "--xla_force_host_platform_device_count=2"]).strip())
  proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                        cwd=ROOT, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
  for name in ("dlg", "inverting_gradients", "clients"):
    assert out[f"{name} True"] == out[f"{name} False"], name
  # The attack from the host runs the step programs of the attack made on the device (run first):
  # its data is placed as data made there (committed, it would make the first chunk and the next
  # two programs).
  for name in ("dlg", "inverting_gradients"):
    assert (out[f"{name} False steps"], out[f"{name} True steps"]) == (1, 0), out
  setup, attack = out["seen"]["setup"], out["seen"]["attack"]
  # One device throughout, then the host's (1) for the set-up and the default (0) for the attack.
  assert setup[:4] == [[0]] * 4 and setup[4:] == [[1]] * 4, setup
  assert attack == [[0]] * 4, attack
  # The dummy data drawn and the solver's first state made on the set-up device too (DLG, IG, then
  # the two clients: two draws, one first state).
  draw, first = out["seen"]["draw"], out["seen"]["first"]
  assert draw == [[0]] * 4 + [[1]] * 4 and first == [[0]] * 3 + [[1]] * 3, (draw, first)


ACCELERATOR_PATH = textwrap.dedent("""
    import json, sys
    import jax
    from gradjax import compilation
    from gradjax.run import config, pipeline

    if sys.argv[1] == "gpu":  # the driver, the convolutions and the set-up take an accelerator's path
      jax.default_backend = lambda: "gpu"
    compilation.setup_device = lambda: jax.devices()[1]
    runs = {"dlg": {"attack.iterations": 23},
            "inverting_gradients": {"attack.preset": "inverting_gradients", "attack.iterations": 23},
            "dlg 4 restarts vmapped": {"attack.iterations": 23, "attack.restarts": 4,
                                       "execution.strategy": "vmap"}}
    out = {}
    for name, options in runs.items():
      with compilation.Recorder() as made:
        results, _ = pipeline.run(config.from_options({**options, "execution.chunk": 10,
                                                       "output.lpips": "none"}))
      names = [p.name for p in made.programs]
      out[name] = dict(psnr=results["psnr"], loss=results["loss"], labels=results["label_accuracy"],
                       steps=names.count("jit(solver_steps)"),
                       finalize=names.count("jit(solver_finalize)"))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_a_whole_run_on_an_accelerators_path_gives_the_cpus_result():
  """The command line's run taken the way an accelerator takes it (``jax.default_backend`` says
  "gpu" on two CPU devices, the set-up on the second): a budget of 23 in chunks of 10 (a remainder),
  one restart and four vmapped, DLG and Inverting Gradients, gives what the CPU's path gives, with
  one step program for every chunk and the remainder and no finalize program."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                 "--xla_force_host_platform_device_count=2"]).strip())
  out = {}
  for backend in ("gpu", "cpu"):
    proc = subprocess.run([sys.executable, "-c", ACCELERATOR_PATH, backend], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out[backend] = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
  for name, gpu in out["gpu"].items():
    cpu = out["cpu"][name]
    # The two paths convolve differently (XLA's or patches times a matrix): float32 rounding.
    np.testing.assert_allclose(gpu["loss"], cpu["loss"], rtol=5e-3, err_msg=name)
    np.testing.assert_allclose(gpu["psnr"], cpu["psnr"], rtol=1e-3, err_msg=name)
    assert gpu["labels"] == cpu["labels"], name
    assert (gpu["steps"], gpu["finalize"]) == (1, 0), (name, gpu)
