"""Plot GB/s vs pages from a bench_transfer.py JSON file.

    python benchmarks/plot_transfer.py benchmarks/results/transfer_h200.json transfer.png
"""
from __future__ import annotations

import argparse
import json

SERIES = [  # (key in a sweep row, label, style)
    ("contig_d2h_gbps", "contiguous device_put D2H", "k--"),
    ("contig_h2d_gbps", "contiguous device_put H2D", "k:"),
    ("backup_gbps", "engine backup (D2H)", "C0o-"),
    ("load_gbps", "engine load-back (H2D)", "C1s-"),
    ("perpage_d2h_gbps", "one array per page D2H", "C2^--"),
    ("perpage_h2d_gbps", "one array per page H2D", "C3v--"),
]


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [(k, v) for k, v in results.get("sweeps", {}).items() if v]
    fig, axes = plt.subplots(1, max(1, len(sweeps)), figsize=(6 * max(1, len(sweeps)), 4.5), squeeze=False)
    for ax, (name, rows) in zip(axes[0], sweeps):
        pages = [r["pages"] for r in rows]
        for key, label, style in SERIES:
            if all(key in r for r in rows):
                ax.plot(pages, [r[key] for r in rows], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("pages per transfer (random device pages)")
        ax.set_ylabel("GB/s")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    env = results.get("env", {})
    fig.suptitle(f"hicache-jax transfer engine, {env.get('device', '?')}, jax {env.get('jax', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a JSON file bench_transfer.py wrote (its sweeps are plotted)")
    ap.add_argument("png", help="the image to write (one panel per sweep)")
    args = ap.parse_args()
    try:
        with open(args.results) as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        ap.error(f"{args.results}: {e}")
    plot(results, args.png)


if __name__ == "__main__":
    main()
