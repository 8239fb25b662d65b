"""`WindowPolicy`: the SWA pages a request keeps at insert, for hand-made cases, and the
tree's hit rule accepting every stop point the policy promises (windows of 1 and 2 pages)."""
import re

import numpy as np
import pytest

from hicache_jax import DEFAULT_WINDOW_POLICY, WindowPolicy
from helpers import P, core, query, seq

EVERY, ENDS = WindowPolicy.parse("every"), WindowPolicy.parse("ends")


def every(n: int) -> WindowPolicy:
    return WindowPolicy.parse(f"ends+every_{n}")


def test_names_round_trip_and_the_default():
    for name in ("every", "ends", "ends+every_2", "ends+every_16"):
        assert WindowPolicy.parse(name).name == name
    assert WindowPolicy.parse("ends+every_1") == EVERY
    assert WindowPolicy().name == DEFAULT_WINDOW_POLICY


@pytest.mark.parametrize("policy,window,want", [
    (EVERY, 1, set(range(10))),
    (EVERY, 2, set(range(10))),
    (ENDS, 1, {9}),
    (ENDS, 2, {8, 9}),
    (every(4), 1, {3, 7, 9}),
    (every(4), 2, {2, 3, 6, 7, 8, 9}),
    (every(5), 2, {3, 4, 8, 9}),           # the end is a multiple of 5: one window
])
def test_pages_of_ten_whole_pages(policy, window, want):
    # 10 whole pages and 5 tokens of an 11th: the last whole page boundary is 10
    assert policy.keep_pages(10 * P + 5, P, window) == want


@pytest.mark.parametrize("policy,window,want", [
    (EVERY, 2, {3, 4, 5, 6, 7, 8, 9}),
    (ENDS, 2, {8, 9}),
    (every(4), 2, {3, 6, 7, 8, 9}),        # the window of 4 is {2, 3}: page 2 is the tree's
    (every(4), 1, {3, 7, 9}),
])
def test_an_already_cached_prefix_is_not_kept_again(policy, window, want):
    assert policy.keep_pages(10 * P + 5, P, window, cached_pages=3) == want


def test_a_request_shorter_than_its_window():
    for policy in (EVERY, ENDS, every(4)):
        assert policy.keep_pages(P - 1, P, 2) == frozenset()           # no whole page: nothing to keep
        assert policy.keep_pages(P + 7, P, 2) == {0}                    # the window starts at the root
        assert policy.keep_pages(2 * P, P, 3) == {0, 1}
        assert policy.keep_pages(5 * P, P, 2, cached_pages=5) == frozenset()   # all of it cached


def test_no_window_and_explicit_ends():
    assert every(2).keep_pages(10 * P, P, 0) == frozenset()
    # the prompt's end (4.5 pages) and the request's end (10 pages) are both stop points
    assert ENDS.stop_points(10 * P, P, ends=(4 * P + 128, 10 * P)) == (4, 10)
    assert ENDS.keep_pages(10 * P, P, 2, ends=(4 * P + 128, 10 * P)) == {2, 3, 8, 9}
    assert every(4).stop_points(10 * P, P, cached_pages=4) == (8, 10)
    assert ENDS.keep_pages(10 * P, P, 1, ends=()) == frozenset()


@pytest.mark.parametrize("name", ["sometimes", "ends+every_0", "ends+every_x", "every_4", "ends+every_-2", ""])
def test_bad_names_raise_naming_them(name):
    with pytest.raises(ValueError, match=re.escape(f"window policy '{name}'")):
        WindowPolicy.parse(name)


@pytest.mark.parametrize("call,match", [
    (lambda: WindowPolicy(0), "every_pages must be an int >= 1 or None, got 0"),
    (lambda: WindowPolicy(True), "every_pages must be an int >= 1 or None, got True"),
    (lambda: WindowPolicy.parse(None), "window policy None"),
    (lambda: ENDS.keep_pages(-1, P, 1), "num_tokens must be an int >= 0, got -1"),
    (lambda: ENDS.keep_pages(512, 0, 1), "page_size must be an int >= 1, got 0"),
    (lambda: ENDS.keep_pages(512, P, -1), "window_pages must be an int >= 0, got -1"),
    (lambda: ENDS.keep_pages(512, P, 1.0), "window_pages must be an int >= 0, got 1.0"),
    (lambda: ENDS.keep_pages(512, P, 1, cached_pages=3), r"cached_pages must be an int in 0..2 .* got 3"),
    (lambda: ENDS.keep_pages(512, P, 1, ends=[600]), r"request end 600 is not a token position in 0..512"),
    (lambda: ENDS.keep_pages(512, P, 1, ends=[-1]), r"request end -1 is not a token position"),
])
def test_bad_arguments_raise_naming_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def usable(c, tokens: np.ndarray, b: int) -> int:
    """Pages of the first `b` pages of `tokens` that a request could reuse from the device."""
    return c.match_prefix(query(tokens[: b * P])).device_len // P


def insert(c, tokens: np.ndarray, kept: frozenset[int], cached: int = 0) -> None:
    """Insert the whole pages of `tokens` (the first `cached` are the tree's) with SWA pages for `kept`."""
    swa = c.components.windows[0].name
    n = len(tokens) // P
    own = c.match_prefix(query(tokens[: cached * P])).device_pages if cached else np.zeros(0, np.int32)
    assert own.size == cached
    got = c.alloc_device({"kv": n - cached, swa: len(kept)})
    c.insert(tokens[: n * P], np.concatenate([own, got["kv"]]), {swa: dict(zip(sorted(kept), got[swa].tolist()))})
    c.check_invariants()


@pytest.mark.parametrize("layout,window", [("tiny_v4", 1), ("tiny_gemma3", 2)])
@pytest.mark.parametrize("name", ["every", "ends", "ends+every_2", "ends+every_3"])
def test_every_stop_point_is_usable_in_the_tree(layout, window, name):
    policy = WindowPolicy.parse(name)
    c = core(layout, dev=24, swa_dev=24)
    assert c.components.windows[0].window_pages == window
    first, second = seq(*range(5)), seq(*range(11))          # a request, then one extending it
    insert(c, first, policy.keep_pages(len(first), P, window))
    kept = policy.keep_pages(len(second), P, window, cached_pages=5)
    insert(c, second, kept, cached=5)
    points = {5, *policy.stop_points(len(second), P, cached_pages=5)}
    for b in sorted(points):
        assert usable(c, second, b) == b, f"stop point {b} refused (kept {sorted(kept)})"
    if name == "ends":      # a window of pages 9..10 only: nothing between the two ends
        assert [usable(c, second, b) for b in range(6, 11)] == [5] * 5
