"""``autotune``: run the fastest of several schedules, chosen once per key and remembered on disk.

    @ty.autotune(configs=[ty.Config(BLOCK_N=256), ty.Config(BLOCK_N=128)], key=["a", "b"])
    def launch(a, b, out, BLOCK_N=128):
        kernel[grid](..., BLOCK_N=BLOCK_N)

The first call for a key (the values named in ``key`` plus the device's name) calls ``launch``
once per config and times it (CUDA-event medians); the winner's keyword arguments are used for
this and every later call with that key. The choice is written to the compile cache folder
(``tylopy.jit.cache.cache_dir()``, under ``autotune/``), one JSON file per key, signed like
the cache's entries and written to a temporary name and renamed, so a second process reads it
instead of tuning again; a file that cannot be read, is not signed with the user's key or does
not match the configs is ignored and rewritten.

The tuned function must be idempotent (every candidate runs it several times on the same
arguments). A candidate that raises (fails to compile, needs more shared memory or registers
than the device has) is skipped with a note; if every candidate fails, the first error is raised
with the list of notes.

Environment:

* ``TYLOPY_AUTOTUNE=0`` uses the first config that ``prune`` keeps, without timing or the disk;
  ``TYLOPY_AUTOTUNE=force`` tunes again (once per key in this process) and overwrites the file.
* ``TYLOPY_AUTOTUNE_VERBOSE=1`` prints one line per candidate (time or why it was skipped), the
  winner, and where a stored choice came from. The same lines go to the ``tylopy.autotune`` log at
  INFO (``TYLOPY_LOG=info`` prints them).

A stored choice belongs to the code it was measured with: the file's name is a digest of the key,
the configs, the tuned function's source (its file and the files of the kernels its module
holds; its compiled code when it has no file) and the tylopy, llvmlite and ptxas versions, so an
edited kernel or an upgrade tunes again instead of reusing a stale choice.
* ``TYLOPY_CACHE=0`` keeps choices in memory only.

Under CUDA graph capture nothing is timed (events, synchronizations and the candidates' runs
cannot be part of a graph): a choice already made (in memory or on disk) is used; otherwise the
default config runs untuned, with an ``AutotuneWarning``, and nothing is remembered, so the next
call outside a capture tunes. Call the tuned function once before capturing.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import sys
import types
import warnings
from typing import Any, Callable, Sequence

from ..errors import TylopyError
from . import cachefs

FORMAT = 2  # 2: the key holds the source digest and the tool versions
_log = logging.getLogger("tylopy.autotune")


class Config:
    """One candidate: the keyword arguments it adds to the call."""

    def __init__(self, kwargs: dict | None = None, **more):
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"Config expects a dict of keyword arguments, but got {type(kwargs).__name__}")
        self.kwargs = dict(kwargs or {}, **more)

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items()) + ")"

    def __eq__(self, other):
        return isinstance(other, Config) and _canonical(self.kwargs) == _canonical(other.kwargs)

    def __hash__(self):
        return hash(_canonical(self.kwargs))


class AutotuneError(TylopyError):
    """Every candidate failed, or the autotuner was set up wrongly."""


class AutotuneWarning(UserWarning):
    """A call ran with an untuned config (under CUDA graph capture)."""


def capturing() -> bool:
    """Whether torch's current CUDA stream is capturing a graph (False without CUDA)."""
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except (ImportError, RuntimeError):
        return False


def _canonical(x) -> str:
    """A stable text for keys and configs (JSON where possible, repr otherwise, sorted dicts)."""
    return json.dumps(x, sort_keys=True, default=repr)


