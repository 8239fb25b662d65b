"""`SimResult`: what a simulated fleet did, as one frozen record and its JSON form.

Hit rates are fractions of all input tokens, by the tier each token came from for its
request: `device` (matched on the instance's device tier), `host` (loaded back from its
host tier), `storage` (fetched from the shared tier for that request, then loaded back),
and their sum `total`; every other input token was prefilled. TTFT runs from a request's
arrival to the end of its prefill: queueing, the storage lookup and read, the load-back
and the prefill itself.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from hicache_jax.sim.instance import RequestOutcome

TIERS = ("device", "host", "storage")


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / mean / max of durations in seconds, as milliseconds (linear interpolation)."""
    if not len(seconds):
        return {k: 0.0 for k in ("p50", "p90", "p99", "mean", "max")}
    a = np.asarray(seconds, np.float64) * 1e3
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3),
            "mean": round(float(a.mean()), 3), "max": round(float(a.max()), 3)}


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """One simulated run (see the module docstring). `outcomes`: one per request, in arrival order."""

    instances: int
    route: str
    window_policy: str
    outcomes: tuple[RequestOutcome, ...]
    bytes_moved: Mapping[str, int]          # link direction -> bytes, summed over instances
    tiers: Mapping[str, object]             # tier sizes: pages per allocator and GiB, per instance (storage: shared)
    tree: Mapping[str, object]              # the trees' counters, summed over instances
    storage: Mapping[str, object] | None    # the shared store's counters (None without one)
    sim_seconds: float                      # simulated time from the first arrival to the last first token
    wall_s: float                           # how long the simulation took to run
    peak_rss_mib: float                     # the process's peak resident memory when it ended

    @property
    def requests(self) -> int:
        return len(self.outcomes)

    @property
    def input_tokens(self) -> int:
        return sum(o.input_tokens for o in self.outcomes)

    @property
    def hit_tokens(self) -> dict[str, int]:
        return {t: sum(getattr(o, t) for o in self.outcomes) for t in TIERS}

    @property
    def hit_rate(self) -> dict[str, float]:
        hits, total = self.hit_tokens, self.input_tokens
        rates = {t: round(hits[t] / total, 6) if total else 0.0 for t in TIERS}
        rates["total"] = round(sum(hits.values()) / total, 6) if total else 0.0
        return rates

    @property
    def prefill_tokens_saved(self) -> int:
        return sum(self.hit_tokens.values())

    @property
    def ttft_ms(self) -> dict[str, float]:
        return percentiles_ms([o.ttft_s for o in self.outcomes])

    @property
    def queue_ms(self) -> dict[str, float]:
        return percentiles_ms([o.start_s - o.arrival_s for o in self.outcomes])

    def per_instance(self) -> list[dict]:
        out = []
        for i in range(self.instances):
            mine = [o for o in self.outcomes if o.instance == i]
            tokens = sum(o.input_tokens for o in mine)
            hits = sum(o.device + o.host + o.storage for o in mine)
            out.append({"requests": len(mine), "input_tokens": tokens,
                        "hit_rate": round(hits / tokens, 6) if tokens else 0.0})
        return out

    def to_json(self) -> dict:
        """The JSON record (the CLI's last line)."""
        return {
            "requests": self.requests, "instances": self.instances, "route": self.route,
            "window_policy": self.window_policy, "input_tokens": self.input_tokens,
            "hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "prefill_tokens": self.input_tokens - self.prefill_tokens_saved,
            "bytes_moved": dict(self.bytes_moved), "ttft_ms": self.ttft_ms, "queue_ms": self.queue_ms,
            "tiers": dict(self.tiers), "per_instance": self.per_instance(), "tree": dict(self.tree),
            "storage": dict(self.storage) if self.storage is not None else None,
            "sim_seconds": round(self.sim_seconds, 3), "wall_s": round(self.wall_s, 3),
            "peak_rss_mib": round(self.peak_rss_mib, 1),
        }


def tree_counters(stats: Sequence) -> dict[str, object]:
    """The `TreeStats` of every instance, summed into plain JSON values."""
    dropped, evicted, refusals, prefetches = Counter(), Counter(), Counter(), Counter()
    loads = without_room = 0
    for s in stats:
        for (allocator, reason), n in s.dropped.items():
            dropped[f"{allocator}/{reason}"] += n
        for tier, n in s.evicted.items():
            evicted[tier.name.lower()] += n
        refusals.update({str(k): v for k, v in s.refusals.items()})
        prefetches.update({str(k): v for k, v in s.prefetches.items()})
        loads += s.loads_started
        without_room += s.backups_without_room
    return {"dropped_tokens": dict(dropped), "evicted_tokens": dict(evicted), "load_backs": loads,
            "load_back_refusals": dict(refusals), "prefetches": dict(prefetches),
            "backups_without_room": without_room}


__all__ = ["SimResult", "TIERS", "percentiles_ms", "tree_counters"]
