"""The ``agentix`` command (also ``python -m agentix``): bundles, one-off
calls, a check of the machine, and the sandboxes and warm pools of the
provider service, ``agentix-providerd`` (docs/CLI.md).

    agentix build [PATH] [-n NAME[:TAG]] [-o DIR] [--wheelhouse DIR]... [--wire W] [--bundler B] [--dry-run]
    agentix run PATH module:function [ARG...] [--kw NAME=VALUE]... [--image I] [--rebuild] [--timeout S]
    agentix doctor
    agentix --version
    agentix sandbox ls [-l SELECTOR] [--all] [--phase PHASE]
    agentix sandbox get ID
    agentix sandbox rm ID... [--grace S] [--missing-ok]
    agentix sandbox logs ID [-f] [--offset N]
    agentix sandbox wait ID [--until PHASE] [--timeout S]
    agentix pool create NAME --bundle B [--image I] --min-ready N [--max-total N] ...
    agentix pool ls
    agentix pool rm NAME [--missing-ok]

Every command takes ``--url`` (else ``$AGENTIX_PROVIDER_URL``, else the
per-user default socket), ``--token`` (else ``$AGENTIX_PROVIDER_TOKEN``) and
``--json`` (one JSON document on stdout, for scripts; field names are the
proto's). Errors go to stderr as ``agentix: REASON (CODE): message`` with
exit status 1 (with ``--json``, also ``{"error": {...}}`` on stdout); a
``wait`` that does not reach its phase exits 1 too. Uses argparse only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["main"]

_PHASES = ["pending", "starting", "ready", "terminating", "terminated"]


def _common() -> argparse.ArgumentParser:
    # Accepted before and after the subcommand (SUPPRESS keeps a later
    # parser from resetting what an earlier one read).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help="the provider service (default: $AGENTIX_PROVIDER_URL, else the per-user socket)")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="the provider service's bearer token (default: $AGENTIX_PROVIDER_TOKEN)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON document (for scripts)")
    return common


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (got {text!r})")
    return key, value


def _parser() -> argparse.ArgumentParser:
    common = _common()
    from agentix import __version__
    from agentix.cli.build import add_build_arguments
    from agentix.cli.run import add_run_arguments

    parser = argparse.ArgumentParser(
        prog="agentix", parents=[common],
        description="Bundle Python projects, run their functions in sandboxes, check this machine, and manage "
                    "the sandboxes and warm pools of agentix-providerd.",
    )
    parser.add_argument("--version", action="version", version=f"agentix {__version__}")
    areas = parser.add_subparsers(dest="area", metavar="{build,run,doctor,sandbox,pool}", required=True)

    build = areas.add_parser(
        "build", parents=[common], help="bundle a project (the bundler's progress on stderr)",
        description="Turns the Python project in PATH into a self-contained sandbox bundle (docs/BUNDLE.md).",
    )
    build.add_argument("path", nargs="?", default=".", help="the project directory, holding pyproject.toml "
                       "(default: .)")
    add_build_arguments(build)
    build.add_argument("--platform", default=None, help="linux/amd64, the only one (others are refused)")
    build.add_argument("--dry-run", action="store_true", help="print what would be built, with which bundler")

    run = areas.add_parser(
        "run", parents=[common], help="bundle if needed, call module:function in a fresh local sandbox",
        description="Bundles PATH if its bundle is missing or older than its sources, starts a bubblewrap "
                    "sandbox from it (LocalProvider), calls module:function with ARGs (each read as JSON when "
                    "it parses, else a string), prints the result and the sandbox's logs, and deletes it.",
    )
    run.add_argument("path", help="the project directory")
    run.add_argument("target", metavar="module:function", help="e.g. hello_agentix.tools:add")
    run.add_argument("args", nargs="*", default=[], metavar="ARG", help="positional arguments (none or more)")
    add_build_arguments(run)
    add_run_arguments(run)

    areas.add_parser(
        "doctor", parents=[common], help="check bubblewrap, namespaces, cgroups, engines, versions, binaries",
        description="Checks what bundling and running sandboxes need on this machine; each failing check says "
                    "what to do. Exit status 1 when a required check fails.",
    )

    sandbox = areas.add_parser("sandbox", parents=[common], help="list, inspect, wait for and delete sandboxes")
    verbs = sandbox.add_subparsers(dest="verb", metavar="{ls,get,rm,logs,wait}", required=True)
    ls = verbs.add_parser("ls", parents=[common], help="list sandboxes")
    ls.add_argument("-l", "--selector", default="", help="label selector, e.g. 'team=a,job in (1,2),!debug'")
    ls.add_argument("-a", "--all", action="store_true", help="include terminated sandboxes (kept 1 h)")
    ls.add_argument("--phase", action="append", choices=_PHASES, default=[], help="only these phases (repeatable)")
    get = verbs.add_parser("get", parents=[common], help="show one sandbox")
    get.add_argument("id")
    rm = verbs.add_parser("rm", parents=[common], help="delete sandboxes (waits until they are gone)")
    rm.add_argument("ids", nargs="+", metavar="id")
    rm.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL (default 2)")
    rm.add_argument("--missing-ok", action="store_true", help="an unknown id is not an error")
    logs = verbs.add_parser("logs", parents=[common], help="print a sandbox's output")
    logs.add_argument("id")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the sandbox ends")
    logs.add_argument("--offset", type=int, default=0, help="start at this byte offset")
    wait = verbs.add_parser("wait", parents=[common], help="wait until a sandbox reaches a phase")
    wait.add_argument("id")
    wait.add_argument("--until", choices=_PHASES, default="ready", help="the phase (default: ready)")
    wait.add_argument("--timeout", type=float, default=None, help="seconds (default: no limit)")

    pool = areas.add_parser("pool", parents=[common], help="create, list and delete warm pools")
    pverbs = pool.add_subparsers(dest="verb", metavar="{create,ls,rm}", required=True)
    create = pverbs.add_parser("create", parents=[common], help="create a warm pool")
    create.add_argument("name")
    create.add_argument("--bundle", required=True, help="the bundle (a path on providerd's machine)")
    create.add_argument("--image", default="host", help="the image (default: host)")
    create.add_argument("--platform", default=None)
    create.add_argument("--backend", default=None, help="the backend (default: the server's)")
    create.add_argument("--cpu", type=float, default=None, help="CPUs per member")
    create.add_argument("--memory", default=None, help="memory per member, e.g. 512m")
    create.add_argument("--min-ready", type=int, required=True, help="ready members to keep")
    create.add_argument("--max-total", type=int, default=0, help="live members at most (default: min-ready)")
    create.add_argument("--max-creating", type=int, default=0, help="members starting at once (default: 4)")
    create.add_argument("--member-max-age", type=float, default=None, help="recycle idle members older than this (s)")
    create.add_argument("--label", action="append", type=_key_value, default=[], metavar="K=V")
    create.add_argument("--strategy", choices=["recreate", "on_replenish"], default=None,
                        help="what happens to members when the template changes")
    pverbs.add_parser("ls", parents=[common], help="list warm pools")
    prm = pverbs.add_parser("rm", parents=[common], help="delete a warm pool and its unclaimed members")
    prm.add_argument("name")
    prm.add_argument("--missing-ok", action="store_true", help="an unknown pool is not an error")
    return parser


# ------------------------------------------------------------------ output

def _dict(message: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _ago(timestamp: Any, now: float) -> str:
    if not timestamp.seconds:
        return "-"
    return _span(now - timestamp.seconds)


def _span(seconds: float) -> str:
    """``"45s"``, ``"3m20s"``, ``"2h5m"``, ``"1d3h"`` (``-`` before a past time)."""
    sign = "-" if seconds < 0 else ""
    whole = abs(int(seconds))
    if whole >= 86400:
        return f"{sign}{whole // 86400}d{whole % 86400 // 3600}h"
    if whole >= 3600:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60}m"
    if whole >= 60:
        return f"{sign}{whole // 60}m{whole % 60}s"
    return f"{sign}{whole}s"


def _expires(status: Any, now: float) -> str:
    from agentix.provider.v1 import provider_pb2 as pb

    if status.phase == pb.SandboxStatus.TERMINATED or not status.expire_time.seconds:
        return "-"
    return "in " + _span(status.expire_time.seconds - now)


def _table(rows: list[list[str]], out: IO[str]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)


def _sandbox_rows(records: Sequence[Any], now: float) -> list[list[str]]:
    from agentix.provider.v1 import provider_pb2 as pb

    rows = [["ID", "PHASE", "LAUNCH", "AGE", "EXPIRES", "POOL", "LABELS"]]
    for record in records:
        status = record.status
        phase = pb.SandboxStatus.Phase.Name(status.phase)
        if status.phase == pb.SandboxStatus.TERMINATED and status.exit.reason:
            phase += f" ({pb.Exit.Reason.Name(status.exit.reason)})"
        launch = pb.SandboxStatus.Launch.Name(status.launch) if status.launch else "-"
        expires = _expires(status, now)
        labels = ",".join(f"{k}={v}" for k, v in sorted(record.labels.items())) or "-"
        rows.append([record.id, phase, launch, _ago(status.create_time, now), expires, record.pool or "-", labels])
    return rows


def _print_sandbox(record: Any, out: IO[str]) -> None:
    from agentix.provider.v1 import provider_pb2 as pb

    status = record.status
    now = time.time()
    lines = [
        ("id", record.id),
        ("phase", pb.SandboxStatus.Phase.Name(status.phase)),
        ("launch", pb.SandboxStatus.Launch.Name(status.launch)),
        ("endpoint", status.endpoint.target or "-"),
        ("backend", record.spec.backend or "(default)"),
        ("image", record.spec.image),
        ("bundle", record.spec.bundle.path or record.spec.bundle.oci_reference),
        ("pool", record.pool or "-"),
        ("age", _ago(status.create_time, now)),
        ("expires", _expires(status, now)),
        ("labels", ",".join(f"{k}={v}" for k, v in sorted(record.labels.items())) or "-"),
        ("request_id", record.request_id),
        ("resource_version", str(record.resource_version)),
    ]
    if status.phase == pb.SandboxStatus.TERMINATED:
        lines.append(("exit", f"{pb.Exit.Reason.Name(status.exit.reason)} (code {status.exit.exit_code})"))
        if status.exit.message:
            lines.append(("exit message", status.exit.message))
    width = max(len(key) for key, _ in lines)
    for key, value in lines:
        print(f"{key + ':':<{width + 1}} {value}", file=out)
    if status.exit.log_tail:
        print("output ends with:", file=out)
        print(status.exit.log_tail.rstrip("\n"), file=out)


def _pool_rows(pools: Sequence[Any]) -> list[list[str]]:
    rows = [["NAME", "READY", "CREATING", "TOTAL", "MIN", "MAX", "CLAIMED", "STATE"]]
    for pool in pools:
        status = pool.status
        state = f"degraded: {status.last_error}" if status.degraded else "ok"
        rows.append([
            pool.name, str(status.ready), str(status.creating), str(status.total), str(pool.min_ready),
            str(pool.max_total), str(status.claimed), state,
        ])
    return rows


# ------------------------------------------------------------------ commands

async def _run(args: argparse.Namespace, out: IO[str]) -> int:
    from agentix.provider.service import ServiceProvider

    provider = ServiceProvider(args.url, token=args.token)
    try:
        return await _dispatch(provider, args, out)
    finally:
        await provider.aclose()


async def _dispatch(provider: Any, args: argparse.Namespace, out: IO[str]) -> int:
    as_json = args.json
    if args.area == "sandbox":
        if args.verb == "ls":
            records = await provider.list(args.selector, include_terminated=args.all, phases=args.phase)
            if as_json:
                _emit({"sandboxes": [_dict(r) for r in records]}, out)
            elif records:
                _table(_sandbox_rows(records, time.time()), out)
            else:
                print("no sandboxes", file=out)
            return 0
        if args.verb == "get":
            record = await provider.describe(args.id)
            _emit(_dict(record), out) if as_json else _print_sandbox(record, out)
            return 0
        if args.verb == "rm":
            deleted = []
            for sandbox_id in args.ids:
                record = await provider.delete_sandbox(sandbox_id, grace=args.grace, allow_missing=args.missing_ok)
                deleted.append(record)
                if not as_json:
                    print(f"deleted {sandbox_id}" if record.id else f"{sandbox_id}: not found", file=out)
            if as_json:
                _emit({"deleted": [_dict(r) for r in deleted]}, out)
            return 0
        if args.verb == "logs":
            return await _logs(provider, args, out)
        if args.verb == "wait":
            return await _wait(provider, args, out)
    if args.area == "pool":
        if args.verb == "create":
            from agentix.provider.base import SandboxConfig, SandboxResource

            resource = None
            if args.cpu is not None or args.memory is not None:
                resource = SandboxResource(cpu=args.cpu, memory=args.memory)
            config = SandboxConfig(image=args.image, bundle=args.bundle, platform=args.platform, resource=resource)
            if args.backend:
                provider.backend = args.backend
            pool = await provider.create_pool(
                args.name, config, min_ready=args.min_ready, max_total=args.max_total, max_creating=args.max_creating,
                labels=dict(args.label), member_max_age=args.member_max_age, update_strategy=args.strategy,
            )
            if as_json:
                _emit(_dict(pool), out)
            else:
                print(f"created pool {pool.name} (min ready {pool.min_ready}, max {pool.max_total})", file=out)
            return 0
        if args.verb == "ls":
            pools = await provider.list_pools()
            if as_json:
                _emit({"pools": [_dict(p) for p in pools]}, out)
            elif pools:
                _table(_pool_rows(pools), out)
            else:
                print("no pools", file=out)
            return 0
        if args.verb == "rm":
            await provider.delete_pool(args.name, allow_missing=args.missing_ok)
            _emit({"deleted": args.name}, out) if as_json else print(f"deleted pool {args.name}", file=out)
            return 0
    raise AssertionError(f"unhandled command {args.area} {args.verb}")


async def _logs(provider: Any, args: argparse.Namespace, out: IO[str]) -> int:
    if args.json:
        data = bytearray()
        async for chunk in provider.logs(args.id, follow=args.follow, offset=args.offset):
            data += chunk
        _emit({"id": args.id, "offset": args.offset, "end": args.offset + len(data),
               "data": data.decode(errors="replace")}, out)
        return 0
    binary = getattr(out, "buffer", None)
    async for chunk in provider.logs(args.id, follow=args.follow, offset=args.offset):
        if binary is not None:
            binary.write(chunk)
            binary.flush()
        else:
            out.write(chunk.decode(errors="replace"))
    return 0


async def _wait(provider: Any, args: argparse.Namespace, out: IO[str]) -> int:
    from agentix.provider.errors import ProviderTimeout, SandboxStartFailed, SandboxTerminated

    try:
        record = await provider.wait(args.id, args.until, timeout=args.timeout)
    except (ProviderTimeout, SandboxTerminated, SandboxStartFailed) as error:
        if error.code == "DEADLINE_EXCEEDED" and error.reason not in ("", "READY_TIMEOUT"):
            raise
        record = await provider.describe(args.id)
        if args.json:
            _emit({"sandbox": _dict(record), "reached": False, "message": error.message}, out)
        print(f"agentix: {error.message}", file=sys.stderr)
        return 1
    if args.json:
        _emit({"sandbox": _dict(record), "reached": True}, out)
    else:
        from agentix.provider.service import phase_name

        print(f"{record.id} is {phase_name(record.status.phase)}", file=out)
    return 0


def _emit(document: Any, out: IO[str]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True), file=out)


def _default_url() -> str:
    from agentix.provider.local import default_socket
    from agentix.provider.service import URL_ENV

    return os.environ.get(URL_ENV) or f"unix://{default_socket()}"


def main(argv: Sequence[str] | None = None, *, out: IO[str] | None = None) -> int:
    """Runs the ``agentix`` command; returns its exit status."""
    out = out if out is not None else sys.stdout
    parser = _parser()
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    if args.area in ("build", "run", "doctor"):
        return _local_command(args, out)
    args.url = getattr(args, "url", None) or _default_url()
    args.token = getattr(args, "token", None)
    from agentix.provider.errors import ProviderError

    try:
        return asyncio.run(_run(args, out))
    except ProviderError as error:
        if args.json:
            _emit({"error": {"code": error.code, "reason": error.reason, "message": error.message}}, out)
        if error.code == "UNAVAILABLE" and not error.reason:
            listen = args.url if args.url.startswith("unix:") else f"unix://{_default_socket_path()}"
            print(
                f"agentix: cannot reach agentix-providerd at {args.url} ({error.message}).\n"
                f"Start one with `agentix-providerd --listen {listen}` (a LocalProvider starts the per-user "
                "one by itself), or point --url / AGENTIX_PROVIDER_URL at a running one.",
                file=sys.stderr,
            )
        else:
            print(f"agentix: {error.describe()}", file=sys.stderr)
        return 1
    except ImportError as error:
        print(f"agentix: {error} (the command needs grpcio and protobuf: Debian's python3-grpcio and "
              "python3-protobuf)", file=sys.stderr)
        return 1
    except ValueError as error:  # a bad --url, size or label
        print(f"agentix: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _local_command(args: argparse.Namespace, out: IO[str]) -> int:
    """``build``, ``run`` and ``doctor``: no provider service needed up front."""
    from agentix.cli.build import BundleError

    try:
        if args.area == "build":
            from agentix.cli.build import run_build

            return run_build(args, out)
        if args.area == "run":
            from agentix.cli.run import run_command

            return run_command(args, out)
        from agentix.cli.doctor import run_doctor

        return run_doctor(args, out)
    except BundleError as error:
        if args.json:
            _emit({"error": {"code": "BUNDLE_FAILED", "message": str(error)}}, out)
        print(f"agentix: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _default_socket_path() -> str:
    from agentix.provider.local import default_socket

    return str(default_socket())


if __name__ == "__main__":
    sys.exit(main())
