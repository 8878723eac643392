"""A lane-exact CPU emulator of tylopy kernels, with checks of the asynchronous protocols.

    report = kernel.emulate(x, y, out, n, grid=(4,))      # torch CPU tensors or numpy arrays
    report = kernel.emulate(*args, grid=g, ctas=[(0, 0, 0)], HEAD_DIM=64)   # a subset, constexprs

It executes the IR, not PTX: every CTA of the grid (or the chosen ones) with all its threads,
warps in lockstep with lane masks for divergence, values as numpy arrays over the 32 lanes.
Each op has the semantics of its LLVM/PTX lowering (see the ``ops_*`` modules). Checked on an
H200 (tests/test_emulate_gpu.py): conversions, fma, div/rcp/sqrt, shuffles, TMA images,
mma.sync and wgmma (whose f32 accumulation follows ``tylopy.semantics.tensorcore``) and the Hopper attention
kernel's output are bit-identical; only ``ex2/lg2/rsqrt.approx`` differ, the emulator giving
the correctly rounded value and the hardware one within the PTX ISA's documented error.

Protocol checks raise ``ProtocolError`` naming the source line, the barrier or stage and the
warps: deadlock (every live warp waiting, including a wgmma that not all 4 warps of its
warpgroup issue), an mbarrier phase that can never complete, expect_tx bytes that differ from
the bytes the copies deliver, too many arrivals, a wgmma accumulator read before its
wait_group, a wgmma without wgmma_fence, smem written by ordinary stores and read by wgmma
without fence.proxy.async, an mbarrier used before its initialization is visible (or used by
TMA without the init fence), shared-memory races between warps (two writes, a read and a
write, or a write over bytes a wgmma still reads, with nothing ordering them: vector clocks
over bar.sync and mbarrier phases), warps of a warpgroup disagreeing on a collective, and
``.sync.aligned`` instructions in diverged warps. Memory errors (``MemoryAccessError``): global
or shared accesses out of bounds, misaligned vector accesses. ``check_races=False`` turns the
race checks off.

``tylopy emulate FILE.py[:KERNEL]`` (``tylopy.cli.emulate``) runs a kernel file's ``emulate_example()``.
"""
from .errors import EmulationError, MemoryAccessError, ProtocolError, UnsupportedOpError
from .launch import EmulationReport, emulate_kernel

__all__ = ["emulate_kernel", "EmulationReport", "EmulationError", "ProtocolError", "MemoryAccessError",
           "UnsupportedOpError"]
