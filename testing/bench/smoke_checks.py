"""What the benchmarks' smoke tests check of a run: that it exits 0 with its
JSON report on the last stdout line, and that figures are positive numbers
(never timing thresholds: the smoke tests must pass on a slow or busy machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import unittest
from typing import Iterable, Sequence


def run_report(test: unittest.TestCase, argv: Sequence[str], timeout_s: float,
               echo: bool = False) -> dict:
    """Runs `argv`, fails `test` unless it exits 0, and returns the JSON object
    on the last non-empty stdout line. `echo`: also copy stdout to stderr (the
    figures, for the test log)."""
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE, text=True, timeout=timeout_s)
    if echo:
        sys.stderr.write(proc.stdout)
    test.assertEqual(proc.returncode, 0, proc.stdout[-6000:])
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    test.assertTrue(lines, "no report on stdout")
    return json.loads(lines[-1])  # the JSON object is the LAST line


def daemon_share(test: unittest.TestCase, value, where: str) -> None:
    """Fails `test` unless `value` (the daemon's CPU for a Python host's call,
    or for a sandbox's namespace request) is a number of zero or more: zero
    when it went direct (the daemon's default since stop 43,
    docs/DIRECT-CALLS.md), which never wakes the daemon."""
    test.assertIsInstance(value, (int, float), where)
    test.assertNotIsInstance(value, bool, where)
    test.assertGreaterEqual(value, 0, where)


def positive_numbers(test: unittest.TestCase, record: dict, keys: Iterable[str], where: str) -> None:
    """Fails `test` unless each of `keys` in `record` is a number (not a bool)
    above zero; `where` names the record in the failure message."""
    for key in keys:
        value = record.get(key)
        test.assertIsInstance(value, (int, float), f"{where}.{key}")
        test.assertNotIsInstance(value, bool, f"{where}.{key}")
        test.assertGreater(value, 0, f"{where}.{key}")
