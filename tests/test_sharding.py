"""Restarts sharded over 8 fake CPU devices: each device gets its share, results equal one device.

Runs in a subprocess because the device count is fixed when JAX starts
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # one subprocess with 8 CPU devices compiles every case (~20 s)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import dataclasses, json
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from gradjax import attacks, clients, driver, models, optimizers, presets, sharding, solvers
    out = {"devices": jax.device_count()}

    # The solver on a quadratic with per-restart targets: placement and equality.
    targets = jnp.asarray(np.random.default_rng(0).normal(size=(8, 5)))
    value = lambda p, data, step: jnp.sum((p["p"] - data[1]) ** 2)
    solver = solvers.make_solver(value, optimizers.make_optimizer("adam", 0.1))
    init = {"p": jnp.zeros((8, 5))}
    kw = dict(iterations=50, restart_data=targets)
    execution = driver.Execution("vmap", chunk=25)
    sharded = driver.run(solver, init, None, execution=dataclasses.replace(execution, shard=True), **kw)
    plain = driver.run(solver, init, None, execution=execution, **kw)
    leaf = sharded.best_params["p"]
    out["shards"] = sorted((s.device.id, s.data.shape[0]) for s in leaf.addressable_shards)
    out["solver_max_diff"] = float(np.abs(np.asarray(leaf) - np.asarray(plain.best_params["p"])).max())

    # Successive halving over 6 restarts (padded to 8): 6 -> 3 -> 1 survivors, re-sharded per round.
    kw = dict(iterations=40, restart_data=targets[:6] * jnp.arange(1, 7)[:, None])
    execution = driver.Execution("vmap", chunk=10, halving_rounds=3, halving_keep=0.5)
    init6 = {"p": jnp.zeros((6, 5))}
    sharded = sharding.fetch(driver.run(solver, init6, None,
                                        execution=dataclasses.replace(execution, shard=True), **kw))
    plain = driver.run(solver, init6, None, execution=execution, **kw)
    out["halving_iterations"] = [np.asarray(sharded.iterations).tolist(), np.asarray(plain.iterations).tolist()]
    out["halving_max_diff"] = float(np.abs(np.asarray(sharded.best_params["p"])
                                           - np.asarray(plain.best_params["p"])).max())

    # A DLG attack with 6 restarts (padded to 8) sharded vs on one device.
    model = models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3), num_classes=4,
                          param_dtype=jnp.float64)
    x = np.random.default_rng(1).uniform(size=(1, 8, 8, 3))
    obs = clients.fedsgd(model.apply_fn, model.variables, x, np.array([2]))
    attack = presets.dlg(iterations=30)
    a = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(3), input_shape=(8, 8, 3),
                            restarts=6, execution=driver.Execution("vmap", shard=True))
    b = attacks.reconstruct(attack, model.apply_fn, obs, jax.random.key(3), input_shape=(8, 8, 3),
                            restarts=6, execution=driver.Execution("vmap"))
    out["restarts"] = len(a.restart_losses)
    out["attack_loss_rel_diff"] = float(np.max(np.abs(a.restart_losses - b.restart_losses)
                                               / np.abs(b.restart_losses)))
    out["attack_x_max_diff"] = float(np.abs(a.x_restarts - b.x_restarts).max())
    out["best"] = [a.best_restart, b.best_restart]
    print("RESULT " + json.dumps(out))
""")


# One test, not three sharing a module fixture: pytest-xdist gave the three to both workers, and
# each ran the 8-device process (CI: 42.8 and 31.6 s of set-up).
def test_restarts_sharded_over_eight_devices_equal_one_device():
  """Each of eight devices holds one restart; the solver, successive halving (dropped restarts ran
  fewer iterations) and a DLG attack give what one device gives."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                 "--xla_force_host_platform_device_count=8"]).strip())
  proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                        cwd=ROOT, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  result = json.loads(line[len("RESULT "):])
  assert result["devices"] == 8
  assert result["shards"] == [[d, 1] for d in range(8)]
  assert result["solver_max_diff"] < 1e-12
  assert result["restarts"] == 6 and result["best"][0] == result["best"][1]
  assert result["attack_loss_rel_diff"] < 1e-9
  assert result["attack_x_max_diff"] < 1e-9
  sharded, plain = result["halving_iterations"]
  assert sharded == plain and len(sharded) == 6
  assert sorted(set(sharded)) != [sharded[0]]
  assert result["halving_max_diff"] < 1e-12
