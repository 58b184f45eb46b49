"""gradjax's benchmark programs: measurements, not attacks, so they live in the clone and not in the
installed package. One harness runs them from the clone's root:

  python -m benchmarks suite [--suite=gpu --parts=...]   # the CPU sections or the accelerator suite
  python -m benchmarks step                              # one attack step against PyTorch eager
  python -m benchmarks memory                            # compiled memory of large-batch matching

They import gradjax (the attack core and its command-line plumbing); nothing in gradjax imports them.
"""

# command -> (module, one line on what it does)
PROGRAMS = {
    "suite": ("suite", "the benchmark suite (CPU sections, or the accelerator suite)"),
    "step": ("step", "one attack step against one training step, JAX and PyTorch"),
    "memory": ("memory", "compiled memory of large-batch matching, with and without remat"),
}
