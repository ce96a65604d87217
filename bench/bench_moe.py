"""Benchmark of the moe family (routing, permute, unpermute with the weighted combine) against torch's
composites, in one run on one GPU.

Shapes: Qwen3-30B-A3B's layer (16384 tokens, hidden 2048, 128 experts, top-8) and a Mixtral-like one
(16384 tokens, hidden 4096, 64 experts, top-2), bfloat16 activations, float32 router weights.
torch's composites are what Hugging Face's Qwen3MoeSparseMoeBlock does: the router softmax over
the experts in float32, topk, renormalise, and the per-expert counts (scatter_add_ into zeros:
torch.bincount synchronises with the host to size its output); permute as a stable argsort of the
flat ids, then index_select of the token rows (and the counts' cumsum for offsets); the combine as
HF's index_add_ of the weighted expert rows into zeros. Backwards are autograd's of the same
composites, timed alone. CUDA events, interleaved rounds, medians; rawops through the adapter's
launch functions (no autograd bookkeeping), the whole op each time (permute: its index kernels too).
Route's kernel (10-20 us) is shorter than its call's host work, so its rows are timed with the GPU
kept busy while each call is enqueued (timing.queued_device_times_us: the device time it costs in a
step whose GPU work runs ahead of the host), both sides alike; the call timed alone (host-bound) is
shown beside it.

Bytes each must move: permute reads x once and writes T k rows; unpermute reads T k rows and writes
T rows; its backward reads d out and T k rows, writes T k rows (the weights, ids and int32 tables
are noise beside them, and not counted). Bars: route >= 5x torch's composite; permute and
unpermute+combine >= 0.85 of the copy ceiling measured in the same run; the other rows are shown
for information. Permute's traffic is 1:k (T H read, T k H written), and where the card writes slower
than it copies (the H200) its limit falls below the bar: beside it, the same bytes moved by a
broadcast kernel (out[r] = x[r / k], a 16-byte vector a thread, rows in order: the limit of that
traffic, compiled by CuPy at bench time), and where that limit is under the bar the row is met at
>= 0.9 of it.

The experts' grouped GEMMs (sm_90), Qwen3's and Mixtral's: forward, d x and d weight of the gate/up
and down projections over moe_permute(pad_to=128)'s rows, against torch._grouped_mm on the same rows
and cuBLAS dense (torch.mm) of the same M x N x K. Bars: >= 0.9x torch._grouped_mm, >= 0.8 of dense.

The layer (sm_90: the grouped GEMM): transformers' Qwen3MoeSparseMoeBlock with each experts
implementation against rawops' MoE sharing its Parameters, forward and forward + backward, peak
memory; with two GPUs, the expert-parallel layer (NCCL all_to_all, 16384 tokens a GPU) in tokens/s
a GPU against one GPU's.

    python bench/bench_moe.py [--out bench/results]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import (ROW_HEADER, device_times_us, queued_device_times_us, ranked_step_us, row_result, start,  # noqa: E402
                    write_results)

# (name, tokens, hidden, experts, k)
SHAPES = [("qwen3", 16384, 2048, 128, 8), ("mixtral", 16384, 4096, 64, 2)]
# (name, tokens, hidden, intermediate, experts, k) of the grouped GEMMs
GEMM_SHAPES = [("qwen3", 16384, 2048, 768, 128, 8), ("mixtral", 16384, 4096, 14336, 64, 2)]
ROUTE_BAR = 5.0
ALONE = "call alone us (rawops / torch)"
LIMIT = "1:k limit us (of it)"
COPY_BAR = 0.85
LIMIT_FRACTION = 0.9  # of the 1:k limit, where that limit is under COPY_BAR
BROADCAST = r"""
extern "C" __global__ void broadcast_rows(const uint4* __restrict__ x, uint4* __restrict__ out, long long vecs,
                                          long long k, long long total) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const long long r = i / vecs, c = i - r * vecs;
  out[i] = x[(r / k) * vecs + c];
}
"""


def broadcast_limit_us(x, k):
    """Device time of out (T k, H) = x's rows each k times in order: permute's bytes at their simplest."""
    import cupy

    tokens, hidden = x.shape
    out = torch.empty(tokens * k, hidden, device=x.device, dtype=x.dtype)
    vecs = hidden * x.element_size() // 16
    total = tokens * k * vecs
    kernel = cupy.RawModule(code=BROADCAST).get_function("broadcast_rows")
    xc, oc = cupy.from_dlpack(x), cupy.from_dlpack(out)
    args = (xc, oc, cupy.int64(vecs), cupy.int64(k), cupy.int64(total))
    fn = lambda: kernel((-(-total // 256),), (256,), args)  # noqa: E731
    fn()
    assert torch.equal(out.view(tokens, k, hidden), x.unsqueeze(1).expand(tokens, k, hidden))
    return device_times_us({"broadcast": fn})["broadcast"]
DTYPE, DTYPE_NAME = torch.bfloat16, "bf16"


def torch_route(logits, k):
    """HF's router: softmax over the experts in float32, topk, renormalise; the counts."""
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, ids = torch.topk(p, k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    counts = torch.zeros(logits.shape[1], dtype=torch.int64, device=logits.device)
    counts.scatter_add_(0, ids.flatten(), torch.ones_like(ids.flatten()))
    return w, ids, counts


def torch_permute_fn(experts, k):
    """A stable argsort of the flat ids, the token rows gathered in that order, the offsets."""
    def fn(x, ids):
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        offsets = torch.cumsum(counts, 0)
        return x.index_select(0, order // k), offsets, order
    return fn


def torch_unpermute(y, w_sorted, token_of_row, tokens):
    """HF's combine: the weighted expert rows index_add_-ed into zeros (float32 weights applied in y's dtype)."""
    out = torch.zeros((tokens, y.shape[1]), dtype=y.dtype, device=y.device)
    return out.index_add_(0, token_of_row, y * w_sorted[:, None].to(y.dtype))


def backward_of(fn, inputs, grads, differentiable):
    """fn's backward alone (autograd.grad replayed over one forward graph)."""
    leaves = [t.detach().clone().requires_grad_(d) for t, d in zip(inputs, differentiable)]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    wrt = [t for t, d in zip(leaves, differentiable) if d]
    return lambda: torch.autograd.grad(outs[:len(grads)], wrt, grads, retain_graph=True)


def shape_rows(ta_moe, name, tokens, hidden, experts, k, ceiling):
    from rawops import moe as _moe

    rows = []
    shape = f"{name} T{tokens} H{hidden} E{experts} k{k}"
    logits = torch.randn(tokens, experts, device="cuda", dtype=DTYPE)
    flags = _moe.score_flags("softmax", True)
    # route: its kernel is shorter than its host work, so it is timed with the GPU busy while the call
    # is enqueued (the device time it costs inside a step); the call alone beside it
    route_fns = {"rawops": lambda: ta_moe.route(logits, k, flags), "torch": lambda: torch_route(logits, k)}
    times = queued_device_times_us(route_fns)
    alone = device_times_us(route_fns)
    nbytes = logits.numel() * logits.element_size() + tokens * k * 8
    rows.append(row_result("route", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {}, ceiling,
                           times["torch"] / times["rawops"] >= ROUTE_BAR))
    rows[-1][ALONE] = f"{alone['rawops']:.1f} / {alone['torch']:.1f}"
    w, ids, _ = ta_moe.route(logits, k, flags)
    ids_t = ids.long()  # the same ids in torch's index dtype (topk's int64), for its composites
    gw = torch.randn_like(w)
    bwd = {"rawops": lambda: ta_moe.route_backward(logits, ids, gw, flags),
           "torch": backward_of(lambda lg: torch_route(lg, k)[0], (logits,), (gw,), (True,))}
    times = device_times_us(bwd)
    nbytes = 2 * logits.numel() * logits.element_size() + tokens * k * 8
    rows.append(row_result("route bwd", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {}, ceiling,
                           None))
    # permute
    x = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE)
    e = x.element_size()
    tp = torch_permute_fn(experts, k)
    times = device_times_us({"rawops": lambda: ta_moe.permute(x, ids, experts, 1), "torch": lambda: tp(x, ids_t)})
    nbytes = (tokens + tokens * k) * hidden * e
    tbps = nbytes / times["rawops"] / 1e6
    limit_us = broadcast_limit_us(x, k)
    under_bar = nbytes / limit_us / 1e6 < COPY_BAR * ceiling
    rows.append(row_result("permute", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {}, ceiling,
                           tbps >= COPY_BAR * ceiling or (under_bar and limit_us / times["rawops"] >= LIMIT_FRACTION)))
    rows[-1][LIMIT] = (f"{limit_us:.1f} ({limit_us / times['rawops']:.3f}; the limit "
                       f"{nbytes / limit_us / 1e6 / ceiling:.3f} of the ceiling)")
    pad = 128
    padded_rows = _moe.permuted_rows(tokens, k, experts, pad)
    times = device_times_us({"rawops": lambda: ta_moe.permute(x, ids, experts, pad), "torch": lambda: tp(x, ids_t)})
    nbytes_pad = (tokens + padded_rows) * hidden * e
    rows.append(row_result(f"permute pad{pad}", DTYPE_NAME, shape, nbytes_pad, times["rawops"], times["torch"], {},
                           ceiling, None))
    permuted, offsets, counts, index = ta_moe.permute(x, ids, experts, 1)
    del permuted
    # unpermute + combine (y: the experts' output rows in permuted order)
    y = torch.randn(tokens * k, hidden, device="cuda", dtype=DTYPE)
    order = torch.argsort(ids.flatten(), stable=True)
    token_of_row, w_sorted = order // k, w.flatten()[order]
    times = device_times_us({"rawops": lambda: ta_moe.unpermute(y, w, index),
                             "torch": lambda: torch_unpermute(y, w_sorted, token_of_row, tokens)})
    nbytes = (tokens * k + tokens) * hidden * e
    tbps = nbytes / times["rawops"] / 1e6
    rows.append(row_result("unpermute+combine", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {},
                           ceiling, tbps >= COPY_BAR * ceiling))
    g = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE)
    bwd = {"rawops": lambda: ta_moe.unpermute_backward(g, y, w, index),
           "torch": backward_of(lambda yy, ww: torch_unpermute(yy, ww, token_of_row, tokens), (y, w_sorted), (g,),
                                (True, True))}
    times = device_times_us(bwd)
    nbytes = (tokens + 2 * tokens * k) * hidden * e
    rows.append(row_result("unpermute bwd", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {}, ceiling,
                           None))
    bwd = {"rawops": lambda: ta_moe.unpermute(y, None, index),
           "torch": backward_of(lambda xx: tp(xx, ids_t)[0], (x,), (y,), (True,))}
    times = device_times_us(bwd)
    nbytes = (tokens * k + tokens) * hidden * e
    rows.append(row_result("permute bwd", DTYPE_NAME, shape, nbytes, times["rawops"], times["torch"], {}, ceiling,
                           None))
    return rows


