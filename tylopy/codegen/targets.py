"""The targets tylopy compiles for, and the PTX ISA version each is emitted with."""

# sm_90a needs PTX 8.0+; 8.5 is what LLVM 22 emits and driver 580 loads.
PTX_FEATURES = {"sm_90a": "+ptx85", "sm_90": "+ptx85", "sm_80": "+ptx85", "sm_86": "+ptx85", "sm_89": "+ptx85"}
SUPPORTED_ARCHS = tuple(PTX_FEATURES)

# The most shared memory (static + dynamic, bytes) one block may use on each target, after the
# dynamic-size opt-in: the CUDA C++ Programming Guide's table of compute capabilities (227 KB on
# 9.0, 163 KB on 8.0, 99 KB on 8.6 and 8.9). A kernel asking for more could never launch.
SHARED_MEMORY_PER_BLOCK = {"sm_90a": 232448, "sm_90": 232448, "sm_80": 166912, "sm_86": 101376, "sm_89": 101376}


def arch_for_capability(major: int, minor: int) -> str | None:
    """The target to compile for on a device of compute capability (major, minor), if tylopy has one."""
    if (major, minor) == (9, 0):
        return "sm_90a"
    name = f"sm_{major}{minor}"
    return name if name in PTX_FEATURES else None


def family(arch: str) -> tuple[int, int]:
    """(major, minor) of an arch name such as sm_90a."""
    digits = arch[3:].rstrip("a")
    return int(digits[:-1]), int(digits[-1])
