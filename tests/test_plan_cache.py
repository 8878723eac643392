"""The one bounded cache type of per-call plans, and ``tylopy.clear_caches()``."""
import pytest

import tylopy as ty
from tylopy.runtime import plancache, tensormap
from tylopy_kernels.examples.vector_add import vector_add


def test_least_recently_used_entries_leave_first():
    c = ty.PlanCache("test", capacity=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recent
    c.put("c", 3)
    assert "b" not in c and c.get("a") == 1 and c.get("c") == 3 and len(c) == 2


def test_unhashable_keys_miss_instead_of_raising():
    c = ty.PlanCache("test")
    assert c.get([1, 2]) is None and c.get("absent", 7) == 7


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "8"])
def test_capacity_must_be_a_positive_int(capacity):
    with pytest.raises(ValueError, match="capacity expects a positive int"):
        ty.PlanCache("test", capacity=capacity)


def test_clear_caches_empties_plans_maps_and_compiled_kernels():
    c = ty.PlanCache("test")
    c.put("k", object())
    tensormap._cache["probe"] = object()
    vector_add.compile()
    assert vector_add._compiled
    ty.clear_caches()
    assert len(c) == 0 and "probe" not in tensormap._cache and not vector_add._compiled
    assert ("test", 0, 256) in plancache.caches()
