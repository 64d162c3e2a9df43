"""Built-in processors: `ConsoleProcessor` (human-readable lines) and
`JsonlProcessor` (one JSON object per finished span / trace)."""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
from datetime import datetime
from typing import IO, Any

from agentix.utils.trace import Processor, Span, Trace

__all__ = ["ConsoleProcessor", "JsonlProcessor"]


def _duration_ms(started_at: str | None, ended_at: str | None) -> str:
    """``" (12.3 ms)"`` for two timestamps of this module's format, else ``""``."""
    if not started_at or not ended_at:
        return ""
    try:
        start = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
        end = datetime.fromisoformat(ended_at.replace("Z", "+00:00"))
    except ValueError:
        return ""
    return f" ({(end - start).total_seconds() * 1000:.1f} ms)"


class ConsoleProcessor(Processor):
    """Prints one line per trace/span start and end to `stream` (default:
    ``sys.stderr`` at the time of each write), indented two spaces per nesting
    level: a trace's root spans are one level in, children one more. Depth is
    known for spans whose parent was started through this processor; other
    spans count as roots. Lines::

        trace start <name> <trace_id> {metadata}
          span start <name> <span_id> {attrs}
            event <name> {attributes}            (printed at span end)
          span end <name> <status>[: error] (1.2 ms)
        trace end <name> <trace_id> (3.4 ms)

    The depths of at most `MAX_OPEN_SPANS` started spans are kept (the oldest
    go first): spans that never end, such as a sandbox's replayed starts
    whose end never comes, cannot grow it without bound.
    """

    MAX_OPEN_SPANS = 10_000

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._depth: collections.OrderedDict[str, int] = collections.OrderedDict()

    def _write(self, depth: int, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        with self._lock:
            stream.write("  " * depth + text + "\n")
            stream.flush()

    def on_trace_start(self, trace: Trace) -> None:
        metadata = f" {trace.metadata}" if trace.metadata else ""
        self._write(0, f"trace start {trace.name} {trace.trace_id}{metadata}")

    def on_trace_end(self, trace: Trace) -> None:
        self._write(0, f"trace end {trace.name} {trace.trace_id}{_duration_ms(trace.started_at, trace.ended_at)}")

    def on_span_start(self, span: Span) -> None:
        with self._lock:
            depth = self._depth.get(span.parent_id, 0) + 1 if span.parent_id else 1
            self._depth[span.span_id] = depth
            if len(self._depth) > self.MAX_OPEN_SPANS:
                self._depth.popitem(last=False)
        attrs = f" {span.attrs}" if span.attrs else ""
        self._write(depth, f"span start {span.name} {span.span_id}{attrs}")

    def on_span_end(self, span: Span) -> None:
        with self._lock:
            depth = self._depth.pop(span.span_id, 1)
        for event in span.events:
            attributes = f" {event.attributes}" if event.attributes else ""
            self._write(depth + 1, f"event {event.name}{attributes}")
        outcome: str = span.status
        if span.error is not None:
            outcome += f": {span.error.message}"
        elif span.status_description:
            outcome += f": {span.status_description}"
        self._write(depth, f"span end {span.name} {outcome}{_duration_ms(span.started_at, span.ended_at)}")

    def force_flush(self) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        with self._lock:
            stream.flush()


class JsonlProcessor(Processor):
    """Appends one line ``json.dumps(item.export(), default=str)`` per ended
    span (``spans=True``) and per ended trace (``traces=True``) to `path`.

    The parent directory is created and the file opened (append mode, UTF-8)
    at construction. Each line is written under a lock and flushed at once,
    so concurrent spans never interleave and a crash loses nothing written.
    `shutdown` closes the file; it is idempotent, and spans ending after it
    are dropped silently.
    """

    def __init__(self, path: str | os.PathLike[str], *, spans: bool = True, traces: bool = True) -> None:
        self.path = os.fspath(path)
        self.spans = spans
        self.traces = traces
        self._lock = threading.Lock()
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str) + "\n"
        with self._lock:
            if self._file is None:
                return
            self._file.write(line)
            self._file.flush()

    def on_span_end(self, span: Span) -> None:
        if self.spans:
            self._write(span.export())

    def on_trace_end(self, trace: Trace) -> None:
        if self.traces:
            self._write(trace.export())

    def force_flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def shutdown(self) -> None:
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def __repr__(self) -> str:
        return f"JsonlProcessor({self.path!r}, spans={self.spans}, traces={self.traces})"
