"""examples/program_runs.py: a program label counts once, the first time it runs; the program still runs."""
from examples import program_runs


class HookHolder:
    hook = None

    def on_program_call(self, hook):
        self.hook = hook


def test_a_label_counts_the_first_time_it_runs_only():
    cache = HookHolder()
    program_runs.watch(cache)
    before = program_runs.first_runs()
    calls = []
    program = lambda *args: calls.append(args) or len(calls)
    assert cache.hook("test:a[1]", program, 1, 2) == 1
    assert cache.hook("test:a[1]", program, 3) == 2
    assert cache.hook("test:a[2]", program) == 3
    assert program_runs.first_runs() == before + 2 and calls == [(1, 2), (3,), ()]
