"""The tree core's modules import each other one way: a graph without cycles, whose leaves
are the vocabulary (states, components) and whose root is the coordinator."""
import pathlib
import re

TREE = pathlib.Path(__file__).resolve().parents[2] / "hicache_jax" / "tree"


def imports() -> dict[str, set[str]]:
    mods = {p.stem: p for p in TREE.glob("*.py") if p.stem != "__init__"}
    return {m: set(re.findall(r"from hicache_jax\.tree\.(\w+) import", p.read_text())) for m, p in mods.items()}


def test_tree_modules_import_each_other_without_cycles():
    deps = imports()
    done: set[str] = set()

    def visit(m, path):
        assert m not in path, f"import cycle: {' -> '.join(path + [m])}"
        if m not in done:
            for d in deps[m]:
                visit(d, path + [m])
            done.add(m)

    for m in deps:
        visit(m, [])
    assert not deps["state"] and not deps["components"]           # the vocabulary depends on nothing
    assert not any("core" in d for m, d in deps.items() if m != "core")   # nothing reaches back to the coordinator


def test_no_tree_module_is_over_300_lines():
    long = {p.name: n for p in TREE.glob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long
