"""What ``agentix deploy <backend>`` commands share (SPEC §10.7).

Provider plugins build their deploy command from `common_options` (the
``BUNDLE`` argument, ``-n/--name``, ``--platform``, ``--format text|json``) and
report with `print_deploy_result`; these are the names plugin CLIs import. The
``agentix`` command itself (`agentix.cli.main`) has no ``deploy`` subcommand:
bundles go to a provider as ``SandboxConfig.bundle`` (docs/CLI.md). `common_options`
needs ``click`` (Debian: ``python3-click``), imported only when it is used.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from agentix.provider.base import DeployedBundle

__all__ = ["common_options", "print_deploy_result"]

F = TypeVar("F", bound=Callable[..., Any])


def common_options(command: F) -> F:
    """Adds ``BUNDLE`` (an existing file, passed as a `Path`), ``-n/--name``,
    ``--platform`` and ``--format text|json`` (parameter ``output_format``)
    to a click command."""
    try:
        import click
    except ImportError:
        raise ImportError(
            "agentix.cli.deploy.common_options needs click: install python3-click (Debian) or click (pip)"
        ) from None
    decorators = [
        click.argument("bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("-n", "--name", default=None, help="NAME[:TAG] to record for the bundle."),
        click.option("--platform", default=None, help="Target platform, e.g. linux/amd64."),
        click.option(
            "--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
            help="Output format.",
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def print_deploy_result(result: DeployedBundle, fmt: str = "text", *, file: IO[str] | None = None) -> None:
    """Prints a deploy result: ``text`` is ``bundle -> …``, ``platform -> …``
    (if set), the metadata sorted as ``key -> value``, then for each hint a
    blank-line-separated ``# label`` and its command; ``json`` is one object
    ``{"bundle", "platform", "metadata", "hints"}``."""
    out = file if file is not None else sys.stdout
    if fmt == "json":
        payload = {
            "bundle": str(result.bundle),
            "platform": result.platform,
            "metadata": dict(result.metadata),
            "hints": dict(result.hints),
        }
        print(json.dumps(payload, indent=2), file=out)
        return
    if fmt != "text":
        raise ValueError(f"unknown output format {fmt!r} (use 'text' or 'json')")
    print(f"bundle -> {result.bundle}", file=out)
    if result.platform:
        print(f"platform -> {result.platform}", file=out)
    for key, value in sorted(result.metadata.items()):
        print(f"{key} -> {value}", file=out)
    if result.hints:
        print(file=out)
        for label, command in result.hints.items():
            print(f"# {label}", file=out)
            print(command, file=out)
