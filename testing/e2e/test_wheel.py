"""The agentix wheel this suite runs against (tools/make_venv installed it):
it carries a CPython extension, so its tag must name this interpreter and
platform, not py3-none-any."""

import importlib.metadata
import importlib.util
import pathlib
import sys
import sysconfig


def test_the_wheel_is_tagged_for_the_interpreter_and_platform_of_its_extension():
    dist = importlib.metadata.distribution("agentix")
    wheel = dict(
        line.split(": ", 1) for line in (dist.read_text("WHEEL") or "").splitlines() if ": " in line
    )
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel["Tag"] == f"{python}-{python}-{platform}"
    assert wheel["Root-Is-Purelib"] == "false"

    extension = importlib.util.find_spec("agentix.runtime.client._native_calls")
    assert extension is not None and extension.origin.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    installed = {str(path) for path in dist.files or []}
    assert str(pathlib.Path(extension.origin).relative_to(dist.locate_file(""))) in installed
