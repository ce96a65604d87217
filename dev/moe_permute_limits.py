"""What bounds moe_permute (issue 28: 0.78 of the H100's copy ceiling on its covering grid, bar 0.85):
its traffic is T H read, T k H written (8:1 at Qwen3's top-8), not a copy's 1:1. Timed in the same
rounds at bench_moe's shapes (bf16), each against the bytes permute must move:
  fill T k H            out.zero_(): the write half alone (a write-only stream's rate)
  broadcast copy        out viewed (T, k, H) <- x expanded: the exact 1:k traffic, rows in order
  broadcast kernel      out[r] = x[r / k] a 16-byte vector a thread, a covering grid, rows in order
                        (evict-first stores, and plain: "st"): the 1:k stream at its simplest
  permute ordered ids   the shipped permute with ids sorted by token (output rows in token order: x
                        read once, in order; the limit of the kernel without the routing's scatter)
  permute pieces=P      random routing, the kernel with P 16-byte loads a lane in flight before
                        its stores (shipped: rawops/_constants.py MOE_PERMUTE_PIECES), cubins built
                        from kernels/moe.cu (dev/cubins.py)
  permute chunk=C       the shipped kernels, the index kernels' chunks at least C entries (fewer
                        blocks: fewer counts for the one-block scan to read; shipped 512)
Experiment, not a bench.
    python dev/moe_permute_limits.py
"""
import os
import sys

import cupy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, ".."),
                                                                        os.path.join(HERE, "..", "bench"), HERE]
import timing  # noqa: E402
from cubins import build_modules  # noqa: E402

from rawops import moe as _moe  # noqa: E402
from rawops.torch_adapter import moe as ta_moe  # noqa: E402

SHAPES = [("qwen3", 16384, 2048, 128, 8), ("mixtral", 16384, 4096, 64, 2)]
PIECES = (2, 4, 8)
CHUNKS = (1024, 2048, 4096)
BROADCAST = r"""
template <bool kStream>
__device__ void broadcast(const uint4* __restrict__ x, uint4* __restrict__ out, long long vecs, long long k,
                          long long total) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const long long r = i / vecs, c = i - r * vecs;
  const uint4 v = x[(r / k) * vecs + c];
  if (kStream) __stcs(out + i, v); else out[i] = v;
}
extern "C" __global__ void broadcast_cs(const uint4* x, uint4* out, long long vecs, long long k, long long total) {
  broadcast<true>(x, out, vecs, k, total);
}
extern "C" __global__ void broadcast_st(const uint4* x, uint4* out, long long vecs, long long k, long long total) {
  broadcast<false>(x, out, vecs, k, total);
}
"""


def main():
    ceiling = timing.copy_ceiling_tbps()
    print(f"{torch.cuda.get_device_name()}, copy ceiling {ceiling:.3f} TB/s")
    modules = build_modules("moe", {p: [f"RAWOPS_MOE_PERMUTE_PIECES={p}"] for p in PIECES})
    shipped_fn = _moe._fn
    for name, tokens, hidden, experts, k in SHAPES:
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        _, ids, _ = ta_moe.route(logits, k, _moe.score_flags("softmax", True))
        ordered = (torch.arange(tokens * k, device="cuda") * experts // (tokens * k)).to(torch.int32).view(tokens, k)
        out = torch.empty(tokens, k, hidden, device="cuda", dtype=torch.bfloat16)
        nbytes = tokens * hidden * 2 * (1 + k)
        calls = {
            "fill T k H": lambda: out.zero_(),
            "broadcast copy": lambda: out.copy_(x.unsqueeze(1).expand(tokens, k, hidden)),
            "permute ordered ids": lambda: ta_moe.permute(x, ordered, experts, 1),
        }
        vecs, total = hidden * 2 // 16, tokens * k * hidden * 2 // 16
        bmod = cupy.RawModule(code=BROADCAST, options=("-std=c++17",))
        xc, oc = cupy.from_dlpack(x), cupy.from_dlpack(out)
        for kind in ("cs", "st"):
            kernel = bmod.get_function(f"broadcast_{kind}")
            calls[f"broadcast kernel {kind}"] = (
                lambda kernel=kernel: kernel((-(-total // 256),), (256,), (xc, oc, cupy.int64(vecs), cupy.int64(k),
                                                                           cupy.int64(total))))
        for p, module in modules.items():
            pointer = module.get_function("moe_permute_bf16").kernel.ptr

            def variant(pointer=pointer):
                _moe._fn = lambda n, d, c=None: pointer if n == "moe_permute" else shipped_fn(n, d, c)
                try:
                    ta_moe.permute(x, ids, experts, 1)
                finally:
                    _moe._fn = shipped_fn
            calls[f"permute pieces={p}"] = variant
        for chunk in CHUNKS:
            def chunked(chunk=chunk):
                saved = _moe.INDEX_MIN_CHUNK
                _moe.INDEX_MIN_CHUNK = chunk
                try:
                    return ta_moe.permute(x, ids, experts, 1)
                finally:
                    _moe.INDEX_MIN_CHUNK = saved
            calls[f"permute chunk={chunk}"] = chunked
        check = {p: None for p in PIECES}
        for p in PIECES:  # each variant's rows bit for bit the shipped kernel's
            _moe._fn = (lambda n, d, c=None, q=modules[p].get_function("moe_permute_bf16").kernel.ptr:
                        q if n == "moe_permute" else shipped_fn(n, d, c))
            try:
                check[p] = ta_moe.permute(x, ids, experts, 1)[0]
            finally:
                _moe._fn = shipped_fn
        shipped = ta_moe.permute(x, ids, experts, 1)[0]
        print(f"== {name}: T {tokens} H {hidden} E {experts} k {k}; variants equal to shipped: "
              + ", ".join(f"{p}: {bool(torch.equal(v, shipped))}" for p, v in check.items()))
        times = timing.device_times_us(calls, reps=20, rounds=5)
        for label, us in times.items():
            moved = tokens * k * hidden * 2 if label == "fill T k H" else nbytes
            rate = moved / us / 1e6
            print(f"  {label:22s} {us:8.1f} us  {rate:.3f} TB/s  {rate / ceiling:.3f} of ceiling")


if __name__ == "__main__":
    main()
