"""`agentix doctor`'s CPU idle check against fake sysfs trees."""

from pathlib import Path

from agentix.cli.doctor import cpu_idle


def _sysfs(root: Path, governor: str | None, poll_ns: str | None) -> Path:
    if governor is not None:
        cpuidle = root / "devices/system/cpu/cpuidle"
        cpuidle.mkdir(parents=True)
        (cpuidle / "current_governor_ro").write_text(governor + "\n")
    if poll_ns is not None:
        params = root / "module/haltpoll/parameters"
        params.mkdir(parents=True)
        (params / "guest_halt_poll_ns").write_text(poll_ns + "\n")
    return root


def test_halting_at_once_is_a_warning_that_says_how_to_change_it(tmp_path):
    check = cpu_idle(_sysfs(tmp_path, "haltpoll", "0"))
    assert check.status == "warn"
    assert "guest_halt_poll_ns=0" in check.detail
    assert "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns" in check.fix


def test_polling_before_halting_is_ok(tmp_path):
    check = cpu_idle(_sysfs(tmp_path, "haltpoll", "200000"))
    assert (check.status, check.fix) == ("ok", "")
    assert "200000 ns" in check.detail


def test_other_governors_and_no_cpuidle_are_ok(tmp_path):
    assert cpu_idle(_sysfs(tmp_path / "menu", "menu", None)).detail == "cpuidle governor menu"
    assert cpu_idle(_sysfs(tmp_path / "none", None, None)).status == "ok"
    # haltpoll without its parameter (a kernel that does not export it)
    assert cpu_idle(_sysfs(tmp_path / "bare", "haltpoll", None)).status == "ok"
