"""The build cache against corruption and interruption (issue 25): artifacts leave the cache as copies
(a damaged build file cannot damage the entry), "up to date" checks sha256 (a same-size corruption is
noticed), no temporaries are left after a failure, and `emitter cache --max-size` / `--clear` bound and
free the space. A fake nvcc stands in for the compiler."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from emitter.build import builder as builder_mod
from emitter.build.cache import Cache
from tests.hostile_helpers import assert_clean, cli, entry, install_fake_nvcc, nvcc_calls, write_manifest


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return install_fake_nvcc(tmp_path, monkeypatch)


def _manifest(tmp_path: Path, names=("k",)) -> Path:
    m = tmp_path / "m"
    write_manifest(m, [entry(n) for n in names], sources={f"{n}.cu": f"// instance {n}\n" for n in names})
    return m


def _build(m: Path, tmp_path: Path, *extra):
    return cli("build", m, "--no-progress", "-j", "1", "--cache-dir", tmp_path / "cache", *extra)


def _flip(path: Path) -> None:
    """Same size, different bytes."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _art(m: Path, name: str, kind: str) -> Path:
    """An installed artifact as its record names it (the device image may be a .cubin or a .fatbin)."""
    return m / json.loads((m / "build" / name / "record.json").read_text())["artifacts"][kind]


