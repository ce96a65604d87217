"""The 16-bit layer_norm backward on the H100: 154 us (0.87 of the copy ceiling, bar 0.85) at a3504c4,
163-166 at every run since (bench_norm, 16384 x 4096 bf16 / f16); bench_norm's second table at 8a41b57
put the full-rows entry at 1.4% of that, so the rest is in the block-a-row entry itself (its two row
sums, f3bd6eb / 50a48cb, are the change that touched it; on the H200 they gained 141 -> 131 us). This
times a3504c4's kernel (its kernels/ and constants, built to a cubin) beside today's two entries on
the same operands, the same grid, block and shared memory, in interleaved rounds, and checks their dx
against each other.

    python dev/time_norm_bwd_old.py --build [--commit a3504c4]   # on the CPU machine: the cubin in dev/.cubins
    python dev/time_norm_bwd_old.py [--commit a3504c4]           # on the GPU machine (carry dev/.cubins)
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# dev/ last on the path: its profile.py must not shadow the standard library's (torch imports cProfile)
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]
CACHE = os.path.join(HERE, ".cubins")
ROWS, COLS = 16384, 4096


def cubin_path(commit):
    return os.path.join(CACHE, f"norm-{commit}-sm_90.cubin")


def build(commit):
    """nvcc of `commit`'s kernels/norm.cu with that commit's headers, flags and constants."""
    os.makedirs(CACHE, exist_ok=True)
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "kernels", "rawops/_nvcc.py",
                                  "rawops/_constants.py"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        spec = importlib.util.spec_from_file_location("_old_nvcc", os.path.join(tree, "rawops", "_nvcc.py"))
        helpers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helpers)  # its constants: from the extracted rawops/_constants.py beside it
        flags = [f for f in helpers.NVCC_FLAGS if f != "--compress-mode=size"]
        out = cubin_path(commit)
        subprocess.run([helpers.find_nvcc(), *flags, *helpers.CONSTANT_DEFINES, f"-I{tree}/kernels/include", "--cubin",
                        "-arch=sm_90", f"{tree}/kernels/norm.cu", "-o", out], check=True)
    print(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="a3504c4")
    parser.add_argument("--build", action="store_true")
    args = parser.parse_args()
    if args.build:
        return build(args.commit)

    import cupy
    import torch

    sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]
    import timing
    from rawops import config, norm
    from rawops._launch import launch

    from cubins import unpacked

    old = cupy.RawModule(path=unpacked(cubin_path(args.commit)))
    print(f"{torch.cuda.get_device_name()}: layer_norm backward {ROWS} x {COLS}, us a launch (the dx kernel "
          f"alone, partial rows of dweight / dbias included; their final sum not)")
    for dtype, name, code in ((torch.bfloat16, "bf16", 2), (torch.float16, "f16", 1)):
        x = torch.randn(ROWS, COLS, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        w = torch.randn(COLS, device="cuda", dtype=dtype)
        mean = x.float().mean(1)
        rstd = (x.float().var(1, unbiased=False) + 1e-5).rsqrt()
        itemsize = x.element_size()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        dx0 = torch.empty_like(x)
        plan = norm.backward_plan(ROWS, COLS, itemsize, sms, dy.data_ptr(), x.data_ptr(), w.data_ptr(), dx0.data_ptr())
        runs = {}
        for label, full in (("today, a block a row", False), ("today, full rows", True)):
            with config.override(norm_full_rows=full):
                cfg = norm.backward_config("layer_norm", 0, code, itemsize, plan, COLS, True, 2)
            runs[label] = cfg
        function, mode, blocks, threads, smem, chunks, stage_flags = runs["today, a block a row"]
        kernel = old.get_function(f"layer_norm_bwd_{name}")
        if smem > kernel.max_dynamic_shared_size_bytes:
            kernel.max_dynamic_shared_size_bytes = smem
        outs, fns = {}, {}
        for label, cfg in [*runs.items(), (f"{args.commit}", (kernel.kernel.ptr, *runs["today, a block a row"][1:]))]:
            fn_ptr, mode, blocks, threads, smem, chunks, stage_flags = cfg
            dx = torch.empty_like(x)
            pdw = torch.empty(chunks, COLS, device="cuda")
            pdb = torch.empty_like(pdw)
            flags = norm.FLAG_VECTORS | norm.FLAG_WEIGHT | stage_flags
            a = (dy.data_ptr(), x.data_ptr(), w.data_ptr(), mean.data_ptr(), rstd.data_ptr(), dx.data_ptr(),
                 pdw.data_ptr(), pdb.data_ptr(), ROWS, COLS, COLS, COLS, COLS, mode, flags)

            def call(fn_ptr=fn_ptr, blocks=blocks, threads=threads, smem=smem, a=a):
                launch(fn_ptr, (blocks,), threads, smem, torch.cuda.current_stream().cuda_stream, a, norm.BWD_KINDS, 0)
            fns[label], outs[label] = call, (dx, pdw)
            print(f"  {name} {label}: grid {blocks} x {threads}, shared {smem} B, chunks {chunks}")
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        ref = outs["today, a block a row"][0].float()
        for label, (dx, _) in outs.items():
            err = ((dx.float() - ref).norm() / ref.norm()).item()
            print(f"  {name} {label}: dx relative to today's block-a-row entry {err:.2e}")
        times = timing.device_times_us(fns)
        nbytes = 3 * ROWS * COLS * itemsize
        for label, us in times.items():
            print(f"  {name} {label:24s} {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
