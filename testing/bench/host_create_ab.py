"""Same-run A/B of the host's side of a cold create: two Python hosts (venvs),
one bundle.

    /usr/bin/python3 testing/bench/host_create_ab.py --bundle BUNDLE \
        --a-python /tmp/old34-venv/bin/python --b-python .venv-test/bin/python \
        [--rounds 12] [--runs 3]

Each round runs, for A then B (the order alternates by round), a fresh host
process under that side's python that does `--runs` times what
sandbox_lifecycle.py measures (the in-process `LocalProvider.create` of a
busybox-root sandbox from BUNDLE, then the first `hello_agentix.tools.add`,
then aclose and delete; one warm-up create first, not counted), and notes per
create:

  create_to_first_call_ms  create() called -> the first call's result
  create_ms                create() called -> it returned
  host_cpu_ms              the host process's CPU (all its threads:
                           time.process_time) over create_to_first_call_ms

Printed: the medians per side and the median of the per-round ratios B / A
(the figures worth reading on a shared machine). Last line: JSON.
Bounded: every create, call and delete has a timeout; a round's process is
killed after --round-timeout seconds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Run by each side's python: prints one JSON line with the per-create figures.
CHILD = r"""
import asyncio, json, sys, time
from agentix import SandboxConfig
from agentix.provider._local_inprocess import InProcessLocalProvider, LocalProviderConfig
from hello_agentix import tools

async def main(bundle, root, runs):
    provider = InProcessLocalProvider(LocalProviderConfig(ready_timeout=30.0))
    config = SandboxConfig(image=root, bundle=bundle, env={"AGENTIX_LOG_LEVEL": "debug"})
    out = []
    try:
        for i in range(runs + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            sandbox = await asyncio.wait_for(provider.create(config), 60)
            t1 = time.perf_counter()
            try:
                value = await asyncio.wait_for(sandbox.remote(tools.add, 1, 2), 60)
                t2, c2 = time.perf_counter(), time.process_time()
                if value != 3:
                    raise RuntimeError(f"add(1, 2) returned {value!r}")
            finally:
                await asyncio.wait_for(sandbox.aclose(), 30)
                await asyncio.wait_for(provider.delete(sandbox.sandbox_id), 30)
            if i:  # the first is the warm-up
                out.append({"create_to_first_call_ms": (t2 - t0) * 1e3, "create_ms": (t1 - t0) * 1e3,
                            "host_cpu_ms": (c2 - c0) * 1e3})
    finally:
        await provider.aclose()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""

KEYS = ("create_to_first_call_ms", "create_ms", "host_cpu_ms")


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def run_side(python: str, bundle: str, root: str, runs: int, timeout: float) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "examples" / "hello"), env.get("PYTHONPATH")]))
    done = subprocess.run([python, "-c", CHILD, bundle, root, str(runs)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO))
    if done.returncode != 0:
        raise RuntimeError(f"{python}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True, help="a built bundle directory (both sides use it)")
    parser.add_argument("--a-python", required=True, help="side A's python (the old host venv)")
    parser.add_argument("--b-python", required=True, help="side B's python (the new host venv)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runs", type=int, default=3, help="measured creates per side and round")
    parser.add_argument("--round-timeout", type=float, default=300.0)
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    import sandbox_lifecycle as lc  # the benchmark's busybox root

    root = str(lc._busybox_root(Path(tempfile.mkdtemp(prefix="agx-host-ab-root-")) / "root"))
    pythons = {"a": args.a_python, "b": args.b_python}
    per_round = {"a": [], "b": []}
    for i in range(args.rounds):
        for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
            runs = run_side(pythons[side], args.bundle, root, args.runs, args.round_timeout)
            per_round[side].append({k: _median([r[k] for r in runs]) for k in KEYS})
            print(f"[host-ab] round {i + 1} {side}: " + ", ".join(f"{k} {per_round[side][-1][k]}" for k in KEYS)
                  + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    out = {"rounds": args.rounds, "runs": args.runs}
    for k in KEYS:
        a = [r[k] for r in per_round["a"]]
        b = [r[k] for r in per_round["b"]]
        ratios = [y / x for x, y in zip(a, b) if x and y]
        out[k] = {"a": _median(a), "b": _median(b),
                  "ratio_b_over_a": round(statistics.median(ratios), 3) if ratios else None,
                  "b_lower_in": f"{sum(r < 1 for r in ratios)}/{len(ratios)}"}
        print(f"[host-ab] {k}: {out[k]['a']} -> {out[k]['b']} (x{out[k]['ratio_b_over_a']}, "
              f"B lower in {out[k]['b_lower_in']} rounds)", flush=True)
    out["loadavg"] = os.getloadavg()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
