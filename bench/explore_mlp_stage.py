"""The fast MLP forward's z stores (training forward) in three builds of kernels/mlp.cu, timed in
interleaved rounds on the 64-wide, 4-hidden-layer float16 network at batch 2^20 (the bench's
forward+backward row), training and inference forward, ReLU and GELU:

- shipped: the library's build (sm_90: each chunk staged by stmatrix, rows stored as 16-byte
  segments by store_staged_rows);
- sts: the same source with -DRAWOPS_MLP_STAGE_STS (the pre-sm_90 staging: four 4-byte shared
  stores a chunk), so that path runs on this GPU too;
- bulk: -DRAWOPS_MLP_Z_BULK, the staged rows written by the copy engine (cp.async.bulk, one row a
  lane) instead of the warp's own 16-byte stores;
- shuffle (when its cubin is given): an older mlp.cu whose z stores were a quad transpose by
  shuffles straight from the fragments (commit 00b6813), built beforehand with
  `git show 00b6813:kernels/mlp.cu > /tmp/mlp_shuffle.cu && nvcc -O3 -std=c++17 -Ikernels/include
  --cubin -arch=sm_90 /tmp/mlp_shuffle.cu -o bench/.cubins/mlp-shuffle-sm90.cubin`.

Every build must give the same bits (y and every saved z). Needs nvcc for the sts cubin
(`python bench/cubins.py 90` builds it beforehand).

    python bench/explore_mlp_stage.py [--out bench/results] [--baseline bench/.cubins/mlp-shuffle-sm90.cubin]
"""
import os
import sys

import cupy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubins import build_modules  # noqa: E402
from timing import device_times_us, start, write_results  # noqa: E402

CUBINS = {"mlp": {"sts": ["RAWOPS_MLP_STAGE_STS"], "bulk": ["RAWOPS_MLP_Z_BULK"]}}  # bench/cubins.py builds these
BATCH, SIZES = 1 << 20, (64,) * 6
DEFAULT_BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cubins", "mlp-shuffle-sm90.cubin")


class Builds:
    """Routes rawops.mlp's tensor-core kernel lookups to one build at a time."""

    def __init__(self, modules):
        from rawops import mlp

        self.mlp, self.modules, self.current = mlp, modules, "shipped"
        self.shipped_lookup, self.pointers = mlp._tc_function, {}
        mlp._tc_function = self.lookup

    def lookup(self, name, plan, device, smem):
        if self.current == "shipped":
            return self.shipped_lookup(name, plan, device, smem)
        key = (self.current, f"{name}_{plan.suffix}", smem)
        if key not in self.pointers:
            kernel = self.modules[self.current].get_function(key[1])
            kernel.max_dynamic_shared_size_bytes = smem
            self.pointers[key] = kernel.kernel.ptr
        return self.pointers[key]

    def run(self, build, fn):
        def call():
            self.current = build
            try:
                return fn()
            finally:
                self.current = "shipped"
        return call


def write_probes():
    """(name, bytes moved, callable): a 640 MB fill (the training forward's writes: z and y), a
    768 MB fill, and a copy of 384 MB (768 MB moved, half read)."""
    fill640 = torch.empty(640 << 20, dtype=torch.uint8, device="cuda")
    fill768 = torch.empty(768 << 20, dtype=torch.uint8, device="cuda")
    src, dst = (torch.empty(384 << 20, dtype=torch.uint8, device="cuda") for _ in range(2))
    return [("fill 640 MB (write only)", 640 << 20, lambda: fill640.fill_(1)),
            ("fill 768 MB (write only)", 768 << 20, lambda: fill768.fill_(1)),
            ("copy 384 MB (768 MB moved)", 768 << 20, lambda: dst.copy_(src))]


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    import rawops
    from bench_mlp import sequential

    baseline = sys.argv[sys.argv.index("--baseline") + 1] if "--baseline" in sys.argv else DEFAULT_BASELINE
    modules = build_modules("mlp", CUBINS["mlp"])
    if os.path.exists(baseline):
        modules["shuffle"] = cupy.RawModule(path=baseline)
    else:
        print(f"no baseline cubin at {baseline}: shuffle build skipped")
    builds = Builds(modules)
    names = ["shipped", *modules]
    rows, notes = [], {}
    linears = [m for m in sequential(SIZES, torch.float16) if isinstance(m, torch.nn.Linear)]
    weights = [cupy.asarray(m.weight.detach()) for m in linears]
    biases = [cupy.asarray(m.bias.detach()) for m in linears]
    x = cupy.asarray(torch.randn(BATCH, SIZES[0], device="cuda", dtype=torch.float16))
    for act in ("relu", "gelu"):

        def train():
            return rawops.fused_mlp_forward(x, weights, biases, act, "none")

        def infer():
            return rawops.fused_mlp(x, weights, biases, act, "none")

        results = {b: builds.run(b, train)() for b in names}
        y0, (z0,) = results["shipped"]
        for b in names[1:]:
            y, (z,) = results[b]
            same = bool((y == y0).all()) and bool((z == z0).all())
            notes[f"{act}, {b}: y and z bit-identical to shipped"] = same
            print(f"{act}, {b}: y and z bit-identical to shipped: {same}")
        fns = {f"{b} train": builds.run(b, train) for b in names}
        fns.update({f"{b} infer": builds.run(b, infer) for b in names})
        times = device_times_us(fns)
        for key, t in times.items():
            build, kind = key.split()
            rows.append({"activation": act, "build": build, "forward": kind, "us": round(t, 1),
                         "x shipped": round(times[f"shipped {kind}"] / t, 3)})
            print(f"{act} {key}: {t:.1f} us")
    # Is the training forward (768 MB, 5/6 of it written) at the DRAM's rate for such a mix? The
    # same bytes as a pure write (fill) and as copies, timed beside it.
    stream_rows = []
    for name, nbytes, fn in write_probes():
        t = device_times_us({name: fn})[name]
        stream_rows.append({"probe": name, "MB": nbytes / 1e6, "us": round(t, 1), "TB/s": round(nbytes / t / 1e6, 3)})
        print(f"{name}: {t:.1f} us, {nbytes / t / 1e6:.3f} TB/s")
    write_results(out_dir, "explore_mlp_stage", "python bench/explore_mlp_stage.py",
                  [("64x4 float16 at 2^20: training / inference forward by build",
                    ["activation", "build", "forward", "us", "x shipped"], rows, notes),
                   ("DRAM probes", ["probe", "MB", "us", "TB/s"], stream_rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
