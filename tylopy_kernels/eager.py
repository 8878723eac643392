"""Operators called from eager code without torch's operator dispatch.

A ``torch.library.custom_op`` is what torch.compile, torch.export and the dispatcher's modes see,
and it stays the only route there. Outside them, dispatching a custom operator costs about
100 microseconds of host time per differentiable call, and as much again in the backward
(torch's Python wrappers: the autograd kernel, the aliasing check, the argument pytrees), more
than a short attention kernel runs. ``EagerOp`` calls the operator's Python body directly when
nothing but plain autograd is watching, and gives autograd the same ``setup_context`` and
``backward`` the operator registered, in a ``torch.autograd.Function``::

    def _fwd(q: Tensor, ...) -> tuple[Tensor, Tensor]: ...       # the body
    fwd_op = torch.library.custom_op("tylopy::x_fwd", mutates_args=())(_fwd)
    fwd_op.register_autograd(_backward, setup_context=_setup)
    x_fwd = EagerOp(fwd_op, _fwd, _setup, _backward)              # called by the entry point

The two routes compute the same thing with the same code; which one ran is invisible except
in host time. A list of tensors among the arguments (the variant operators' ``tensors``) is
spread into separate ``Function`` inputs, so each gets its gradient.
"""
from __future__ import annotations

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager_ok(args) -> bool:
    """Whether ``args`` may skip the operator: no trace, no dispatch or function mode, no
    functorch transform, and every tensor a plain CUDA or CPU tensor (no fake, meta, functional
    or other subclass tensor, which a mode or a tracer may be watching)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or \
            torch._C._is_torch_function_mode_enabled():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    for a in args:
        if isinstance(a, (list, tuple)):
            if not eager_ok_tensors(a):
                return False
        elif isinstance(a, torch.Tensor) and not eager_ok_tensors((a,)):
            return False
    return True


def eager_ok_tensors(tensors) -> bool:
    for t in tensors:
        if type(t) not in _PLAIN or t.device.type == "meta":
            return False
    return True


def _needs_grad(args) -> bool:
    if not torch.is_grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
            return True
    return False


class _Function(torch.autograd.Function):
    """The operator's registered autograd formula, without the operator: ``forward(ctx, op, spec,
    *flat)`` where ``spec`` rebuilds the operator's arguments from ``flat``."""

    @staticmethod
    def forward(ctx, op, spec, *flat):
        args = _unflatten(spec, flat)
        output = op.body(*args)
        op.setup(ctx, args, output)
        ctx._tylopy_op, ctx._tylopy_spec = op, spec
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        op, spec = ctx._tylopy_op, ctx._tylopy_spec  # (kept: retain_graph may run it again)
        result = op.backward(ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        flat = []
        for (kind, n), g in zip(spec, result):
            if kind == "list":
                flat += [None] * n if g is None else list(g)
            else:
                flat.append(g)
        return (None, None, *flat)


def _flatten(args):
    spec, flat = [], []
    for a in args:
        if isinstance(a, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in a):
            spec.append(("list", len(a)))
            flat += a
        else:
            spec.append(("one", 1))
            flat.append(a)
    return tuple(spec), flat


def _unflatten(spec, flat):
    args, i = [], 0
    for kind, n in spec:
        if kind == "list":
            args.append(list(flat[i:i + n]))
            i += n
        else:
            args.append(flat[i])
            i += 1
    return args


class EagerOp:
    """Call ``op`` (a custom operator) or, where ``eager_ok``, its ``body`` directly; with autograd
    (``setup``, ``backward``: what was registered with ``op.register_autograd``) when an input
    requires a gradient. Without ``setup`` the operator has no autograd formula of its own (a
    backward operator): the body runs under no autograd either way."""

    def __init__(self, op, body, setup=None, backward=None):
        self.op, self.body, self.setup, self.backward = op, body, setup, backward

    def __call__(self, *args):
        if not eager_ok(args):
            return self.op(*args)
        if self.setup is not None and _needs_grad(args):
            spec, flat = _flatten(args)
            return _Function.apply(self, spec, *flat)
        return self.body(*args)


__all__ = ["EagerOp", "eager_ok"]
