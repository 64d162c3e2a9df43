"""agentix.trace: ids, timestamps, spans, parenting, processors, JSONL output,
scope isolation and propagation through the context carrier (SPEC §5)."""

import asyncio
import contextvars
import datetime
import io
import json
import logging
import pickle
import random
import re
import threading
import uuid

import pytest

import agentix
from agentix.utils import context
from agentix.utils import trace as tr
from child_paths import run_in_fresh_interpreter

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


class Recorder(tr.Processor):
    """Records every callback as (method, name, object) into a shared list."""

    def __init__(self, log, tag="rec"):
        self.log = log
        self.tag = tag

    def on_trace_start(self, t):
        self.log.append((self.tag, "trace_start", t.name))

    def on_trace_end(self, t):
        self.log.append((self.tag, "trace_end", t.name))

    def on_span_start(self, s):
        self.log.append((self.tag, "span_start", s.name))

    def on_span_end(self, s):
        self.log.append((self.tag, "span_end", s.name))


@pytest.fixture(autouse=True)
def isolated_provider(monkeypatch):
    """Each test starts with no processors, tracing enabled and the warn-once
    flag cleared; the previous state is restored afterwards."""
    saved = tr.get_processors()
    tr.set_processors([])
    tr.set_tracing_disabled(False)
    monkeypatch.setattr(tr, "_warned_no_processor", False)
    yield
    tr.set_processors(saved)
    tr.set_tracing_disabled(False)


@pytest.fixture
def calls():
    log = []
    tr.add_processor(Recorder(log))
    return log


def run_isolated(fn):
    return contextvars.copy_context().run(fn)


# ── ids, timestamps, exports ────────────────────────────────────────


def test_id_formats_and_uniqueness():
    trace_ids = {tr.gen_trace_id() for _ in range(100)}
    span_ids = {tr.gen_span_id() for _ in range(100)}
    assert len(trace_ids) == len(span_ids) == 100
    assert all(re.fullmatch(r"trace_[0-9a-f]{32}", i) for i in trace_ids)
    assert all(re.fullmatch(r"span_[0-9a-f]{24}", i) for i in span_ids)


def test_ids_keep_the_uuid4_version_and_variant_bits():
    # Ids are cut from uuid4s: version nibble 4 at hex 12, variant 8-b at hex 16.
    for value in [tr.gen_trace_id()[6:] for _ in range(50)] + [tr.gen_span_id()[5:] for _ in range(50)]:
        assert value[12] == "4" and value[16] in "89ab", value
        assert uuid.UUID(value.ljust(32, "0")).version == 4


def test_ids_do_not_follow_the_programs_random_seed():
    random.seed(0)
    first = [tr.gen_span_id() for _ in range(3)] + [tr.gen_trace_id()]
    random.seed(0)
    again = [tr.gen_span_id() for _ in range(3)] + [tr.gen_trace_id()]
    assert not set(first) & set(again)


_FORKED_TRACE_IDS = """
import json, os
from agentix.utils import trace as tr
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its next ids to the parent, then out at once
    try:
        os.write(write_end, " ".join([tr.gen_span_id() for _ in range(5)] + [tr.gen_trace_id()]).encode())
    finally:
        os._exit(0)
os.close(write_end)
with os.fdopen(read_end, "rb") as pipe:
    child = pipe.read().decode().split()
os.waitpid(pid, 0)
parent = [tr.gen_span_id() for _ in range(5)] + [tr.gen_trace_id()]
print(json.dumps({"child": child, "parent": parent}))
"""


def test_a_forked_child_does_not_repeat_its_parents_ids():
    # Forked from a fresh interpreter (child_paths.run_in_fresh_interpreter says why).
    seen = json.loads(run_in_fresh_interpreter(_FORKED_TRACE_IDS).splitlines()[-1])
    child, parent = seen["child"], seen["parent"]
    assert len(child) == 6 and not set(child) & set(parent)


