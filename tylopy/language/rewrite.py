"""Rewrites a kernel's Python source so that ``if``, ``for`` and ``while`` can take run-time values.

Each statement becomes a call into ``tylopy.tracing`` with its body as a nested function that
receives and returns the names the body assigns (the loop-carried or merged values)::

    for k in range(n_tiles):            def __ty_for_7(k, acc):
        acc = acc + x[k]        ==>         acc = acc + x[k]
                                            return (acc,)
                                        (acc,) = __ty.for_(range(n_tiles), __ty_for_7, ('acc',),
                                                           (__ty.lookup(locals(), 'acc'),))

At trace time ``for_``/``if_``/``while_`` run the body as plain Python when the condition or the
bounds are compile-time values (unrolling), and build an IR region otherwise. ``return``,
``break`` and ``continue`` are first lowered to flag variables (``jumps.py``), so they work
under run-time conditions too. A name whose list elements or attributes are assigned in a body
(``acc[i] = ...``) is carried like a rebound name when it holds a list, tuple, dict or tile
object; pointers stored through (``out[i] = ...``) are not carried.

Column offsets stay those of the user's file (the dedent is undone), so an error's caret sits
under the expression that raised it.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import itertools
import linecache
import os
import textwrap

from ..errors import KernelSourceError, SourceLoc
from . import capture, jumps

_counter = itertools.count()
RT = "__ty"  # the name under which the rewritten code sees tylopy.tracing
TRACED_PREFIX = "__ty_fn_"  # the rewritten function is __ty_fn_<n>_<original name>
LOCALS = "__ty_locals"  # Python's locals() under a reserved name (a user's `locals` must not break the rewrite)
TRACED_BUILTINS = ("range", "min", "max")  # tylopy's versions stand in for these builtins in kernel code


def _generated(name: str) -> bool:
    """Names the rewrite makes for its own functions and loop indices (never carried)."""
    return name.startswith("__ty_") or name == RT


def _carried_only_mutated(node) -> set:
    """For ``(a, b) = __ty.if_(..., mutated=('b',))`` made by an inner rewrite: the names that the
    inner statement only stores through (they stay "mutated", not rebound, for the outer one)."""
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
        return set()
    func = node.value.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == RT):
        return set()
    for kw in node.value.keywords:
        if kw.arg == "mutated" and isinstance(kw.value, ast.Tuple):
            return {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
    return set()


def _assigned_names(stmts) -> list[str]:
    names: list[str] = []

    class V(ast.NodeVisitor):
        def visit_Assign(self, node):
            skip = _carried_only_mutated(node)
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id not in skip:
                        self.visit_Name(n)
            self.visit(node.value)

        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Store) and not _generated(node.id) and node.id not in names:
                names.append(node.id)

        def visit_FunctionDef(self, node):  # a def binds its name, its body is another scope
            if not _generated(node.name) and node.name not in names:
                names.append(node.name)

        def visit_Lambda(self, node):
            pass

        def visit_comprehension(self, node):
            self.visit(node.iter)

        def visit_ListComp(self, node):
            for g in node.generators:
                self.visit(g.iter)

        visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    for s in stmts:
        V().visit(s)
    return names


def _mutated_names(stmts) -> list[str]:
    """Names whose elements or attributes are assigned (``acc[i] = v``, ``st.m = v``, ``acc[i] += v``),
    also inside statements an inner rewrite already turned into calls."""
    names: list[str] = []
    for s in stmts:
        for node in ast.walk(s):
            for n in sorted(_carried_only_mutated(node)):
                if n not in names:
                    names.append(n)
            if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                base = node.value
                while isinstance(base, (ast.Subscript, ast.Attribute)):
                    base = base.value
                if isinstance(base, ast.Name) and not _generated(base.id) and base.id not in names:
                    names.append(base.id)
    return names


def _body_names(stmts, exclude=()) -> tuple[list[str], list[str]]:
    """(every name the body rebinds or mutates, the ones it only mutates)."""
    assigned = [n for n in _assigned_names(stmts) if n not in exclude]
    mutated = [n for n in _mutated_names(stmts) if n not in assigned and n not in exclude]
    return assigned + mutated, mutated


def _has_jump(stmts) -> bool:
    class V(ast.NodeVisitor):
        found = False

        def visit_Return(self, node):
            self.found = True

        def visit_Break(self, node):
            self.found = True

        def visit_Continue(self, node):
            self.found = True

        def visit_FunctionDef(self, node):
            pass

        def visit_For(self, node):  # break/continue inside an inner loop belong to it
            for s in node.body + node.orelse:
                if any(isinstance(n, ast.Return) for n in ast.walk(s)):
                    self.found = True

        visit_While = visit_For

    v = V()
    for s in stmts:
        v.visit(s)
    return v.found


def _rt(attr: str) -> ast.expr:
    return ast.Attribute(value=ast.Name(id=RT, ctx=ast.Load()), attr=attr, ctx=ast.Load())


def _tuple(names, ctx) -> ast.Tuple:
    return ast.Tuple(elts=[ast.Name(id=n, ctx=ctx()) for n in names], ctx=ctx())


def _lookups(names) -> ast.Tuple:
    locals_call = ast.Call(func=ast.Name(id=LOCALS, ctx=ast.Load()), args=[], keywords=[])
    return ast.Tuple(elts=[ast.Call(func=_rt("lookup"), args=[locals_call, ast.Constant(n)], keywords=[])
                           for n in names], ctx=ast.Load())


def _func(name, params, body, names) -> ast.FunctionDef:
    ret = ast.Return(value=_tuple(names, ast.Load))
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], vararg=None,
                         kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    return ast.FunctionDef(name=name, args=args, body=list(body) + [ret], decorator_list=[],
                           returns=None, type_params=[])


def _keywords(mutated, stops) -> list[ast.keyword]:
    kws = []
    if mutated:
        kws.append(ast.keyword(arg="mutated", value=ast.Tuple([ast.Constant(n) for n in mutated], ast.Load())))
    if stops:
        kws.append(ast.keyword(arg="stop", value=ast.Tuple([ast.Constant(n) for n in stops], ast.Load())))
    return kws


def _names_tuple(names) -> ast.Tuple:
    return ast.Tuple([ast.Constant(n) for n in names], ast.Load())


class _Rewriter(ast.NodeTransformer):
    def _fresh(self, kind: str) -> str:
        return f"__ty_{kind}_{next(_counter)}"

    def _call_stmt(self, names, call) -> ast.stmt:
        if names:
            return ast.Assign(targets=[_tuple(names, ast.Store)], value=call)
        return ast.Expr(value=call)

    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        if _has_jump(node.body + node.orelse):
            return node
        names, mutated = _body_names(node.body + node.orelse)
        then_name, else_name = self._fresh("then"), self._fresh("else")
        then_fn = _func(then_name, names, node.body, names)
        else_fn = _func(else_name, names, node.orelse or [ast.Pass()], names)
        call = ast.Call(func=_rt("if_"), args=[node.test, ast.Name(then_name, ast.Load()), ast.Name(else_name, ast.Load()),
                                               _names_tuple(names), _lookups(names)],
                        keywords=_keywords(mutated, ()))
        out = [then_fn, else_fn, self._call_stmt(names, call)]
        for s in out:
            jumps.at(s, node)
        return out

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        if node.orelse or _has_jump(node.body) or not isinstance(node.target, (ast.Name, ast.Tuple)):
            return node
        target_names = _assigned_names([ast.Assign(targets=[node.target], value=ast.Constant(0))])
        names, mutated = _body_names(node.body, exclude=target_names)
        body_name = self._fresh("for")
        iv = self._fresh("iv")
        body = [ast.Assign(targets=[node.target], value=ast.Name(iv, ast.Load()))] + node.body
        jumps.at(body[0], node)
        fn = _func(body_name, [iv] + names, body, names)
        it = node.iter  # (a range call is already tylopy's: visit_Call)
        call = ast.Call(func=_rt("for_"), args=[it, ast.Name(body_name, ast.Load()), _names_tuple(names),
                                                _lookups(names)],
                        keywords=_keywords(mutated, getattr(node, jumps.STOPS, ())))
        out = [fn, self._call_stmt(names, call)]
        for s in out:
            jumps.at(s, node)
        return out

    def visit_Assert(self, node: ast.Assert):
        """``assert c, msg`` checks ``c`` at trace time; a run-time ``c`` is an error naming ty.device_assert."""
        args = [node.test] + ([node.msg] if node.msg is not None else [])
        call = jumps.at(ast.Call(func=_rt("assert_"), args=args, keywords=[]), node.test)
        return jumps.at(ast.Expr(value=call), node)

    def visit_While(self, node: ast.While):
        self.generic_visit(node)
        if node.orelse or _has_jump(node.body):
            return node
        names, mutated = _body_names(node.body)
        cond_name, body_name = self._fresh("wcond"), self._fresh("wbody")
        cond_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in names], vararg=None,
                                  kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        cond_fn = ast.FunctionDef(name=cond_name, args=cond_args, body=[ast.Return(value=node.test)],
                                  decorator_list=[], returns=None, type_params=[])
        body_fn = _func(body_name, names, node.body, names)
        call = ast.Call(func=_rt("while_"), args=[ast.Name(cond_name, ast.Load()), ast.Name(body_name, ast.Load()),
                                                  _names_tuple(names), _lookups(names)],
                        keywords=_keywords(mutated, getattr(node, jumps.STOPS, ())))
        out = [cond_fn, body_fn, self._call_stmt(names, call)]
        for s in out:
            jumps.at(s, node)
        return out


def source_of(fn) -> tuple[str, str]:
    """(source, file name) of ``fn`` as the file has it; a clear error when Python kept no source."""
    if getattr(fn, "__wrapped__", None) is not None:
        inner = inspect.unwrap(fn)
        code = getattr(inner, "__code__", None)
        loc = _def_line(inner) if code else None
        raise KernelSourceError(
            f"{fn.__qualname__!r} is a wrapper made by another decorator (it has __wrapped__); tylopy traces the "
            "source of the function it is given, so the wrapper's behaviour would be lost", loc,
            hint="put @ty.kernel / @ty.func directly above the def (other decorators may go above it)")
    try:
        filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
        if filename and os.path.isfile(filename):
            linecache.cache.pop(filename, None)  # the file as it is now (an edit may keep size and mtime)
        lines, _ = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        where = getattr(getattr(fn, "__code__", None), "co_filename", "?")
        raise KernelSourceError(
            f"tylopy cannot read the source of {fn.__qualname__!r} (defined in {where}): it rewrites a kernel's "
            "source to trace run-time if/for/while", None,
            hint="define kernels and @ty.func helpers in a .py file and import or run it (not in a REPL, "
                 "`python -` or exec of a string)") from None
    return "".join(lines), filename


def _def_line(fn) -> SourceLoc:
    """The ``def`` line of ``fn`` (its code's first line is that of its first decorator)."""
    code = fn.__code__
    try:
        lines, start = inspect.getsourcelines(fn)
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("def ", "async def ")):
                col = len(line) - len(line.lstrip())
                return SourceLoc(code.co_filename, start + i, col, fn.__name__, col + 3)
    except (OSError, TypeError):
        pass
    return SourceLoc(code.co_filename, code.co_firstlineno, 0, fn.__name__)


