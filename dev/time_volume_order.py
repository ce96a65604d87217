"""normalize_volume's map walking the volume from its end (issue 27: u8 -> f16 512^3 at 0.834 of the
H200's copy ceiling counting both passes, bar 0.85): the min/max pass reads the volume from the start,
so a map walking back from the end finds its first reads (up to L2's size) in L2. Variants of
kernels/image.cu as cubins (dev/cubins.py): the walk's direction and the min/max pass's loads in flight
a thread (IMAGE_REDUCE_UNROLL, the plan's REDUCE_UNROLL patched to match); outputs checked against the
shipped kernels' bit for bit, times in interleaved rounds beside a copy of the same bytes (both passes).
Experiment, not a bench.
    python dev/time_volume_order.py
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import _modules, image  # noqa: E402

# name: (macros, REDUCE_UNROLL); the shipped kernels walk from the end with IMAGE_REDUCE_UNROLL loads
VARIANTS = {"from the start (before)": (["RAWOPS_IMAGE_VOLUME_REVERSE=0"], image.REDUCE_UNROLL),
            "from the end, unroll 8": (["RAWOPS_IMAGE_REDUCE_UNROLL=8"], 8)}
CASES = [("uint8", "float16"), ("uint8", "float32"), ("uint16", "float16"), ("uint16", "float32")]


def variant_call(fn, module, unroll):
    shipped = _modules.function_pointer

    def pointer(family, name, device):
        return module.get_function(name).kernel.ptr if family == image.FAMILY else shipped(family, name, device)

    def call():
        saved = image.REDUCE_UNROLL
        _modules.function_pointer, image.REDUCE_UNROLL = pointer, unroll
        try:
            return fn()
        finally:
            _modules.function_pointer, image.REDUCE_UNROLL = shipped, saved
    return call


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    modules = build_modules("image", {name: macros for name, (macros, _) in VARIANTS.items()})
    for in_dtype, out_dtype in CASES:
        top = 255 if in_dtype == "uint8" else 65535
        vol = cupy.asarray(cupy.random.randint(0, top + 1, (512, 512, 512)), dtype=in_dtype)
        nbytes = vol.nbytes * 2 + vol.size * cupy.dtype(out_dtype).itemsize  # both passes' reads, the write
        fn = lambda: image.normalize_volume(vol, out_dtype=out_dtype)  # noqa: E731
        ref = fn()
        calls = {"shipped (from the end)": fn}
        for name, (_, unroll) in VARIANTS.items():
            call = variant_call(fn, modules[name], unroll)
            same = bool(cupy.array_equal(call().view(cupy.uint16 if ref.itemsize == 2 else cupy.uint32),
                                         ref.view(cupy.uint16 if ref.itemsize == 2 else cupy.uint32)))
            calls[f"{name} ({'same bits' if same else 'DIFFERENT'})"] = call
        calls["map alone (lo, hi given)"] = lambda: image.normalize_volume(vol, 0, top, out_dtype=out_dtype)
        src, dst = (torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(2))
        calls["copy same bytes"] = lambda: dst.copy_(src)
        times = timing.device_times_us(calls, reps=20, rounds=5)
        print(f"== 512^3 {in_dtype} -> {out_dtype}")
        for label, us in times.items():
            print(f"  {label:40s} {us:8.1f} us  {nbytes / us / 1e6 / ceiling:.3f} of ceiling")
        sys.stdout.flush()
        calls.clear()
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
