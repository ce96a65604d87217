"""The MLP training forward's z stores: is its 310 us (inference 145 us + 512 MB of z) held by
where z goes? Builds of kernels/mlp.cu timed in interleaved rounds on the 64-wide, 4-hidden-layer
float16 ReLU network at batch 2^20 (the bench's forward+backward row), training and inference
forward:

- shipped: the library's build ([hidden][batch][width], plain 16-byte stores);
- cs: -DRAWOPS_MLP_Z_CS, the same stores evict-first (st.global.cs);
- tile: -DRAWOPS_MLP_Z_TILE_MAJOR, a warp tile's z of every layer contiguous ([tiles][hidden][32][width]:
  one 16 KB run a tile instead of four 4 KB runs 128 MB apart; no backward reads this layout);
- tile+cs: both.

Every build must give the same y and the same z (the tile layout permuted back). DRAM probes (a
fill and a copy of the same bytes) are timed beside them. Needs nvcc for the cubins
(`python bench/cubins.py 90` builds them beforehand).

    python bench/explore_mlp_zstore.py [--out bench/results]
"""
import os
import sys

import cupy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubins import build_modules  # noqa: E402
from timing import device_times_us, start, write_results  # noqa: E402

CUBINS = {"mlp": {"cs": ["RAWOPS_MLP_Z_CS"], "tile": ["RAWOPS_MLP_Z_TILE_MAJOR"],
                  "tile+cs": ["RAWOPS_MLP_Z_TILE_MAJOR", "RAWOPS_MLP_Z_CS"]}}  # bench/cubins.py builds these
BATCH, SIZES, ROWS = 1 << 20, (64,) * 6, 32


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

    modules = build_modules("mlp", CUBINS["mlp"])
    builds = Builds(modules)
    names = ["shipped", *modules]
    rows, notes = [], {}
    linears = [m for m in sequential(SIZES, torch.float16) if isinstance(m, torch.nn.Linear)]
    weights = [cupy.asarray(m.weight.detach()) for m in linears]
    biases = [cupy.asarray(m.bias.detach()) for m in linears]
    x = cupy.asarray(torch.randn(BATCH, SIZES[0], device="cuda", dtype=torch.float16))
    hidden, width = len(SIZES) - 2, SIZES[1]
    for act in ("relu",):

        def train():
            return rawops.fused_mlp_forward(x, weights, biases, act, "none")

        def infer():
            return rawops.fused_mlp(x, weights, biases, act, "none")

        results = {b: builds.run(b, train)() for b in names}
        y0, (z0,) = results["shipped"]
        for b in names[1:]:
            y, (z,) = results[b]
            if b.startswith("tile"):  # [tiles][hidden][rows][width] back to [hidden][batch][width]
                z = z.reshape(BATCH // ROWS, hidden, ROWS, width).transpose(1, 0, 2, 3).reshape(hidden, BATCH, width)
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
    write_results(out_dir, "explore_mlp_zstore", "python bench/explore_mlp_zstore.py",
                  [("64x4 float16 at 2^20: training / inference forward by build",
                    ["activation", "build", "forward", "us", "x shipped"], rows, notes),
                   ("DRAM probes", ["probe", "MB", "us", "TB/s"], stream_rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
