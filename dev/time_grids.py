"""Time the grid-stride kernels whose grids now come from the device (the occupancy API:
rawops._modules.resident_blocks) against the grids they had before (a fixed count of blocks an
SM), on this GPU: device time of each (CUDA events around each call, warm-up, interleaved rounds,
median: bench/timing.py), the old/new ratio (above 1: the new grid is faster) and each as a
fraction of the copy ceiling measured in the same run. Experiment for issue 26 item 1, not a bench.
    python dev/time_grids.py

The old grids, reproduced through the plans' `resident` arguments (or by answering the occupancy
query with the old count while a call runs):
  image          8 blocks of 256 an SM          (IMAGE_BLOCKS_PER_SM)
  elementwise    32 blocks an SM, scalar and strided paths (MAP_SCALAR_BLOCKS_PER_SM)
  glu            32 blocks an SM, element-by-element path (GRID_STRIDE_BLOCKS_PER_SM)
  cross_entropy  2048 threads an SM (2048 // threads blocks), 24 MiB re-read budget
"""
import contextlib
import os
import sys

import cupy
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import timing  # noqa: E402

from rawops import _modules, elementwise, glu, image as im, losses  # noqa: E402
from rawops._launch import MapKernel, launch, sm_count  # noqa: E402

DEVICE = 0


