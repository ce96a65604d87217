"""The image kernels' grid: one wave of resident blocks walking the chunks grid-stride (shipped)
against a grid covering every chunk once (short blocks handed out in order: the elementwise maps'
launch, 5-15% faster there than a grid-stride walk on the H100, docs/performance.md). Issue 27:
to_tensor_normalize f32 at 0.83-0.88 of the copy ceiling (bar 0.9), the 16-bit outputs lower.
Each case: the op with both grids and a device copy of the same bytes, interleaved (timing.py).
Experiment, not a bench.
    python dev/time_image_grid.py
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench")]
import timing  # noqa: E402

import rawops  # noqa: E402
from rawops import image  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cases():
    """(label, call, bytes moved)."""
    u8 = lambda *shape: cupy.asarray(torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda"))  # noqa: E731
    frame8k, batch = u8(4320, 7680, 3), u8(256, 224, 224, 3)
    frame4k = cupy.asarray(torch.rand(2160, 3840, 3, device="cuda"))
    vol16 = cupy.asarray(torch.randint(0, 65536, (512, 512, 512), dtype=torch.int32, device="cuda")).astype(
        cupy.uint16)
    vol8 = u8(512, 512, 512)
    px8k, pxb = 4320 * 7680, 256 * 224 * 224
    out = []
    out.append(("rgb_to_gray u8 8K", lambda: rawops.rgb_to_gray(frame8k), px8k * 4))
    out.append(("rgb_to_gray f32 4K", lambda: rawops.rgb_to_gray(frame4k), 2160 * 3840 * 16))
    out.append(("rgb_to_gray u8 256x224^2", lambda: rawops.rgb_to_gray(batch), pxb * 4))
    for dt, size in (("float32", 4), ("float16", 2), ("bfloat16", 2)):
        out.append((f"to_tensor u8->{dt} 256x224^2",
                    lambda dt=dt: rawops.to_tensor_normalize(batch, MEAN, STD, out_dtype=dt), pxb * 3 * (1 + size)))
    out.append(("to_tensor u8->float32 8K", lambda: rawops.to_tensor_normalize(frame8k, MEAN, STD), px8k * 15))
    n = 512 ** 3
    out.append(("normalize_volume u16->f32 512^3", lambda: rawops.normalize_volume(vol16), n * 8))
    out.append(("normalize_volume u8->f16 512^3", lambda: rawops.normalize_volume(vol8, out_dtype="float16"), n * 4))
    return out


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    shipped = image._resident
    # normalize_volume's min/max pass keeps its grid (one partial a block, which every map block
    # re-reduces): only the maps change
    minmax = {image._function(f"volume_minmax_{image.SUFFIX[t]}", 0) for t in ("uint8", "uint16")}
    wide = lambda function, device: shipped(function, device) if function in minmax else 1 << 30  # noqa: E731
    for label, call, nbytes in cases():
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)

        def covering(call=call):
            image._resident = wide
            try:
                call()
            finally:
                image._resident = shipped
        copy = lambda dst=dst, src=src: dst.copy_(src)  # noqa: E731
        times = timing.device_times_us({"resident": call, "covering": covering, "copy": copy}, reps=20, rounds=5)
        print(f"{label:34s} " + "  ".join(f"{k} {v:7.1f} us {nbytes / v / 1e6 / ceiling:.3f}"
                                           for k, v in times.items()))


if __name__ == "__main__":
    main()
