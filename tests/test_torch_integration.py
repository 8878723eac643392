"""CPU tier of the PyTorch integration of every entry point (docs/pytorch.md):

* the functions are plain names of the package (``tylopy.functions``, ``tylopy.distributed``),
  importable in either order with the kernel modules, and ``import tylopy`` compiles no kernel;
* a ``torch.export`` program saved in one process loads and runs in another after ``import
  tylopy`` alone (the operators' CPU implementations), and does not without it;
* ``tylopy::matmul`` (opcheck, float64 gradcheck, a backward through the operator itself) and
  ``tylopy::attention_decode`` (opcheck), both traced into one graph by dynamo on meta tensors;
* SDPA's conventions: autocast, nested jagged tensors, an int ``cache_seqlens``, the pre-sm_80
  rejection in the caller's name;
* ring attention over gloo (2 processes) traced without graph breaks, compiled gradients equal.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tylopy
import tylopy_kernels
from tylopy_kernels.attention import autograd as A
from tylopy_kernels.attention import conventions
from tylopy_kernels.attention.decode import api as decode_api
from tylopy_kernels.gemm import ops as gemm_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tylopy.__file__)))
META = dict(device="meta", dtype=torch.bfloat16)


def _python(code, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


# -- plain modules ---------------------------------------------------------------------------------------

def test_functions_are_plain_names_of_the_package():
    from tylopy.distributed import ring_attention, shard_sequence, unshard_sequence  # noqa: F401
    from tylopy.functions import attention, attention_decode, attention_varlen, matmul
    from tylopy_kernels.attention import attention as kernel_attention
    from tylopy_kernels.gemm import matmul as kernel_matmul
    assert tylopy.attention is attention is kernel_attention and tylopy.matmul is matmul is kernel_matmul
    assert tylopy.attention_varlen is attention_varlen and tylopy.attention_decode is attention_decode
    assert tylopy.distributed.ring_attention is ring_attention
    for name in ("attention", "attention_varlen", "attention_decode", "matmul", "distributed"):
        assert name in tylopy.__all__ and name in dir(tylopy)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert '"tylopy.functions"' not in f.read()  # entry points stay for checks and benchmarks only
    with pytest.raises(AttributeError, match="the type is ty.f32"):
        tylopy.float32  # noqa: B018


@pytest.mark.parametrize("first", ["tylopy_kernels.attention.decode.launch", "tylopy_kernels.attention.sm90.launch",
                                   "tylopy_kernels.gemm.launch"])
def test_kernel_modules_imported_first(first):
    """A kernel module imports tylopy, whose facade imports the kernels package back: either order works."""
    proc = _python(f"""
        import {first}
        import tylopy, torch
        assert callable(tylopy.attention_decode) and callable(tylopy.matmul) and callable(tylopy.attention)
        assert torch.ops.tylopy.matmul.default is not None
        print("OK")
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_import_registers_the_operators_and_compiles_nothing():
    proc = _python("""
        import sys, time
        t = time.perf_counter()
        import tylopy
        import torch
        ops = [n for n in ("attention_fwd", "attention_bwd", "attention_varlen_fwd", "attention_varlen_bwd",
                           "attention_decode", "matmul", "scaled_matmul", "attention_variant_fwd",
                           "attention_variant_bwd", "varlen_doc_tables", "attention_fp8_fwd")
               if hasattr(torch.ops.tylopy, n)]
        kernels = [m for m in ("tylopy_kernels.attention.sm90.forward", "tylopy_kernels.attention.portable.forward",
                               "tylopy_kernels.attention.decode.kernel", "tylopy_kernels.gemm.hopper",
                               "tylopy_kernels.gemm.fp8") if m in sys.modules]
        print("OPS", len(ops), "KERNELS", kernels)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OPS 11 KERNELS []" in proc.stdout
    assert set(tylopy_kernels.ops.OPERATORS) == {f"tylopy::{n}" for n in (
        "attention_fwd", "attention_bwd", "attention_varlen_fwd", "attention_varlen_bwd", "attention_decode", "matmul",
        "scaled_matmul", "attention_variant_fwd", "attention_variant_bwd", "varlen_doc_tables", "attention_fp8_fwd")}


# -- torch.export ----------------------------------------------------------------------------------------------

EXPORT = """
    import torch, tylopy
    class Model(torch.nn.Module):
        def forward(self, q, k, v, a, b, k_cache, v_cache, lens):
            o = tylopy.attention(q, k, v, is_causal=True)
            c = tylopy.matmul(a, b)
            d = tylopy.attention_decode(q.transpose(1, 2)[:, -1:].contiguous(), k_cache, v_cache, lens)
            return o, c, d
    m = dict(device="meta", dtype=torch.bfloat16)
    args = (torch.empty(1, 2, 8, 64, **m), torch.empty(1, 2, 8, 64, **m), torch.empty(1, 2, 8, 64, **m),
            torch.empty(8, 16, **m), torch.empty(16, 8, **m), torch.empty(1, 32, 2, 64, **m),
            torch.empty(1, 32, 2, 64, **m), torch.empty(1, dtype=torch.int32, device="meta"))
    program = torch.export.export(Model(), args)
    targets = sorted(set(str(n.target) for n in program.graph.nodes if "tylopy" in str(n.target)))
    print("TARGETS", targets)
    torch.export.save(program, {path!r})
"""

LOAD = """
    import math, torch
    {imports}
    program = torch.export.load({path!r})
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q, k, v, a, b, kc, vc = r(1, 2, 8, 64), r(1, 2, 8, 64), r(1, 2, 8, 64), r(8, 16), r(16, 8), r(1, 32, 2, 64), r(1, 32, 2, 64)
    kc[:, 20:] = float("nan")  # past the sequence's end: never read
    vc[:, 20:] = float("nan")
    lens = torch.tensor([20], dtype=torch.int32)
    bf = lambda t: t.bfloat16()
    o, c, d = program.module()(*map(bf, (q, k, v, a, b, kc, vc)), lens)
    qb, kb, vb = (bf(t).double() for t in (q, k, v))
    ref_o = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
    ref_c = bf(a).double() @ bf(b).double()
    qd = qb.transpose(1, 2)[:, -1:]
    s = torch.einsum("bihd,bjhd->bhij", qd, bf(kc[:, :20]).double()) / math.sqrt(64)
    ref_d = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), bf(vc[:, :20]).double())
    errs = [(x.double() - y).abs().max().item() for x, y in ((o, ref_o), (c, ref_c), (d, ref_d))]
    print("ERRS", errs, o.dtype, c.shape, d.shape)
