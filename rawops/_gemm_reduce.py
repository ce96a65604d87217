"""kernels/gemm.cu's gemm_reduce, shared by every GEMM that splits K (the portable kernels,
TF32, the Hopper kernel): it adds the float32 partials in split order (deterministic) and applies
the epilogue. Its launch shape, in one place."""
from . import _constants as C
from ._launch import FLOAT_SUFFIXES

FAMILY = "gemm"
THREADS = C.GEMM_REDUCE_THREADS
KINDS = "ppppppqqqq"  # (partial, 0, c, bias, aux, pre, m, n, splits, flags): rawops.gemm.KINDS


def kernel_name(dtype):
    """gemm_reduce_<f32|f16|bf16> for dtype code 0, 1, 2."""
    return f"gemm_reduce_{FLOAT_SUFFIXES[dtype]}"


def blocks(m, n, sms):
    """gemm_reduce's grid: a thread an output element, at most 8 blocks an SM."""
    return max(1, min(-(-m * n // THREADS), sms * 8))
