"""Content-addressed cache of compiled instances, safe under concurrent builds and SIGKILL.

Layout under the cache root (`cache_root()`):
    v1/entries/<k[:2]>/<key>/   meta.json + device.cubin + host.so   (complete, never modified again)
    v1/tmp/<host>.<pid>.<rand>/  work in progress (nvcc output, entries being assembled, trash)
    v1/locks/<key>.lock          flock: one builder compiles a key at a time; others wait, then hit

An entry appears by one os.rename of a finished directory, so a reader sees all of it or nothing; a
build killed mid-way leaves only a tmp directory, which nothing reads and a later build removes (a
failure such as ENOSPC removes it at once). Files are verified against the sizes and sha256 in
meta.json before they are handed out, and builds copy them (never hard-link), so a damaged build
directory cannot damage an entry. A hit sets meta.json's mtime: the "last used" time by which
`trim(max_bytes)` (`emitter cache --max-size`) evicts least recently used entries first.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from emitter.errors import EmitterError

CACHE_FORMAT = 1


class CacheError(EmitterError):
    exit_code = 2
_ARTIFACT_FILES = {"cubin": "device.cubin", "host": "host.so"}


def cache_root(flag: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """--cache-dir, else $EMITTER_CACHE_DIR, else $XDG_CACHE_HOME/emitter, else ~/.cache/emitter."""
    env = os.environ if env is None else env
    if flag:
        return Path(flag).expanduser()
    if env.get("EMITTER_CACHE_DIR"):
        return Path(env["EMITTER_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "emitter"
    return Path(env.get("HOME") or Path.home()).expanduser() / ".cache" / "emitter"


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tmp_prefix() -> str:
    return f"{socket.gethostname()}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune_tmp(tmp_dir: Path, max_age_s: float = 24 * 3600) -> int:
    """Remove leftovers of dead builds: ours by a dead pid on this host, anyone's after max_age_s."""
    removed = 0
    try:
        children = list(tmp_dir.iterdir())
    except FileNotFoundError:
        return 0
    host = socket.gethostname()
    now = time.time()
    for p in children:
        # names are <host>.<pid>.<rand> (mkdtemp's random part has no dots; hostnames may)
        host_part, _, rest = p.name.rpartition(".")[0].rpartition(".")
        dead = host_part == host and rest.isdigit() and not _pid_alive(int(rest))
        try:
            old = now - p.lstat().st_mtime > max_age_s
        except FileNotFoundError:
            continue
        if dead or old:
            shutil.rmtree(p, ignore_errors=True)
            removed += 1
    return removed


def make_tmp(tmp_dir: Path) -> Path:
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=tmp_dir))


@dataclass
class Entry:
    key: str
    path: Path
    meta: dict[str, Any]

    def file(self, artifact: str) -> Path:
        return self.path / _ARTIFACT_FILES[artifact]


