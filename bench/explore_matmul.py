"""Side-by-side timings of the matrix family's FFMA variants (not the shipped benchmark):
the cubins under bench/explore/ (compiled off the GPU machine: `bash bench/explore/build.sh`)
loaded through CuPy, launched on torch's stream, checked against float64 and timed with CUDA
events; plus the host cost of the torch adapter's linear_gelu paths.

    python bench/explore_matmul.py [--skip-gemm]
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_time_us, host_times_us  # noqa: E402

F = torch.nn.functional
KINDS = "ppppppqqqq"


def module(name):
    return cupy.RawModule(path=os.path.join(HERE, "explore", name))


def launcher(mod, name, grid, block, shared=0):
    fn = mod.get_function(name)
    if shared > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = shared

    def go(a, b, c, bias=0, m=0, n=0, k=0, flags=0):
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            fn(grid, (block,), (cupy.uint64(a), cupy.uint64(b), cupy.uint64(c), cupy.uint64(bias), cupy.uint64(0),
                                cupy.uint64(0), cupy.int64(m), cupy.int64(n), cupy.int64(k), cupy.int64(flags)),
               shared_mem=shared)
    return go


def graph_us(fn, per_graph=20, reps=20):
    """Device time per call of fn, from a CUDA graph of `per_graph` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    return device_time_us(g.replay, warmup=3, reps=reps) / per_graph


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def gemm_rows():
    cur, v3 = module("matmul_variants.cubin"), module("matmul_v3.cubin")  # bash bench/explore/build.sh --v3
    size = 8192
    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")
    c = torch.empty(size, size, device="cuda")
    ref = a[:64].double() @ b.double()
    flops = 2 * size ** 3
    rows = []
    for label, mod, name in (("v3 gemm_simt_nn", v3, "gemm_simt_nn_f32"), ("gemm_simt_nn, loads first", cur,
                             "gemm_simt_nn_f32"), ("shipped gemm_simt_vec_nn", cur, "gemm_simt_vec_nn_f32"),
                             ("vec with 64x32 warp tiles", cur, "vec_warptiles_nn")):
        go = launcher(mod, name, (64, 64), 256)
        c.fill_(float("nan"))
        go(a.data_ptr(), b.data_ptr(), c.data_ptr(), 0, size, size, size, 0)
        torch.cuda.synchronize()
        err = rel(c[:64], ref)
        nan = bool(torch.isnan(c).any())
        us = device_time_us(lambda: go(a.data_ptr(), b.data_ptr(), c.data_ptr(), 0, size, size, size, 0), 2, 10)
        rows.append((label, us, flops / us / 1e6, err, nan))
    us = device_time_us(lambda: torch.matmul(a, b), 2, 10)
    rows.append(("torch.matmul", us, flops / us / 1e6, 0.0, False))
    # nt (linear forward f32 8192x768->3072) through the vector kernel
    x = torch.randn(8192, 768, device="cuda")
    w = torch.randn(3072, 768, device="cuda") * 768 ** -0.5
    y = torch.empty(8192, 3072, device="cuda")
    for label, mod, name in (("nt v3", v3, "gemm_simt_nt_f32"), ("nt vec", cur, "gemm_simt_vec_nt_f32")):
        go = launcher(mod, name, (24, 64), 256)
        go(x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, 8192, 3072, 768, 0)
        torch.cuda.synchronize()
        err = rel(y, x.double() @ w.double().t())
        us = device_time_us(lambda: go(x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, 8192, 3072, 768, 0), 3, 20)
        rows.append((label, us, 2 * 8192 * 768 * 3072 / us / 1e6, err, False))
    us = device_time_us(lambda: x @ w.t(), 3, 20)
    rows.append(("nt torch", us, 2 * 8192 * 768 * 3072 / us / 1e6, 0.0, False))
    print("\n| gemm f32 | us | TFLOP/s | rel err | NaN |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.1f} | {r[3]:.2e} | {r[4]} |")


# (label, cubin, kernel, blocks along x at N = 3072, threads, dynamic shared bytes)
CLUSTER_RING = 3 * 96 * 36 * 4  # v6: 3 stages x (32 x rows + 64 W rows) x 36 floats
SHIPPED = ("v5 linear_small (all of x staged, then the FMAs) [shipped]", "cur", "linear_small_nt_f32", 128, 384,
           32 * 768 * 4)
C4W4 = ("v6 cluster C4 W4, 40.5 KB (192 CTAs)", "cur", "cluster_c4_w4", 192, 128, CLUSTER_RING)
SMALL = [SHIPPED,
         ("v6 cluster C8 W2, 58 KB (3 CTAs/SM: 45 clusters fit)", "cur", "cluster_c8_w2", 384, 64, 58 * 1024),
         ("v6 cluster C8 W2, 40.5 KB", "cur", "cluster_c8_w2", 384, 64, CLUSTER_RING),
         ("v6 cluster C8 W4, 40.5 KB", "cur", "cluster_c8_w4", 384, 128, CLUSTER_RING),
         ("v6 cluster C4 W2, 40.5 KB (192 CTAs)", "cur", "cluster_c4_w2", 192, 64, CLUSTER_RING), C4W4,
         ("v6 cluster C2 W4, 40.5 KB (96 CTAs)", "cur", "cluster_c2_w4", 96, 128, CLUSTER_RING)]
# linear_small_tf32 (3xTF32, sm_90): (C, NWN, NT, NWK) as kernels/matmul.cu's RAWOPS_SMALL_TF32.


