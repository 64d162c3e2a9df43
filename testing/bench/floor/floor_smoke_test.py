"""Smoke test: the floor programs run (--quick) and print one JSON line with
positive figures. No timing thresholds: it must pass on a busy machine."""

import json
import os
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("noop_p50_us", "noop_p99_us", "noop_mean_us", "calls_per_s_c1", "calls_per_s_c4",
        "noop_cpu_us_per_call", "noop_cpu_us_per_call_client", "noop_cpu_us_per_call_server",
        "mb_per_s_1mib", "echo_ms_1mib", "echo_cpu_ms_1mib", "mb_per_s_4mib", "echo_ms_4mib",
        "echo_cpu_ms_4mib")


def io_uring_available() -> bool:
    """Whether this process may create an io_uring (io_uring_setup, x86-64 425)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    fd = libc.syscall(425, 2, params)
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def run(name: str, *flags: str, cpu: int | None = None) -> dict:
    """`name --quick flags`'s JSON line; with `cpu`, every process of it on that CPU."""
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    proc = subprocess.run([os.path.join(HERE, name), "--quick", *flags],
                          stdout=subprocess.PIPE, text=True, timeout=120, preexec_fn=pin)
    if proc.returncode != 0:
        raise AssertionError(f"{name} exited {proc.returncode}: {proc.stdout}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class FloorSmokeTest(unittest.TestCase):
    def check(self, name: str, kind: str, *flags: str) -> dict:
        report = run(name, "--big-mib=1,4", "--concurrency=4", "--small-bytes=100", *flags)
        self.assertEqual(report["kind"], kind)
        self.assertEqual(report["small_bytes"], 100)
        for key in KEYS:
            self.assertGreater(report[key], 0, key)
        self.assertLessEqual(report["noop_p50_us"], report["noop_p99_us"])
        self.assertAlmostEqual(report["noop_cpu_us_per_call"],
                               report["noop_cpu_us_per_call_client"]
                               + report["noop_cpu_us_per_call_server"], delta=0.05)
        self.assertNotIn("mb_per_s_16mib", report)  # only the sizes asked for
        return report

    def test_unix_socket_floor(self):
        self.check("unix_pingpong", "unix_socket")

    def test_relayed_unix_socket_floor(self):
        self.check("unix_pingpong", "unix_socket_relay", "--relay")
        # The relay process forwards every byte: it spends CPU the direct pair does not.
        # Both on one CPU: unpinned, a run in the idle regime (each wake-up a halted
        # vCPU's) can cost the direct pair more CPU than an awake relayed run.
        cpu = min(os.sched_getaffinity(0))
        flags = ("--small-bytes=100", "--big-mib=", "--concurrency=")
        relayed = run("unix_pingpong", "--relay", *flags, cpu=cpu)
        direct = run("unix_pingpong", *flags, cpu=cpu)
        self.assertGreater(relayed["noop_cpu_us_per_call_server"],
                           direct["noop_cpu_us_per_call_server"])

    def test_grpc_floor(self):
        report = self.check("grpc_pingpong", "grpc_cpp_bidi", "--unary")
        for key in ("unary_p50_us", "unary_p99_us", "unary_cpu_us_per_call"):
            self.assertGreater(report[key], 0, key)

    def test_grpc_floor_without_big_messages(self):
        report = run("grpc_pingpong", "--big-mib=")
        self.assertGreater(report["noop_p50_us"], 0)
        self.assertFalse([k for k in report if k.startswith("mb_per_s_")])

    def test_unix_stream_floor(self):
        report = run("unix_pingpong", "--stream-records=5000", "--record-bytes=150")
        self.assertEqual(report["kind"], "unix_socket_stream")
        self.assertEqual((report["records"], report["record_bytes"]), (5000, 150))
        for key in ("records_per_s", "records_per_s_unbatched", "cpu_us_per_record",
                    "cpu_us_per_record_unbatched"):
            self.assertGreater(report[key], 0, key)

    def test_spawn_floor(self):
        report = run("spawn_true", "--runs=5")
        self.assertEqual((report["kind"], report["runs"]), ("fork_exec_true", 5))
        self.assertGreater(report["spawn_p50_ms"], 0)
        self.assertLessEqual(report["spawn_p50_ms"], report["spawn_p99_ms"])
        self.assertGreater(report["spawn_cpu_ms"], 0)

    def test_tick_ring(self):
        for pages in ("0", "8"):
            report = run("tick_ring", "--procs=3", "--cpu=0", f"--pages={pages}")
            self.assertEqual((report["kind"], report["procs"]), ("tick_ring", 3))
            self.assertEqual(report["pages_per_hop"], int(pages))
            self.assertGreater(report["rounds"], 0)
            self.assertGreater(report["ticks"], 10)  # --quick: 300 ms of 4 ms periods
            self.assertLessEqual(report["round_p50_us"], report["round_p99_us"])
            self.assertLessEqual(report["tick_loss_p25_us"], report["tick_loss_p75_us"])

    def test_tick_ring_hand_offs_in_one_kernel_entry(self):
        # Every process sleeps once per round whichever way it hands off, so a
        # round has at least --procs switches; the io_uring modes say so too.
        for flags in ((), ("--poll=1",), ("--uring=1",), ("--uring=2", "--defer=1")):
            for socket in ("0", "1"):
                args = [os.path.join(HERE, "tick_ring"), "--quick", "--procs=3", "--cpu=0",
                        f"--socket={socket}", *flags]
                proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, timeout=120)
                if proc.returncode == 3:  # refused: then io_uring must really be refused here
                    self.assertIn("io_uring unavailable", proc.stderr)
                    self.assertFalse(io_uring_available(), proc.stderr)
                    continue
                self.assertEqual(proc.returncode, 0, proc.stderr)
                report = json.loads(proc.stdout.strip().splitlines()[-1])
                mode = next((int(f.split("=")[1]) for f in flags if f.startswith("--uring=")), 0)
                self.assertEqual((report["uring"], report["socket"]), (mode, int(socket)))
                self.assertEqual(report["poll"], 1 if "--poll=1" in flags else 0)
                self.assertGreater(report["rounds"], 0)
                self.assertGreaterEqual(report["switches_per_round"], 3 * 0.99, flags)
                self.assertGreater(report["cpu_us_per_round"], 0)

    def test_bad_flag_is_refused(self):
        for name in ("unix_pingpong", "grpc_pingpong", "spawn_true", "tick_ring"):
            proc = subprocess.run([os.path.join(HERE, name), "--nope"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(proc.returncode, 2, name)


if __name__ == "__main__":
    unittest.main()
