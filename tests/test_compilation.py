"""Programs compiled with gradjax.compilation's options compute what plain jax.jit computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradjax import clients, compilation, models


@pytest.mark.slow
def test_model_init_as_one_program_equals_flax_init():
  model = models.create("lenet_zhu", jax.random.key(3), input_shape=(16, 16, 3), num_classes=5)
  module = models.get_module("lenet_zhu", num_classes=5)
  eager = module.init(jax.random.key(3), jnp.zeros((1, 16, 16, 3)), train=False)
  jax.tree.map(np.testing.assert_array_equal, model.variables, eager)  # threefry draws: exact


@pytest.mark.slow
def test_once_and_step_options_agree_with_default_jit(photos):
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3))
  obs = clients.fedsgd(model.apply_fn, model.variables, photos[:2], np.array([1, 2]))

  def matching(x):
    g = jax.grad(lambda p: jnp.sum(model.apply_fn({"params": p}, x) ** 2))(model.variables["params"])
    return sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(obs.gradient)))

  fn = jax.value_and_grad(matching)
  # XLA's defaults, fusion emitters included (the suite's XLA_FLAGS turn them off: tests/conftest.py)
  default = compilation.options({"xla_cpu_use_fusion_emitters": True})
  want = jax.jit(fn, compiler_options=default)(photos[2:4])
  # float32 with cancellation: the levels differ in fused multiply-adds, so compare on the scale
  # of each result.
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=3e-4 * np.abs(b).max())
  for options in (compilation.ONCE, compilation.STEP):
    got = jax.jit(fn, compiler_options=compilation.options(options))(photos[2:4])
    jax.tree.map(close, got, want)
  got = compilation.once(fn)(photos[2:4])
  jax.tree.map(close, got, want)


def test_once_inside_other_transformations():
  double = compilation.once(lambda x: 2.0 * x)
  x = jnp.arange(3.0)
  np.testing.assert_array_equal(double(x), 2.0 * np.arange(3.0))
  np.testing.assert_array_equal(jax.jit(double)(x), 2.0 * np.arange(3.0))
  np.testing.assert_array_equal(jax.vmap(double)(x), 2.0 * np.arange(3.0))
  assert jax.grad(lambda v: double(v).sum())(x).tolist() == [2.0, 2.0, 2.0]
  shapes = jax.eval_shape(
      lambda: models.create("lenet_zhu", jax.random.key(0), input_shape=(8, 8, 3)).variables)
  assert shapes["params"]["head"]["kernel"].shape == (12 * 2 * 2, 10)


def test_options_drops_what_the_compiler_does_not_know():
  wanted = {"xla_backend_optimization_level": 0, "xla_no_such_option_anywhere": True}
  assert compilation.options(wanted) == {"xla_backend_optimization_level": 0}


def test_covered_counts_nested_and_overlapping_spans_once():
  spans = [(0.0, 2.0), (1.0, 3.0), (0.5, 0.7), (5.0, 6.0), (7.0, 7.0)]  # union: [0, 3] and [5, 6]
  assert compilation.covered(spans) == pytest.approx(4.0)
  assert compilation.covered(spans, 2.5, 5.5) == pytest.approx(1.0)  # [2.5, 3] and [5, 5.5]
  assert compilation.covered([], 0.0, 1.0) == 0.0
  # Against a fine grid of the window: the share of points inside some span.
  grid = np.linspace(-1, 8, 900_001)
  inside = np.zeros_like(grid, bool)
  for a, b in spans:
    inside |= (grid >= a) & (grid < b)
  assert compilation.covered(spans) == pytest.approx(inside.mean() * 9.0, abs=1e-4)


def test_recorder_times_each_program_made_and_sees_the_persistent_cache():
  """A function never compiled before (its constant is new): made once per input shape, not again
  from JAX's in-memory cache; after jax.clear_caches() it is loaded from the persistent cache (the
  suite's, tests/conftest.py). Each stage's spans lie inside the wall-clock time around the calls."""
  import time
  assert jax.config.jax_compilation_cache_dir and jax.config.jax_persistent_cache_min_compile_time_secs == 0
  constant = float(np.random.default_rng().uniform(1, 2))
  fn = jax.jit(lambda x: jnp.sin(x) * constant)
  start = time.time()
  with compilation.Recorder() as made:
    fn(jnp.ones(3)), fn(jnp.ones(4)), fn(jnp.ones(3))
    jax.clear_caches()
    fn(jnp.ones(3))
  end = time.time()
  ours = [p for p in made.programs if p.name == "jit(<lambda>)"]
  assert [p.cached for p in ours] == [False, False, True]
  assert all(p.tracing > 0 and p.lowering > 0 and p.compiling > 0 for p in ours)
  seconds = made.seconds()
  assert 0 < seconds["programs"] <= end - start
  assert max(seconds[s] for s in compilation.STAGES) <= seconds["programs"]
  assert sum(p.compiling for p in made.programs) == pytest.approx(seconds["compiling"], rel=1e-6)
  assert all(start <= a <= b <= end for spans in made.spans.values() for a, b in spans)


def test_a_programs_tracing_time_is_credited_to_it():
  """A function whose Python body sleeps 0.3 s while JAX traces it: its program's tracing time and
  the tracing stage's total are at least that, and the other programs made beside it are not
  credited with it."""
  import time
  constant = float(np.random.default_rng().uniform(1, 2))

  def slow_to_trace(x):
    time.sleep(0.3)
    return jnp.cos(x) * constant

  with compilation.Recorder() as made:
    jax.jit(slow_to_trace)(jnp.ones(5))
    jax.jit(lambda x: jnp.tan(x) * constant)(jnp.ones(5))
  (slow,) = [p for p in made.programs if p.name == "jit(slow_to_trace)"]
  (quick,) = [p for p in made.programs if p.name == "jit(<lambda>)"]
  assert 0.29 <= slow.tracing < 0.3 + 5.0 and quick.tracing < 0.29  # (clock rounding)
  assert made.seconds()["tracing"] >= 0.29


@pytest.mark.slow
def test_a_run_reports_where_its_time_went():
  """pipeline.run's ``time``: its phases add up to the wall-clock time around the call, the attack's
  is the run's wall_time_s, each phase's time making programs lies within it, and the solver's step
  program (the in-memory cache emptied first) is among those listed."""
  import time

  from gradjax.run import config, pipeline
  jax.clear_caches()
  start = time.perf_counter()
  results, _ = pipeline.run(config.from_options(
      {"attack.preset": "dlg", "attack.iterations": 5, "output.lpips": "none"}))
  wall = time.perf_counter() - start
  spent = results["time"]
  phases = spent["phases"]
  assert list(phases) == ["setup", "attack", "scoring"]
  assert wall - 0.2 <= sum(p["seconds"] for p in phases.values()) <= wall
  assert phases["attack"]["seconds"] == pytest.approx(results["wall_time_s"], abs=0.05)
  for p in phases.values():
    assert max(p[stage] for stage in compilation.STAGES) <= p["making_programs"] <= p["seconds"]
  assert phases["attack"]["making_programs"] > 0
  names = [p["name"] for p in spent["largest_programs"]]
  assert "jit(solver_steps)" in names and len(names) <= pipeline.LARGEST_PROGRAMS
  assert 0 <= spent["programs_loaded"] <= spent["programs"]


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"attack.preset": "dlg"},
    {"attack.preset": "dlm", "client.name": "fedavg", "model.name": "mlp", "data.image_size": 8},
    {"attack.preset": "sapag", "model.name": "lenet5", "data.image_size": 16}])
def test_a_run_makes_no_program_of_a_single_operation(options):
  """Every program of an image run (set-up, attack, scores) is one of gradjax's functions: none
  comes from an operation run eagerly (``jnp.asarray`` of host data, a label rule's ``argmin``, a
  FedAvg update's per-leaf difference, SAPAG's depth weights), each of which XLA compiled (or
  loaded) as a program of its own, one per shape (the in-memory cache emptied first)."""
  from gradjax.run import config, pipeline
  jax.clear_caches()
  with compilation.Recorder() as made:
    pipeline.run(config.from_options({**options, "attack.iterations": 2, "output.lpips": "none"}))
  names = [p.name for p in made.programs]
  assert "jit(solver_steps)" in names
  assert all(n.startswith(("jit(_", "jit(solver_")) or n == "jit(<lambda>)" for n in names), names


@pytest.mark.slow
def test_attacking_a_capture_makes_no_program_of_a_single_operation(tmp_path):
  """The same for a captured update read from PyTorch-layout files (an audit's attack, its fidelity
  check against the ground truth included): the file's tensors reach the device without a copy
  program each, the throw-away model without its key's."""
  from gradjax import data, interop
  from gradjax.run import config, pipeline
  truth = data.load("skimage", indices=[0], image_size=(32, 32))  # the run's default ground truth
  model = models.create("lenet_zhu", jax.random.key(0), input_shape=(32, 32, 3), num_classes=10)
  observation = clients.fedsgd(model.apply_fn, model.variables, truth.x, truth.y, share_labels=True)
  interop.save_weights(tmp_path / "w.safetensors", model)
  interop.save_observation(tmp_path / "g.safetensors", observation, interop.zoo_mapping(model), model)
  jax.clear_caches()
  with compilation.Recorder() as made:
    pipeline.run(config.from_options({
        "model.weights": str(tmp_path / "w.safetensors"),
        "client.observation": str(tmp_path / "g.safetensors"), "attack.preset": "dlg",
        "attack.iterations": 2, "output.lpips": "none"}))
  names = [p.name for p in made.programs]
  assert "jit(solver_steps)" in names
  assert all(n.startswith(("jit(_", "jit(solver_")) or n == "jit(<lambda>)" for n in names), names


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["dlg", "inverting_gradients"])
def test_a_second_budget_in_one_process_makes_no_program(attack):
  """A second run in the same process that changes only the budget (an audit's probes, then its run;
  a sweep over budgets) makes no program at all: the same solver and its compiled steps serve it,
  Inverting Gradients' learning-rate milestones included."""
  from gradjax.run import config, pipeline
  options = {"attack.preset": attack, "data.image_size": 16, "output.lpips": "none"}
  pipeline.run(config.from_options({**options, "attack.iterations": 4}))
  with compilation.Recorder() as made:
    results, _ = pipeline.run(config.from_options({**options, "attack.iterations": 9}))
  assert results["iterations"] == 9 and made.programs == [], [p.name for p in made.programs]


