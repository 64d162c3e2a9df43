"""--calls_cpu (on by default: auto) and AGENTIX_CALLS_CPU (docs/FRAME-WIRE.md,
"Wake-ups"): while calls come one at a time, the daemon's frame-wire
connection thread and its worker reader run on one CPU, and the worker's thread
waiting for the next call waits on it too, but gets the whole mask back before
it runs the call: user code and the threads it starts are never pinned. While
calls overlap nothing is pinned. A frame-wire host's HELLO agentix-calls-cpu
chooses the CPU; the Python host's AGENTIX_CALLS_CPU pins its event loop's
thread."""

import asyncio
import contextlib
import os
import threading
import time

import e2e_targets as t
import pytest
from test_frame_wire_daemon import MESSAGE, TOKEN, FrameClient, _token_file

from agentix import AsyncClientNamespace, RuntimeClient, request_handler
from agentix.runtime.v1 import runtime_pb2 as pb

# The daemon's threads --calls_cpu places (by name).
DAEMON_PATH_THREADS = ("agx-frames", "agx-wrk-read")
# Why a test watching those threads' placement runs relayed under
# AGENTIX_TEST_DIRECT_CALLS: a direct call never passes them, so the daemon
# places nothing (docs/DIRECT-CALLS.md, "Flag and default").
PLACES_THE_DAEMONS_PATH = "asserts where the daemon places its relay threads"


def _threads(pid):
    """{tid: (name, allowed CPUs as a frozenset)} of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, frozenset(os.sched_getaffinity(int(tid))))
        except OSError:
            continue  # ended meanwhile
    return out


def _worker_pid(daemon_pid):
    children = []
    for tid in os.listdir(f"/proc/{daemon_pid}/task"):
        try:
            with open(f"/proc/{daemon_pid}/task/{tid}/children") as f:
                children += [int(p) for p in f.read().split()]
        except OSError:
            continue  # ended meanwhile
    assert len(children) == 1, children
    return children[0]


def _path(daemon_pid, names=DAEMON_PATH_THREADS):
    """The CPU sets of the daemon's threads named `names`."""
    return {cpus for name, cpus in _threads(daemon_pid).values() if name in names}


def _pinned_worker_threads(daemon_pid, settle_s=2.0):
    """{tid: CPUs} of the worker's threads that are pinned (fewer CPUs than the
    process may use), once some are (bounded): the thread waiting for the next
    call pins itself just before it blocks."""
    everywhere = frozenset(os.sched_getaffinity(0))
    deadline = time.monotonic() + settle_s
    while True:
        pinned = {tid: cpus for tid, (_, cpus) in _threads(_worker_pid(daemon_pid)).items()
                  if cpus != everywhere}
        if pinned or time.monotonic() > deadline:
            return pinned
        time.sleep(0.01)


def _waits_as_placed(pinned, cpu):
    """Whether the worker's pinned threads (`pinned`, as _pinned_worker_threads
    gives them) are one waiting for the next call on `cpu` (the call path's)
    and at most one follower waiting off it, on every other CPU (so that the
    follower's 1 ms timer fires away from the call path)."""
    everywhere = frozenset(os.sched_getaffinity(0))
    masks = list(pinned.values())
    return (masks.count(frozenset({cpu})) == 1
            and masks.count(everywhere - {cpu}) == len(masks) - 1 <= 1)


def _worker_settles_pinned_to(daemon_pid, cpu, settle_s=2.0):
    """Whether the worker's pinned threads come to be placed for `cpu`
    (_waits_as_placed; bounded)."""
    deadline = time.monotonic() + settle_s
    while True:
        if _waits_as_placed(_pinned_worker_threads(daemon_pid), cpu):
            return True
        if time.monotonic() > deadline:
            print("worker threads:", sorted(_threads(_worker_pid(daemon_pid)).values()))
            return False
        time.sleep(0.01)


def _allowed():
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "needs a machine with two CPUs to tell pinned from free"
    return allowed


