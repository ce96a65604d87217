"""bias_gelu's backward as short tiles (bench/explore/bias_bwd_tiles.cu): blocks shaped like the map
kernels', one 16-byte vector of one row a thread, each block's column sums over its rows into a
partial row that column_sum_final adds in order. Timed at 16384 x 4096 (tanh) per dtype beside the
library's call ("shipped": the tiles of kernels/elementwise.cu since session 10; "walkers": the same
call with rawops.elementwise.USE_BIAS_BWD_TILE off, what shipped before) and torch, in interleaved
rounds. dx must be the library's bits and dbias the same bits on every run. Needs nvcc (or the cubin built beforehand: python
bench/explore_bias_bwd_tiles.py --build 90, carried in bench/.cubins).

    python bench/explore_bias_bwd_tiles.py [--out bench/results]
    python bench/explore_bias_bwd_tiles.py --routing   # the library's call, tiles (USE_BIAS_BWD_TILE)
                                                       # on and off, at the shapes that reach it
    python bench/explore_bias_bwd_tiles.py --fused-final   # staged in session 10, not yet run: the
                                                           # tiles with column_sum_final folded in
                                                           # (the last block of a column tile adds it)
    python bench/explore_bias_bwd_tiles.py --alloc     # also each half-type shape in ALLOC_SHAPES
                                                       # with dx, dbias, partial allocated per call
                                                       # (as the library call does)
"""
import os
import sys