"""


@pytest.mark.slow
def test_exported_program_runs_in_a_process_that_only_imports_tylopy(tmp_path):
    path = str(tmp_path / "model.pt2")
    proc = _python(EXPORT.format(path=path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'tylopy.attention_decode.default', 'tylopy.attention_fwd.default', 'tylopy.matmul.default'" in proc.stdout
    without = _python(LOAD.format(imports="", path=path))
    assert without.returncode != 0  # the operators are tylopy's: without it the program does not load
    proc = _python(LOAD.format(imports="import tylopy", path=path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = eval(proc.stdout.split("ERRS ")[1].split("]")[0] + "]")  # noqa: S307 - our own subprocess' output
    assert all(e < 0.05 for e in errs), errs  # bf16 outputs of fp64 references
    assert "torch.bfloat16 torch.Size([8, 8]) torch.Size([1, 1, 2, 64])" in proc.stdout


# -- matmul -------------------------------------------------------------------------------------------------------

def test_matmul_operator_opcheck_and_float64_gradients():
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(gemm_ops.matmul_op, (a, b, bias, torch.float64, "", ""))
    assert torch.autograd.gradcheck(lambda a, b, bias: gemm_ops.matmul_op(a, b, bias, torch.float64, "", ""),
                                    (a, b, bias))
    out = gemm_ops.matmul_op(a.detach(), b.detach(), None, torch.float64, "gelu", "")
    ref = torch.nn.functional.gelu(a.detach() @ b.detach(), approximate="tanh")
    assert (out - ref).abs().max().item() < 1e-12


def _compiled_graphs(fn, *args):
    """fullgraph compile through AOT autograd, forward and backward; the tylopy calls of each graph."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    seen = {}

    def record(kind):
        def compiler(gm, _):
            seen[kind] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "tylopy" in str(n.target)]
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=record("fw"), bw_compiler=record("bw"))

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args).float().sum().backward()
    return seen


