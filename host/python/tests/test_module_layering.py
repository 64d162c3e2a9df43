"""The host runtime's modules import each other in one direction and use
only each other's public names (docs/ARCHITECTURE.md, "Design decisions"),
and none grows past the size a reader can take in."""

from __future__ import annotations

import ast
import pathlib

import agentix.runtime

RUNTIME = pathlib.Path(agentix.runtime.__file__).parent
# About the size of a module one reads in a sitting (issue 21).
MAX_LINES = 700


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue  # generated
        parts = path.relative_to(RUNTIME.parent.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``import`` / ``from ... import`` in `path`,
    wherever it is (also in functions and under TYPE_CHECKING)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def test_the_client_package_has_no_import_cycle():
    modules = _modules()
    client = {name for name in modules if name.startswith("agentix.runtime.client.")}
    edges: dict[str, set[str]] = {name: set() for name in client}
    for name in client:
        for module, names in _imports(modules[name]):
            targets = [module] + [f"{module}.{n}" for n in names]
            edges[name].update(t for t in targets if t in client and t != name)

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for nxt in sorted(edges[name]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[name] = 2

    for name in sorted(client):
        if name not in state:
            visit(name)


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    # A package's own private submodules are its business, not a reach.
    submodules = set(modules) | {"agentix.runtime.client._native_calls"}
    reaches = []
    for name, path in modules.items():
        for module, names in _imports(path):
            if module.startswith("agentix.") and module != name:
                reaches += [
                    f"{name} imports {module}.{n}"
                    for n in names
                    if n.startswith("_") and f"{module}.{n}" not in submodules
                ]
    assert reaches == []


def test_the_facade_does_not_know_the_client():
    facade = _modules()["agentix.runtime.client._sio_facade"]
    imported = {module for module, _ in _imports(facade)}
    assert not {m for m in imported if m.startswith("agentix.runtime.client")}, imported
    assert "._emit_namespace_event" not in facade.read_text()


def test_no_runtime_source_file_is_over_700_lines():
    long = {str(path.relative_to(RUNTIME)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_host_cuts_arguments_to_the_daemons_chunk_size():
    """One chunk size per language, and the two agree: the daemon refuses
    ArgumentChunks over ``ipc::kChunkBytes`` (worker/ipc/chunking.h)."""
    import re

    from agentix.runtime.client import chunking, stream

    header = pathlib.Path(__file__).resolve().parents[3] / "worker" / "ipc" / "chunking.h"
    match = re.search(r"kChunkBytes = ([0-9u *]+);", header.read_text())
    assert match is not None, "kChunkBytes not found in worker/ipc/chunking.h"
    value = 1
    for factor in match.group(1).replace("u", "").split("*"):
        value *= int(factor)
    assert chunking.CHUNK_BYTES == value
    assert stream.CHUNK_BYTES is chunking.CHUNK_BYTES
