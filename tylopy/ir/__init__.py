"""tylopy's IR: types, values and ops, the builder used while tracing, and the verifier."""
from .core import Block, KernelIR, LaunchBounds, Op, Param, SharedAlloc, Value, format_ir
from .types import PointerType, ScalarType, TensorMapType
from .verify import verify

__all__ = ["Block", "KernelIR", "LaunchBounds", "Op", "Param", "SharedAlloc", "Value", "format_ir",
           "PointerType", "ScalarType", "TensorMapType", "verify"]