# The grouped GEMMs of the layer's experts, over moe_permute(pad_to=128)'s rows of a random routing:
# the gate/up and down projections forward (nt: each expert's nn.Linear weight), their d x (nn) and
# their d weight (tn, one launch over every expert), against torch._grouped_mm on the same rows and
# offsets and cuBLAS dense (torch.mm) of the same M x N x K (the same FLOPs, one weight).
GEMM_BARS = {"grouped_mm": 0.9, "dense": 0.8}
GEMM_HEADER = ["op", "dtype", "shape", "rawops us", "torch._grouped_mm us", "cuBLAS dense us", "rawops TFLOP/s",
               "x torch._grouped_mm", "of dense", "meets target", "notes"]


def grouped_rows(name, tokens, hidden, inter, experts, k):
    from rawops import moe as _moe
    from rawops.torch_adapter import moe as ta_moe

    shape = f"{name} T{tokens} H{hidden} I{inter} E{experts} k{k}"
    logits = torch.randn(tokens, experts, device="cuda", dtype=DTYPE)
    _, ids, _ = ta_moe.route(logits, k, _moe.score_flags("softmax", True))
    x = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE)
    xp, offsets, _, _ = ta_moe.permute(x, ids, experts, 128)
    del x
    rows, ends = xp.shape[0], offsets[1:].contiguous()
    used = int(offsets[-1])  # the rows of the groups (the permuted buffer's tail past them stays zero)
    wgu = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=DTYPE) * hidden ** -0.5
    wd = torch.randn(experts, hidden, inter, device="cuda", dtype=DTYPE) * inter ** -0.5
    hp = torch.randn(rows, inter, device="cuda", dtype=DTYPE)  # the swiglu rows the down projection reads
    dgu = torch.randn(rows, 2 * inter, device="cuda", dtype=DTYPE)  # d of the gate/up output
    dy = torch.randn(rows, hidden, device="cuda", dtype=DTYPE)  # d of the down output
    cases = [  # (op, m, n, k, rawops, torch._grouped_mm, dense of the same m n k)
        ("gate_up fwd (nt)", used, 2 * inter, hidden, lambda: ta_moe.grouped_mm(xp, wgu, offsets, True),
         lambda: torch._grouped_mm(xp, wgu.transpose(-2, -1), offs=ends), lambda: torch.mm(xp[:used], wgu[0].t())),
        ("down fwd (nt)", used, hidden, inter, lambda: ta_moe.grouped_mm(hp, wd, offsets, True),
         lambda: torch._grouped_mm(hp, wd.transpose(-2, -1), offs=ends), lambda: torch.mm(hp[:used], wd[0].t())),
        ("gate_up dx (nn)", used, hidden, 2 * inter, lambda: ta_moe.grouped_mm(dgu, wgu, offsets, False),
         lambda: torch._grouped_mm(dgu, wgu, offs=ends), lambda: torch.mm(dgu[:used], wgu[0])),
        ("down dx (nn)", used, inter, hidden, lambda: ta_moe.grouped_mm(dy, wd, offsets, False),
         lambda: torch._grouped_mm(dy, wd, offs=ends), lambda: torch.mm(dy[:used], wd[0])),
        ("gate_up dW (tn)", 2 * inter, hidden, used,
         lambda: ta_moe.grouped_mm_weight_grad(xp, dgu, offsets, experts, True),
         lambda: torch._grouped_mm(dgu.t(), xp, offs=ends), lambda: torch.mm(dgu[:used].t(), xp[:used])),
        ("down dW (tn)", hidden, inter, used, lambda: ta_moe.grouped_mm_weight_grad(hp, dy, offsets, experts, True),
         lambda: torch._grouped_mm(dy.t(), hp, offs=ends), lambda: torch.mm(dy[:used].t(), hp[:used])),
    ]
    out = []
    for op, m, n, kk, ours, theirs, dense in cases:
        fns = {"rawops": ours, "dense": dense}
        note = "-"
        try:
            theirs()
            fns["grouped_mm"] = theirs
        except Exception as error:  # a torch without it, or a layout it refuses
            note = f"torch._grouped_mm: {type(error).__name__}: {str(error)[:70]}"
        t = device_times_us(fns, warmup=3, reps=10, rounds=3)
        tflops = 2 * m * n * kk / t["rawops"] / 1e6
        vs = t["grouped_mm"] / t["rawops"] if "grouped_mm" in t else None
        of_dense = t["dense"] / t["rawops"]
        meets = of_dense >= GEMM_BARS["dense"] and (vs is None or vs >= GEMM_BARS["grouped_mm"])
        out.append({"op": f"grouped gemm {op}", "dtype": DTYPE_NAME, "shape": f"{shape} M{m} N{n} K{kk}",
                    "rawops us": t["rawops"], "torch._grouped_mm us": t.get("grouped_mm"),
                    "cuBLAS dense us": t["dense"], "rawops TFLOP/s": tflops, "x torch._grouped_mm": vs,
                    "of dense": of_dense, "meets target": meets, "torch us": t.get("grouped_mm"), "notes": note})
        print(f"{op:18s} {shape}: rawops {t['rawops']:8.1f} us ({tflops:5.0f} TFLOP/s), "
              f"grouped_mm {t.get('grouped_mm', float('nan')):8.1f}, dense {t['dense']:8.1f}", flush=True)
    return out


