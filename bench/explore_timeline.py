"""Where the time goes inside the two kernels that miss their bars, from %globaltimer stamps
(kernels/include/rawops/timeline.cuh; elementwise.cu and matmul.cu rebuilt here with nvcc and
-DRAWOPS_TIMELINE, launched through CuPy on the shipped plans):

- bias_gelu's fused backward at 16384 x 4096 (thread 0 of each block: entry, its rows done,
  partial written): how far apart blocks start and end, and how long each SM sits idle at the
  end of the launch (a one-wave grid ends with its slowest block; the map kernels, thousands of
  short blocks, balance themselves);
- linear_small_tf32, float32 32x768->3072 (lane 0 of each warp: entry, first operands split,
  partial tile stored, CTA barrier passed, exit): the launch ramp, the wait for the first
  operands from L2, the math, the barrier, the reduction + epilogue; beside an empty kernel of
  the same launch shape (the floor of launching it).

Each instrumented kernel is also timed against the shipped one (the stamps' own cost).
Needs nvcc and a built rawops (the plans).

    python bench/explore_timeline.py [--out bench/results]
"""
import importlib
import os
import sys

import cupy
import numpy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubins import build_modules  # noqa: E402
from timing import device_time_us, graph_per_call_us, start, write_results  # noqa: E402

ROWS, COLS = 16384, 4096
M, K, N = 32, 768, 3072
SLOTS, MARKS = 8192, 8  # timeline.cuh: RAWOPS_TIMELINE_SLOTS, kTimelineMarks
# bench/cubins.py builds these; matmul also unstamped (the stamps' own cost).
# linear_small_tf32's launch shapes (kernels/matmul.cu RAWOPS_SMALL_TF32: clusters of C CTAs
# splitting K, NWN x NWK warps of NT n8 tiles, MIN_BLOCKS CTAs an SM): the shipped one and
# others built with -DRAWOPS_SMALL_TF32_SHAPE, each CTA of a cluster reading 1/C of x.
SHIPPED_SHAPE = (1, 1, 3, 16, 1)
# (Run of 04:37 on 2026-11-24 also had c2n1t6k8 (2, 1, 6, 8, 1), c4n2t3k4b2 (4, 2, 3, 4, 2) and
# c4n4t3k4 (4, 4, 3, 4, 1): 7.6, 12 and 14.7 us against 6.75; 04:46 c2n2t3k8 (2, 2, 3, 8, 1) 7.8:
# bench/NOTES.md, session 12.)
# Session 12, 05:12: clusters of 2 splitting K where each warp pushed its partial rows to their
# owner CTA (-DRAWOPS_SMALL_TF32_PUSH, kernel and explorer in git at 9eacd4c): c2n2t3k8 push 7.3-7.4,
# c2n1t6k8 push 7.6, c2n2t3k8 7.8-7.9 against 6.4 (bench/results/explore_linear_push.md).
# Session 13: c1n1t3k8 with 6 steps loaded before the first split (-DRAWOPS_SMALL_TF32_STEPS=6)
# 6.37-6.40 against 6.40-6.42; the same with a __syncwarp between a round's loads and its math
# (every load issued before the first mma; -DRAWOPS_SMALL_TF32_ORDERED, in git at f4bd552) 7.9.
SHAPES = {}
SHAPE_MACROS = {}  # extra -D macros of a SHAPES entry (e.g. RAWOPS_SMALL_TF32_STEPS=6)
# The shipped shape with the partials summed 2 features a thread (-DRAWOPS_SMALL_TF32_PAIRS).
# Warps past the first F start their loads S ns apart (-DRAWOPS_SMALL_TF32_STAGGER=S, _FREE=F).
# Other builds of the shipped shape, timed beside it: {key: [macro, ...]}; STAMPED_VARIANTS also
# get a stamped row. Session 12 (bench/results/explore_linear_reduce.md; their macros were
# removed after): pairs (now shipped), halves, float2 stores, staggered loads.
# Session 13 probes (wrong output, timed only; macros in git at f4bd552 and 837abe0): the loads
# alone 5.70-5.77 us, the math alone 4.74, no sum after the barrier 5.62-5.72, the sums stored
# without bias and GELU 5.80, against 6.38-6.45 (bench/results/explore_linear_probes.md, _ordered.md,
# _nosum.md, _epilogue.md); the odd-row XOR 16 layout (shipped) against the one before:
# 6.21 against 6.41 (_swizzle.md), where that run's epilogue was also written out (gelu.cuh at
# 837abe0; stride 56 alone gave 6.16 against 6.38, so it was left out).
VARIANTS = {}
VARIANT_STRIDES = {}  # partial-tile row stride (floats) where a variant changes it
STAMPED_VARIANTS = []  # keys of VARIANTS or SHAPES


