"""Benchmark of the gemm family (matmul, linear_gelu) against torch, in one run on one GPU.

linear_gelu = gelu(x @ W^T + b, approximate="tanh"), forward (no grad), forward + backward
(autograd) and the backward alone, at 32, 256 and 8192 rows of 768 -> 3072 in float32 and
bfloat16, and forward + backward of the exact-erf form at 8192 rows of 1024 -> 4096 (bench_model's
MLP); matmul at 8192^3 and 4096^3 in every dtype, float32 also as TF32; on sm_90 the float32 rows the
3xTF32 path takes (config.f32_3xtf32) with it off and on, each beside torch.

torch: F.gelu(F.linear(x, w, b), approximate="tanh") eager ("torch us"), the cuBLASLt GELU
epilogue torch._addmm_activation(b, x, w.t(), use_gelu=True), aten's gelu_backward + 2 matmuls
+ sum for the backward, and torch.matmul with float32 exact (TF32 off, torch's default); the
`tf32` rows set torch.backends.cuda.matmul.allow_tf32 for torch and tf32=True for rawops.
rawops through rawops.torch_adapter, on torch's stream.

Times: CUDA events made before the timed calls (timing.event_pairs), medians after warm-up;
linear_gelu forward rows and the autograd rows in interleaved rounds (a call at 32 rows is
mostly host time); "loop" = per call of 20 back-to-back calls between one event pair; "graph" =
a one-call CUDA graph replayed (no host time); the backward alone as CUDA graphs. Floors:
compute at the dense peaks of an H100/H200 SXM (bf16/f16 989 TFLOP/s, TF32 495, FFMA 66.9),
memory = each operand read once and each output written once at the copy ceiling measured in
the same run. Errors: relative Frobenius norm against float64 on the same inputs.
Bars (docs/performance.md): linear_gelu f32 32x768->3072 >= 3x eager; bf16 8192x768->3072
>= 1.2x eager and >= 0.9x the cuBLASLt epilogue; matmul 8192^3 bf16 and f32 >= 0.8x torch.

    python bench/bench_gemm.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compiled, device_time_us, device_times_us, graphed, loop_times_us, start, write_results  # noqa: E402

PEAK_TFLOPS = {torch.float32: 66.9, torch.float16: 989.0, torch.bfloat16: 989.0}
PEAK_TF32_TFLOPS = 495.0
NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
F = torch.nn.functional

# linear_gelu's shapes (dtype, M, K, N): a small and a large batch in both dtypes, and bfloat16 at
# 256 rows (the Hopper GEMM's narrow tiles).
LINEAR_SHAPES = ((torch.float32, 32, 768, 3072), (torch.bfloat16, 32, 768, 3072), (torch.bfloat16, 256, 768, 3072),
                 (torch.float32, 8192, 768, 3072), (torch.bfloat16, 8192, 768, 3072))
# forward + backward: (dtype, M, K, N, approximate); the exact-erf row at bench_model's MLP shape (nn.GELU's
# default, what LinearGELU defaults to)
TRAIN_SHAPES = ((torch.float32, 32, 768, 3072, "tanh"), (torch.bfloat16, 8192, 768, 3072, "tanh"),
                (torch.bfloat16, 8192, 1024, 4096, "none"))
MATMUL_SHAPES = ((torch.bfloat16, 8192, False), (torch.float16, 8192, False), (torch.float32, 8192, False),
                 (torch.float32, 8192, True), (torch.bfloat16, 4096, False), (torch.float32, 4096, False),
                 (torch.float32, 4096, True))


def _floors(flops, nbytes, dtype, ceiling):
    return flops / PEAK_TFLOPS[dtype] / 1e6, nbytes / ceiling / 1e6


def _error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def _linear_operands(dtype, m, k, n):
    """Fresh x (m, k), weight (n, k) scaled like nn.Linear's outputs, bias (n,)."""
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
    return x, w, torch.randn(n, device="cuda").to(dtype)


def _row(op, dtype, shape, **values):
    return {"op": op, "dtype": NAMES[dtype], "shape": shape, **values}


