"""Benchmark of the matrix family against torch, in one run on one GPU: linear_gelu forward
(and forward+backward) and matmul.

torch: F.gelu(F.linear(x, w, b), approximate="tanh") eager, the cuBLASLt GELU epilogue
torch._addmm_activation(b, x, w.t(), use_gelu=True), and torch.matmul (float32 with TF32 off,
torch's default; the `f32 tf32` rows: rawops matmul(tf32=True) against torch with
torch.backends.cuda.matmul.allow_tf32 = True, cuBLAS TF32, in the same run). rawops through
torch_adapter (raw pointers, torch's stream). Issue targets
(H100): linear_gelu f32 32x768->3072 >= 3x eager (42 us); bf16 8192x768->3072 >= 1.2x eager
(99 us) and >= 0.9x the epilogue (71 us); matmul 8192^3 >= 0.8x torch (688 TFLOP/s bf16,
51.6 f32). CUDA events, warm-up, medians (small rows in interleaved rounds). Floors: compute at the H100 SXM dense
peaks (bf16/f16 989 TFLOP/s, tf32 495, FFMA 66.9), memory = each operand read once and each
output written once at the measured copy ceiling. Each event pair is made before the timed calls
(timing.event_pairs: a fresh pair counted 20-35 us of its own creation on the H100 host).

    python bench/bench_matmul.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, device_times_us, graphed, loop_times_us, start, write_results  # noqa: E402

PEAK_TFLOPS = {torch.float32: 66.9, torch.float16: 989.0, torch.bfloat16: 989.0}
PEAK_TF32_TFLOPS = 495.0
NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
F = torch.nn.functional


def _floors(flops, nbytes, dtype, ceiling):
    return flops / PEAK_TFLOPS[dtype] / 1e6, nbytes / ceiling / 1e6


def _error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


# linear_gelu's shapes (dtype, M, K, N): the small and large batch, both dtypes, and a
# medium batch (bfloat16 at 256 rows: the Hopper GEMM's narrow tiles).
LINEAR_SHAPES = ((torch.float32, 32, 768, 3072), (torch.bfloat16, 32, 768, 3072), (torch.bfloat16, 256, 768, 3072),
                 (torch.float32, 8192, 768, 3072), (torch.bfloat16, 8192, 768, 3072))


def _linear_operands(dtype, m, k, n):
    """Fresh x (m, k), weight (n, k) scaled like nn.Linear's outputs, bias (n,)."""
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype)
    return x, w, torch.randn(n, device="cuda").to(dtype)


