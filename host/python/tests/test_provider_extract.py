"""Hardened bundle extraction (SPEC §9.8) and OCI layer application."""

import io
import json
import logging
import os
import stat
import tarfile

import pytest

from agentix.provider._extract import ExtractLimits, UnsafeArchiveError, extract_nix_tree
from agentix.provider._oci import _apply_layer

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


# --- Issue 17, item 7: hostile bundle tarballs ----------------------------------------------


def _tree_snapshot(path):
    """Every path under `path` (without following links), with its size."""
    result = {}
    for directory, dirnames, filenames in os.walk(path):
        for entry in dirnames + filenames:
            full = os.path.join(directory, entry)
            result[os.path.relpath(full, path)] = os.lstat(full).st_size
    return result


def test_setuid_sticky_and_writable_modes_are_dropped(tmp_path):
    tar = _bundle(
        tmp_path,
        _dir("nix/open", mode=0o777),
        _dir("nix/tmp", mode=0o1777),
        _file("nix/open/suid", b"x", mode=0o4755),
        _file("nix/open/sgid", b"x", mode=0o2775),
        _file("nix/open/world", b"x", mode=0o777),
        _file("nix/open/private", b"x", mode=0o600),
    )
    nix = extract_nix_tree(tar, tmp_path / "cache" / "root")
    modes = {name: stat.S_IMODE(os.lstat(nix / name).st_mode) for name in
             ("open", "tmp", "open/suid", "open/sgid", "open/world", "open/private")}
    assert modes == {"open": 0o755, "tmp": 0o755, "open/suid": 0o755, "open/sgid": 0o755,
                     "open/world": 0o755, "open/private": 0o600}


def test_symlink_resolving_through_an_earlier_dotdot_symlink_is_refused(tmp_path):
    # `up -> ..` is nix/ itself (inside); `passwd -> up/../etc/passwd` looks like
    # nix/runtime/etc/passwd but resolves through `up` to /etc/passwd.
    before = _tree_snapshot(tmp_path)
    tar = _bundle(
        tmp_path,
        _symlink("nix/runtime/up", ".."),
        _symlink("nix/runtime/passwd", "up/../etc/passwd"),
        _file("nix/runtime/after", b"x"),
    )
    root = tmp_path / "cache" / "root"
    with pytest.raises(UnsafeArchiveError, match="symlink leaves the tree") as caught:
        extract_nix_tree(tar, root)
    assert caught.value.member == "nix/runtime/passwd" and caught.value.rule == "symlink leaves the tree"
    assert "up/../etc/passwd" in str(caught.value)
    assert not root.exists() and _leftovers(tmp_path) == []
    after = _tree_snapshot(tmp_path)
    assert set(after) - set(before) - {"bundle.tar", "cache"} == set()  # nothing written elsewhere


