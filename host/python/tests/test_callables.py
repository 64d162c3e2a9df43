"""Callable encoding: what may be a remote target, and the messages that say why not."""

import asyncio
import functools
import math
import os
import sys
import types

import pytest

from agentix.runtime.shared.callables import RemoteCallable, display_name_for

MODULE = __name__


def top_level(x):
    return x


async def top_level_async(x):
    return x


class Echo:
    @staticmethod
    def echo(x):
        return x

    def method(self, x):
        return x


class CallableInstance:
    def __call__(self):
        return None


def _module_less_function():
    namespace = {}
    exec("def orphan():\n    return None", namespace)
    return namespace["orphan"]


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (top_level, f"{MODULE}::top_level"),
        (top_level_async, f"{MODULE}::top_level_async"),
        (Echo.echo, f"{MODULE}::Echo.echo"),
        (Echo.method, f"{MODULE}::Echo.method"),
        (len, "builtins::len"),
        (abs, "builtins::abs"),
        (math.factorial, "math::factorial"),
        (asyncio.sleep, "asyncio.tasks::sleep"),
        (os.getcwd, "posix::getcwd"),
    ],
)
def test_accepted_targets_encode_as_module_and_qualname(fn, expected):
    ref = RemoteCallable._resolve(fn)
    assert ref == expected
    assert isinstance(ref, RemoteCallable) and isinstance(ref, str)
    assert RemoteCallable.validate(fn) == expected


def test_remote_callable_has_no_instance_dict():
    assert RemoteCallable.__slots__ == ()
    with pytest.raises(AttributeError):
        RemoteCallable("m::f").extra = 1


def test_lambda_is_rejected_with_fix():
    fn = lambda: None  # noqa: E731
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(fn)
    assert str(info.value) == (
        f"cannot remote '{MODULE}::test_lambda_is_rejected_with_fix.<locals>.<lambda>': "
        "lambdas have no importable name — use a module-level def."
    )


def test_local_function_is_rejected_with_fix():
    def inner():
        return None

    with pytest.raises(TypeError) as info:
        RemoteCallable.validate(inner)
    assert str(info.value) == (
        f"cannot remote '{MODULE}::test_local_function_is_rejected_with_fix.<locals>.inner': "
        "it is a local/nested function. Define it at module top level so the worker can import it by name."
    )


def test_closure_is_rejected_as_local_function():
    captured = 3

    def closure():
        return captured

    with pytest.raises(TypeError, match="it is a local/nested function"):
        RemoteCallable._resolve(closure)


def test_bound_method_is_rejected_with_fix():
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(Echo().method)
    assert str(info.value) == (
        f"cannot remote '{MODULE}::Echo.method': it is a bound method. Pass the unbound function "
        "and send the instance as an argument, or move the logic into a module-level def."
    )


@pytest.mark.parametrize(
    ("fn", "label", "kind"),
    [
        (functools.partial(top_level, 1), "functools::partial", "partial"),
        (CallableInstance(), f"{MODULE}::CallableInstance", "CallableInstance"),
        (Echo, f"{MODULE}::Echo", "type"),
    ],
)
def test_non_function_callables_are_rejected_with_fix(fn, label, kind):
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(fn)
    assert str(info.value) == (
        f"cannot remote '{label}': only importable top-level functions are remote targets "
        f"(got a {kind}). functools.partial, callable instances, and closures "
        "aren't importable by name — wrap the call in a module-level def."
    )


@pytest.mark.parametrize(("value", "kind"), [(3, "int"), ("m::f", "str"), (None, "NoneType")])
def test_non_callable_is_rejected(value, kind):
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(value)
    assert str(info.value) == f"remote target must be callable (got {kind})"


def test_module_less_function_is_rejected_with_fix():
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(_module_less_function())
    assert str(info.value) == (
        "cannot remote 'builtins::function': it has no importable module path. Define it in an "
        "importable module (not a REPL / exec context)."
    )


def _main_function():
    def script_function():
        return None

    script_function.__module__ = "__main__"
    script_function.__qualname__ = "script_function"
    return script_function


def _fake_main(monkeypatch, *, spec_name=None, file=None):
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    if file is not None:
        main.__file__ = str(file)
    monkeypatch.setitem(sys.modules, "__main__", main)


