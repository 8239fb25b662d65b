"""`Router`: which instance serves a request.

    random        uniformly at random (seeded)
    round_robin   instance k mod N for the k-th request
    affinity      the instance whose tree holds the longest prefix of the prompt (on any
                  tier: a host hit is cheap too), among the instances whose load is at
                  most `load_bound` requests above the least loaded one; ties go to the
                  less loaded, then to the one given the fewest requests so far, then to
                  the lowest index

The load bound keeps affinity from piling a popular prefix's requests onto one instance
while others idle (SGLang's cache-aware router balances the same way). The router asks
each instance two things only, so the real multi-process check routes with this same
class over processes: `coverage(i)` (leading pages of the prompt instance i holds) and
`load(i)` (its requests waiting or running). Coverage is the tree's, as of the request's
arrival: a prefix still being computed elsewhere is not seen.
"""
from __future__ import annotations

import random
from collections.abc import Callable

from hicache_jax import validate
from hicache_jax.sim.config import ROUTES


class Router:
    def __init__(self, route: str, instances: int, load_bound: int = 4, seed: int = 0):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}; got {route!r}")
        self.route = route
        self.instances = validate.count("instances", instances, minimum=1)
        self.load_bound = validate.count("load_bound", load_bound)
        self._rng = random.Random(seed)
        self._next = 0
        self.routed = [0] * instances
        self.affine = 0        # affinity: requests sent where a prefix was found

    def pick(self, coverage: Callable[[int], int], load: Callable[[int], int]) -> int:
        """The instance for the next request (see the module docstring)."""
        n = self.instances
        if self.route == "random":
            i = self._rng.randrange(n)
        elif self.route == "round_robin":
            i, self._next = self._next, (self._next + 1) % n
        else:
            loads = [load(k) for k in range(n)]
            limit = min(loads) + self.load_bound
            best, best_key = 0, None
            for k in range(n):
                if loads[k] > limit:
                    continue
                key = (-coverage(k), loads[k], self.routed[k], k)
                if best_key is None or key < best_key:
                    best, best_key = k, key
            i = best
            self.affine += best_key[0] < 0
        self.routed[i] += 1
        return i


__all__ = ["Router"]
