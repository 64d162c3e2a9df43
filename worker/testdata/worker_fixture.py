"""Targets the worker tests call through `--python-path worker/testdata`.

Each function exercises one path of the worker driver: sync and async
execution, blocking, exceptions of every kind, results pickle cannot carry,
large values, and reporting on the interpreter's configuration.
"""

import asyncio
import gc
import logging
import os
import subprocess
import sys
import time

NOT_CALLABLE = 42

_count = 0


def add(a, b=0):
    return a + b


async def async_add(a, b=0):
    await asyncio.sleep(0)
    return a + b


def echo(value):
    return value


def length(data):
    return len(data)


def big(n):
    return b"x" * n


async def sleep_async(seconds):
    await asyncio.sleep(seconds)
    return seconds


def sleep_sync(seconds):
    time.sleep(seconds)
    return seconds


def fail(message):
    raise ValueError(message)


def exit_now(code):
    raise SystemExit(code)


async def interrupt():
    await asyncio.sleep(0)
    raise KeyboardInterrupt("stop")


def unpicklable():
    return lambda: None


def returns_coroutine():
    return async_add(1, 2)


def unencodable_for_msgpack():
    return {1, 2, 3}


def count():
    global _count
    _count += 1
    return _count


async def cancellable(marker):
    """Sleeps until cancelled; records the cancellation in `marker`."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        with open(marker, "w") as f:
            f.write("cancelled")
        raise
    return "not cancelled"


def exists(path):
    return os.path.exists(path)


def disable_gc():
    gc.disable()


def pool_jobs_holding_arguments():
    """How many sync-pool jobs other than the running one still hold their
    arguments (the worker's driver names the class _PoolJob)."""
    return sum(1 for o in gc.get_objects()
               if type(o).__name__ == "_PoolJob" and o.args is not None) - 1


_holders_seen = []


def watch_holders(value, seconds):
    """Starts a thread that watches, for up to `seconds` after this call,
    how many references to `value` others than itself hold, and records the
    least it saw (watched_holders)."""
    import threading

    def watch():
        deadline = time.monotonic() + seconds
        least = sys.getrefcount(box[0]) - 2
        while least > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
            least = min(least, sys.getrefcount(box[0]) - 2)
        _holders_seen.append(least)

    box = [value]
    threading.Thread(target=watch, daemon=True).start()


def watched_holders():
    """What watch_holders' last watch saw (-1: still watching)."""
    return _holders_seen[-1] if _holders_seen else -1


def touch(path):
    with open(path, "w"):
        pass
    return path


def noisy():
    print("to stdout through print")
    print("to stderr through print", file=sys.stderr)
    os.write(1, b"to fd 1 directly\n")
    return "ok"


# ---- logging and captured output -------------------------------------------


def log_warning():
    logging.getLogger("app").warning("x %s", 1, extra={"k": 1})
    return "logged"


def log_then_sigkill(n):
    """Logs `n` records (and prints a line), then SIGKILLs this worker: no
    handler, flush or close runs after the last one."""
    import signal
    print("printed before the kill")
    log = logging.getLogger("app.killed")
    for i in range(n):
        log.warning("record %d before the kill", i)
    os.kill(os.getpid(), signal.SIGKILL)


def log_raw_record():
    """A record made without the record factory (no agentix_context)."""
    record = logging.LogRecord("app.raw", logging.INFO, __file__, 1,
                               "raw record", None, None)
    logging.getLogger("app.raw").handle(record)
    return "logged"


def durable_format_matches_formatter():
    """Formats records of every kind with the durable log's formatter and with
    logging.Formatter of the same format; raises AssertionError if a line or
    the attributes formatting sets (message, asctime) differ."""
    handler = next(h for h in logging.getLogger().handlers
                   if type(h).__name__ == "_DurableHandler")
    ours = handler.formatter
    reference = logging.Formatter(ours._fmt)
    logger = logging.getLogger("app.format")
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    made = [
        logger.makeRecord("app.format", logging.INFO, __file__, 1,
                          "plain %d %s", (7, "\u00e9"), None),
        logger.makeRecord("app.format", logging.ERROR, __file__, 2,
                          "failed", (), exc_info),
        logger.makeRecord("app.format", logging.INFO, __file__, 3,
                          "with stack", (), None, sinfo="Stack (most recent call last):"),
        logger.makeRecord("app.format", logging.INFO, __file__, 4,
                          {"a mapping": 1}, (), None),
        logger.makeRecord("app.format", logging.WARNING, __file__, 5,
                          "%(key)s", ({"key": "by name"},), None),
    ]
    made[3].agentix_context = 12345  # not a str: %s formats it
    for i, record in enumerate(made):
        record.created = 1_764_643_200.25 + i  # distinct seconds and msecs
        record.msecs = 250.0 + i
        if not hasattr(record, "agentix_context"):
            record.agentix_context = "ctx"
        theirs = logging.makeLogRecord(vars(record))
        expected = reference.format(theirs)
        got = ours.format(record)
        if got != expected or record.message != theirs.message or (
                record.asctime != theirs.asctime):
            raise AssertionError(f"record {i}: {got!r} != {expected!r}")
    return "same"


def durable_line_matches_formatter():
    """Writes records with write_log_line (the durable log's C path) to a
    temporary file and checks each line, and the message and asctime it
    sets, against logging.Formatter with the default format; checks that
    the records it declines write nothing. Raises AssertionError."""
    import tempfile
    import _agentix_worker as w
    handler = next(h for h in logging.getLogger().handlers
                   if type(h).__name__ == "_DurableHandler")
    reference = logging.Formatter(handler.formatter._fmt)
    logger = logging.getLogger("app.line")

    def record(msg, args=(), **attrs):
        made = logger.makeRecord("app.line", logging.INFO, __file__, 1, msg,
                                 args, None)
        for key, value in attrs.items():
            setattr(made, key, value)
        return made

    plain = [
        record("plain %d %s", (7, "\u00e9\u2603")),
        record({"a mapping": 1}),
        record("%(key)s", ({"key": "by name"},)),
        record("no context"),
        # As _pump_durable makes them: msecs an int.
        record("stdio line", created=1_764_643_201.5, msecs=500,
               module="stdio"),
        record("same second", created=1_764_643_201.75, msecs=750.0),
        record("midnight", created=1_764_633_600.0, msecs=0.0),
        # Milliseconds zero-padded; the same asctime twice, then another.
        record("ms 7", created=1_764_643_202.0079, msecs=7.9),
        record("ms 7 again", created=1_764_643_202.0079, msecs=7.9),
        record("ms 45", created=1_764_643_202.045, msecs=45.0),
        record("ms 999", created=1_764_643_202.999, msecs=999.999),
    ]
    del plain[3].__dict__["agentix_context"]
    declined = [
        record("exception", exc_info=(ValueError, ValueError("x"), None)),
        record("exception text", exc_text="Traceback"),
        record("stack", stack_info="Stack (most recent call last):"),
        record("bad \udcff surrogate"),
        record("%d", ("not a number",)),
        record("context", agentix_context=12345),
        record("msecs", msecs=1000.0),
        record("created", created=1),
    ]
    with tempfile.TemporaryFile() as out:
        fd = out.fileno()
        for i, made in enumerate(plain):
            theirs = logging.makeLogRecord(vars(made))
            if "agentix_context" not in vars(made):
                theirs.agentix_context = "ctx"  # the context given below
            expected = (reference.format(theirs) + "\n").encode()
            start = os.lseek(fd, 0, os.SEEK_CUR)
            size = w.write_log_line(made, fd, "ctx", -1)
            os.lseek(fd, start, os.SEEK_SET)
            got = os.read(fd, 1 << 16)
            if size != len(expected) or got != expected or (
                    made.message != theirs.message
                    or made.asctime != theirs.asctime
                    or made.agentix_context != theirs.agentix_context):
                raise AssertionError(f"record {i}: {got!r} ({size}) != "
                                     f"{expected!r}")
            # The caller's room: a line that would not fit is declined.
            if w.write_log_line(made, fd, "ctx", len(expected)) != -1:
                raise AssertionError(f"record {i} written without room")
            if w.write_log_line(made, fd, "ctx", len(expected) + 1) != size:
                raise AssertionError(f"record {i} not written with room")
        end = os.lseek(fd, 0, os.SEEK_END)
        for i, made in enumerate(declined):
            if w.write_log_line(made, fd, "ctx", -1) != -1:
                raise AssertionError(f"declined record {i} was written")
        if os.lseek(fd, 0, os.SEEK_END) != end:
            raise AssertionError("a declined record wrote something")
    return "same"


def bridge_paths_agree():
    """Sends records through the log bridge's C path (handle: the record as
    logging made it) and its general path (emit), each record both ways, with
    messages "agree <i>": the test compares each pair of frames, so a field
    the general path sends and the C path does not (or the reverse) fails."""
    bridge = next(h for h in logging.getLogger().handlers
                  if type(h).__name__ == "_LogBridge")
    logger = logging.getLogger("app.agree")
    made = [
        logger.makeRecord("app.agree", logging.INFO, __file__, 10,
                          "agree %d %s", (0, "\u00e9"), None),
        logger.makeRecord("app.agree", logging.WARNING, __file__, 11,
                          "agree %(n)d", ({"n": 1},), None, func="f",
                          sinfo="Stack (most recent call last):"),
        logger.makeRecord("app.agree", logging.ERROR, __file__, 12,
                          "agree 2", (), None),
    ]
    made[2].exc_info = (ValueError, ValueError("x"), None)
    made[2].exc_text = "Traceback: formatted before"
    for record in made:
        bridge.handle(record)
        bridge.emit(record)
    return len(made)


def logger_log_in_c():
    """logging.Logger's _log and level methods are the C ones
    (logger_log.h): each call below is made from one line twice, through
    them and through the stdlib's (the driver keeps those), so the test
    compares each pair of frames ("clog <i>", everything but the time). A
    logger filter notes the Python frames of those methods on the stack:
    none under the C ones. Returns how many pairs."""
    from _agentix_driver import logs
    stdlib = logs._stdlib_methods
    ours = {name: logging.Logger.__dict__[name] for name in stdlib}
    if sorted(stdlib) != ["_log", "critical", "debug", "error", "info", "log",
                          "warning"] or any(
            type(method).__name__ != "method_descriptor"
            for method in ours.values()):
        raise AssertionError(f"Logger's methods: {ours!r}")
    logger = logging.getLogger("app.clog")
    adapter = logging.LoggerAdapter(logger, {})
    python_frames = []
    codes = {method.__code__ for method in stdlib.values()}

    def note(record):
        frame, names = sys._getframe(), []
        while frame is not None:
            if frame.f_code in codes:
                names.append(frame.f_code.co_name)
            frame = frame.f_back
        python_frames.append(names)
        return True

    def use(methods):
        for name, method in methods.items():
            setattr(logging.Logger, name, method)

    logger.addFilter(note)
    calls = [
        lambda: logger.info("clog %d %s", 0, "\u00e9"),
        lambda: logger.warning("clog %s", 1, stacklevel=2),
        lambda: logger.log(logging.INFO, "clog 2", extra={"k": [1, "v"]}),
        lambda: adapter.error("clog 3"),
    ]
    try:
        for call in calls:
            for methods in (ours, stdlib):
                use(methods)
                try:
                    call()
                finally:
                    use(ours)
    finally:
        logger.removeFilter(note)
    expected = [[], ["_log", "info"], [], ["_log", "warning"], [],
                ["_log", "log"], [], ["_log", "log"]]
    if python_frames != expected:
        raise AssertionError(f"Python frames: {python_frames}")
    return len(calls)


def logger_log_audited():
    """An audit hook added by user code sees what the stdlib's logging
    raises: one "sys._getframe" per record from findCaller (whose frame it
    is), and a hook that refuses it fails the logging call. Each call is
    made through the C methods and then the stdlib's (this worker's hook
    stays: call it last). Returns how many calls."""
    from _agentix_driver import logs
    stdlib = logs._stdlib_methods
    ours = {name: logging.Logger.__dict__[name] for name in stdlib}
    logger = logging.getLogger("app.audited")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    seen, refuse = [], []

    def hook(event, args):
        if event == "sys._getframe" and (seen or refuse):
            seen.append(args[0].f_code.co_name)
            if refuse:
                raise RuntimeError("no frames here")

    sys.addaudithook(hook)
    calls = [lambda: logger.info("audited"),
             lambda: logger.log(logging.WARNING, "audited %s", 1),
             lambda: logger._log(logging.INFO, "audited", ())]
    results = []
    for call in calls:
        for refusing in (False, True):
            for methods in (ours, stdlib):
                for name, method in methods.items():
                    setattr(logging.Logger, name, method)
                seen[:] = ["start"]
                refuse[:] = [True] if refusing else []
                try:
                    call()
                    raised = None
                except RuntimeError as error:
                    raised = repr(error)
                finally:
                    refuse.clear()
                    for name, method in ours.items():
                        setattr(logging.Logger, name, method)
                results.append((seen[1:], raised))
                seen.clear()
    # Per call: C then stdlib, without and then with the refusal.
    expected = ([(["findCaller"], None)] * 2 + [
        (["findCaller"], "RuntimeError('no frames here')")] * 2) * len(calls)
    if results != expected:
        raise AssertionError(f"audit events: {results}")
    return len(calls)


def log_handles_in_c():
    """The bridge's and the durable log's `handle` are the C ones
    (log_handles.h) and do what their classes' Python `handle` does: each
    record "handles <i>" goes through the C handle, then the class's, so the
    test compares each pair of frames and of durable lines. Handler filters
    are run (a record "filtered" is neither sent nor written), the durable
    handler's lock is taken and released once per record, a record logged
    while one is formatted is counted in the handler's size, and a record
    with extras takes emit(). Returns the durable log's path."""
    import _agentix_worker as w
    root = logging.getLogger()
    bridge = next(h for h in root.handlers if type(h).__name__ == "_LogBridge")
    durable = next(h for h in root.handlers
                   if type(h).__name__ == "_DurableHandler")
    for handler in (bridge, durable):
        assert type(handler.handle).__name__ == "builtin_function_or_method", (
            handler.handle)
    logger = logging.getLogger("app.handles")

    class Nested:
        def __str__(self):
            logging.getLogger("app.nested").info("nested while formatting")
            return "nested arg"

    def record(i, *args, **extra):
        made = logger.makeRecord("app.handles", logging.INFO, __file__, 20 + i,
                                 f"handles {i}" + " %s" * len(args), args, None)
        for key, value in extra.items():
            setattr(made, key, value)
        return made

    class CountingLock:
        def __init__(self, inner):
            self.inner, self.acquired, self.released = inner, 0, 0

        def acquire(self, *args):
            self.acquired += 1
            return self.inner.acquire(*args)

        def release(self):
            self.released += 1
            self.inner.release()

        __enter__ = acquire

        def __exit__(self, *exc):
            self.release()

    made = [record(0, "\u00e9"), record(1, 7), record(2, extra_key="x")]
    lock = durable.lock
    counting = durable.lock = CountingLock(lock)
    try:
        for each in made:
            bridge.handle(each)
            durable.handle(each)
            for handler in (bridge, durable):
                type(handler).handle(handler, each)
        assert counting.acquired == counting.released == 2 * len(made), (
            counting.acquired, counting.released)
    finally:
        durable.lock = lock

    class Refuse(logging.Filter):
        def filter(self, rec):
            return "filtered" not in rec.getMessage()

    refuse = Refuse()
    for handler in (bridge, durable):
        handler.addFilter(refuse)
    try:
        logger.info("filtered out")
        logger.info("handles after the filter")
    finally:
        for handler in (bridge, durable):
            handler.removeFilter(refuse)
    logger.info("handles %s", Nested())
    written = (w.mapped_log_length(durable._mapped) if durable._mapped is not None
               else os.fstat(durable._fd).st_size)
    assert durable._size == written, (durable._size, written)
    return durable.baseFilename


def durable_rotation(records, max_bytes):
    """Lowers the durable log's size limit, then logs `records` records of
    two-byte characters (the limit counts bytes)."""
    handler = next(h for h in logging.getLogger().handlers
                   if type(h).__name__ == "_DurableHandler")
    handler.maxBytes = max_bytes
    for i in range(records):
        logging.getLogger("app.rotate").info("rotate %04d %s", i, "\u00e9" * 40)
    return "logged"


def log_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("app").exception("failed")
    return "logged"


async def log_async(tag):
    await asyncio.sleep(0)
    logging.getLogger("app.async").info("async %s", tag)
    print(f"async print {tag}")
    return tag


def log_extras():
    logging.getLogger("app").info(
        "extras", extra={"num": 2, "text": "t", "seq": (1, [2, b"b"]),
                         "mapping": {3: None}, "obj": object, "_hidden": 1})
    # Forwarded: everything but agentix.utils.log*.
    logging.getLogger("agentix.sio.ns").warning("forwarded too")
    logging.getLogger("agentix.utils.log").warning("not forwarded")
    logging.getLogger("agentix.other").warning("forwarded")
    return "logged"


def print_lines():
    print("hi")
    print("to", "stderr", file=sys.stderr)
    sys.stdout.write("part")
    sys.stdout.write("ial\r\n")
    return "printed"


def write_fds():
    os.write(1, b"raw\n")
    os.write(2, b"raw err\n")
    os.write(1, b"bad \xff utf8\n")
    return "written"


def run_child():
    subprocess.run(["sh", "-c", "echo hi; echo err >&2"], check=True,
                   timeout=30)
    return "ran"


def fd_line(i):
    os.write(1, b"fd-line %d\n" % i)
    return i


def long_line(size):
    os.write(1, b"y" * size)
    return "written"


def burst(size):
    """Writes `size` bytes three ways: print(), fd 1 and a child, in
    100-byte lines; any of them would block on an undrained pipe."""
    line = "b" * 99 + "\n"
    for _ in range(size // 100):
        sys.stdout.write(line)
    os.write(1, line.replace("b", "f").encode() * (size // 100))
    subprocess.run(["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' c"],
                   check=True, timeout=30)
    os.write(1, b"\n")
    return "done"


def fork_child():
    pid = os.fork()
    if pid == 0:
        try:
            print("printed in a forked child")
            logging.getLogger("app.child").warning("logged in a forked child")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    logging.getLogger("app").warning("parent after fork")
    return "forked"


def ordered(n):
    log = logging.getLogger("app.order")
    for i in range(n):
        log.info("seq %d", i)
        print(f"print {i}")
        os.write(1, b"fd %d\n" % i)
    return n


def sys_path():
    return list(sys.path)


def interpreter_info():
    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "version": sys.version.split()[0],
        "isolated": sys.flags.isolated,
        "os_file": os.__file__,
        "argv": list(sys.argv),
    }


def env(name):
    return os.environ.get(name)


def thread_name():
    """(Python thread name, OS thread name) of the calling thread."""
    import threading
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return threading.current_thread().name, f.read().strip()


class Echo:
    @staticmethod
    def echo(value):
        return value

    def method(self, value):
        return ("method", value)


# ---- streaming targets ------------------------------------------------------

# Tags of the generators whose `finally` ran (see closed()).
_closed = set()


async def agen_count(n):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


def gen_count(n):
    for i in range(n):
        yield i
    return "done"


def list_of(n):
    """A plain function returning an iterable (not an iterator)."""
    return list(range(n))


async def returns_agen(n):
    """A coroutine function whose value is an async iterator."""
    await asyncio.sleep(0)
    return agen_count(n)


async def returns_list(n):
    """A coroutine function whose value is a sync iterable."""
    await asyncio.sleep(0)
    return list(range(n))


def agen_from_sync(n):
    """A plain function whose value is an async iterator."""
    return agen_count(n)


def gen_then_fail(n):
    yield from range(n)
    raise ValueError(f"failed after {n}")


async def agen_then_fail(n):
    for i in range(n):
        yield i
    raise ValueError(f"failed after {n}")


def gen_forever(tag, delay=0):
    """Yields 0, 1, ... (sleeping `delay` s before each) until closed."""
    try:
        i = 0
        while True:
            time.sleep(delay)
            yield i
            i += 1
    finally:
        _closed.add(tag)


async def agen_forever(tag):
    try:
        i = 0
        while True:
            await asyncio.sleep(0)
            yield i
            i += 1
    finally:
        _closed.add(tag)


def gen_unpicklable(tag):
    try:
        yield 1
        yield lambda: None
        yield 3
    finally:
        _closed.add(tag)


def closed(tag):
    return tag in _closed


# ---- traces (need agentix on the path; imported lazily so that workers
# without it still load this module) ------------------------------------------


def traced():
    """A trace with two nested spans: an event, a status and an error."""
    from agentix import trace
    with trace.trace("t", k=1) as t:
        with trace.span("outer", a=1) as outer:
            with trace.span("inner") as inner:
                inner.add_event("ev", x=2)
                inner.set_status("ok", "fine")
            outer.set_error("bad", code=7)
    return [t.trace_id, outer.span_id, inner.span_id]


class _Opaque:
    def __repr__(self):
        return "<opaque>"


def traced_odd_attributes():
    from agentix import trace
    with trace.span("odd", obj=_Opaque(), big=1 << 70, none=None, s="x",
                    f=1.5, b=True, raw=b"\x00\xff") as s:
        pass
    return s.span_id


def traced_stamps():
    """Ended spans with given stamps, in turn sharing and changing seconds
    (the forwarder reuses the last second it converted), a datetime and
    unreadable ones."""
    import datetime
    from agentix.utils import trace
    stamps = [
        ("2024-01-02T03:04:05.123456Z", "2024-01-02T03:04:05.999999Z"),
        ("2024-01-02T03:04:05.000001Z", "2024-01-02T03:04:06.000000Z"),
        ("2024-01-02T03:04:06.5Z", "1999-12-31T23:59:59.000002Z"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5, 7, datetime.timezone.utc),
         "2024-01-02T03:04:xx.000000Z"),
    ]
    for i, (start, end) in enumerate(stamps):
        span = trace.Span(span_id=f"span_{i}", trace_id="trace_stamps",
                          parent_id=None, name=f"stamp{i}",
                          started_at=start, ended_at=end)
        trace._dispatch("on_span_end", span)
    return len(stamps)


def forwarder_paths_agree():
    """Forwards spans through the trace forwarder's C path (send_span) and
    its general path (send_trace), each span both ways, named "agree<i>":
    the test compares each pair of events."""
    from agentix.utils import trace
    forwarder = next(p for p in trace.get_processors()
                     if type(p).__name__ == "_TraceForwarder")
    spans = [
        trace.Span(span_id="span_a", trace_id="trace_agree", parent_id=None,
                   name="agree0", attrs={"i": 1, "s": "\u00e9", "f": 0.5,
                                         "b": False, "y": b"\x00"},
                   started_at="2024-01-02T03:04:05.123456Z",
                   ended_at="2024-01-02T03:04:06.000001Z", status="ok"),
        trace.Span(span_id="span_b", trace_id="trace_agree",
                   parent_id="span_a", name="agree1",
                   started_at="2024-01-02T03:04:05.123457Z",
                   ended_at="2024-01-02T03:04:05.123458Z"),
    ]
    fast = forwarder._send_span
    for span in spans:
        for general in (False, True):
            if general:
                forwarder._send_span = lambda *args: False
            try:
                forwarder.on_span_start(span)
                forwarder.on_span_end(span)
            finally:
                forwarder._send_span = fast
    return len(spans)


def traced_sync(tag):
    """Runs on a pool thread."""
    from agentix import trace
    with trace.span(tag):
        pass


async def traced_async(tag):
    """A span in the call's task and one in a task it starts."""
    from agentix import trace

    async def child():
        with trace.span(tag + "-child"):
            await asyncio.sleep(0)

    with trace.span(tag):
        await asyncio.create_task(child())


def trace_processors():
    """Names of the registered trace processors' classes."""
    from agentix import trace
    return [type(p).__name__ for p in trace.get_processors()]


def open_fds():
    """{fd: what it is} for every fd this process has open, and the fds a
    process it starts without close_fds inherits."""
    mine = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            mine[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the listing's own fd, closed by now
    child = subprocess.run(["/bin/sh", "-c", "/bin/ls /proc/$$/fd"], close_fds=False,
                           stdout=subprocess.PIPE, check=True, text=True)
    return {"worker": mine, "child": sorted(int(f) for f in child.stdout.split())}


def driver_loaders():
    """How the worker's driver modules were loaded ("bytecode" or "source")."""
    return sorted({str(module.__spec__.loader_state)
                   for name, module in list(sys.modules.items())
                   if name.split(".")[0] == "_agentix_driver"})


def agentix_hooks():
    """(trace processor class names, agentix.sio's bridge class name) of the
    stand-in agentix (testdata/slow_agentix); waits for its import."""
    import agentix.sio
    import agentix.utils.trace
    return ([type(p).__name__ for p in agentix.utils.trace.processors],
            type(agentix.sio.bridge).__name__)


def fork_child_importing_agentix(timeout):
    """Forks a child that imports agentix.utils.trace; its exit code (7 when
    the import worked), or "hung" if it did not exit within `timeout`."""
    pid = os.fork()
    if pid == 0:
        try:
            import agentix.utils.trace  # noqa: F401
            os._exit(7)
        finally:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


# ---- cold start: stdlib modules deferred at boot (driver/lazy.py)


def deferred_stdlib():
    """{module: thread that ran its body} for the modules the driver deferred
    at boot; waits (at most 10 s) for a load under way. Call it once the
    worker has been idle long enough for its warm-up to start."""
    from _agentix_driver import lazy
    deadline = time.monotonic() + 10
    while lazy.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    return {name: lazy.loaded_by.get(name) for name in lazy.DEFERRED}


def ssl_through_asyncio():
    """What a first call sees of ssl and asyncio's TLS pieces."""
    import ssl
    context = ssl.create_default_context()
    return [context.verify_mode == ssl.CERT_REQUIRED,
            asyncio.sslproto.SSLAgainErrors == (ssl.SSLWantReadError, ssl.SSLSyscallError),
            asyncio.base_events.ssl is ssl,
            asyncio.selector_events.sslproto is asyncio.sslproto,
            type(ssl).__name__]


def deferred_module_race(directory, threads, fail=False):
    """Defers a fresh module whose body takes 50 ms (or raises), then has
    `threads` threads read it at once. Returns (type before, values read,
    times its body ran, type after, still in sys.modules)."""
    import builtins
    import threading
    from _agentix_driver import lazy
    name = f"lazy_probe_{os.getpid()}_{int(fail)}"
    with open(os.path.join(directory, name + ".py"), "w") as f:
        f.write("import builtins, time\n"
                f"builtins._lazy_probe_runs = getattr(builtins, '_lazy_probe_runs', 0) + 1\n"
                "time.sleep(0.05)\n"
                + ("raise RuntimeError('boom')\n" if fail else "VALUE = 42\n"))
    sys.path.insert(0, directory)
    builtins._lazy_probe_runs = 0
    try:
        with lazy.deferring((name,)):
            module = __import__(name)
        before = type(module).__name__
        barrier = threading.Barrier(threads)
        seen = []

        def read():
            barrier.wait()
            try:
                seen.append(module.VALUE)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                seen.append(f"{type(exc).__name__}: {exc}")

        workers = [threading.Thread(target=read) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        return (before, sorted(set(map(str, seen))), builtins._lazy_probe_runs,
                type(module).__name__, name in sys.modules)
    finally:
        sys.path.remove(directory)


def deferred_package_race(directory):
    """Defers a fresh package whose body sleeps 100 ms, then imports its
    submodule; one thread reads the package (running that body), a second
    imports the submodule meanwhile. Returns (what each thread got, or
    "hung" if one still waits after 5 s; times the package's and the
    submodule's bodies ran; whether the package's `sub` is the one in
    sys.modules)."""
    import builtins
    import importlib
    import threading
    from _agentix_driver import lazy
    name = f"lazy_package_probe_{os.getpid()}"
    os.makedirs(os.path.join(directory, name), exist_ok=True)
    with open(os.path.join(directory, name, "__init__.py"), "w") as f:
        f.write("import builtins, time\n"
                "builtins._lazy_package_runs += 1\n"
                "time.sleep(0.1)\n"
                "from . import sub\n"
                "VALUE = sub.VALUE\n")
    with open(os.path.join(directory, name, "sub.py"), "w") as f:
        f.write("import builtins\n"
                "builtins._lazy_sub_runs += 1\n"
                "VALUE = 42\n")
    sys.path.insert(0, directory)
    builtins._lazy_package_runs = 0
    builtins._lazy_sub_runs = 0
    seen = {}
    try:
        with lazy.deferring((name,)):
            package = __import__(name)

            def read():
                seen["read"] = package.VALUE

            def import_sub():
                while builtins._lazy_package_runs == 0:  # the body runs
                    time.sleep(0.001)
                seen["import"] = importlib.import_module(name + ".sub").VALUE

            threads = [threading.Thread(target=read, daemon=True),
                       threading.Thread(target=import_sub, daemon=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(5)
            if any(t.is_alive() for t in threads):
                return ("hung", builtins._lazy_package_runs,
                        builtins._lazy_sub_runs, None)
        return (sorted(seen.items()), builtins._lazy_package_runs,
                builtins._lazy_sub_runs,
                package.sub is sys.modules[name + ".sub"])
    finally:
        sys.path.remove(directory)


def import_while_deferring_ends(directory):
    """Imports a fresh module while the boot thread leaves `deferring()`
    (as a call does when it runs during boot): a finder just before
    PathFinder ends the deferral when the import asks it. Returns the
    module's VALUE, or the import's error."""
    from _agentix_driver import lazy
    name = f"meta_path_probe_{os.getpid()}"
    with open(os.path.join(directory, name + ".py"), "w") as f:
        f.write("VALUE = 7\n")
    deferral = lazy.deferring(("not_imported_by_anyone",))

    class EndsDeferral:
        def find_spec(self, fullname, path=None, target=None):
            if fullname == name:
                deferral.__exit__(None, None, None)
            return None

    ender = EndsDeferral()
    sys.path.insert(0, directory)
    deferral.__enter__()
    at = next(i for i, f in enumerate(sys.meta_path)
              if getattr(f, "__name__", "") == "PathFinder")
    sys.meta_path.insert(at, ender)
    try:
        return __import__(name).VALUE
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        lazy.remove_finder(ender)
        sys.path.remove(directory)


def boot_imported(names):
    """Which of `names` were imported when the worker sent its ready frame."""
    from _agentix_driver import serve
    return sorted(name for name in names if name in serve.boot_modules)


_background_import = {}


def start_agentix_import():
    """Starts `import agentix` on a thread of its own and returns once that
    thread is executing the package's __init__ (holding its import lock)."""
    import threading

    def run():
        try:
            import agentix  # noqa: F401
            _background_import["result"] = "ok"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            _background_import["result"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, name="user-import")
    _background_import["thread"] = thread
    thread.start()
    deadline = time.monotonic() + 10
    while "agentix" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.001)
    return "agentix" in sys.modules


def background_agentix_import():
    """The outcome of start_agentix_import's import (waits for it)."""
    _background_import["thread"].join(30)
    return _background_import.get("result", "still running")

def thread_ident():
    """The calling thread's id (which pool thread ran the call)."""
    import threading
    return threading.get_ident()


_gate = {"running": 0, "peak": 0}
_gate_cond = __import__("threading").Condition()


def concurrency_gate(n, timeout):
    """Counts calls running here at once; each waits (at most `timeout` s)
    until `n` have been running together. Returns the peak so far."""
    with _gate_cond:
        _gate["running"] += 1
        _gate["peak"] = max(_gate["peak"], _gate["running"])
        _gate_cond.notify_all()
        _gate_cond.wait_for(lambda: _gate["peak"] >= n, timeout)
        _gate["running"] -= 1
        return _gate["peak"]


def coroutine_checks():
    """Where the driver's asyncio-free checks (calls.py, worker cold start)
    disagree with asyncio.iscoroutinefunction and inspect.isawaitable: a
    list of (kind, case) that differ, empty when they agree."""
    import functools
    import inspect
    import types
    from unittest import mock

    from _agentix_driver import calls

    async def coroutine_fn():
        return 1

    async def agen_fn():
        yield 1

    def plain():
        return 1

    marked = lambda: None  # noqa: E731
    marked._is_coroutine = asyncio.coroutines._is_coroutine

    class Holder:
        async def method(self):
            return 1

        def sync_method(self):
            return 1

        @staticmethod
        async def static():
            return 1

    class AsyncCallable:
        async def __call__(self):
            return 1

    class Awaitable:
        def __await__(self):
            yield

    @types.coroutine
    def legacy():
        yield

    functions = {
        "def": plain, "async def": coroutine_fn, "async generator": agen_fn,
        "lambda": lambda: 1, "bound async method": Holder().method,
        "bound sync method": Holder().sync_method, "static async": Holder.static,
        "partial(async)": functools.partial(coroutine_fn),
        "partial(partial(async))": functools.partial(functools.partial(coroutine_fn)),
        "partial(def)": functools.partial(plain), "async __call__": AsyncCallable(),
        "builtin": len, "builtin method": [].append, "method descriptor": str.upper,
        "partial(bound async method)": functools.partial(Holder().method),
        "class": Holder, "AsyncMock": mock.AsyncMock(),
        "Mock": mock.Mock(), "marked": marked,
    }
    coroutine = coroutine_fn()
    generator = (i for i in ())
    future = asyncio.get_event_loop_policy().new_event_loop().create_future()
    values = {
        "coroutine": coroutine, "generator": generator,
        "types.coroutine generator": legacy(), "future": future,
        "__await__": Awaitable(), "int": 1, "None": None,
        "Awaitable class": Awaitable,
    }
    differ = [("function", name) for name, fn in functions.items()
              if calls._iscoroutinefunction(fn) != asyncio.iscoroutinefunction(fn)]
    differ += [("value", name) for name, value in values.items()
               if calls._isawaitable(value) != inspect.isawaitable(value)]
    if (calls._CO_COROUTINE, calls._CO_ITERABLE_COROUTINE) != (
            inspect.CO_COROUTINE, inspect.CO_ITERABLE_COROUTINE):
        differ.append(("constant", "CO_*"))
    coroutine.close()
    future.get_loop().close()
    return differ


def swappable():
    return "first"


def swap_target():
    """Rebinds swappable in this module, as a reload or a monkeypatch would
    (the worker must call the new one, not one it remembered)."""
    global swappable

    async def swappable():
        return "second"

    return True


class _CountingChannel:
    """The worker's channel, counting the replies each flush writes."""

    def __init__(self, real):
        self._real = real
        self.pending = 0
        self.writes = []  # replies per write that carried any

    def send_result(self, *args):
        self._real.send_result(*args)
        self.pending += 1

    def flush(self):
        if self.pending:
            self.writes.append(self.pending)
            self.pending = 0
        return self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


def count_reply_writes():
    """From now on, the worker counts the replies each of its writes
    carries (reply_writes() returns them)."""
    gc.unfreeze()  # the worker was made at boot: frozen objects are not listed
    (worker,) = [o for o in gc.get_objects() if type(o).__name__ == "_Worker"]
    worker._channel = _CountingChannel(worker._channel)


def reply_writes():
    """The replies per write since count_reply_writes(), this call's not
    yet written."""
    gc.unfreeze()
    (worker,) = [o for o in gc.get_objects() if type(o).__name__ == "_Worker"]
    return list(worker._channel.writes)


def collector_walks(names):
    """Which of the modules `names` the cycle collector still walks (their
    namespace is in one of its generations, not frozen); waits for the
    warm-up thread first."""
    import threading
    for thread in threading.enumerate():
        if thread.name == "agentix-warmup":
            thread.join(30)
    walked = {id(o) for o in gc.get_objects()}
    return [name for name in names if id(vars(sys.modules[name])) in walked]


def record_factory_matches_stdlib():
    """Makes records with the worker's record factory (the stdlib's LogRecord
    built in C, or the factory's own path) and with logging.LogRecord from
    the same arguments, and compares them: the same class, the same
    attributes in the same order with the same values (the time-derived ones
    by their relation to `created`), agentix_context last. Returns how many
    records were compared. Raises AssertionError."""
    import multiprocessing
    import threading
    factory = logging.getLogRecordFactory()
    context = next(h for h in logging.getLogger().handlers
                   if type(h).__name__ == "_LogBridge")._context
    logging.addLevelName(27, "SEMI")
    exc_info = (ValueError, ValueError("x"), None)
    calls = [
        ("app.f", logging.INFO, __file__, 7, "m %d", (1,), None, "fn", None),
        ("app.f", logging.INFO, __file__, 8, "m %(a)s", ({"a": 1},), None,
         "fn", None),
        ("app.f", logging.INFO, __file__, 9, "m %s", ({},), None, None, None),
        ("app.f", logging.INFO, __file__, 9, "m %s", ("text",), None, None,
         None),
        ("app.f", 25, "/x/noext", 1, "m", (), exc_info, "g", "Stack:"),
        ("app.f", 27, "/x/.hidden", 1, "m", (), None, "g", None),
        ("app.f", "odd level", "", 0, "m", (), None, None, None),
        ("app.f", logging.ERROR, "/x/a.b.c", 1, "%d-%d", (1, 2), None, "g", None),
    ]

    def compare(made, args, kwargs, label, theirs=None):
        if theirs is None:
            theirs = logging.LogRecord(*args, **kwargs)
        if type(made) is not logging.LogRecord:
            raise AssertionError(f"{label}: {type(made)}")
        ours = dict(vars(made))
        if ours.pop("agentix_context") != context or (
                list(vars(made))[-1] != "agentix_context"):
            raise AssertionError(f"{label}: context not last or wrong")
        expected = vars(theirs)
        if list(ours) != list(expected):
            raise AssertionError(f"{label}: keys {list(ours)} != "
                                 f"{list(expected)}")
        created = made.created
        if not (isinstance(created, float) and abs(created - theirs.created) < 5
                and made.msecs == int((created - int(created)) * 1000) + 0.0
                and made.relativeCreated == (created - logging._startTime) * 1000
                and type(made.msecs) is float):
            raise AssertionError(f"{label}: times {created} {made.msecs} "
                                 f"{made.relativeCreated}")
        for key in ("created", "msecs", "relativeCreated"):
            ours.pop(key), expected.pop(key)
        if ours != expected or any(type(ours[k]) is not type(expected[k])
                                   for k in ours):
            raise AssertionError(f"{label}: {ours} != {expected}")
        if made.getMessage() != theirs.getMessage():
            raise AssertionError(f"{label}: message")

    count = 0
    for i, args in enumerate(calls):
        compare(factory(*args), args, {}, f"call {i}")
        count += 1
    # From a named thread; with multiprocessing imported and the process
    # renamed; with logging's switches off; by keyword (the factory's path).
    out = []
    worker = threading.Thread(
        target=lambda: out.extend((factory(*calls[0]),
                                   logging.LogRecord(*calls[0]))),
        name="named-thread")
    worker.start()
    worker.join()
    compare(out[0], calls[0], {}, "thread", out[1])
    if out[0].threadName != "named-thread":
        raise AssertionError("threadName")
    process = multiprocessing.current_process()
    saved_name = process.name
    process.name = "renamed"
    try:
        made = factory(*calls[0])
        compare(made, calls[0], {}, "process name")
        if made.processName != "renamed":
            raise AssertionError("processName")
    finally:
        process.name = saved_name
    switches = ("logThreads", "logProcesses", "logMultiprocessing")
    saved = [getattr(logging, name) for name in switches]
    try:
        for name in switches:
            setattr(logging, name, False)
        made = factory(*calls[0])
        compare(made, calls[0], {}, "switches off")
        if (made.thread, made.threadName, made.process,
                made.processName) != (None, None, None, None):
            raise AssertionError("switches")
    finally:
        for name, value in zip(switches, saved):
            setattr(logging, name, value)
    compare(factory(*calls[0][:7], func="kw", sinfo=None), calls[0][:7],
            {"func": "kw", "sinfo": None}, "keywords")
    count += 4
    # A forked child's records carry the child's pid.
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        made = factory(*calls[0])
        os._exit(0 if made.process == os.getpid() != parent else 1)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0 or factory(*calls[0]).process != parent:
        raise AssertionError("pid after fork")
    count += 1
    # time.time replaced (as test clocks do): the record honours it.
    saved_time = time.time
    time.time = lambda: 1_000_000.25
    try:
        made = factory(*calls[0])
    finally:
        time.time = saved_time
    if made.created != 1_000_000.25 or made.msecs != 250.0:
        raise AssertionError(f"replaced time.time: {made.created}")
    count += 1
    # threadName read from threading._active: a thread renamed while it
    # runs, one threading does not know (current_thread() makes a
    # _DummyThread), one whose class has its own `name`.
    import _thread

    class Named(threading.Thread):
        @property
        def name(self):
            return "from-the-class"

    def record():
        out.append((factory(*calls[0]), logging.LogRecord(*calls[0])))

    def renamed():
        threading.current_thread().name = "renamed-while-running"
        record()

    def unknown():
        record()
        done.release()

    out, done = [], threading.Lock()
    for thread in (threading.Thread(target=renamed), Named(target=record)):
        thread.start()
        thread.join()
    done.acquire()
    _thread.start_new_thread(unknown, ())
    done.acquire()
    for (made, theirs), label in zip(out, ("renamed", "class name", "dummy")):
        compare(made, calls[0], {}, label, theirs)
    if [made.threadName for made, _ in out[:2]] != [
            "renamed-while-running", "from-the-class"] or not (
                out[2][0].threadName.startswith("Dummy-")):
        raise AssertionError(f"thread names {[m.threadName for m, _ in out]}")
    count += 3
    # threading.get_ident replaced (as gevent's monkey-patching does): the
    # record's thread is what it answers (current_thread() then makes a
    # _DummyThread under that ident, as in the stdlib).
    saved_get_ident = threading.get_ident
    threading.get_ident = lambda: 12345
    try:
        made = factory(*calls[0])
        theirs = logging.LogRecord(*calls[0])
    finally:
        threading.get_ident = saved_get_ident
        threading._active.pop(12345, None)
    compare(made, calls[0], {}, "replaced get_ident", theirs)
    if made.thread != 12345:
        raise AssertionError(f"replaced get_ident: {made.thread}")
    count += 1
    # A child forked from another thread: threading makes that thread the
    # child's main one; its records name it and carry the child's pid.
    def fork_from_thread():
        child = os.fork()
        if child == 0:
            try:
                made = factory(*calls[0])
                compare(made, calls[0], {}, "forked from a thread")
                code = 0 if (made.threadName, made.process) == (
                    "forker", os.getpid()) else 3
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(child, 0)
        forked.append(os.waitstatus_to_exitcode(status))

    forked = []
    forker = threading.Thread(target=fork_from_thread, name="forker")
    forker.start()
    forker.join()
    if forked != [0]:
        raise AssertionError(f"forked from a thread: {forked}")
    count += 1
    # A mapping argument is told by isinstance, also for an exact float
    # once float is registered as a Mapping (abc's cache token changes).
    import collections.abc
    float_call = ("app.f", logging.INFO, __file__, 7, "m %s", (1.5,), None,
                  "fn", None)
    if factory(*float_call).args != (1.5,):
        raise AssertionError("float args before registering")
    # A class of the user's registered as a Mapping after its first record.
    class Lookup:
        pass

    lookup = Lookup()
    lookup_call = float_call[:5] + ((lookup,),) + float_call[6:]
    compare(factory(*lookup_call), lookup_call, {}, "before registering")
    collections.abc.Mapping.register(Lookup)
    made = factory(*lookup_call)
    compare(made, lookup_call, {}, "registered as a Mapping")
    if made.args is not lookup:
        raise AssertionError(f"registered class: {made.args!r}")
    collections.abc.Mapping.register(float)  # this worker's last test
    made = factory(*float_call)
    compare(made, float_call, {}, "float as a Mapping")
    if made.args != 1.5:
        raise AssertionError(f"float registered as a Mapping: {made.args!r}")
    return count + 2


def extension_modules():
    """Uses C extension modules loaded into the worker at run time: each binds
    to the worker's one libpython (static in the binary, or the shared one)."""
    import ctypes
    import decimal
    import ssl

    import numpy

    # ctypes.pythonapi resolves the C API from the process's own symbols.
    ctypes.pythonapi.PyLong_FromLong.restype = ctypes.py_object
    ctypes.pythonapi.PyLong_FromLong.argtypes = [ctypes.c_long]
    mapped = set()
    with open("/proc/self/maps", encoding="ascii") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libpython" in path:
                mapped.add(path)
    return {
        "pythonapi": ctypes.pythonapi.PyLong_FromLong(41) + 1,
        "decimal": str(decimal.Decimal("1.10") + decimal.Decimal("2.205")),
        "ssl": ssl.create_default_context().protocol == ssl.PROTOCOL_TLS_CLIENT,
        "asyncio": asyncio.run(asyncio.sleep(0, "slept")),
        "numpy": int(numpy.arange(10, dtype=numpy.int64).sum()),
        "libpython_mapped": sorted(mapped),
    }