def test_matmul_backward_calls_matmul_itself():
    a = torch.empty(2, 64, 32, **META, requires_grad=True)
    w = torch.empty(48, 32, **META, requires_grad=True)
    bias = torch.empty(48, **META, requires_grad=True)
    seen = _compiled_graphs(lambda a: tylopy.matmul(a, w.t(), bias), a)
    assert seen["fw"] == ["tylopy.matmul.default"]
    assert seen["bw"] == ["tylopy.matmul.default", "tylopy.matmul.default"]  # dA = dC W, dW^T = A^T dC
    assert a.grad.shape == a.shape and w.grad.shape == w.shape and bias.grad.shape == bias.shape


def test_matmul_and_decode_trace_into_one_graph():
    from tylopy_kernels.gemm import epilogues

    def step(x, w, q, k_cache, v_cache, lens):
        h = tylopy.matmul(x, w, epilogue=epilogues.gelu)
        out = tylopy.attention_decode(q, k_cache, v_cache, lens, is_causal=True)
        return h, out

    args = (torch.empty(4, 64, **META), torch.empty(64, 128, **META), torch.empty(2, 1, 4, 128, **META),
            torch.empty(2, 256, 2, 128, **META), torch.empty(2, 256, 2, 128, **META),
            torch.empty(2, dtype=torch.int32, device="meta"))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(*args)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    h, out = step(*args)  # meta tensors take the operators outside a trace too
    assert h.shape == (4, 128) and out.shape == (2, 1, 4, 128)


def test_matmul_rejections_name_the_argument():
    a = torch.empty(8, 16, **META, requires_grad=True)
    b = torch.empty(16, 8, **META)
    from tylopy_kernels.gemm import epilogues
    with pytest.raises(ValueError, match="matmul: epilogue expects None when an input requires grad"):
        tylopy.matmul(a, b, epilogue=epilogues.relu)
    with pytest.raises(TypeError, match="matmul: epilogue expects None or one of tylopy_kernels.gemm.epilogues"):
        tylopy.matmul(a.detach(), b, epilogue=lambda x: x)
    with pytest.raises(TypeError, match="matmul: b expects dtype"):
        tylopy.matmul(a, b.float())


# -- attention_decode ------------------------------------------------------------------------------------------

def test_decode_operator_opcheck_and_cpu_reference():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 4, 64, generator=gen)
    kc, vc = torch.randn(2, 32, 2, 64, generator=gen), torch.randn(2, 32, 2, 64, generator=gen)
    lens = torch.tensor([5, 32], dtype=torch.int32)
    for return_lse in (False, True):
        torch.library.opcheck(decode_api.attention_decode_op,
                              (q, kc, vc, lens, None, 0.125, True, None, return_lse, "bshd", "atomic"))
    out, lse = decode_api.attention_decode_op(q, kc, vc, lens, None, 0.125, False, None, True, "bshd", "atomic")
    assert out.shape == q.shape and lse.shape == (2, 4, 2) and lse.dtype == torch.float32


def test_int_cache_seqlens_is_a_type_error_naming_it():
    q = torch.empty(1, 1, 2, 64, **META)
    kc = torch.empty(1, 32, 2, 64, **META)
    with pytest.raises(TypeError, match="attention_decode: cache_seqlens expects a .*torch.int32.*got int"):
        tylopy.attention_decode(q, kc, kc, 17)


# -- SDPA conventions -------------------------------------------------------------------------------------------

def test_autocast_runs_fp32_attention_in_the_autocast_dtype():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 16, generator=gen) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = A.attention_fwd(q, k, v, None, False, 0.25, True)  # the operators' autocast rule
        cast = conventions.autocast_inputs(q, k, v)
        with pytest.raises(ValueError, match="attention: query expects a CUDA tensor"):  # past the dtype check
            tylopy.attention(q, k, v)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert all(t.dtype == torch.bfloat16 for t in cast)
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.bfloat16().double() for t in (q, k, v)), scale=0.25)
    assert (out.double() - ref).abs().max().item() < 2 ** -5 * ref.abs().max().item()  # bf16 arithmetic throughout
    with pytest.raises(TypeError, match="attention: query expects dtype torch.bfloat16 or torch.float16"):
        tylopy.attention(q, k, v)  # outside autocast fp32 stays refused


