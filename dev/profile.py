"""Run library (or torch) calls for Nsight Compute / Nsight Systems, or time them.

Each statement runs --warmup times, then once more between cudaProfilerStart/Stop inside an NVTX
range named after it, so that with `ncu --profile-from-start off` or `nsys profile
--capture-range=cudaProfilerApi` only the warm pass is captured (clocks up, L2 as in the
benches). Several statements are profiled in order on the same buffers (the library's kernel
beside torch's, say). --time prints each statement's median device time (bench/timing.py,
interleaved rounds) instead.

Names a statement can use: torch, F, rawops, config (rawops.config), ta (rawops.torch_adapter)
and its family modules ta_ew, ta_norm, ta_sm, ta_gemm, and CUDA tensors of --dtype: x, y, dy
of --shape, w and b of its last dim; --setup runs first in the same namespace (more operands).

    python dev/profile.py "ta.relu(x)" "torch.relu(x)" --shape 67108864 --dtype f16
    python dev/profile.py "ta.linear_gelu(x, w2, b2, approximate='tanh')" --shape 32x768 \\
        --setup "w2 = torch.randn(3072, 768, device='cuda'); b2 = torch.randn(3072, device='cuda')"
    python dev/profile.py "ta.gelu(x, approximate='tanh')" --time --config dependent_launch=false
"""
import argparse
import ast
import contextlib
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This file's folder off the path: as `profile` it would shadow the standard library's module, which
# cProfile (imported by torch._dynamo, so by Liger's functional API) needs.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _value(text):
    lowered = text.strip().lower()
    if lowered in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[lowered]
    return ast.literal_eval(text)


def namespace(shape, dtype, setup):
    import torch
    import torch.nn.functional as F

    import rawops
    from rawops import config
    from rawops import torch_adapter as ta

    names = {"torch": torch, "F": F, "rawops": rawops, "config": config, "ta": ta}
    for short, family in (("ta_ew", "elementwise"), ("ta_norm", "norm"), ("ta_sm", "softmaxes"), ("ta_gemm", "gemm")):
        with contextlib.suppress(ImportError):
            names[short] = importlib.import_module(f"rawops.torch_adapter.{family}")
    dt = getattr(torch, DTYPES[dtype])
    for name in ("x", "y", "dy"):
        names[name] = torch.randn(*shape, device="cuda", dtype=dt)
    names["w"] = torch.randn(shape[-1], device="cuda", dtype=dt)
    names["b"] = torch.randn(shape[-1], device="cuda", dtype=dt)
    if setup:
        exec(setup, names)
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("statements", nargs="+", help="Python expressions or statements, run in order")
    parser.add_argument("--shape", default="16384x4096", help="x, y, dy shape, e.g. 67108864 or 16384x4096")
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    parser.add_argument("--setup", default="", help="statements run once before (more operands)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                        help="a rawops.config switch for the run (repeatable)")
    parser.add_argument("--time", action="store_true", help="print median device times instead")
    args = parser.parse_args()

    import torch

    from rawops import config

    shape = tuple(int(d) for d in args.shape.lower().split("x"))
    names = namespace(shape, args.dtype, args.setup)
    calls = [(text, compile(text, f"<{text}>", "exec")) for text in args.statements]
    switches = dict((k.strip(), _value(v)) for k, v in (item.split("=", 1) for item in args.config))
    with config.override(**switches):
        if args.time:
            sys.path.insert(0, os.path.join(ROOT, "bench"))
            from timing import device_times_us

            times = device_times_us({text: (lambda code=code: exec(code, names)) for text, code in calls})
            for text, us in times.items():
                print(f"{us:10.2f} us  {text}")
            return 0
        for _, code in calls:
            for _ in range(args.warmup):
                exec(code, names)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for text, code in calls:
            with torch.cuda.nvtx.range(text[:60]):
                exec(code, names)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