def linear_rows(ta, ceiling):
    rows = []
    for dtype, m, k, n in LINEAR_SHAPES:
        x, w, b = _linear_operands(dtype, m, k, n)
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
        with torch.no_grad():
            error = _error(ta.linear_gelu(x, w, b), ref)
            # Interleaved rounds (timing.device_times_us): at 32 rows a call is mostly host time,
            # and the lent host's speed drifts by up to 1.7x within minutes (bench/NOTES.md).
            us, us_eager, us_lt, us_graph, us_eager_graph, us_lt_graph = device_times_us({
                "rawops": lambda: ta.linear_gelu(x, w, b),
                "eager": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
                "epilogue": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
                "rawops graph": graphed(lambda: ta.linear_gelu(x, w, b)),
                "eager graph": graphed(lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
                "epilogue graph": graphed(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
            }).values()
            us_loop, us_eager_loop = loop_times_us({
                "rawops": lambda: ta.linear_gelu(x, w, b),
                "eager": lambda: F.gelu(F.linear(x, w, b), approximate="tanh")}).values()
        flops = 2 * m * k * n
        nbytes = (m * k + n * k + n + m * n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        rows.append({"op": f"linear_gelu fwd {NAMES[dtype]}", "shape": f"{m}x{k}->{n}", "rawops us": us,
                     "rawops loop us": us_loop, "eager loop us": us_eager_loop, "x eager (loops)": us_eager_loop / us_loop,
                     "torch eager us": us_eager, "cuBLASLt epilogue us": us_lt, "x eager": us_eager / us,
                     "x epilogue": us_lt / us, "rawops graph us": us_graph, "eager graph us": us_eager_graph,
                     "epilogue graph us": us_lt_graph, "x eager (graphs)": us_eager_graph / us_graph,
                     "rawops TFLOP/s": flops / us / 1e6, "compute floor us": compute,
                     "memory floor us": memory, "rel error vs f64": error})
        print(rows[-1], flush=True)
    return rows


def linear_train_rows(ta, ceiling):
    rows = []
    for dtype, m, k, n in ((torch.float32, 32, 768, 3072), (torch.bfloat16, 8192, 768, 3072)):
        x = torch.randn(m, k, device="cuda").to(dtype).requires_grad_()
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype).requires_grad_()
        b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
        dy = torch.randn(m, n, device="cuda").to(dtype)

        def ours():
            ta.linear_gelu(x, w, b).backward(dy)

        def eager():
            F.gelu(F.linear(x, w, b), approximate="tanh").backward(dy)

        # Interleaved rounds: this row swung 0.82-1.02x between runs when timed one side after the other.
        us, us_eager = device_times_us({"rawops": ours, "eager": eager}).values()
        flops = 3 * 2 * m * k * n
        # forward: x, W, b read, y and pre written; backward: dy, pre, W, x read, dx, dW, db written.
        nbytes = (2 * m * k + 2 * n * k + n + 2 * m * n + 2 * m * n + m * k + n * k + n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        rows.append({"op": f"linear_gelu fwd+bwd {NAMES[dtype]}", "shape": f"{m}x{k}->{n}", "rawops us": us,
                     "torch eager us": us_eager, "x eager": us_eager / us, "rawops TFLOP/s": flops / us / 1e6,
                     "compute floor us": compute, "memory floor us": memory})
        print(rows[-1], flush=True)
    return rows


def backward_rows(ta, ceiling):
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
            us = device_time_us(graphed(lambda: ta._linear_gelu_bwd(dy, x, w, b, pre, "tanh")))
            us_recompute = device_time_us(graphed(lambda: ta._linear_gelu_bwd(dy, x, w, b, None, "tanh")))
            us_torch = device_time_us(graphed(torch_bwd))
        flops = 2 * 2 * m * k * n
        nbytes = (2 * m * n + n * k + m * k + m * k + n * k + n) * x.element_size()
        compute, memory = _floors(flops, nbytes, dtype, ceiling)
        rows.append({"op": f"linear_gelu bwd {NAMES[dtype]}", "shape": f"{m}x{k}->{n}", "rawops us": us,
                     "rawops recompute us": us_recompute, "torch us": us_torch, "x torch": us_torch / us,
                     "rawops TFLOP/s": flops / us / 1e6, "compute floor us": compute, "memory floor us": memory})
        print(rows[-1], flush=True)
    return rows


def matmul_rows(ta, ceiling):
    """tf32 rows: rawops matmul(tf32=True) against torch.matmul with allow_tf32 on (cuBLAS TF32),
    timed in the same run; the others against torch's default (TF32 off)."""
    rows = []
    for dtype, size, tf32 in ((torch.bfloat16, 8192, False), (torch.float16, 8192, False),
                              (torch.float32, 8192, False), (torch.float32, 8192, True),
                              (torch.bfloat16, 4096, False), (torch.float32, 4096, False),
                              (torch.float32, 4096, True)):
        a = torch.randn(size, size, device="cuda").to(dtype)
        b = torch.randn(size, size, device="cuda").to(dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        with torch.no_grad():
            c = ta.matmul(a, b, tf32=tf32)
            probe = slice(0, 64)  # a float64 reference of 64 rows keeps the check cheap
            error = _error(c[probe], a[probe].double() @ b.double())
            us = device_time_us(lambda: ta.matmul(a, b, tf32=tf32), warmup=3, reps=20)
            us_torch = device_time_us(lambda: torch.matmul(a, b), warmup=3, reps=20)
        torch.backends.cuda.matmul.allow_tf32 = False
        flops = 2 * size ** 3
        compute, memory = _floors(flops, 3 * size * size * a.element_size(), dtype, ceiling)
        if tf32:
            compute = flops / PEAK_TF32_TFLOPS / 1e6
        rows.append({"op": f"matmul {NAMES[dtype]}{' tf32' if tf32 else ''}", "shape": f"{size}^3", "rawops us": us,
                     "torch us": us_torch,
                     "x torch": us_torch / us, "rawops TFLOP/s": flops / us / 1e6,
                     "torch TFLOP/s": flops / us_torch / 1e6, "compute floor us": compute,
                     "memory floor us": memory, "rel error vs f64": error})
        print(rows[-1], flush=True)
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: exact float32 matmul
    from rawops import torch_adapter as ta

    sections = [
        ("linear_gelu forward (no grad)", ["op", "shape", "rawops us", "torch eager us", "cuBLASLt epilogue us", "x eager", "x epilogue", "rawops loop us",
                                           "eager loop us", "x eager (loops)", "rawops graph us", "eager graph us",
                                           "epilogue graph us", "x eager (graphs)", "rawops TFLOP/s", "compute floor us",
                                           "memory floor us", "rel error vs f64"], linear_rows(ta, ceiling),
         {"targets": "f32 32x768->3072 >= 3x eager; bf16 8192x768->3072 >= 1.2x eager and >= 0.9x epilogue",
          "rawops us, torch eager us, cuBLASLt epilogue us": "one event pair around each call (made beforehand: "
          "timing.event_pairs), interleaved rounds; the bars are judged on these",
          "loop us": "per call of 20 back-to-back calls between one event pair (host and GPU overlap across calls)",
          "graph us": "a one-call CUDA graph replayed (no host cost)",
          "copy ceiling TB/s": round(ceiling, 3)}),
        ("linear_gelu forward + backward (autograd)", ["op", "shape", "rawops us", "torch eager us", "x eager",
                                                       "rawops TFLOP/s", "compute floor us", "memory floor us"],
         linear_train_rows(ta, ceiling), {"flops": "3 GEMMs of 2MKN (forward, dx, dW)"}),
        ("linear_gelu backward alone (CUDA graphs, device time)",
         ["op", "shape", "rawops us", "rawops recompute us", "torch us", "x torch", "rawops TFLOP/s",
          "compute floor us", "memory floor us"], backward_rows(ta, ceiling),
         {"rawops": "dpre from the saved pre-activation; 'recompute': dpre from a GEMM whose epilogue applies "
                    "gelu' (no pre stored)", "flops": "2 GEMMs of 2MKN (dx, dW)"}),
        ("matmul", ["op", "shape", "rawops us", "torch us", "x torch", "rawops TFLOP/s", "torch TFLOP/s",
                    "compute floor us", "memory floor us", "rel error vs f64"], matmul_rows(ta, ceiling),
         {"targets": ">= 0.8x torch at 8192^3 bf16 and f32; tf32: none set (torch with allow_tf32)",
          "peaks": "bf16/f16 989, tf32 495, FFMA 66.9 TFLOP/s"}),
    ]
    text = write_results(out_dir, "matmul", "python bench/bench_matmul.py", sections)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