async def test_with_calls_cpu_auto_only_the_call_paths_waits_are_pinned_never_user_code(start_daemon):
    everywhere = sorted(_allowed())
    # (the default, probe, places the daemon's call path as auto does once its
    # probe has chosen, on every machine that has two CPUs)
    daemon = start_daemon(extra_args=["--calls_cpu=auto"], relayed_only=PLACES_THE_DAEMONS_PATH)
    async with RuntimeClient(daemon.url) as client:
        for _ in range(8):
            tid, in_call, in_thread = await client.remote(t.cpus_in_call)
            # The call, and a thread it starts, may use every CPU the daemon may.
            assert in_call == everywhere
            assert in_thread == everywhere
        path = _path(daemon.proc.pid)
        assert len(path) == 1
        (cpu,) = path
        assert len(cpu) == 1 and cpu <= frozenset(everywhere)
        # One worker thread waits for the next call, pinned to the call path's
        # CPU (the one that ran the last call, or the follower that took the
        # intake over while it ran); a follower, if one waits, waits off that
        # CPU; no other worker thread is pinned.
        (path_cpu,) = cpu
        assert _worker_settles_pinned_to(daemon.proc.pid, path_cpu)
        assert _path(daemon.proc.pid, ("agx-grpc",)) == {frozenset(everywhere)}

        # Overlapping calls: nothing on the call path is pinned.
        for _ in range(10):
            await asyncio.gather(*(client.remote(os.getpid) for _ in range(200)))
            if _path(daemon.proc.pid) == {frozenset(everywhere)}:
                break
        assert _path(daemon.proc.pid) == {frozenset(everywhere)}

        # One at a time again: pinned after a run of single results.
        for _ in range(100):
            await client.remote(os.getpid)
        path = _path(daemon.proc.pid)
        assert len(path) == 1 and len(next(iter(path))) == 1
        tid, in_call, in_thread = await client.remote(t.cpus_in_call)
        assert in_call == in_thread == everywhere


@pytest.mark.parametrize("kind", ["relayed", "direct"])
async def test_with_calls_cpu_off_nothing_is_pinned(start_daemon, monkeypatch, kind):
    """Direct calls too: their worker's intake follower, which otherwise waits
    off the CPU the holder last offered from, is not pinned (the daemon tells
    the worker --noavoid_holder_cpu)."""
    everywhere = frozenset(os.sched_getaffinity(0))
    if kind == "direct":
        monkeypatch.setenv("AGENTIX_CALLS_WIRE", "frames")
        monkeypatch.setenv("AGENTIX_CALLS_DIRECT", "auto")
        daemon = start_daemon(extra_args=["--calls_cpu=off", "--direct_calls", "--log_level=debug"])
    else:
        daemon = start_daemon(extra_args=["--calls_cpu=off"], relayed_only="the relayed case of two")
    async with RuntimeClient(daemon.url) as client:
        for _ in range(5):
            await client.remote(os.getpid)
        assert _path(daemon.proc.pid, DAEMON_PATH_THREADS + ("agx-grpc",)) == {everywhere}
        assert _pinned_worker_threads(daemon.proc.pid, settle_s=0.2) == {}
    if kind == "direct":  # the calls went direct: the worker reported the connection's end
        deadline = time.monotonic() + 10
        while "direct connection" not in daemon.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "direct connection" in daemon.log(), daemon.log()[-4000:]


def _call_on(client, n, name):
    """n sequential calls on a raw frame-wire connection (ids unique by `name`)."""
    for i in range(n):
        client.call(f"{name}-{i}", "e2e_targets::noop")
        kind, payload = client.read()
        assert kind == MESSAGE
        (event,) = pb.CallsResponse.FromString(payload).events
        assert event.WhichOneof("kind") == "result"


