"""``tylopy.attention`` with variant keywords on the CPU (the torch path), ``create_block_mask``,
the operators under autograd and torch.compile, and the keyword checks."""
import warnings

import pytest
import torch

import tylopy as ty
from tylopy_kernels.attention import autograd_variants
from tylopy_kernels.attention import variants as V


def _qkv(B=1, H=2, Hkv=2, n=40, nk=56, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, m, D, generator=g, dtype=dtype) for h, m in ((H, n), (Hkv, nk), (Hkv, nk)))


def _brute(q, k, v, scale, keep=None, bias=None, sinks=None):
    """softmax over keys of the float64 scores (+ bias, masked by keep, with sink) by definition."""
    s = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    return p @ v


def test_builtins_by_definition():
    q, k, v = _qkv()
    n, nk, sc = 40, 56, 0.25
    i, j = torch.arange(n)[:, None], torch.arange(nk)[None, :]
    slopes, sinks = torch.tensor([0.5, 0.1]), torch.tensor([0.2, -0.7])
    # bottom-right causal with a window (5 back, 2 ahead of the diagonal), softcap, ALiBi, sinks
    diag = nk - n
    keep = (j <= i + diag) & (j >= i + diag - 5)
    s = (q @ k.transpose(-1, -2)) * sc
    bias = 3.0 * torch.tanh(s / 3.0) - s - slopes.double().view(1, 2, 1, 1) * (i + diag - j).abs()
    want = _brute(q, k, v, sc, keep, bias, sinks)
    got = ty.attention(q, k, v, scale=sc, is_causal=True, causal_align="bottom_right", window_size=(5, 2),
                       softcap=3.0, alibi_slopes=slopes, sinks=sinks)
    assert (got - want).abs().max() < 1e-12


def test_rectangular_causal_is_top_left_as_sdpa_and_float_masks_add():
    q, k, v = _qkv()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ty.attention(q, k, v, is_causal=True) - want).abs().max() < 1e-12
    mask = torch.randn(40, 56, dtype=torch.float64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ty.attention(q, k, v, attn_mask=mask) - want).abs().max() < 1e-12


def test_rows_without_keys_and_the_sink_lse():
    q, k, v = _qkv(n=60, nk=20)
    sinks = torch.tensor([0.5, -1.0])
    out, lse = ty.attention(q, k, v, is_causal=True, causal_align="bottom_right", sinks=sinks, return_lse=True)
    assert (out[:, :, :40] == 0).all() and torch.allclose(lse[0, :, :40], sinks.double()[:, None].expand(2, 40))
    out, lse = ty.attention(q, k, v, is_causal=True, causal_align="bottom_right", return_lse=True)
    assert (out[:, :, :40] == 0).all() and torch.isinf(lse[:, :, :40]).all()


