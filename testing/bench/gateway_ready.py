"""Readiness cost of the gateway: starts agentix-sandboxd and the gateway together
(as bootstrap.sh does) N times and reports, per round, when the daemon's socket
first accepts and when the gateway's GET /health first answers 200.

    .venv-test/bin/python testing/bench/gateway_ready.py host/python/agentix/gateway/__main__.py 9

Run from the repository root after `bazel build //...` and tools/make_venv .venv-test.
"""
import subprocess, sys, time, urllib.request, socket, os, statistics
main = sys.argv[1]; W = os.getcwd()
res = []
for i in range(int(sys.argv[2])):
    sock = f"/tmp/gwr2-{i}.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    t = time.monotonic()
    g = subprocess.Popen([sys.executable, "-I", "-S", main, "--daemon", f"unix://{sock}", "--port", str(port), "--log-level", "warning"], stderr=subprocess.DEVNULL)
    d = subprocess.Popen([f"{W}/bazel-bin/sandbox/agentix-sandboxd", "--listen", f"unix://{sock}", "--worker", f"{W}/bazel-bin/worker/agentix-worker", "--venv", f"{W}/.venv-test", "--prestart-worker"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    td = th = None
    while th is None:
        if td is None:
            with socket.socket(socket.AF_UNIX) as p:
                try: p.connect(sock); td = time.monotonic() - t
                except OSError: pass
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200: th = time.monotonic() - t
        except (urllib.error.HTTPError, OSError):
            pass
        time.sleep(0.001)
    td = td if td is not None else th
    res.append((td*1e3, th*1e3))
    g.terminate(); d.terminate(); g.wait(); d.wait()
    time.sleep(0.3)
print([(round(a), round(b)) for a, b in res])
print("median daemon accepts ms", round(statistics.median(a for a, _ in res)), "median health 200 ms", round(statistics.median(b for _, b in res)), "median added", round(statistics.median(b - a for a, b in res)))
