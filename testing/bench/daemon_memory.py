"""The daemon-memory attacks of issue 17 (items 8, 9) at a chosen scale,
against a given agentix-sandboxd; prints the daemon's VmRSS/VmHWM (MiB)
before, under the attack, and after the attacking client left.

    bazel build //... && tools/make_venv $PWD/.venv-test
    N=30 SIZE_MIB=100 .venv-test/bin/python testing/bench/daemon_memory.py \
        bazel-bin/sandbox/agentix-sandboxd results [daemon flags...]

Attacks: results (N calls of SIZE_MIB MiB, never read, WAIT s), subscribers
(N idle Logs subscribers, then RECORDS log records), ids (N call ids of
1 MiB), upload (1 GiB announced, 10 bytes sent; waits WAIT s for the end).
Not a test: a measuring tool (its figures are in the issue's report)."""
import asyncio, os, pickle, signal, subprocess, sys, tempfile, time
from pathlib import Path
W = str(Path(__file__).resolve().parents[2])
sys.path.insert(0, W + "/testing/e2e")
sys.path.insert(0, W + "/testing/fixtures/remote_targets")
import grpc
from agentix import RuntimeClient
from agentix.runtime.v1 import runtime_pb2 as pb, runtime_pb2_grpc as pb_grpc
from raw_stream import RawStream, start
MiB = 1 << 20

def status(pid):
    d = {}
    for l in Path(f"/proc/{pid}/status").read_text().splitlines():
        if l.startswith(("VmRSS", "VmHWM")):
            d[l.split(":")[0]] = int(l.split()[1]) // 1024
    return d

async def main():
    binary, attack, *flags = sys.argv[1:]
    tmp = tempfile.mkdtemp()
    sock = f"unix://{tmp}/s.sock"
    log = open(f"{tmp}/log", "wb")
    proc = subprocess.Popen([binary, "--listen", sock, "--worker", f"{W}/bazel-bin/worker/agentix-worker",
        "--venv", f"{W}/.venv-test", "--python-path", f"{W}/testing/fixtures/remote_targets", *flags],
        stdout=log, stderr=subprocess.STDOUT)
    while b"serving" not in Path(f"{tmp}/log").read_bytes():
        time.sleep(0.05)
    import e2e_targets as t
    async with RuntimeClient(sock, logs=False, traces=False) as c:
        await c.remote(t.add, 1, 2)
    print("before", status(proc.pid))
    t0 = time.monotonic()
    if attack == "results":
        n, size = int(os.environ.get("N", 20)), int(os.environ.get("SIZE_MIB", 50)) * MiB
        raw = RawStream(sock)
        await raw.send(*[start(f"b{i}", "e2e_targets::make_bytes", pickle.dumps(((size,), {}))) for i in range(n)])
        await asyncio.sleep(float(os.environ.get("WAIT", 30)))
        print("attack", status(proc.pid))
        await raw.close()
    elif attack == "subscribers":
        n, records = int(os.environ.get("N", 500)), int(os.environ.get("RECORDS", 50000))
        ch = grpc.aio.insecure_channel(sock)
        stub = pb_grpc.RuntimeServiceStub(ch)
        calls = []
        for _ in range(n):
            call = stub.Logs()
            await call.write(pb.LogsRequest(subscribe=pb.SubscribeLogs()))
            calls.append(call)
        await asyncio.sleep(1)
        async with RuntimeClient(sock, logs=False, traces=False) as c:
            await c.remote(t.log_many, records)
        await asyncio.sleep(5)
        print("attack", status(proc.pid))
        for call in calls:
            call.cancel()
        await ch.close()
    elif attack == "ids":
        n = int(os.environ.get("N", 300))
        raw = RawStream(sock)
        async def drain():
            while (await raw.call.read()) is not grpc.aio.EOF:
                pass
        reader = asyncio.ensure_future(drain())
        for i in range(n):
            await raw.send(start(str(i) * 0 + f"{i:08d}" + "i" * MiB, "e2e_targets::noop", pickle.dumps(((), {}))))
        await asyncio.sleep(5)
        print("attack", status(proc.pid))
        reader.cancel()
        await raw.close()
    elif attack == "upload":
        raw = RawStream(sock)
        await raw.send(start("stuck", "e2e_targets::echo", b"x" * 10, size=1 << 30))
        try:
            e = await raw.terminal("stuck", timeout=float(os.environ.get("WAIT", 90)))
            print("terminal after", round(time.monotonic() - t0, 1), "s:", e.error.error.type)
        except asyncio.TimeoutError:
            print("no terminal event after", round(time.monotonic() - t0, 1), "s")
        info = await pb_grpc.RuntimeServiceStub(raw.channel).GetInfo(pb.GetInfoRequest())
        print("calls_in_flight", info.calls_in_flight)
        await raw.close()
    await asyncio.sleep(3)
    async with RuntimeClient(sock, logs=False, traces=False) as c:
        assert await c.remote(t.add, 2, 3) == 5
    await asyncio.sleep(2)
    print("after clients left", status(proc.pid), "(still serving)")
    proc.send_signal(signal.SIGTERM); proc.wait()

asyncio.run(main())
