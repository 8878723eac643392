"""The registry behind attention variants: user mods (score_mod, mask_mod) and Variants by id
string (the operators take ids: mods are not tensors), the value-based identity of a mod
(``ModRef``: its code and the non-tensor values it captures) and the tensors it captures.
``variants.py`` re-exports what callers use."""
from __future__ import annotations

import threading
import types
from dataclasses import dataclass


@dataclass(frozen=True)
class ModRef:
    """A user mod by value: its code, the non-tensor values it captures (baked into a trace) and the
    tensors it reads (slots of ``Variant.tensor_names``, named ``aux<k>``). Two closures of one
    function over equal constants are one ModRef; the tensors' values are run-time data."""

    mod_id: str                # the registry key (``lookup_mod``): the function itself
    code: object               # fn.__code__
    captured: tuple            # hashable form of defaults, non-tensor closure values and globals
    tensor_slots: tuple        # (name the mod reads it by, "aux<k>") per captured tensor
    takes_aux: bool            # called with ``aux`` as the last argument
    qualname: str = ""

    def function(self):
        return lookup_mod(self.mod_id)


def slot_mods(variant) -> list:
    """The ModRefs of a Variant whose captured tensors take aux slots, in slot order: score_mod,
    mask_mod (their slots follow the explicit tensors), then score_mod_bwd (its slots come last)."""
    return [m for m in (variant.score_mod, variant.mask_mod, getattr(variant, "score_mod_bwd", None))
            if m is not None]




# -- the registry of user functions (mods are not tensors: operators get an id string) ---------------

_lock = threading.Lock()
_mods: dict = {}        # mod_id -> function
_variants: dict = {}    # variant_id -> Variant


def register_mod(fn) -> str:
    """An id string for ``fn`` (stable while it lives: the same function gets the same id)."""
    key = f"mod{id(fn):x}"
    with _lock:
        _mods[key] = fn
    return key


def lookup_mod(mod_id: str):
    fn = _mods.get(mod_id)
    if fn is None:
        raise KeyError(f"attention: no mod is registered under {mod_id!r} (a graph from another process?)")
    return fn


def register_variant(variant) -> str:
    """An id string for the operators (``tylopy::attention_variant_fwd/_bwd`` take it)."""
    base = f"v{abs(hash(variant)):x}"
    with _lock:
        for n in range(len(_variants) + 1):  # a hash collision takes the next free suffix
            key = base if n == 0 else f"{base}_{n}"
            old = _variants.get(key)
            if old is None:
                _variants[key] = variant
                return key
            same_bwd = getattr(old, "score_mod_bwd", None) == getattr(variant, "score_mod_bwd", None)
            if old == variant and same_bwd:  # keep the first object: launch plans are keyed by it
                return key
    raise AssertionError("unreachable")


def lookup_variant(variant_id: str):
    v = _variants.get(variant_id)
    if v is None:
        raise KeyError(f"attention: no variant is registered under {variant_id!r}")
    return v


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _hashable(x, depth=0):
    """A hashable stand-in for a captured value (tensors are collected separately)."""
    if isinstance(x, (type(None), bool, int, float, complex, str, bytes)):
        return x
    if isinstance(x, types.ModuleType):
        return ("module", x.__name__)
    if isinstance(x, (tuple, list)) and depth < 4:
        return (type(x).__name__,) + tuple(_hashable(y, depth + 1) for y in x)
    if isinstance(x, types.FunctionType) and depth < 4:
        return ("fn", x.__code__, tuple(_hashable(c.cell_contents, depth + 1) for c in (x.__closure__ or ())))
    try:
        hash(x)
        return ("obj", x)
    except TypeError:
        return ("id", id(x))


def captured_tensors(fn):
    """[(where, name, tensor)] for the tensors ``fn`` reads: closure cells and globals its code names
    (where is "closure" or "global")."""
    fn = getattr(fn, "fn", fn)  # a @ty.func
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            val = cell.cell_contents
        except ValueError:
            continue
        if _is_tensor(val):
            out.append(("closure", name, val))
    for name in _global_names(fn.__code__):
        val = fn.__globals__.get(name)
        if _is_tensor(val):
            out.append(("global", name, val))
    return out


