"""``matmul``: the PyTorch entry point of the Hopper GEMM.

    c = tylopy.matmul(a, b)                              # a @ b
    c = tylopy.matmul(x, w.t(), bias=b, out_dtype=torch.float32)   # a Linear layer
    c = tylopy.matmul(a, b, epilogue=gelu)               # gelu(a @ b) in the kernel's epilogue

``a`` is (..., M, K) (leading dimensions are flattened into M), ``b`` is (K, N); both bf16 or
both fp16, in any layout whose rows or columns are contiguous (``w.t()`` of a Linear weight is
read as it is, MN-major or K-major, without a copy). Accumulation is fp32; the output is
``out_dtype`` (default: the inputs' dtype). ``bias`` (N,) in the inputs' dtype or fp32 is added
in fp32; ``epilogue`` is a function of one f32 value written with ``ty.*`` operations (a
``@ty.func`` or a plain function; ``tylopy_kernels.gemm.epilogues`` has relu, gelu, silu and
scale), applied after the bias. ``schedule`` fixes the kernel's schedule (a dict of its
constexprs: BLOCK_M, BLOCK_N, STAGES, SCHEDULE, GROUP_M, STORE, SPLIT_K); without it
``ty.autotune`` picks one per problem (docs/gemm.md).

Runs on Hopper (sm_90) only; elsewhere it raises with the reason. Every check below runs before
the GPU is touched, so bad input fails the same way on a machine without one. Launches go on the
current stream and never synchronize the host.
"""
from __future__ import annotations

import functools

import torch

