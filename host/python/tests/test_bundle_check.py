"""agentix.runtime.client.bundle_check: the host's copy of a module against
the bundle manifest's hash (the e2e side is testing/e2e/test_cli.py)."""

import hashlib
import json
import logging
import sys
import types

import pytest

from agentix import StaleModuleError
from agentix.runtime.client.bundle_check import BundleCheck


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project `proj` with module proj.mod loaded on the host, and a bundle
    dir at its default place whose manifest matches it."""
    root = tmp_path / "proj-src"
    (root / "proj").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname='proj'\n")
    source = root / "proj" / "mod.py"
    source.write_text("def f():\n    return 1\n")
    extra = root / "proj" / "extra.py"
    extra.write_text("def g():\n    return 2\n")
    for name, path in (("proj.mod", source), ("proj.extra", extra)):
        module = types.ModuleType(name)
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, name, module)
    bundle = root / "dist" / "agentix-bundle"
    bundle.mkdir(parents=True)
    digest = "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps({"name": "proj", "tag": "1", "modules": {"proj.mod": digest}}))
    return root, source, bundle


def test_a_matching_module_passes_silently(project, caplog):
    _, _, bundle = project
    check = BundleCheck.create(bundle, "warn")
    with caplog.at_level(logging.WARNING, logger="agentix.bundle"):
        check.check("proj.mod::f")
        check.check("os::getcwd")  # not the project's
    assert caplog.records == []


def test_an_edited_module_warns_once_with_the_rebuild_command(project, caplog):
    root, source, bundle = project
    source.write_text("def f():\n    return 2\n")
    check = BundleCheck.create(str(bundle / "manifest.json"), None)
    with caplog.at_level(logging.WARNING, logger="agentix.bundle"):
        for _ in range(3):
            check.check("proj.mod::f")
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith(f"module proj.mod ({source}) differs from the copy in bundle proj:1 at {bundle}")
    assert message.endswith(f"Rebuild the bundle: agentix build {root}")


def test_a_module_added_after_the_build_is_reported(project, caplog):
    _, _, bundle = project
    with caplog.at_level(logging.WARNING, logger="agentix.bundle"):
        BundleCheck.create(bundle, "warn").check("proj.extra::g")
    assert "module proj.extra" in caplog.text and "is not in bundle proj:1" in caplog.text


def test_strict_refuses_every_call(project, monkeypatch):
    _, source, bundle = project
    source.write_text("changed = True\n")
    monkeypatch.setenv("AGENTIX_STALE_MODULES", "strict")
    check = BundleCheck.create(bundle, None)
    for _ in range(2):
        with pytest.raises(StaleModuleError, match="AGENTIX_STALE_MODULES=strict refuses the call") as info:
            check.check("proj.mod::f")
        assert info.value.module == "proj.mod"


def test_off_no_manifest_and_bad_input(project, tmp_path, monkeypatch):
    _, _, bundle = project
    monkeypatch.delenv("AGENTIX_BUNDLE_MANIFEST", raising=False)
    assert BundleCheck.create(bundle, "off") is None
    assert BundleCheck.create(None, "warn") is None
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"name": "x"}))  # built before module hashes
    assert BundleCheck.create(old, "warn") is None
    with pytest.raises(ValueError, match="stale_modules must be one of warn, strict, off"):
        BundleCheck.create(bundle, "loud")
    with pytest.raises(ValueError, match="cannot read the bundle manifest"):
        BundleCheck.create(tmp_path / "missing", "warn")