def test_now_matches_the_clock_across_seconds(monkeypatch):
    # _now reuses the formatted second; a new second must be formatted afresh.
    for ns in (1_700_000_000_123_456_789, 1_700_000_000_999_999_999, 1_700_000_001_000_000_000,
               1_700_000_000_000_001_000, 951_782_400_000_000_000,
               # 1970's first second (fewer than 7 microsecond digits) and the next ones.
               123_456_789, 0, 999_999_999, 1_000_000_000, 1_000_000_007_000, 5_000):
        monkeypatch.setattr(tr.time, "time_ns", lambda ns=ns: ns)
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        expected = epoch + datetime.timedelta(microseconds=ns // 1000)
        assert tr._now() == expected.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_timestamps_are_iso_utc_microseconds_and_ordered(calls):
    with tr.trace("t") as t:
        with tr.span("s") as s:
            s.add_event("e")
    for stamp in (t.started_at, t.ended_at, s.started_at, s.ended_at, s.events[0].timestamp):
        assert ISO.match(stamp), stamp
    assert t.started_at <= s.started_at <= s.events[0].timestamp <= s.ended_at <= t.ended_at


def test_exports():
    t = tr.Trace(trace_id="trace_x", name="run", metadata={"user": "ada"}, started_at="a", ended_at="b")
    assert t.export() == {"object": "trace", "id": "trace_x", "name": "run", "metadata": {"user": "ada"},
                          "started_at": "a", "ended_at": "b"}
    assert tr.Trace(trace_id="trace_y", name="n").export()["metadata"] is None
    s = tr.Span(span_id="span_1", trace_id="trace_x", parent_id=None, name="op")
    assert s.export() == {"object": "span", "id": "span_1", "trace_id": "trace_x", "parent_id": None,
                          "name": "op", "attrs": None, "started_at": None, "ended_at": None,
                          "status": "unset", "status_description": None, "error": None, "events": None}
    s.set_error("boom", code=7)
    s.add_event("tick", n=1)
    exported = s.export()
    assert exported["error"] == {"message": "boom", "data": {"code": 7}}
    assert exported["events"][0]["name"] == "tick" and exported["events"][0]["attributes"] == {"n": 1}


def test_public_names():
    assert len(tr.__all__) == len(set(tr.__all__)) == 25
    for name in tr.__all__:
        assert getattr(tr, name) is not None, name
    assert agentix.trace is tr
    assert "trace" in agentix.__all__
    assert isinstance(tr.__path__, list)  # pkgutil namespace package


# ── span API ────────────────────────────────────────────────────────


def test_attributes_status_events():
    with tr.span("op", a=1) as s:
        s.set_attribute("b", 2)
        s.set_attributes(c=3, a=10)
        s.set_status("ok", "fine")
        s.set_status("ok")
        s.add_event("first", x=1)
        s.add_event("second")
    assert s.attrs == {"a": 10, "b": 2, "c": 3}
    assert (s.status, s.status_description) == ("ok", "fine")
    assert [(e.name, e.attributes) for e in s.events] == [("first", {"x": 1}), ("second", {})]
    with pytest.raises(ValueError):
        s.set_status("failed")


def test_set_error_sets_status_only_when_unset():
    s = tr.Span(span_id="span_1", trace_id="t", parent_id=None, name="x")
    s.set_error("bad")
    assert s.error == tr.SpanError("bad", None)
    assert (s.status, s.status_description) == ("error", "bad")
    ok = tr.Span(span_id="span_2", trace_id="t", parent_id=None, name="y")
    ok.set_status("ok")
    ok.set_error("late", detail="d")
    assert ok.status == "ok"
    assert ok.error == tr.SpanError("late", {"detail": "d"})


def test_exception_in_span_records_error_and_reraises(calls):
    with pytest.raises(KeyError):
        with tr.span("failing") as s:
            raise KeyError("missing")
    assert s.error.message == "KeyError: 'missing'"
    assert s.status == "error"
    assert s.ended_at is not None
    assert calls[-1] == ("rec", "span_end", "failing")
    assert tr.get_current_span() is None


def test_existing_error_is_not_overwritten():
    with pytest.raises(RuntimeError):
        with tr.span("x") as s:
            s.set_error("mine", step=2)
            raise RuntimeError("other")
    assert s.error == tr.SpanError("mine", {"step": 2})


def test_base_exception_ends_span_without_error(calls):
    async def cancelled():
        with tr.span("task") as s:
            raise asyncio.CancelledError
        return s

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled())
    assert calls == [("rec", "span_start", "task"), ("rec", "span_end", "task")]


