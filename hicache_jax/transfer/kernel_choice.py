"""Which pack / unpack kernels an engine's programs use (`TransferConfig.kernels`)."""
from __future__ import annotations

import logging

import jax

import pallas_kernels as pk

log = logging.getLogger("hicache_jax.transfer")


def resolve_kernels(kernels: str, device: jax.Device, layout) -> str:
    """The implementation name the programs of `layout` use on `device` (never "auto");
    ValueError when the chosen kernels cannot move its pages (under "auto": the reference)."""
    if kernels not in pk.IMPLS:
        raise ValueError(f"kernels must be one of {', '.join(pk.IMPLS)}; got {kernels!r}")
    backend, _ = pk.resolve(kernels, device)
    chosen = backend if kernels == "auto" else kernels
    granule = pk.GRANULE_BYTES.get(backend)
    odd = sorted(p.name for p in layout.pools if granule and p.page_bytes % granule)
    if odd and kernels == "auto":
        log.info("page kernels: reference (pools %s have pages that are not multiples of %d B)", odd, granule)
        return "reference"
    if odd:
        raise ValueError(f"kernels={kernels!r} move multiples of {granule} B; pools {odd} have other page sizes")
    return chosen
