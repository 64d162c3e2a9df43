"""Python code for a child interpreter that sees the generated stubs as this process does."""


def with_stub_paths(code: str) -> str:
    """`code`, preceded by statements giving the child's stub packages this
    process's package paths (a direct pytest run extends them in conftest; a
    PYTHONPATH cannot, the packages have ``__init__.py`` files of their own)."""
    import agentix.provider.v1
    import agentix.runtime.client
    import agentix.runtime.v1

    return (
        "import agentix.provider.v1, agentix.runtime.client, agentix.runtime.v1; "
        f"agentix.provider.v1.__path__[:] = {list(agentix.provider.v1.__path__)!r}; "
        f"agentix.runtime.v1.__path__[:] = {list(agentix.runtime.v1.__path__)!r}; "
        f"agentix.runtime.client.__path__[:] = {list(agentix.runtime.client.__path__)!r};\n" + code
    )


def run_in_fresh_interpreter(code: str, timeout: float = 60) -> str:
    """Runs `code` in a new interpreter (this one's `sys.path`, the stubs) and returns its
    standard output; fails with its standard error if it does not exit 0.

    Tests that fork use it: this process runs gRPC's and the native
    transport's threads, and fork(2) copies only the calling thread, so a
    child forked here can wait forever on a lock one of them held (a CI run
    hung so); the fresh interpreter forks with one thread."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", with_stub_paths(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"the child interpreter failed ({done.returncode}): {done.stderr[-3000:]}"
    return done.stdout