import numpy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "explore", "bias_bwd_tiles.cu")
ROWS, COLS = 16384, 4096
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (threads, rows a tile, rows a thread). Run 1 (00:40, bench/results/explore_bias_bwd_tiles.md in git
# history) also had 4-vector tiles (256 x 64 rows, 512 x 128, 128 x 32): 10-40% slower for the
# half types (a warp's row segments 64 bytes).
# Run 2 (00:38) also had 512 x 32 rows x 16 vectors, 1024 x 32 x 32 and 512 x 128 rows x 2 a thread:
# none the best of any dtype. Run 3 times each dtype on TRIALS fresh allocations (the bf16 tiles of
# run 2 were 10-30% slower than f16's, and f16's 512 x 64 moved 146.7 -> 141.1 us between runs).
# Run 4: (threads, rows a tile, rows a thread, dynamic shared memory KB to cap the blocks an SM).
# Run 7 (session 17): the tiles round dx in packed pairs (dtype.cuh from_float2; bfloat16 had one
# F2F.BF16.F32 an element): do the half types' shapes move? Runs 1-6 timed SHAPES_RUN4.
# Run 8 (session 18): the tiles also read their operands in pairs (to_float2: bfloat16's pair from one
# 32-bit word), which took the bfloat16 tiles from 56 registers to 40 (2 -> 3 blocks of 512 an SM). The
# library's fatbin carried from the commit before, so "shipped" is the old code beside every shape new.
# Then the library itself timed with each fatbin (new, old, new; 23:22): bfloat16 141.0-141.2 us against
# 139.6-139.8, and float16's exact tiles, whose SASS changed only in scheduling, 142.5-143.2 against
# 138.8. Reverted (bench/results/explore_bias_bwd_tiles_pairs.md).
# Run 9 (session 18): dx stored by one STG.E.128 a vector (dtype.cuh store16_pinned) where nvcc had
# split store16 into four 32-bit STG.E in every tile kernel; the library's fatbin swapped as in run 8.
SHAPES_RUN4 = [(512, 64, 1, 0), (512, 64, 1, 64), (512, 64, 1, 100), (1024, 64, 1, 0), (1024, 128, 1, 0),
               (512, 64, 2, 0), (512, 128, 2, 0), (512, 128, 2, 64), (512, 256, 4, 0), (256, 128, 4, 0)]
SHAPES = [(512, 64, 1, 0), (1024, 128, 1, 0), (512, 64, 2, 0), (512, 128, 2, 0), (256, 64, 2, 0), (256, 128, 4, 0),
          (512, 256, 4, 0)]
TRIALS = 2
RUN_DTYPES = ("bf16", "f16")  # run 7: the half types only
ALLOC_SHAPES = [(512, 64, 1, 0), (256, 128, 4, 0)]


def cubin(arch):
    """The exploration cubin for sm_<arch> (bench/cubins.py build_source: cached by content in
    bench/.cubins)."""
    from cubins import build_source

    return build_source(SOURCE, arch)


ROUTING_SHAPES = [((16384, 4096), True), ((8192, 3072), False), ((32, 3072), False), ((4096, 768), True)]


def routing():
    """rawops' fused backward (torch_adapter._bias_gelu_bwd_fused: dx + dbias, or linear_gelu's dpre +
    dbias without a bias) with the short tiles and with the walkers, interleaved rounds, each
    dtype and shape; the bias-free shapes are linear_gelu's backward (8192 and 32 tokens, 3072)."""
    sys.path.insert(0, HERE)
    from timing import device_times_us, start, switched, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    rows = []
    for name, dtype in DTYPES.items():
        for (r, c), with_bias in ROUTING_SHAPES:
            dy, x = (torch.randn(r, c, device="cuda", dtype=dtype) for _ in range(2))
            bias = torch.randn(c, device="cuda", dtype=dtype) if with_bias else None

            def call(tiles):
                return switched(ew, "USE_BIAS_BWD_TILE", tiles, lambda: ta._bias_gelu_bwd_fused(dy, x, bias, "tanh"))

            a, b = call(True)(), call(False)()
            same = torch.equal(a[0], b[0])
            times = device_times_us({"tiles": call(True), "walkers": call(False)}, rounds=8)
            nbytes = 3 * dy.numel() * dy.element_size()
            row = {"dtype": name, "shape": f"{r}x{c}", "bias": with_bias, "tiles us": times["tiles"],
                   "walkers us": times["walkers"], "tiles TB/s": nbytes / times["tiles"] / 1e6,
                   "x walkers": times["walkers"] / times["tiles"], "dx same bits": same}
            rows.append(row)
            print(row, flush=True)
    write_results(out_dir, "explore_bias_bwd_routing", "python bench/explore_bias_bwd_tiles.py --routing", [
        ("fused GELU backward + column sums: short tiles vs walkers (the library's call)",
         ["dtype", "shape", "bias", "tiles us", "walkers us", "tiles TB/s", "x walkers", "dx same bits"], rows, {})])
    return 0


FUSED_FINAL_SHAPES = {"f32": [(1024, 64, 1)], "f16": [(512, 64, 1), (256, 128, 4)], "bf16": [(256, 128, 4)]}


def fused_final():
    """The library's call against the tile kernels with the final sum folded in (bias_bwd_tile_fused_final,
    bench/explore/bias_bwd_tiles.cu) and against the same shape's plain tile kernel + column_sum_final,
    interleaved; dx must be the library's bits, dbias the same bits on every call (the counters reset)
    and within rounding of float64."""
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

    cc = torch.cuda.get_device_capability(0)
    module = cupy.RawModule(path=cubin(f"{cc[0]}{cc[1]}"))
    device = torch.cuda.current_device()
    torch_stream = torch.cuda.current_stream().cuda_stream
    cupy_stream = allocating_on(torch_stream, torch_stream)
    rows, notes = [], {}
    for name, dtype in DTYPES.items():
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        nbytes = 3 * dy.numel() * dy.element_size()
        ref_dx, _ = ta._bias_gelu_bwd(dy, x, bias, "tanh")
        ref64 = ref_dx.double().sum(0)
        candidates = {"shipped (library call)": lambda: ta._bias_gelu_bwd(dy, x, bias, "tanh")}
        for threads, tile_rows, per in FUSED_FINAL_SHAPES[name]:
            vecs = threads * per // tile_rows
            chunks, col_tiles = ROWS // tile_rows, COLS // (vecs * (16 // dy.element_size()))
            dx = torch.empty_like(dy)
            dbias = torch.empty(COLS, device="cuda", dtype=dtype)
            partial = torch.empty(chunks, COLS, device="cuda", dtype=torch.float32)
            counters = torch.zeros(col_tiles, device="cuda", dtype=torch.int32)
            ptrs = tuple(numpy.uint64(t.data_ptr()) for t in (dy, x, bias, dx, partial))
            plain = module.get_function(f"bias_gelu_tanh_bwd_tile_{threads}_{tile_rows}_{per}_{name}")
            folded_all = module.get_function(f"bias_gelu_tanh_bwd_tile_ff_{threads}_{tile_rows}_{per}_{name}")
            folded_one = module.get_function(f"bias_gelu_tanh_bwd_tile_ff1_{threads}_{tile_rows}_{per}_{name}")

            def run_plain(plain=plain, ptrs=ptrs, grid=chunks * col_tiles, threads=threads, chunks=chunks,
                          partial=partial, dbias=dbias, dx=dx):
                plain((grid,), (threads,), ptrs + (numpy.int64(ROWS), numpy.int64(COLS)), stream=cupy_stream)
                ew._launch_column_sum_final(device, name, partial.data_ptr(), dbias.data_ptr(), chunks, COLS,
                                            torch_stream)
                return dx, dbias

            def folded_runner(folded):
                def run_folded(folded=folded, ptrs=ptrs, grid=chunks * col_tiles, threads=threads, dx=dx,
                               dbias=dbias, counters=counters):
                    folded((grid,), (threads,), ptrs + (numpy.int64(ROWS), numpy.int64(COLS),
                                                        numpy.uint64(counters.data_ptr()),
                                                        numpy.uint64(dbias.data_ptr())), stream=cupy_stream)
                    return dx, dbias
                return run_folded

            label = f"{tile_rows} rows x {vecs} vectors, {threads} threads, {per} row(s) each"
            candidates[f"{label}, + column_sum_final"] = run_plain
            for how, folded in (("every thread fences", folded_all), ("thread 0 fences", folded_one)):
                run_folded = folded_runner(folded)
                dx.fill_(float("nan"))
                first = run_folded()[1].clone()
                second = run_folded()[1].clone()
                torch.cuda.synchronize()
                err = ((first.double() - ref64).norm() / ref64.norm()).item()
                key = f"{name}, {label}, folded, {how}"
                notes[key] = (f"dx bit-identical to the library's: {torch.equal(dx, ref_dx)}; dbias repeatable: "
                              f"{torch.equal(first, second)}; counters back to 0: "
                              f"{int(counters.abs().sum().item()) == 0}; rel error {err:.2e}")
                print(key, notes[key], flush=True)
                candidates[f"{label}, final folded in, {how}"] = run_folded
        times = device_times_us(candidates, rounds=8)
        for label, us in times.items():
            rows.append({"dtype": name, "variant": label, "us": us, "TB/s": nbytes / us / 1e6,
                         "of copy ceiling": nbytes / us / 1e6 / ceiling})
            print(f"{name:5s} {label:70s} {us:8.1f} us {nbytes / us / 1e6:5.3f} TB/s", flush=True)
        del dy, x
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_bwd_fused_final", "python bench/explore_bias_bwd_tiles.py --fused-final", [
        (f"bias_gelu backward (dx + dbias), {ROWS}x{COLS}, tanh: column_sum_final folded into the tiles",
         ["dtype", "variant", "us", "TB/s", "of copy ceiling"], rows, notes)])
    return 0


