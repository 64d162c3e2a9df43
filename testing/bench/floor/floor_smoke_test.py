"""Smoke test: both floor programs run (--quick) and print one JSON line with
positive figures. No timing thresholds: it must pass on a busy machine."""

import json
import os
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("noop_p50_us", "noop_p99_us", "calls_per_s_c1", "mb_per_s_16mib", "echo_ms_16mib")


class FloorSmokeTest(unittest.TestCase):
    def check(self, name: str, kind: str) -> None:
        proc = subprocess.run([os.path.join(HERE, name), "--quick", "--big-mib=4"],
                              stdout=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(report["kind"], kind)
        self.assertEqual(report["big_bytes"], 4 << 20)
        for key in KEYS:
            self.assertGreater(report[key], 0, key)
        self.assertLessEqual(report["noop_p50_us"], report["noop_p99_us"])

    def test_unix_socket_floor(self):
        self.check("unix_pingpong", "unix_socket")

    def test_grpc_floor(self):
        self.check("grpc_pingpong", "grpc_cpp_bidi")

    def test_bad_flag_is_refused(self):
        proc = subprocess.run([os.path.join(HERE, "unix_pingpong"), "--nope"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(proc.returncode, 2)


if __name__ == "__main__":
    unittest.main()