class KeyLock:
    """An exclusive flock on one key (released by the kernel if the holder dies, even by SIGKILL)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class Cache:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.base = self.root / f"v{CACHE_FORMAT}"
        self.entries = self.base / "entries"
        self.tmp = self.base / "tmp"
        self.locks = self.base / "locks"

    # -- entries -----------------------------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def lookup(self, key: str, verify: bool = True) -> Entry | None:
        """The complete entry for `key`, or None. A damaged entry (bad meta, size or hash) is evicted."""
        path = self.entry_path(key)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):
            self.evict(key)
            return None
        if not isinstance(meta, dict):
            self.evict(key)
            return None
        entry = Entry(key, path, meta)
        if verify and not self._intact(entry):
            self.evict(key)
            return None
        try:
            os.utime(path / "meta.json")          # last used, for trim()
        except OSError:
            pass
        return entry

    def _intact(self, entry: Entry) -> bool:
        if entry.meta.get("key") != entry.key:
            return False
        files = entry.meta.get("files")
        if not isinstance(files, dict) or set(files) != set(_ARTIFACT_FILES):
            return False
        for artifact, info in files.items():
            p = entry.file(artifact)
            try:
                if p.is_symlink() or p.stat().st_size != info["size"] or sha256_file(p) != info["sha256"]:
                    return False
            except (OSError, KeyError, TypeError):
                return False
        return True

    def new_work_dir(self) -> Path:
        return make_tmp(self.tmp)

    def commit(self, key: str, work: Path, artifacts: Mapping[str, Path], meta: dict[str, Any]) -> Entry:
        """Move finished artifacts into the entry for `key`, atomically. If another builder committed the
        same key first, theirs stands (same inputs, same outputs) and ours is discarded."""
        stage = Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=self.tmp))
        try:
            return self._commit(key, stage, artifacts, meta)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)     # ENOSPC, say: no stray files
            raise

    def _commit(self, key: str, stage: Path, artifacts: Mapping[str, Path], meta: dict[str, Any]) -> Entry:
        files = {}
        for artifact, src in artifacts.items():
            dst = stage / _ARTIFACT_FILES[artifact]
            os.replace(src, dst)
            files[artifact] = {"size": dst.stat().st_size, "sha256": sha256_file(dst)}
        meta = {"schema_version": CACHE_FORMAT, "key": key, "files": files, "created": time.time(), **meta}
        with open(stage / "meta.json", "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        for name in os.listdir(stage):
            fd = os.open(stage / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        final = self.entry_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(stage, final)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            existing = self.lookup(key)          # evicts the other entry if it is damaged
            if existing is not None:
                shutil.rmtree(stage, ignore_errors=True)
                return existing
            os.rename(stage, final)  # pragma: no cover - the other entry was damaged and evicted
        return Entry(key, final, meta)

    def evict(self, key: str) -> None:
        path = self.entry_path(key)
        if not path.exists():
            return
        trash = Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=self._ensure_tmp()))
        try:
            os.rename(path, trash / "evicted")
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)

    def _ensure_tmp(self) -> Path:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return self.tmp

    def lock(self, key: str) -> KeyLock:
        return KeyLock(self.locks / f"{key}.lock")

    def prune(self) -> int:
        return prune_tmp(self.tmp)

    def ensure_writable(self) -> None:
        try:
            for d in (self.entries, self.tmp, self.locks):
                d.mkdir(parents=True, exist_ok=True)
            probe = make_tmp(self.tmp)
            probe.rmdir()
        except OSError as e:
            raise CacheError(f"the compile cache {self.root} is not writable ({e.strerror})\n"
                             f"  fix: pass --cache-dir DIR or set EMITTER_CACHE_DIR to a writable directory, "
                             f"or build with --no-cache") from None

    # -- `emitter cache` ---------------------------------------------------------------------------
    def _entries_by_use(self) -> list[tuple[float, int, str]]:
        """(last used, bytes, key) of every entry, least recently used first."""
        out = []
        if not self.entries.is_dir():
            return out
        for shard in self.entries.iterdir():
            if not shard.is_dir() or shard.is_symlink():
                continue
            for entry in shard.iterdir():
                try:
                    used = (entry / "meta.json").stat().st_mtime
                except OSError:
                    used = 0.0
                size = 0
                try:
                    for f in entry.iterdir():
                        size += f.lstat().st_size
                except OSError:
                    pass
                out.append((used, size, entry.name))
        out.sort()
        return out

    def trim(self, max_bytes: int) -> dict[str, Any]:
        """Evict least recently used entries until the entries take at most `max_bytes`; entries a build
        holds the lock of are left alone. Returns {"evicted", "freed", "bytes"} (bytes left)."""
        entries = self._entries_by_use()
        total = sum(size for _, size, _ in entries)
        evicted = freed = 0
        for _used, size, key in entries:
            if total <= max_bytes:
                break
            lk = self.lock(key)
            if not lk.try_acquire():
                continue                  # being built or read right now
            try:
                self.evict(key)
                try:
                    lk.path.unlink()
                except OSError:
                    pass
            finally:
                lk.release()
            total -= size
            freed += size
            evicted += 1
        return {"evicted": evicted, "freed": freed, "bytes": total}

    def stats(self) -> dict[str, Any]:
        entries = 0
        size = 0
        for dirpath, _dirs, files in os.walk(self.base):
            for fn in files:
                try:
                    size += os.lstat(os.path.join(dirpath, fn)).st_size
                except FileNotFoundError:
                    pass
        if self.entries.is_dir():
            for shard in self.entries.iterdir():
                if shard.is_dir():
                    entries += sum(1 for _ in shard.iterdir())
        return {"path": str(self.root), "entries": entries, "bytes": size}

    def clear(self) -> dict[str, Any]:
        """Remove every entry (a running build's own work directories are left alone)."""
        before = self.stats()
        if self.entries.exists():
            trash = Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=self._ensure_tmp()))
            os.rename(self.entries, trash / "entries")
            shutil.rmtree(trash, ignore_errors=True)
        self.prune()
        if self.locks.is_dir():
            for p in self.locks.iterdir():
                lk = KeyLock(p)
                if lk.try_acquire():       # nobody is building it: safe to drop the lock file
                    try:
                        p.unlink()
                    finally:
                        lk.release()
        return before