def test_block_mask_tiles_against_brute_force():
    doc = (torch.arange(300) // 70).to(torch.int32)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
    bm = ty.create_block_mask(document, None, None, 300, 300, BLOCK_SIZE=64)
    assert ty.create_block_mask(document, None, None, 300, 300, BLOCK_SIZE=64) is bm  # cached
    dense = document(0, 0, torch.arange(300)[:, None], torch.arange(300)[None, :])
    nt = 5
    for a in range(nt):
        tile_rows = slice(64 * a, 64 * a + 64)
        listed_p = set(bm.kv_indices[0, 0, a, :bm.kv_num_blocks[0, 0, a]].tolist())
        listed_f = set(bm.full_kv_indices[0, 0, a, :bm.full_kv_num_blocks[0, 0, a]].tolist())
        for c in range(nt):
            t = dense[tile_rows, 64 * c:64 * c + 64]
            kind = "full" if t.all() else "partial" if t.any() else "empty"
            assert (c in listed_f, c in listed_p) == (kind == "full", kind == "partial"), (a, c, kind)
    q, k, v = _qkv(n=300, nk=300)
    want = _brute(q, k, v, 0.25, dense)
    assert (ty.attention(q, k, v, scale=0.25, block_mask=bm) - want).abs().max() < 1e-12


def test_padded_index_lists_count_only_their_listed_tiles():
    """Index lists padded past their counts with repeats of listed tiles (as other libraries pad
    them) flag exactly the listed tiles: scatter's last write among duplicates is unspecified."""
    num = torch.tensor([[[2, 1]]], dtype=torch.int32)
    idx = torch.tensor([[[[3, 1, 3, 3], [0, 0, 0, 0]]]], dtype=torch.int32)
    none, none_idx = torch.zeros(1, 1, 2, dtype=torch.int32), torch.zeros(1, 1, 2, 4, dtype=torch.int32)
    full, partial = V.tile_flags(num, idx, none, none_idx)
    assert partial.tolist() == [[[[False, True, False, True], [True, False, False, False]]]]
    assert not full.any()


def test_block_mask_cache_never_serves_a_freed_tensor_s_mask():
    """Closures of one mask_mod over new tensors (the old ones freed, so their ids may be reused) each get
    the block mask of their own tensor."""
    def closure(doc):
        def document(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]
        return document
    for n in range(12):
        doc = (torch.arange(256) // (16 + 16 * (n % 3))).to(torch.int32)
        bm = ty.create_block_mask(closure(doc), 1, 1, 256, 256, BLOCK_SIZE=64)
        del doc
        want = (torch.arange(256) // (16 + 16 * (n % 3)))
        tiles = (want.view(4, 64)[:, None, :, None] == want.view(4, 64)[None, :, None, :]).any(-1).any(-1)
        got = torch.zeros(4, 4, dtype=torch.bool)
        for a in range(4):
            for lst, num in ((bm.kv_indices, bm.kv_num_blocks), (bm.full_kv_indices, bm.full_kv_num_blocks)):
                got[a, lst[0, 0, a, :num[0, 0, a]].long()] = True
        assert torch.equal(got, tiles), n


def test_block_mask_for_other_shapes_names_block_mask():
    bm = ty.create_block_mask(lambda b, h, i, j: i >= j, 1, 2, 40, 40)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block_mask expects a mask built for"):
        ty.attention(q, k, v, block_mask=bm)


@pytest.mark.parametrize("kw,arg", [
    (dict(window_size=(3,)), "window_size"), (dict(window_size=(-2, 0)), "window_size"),
    (dict(softcap=-1.0), "softcap"), (dict(alibi_slopes=torch.ones(3)), "alibi_slopes"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), "alibi_slopes"), (dict(sinks=torch.ones(2, 1)), "sinks"),
    (dict(causal_align="center"), "causal_align"), (dict(score_mod=3), "score_mod"), (dict(block_mask="x"), "block_mask"),
    (dict(aux=(torch.ones(2),)), "aux"), (dict(attn_mask=torch.ones(3, 56)), "attn_mask"),
])
def test_bad_keywords_name_the_keyword(kw, arg):
    q, k, v = _qkv()
    with pytest.raises((ValueError, TypeError)) as info:
        ty.attention(q, k, v, **kw)
    text = str(info.value)
    assert arg in text and "expects" in text and "but got" in text, text


def test_one_warning_per_reason_on_the_torch_path():
    q, k, v = (t.to(torch.bfloat16) for t in _qkv())
    autograd_variants._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ty.attention(q, k, v, softcap=5.0)
        ty.attention(q, k, v, softcap=6.0, is_causal=True)
    msgs = [str(w.message) for w in caught if "reference path" in str(w.message)]
    assert len(msgs) == 1 and "cpu" in msgs[0], msgs


def test_the_backward_says_why_it_leaves_the_kernel():
    """A call the variant kernel took forward takes the reference backward, with one warning
    naming why, for an LSE gradient and under torch.use_deterministic_algorithms (its dQ and sink
    gradient are summed with atomics); otherwise nothing is refused."""
    assert autograd_variants.backward_refusal(None) is None
    assert "gradient of the LSE" in autograd_variants.backward_refusal(torch.zeros(1))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert "use_deterministic_algorithms" in autograd_variants.backward_refusal(None)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.exhaustive  # a minute on two cores; the emulated backward tests check the same gradients
def test_gradients_and_sink_gradient_by_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(n=12, nk=20, Hkv=1))
    sinks = torch.tensor([0.3, -0.2], requires_grad=True)

    def f(q, k, v):
        return ty.attention(q, k, v, enable_gqa=True, is_causal=True, causal_align="bottom_right",
                            window_size=(4, 1), softcap=2.0, sinks=sinks.detach(), score_mod=lambda s, b, h, i, j: s * 1.5,
                            return_lse=True)
    assert torch.autograd.gradcheck(f, (q, k, v))
    out = ty.attention(q, k, v, enable_gqa=True, sinks=sinks)
    (g,) = torch.autograd.grad(out.sum() + out.square().sum(), [sinks])
    eps, num = 1e-3, []
    for h in range(2):
        d = torch.zeros(2)
        d[h] = eps
        hi = ty.attention(q, k, v, enable_gqa=True, sinks=sinks.detach() + d)
        lo = ty.attention(q, k, v, enable_gqa=True, sinks=sinks.detach() - d)
        num.append(((hi.sum() + hi.square().sum()) - (lo.sum() + lo.square().sum())).item() / (2 * eps))
    assert torch.allclose(g.double(), torch.tensor(num, dtype=torch.float64), rtol=1e-3, atol=1e-5)


def test_torch_compile_fullgraph_with_mods_and_block_mask():
    q, k, v = _qkv(n=64, nk=64)
    doc = (torch.arange(64) >= 30).to(torch.int32)
    bias = torch.tensor([0.1, -0.2], dtype=torch.float32)

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h]
    bm = ty.create_block_mask(document, 1, 1, 64, 64)

    def f(q, k, v):
        return ty.attention(q, k, v, score_mod=biased, block_mask=bm, softcap=10.0)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert (got - f(q, k, v)).abs().max() == 0