def main():
    if "--fused-final" in sys.argv:
        sys.argv.remove("--fused-final")
        return fused_final()
    alloc = "--alloc" in sys.argv
    if alloc:
        sys.argv.remove("--alloc")
    if "--routing" in sys.argv:
        sys.argv.remove("--routing")  # timing.start parses the rest
        return routing()
    if "--build" in sys.argv:
        print(cubin(sys.argv[sys.argv.index("--build") + 1]))
        return 0
    sys.path.insert(0, HERE)
    from timing import device_times_us, start, switched, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    import cupy

    from rawops import elementwise as ew
    from rawops import torch_adapter as ta

    module = cupy.RawModule(path=cubin(torch.cuda.get_device_capability(0)[0].__str__() +
                                       torch.cuda.get_device_capability(0)[1].__str__()))
    device = torch.cuda.current_device()
    from rawops._launch import allocating_on

    torch_stream = torch.cuda.current_stream().cuda_stream
    cupy_stream = allocating_on(torch_stream, torch_stream)  # the same stream, as CuPy's launch wants it
    rows, notes = [], {}
    for trial, (name, dtype) in [(t, item) for item in reversed(DTYPES.items()) for t in range(TRIALS)
                                 if item[0] in RUN_DTYPES]:
        # a spacer of a different size each trial: the operands land at other addresses
        spacer = torch.empty((trial * 37 + 1) << 20, dtype=torch.uint8, device="cuda")
        dy, x = (torch.randn(ROWS, COLS, device="cuda", dtype=dtype) for _ in range(2))
        bias = torch.randn(COLS, device="cuda", dtype=dtype)
        nbytes = 3 * dy.numel() * dy.element_size()
        ref_dx, ref_db = ta._bias_gelu_bwd(dy, x, bias, "tanh")
        v = 16 // dy.element_size()
        walkers = switched(ew, "USE_BIAS_BWD_TILE", False, lambda: ta._bias_gelu_bwd(dy, x, bias, "tanh"))
        candidates = {"shipped": lambda: ta._bias_gelu_bwd(dy, x, bias, "tanh"), "walkers": walkers,
                      "torch (gelu_backward + sum)": lambda: (
                          lambda g: (g, g.sum(0)))(torch.ops.aten.gelu_backward(dy, x + bias, approximate="tanh"))}
        for threads, tile_rows, per, smem_kb in SHAPES:
            kernel = module.get_function(f"bias_gelu_tanh_bwd_tile_{threads}_{tile_rows}_{per}_{name}")
            vecs = threads * per // tile_rows
            chunks = ROWS // tile_rows
            grid = chunks * (COLS // (vecs * v))
            dx = torch.empty_like(dy)
            dbias = torch.empty(COLS, device="cuda", dtype=dtype)
            partial = torch.empty(chunks, COLS, device="cuda", dtype=torch.float32)
            args = tuple(numpy.uint64(t.data_ptr()) for t in (dy, x, bias, dx, partial)) + (
                numpy.int64(ROWS), numpy.int64(COLS))

            if smem_kb:
                kernel.max_dynamic_shared_size_bytes = smem_kb << 10

            def run(kernel=kernel, grid=grid, threads=threads, args=args, partial=partial, dx=dx, dbias=dbias,
                    chunks=chunks, smem=smem_kb << 10):
                kernel((grid,), (threads,), args, stream=cupy_stream, shared_mem=smem)
                ew._launch_column_sum_final(device, name, partial.data_ptr(), dbias.data_ptr(), chunks, COLS,
                                            torch_stream)
                return dx, dbias

            dx.fill_(float("nan"))
            run()
            first = dbias.clone()
            run()
            torch.cuda.synchronize()
            label = (f"tiles of {tile_rows} rows x {vecs} vectors, {threads} threads, {per} row(s) each"
                     + (f", {smem_kb} KB shared" if smem_kb else "") + f" ({grid} blocks)")
            same_dx = torch.equal(dx, ref_dx)
            repeat = torch.equal(first, dbias)
            ref64 = ref_dx.double().sum(0)
            err = ((dbias.double() - ref64).norm() / ref64.norm()).item()
            err_shipped = ((ref_db.double() - ref64).norm() / ref64.norm()).item()
            notes[f"{name} trial {trial}, {label}"] = (f"dx bit-identical to shipped: {same_dx}; dbias repeatable: {repeat}; "
                                         f"dbias rel error vs float64 sum of dx {err:.2e} (shipped {err_shipped:.2e})")
            print(f"{name} trial {trial} {label}: {notes[f'{name} trial {trial}, {label}']}", flush=True)
            candidates[label] = run
            if alloc and name != "f32" and (threads, tile_rows, per, smem_kb) in ALLOC_SHAPES:
                def run_alloc(kernel=kernel, grid=grid, threads=threads, chunks=chunks, dy=dy, x=x, bias=bias):
                    out = torch.empty_like(dy)
                    db = torch.empty(COLS, device="cuda", dtype=dy.dtype)
                    part = torch.empty(chunks, COLS, device="cuda", dtype=torch.float32)
                    kernel((grid,), (threads,), tuple(numpy.uint64(t.data_ptr()) for t in (dy, x, bias, out, part))
                           + (numpy.int64(ROWS), numpy.int64(COLS)), stream=cupy_stream)
                    ew._launch_column_sum_final(device, name, part.data_ptr(), db.data_ptr(), chunks, COLS,
                                                torch_stream)
                    return out, db

                candidates[label + ", allocating per call"] = run_alloc
                if name == "f16" and (threads, tile_rows, per) == ew.BIAS_BWD_TILE_SHAPE[1]:
                    # the library's kernel and launch path crossed with the explorer's: which of
                    # the two makes the library call slower than this variant?
                    from rawops import _modules

                    lib_kernel = _modules.get_function("elementwise", "bias_gelu_tanh_bwd_tile_f16", device)
                    candidates["library kernel, CuPy launch (allocating)"] = (
                        lambda run_alloc=run_alloc, lib_kernel=lib_kernel: run_alloc(kernel=lib_kernel))
                    real_pointer = _modules.function_pointer

                    def variant_through_library(kernel=kernel):
                        _modules.function_pointer = (lambda family, fn, dev: kernel.kernel.ptr
                                                     if fn == "bias_gelu_tanh_bwd_tile_f16" else real_pointer(family, fn, dev))
                        try:
                            return ta._bias_gelu_bwd(dy, x, bias, "tanh")
                        finally:
                            _modules.function_pointer = real_pointer

                    candidates["variant kernel, library call"] = variant_through_library
        times = device_times_us(candidates)
        for label, us in times.items():
            rows.append({"dtype": name, "trial": trial, "variant": label, "us": us, "TB/s": nbytes / us / 1e6,
                         "of copy ceiling": nbytes / us / 1e6 / ceiling, "x shipped": times["shipped"] / us})
            print(f"{name:5s} {trial} {label:60s} {us:8.1f} us {nbytes / us / 1e6:5.3f} TB/s", flush=True)
        del dy, x, spacer
        torch.cuda.empty_cache()
    write_results(out_dir, "explore_bias_bwd_tiles", "python bench/explore_bias_bwd_tiles.py", [
        (f"bias_gelu backward (dx + dbias), {ROWS}x{COLS}, tanh: short tiles vs shipped",
         ["dtype", "trial", "variant", "us", "TB/s", "of copy ceiling", "x shipped"], rows, notes)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
