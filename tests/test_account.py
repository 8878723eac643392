"""The per-tile account of ncu source-page CSVs (tylopy_kernels/attention/bench/account.py) on a
small synthetic listing: a loop of 3 iterations with an HGMMA, a wait, an exponential and a branch."""
import pytest

from tylopy_kernels.attention.bench import account as A

CSV = '''"==PROF==" preamble line
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb","stall_wait"
"0x0100","MOV R1, c[0x0][0x28] ;","1","4","0","0"
"0x0110","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;","9","12","0","3"
"0x0120","WARPGROUP.DEPBAR.LE gsb0, 0x0 ;","30","12","0","24"
"0x0130","FFMA R2, R3, R4, R5 ;","3","12","1","0"
"0x0140","MUFU.EX2 R6, R2 ;","6","12","4","0"
"0x0150","HGMMA.64x64x16.F32.BF16 R60, R8, gdesc[UR8], R60 ;","2","12","0","0"
"0x0160","@P0 BRA 0x110 ;","1","12","0","1"
"0x0170","EXIT ;","0","4","0","0"
'''


def test_per_tile_counts_divide_by_the_loop_head():
    acc = A.account(A.parse(CSV))
    assert acc["iterations"] == 12 and acc["loop rows"] == 6
    assert acc["instructions"] == 6 and acc["HGMMA"] == 2 and acc["MUFU"] == 1 and acc["fp32"] == 1
    assert acc["stalls"] == {"stall_wait": 100 * 28 / 33, "stall_long_sb": 100 * 5 / 33}
    assert acc["S->PV chain"] == 2  # after the DEPBAR: FFMA, MUFU, then the PV HGMMA (register A)
    assert acc["MUFU run"] == 1


def test_table_puts_kernels_side_by_side():
    acc = A.account(A.parse(CSV))
    text = A.table({"tylopy": acc, "fa3": acc})
    assert text.splitlines()[0] == "| per key tile | tylopy | fa3 |" and "| stall_wait (% of samples) | 84.8 | 84.8 |" in text


def test_a_listing_without_the_loop_is_refused():
    with pytest.raises(ValueError, match="no loop with MUFU.EX2 and HGMMA"):
        A.account(A.parse(CSV.replace("MUFU.EX2", "FMUL")))
    with pytest.raises(ValueError, match="no source-page header"):
        A.parse("a,b\n1,2\n")
