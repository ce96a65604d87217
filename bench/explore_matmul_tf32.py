"""Side-by-side timings of TF32 GEMM variants (kernels/matmul_tf32.cu with its tile constants
changed), not the shipped benchmark. Build the cubins where nvcc is (sm_90), then time them on
the GPU against the shipped kernel (rawops.matmul(tf32=True)), the exact FFMA kernel and
torch with allow_tf32 (cuBLAS TF32), all in one run, CUDA events, median of 10 after warm-up.

    python bench/explore_matmul_tf32.py --build     # cubins into bench/explore/tf32_*.cubin
    python bench/explore_matmul_tf32.py [size]       # on the GPU (default 8192)
"""
import concurrent.futures
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "kernels", "matmul_tf32.cu")
# name -> (kTf32K, kTf32Stages, kTf32WideStages, kTf32Group, kernels timed); shipped: (16, 4, 4, 8).
# Round 1 (H100, 8192^3, 128 x 128 kernel only, TFLOP/s nn/nt/tn): bk16 s4 g8 96.8/119.6/94.3,
# g1 99.3/104.3/86.4, bk16 s5 93.5/112.4/92.7, bk32 s3 101.8/123.1/100.0, bk32 s4 85.4/101.0/87.3.
VARIANTS = {"shipped": (16, 4, 4, 8, ("", "wide_")), "wide_s3": (16, 4, 3, 8, ("wide_",)),
            "wide_s5": (16, 4, 5, 8, ("wide_",)), "wide_g1": (16, 4, 4, 1, ("wide_",)),
            "wide_bk32_s3": (32, 4, 3, 8, ("wide_",))}


def cubin(name):
    return os.path.join(HERE, "explore", f"tf32_{name}.cubin")


def build():
    text = open(SOURCE).read()

    def one(item):
        name, (bk, stages, wide_stages, group, _) = item
        src = text
        for constant, value in (("kTf32K", bk), ("kTf32Stages", stages), ("kTf32WideStages", wide_stages),
                                ("kTf32Group", group)):
            src, count = re.subn(rf"constexpr int {constant} = \d+;", f"constexpr int {constant} = {value};", src)
            assert count == 1, constant
        path = f"/tmp/tf32_{name}.cu"
        with open(path, "w") as f:
            f.write(src)
        subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-cubin", f"-I{ROOT}/kernels/include", path,
                        "-o", cubin(name)], check=True)
        return name

    with concurrent.futures.ThreadPoolExecutor(len(VARIANTS)) as pool:
        for name in pool.map(one, VARIANTS.items()):
            print("built", cubin(name))


def shared_bytes(layout, bk, stages, bn):
    tile = lambda kmajor, rows: rows * (bk + 4) if kmajor else bk * (rows + 8)  # noqa: E731
    return stages * (tile(layout[0] == "n", 128) + tile(layout[1] == "t", bn)) * 4


def main(size):
    import cupy
    import torch

    sys.path.insert(0, HERE)
    from timing import device_time_us

    import rawops
    from rawops import _gemm_tf32, _launch

    m = n = k = size
    flops = 2 * m * n * k
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    probe = slice(0, 64)
    ref = a[probe].double() @ b.double()
    rows = []

    def report(what, us, c):
        err = ((c[probe].double() - ref).norm() / ref.norm()).item()
        rows.append((what, us, flops / us / 1e6, err))
        print(f"{what:28s} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s  rel err {err:.2e}", flush=True)

    ca, cb = cupy.from_dlpack(a), cupy.from_dlpack(b)
    cc = cupy.empty((m, n), dtype=cupy.float32)
    stream = torch.cuda.current_stream().cuda_stream
    with cupy.cuda.ExternalStream(stream):
        run = lambda: rawops.matmul(ca, cb, tf32=True, out=cc)  # noqa: E731
        report("rawops tf32 (shipped, nn)", device_time_us(run, warmup=3, reps=10), torch.from_dlpack(cc))
        _gemm_tf32.WIDE, _gemm_tf32._plans = False, {}
        report("rawops tf32 narrow (nn)", device_time_us(run, warmup=3, reps=10), torch.from_dlpack(cc))
        _gemm_tf32.WIDE, _gemm_tf32._plans = True, {}
        run = lambda: rawops.matmul(ca, cb, out=cc)  # noqa: E731
        report("rawops exact FFMA (nn)", device_time_us(run, warmup=2, reps=5), torch.from_dlpack(cc))
    torch.backends.cuda.matmul.allow_tf32 = True
    report("torch allow_tf32 (nn)", device_time_us(lambda: torch.matmul(a, b), warmup=3, reps=10), torch.matmul(a, b))
    torch.backends.cuda.matmul.allow_tf32 = False

    # The three layouts of every variant on the same data: a^T and b^T stored for nt / tn.
    at, bt = a.t().contiguous(), b.t().contiguous()
    operands = {"nn": (a, b), "nt": (a, bt), "tn": (at, b)}
    c = torch.empty(m, n, device="cuda")
    for name, (bk, stages, wide_stages, group, kinds) in VARIANTS.items():
        if not os.path.exists(cubin(name)):
            print(f"{name}: no cubin (run --build)")
            continue
        mod = cupy.RawModule(path=cubin(name))
        for kind in kinds:
            bn = 256 if kind else 128
            for layout, (x, y) in operands.items():
                fn = mod.get_function(f"gemm_tf32_{kind}{layout}_f32")
                shared = shared_bytes(layout, bk, wide_stages if kind else stages, bn)
                fn.max_dynamic_shared_size_bytes = shared
                pointer = fn.kernel.ptr
                args = (x.data_ptr(), y.data_ptr(), c.data_ptr(), 0, 0, 0, m, n, k, 0)
                grid = (-(-n // bn), -(-m // 128))

                def launch():
                    _launch.launch(pointer, grid, 256, shared, stream, args, "ppppppqqqq", 0)

                c.fill_(float("nan"))
                report(f"{name} {kind or 'narrow_'}{layout}", device_time_us(launch, warmup=3, reps=10), c)
    return rows


if __name__ == "__main__":
    if "--build" in sys.argv:
        build()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)