def shape_macros(shape):
    return ["RAWOPS_SMALL_TF32_SHAPE"] + [f"RAWOPS_SMALL_TF32_{name}={value}" for name, value in
                                          zip(("C", "NWN", "NT", "NWK", "MIN_BLOCKS"), shape)]


def build_macros(key):
    return VARIANTS[key] if key in VARIANTS else shape_macros(SHAPES[key]) + SHAPE_MACROS.get(key, [])


CUBINS = {"elementwise": {"stamped": ["RAWOPS_TIMELINE"]},
          "matmul": {"stamped": ["RAWOPS_TIMELINE"], "unstamped": [],
                     **{f"{key} stamped": ["RAWOPS_TIMELINE"] + build_macros(key) for key in STAMPED_VARIANTS},
                     **VARIANTS, **{key: build_macros(key) for key in SHAPES}}}
DTYPES = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}


def timeline(module):
    """The module's stamps as a (SLOTS, MARKS) uint64 CuPy array (zeroed by the caller)."""
    return cupy.ndarray((SLOTS, MARKS), cupy.uint64, module.get_global("rawops_timeline"))


def run_stamped(module, launch, warmup=20):
    """The stamps of the last of `warmup` + 1 back-to-back launches (steady clocks and L2: a
    launch alone after a synchronize ran up to 20% slower than the events' median, session 8),
    as float64 us with the earliest entry at 0, and the SM ids. Each launch rewrites every slot
    it uses, so the table ends holding the last launch's stamps."""
    stamps = timeline(module)
    stamps.fill(0)
    torch.cuda.synchronize()
    for _ in range(warmup + 1):
        launch()
    torch.cuda.synchronize()
    host = cupy.asnumpy(stamps)
    used = host[:, 0] > 0
    marks, smid = host[used, :MARKS - 1].astype(numpy.float64), host[used, MARKS - 1]
    origin = marks[:, 0].min()
    marks = numpy.where(marks > 0, (marks - origin) / 1e3, numpy.nan)
    return marks, smid


def pct(values):
    """min / median / 99th / max of a column of stamps, us."""
    v = values[~numpy.isnan(values)]
    if v.size == 0:
        return "-"
    return "/".join(f"{x:.2f}" for x in (v.min(), numpy.median(v), numpy.percentile(v, 99), v.max()))


def idle_tail(end, smid):
    """Mean over SMs of the time between the SM's last block end and the launch's last, as a
    fraction of the launch's span: the bandwidth a one-wave grid leaves on the table."""
    span = numpy.nanmax(end)
    last = {}
    for e, s in zip(end, smid):
        last[s] = max(last.get(s, 0.0), e)
    return float(numpy.mean([(span - v) / span for v in last.values()]))


