"""``python -m gradjax <command> [flags]``: the ``gradjax`` command (:mod:`gradjax.cli`)."""

from gradjax.cli import main

if __name__ == "__main__":
  main()
