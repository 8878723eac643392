"""Kernels written in tylopy, and the functions built from them (tylopy.attention, tylopy.matmul, ...).

tylopy is imported first, whichever module of this package is asked for: tylopy's own __init__
imports the entry points and operators defined here last (tylopy/functions.py), so starting from
tylopy is the one order in which every module below finds tylopy's namespace complete and no
module of this package half-initialized.
"""
import tylopy  # noqa: F401
