"""The CUDA driver side: context shared with torch, module loading, tensor maps, launches.

Nothing here is imported until a kernel is launched, so compiling, dumping and emulating work
on machines without the NVIDIA driver.
"""
