"""The 16-bit small-batch linear on the tensor pipe (linear_small_mma_nt_<f16|bf16>, kernels/
matmul.cu: linear_small_tc) in other shapes than the shipped one: NT n8 tiles a warp (24 features
a CTA at NT = 3), NWK warps splitting K, STEPS 32-wide K steps loaded per round. Each variant is
its own cubin (bench/cubins.py), launched from a CUDA graph of 20 calls beside the library's call
and torch's (F.linear + gelu, and the cuBLASLt epilogue), and checked against float64.

    python bench/explore_small_mma.py [--out bench/results]
"""
import os
import sys

import numpy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# (NT, NWK, STEPS, MIN_BLOCKS an SM: the register cap); the first is the shipped shape. Run 1
# (14:30, graphs captured nothing: the launches went to the stream current at setup) had
# (3, 16, 2), (3, 4, 3), (3, 8, 2), (2, 8, 3) and (1, 8, 3) at one block an SM.
VARIANTS = [(3, 8, 3, 1), (3, 8, 3, 2), (3, 4, 3, 2), (3, 4, 3, 4), (3, 8, 2, 2), (2, 8, 3, 2)]
SHAPES = [(32, 768, 3072, torch.bfloat16), (128, 768, 3072, torch.bfloat16), (32, 768, 3072, torch.float16),
          (8, 4096, 4096, torch.bfloat16)]
CUBINS = {"matmul": {v: [f"RAWOPS_SMALL_MMA_NT={v[0]}", f"RAWOPS_SMALL_MMA_NWK={v[1]}",
                         f"RAWOPS_SMALL_TF32_STEPS={v[2]}", f"RAWOPS_SMALL_MMA_MINB={v[3]}"] for v in VARIANTS}}


def shared_bytes(nt, nwk):
    feat = nt * 8
    stride = feat + 16 if feat % 32 == 24 else feat + 8
    return nwk * 32 * stride * 4


def main():
    sys.path.insert(0, HERE)
    from cubins import build_modules
    from timing import graph_per_call_us, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    import rawops.matmul  # noqa: F401
    from rawops import torch_adapter as ta
    from rawops._launch import allocating_on

    modules = build_modules("matmul", CUBINS["matmul"])
    rows = []
    for m, k, n, dtype in SHAPES:
        suffix = "bf16" if dtype is torch.bfloat16 else "f16"
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.double(), w.double(), bias.double()),
                                       approximate="tanh")
        y = torch.empty(m, n, device="cuda", dtype=dtype)
        candidates = {"library call (torch_adapter.linear_gelu)": lambda: ta.linear_gelu(x, w, bias),
                      "torch F.linear + F.gelu": lambda: torch.nn.functional.gelu(
                          torch.nn.functional.linear(x, w, bias), approximate="tanh"),
                      "torch cuBLASLt epilogue": lambda: torch._addmm_activation(bias, x, w.t(), use_gelu=True)}
        for variant in VARIANTS:
            nt, nwk, steps, min_blocks = variant
            function = modules[variant].get_function(f"linear_small_mma_nt_{suffix}")
            shared = shared_bytes(nt, nwk)
            function.max_dynamic_shared_size_bytes = shared
            args = tuple(numpy.uint64(p) for p in (x.data_ptr(), w.data_ptr(), y.data_ptr(), bias.data_ptr(), 0, 0)) + (
                numpy.int64(m), numpy.int64(n), numpy.int64(k), numpy.int64(1))  # flags 1: bias + GELU (tanh)
            grid = (-(-n // (nt * 8)), -(-m // 32))

            def launch(function=function, grid=grid, nwk=nwk, args=args, shared=shared):
                # torch's stream at call time (the graph captures on a side stream), as a CuPy stream
                handle = torch.cuda.current_stream().cuda_stream
                function(grid, (nwk * 32,), args, shared_mem=shared, stream=allocating_on(handle, handle))
                return y

            y.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            candidates[f"NT {nt} NWK {nwk} STEPS {steps} MINB {min_blocks} ({grid[0] * grid[1]} CTAs of {nwk * 32}), "
                       f"err {err:.2e}"] = launch
        for label, fn in candidates.items():
            us = graph_per_call_us(fn)
            rows.append({"shape": f"{m}x{k}->{n} {suffix}", "variant": label, "graph us a call": us})
            print(f"{m}x{k}->{n} {suffix} {label:70s} {us:7.2f} us", flush=True)
    write_results(out_dir, "explore_small_mma", "python bench/explore_small_mma.py", [
        ("16-bit linear_gelu at small batch: linear_small_mma shapes (CUDA graph of 20 calls, per call)",
         ["shape", "variant", "graph us a call"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
