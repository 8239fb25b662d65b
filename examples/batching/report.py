"""What a replay measured: per-run summaries, the comparison table, throughput over time.

Every time is on the replay clock (loop.py): TTFT is first token - arrival, inter-token
latency the gap between a request's consecutive tokens, throughput the output tokens over
the span from the first arrival to the last token. Hit tokens are prompt tokens a request
did not compute because the cache had them, by the tier they came from, over all its
admissions; `resume_hit_tokens` is the part found when a preempted request came back (its
own pages, kept by `retract`). Bytes moved are the cache's own counters, per link.
"""
from __future__ import annotations

import numpy as np

from examples.batching.loop import PHASES, Run
from examples.batching.sequence import TIERS

FUSED_LOAD = "plan:load_pieces"    # the label of a load's one fused program (hicache_jax.transfer.plan_programs)


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """{p50, p90, p99, mean} in milliseconds (zeros when there is nothing to measure)."""
    if not seconds:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    x = 1e3 * np.asarray(seconds, np.float64)
    return {"p50": round(float(np.percentile(x, 50)), 3), "p90": round(float(np.percentile(x, 90)), 3),
            "p99": round(float(np.percentile(x, 99)), 3), "mean": round(float(x.mean()), 3)}


def summarize(run: Run) -> dict:
    """The JSON summary of one run."""
    seqs = run.sequences
    ttft = [s.token_times[0] - s.job.arrival_s for s in seqs]
    itl = [b - a for s in seqs for a, b in zip(s.token_times, s.token_times[1:])]
    tokens = sum(len(s.tokens) for s in seqs)
    span = max(s.token_times[-1] for s in seqs) - min(s.job.arrival_s for s in seqs)
    hits = {tier: sum(s.hits[tier] + s.resume_hits[tier] for s in seqs) for tier in TIERS}
    st = run.stats
    return {
        "requests": len(seqs),
        "output_tokens": tokens,
        "ttft_ms": percentiles_ms(ttft),
        "itl_ms": percentiles_ms(itl),
        "throughput_tok_s": round(tokens / span, 3) if span > 0 else 0.0,
        "span_s": round(span, 3),
        "busy_s": round(sum(r.wall_s for r in run.steps), 3),
        "prompt_tokens": sum(len(s.job.prompt) for s in seqs),
        "hit_tokens": hits,
        "resume_hit_tokens": {tier: sum(s.resume_hits[tier] for s in seqs) for tier in TIERS},
        "computed_tokens": sum(s.computed_tokens for s in seqs),
        "bytes_moved": {"device_to_host": int(sum(st.backup_bytes.values())),
                        "host_to_device": int(sum(st.load_bytes.values()))},
        "dropped_tokens": {pool: {why: int(n) for why, n in r.items()} for pool, r in st.dropped_tokens.items()},
        "max_batch": max(r.batch for r in run.steps),
        "mean_batch": round(float(np.mean([r.batch for r in run.steps])), 3),
        "steps": len(run.steps),
        "preemptions": run.preemptions,
        "refused_admissions": run.refused_admissions,
        "load_refusals": dict(st.load_refusals),     # host hits recomputed instead, by reason
        "wall_s": round(run.wall_s, 3),
        "phase_s": {phase: round(spent, 3) for phase, spent in run.phase_s.items()},
        "cache_phases_s": {phase: round(spent, 3) for phase, spent in sorted(run.cache_phases_s.items())},
        "transfer_waits": dict(st.transfer_waits),   # the cache's calls that waited on transfers in flight
        "background_compiles": run.background_compiles,
        "background_compile_s": round(run.background_compile_s, 3),
        "gc_s": round(run.gc_s, 3), "gc_full_passes": run.gc_full_passes,
        "fused_loads": run.program_calls.get(FUSED_LOAD, 0),
        "program_calls": run.program_calls,
        "step_profile": step_profile(run),
    }


