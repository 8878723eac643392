"""The compile cache's files: where they live, whom they trust, and reads and writes with bounds.

* **Location**: ``$TYLOPY_CACHE_DIR``, else ``$XDG_CACHE_HOME/tylopy``, else ``~/.cache/tylopy``;
  created with mode 0700.
* **Trust**: the folder must be owned by the user and not writable by group or others (anyone who
  can write there could plant a kernel); otherwise the disk cache is off for the process, with one
  warning, unless ``TYLOPY_CACHE_SHARED=1`` says the sharing is intended. Whatever the folder, every
  metadata file carries an HMAC-SHA256 under a per-user key (``$XDG_CONFIG_HOME/tylopy/cache.key``,
  else ``~/.config/tylopy/cache.key``; 32 random bytes, mode 0600, made on first use) over its name
  and content; the metadata holds the SHA-256 of the PTX and cubin. A file without the right MAC
  is a miss, never loaded: a cubin planted beside a fixed-up hash does not run.
* **Bounds**: every read opens without following symlinks and without blocking (a planted FIFO),
  checks it is a regular file and reads at most a fixed number of bytes; metadata above
  ``MAX_META_BYTES`` is not ours. A compile that meets planted or corrupt files finishes in the
  time of reading them once.
* **Writes** go to a fresh temporary name (O_EXCL, 0600) and are renamed into place, so a
  symlink planted at the final name is replaced, never followed (the same for ``TYLOPY_DUMP_DIR``).
* **Size**: after each store the folder is pruned to ``TYLOPY_CACHE_MAX_SIZE`` (default 4G), least
  recently used entry first (a hit refreshes an entry's time); ``tylopy cache prune --max-size``
  does the same on demand.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
import time
import warnings

from ..errors import TylopyError

MAX_META_BYTES = 1 << 20  # a metadata file (entry or manifest) larger than this is not ours
MAX_BLOB_BYTES = 256 << 20  # PTX or cubin
DEFAULT_MAX_SIZE = "4G"
_MAGIC = b"tylopy-cache-mac "
_MAC_LINE = len(_MAGIC) + 64 + 1
_ENTRY = re.compile(r"^([0-9a-f]{32})\.(json|ptx|cubin|reads\.json)$")
_TMP_MAX_AGE = 3600.0  # a temporary file older than this is left from a crash

_warned: set = set()


class CacheUnavailable(TylopyError, OSError):
    """The cache folder cannot be used (a file is in the way, it cannot be created)."""


def warn_once(message: str, stacklevel: int = 3) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def default_dir() -> str:
    explicit = os.environ.get("TYLOPY_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tylopy")


def key_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "tylopy", "cache.key")


def shared() -> bool:
    return os.environ.get("TYLOPY_CACHE_SHARED", "") not in ("", "0")


def cache_dir() -> str:
    """The cache folder, created (0700) if needed; ``CacheUnavailable`` if that fails."""
    d = default_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CacheUnavailable(f"the compile cache folder {d} cannot be created ({e.strerror or e}); "
                               "set TYLOPY_CACHE_DIR to a writable folder, or TYLOPY_CACHE=0") from None
    if not os.path.isdir(d):
        raise CacheUnavailable(f"the compile cache path {d} is not a folder; set TYLOPY_CACHE_DIR to a writable "
                               "folder, or TYLOPY_CACHE=0")
    return d


def dir_problem(d: str) -> str | None:
    """Why ``d`` is not safe to load kernels from (None: it is)."""
    try:
        st = os.stat(d)
    except OSError as e:
        return f"it cannot be examined ({e.strerror or e})"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def trusted_dir() -> str | None:
    """The cache folder when its entries may be loaded; None (after one warning) when it is not
    safe and ``TYLOPY_CACHE_SHARED=1`` does not say it is meant to be shared, or no key exists."""
    d = cache_dir()
    problem = None if shared() else dir_problem(d)
    if problem is not None:
        warn_once(f"tylopy: not using the compile cache in {d}: {problem}; compiling without a disk cache "
                  "(chmod 700 it, point TYLOPY_CACHE_DIR at a folder of your own, or set TYLOPY_CACHE_SHARED=1 "
                  "if others are meant to write there)", stacklevel=4)
        return None
    if mac_key() is None:
        return None
    return d


# -- the per-user key and MACs ------------------------------------------------------------------------

_keys: dict = {}


def mac_key() -> bytes | None:
    """This user's cache key (made on first use); None, after one warning, when it is unusable."""
    path = key_path()
    if path in _keys:
        return _keys[path]
    try:
        key = _read_key(path)
        if key is None:
            _create_key(path)
            key = _read_key(path)
            if key is None:
                raise ValueError("it could not be read back after it was made")
    except (OSError, ValueError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        warn_once(f"tylopy: the compile cache key {path} cannot be used ({detail}); compiling without a disk "
                  "cache (remove it to have a new one made, or set XDG_CONFIG_HOME)", stacklevel=5)
        key = None
    _keys[path] = key
    return key


def _read_key(path: str) -> bytes | None:
    try:
        data = read_bounded(path, 4096, missing_ok=False)
    except FileNotFoundError:
        return None
    st = os.stat(path, follow_symlinks=False)
    if st.st_uid != os.geteuid():
        raise ValueError(f"it is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o077:
        raise ValueError(f"others may read it (mode {stat.S_IMODE(st.st_mode):04o}; expected 0600)")
    text = data.strip()
    if not re.fullmatch(rb"[0-9a-f]{64}", text):
        raise ValueError("it does not hold 64 hex digits")
    return bytes.fromhex(text.decode())


def _create_key(path: str) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-key-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # atomic and exclusive: a key made meanwhile by another process wins
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def _mac(key: bytes, name: str, payload: bytes) -> str:
    return hmac.new(key, b"tylopy-cache\0" + name.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def seal(name: str, payload: bytes) -> bytes:
    """``payload`` with a MAC line binding it to the file name ``name`` under this user's key."""
    return _MAGIC + _mac(mac_key(), name, payload).encode() + b"\n" + payload


def unseal(name: str, data: bytes) -> bytes | None:
    """The payload of a sealed file when its MAC is right; None when it is not (untrusted)."""
    key = mac_key()
    if key is None or len(data) < _MAC_LINE or not data.startswith(_MAGIC) or data[_MAC_LINE - 1:_MAC_LINE] != b"\n":
        return None
    payload = data[_MAC_LINE:]
    given = data[len(_MAGIC):_MAC_LINE - 1].decode("ascii", "replace")
    return payload if hmac.compare_digest(given, _mac(key, name, payload)) else None


# -- bounded reads, safe writes ---------------------------------------------------------------------

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def read_bounded(path: str, limit: int, missing_ok: bool = True) -> bytes | None:
    """The bytes of the regular file ``path`` (no symlink, no FIFO or device), or None when it is
    absent, something else, or longer than ``limit``."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return None if len(data) > limit else data
    except OSError:
        return None
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to a new private temporary file and rename it to ``path`` (a symlink or file at
    ``path`` is replaced, never written through)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def touch(path: str) -> None:
    """Mark an entry as used now (the size cap removes the least recently used first)."""
    try:
        os.utime(path, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


# -- size ---------------------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """``"500M"``, ``"2G"``, ``"123456"`` -> bytes; ValueError naming ``what`` otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{what} expects a size such as 500M, 2G or a number of bytes, but got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def max_size() -> int | None:
    raw = os.environ.get("TYLOPY_CACHE_MAX_SIZE", DEFAULT_MAX_SIZE)
    try:
        return parse_size(raw, "TYLOPY_CACHE_MAX_SIZE")
    except ValueError as e:
        warn_once(f"tylopy: {e}; the compile cache is not size-capped", stacklevel=5)
        return None


def _entries(d: str) -> tuple[list, int]:
    """([(last use, bytes, [paths])] per entry, total bytes); stale temporary files count as entries
    used long ago."""
    groups: dict = {}
    now = time.time()
    try:
        listing = list(os.scandir(d))
    except OSError:
        return [], 0
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            continue
        m = _ENTRY.match(e.name)
        if m is not None:
            stem = m.group(1) + (".reads" if m.group(2) == "reads.json" else "")
            used = st.st_mtime if m.group(2) in ("json", "reads.json") else None
        elif e.name.startswith(".tmp-") and now - st.st_mtime > _TMP_MAX_AGE:
            stem, used = e.name, 0.0
        else:
            continue
        g = groups.setdefault(stem, [None, 0, []])
        if used is not None:
            g[0] = used
        elif g[0] is None:
            g[0] = -1.0  # files of an entry whose metadata is gone: oldest
        g[1] += st.st_size
        g[2].append(e.path)
    entries = [tuple(g) for g in groups.values()]
    return entries, sum(g[1] for g in entries)


def prune(d: str, max_bytes: int) -> tuple[int, int, int]:
    """Remove least recently used entries until the folder holds at most ``max_bytes``: (entries
    removed, bytes freed, bytes left)."""
    entries, total = _entries(d)
    removed = freed = 0
    for _used, size, paths in sorted(entries, key=lambda g: g[0]):
        if total <= max_bytes:
            break
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        removed += 1
        freed += size
        total -= size
    return removed, freed, total


def enforce_cap(d: str) -> None:
    cap = max_size()
    if cap is not None:
        try:
            prune(d, cap)
        except OSError as e:
            warn_once(f"tylopy: cannot prune the compile cache in {d} ({e})", stacklevel=5)


def dump_file(folder: str, name: str, text: str) -> None:
    """Write a ``TYLOPY_DUMP_DIR`` file without following a symlink planted at its name."""
    atomic_write(os.path.join(folder, name), text.encode())
