"""attention_decode on a GPU with a hostile block_table (entries negative or past the page pool,
inside the pages a sequence uses): no fault, the other sequences' outputs match the FP64
reference, ``check_block_table()`` reports the bad entries after the fact (also for a launch
replayed from a CUDA graph), and ``check_inputs=True`` refuses the table before launching.
Run this file on its own (serially): it feeds the kernel deliberately invalid tables, and a
regression here would fault the context for every test after it."""
import pytest
import torch

import tylopy
from attention_decode_cases import DecodeCase, check_result, make_inputs, scale_of
from tylopy_kernels.attention.decode import launch as dl

pytestmark = pytest.mark.gpu

CASES = [
    DecodeCase("paged16-b4", (5, 3000, 777, 129), h_q=32, h_kv=8, head_dim=128, page_size=16, merge="atomic"),
    DecodeCase("paged256-causal-nq4", (300, 9000, 4), n_q=4, h_q=32, h_kv=8, head_dim=128, page_size=256,
               causal=True, merge="kernel"),
    DecodeCase("paged32-d64", (2048, 333), h_q=8, h_kv=8, head_dim=64, page_size=32, splits=5),
]


def _decode(case, q, k, v, lens, table, **kw):
    return tylopy.attention_decode(q, k, v, lens, scale=scale_of(case), block_table=table, is_causal=case.causal,
                                   num_splits=case.splits, return_lse=True, layout=case.layout, merge=case.merge,
                                   **kw)


@pytest.mark.parametrize("bad", ["negative", "past-the-pool", "huge"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_entries_are_reported_and_contained(case, bad):
    q, k, v, lens, table = make_inputs(case, "cuda")
    ref_out, ref_lse = dl.reference_decode(q, k, v, lens, scale=scale_of(case), block_table=table,
                                           is_causal=case.causal, layout=case.layout)
    value = {"negative": -3, "past-the-pool": k.shape[0], "huge": 2**31 - 1}[bad]
    hit = 1  # the second sequence; its last used page
    table[hit, (int(lens[hit]) - 1) // case.page_size] = value
    tylopy.attention_decode.block_table_status()  # reset
    out, lse = _decode(case, q, k, v, lens, table)
    torch.cuda.synchronize()
    status = tylopy.attention_decode.block_table_status()
    print(case.name, bad, status)
    assert not status.ok and status.first_sequence == hit and status.lowest_entry == value
    keep = [b for b in range(len(case.lens)) if b != hit]
    check_result(case, out[keep], lse[keep], ref_out[keep], ref_lse[keep])
    with pytest.raises(ValueError, match=r"attention_decode: block_table expects entries in 0..num_pages-1"):
        _decode(case, q, k, v, lens, table)
        tylopy.attention_decode.check_block_table()
    with pytest.raises(ValueError, match=rf"block_table\[{hit}, \d+\] = {value}"):
        _decode(case, q, k, v, lens, table, check_inputs=True)
    assert tylopy.attention_decode.check_block_table().ok


def test_a_graph_replay_reports_a_table_edited_after_capture():
    case = CASES[0]
    q, k, v, lens, table = make_inputs(case, "cuda")
    _decode(case, q, k, v, lens, table)  # compile and plan outside the capture
    torch.cuda.synchronize()
    tylopy.attention_decode.check_block_table()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = _decode(case, q, k, v, lens, table)
    graph.replay()
    torch.cuda.synchronize()
    assert tylopy.attention_decode.block_table_status().ok
    table[2, 0] = -7
    graph.replay()
    torch.cuda.synchronize()
    status = tylopy.attention_decode.block_table_status()
    assert status.first_sequence == 2 and status.lowest_entry == -7, status
