"""The names the original pins, importable where users and plugins import them."""

import pathlib
import subprocess
import sys
import tomllib

import pytest

import agentix
from agentix import (
    CallCancelled,
    CallTimeout,
    Failed,
    Ok,
    RemoteCallError,
    RestrictedUnpickleError,
    Result,
    RuntimeUnreachable,
    WorkerExited,
)

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_exception_hierarchy():
    assert issubclass(WorkerExited, RemoteCallError)
    assert issubclass(CallCancelled, RemoteCallError)
    for cls in (RestrictedUnpickleError, CallTimeout, RuntimeUnreachable):
        assert issubclass(cls, Exception)


def test_result_types():
    assert Ok(1).value == 1
    error = ValueError("x")
    assert Failed(error).error is error
    assert Result[int] is not None
    with pytest.raises(AttributeError):
        Ok(1).value = 2  # frozen


def test_all_names_resolve():
    for name in agentix.__all__:
        assert getattr(agentix, name) is not None, name
    for name in ("CallCancelled", "CallTimeout", "Failed", "Ok", "RemoteCallError", "RestrictedUnpickleError",
                 "Result", "RuntimeUnreachable", "WorkerExited", "RuntimeClient", "context", "__version__",
                 "Unauthenticated", "StaleModuleError"):
        assert name in agentix.__all__


def test_agentix_offers_every_provider_name_lazily():
    # agentix lists the provider names itself (importing agentix.provider at
    # `import agentix` would cost every host its start-up time): the two
    # lists must not drift apart.
    import agentix.provider

    assert agentix._PROVIDER_NAMES == set(agentix.provider.__all__)
    for name in agentix.provider.__all__:
        assert getattr(agentix, name) is getattr(agentix.provider, name), name


def test_auth_and_stale_errors_are_their_own_types():
    assert issubclass(agentix.Unauthenticated, PermissionError)
    assert not issubclass(agentix.Unauthenticated, agentix.RuntimeUnreachable)
    assert agentix.Unauthenticated.code == "UNAUTHENTICATED"
    assert issubclass(agentix.StaleModuleError, RuntimeError)


def test_runtime_client_module_exports():
    import agentix.runtime.client as client_module

    assert sorted(client_module.__all__) == [
        "CallCancelled", "CallTimeout", "Failed", "Ok", "RemoteCallError", "Result", "ResultTooLarge",
        "RuntimeClient", "RuntimeUnreachable", "Unauthenticated", "WorkerExited",
    ]
    assert client_module.RuntimeClient is agentix.RuntimeClient


def test_shared_exports():
    from agentix.runtime.shared import MAX_MESSAGE_BYTES
    from agentix.runtime.shared import safepickle

    assert MAX_MESSAGE_BYTES == 268435456
    assert sorted(safepickle.__all__) == [
        "RestrictedUnpickleError", "RestrictedUnpickler", "SAFE_TYPES", "allow_callable", "allow_type",
        "restricted_loads",
    ]


def test_context_alias():
    from agentix.utils import context

    assert agentix.context is context


def test_namespace_packages_extend_their_path():
    import agentix.utils

    assert isinstance(agentix.__path__, list)
    assert isinstance(agentix.utils.__path__, list)


def test_version_matches_pyproject():
    with PYPROJECT.open("rb") as f:
        assert tomllib.load(f)["project"]["version"] == agentix.__version__ == "0.3.0"


def test_importing_agentix_does_not_import_grpc():
    code = "import sys, agentix, agentix.utils.context; print('grpc' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": str(pathlib.Path(agentix.__file__).parent.parent)})
    assert output.stdout.strip() == "False"
