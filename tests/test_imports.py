"""The import graph of specviz/ (read from the source, nothing imported): no
cycles among module-level imports, and none through imports hidden inside
functions either, but for edges listed in DEFERRED with the reason they are
still there (none since 2026-11-23). A new cycle, or an import moved into a function to dodge one,
fails here."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "specviz"

# function-level imports that still close a cycle (importer, imported), each with its reason: none left
DEFERRED: set[tuple[str, str]] = set()


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def _targets(mods, mod: str, is_pkg: bool, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    base = mod.split(".")
    if node.level:
        base = base if is_pkg else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = node.module
    subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in mods]
    # `from . import x` of submodules only: no edge to the package itself (already importing)
    found = subs if len(subs) == len(node.names) else [name] + subs
    return [t for t in found if t in mods]


def _skipped(tree) -> set[int]:
    """Imports under `if TYPE_CHECKING:` or `if __name__ == "__main__":` (never run on import)."""
    skip = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.unparse(node.test)
                                         or "__main__" in ast.unparse(node.test)):
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, edges including imports inside functions)."""
    mods = modules()
    top, inner = {m: set() for m in mods}, {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text())
        skip = _skipped(tree)
        in_func = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                found = set(_targets(mods, mod, is_pkg, node)) - {mod}
                (inner if id(node) in in_func else top)[mod] |= found
        if mod == "specviz.engine.proposers":  # imports every module in its folder (importlib)
            top[mod] |= {m for m in mods if m.startswith(mod + ".")}
    return top, {m: top[m] | inner[m] for m in mods}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_module_level_cycles():
    top, _ = graph()
    assert cycles(top) == []


def test_no_cycles_through_imports_inside_functions():
    _, full = graph()
    for a, b in DEFERRED:
        full[a].discard(b)
    assert cycles(full) == []


def test_deferred_edges_still_exist():
    """A DEFERRED edge that is gone must leave the list (it would hide a new one)."""
    _, full = graph()
    assert [e for e in DEFERRED if e[1] not in full[e[0]]] == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# Folders from the bottom up: a module may import from its own folder or one below it, never above
# (README "How it fits together"). The top-level utilities (errors, paths, ...) are the floor.
LAYERS = ["specviz", "specviz.engine.cpu", "specviz.engine.gpu", "specviz.engine.backends", "specviz.engine",
          "specviz.engine.trained", "specviz.engine.proposers", "specviz.calibration",
          "specviz.models", "specviz.hosting", "specviz.run", "specviz.ui", "specviz.bench", "specviz.heads",
          "specviz.cli"]
ENTRY = {"specviz", "specviz.__main__"}  # `python -m specviz`: the CLI's door, above everything


def folder(mod: str, mods) -> str:
    return mod if mods[mod][1] else mod.rsplit(".", 1)[0]


def back_arrows() -> list[str]:
    mods = modules()
    _, full = graph()
    rank = {f: i for i, f in enumerate(LAYERS)}
    out = []
    for a, targets in full.items():
        if a in ENTRY:
            continue
        for b in targets:
            fa, fb = folder(a, mods), folder(b, mods)
            if rank[fb] > rank[fa]:
                out.append(f"{a} -> {b}")
    return sorted(out)


def test_no_back_arrows_between_folders():
    assert back_arrows() == []


def test_every_folder_has_a_layer():
    mods = modules()
    assert {folder(m, mods) for m in mods} <= set(LAYERS)


def test_a_small_top_level_and_engine():
    """At most 6 loose modules at specviz/'s top level, at most 20 files in engine/'s."""
    loose = [p for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(loose) <= 6, sorted(p.name for p in loose)
    assert len(list((ROOT / "engine").glob("*.py"))) <= 20
