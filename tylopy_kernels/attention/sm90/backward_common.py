"""Pieces the Hopper attention backward kernels share: shared-memory tiles and descriptors,
wgmma products over them, masking, and stores of accumulator rows.

Every tile sits in shared memory as TMA writes it with 128-byte swizzle: rows of 64 elements
(128 B), a head dim of 128 as two 64-column panels (a panel holds all rows of its 64 columns).
An operand is K-major when its reduction dimension runs along the stored rows, MN-major
(imm-trans = 1) when its M or N dimension does (docs/hopper.md, "descriptors").
"""
from typing import Any, NamedTuple

import tylopy as ty
from tylopy import hopper

from tylopy_kernels.attention.sm90.tiles import shift


class Sizes(NamedTuple):
    """A backward problem's run-time sizes: queries and keys per sequence, query heads, query heads per
    key/value head, and the padded length of the L/delta rows."""

    n_q: Any
    n_k: Any
    n_heads: Any
    group: Any
    n_pad: Any


class TensorMaps(NamedTuple):
    """The dK/dV kernels' tensor maps: Q, K, V, dO and the L and delta rows (producer warp 0 loads
    them), and the fp32 dQ accumulator (DQ="tma": producer warp 1 adds into it)."""

    q: Any
    k: Any
    v: Any
    do: Any
    lse: Any
    delta: Any
    dq: Any


class Gradients(NamedTuple):
    """Where the dK/dV kernels' consumers write: dK's and dV's pointers, the fp32 dQ accumulator
    (DQ="atomic"), and dK's and dV's (batch, head, row) strides."""

    dk: Any
    dv: Any
    dq_accum: Any
    dk_strides: tuple
    dv_strides: tuple


PANEL = 64                    # elements in one 128-byte swizzle row
ROW_BYTES = 128
LOG2E = 1.4426950408889634
NEG_INF = float("-inf")
BIG = 1 << 30                 # a column bound no offset reaches
MASK_UNIT = 1e30              # |masking term| >= this; |exponents| stay far below it
# Registers per thread after setmaxnreg, (producer, consumer): 128*24 + 256*240 = 384*168, the
# whole pool of one CTA per SM (docs/hopper.md, "setmaxnreg").
REGISTER_SPLIT = (24, 240)


bar_at = hopper.barrier_at      # the mbarrier at a shared-memory offset (ty.hopper's ring helpers)
stage_of = hopper.stage_phase   # (stage, phase) of load j in a ring of ``stages``


@ty.func
def tma_coords(order, n, h, b):
    """TMA coordinates after the head-dim one, in the order the host sorted the strides."""
    pos = {"n": n, "h": h, "b": b}
    return tuple(pos[x] for x in order)


@ty.func
def load_tile(smem, offset, tmap, bar, rows, panels, coords):
    """TMA a (rows x 64*panels) tile as ``panels`` 64-column panels of ``rows`` 128-byte rows;
    ``coords``: its TMA coordinates after the head-dim one (``tma_coords``)."""
    for p in range(panels):
        hopper.tma_load(smem + (offset + p * rows * ROW_BYTES), tmap, bar, p * PANEL, *coords)


@ty.func
def kmajor_desc(base, offset):
    """Descriptor of a K-major SW128 operand at ``offset`` (1024-aligned, or + 64-row steps)."""
    return hopper.smem_descriptor(base + ty.cast(offset, ty.u32))


