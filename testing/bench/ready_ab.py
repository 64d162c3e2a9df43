"""Spawn -> ready of agentix-worker binaries (a socketpair end as --channel-fd, Debian's /usr
stdlib), alternating, 60 runs each: wall to the first channel byte, CPU and minor faults of the
whole (short) life. Usage: /usr/bin/python3 testing/bench/ready_ab.py OLD_WORKER NEW_WORKER"""
import os, socket, subprocess, time, resource, statistics as st, sys
bins = sys.argv[1:]
res = {b: [] for b in bins}
for n in range(60):
    order = bins if n % 2 == 0 else bins[::-1]
    for b in order:
        parent, child = socket.socketpair()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        p = subprocess.Popen([b, f"--channel-fd={child.fileno()}", "--worker-id=probe"], pass_fds=(child.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        child.close()
        first = parent.recv(1)
        el = (time.perf_counter() - t) * 1e3
        parent.close(); p.wait()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert first
        res[b].append((el, (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1e3, r1.ru_minflt - r0.ru_minflt))
print("load", os.getloadavg())
base = None
for b, rows in res.items():
    m = [st.median(r[i] for r in rows) for i in range(3)]
    base = base or m
    print(b, "spawn->ready %.1f ms (%.3f), CPU whole life %.1f ms (%.3f), faults %d (%.3f)" % (m[0], m[0]/base[0], m[1], m[1]/base[1], m[2], m[2]/base[2]))