def step_profile(run: Run) -> dict:
    """Where the steps' wall time goes, step by step (ms): each part's median and p99 over
    the steps, and the median wait for the device once everything was dispatched; and the
    slow steps (over twice the median step): how many, the wall time they took beyond the
    median, what they spent in each part, in the engine's dispatch and in transfer waits,
    and the transfer programs they ran."""
    if not run.steps:
        return {}
    wall = 1e3 * np.asarray([r.wall_s for r in run.steps])
    parts = 1e3 * np.asarray([r.phase_s for r in run.steps]).reshape(len(wall), len(PHASES))
    median = float(np.median(wall))
    slow = wall > 2 * median
    ms = lambda x: round(float(x), 3)
    return {
        "step_ms": {"p50": ms(median), "p99": ms(np.percentile(wall, 99)), "max": ms(wall.max())},
        "part_ms_p50": {p: ms(np.median(parts[:, i])) for i, p in enumerate(PHASES)},
        "part_ms_p99": {p: ms(np.percentile(parts[:, i], 99)) for i, p in enumerate(PHASES)},
        "fetch_ms_p50": ms(1e3 * np.median([r.fetch_s for r in run.steps])),   # the device still busy
        "slow_steps": int(slow.sum()),
        "slow_excess_ms": ms((wall[slow] - median).sum()),
        "slow_part_ms": {p: ms(parts[slow, i].sum()) for i, p in enumerate(PHASES)},
        "slow_dispatch_ms": ms(1e3 * sum(r.dispatch_s for r, s in zip(run.steps, slow) if s)),
        "slow_wait_ms": ms(1e3 * sum(r.wait_s for r, s in zip(run.steps, slow) if s)),
        "programs_per_step": ms(np.mean([r.programs for r in run.steps])),
        "programs_per_slow_step": ms(np.mean([r.programs for r, s in zip(run.steps, slow) if s]) if slow.any() else 0),
    }


def ratios(summaries: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """HiCache against each other run: TTFT ratios (other / hicache: > 1, HiCache is faster)
    and throughput ratio (hicache / other)."""
    hi = summaries["hicache"]
    out = {}
    for name, other in summaries.items():
        if name == "hicache":
            continue
        out[f"vs_{name}"] = {
            "ttft_p50": _ratio(other["ttft_ms"]["p50"], hi["ttft_ms"]["p50"]),
            "ttft_p99": _ratio(other["ttft_ms"]["p99"], hi["ttft_ms"]["p99"]),
            "throughput": _ratio(hi["throughput_tok_s"], other["throughput_tok_s"]),
        }
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def table(summaries: dict[str, dict]) -> str:
    """The comparison table printed before the JSON line."""
    head = (f"{'run':12} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'ITL p50':>8} {'tok/s':>7} {'batch':>5} "
            f"{'hit dev':>8} {'hit host':>8} {'computed':>9} {'preempt':>7} {'D->H MB':>8} {'H->D MB':>8}")
    lines = [head, "-" * len(head)]
    for name, s in summaries.items():
        t, b = s["ttft_ms"], s["bytes_moved"]
        lines.append(f"{name:12} {t['p50']:9.1f} {t['p90']:8.1f} {t['p99']:8.1f} {s['itl_ms']['p50']:8.1f} "
                     f"{s['throughput_tok_s']:7.1f} {s['max_batch']:5d} {s['hit_tokens']['device']:8d} "
                     f"{s['hit_tokens']['host']:8d} {s['computed_tokens']:9d} {s['preemptions']:7d} "
                     f"{b['device_to_host'] / 1e6:8.1f} {b['host_to_device'] / 1e6:8.1f}")
    lines.append("(times in ms on the replay clock; hits and computed in prompt tokens; batch: the most "
                 "sequences in one step)")
    return "\n".join(lines)


def throughput_series(run: Run, points: int = 60, window_parts: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(times s, output tokens/s) over the run's span: at each time, the tokens of the steps
    that ended in the window before it (a twelfth of the span) over the window's length.
    A window, not a bucket per step: decode tokens come in bursts, one per running sequence."""
    t = np.asarray([r.clock_s for r in run.steps])
    n = np.cumsum([r.tokens for r in run.steps], dtype=np.float64)
    start = min(s.job.arrival_s for s in run.sequences)
    width = max((t.max() - start) / window_parts, 1e-9)
    at = np.linspace(start + width, t.max(), points)
    done = lambda x: np.interp(x, t, n, left=0.0)     # tokens done by time x (steps ended by then)
    return at, (done(at) - done(at - width)) / width
