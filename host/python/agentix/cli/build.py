"""``agentix build [PATH]``: bundle a project with the bundler (docs/CLI.md).

The bundler is a C++ binary (``bazel run //bundler -- build PATH`` in a
checkout). This command finds it (`find_bundler`), runs it with the user's
flags, lets its progress lines (``[bundler] stage: ...`` on stderr) through as
they come, and prints ``bundle ready → DIR`` on stderr and, with ``--json``,
the bundler's summary as one JSON document on stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["BUNDLER_ENV", "BundleError", "add_build_arguments", "bundle_project", "find_bundler", "run_build"]

BUNDLER_ENV = "AGENTIX_BUNDLER"
_NAMES = ("agentix-bundle",)
# Relative to a bazel-bin tree.
_BAZEL_PATH = "bundler/bundler"
_PLATFORMS = {"linux/amd64", "linux/x86-64", "linux/x86_64", "amd64", "x86-64", "x86_64"}


class BundleError(RuntimeError):
    """The bundler could not be found or failed; the message says why."""


def _package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def bundler_candidates() -> list[Path]:
    """Where the bundler is looked for, in order (after ``--bundler`` and
    ``$AGENTIX_BUNDLER``): ``agentix/bin/agentix-bundle`` beside the package,
    ``agentix-bundle`` on PATH, ``/usr/lib/agentix/agentix-bundle``, then
    ``bundler/bundler`` in a Bazel output tree (``$AGENTIX_BAZEL_BIN``, or the
    ``bazel-bin`` of the checkout holding this package or of the working
    directory and its parents)."""
    package = _package_dir()
    candidates = [package / "bin" / name for name in _NAMES]
    for name in _NAMES:
        on_path = shutil.which(name)
        if on_path:
            candidates.append(Path(on_path))
    candidates += [Path("/usr/lib/agentix") / name for name in _NAMES]
    trees = []
    if os.environ.get("AGENTIX_BAZEL_BIN"):
        trees.append(Path(os.environ["AGENTIX_BAZEL_BIN"]))
    trees += [parent / "bazel-bin" for parent in package.parents]
    cwd = Path.cwd()
    trees += [parent / "bazel-bin" for parent in (cwd, *cwd.parents)]
    candidates += [tree / _BAZEL_PATH for tree in trees]
    return candidates


def find_bundler(explicit: str | None = None) -> str:
    """The bundler binary: `explicit` (``--bundler``), else ``$AGENTIX_BUNDLER``,
    else the first of `bundler_candidates` that is executable. Raises
    `BundleError` saying what to do when there is none."""
    for source, value in (("--bundler", explicit), (f"${BUNDLER_ENV}", os.environ.get(BUNDLER_ENV))):
        if value:
            if os.path.isfile(value) and os.access(value, os.X_OK):
                return value
            raise BundleError(f"{source} is {value!r}, which is not an executable file")
    for candidate in bundler_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise BundleError(
        "the bundler (agentix-bundle) was not found: install the agentix Debian package, build it in a checkout "
        f"with `bazel build //bundler` (then run from the checkout), or point --bundler / ${BUNDLER_ENV} at it"
    )


def _inputs_beside(bundler: str) -> list[str]:
    """Flags for a bundler that has no Bazel runfiles (an installed one): the
    daemon, worker and agentix wheel it bundles, from beside it or PATH."""
    if Path(bundler + ".runfiles").is_dir():
        return []
    here = Path(bundler).resolve().parent
    flags: list[str] = []
    for flag, name in (("--sandboxd", "agentix-sandboxd"), ("--worker", "agentix-worker")):
        found = str(here / name) if (here / name).is_file() else shutil.which(name)
        if found:
            flags.append(f"{flag}={found}")
    wheel = os.environ.get("AGENTIX_WHEEL")
    if not wheel:
        wheels = sorted([*here.glob("agentix-*.whl"), *(here.parent / "share" / "agentix").glob("agentix-*.whl")])
        wheel = str(wheels[-1]) if wheels else ""
    if wheel:
        flags.append(f"--wheel={wheel}")
    return flags


def add_build_arguments(parser: Any) -> None:
    """The flags `agentix build` and `agentix run` share."""
    parser.add_argument("-n", "--name", default=None, help="bundle NAME or NAME:TAG (default: [project].name "
                        "without an 'agentix-' prefix, and [project].version or 'latest')")
    parser.add_argument("-o", "--output", default=None, help="output directory (default: PATH/dist/agentix-bundle)")
    parser.add_argument("--wheelhouse", action="append", default=[], metavar="DIR",
                        help="a directory of wheels pip may install from (repeatable)")
    parser.add_argument("--wire", choices=["grpc", "socketio"], default=None,
                        help="the wire the bundle serves by default (default: grpc)")
    parser.add_argument("--bundler", default=None,
                        help=f"the bundler binary (default: ${BUNDLER_ENV}, else found as docs/CLI.md says)")


def bundle_project(
    project: str, *, name: str | None = None, output: str | None = None, wheelhouses: Sequence[str] = (),
    wire: str | None = None, bundler: str | None = None, progress: IO[str] | None = None,
) -> dict[str, str]:
    """Runs the bundler on `project`; returns its summary (``tree``,
    ``tarball``, ``sha256``, ``digest``, ``oci``, and ``output``: the bundle
    directory). Its progress lines go to `progress` (default: our stderr) as
    they come. Raises `BundleError` when the project is no project or the
    bundler fails."""
    directory = Path(project).resolve()
    if not (directory / "pyproject.toml").is_file():
        raise BundleError(f"{project} is not a project: it has no pyproject.toml")
    binary = find_bundler(bundler)
    argv = [binary, "build", str(directory)]
    out_dir = Path(output).resolve() if output else directory / "dist" / "agentix-bundle"
    argv.append(f"--output={out_dir}")
    if name:
        argv.append(f"--name={name}")
    argv += [f"--wheelhouse={Path(w).resolve()}" for w in wheelhouses]
    if wire:
        argv.append(f"--wire={wire}")
    argv += _inputs_beside(binary)
    sink = progress if progress is not None else sys.stderr
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    assert process.stdout is not None and process.stderr is not None
    tail: list[str] = []
    for line in process.stderr:  # the bundler's progress, live
        sink.write(line)
        sink.flush()
        tail = [*tail[-20:], line.rstrip("\n")]
    summary_text = process.stdout.read()
    code = process.wait()
    if code != 0:
        errors = [line for line in tail if "error" in line] or tail[-3:]
        raise BundleError(f"the bundler failed (exit {code}): " + ("; ".join(errors) or "no output"))
    summary = {}
    for line in summary_text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            summary[key.strip()] = value.strip()
    summary["output"] = str(out_dir)
    return summary


def run_build(args: Any, out: IO[str]) -> int:
    """``agentix build``: exit 0 with the bundle built, 1 when it failed."""
    if args.platform and args.platform.lower() not in _PLATFORMS:
        print(f"agentix: --platform {args.platform}: bundles are built for linux/amd64 only", file=sys.stderr)
        return 2
    if args.dry_run:
        directory = Path(args.path).resolve()
        plan = {
            "project": str(directory),
            "pyproject": (directory / "pyproject.toml").is_file(),
            "output": str(Path(args.output).resolve() if args.output else directory / "dist" / "agentix-bundle"),
            "bundler": find_bundler(args.bundler),
            "platform": "linux/amd64",
        }
        if args.json:
            print(json.dumps(plan, indent=2, sort_keys=True), file=out)
        else:
            for key, value in plan.items():
                print(f"{key}: {value}", file=out)
        return 0 if plan["pyproject"] else 1
    summary = bundle_project(
        args.path, name=args.name, output=args.output, wheelhouses=args.wheelhouse, wire=args.wire,
        bundler=args.bundler,
    )
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True), file=out)
    else:
        for key in ("tree", "tarball", "sha256", "digest", "oci"):
            if key in summary:
                print(f"{key}: {summary[key]}", file=out)
    print(f"bundle ready → {summary['output']}", file=sys.stderr)
    return 0
