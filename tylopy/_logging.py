"""tylopy's log: the ``tylopy`` logger of the standard ``logging`` module, quiet by default.

Every module logs to a child of it (``tylopy.compile``, ``tylopy.autotune``, ``tylopy.emulate``):

* INFO: a compile that took a second or more (what was built, from where, how long), each
  autotuning candidate and the choice, an emulated launch (start, end, and progress every
  second or so of a long one);
* DEBUG: every compile and disk-cache load, every emulated block.

``TYLOPY_LOG=info`` or ``TYLOPY_LOG=debug`` (read when tylopy is imported) prints these to
stderr as ``tylopy: ...`` lines; ``configure(level)`` does the same from Python, and an
application that configures ``logging`` itself sees them through its own handlers without either.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

LOGGER = "tylopy"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_OFF = ("", "0", "off", "none", "quiet")

logger = logging.getLogger(LOGGER)
logger.addHandler(logging.NullHandler())  # a library's default: nothing printed unless asked for
_handler: logging.Handler | None = None


def configure(level: str | int | None) -> None:
    """Print tylopy's log at ``level`` ("debug", "info", "warning", "error", or a ``logging`` level)
    to stderr; None or "off" stops printing it (back to the default: only what the
    application's own logging configuration shows)."""
    global _handler
    if isinstance(level, str):
        name = level.strip().lower()
        if name not in LEVELS and name not in _OFF:
            raise ValueError(f"TYLOPY_LOG expects one of {', '.join([*LEVELS, 'off'])}, but got {level!r}")
        level = None if name in _OFF else LEVELS[name]
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    if level is None:
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        return
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("tylopy: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(level)
    logger.propagate = False  # printed here; the application's handlers would print it twice


def configure_from_environment() -> None:
    """Apply ``TYLOPY_LOG`` (a bad value warns and leaves the log quiet: importing must not fail)."""
    value = os.environ.get("TYLOPY_LOG")
    if value is None:
        return
    try:
        configure(value)
    except ValueError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=3)
