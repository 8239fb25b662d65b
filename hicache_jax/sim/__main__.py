"""`python -m hicache_jax.sim`: see `hicache_jax.sim.cli` (or `--help`)."""
import sys

from hicache_jax.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