def _global_names(code):
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += [n for n in _global_names(c) if n not in names]
    return names


def mod_ref(fn, arg: str, first_slot: int, takes_aux: bool) -> tuple[ModRef, list]:
    """(ModRef, its captured tensors) for the user's ``fn`` given as keyword ``arg``; captured tensors
    take slots ``aux<first_slot>...``."""
    if not callable(fn):
        raise TypeError(f"attention: {arg} expects a function, but got {type(fn).__name__}")
    inner = getattr(fn, "fn", fn)
    if not hasattr(inner, "__code__"):
        raise TypeError(f"attention: {arg} expects a Python function (or @ty.func), but got {type(fn).__name__}")
    tensors = captured_tensors(inner)
    slots = tuple((f"{where}:{name}", f"aux{first_slot + k}") for k, (where, name, _) in enumerate(tensors))
    closure = tuple(("tensor",) if _is_tensor(c.cell_contents) else _hashable(c.cell_contents)
                    for c in (inner.__closure__ or ()) if _cell_filled(c))
    glob = tuple((n, ("tensor",) if _is_tensor(inner.__globals__.get(n)) else _hashable(inner.__globals__.get(n)))
                 for n in _global_names(inner.__code__) if n in inner.__globals__)
    captured = (_hashable(inner.__defaults__), closure, glob)
    ref = ModRef(register_mod(fn), inner.__code__, captured, slots, takes_aux, getattr(inner, "__qualname__", ""))
    return ref, [t for _, _, t in tensors]


def with_bwd_slots(variant, score_mod_bwd):
    """``variant`` with the user's ``score_mod_bwd`` (its ModRef), which takes ``aux`` when the score_mod does.
    A tensor it captures that a mod captures too (the same object) reads that mod's slot (one load in
    the kernel serves both); any other takes a new aux slot after the variant's."""
    from dataclasses import replace
    known = {}
    for m in (variant.score_mod, variant.mask_mod):
        if m is not None and m.tensor_slots:
            found = {f"{where}:{name}": t for where, name, t in captured_tensors(m.function())}
            for where, slot in m.tensor_slots:
                known.setdefault(id(found[where]), slot)
    first = sum(1 for n in variant.tensor_names if n.startswith("aux"))
    ref, _ = mod_ref(score_mod_bwd, "score_mod_bwd", first, variant.score_mod.takes_aux)
    slots, new = [], []
    for where, name, t in captured_tensors(score_mod_bwd):
        slot = known.get(id(t))
        if slot is None:
            slot = known[id(t)] = f"aux{first + len(new)}"
            new.append(slot)
        slots.append((f"{where}:{name}", slot))
    return replace(variant, score_mod_bwd=replace(ref, tensor_slots=tuple(slots)),
                   tensor_names=variant.tensor_names + tuple(new))


def captured_slots(variant) -> list:
    """[(ModRef, "where:name", "aux<k>")] of the tensors the variant's mods (and score_mod_bwd) capture, one
    per slot, in slot order (a score_mod_bwd's tensor that shares a mod's slot is not listed again)."""
    out, seen = [], set()
    for ref in slot_mods(variant):
        for where, slot in ref.tensor_slots:
            if slot not in seen:
                seen.add(slot)
                out.append((ref, where, slot))
    return out


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True



class ModError(ValueError):
    """A user mod that cannot be evaluated: names the keyword and the line of the user's function."""

    names_user_line = True  # tracing re-raises it as it is (no kernel context around the user's line)

    @staticmethod
    def from_exception(arg, fn, e):
        import traceback
        inner = getattr(fn, "fn", fn)
        where = ""
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if frame.filename == inner.__code__.co_filename:
                where = f" ({frame.filename}:{frame.lineno}: {frame.line})"
                break
        if not where:
            where = f" ({inner.__code__.co_filename}:{inner.__code__.co_firstlineno})"
        return ModError(f"attention: {arg} expects a function of torch tensors that runs on the indices of the "
                        f"call{where}, but got {type(e).__name__}: {e}")
