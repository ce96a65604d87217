"""The Hopper GEMM's narrow tiles and K splits (kernels/matmul_sm90.cu, BN 256 / 128 / 64, split-K
through gemm_reduce) on outputs with too few 128 x 256 tiles to fill the H100: every (BN, splits)
forced through rawops.matmul.launch_gemm (the library's launch, torch's memory and stream),
beside the planner's own choice, the small-batch kernel where it applies, and torch (cuBLAS);
CUDA graphs of 20 calls, each route checked against float64. The fit of
rawops/_gemm_sm90.estimate_us comes from this table. Forced routes also take x @ W^T at <= 32
rows, which the planner sends to linear_small_mma.

    python bench/explore_sm90_split.py [--out bench/results]
"""
import importlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
B16, F32 = torch.bfloat16, torch.float32
# (layout, m, n, k, dtype): linear_gelu's x @ W^T (nt) from the small batch up to a wave of
# 128 x 256 tiles, its backward's dx (nn) and dW (tn), a square-ish nn, and TF32 nt.
SHAPES = [("nt", m, 3072, 768, B16) for m in (32, 64, 128, 256, 512, 1024)]
SHAPES += [("nt", m, 4096, 4096, B16) for m in (32, 128, 512)]
SHAPES += [("nn", 32, 768, 3072, B16), ("nn", 256, 4096, 4096, B16), ("tn", 3072, 768, 512, B16),
           ("nt", 256, 3072, 768, F32), ("nt", 1024, 4096, 4096, F32)]
# TF32 nn / tn under half a wave (b, or a and b, copied transposed first; session 16's first
# planner kept them on mma.sync, this run sent them to the Hopper kernel).
SHAPES += [("nn", 256, 3072, 768, F32), ("nn", 1024, 1024, 1024, F32), ("tn", 768, 3072, 256, F32),
           ("nn", 64, 64, 64, F32)]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def operands(layout, m, n, k, dtype):
    a = torch.randn((m, k) if layout[0] == "n" else (k, m), device="cuda", dtype=dtype)
    b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda", dtype=dtype) * k ** -0.5
    a64, b64 = a.double(), b.double()
    ref = (a64 if layout[0] == "n" else a64.t()) @ (b64.t() if layout[1] == "t" else b64)
    return a, b, ref


def describe(mm, tf, layout, code, m, n, k, a, b, c, flags):
    """What the planner ran for this call (its cached plan): the Hopper kernel's BN and splits,
    or the portable kernels."""
    if code == 0:
        found = tf._launch_plan(layout, m, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr(), 0, flags)
        return f"Hopper BN {found[-1][0]} splits {found[-1][1]}" if found[0] == "hopper" else "mma.sync TF32"
    found = mm._launch_plan(layout, code, m, n, k, a.data_ptr(), b.data_ptr(), 0, flags, c.data_ptr())
    return f"Hopper BN {found[5][0]} splits {found[5][1]}" if found[4] == 0 else f"portable, {found[4]} splits"


def main():
    sys.path.insert(0, HERE)
    from timing import device_time_us, graphed, start, write_results

    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    mm = importlib.import_module("rawops.matmul")
    tf = importlib.import_module("rawops._gemm_tf32")
    h = importlib.import_module("rawops._gemm_sm90")
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    rows = []
    for layout, m, n, k, dtype in SHAPES:
        code = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
        label = f"{layout} {m}x{n}x{k} {'tf32' if code == 0 else 'bf16'}"
        a, b, ref = operands(layout, m, n, k, dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        gelu = layout == "nt"
        if gelu:
            ref = torch.nn.functional.gelu(ref + bias.double(), approximate="tanh")
        flags = mm.EPI_BIAS_GELU if gelu else mm.EPI_NONE
        c = torch.empty(m, n, device="cuda", dtype=dtype)

        def workspace(nbytes):
            scratch = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            return scratch.data_ptr(), scratch

        def call():
            stream = torch.cuda.current_stream().cuda_stream
            args = (a.data_ptr(), b.data_ptr(), c.data_ptr(), bias.data_ptr() if gelu else 0, 0, 0, m, n, k, flags,
                    stream, workspace)
            if code == 0:
                assert tf.launch_gemm(0, layout, *args)[0]
            else:
                mm.launch_gemm(0, layout, code, *args)

        routes = {"planner": {}, "Hopper off (portable kernels' plan)": {(h, "_built"): {0: False}}}
        if code == 0:
            routes["Hopper off (portable kernels' plan)"][(tf, "HOPPER")] = False
        k_tiles = -(-k // h.tile_k(code))
        for bn in h.TILE_WIDTHS:
            tiles = -(-m // h.TILE_M) * -(-n // bn)
            for splits in SPLITS if bn != h.TILE_N else (1,):
                if splits > k_tiles or (splits > 1 and tiles * splits > 2 * sms):
                    break
                routes[f"BN {bn} splits {splits} ({tiles * splits} units)"] = {
                    (h, "FORCE_SHAPE"): (bn, splits), (mm, "SMALL_MMA_BEFORE_HOPPER_M"): 0}
        for route, settings in routes.items():
            saved = {key: getattr(*key) for key in settings}
            for (module, name), value in settings.items():
                setattr(module, name, value)
            mm._plans.clear(), tf._plans.clear()
            try:
                c.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                err = ((c.double() - ref).norm() / ref.norm()).item()
                chosen = describe(mm, tf, layout, code, m, n, k, a, b, c, flags) if route == "planner" else None

                def burst():
                    for _ in range(20):
                        call()
                replay = graphed(burst)
            finally:
                for (module, name), value in saved.items():
                    setattr(module, name, value)
                mm._plans.clear(), tf._plans.clear()
            us = device_time_us(replay) / 20
            if chosen is not None:
                route += f": {chosen}"
            rows.append({"shape": label, "route": route, "graph us a call": us, "rel err": f"{err:.1e}"})
            print(f"{label:28s} {route:42s} {us:8.2f} us  err {err:.1e}", flush=True)
        a_op = a if layout[0] == "n" else a.t()
        b_op = b.t() if layout[1] == "t" else b
        torch.backends.cuda.matmul.allow_tf32 = code == 0
        if gelu:
            fn = lambda: torch._addmm_activation(bias, a_op, b_op, use_gelu=True)  # noqa: E731
        else:
            fn = lambda: torch.mm(a_op, b_op)  # noqa: E731

        def torch_burst():
            for _ in range(20):
                fn()
        us = device_time_us(graphed(torch_burst)) / 20
        torch.backends.cuda.matmul.allow_tf32 = False
        route = "torch (cuBLASLt epilogue)" if gelu else "torch.mm"
        rows.append({"shape": label, "route": route, "graph us a call": us, "rel err": ""})
        print(f"{label:28s} {route:42s} {us:8.2f} us", flush=True)
    write_results(out_dir, "explore_sm90_split", "python bench/explore_sm90_split.py", [
        ("Hopper GEMM tile widths and K splits (CUDA graph of 20 calls, per call; nt with bias + GELU)",
         ["shape", "route", "graph us a call", "rel err"], rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