# The whole layer against transformers' Qwen3MoeSparseMoeBlock (Qwen3-30B-A3B's shape), with each
# experts implementation the installed transformers offers (config._experts_implementation).
HF_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")
LAYER_BARS = {"eager": 2.0, "fastest": 1.2}
LAYER_HEADER = ["op", "dtype", "shape", "config", "fwd us", "fwd+bwd us", "peak MiB", "x fwd", "x fwd+bwd", "notes"]


def layer_rows():
    """HF's block with each experts implementation and rawops' MoE sharing its Parameters: forward, forward
    + backward (every Parameter's gradient and the input's), peak memory of the forward + backward above
    the inputs. x: HF's time over rawops'."""
    from transformers.models.qwen3_moe import modeling_qwen3_moe as modeling

    from rawops.torch_adapter import MoE

    tokens, hidden, inter, experts, k = 16384, 2048, 768, 128, 8
    config = modeling.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                                     num_experts_per_tok=k, norm_topk_prob=True)
    block = modeling.Qwen3MoeSparseMoeBlock(config).to("cuda", DTYPE)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=hidden ** -0.5)
    x = torch.randn(1, tokens, hidden, device="cuda", dtype=DTYPE, requires_grad=True)
    dout = torch.randn_like(x)
    params = [x, *block.parameters()]
    shape = f"qwen3 T{tokens} H{hidden} I{inter} E{experts} k{k}"

    def timed(module):
        def fwd():
            with torch.no_grad():
                return module(x)

        def step():
            for p in params:
                p.grad = None
            torch.autograd.backward(module(x), dout)
        times = device_times_us({"fwd": fwd, "step": step})
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return times["fwd"], times["step"], (torch.cuda.max_memory_allocated() - base) / 2 ** 20

    results = {}
    for impl in HF_IMPLEMENTATIONS:
        config._experts_implementation = impl
        try:
            results[f"hf {impl}"] = timed(block)
        except Exception as error:  # an implementation this torch / transformers lacks
            results[f"hf {impl}"] = f"{type(error).__name__}: {str(error)[:80]}"
    results["rawops"] = timed(MoE.from_qwen3(block))
    ours = results["rawops"]
    rows = []
    for name, r in results.items():
        row = {"op": "moe layer", "dtype": DTYPE_NAME, "shape": shape, "config": name, "rawops us": None,
               "torch us": None}
        if isinstance(r, str):
            row["notes"] = r
        else:
            row.update({"fwd us": r[0], "fwd+bwd us": r[1], "peak MiB": r[2], "x fwd": r[0] / ours[0],
                        "x fwd+bwd": r[1] / ours[1]})
            if name != "rawops":
                row.update({"op": f"moe layer fwd+bwd vs {name}", "rawops us": ours[1], "torch us": r[1]})
        rows.append(row)
    return rows


