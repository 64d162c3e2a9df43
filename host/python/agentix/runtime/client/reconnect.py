"""A client's reconnection policy: whether it reconnects by itself after a
lost connection, how many attempts it makes, and the backoff between them
(the original's socketio options; see `RuntimeClient`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from agentix.runtime.client.errors import RuntimeUnreachable

__all__ = ["ReconnectPolicy"]

T = TypeVar("T")

# Defaults: the original's socketio ones, but a first attempt at once and a
# bounded number of attempts, so no call waits forever.
_RECONNECT_ATTEMPTS = 8
_RECONNECT_DELAY = 0.25
_RECONNECT_DELAY_MAX = 5.0
_RANDOMIZATION = 0.5


class ReconnectPolicy:
    """The reconnection options of one client (None: the default)."""

    __slots__ = ("options", "enabled", "attempts", "delay", "delay_max", "randomization")

    def __init__(
        self,
        reconnection: bool | None,
        attempts: int | None,
        delay: float | None,
        delay_max: float | None,
        randomization: float | None,
    ) -> None:
        # The options as given (RuntimeClient.reconnection_options).
        self.options: dict[str, Any] = {
            name: value
            for name, value in (
                ("reconnection", reconnection),
                ("reconnection_attempts", attempts),
                ("reconnection_delay", delay),
                ("reconnection_delay_max", delay_max),
                ("randomization_factor", randomization),
            )
            if value is not None
        }
        self.enabled = reconnection is not False
        self.attempts = _RECONNECT_ATTEMPTS if attempts is None else attempts
        self.delay = _RECONNECT_DELAY if delay is None else delay
        self.delay_max = _RECONNECT_DELAY_MAX if delay_max is None else delay_max
        self.randomization = _RANDOMIZATION if randomization is None else randomization

    def exhausted(self, attempt: int) -> bool:
        """Whether `attempt` failed attempts are all there may be (0 attempts: unlimited)."""
        return bool(self.attempts) and attempt >= self.attempts

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after the `attempt`-th failed reconnect (1, 2, ...)."""
        delay = min(self.delay * 2 ** (attempt - 1), self.delay_max)
        return max(0.0, delay * (1 + self.randomization * (2 * random.random() - 1)))

    async def retry(self, connect: Callable[[], Awaitable[T]], failure: BaseException) -> T:
        """`connect()` retried with backoff after a first attempt failed
        with `failure`. Raises the last attempt's error when every attempt
        failed."""
        attempt = 1
        while not self.exhausted(attempt):
            await asyncio.sleep(self.backoff(attempt))
            try:
                return await connect()
            except (RuntimeUnreachable, OSError, grpc.aio.AioRpcError) as error:
                failure = error
                attempt += 1
        raise failure
