"""Attention test cases: one ``Case`` type for both kernels, the inputs of a case (reproducible from
its name), and the two kernels' suites.

* The Hopper suite (``shape_cases``, ``special_cases``, ``CONSTANT_CASES``,
  ``NONPOSITIVE_SCALE_CASES``): D = 64, the launcher picks the tile schedule, names derived from
  the fields ("bf16 2x3 113x203 mask=random lse").
* The portable suite (``PORTABLE_CASES``, ``PORTABLE_QUICK``): D = 16, 32 or 64, an explicit
  ``block_n`` and warp count, memory layouts, named by label ("N2047-D64-BN64-bf16").

``make_inputs`` draws from a generator seeded by the case's name. ``Case.draw`` says where: on the
launch device (the Hopper suite) or on the CPU, copied to the device afterwards (the portable
suite: the same numbers on every device, so the CPU emulator sees the GPU's inputs).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from tylopy_kernels.attention.testing.reference import resolve_scale

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
_DTYPE_NAMES = {"bf16": "bf16", "f16": "f16", "bfloat16": "bf16", "float16": "f16"}


def torch_dtype(name: str) -> torch.dtype:
    """bf16/f16 (also spelled bfloat16/float16) as a torch dtype."""
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype expects bf16 or f16, but got {name!r}")
    return DTYPES[_DTYPE_NAMES[name]]


@dataclass(frozen=True)
class Case:
    """One attention case.

    ``mask``: None; for inputs drawn on the device "random" ((n_q, n_k), row 0 empty), "heads"
    ((B, H, n_q, n_k), one empty row), "keys" ((B, 1, 1, n_k) key padding: batch b keeps
    n_k b / (B - 1) keys, so batch 0 has none), "transposed" (a non-contiguous (n_q, n_k) view); for
    inputs drawn on the CPU "qk" ((n_q, n_k): row 0 sees no key, row 1 only the last), "bhk"
    ((B, 1, 1, n_k)), "hqk" ((1, H, n_q, n_k)).
    ``inputs``: "randn"; "uniform" (q = 0: every score equal); on the device "large" (scores reach
    +-3e4), "large_uniform" (every score +3e4; -3e4 with ``negate``), "constant" (q = k = v =
    ``value``); on the CPU "integers" (Q and K integers in [-128, 128]: float32 scores are exact and
    reach +-3e4).
    ``layout`` (the portable suite): "contiguous", "bnhd" (a (B, N, H, D) buffer transposed),
    "poison" (a slice of a NaN-filled larger buffer, 16-byte aligned), "poison_odd" (misaligned).
    ``block_n``/``warps``: the kernel's key tile and warps per CTA (None: the launcher's choice).
    ``kind`` (the portable suite's runner): "numerics", "future" (causal future perturbation),
    "worked" (the worked example, ``worked_example_inputs``; ``extra`` may hold "two_tiles").
    """

    dtype: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    causal: bool = False
    mask: str | None = None
    lse: bool = False
    inputs: str = "randn"
    scale: float | None = None
    value: float = 0.0
    negate: bool = False
    head_dim: int = 64
    block_n: int | None = None
    warps: int | None = None
    layout: str = "contiguous"
    kind: str = "numerics"
    extra: tuple = ()
    draw: str = "device"
    label: str = ""

    def __post_init__(self):
        torch_dtype(self.dtype)
        if self.causal and self.n_q != self.n_k:
            raise ValueError(f"Case expects n_q == n_k with causal=True, but got {self.n_q} and {self.n_k}")
        if self.causal and self.mask:
            raise ValueError("Case expects no mask with causal=True (the entry point rejects both)")
        if self.draw not in ("device", "cpu"):
            raise ValueError(f"Case.draw expects 'device' or 'cpu', but got {self.draw!r}")

    @property
    def torch_dtype(self):
        return torch_dtype(self.dtype)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        parts = [self.dtype, f"{self.batch}x{self.heads}", f"{self.n_q}x{self.n_k}"]
        parts += ["causal"] if self.causal else []
        parts += [f"mask={self.mask}"] if self.mask else []
        parts += ["lse"] if self.lse else []
        if self.inputs != "randn":
            parts.append(self.inputs + (f"={self.value:g}" if self.inputs == "constant" else "")
                         + ("-neg" if self.negate else ""))
        parts += [f"scale={self.scale:g}"] if self.scale is not None else []
        return " ".join(parts)

    @property
    def resolved_scale(self) -> float:
        return resolve_scale(self.scale, self.head_dim)

    @property
    def stats(self) -> bool:
        """Whether the statistical same-boundary rule applies (not where score noise dominates)."""
        return self.inputs not in ("large", "large_uniform", "constant")


# -- inputs ---------------------------------------------------------------------------------------------

def _seed(case: Case) -> int:
    return zlib.crc32(case.name.encode())


def make_inputs(case: Case, device="cuda"):
    """(q, k, v, mask) for a case, reproducible from its name."""
    if case.draw == "cpu":
        return _inputs_drawn_on_cpu(case, device)
    g = torch.Generator(device=device).manual_seed(_seed(case))
    B, H, D, dt = case.batch, case.heads, case.head_dim, case.torch_dtype
    shape_q, shape_k = (B, H, case.n_q, D), (B, H, case.n_k, D)
    q = torch.randn(shape_q, generator=g, device=device)
    k = torch.randn(shape_k, generator=g, device=device)
    v = torch.randn(shape_k, generator=g, device=device)
    if case.inputs == "uniform":
        q.zero_()
    elif case.inputs == "large" and case.n_q and case.n_k:
        s = (q @ k.transpose(-1, -2)) * case.resolved_scale
        grow = math.sqrt(3e4 / float(s.abs().max()))
        q, k = q * grow, k * grow
    elif case.inputs == "large_uniform":  # 75 * 50 * 64 / 8 = 3e4 exactly, in bf16 and fp16
        if case.scale is not None:
            raise ValueError("large_uniform inputs assume the default scale 1/8")
        q.fill_(-75.0 if case.negate else 75.0)
        k.fill_(50.0)
    elif case.inputs == "constant":
        q.fill_(case.value), k.fill_(case.value), v.fill_(case.value)
    elif case.inputs != "randn":
        raise ValueError(f"inputs drawn on the device expect randn, uniform, large, large_uniform or constant, "
                         f"but got {case.inputs!r}")
    mask = make_mask(case, g, device)
    return q.to(dt), k.to(dt), v.to(dt), mask


def make_mask(case: Case, g, device):
    """The case's Boolean mask (None without one), drawn from ``g``."""
    B, H, n_q, n_k = case.batch, case.heads, case.n_q, case.n_k
    if case.mask is None:
        return None
    if case.mask == "random":
        m = torch.rand((n_q, n_k), generator=g, device=device) > 0.3
        if n_q > 1:
            m[0] = False
    elif case.mask == "heads":
        m = torch.rand((B, H, n_q, n_k), generator=g, device=device) > 0.5
        m[0, -1, n_q // 2] = False
    elif case.mask == "keys":
        lengths = [n_k * b // (B - 1) for b in range(B)] if B > 1 else [max(1, 2 * n_k // 3)]
        m = torch.arange(n_k, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
        m = m[:, None, None, :]
    elif case.mask == "transposed":
        m = (torch.rand((n_k, n_q), generator=g, device=device) > 0.3).t()
        m[n_q - 1] = False
    else:
        raise ValueError(f"mask kind expects random, heads, keys or transposed, but got {case.mask!r}")
    return m


def _inputs_drawn_on_cpu(case: Case, device):
    gen = torch.Generator(device="cpu").manual_seed(_seed(case))
    dt = case.torch_dtype
    B, H, n_q, n_k, D = case.batch, case.heads, case.n_q, case.n_k, case.head_dim

    def randn(*shape):
        return torch.randn(*shape, generator=gen)
    if case.inputs == "uniform":
        qf, kf = torch.zeros(B, H, n_q, D), randn(B, H, n_k, D)
    elif case.inputs == "integers":   # every product and partial sum is exact in FP32; scores ~ +-3e4
        qf = torch.randint(-128, 129, (B, H, n_q, D), generator=gen).float()
        kf = torch.randint(-128, 129, (B, H, n_k, D), generator=gen).float()
    elif case.inputs == "randn":
        qf, kf = randn(B, H, n_q, D), randn(B, H, n_k, D)
    else:
        raise ValueError(f"inputs drawn on the CPU expect randn, uniform or integers, but got {case.inputs!r}")
    vf = randn(B, H, n_k, D)
    q = _in_layout(qf.to(dt).to(device), case.layout)
    k = _in_layout(kf.to(dt).to(device), case.layout)
    v = _in_layout(vf.to(dt).to(device), case.layout)
    mask = None
    if case.mask == "qk":
        mask = torch.rand(n_q, n_k, generator=gen) > 0.4
        mask[0] = False            # a row that sees no key: zeros, LSE -inf
        mask[1, :] = False
        mask[1, -1] = True         # a row that sees only the last key
    elif case.mask == "bhk":
        mask = torch.rand(B, 1, 1, n_k, generator=gen) > 0.3
        mask[..., 0] = True
    elif case.mask == "hqk":
        mask = torch.rand(1, H, n_q, n_k, generator=gen) > 0.5
        mask[0, 0, 3] = False
    elif case.mask is not None:
        raise ValueError(f"mask kind expects qk, bhk or hqk for inputs drawn on the CPU, but got {case.mask!r}")
    return q, k, v, (mask.to(device) if mask is not None else None)


def _in_layout(values, layout):
    """A (B, H, N, D) tensor holding ``values`` in the given memory layout."""
    B, H, N, D = values.shape
    if layout == "bnhd":
        t = torch.empty(B, N, H, D, dtype=values.dtype, device=values.device).transpose(1, 2)
    elif layout in ("poison", "poison_odd"):
        pad = 8 if layout == "poison" else 3
        buf = torch.full((B, H, N + 5, D + pad), float("nan"), dtype=values.dtype, device=values.device)
        t = buf[:, :, 2:N + 2, pad:pad + D] if layout == "poison_odd" else buf[:, :, 2:N + 2, :D]
    elif layout == "contiguous":
        t = torch.empty(B, H, N, D, dtype=values.dtype, device=values.device)
    else:
        raise ValueError(f"layout expects contiguous, bnhd, poison or poison_odd, but got {layout!r}")
    t.copy_(values)
    return t


def worked_example_inputs(D, dtype, block_n, two_tiles, device="cuda"):
    """q, k, v, mask, scale whose scaled logits are [0, 0] then [log 2] and values [1, 3] then [10].

    q = e0 and the keys are 0, 0, e0 with scale = log 2, so q.k * scale = [0, 0, log 2]. With
    ``two_tiles`` the third key sits at index block_n (the next tile), and a mask hides the keys
    in between: the first tile's maximum 0 grows to log 2 in the second. Every output is 6; 7
    means the numerator was not rescaled.
    """
    dt = torch_dtype(dtype)
    n_k = block_n + 1 if two_tiles else 3
    last = n_k - 1
    q = torch.zeros(1, 1, 3 if not two_tiles else 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, n_k, D)
    k[0, 0, last, 0] = 1.0
    v = torch.zeros(1, 1, n_k, D)
    v[0, 0, 0], v[0, 0, 1], v[0, 0, last] = 1.0, 3.0, 10.0
    mask = None
    if two_tiles:
        mask = torch.zeros(1, n_k, dtype=torch.bool)
        mask[0, [0, 1, last]] = True
        mask = mask.to(device)
    return q.to(dt).to(device), k.to(dt).to(device), v.to(dt).to(device), mask, math.log(2.0)


# -- the Hopper suite -------------------------------------------------------------------------------------

PAIRS = ((1, 1), (1, 239), (239, 1), (17, 17), (64, 128), (113, 203), (127, 129), (128, 128), (129, 127),
         (1023, 1024), (2048, 2048), (4097, 4097))
BATCH_HEADS = {(1, 1): (1, 1), (1, 239): (2, 3), (239, 1): (1, 2), (17, 17): (9, 6), (64, 128): (1, 1),
               (113, 203): (2, 3), (127, 129): (3, 2), (128, 128): (1, 4), (129, 127): (9, 6),
               (1023, 1024): (1, 2), (2048, 2048): (1, 2), (4097, 4097): (1, 1)}
MASK_KINDS = ("random", "heads", "keys", "transposed")


def shape_cases(compact: bool = False) -> list[Case]:
    """Every (n_q, n_k) pair in bf16 and fp16: plain, masked, and causal where n_q == n_k. The
    compact list (for ``tylopy check``) takes one dtype per pair, alternating."""
    cases = []
    for i, (n_q, n_k) in enumerate(PAIRS):
        B, H = BATCH_HEADS[(n_q, n_k)]
        for j, dt in enumerate(("bf16", "f16")):
            if compact and j != i % 2:
                continue
            lse = (i + j) % 2 == 0
            cases.append(Case(dt, B, H, n_q, n_k, lse=lse))
            cases.append(Case(dt, B, H, n_q, n_k, mask=MASK_KINDS[(i + j) % 4], lse=not lse))
            if n_q == n_k:
                cases.append(Case(dt, B, H, n_q, n_k, causal=True, lse=not lse))
    return cases


def special_cases() -> list[Case]:
    """Uniform and large logits, many work tiles (more than the SM count), non-default scales."""
    return [
        Case("bf16", 2, 2, 200, 333, inputs="uniform", lse=True),
        Case("f16", 1, 2, 300, 300, causal=True, inputs="uniform"),
        Case("bf16", 1, 2, 256, 256, inputs="large", lse=True),
        Case("f16", 2, 1, 300, 257, inputs="large", mask="random", lse=True),
        Case("bf16", 1, 1, 384, 384, causal=True, inputs="large", lse=True),
        Case("bf16", 1, 2, 300, 300, causal=True, inputs="large_uniform", lse=True),
        Case("f16", 1, 2, 200, 333, inputs="large_uniform", negate=True, lse=True),
        Case("bf16", 4, 8, 1024, 1024, causal=True, lse=True),
        Case("f16", 9, 6, 640, 640, mask="keys"),
        Case("bf16", 9, 6, 512, 700),
        Case("bf16", 1, 2, 300, 200, scale=0.3, lse=True),
        Case("f16", 1, 1, 129, 300, scale=1, mask="random"),
    ]


# Former failures, kept as cases. Each constant's square has so few significant bits that every
# partial sum of q.k is exact in float32, whatever the order: the score is exactly 64 value^2, and
# the old exponent fma(s, c, -round(m c)) missed by 7916 (bf16) and 2044.5 (fp16).
CONSTANT_CASES = (Case("bf16", 1, 2, 300, 300, inputs="constant", value=133120.0),
                  Case("f16", 1, 1, 200, 200, inputs="constant", value=54656.0))
NONPOSITIVE_SCALE_CASES = (Case("bf16", 1, 1, 128, 128, scale=0.0),
                           Case("bf16", 1, 2, 100, 300, scale=-0.125, lse=True))


# -- the portable suite -------------------------------------------------------------------------------------

def portable_case(label, n_q, n_k=None, D=64, block_n=64, warps=4, **fields) -> Case:
    """A case of the portable suite: inputs drawn on the CPU, an explicit tile and warp count;
    ``fields`` are Case's (``dtype`` "bf16" unless given), ``B`` and ``H`` (batch and heads, 1
    unless given)."""
    shape = dict(dtype=fields.pop("dtype", "bf16"), batch=fields.pop("B", 1), heads=fields.pop("H", 1))
    return Case(**shape, n_q=n_q, n_k=n_q if n_k is None else n_k, head_dim=D, block_n=block_n, warps=warps,
                draw="cpu", label=label, **fields)


def _portable_cases() -> list[Case]:
    P = portable_case
    cases = []
    for n in (1, 2, 15, 17, 63, 65, 2047, 2048, 4096, 5000):
        heads = 2 if n <= 2048 else 1
        for D in (16, 32, 64):
            for bn in (32, 64):
                cases.append(P(f"N{n}-D{D}-BN{bn}-bf16", n, D=D, block_n=bn, H=heads))
            cases.append(P(f"N{n}-D{D}-BN64-f16", n, D=D, dtype="f16", H=heads))
        cases.append(P(f"N{n}-D64-BN64-bf16-causal", n, causal=True, H=heads, lse=True))
        cases.append(P(f"N{n}-D32-BN32-f16-causal", n, D=32, block_n=32, dtype="f16", causal=True, H=heads))
    cases += [
        P("single-D16-f16-lse", 1, D=16, dtype="f16", lse=True),
        P("ragged-rect-100x300-D32", 100, 300, D=32, block_n=32, B=2, H=3, lse=True),
        P("ragged-rect-300x7-D64", 300, 7, lse=True),
        P("ragged-rect-1x5000-D16", 1, 5000, D=16),
        P("ragged-rect-129x33-D64-BN32-f16", 129, 33, block_n=32, dtype="f16"),
        P("batch-heads-3x5-N77-D32", 77, D=32, B=3, H=5, lse=True),
        P("uniform-N1000-D64", 1000, inputs="uniform", H=2),
        P("uniform-N999-D16-BN32-f16-causal", 999, D=16, block_n=32, dtype="f16", inputs="uniform", causal=True),
        P("large-N777-D64-bf16", 777, inputs="integers", lse=True),
        P("large-N2048-D64-f16-causal", 2048, dtype="f16", inputs="integers", causal=True, lse=True),
        P("large-N500-D16-BN32-bf16", 500, D=16, block_n=32, inputs="integers", H=2),
        P("mask-qk-D64-lse", 200, 333, mask="qk", lse=True, H=2),
        P("mask-bhk-D32-BN32", 150, 150, D=32, block_n=32, mask="bhk", B=2, H=2, lse=True),
        P("mask-hqk-D16-f16", 90, 200, D=16, dtype="f16", mask="hqk", H=3, lse=True),
        P("layout-bnhd-D64-causal", 300, B=2, H=4, layout="bnhd", causal=True),
        P("layout-bnhd-D16-rect", 100, 250, D=16, B=2, H=3, layout="bnhd", lse=True),
        P("poison-aligned-D32", 200, 150, D=32, layout="poison", lse=True),
        P("poison-aligned-D64-causal-BN32", 129, block_n=32, layout="poison", causal=True, lse=True),
        P("poison-misaligned-D16-f16", 70, 90, D=16, dtype="f16", layout="poison_odd"),
        P("scale-0.5-D32", 128, D=32, scale=0.5),
        P("warps1-N100-D64-causal", 100, causal=True, warps=1, lse=True),
        P("warps2-N200x150-D32-BN32", 200, 150, D=32, block_n=32, warps=2),
        P("warps8-N300-D16-f16-causal", 300, D=16, dtype="f16", causal=True, warps=8, lse=True),
        P("warps8-N1000x70-D64-mask", 1000, 70, mask="qk", warps=8),
        P("worked-example-D16", 3, D=16, kind="worked"),
        P("worked-example-D64-BN32-f16", 3, D=64, block_n=32, dtype="f16", kind="worked"),
        P("worked-example-two-tiles-D32-BN32", 1, D=32, block_n=32, kind="worked", extra=("two_tiles",)),
        P("worked-example-two-tiles-D64-BN64", 1, D=64, block_n=64, kind="worked", extra=("two_tiles",)),
    ]
    for D, bn, dtype in ((16, 32, "bf16"), (64, 64, "bf16"), (32, 64, "f16"), (64, 32, "f16")):
        name = {"bf16": "bfloat16", "f16": "float16"}[dtype]
        cases.append(P(f"future-D{D}-BN{bn}-{name}", 300, D=D, block_n=bn, dtype=dtype, causal=True, H=2,
                       lse=True, kind="future"))
    return cases


PORTABLE_CASES = _portable_cases()
PORTABLE_QUICK = [c for c in PORTABLE_CASES if c.n_k <= 2048
                  and (c.kind != "numerics" or c.n_q in (1, 17, 65, 2048) or not c.name.startswith("N"))]
