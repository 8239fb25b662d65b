"""Ways timed against a reference, each round pairing every way with the reference beside it.

`paired_rounds(ways, rounds, timed)`: `ways` maps names to callables and holds "contiguous",
the reference; each round times every other way once, in an order rotated round by round,
and the reference right before or after it (alternating), so that drift between rounds
touches both sides of a pair alike. Returns ({way: [ms]}, {way: [reference ms / way ms]}).
"""
from __future__ import annotations

from collections.abc import Callable

REFERENCE = "contiguous"


def paired_rounds(ways: dict[str, Callable], rounds: int,
                  timed: Callable[[Callable], tuple[float, object]]) -> tuple[dict, dict]:
    names = [w for w in ways if w != REFERENCE]
    ms, ratios = {w: [] for w in ways}, {w: [] for w in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            pair = [(REFERENCE, ways[REFERENCE]), (name, ways[name])]
            if (r + k) % 2:
                pair.reverse()
            got = {w: timed(fn)[0] for w, fn in pair}
            ms[name].append(got[name])
            ms[REFERENCE].append(got[REFERENCE])
            ratios[name].append(got[REFERENCE] / got[name])
    return ms, ratios