def _parse(fn, src: str, filename: str) -> ast.FunctionDef:
    """The function's AST with the line numbers and columns of its file."""
    dedented = textwrap.dedent(src)
    indent = len(src.splitlines()[0]) - len(dedented.splitlines()[0])
    tree = ast.parse(dedented)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    if indent:
        for node in ast.walk(tree):
            if hasattr(node, "col_offset"):
                node.col_offset += indent
                if getattr(node, "end_col_offset", None) is not None:
                    node.end_col_offset += indent
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise KernelSourceError(f"tylopy can only trace plain functions (def), but {fn.__qualname__!r} is a "
                                f"{type(fdef).__name__}", SourceLoc(filename, fdef.lineno, fdef.col_offset))
    for node in ast.walk(fdef):
        name = node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else None
        if name is not None and name.startswith("__ty"):
            raise KernelSourceError(
                f"the name {name!r} is reserved for tylopy's rewritten code, but {fn.__qualname__!r} uses it",
                SourceLoc(filename, node.lineno, node.col_offset, fn.__name__, node.end_col_offset or 0),
                hint="rename it (names starting with '__ty' are tylopy's)")
    return fdef


class Traceable:
    """A kernel or ``@ty.func`` body rewritten for tracing.

    ``make()`` gives the function to call for one trace: it is built from the current values of
    the original's closure variables (so rebinding one is seen), and its global lookups go
    through ``RecordingGlobals`` (so the trace records what it read).
    """

    def __init__(self, fn, factory, record_closure: bool, source_digest: str = ""):
        self.fn = fn
        self.factory = factory
        self.record_closure = record_closure
        self.source_digest = source_digest  # of the text this was rewritten from (part of the cache key)

    def make(self, runtime_module):
        fn = self.fn
        cells = []
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                raise KernelSourceError(f"{fn.__qualname__!r} uses the closure variable {name!r} before it is "
                                        "assigned", None) from None
            if self.record_closure:
                value = capture.note_closure(name, value)
            cells.append(value)
        new_fn = self.factory(runtime_module, *cells)
        new_fn.__defaults__ = fn.__defaults__
        new_fn.__kwdefaults__ = fn.__kwdefaults__
        return new_fn


