"""docs/ARCHITECTURE.md walks a call, a log record and a span through the
code, naming each file: this keeps it from naming files or code that no
longer exist (it rotted once already, when the worker was split)."""

import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"

_SOURCE = re.compile(r"\.(py|cc|h|md|proto|bazel|bzl|toml)$")
_PATH = re.compile(r"^[\w.+-]+(/[\w.+-]*)*$")
# Code names: `Name`, `name()`, `Class.method()`, `Class::Method`, `NAME`.
_SYMBOL = re.compile(r"^_?[A-Za-z]\w*((::|\.)_?[A-Za-z]\w*)*(\(\))?$")


def _backticked(text):
    return re.findall(r"`([^`\n]+)`", text)


def _repo_files():
    """Every file of the tree, less Bazel's output links and virtualenvs."""
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(("bazel-", ".")) and d != "node_modules"]
        for name in files:
            yield pathlib.Path(top, name)


def _paths(tokens):
    return [t for t in tokens if _PATH.match(t) and ("/" in t or _SOURCE.search(t))]


def test_every_path_the_architecture_page_names_exists():
    tokens = _backticked(DOC.read_text())
    paths = _paths(tokens)
    assert len(paths) > 50, "the page should name the files it walks through"
    basenames = {p.name for p in _repo_files()}
    missing = []
    for path in paths:
        if "/" in path:
            # From the repository root, as the page says.
            if not (ROOT / path).exists():
                missing.append(path)
        elif path not in basenames:
            missing.append(path)
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_every_function_and_class_the_walk_names_is_in_a_file_it_names():
    # The walk-through; the design notes after it also name former names.
    text = DOC.read_text().split("\n## Design decisions")[0]
    tokens = _backticked(text)
    named = [ROOT / p for p in _paths(tokens) if "/" in p and (ROOT / p).is_file()]
    corpus = "\n".join(p.read_text(errors="replace") for p in named)
    words = set(re.findall(r"\w+", corpus))
    absent = []
    for token in tokens:
        if not _SYMBOL.match(token) or _PATH.match(token) and _SOURCE.search(token):
            continue
        # The last part must be defined or used in a named file: a renamed
        # function or class leaves the page pointing at nothing.
        name = re.split(r"::|\.", token.removesuffix("()"))[-1]
        if name not in words:
            absent.append(token)
    assert not absent, (
        "docs/ARCHITECTURE.md names code found in none of the files it names "
        f"(renamed or moved?): {absent}")
