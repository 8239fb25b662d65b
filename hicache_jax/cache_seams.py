"""What `HiCache` offers beside serving: its numbers, its invariants and seams to watch its
programs (tests, benchmarks, monitoring). A mixin of `HiCache`: it reads the cache's parts."""
from __future__ import annotations

from prometheus_client import generate_latest

from hicache_jax.data_plane import time_phases
from hicache_jax.metrics import CacheStats, snapshot
from hicache_jax.plan import Direction


class CacheSeams:
    def wait_compiles(self) -> None:
        """Block until the programs compiling in the background are ready: a load that
        gathers pieces of several host blocks runs as one program from the second load of
        its shape on (the first moves by per-chunk programs meanwhile). For warm-up and
        benchmarks; a serving loop need not call it."""
        self._engine.wait_compiles()

    # -- introspection ------------------------------------------------------------------------
    @property
    def landing_sizes(self) -> tuple[int, ...]:
        """The block sizes (pages) a deferred load may leave to a step (`TransferConfig.landing_buckets`)."""
        return self._engine.landing_sizes

    def on_program_call(self, hook) -> None:
        """Instrumentation: every transfer program this cache runs is called as
        `hook(label, program, *args)` from now on (see `TransferEngine.on_program_call`)."""
        self._engine.on_program_call(hook)

    def time_phases(self) -> dict[str, float]:
        """Instrumentation (benchmarks): from now on, the seconds this cache's calls spend in
        each phase of a host hit add up in the returned dict: `match` (the tree's match),
        `plan` (the tree's load planning), `dispatch` (the engine's start), `wait` (waiting
        for a transfer to end and applying its end)."""
        return time_phases(self._core, self._data)

    def stats(self) -> CacheStats:
        """A frozen snapshot of every number this cache counts (the same as `metrics_text`)."""
        in_flight = self._core.in_flight()
        return snapshot(self.layout, self._core, self._data.counters,
                        {d.value: sum(t.direction is d for t in in_flight) for d in Direction},
                        self._storage.stats() if self._storage is not None else None, self._engine.host.block_counts())

    def metrics_text(self) -> str:
        """The Prometheus text exposition of this cache's metrics."""
        return generate_latest(self._registry).decode()

    def check_invariants(self) -> None:
        """Recompute every conservation law of the control plane; validate the device pools."""
        self._core.check_invariants()
        self._data.check()