def linear_rows(ta, ceiling):
    rows = []
    for dtype, m, k, n in LINEAR_SHAPES:
        x, w, b = _linear_operands(dtype, m, k, n)
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")

        def ours():
            return ta.linear_gelu(x, w, b, approximate="tanh")

        def eager():
            return F.gelu(F.linear(x, w, b), approximate="tanh")

        def epilogue():
            return torch._addmm_activation(b, x, w.t(), use_gelu=True)

        inductor = compiled(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"))
        with torch.no_grad():
            error = _error(ours(), ref)
            times = device_times_us({
                "rawops": ours, "eager": eager, "epilogue": epilogue, "rawops graph": graphed(ours),
                "eager graph": graphed(eager), "epilogue graph": graphed(epilogue)})
            times["compile"] = device_time_us(lambda: inductor(x, w, b))  # timed apart: its own allocator state
            us, us_eager, us_lt, us_graph, us_eager_graph, us_lt_graph = (
                times[k] for k in ("rawops", "eager", "epilogue", "rawops graph", "eager graph", "epilogue graph"))
            us_loop, us_eager_loop = loop_times_us({"rawops": ours, "eager": eager}).values()
        flops = 2 * m * k * n
        nbytes = (m * k + n * k + n + m * n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        rows.append(_row("linear_gelu fwd", dtype, f"{m}x{k}->{n}", **{
            "rawops us": us, "torch us": us_eager, "torch.compile us": times["compile"], "cuBLASLt epilogue us": us_lt,
            "x torch": us_eager / us,
            "x epilogue": us_lt / us, "rawops loop us": us_loop, "torch loop us": us_eager_loop,
            "x torch (loops)": us_eager_loop / us_loop, "rawops graph us": us_graph, "torch graph us": us_eager_graph,
            "epilogue graph us": us_lt_graph, "x torch (graphs)": us_eager_graph / us_graph,
            "rawops TFLOP/s": flops / us / 1e6, "compute floor us": compute, "memory floor us": memory,
            "rel error vs f64": error}))
        print(rows[-1], flush=True)
    return rows


def linear_train_rows(ta, ceiling):
    rows = []
    for dtype, m, k, n, approximate in TRAIN_SHAPES:
        x = torch.randn(m, k, device="cuda").to(dtype).requires_grad_()
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype).requires_grad_()
        b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
        dy = torch.randn(m, n, device="cuda").to(dtype)

        def ours():
            ta.linear_gelu(x, w, b, approximate=approximate).backward(dy)

        def eager():
            F.gelu(F.linear(x, w, b), approximate=approximate).backward(dy)

        inductor = compiled(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate=approximate))

        def compiled_step():
            inductor(x, w, b).backward(dy)

        times = device_times_us({"rawops": ours, "eager": eager})
        times["compile"] = device_time_us(compiled_step)  # apart: interleaved, it slowed every autograd row
        us, us_eager = times["rawops"], times["eager"]
        flops = 3 * 2 * m * k * n
        # forward: x, W, b read, y and pre written; backward: dy, pre, W, x read, dx, dW, db written.
        nbytes = (2 * m * k + 2 * n * k + n + 2 * m * n + 2 * m * n + m * k + n * k + n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        op = "linear_gelu fwd+bwd" if approximate == "tanh" else "linear_gelu erf fwd+bwd"
        rows.append(_row(op, dtype, f"{m}x{k}->{n}", **{
            "rawops us": us, "torch us": us_eager, "torch.compile us": times["compile"], "x torch": us_eager / us,
            "rawops TFLOP/s": flops / us / 1e6, "compute floor us": compute, "memory floor us": memory}))
        print(rows[-1], flush=True)
    return rows


def backward_rows(ta_gemm, ceiling):
    """The backward alone, both sides as CUDA graphs: rawops (dpre from the saved
    pre-activation, dx and dW GEMMs, column sum) against aten's gelu_backward + 2 matmuls + sum."""
    rows = []
    for dtype, m, k, n in LINEAR_SHAPES:
        x, w, b = _linear_operands(dtype, m, k, n)
        dy = torch.randn(m, n, device="cuda").to(dtype)
        pre = F.linear(x, w, b)

        def torch_bwd():
            dpre = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
            return dpre @ w, dpre.t() @ x, dpre.sum(0)

        with torch.no_grad():
            us = device_time_us(graphed(lambda: ta_gemm.linear_gelu_backward(dy, x, w, b, pre, "tanh")))
            us_recompute = device_time_us(graphed(lambda: ta_gemm.linear_gelu_backward(dy, x, w, b, None, "tanh")))
            us_torch = device_time_us(graphed(torch_bwd))
        flops = 2 * 2 * m * k * n
        nbytes = (2 * m * n + n * k + m * k + m * k + n * k + n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        rows.append(_row("linear_gelu bwd", dtype, f"{m}x{k}->{n}", **{
            "rawops us": us, "rawops recompute us": us_recompute, "torch us": us_torch, "x torch": us_torch / us,
            "rawops TFLOP/s": flops / us / 1e6, "compute floor us": compute, "memory floor us": memory}))
        print(rows[-1], flush=True)
    return rows


def matmul_rows(ta, ceiling):
    """tf32 rows: rawops matmul(tf32=True) against torch.matmul with allow_tf32 on (cuBLAS TF32),
    timed in the same run; the others against torch's default (TF32 off)."""
    rows = []
    for dtype, size, tf32 in MATMUL_SHAPES:
        a = torch.randn(size, size, device="cuda").to(dtype)
        b = torch.randn(size, size, device="cuda").to(dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            with torch.no_grad():
                c = ta.matmul(a, b, tf32=tf32)
                probe = slice(0, 64)  # a float64 reference of 64 rows keeps the check cheap
                error = _error(c[probe], a[probe].double() @ b.double())
                us = device_time_us(lambda: ta.matmul(a, b, tf32=tf32), warmup=3, reps=20)
                us_torch = device_time_us(lambda: torch.matmul(a, b), warmup=3, reps=20)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        flops = 2 * size ** 3
        compute, memory = _floors(flops, 3 * size * size * a.element_size(), dtype, ceiling)
        if tf32:
            compute = flops / PEAK_TF32_TFLOPS / 1e6
        rows.append(_row("matmul tf32" if tf32 else "matmul", dtype, f"{size}^3", **{
            "rawops us": us, "torch us": us_torch, "x torch": us_torch / us, "rawops TFLOP/s": flops / us / 1e6,
            "torch TFLOP/s": flops / us_torch / 1e6, "compute floor us": compute, "memory floor us": memory,
            "rel error vs f64": error}))
        print(rows[-1], flush=True)
    return rows


# float32 at float32's accuracy on sm_90's tensor cores (config.f32_3xtf32, on by default):
# (op, M, K, N) as linear_gelu's and matmul's rows above.
SPLIT3_SHAPES = (("linear_gelu fwd", 8192, 768, 3072), ("linear_gelu fwd+bwd", 8192, 768, 3072),
                 ("matmul", 8192, 8192, 8192), ("matmul", 4096, 4096, 4096))


def _torch_linear_gelu(x, w, b, approximate):
    return F.gelu(F.linear(x, w, b), approximate=approximate)


def split3_rows(ta, ceiling):
    """The float32 rows the 3xTF32 path takes, with config.f32_3xtf32 off (exact FFMA) and on, each
    beside torch float32 (TF32 off) in interleaved rounds; errors against float64 over the first 64
    rows of the full forward output (the path is chosen by size), beside torch's."""
    from rawops import _gemm_sm90, config

    if torch.cuda.get_device_capability() != (9, 0) or not _gemm_sm90.built(torch.cuda.current_device()):
        return []
    rows = []
    for op, m, k, n in SPLIT3_SHAPES:
        grad = op.endswith("bwd")
        if op == "matmul":
            args = (torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda"))
            ours_f, torch_f, kwargs = ta.matmul, torch.matmul, {}
            ref = args[0][:64].double() @ args[1].double()
        else:
            args = _linear_operands(torch.float32, m, k, n)
            ours_f, torch_f, kwargs = ta.linear_gelu, _torch_linear_gelu, {"approximate": "tanh"}
            ref = _torch_linear_gelu(*(t.double() for t in (args[0][:64], *args[1:])), "tanh")
            for t in args:
                t.requires_grad_(grad)
        dy = torch.randn(m, n, device="cuda")

        def step(f):
            y = f(*args, **kwargs)
            if grad:
                y.backward(dy)
        values = {}
        with torch.no_grad():
            values["torch error"] = _error(torch_f(*args, **kwargs)[:64], ref)
        for label, on in (("FFMA", False), ("3xTF32", True)):
            with config.override(f32_3xtf32=on):
                with torch.no_grad():
                    values[f"{label} error"] = _error(ours_f(*args, **kwargs)[:64], ref)
                times = device_times_us({"rawops": lambda: step(ours_f), "torch": lambda: step(torch_f)},
                                        warmup=3, reps=5, rounds=3)
            values[f"{label} us"], values[f"torch us ({label} run)"] = times["rawops"], times["torch"]
            values[f"x torch ({label})"] = times["torch"] / times["rawops"]
        values["3xTF32 TFLOP/s"] = (3 if grad else 1) * 2 * m * k * n / values["3xTF32 us"] / 1e6
        # history.csv: the 3xTF32 time against its run's torch, under an op name of its own
        values["rawops us"], values["torch us"] = values["3xTF32 us"], values["torch us (3xTF32 run)"]
        rows.append(_row(f"{op} (3xTF32)", torch.float32, f"{m}x{k}->{n}" if op != "matmul" else f"{m}^3",
                         **values))
        print(rows[-1], flush=True)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: exact float32 matmul
    from rawops import torch_adapter as ta
    from rawops.torch_adapter import gemm as ta_gemm

    sections = [
        ("linear_gelu forward (no grad)",
         ["op", "dtype", "shape", "rawops us", "torch us", "torch.compile us", "cuBLASLt epilogue us", "x torch",
          "x epilogue",
          "rawops loop us", "torch loop us", "x torch (loops)", "rawops graph us", "torch graph us",
          "epilogue graph us", "x torch (graphs)", "rawops TFLOP/s", "compute floor us", "memory floor us",
          "rel error vs f64"], linear_rows(ta, ceiling),
         {"targets": "f32 32x768->3072 >= 3x eager; bf16 8192x768->3072 >= 1.2x eager and >= 0.9x epilogue",
          "torch us": "F.gelu(F.linear(x, w, b), approximate='tanh') eager",
          "rawops us, torch us, cuBLASLt epilogue us": "one event pair around each call (made beforehand: "
          "timing.event_pairs), interleaved rounds; the bars are judged on these",
          "loop us": "per call of 20 back-to-back calls between one event pair (host and GPU overlap across calls)",
          "graph us": "a one-call CUDA graph replayed (no host cost)",
          "copy ceiling TB/s": round(ceiling, 3)}),
        ("linear_gelu forward + backward (autograd)",
         ["op", "dtype", "shape", "rawops us", "torch us", "torch.compile us", "x torch", "rawops TFLOP/s",
          "compute floor us", "memory floor us"], linear_train_rows(ta, ceiling),
         {"torch us": "eager F.gelu(F.linear(...)).backward(dy)", "flops": "3 GEMMs of 2MKN (forward, dx, dW)"}),
        ("linear_gelu backward alone (CUDA graphs, device time)",
         ["op", "dtype", "shape", "rawops us", "rawops recompute us", "torch us", "x torch", "rawops TFLOP/s",
          "compute floor us", "memory floor us"], backward_rows(ta_gemm, ceiling),
         {"rawops": "dpre from the saved pre-activation; 'recompute': dpre from a GEMM whose epilogue applies "
                    "gelu' (no pre stored)", "torch us": "aten gelu_backward + 2 matmuls + sum",
          "flops": "2 GEMMs of 2MKN (dx, dW)"}),
        ("matmul",
         ["op", "dtype", "shape", "rawops us", "torch us", "x torch", "rawops TFLOP/s", "torch TFLOP/s",
          "compute floor us", "memory floor us", "rel error vs f64"], matmul_rows(ta, ceiling),
         {"targets": ">= 0.8x torch at 8192^3 bf16 and f32; tf32: none set (torch with allow_tf32)",
          "peaks": "bf16/f16 989, tf32 495, FFMA 66.9 TFLOP/s"}),
    ]
    sections.append(
        ("float32 at float32's accuracy: 3xTF32 on sm_90 (config.f32_3xtf32) beside exact FFMA",
         ["op", "dtype", "shape", "FFMA us", "torch us (FFMA run)", "x torch (FFMA)", "3xTF32 us",
          "torch us (3xTF32 run)", "x torch (3xTF32)", "3xTF32 TFLOP/s", "FFMA error", "3xTF32 error", "torch error"],
         split3_rows(ta, ceiling),
         {"3xTF32": "each operand split into TF32 big + small, three products a 32-column stage, each stage's "
                    "tensor-core sums added by FADD (rawops/_gemm_tf32.py split3_plan); on by default "
                    "(the rows above), off: exact FFMA",
          "errors": "relative norm against float64 over the first 64 rows of the full output (forward)"}))
    text = write_results(out_dir, "gemm", "python bench/bench_gemm.py", sections)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