@contextlib.contextmanager
def patched(module, name, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def old_resident(blocks_per_sm):
    """_modules.resident_blocks answering the old fixed count, whatever the kernel."""
    total = blocks_per_sm * sm_count(DEVICE)
    return patched(_modules, "resident_blocks", lambda function, threads, smem, device: total)


def cp(t):
    """A CuPy view of a torch tensor (DLPack: torch exports no bfloat16 __cuda_array_interface__)."""
    return cupy.from_dlpack(t)


def report(rows, name, nbytes, grids, fns, ceiling):
    us = timing.device_times_us(fns)
    old, new = us["old"], us["new"]
    frac = {k: nbytes / v / 1e6 / ceiling for k, v in us.items()}
    print(f"{name:44} grid {grids[0]:>6} -> {grids[1]:>6}  old {old:9.1f} us ({frac['old']:.3f})  "
          f"new {new:9.1f} us ({frac['new']:.3f})  old/new {old / new:.3f}")
    rows.append((name, grids, old, new))


def volume_minmax(rows, ceiling):
    x = torch.rand((512, 512, 512), dtype=torch.float32, device="cuda")
    n = x.numel()
    fn = _modules.function_pointer(im.FAMILY, "volume_minmax_f32", DEVICE)
    new = _modules.resident_blocks(fn, im.THREADS, 0, DEVICE)
    grids = [im.volume_plan(n, "float32", "float32", r, r)[0] for r in (8 * sm_count(DEVICE), new)]
    partials = torch.empty(2 * max(grids), dtype=torch.float32, device="cuda")
    args = (x.data_ptr(), partials.data_ptr(), n, int(x.data_ptr() % 16 == 0))

    def run(blocks):
        return lambda: launch(fn, (blocks,), im.THREADS, 0, 0, args, im.KINDS["volume_minmax"], DEVICE)

    report(rows, "volume_minmax f32 512^3 (kernel)", x.nbytes, grids, {"old": run(grids[0]), "new": run(grids[1])},
           ceiling)

    vol = cp(x)

    def op_old():
        with old_resident(8):
            im.normalize_volume(vol)

    # min/max pass + map pass: x read twice, float32 written once
    report(rows, "normalize_volume f32 512^3 (both passes)", 3 * x.nbytes, grids,
           {"old": op_old, "new": lambda: im.normalize_volume(vol)}, ceiling)


def rgb_to_gray(rows, ceiling):
    images, h, w = 64, 1024, 1024
    x = torch.randint(0, 256, (images, 3, h, w), dtype=torch.uint8, device="cuda")
    y = torch.empty((images, h, w), dtype=torch.uint8, device="cuda")
    pixels = h * w
    per = im.per_step("uint8", "uint8")
    fn = _modules.function_pointer(im.FAMILY, "rgb_to_gray_fwd_chw_u8_u8", DEVICE)
    work = im.chunks(images, pixels, per)
    grids = [im.grid(work, 8 * sm_count(DEVICE)), im.grid(work, _modules.resident_blocks(fn, im.THREADS, 0, DEVICE))]
    args = (x.data_ptr(), y.data_ptr(), images, pixels, im.gray_vec(True, pixels, per, x.data_ptr(), y.data_ptr()))

    def run(blocks):
        return lambda: launch(fn, (blocks,), im.THREADS, 0, 0, args, im.KINDS["rgb_to_gray_fwd_chw"], DEVICE)

    report(rows, "rgb_to_gray chw u8 64x3x1024x1024", x.nbytes + y.nbytes, grids,
           {"old": run(grids[0]), "new": run(grids[1])}, ceiling)


def gelu(rows, ceiling):
    kernel = elementwise.MAP["gelu_erf_fwd"]
    with old_resident(32):  # a twin of the op whose grid bounds are asked (and kept) now: the old ones
        old = MapKernel(kernel.family, kernel.name, kernel.arg_names, kernel.reads_b, kernel.reads_c, kernel.capped)
        old.resident(DEVICE, 2, True)
        old.resident(DEVICE, 2)
    base = torch.randn((16384, 8192), dtype=torch.bfloat16, device="cuda")
    x = cp(base[:, ::2])  # a strided view: the strided kernel
    out = cp(torch.empty(x.shape, dtype=torch.bfloat16, device="cuda"))
    grids = (old.resident(DEVICE, 2, True), kernel.resident(DEVICE, 2, True))
    report(rows, "gelu erf bf16 [:, ::2] of 16384x8192 (strided)", 2 * out.nbytes, grids,
           {"old": lambda: old(x, out=out), "new": lambda: kernel(x, out=out)}, ceiling)
    flat = cp(base.view(-1)[1:1 + (1 << 26)])  # 2 bytes past 16-byte alignment, out aligned: the scalar path
    out = cp(torch.empty(flat.shape, dtype=torch.bfloat16, device="cuda"))
    grids = (old.resident(DEVICE, 2), kernel.resident(DEVICE, 2))
    report(rows, "gelu erf bf16 2^26 misaligned (scalar path)", 2 * out.nbytes, grids,
           {"old": lambda: old(flat, out=out), "new": lambda: kernel(flat, out=out)}, ceiling)


def swiglu(rows, ceiling):
    n = 1 << 26
    gate = cp(torch.randn(n + 1, dtype=torch.bfloat16, device="cuda")[1:])  # off 16 bytes: element by element
    up = cp(torch.randn(n + 1, dtype=torch.bfloat16, device="cuda")[1:])
    out = cp(torch.empty(n + 1, dtype=torch.bfloat16, device="cuda")[1:])
    fn = _modules.function_pointer(glu.FAMILY, "swiglu_fwd_bf16", DEVICE)
    threads, shared = glu.map_shape("swiglu_fwd" in glu.CAPPED, _modules.compute_capability(DEVICE),
                                     _modules.fast_memory(DEVICE))
    work = -(-n // threads)
    grids = (min(work, 32 * sm_count(DEVICE)), min(work, _modules.resident_blocks(fn, threads, shared, DEVICE)))

    def op_old():
        with old_resident(32):
            glu.swiglu(gate, up, out=out)

    report(rows, "swiglu bf16 2^26 misaligned (element path)", 3 * n * 2, grids,
           {"old": op_old, "new": lambda: glu.swiglu(gate, up, out=out)}, ceiling)


def cross_entropy(rows, ceiling):
    n_rows, vocab = 8192, 128256
    x = cp(torch.randn((n_rows, vocab), dtype=torch.bfloat16, device="cuda"))
    t = cp(torch.randint(0, vocab, (n_rows,), device="cuda"))

    def old_per_sm():  # 2048 threads an SM, whatever the kernel's registers allow
        return patched(_modules, "blocks_per_sm", lambda function, threads, smem, device: max(1, 2048 // threads))

    fn = _modules.function_pointer(losses.FAMILY, "cross_entropy_fwd_bf16", DEVICE)
    for grad, nbytes in ((False, x.nbytes), ("new", 3 * x.nbytes)):
        with old_per_sm():
            old_grid = losses.device_plan(fn, DEVICE, n_rows, vocab, 2, bool(grad))[1]
        new_grid = losses.device_plan(fn, DEVICE, n_rows, vocab, 2, bool(grad))[1]

        def op_old(grad=grad):
            with old_per_sm():
                losses.cross_entropy(x, t, grad=grad)

        report(rows, f"cross_entropy bf16 8192x128256 fwd grad={grad}", nbytes, (old_grid, new_grid),
               {"old": op_old, "new": lambda grad=grad: losses.cross_entropy(x, t, grad=grad)}, ceiling)


def main():
    if not torch.cuda.is_available():
        print("time_grids: no CUDA GPU here")
        return 0
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name(DEVICE)}, {sm_count(DEVICE)} SMs, copy ceiling {ceiling:.2f} TB/s "
          "(fractions of it in parentheses)")
    rows = []
    for case in (volume_minmax, rgb_to_gray, gelu, swiglu, cross_entropy):
        case(rows, ceiling)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