def tf32_variant(label, name, c, nwn, nt, nwk):
    feat = nwn * nt * 8
    stride = feat + 16 if feat % 32 == 24 else feat + 8
    return (label, "cur", name, c * -(-3072 // feat), nwn * nwk * 32, nwk * 32 * stride * 4)


TF32_SHIPPED = tf32_variant("v7 linear_small_tf32 C1 N1 T3 K16 (128 CTAs of 512, no cluster) [ships]",
                            "linear_small_tf32_nt_f32", 1, 1, 3, 16)
TF32 = [TF32_SHIPPED,
        tf32_variant("v7 C2 N1 T6 K8 (128 CTAs of 256, clusters of 2)", "tf32_c2_n1_t6_k8", 2, 1, 6, 8),
        tf32_variant("v7 C2 N1 T3 K8 (256 CTAs, 2/SM)", "tf32_c2_n1_t3_k8", 2, 1, 3, 8)]
SMALL += TF32
SMALL_ROWS_OTHER = [SHIPPED, C4W4] + TF32
SMALL_BF16 = [("v5 bf16 [shipped]", "cur", "linear_small_nt_bf16", 128, 384, 32 * 768 * 2)]


def small_rows(dtype=torch.float32, variants=SMALL, m=32):
    mods = {"cur": module("matmul_variants.cubin")}
    k, n = 768, 3072
    x = torch.randn(m, k, device="cuda").to(dtype)
    ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype) for _ in range(8)]  # past L2 when rotated
    bias = torch.randn(n, device="cuda").to(dtype)
    y = torch.empty(m, n, device="cuda", dtype=dtype)
    ref = F.gelu(F.linear(x.double(), ws[0].double(), bias.double()), approximate="tanh")
    print(f"\n| linear_small {dtype} {m}x768->3072 | graph us (same W) | graph us (8 W rotated) | rel err |")
    print("|---|---|---|---|")
    for label, mod, name, blocks, block, shared in variants:
        go = launcher(mods[mod], name, (blocks, -(-m // 32)), block, shared)
        y.fill_(float("nan"))
        go(x.data_ptr(), ws[0].data_ptr(), y.data_ptr(), bias.data_ptr(), m, n, k, 1)
        torch.cuda.synchronize()
        torch.cuda.synchronize()
        err = rel(y, ref) if not torch.isnan(y).any() else float("nan")
        same = graph_us(lambda: go(x.data_ptr(), ws[0].data_ptr(), y.data_ptr(), bias.data_ptr(), m, n, k, 1))

        def rotating():
            for w in ws:
                go(x.data_ptr(), w.data_ptr(), y.data_ptr(), bias.data_ptr(), m, n, k, 1)
        rot = graph_us(rotating, per_graph=3) / len(ws)
        print(f"| {label} | {same:.2f} | {rot:.2f} | {err:.2e} |", flush=True)
    eager = graph_us(lambda: F.gelu(F.linear(x, ws[0], bias), approximate="tanh"))
    err = rel(F.gelu(F.linear(x, ws[0], bias), approximate="tanh"), ref)  # torch's own float32 error
    print(f"| torch eager (graph) | {eager:.2f} | | {err:.2e} |")
    if dtype == torch.float32:  # what one TF32 product per term gives (the tests' 1e-5 must fail it)
        torch.backends.cuda.matmul.allow_tf32 = True
        err = rel(F.gelu(F.linear(x, ws[0], bias), approximate="tanh"), ref)
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"| torch with allow_tf32 (1xTF32, error only) | | | {err:.2e} |")


def host_rows():
    from rawops import torch_adapter as ta

    x = torch.randn(32, 768, device="cuda")
    w = torch.randn(3072, 768, device="cuda") * 768 ** -0.5
    b = torch.randn(3072, device="cuda")
    x2 = torch.randn(32, 512, device="cuda")
    w2 = torch.randn(3072, 512, device="cuda") * 512 ** -0.5

    def two_shapes():  # each call misses the last-launch cache: the dict of plans (v5's path)
        ta.linear_gelu(x, w, b)
        ta.linear_gelu(x2, w2, b)
    with torch.no_grad():
        fns = {"ta.linear_gelu (fast path)": lambda: ta.linear_gelu(x, w, b),
               "ta.linear_gelu x2, two shapes alternating": two_shapes,
               "ta._linear_gelu_fwd (v3 path)": lambda: ta._linear_gelu_fwd(x, w, b, "tanh", False),
               "eager F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
               "x.new_empty((32, 3072))": lambda: x.new_empty((32, 3072)),
               "torch.empty(shape, dtype, device)": lambda: torch.empty((32, 3072), dtype=x.dtype, device=x.device)}
        host = host_times_us(fns, calls=300, rounds=7)
        ev = {"ta.linear_gelu events (3xTF32)": device_time_us(lambda: ta.linear_gelu(x, w, b)),
              "eager events": device_time_us(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))}
        ta._mm.LINEAR_TF32 = False  # the exact FFMA path (v5), same run
        ev["ta.linear_gelu events (LINEAR_TF32 = False: v5)"] = device_time_us(lambda: ta.linear_gelu(x, w, b))
        ta._mm.LINEAR_TF32 = True
        ev["ta.linear_gelu events (3xTF32), again"] = device_time_us(lambda: ta.linear_gelu(x, w, b))
    print("\n| host path | us per call |\n|---|---|")
    for name, us in {**host, **ev}.items():
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        host_rows()
    except Exception as e:  # the explorer must still time the kernels
        print("host rows failed:", repr(e))
    small_rows()
    for rows in (8, 128):
        if "--skip-rows" not in sys.argv:
            small_rows(variants=SMALL_ROWS_OTHER, m=rows)
    small_rows(torch.bfloat16, SMALL_BF16)
    if "--skip-gemm" not in sys.argv:
        gemm_rows()
