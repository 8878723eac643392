"""The kernel language: what a kernel's source means while it is traced.

``rewrite`` turns a kernel's Python source into traceable form (run-time ``if``/``for``/``while``,
``break``/``continue``/``return`` under run-time conditions, ``jumps``); ``tracing`` is the one
implementation of that control flow; ``builder`` appends IR ops at the user's source lines;
``proxy.RuntimeValue`` gives run-time values Python's operators; ``lang`` and the instruction
modules (``elementwise``, ``matrix``, ``warp``, ``atomics``, ``async_copy``, ``hopper``, ``cluster``,
``fp8``, ``debug``, ``derivative``) are the ``ty.*`` functions, each checking its arguments and
emitting IR; ``tensor`` is ``ty.tensor`` parameters; ``capture`` records what a trace reads from
outside the kernel (globals, closures, module attributes) and fingerprints it by value;
``diagnostics`` places errors at the user's line. The contract: tracing a kernel with given
arguments and constexprs yields verified IR and the list of reads it depended on, and nothing
else: no compile, no cache, no device (those are ``tylopy.jit``'s).
"""
