"""Benchmark of the image family (rgb_to_gray, to_tensor_normalize, normalize_volume) against
the torch composites users write today, in one run on one GPU.

Frames: 4K (2160x3840), 8K (4320x7680) and a batch of 256 224x224 images (the last is about the
size of L2: reported, judged like the others). Volumes: 512^3 uint16 and 256x512x512 float32.
Through the torch adapter (outputs from torch's allocator, like the composites'); CUDA events,
interleaved rounds, medians after warm-up (bench/timing.py), the GPU kept busy while the host
enqueues each call (timing.queued_device_times_us, every column alike): a 4K u8 frame's kernel (17 us
on the H100) is shorter than the adapter's host work, and events around a call on an idle GPU would
time the host (`rawops call alone us`, beside each row: the same call without the queue). Bytes: each
input read once and the output written once; normalize_volume's input twice (its min/max pass, then
the map).
torch composites:
  rgb_to_gray          (img.float() @ w).round().clamp(0, 255).to(torch.uint8)  (float: no rounding)
  to_tensor_normalize  ((img.permute(0, 3, 1, 2).float() / 255) - mean[:, None, None]) / std[:, None, None]
  normalize_volume     v = vol.float(); (v - v.min()) / (v.max() - v.min())
torch.compile of the composite is timed apart on the largest shape of each op.
Inputs below twice L2's size are rotated: each timed call takes the next of enough copies of
the input to span twice L2 (the op, torch and the copy alike), so every call reads DRAM as a
frame arriving from elsewhere would, not the previous call's lines left in L2.
Beside each row, the limits it is judged against:
  copy of same bytes us   a device copy of the same number of bytes (half read, half written,
                          rotated alike), timed in the same rounds: the fastest any kernel moves
                          that many bytes at that size, launch and tail included;
  torch same-traffic copy us   (to_tensor_normalize) torch's dtype-converting copy of the frame
                          into the output dtype, same layout: the op's exact bytes read and
                          written (1 in, 2 or 4 out an element), the write-heavy mix's own rate;
  limit x torch           torch us over the least time those bytes take (at the copy ceiling, or
                          as the same-size copy where that is slower): the largest speed-up over
                          the composite that any kernel could show at that size.
Targets: rgb_to_gray and to_tensor_normalize >= 90% of the copy ceiling measured in the same run
(or, at a size where a copy of the same bytes itself falls short of the ceiling, of that copy's
rate) and >= 10x torch (or >= 90% of the limit x torch where that is below 10x);
normalize_volume >= 85% of the ceiling counting both passes.

    python bench/bench_image.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compiled, device_times_us, row_result, start, write_results  # noqa: E402

HEADER = ["op", "dtype", "shape", "rawops us", "torch us", "torch.compile us", "rawops TB/s", "torch TB/s",
          "of copy ceiling", "copy of same bytes us", "of same-size copy", "torch same-traffic copy us",
          "x torch", "limit x torch", "rawops call alone us", "meets target"]
FRAMES = {"4K": (1, 2160, 3840), "8K": (1, 4320, 7680), "256x224x224": (256, 224, 224)}
COMPILED_FRAME = "8K"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZE = {torch.uint8: 1, torch.uint16: 2, torch.float16: 2, torch.float32: 4, torch.bfloat16: 2}
SHORT = {torch.uint8: "u8", torch.uint16: "u16", torch.float16: "f16", torch.float32: "f32", torch.bfloat16: "bf16"}


def _rotation(make, nbytes):
    """Copies of make()'s input, enough that their bytes (nbytes each) span twice L2: one copy
    where a single input already does."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    first = make()
    return [first] + [first.clone() for _ in range(-(-2 * l2 // nbytes) - 1)]


class _Cycle:
    """fn(next input) on each call, the inputs in turn."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.inputs)
        return self.fn(self.inputs[self.i])


def _measure(ours, theirs, composite, compile_it, nbytes, inputs, same_traffic=None):
    """(rawops us, torch us, copy us, other columns): ours(input) and theirs(input) on the inputs
    in turn, interleaved with a device copy of the same bytes (nbytes / 2 read, nbytes / 2
    written, as many sources as inputs: the op's own limit at its size, fixed launch costs
    included); torch.compile of the composite timed apart. same_traffic(input): torch moving the
    op's exact bytes (reads and writes alike), timed in the same rounds into others."""
    sources = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in inputs]
    dst = torch.empty_like(sources[0])
    fns = {"rawops": _Cycle(ours, inputs), "torch": _Cycle(theirs, inputs), "copy": _Cycle(dst.copy_, sources)}
    if same_traffic is not None:
        fns["same traffic"] = _Cycle(same_traffic, inputs)
    times = device_times_us(fns, queued=True)
    others = {"same traffic": times["same traffic"]} if same_traffic is not None else {}
    others["alone"] = device_times_us({"rawops": fns["rawops"]})["rawops"]
    if compile_it:
        fn = compiled(composite)
        others["torch.compile"] = device_times_us({"compiled": _Cycle(fn, inputs)}, queued=True)["compiled"]
    return times["rawops"], times["torch"], times["copy"], others


def _row(op, dtype, shape, nbytes, us, us_torch, us_copy, others, ceiling, fraction):
    """A HEADER row; met: >= `fraction` of the copy ceiling (or of a same-size copy's rate where
    that is lower), and >= 10x torch (or >= 90% of the limit x torch where that is lower). The
    limit is one floor for both bars: the least time these bytes take, at the copy ceiling or, where
    slower, as a copy of the same size (a small frame's launch and ramp are in it)."""
    tbps = nbytes / us / 1e6
    limit_tbps = min(ceiling, nbytes / us_copy / 1e6)
    limit_x = us_torch / (nbytes / limit_tbps / 1e6)
    speed_bar = min(10.0, 0.9 * limit_x) if fraction == 0.9 else 0.0
    meets = tbps >= fraction * limit_tbps and us_torch / us >= speed_bar
    row = row_result(op, dtype, shape, nbytes, us, us_torch, others, ceiling, meets)
    row["copy of same bytes us"] = us_copy
    row["of same-size copy"] = us_copy / us
    row["limit x torch"] = limit_x
    row["torch same-traffic copy us"] = others.get("same traffic", float("nan"))
    row["rawops call alone us"] = others.get("alone", float("nan"))
    return row


def _frame(n, h, w, dtype, planar=False):
    if dtype == torch.uint8:
        img = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, device="cuda")
    else:
        img = (torch.rand(n, h, w, 3, device="cuda") * 255).to(dtype)
    return img.permute(0, 3, 1, 2).contiguous() if planar else img


def gray_rows(ta, ceiling):
    rows = []
    cases = [(name, torch.uint8, torch.uint8, False) for name in FRAMES]
    cases += [("4K", torch.float32, torch.float32, False), ("4K", torch.uint8, torch.uint8, True),
              ("4K", torch.float16, torch.float16, False)]
    for name, tin, tout, planar in cases:
        pixels = FRAMES[name][0] * FRAMES[name][1] * FRAMES[name][2]
        nbytes = pixels * (3 * SIZE[tin] + SIZE[tout])
        images = _rotation(lambda: _frame(*FRAMES[name], tin, planar), nbytes)
        w = torch.tensor([0.299, 0.587, 0.114], device="cuda")
        if planar:
            def composite(img, w=w):
                return torch.einsum("nchw,c->nhw", img.float(), w).round().clamp(0, 255).to(torch.uint8)
        elif tout == torch.uint8:
            def composite(img, w=w):
                return (img.float() @ w).round().clamp(0, 255).to(torch.uint8)
        else:
            def composite(img, w=w, tout=tout):
                return (img.float() @ w).to(tout)
        us, us_torch, us_copy, others = _measure(lambda img: ta.rgb_to_gray(img, tout, channels_last=not planar),
                                                 composite, composite,
                                                 name == COMPILED_FRAME and not planar and tin == torch.uint8, nbytes,
                                                 images)
        label = "rgb_to_gray" + (" chw" if planar else "")
        rows.append(_row(label, f"{SHORT[tin]}->{SHORT[tout]}", f"{name} ({pixels} px)", nbytes, us, us_torch,
                         us_copy, others, ceiling, 0.9))
        images = None
        torch.cuda.empty_cache()
    return rows


def to_tensor_rows(ta, ceiling):
    rows = []
    cases = [(name, torch.float32, "NCHW") for name in FRAMES]
    cases += [("256x224x224", torch.float16, "NCHW"), ("256x224x224", torch.bfloat16, "NCHW"),
              ("4K", torch.float32, "NHWC")]
    mean = torch.tensor(MEAN, device="cuda")
    std = torch.tensor(STD, device="cuda")
    for name, tout, layout in cases:
        elements = 3 * FRAMES[name][0] * FRAMES[name][1] * FRAMES[name][2]
        nbytes = elements * (1 + SIZE[tout])
        images = _rotation(lambda: _frame(*FRAMES[name], torch.uint8), nbytes)
        if layout == "NCHW":
            def composite(img, tout=tout):
                return (((img.permute(0, 3, 1, 2).float() / 255) - mean[:, None, None]) / std[:, None, None]).to(tout)
        else:
            def composite(img, tout=tout):
                return (((img.float() / 255) - mean) / std).to(tout)
        converted = torch.empty(images[0].shape, dtype=tout, device="cuda")
        us, us_torch, us_copy, others = _measure(
            lambda img: ta.to_tensor_normalize(img, MEAN, STD, tout, layout), composite, composite,
            name == COMPILED_FRAME and tout == torch.float32, nbytes, images, converted.copy_)
        rows.append(_row(f"to_tensor_normalize {layout}", f"u8->{SHORT[tout]}", f"{name}x3", nbytes, us, us_torch,
                         us_copy, others, ceiling, 0.9))
        images = None
        torch.cuda.empty_cache()
    return rows


def volume_rows(ta, ceiling):
    rows = []
    cases = [((512, 512, 512), torch.uint16, torch.float32, True),
             ((256, 512, 512), torch.float32, torch.float32, True),
             ((512, 512, 512), torch.uint8, torch.float16, False)]
    for shape, tin, tout, compile_it in cases:
        if tin == torch.float32:
            vol = torch.randn(shape, device="cuda")
        else:
            vol = torch.randint(0, 60000 if tin == torch.uint16 else 256, shape, dtype=torch.int32,
                                device="cuda").to(tin)

        def composite(vol, tout=tout):
            v = vol.float()
            return ((v - v.min()) / (v.max() - v.min())).to(tout)
        nbytes = vol.numel() * (2 * SIZE[tin] + SIZE[tout])
        us, us_torch, us_copy, others = _measure(lambda vol: ta.normalize_volume(vol, out_dtype=tout), composite,
                                                 composite, compile_it, nbytes, [vol])
        rows.append(_row("normalize_volume", f"{SHORT[tin]}->{SHORT[tout]}", "x".join(map(str, shape)), nbytes, us,
                         us_torch, us_copy, others, ceiling, 0.85))
        vol = None
        torch.cuda.empty_cache()
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    import rawops.torch_adapter.image as ta

    notes = {"copy ceiling TB/s": round(ceiling, 3),
             "bytes": "input read once + output written once (normalize_volume: input twice)"}
    text = write_results(out_dir, "image", "python bench/bench_image.py", [
        ("rgb_to_gray", HEADER, gray_rows(ta, ceiling),
         {**notes, "target": ">= 90% of the copy ceiling and >= 10x the torch composite"}),
        ("to_tensor_normalize", HEADER, to_tensor_rows(ta, ceiling),
         {**notes, "target": ">= 90% of the copy ceiling and >= 10x the torch composite"}),
        ("normalize_volume", HEADER, volume_rows(ta, ceiling),
         {**notes, "target": ">= 85% of the copy ceiling counting both passes"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
