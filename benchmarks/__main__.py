"""``python -m benchmarks <program> [flags]`` from the clone's root (:mod:`benchmarks`)."""

from benchmarks import PROGRAMS
from gradjax import cli

if __name__ == "__main__":
  cli.main(program="python -m benchmarks", commands=PROGRAMS, package="benchmarks")
