"""What the command line prints: a run's summary, a sweep's table, and its plot."""
from __future__ import annotations

from hicache_jax.layout import PoolLayout
from hicache_jax.sim.results import SimResult
from hicache_jax.sim.sizing import TierSize

_GB = 1e9


def summary(layout: PoolLayout, plan, result: SimResult, tag: str = "") -> str:
    """A few lines: the fleet, each tier's size, where the prompt tokens came from, TTFT, traffic."""
    j = result.to_json()
    t, rate, ttft = j["tiers"], j["hit_rate"], j["ttft_ms"]
    cfg = plan.config
    lines = [f"{tag}{layout.model.name or 'model'}: {j['requests']:,} requests on {j['instances']} instance(s), "
             f"route {j['route']}, window policy {j['window_policy']}; simulated {j['sim_seconds']:,.0f} s "
             f"in {j['wall_s']:.1f} s (peak memory {j['peak_rss_mib']:,.0f} MiB)"]
    for tier in ("device", "host", "storage"):
        if f"{tier}_pages" in t:
            size = plan.sizes.get(tier, TierSize())
            each = "shared" if tier == "storage" else "per instance"
            pages = ", ".join(f"{a} {n:,}" for a, n in t[f"{tier}_pages"].items())
            lines.append(f"  {tier:8} {str(size):>10}  = {t[f'{tier}_gib']:,.2f} GiB {each} (pages: {pages})")
    lines.append(f"  hit rate {rate['total']:.3f} of {j['input_tokens']:,} input tokens: device {rate['device']:.3f}, "
                 f"host {rate['host']:.3f}, storage {rate['storage']:.3f}; prefilled {j['prefill_tokens']:,}")
    lines.append(f"  TTFT ms p50 {ttft['p50']:,.1f}  p90 {ttft['p90']:,.1f}  p99 {ttft['p99']:,.1f} "
                 f"(queueing p50 {j['queue_ms']['p50']:,.1f}; prefill at {cfg.rates.prefill_tokens_per_s:,.0f} tok/s)")
    moved = j["bytes_moved"]
    lines.append("  moved GB: " + ", ".join(f"{k.replace('_', ' ')} {v / _GB:,.1f}" for k, v in moved.items()))
    return "\n".join(lines)


def sweep_table(flag: str, results: list) -> str:
    """One row per swept value: hit rates by tier, TTFT percentiles, host GiB, traffic."""
    head = (flag, "total", "device", "host", "storage", "TTFT p50", "p90", "p99", "host GiB", "h2d GB", "s2h GB")
    rows = []
    for value, _, r in results:
        j = r.to_json()
        hr, tt, mv = j["hit_rate"], j["ttft_ms"], j["bytes_moved"]
        rows.append((str(value), f"{hr['total']:.3f}", f"{hr['device']:.3f}", f"{hr['host']:.3f}",
                     f"{hr['storage']:.3f}", f"{tt['p50']:,.0f}", f"{tt['p90']:,.0f}", f"{tt['p99']:,.0f}",
                     f"{j['tiers']['host_gib']:,.1f}", f"{mv['host_to_device'] / _GB:,.1f}",
                     f"{mv['storage_to_host'] / _GB:,.1f}"))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))
    return "\n".join(["", fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def sweep_x(flag: str, results: list) -> tuple[list[float], str]:
    """The x axis of a sweep: a tier's GiB (per instance, storage shared) for size flags,
    else the values themselves when they are numbers, else their positions."""
    for tier in ("device", "host", "storage"):
        if flag.startswith(f"{tier}-"):
            unit = "shared" if tier == "storage" else "per instance"
            return [r.tiers[f"{tier}_gib"] for _, _, r in results], f"{tier} tier, GiB {unit}"
    try:
        return [float(v) for v, _, _ in results], flag
    except ValueError:
        return list(range(len(results))), flag


def plot_sweep(flag: str, results: list, layout: PoolLayout, path: str) -> None:
    """Hit rate by tier (stacked) and TTFT percentiles against the swept value, as a PNG."""
    import matplotlib       # only here: a plain run needs no plotting library
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, label = sweep_x(flag, results)
    rates = [r.hit_rate for _, _, r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(x)
    for tier, color in (("device", "#3b6ea5"), ("host", "#6fa84f"), ("storage", "#d9a43b")):
        top = [b + hr[tier] for b, hr in zip(bottom, rates)]
        left.fill_between(x, bottom, top, color=color, alpha=0.8, label=tier, step=None)
        bottom = top
    left.plot(x, bottom, "k.-", lw=1, label="total")
    left.set(xlabel=label, ylabel="fraction of input tokens", title="hit rate by tier",
             ylim=(0, min(1.0, 1.25 * max(bottom) + 0.05)))
    left.legend(loc="upper left", fontsize=8)
    for p, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        right.plot(x, [r.ttft_ms[p] / 1e3 for _, _, r in results], style, label=p)
    right.set(xlabel=label, ylabel="seconds", title="time to first token", yscale="log")
    right.legend(fontsize=8)
    if isinstance(x[0], int) and not isinstance(results[0][0], (int, float)):
        for ax in (left, right):
            ax.set_xticks(x, [str(v) for v, _, _ in results])
    name = layout.model.name or "model"
    r0 = results[0][2]
    fig.suptitle(f"{name}: {r0.requests:,} requests, {r0.instances} instance(s), route {r0.route}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["plot_sweep", "summary", "sweep_table", "sweep_x"]