def test_variant_is_hashable_and_mods_are_keyed_by_code_and_constants():
    def make(w):
        def mod(b, h, q_idx, kv_idx):
            return q_idx - kv_idx <= w
        return mod
    a, _ = V.make_variant(1, 2, 8, 8, torch.device("cpu"), mask_mod=make(3))
    b, _ = V.make_variant(1, 2, 8, 8, torch.device("cpu"), mask_mod=make(3))
    c, _ = V.make_variant(1, 2, 8, 8, torch.device("cpu"), mask_mod=make(4))
    from tylopy_kernels.attention.sm90.variant_tiles import KernelVariant
    ka, kb, kc = (KernelVariant.of(x, ()) for x in (a, b, c))
    assert ka == kb and hash(ka) == hash(kb) and ka != kc  # one specialization per code and constants
    assert ka.__tylopy_fingerprint__() == kb.__tylopy_fingerprint__()


def test_bad_mods_are_errors_naming_the_keyword_and_the_users_line():
    q, k, v = _qkv()
    table = torch.randn(8)

    def branchy(score, b, h, q_idx, kv_idx):
        if q_idx > kv_idx:  # Python control flow on index tensors
            return score
        return score - 1.0

    def distance(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) * 1.0  # a float, not a bool

    def past_the_table(score, b, h, q_idx, kv_idx):
        return score + table[kv_idx]  # 8 entries, 56 keys

    here = __file__.rsplit("/", 1)[-1]
    for kw, words in ((dict(score_mod=branchy), ("score_mod", "if q_idx > kv_idx")),
                      (dict(mask_mod=distance), ("mask_mod expects a function returning bool", here)),
                      (dict(score_mod=past_the_table), ("score_mod", "table[kv_idx]", "out of bounds"))):
        with pytest.raises(V.ModError) as info:
            ty.attention(q, k, v, **kw)
        assert all(w in str(info.value) for w in words), str(info.value)
