"""``tylopy check NAME [ARGS...]``: run ``tylopy_kernels.check_NAME.main(ARGS)``.

Each checker module owns its cases, references and output; it prints one line per case and a
summary, and returns the exit status (0: all passed). This file only finds it.
"""
import importlib
import pkgutil
import sys

_PACKAGE = __name__.rpartition(".")[0] or "tylopy_kernels"


def available() -> list:
    """The NAMEs that have a ``check_NAME`` module beside this one."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name[len("check_"):] for m in pkgutil.iter_modules([here]) if m.name.startswith("check_"))


def run(name: str, argv) -> int:
    """Dispatch ``name`` to ``check_<name>.main(argv)``; 2 (with a message) for an unknown name."""
    if not isinstance(name, str) or not name.isidentifier():
        print(f"tylopy check: NAME expects a checker name such as 'streaming_attention', but got {name!r}",
              file=sys.stderr)
        return 2
    module_name = f"{_PACKAGE}.check_{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        print(f"tylopy check: no checker {name!r} (no module {module_name}); available: "
              f"{', '.join(available()) or 'none'}", file=sys.stderr)
        return 2
    main = getattr(module, "main", None)
    if main is None:
        print(f"tylopy check: {module_name} has no main(argv)", file=sys.stderr)
        return 2
    rc = main(list(argv))
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
