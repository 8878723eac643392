"""Compile a ``KernelIR`` once into closures the warps execute.

Every IR value gets a slot in a flat per-warp list (``Warp.env``); every op becomes an
instruction ``(is_generator, fn)`` where ``fn(warp)`` reads its operand slots and writes its
result slots. Instructions that can block (barriers, mbarrier waits, setmaxnreg.inc) and the
region ops that may contain them are generators that yield a ``Wait`` to the scheduler.
Constants are computed once into the slot template each warp starts from.

Op semantics live in ``control`` and the ``ops_*`` modules, registered in ``HANDLERS`` by opcode
(``ops_scalar``: arithmetic, conversions, shuffles; ``ops_memory``: pointers, loads, stores;
``ops_hopper``: barriers, mbarriers, fences, setmaxnreg, TMA; ``ops_mma``: mma.sync, ldmatrix;
``ops_wgmma``: wgmma and its groups).

Pending wgmma results: a forward data-flow pass finds every value that may hold a wgmma
result not yet waited on (through fence_operand, wgmma_wait and region arguments); ops
that read such values, other than the wgmma plumbing, get a run-time check.
"""
from __future__ import annotations

from ..ir.values import Block, KernelIR, Op
from .compiled import HANDLERS, CBlock, handler, run_block  # noqa: F401  (re-exported)
from .errors import ProtocolError, where
from .values import Pending, splat

PENDING_OK = frozenset({"wgmma", "wgmma_wait", "fence_operand", "yield", "condition", "for", "if", "while"})


def load_handlers() -> dict:
    """Import the ``ops_*`` modules (they register themselves) and return the table."""
    from . import control, ops_async_copy, ops_hopper, ops_memory, ops_mma, ops_scalar, ops_wgmma  # noqa: F401
    from . import multicast, ops_atomics, ops_cluster, ops_debug, ops_warp  # noqa: F401
    from . import ops_rounding  # noqa: F401  (after ops_scalar: wraps its handlers for explicit roundings)
    return HANDLERS


def pending_values(kir: KernelIR) -> set[int]:
    """Ids of values that may carry a wgmma result that no wgmma_wait has passed through yet."""
    pend: set[int] = set()

    def flow(srcs, dsts):
        changed = False
        for s, d in zip(srcs, dsts):
            if s.id in pend and d.id not in pend:
                pend.add(d.id)
                changed = True
        return changed

    def visit(block: Block) -> bool:
        changed = False
        for op in block.ops:
            if op.opcode == "wgmma":
                for r in op.results:
                    if r.id not in pend:
                        pend.add(r.id)
                        changed = True
            elif op.opcode in ("fence_operand", "wgmma_wait"):
                changed |= flow(op.operands, op.results)
            elif op.opcode == "for":
                body = op.regions[0]
                init = op.operands[3:]
                ys = body.ops[-1].operands
                changed |= flow(init, body.args[1:]) | flow(ys, body.args[1:])
                changed |= flow(init, op.results) | flow(ys, op.results)
            elif op.opcode == "if":
                for r in op.regions:
                    changed |= flow(r.ops[-1].operands, op.results)
            elif op.opcode == "while":
                cond, body = op.regions
                ys = body.ops[-1].operands
                for dst in (cond.args, body.args, op.results):
                    changed |= flow(op.operands, dst) | flow(ys, dst)
            for r in op.regions:
                changed |= visit(r)
        return changed

    while visit(kir.body):
        pass
    return pend


def pending_read_error(op: Op, v: Pending, w) -> ProtocolError:
    return ProtocolError(
        f"wgmma accumulator read before its wgmma_wait: {op.opcode} at {where(op)} ({w.describe()}) reads a "
        f"result of the wgmma at {where(v.op)}, which is in commit group {v.group} of that warp; only "
        f"{w.groups_done()} group(s) have been waited out. Pass the accumulator through "
        f"wgmma_wait(n) with n small enough to cover its group, and read the values the wait returns")


class Program:
    """One kernel specialization, compiled for the emulator."""

    def __init__(self, kir: KernelIR):
        load_handlers()
        self.kir = kir
        self.slots: dict[int, int] = {}
        self.consts: dict[int, object] = {}
        self.ops: list[Op] = []
        self.pending = pending_values(kir)
        self.param_slots = [self.slot(p.value) for p in kir.params]
        self.body = self.block(kir.body)
        self.nslots = len(self.slots)

    def slot(self, v) -> int:
        s = self.slots.get(v.id)
        if s is None:
            s = self.slots[v.id] = len(self.slots)
        return s

    def block(self, block: Block) -> CBlock:
        args = [self.slot(a) for a in block.args]
        ops = list(block.ops)
        term_op = ops.pop() if ops and ops[-1].opcode in ("yield", "condition") else None
        instrs = [ins for ins in (self.instr(op) for op in ops) if ins is not None]
        term = [self.slot(v) for v in term_op.operands] if term_op is not None else []
        return CBlock(args, instrs, term, term_op, any(g for g, _ in instrs))

    def instr(self, op: Op):
        self.ops.append(op)
        if op.opcode == "const":
            self.consts[self.slot(op.result)] = splat(op.attr("value"), op.result.type)
            return None
        make = HANDLERS.get(op.opcode)
        if make is None:
            from .errors import UnsupportedOpError
            raise UnsupportedOpError(f"the emulator has no semantics for op {op.opcode!r} at {where(op)}")
        is_gen, fn = make(self, op)
        if op.opcode not in PENDING_OK:
            checked = [self.slot(v) for v in op.operands if v.id in self.pending]
            if checked:
                is_gen, fn = _with_pending_check(op, checked, is_gen, fn)
        return is_gen, fn

    def template(self, params: dict) -> list:
        """The slot list a warp starts from: constants and the bound parameters."""
        env = [None] * self.nslots
        for s, v in self.consts.items():
            env[s] = v
        for p, s in zip(self.kir.params, self.param_slots):
            env[s] = params[p.name]
        return env


def _with_pending_check(op, slots, is_gen, fn):
    def check(w):
        env = w.env
        for s in slots:
            v = env[s]
            if type(v) is Pending:
                raise pending_read_error(op, v, w)

    if is_gen:
        def gen(w):
            check(w)
            yield from fn(w)
        return True, gen

    def plain(w):
        check(w)
        fn(w)
    return False, plain
