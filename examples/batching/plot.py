"""The replay's figure: TTFT CDF of every run, and output throughput over the replay clock."""
from __future__ import annotations

import numpy as np

from examples.batching.loop import Run
from examples.batching.report import throughput_series

COLORS = {"hicache": "tab:blue", "device_only": "tab:orange", "no_cache": "tab:gray"}


def plot(runs: dict[str, Run], path, title: str) -> None:
    """Write a PNG to `path`: left, the CDF of TTFT per run; right, tokens/s over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, run in runs.items():
        ttft = np.sort([1e3 * (s.token_times[0] - s.job.arrival_s) for s in run.sequences])
        cdf.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", label=name, color=COLORS.get(name))
        t, rate = throughput_series(run)
        tput.plot(t, rate, label=name, color=COLORS.get(name))
    cdf.set_xscale("log")
    cdf.set_xlabel("TTFT (ms, replay clock)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("time to first token")
    cdf.grid(alpha=0.3)
    cdf.legend()
    tput.set_xlabel("replay clock (s)")
    tput.set_ylabel("output tokens / s")
    tput.set_title("throughput over time")
    tput.grid(alpha=0.3)
    tput.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
