"""Just-in-time compilation: from a ``@ty.kernel`` and its arguments to a launch.

``kernel`` holds ``Kernel`` (binding arguments to parameters, specializing on constexprs and open
dtypes, tracing through ``tylopy.language``, lowering through ``tylopy.codegen``) and ``@ty.func``;
``compiled`` is a specialization with its PTX, resource report and launcher; ``launching`` is
``kernel[grid](...)`` and ``kernel[grid].repeat(...)``; ``options`` the compile options and their
environment; ``cache`` and ``cachefs`` the disk cache (keys from source, constexprs, options,
toolchain and the trace's reads; signed entries, bounded size); ``guards`` re-check, per launch,
the values a specialization's trace read (a changed global compiles again); ``autotune`` times
configurations once per key and keeps the winner on disk. The contract: a launch runs the
specialization whose trace read exactly the values in effect now, or raises an error naming the
argument or source line; nothing here defines what a kernel's source means.
"""