def _key_part(x) -> Any:
    """What a key argument contributes: tensors by shape, dtype and strides; functions by name."""
    if hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "stride"):
        return ["tensor", list(x.shape), str(x.dtype), list(x.stride())]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)):
        return [_key_part(e) for e in x]
    if callable(x):  # functions (epilogues...) by what the compile cache keys them by: code and inputs
        from ..language.capture import fingerprint
        from ..errors import CaptureError
        name = getattr(x, "__qualname__", type(x).__qualname__)
        try:
            return f"{name} {hashlib.sha256(fingerprint(x, 'an autotune key').encode()).hexdigest()[:16]}"
        except CaptureError:
            return f"{getattr(x, '__module__', '?')}.{name}"
    return repr(x)


def device_name(arguments: dict) -> str:
    """The device the call runs on: the first tensor argument's GPU name and compute capability."""
    for v in arguments.values():
        dev = getattr(v, "device", None)
        if dev is not None and getattr(dev, "type", None) is not None:
            if dev.type != "cuda":
                return str(dev.type)
            import torch
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(idx)
            return f"{torch.cuda.get_device_name(idx)} sm_{major}{minor}"
    return "no-device"


def cuda_median_ms(fn, warmup_ms: float = 20, rep_ms: float = 80) -> float:
    """Median milliseconds of ``fn()`` on the current stream, from CUDA events after warm-up."""
    from tylopy.runtime.timing import events_median_ms
    return events_median_ms(fn, warmup_ms, rep_ms)


def mode() -> str:
    """"on", "off" or "force", from TYLOPY_AUTOTUNE."""
    v = os.environ.get("TYLOPY_AUTOTUNE", "1").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("force", "2", "retune"):
        return "force"
    return "on"


def verbose() -> bool:
    return os.environ.get("TYLOPY_AUTOTUNE_VERBOSE", "0").strip().lower() not in ("", "0", "off", "false", "no")


def _say(line: str, level: int = logging.INFO) -> None:
    """One line of progress: to the ``tylopy.autotune`` log, and to stderr with TYLOPY_AUTOTUNE_VERBOSE."""
    if verbose():
        print(f"tylopy.autotune {line}", file=sys.stderr, flush=True)
    _log.log(level, "%s", line)


def tool_versions() -> dict:
    """The versions whose change can change which config is fastest."""
    import llvmlite
    from ..codegen.ptxas import ptxas_version
    from .kernel import __version__
    return {"tylopy": __version__, "llvmlite": llvmlite.__version__, "ptxas": ptxas_version()}


def _source_files(fn) -> list[str]:
    """The file of ``fn`` and of every tylopy kernel its module holds (the launcher's kernels)."""
    from .kernel import Kernel
    fn = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
    files = [getattr(getattr(fn, "__code__", None), "co_filename", None)]
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    for value in list(vars(module).values()) if module is not None else ():
        if isinstance(value, Kernel) and isinstance(value.fn, types.FunctionType):
            files.append(value.fn.__code__.co_filename)
    return sorted({f for f in files if f and os.path.isfile(f)})


def source_digest(fn) -> str:
    """A digest of the tuned function's source: its files' bytes, or its compiled code without one."""
    from ..language.capture import code_digest
    h = hashlib.sha256()
    files = _source_files(fn)
    for path in files:
        try:
            with open(path, "rb") as f:
                h.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
        except OSError:
            h.update(path.encode())
    target = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
    if not files and isinstance(getattr(target, "__code__", None), types.CodeType):
        h.update(code_digest(target.__code__).encode())
    return h.hexdigest()[:32]


