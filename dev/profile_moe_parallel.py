"""Where the expert-parallel layer's step goes (issue 28 item 5): two ranks (NCCL) at the Qwen3 shape,
16384 tokens a rank (bench/bench_moe.py's parallel_layer); rank 0 prints torch.profiler's CUDA kernels
by total time over 5 steps and the step's median time.

    python dev/profile_moe_parallel.py
"""
import os
import socket
import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from timing import ranked_step_us  # noqa: E402

TOKENS = 16384


def worker(rank, world, port):
    import torch.distributed as dist

    from bench_moe import parallel_layer

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    step = parallel_layer(rank, world, TOKENS)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    step_us = ranked_step_us(step)
    if rank == 0:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
        print(f"step median {step_us:.0f} us (per rank, {TOKENS} tokens a rank)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)