def test_a_frame_wire_hosts_hello_names_the_cpu_latest_wins_bad_ones_ignored(start_daemon, tmp_path):
    allowed = sorted(_allowed())
    daemon = start_daemon(extra_args=["--calls_cpu=auto", "--token-file", _token_file(tmp_path)])
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    clients = []
    for cpu in (allowed[0], allowed[-1], allowed[0]):
        c = FrameClient(calls_path)
        clients.append(c)
        c.hello(client_id=f"host{len(clients)}", extra=[("agentix-calls-cpu", str(cpu))])
        _call_on(c, 3, f"host{len(clients)}")
        assert _path(daemon.proc.pid, ("agx-wrk-read",)) == {frozenset({cpu})}
        # Read thread by thread, /proc can show the intake changing hands (the
        # last leader still pinned, the next one already): settled within 2 s.
        assert _worker_settles_pinned_to(daemon.proc.pid, cpu)
    # Not a CPU this daemon may use, or not a number: ignored (the calls work,
    # the last good host's CPU stays).
    for bad in ("99999", "-1", "one"):
        c = FrameClient(calls_path)
        clients.append(c)
        c.hello(client_id=f"host{len(clients)}", extra=[("agentix-calls-cpu", bad)])
        _call_on(c, 2, f"host{len(clients)}")
        assert _path(daemon.proc.pid, ("agx-wrk-read",)) == {frozenset({allowed[0]})}
    for c in clients:
        c.close()


@pytest.mark.parametrize("value", ["nope", "-1", "99999"])
def test_a_bad_calls_cpu_stops_the_daemon_with_the_reason(start_daemon, value):
    with pytest.raises(RuntimeError) as failed:
        start_daemon(extra_args=[f"--calls_cpu={value}"])
    assert "--calls_cpu" in str(failed.value)
    assert value in str(failed.value)


async def test_host_calls_cpu_pins_the_event_loop_thread(daemon, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "auto")
    try:
        async with RuntimeClient(daemon.url) as client:
            assert await client.remote(os.getpid) > 0
            assert os.sched_getaffinity(0) == {max(before)}
    finally:
        os.sched_setaffinity(0, before)


async def test_host_calls_cpu_refuses_a_bad_value(daemon, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "the-fast-one")
    with pytest.raises(ValueError, match="AGENTIX_CALLS_CPU"):
        async with RuntimeClient(daemon.url) as client:
            await client.remote(os.getpid)
    assert os.sched_getaffinity(0) == before


