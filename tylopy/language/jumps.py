"""Lowers ``return``, ``break`` and ``continue`` to flag variables before the control-flow rewrite.

A jump inside a run-time ``if`` or loop cannot leave a traced region, so each becomes an
assignment to a flag and every statement after it runs under a guard::

    for k in range(n):                      __tyf_brk_1 = False
        if x[k] < 0.0:                      for k in range(n):          # stops when __tyf_brk_1
            break                 ==>           if x[k] < 0.0:
        acc = acc + x[k]                            __tyf_brk_1 = True
                                                if __ty.not_any(__tyf_brk_1):
                                                    acc = acc + x[k]

``return v`` sets ``__tyf_ret`` and ``__tyf_rv`` and stops every enclosing loop; the function
ends with ``return __ty.finish_return(...)``. A loop with a break (or a return inside) carries
its flags and stops when one is true (``tracing.for_``/``while_`` take them as ``stop``), so a
run-time ``for`` with a break becomes an IR ``while``. On compile-time values the flags are
Python bools and everything runs as plain Python would. Functions without nested jumps are
left exactly as written.
"""
from __future__ import annotations

import ast
import itertools

from ..errors import KernelSourceError, SourceLoc

RET, RV = "__tyf_ret", "__tyf_rv"
FLAG_PREFIX = "__tyf_"
STOPS = "_ty_stops"  # attribute set on a rewritten loop node: names of the flags that end it
_counter = itertools.count()


_KEYWORD_WIDTH = {ast.For: 3, ast.While: 5, ast.If: 2, ast.With: 4, ast.Return: 6, ast.Break: 5, ast.Continue: 8,
                  ast.FunctionDef: 3}


def at(node, like):
    """Place a generated node on ``like``'s first line (a caret there spans the expression, or the
    statement's keyword when the statement spans several lines). Returns ``node``."""
    node.lineno = node.end_lineno = like.lineno
    node.col_offset = like.col_offset
    if getattr(like, "end_lineno", None) == like.lineno and like.end_col_offset is not None:
        node.end_col_offset = like.end_col_offset
    else:
        node.end_col_offset = like.col_offset + _KEYWORD_WIDTH.get(type(like), 1)
    return node


def _rt_call(attr: str, *args) -> ast.Call:
    func = ast.Attribute(value=ast.Name(id="__ty", ctx=ast.Load()), attr=attr, ctx=ast.Load())
    return ast.Call(func=func, args=list(args), keywords=[])


def _assign(name: str, value: ast.expr, like: ast.AST) -> ast.Assign:
    return at(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value), like)


def _guard(flags, body, like: ast.AST) -> ast.If:
    test = _rt_call("not_any", *[ast.Name(id=f, ctx=ast.Load()) for f in sorted(flags)])
    return at(ast.If(test=at(test, like), body=body, orelse=[]), like)


def _walk_local(node):
    """The nodes of ``node`` that belong to its function (not to nested defs or lambdas)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for c in ast.iter_child_nodes(n):
            if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(c)


def _has(stmts, kind) -> bool:
    """Does a loop body contain a ``kind`` (break or continue) of this loop? Those inside an inner
    loop's body belong to that loop; those in an inner loop's ``else`` still belong to this one."""
    def search(node) -> bool:
        if isinstance(node, kind):
            return True
        if isinstance(node, (ast.For, ast.While)):
            return any(search(x) for x in node.orelse)
        return any(search(c) for c in ast.iter_child_nodes(node)
                   if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))
    return any(search(s) for s in stmts)


def _nested_return(body) -> bool:
    """A return below the function's top statement list (inside an if, loop, with...)."""
    for s in body:
        if isinstance(s, ast.Return):
            continue
        if any(isinstance(n, ast.Return) for n in _walk_local(s)):
            return True
    return False


def always_returns(stmts) -> bool:
    """Does every path through ``stmts`` end in a return (as far as the syntax shows)?"""
    for s in stmts:
        if isinstance(s, ast.Return):
            return True
        if isinstance(s, ast.If) and always_returns(s.body) and always_returns(s.orelse):
            return True
        if isinstance(s, ast.With) and always_returns(s.body):
            return True
    return False


class _Loop:
    def __init__(self, brk: str | None, cont: str | None):
        self.brk, self.cont = brk, cont


