"""normalize_volume's two passes apart (issue 27: u8 -> f16 at 0.64 of the H200's copy ceiling, 0.82 of the
H100's: the same throughput on both cards, so not memory-bound). For each input / output dtype at 512^3:
the min/max pass alone, the map alone (lo and hi given), the whole call, with the shipped fatbin's map
(integer voxels through map_int) and with the same source built with RAWOPS_VOLUME_DIVIDE (div.rn and
I2F, as before) as a cubin, beside a copy of each pass's bytes; interleaved (bench/timing.py).
Experiment, not a bench.
    python dev/time_volume.py
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

import rawops  # noqa: E402
from rawops import image  # noqa: E402

N = 512 ** 3
CASES = (("uint8", "float16"), ("uint8", "float32"), ("uint16", "float32"), ("uint16", "float16"))


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s, {N} voxels")
    divide = build_modules("image", {"divide": ["RAWOPS_VOLUME_DIVIDE=1"]})["divide"]
    shipped_function = image._function
    for in_dtype, out_dtype in CASES:
        high = 256 if in_dtype == "uint8" else 65536
        vol = cupy.asarray(torch.randint(0, high, (N,), dtype=torch.int32, device="cuda")).astype(in_dtype)
        name = f"normalize_volume_fwd_{image.SUFFIX[in_dtype]}_{image.SUFFIX[out_dtype]}"
        old = divide.get_function(name).kernel.ptr

        def with_divide(call):
            def run():
                image._function = lambda n, d: old if n == name else shipped_function(n, d)
                try:
                    call()
                finally:
                    image._function = shipped_function
            return run
        whole = lambda: rawops.normalize_volume(vol, out_dtype=out_dtype)  # noqa: E731
        mapped = lambda: rawops.normalize_volume(vol, 3, high - 7, out_dtype=out_dtype)  # noqa: E731
        isz, osz = vol.itemsize, cupy.dtype(out_dtype).itemsize
        pass_bytes = {"whole": N * (2 * isz + osz), "map": N * (isz + osz), "minmax": N * isz}
        copies = {k: (torch.empty(v // 2, dtype=torch.uint8, device="cuda"),
                      torch.empty(v // 2, dtype=torch.uint8, device="cuda")) for k, v in pass_bytes.items()}
        calls = {"whole": whole, "whole divide": with_divide(whole), "map": mapped, "map divide": with_divide(mapped)}
        calls.update({f"copy {k}": (lambda d=d, s=s: d.copy_(s)) for k, (s, d) in copies.items()})
        times = timing.device_times_us(calls, reps=20, rounds=5)
        times["minmax (whole - map)"] = times["whole"] - times["map"]
        print(f"== {in_dtype} -> {out_dtype}")
        for label, us in times.items():
            key = label.split()[1] if label.startswith("copy") else label.split()[0]
            print(f"  {label:22s} {us:7.1f} us  {pass_bytes[key] / us / 1e6 / ceiling:.3f} of ceiling")


if __name__ == "__main__":
    main()
