"""kernels/gemm.cu's gemm_reduce, shared by every GEMM that splits K (the portable kernels,
TF32, the Hopper kernel): it adds the float32 partials in split order (deterministic) and applies
the epilogue. Its launch shape, in one place."""
from . import _constants as C, _modules
from ._launch import FLOAT_SUFFIXES

FAMILY = "gemm"
THREADS = C.GEMM_REDUCE_THREADS
KINDS = "ppppppqqqq"  # (partial, 0, c, bias, aux, pre, m, n, splits, flags): rawops.gemm.KINDS


def kernel_name(dtype):
    """gemm_reduce_<f32|f16|bf16> for dtype code 0, 1, 2."""
    return f"gemm_reduce_{FLOAT_SUFFIXES[dtype]}"


def blocks(m, n, resident):
    """gemm_reduce's grid (grid-stride): a thread an output element, at most `resident` blocks
    (those of the kernel the device holds at once: one wave)."""
    return max(1, min(-(-m * n // THREADS), resident))


def function_and_grid(dtype, m, n, device):
    """(gemm_reduce's function pointer for dtype code `dtype` on `device`, its grid for m x n)."""
    function = _modules.function_pointer(FAMILY, kernel_name(dtype), device)
    return function, (blocks(m, n, _modules.resident_blocks(function, THREADS, 0, device)),)
