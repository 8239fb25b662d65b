"""`python -m hicache_jax.layout CONFIG [--tokens N] [--prefixes K]`: the pool table and host sizing."""
from __future__ import annotations

import argparse
import sys

from hicache_jax.config import load_model_config
from hicache_jax.layout import PoolLayout, build_layout


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def pool_table(layout: PoolLayout) -> str:
    head = ("pool", "kind", "source", "hit policy", "layers", "page bytes", "bytes/token", "placement")
    rows = []
    for p in layout.pools:
        per_token = p.num_layers * p.page_bytes / layout.page_size
        rows.append((p.name, str(p.kind), p.index_source or "-", str(p.hit_policy), str(p.num_layers),
                     f"{p.page_bytes:,}", f"{per_token:,.2f}", str(p.sharding)))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    right = {4, 5, 6}
    def fmt(r):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def sizing(layout: PoolLayout, tokens: int, prefixes: int | None) -> str:
    page = layout.page_size
    pages = -(-tokens // page)
    global_bytes = pages * layout.page_bytes_of(layout.anchor.name)
    lines = [f"host memory for {tokens:,} cached tokens ({pages:,} pages of {page}):",
             f"  global KV (kv-derived pools): {_size(global_bytes)}  ({layout.bytes_per_token():,.2f} B/token)"]
    swa = layout.swa_pool
    if swa is not None:
        wp = layout.window_pages()
        per_prefix = wp * layout.page_bytes_of(swa.name)
        window_pools = " + ".join(q.name for q in layout.moving_with(swa.name))
        lines.append(f"  window state per cached prefix end ({window_pools}; {wp} page{'s' * (wp > 1)}): "
                     f"{_size(per_prefix)}  ({layout.window_bytes_per_token():,.2f} B/window token)")
        if prefixes is not None:
            lines.append(f"  total with {prefixes:,} prefix ends: {_size(global_bytes + prefixes * per_prefix)}")
        lines.append(f"  upper bound (window state kept for every page): {_size(global_bytes + pages * layout.page_bytes_of(swa.name))}")
    return "\n".join(lines)


def _indexer(cfg) -> str:
    return "fp4 (low-ratio)" if cfg.model_type == "deepseek_v41" else cfg.indexer_dtype


def _kinds(layout: PoolLayout) -> str:
    """How many layers attend to the window only and how many to every token (hybrid models)."""
    local = sum(info.ratio == 0 for info in layout.layers)
    return f" ({local} sliding-window, {len(layout.layers) - local} global)" if layout.model.layer_types else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hicache_jax.layout", description=__doc__)
    ap.add_argument("config", help="model config JSON (see configs/)")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="cached tokens to size the host tier for")
    ap.add_argument("--prefixes", type=int, default=None, help="number of cached prefix ends (each keeps its SWA window)")
    args = ap.parse_args(argv)
    if args.tokens < 0:
        ap.error(f"--tokens must be >= 0, got {args.tokens}")
    try:
        cfg = load_model_config(args.config)
        layout = build_layout(cfg)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = cfg
    print(f"{m.name or args.config}: {m.model_type}, {m.num_hidden_layers} layers{_kinds(layout)}, page {m.page_size} tokens"
          + (f", window {m.sliding_window}" if m.sliding_window else "")
          + (f", kv_layout {m.kv_layout}, indexer {_indexer(m)}" if m.is_deepseek else f", {m.kv_dtype} K/V"))
    print()
    print(pool_table(layout))
    print()
    print(sizing(layout, args.tokens, args.prefixes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