def _entry_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache" / "v1" / "entries").glob("*/*") if p.is_dir())


def test_artifacts_are_copies_not_links(tmp_path, fake):
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    [ent] = _entry_dirs(tmp_path)
    for kind, cached in (("host", "host.so"), ("cubin", "device.cubin")):
        a, c = _art(m, "k", kind), ent / cached
        assert a.stat().st_nlink == 1 and c.stat().st_nlink == 1
        assert a.stat().st_ino != c.stat().st_ino


def test_same_size_corruption_of_a_build_file_is_noticed_and_cache_stays_intact(tmp_path, fake):
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    so = m / "build" / "k" / "libk.so"
    good = so.read_bytes()
    _flip(so)
    code, out = _build(m, tmp_path)
    assert code == 0, out
    assert so.read_bytes() == good, "a corrupted artifact must be reinstalled, not kept as up to date"
    assert len(nvcc_calls(fake)) == 2, "reinstalled from the (intact) cache, not recompiled"


def test_same_size_corruption_of_a_cache_file_is_evicted_and_rebuilt(tmp_path, fake):
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    [ent] = _entry_dirs(tmp_path)
    _flip(ent / "device.cubin")
    shutil.rmtree(m / "build")
    code, out = _build(m, tmp_path)
    assert code == 0, out
    assert len(nvcc_calls(fake)) == 4, "the damaged entry must not be used"
    [ent2] = _entry_dirs(tmp_path)
    assert _art(m, "k", "cubin").read_bytes() == (ent2 / "device.cubin").read_bytes()
    assert (ent2 / "device.cubin").read_bytes().startswith(b"cubin:")


def test_disk_full_while_installing_leaves_no_temporary(tmp_path, fake, monkeypatch):
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    shutil.rmtree(m / "build" / "k")
    real = shutil.copyfile

    def full(src, dst, *a, **kw):
        with open(dst, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(builder_mod.shutil, "copyfile", full)
    code, out = _build(m, tmp_path)
    monkeypatch.setattr(builder_mod.shutil, "copyfile", real)
    assert code == 1 and "No space left" in out, out
    leftovers = [p for p in (m / "build").rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")]
    assert leftovers == [] or all(p.is_dir() and not any(p.iterdir()) for p in leftovers), leftovers
    rec = json.loads((m / "build" / "k" / "record.json").read_text())
    assert rec["status"] == "failed" and rec["artifacts"] == {"cubin": None, "host": None}
    code, out = _build(m, tmp_path)         # space is back: a cache hit
    assert code == 0 and len(nvcc_calls(fake)) == 2, out


def test_disk_full_while_committing_to_the_cache_leaves_no_stage(tmp_path, fake, monkeypatch):
    import emitter.build.cache as cache_mod

    m = _manifest(tmp_path)
    real = cache_mod.json.dump

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.json, "dump", full)
    code, out = _build(m, tmp_path)
    monkeypatch.setattr(cache_mod.json, "dump", real)
    assert code == 1 and "No space left" in out, out
    tmp = tmp_path / "cache" / "v1" / "tmp"
    assert not list(tmp.iterdir()), list(tmp.iterdir())
    assert _entry_dirs(tmp_path) == []


def test_renaming_onto_the_same_file_leaves_no_link(tmp_path, fake):
    """With hard links a rename onto another link of the same inode is a no-op that keeps the temporary."""
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    rec = m / "build" / "k" / "record.json"
    data = json.loads(rec.read_text())
    data["cache_key"] = "0" * 64          # not up to date: installs from the cache over the same files
    rec.write_text(json.dumps(data))
    assert _build(m, tmp_path)[0] == 0
    names = sorted(p.name for p in (m / "build" / "k").iterdir())
    assert names == sorted(["build.log", "record.json", _art(m, "k", "cubin").name, "libk.so"]), names


def _cache_with(tmp_path, fake, n: int) -> list[str]:
    m = _manifest(tmp_path, names=[f"k{i}" for i in range(n)])
    assert _build(m, tmp_path)[0] == 0
    keys = []
    for i in range(n):
        keys.append(json.loads((m / "build" / f"k{i}" / "record.json").read_text())["cache_key"])
    now = time.time()
    for i, key in enumerate(keys):             # k0 used longest ago
        os.utime(Cache(tmp_path / "cache").entry_path(key) / "meta.json", (now - 1000 + i, now - 1000 + i))
    return keys


def test_cache_max_size_evicts_least_recently_used(tmp_path, fake):
    keys = _cache_with(tmp_path, fake, 3)
    cache = Cache(tmp_path / "cache")
    size = {k: sum(f.stat().st_size for f in cache.entry_path(k).iterdir()) for k in keys}
    code, out = cli("cache", "--cache-dir", tmp_path / "cache", "--max-size", str(size[keys[1]] + size[keys[2]]))
    assert code == 0 and "evicted 1" in out, out
    assert not cache.entry_path(keys[0]).exists()
    assert cache.entry_path(keys[1]).exists() and cache.entry_path(keys[2]).exists()


def test_a_cache_hit_counts_as_use(tmp_path, fake):
    keys = _cache_with(tmp_path, fake, 2)
    cache = Cache(tmp_path / "cache")
    assert cache.lookup(keys[0]) is not None            # k0 is now the most recently used
    cache.trim(sum(f.stat().st_size for f in cache.entry_path(keys[0]).iterdir()))
    assert cache.entry_path(keys[0]).exists() and not cache.entry_path(keys[1]).exists()


def test_cache_max_size_zero_and_clear_free_everything(tmp_path, fake):
    _cache_with(tmp_path, fake, 2)
    code, out = cli("cache", "--cache-dir", tmp_path / "cache", "--max-size", "0")
    assert code == 0 and "evicted 2" in out
    shutil.rmtree(tmp_path / "m" / "build")
    _cache_with(tmp_path, fake, 2)
    code, out = cli("cache", "--cache-dir", tmp_path / "cache", "--clear")
    assert code == 0 and "cleared 2 entries" in out
    assert Cache(tmp_path / "cache").stats()["entries"] == 0


@pytest.mark.parametrize("size", ["lots", "-5", "1.5.5G", "10X", "9" * 40])
def test_cache_max_size_bad_value(tmp_path, size):
    code, out = cli("cache", "--cache-dir", tmp_path / "cache", "--max-size", size)
    assert_clean(code, out, "is not a size", "fix:")


def test_cache_dir_that_is_a_file(tmp_path):
    (tmp_path / "cachefile").write_text("x")
    code, out = cli("cache", "--cache-dir", tmp_path / "cachefile")
    assert_clean(code, out, "is a file")


@pytest.mark.parametrize("meta", ["[1]", "{ half", json.dumps({"key": "x", "files": [1]})], ids=["list", "json", "files"])
def test_garbage_cache_meta_is_evicted(tmp_path, fake, meta):
    m = _manifest(tmp_path)
    assert _build(m, tmp_path)[0] == 0
    [ent] = _entry_dirs(tmp_path)
    (ent / "meta.json").write_text(meta)
    shutil.rmtree(m / "build")
    code, out = _build(m, tmp_path)
    assert code == 0, out
    assert len(nvcc_calls(fake)) == 4


def test_build_stopped_by_a_full_disk_is_a_clean_error(tmp_path, fake, monkeypatch):
    m = _manifest(tmp_path)
    real = builder_mod.atomic_write_text

    def full(path, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(builder_mod, "atomic_write_text", full)     # the build log, success or failure
    code, out = _build(m, tmp_path)
    monkeypatch.setattr(builder_mod, "atomic_write_text", real)
    assert_clean(code, out, "the build stopped: no space left", "fix:")
    assert not [p for p in (tmp_path / "cache" / "v1" / "tmp").iterdir()]
