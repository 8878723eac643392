"""attention_decode with a hostile block_table on the CPU (emulator): entries that are negative or
past the page pool, inside the pages a sequence uses, are never dereferenced (the emulator would
raise MemoryAccessError), the device status words report them, the other sequences' outputs are
unchanged against the FP64 reference, and check_inputs=True's host check names the entry."""
import pytest
import torch

from attention_decode_cases import DecodeCase, check_result, make_inputs, scale_of
from tylopy_kernels.attention.decode import launch as dl
from tylopy_kernels.attention.decode import status as st

SMALL = dict(WARPS=2, WARP_KEYS=16, STAGES=2)
CASE = DecodeCase("hostile", (37, 80, 50), page_size=16, splits=2, merge="atomic", schedule=SMALL)


def _run(table_edit):
    q, k, v, lens, table = make_inputs(CASE)
    good = table.clone()
    table_edit(table, k.shape[0])
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full((len(CASE.lens), CASE.h_q, CASE.n_q), float("nan"))
    st.block_table_status("cpu")  # reset
    opts = dl.DecodeOptions(scale=scale_of(CASE), num_splits=CASE.splits, merge=CASE.merge, schedule=CASE.schedule)
    for step in dl.plan_decode(dl.DecodeTensors(q, k, v, lens, table), out, lse, opts):
        step.emulate()
    ref_out, ref_lse = dl.reference_decode(q, k, v, lens, scale=scale_of(CASE), block_table=good)
    return out, lse, ref_out, ref_lse, st.block_table_status("cpu")


@pytest.mark.parametrize("bad", ["negative", "past-the-pool"])
def test_bad_entries_are_caught_on_the_device(bad):
    def edit(table, num_pages):
        table[1, 2] = -5 if bad == "negative" else num_pages + 7  # sequence 1 (80 keys) uses pages 0..4
    out, lse, ref_out, ref_lse, status = _run(edit)
    print(status)
    assert not status.ok and status.first_sequence == 1 and status.bad_reads >= 1
    assert status.lowest_entry == status.highest_entry == (-5 if bad == "negative" else 3 * 5 + 3 + 7)
    keep = [0, 2]  # the other sequences are untouched
    check_result(CASE, out[keep], lse[keep], ref_out[keep], ref_lse[keep])
    with pytest.raises(ValueError, match="attention_decode: block_table expects entries in 0..num_pages-1"):
        st.status_buffer("cpu")[0] = 1
        st.check_block_table("cpu")
    assert st.block_table_status("cpu").ok  # read and reset


def test_entries_past_the_sequence_end_are_not_checked():
    def edit(table, num_pages):
        table[0, 3:] = -1234  # sequence 0 has 37 keys: pages 0..2 only
    out, lse, ref_out, ref_lse, status = _run(edit)
    assert status.ok, status
    check_result(CASE, out, lse, ref_out, ref_lse)


def test_check_inputs_names_the_entry_on_the_host():
    q, k, v, lens, table = make_inputs(CASE)
    table[2, 1] = k.shape[0]
    with pytest.raises(ValueError) as e:
        st.check_table_on_host(table, lens, CASE.page_size, k.shape[0], CASE.capacity)
    msg = str(e.value)
    print(msg)
    assert f"block_table[2, 1] = {k.shape[0]}" in msg and f"0..{k.shape[0] - 1}" in msg and "1 such entry" in msg
    table[2, 1] = 0
    st.check_table_on_host(table, lens, CASE.page_size, k.shape[0], CASE.capacity)


def test_int32_extreme_entries_are_caught_without_an_overflowing_address():
    """INT32_MIN and INT32_MAX (a page index whose byte offset overflows any 32-bit product) in the
    pages sequences 0 and 2 use: no read through them (the emulator would raise), both recorded."""
    def edit(table, num_pages):
        table[0, 1] = st.INT32_MIN
        table[2, 0] = st.INT32_MAX
    out, lse, ref_out, ref_lse, status = _run(edit)
    assert status.first_sequence == 0 and status.bad_reads >= 2
    assert (status.lowest_entry, status.highest_entry) == (st.INT32_MIN, st.INT32_MAX)
    check_result(CASE, out[[1]], lse[[1]], ref_out[[1]], ref_lse[[1]])


def test_the_public_function_carries_the_table_checks():
    """docs/serving.md's calls: the status readers on tylopy.attention_decode, and check_inputs as a
    keyword (refused where the table cannot be read on the host)."""
    import inspect
    import tylopy
    assert tylopy.attention_decode.block_table_status is st.block_table_status
    assert tylopy.attention_decode.check_block_table is st.check_block_table
    assert inspect.signature(tylopy.attention_decode).parameters["check_inputs"].default is False
    q, k, v, lens, table = (t.to("meta") for t in make_inputs(CASE))
    with pytest.raises(ValueError, match="check_inputs expects False under torch.compile"):
        tylopy.attention_decode(q, k, v, lens, block_table=table, check_inputs=True)
