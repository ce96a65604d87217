"""The register-resident MLP forward (kernels/mlp_fused_fwd.cu) of the 64-wide network with 16-row
warp tiles (kMT = 1: half the registers) and 24 or 32 warps a block, against the shipped 32-row
tiles at 16 warps: on fast memory the forward is latency-bound (H200 ncu: 4 warps a scheduler,
tensor pipe 48% active, stalls on fixed-latency waits). Each variant a cubin of the same source
(dev/cubins.py), launched through FusedMLP with the family's kernels, the plan's rows a warp and
warps a block patched to match; outputs checked bit for bit against the shipped kernels', then
timed in interleaved rounds beside nn.Sequential. Experiment, not a bench.
    python dev/time_mlp_fwd_variants.py
"""
import contextlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import _mlp_plans as plans  # noqa: E402
from rawops import _modules, mlp  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402

FAMILY = "mlp_fused_fwd"
# label -> (macros, rows a 64-wide warp tile, warps a block)
VARIANTS = {
    "16 rows, 32 warps": (["RAWOPS_MLP_W64_MT=1", "RAWOPS_MLP_FAST_MAX_WARPS=32"], 16, 32),
    "16 rows, 24 warps": (["RAWOPS_MLP_W64_MT=1", "RAWOPS_MLP_FAST_MAX_WARPS=24"], 16, 24),
}
CACHES = [(mlp, "_ready"), (mlp, "_smem_set"), (mlp, "_per_sm"), (mlp, "_fast_fits")]


@contextlib.contextmanager
def variant(module, rows, warps):
    saved = {key: getattr(*key) for key in CACHES}
    shipped = (_modules.function_pointer, _modules.get_function, plans.fast_rows, plans.FAST_MAX_WARPS)
    if module is not None:
        _modules.function_pointer = lambda fam, name, dev: (module.get_function(name).kernel.ptr if fam == FAMILY
                                                            else shipped[0](fam, name, dev))
        _modules.get_function = lambda fam, name, dev: (module.get_function(name) if fam == FAMILY
                                                        else shipped[1](fam, name, dev))
        plans.fast_rows = lambda width: rows if width == 64 else shipped[2](width)
        plans.FAST_MAX_WARPS = warps
        for key in CACHES:
            setattr(*key, {})
    try:
        yield
    finally:
        _modules.function_pointer, _modules.get_function, plans.fast_rows, plans.FAST_MAX_WARPS = shipped
        for key, value in saved.items():
            setattr(*key, value)


def network(dtype):
    layers = []
    for i in range(5):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).cuda().to(dtype)


def main():
    modules = build_modules(FAMILY, {k: v[0] for k, v in VARIANTS.items()})
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    for dtype in (torch.float16, torch.bfloat16):
        net = network(dtype)
        x = torch.randn(1 << 20, 64, device="cuda", dtype=dtype)
        dy = torch.randn(1 << 20, 64, device="cuda", dtype=dtype)
        fns, train = {}, {}
        with torch.no_grad():
            ref = ta.FusedMLP.from_sequential(net)(x)
        for label, (macros, rows, warps) in {"shipped": ([], 32, 16), **VARIANTS}.items():
            module = modules.get(label)
            fused = ta.FusedMLP.from_sequential(net)
            with variant(module, rows, warps), torch.no_grad():
                out = fused(x)
            if not torch.equal(out, ref):
                print(f"WRONG: {label} {dtype}: max diff {(out.float() - ref.float()).abs().max().item()}", flush=True)
                continue

            def fwd(fused=fused, module=module, rows=rows, warps=warps):
                with variant(module, rows, warps), torch.no_grad():
                    fused(x)

            def fwd_bwd(fused=fused, module=module, rows=rows, warps=warps):
                with variant(module, rows, warps):
                    xg = x.detach().requires_grad_(True)
                    fused(xg).backward(dy)
            fns[label], train[label] = fwd, fwd_bwd
        fns["torch eager"] = lambda: net(x)
        times = timing.device_times_us(fns)
        print(f"fwd {dtype}: " + "; ".join(f"{k} {us:.1f} us ({times['torch eager'] / us:.2f}x eager)"
                                           for k, us in times.items()), flush=True)
        train["torch eager"] = lambda: net(x.detach().requires_grad_(True)).backward(dy)
        times = timing.device_times_us(train, reps=10, rounds=3)
        print(f"fwd+bwd {dtype}: " + "; ".join(f"{k} {us:.1f} us ({times['torch eager'] / us:.2f}x eager)"
                                               for k, us in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
