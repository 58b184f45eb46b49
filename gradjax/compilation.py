"""Programs that run once per experiment, compiled for a short compilation rather than a fast run.

XLA hands every program to LLVM with its backend optimisation level (2 by default). For a program
that runs once, the optimisation costs more than it saves: on XLA:CPU (jax 0.10.2) the threefry draw
of one 5×5×3×12 uniform kernel took 2.8 s to compile at level 2 and 0.3 s at level 0. Code that is
not jitted at all is no cheaper: each primitive becomes a program of its own (a LeNet gradient taken
eagerly compiled some hundred of them). So the set-up of an experiment (the model's initialisation,
the client's gradient, the dummy data, the solver's first and last evaluations, the LPIPS network)
is jitted whole with :func:`once`; the optimisation step that runs thousands of times gets
an optimisation level that compiles faster for the same speed (:data:`STEP`). The level changes how
fast the machine code runs and, through fused multiply-adds, the last bits of some results (XLA:CPU
runs without fast-math), so a long optimisation is reproducible at one level, not across levels
(the README's DLG run: PSNR 43.58 dB with every program at level 0, 43.65 dB at levels 1 and 2).
"""

import functools

import jax

# Compiler options of a program that runs once (``jax.jit(..., compiler_options=...)``).
ONCE = {"xla_backend_optimization_level": 0}
# Compiler options of the optimisation step, which runs thousands of times: LLVM's level 1. DLG's
# step on lenet_zhu compiled in 6.9 s at level 1 against 8.7 s at level 2 (one core, jax 0.10.2)
# and 2000 iterations ran in the same time; level 0 compiled in 3.7 s but ran 40 % slower.
#
# ``xla_cpu_copy_insertion_use_region_analysis``: without it XLA:CPU copies every donated buffer
# that a program both reads and updates in place (twice: L-BFGS's (m, ...) history, read by the
# direction's products and given its newest pair by ``.at[slot].set``), a fifth of a DLG iteration
# on LeNet and most of a vmapped one. Other backends ignore it.
STEP = {"xla_backend_optimization_level": 1, "xla_cpu_copy_insertion_use_region_analysis": True}


def once(fun=None, **jit_kwargs):
  """``jax.jit(fun, **jit_kwargs)`` with the compiler options :data:`ONCE`; also a decorator
  (``@once`` or ``@once(static_argnames=...)``).

  Called inside another transformation (``jit``, ``vmap``, ``eval_shape``, ``grad``), where JAX
  takes compiler options only at the top level, it is the plain ``jax.jit(fun, **jit_kwargs)``.
  """
  if fun is None:
    return functools.partial(once, **jit_kwargs)
  fast = jax.jit(fun, compiler_options=ONCE, **jit_kwargs)
  plain = jax.jit(fun, **jit_kwargs)

  @functools.wraps(fun)
  def call(*args, **kwargs):
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
      return plain(*args, **kwargs)
    try:
      return fast(*args, **kwargs)
    except ValueError as e:  # inside a trace that none of the arguments shows
      if "compiler_options" not in str(e):
        raise
      return plain(*args, **kwargs)

  return call
