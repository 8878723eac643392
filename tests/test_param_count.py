"""The rule "no function over 8 parameters outside kernel signatures" in tylopy/: the functions over
the limit are exactly those of tools/params_allowlist.txt, none with more parameters than listed
(tools/count_params.py, read with ast)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import count_params as cp  # noqa: E402

ALLOWLIST = os.path.join(ROOT, "tools", "params_allowlist.txt")


def test_tylopy_functions_stay_within_eight_parameters():
    problems = cp.compare(cp.over_limit(["tylopy"]), cp.read_allowlist(ALLOWLIST))
    assert not problems, "\n".join(problems)


def test_the_count_sees_kernels_methods_and_nested_functions(tmp_path):
    src = '''
import tylopy as ty
@ty.kernel(threads=32)
def k(a, b, c, d, e, f, g, h, i): pass
@ty.func
def f(a, b, c, d, e, f, g, h, i): pass
def plain(a, b, c, d, e, f, g, h, *args, **kw): pass
class C:
    def method(self, a, b, c, d, e, f, g, h): pass
    @staticmethod
    def static(self, a, b, c, d, e, f, g, h): pass
def outer():
    def inner(a, b, c, d, e, f, g, h, *, i): pass
'''
    (tmp_path / "m.py").write_text(src)
    found = cp.over_limit(["m.py"], root=str(tmp_path))
    assert {n: c for n, (c, _) in found.items()} == {"m.py::plain": 10, "m.py::C.static": 9,
                                                      "m.py::outer.<locals>.inner": 9}
    assert cp.compare(found, {"m.py::plain": 10, "m.py::C.static": 8, "m.py::gone": 9}) == [
        "m.py::C.static (line 11) takes 9 parameters, 8 on the allowlist",
        "m.py::outer.<locals>.inner (line 13) takes 9 parameters; the limit is 8 outside kernel signatures "
        "(group related ones into a dataclass)",
        "m.py::gone is on the allowlist but no longer over the limit: delete its line"]
