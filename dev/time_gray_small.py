"""Why rgb_to_gray u8 on a 4K frame reads anywhere from 13.7 to 32 us between runs of bench_image
(history.csv, H100 and H200, the same kernel), while the same-size copy beside it reads ~12.3 every
time (issue 27: the 4K rows' bar, 0.9 of that copy). Each way of timing it, three times over in one
process, so the spread within a run shows beside the medians:

  bench      the torch adapter on rotated inputs (2x L2 of them), a new output each call (bench_image's)
  own out    the CuPy API, each rotated input with its own output (no allocator in the loop)
  one out    the CuPy API, one output for every input
  copy       a device copy of the same bytes into one destination (bench_image's floor)
  copy rot   the same copy, each source with its own destination
  ... cold   the same with L2 flushed (a fill of twice its size) before every call, outside the events

8K (4x the bytes, past L2) is timed the same way for reference. Then the kernel at 16 (shipped), 32
and 64 pixels a thread (RAWOPS_IMAGE_PIXELS, cubins from dev/cubins.py: 32, 34 and 48 registers, the
last with an 8-byte stack), each input its own output, outputs checked equal to the shipped call's.
Experiment, not a bench.

    python dev/cubins.py 90 image RAWOPS_IMAGE_PIXELS=32   # (16, 64) where nvcc is; carry dev/.cubins
    python dev/time_gray_small.py
"""
import os
import statistics
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402

import rawops  # noqa: E402
from cubins import build_modules  # noqa: E402
from rawops import image  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402
from rawops._launch import launch  # noqa: E402

WIDTHS = {f"{p} px": [f"RAWOPS_IMAGE_PIXELS={p}"] for p in (16, 32, 64)}

FRAMES = {"4K": (2160, 3840), "8K": (4320, 7680)}
REPEATS = 3


class Cycle:
    def __init__(self, fn, *lists):
        self.fn, self.lists, self.i = fn, lists, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.lists[0])
        return self.fn(*(items[self.i] for items in self.lists))


def cold_us(fn, flush, reps=50):
    """Median device us of fn with L2 flushed before each call (outside the event pair)."""
    for _ in range(5):
        fn()
    stream = torch.cuda.current_stream()
    events = timing.event_pairs(reps, stream)
    for start, end in events:
        flush()
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def main():
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    flush = lambda: scratch.fill_(1)  # noqa: E731
    print(f"{torch.cuda.get_device_name()}, L2 {l2 >> 20} MiB", flush=True)
    for name, (h, w) in FRAMES.items():
        nbytes = h * w * 4
        count = max(1, -(-2 * l2 // (h * w * 3)))
        frames = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device="cuda") for _ in range(count)]
        cp_frames = [cupy.asarray(f) for f in frames]
        outs = [cupy.empty((h, w), cupy.uint8) for _ in frames]
        sources = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in frames]
        dst = torch.empty_like(sources[0])
        dsts = [torch.empty_like(s) for s in sources]
        fns = {
            "bench": Cycle(lambda f: ta.rgb_to_gray(f, torch.uint8), frames),
            "own out": Cycle(lambda f, o: rawops.rgb_to_gray(f, out=o), cp_frames, outs),
            "one out": Cycle(lambda f: rawops.rgb_to_gray(f, out=outs[0]), cp_frames),
            "copy": Cycle(dst.copy_, sources),
            "copy rot": Cycle(lambda d, s: d.copy_(s), dsts, sources),
        }
        for r in range(REPEATS):
            warm = timing.device_times_us(fns)
            cold = {k: cold_us(fns[k], flush) for k in ("bench", "own out", "copy", "copy rot")}
            print(f"{name} ({count} inputs) run {r}: " + "  ".join(f"{k} {v:6.1f}" for k, v in warm.items())
                  + " | cold: " + "  ".join(f"{k} {v:6.1f}" for k, v in cold.items()), flush=True)
        pixels_variants(name, h, w, cp_frames, outs, fns["copy rot"])
        frames = cp_frames = outs = sources = dsts = None
        torch.cuda.empty_cache()


def pixels_variants(name, h, w, frames, outs, copy):
    """rgb_to_gray_fwd_hwc_u8_u8 at each of WIDTHS' pixels a thread, its covering grid as rawops/image.py
    plans it, beside the copy of the same bytes."""
    stream = torch.cuda.current_stream().cuda_stream
    want = [rawops.rgb_to_gray(f) for f in frames]
    fns = {"copy rot": copy}
    for label, module in build_modules("image", WIDTHS).items():
        per = int(label.split()[0])
        kernel = module.get_function("rgb_to_gray_fwd_hwc_u8_u8")
        grid = image.covering(-(-h * w // per))  # a thread a chunk of `per` pixels

        def call(f, o, kernel=kernel, grid=grid):
            launch(kernel.kernel.ptr, (grid,), image.THREADS, 0, stream, (f.data.ptr, o.data.ptr, 1, h * w, 1),
                   image.KINDS["rgb_to_gray_fwd_hwc"], 0)
        for f, o in zip(frames, outs):
            o.fill(0)
            call(f, o)
        ok = all(bool((o == g).all()) for o, g in zip(outs, want))
        print(f"{name} {label}: {kernel.num_regs} registers, grid {grid}: {'equal' if ok else 'WRONG, not timed'}",
              flush=True)
        if ok:
            fns[label] = Cycle(call, frames, outs)
    times = timing.device_times_us(fns)
    print(f"{name} by pixels a thread: " + "  ".join(f"{k} {v:6.1f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
