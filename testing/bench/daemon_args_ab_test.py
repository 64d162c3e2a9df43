"""daemon_args_ab's reading of a benchmark report and of a benchmark's run."""

import sys
import unittest

import daemon_args_ab


class FlattenTest(unittest.TestCase):
    def test_numbers_become_dotted_keys_without_details_or_flags(self):
        report = {"noop_p50_us": 80.5, "baseline": None, "daemon_args": ["--x"],
                  "ratios": {"noop_p50_ours_over_floor": 2.1, "missing": None},
                  "busy": {"noop_p50_us": 120, "floor": {"noop_p50_us": 40.0},
                           "details": {"noop_p50_us": 1.0}},
                  "targets_met": {"calls": True},
                  "details": {"ours": {"noop_p50_us": 80.5}}}
        self.assertEqual(daemon_args_ab.flatten(report), {
            "noop_p50_us": 80.5, "ratios.noop_p50_ours_over_floor": 2.1,
            "busy.noop_p50_us": 120, "busy.floor.noop_p50_us": 40.0})


class RunBenchTest(unittest.TestCase):
    def run_python(self, code):
        return daemon_args_ab.run_bench([sys.executable, "-c", code], timeout_s=60)

    def test_the_last_line_is_the_report(self):
        report, error = self.run_python('print("a line"); print(\'{"noop_p50_us": 3}\')')
        self.assertEqual((report, error), ({"noop_p50_us": 3}, None))

    def test_a_report_with_errors_or_a_failed_exit_is_a_failure(self):
        report, error = self.run_python('print(\'{"errors": ["ours: no result"]}\')')
        self.assertIsNone(report)
        self.assertIn("ours: no result", error)
        report, error = self.run_python('import sys; print(\'{"a": 1}\'); sys.exit(1)')
        self.assertIsNone(report)
        self.assertIn("exit code 1", error)

    def test_no_json_is_a_failure(self):
        report, error = self.run_python('print("not json")')
        self.assertIsNone(report)
        self.assertIn("no JSON report", error)


if __name__ == "__main__":
    unittest.main()
