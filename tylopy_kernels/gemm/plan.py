"""The compile-time geometry of one GEMM schedule: tiles, warpgroup roles, shared-memory map.

Plain Python shared by the kernel (at trace time) and the launcher (to size shared memory and
reject schedules before compiling). Every size is in bytes unless named otherwise.

Terms: the CTA computes a BLOCK_M x BLOCK_N tile of C in k-blocks of 64 (one 128-byte swizzle
row of 16-bit elements). Two consumer warpgroups share the tile ("cooperative", each owns half
of the rows) or take turns on whole tiles ("pingpong", each owns every other tile). A consumer's
part is WM x WN: WM/64 wgmma atoms of m64 x n{WN} x k16, each WN/2 f32 registers per thread.
"""
from __future__ import annotations

from tylopy import hopper

BLOCK_K = 64                  # elements of one k-block: a 128-byte row of bf16/fp16
ROW_BYTES = 128               # one SWIZZLE_128B row
CHUNK_ROWS = 64               # an MN-major operand arrives as 64 (m or n) x 64 (k) boxes
CHUNK_BYTES = CHUNK_ROWS * ROW_BYTES
SMEM_LIMIT = 232448           # H100/H200 opt-in dynamic shared memory per block
CONSUMERS = 2
THREADS = 128 * (CONSUMERS + 1)
# setmaxnreg split of the 1-CTA-per-SM pool (65536 / 384 = 168 per thread at entry):
# 128 * 40 + 256 * 232 = 384 * 168.
REGISTERS = (40, 232)
MAX_ACC_REGS = 128            # accumulator registers per consumer thread that leave room for the epilogue
SCHEDULES = ("cooperative", "pingpong")
STORES = ("direct", "tma")

# Named barriers (0 is __syncthreads): the pingpong turn of consumer c is 1 + c; the epilogue
# staging buffer of consumer c is guarded by 3 + c.
TURN_BARRIER = 1
EPILOGUE_BARRIER = 3


def out_bytes_of(name: str) -> int:
    return 4 if name == "f32" else 2


class Plan:
    """Geometry of one schedule; ``Plan(...)`` raises ValueError naming a bad choice."""

    def __init__(self, block_m: int, block_n: int, stages: int, schedule: str, out_dtype: str = "bf16",
                 store: str = "direct"):
        if schedule not in SCHEDULES:
            raise ValueError(f"SCHEDULE expects one of {SCHEDULES}, but got {schedule!r}")
        if store not in STORES:
            raise ValueError(f"STORE expects one of {STORES}, but got {store!r}")
        if block_n % 64 or not 64 <= block_n <= 256:
            raise ValueError(f"BLOCK_N expects 64, 128, 192 or 256, but got {block_n}")
        if not isinstance(stages, int) or not 2 <= stages <= 8:
            raise ValueError(f"STAGES expects an int in 2..8, but got {stages!r}")
        if schedule == "cooperative":
            if block_m not in (128, 256):
                raise ValueError(f"BLOCK_M expects 128 or 256 for the cooperative schedule (two consumers of "
                                 f"64 or 128 rows), but got {block_m}")
            self.wm = block_m // CONSUMERS
        else:
            if block_m not in (64, 128):
                raise ValueError(f"BLOCK_M expects 64 or 128 for the pingpong schedule (one consumer per tile), "
                                 f"but got {block_m}")
            self.wm = block_m
        self.wn = block_n
        self.atoms_m = self.wm // 64
        acc_regs = self.atoms_m * self.wn // 2
        if acc_regs > MAX_ACC_REGS:
            raise ValueError(f"a {self.wm} x {self.wn} consumer tile needs {acc_regs} accumulator registers per "
                             f"thread, more than the {MAX_ACC_REGS} that leave room for the epilogue "
                             f"(BLOCK_M={block_m}, BLOCK_N={block_n}, SCHEDULE={schedule!r})")
        self.block_m, self.block_n, self.stages = block_m, block_n, stages
        self.schedule, self.store, self.out_dtype = schedule, store, out_dtype
        self.cooperative = schedule == "cooperative"
        self.a_bytes = block_m * ROW_BYTES
        self.b_bytes = block_n * ROW_BYTES
        self.stage_bytes = self.a_bytes + self.b_bytes
        self.a = 0
        self.b = stages * self.a_bytes
        end = self.b + stages * self.b_bytes
        # TMA-store staging: per consumer, two buffers of WM rows x 128 bytes (64 bf16 or 32 f32
        # columns), written by the warpgroup and stored while the next one fills.
        self.out_bytes = out_bytes_of(out_dtype)
        self.epi_cols = ROW_BYTES // self.out_bytes
        self.epi_chunks = self.wn // self.epi_cols
        self.epi_buf_bytes = self.wm * ROW_BYTES
        self.epi = end
        if store == "tma":
            end += CONSUMERS * 2 * self.epi_buf_bytes
        self.full = end
        self.empty = end + 8 * stages
        self.ring = hopper.Ring(self.full, self.empty, stages)  # the operands' stages and their barriers
        self.total = self.empty + 8 * stages
        # a stage is released by one thread of each consumer that read it
        self.empty_count = CONSUMERS if self.cooperative else 1
        if self.total > SMEM_LIMIT:
            raise ValueError(f"the schedule needs {self.total} bytes of shared memory, more than the {SMEM_LIMIT} a "
                             f"block may use (BLOCK_M={block_m}, BLOCK_N={block_n}, STAGES={stages}, STORE={store!r})")

    def key(self) -> tuple:
        return (self.block_m, self.block_n, self.stages, self.schedule, self.out_dtype, self.store)
