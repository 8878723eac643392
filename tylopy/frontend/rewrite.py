"""Rewrites a kernel's Python source so that ``if``, ``for`` and ``while`` can take run-time values.

Each statement becomes a call into ``tylopy.tracing`` with its body as a nested function that
receives and returns the names the body assigns (the loop-carried or merged values)::

    for k in range(n_tiles):            def __ty_for_7(k, acc):
        acc = acc + x[k]        ==>         acc = acc + x[k]
                                            return (acc,)
                                        (acc,) = __ty.for_(range(n_tiles), __ty_for_7, ('acc',),
                                                           (__ty.lookup(locals(), 'acc'),))

At trace time ``for_``/``if_``/``while_`` run the body as plain Python when the condition or the
bounds are compile-time values (unrolling), and build an IR region otherwise. Statements that
contain ``return``, ``break`` or ``continue`` are left alone: they keep Python's meaning and
work on compile-time values only (a run-time condition there raises an error at its line).
"""
from __future__ import annotations

import ast
import inspect
import itertools
import textwrap

from ..errors import KernelSourceError
from . import capture

_counter = itertools.count()
RT = "__ty"  # the name under which the rewritten code sees tylopy.tracing


def _assigned_names(stmts) -> list[str]:
    names: list[str] = []

    class V(ast.NodeVisitor):
        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Store) and not node.id.startswith("__ty") and node.id not in names:
                names.append(node.id)

        def visit_FunctionDef(self, node):  # a def binds its name, its body is another scope
            if not node.name.startswith("__ty") and node.name not in names:
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
    locals_call = ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[])
    return ast.Tuple(elts=[ast.Call(func=_rt("lookup"), args=[locals_call, ast.Constant(n)], keywords=[])
                           for n in names], ctx=ast.Load())


def _func(name, params, body, names) -> ast.FunctionDef:
    ret = ast.Return(value=_tuple(names, ast.Load))
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], vararg=None,
                         kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    return ast.FunctionDef(name=name, args=args, body=list(body) + [ret], decorator_list=[],
                           returns=None, type_params=[])


class _Rewriter(ast.NodeTransformer):
    def _fresh(self, kind: str) -> str:
        return f"__ty_{kind}_{next(_counter)}"

    def _call_stmt(self, node, names, call) -> list[ast.stmt]:
        if names:
            target = _tuple(names, ast.Store)
            stmt = ast.Assign(targets=[target], value=call)
        else:
            stmt = ast.Expr(value=call)
        return stmt

    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        if _has_jump(node.body + node.orelse):
            return node
        names = _assigned_names(node.body + node.orelse)
        then_name, else_name = self._fresh("then"), self._fresh("else")
        then_fn = _func(then_name, names, node.body, names)
        else_fn = _func(else_name, names, node.orelse or [ast.Pass()], names)
        call = ast.Call(func=_rt("if_"), args=[node.test, ast.Name(then_name, ast.Load()), ast.Name(else_name, ast.Load()),
                                               ast.Tuple([ast.Constant(n) for n in names], ast.Load()), _lookups(names)],
                        keywords=[])
        out = [then_fn, else_fn, self._call_stmt(node, names, call)]
        for s in out:
            ast.copy_location(s, node)
        return out

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        if node.orelse or _has_jump(node.body) or not isinstance(node.target, (ast.Name, ast.Tuple)):
            return node
        target_names = _assigned_names([ast.Assign(targets=[node.target], value=ast.Constant(0))])
        names = [n for n in _assigned_names(node.body) if n not in target_names]
        body_name = self._fresh("for")
        iv = self._fresh("iv")
        body = [ast.Assign(targets=[node.target], value=ast.Name(iv, ast.Load()))] + node.body
        for s in body[:1]:
            ast.copy_location(s, node)
        fn = _func(body_name, [iv] + names, body, names)
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            it = ast.Call(func=_rt("range"), args=it.args, keywords=it.keywords)
        call = ast.Call(func=_rt("for_"), args=[it, ast.Name(body_name, ast.Load()),
                                                ast.Tuple([ast.Constant(n) for n in names], ast.Load()), _lookups(names)],
                        keywords=[])
        out = [fn, self._call_stmt(node, names, call)]
        for s in out:
            ast.copy_location(s, node)
        return out

    def visit_While(self, node: ast.While):
        self.generic_visit(node)
        if node.orelse or _has_jump(node.body):
            return node
        names = _assigned_names(node.body)
        cond_name, body_name = self._fresh("wcond"), self._fresh("wbody")
        cond_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in names], vararg=None,
                                  kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        cond_fn = ast.FunctionDef(name=cond_name, args=cond_args, body=[ast.Return(value=node.test)],
                                  decorator_list=[], returns=None, type_params=[])
        body_fn = _func(body_name, names, node.body, names)
        call = ast.Call(func=_rt("while_"), args=[ast.Name(cond_name, ast.Load()), ast.Name(body_name, ast.Load()),
                                                  ast.Tuple([ast.Constant(n) for n in names], ast.Load()), _lookups(names)],
                        keywords=[])
        out = [cond_fn, body_fn, self._call_stmt(node, names, call)]
        for s in out:
            ast.copy_location(s, node)
        return out


def source_of(fn) -> tuple[str, str]:
    """(dedented source, file name) of ``fn``; a clear error when Python kept no source for it."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError):
        where = getattr(fn.__code__, "co_filename", "?")
        raise KernelSourceError(
            f"tylopy cannot read the source of {fn.__qualname__!r} (defined in {where}): it rewrites a kernel's "
            "source to trace run-time if/for/while", None,
            hint="define kernels and @ty.func helpers in a .py file (not in a REPL, `python -` or exec)") from None
    return src, filename


class Traceable:
    """A kernel or ``@ty.func`` body rewritten for tracing.

    ``make()`` gives the function to call for one trace: it is built from the current values of
    the original's closure variables (so rebinding one is seen), and its global lookups go
    through ``RecordingGlobals`` (so the trace records what it read).
    """

    def __init__(self, fn, factory, record_closure: bool):
        self.fn = fn
        self.factory = factory
        self.record_closure = record_closure

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


def rewrite_function(fn, record_closure: bool = False) -> Traceable:
    """Rewrite ``fn``'s source so that its control flow can be traced (see ``Traceable``)."""
    src, filename = source_of(fn)
    first_line = fn.__code__.co_firstlineno
    tree = ast.parse(src)
    ast.increment_lineno(tree, first_line - 1)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise KernelSourceError(f"tylopy can only trace plain functions (def), but {fn.__qualname__!r} is a "
                                f"{type(fdef).__name__}", None)
    fdef.decorator_list = []
    fdef.returns = None
    for a in fdef.args.args + fdef.args.kwonlyargs + fdef.args.posonlyargs:
        a.annotation = None
    fdef = _Rewriter().visit(fdef)
    freevars = fn.__code__.co_freevars
    factory_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=RT)] + [ast.arg(arg=v) for v in freevars],
                                 vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    factory = ast.FunctionDef(name="__ty_factory", args=factory_args,
                              body=[fdef, ast.Return(value=ast.Name(fdef.name, ast.Load()))],
                              decorator_list=[], returns=None, type_params=[])
    ast.copy_location(factory, fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec")
    namespace: dict = {}
    exec(code, capture.RecordingGlobals(fn.__globals__), namespace)
    return Traceable(fn, namespace["__ty_factory"], record_closure)