class _Lowering:
    def __init__(self, filename: str, qualname: str, lower_return: bool):
        self.filename, self.qualname = filename, qualname
        self.lower_return = lower_return

    def error(self, node, message: str, hint: str):
        loc = SourceLoc(self.filename, node.lineno, node.col_offset, self.qualname,
                        getattr(node, "end_col_offset", None) or 0)
        raise KernelSourceError(message, loc, hint)

    def block(self, stmts, loop: _Loop | None) -> list:
        out = []
        for i, s in enumerate(stmts):
            new, flags, dead = self.stmt(s, loop)
            out.extend(new)
            if dead:
                return out  # an unconditional jump: Python never runs the rest either
            if flags:
                rest = self.block(stmts[i + 1:], loop)
                if rest:
                    out.append(_guard(flags, rest, stmts[i + 1]))
                return out
        return out

    def stmt(self, s, loop):
        """(new statements, flags they may set that must guard what follows, always jumps?)."""
        if isinstance(s, ast.Return):
            if not self.lower_return:
                return [s], set(), True
            value = s.value if s.value is not None else at(ast.Constant(None), s)
            return [_assign(RV, value, s), _assign(RET, at(ast.Constant(True), s), s)], {RET}, True
        if isinstance(s, (ast.Break, ast.Continue)):
            if loop is None:
                return [s], set(), True  # Python reports it as a SyntaxError when compiling
            flag = loop.brk if isinstance(s, ast.Break) else loop.cont
            return [_assign(flag, at(ast.Constant(True), s), s)], {flag}, True
        if isinstance(s, ast.If):
            s.body = self.block(s.body, loop) or [at(ast.Pass(), s)]
            s.orelse = self.block(s.orelse, loop)
            return [s], self._flags_set(s, loop), False
        if isinstance(s, (ast.For, ast.While)):
            return self.loop(s, loop)
        if isinstance(s, ast.With):
            s.body = self.block(s.body, loop)
            return [s], self._flags_set(s, loop), False
        if isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))) and any(
                isinstance(n, (ast.Return, ast.Break, ast.Continue)) for n in _walk_local(s)):
            self.error(s, "return, break and continue inside try are not supported in tylopy kernels",
                       "move the jump out of the try statement")
        if isinstance(s, ast.FunctionDef):
            lower_function(s, self.filename)
        return [s], set(), False

    def _flags_set(self, s, loop) -> set:
        flags = set()
        for n in _walk_local(s):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                name = n.targets[0].id
                if name == RET or (loop is not None and name in (loop.brk, loop.cont)):
                    flags.add(name)
        return flags

    def loop(self, s, outer: _Loop | None):
        has_break = _has(s.body, ast.Break)
        has_cont = _has(s.body, ast.Continue)
        has_ret = self.lower_return and any(isinstance(n, ast.Return) for b in s.body for n in _walk_local(b))
        n = next(_counter)
        me = _Loop(f"{FLAG_PREFIX}brk_{n}" if has_break else None, f"{FLAG_PREFIX}cont_{n}" if has_cont else None)
        body = self.block(s.body, me)
        if has_cont:
            body = [_assign(me.cont, at(ast.Constant(False), s), s)] + body
        s.body = body or [at(ast.Pass(), s)]
        stops = ([me.brk] if has_break else []) + ([RET] if has_ret else [])
        setattr(s, STOPS, stops)
        before = [_assign(me.brk, at(ast.Constant(False), s), s)] if has_break else []
        orelse = self.block(s.orelse, outer)
        s.orelse = []
        after = ([_guard(stops, orelse, s)] if stops else orelse) if orelse else []
        flags = {RET} if has_ret else set()
        if orelse:
            flags |= {f for a in orelse for f in self._flags_set(a, outer)}
        return before + [s] + after, flags, False


def lower_function(fdef: ast.FunctionDef, filename: str) -> ast.FunctionDef:
    """Lower the jumps of ``fdef`` (and of functions defined inside it) in place."""
    lower_return = _nested_return(fdef.body)
    low = _Lowering(filename, fdef.name, lower_return)
    body = low.block(fdef.body, None)
    if lower_return:
        first = fdef.body[0]
        always = at(ast.Constant(always_returns(fdef.body)), first)
        init = [_assign(RET, at(ast.Constant(False), first), first),
                _assign(RV, at(_rt_call("no_return"), first), first)]
        last = fdef.body[-1]
        ret = at(ast.Return(value=at(
            _rt_call("finish_return", ast.Name(id=RET, ctx=ast.Load()), ast.Name(id=RV, ctx=ast.Load()), always),
            last)), last)
        body = init + body + [ret]
    fdef.body = body or [at(ast.Pass(), fdef)]
    return fdef