class Autotuner:
    """The callable ``autotune`` returns: picks a config per key, then calls the function with it."""

    def __init__(self, fn: Callable, configs: Sequence, key: Sequence, prune: Callable | None = None,
                 timer: Callable | None = None, name: str | None = None, device: Callable | None = None):
        if not callable(fn):
            raise TypeError(f"autotune expects a function to decorate, but got {fn!r}")
        configs = [c if isinstance(c, Config) else Config(c) for c in configs]
        if not configs:
            raise AutotuneError("autotune configs expects at least one Config, but got an empty list")
        if isinstance(key, str) or not all(isinstance(k, str) or callable(k) for k in key):
            raise AutotuneError(f"autotune key expects a list of argument names or functions of the arguments, "
                                f"but got {key!r}")
        self.fn = fn
        self.configs = configs
        self.key = list(key)
        self.prune = prune
        self.timer = timer or cuda_median_ms
        self.name = name or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        self.device = device or device_name
        self.signature = inspect.signature(fn)
        names = set(self.signature.parameters)
        for k in self.key:
            if isinstance(k, str) and k not in names:
                raise AutotuneError(f"autotune key names {k!r}, but {self.name} has no such parameter "
                                    f"(it has {sorted(names)})")
        self._memory: dict[str, Config] = {}
        self._forced: set[str] = set()
        self._code: dict | None = None  # the source digest and tool versions, once per process
        functools.update_wrapper(self, fn)

    # -- keys -----------------------------------------------------------------------------------
    def _arguments(self, args, kwargs) -> dict:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def key_of(self, arguments: dict) -> list:
        parts = [_key_part(k(arguments) if callable(k) else arguments[k]) for k in self.key]
        return [self.device(arguments), *parts]

    def candidates(self, arguments: dict) -> list[Config]:
        if self.prune is None:
            return list(self.configs)
        kept = [c if isinstance(c, Config) else Config(c) for c in self.prune(arguments, list(self.configs))]
        if not kept:
            raise AutotuneError(f"autotune {self.name}: prune removed every config for this call")
        return kept

    def code(self) -> dict:
        """What the stored choice was measured with: the source digest and the tool versions."""
        if self._code is None:
            self._code = {"source": source_digest(self.fn), "versions": tool_versions()}
        return self._code

    def _digest(self, key: list, configs: list[Config]) -> str:
        blob = _canonical([FORMAT, self.name, key, [c.kwargs for c in configs], self.code()])
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def cache_path(self, key: list, configs: list[Config]) -> str | None:
        """The file that holds the choice for ``key`` (None when the disk cache is off or unusable)."""
        from . import cache
        if not cache.enabled():
            return None
        try:
            d = cachefs.trusted_dir()  # (a folder others may write is not read: see docs/cache.md)
        except cachefs.CacheUnavailable:
            return None
        if d is None:
            return None
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in self.name)[-80:]
        return os.path.join(d, "autotune", safe, self._digest(key, configs) + ".json")

    # -- disk -----------------------------------------------------------------------------------
    def _load(self, path: str | None, key: list, configs: list[Config]) -> Config | None:
        if path is None:
            return None
        data = cachefs.read_bounded(path, cachefs.MAX_META_BYTES)
        payload = None if data is None else cachefs.unseal(os.path.basename(path), data)
        if payload is None:
            return None  # absent, or not signed with this user's key: tune again and overwrite it
        try:
            record = json.loads(payload.decode("utf-8"))
            best = record["best"]
            if (record.get("format") != FORMAT or record.get("key") != json.loads(_canonical(key))
                    or record.get("code") != json.loads(_canonical(self.code()))
                    or not isinstance(best, int) or not 0 <= best < len(configs)
                    or _canonical(record.get("config")) != _canonical(configs[best].kwargs)):
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable or not ours: tune again and overwrite it
        return configs[best]

    def _store(self, path: str | None, key: list, configs: list[Config], best: int, timings: list) -> None:
        if path is None:
            return
        record = {"format": FORMAT, "name": self.name, "key": json.loads(_canonical(key)),
                  "code": json.loads(_canonical(self.code())), "best": best,
                  "config": json.loads(_canonical(configs[best].kwargs)),
                  "configs": [json.loads(_canonical(c.kwargs)) for c in configs], "timings_ms": timings}
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            text = json.dumps(record, indent=1).encode()
            cachefs.atomic_write(path, cachefs.seal(os.path.basename(path), text))
        except OSError as e:
            _say(f"{self.name}: could not store the choice in {path} ({e})", logging.WARNING)

    # -- tuning ---------------------------------------------------------------------------------
    def _bench(self, args, kwargs, configs: list[Config], label: str) -> tuple[int, list]:
        timings, notes, first_error = [], [], None
        for i, cfg in enumerate(configs):
            call = functools.partial(self.fn, *args, **kwargs, **cfg.kwargs)
            try:
                call()  # compiles and loads outside the timed runs
                ms = float(self.timer(call))
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is skipped, not fatal
                first_error = first_error or e
                note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                notes.append(f"{cfg}: {note}")
                timings.append({"ms": None, "skipped": note})
                _say(f"{label} {i + 1}/{len(configs)} {cfg} skipped: {note}")
                continue
            timings.append({"ms": ms})
            _say(f"{label} {i + 1}/{len(configs)} {cfg} {ms:.4f} ms")
        ok = [(t["ms"], i) for i, t in enumerate(timings) if t["ms"] is not None]
        if not ok:
            raise AutotuneError(f"autotune {self.name}: every config failed for {label}:\n  " + "\n  ".join(notes)) \
                from first_error
        return min(ok)[1], timings

    def best_config(self, *args, **kwargs) -> Config:
        """The config this call runs with (tuning first if the key is new)."""
        arguments = self._arguments(args, kwargs)
        configs = self.candidates(arguments)
        how = mode()
        if how == "off":
            return configs[0]
        key = self.key_of(arguments)
        mkey = _canonical([key, [c.kwargs for c in configs]])
        found = self._memory.get(mkey)
        if found is not None and (how != "force" or mkey in self._forced):
            return found
        path = self.cache_path(key, configs)
        label = f"{self.name} {_canonical(key)}"
        if how != "force":
            found = self._load(path, key, configs)
            if found is not None:
                _say(f"{label}: {found} (stored in {path})")
                self._memory[mkey] = found
                return found
        if capturing():
            # Timing needs events and synchronizations a capture forbids, and every candidate's
            # runs would be recorded into the graph: run the untuned default, and say so.
            warnings.warn(f"autotune {label}: called under CUDA graph capture, where it cannot time candidates; "
                          f"running the default {configs[0]} untuned (call it once before capturing to tune)",
                          AutotuneWarning, stacklevel=3)
            return configs[0]
        _say(f"{label}: timing {len(configs)} configs" + (" (TYLOPY_AUTOTUNE=force)" if how == "force" else ""))
        best, timings = self._bench(args, kwargs, configs, label)
        _say(f"{label}: best {configs[best]} {timings[best]['ms']:.4f} ms" + (f", stored in {path}" if path else ""))
        self._store(path, key, configs, best, timings)
        self._memory[mkey] = configs[best]
        self._forced.add(mkey)
        return configs[best]

    def __call__(self, *args, **kwargs):
        cfg = self.best_config(*args, **kwargs)
        return self.fn(*args, **kwargs, **cfg.kwargs)

    def clear(self) -> None:
        """Forget the choices made in this process (the files stay)."""
        self._memory.clear()
        self._forced.clear()


def autotune(configs: Sequence, key: Sequence, *, prune: Callable | None = None, timer: Callable | None = None,
             name: str | None = None, device: Callable | None = None):
    """Decorate a launcher so each call runs with the fastest of ``configs`` for its ``key``.

    ``configs``: ``Config`` objects or dicts of keyword arguments added to the call. ``key``:
    argument names, or functions of the arguments dict, whose values select a choice (tensors
    count by shape, dtype and strides); the device's name is always part of it. ``prune(arguments,
    configs)`` may narrow the candidates per call (the first one it keeps is the untuned default).
    ``timer(fn) -> ms`` replaces the CUDA-event median; ``device(arguments) -> str`` the device name.
    """
    def wrap(fn):
        return Autotuner(fn, configs, key, prune=prune, timer=timer, name=name, device=device)
    return wrap


__all__ = ["autotune", "Config", "Autotuner", "AutotuneError", "AutotuneWarning"]
