"""OCI image layouts: verified, content-addressed root cache (issue 17, item 7)."""

import hashlib
import io
import json
import os
import stat
import tarfile

import pytest

from agentix.provider._extract import ExtractLimits, UnsafeArchiveError
from agentix.provider._oci import ImageDigestError, unpack_oci_layout


def _layer(members, gzip=True):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        for name, kind, payload, mode in members:
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, mode
            data = None
            if kind == tarfile.SYMTYPE:
                info.linkname = payload
            elif kind == tarfile.REGTYPE:
                data = payload
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name, data, mode=0o644):
    return (name, tarfile.REGTYPE, data, mode)


def _dir(name, mode=0o755):
    return (name, tarfile.DIRTYPE, None, mode)


def _symlink(name, target):
    return (name, tarfile.SYMTYPE, target, 0o777)


def _put(layout, data):
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _manifest(layout, layers, config=b'{"architecture": "amd64", "os": "linux"}'):
    """Writes the blobs of an image; returns the manifest's bytes."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_put(layout, config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_put(layout, layer)}
                   for layer in layers],
    }
    return json.dumps(manifest).encode()


def _index(layout, descriptor):
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **descriptor,
        "annotations": {"org.opencontainers.image.ref.name": "v1"},
    }]}))


def _layout(layout, layers, **kwargs):
    _index(layout, _put(layout, _manifest(layout, layers, **kwargs)))
    return layout


GOOD = [_dir("etc"), _file("etc/marker", b"good\n")]
EVIL = [_dir("etc"), _file("etc/marker", b"evil\n")]


def test_index_claiming_another_images_digest_is_refused_and_its_cache_kept(tmp_path):
    cache = tmp_path / "cache"
    good = _layout(tmp_path / "good", [_layer(GOOD)])
    good_digest = json.loads((good / "index.json").read_text())["manifests"][0]["digest"]
    root = unpack_oci_layout(good, None, cache)
    assert (root / "etc" / "marker").read_bytes() == b"good\n"

    # The attacker's layout: its own manifest stored under, and named by, the good digest.
    evil = tmp_path / "evil"
    evil_manifest = _manifest(evil, [_layer(EVIL)])
    (evil / "blobs" / "sha256" / good_digest.partition(":")[2]).write_bytes(evil_manifest)
    _index(evil, {"digest": good_digest, "size": len(evil_manifest)})
    for cached in (cache, tmp_path / "fresh-cache"):  # with and without the good image cached
        with pytest.raises(ImageDigestError, match="manifest blob does not match its descriptor") as caught:
            unpack_oci_layout(evil, None, cached)
        assert good_digest in str(caught.value)
        assert "sha256:" + hashlib.sha256(evil_manifest).hexdigest() in str(caught.value)
    assert not (tmp_path / "fresh-cache").exists() or not any(
        entry.name.startswith("sha256-") for entry in (tmp_path / "fresh-cache").iterdir())
    assert (root / "etc" / "marker").read_bytes() == b"good\n"  # the good entry is untouched
    assert unpack_oci_layout(good, None, cache) == root
    assert sorted(entry.name for entry in cache.iterdir()) == [f"sha256-{good_digest.partition(':')[2]}"]


def test_manifest_size_must_match(tmp_path):
    layout = tmp_path / "layout"
    manifest = _manifest(layout, [_layer(GOOD)])
    _index(layout, {**_put(layout, manifest), "size": len(manifest) + 1})
    with pytest.raises(ImageDigestError, match=f"\\({len(manifest) + 1} bytes\\), the blob is .* \\({len(manifest)} bytes\\)"):
        unpack_oci_layout(layout, None, tmp_path / "cache")


def test_config_blob_must_match(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer(GOOD)])
    manifest = json.loads((layout / "blobs" / "sha256" / json.loads((layout / "index.json").read_text())
                           ["manifests"][0]["digest"].partition(":")[2]).read_bytes())
    config = layout / "blobs" / "sha256" / manifest["config"]["digest"].partition(":")[2]
    config.write_bytes(config.read_bytes().replace(b"amd64", b"arm64"))
    with pytest.raises(ImageDigestError, match="config blob does not match its descriptor"):
        unpack_oci_layout(layout, None, tmp_path / "cache")
    assert not any(e.name.startswith("sha256-") for e in (tmp_path / "cache").iterdir()) \
        if (tmp_path / "cache").exists() else True


def test_layer_blob_must_match_and_nothing_is_cached(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer(GOOD)])
    index = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"].partition(":")[2]
    layer_digest = json.loads((layout / "blobs" / "sha256" / index).read_bytes())["layers"][0]["digest"]
    blob = layout / "blobs" / "sha256" / layer_digest.partition(":")[2]
    good_size = len(blob.read_bytes())
    evil = _layer(EVIL)
    assert len(evil) == good_size  # same size: only the hash tells them apart
    blob.write_bytes(evil)
    with pytest.raises(ImageDigestError, match=f"descriptor says {layer_digest}, the blob is sha256:"):
        unpack_oci_layout(layout, None, tmp_path / "cache")
    assert [e.name for e in (tmp_path / "cache").iterdir()] == []


def test_an_unverified_cache_entry_is_rebuilt_not_trusted(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer(GOOD)])
    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"].partition(":")[2]
    planted = tmp_path / "cache" / f"sha256-{digest}"
    for root in (planted, planted / "rootfs"):  # the old layout, and the new one without its record
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc" / "marker").write_bytes(b"planted\n")
    root = unpack_oci_layout(layout, None, tmp_path / "cache")
    assert (root / "etc" / "marker").read_bytes() == b"good\n"
    assert [e.name for e in (tmp_path / "cache").iterdir()] == [f"sha256-{digest}"]


def test_layer_modes_drop_setuid_sticky_and_group_world_write(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer([
        _dir("bin"), _file("bin/su", b"su", mode=0o4755), _file("bin/open", b"x", mode=0o777),
        _dir("tmp", mode=0o1777), _dir("shared", mode=0o777),
    ])])
    root = unpack_oci_layout(layout, None, tmp_path / "cache")
    modes = {name: stat.S_IMODE(os.lstat(root / name).st_mode) for name in ("bin/su", "bin/open", "tmp", "shared")}
    assert modes == {"bin/su": 0o755, "bin/open": 0o755, "tmp": 0o755, "shared": 0o755}


def test_layer_symlink_resolving_above_the_root_through_an_earlier_link_is_refused(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer([
        _dir("x"), _symlink("x/up", ".."), _symlink("x/passwd", "up/../etc/passwd"),
    ])])
    with pytest.raises(UnsafeArchiveError, match="'x/passwd' refused \\(symlink leaves the tree\\)"):
        unpack_oci_layout(layout, None, tmp_path / "cache")
    assert [e.name for e in (tmp_path / "cache").iterdir()] == []  # no entry, no staging left


def test_absolute_layer_symlinks_stay_inside_the_image(tmp_path):
    layout = _layout(tmp_path / "layout", [_layer([
        _dir("bin"), _file("bin/busybox", b"bb", mode=0o755), _symlink("bin/sh", "/bin/busybox"),
        _symlink("bin/up", ".."), _symlink("bin/etc", "up/etc"),  # .. of bin is the root: inside
    ])])
    root = unpack_oci_layout(layout, None, tmp_path / "cache")
    assert os.readlink(root / "bin" / "sh") == "/bin/busybox"


def test_size_cap_covers_all_layers_together(tmp_path):
    layers = [_layer([_file(f"part{i}", bytes(600 << 10))]) for i in range(2)]
    layout = _layout(tmp_path / "layout", layers)
    with pytest.raises(UnsafeArchiveError, match="'part1' refused \\(size cap\\)"):
        unpack_oci_layout(layout, None, tmp_path / "cache", limits=ExtractLimits(max_bytes=1 << 20))
    assert [e.name for e in (tmp_path / "cache").iterdir()] == []
