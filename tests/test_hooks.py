"""``ty.observe``: the compiles and launches a block made, launches of prepared plans included, seen
without patching anything (the launches go to the fake driver of ``tylopy.testing``)."""
import torch

import tylopy as ty
from tylopy.testing import on_device
from tylopy_kernels.examples.vector_add import vector_add


def fresh(kernel):
    return ty.Kernel(kernel.fn, kernel.threads, kernel.arch, kernel.min_blocks_per_sm, kernel.max_registers,
                     kernel.name, _register=False)


def vectors(n=1000):
    return [on_device(torch.randn(n)) for _ in range(3)]


def test_launches_of_every_path_are_observed(fake):
    k = fresh(vector_add)
    x, y, out = vectors()
    with ty.observe() as events:
        k[(4,)](x, y, out, 1000)
        run = k[(2,)].prepare(x, y, out, 1000)
        run.launch()
        run.launch()
    launches = [e for e in events if e.kind == "launch"]
    assert [(e.kernel, e.grid, e.prepared) for e in launches] == [
        ("vector_add", (4, 1, 1), False), ("vector_add", (2, 1, 1), True), ("vector_add", (2, 1, 1), True)]
    assert len(fake.launches) == 3 and all(e.device == 0 for e in launches)


def test_compiles_say_where_the_specialization_came_from(cache_dir):
    with ty.observe() as events:
        fresh(vector_add).compile()
        fresh(vector_add).compile()  # a new kernel object: from the disk cache
        k = fresh(vector_add)
        k.compile()
        k.compile()  # the same object: from its memory, no event
    assert [(e.kind, e.source) for e in events] == [("compile", "build"), ("compile", "disk"), ("compile", "disk")]
    assert events[0].kernel == "vector_add" and events[0].seconds > 0


def test_observers_nest_and_close():
    with ty.observe() as outer:
        with ty.observe() as inner:
            ty.runtime.hooks.emit("x")
        ty.runtime.hooks.emit("y")
    ty.runtime.hooks.emit("z")
    assert outer == ["x", "y"] and inner == ["x"]
    assert not ty.runtime.hooks._observers
