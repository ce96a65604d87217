"""bias_gelu's forward as short tiles (bench/explore/bias_map_tiles.cu bias_map_tile, several shapes)
against the library's call (the map kernel) and torch, at bench_elementwise's shape (64M elements
as 16384 x 4096), both GELU forms, every dtype, in interleaved rounds, the variants launched through
CuPy, each allocating its output as the library does, and the map kernel in the capped launch shape
of the light ops on sm_90 (_launch.map_shape: 128 threads, unused dynamic shared memory holding 13
blocks an SM). Every variant's output must be the map kernel's bits. Run 1 (session 17) also had the
library taking the 256 x 32 tiles (since removed): no shape beat the map kernel but bfloat16 erf
(94.1 against 96.9 us). The capped shape was timed by bench/explore_bias_gelu_fwd.py, since merged
here (git history: 5e29e20; bench/results/explore_bias_gelu_fwd.md). Needs nvcc (or the cubin built
beforehand: python bench/explore_bias_map_tiles.py --build 90, carried in bench/.cubins).

    python bench/explore_bias_map_tiles.py [--out bench/results]
"""
import os
import sys

import numpy
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "explore", "bias_map_tiles.cu")
ROWS, COLS = 16384, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SHAPES = [(128, 16, 1), (128, 32, 2), (256, 32, 1), (256, 64, 2), (256, 128, 4), (512, 64, 1), (512, 128, 2),
          (1024, 128, 1)]


def cubin(arch):
    """The exploration cubin for sm_<arch> (bench/cubins.py build_source: cached by content in
    bench/.cubins)."""
    from cubins import build_source

    return build_source(SOURCE, arch)


def main():
    if "--build" in sys.argv:
        print(cubin(sys.argv[sys.argv.index("--build") + 1]))
        return 0
    sys.path.insert(0, HERE)
    from timing import device_times_us, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    import cupy

    from rawops import elementwise as ew
    from rawops import torch_adapter as ta
    from rawops._launch import allocating_on

    major, minor = torch.cuda.get_device_capability(0)
    module = cupy.RawModule(path=cubin(f"{major}{minor}"))
    torch_stream = torch.cuda.current_stream().cuda_stream
    cupy_stream = allocating_on(torch_stream, torch_stream)
    rows = []
    for name, dtype in DTYPES.items():
        x = torch.randn(ROWS, COLS, device="cuda", dtype=dtype)
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        nbytes = 2 * x.numel() * x.element_size()
        for mode, approximate in (("tanh", "tanh"), ("erf", "none")):
            def library(approximate=approximate):
                return ta.bias_gelu(x, bias, approximate)

            kernel_name = f"bias_gelu_{mode}_fwd"
            capped = ew.MapKernel(ew.FAMILY, kernel_name, *ew.KERNELS[kernel_name], capped=True)
            reference = library()
            candidates = {"library": library, "map, capped launch": lambda capped=capped: capped.torch_call(x, c=bias),
                          "torch": lambda approximate=approximate: F.gelu(x + bias, approximate=approximate)}
            same = {"map, capped launch": torch.equal(candidates["map, capped launch"](), reference)}
            for threads, tile_rows, per in SHAPES:
                fn = module.get_function(f"bias_gelu_{mode}_fwd_tile_{threads}_{tile_rows}_{per}_{name}")
                vecs = threads * per // tile_rows
                grid = -(-ROWS // tile_rows) * (COLS // (vecs * 16 // x.element_size()))

                def run(fn=fn, grid=grid, threads=threads):
                    out = torch.empty_like(x)
                    fn((grid,), (threads,), (numpy.uint64(x.data_ptr()), numpy.uint64(0), numpy.uint64(bias.data_ptr()),
                                             numpy.uint64(out.data_ptr()), numpy.int64(x.numel()), numpy.int64(0),
                                             numpy.int64(COLS), numpy.float32(0)), stream=cupy_stream)
                    return out

                label = f"{tile_rows} rows x {vecs} vectors, {threads} threads, {per} a thread"
                same[label] = torch.equal(run(), reference)
                candidates[label] = run
            times = device_times_us(candidates)
            for label, us in times.items():
                row = {"dtype": name, "gelu": mode, "variant": label, "us": us, "TB/s": nbytes / us / 1e6,
                       "of copy ceiling": nbytes / us / 1e6 / ceiling, "x library": times["library"] / us,
                       "map's bits": same.get(label, "-")}
                rows.append(row)
                print(f"{name:5s} {mode:4s} {label:45s} {us:8.1f} us {row['of copy ceiling']:.3f} "
                      f"{same.get(label, '-')}", flush=True)
        del x
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_map_tiles", "python bench/explore_bias_map_tiles.py", [
        (f"bias_gelu forward, {ROWS}x{COLS}: short tiles vs the map kernel",
         ["dtype", "gelu", "variant", "us", "TB/s", "of copy ceiling", "x library", "map's bits"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
