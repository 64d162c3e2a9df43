"""Hardened bundle extraction (SPEC §9.8) and OCI layer application."""

import io
import json
import logging
import os
import stat
import tarfile

import pytest

from agentix.provider._extract import ExtractLimits, UnsafeArchiveError, extract_nix_tree
from agentix.provider._oci import ImageDigestError, _apply_layer, unpack_oci_layout

BOOTSTRAP = ("nix/runtime/bootstrap.sh", b"#!/bin/sh\nexec true\n", 0o755)


def _member(name, *, data=None, kind=tarfile.REGTYPE, linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = linkname
    if data is not None:
        info.size = len(data)
    return info, data


def _file(name, data=b"", mode=0o644):
    return _member(name, data=data, mode=mode)


def _dir(name, mode=0o755):
    return _member(name, kind=tarfile.DIRTYPE, mode=mode)


def _symlink(name, target):
    return _member(name, kind=tarfile.SYMTYPE, linkname=target)


def _hardlink(name, target):
    return _member(name, kind=tarfile.LNKTYPE, linkname=target)


def _tar(path, members, gzip=False):
    with tarfile.open(path, "w:gz" if gzip else "w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _bundle(tmp_path, *extra, gzip=False, name="bundle.tar"):
    return _tar(tmp_path / name, [_dir("nix"), _dir("nix/runtime"), _file(*BOOTSTRAP), *extra], gzip=gzip)


def _leftovers(tmp_path):
    return [entry for entry in os.listdir(tmp_path / "cache") if entry.startswith(".")] if (tmp_path / "cache").exists() else []


def test_extracts_files_links_and_modes(tmp_path):
    tar = _bundle(
        tmp_path,
        _dir("nix/runtime/bin", mode=0o750),
        _file("nix/runtime/bin/tool", b"tool", mode=0o4755),
        _symlink("nix/runtime/bin/alias", "tool"),
        _symlink("nix/runtime/abs", "/nix/runtime/bin/tool"),
        _hardlink("nix/runtime/bin/tool2", "nix/runtime/bin/tool"),
        gzip=True,
    )
    root = tmp_path / "cache" / "sha256-x"
    nix = extract_nix_tree(tar, root)
    assert nix == root / "nix"
    assert (nix / "runtime" / "bootstrap.sh").read_bytes() == BOOTSTRAP[1]
    assert stat.S_IMODE(os.stat(nix / "runtime" / "bootstrap.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(nix / "runtime" / "bin" / "tool").st_mode) == 0o755  # setuid dropped
    assert stat.S_IMODE(os.stat(nix / "runtime" / "bin").st_mode) == 0o750
    assert os.readlink(nix / "runtime" / "bin" / "alias") == "tool"
    assert os.readlink(nix / "runtime" / "abs") == "/nix/runtime/bin/tool"
    assert os.stat(nix / "runtime" / "bin" / "tool2").st_ino == os.stat(nix / "runtime" / "bin" / "tool").st_ino
    assert _leftovers(tmp_path) == []


def test_gnu_dot_slash_names_are_accepted(tmp_path):
    tar = _tar(tmp_path / "b.tar", [_dir("."), _dir("./nix"), _file("./" + BOOTSTRAP[0], BOOTSTRAP[1], BOOTSTRAP[2])])
    assert (extract_nix_tree(tar, tmp_path / "root") / "runtime" / "bootstrap.sh").is_file()


def test_manifest_is_written_sorted_and_the_tars_own_is_skipped(tmp_path):
    tar = _bundle(tmp_path, _file("manifest.json", b'{"from": "tar"}'))
    root = tmp_path / "root"
    extract_nix_tree(tar, root, manifest={"name": "b", "format": "agentix-bundle"})
    assert (root / "manifest.json").read_text() == json.dumps(
        {"format": "agentix-bundle", "name": "b"}, indent=2, sort_keys=True
    ) + "\n"
    assert sorted(os.listdir(root)) == [".agentix-verified.json", "manifest.json", "nix"]


def test_no_manifest_written_when_none_given(tmp_path):
    root = tmp_path / "root"
    extract_nix_tree(_bundle(tmp_path, _file("manifest.json", b"{}")), root)
    assert sorted(os.listdir(root)) == [".agentix-verified.json", "nix"]


def test_idempotent_once_bootstrap_exists(tmp_path):
    root = tmp_path / "root"
    extract_nix_tree(_bundle(tmp_path, _file("nix/first", b"1")), root)
    second = _bundle(tmp_path, _file("nix/second", b"2"), name="other.tar")
    assert extract_nix_tree(second, root) == root / "nix"
    assert (root / "nix" / "first").exists() and not (root / "nix" / "second").exists()


@pytest.mark.parametrize(
    "member, message",
    [
        (_file("/nix/abs", b"x"), "absolute path"),
        (_file("nix/../../escape", b"x"), "'..' in path"),
        (_file("nix/runtime/../../../x", b"x"), "'..' in path"),
        (_file("etc/passwd", b"x"), "outside nix/"),
        (_hardlink("nix/link", "nix/../../etc/passwd"), "'..' in path"),
        (_hardlink("nix/link", "nix/missing"), "hard link target"),
        (_member("nix/fifo", kind=tarfile.FIFOTYPE), "member type"),
        (_member("nix/dev", kind=tarfile.CHRTYPE), "member type"),
        (_member("nix/blk", kind=tarfile.BLKTYPE), "member type"),
    ],
)
def test_unsafe_members_are_refused_and_nothing_is_left(tmp_path, member, message):
    tar = _bundle(tmp_path, member)
    root = tmp_path / "cache" / "root"
    with pytest.raises(UnsafeArchiveError, match=message) as caught:
        extract_nix_tree(tar, root)
    assert caught.value.member == member[0].name and caught.value.rule == message.replace("\\", "")
    assert not root.exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("target", ["/etc/passwd", "../../etc", "../..", "/", "/nixos"])
def test_escaping_symlinks_are_omitted_with_a_warning(tmp_path, caplog, target):
    tar = _bundle(tmp_path, _symlink("nix/runtime/escape", target), _symlink("nix/runtime/ok", "/nix/runtime/bootstrap.sh"))
    with caplog.at_level(logging.WARNING, logger="agentix.provider._extract"):
        nix = extract_nix_tree(tar, tmp_path / "root")
    assert not os.path.lexists(nix / "runtime" / "escape")
    assert os.path.islink(nix / "runtime" / "ok")
    assert "nix/runtime/escape" in caplog.text and "outside /nix" in caplog.text


def test_no_write_through_a_symlinked_parent(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    # In-/nix symlink (allowed as a link) used as a directory by a later member.
    tar = _bundle(tmp_path, _symlink("nix/sub", "runtime"), _file("nix/sub/planted", b"x"))
    with pytest.raises(UnsafeArchiveError, match="parent .* is a symlink"):
        extract_nix_tree(tar, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_no_write_through_a_file_parent(tmp_path):
    tar = _bundle(tmp_path, _file("nix/plain", b"x"), _file("nix/plain/child", b"y"))
    with pytest.raises(UnsafeArchiveError, match="not a directory"):
        extract_nix_tree(tar, tmp_path / "root")


def test_a_later_file_replaces_a_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    # nix/runtime/x -> /nix/... is allowed; the file written later at the same
    # name must replace the link, never write to where it points.
    tar = _bundle(tmp_path, _symlink("nix/runtime/x", "/nix/runtime/bootstrap.sh"), _file("nix/runtime/x", b"new"))
    nix = extract_nix_tree(tar, tmp_path / "root")
    assert not os.path.islink(nix / "runtime" / "x") and (nix / "runtime" / "x").read_bytes() == b"new"
    assert victim.read_text() == "untouched"


def test_hard_link_to_a_symlink_is_refused(tmp_path):
    tar = _bundle(tmp_path, _symlink("nix/runtime/link", "bootstrap.sh"), _hardlink("nix/hard", "nix/runtime/link"))
    with pytest.raises(UnsafeArchiveError, match="not a regular file"):
        extract_nix_tree(tar, tmp_path / "root")


def test_archive_without_bootstrap_is_not_a_bundle(tmp_path):
    tar = _tar(tmp_path / "b.tar", [_dir("nix"), _file("nix/readme", b"x")])
    with pytest.raises(RuntimeError, match="not an agentix bundle"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_symlinked_nix_does_not_count_as_a_bundle(tmp_path):
    # A `nix -> /nix` member would make the host's /nix look like the bundle.
    tar = _tar(tmp_path / "b.tar", [_symlink("nix", "/nix")])
    with pytest.raises(RuntimeError, match="not an agentix bundle"):
        extract_nix_tree(tar, tmp_path / "root")


def test_oci_layer_whiteouts_and_setuid_stripping(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    lower = _tar(tmp_path / "lower.tar", [
        _dir("etc"), _file("etc/keep", b"k"), _file("etc/gone", b"g"),
        _dir("opaque"), _file("opaque/old", b"o"),
        _dir("bin"), _file("bin/su", b"su", mode=0o4755), _symlink("bin/sh", "/bin/busybox"),
        _member("dev/null", kind=tarfile.CHRTYPE),
    ])
    upper = _tar(tmp_path / "upper.tar", [
        _file("etc/.wh.gone", b""),
        _dir("opaque"), _file("opaque/.wh..wh..opq", b""), _file("opaque/new", b"n"),
    ])
    _apply_layer(lower, root)
    _apply_layer(upper, root)
    assert sorted(os.listdir(root / "etc")) == ["keep"]
    assert sorted(os.listdir(root / "opaque")) == ["new"]
    assert stat.S_IMODE(os.stat(root / "bin" / "su").st_mode) == 0o755
    assert os.readlink(root / "bin" / "sh") == "/bin/busybox"  # resolved inside the sandbox, kept as is
    assert not (root / "dev" / "null").exists()


def test_oci_layer_cannot_write_through_its_absolute_symlinks(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    layer = _tar(tmp_path / "l.tar", [_symlink("etc", str(outside)), _file("etc/passwd", b"x")])
    with pytest.raises(RuntimeError, match="is a symlink"):
        _apply_layer(layer, root)
    assert os.listdir(outside) == []
