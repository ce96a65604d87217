"""Where the expert-parallel layer's step goes (issue 28 item 5): two ranks (NCCL) at the Qwen3 shape,
16384 tokens a rank; rank 0 prints torch.profiler's CUDA kernels by total time over 5 steps, the
step's median time, and one GPU's layer (all experts, 16384 tokens) for comparison.

    python dev/profile_moe_parallel.py
"""
import os
import socket
import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

TOKENS, HIDDEN, INTER, EXPERTS, K = 16384, 2048, 768, 128, 8


def worker(rank, world, port):
    import torch.distributed as dist

    from rawops.torch_adapter import moe_route
    from rawops.torch_adapter._moe_parallel import expert_parallel, local_moe_experts

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    lo, hi = rank * EXPERTS // world, (rank + 1) * EXPERTS // world
    dt = torch.bfloat16
    wr = (torch.randn(EXPERTS, HIDDEN, device="cuda") * HIDDEN ** -0.5).to(dt).requires_grad_(True)
    wgu = (torch.randn(hi - lo, 2 * INTER, HIDDEN, device="cuda") * HIDDEN ** -0.5).to(dt).requires_grad_(True)
    wd = (torch.randn(hi - lo, HIDDEN, INTER, device="cuda") * INTER ** -0.5).to(dt).requires_grad_(True)
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dt, requires_grad=True)
    dout = torch.randn_like(x)
    local = local_moe_experts(wgu, wd)

    def step():
        weights, ids, _ = moe_route(torch.nn.functional.linear(x, wr), K)
        torch.autograd.backward(expert_parallel(x, weights, ids, EXPERTS, local), dout)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    times = []
    for _ in range(10):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    if rank == 0:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
        print(f"step median {sorted(times)[5]:.0f} us (per rank, {TOKENS} tokens a rank)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)
