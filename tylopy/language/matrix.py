"""Warp-level matrix loads and stores between shared memory and registers: ``ldmatrix`` and ``stmatrix``.

Both move 8x8 matrices of 16-bit elements, one to four at a time, and every lane of the warp
takes part (``.sync.aligned``: call them in warp-uniform code). The lane -> row mapping (PTX
ISA, "ldmatrix" and "stmatrix"):

* addresses: lane ``8 j + i`` gives the shared address of row ``i`` of matrix ``j`` (x1 uses
  lanes 0-7, x2 lanes 0-15, x4 all 32; the other lanes' addresses are ignored). Each row is 16
  contiguous bytes, 16-byte aligned; rows may sit anywhere (a swizzled tile is fine);
* registers: word ``j`` of lane ``l`` holds row ``l // 4``, columns ``2 (l % 4)`` (bits 0-15)
  and ``2 (l % 4) + 1`` (bits 16-31) of matrix ``j``: exactly the quad layout of an mma.sync
  fragment; with ``trans=True`` the matrix is read (or written) transposed, so the word holds
  rows ``2 (l % 4)`` and ``2 (l % 4) + 1`` of column ``l // 4``.

``ldmatrix`` needs sm_75+ (tylopy targets sm_80+); ``stmatrix`` needs sm_90.
docs/primitives.md, "Matrix and asynchronous copies", has the whole picture.
"""
from __future__ import annotations

from ..codegen.targets import family
from ..ir.types import PointerType, b32
from .builder import current_builder
from .proxy import RuntimeValue, as_value, emit

_NUMS = (1, 2, 4)


def _shared_rows(what: str, ptr) -> RuntimeValue:
    bld = current_builder()
    if not isinstance(ptr, RuntimeValue) or not isinstance(ptr.type, PointerType):
        bld.error(f"{what} expects a shared-memory pointer (this lane's row address), but got {ptr!r}")
    if ptr.type.space != "shared":
        bld.error(f"{what} expects a shared-memory pointer, but got a {ptr.type.space} pointer ({ptr.type})",
                  hint="matrices are loaded from ty.shared / ty.dynamic_shared memory; "
                       "ty.ptr_cast(p, space='shared') converts a generic pointer into shared memory")
    return ptr


def _num_trans(what: str, num, trans) -> tuple[int, bool]:
    bld = current_builder()
    if isinstance(num, bool) or num not in _NUMS:
        bld.error(f"{what} num expects 1, 2 or 4 (matrices), but got {num!r}")
    if not isinstance(trans, bool):
        bld.error(f"{what} trans expects a compile-time bool, but got {trans!r}")
    return int(num), trans


def ldmatrix(ptr, num: int = 4, trans: bool = False):
    """Load ``num`` 8x8 matrices of 16-bit elements from shared memory (``ldmatrix.sync.aligned.m8n8``).

    ``ptr``: this lane's row address (lane 8j + i: row i of matrix j). Returns one b32 word per
    matrix (a single value for ``num=1``, else a tuple): word j of lane l holds row l // 4,
    columns 2(l % 4) and 2(l % 4) + 1 of matrix j, low column in bits 0-15 (``trans``: the
    transposed matrix). These are the A/B operand words of ``ty.mma``: see
    ``MmaSyncAtom.a_fragment``/``b_fragment``.
    """
    p = _shared_rows("ldmatrix", ptr)
    num, trans = _num_trans("ldmatrix", num, trans)
    words = emit("ldmatrix", (p,), num=num, trans=trans)
    return words[0] if num == 1 else words


def stmatrix(ptr, words, trans: bool = False) -> None:
    """Store 1, 2 or 4 8x8 matrices of 16-bit elements to shared memory (``stmatrix.sync.aligned.m8n8``, sm_90).

    The inverse of ``ldmatrix``: ``words`` (one b32 word, or a tuple of 1/2/4) hold in lane l
    row l // 4, columns 2(l % 4), 2(l % 4) + 1 of each matrix; lane 8j + i gives the address of
    row i of matrix j. ``trans=True`` writes each matrix transposed.
    """
    bld = current_builder()
    p = _shared_rows("stmatrix", ptr)
    ws = tuple(words) if isinstance(words, (tuple, list)) else (words,)
    num, trans = _num_trans("stmatrix", len(ws), trans)
    if family(bld.arch) < (9, 0):
        bld.error(f"stmatrix expects a kernel for sm_90 or newer, but this kernel targets {bld.arch}",
                  hint="declare the kernel with arch='sm_90a' (or store the fragment with ordinary stores)")
    vals = []
    for i, w in enumerate(ws):
        v = as_value(w, b32)
        if v.type != b32:
            bld.error(f"stmatrix word {i} expects a b32 word (two packed 16-bit values), but got {v.type}",
                      hint="pack two f32 values with ty.pack2(lo, hi, ty.bf16), or ty.bitcast an i32/u32")
        vals.append(v)
    emit("stmatrix", (p, *vals), num=num, trans=trans)


__all__ = ["ldmatrix", "stmatrix"]