def test_a_later_symlink_cannot_redirect_an_earlier_one_outside(tmp_path):
    # `a -> x/y/../..` is nix/ when written (x missing); `x -> .` then makes it
    # nix/y/../.. = the sandbox's /. The check over the finished tree refuses it.
    tar = _bundle(tmp_path, _symlink("nix/a", "x/y/../.."), _symlink("nix/x", "."), _dir("nix/y"))
    with pytest.raises(UnsafeArchiveError, match="'nix/a' refused \\(symlink leaves the tree\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_hard_link_through_a_symlinked_directory_is_refused(tmp_path):
    tar = _bundle(tmp_path, _symlink("nix/rt", "runtime"), _hardlink("nix/copy", "nix/rt/bootstrap.sh"))
    with pytest.raises(UnsafeArchiveError, match="'nix/copy' refused \\(hard link target\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")


def test_size_cap_refuses_a_member_before_writing_it(tmp_path):
    tar = _bundle(tmp_path, _file("nix/big", bytes(4 << 20)), gzip=True)
    assert os.path.getsize(tar) < 64 << 10
    with pytest.raises(UnsafeArchiveError, match="'nix/big' refused \\(size cap\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root", limits=ExtractLimits(max_bytes=1 << 20))
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_size_cap_is_a_running_total(tmp_path):
    parts = [_file(f"nix/part{i}", bytes(300 << 10)) for i in range(4)]
    tar = _bundle(tmp_path, *parts, gzip=True)
    with pytest.raises(UnsafeArchiveError, match="'nix/part3' refused \\(size cap\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root", limits=ExtractLimits(max_bytes=1 << 20))


def test_uncompressed_stream_cap_counts_headers_too(tmp_path):
    tar = _bundle(tmp_path, *[_dir(f"nix/d{i}") for i in range(400)], gzip=True)  # ~200 KB of headers, no data
    with pytest.raises(UnsafeArchiveError, match="archive refused \\(size cap\\): uncompressed stream"):
        extract_nix_tree(tar, tmp_path / "cache" / "root", limits=ExtractLimits(max_bytes=100 << 10))
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_member_cap(tmp_path):
    tar = _bundle(tmp_path, *[_file(f"nix/f{i}", b"") for i in range(20)])
    with pytest.raises(UnsafeArchiveError, match="\\(member cap\\): more than 10 members"):
        extract_nix_tree(tar, tmp_path / "cache" / "root", limits=ExtractLimits(max_members=10))
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_limits_from_the_environment(monkeypatch):
    assert ExtractLimits.from_env() == ExtractLimits(max_bytes=8 << 30, max_members=1_000_000)
    monkeypatch.setenv("AGENTIX_EXTRACT_MAX_BYTES", "4096")
    monkeypatch.setenv("AGENTIX_EXTRACT_MAX_MEMBERS", "7")
    assert ExtractLimits.from_env() == ExtractLimits(max_bytes=4096, max_members=7)
    monkeypatch.setenv("AGENTIX_EXTRACT_MAX_BYTES", "0")
    with pytest.raises(ValueError, match="must be positive"):
        ExtractLimits.from_env()


def _gzip_bomb(path, size):
    """A tar.gz whose one member holds `size` zero bytes — for real: the data is
    concatenated gzip members of 16 MiB of zeros, ~16 KiB each."""
    import gzip as gz

    info = tarfile.TarInfo("nix/bomb")
    info.size = size
    chunk = gz.compress(bytes(16 << 20), compresslevel=9)
    with open(path, "wb") as out:
        out.write(gz.compress(_bundle_prefix() + info.tobuf(tarfile.GNU_FORMAT)))
        for _ in range(-(-size // (16 << 20))):
            out.write(chunk)
    return path


def _bundle_prefix():
    """The members of a minimal bundle, without the end-of-archive blocks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in [_dir("nix"), _dir("nix/runtime"), _file(*BOOTSTRAP)]:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return _strip_end(buffer.getvalue())


def _strip_end(data):
    """The tar stream without its end-of-archive zero blocks (so more members can follow)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = archive.getmembers()
    last = members[-1]
    return data[: last.offset_data + -(-last.size // 512) * 512]


def test_default_cap_refuses_a_gzip_bomb_fast_without_materializing_it(tmp_path):
    import time

    cap = ExtractLimits().max_bytes
    tar = _gzip_bomb(tmp_path / "bomb.tar.gz", cap + 1)  # ~8 MB expanding to 8 GiB
    assert os.path.getsize(tar) < 16 << 20
    started = time.monotonic()
    with pytest.raises(UnsafeArchiveError, match="'nix/bomb' refused \\(size cap\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")
    assert time.monotonic() - started < 5  # refused at the header, nothing decompressed past it
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def _gnu_sparse_member(name, real_size):
    """A GNU sparse ('S') header of `real_size` bytes holding no data: a tiny
    archive that expands to `real_size` zero bytes on disk."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 0
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[386:398] = b"%011o\0" % (real_size - 1)  # one sparse entry: 0 bytes at the end
    header[398:410] = b"%011o\0" % 0
    header[483:495] = b"%011o\0" % real_size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def test_sparse_bomb_is_refused(tmp_path):
    import gzip as gz

    tar = tmp_path / "sparse.tar.gz"
    tar.write_bytes(gz.compress(_bundle_prefix() + _gnu_sparse_member("nix/sparse", 2 << 30) + bytes(1024)))
    assert os.path.getsize(tar) < 512
    with pytest.raises(UnsafeArchiveError, match="'nix/sparse' refused \\(sparse file\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")
    assert not (tmp_path / "cache" / "root").exists() and _leftovers(tmp_path) == []


def test_oversized_long_name_header_is_refused_before_it_is_read(tmp_path):
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = 64 << 20
    tar = tmp_path / "longname.tar"
    tar.write_bytes(_bundle_prefix() + info.tobuf(tarfile.GNU_FORMAT) + bytes(1024))
    with pytest.raises(UnsafeArchiveError, match="\\(header cap\\)"):
        extract_nix_tree(tar, tmp_path / "cache" / "root")


def test_an_unverified_cache_directory_is_replaced_not_trusted(tmp_path):
    root = tmp_path / "cache" / "root"
    (root / "nix" / "runtime").mkdir(parents=True)
    (root / "nix" / "runtime" / "bootstrap.sh").write_bytes(b"#!/bin/sh\necho planted\n")
    (root / "nix" / "planted").write_bytes(b"x")
    nix = extract_nix_tree(_bundle(tmp_path), root)
    assert (nix / "runtime" / "bootstrap.sh").read_bytes() == BOOTSTRAP[1]
    assert not (nix / "planted").exists() and _leftovers(tmp_path) == []


def test_expected_sha256_must_match_the_bytes_extracted(tmp_path):
    import hashlib

    tar = _bundle(tmp_path)
    root = tmp_path / "cache" / "root"
    with pytest.raises(RuntimeError, match="sha256 is [0-9a-f]{64}, expected 0{64}"):
        extract_nix_tree(tar, root, expected_sha256="0" * 64)
    assert not root.exists() and _leftovers(tmp_path) == []
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()
    extract_nix_tree(tar, root, expected_sha256=digest)
    assert json.loads((root / ".agentix-verified.json").read_text()) == {"format": 1, "sha256": digest}


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_plain_and_compressed_bundles_extract(tmp_path, mode):
    tar = tmp_path / "bundle.tar"
    with tarfile.open(tar, mode) as archive:
        for info, data in [_dir("nix"), _dir("nix/runtime"), _file(*BOOTSTRAP)]:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    nix = extract_nix_tree(tar, tmp_path / "cache" / "root")
    assert (nix / "runtime" / "bootstrap.sh").read_bytes() == BOOTSTRAP[1]
