"""Float ops and conversions with an explicit rounding direction (the ``rounding`` attribute).

The handlers wrap the plain ones of ``ops_scalar``: without the attribute an op runs exactly as
before; with it, the numpy semantics of ``tylopy/semantics/rounding.py`` (bit-exact directed
rounding) compute the result.
"""
from __future__ import annotations

from . import ops_scalar  # noqa: F401  (registers the plain handlers this module wraps)
from .compiled import HANDLERS, handler
from .values import np_dtype
from ..semantics import rounding

_PLAIN = {k: HANDLERS[k] for k in ("add", "sub", "mul", "div", "fma", "sqrt", "convert")}


def _fn(op):
    mode = op.attr("rounding")
    t = op.operands[0].type
    if op.opcode in ("add", "sub", "mul", "div"):
        return rounding.binary(op.opcode, np_dtype(t), mode)
    if op.opcode == "fma":
        return rounding.fma(np_dtype(t), mode)
    if op.opcode == "sqrt":
        return rounding.sqrt(mode)
    return rounding.convert(t, op.attr("to"), mode)


@handler("add", "sub", "mul", "div", "fma", "sqrt", "convert")
def make_rounded(prog, op):
    fp8 = op.opcode == "convert" and (op.operands[0].type.is_fp8 or op.attr("to").is_fp8)
    if op.attr("rounding") is None or fp8:  # fp8 converts round to nearest only
        return _PLAIN[op.opcode](prog, op)
    fn = _fn(op)
    args = [prog.slot(v) for v in op.operands]
    r = prog.slot(op.result)

    def run(w):
        env = w.env
        env[r] = fn(*(env[a] for a in args))
    return False, run
