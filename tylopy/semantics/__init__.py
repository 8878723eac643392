"""The CPU semantics shared by the tile library's reference mode and the emulator.

``scalar``: every scalar op (rounding, fma, ftz, approximations, integer division and shifts,
conversions); ``conversions``: 16-bit float packing; ``tensorcore``: the tensor cores' f32
accumulation as measured on an H200; ``warp``: votes, matches, ``redux`` and the butterfly
order of ``ty.warp_reduce``; ``atomics``: ``atom``/``red`` updates and their lane order;
``printf``: C formats of ``ty.printf``.
"""