def test_prng_key_is_jax_random_key_without_a_program():
  seeds = [0, 1, 7, 2**31, 2**32 - 1]
  jax.clear_caches()
  with compilation.Recorder() as made:
    keys = [compilation.prng_key(s) for s in seeds]
  assert made.programs == []
  for key, seed in zip(keys, seeds):
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(seed)))
    np.testing.assert_array_equal(jax.random.normal(key, (3,)), jax.random.normal(jax.random.key(seed), (3,)))
  np.testing.assert_array_equal(jax.random.key_data(compilation.prng_key(2**40)),
                                jax.random.key_data(jax.random.key(2**40)))


def test_device_array_is_jnp_asarray_without_a_program():
  values = [np.ones((2, 3)), np.arange(4, dtype=np.int64), np.float64(2.5), np.ones(2, bool),
            jnp.ones(3), [1.0, 2.0]]
  jax.clear_caches()
  with compilation.Recorder() as made:
    got = [compilation.device_array(v) for v in values[:-1]]
  assert made.programs == []
  got.append(compilation.device_array(values[-1]))
  for g, v in zip(got, values):
    want = jnp.asarray(v)
    assert isinstance(g, jax.Array) and g.dtype == want.dtype and g.weak_type == want.weak_type
    np.testing.assert_array_equal(g, want)


