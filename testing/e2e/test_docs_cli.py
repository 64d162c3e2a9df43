"""The `agentix` commands and flags the docs name exist (issue 23, "docs that
are true"): every ``agentix ...`` in inline code or a code block of the
README files and docs/*.md is read as a command path (``agentix sandbox ls``,
``agentix pool create|ls|rm``) and its flags; each path must answer
``--help`` with exit 0 and list every flag the docs give it. A renamed or
dropped subcommand or flag fails here instead of rotting in the docs.
"""

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

from conftest import REPO

AGENTIX = [str(Path(sys.prefix) / "bin" / "python"), "-m", "agentix"]
DOCS = [REPO / "README.md", REPO / "host" / "python" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_INVOCATION = re.compile(r"(?<![\w./-])agentix(?= )")
_FLAG = re.compile(r"^-{1,2}[a-zA-Z][\w-]*$")
# What ends an invocation inside a span or line.
_STOP = {";", "&&", "||", "#", ">", "2>", "|&"}


@cache
def help_text(path: tuple[str, ...]) -> str:
    done = subprocess.run([*AGENTIX, *path, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"`agentix {' '.join(path)} --help` failed: {done.stderr}"
    return done.stdout


def subcommands(path: tuple[str, ...]) -> set[str]:
    """The subcommands `agentix PATH --help` offers (its usage's {a,b,...})."""
    usage = help_text(path).split("\n\n", 1)[0]
    choices = re.search(r"\{([\w,-]+)\}", usage)
    return set(choices.group(1).split(",")) if choices else set()


def snippets(text: str) -> list[str]:
    """Inline code spans and code-block lines (comments dropped)."""
    found = []
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            found.append(re.split(r"\s#\s", line, maxsplit=1)[0])
        else:
            found.extend(re.findall(r"`([^`]+)`", line.replace("\\|", "|")))
    return found


def flags_of(token: str) -> list[str]:
    """`[-n/--name` -> ['-n', '--name']; `--kw NAME=VALUE]...` -> ['--kw']."""
    token = token.strip("[]().,…").removesuffix("...").strip("[]")
    token = token.split("=", 1)[0]
    return [part for part in token.split("/") if _FLAG.match(part)]


def invocations(snippet: str):
    """(paths, flags, problem) for each `agentix ...` in `snippet`: paths are
    the command paths named (several for `ls|get`), flags what follows them."""
    for start in _INVOCATION.finditer(snippet):
        if snippet[:start.start()].endswith(("from ", "import ")):
            continue  # Python: `from agentix import ...`
        paths: list[tuple[str, ...]] = [()]
        flags: list[str] = []
        resolving = True
        for raw in snippet[start.end():].split():
            if raw in _STOP:
                break
            token = raw.rstrip(",;")
            if token == "|":  # `get ID | rm ID...`: the next word is a sibling command
                yield paths, flags, None
                paths, flags, resolving = [path[:-1] for path in paths], [], True
                continue
            if token.startswith(("-", "[-")):
                flags.extend(flags_of(token))
            elif resolving:
                choices = subcommands(paths[0])
                words = [word for word in token.split("|") if word]
                if choices and words and all(word in choices for word in words):
                    paths = [(*path, word) for path in paths for word in words]
                else:
                    if choices and words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
                        yield paths, flags, f"unknown command {token!r} after `agentix {' '.join(paths[0])}`"
                    resolving = False
            if raw != token:  # `agentix --version; agentix ...`: a list goes on after , or ;
                break
        yield paths, flags, None


def test_every_agentix_command_and_flag_the_docs_name_exists():
    problems = []
    named: set[tuple[str, ...]] = set()
    for doc in DOCS:
        for snippet in snippets(doc.read_text()):
            for paths, flags, problem in invocations(snippet):
                where = f"{doc.relative_to(REPO)}: `{snippet.strip()}`"
                if problem:
                    problems.append(f"{where}: {problem}")
                    continue
                for flag in flags:
                    pattern = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
                    if not any(pattern.search(help_text(path)) for path in paths):
                        problems.append(f"{where}: {flag} is not an option of "
                                        + " / ".join(f"`agentix {' '.join(p)}`" for p in paths))
                named.update(paths)
    assert not problems, "\n".join(problems)
    # The walk did read the docs' commands (a broken parser would see none).
    assert {("build",), ("run",), ("doctor",), ("sandbox", "ls"), ("sandbox", "wait"), ("pool", "create")} <= named