def _allowed_list(tid):
    """The CPUs thread `tid` of this process may run on, as /proc says (a set)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        (line,) = [l for l in f if l.startswith("Cpus_allowed_list:")]
    cpus = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


@contextlib.contextmanager
def _masks_of(tid):
    """Another thread samples thread `tid`'s CPU mask every 10 ms while the
    block runs (a call in flight); yields the list the samples go to."""
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(frozenset(_allowed_list(tid)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


async def test_pinned_waits_pin_the_loop_thread_only_while_a_call_is_in_flight(start_daemon, monkeypatch):
    before = os.sched_getaffinity(0)
    assert len(before) >= 2, "needs a machine with two CPUs to tell pinned from free"
    cpu = max(before)
    monkeypatch.setenv("AGENTIX_CALLS_CPU", "wait:auto")
    daemon = start_daemon(extra_args=["--calls_cpu=auto"])
    loop_tid = threading.get_native_id()
    try:
        async with RuntimeClient(daemon.url) as client:
            for _ in range(20):  # sequential calls: user code after each runs unpinned
                assert await client.remote(os.getpid) > 0
                assert os.sched_getaffinity(0) == before
            with _masks_of(loop_tid) as seen:
                await client.remote(time.sleep, 0.5)
            assert os.sched_getaffinity(0) == before
            assert seen.count(frozenset({cpu})) >= len(seen) // 2 > 0, seen
            # Overlapping calls wait unpinned; the next sequential one is pinned again.
            with _masks_of(loop_tid) as seen:
                await asyncio.gather(*(client.remote(time.sleep, 0.3) for _ in range(2)))
            # The first call is pinned until the second starts (microseconds later):
            # only a first sample may have caught that.
            assert len(seen) > 1 and set(seen[1:]) == {frozenset(before)}, seen
            assert os.sched_getaffinity(0) == before
    finally:
        os.sched_setaffinity(0, before)


def _thread_cpus(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        (line,) = [l for l in f if l.startswith("Cpus_allowed_list:")]
    cpus = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return sorted(cpus)


class CpuWatch(AsyncClientNamespace):
    """Answers "mask" with the CPUs of the sandbox thread it names, once it
    is pinned to one (the worker's loop pins itself as it blocks, which may
    come a little after its request got here), or after `settle_s`."""

    def __init__(self, settle_s):
        super().__init__("/cpu")
        self.settle_s = settle_s

    @request_handler("mask")
    async def on_mask(self, who):
        deadline = time.monotonic() + self.settle_s
        while True:
            cpus = _thread_cpus(who["pid"], who["tid"])
            if len(cpus) == 1 or time.monotonic() > deadline:
                return cpus
            await asyncio.sleep(0.002)


@pytest.mark.parametrize("calls_cpu, sandbox_setting", [("auto", "wait"), ("auto", ""), ("off", "wait")])
async def test_the_worker_loop_awaits_a_namespace_reply_pinned_only_when_the_sandbox_names_it(
        start_daemon, calls_cpu, sandbox_setting):
    # Pinned only with AGENTIX_CALLS_CPU named in the sandbox and a call path
    # the daemon placed: unset, a request's two event loops work beside each
    # other (docs/DECISIONS.md, "stop-63: namespace traffic is not pinned").
    everywhere = sorted(_allowed())
    env = {"AGENTIX_CALLS_CPU": sandbox_setting} if sandbox_setting else None
    daemon = start_daemon(extra_args=[f"--calls_cpu={calls_cpu}"], env=env)
    pins = calls_cpu == "auto" and sandbox_setting == "wait"
    client = RuntimeClient(daemon.url)
    client.register_namespace(CpuWatch(settle_s=2.0 if pins else 0.3))
    async with client:
        answers = await client.remote(t.request_loop_masks, 5)
        path = _path(daemon.proc.pid)
    # Sandbox code (the request's caller, once the reply came) always runs unpinned.
    assert [after for _, after in answers] == [everywhere] * 5
    seen = [sorted(cpus) for cpus in path]
    if not pins:
        assert [saw for saw, _ in answers] == [everywhere] * 5
        return
    # Waiting for the reply, the loop thread was pinned to the daemon's call-path CPU.
    assert len(seen) == 1 and len(seen[0]) == 1, seen
    assert [saw for saw, _ in answers] == [seen[0]] * 5


def _probe_choice(daemon, timeout_s=10.0):
    """(choice, figures) from the daemon's start-up log line of --calls_cpu=probe."""
    import re

    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(r"calls_cpu probe: (pin|pin_daemon|off) \((.+)\); same-CPU round trip "
                          r"([\d.]+) us, cross-CPU ([\d.]+) us, sched_setaffinity ([\d.]+) us, (\d+) CPUs \((-?\d+) idle\)",
                          daemon.log())
        if found:
            return found.group(1), [float(v) for v in found.groups()[2:]]
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.02)