def test_main_started_with_dash_m_uses_spec_name(monkeypatch):
    _fake_main(monkeypatch, spec_name="tools.run")
    assert RemoteCallable._resolve(_main_function()) == "tools.run::script_function"


def test_main_script_function_is_refused_with_the_fix(monkeypatch, tmp_path):
    # Even when the script could be imported by a name under sys.path: the
    # sandbox would run its top level.
    script = tmp_path / "tools" / "run.py"
    script.parent.mkdir()
    script.write_text("")
    _fake_main(monkeypatch, file=script)
    monkeypatch.setattr(sys, "path", ["/nonexistent-root", str(tmp_path)])
    with pytest.raises(TypeError) as info:
        RemoteCallable._resolve(_main_function())
    message = str(info.value)
    assert message.startswith("cannot remote '__main__::script_function': it is defined in __main__")
    assert str(script) in message
    assert "Move script_function into a module of your project" in message


@pytest.mark.parametrize("relative", ["my-tool.py", "tool.txt"])
def test_main_script_without_importable_name_is_rejected(monkeypatch, tmp_path, relative):
    script = tmp_path / relative
    script.write_text("")
    _fake_main(monkeypatch, file=script)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(TypeError, match="it is defined in __main__"):
        RemoteCallable._resolve(_main_function())


def test_main_script_outside_sys_path_is_rejected(monkeypatch, tmp_path):
    script = tmp_path / "run.py"
    script.write_text("")
    _fake_main(monkeypatch, file=script)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    with pytest.raises(TypeError, match="it is defined in __main__"):
        RemoteCallable._resolve(_main_function())


def test_resolve_imports_the_target():
    assert RemoteCallable("math::factorial").resolve() is math.factorial
    assert RemoteCallable(f"{MODULE}::Echo.echo").resolve() is Echo.echo


def test_resolve_refuses_reference_without_separator():
    with pytest.raises(ValueError) as info:
        RemoteCallable("math.factorial").resolve()
    assert str(info.value) == "invalid remote callable reference 'math.factorial'"


def test_resolve_refuses_non_callable():
    with pytest.raises(TypeError) as info:
        RemoteCallable("math::pi").resolve()
    assert str(info.value) == "resolved value is not callable (got float)"


def test_resolve_propagates_import_errors():
    with pytest.raises(ModuleNotFoundError):
        RemoteCallable("agentix_no_such_module::f").resolve()
    with pytest.raises(AttributeError):
        RemoteCallable("math::no_such_function").resolve()


def test_display_name_for_never_raises():
    assert display_name_for(top_level) == f"{MODULE}::top_level"
    assert display_name_for(functools.partial(top_level)) == "functools::partial"
    assert display_name_for(CallableInstance()) == f"{MODULE}::CallableInstance"
    assert display_name_for(3) == "builtins::int"


def test_named_target_is_display_name_and_wire_form_and_sees_renames():
    from agentix.runtime.shared.callables import named_target

    def renamed(x):
        return x

    renamed.__qualname__ = "renamed"
    assert named_target(renamed) == (f"{MODULE}::renamed", f"{MODULE}::renamed")
    assert named_target(renamed) == (f"{MODULE}::renamed", f"{MODULE}::renamed")  # remembered
    renamed.__qualname__ = "Other.renamed"
    assert named_target(renamed) == (f"{MODULE}::Other.renamed", f"{MODULE}::Other.renamed")
    renamed.__module__ = "elsewhere"
    assert named_target(renamed)[1] == "elsewhere::Other.renamed"
    renamed.__qualname__ = "outer.<locals>.renamed"  # no longer a valid target: refused, not remembered
    with pytest.raises(TypeError, match="local/nested function"):
        named_target(renamed)
    for fn in (len, math.factorial, Echo.echo):
        assert named_target(fn) == (display_name_for(fn), RemoteCallable._resolve(fn))
    with pytest.raises(TypeError):
        named_target(CallableInstance())


def test_named_target_resolves_main_functions_each_time(monkeypatch):
    from agentix.runtime.shared.callables import named_target

    fn = _main_function()
    _fake_main(monkeypatch, spec_name="tools.run")
    assert named_target(fn)[1] == "tools.run::script_function"
    _fake_main(monkeypatch, spec_name="tools.other")
    assert named_target(fn)[1] == "tools.other::script_function"
