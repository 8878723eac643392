"""The SASS loop counter of the Hopper attention (tylopy_kernels/attention/bench/sass_profile.py): parsing on a
hand-written disassembly, and on the real kernel where ptxas and nvdisasm are installed."""
import pytest

from tylopy_kernels.attention.bench import sass_profile as S

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;
.L_x_1:
        /*0020*/                   FFMA R2, R3, R4, R5 ;
        /*0030*/                   MUFU.EX2 R2, R2 ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R88, R56, gdesc[UR8], R88 ;
        /*0050*/              @!P0 BRA `(.L_x_1) ;
        /*0060*/                   SHFL.BFLY PT, R6, R2, 0x1, 0x1f ;
        /*0070*/               @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_the_innermost_loop_with_ex2_and_hgmma_is_counted():
    ins, labels = S.instructions(SASS)
    assert [op for op, _ in ins][:3] == ["MOV", "HGMMA.64x128x16.F32.BF16", "FFMA"]
    assert labels == {".L_x_0": 1, ".L_x_1": 2} and ins[5] == ("BRA", ".L_x_1")
    assert S.main_loop(ins, labels) == (2, 5)
    assert [S.classify(op) for op, _ in ins[2:6]] == ["fp32", "MUFU", "HGMMA", "branch"]


def test_no_loop_says_so():
    ins, labels = S.instructions("        /*0000*/                   EXIT ;\n")
    with pytest.raises(ValueError, match="no loop with MUFU.EX2 and HGMMA"):
        S.main_loop(ins, labels)


def test_the_default_kernel_loop():
    import shutil
    if S.nvdisasm() is None or shutil.which("ptxas") is None:
        pytest.skip("needs ptxas and nvdisasm")
    from tylopy_kernels.attention.bench.forward import sass_profiles
    name, cx = sass_profiles()[0]
    row = S.report(cx)
    # D=64, 128 keys a tile: QK^T is 4 HGMMA (k = 64 / 16), PV 8 (k = 128 / 16); 64 scores a thread
    assert row["HGMMA"] == 12 and row["MUFU"] >= 64 and row["loop"] < row["kernel"]
    # the row sums go in before the PV wait (EARLY_SUMS), so ptxas interleaves the exponents with
    # other work instead of issuing them as one run of 64 (docs/performance.md, the account)
    assert row["MUFU run"] <= 8, row


def test_longest_run():
    assert S.longest_run(["MUFU.EX2", "FFMA", "MUFU.EX2", "MUFU.EX2", "FADD"], "MUFU.EX2") == 2
    assert S.longest_run([], "MUFU.EX2") == 0