def test_span_as_a_decorator_opens_a_fresh_span_per_call(calls):
    seen = []

    @tr.span("step", kind="tool")
    def step(n):
        current = tr.get_current_span()
        seen.append((current.span_id, current.attrs))
        if n:
            raise ValueError(f"bad {n}")
        return n

    with tr.trace("run"):
        assert step(0) == 0
        with pytest.raises(ValueError):
            step(2)
    assert seen[0][0] != seen[1][0] and seen[0][1] == {"kind": "tool"}
    assert [c for c in calls if c[1].startswith("span")] == [
        ("rec", "span_start", "step"), ("rec", "span_end", "step"),
        ("rec", "span_start", "step"), ("rec", "span_end", "step"),
    ]
    assert tr.get_current_span() is None


def test_a_span_context_manager_is_entered_once():
    scope = tr.span("once")
    with scope as first:
        with pytest.raises(RuntimeError):
            scope.__enter__()
        assert tr.get_current_span() is first
    assert tr.get_current_span() is None and first.ended_at is not None


def test_a_base_exception_from_a_start_processor_still_ends_the_span():
    log = []

    class Interrupting(Recorder):
        def on_span_start(self, s):
            super().on_span_start(s)
            raise KeyboardInterrupt

    tr.add_processor(Interrupting(log))
    with pytest.raises(KeyboardInterrupt):
        with tr.span("interrupted"):
            pass
    assert log == [("rec", "span_start", "interrupted"), ("rec", "span_end", "interrupted")]
    assert tr.get_current_span() is None


# ── parenting and scope ─────────────────────────────────────────────


def test_nested_spans_parent_to_current_span():
    def body():
        with tr.trace("run", user="ada") as t:
            assert tr.get_current_trace() is t and tr.current_trace_id() == t.trace_id
            assert tr.get_current_span() is None
            with tr.span("outer") as outer:
                assert tr.current_span_id() == outer.span_id
                with tr.span("inner", span_id="span_custom") as inner:
                    assert tr.get_current_span() is inner
                assert tr.get_current_span() is outer
            with tr.span("sibling") as sibling:
                pass
        assert tr.get_current_trace() is None and tr.current_trace_id() is None
        return t, outer, inner, sibling

    t, outer, inner, sibling = run_isolated(body)
    assert t.metadata == {"user": "ada"}
    assert (outer.trace_id, outer.parent_id) == (t.trace_id, None)
    assert (inner.span_id, inner.trace_id, inner.parent_id) == ("span_custom", t.trace_id, outer.span_id)
    assert sibling.parent_id is None


def test_explicit_trace_id():
    with tr.trace("run", trace_id="trace_given") as t, tr.span("s") as s:
        pass
    assert t.trace_id == s.trace_id == "trace_given"


def test_span_without_trace_is_unbound():
    with tr.span("lonely") as s, tr.span("child") as child:
        pass
    assert s.trace_id == child.trace_id == "trace_unbound"
    assert s.parent_id is None and child.parent_id == s.span_id


def test_explicit_parent_span_and_trace():
    with tr.trace("run") as t, tr.span("root") as root:
        pass
    result = {}

    def in_thread():  # a plain thread has a fresh context: no current span
        assert tr.get_current_span() is None
        with tr.span("worker", parent=root) as s:
            result["span"] = s
        with tr.span("top", parent=t) as s2:
            result["top"] = s2

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert (result["span"].trace_id, result["span"].parent_id) == (t.trace_id, root.span_id)
    assert (result["top"].trace_id, result["top"].parent_id) == (t.trace_id, None)
    # an explicit parent wins over the current span
    with tr.trace("other"), tr.span("current"), tr.span("x", parent=root) as s3:
        pass
    assert (s3.trace_id, s3.parent_id) == (t.trace_id, root.span_id)
    with pytest.raises(TypeError):
        with tr.span("bad", parent="span_123"):
            pass


def test_nested_trace_starts_fresh_span_scope():
    with tr.trace("outer"), tr.span("s") as s:
        with tr.trace("inner") as inner, tr.span("t") as t_span:
            pass
        assert tr.get_current_span() is s
    assert (t_span.trace_id, t_span.parent_id) == (inner.trace_id, None)


@pytest.mark.asyncio
async def test_asyncio_tasks_have_independent_current_spans():
    both = asyncio.Barrier(2)
    seen = {}

    async def work(name):
        with tr.span(name) as s:
            await both.wait()  # both spans open at the same time
            seen[name] = (tr.get_current_span(), s)
            with tr.span(name + "-child") as child:
                await asyncio.sleep(0)
                seen[name + "-child"] = child

    with tr.trace("run"), tr.span("parent") as parent:
        await asyncio.gather(work("a"), work("b"))
        assert tr.get_current_span() is parent
    for name in ("a", "b"):
        current, own = seen[name]
        assert current is own
        assert own.parent_id == parent.span_id
        assert seen[name + "-child"].parent_id == own.span_id


