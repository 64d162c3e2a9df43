"""The environment a call sees: set_env, the log level, the context module."""

import logging
import os
import sys
import time

from .common import _DEBUG, _log, _text

_context_mod = None
_context_missing_reported = False


def _env_log_level():
    """The level $AGENTIX_LOG_LEVEL names (a level name or number), or
    INFO when it is unset or unknown."""
    value = os.environ.get("AGENTIX_LOG_LEVEL", "").strip()
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper()) if value else logging.INFO
    return level if isinstance(level, int) else logging.INFO


def _context_module():
    """agentix.utils.context from the sandbox's venv, or None if the venv has
    no agentix (then there is nothing a call could read the context with)."""
    global _context_mod, _context_missing_reported
    if _context_mod is None:
        try:
            import agentix.utils.context as module
        except ImportError:
            if not _context_missing_reported:
                _context_missing_reported = True
                _log(_DEBUG, "agentix is not importable in the sandbox; "
                             "propagated call context is ignored")
            return None
        _context_mod = module
    return _context_mod


# Cached from the environment by the stdlib on first use: forgotten when
# set_env changes one of these, so the next use reads the new value.
_TEMPDIR_VARS = (b"TMPDIR", b"TEMP", b"TMP")


def _apply_env(entries):
    """Applies a set_env frame: SandboxAdmin.Activate's env, given to a worker
    that was started before activation (agentix-sandboxd
    --prestart-worker). `entries` is b"K=V\\0K=V\\0...". Returns "" once
    every entry is in os.environ (hence in the C environment, for getenv and
    child processes), else why not; the daemon then replaces this worker.
    Only runs before any call: no user code has read the environment yet."""
    try:
        keys = []
        for entry in entries.split(b"\0"):
            if not entry:
                continue
            key, sep, value = entry.partition(b"=")
            if not sep or not key:
                return f"malformed environment entry {entry[:64]!r}"
            os.environb[key] = value  # os.environ shares its data
            keys.append(key)
        if b"TZ" in keys:
            time.tzset()
        if any(k in _TEMPDIR_VARS for k in keys):
            tempfile = sys.modules.get("tempfile")
            if tempfile is not None:
                tempfile.tempdir = None
        _log(_DEBUG, f"environment updated: {len(keys)} entries")
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {_text(exc)}"


# StartCall's plain context fields as the daemon passes them in the call
# frame (wire/call_context.h): this prefix, then u32-LE-length-prefixed
# strings traceparent, tracestate, key, value, key, value...
_PLAIN_CONTEXT_MAGIC = b"\0AXC1"
_HEX = frozenset("0123456789abcdef")


def _plain_context(context, carrier):
    """The propagated values (for context.attach) that StartCall's
    traceparent / tracestate / baggage describe: the baggage as the
    sandbox's agentix.context baggage, and the trace parent as the current
    agentix Trace and Span (ids only: "trace_" + the W3C trace-id, "span_" +
    the full agentix span id from tracestate's "agentix=" entry when it
    extends the parent-id, else + the parent-id). The daemon has checked the
    traceparent."""
    strings = []
    view = memoryview(carrier)
    at = len(_PLAIN_CONTEXT_MAGIC)
    while at + 4 <= len(view):
        size = int.from_bytes(view[at:at + 4], "little")
        strings.append(bytes(view[at + 4:at + 4 + size]).decode())
        at += 4 + size
    traceparent, tracestate = strings[0], strings[1]
    pairs = strings[2:]
    values = {}
    if pairs:
        values["agentix_context_baggage"] = dict(zip(pairs[::2], pairs[1::2]))
    if traceparent:
        try:
            import agentix.utils.trace as trace
        except ImportError:
            return values
        trace_id = "trace_" + traceparent[3:35]
        parent_id = traceparent[36:52]
        span_id = parent_id
        for entry in tracestate.split(","):
            key, _, value = entry.strip().partition("=")
            if (key == "agentix" and len(value) == 24
                    and value.startswith(parent_id) and _HEX.issuperset(value)):
                span_id = value
                break
        values["agentix_trace_current_trace"] = trace.Trace(
            trace_id=trace_id, name="")
        values["agentix_trace_current_span"] = trace.Span(
            span_id="span_" + span_id, trace_id=trace_id, parent_id=None,
            name="")
    return values