def _matches(fdef: ast.FunctionDef, fn) -> bool:
    """Is the parsed ``def`` the one Python compiled ``fn`` from (name and parameters)?"""
    code = fn.__code__
    a = fdef.args
    return (fdef.name == code.co_name and len(a.posonlyargs) + len(a.args) == code.co_argcount
            and len(a.kwonlyargs) == code.co_kwonlyargcount)


def _parsed_source(fn) -> tuple[ast.FunctionDef, str, str]:
    """(the function's ``def`` as its file has it now, the file name, the digest of that text); a
    ``def`` that no longer matches the loaded code (name, parameters) is an error that says so."""
    for attempt in range(2):
        src, filename = source_of(fn)
        fdef = _parse(fn, src, filename)
        if _matches(fdef, fn):
            return fdef, filename, hashlib.sha256(src.encode()).hexdigest()[:16]
        linecache.checkcache(filename)
    raise KernelSourceError(
        f"the source of {fn.__qualname__!r} in {filename} does not match the code Python loaded (the file changed "
        "after it was imported?)", None, hint="re-import the module (or restart) after editing a kernel's file")


def rewrite_function(fn, record_closure: bool = False) -> Traceable:
    """Rewrite ``fn``'s source so that its control flow can be traced (see ``Traceable``)."""
    fdef, filename, digest = _parsed_source(fn)
    fdef.decorator_list = []
    fdef.returns = None
    for a in fdef.args.args + fdef.args.kwonlyargs + fdef.args.posonlyargs:
        a.annotation = None
    jumps.lower_function(fdef, filename)
    fdef = _Rewriter().visit(fdef)
    # The traced function must not bind its own name in the factory: a recursive call (or one
    # through a closure variable of that name) has to reach the @ty.func wrapper, as in the original.
    fdef.name = f"{TRACED_PREFIX}{next(_counter)}_{fn.__name__}"
    freevars = fn.__code__.co_freevars
    factory_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=RT)] + [ast.arg(arg=v) for v in freevars],
                                 vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    factory = ast.FunctionDef(name="__ty_factory", args=factory_args,
                              body=[fdef, ast.Return(value=ast.Name(fdef.name, ast.Load()))],
                              decorator_list=[], returns=None, type_params=[])
    jumps.at(factory, fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec")
    namespace: dict = {}
    exec(code, capture.RecordingGlobals(fn.__globals__, _kernel_builtins()), namespace)
    return Traceable(fn, namespace["__ty_factory"], record_closure, digest)


def _kernel_builtins() -> dict:
    """The builtins of rewritten code: Python's, with tylopy's ``range``/``min``/``max``. They are
    found only where Python would find a builtin, so a parameter, local, closure variable or module
    global of the same name (bound before or after the kernel was defined) wins, as in Python."""
    from . import tracing
    names = dict(vars(builtins))
    names.update({n: getattr(tracing, n) for n in TRACED_BUILTINS})
    names[LOCALS] = builtins.locals
    return names