def bias_rows(module, stream, sms):
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    rows = []
    for name, dtype in DTYPES.items():
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        dx = torch.empty_like(x)
        ew.USE_BIAS_BWD_TILE = False  # the walkers (bias_bwd_partial) are what this stamps
        (strips, chunks), _, threads, strip = ew.bias_gelu_bwd_plan(ROWS, COLS, {"f32": 0, "f16": 1, "bf16": 2}[name],
                                                                    (0, 0, 0), sms)
        ew.USE_BIAS_BWD_TILE = True
        partial = torch.empty(chunks, COLS, device="cuda", dtype=torch.float32)
        fused = module.get_function(f"bias_gelu_tanh_bwd_partial_{name}")
        args = tuple(numpy.uint64(t.data_ptr()) for t in (dy, x, bias, dx, partial)) + tuple(
            numpy.int64(v) for v in (ROWS, COLS, strip))

        def launch():
            with stream:
                fused((strips, chunks), (threads,), args)

        marks, smid = run_stamped(module, launch)
        ref_dx, _ = ta._bias_gelu_bwd(dy, x, bias, "tanh")
        assert torch.equal(dx, ref_dx), f"{name}: the stamped kernel's dx differs from the shipped one's"
        start_, done, end = marks[:, 0], marks[:, 1], marks[:, 2]
        us_stamped = device_time_us(launch)
        us_shipped = device_time_us(lambda: ta._bias_gelu_bwd_fused(dy, x, bias, "tanh"))
        rows.append({"kernel": f"bias_gelu bwd partial {name}", "grid": f"{strips}x{chunks} of {threads}",
                     "span us": numpy.nanmax(end), "entry us (min/med/p99/max)": pct(start_),
                     "rows done us": pct(done), "end us": pct(end), "block us": pct(end - start_),
                     "idle tail": idle_tail(end, smid), "stamped us (events)": us_stamped,
                     "shipped us (events, + final sum)": us_shipped})
        print(rows[-1], flush=True)
        del dy, x, dx, partial
        torch.cuda.empty_cache()
    return rows


EMPTY = r'''
extern "C" __global__ void empty_kernel(const float* a, const float* b, float* c, const float* bias,
                                        const float* aux, float* pre, long long m, long long n, long long k,
                                        long long flags) {
  extern __shared__ float smem[];
  if (threadIdx.x == 0 && m < 0) c[blockIdx.x] = smem[0];  // never true: keeps the arguments live
}
'''


