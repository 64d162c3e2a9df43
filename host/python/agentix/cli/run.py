"""``agentix run PATH module:function [ARGS...]``: one call in a fresh local sandbox.

Bundles PATH when its bundle is missing or older than the project's sources
(``.py`` files and ``pyproject.toml``, outside ``dist/``), starts a sandbox
from it with `LocalProvider` (bubblewrap), calls ``module:function`` with
ARGS, prints the result on stdout, and deletes the sandbox. What the sandbox
logs or prints while the call runs is shown on stderr (``--json``: in the
document's ``"logs"``). Each ARG is read as JSON when it parses
(``3``, ``'"text"'``, ``'[1, 2]'``, ``'{"a": 1}'``), else taken as a string;
``--kw NAME=VALUE`` passes a keyword argument the same way. The host does not
import the module: the call goes by name. Exit status: 0, 1 when the call
raised (its type, message and the sandbox's traceback on stderr) or the
sandbox could not be made, 2 for bad arguments.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from agentix.cli.build import BundleError, bundle_project

__all__ = ["bundle_is_current", "named_target", "parse_value", "run_command"]

_SKIP_DIRS = {"dist", "build", ".git", "__pycache__", ".venv", "venv", "node_modules"}


def parse_value(text: str) -> Any:
    """An ARG: JSON when it parses, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def named_target(spec: str) -> Callable[..., Any]:
    """A stand-in for ``module:function`` that encodes as that name, so the
    host needs neither the module nor its dependencies. `ValueError` for a
    spec that is not ``module:function`` with dotted identifiers."""
    module, sep, qualname = spec.replace("::", ":").partition(":")
    parts = [*module.split("."), *qualname.split(".")]
    if not sep or not module or not qualname or not all(part.isidentifier() for part in parts):
        raise ValueError(f"expected module:function (e.g. hello_agentix.tools:add), got {spec!r}")

    def target(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{spec} runs in the sandbox only")

    target.__module__ = module
    target.__qualname__ = qualname
    target.__name__ = qualname.rsplit(".", 1)[-1]
    return target


def bundle_is_current(project: Path, bundle: Path) -> bool:
    """True when `bundle` has a manifest newer than every source of `project`."""
    manifest = bundle / "manifest.json"
    if not manifest.is_file() or not (bundle / "nix" / "runtime" / "bootstrap.sh").is_file():
        return False
    built = manifest.stat().st_mtime
    for path in _sources(project):
        if path.stat().st_mtime > built:
            return False
    return True


def _sources(project: Path):
    yield project / "pyproject.toml"
    stack = [project]
    while stack:
        directory = stack.pop()
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                if entry.name not in _SKIP_DIRS and not entry.name.startswith("."):
                    stack.append(entry)
            elif entry.suffix == ".py":
                yield entry


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


async def _call(args: Any, bundle: Path, target: Callable[..., Any], call_args: list[Any],
                call_kwargs: dict[str, Any]) -> tuple[Any, BaseException | None, float]:
    from agentix.provider.base import SandboxConfig
    from agentix.provider.local import LocalProvider

    provider = LocalProvider()
    try:
        async with provider.session(SandboxConfig(image=args.image, bundle=str(bundle))) as sandbox:
            started = time.perf_counter()
            try:
                sandbox.call_deadline = args.timeout
                value = await sandbox.remote(target, *call_args, **call_kwargs)
                return value, None, time.perf_counter() - started
            except Exception as error:  # reported by the caller
                return None, error, time.perf_counter() - started
    finally:
        await provider.aclose()


def run_command(args: Any, out: IO[str]) -> int:
    """``agentix run``; see the module docstring."""
    from agentix import RemoteCallError
    from agentix.utils.log import configure_logging

    try:
        target = named_target(args.target)
    except ValueError as bad:
        print(f"agentix: {bad}", file=sys.stderr)
        return 2
    call_args = [parse_value(text) for text in args.args]
    call_kwargs: dict[str, Any] = {}
    for item in args.kw:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            print(f"agentix: --kw expects NAME=VALUE (got {item!r})", file=sys.stderr)
            return 2
        call_kwargs[key] = parse_value(value)
    project = Path(args.path).resolve()
    bundle = Path(args.output).resolve() if args.output else project / "dist" / "agentix-bundle"
    if args.rebuild or not bundle_is_current(project, bundle):
        print(f"agentix: bundling {project} (its bundle is missing or older than its sources)", file=sys.stderr)
        summary = bundle_project(
            str(project), name=args.name, output=str(bundle), wheelhouses=args.wheelhouse, wire=args.wire,
            bundler=args.bundler,
        )
        bundle = Path(summary["output"])
    collected = _Collect()
    if args.json:
        logging.getLogger().addHandler(collected)
        logging.getLogger().setLevel(logging.INFO)
    else:
        configure_logging()  # the sandbox's records and output, on stderr as they come
    value, error, seconds = asyncio.run(_call(args, bundle, target, call_args, call_kwargs))
    if args.json:
        document: dict[str, Any] = {"target": args.target, "bundle": str(bundle), "seconds": round(seconds, 6),
                                    "logs": [r for r in collected.records if r["logger"].startswith("agentix.sandbox")
                                             or not r["logger"].startswith("agentix")]}
        if error is None:
            document["result"] = value if _jsonable(value) else repr(value)
        else:
            document["error"] = _error_dict(error)
        print(json.dumps(document, indent=2, sort_keys=True), file=out)
    elif error is None:
        print(_show(value), file=out)
    if error is not None:
        if not args.json:
            if isinstance(error, RemoteCallError):
                print(f"agentix: {args.target} raised {error.error.type}: {error.error.message}", file=sys.stderr)
                if error.error.traceback:
                    print(error.error.traceback.rstrip("\n"), file=sys.stderr)
            else:
                print(f"agentix: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _error_dict(error: BaseException) -> dict[str, Any]:
    from agentix import RemoteCallError

    if isinstance(error, RemoteCallError):
        return {"type": error.error.type, "message": error.error.message, "traceback": error.error.traceback}
    return {"type": type(error).__name__, "message": str(error)}


def add_run_arguments(parser: Any) -> None:
    parser.add_argument("--image", default="host",
                        help="the sandbox's root: 'host' (this machine's, read-only) or a directory (default: host)")
    parser.add_argument("--kw", action="append", default=[], metavar="NAME=VALUE",
                        help="a keyword argument (VALUE read as JSON when it parses); repeatable")
    parser.add_argument("--rebuild", action="store_true", help="bundle again even if the bundle is current")
    parser.add_argument("--timeout", type=float, default=None, help="seconds the call may take (default: no limit)")


__all__ += ["add_run_arguments", "BundleError"]