async def test_calls_cpu_probe_serves_calls_reports_its_choice_and_tells_the_hosts_that_ask(start_daemon, tmp_path):
    from agentix.runtime.client.hello import decode_hello

    before = frozenset(_allowed())
    daemon = start_daemon(extra_args=["--calls_cpu=probe", "--token-file", _token_file(tmp_path)])
    choice, (same, cross_cpu, affinity, cpus, idle) = _probe_choice(daemon)
    assert same > 0 and cross_cpu > 0 and affinity > 0 and cpus == len(before) and 0 <= idle <= cpus
    # A frame-wire host that asks is told whether to pin its waits; one that
    # does not ask is told nothing (its first frame is its call's result).
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    asking, silent = FrameClient(calls_path), FrameClient(calls_path)
    asking.hello(client_id="asking", extra=[("agentix-calls-cpu-follow", "1")])
    kind, payload = asking.read()
    assert kind == 1 and decode_hello(payload) == [("agentix-calls-cpu", "wait" if choice == "pin" else "off")]
    silent.hello(client_id="silent")
    _call_on(silent, 3, "silent")
    _call_on(asking, 70, "asking")  # past the 64 sequential reads that pin
    # The daemon's call path is placed as chosen.
    path = _path(daemon.proc.pid, ("agx-wrk-read",))
    if choice == "off":
        assert path == {before}
    else:
        assert len(path) == 1 and len(next(iter(path))) == 1
    asking.close()
    silent.close()
    # The Python host (default setting) asks, and its loop thread waits pinned
    # only if the probe chose the whole placement.
    loop_tid = threading.get_native_id()
    try:
        async with RuntimeClient(daemon.url, token=TOKEN) as client:
            for _ in range(20):
                assert await client.remote(os.getpid) > 0
            with _masks_of(loop_tid) as seen:
                await client.remote(time.sleep, 0.5)
        assert seen
        if choice == "pin":
            assert seen.count(before) < len(seen), seen
        else:
            assert set(seen) == {before}, seen
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize("sandbox_setting", ["", "wait"])
async def test_the_worker_loops_reply_waits_pin_whatever_the_probe_chose_only_when_named(start_daemon, sandbox_setting):
    # Unset in the sandbox, the worker's namespace-reply waits never pin, also
    # when the probe tells the hosts to pin their calls' waits ("pin"); named
    # there, they pin to the call path's CPU whenever the daemon placed it
    # ("pin" or "pin_daemon").
    everywhere = sorted(_allowed())
    env = {"AGENTIX_CALLS_CPU": sandbox_setting} if sandbox_setting else None
    daemon = start_daemon(extra_args=["--calls_cpu=probe"], env=env,
                          relayed_only=PLACES_THE_DAEMONS_PATH)
    choice, _ = _probe_choice(daemon)
    pins = bool(sandbox_setting) and choice != "off"
    client = RuntimeClient(daemon.url)
    client.register_namespace(CpuWatch(settle_s=2.0 if pins else 0.3))
    async with client:
        await client.remote(t.request_loop_masks, 1)  # the worker has read the placement
        answers = await client.remote(t.request_loop_masks, 5)
        path = _path(daemon.proc.pid, ("agx-wrk-read",))
    print("probe chose", choice)  # (pytest -s)
    assert [after for _, after in answers] == [everywhere] * 5
    if not pins:
        assert [saw for saw, _ in answers] == [everywhere] * 5
        if choice != "off":  # the daemon's own call path stays placed
            assert len(path) == 1 and len(next(iter(path))) == 1, path
        return
    (cpus,) = path
    assert len(cpus) == 1 and [saw for saw, _ in answers] == [sorted(cpus)] * 5


def _call_reading_answers(client, call_id):
    """One noop call on a raw frame-wire connection, read up to its result;
    the daemon's HELLO answers (`agentix-calls-cpu`) that came before it."""
    from agentix.runtime.client.hello import decode_hello

    told = []
    client.call(call_id, "e2e_targets::noop")
    while True:
        kind, payload = client.read()
        if kind == 1:  # HELLO
            (key, value), = decode_hello(payload)
            assert key == "agentix-calls-cpu"
            told.append(value)
            continue
        assert kind == MESSAGE
        if pb.CallsResponse.FromString(payload).events[0].WhichOneof("kind") == "result":
            return told


def _told_on(client, name, want, timeout_s=20.0):
    """Sequential calls on a raw frame-wire connection, with pauses between
    them (a re-probe waits for one), until the daemon's HELLO answer `want`
    arrives among their frames; the answers seen, in order."""
    told, deadline, i = [], time.monotonic() + timeout_s, 0
    while want not in told:
        assert time.monotonic() < deadline, f"never told {want!r} (told {told})"
        told += _call_reading_answers(client, f"{name}-{i}")
        i += 1
        time.sleep(0.15)
    return told


def _latest_choice_becomes(daemon, client, want, force, timeout_s=20.0):
    """Sequential calls with pauses (a re-probe waits for one) until the
    daemon's latest logged probe choice is `want`; `force()` before each (a
    probe running when the test changed its thread's mask gives its own mask
    back as it ends)."""
    import re

    deadline, i = time.monotonic() + timeout_s, 0
    while True:
        force()
        choices = re.findall(r"calls_cpu (?:re-)?probe: (\w+) \(", daemon.log())
        if choices and choices[-1] == want:
            return
        assert time.monotonic() < deadline, f"never chose {want!r} (chose {choices})"
        _call_reading_answers(client, f"until-{want}-{i}")  # (its answers: not asked)
        i += 1
        time.sleep(0.15)