def linear_rows(modules):
    """One row per stamped build of linear_small_tf32 (shipped, STAMPED_VARIANTS): its
    stamped phases, and every plain build's time per call in a CUDA graph of 20 (interleaved)."""
    mm = importlib.import_module("rawops.matmul")  # the attribute rawops.matmul is the function

    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") * K ** -0.5
    b = torch.randn(N, device="cuda")
    y = torch.empty(M, N, device="cuda")

    def launch_shape(shape, stride=None):  # (grid, block, dynamic shared bytes), as rawops/matmul.py plans it
        c, nwn, nt, nwk = shape[:4]
        feat = nwn * nt * 8
        stride = stride or (feat + 16 if feat % 32 == 24 else feat + 8)
        return (c * -(-N // feat), -(-M // mm.SMALL_ROWS)), nwn * nwk * 32, nwk * mm.SMALL_ROWS * stride * 4

    assert launch_shape(SHIPPED_SHAPE)[2] == mm.small_tf32_shared_bytes()
    shapes = {"stamped": SHIPPED_SHAPE, "unstamped": SHIPPED_SHAPE, **{key: SHIPPED_SHAPE for key in VARIANTS}, **SHAPES}
    shapes.update({f"{key} stamped": shapes[key] for key in STAMPED_VARIANTS})
    args = tuple(numpy.uint64(p) for p in (x.data_ptr(), w.data_ptr(), y.data_ptr(), b.data_ptr(), 0, 0)) + tuple(
        numpy.int64(v) for v in (M, N, K, mm.EPI_BIAS_GELU | mm.GELU_FLAGS["tanh"]))
    plain = ("unstamped", *VARIANTS, *SHAPES)

    def kernel(fn, shape, stride=None):
        grid, block, shared = launch_shape(shape, stride)
        if shared > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = shared

        def launch():  # on torch's current stream: inside graph capture, the capturing one
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn(grid, (block,), args, shared_mem=shared)
        return launch

    def small(key):
        return kernel(modules[key].get_function("linear_small_tf32_nt_f32"), shapes[key], VARIANT_STRIDES.get(key))

    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), b.double()), approximate="tanh")

    def error_of(launch):  # each build's output checked, not only timed
        y.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        return ((y.double() - ref).norm() / ref.norm()).item()

    from rawops import torch_adapter as ta

    empty = kernel(cupy.RawKernel(EMPTY, "empty_kernel"), SHIPPED_SHAPE)
    rows = []
    for stamped_key, plain_key in (("stamped", "unstamped"), *((f"{key} stamped", key) for key in STAMPED_VARIANTS)):
        stamped = small(stamped_key)
        marks, smid = run_stamped(modules[stamped_key], stamped)
        errors = {key: error_of(small(key)) for key in (stamped_key, *plain)}
        for key, error in errors.items():
            assert "probe" in key or error < 1e-5, f"linear_small_tf32 ({key}) is off: {error:.2e}"
        entry, split, stored, barrier, leave = (marks[:, i] for i in range(5))
        warps = launch_shape(shapes[plain_key])[1] // 32
        summing = min(warps, 12)  # 384 threads sum: 32 rows x 12 feature pairs
        # Interleaved rounds: the two builds and the library timed alternately, medians.
        fns = {"stamped": stamped, **{key: small(key) for key in plain},
               "library": lambda: ta.linear_gelu(x, w, b), "empty": empty}
        times = {key: [] for key in fns}
        for _ in range(3):
            for key, fn in fns.items():
                times[key].append(graph_per_call_us(fn))
        med = {key: float(numpy.median(v)) for key, v in times.items()}
        row = {"kernel": f"linear_small_tf32 f32 32x768->3072, {stamped_key}",
               "grid": "{0[0]}x{0[1]} of {1}, {2} B".format(*launch_shape(shapes[plain_key])),
               "span us": numpy.nanmax(leave), "warp entry us (min/med/p99/max)": pct(entry),
               "first split - entry": pct(split - entry), "stored - first split": pct(stored - split),
               "barrier - stored": pct(barrier - stored), "exit - barrier": pct(leave - barrier),
               # the warps that sum the partials and the others
               "exit - barrier, summing warps": pct((leave - barrier)[numpy.arange(len(leave)) % warps < summing]),
               "exit - barrier, other warps": pct((leave - barrier)[numpy.arange(len(leave)) % warps >= summing]),
               "SMs": len(set(smid.tolist())),
               "this stamped build us/call (graph of 20)": med["stamped"],
               **{f"{'shipped' if key == 'unstamped' else key} us/call (graph of 20)": med[key] for key in plain},
               "library us/call (graph of 20, adapter)": med["library"],
               "empty kernel, same shape, us/call": med["empty"],
               "rel error (stamped, plain builds)": " / ".join(f"{e:.2e}" for e in errors.values())}
        print(row, flush=True)
        rows.append(row)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    modules = {family: build_modules(family, variants) for family, variants in CUBINS.items()}
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with torch.no_grad():
        bias = bias_rows(modules["elementwise"]["stamped"], stream, sms)
        linear = linear_rows(modules["matmul"])
    text = write_results(out_dir, "explore_timeline", "python bench/explore_timeline.py", [
        ("bias_gelu backward, fused kernel, per block (us from the launch's first entry)", list(bias[0]), bias,
         {"copy ceiling TB/s": round(ceiling, 3),
          "idle tail": "mean over SMs of (last end - the SM's last end) / span"}),
        ("linear_small_tf32, per warp (us)", list(linear[0]), linear,
         {"note": "stamped builds run slower than plain ones (the stamps): compare the plain builds' times",
          "shapes": "cC nN tT kK bB: clusters of C CTAs splitting K, N x K warps of T n8 tiles, B CTAs an SM"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