def test_threads_have_independent_current_spans():
    barrier = threading.Barrier(4)
    errors = []

    def work(index):
        try:
            with tr.span(f"s{index}") as s:
                barrier.wait(timeout=5)
                assert tr.get_current_span() is s
                assert s.parent_id is None
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# ── propagation ─────────────────────────────────────────────────────


def test_context_carrier_contains_trace_and_span():
    def body():
        assert context.encode() is None
        with tr.trace("run") as t, tr.span("step") as s:
            carrier = context.encode()
        assert context.encode() is None
        return t, s, carrier

    t, s, carrier = run_isolated(body)
    decoded = context.decode(carrier)
    assert decoded["agentix_trace_current_trace"].trace_id == t.trace_id
    assert decoded["agentix_trace_current_span"].span_id == s.span_id

    def sandbox_side():  # what the sandbox does around the user's function
        with context.attach(decoded):
            with tr.span("remote") as remote:
                pass
        return remote

    remote = run_isolated(sandbox_side)
    assert (remote.trace_id, remote.parent_id) == (t.trace_id, s.span_id)


def test_objects_pickle():
    with tr.trace("run", k=[1]) as t, tr.span("s", a={"b": 1}) as s:
        s.add_event("e", v=2)
        s.set_error("x", y=1)
    assert pickle.loads(pickle.dumps(t)) == t
    assert pickle.loads(pickle.dumps(s)) == s


# ── provider ────────────────────────────────────────────────────────


def test_processors_called_in_order(calls):
    second = []
    tr.add_processor(Recorder(second, "two"))
    with tr.trace("t"):
        with tr.span("a"):
            with tr.span("b"):
                pass
    assert calls == [
        ("rec", "trace_start", "t"), ("rec", "span_start", "a"), ("rec", "span_start", "b"),
        ("rec", "span_end", "b"), ("rec", "span_end", "a"), ("rec", "trace_end", "t"),
    ]
    assert [c[1:] for c in second] == [c[1:] for c in calls]


def test_callbacks_see_state():
    seen = []

    class Check(tr.Processor):
        def on_span_start(self, s):
            seen.append(("start", s.started_at is not None, s.ended_at, tr.get_current_span() is s))

        def on_span_end(self, s):
            seen.append(("end", s.ended_at is not None, [e.name for e in s.events], s.status))

    tr.add_processor(Check())
    with tr.span("x") as s:
        s.add_event("ev")
        s.set_status("ok")
    assert seen == [("start", True, None, True), ("end", True, ["ev"], "ok")]


def test_add_dedups_remove_set_get():
    one, two = tr.Processor(), tr.Processor()
    tr.add_processor(one)
    tr.add_processor(one)
    tr.add_processor(two)
    assert tr.get_processors() == [one, two]
    tr.get_processors().clear()  # a copy
    assert tr.get_processors() == [one, two]
    tr.remove_processor(one)
    tr.remove_processor(one)  # absent: no error
    assert tr.get_processors() == [two]
    tr.set_processors([one, two, one])
    assert tr.get_processors() == [one, two]


def test_disabled_calls_nothing(calls):
    tr.set_tracing_disabled(True)
    with tr.trace("t"), tr.span("s") as s:
        assert tr.get_current_span() is s
    assert calls == []
    tr.set_tracing_disabled(False)
    with tr.span("s2"):
        pass
    assert len(calls) == 2


def test_processor_exceptions_are_logged_and_swallowed(calls, caplog):
    class Broken(tr.Processor):
        def on_span_start(self, s):
            raise RuntimeError("start broke")

        def on_span_end(self, s):
            raise RuntimeError("end broke")

        def force_flush(self):
            raise RuntimeError("flush broke")

        def shutdown(self):
            raise RuntimeError("shutdown broke")

    tr.set_processors([Broken(), *tr.get_processors()])
    with caplog.at_level(logging.ERROR, logger="agentix.trace"):
        with tr.span("s") as s:
            pass
        tr.force_flush()
        tr.shutdown()
    assert s.status == "unset"
    assert calls == [("rec", "span_start", "s"), ("rec", "span_end", "s")]  # later processors still called
    messages = [r.getMessage() + str(r.exc_info[1]) for r in caplog.records if r.name == "agentix.trace"]
    for text in ("start broke", "end broke", "flush broke", "shutdown broke"):
        assert any(text in m for m in messages), text