DTYPES = (torch.bfloat16, torch.float16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCHEDULE_KEYS = ("BLOCK_M", "BLOCK_N", "STAGES", "SCHEDULE", "GROUP_M", "STORE", "SPLIT_K")


def _fail(exc, arg, expected, got):
    raise exc(f"matmul: {arg} expects {expected}, but got {got}")


def check_inputs(a, b, bias=None, out_dtype=None, epilogue=None, schedule=None):
    """Validate; returns (M, N, K, out_dtype) with M the product of a's leading dimensions."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
        if t.dtype not in DTYPES:
            _fail(TypeError, name, "dtype torch.bfloat16 or torch.float16", t.dtype)
    if a.dim() < 2:
        _fail(ValueError, "a", "a (..., M, K) tensor with at least 2 dimensions", f"shape {tuple(a.shape)}")
    if b.dim() != 2:
        _fail(ValueError, "b", "a 2-D (K, N) tensor", f"shape {tuple(b.shape)}")
    if b.dtype != a.dtype:
        _fail(TypeError, "b", f"a's dtype {a.dtype}", b.dtype)
    if b.device != a.device:
        _fail(ValueError, "b", f"a's device {a.device}", b.device)
    k = a.shape[-1]
    if b.shape[0] != k:
        _fail(ValueError, "b", f"{k} rows (a.shape[-1], the K dimension)", f"shape {tuple(b.shape)}")
    n = b.shape[1]
    m = 1
    for d in a.shape[:-1]:
        m *= d
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            _fail(TypeError, "bias", "a torch.Tensor or None", type(bias).__name__)
        if bias.dim() != 1 or bias.shape[0] != n:
            _fail(ValueError, "bias", f"a 1-D tensor of N = {n} elements", f"shape {tuple(bias.shape)}")
        if bias.dtype not in (a.dtype, torch.float32):
            _fail(TypeError, "bias", f"dtype {a.dtype} (as the inputs) or torch.float32", bias.dtype)
        if bias.device != a.device:
            _fail(ValueError, "bias", f"a's device {a.device}", bias.device)
    if out_dtype is None:
        out_dtype = a.dtype
    elif out_dtype not in OUT_DTYPES:
        _fail(TypeError, "out_dtype", "torch.bfloat16, torch.float16, torch.float32 or None", out_dtype)
    if epilogue is not None:
        if not callable(epilogue):
            _fail(TypeError, "epilogue", "a function of one f32 value (a @ty.func or plain function) or None",
                  type(epilogue).__name__)
    if schedule is not None:
        _check_schedule(schedule, out_dtype)
    return m, n, k, out_dtype


def _check_schedule(schedule, out_dtype):
    from tylopy_kernels.gemm.plan import Plan
    if not isinstance(schedule, dict):
        _fail(TypeError, "schedule", "a dict of the kernel's schedule constexprs or None", type(schedule).__name__)
    unknown = set(schedule) - set(SCHEDULE_KEYS)
    if unknown:
        _fail(ValueError, "schedule", f"keys among {SCHEDULE_KEYS}", sorted(unknown))
    from tylopy_kernels.gemm.launch import full_schedule
    try:
        full = full_schedule(schedule)
        Plan(full["BLOCK_M"], full["BLOCK_N"], full["STAGES"], full["SCHEDULE"],
             "f32" if out_dtype == torch.float32 else "bf16", full["STORE"])
    except ValueError as e:
        raise ValueError(f"matmul: schedule {schedule} is not valid: {e}") from None
    g = full["GROUP_M"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        _fail(ValueError, "schedule GROUP_M", "a positive int", g)
    s = full.get("SPLIT_K", 1)
    if s != "auto" and (isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 64):
        _fail(ValueError, "schedule SPLIT_K", "an int in 1..64 or 'auto'", s)


@functools.lru_cache(maxsize=None)
def _capability(device_index):
    return torch.cuda.get_device_capability(device_index)


# Launch plans of calls seen before, by everything the checks and the plan depend on: a repeated
# call skips the checks, the layout analysis and the autotuner's key (tens of microseconds).
_plans = None  # a PlanCache, made at the end of the module


def _signature(a, b, bias, out_dtype, epilogue, schedule):
    return (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16, b.shape, b.stride(), b.dtype, b.device,
            b.data_ptr() % 16, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            out_dtype, epilogue, None if schedule is None else tuple(sorted(schedule.items())))


class _Call:
    """A cached call: output allocation and the launch plan, for inputs matching its signature."""

    __slots__ = ("plan", "m", "k", "out_shape", "out_dtype", "flatten")

    def __init__(self, plan, m, k, out_shape, out_dtype, flatten):
        self.plan, self.m, self.k, self.out_shape, self.out_dtype = plan, m, k, out_shape, out_dtype
        self.flatten = flatten

    def __call__(self, a, b, bias):
        from tylopy_kernels.gemm.launch import output_buffer
        a2 = a.reshape(self.m, self.k) if self.flatten else a
        out = output_buffer(self.m, self.plan.n, self.out_dtype, a.device)
        self.plan(a2, b, out, bias)  # launches on the current stream of the tensors' device
        if not out.is_contiguous():
            out = out.contiguous()
        return out.view(self.out_shape) if self.flatten else out


def matmul(a, b, bias=None, out_dtype=None, *, epilogue=None, schedule=None):
    """epilogue(a @ b + bias) with fp32 accumulation, as ``out_dtype`` (default a.dtype).

    Differentiable (without an epilogue) and traceable: when an input requires grad, under
    ``torch.compile`` / ``torch.export`` and for meta or fake tensors the call goes through the
    ``tylopy::matmul`` operator (``ops.py``); otherwise it launches the kernel directly."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and through_op(a, b, bias):
        return matmul_through_op(a, b, bias, out_dtype, epilogue, schedule)
    return launch_matmul(a, b, bias, out_dtype, epilogue=epilogue, schedule=schedule)


def launch_matmul(a, b, bias=None, out_dtype=None, *, epilogue=None, schedule=None):
    """``matmul`` on plain CUDA tensors: checks (skipped for a signature seen before) and the launch."""
    try:
        sig = _signature(a, b, bias, out_dtype, epilogue, schedule)
        call = _plans.get(sig)
    except (AttributeError, TypeError):  # not tensors, or an unhashable argument: the checks say why
        sig = call = None
    if call is not None:
        return call(a, b, bias)
    m, n, k, out_dtype = check_inputs(a, b, bias, out_dtype, epilogue, schedule)
    if a.device.type != "cuda":
        _fail(ValueError, "a", "a CUDA tensor", f"a tensor on {a.device}")
    major, minor = _capability(a.device.index)
    if major != 9:
        _fail(RuntimeError, "the device", "a Hopper GPU (sm_90: wgmma and TMA); use torch.matmul elsewhere",
              f"sm_{major}{minor} ({torch.cuda.get_device_name(a.device.index)})")
    from tylopy_kernels.gemm import launch
    out_shape = (*a.shape[:-1], n)
    if m == 0 or n == 0:
        return torch.empty(out_shape, dtype=out_dtype, device=a.device)
    a2 = a.reshape(m, k)
    b2 = b
    if k == 0:  # an empty sum: the kernel still adds the bias and runs the epilogue, on zeros
        a2, b2 = a.new_zeros((m, 8)), b.new_zeros((8, n))
    a3, b3, am, bm = launch.prepare(a2, b2)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    out = launch.output_buffer(m, n, out_dtype, a.device)
    with torch.cuda.device(a.device):
        cfg = launch.full_schedule(schedule) if schedule is not None else \
            launch.run.best_config(a3, b3, out, bias, epilogue, am, bm).kwargs
        plan = launch.make_plan(a3, b3, out, bias, epilogue, am, bm, cfg)
        plan(a3, b3, out, bias)
    # Remember the plan when a repeat needs no copies: the operands went to the kernel as they are.
    if sig is not None and k > 0 and a3.data_ptr() == a2.data_ptr() and b3 is b and (bias is None or sig[10][1] == (1,)):
        _plans.put(sig, _Call(plan, m, k, out_shape, out_dtype, a.dim() != 2 or a2.data_ptr() != a.data_ptr()))
    if not out.is_contiguous():
        out = out.contiguous()
    return out.view(out_shape)


from tylopy_kernels.gemm.ops import matmul_through_op, through_op  # noqa: E402  (imports only torch)


# Last: tylopy imports this module's entry points (tylopy/functions.py), so whichever package is
# imported first, the names above exist before tylopy's __init__ asks for them.
import tylopy as ty  # noqa: E402

_plans = ty.PlanCache("matmul plans", capacity=1024)