PARALLEL_BAR = 1.6  # expert parallel on 2 GPUs: tokens/s at least this many times one GPU's


def parallel_layer(rank, world, tokens=16384):
    """The expert-parallel layer at the Qwen3 shape on this rank of an initialised NCCL group (`tokens`
    a rank, the experts split over the ranks, random weights): step(exchange=None) runs one forward +
    backward through `exchange` (an expert_parallel-like function; None: the shipped one) and returns
    the output. Also used by dev/profile_moe_parallel.py and dev/moe_parallel_gather.py."""
    from rawops.torch_adapter import moe_route
    from rawops.torch_adapter._moe_parallel import expert_parallel, local_moe_experts

    hidden, inter, experts, k = 2048, 768, 128, 8
    lo, hi = rank * experts // world, (rank + 1) * experts // world
    wr = (torch.randn(experts, hidden, device="cuda") * hidden ** -0.5).to(DTYPE).requires_grad_(True)
    wgu = (torch.randn(hi - lo, 2 * inter, hidden, device="cuda") * hidden ** -0.5).to(DTYPE).requires_grad_(True)
    wd = (torch.randn(hi - lo, hidden, inter, device="cuda") * inter ** -0.5).to(DTYPE).requires_grad_(True)
    x = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE, requires_grad=True)
    dout = torch.randn_like(x)
    local = local_moe_experts(wgu, wd)

    def step(exchange=None):
        weights, ids, _ = moe_route(torch.nn.functional.linear(x, wr), k)
        out = (exchange or expert_parallel)(x, weights, ids, experts, local)
        torch.autograd.backward(out, dout)
        return out
    return step


