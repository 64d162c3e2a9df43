"""`configure_logging`: stdlib logging set up the way every agentix process does it."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from typing import IO

__all__ = ["DEFAULT_FORMAT", "configure_logging", "expand_context", "level_from_env"]

DEFAULT_FORMAT = "%(asctime)s [%(agentix_context)s] [%(name)s] %(message)s"

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def expand_context(template: str) -> str:
    """Fills the placeholders of a context template.

    ``{uname}`` and ``{hostname}`` become the host name, ``{pid}`` this
    process's id and ``{id}`` ``$AGENTIX_WORKER_ID`` (or the pid when unset or
    empty). Anything else, including unknown placeholders and stray braces, is
    kept literally.
    """
    hostname = socket.gethostname()
    pid = str(os.getpid())
    values = {
        "uname": hostname,
        "hostname": hostname,
        "pid": pid,
        "id": os.environ.get("AGENTIX_WORKER_ID") or pid,
    }
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)


def level_from_env() -> int:
    """The level named by ``$AGENTIX_LOG_LEVEL``: a level name (any case) or a
    number. Unset, empty or unknown names give ``logging.INFO``."""
    value = os.environ.get("AGENTIX_LOG_LEVEL", "").strip()
    if value.lstrip("-").isdigit():
        return int(value)
    level = logging.getLevelName(value.upper()) if value else None
    return level if isinstance(level, int) else logging.INFO


def configure_logging(*, default_context: str = "host", stream: IO[str] | None = None, force: bool = False) -> None:
    """Configures the root logger and tags every record with ``agentix_context``.

    - Context: ``$AGENTIX_LOG_CONTEXT`` or `default_context`, a template whose
      placeholders are filled by `expand_context`.
    - Level: ``$AGENTIX_LOG_LEVEL`` (see `level_from_env`; default INFO).
    - Format: ``$AGENTIX_LOG_FORMAT`` or `DEFAULT_FORMAT`.
    - Calls ``logging.basicConfig(level=..., stream=stream or sys.stderr,
      format=..., force=force)``; like ``basicConfig`` it adds no handler when
      the root logger already has one, unless `force`.
    - Installs a record factory (wrapping the current one) that sets
      ``record.agentix_context`` to the context on every record created from
      then on. Calling again replaces the context; factories are not stacked.
    """
    context = expand_context(os.environ.get("AGENTIX_LOG_CONTEXT") or default_context)
    logging.basicConfig(
        level=level_from_env(),
        stream=stream or sys.stderr,
        format=os.environ.get("AGENTIX_LOG_FORMAT") or DEFAULT_FORMAT,
        force=force,
    )
    _install_context_factory(context)


class ContextRecordFactory:
    """A record factory that sets ``agentix_context`` and defers the rest to
    the factory that was installed before it."""

    def __init__(self, inner, context: str) -> None:
        self.inner = inner
        self.context = context

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        record.agentix_context = self.context
        return record


def _install_context_factory(context: str) -> None:
    current = logging.getLogRecordFactory()
    if isinstance(current, ContextRecordFactory):
        current.context = context
    else:
        logging.setLogRecordFactory(ContextRecordFactory(current, context))
