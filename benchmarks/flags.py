"""Flag types the benchmarks share: argparse `type=` callables whose errors name the value
(argparse prints them as one line with the flag's name)."""
from __future__ import annotations

import argparse
from collections.abc import Callable


def number_list(kind: type = int, ok: Callable[[float], bool] = lambda v: v >= 1,
                what: str = "counts >= 1") -> Callable[[str], list]:
    """A flag of comma-separated numbers of `kind`, each passing `ok` (described as `what`)."""
    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, separated by commas; got {text!r}") from None
        if not values or not all(ok(v) for v in values):
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
        return values
    return parse


def count(text: str) -> int:
    """A flag of one count >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1; got {text!r}")
    return value
