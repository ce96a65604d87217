"""Shared pieces of the GPU tests: fresh random inputs, float64 references, tolerances."""
import cupy
import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative-norm tolerance per dtype: float32 math then one rounding to the storage type.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
# The norm an error is measured against never goes under this per element. Inputs are O(1),
# so outputs below 1e-6 come from exp() of large arguments, where float32 evaluation itself
# is only good to ~1e-5 relative (torch's float32 kernels included); float16 below its
# smallest normal rounds in absolute terms.
NORM_FLOOR = {torch.float32: 1e-6, torch.float16: 6.1e-5, torch.bfloat16: 1e-6}


def random(shape, dtype, scale=2.0, device="cuda"):
    """Fresh normal data rounded to dtype: never zeros, different on every call."""
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def to_cupy(t):
    return cupy.from_dlpack(t)


def to_torch(a):
    return torch.from_dlpack(a)


def written_late(source, stream, into=None):
    """A NaN copy of `source` (in `into`, a view, when given) that `stream` (a torch or CuPy
    stream) overwrites with `source` only after keeping the GPU busy for tens of ms. A kernel
    launched on any other stream reads the NaN (the streams under test are non-blocking), so a
    test of which stream an op runs on can fail; one that only synchronizes afterwards cannot."""
    if isinstance(stream, cupy.cuda.Stream):
        stream = torch.cuda.ExternalStream(stream.ptr, device=source.device)
    x = torch.full_like(source, float("nan")) if into is None else into.fill_(float("nan"))
    torch.cuda.synchronize(source.device)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        x.copy_(source)
    return x


def poison_pool(*nbytes):
    """Leave blocks of 0xFF bytes (NaN in every float type) in CuPy's pool, one per size and
    all freed together, so that the next allocations of those sizes start as NaN and an
    unwritten element cannot pass (a call with two outputs needs two blocks)."""
    blocks = [cupy.empty(max(n, 1), dtype=cupy.uint8) for n in nbytes]
    for block in blocks:
        block.fill(0xFF)
    del blocks, block


def poison_torch_pool(*nbytes):
    """poison_pool for torch's caching allocator (the adapter's outputs come from it): one
    0xFF block per size, all freed together, so that the next allocations of those sizes on
    the current stream most likely start as NaN (best fit may pick another free block)."""
    blocks = [torch.full((max(n, 1),), 0xFF, dtype=torch.uint8, device="cuda") for n in nbytes]
    del blocks


def assert_close(out, ref, dtype, what="", factor=1, floor=0.0):
    """Relative-norm error of out (a tensor or CuPy array) against a float64 reference, held
    to factor x the dtype's tolerance; NaN never passes. floor: the least norm the error is
    relative to (a result that cancels to near 0 is held to the scale of its terms)."""
    out64 = (to_torch(out) if isinstance(out, cupy.ndarray) else out).double()
    assert out64.shape == ref.shape, f"{what}: shape {tuple(out64.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(out64).any(), f"{what}: NaN in output (an element left unwritten?)"
    if ref.numel() == 0:
        return
    scale = max(ref.norm().item(), NORM_FLOOR[dtype] * ref.numel() ** 0.5, floor)
    error = (out64 - ref).norm().item() / scale
    assert error <= factor * TOLERANCE[dtype], f"{what}: relative error {error:.3g} > {factor * TOLERANCE[dtype]:.3g}"
