"""examples/gc_pauses.py: the collector's pauses are timed, and a settled heap is frozen until unsettled."""
import gc

from examples import gc_pauses


def test_a_full_collection_is_timed_and_counted():
    gc.disable()                              # no collection of its own while the garbage is made
    try:
        before, passes = gc_pauses.spent(), gc_pauses.full_passes()
        garbage = [[i] for i in range(20_000)]
        for a, b in zip(garbage, garbage[1:]):    # cycles only the collector can free
            a.append(b)
            b.append(a)
        del garbage, a, b
        assert gc.collect() > 0
    finally:
        gc.enable()
    assert gc_pauses.full_passes() == passes + 1
    assert gc_pauses.spent() > before


def test_settle_freezes_what_is_alive_and_unsettle_thaws_it():
    alive = [object() for _ in range(1000)]
    try:
        frozen = gc_pauses.settle()
        assert frozen >= len(alive) and gc.get_freeze_count() == frozen
    finally:
        gc_pauses.unsettle()
    assert gc.get_freeze_count() == 0
