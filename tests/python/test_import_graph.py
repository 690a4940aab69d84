"""moe_cpu's import graph (module-level and in-function imports alike) has no cycle."""
import ast
import pathlib

import moe_cpu

PKG = pathlib.Path(moe_cpu.__file__).parent


def module_name(path):
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, name, modules):
    """The moe_cpu modules that `name` (file `path`) imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            # importing a.b.c imports the packages a and a.b first; the importer's own ancestors are no edge
            for up in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if up in modules and up != name and not name.startswith(up + "."):
                    found.add(up)
    return found


def test_import_graph_has_no_cycle():
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    graph = {m: imports(p, m, files) for m, p in files.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert "moe_cpu.layer" in graph and "moe_cpu.router" in graph["moe_cpu.layer"]