def _nested(lengths, H, D, seed):
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, H, D, generator=gen, dtype=torch.float64) for n in lengths]
    return seqs, torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_nested_jagged_tensors_run_as_varlen(monkeypatch, causal):
    """Nested (B, H, j, D) inputs reach attention_varlen as packed values with int32 offsets; here
    attention_varlen is the operator's float64 CPU reference, checked per sequence against SDPA."""
    import tylopy_kernels.attention as attention_pkg
    calls = []

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, scale=None, enable_gqa=False, return_lse=False):
        calls.append((cu_q.dtype, max_q, q.shape))
        return A.varlen_op(q, k, v, A.PackedDocs(cu_q, cu_k, max_q, max_k), is_causal, scale, return_lse)

    monkeypatch.setattr(attention_pkg, "attention_varlen", varlen)
    lengths = (3, 7, 1)
    sq, q = _nested(lengths, 4, 16, 0)
    q = torch.nested.nested_tensor_from_jagged(q.values().transpose(0, 1), q.offsets()).transpose(1, 2)
    sk, _ = _nested(lengths, 2, 16, 1)
    sv, _ = _nested(lengths, 2, 16, 2)
    k = torch.nested.nested_tensor_from_jagged(torch.cat(sk), q.offsets()).transpose(1, 2)
    v = torch.nested.nested_tensor_from_jagged(torch.cat(sv), q.offsets()).transpose(1, 2)
    out, lse = tylopy.attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True, return_lse=True)
    assert calls == [(torch.int32, sum(lengths), (sum(lengths), 4, 16))]  # no cached length: the token count
    assert out.is_nested and out.shape[:2] == (3, 4) and lse.is_nested
    for b, (a, kk, vv) in enumerate(zip(sq, sk, sv)):
        ref = torch.nn.functional.scaled_dot_product_attention(a.transpose(0, 1)[None], kk.transpose(0, 1)[None],
                                                               vv.transpose(0, 1)[None], is_causal=causal,
                                                               scale=0.3, enable_gqa=True)[0]
        assert (out[b] - ref).abs().max().item() < 1e-12


def test_nested_attention_traces_into_one_graph(monkeypatch):
    import tylopy_kernels.attention as attention_pkg
    monkeypatch.setattr(attention_pkg, "attention_varlen", lambda q, k, v, cu_q, cu_k, max_q, max_k, **kw: A.varlen_op(
        q, k, v, A.PackedDocs(cu_q, cu_k, max_q, max_k), kw["is_causal"], 0.125, kw["return_lse"]))
    offsets = torch.tensor([0, 100, 256])
    nested = lambda x: torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2)  # noqa: E731
    packed = torch.randn(256, 8, 64)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda q: tylopy.attention(nested(q), nested(q), nested(q)).values())(packed)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_nested_rejections_say_how_to_convert():
    _, q = _nested((2, 3), 2, 16, 0)
    dense = torch.randn(2, 2, 3, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="attention: key expects dense .* or nested jagged .*attention_varlen"):
        tylopy.attention(q, dense, dense)
    _, k = _nested((2, 3), 2, 16, 1)
    with pytest.raises(ValueError, match="attention: is_causal expects query and key sharing one offsets tensor"):
        tylopy.attention(q, k, k, is_causal=True)
    with pytest.raises(ValueError, match="attention: attn_mask expects None for nested tensors"):
        tylopy.attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attention: query expects a nested \(B, H, j, D\) tensor"):
        tylopy.attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))


def test_pre_ampere_rejection_names_the_function(monkeypatch):
    from tylopy_kernels.attention.decode import launch as decode_launch
    from tylopy_kernels.attention.portable import launch as portable_launch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    monkeypatch.setattr(decode_launch, "_archs", {})
    monkeypatch.setattr(portable_launch, "_archs", {})
    with pytest.raises(ValueError, match="attention_decode: q expects a tensor on a GPU of compute capability 8.0"):
        decode_launch.compiled_for(decode_launch.kd.attention_decode_fwd, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="attention_varlen: query expects a tensor on a GPU of compute capability"):
        portable_launch.compiled_for(torch.device("cuda", 0), entry="attention_varlen")
    with pytest.raises(ValueError, match="^attention: query expects a tensor on a GPU of compute capability"):
        portable_launch.compiled_for(torch.device("cuda", 0))


# -- ring attention over gloo ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ring_attention_compiles_without_graph_breaks_over_gloo():
    worker = os.path.join(ROOT, "tests", "ring_compile_worker.py")
    port = str(29000 + os.getpid() % 3000)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, worker, str(r), "2", port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    for rank, (stdout, _) in enumerate(outs):
        line = next(ln for ln in stdout.splitlines() if ln.startswith("RING"))
        _, r, graphs, breaks, diff = line.split()
        assert (int(r), int(graphs), int(breaks)) == (rank, 1, 0), line
        assert float(diff) < 1e-12, line
