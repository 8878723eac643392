"""The targets tylopy compiles for, and the PTX ISA version each is emitted with."""

# sm_90a needs PTX 8.0+; 8.5 is what LLVM 22 emits and driver 580 loads.
PTX_FEATURES = {"sm_90a": "+ptx85", "sm_90": "+ptx85", "sm_80": "+ptx85", "sm_86": "+ptx85", "sm_89": "+ptx85"}
SUPPORTED_ARCHS = tuple(PTX_FEATURES)


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
