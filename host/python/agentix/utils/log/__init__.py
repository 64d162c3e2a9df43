"""Logging for agentix processes; also reachable as ``agentix.log``.

`configure_logging` sets up stdlib logging with an ``agentix_context`` on
every record (see its docstring and ``_config.py``).

Sandbox logs reach the host through ``RuntimeService.Logs``: every
`agentix.RuntimeClient` subscribes when it connects and replays the sandbox's
records into the host's loggers (``agentix/runtime/client/logs.py``). Delivery
is in order and eventual; there is no happens-before between a record and the
`remote()` call that produced it returning.

`install_worker_bridge` is kept for code written against the original Python
runtime. Here the sandbox's worker forwards its records itself before any user
code runs, so on the host (and in the sandbox) it does nothing.
"""

from __future__ import annotations

import logging

from agentix.utils.log._config import configure_logging

__all__ = ["configure_logging", "install_worker_bridge"]


def install_worker_bridge(level: int = logging.NOTSET) -> None:
    """Does nothing: the agentix-sandboxd worker installs its own log bridge.

    Kept so that code calling it (it was the original's worker-side entry
    point) keeps working. `level` is accepted and ignored.
    """
    del level
