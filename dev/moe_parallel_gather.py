"""Expert parallel through fixed-size collectives (issue 28: 1.06x one GPU on two, bar 1.6x). At
Qwen3's top-8 over 2 ranks nearly every token has an expert on both ranks, so the shipped exchange
(rawops/torch_adapter/_moe_parallel.py: each token once to each rank holding one of its experts,
all_to_all_single with splits read on the host) moves about all T rows each way anyway. Here: an
all_gather of x, the routing weights and ids (every rank the same T), each rank's experts over all
W T rows (slots of other ranks' experts -1), and a reduce_scatter of the weighted sums (16-bit
partials summed in float32 past two ranks): no splits, no count exchange, no gathers or index_add
by rank; one host read remains (the local slot count local_experts takes). Experiment, not shipped.
    python dev/moe_parallel_gather.py          two GPUs: both exchanges timed at the Qwen3 shape
                                               (forward + backward, median of 10) and compared
    python dev/moe_parallel_gather.py --cpu    gloo, float64, 2 and 4 ranks: the gathered exchange's
                                               output and gradients equal the shipped one's
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, "..")]


class _AllGather(torch.autograd.Function):
    """(W T, ...) every rank's rows in rank order; the backward sums each rank's gradient back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class _ReduceScatter(torch.autograd.Function):
    """(T, ...) the ranks' rows for this rank's tokens summed; the backward gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllGather.apply(grad, ctx.group), None


def expert_parallel_gathered(x, weights, ids, num_experts, local_experts, group=None):
    """expert_parallel's result (T, H_out) through all_gather / reduce_scatter (module docstring);
    every rank of the group must hold the same number of tokens."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank = num_experts // world
    rows = _AllGather.apply(x, group)
    weights_all = _AllGather.apply(weights, group)
    ids_all = ids.new_empty((world * ids.shape[0], ids.shape[1]))
    dist.all_gather_into_tensor(ids_all, ids.contiguous(), group=group)
    local = ids_all.long() - rank * per_rank
    here = (local >= 0) & (local < per_rank)
    slot_ids = torch.where(here, local, -1).to(torch.int32)
    partial = local_experts(rows, slot_ids, weights_all * here, int(here.sum()))
    if partial.dtype in (torch.float16, torch.bfloat16) and world > 2:  # two ranks: one add, one rounding
        return _ReduceScatter.apply(partial.float(), group).to(partial.dtype)
    return _ReduceScatter.apply(partial, group)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_worker(rank, world, port):
    from rawops.torch_adapter._moe_parallel import expert_parallel
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from test_moe import _reference_experts

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    experts, k, hidden, inter, tokens = 8, 2, 16, 8, 41
    g = torch.Generator().manual_seed(1234 + rank)
    lo, hi = rank * experts // world, (rank + 1) * experts // world
    wgu = torch.randn(hi - lo, 2 * inter, hidden, generator=g, dtype=torch.float64)
    wd = torch.randn(hi - lo, hidden, inter, generator=g, dtype=torch.float64)
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    route = torch.topk(torch.softmax(torch.randn(tokens, experts, generator=g, dtype=torch.float64), -1), k)
    dout = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    results = []
    for fn in (expert_parallel, expert_parallel_gathered):
        leaves = [t.clone().requires_grad_(True) for t in (x, route.values, wgu, wd)]

        def local(rows, ids, weights, entries, wgu=leaves[2], wd=leaves[3]):
            assert entries == int((ids >= 0).sum())
            return sum(_reference_experts(rows, ids[:, j].clamp(min=0), wgu, wd)
                       * torch.where(ids[:, j] >= 0, weights[:, j], 0)[:, None] for j in range(ids.shape[1]))
        out = fn(leaves[0], leaves[1], route.indices, experts, local)
        results.append([out, *torch.autograd.grad(out, leaves, dout)])
    for name, a, b in zip(("out", "d x", "d weights", "d gate_up", "d down"), *results):
        assert torch.allclose(a, b, atol=1e-10), f"rank {rank}: {name}"
    print(f"rank {rank} of {world}: the gathered exchange equals the shipped one (out and 4 gradients)")
    dist.destroy_process_group()


def _gpu_worker(rank, world, port):
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    from bench_moe import parallel_layer
    from timing import ranked_step_us

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    tokens = 16384
    step = parallel_layer(rank, world, tokens)
    outs = {}
    for name, exchange in (("all_to_all (shipped)", None), ("all_gather / reduce_scatter", expert_parallel_gathered)):
        for _ in range(3):
            outs[name] = step(exchange).detach()
        step_us = ranked_step_us(lambda exchange=exchange: step(exchange))
        if rank == 0:
            print(f"{name:30s} fwd+bwd {step_us:8.0f} us a step (rank 0), {tokens} tokens a GPU", flush=True)
    a, b = outs.values()
    err = ((a.float() - b.float()).norm() / a.float().norm()).item()
    print(f"rank {rank}: outputs differ by {err:.2e} (relative norm)", flush=True)
    dist.destroy_process_group()


def main():
    if "--cpu" in sys.argv:
        for world in (2, 4):
            mp.spawn(_cpu_worker, args=(world, _port()), nprocs=world, join=True)
        return
    if torch.cuda.device_count() < 2:
        print("two GPUs needed (or --cpu)")
        return
    mp.spawn(_gpu_worker, args=(2, _port()), nprocs=2, join=True)


if __name__ == "__main__":
    main()
