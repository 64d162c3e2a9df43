"""The typed API, checked by Debian's mypy (python3-mypy) on what users get:
the package as the wheel holds it (with py.typed and the generated stubs),
and examples/typed: host_ok.py must pass, host_wrong.py must fail with the
errors it marks. Both runs share one fresh mypy cache (a stale cache can
hide errors)."""

import subprocess
import sys
import zipfile

import pytest

from conftest import BAZEL_BIN, REPO

EXAMPLE = REPO / "examples" / "typed"
CONFIG = REPO / "host" / "python" / "mypy.ini"


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    wheels = sorted((BAZEL_BIN / "host" / "python").glob("agentix-*.whl"))
    assert len(wheels) == 1, "run `bazel build //host/python:wheel` first"
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(site)
    return site, tmp_path_factory.mktemp("mypy-cache")


def mypy(site, cache, *targets):
    env = {"MYPYPATH": f"{site}:{EXAMPLE}", "PATH": "/usr/bin:/bin", "HOME": str(cache)}
    return subprocess.run(
        ["/usr/bin/python3", "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", str(cache),
         "--no-error-summary", "--show-error-codes", *map(str, targets)],
        capture_output=True, text=True, timeout=600, env=env, cwd=site,
    )


def test_the_wheel_is_marked_typed(checked):
    site, _ = checked
    assert (site / "agentix" / "py.typed").is_file()


def test_the_package_and_correct_calls_type_check(checked):
    site, cache = checked
    done = mypy(site, cache, site / "agentix", EXAMPLE / "typed_tasks", EXAMPLE / "host_ok.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_wrong_calls_are_type_errors(checked):
    site, cache = checked
    done = mypy(site, cache, EXAMPLE / "host_wrong.py")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line.split(": error: ", 1) for line in done.stdout.splitlines() if ": error: " in line]
    by_line = {}
    for where, message in errors:
        by_line.setdefault(int(where.rsplit(":", 1)[1]), []).append(message)
    # remote(tasks.add, "wrong", "types", "extra"): one too many, and str for int.
    assert any('Too many arguments for "remote"' in m for m in by_line[12]), by_line
    assert any('Argument 2 to "remote"' in m and 'expected "int"' in m for m in by_line[12]), by_line
    # A keyword of the wrong type.
    assert any('"punctuation"' in m and 'expected "str"' in m for m in by_line[13]), by_line
    # The result is the target's: an int is no str.
    assert any('"remote"' in m and 'str' in m for m in by_line[14]), by_line
    # Streamed items too.
    assert any('"int" has no attribute "upper"' in m for m in by_line[16]), by_line
    assert set(by_line) == {12, 13, 14, 16}, by_line


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