@ty.func
def kmajor_step(desc, k, rows):
    """k-step k (16 elements of the reduction dim) of a K-major tile of 64-column panels of ``rows``
    rows: panel k // 4, then 32 bytes per step inside the swizzle row (descriptor units of 16 B)."""
    return desc + ((k // 4) * rows * ROW_BYTES + 32 * (k % 4)) // 16


@ty.func
def mnmajor_desc(base, offset, panel_bytes):
    """Descriptor of an MN-major SW128 operand: LBO = the distance between 64-element panels
    along M/N, SBO = 1024 B between groups of 8 reduction rows; k-step kk is 16 rows = 2048 B."""
    return hopper.smem_descriptor(base + ty.cast(offset, ty.u32), lbo=panel_bytes, sbo=1024)


@ty.func
def ss_gemm(atom, a_desc, a_rows, b_desc, b_rows, k_steps):
    """D = A B^T over the head dim with both operands K-major in shared memory (S^T, dP^T, S, dP)."""
    hopper.wgmma_fence()
    acc = None
    for k in range(k_steps):
        acc = hopper.wgmma(atom, acc, kmajor_step(a_desc, k, a_rows), kmajor_step(b_desc, k, b_rows))
    hopper.wgmma_commit()
    return acc


@ty.func
def rs_gemm(atom, acc, a_ops, b_desc):
    """acc += A B with A in registers (one packed fragment per k16 step) and B MN-major."""
    hopper.wgmma_fence()
    for kk in range(len(a_ops)):
        acc = hopper.wgmma(atom, acc, a_ops[kk], b_desc + (16 * ROW_BYTES // 16) * kk, trans_b=1)
    hopper.wgmma_commit()
    return acc


@ty.func
def zeros(n):
    return ty.Fragment(tuple(ty.cast(0.0, ty.f32) for _ in range(n // 2)), ty.WARPGROUP, ty.wgmma_acc(n))


@ty.func
def swizzled(row, col):
    """Byte offset of element (row, col) in a tile of 64-column panels of 128-byte rows, inside its
    panel (the caller adds col // 64 panels): the 16-byte chunk col/8 moves to chunk (col/8) ^ (row%8)."""
    return row * ROW_BYTES + ((((col & 63) >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1)


@ty.func
def store_rows(acc, out, row0, n_rows, base, stride_n, col0, dtype):
    """Store an f32 accumulator's rows below ``n_rows`` as ``dtype`` pairs (one 32-bit word each)."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    words = ty.ptr_cast(out, ty.b32)
    vals = acc.values
    for i in range(0, len(vals), 2):
        r, c = acc.layout.coord(warp, lane, i)
        row = row0 + r
        if row < n_rows:
            offset = base + ty.cast(row, ty.i64) * stride_n + ty.cast(c + col0, ty.i64)
            words[offset >> 1] = ty.pack2(vals[i], vals[i + 1], dtype)


@ty.func
def user_mask_bits(prob, row0, col0, hq, b, n_cols):
    """The user's mask at this thread's registers of a 64 x ``n_cols`` accumulator tile, from the
    bit-packed copy ``attention_bwd_pack_mask`` made (bit i of word w of a row is column 32w + i):
    per row (g and g + 8 of the warp's 16), the n_cols / 32 words from column col0 on, shifted
    right by 2t, so register i's bit is 8((i >> 2) & 3) + (i & 1) of word i >> 4 (``mask_bit``).
    One or two 16-byte loads a row, issued before the products."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    shift = ty.cast(2 * (lane & 3), ty.u32)
    ms = prob.m_strides
    base = ty.cast(b, ty.i64) * ms[0] + ty.cast(hq, ty.i64) * ms[1] + ty.cast(col0 >> 5, ty.i64)
    words = n_cols // 32
    rows = []
    for h in range(2):
        row = row0 + 16 * warp + (lane >> 2) + 8 * h
        loaded = ty.load(prob.mask + (base + ty.cast(row, ty.i64) * ms[2]), vec=words)
        rows.append([w >> shift for w in loaded])
    return rows


def mask_bit(i):
    """(row slot, word, bit) of accumulator register i in ``user_mask_bits``' words."""
    return (i >> 1) & 1, i >> 4, 8 * ((i >> 2) & 3) + (i & 1)


@ty.func
def mask_bounds(prob, row0, col0, keys_on_rows):
    """Per row of this thread, the bound A of ``masked_exp2``: keys past n_k and (causal) keys in
    a query's future get exponent -inf, through arithmetic only (no branch, no predicates).

    ``keys_on_rows``: the tile is S^T (rows are keys from row0, columns queries from col0);
    otherwise S (rows are queries, columns keys). Register i sits in column col0 + 2t + o_i with
    o_i = 8(i >> 2) + (i & 1) known at compile time. A key row keeps the columns with
    o_i >= low (low = key - col0 - 2t under causal masking); a query row keeps o_i < high (high =
    min(n_k, query + 1 under causal) - col0 - 2t). Then (2(o_i - low) + 1) U, or
    (2(high - o_i) - 1) U, is at least U for a kept and at most -U for a masked register; it is
    A + K_i with A = -2U low (or 2U high) per row and K_i per register (``mask_offset``). Bounds of
    +-2**30 overflow A to +-inf: every column kept, or (a row past n_k) none.
    """
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    t2 = 2 * (lane & 3)
    bounds = []
    for h in range(2):  # this thread's rows g and g + 8 of its warp's 16
        row = row0 + 16 * warp + (lane >> 2) + 8 * h
        if keys_on_rows:
            low = ty.select(prob.causal != 0, shift(row, -getattr(prob, "diag", 0)) - col0 - t2, -BIG)
            low = ty.select(row < prob.n_k, low, BIG)
            bounds.append(ty.cast(low, ty.f32) * (-2.0 * MASK_UNIT))
        else:
            end = ty.select(prob.causal != 0, ty.minimum(prob.n_k, row + 1), prob.n_k)
            bounds.append(ty.cast(end - col0 - t2, ty.f32) * (2.0 * MASK_UNIT))
    return bounds


def mask_offset(i, keys_on_rows):
    """K_i of ``mask_bounds`` for accumulator register i (a compile-time float)."""
    o = 8 * (i >> 2) + (i & 1)
    return (2 * o + 1) * MASK_UNIT if keys_on_rows else -(2 * o + 1) * MASK_UNIT


@ty.func
def tile_needs_mask(prob, row0, col0):
    """Whether ``mask_bounds`` (keys on rows from row0, queries from col0) masks any register of
    this warp: a key row past n_k, or under causal masking a row whose first kept column lies right
    of the thread's first (low > 0; the larger row has the larger low). One vote, the same in every
    lane, so a branch on it is warp-uniform; a warp's answer only depends on its own registers."""
    warp = ty.warp_idx() & 3
    lane = ty.lane_id()
    row = row0 + 16 * warp + (lane >> 2) + 8     # this thread's second key row
    low = shift(row, -getattr(prob, "diag", 0)) - col0 - 2 * (lane & 3)
    return ty.vote_any((row >= prob.n_k) | ((prob.causal != 0) & (low > 0)))


@ty.func
def length_causal_min(e, bound, i, keys_on_rows):
    """min(e, A + K_i): exponent ``e`` of register i, -inf-like where ``mask_bounds`` masks it."""
    return ty.minimum(e, bound + mask_offset(i, keys_on_rows))


@ty.func
def user_masked(e, i, bits):
    """Exponent ``e`` of register i, -inf where ``bits`` (the user mask's words, or None) drop it."""
    if bits is not None:
        h, w, bit = mask_bit(i)
        e = ty.select((bits[h][w] & (1 << bit)) != 0, e, NEG_INF)
    return e


@ty.func
def masked_exp2(x, scale_log2, stat, bound, i, keys_on_rows, bits):
    """2^min(x c - stat, A + K_i): P with the length/causal mask folded in (0 where masked), and
    with ``bits`` (the user mask, or None) also 0 where the user masked register i off."""
    e = length_causal_min(ty.fma(x, scale_log2, -stat), bound, i, keys_on_rows)
    return ty.exp2(user_masked(e, i, bits))


@ty.func
def probabilities_t(s, lse, scale_log2, corner, bits):
    """The dK/dV kernels' P^T = 2^(S^T c log2(e) - L log2(e)), each column's L from ``lse``
    (``backward.TileStats``), masked (0) where ``bits`` (the user mask, or None) say so and, if
    ``corner`` = (problem, first key, first query, ``tile_needs_mask``'s vote) says so, past n_k and
    in the causal future: interior tiles skip that mask's FADD and min per register (the length/causal
    mask on every tile cost 32 FMNMX a tile at D=128). The user mask first: its words die before the
    branch (applied after it, a register of the D=64 masked kernel spilled)."""
    prob, key0, m0, need = corner
    vals = s.values
    args = [user_masked(ty.fma(vals[i], scale_log2, -lse[i >> 2][i & 1]), i, bits) for i in range(len(vals))]
    if need:
        bounds = mask_bounds(prob, key0, m0, True)
        args = [length_causal_min(args[i], bounds[(i >> 1) & 1], i, True) for i in range(len(args))]
    return s.with_data([ty.exp2(a) for a in args])
