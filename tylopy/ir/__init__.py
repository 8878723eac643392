"""tylopy's IR: types, values and ops with their type rules, blocks, the verifier and the printer.

Pure data: nothing here builds ops from Python operators or knows about tiles, fragments or
kernels. It imports nothing of tylopy's but ``tylopy.errors``.
"""
from .ops import OpTypeError, result_types
from .printer import format_ir
from .types import PointerType, ScalarType, TensorMapType
from .values import Block, KernelIR, LaunchBounds, Op, Param, SharedAlloc, Value, WaitSite, walk_block
from .verify import verify

__all__ = ["Block", "KernelIR", "LaunchBounds", "Op", "Param", "SharedAlloc", "Value", "WaitSite", "format_ir",
           "walk_block", "PointerType", "ScalarType", "TensorMapType", "verify", "OpTypeError", "result_types"]
