"""Expert parallel's two exchanges side by side (issue 28: 1.06x one GPU on two, bar 1.6x):
all_to_all (each token once to each rank holding one of its experts, splits read on the host) and
the gather (all_gather of x, weights and ids, each rank's experts over all W T rows, reduce_scatter
back: rawops/torch_adapter/_moe_parallel.py, now what "auto" takes where the ranks' T are equal).
    python dev/moe_parallel_gather.py          two GPUs: both exchanges timed at the Qwen3 shape
                                               (forward + backward, median of 10) and compared
    python dev/moe_parallel_gather.py --cpu    gloo, float64, 2 and 4 ranks: the gathered exchange's
                                               output and gradients equal the shipped one's
"""
import os
import socket
from functools import partial
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [os.path.join(HERE, "..")]


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
    for exchange in ("all_to_all", "gather"):
        leaves = [t.clone().requires_grad_(True) for t in (x, route.values, wgu, wd)]

        def local(rows, ids, weights, entries, wgu=leaves[2], wd=leaves[3]):
            assert entries == int((ids >= 0).sum())
            return sum(_reference_experts(rows, ids[:, j].clamp(min=0), wgu, wd)
                       * torch.where(ids[:, j] >= 0, weights[:, j], 0)[:, None] for j in range(ids.shape[1]))
        out = expert_parallel(leaves[0], leaves[1], route.indices, experts, local, exchange=exchange)
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
    from rawops.torch_adapter._moe_parallel import expert_parallel

    for name, exchange in (("all_to_all", "all_to_all"), ("all_gather / reduce_scatter", "gather")):
        for _ in range(3):
            outs[name] = step(partial(expert_parallel, exchange=exchange)).detach()
        step_us = ranked_step_us(lambda exchange=exchange: step(partial(expert_parallel, exchange=exchange)))
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
