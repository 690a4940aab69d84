"""The C++ sources' #include graph (cpp/, bindings/, tests/cpp/) has no cycle."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
DIRS = ("cpp/src", "cpp/include", "bindings", "tests/cpp")


def headers_by_path():
    files = [p for d in DIRS for p in (ROOT / d).rglob("*") if p.suffix in (".h", ".cpp", ".hpp")]
    return files


def resolve(src, name):
    for base in (src.parent, ROOT / "cpp/src", ROOT / "cpp/include", ROOT / "bindings"):
        cand = (base / name).resolve()
        if cand.is_file():
            return cand
    return None


def include_graph():
    graph = {}
    for f in headers_by_path():
        targets = {resolve(f, n) for n in INCLUDE.findall(f.read_text())}
        graph[f.resolve()] = {t for t in targets if t is not None}
    return graph


def find_cycle(graph):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_include_graph_has_no_cycle():
    graph = include_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the walk sees the real tree
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(str(p.relative_to(ROOT)) for p in cycle)


def test_cycle_finder_sees_a_cycle():
    a, b, c = (pathlib.Path(x) for x in "abc")
    assert find_cycle({a: {b}, b: {c}, c: {a}}) == [a, b, c, a]
    assert find_cycle({a: {b}, b: {c}, c: set()}) is None