def test_force_flush_and_shutdown_reach_every_processor():
    called = []

    class P(tr.Processor):
        def force_flush(self):
            called.append("flush")

        def shutdown(self):
            called.append("shutdown")

    tr.set_processors([P(), P()])
    tr.force_flush()
    tr.shutdown()
    assert called == ["flush", "flush", "shutdown", "shutdown"]


def test_warns_once_without_processor(caplog):
    with caplog.at_level(logging.WARNING, logger="agentix.trace"):
        with tr.trace("t"), tr.span("a"):
            pass
        with tr.span("b"):
            pass
    warnings = [r for r in caplog.records if "no trace Processor is registered" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].getMessage().startswith("trace span ended but no trace Processor is registered")


def test_exporter_is_abstract():
    with pytest.raises(TypeError):
        tr.Exporter()

    class ListExporter(tr.Exporter):
        def __init__(self):
            self.items = []

        def export(self, items):
            self.items.extend(items)

    exporter = ListExporter()
    exporter.export([tr.Trace(trace_id="trace_1", name="t")])
    exporter.shutdown()
    assert len(exporter.items) == 1


# ── built-in processors ─────────────────────────────────────────────


def test_jsonl_processor_lines(tmp_path):
    path = tmp_path / "deep" / "dir" / "trace.jsonl"
    processor = tr.JsonlProcessor(path)
    tr.add_processor(processor)
    with tr.trace("run", when=object()) as t:
        with tr.span("step", n=1) as s:
            s.add_event("e")
        assert len(path.read_text().splitlines()) == 1  # flushed per line
    processor.shutdown()
    processor.shutdown()  # idempotent
    with tr.span("after"):  # dropped after shutdown, no error
        pass
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["object"] for line in lines] == ["span", "trace"]
    assert lines[0] == json.loads(json.dumps(s.export()))
    assert lines[1]["id"] == t.trace_id
    assert lines[1]["metadata"]["when"].startswith("<object object")  # default=str


def test_jsonl_filters_and_appends(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"object": "old"}\n')
    spans_only = tr.JsonlProcessor(path, traces=False)
    traces_only = tr.JsonlProcessor(tmp_path / "traces.jsonl", spans=False)
    tr.set_processors([spans_only, traces_only])
    with tr.trace("run"), tr.span("s"):
        pass
    tr.shutdown()
    assert [json.loads(line)["object"] for line in path.read_text().splitlines()] == ["old", "span"]
    assert [json.loads(line)["object"] for line in (tmp_path / "traces.jsonl").read_text().splitlines()] == ["trace"]


def test_jsonl_concurrent_lines_do_not_interleave(tmp_path):
    path = tmp_path / "c.jsonl"
    tr.collect(path, traces=False)

    def work(index):
        for n in range(50):
            with tr.span(f"t{index}", payload="x" * 2000, n=n):
                pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tr.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["object"] == "span" for line in lines)


def test_collect_registers_and_returns(tmp_path):
    processor = tr.collect(tmp_path / "run.jsonl", spans=False)
    assert isinstance(processor, tr.JsonlProcessor)
    assert tr.get_processors() == [processor]
    assert (processor.spans, processor.traces) == (False, True)
    with tr.trace("run"), tr.span("s"):
        pass
    processor.shutdown()
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["object"] for line in lines] == ["trace"]


def test_console_processor_indents_by_depth():
    stream = io.StringIO()
    tr.add_processor(tr.ConsoleProcessor(stream=stream))
    with tr.trace("run"), tr.span("outer"):
        with tr.span("inner") as inner:
            inner.add_event("tick", k=1)
        with pytest.raises(ValueError), tr.span("bad"):
            raise ValueError("nope")
    lines = stream.getvalue().splitlines()
    starts = [(len(line) - len(line.lstrip()), line.split()[:3]) for line in lines]
    assert starts == [
        (0, ["trace", "start", "run"]),
        (2, ["span", "start", "outer"]),
        (4, ["span", "start", "inner"]),
        (6, ["event", "tick", "{'k':"]),
        (4, ["span", "end", "inner"]),
        (4, ["span", "start", "bad"]),
        (4, ["span", "end", "bad"]),
        (2, ["span", "end", "outer"]),
        (0, ["trace", "end", "run"]),
    ]
    assert "error: ValueError: nope" in lines[6]
    assert lines[-1].endswith(" ms)")