# A small masked encoder under two steps of Adam (whose step compiles faster than L-BFGS's), and the
# span attack on the default decoder.
TEXT_RUNS = {"adam_dlg": {"model.name": "bert", "attack.iterations": 2, "data.sequence_length": 8,
                          "model.text_dim": 16, "model.text_heads": 2, "model.text_ffn": 16,
                          "model.text_layers": 1},
             "dager": {"model.name": "gpt"}}


@pytest.mark.slow
@pytest.mark.parametrize("attack, phases", [("adam_dlg", ["setup", "attack", "scoring"]),
                                            ("dager", ["setup", "attack"])])
def test_a_text_run_reports_where_its_time_went(attack, phases):
  """run_text's ``time``: the optimisation attack's three phases, the span attack's two (it scores as
  it reads), adding up to the wall-clock time around the call."""
  import time

  from gradjax.run import config, text_run
  start = time.perf_counter()
  results = text_run.run_text(config.from_options({
      "data.modality": "text", "data.dataset": "pydoc", "attack.preset": attack, **TEXT_RUNS[attack]}))
  wall = time.perf_counter() - start
  spent = results["time"]["phases"]
  assert list(spent) == phases
  assert wall - 0.2 <= sum(p["seconds"] for p in spent.values()) <= wall
  assert all(p["making_programs"] <= p["seconds"] for p in spent.values())


@pytest.mark.slow
def test_clients_attacked_together_report_where_their_time_went():
  """pipeline.run_clients: two experiments in one solver run each report their own set-up and
  scoring and the shared attack (its wall_time_s); together they fit in the wall-clock time around
  the call, and the solver's step program is listed."""
  import time

  from gradjax.run import config, pipeline
  jax.clear_caches()
  cfg = config.from_options({"attack.preset": "dlg", "attack.iterations": 5, "output.lpips": "none",
                             "data.image_size": 16, "execution.clients_per_run": 2,
                             "execution.strategy": "vmap"})
  start = time.perf_counter()
  outcomes = pipeline.run_clients([config.replace(cfg, {"data.index": i}) for i in (0, 1)])
  wall = time.perf_counter() - start
  attacks = []
  for results, _ in outcomes:
    assert results["clients_together"] == 2
    phases = results["time"]["phases"]
    assert list(phases) == ["setup", "attack", "scoring"]
    assert phases["attack"]["seconds"] == pytest.approx(results["wall_time_s"], abs=1e-6)
    for p in phases.values():
      assert 0 < p["seconds"] and max(p[s] for s in compilation.STAGES) <= p["making_programs"] <= p["seconds"]
    attacks.append(phases["attack"])
    assert "jit(solver_steps)" in [p["name"] for p in results["time"]["largest_programs"]]
  assert attacks[0] == attacks[1]
  # Both set-ups, the one attack and both scorings do not overlap: together within the call.
  spent = (sum(r["time"]["phases"]["setup"]["seconds"] + r["time"]["phases"]["scoring"]["seconds"]
               for r, _ in outcomes) + attacks[0]["seconds"])
  assert spent <= wall
