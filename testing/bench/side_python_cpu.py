"""The Python part of the worker's cost per log record and per span, A/B.

Loads the worker's driver (the worker/driver/ package, or an older
single-file driver.py) into a plain /usr/bin/python3 with a stand-in for the
C module `_agentix_worker` (its channel calls do nothing), installs the log
bridge and the durable log on the root logger and the trace forwarder as the
only processor, and times `log_burst` / `span_burst`-like loops on one thread
(thread CPU time). Nothing else runs beside it, so the figures move much
less with the machine's load than a whole pipeline's do. Newer drivers do
part of this work in C (send_log_record, send_span: counted as free here,
as the keyword sends are; write_log_line: declined, so the durable log is
measured on its Python path): compare those with side_cpu.py. Each variant runs in a
fresh process, in alternating order:

    /usr/bin/python3 testing/bench/side_python_cpu.py \\
        --driver /tmp/before/driver.py --agentix /tmp/before/site \\
        --driver worker/driver --agentix host/python [--rounds 5]

(`git show <commit>:worker/driver.py` gives an older driver; --agentix is the
directory holding that version's `agentix` package.)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, logging, marshal, os, sys, tempfile, time, types

driver_path, agentix_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, agentix_dir)
stand_in = types.ModuleType("_agentix_worker")
stand_in.msgpack_dumps = marshal.dumps  # C, like the real encoder
stand_in.log = lambda *args: None
stand_in.write_log_line = lambda *args: -1  # the durable log's Python path
sys.modules["_agentix_worker"] = stand_in
driver = types.ModuleType("driver")
if os.path.isdir(driver_path):
    # The worker/driver/ package: imported as the worker does, its modules'
    # names gathered into one namespace.
    import importlib, pkgutil
    sys.path.insert(0, os.path.dirname(os.path.abspath(driver_path)))
    package = importlib.import_module(os.path.basename(driver_path.rstrip("/")))
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(package.__name__ + "." + info.name)
        driver.__dict__.update(vars(module))
else:
    exec(compile(open(driver_path).read(), "driver.py", "exec"),
         driver.__dict__)


class Channel:
    def send_log(self, **fields): pass
    def send_trace(self, **fields): pass
    # The C fast paths of newer drivers: "sent", at no cost, as send_log
    # and send_trace above.
    def send_log_record(self, *args): return True
    def send_span(self, *args): return True
    def set_durable(self, *args): pass
    def send_stdio(self, *args): pass


CONTEXT = "sandbox-bench-worker-1"
factory = logging.getLogRecordFactory()


def make_record(*args, **kwargs):  # as the worker's _Logs.start installs
    record = factory(*args, **kwargs)
    record.agentix_context = CONTEXT
    return record


logging.setLogRecordFactory(make_record)
root = logging.getLogger()
root.setLevel(logging.INFO)
os.environ["AGENTIX_LOG_DIR"] = tempfile.mkdtemp(prefix="agx-py-cpu-")
durable = driver._open_durable(Channel(), "1", CONTEXT)


class Trivial(logging.Handler):
    def emit(self, record): pass


def timed(fn):
    times = []
    for _ in range(5):
        start = time.thread_time()
        fn()
        times.append((time.thread_time() - start) * 1e6 / n)
    return sorted(times)[2]


log = logging.getLogger("bench.side")


def logs():
    for i in range(n):
        log.info("side-channel record %d", i)


from agentix import trace  # noqa: E402


def spans():
    with trace.trace("bench"):
        for i in range(n):
            with trace.span("s", i=i):
                pass


out = {}
root.handlers[:] = [Trivial()]
out["record_stdlib_only"] = timed(logs)
root.handlers[:] = [driver._LogBridge(Channel(), CONTEXT), durable]
out["record"] = timed(logs)
trace.set_processors([trace.Processor()])
out["span_trace_module_only"] = timed(spans)
forwarder_class = driver._trace_forwarder_class(trace.Processor)
try:  # newer drivers take the Span class (for send_span)
    forwarder = forwarder_class(Channel(), trace.Span)
except TypeError:
    forwarder = forwarder_class(Channel())
trace.set_processors([forwarder])
out["span"] = timed(spans)
print(json.dumps(out))
'''


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", action="append", required=True)
    parser.add_argument("--agentix", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=30_000, help="records/spans per loop")
    args = parser.parse_args()
    if len(args.driver) != len(args.agentix):
        parser.error("give one --agentix per --driver")
    results = [[] for _ in args.driver]
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        order = range(len(args.driver))
        for i in (order if r % 2 == 0 else reversed(order)):
            child = subprocess.run(
                [sys.executable, "-c", CHILD, os.path.abspath(args.driver[i]),
                 os.path.abspath(args.agentix[i]), str(args.n)],
                capture_output=True, text=True, check=True)
            results[i].append(json.loads(child.stdout.splitlines()[-1]))
    print(f"load {os.getloadavg()[0]:.2f}")
    for i, driver in enumerate(args.driver):
        medians = {key: statistics.median(r[key] for r in results[i])
                   for key in results[i][0]}
        print(f"{driver} (agentix from {args.agentix[i]}), µs, median of {args.rounds}:")
        print(f"  per record {medians['record']:.1f} (stdlib logging alone "
              f"{medians['record_stdlib_only']:.1f}: the bridge and the durable log add "
              f"{medians['record'] - medians['record_stdlib_only']:.1f})")
        print(f"  per span {medians['span']:.1f} (agentix.trace alone "
              f"{medians['span_trace_module_only']:.1f}: forwarding adds "
              f"{medians['span'] - medians['span_trace_module_only']:.1f})")


if __name__ == "__main__":
    main()