PARALLEL_MICRO_BATCHES = (1, 2)  # expert_parallel's micro_batches timed side by side


def _parallel_worker(rank, world, port, out_dir):
    """One rank of parallel_layer: the median time of its step at each of PARALLEL_MICRO_BATCHES,
    written to out_dir/rank<r>.txt (one line each)."""
    import torch.distributed as dist

    from rawops.torch_adapter._moe_parallel import expert_parallel

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    step = parallel_layer(rank, world)
    times = []
    for micro in PARALLEL_MICRO_BATCHES:
        def run(micro=micro):
            return step(lambda *args: expert_parallel(*args, micro_batches=micro))
        for _ in range(3):
            run()
        times.append(ranked_step_us(run))
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(map(str, times)))
    dist.destroy_process_group()


def parallel_rows(one_gpu_step_us, tokens=16384):
    """Expert parallel on 2 GPUs against one GPU's layer (one_gpu_step_us: its forward + backward of
    `tokens` tokens): tokens/s per GPU and the 2-GPU total over one GPU's."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    world = 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_parallel_worker, args=(world, port, out_dir), nprocs=world, join=True)
        ranks = [[float(v) for v in open(os.path.join(out_dir, f"rank{r}.txt")).read().split()] for r in range(world)]
    one = tokens / one_gpu_step_us * 1e6
    rows = []
    for i, micro in enumerate(PARALLEL_MICRO_BATCHES):
        step_us = max(times[i] for times in ranks)  # the slowest rank's step is the step
        per_gpu = tokens / step_us * 1e6
        rows.append({"op": "moe layer fwd+bwd, expert parallel", "dtype": DTYPE_NAME,
                     "shape": f"qwen3 T{tokens} a GPU", "config": f"{world} GPUs, micro_batches={micro}",
                     "fwd+bwd us": step_us, "rawops us": None, "torch us": None,
                     "notes": f"{per_gpu:.0f} tokens/s a GPU; {world} GPUs {world * per_gpu / one:.2f}x one GPU's "
                              f"{one:.0f} (bar {PARALLEL_BAR:g}x)"})
    return rows


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, ceiling = started
    from rawops.torch_adapter import moe as ta_moe

    rows = []
    for shape in SHAPES:
        rows += shape_rows(ta_moe, *shape, ceiling)
        torch.cuda.empty_cache()
    gemm = []
    for gshape in GEMM_SHAPES:
        try:
            gemm += grouped_rows(*gshape)
        except NotImplementedError as error:  # the grouped GEMM: sm_90 only
            gemm = [{"op": "grouped gemm", "notes": str(error), "rawops us": None, "torch us": None}]
            break
        torch.cuda.empty_cache()
    try:
        layer = layer_rows()
        ours = next((r for r in layer if r.get("config") == "rawops" and "fwd+bwd us" in r), None)
        if ours is not None and torch.cuda.device_count() >= 2:
            layer += parallel_rows(ours["fwd+bwd us"])
    except NotImplementedError as error:  # the grouped GEMM: sm_90 only
        layer = [{"op": "moe layer", "notes": str(error), "rawops us": None, "torch us": None}]
    torch.cuda.empty_cache()
    text = write_results(out_dir, "moe", "python bench/bench_moe.py", [
        ("The experts' grouped GEMMs, bf16, over moe_permute(pad_to=128) rows", GEMM_HEADER, gemm,
         {"bars": f">= {GEMM_BARS['grouped_mm']:g}x torch._grouped_mm, >= {GEMM_BARS['dense']:g} of cuBLAS dense "
                  "bf16 at the same M N K",
          "dense": "torch.mm of the same M x N x K with one expert's weight (the same FLOPs)"}),
        ("The layer against transformers' Qwen3MoeSparseMoeBlock, bf16", LAYER_HEADER, layer,
         {"bars": f">= {LAYER_BARS['eager']:g}x HF's eager experts, >= {LAYER_BARS['fastest']:g}x its fastest, "
                  "peak memory no higher than either",
          "x": "HF's time over rawops' (rawops' MoE shares the block's Parameters)"}),
        ("Device time, bf16 activations, float32 router weights", ROW_HEADER + [ALONE, LIMIT], rows,
         {"copy ceiling TB/s": round(ceiling, 3),
          "target": f"route >= {ROUTE_BAR:g}x torch; permute and unpermute+combine >= {COPY_BAR:.0%} of the copy "
                    f"ceiling (permute: or >= {LIMIT_FRACTION:g} of its 1:k limit where that is under the bar); "
                    "other rows for information (meets target: None)",
          "bytes": "permute: x read once, T k (+ padding) rows written; unpermute: T k rows read, T written; its "
                   "backward: d out and T k rows read, T k written; route: logits read, weights and ids written",
          "torch": "HF's router math (softmax float32, topk, renormalise, counts by scatter_add_); argsort + "
                   "index_select; index_add_ of the weighted rows; autograd for the backwards"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
