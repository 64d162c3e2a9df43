"""agentix.runtime.shared.env: undoing the bundle's environment (SPEC §3.7)."""

from agentix.runtime.shared.env import AGENTIX_ADDED_PATH, BUNDLE_RUNTIME_BASH, get_env_without_agentix, image_env


def test_constants():
    assert AGENTIX_ADDED_PATH == "AGENTIX_ADDED_PATH"
    assert BUNDLE_RUNTIME_BASH == "/nix/runtime/bin/bash"


def test_added_entries_are_removed_exactly():
    base = {
        "PATH": "/nix/runtime/venv/bin:/nix/runtime/bin:/usr/bin:/bin",
        "AGENTIX_ADDED_PATH": "/nix/runtime/venv/bin:/nix/runtime/bin",
        "LD_LIBRARY_PATH": "/nix/runtime/lib",
        "AGENTIX_ADDED_LD_LIBRARY_PATH": "/nix/runtime/lib",
        "HOME": "/root",
    }
    assert get_env_without_agentix(base=base) == {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def test_saved_values_restored_only_when_absent_and_extra_applied_last():
    base = {
        "AGENTIX_SAVED_PYTHONPATH": "/image/lib",
        "AGENTIX_SAVED_LD_PRELOAD": "/old.so",
        "LD_PRELOAD": "/live.so",
    }
    env = get_env_without_agentix({"PYTHONPATH": "/mine"}, base=base)
    assert env == {"PYTHONPATH": "/mine", "LD_PRELOAD": "/live.so"}
    assert get_env_without_agentix(base=base)["PYTHONPATH"] == "/image/lib"


def test_image_env_sets_bash_env_when_a_bashrc_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("BASH_ENV", raising=False)
    assert "BASH_ENV" not in image_env()
    (tmp_path / ".bashrc").write_text("export X=1\n")
    assert image_env()["BASH_ENV"] == str(tmp_path / ".bashrc")
    assert image_env({"BASH_ENV": "/other"})["BASH_ENV"] == "/other"