def test_calls_cpu_probe_measures_again_in_pauses_and_tells_each_change_to_the_hosts_that_asked(start_daemon, tmp_path):
    import resource

    from agentix.runtime.client.hello import decode_hello

    # A re-probe at most every 0.3 s (the default is a minute). Two ways to make
    # the real probe choose otherwise: no file descriptor left for its
    # socketpair (a failed probe keeps the placement before it: the hosts
    # pin, "wait"), or one CPU allowed to its thread (nothing to place: "off").
    daemon = start_daemon(extra_args=["--calls_cpu=probe", "--calls_cpu_reprobe_s=0.3",
                                      "--token-file", _token_file(tmp_path)])
    pid = daemon.proc.pid
    choice, _ = _probe_choice(daemon)
    first = "wait" if choice == "pin" else "off"
    calls_path = daemon.socket_path.with_name(daemon.socket_path.name + ".calls")
    changes, once = FrameClient(calls_path), FrameClient(calls_path)
    changes.hello(client_id="changes", extra=[("agentix-calls-cpu-follow", "2")])
    once.hello(client_id="once", extra=[("agentix-calls-cpu-follow", "1")])
    for client in (changes, once):
        kind, payload = client.read()
        assert kind == 1 and decode_hello(payload) == [("agentix-calls-cpu", first)]
    _call_on(changes, 3, "booted")  # (the worker boots with all of the daemon's files)
    # The prober's thread: the first of that name (a probe's echo thread
    # renames itself, but is "agx-probe" for its first microseconds).
    probe_tid = min(tid for tid, (name, _) in _threads(pid).items() if name == "agx-probe")
    allowed = _allowed()
    files = resource.prlimit(pid, resource.RLIMIT_NOFILE)

    def force(answer):
        if answer == "wait":
            os.sched_setaffinity(probe_tid, allowed)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, files[1]))
        else:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, files)
            os.sched_setaffinity(probe_tid, {min(allowed)})

    try:
        for answer in (("wait", "off") if first == "off" else ("off", "wait")):
            force(answer)
            assert _told_on(changes, f"to-{answer}", answer)[-1] == answer
            if answer == "off":
                # One CPU to place on: the daemon's call path is unpinned too
                # (each thread at its next call). Hosts are told "off" for
                # pin_daemon as well, which a re-probe that began before the
                # probe's thread lost its CPUs may have chosen (its idle window
                # is 50 ms), and such a probe gives its thread's mask back as it
                # ends: wait, forcing again, until the latest choice is `off`.
                _latest_choice_becomes(daemon, changes, "off", lambda: force("off"))
                _call_on(changes, 2, f"after-{answer}")
                assert _path(pid, ("agx-wrk-read",)) == {frozenset(allowed)}
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, files)
    assert "calls_cpu re-probe" in daemon.log()
    # The host that asked for the first answer only was told nothing more.
    _call_on(once, 5, "once")
    changes.close()
    once.close()


def test_the_start_up_probe_waits_for_a_prestarted_workers_boot(start_daemon):
    # Its two busy threads would take CPU from the boot, a cold create's
    # critical path (stop 34). A long limit: a loaded machine's boot can take seconds.
    import re

    daemon = start_daemon(extra_args=["--calls_cpu=probe", "--prestart-worker", "--log-level=debug",
                                      "--calls_cpu_probe_wait_ms=60000"])
    _probe_choice(daemon, timeout_s=60.0)
    log = daemon.log()
    ready = re.search(r"worker \S+ ready", log)
    assert ready is not None, log
    assert log.index("calls_cpu probe:") > ready.start(), log


@pytest.mark.parametrize("value", ["-1", "600001", "soon"])
def test_a_bad_start_up_probe_wait_stops_the_daemon_with_the_reason(start_daemon, value):
    with pytest.raises(RuntimeError) as failed:
        start_daemon(extra_args=["--calls_cpu=probe", f"--calls_cpu_probe_wait_ms={value}"])
    assert "calls_cpu_probe_wait_ms" in str(failed.value)
