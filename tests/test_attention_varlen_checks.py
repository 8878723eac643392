"""attention_varlen's checks of cu_seqlens: lists and CPU tensors are checked on the host before
any launch (start at 0, non-decreasing, last entry within the rows, no sequence longer than
max_seqlen), each rejection naming the argument; CUDA cu_seqlens are repaired on the device
without a host sync and counted (GPU test)."""
import pytest
import torch

from tylopy_kernels.attention import attention_varlen
from tylopy_kernels.attention import varlen as V


def _args(**change):
    q = torch.zeros(10, 4, 32, dtype=torch.bfloat16)
    args = dict(q=q, k=q.clone(), v=q.clone(), cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 4, 10], max_seqlen_q=6,
                max_seqlen_k=6)
    args.update(change)
    return args


BAD = [
    ("not from 0", dict(cu_seqlens_q=[1, 4, 10]), "cu_seqlens_q expects prefix sums starting at 0, but got 1 as the first entry"),
    ("decreasing", dict(cu_seqlens_k=torch.tensor([0, 6, 4], dtype=torch.int32)),
     "cu_seqlens_k expects non-decreasing prefix sums, but got 6 then 4 at entries 1, 2"),
    ("past the rows", dict(cu_seqlens_q=[0, 4, 11]), "cu_seqlens_q expects a last entry of at most the 10 rows"),
    ("longer than max", dict(cu_seqlens_k=[0, 2, 10], max_seqlen_k=6),
     r"max_seqlen_k expects at least the longest sequence in cu_seqlens_k \(8 rows, sequence 1\), but got 6"),
    ("floats in a list", dict(cu_seqlens_q=[0, 4.0, 10]), "cu_seqlens_q expects a list of ints"),
    ("beyond int32", dict(cu_seqlens_q=[0, 4, 2**31]), "cu_seqlens_q expects int32 values"),
]


@pytest.mark.parametrize("change,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_host_values_are_checked_before_launch(change, message):
    with pytest.raises((ValueError, TypeError), match=message) as e:
        attention_varlen(**_args(**change))
    print(e.value)


@pytest.mark.parametrize("cu", [[0, 4, 10], (0, 4, 10), torch.tensor([0, 4, 10], dtype=torch.int32)])
def test_good_host_values_pass_to_the_device_check(cu):
    with pytest.raises(ValueError, match="CUDA"):  # every check passed; the launch needs a GPU
        attention_varlen(**_args(cu_seqlens_q=cu, cu_seqlens_k=cu))


def test_padding_rows_after_the_last_sequence_are_allowed():
    with pytest.raises(ValueError, match="CUDA"):
        attention_varlen(**_args(cu_seqlens_q=[0, 4, 8], cu_seqlens_k=[0, 3, 3]))


@pytest.mark.gpu
def test_cuda_cu_seqlens_are_repaired_on_the_device_and_counted():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(40, 2, 64, device="cuda", generator=g).to(torch.bfloat16)
    k, v = q.clone(), q.clone()
    good = torch.tensor([0, 15, 40], dtype=torch.int32, device="cuda")
    V.cu_seqlens_status()
    want = attention_varlen(q, k, v, good, good, 25, 25)
    assert V.cu_seqlens_status() == 0
    hostile = torch.tensor([0, 15, 4000], dtype=torch.int32, device="cuda")  # past the rows: clamped to 40
    got = attention_varlen(q, k, v, hostile, hostile, 25, 25)
    torch.cuda.synchronize()
    assert V.cu_seqlens_status() == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the repaired sums are the good ones here
    negative = torch.tensor([0, -5, 40], dtype=torch.int32, device="cuda")
    attention_varlen(q, k, v, negative, negative, 40, 40)
    torch.cuda.synchronize()
    assert V.cu_seqlens_status() == 1


def test_repeated_calls_count_when_the_status_is_read():
    """A cache hit adds its flag to the status word when the word is read, not with a launch of its
    own; calls with good sums (flag 0) add nothing; more than 64 waiting flags are added early."""
    cpu = torch.device("cpu")
    V.cu_seqlens_status(cpu)
    bad, good = torch.ones((), dtype=torch.int32), torch.zeros((), dtype=torch.int32)
    for _ in range(3):
        V._count_later(cpu, bad)
        V._count_later(cpu, good)
    assert V.cu_seqlens_status(cpu) == 3 and V.cu_seqlens_status(cpu) == 0
    flags = [torch.ones((), dtype=torch.int32) for _ in range(70)]
    for f in flags:
        V._count_later(cpu, f)
    assert len(V._PENDING[cpu]) == 6  # the first 64 went into the word when the 65th came
    assert V.cu_seqlens_status(cpu) == 70


@pytest.mark.gpu
def test_repaired_sums_are_kept_per_tensor_version_and_recounted_each_call():
    """A repeated call with the same device sums reuses their repair (no launch: counted when the
    status is read); an in-place write to the sums repairs them again; a captured graph records its
    own repair."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(40, 2, 64, device="cuda", generator=g).to(torch.bfloat16)
    k, v = q.clone(), q.clone()
    cu = torch.tensor([0, 15, 4000], dtype=torch.int32, device="cuda")  # past the rows: repaired (40)
    V.cu_seqlens_status()
    V._device_sums.clear()
    first = attention_varlen(q, k, v, cu, cu, 25, 25)
    assert len(V._device_sums) == 1
    again = attention_varlen(q, k, v, cu, cu, 25, 25)
    for _ in range(3):
        attention_varlen(q, k, v, cu, cu, 25, 25)
    torch.cuda.synchronize()
    assert len(V._device_sums) == 1 and V.cu_seqlens_status() == 5  # each call with bad sums counts
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    cu.copy_(torch.tensor([0, 30, 40], dtype=torch.int32))  # an in-place write: new sums, repaired again
    moved = attention_varlen(q, k, v, cu, cu, 30, 30)
    want = attention_varlen(q, k, v, [0, 30, 40], [0, 30, 40], 30, 30)
    torch.testing.assert_close(moved, want, rtol=0, atol=0)
    assert V.cu_seqlens_status() == 0
    static = torch.tensor([0, 15, 40], dtype=torch.int32, device="cuda")
    attention_varlen(q, k, v, static, static, 30, 30)  # kept before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_varlen(q, k, v, static, static, 30, 30)
    static.copy_(torch.tensor([0, 30, 40], dtype=torch.int32))
    graph.replay()
    torch.testing.assert_close(out, want, rtol=0, atol=0)  # the replay read the sums as they are now
