"""Expert parallelism for the moe family: the experts sharded over the ranks of a torch.distributed
group, each token's k rows sent to the ranks holding their experts and the results sent back and
combined, through torch's own all_to_all_single (NCCL between GPUs), with autograd through it.

    out = expert_parallel(x, weights, ids, num_experts, local_experts, group=None, combine=None)

Rank r holds experts [r E/W, (r + 1) E/W) of the E = num_experts (W ranks; E a multiple of W).
x (T, H) are this rank's tokens, weights (T, k) and ids (T, k) their routing (moe_route's). The
entries (t, j) are sorted by destination rank (stable: token order within a rank), the counts
exchanged (one small all_to_all and a read of them on the host: the splits of the exchanges are
host integers), the rows exchanged, `local_experts(rows, local_ids)` runs this rank's experts on
the rows it received (local_ids: int64 in [0, E/W)), the results exchanged back into the sorted
order, and `combine(y, weights, index)` adds each token's k results with its weights, index (T, k)
int32 the row of y each entry's result is in (default: rawops' moe_unpermute, deterministic;
another callable for tensors rawops' kernels do not take, as the CPU test does).

local_moe_experts(w_gate_up, w_down) is the GPU local_experts of Qwen3-MoE's SwiGLU experts on
rawops (moe_permute with 128-row groups, the grouped GEMMs, swiglu, the sum back).
"""
import warnings

import torch
import torch.distributed as dist


def _exchange(x, out_rows, out_splits, in_splits, group):
    """all_to_all_single with autograd (torch.distributed.nn.functional's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # its newer home returns async tensors
        from torch.distributed.nn.functional import all_to_all_single
    out = x.new_empty((out_rows, *x.shape[1:]))
    return all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)


def dispatch_order(ids, experts, world):
    """(order, destination counts) of the flat entries of ids (T, k): entries sorted by the rank
    holding their expert (experts // world a rank), stably."""
    per_rank = experts // world
    dest = ids.reshape(-1).long() // per_rank
    order = torch.argsort(dest, stable=True)
    return order, torch.bincount(dest, minlength=world)


def _unpermute(y, weights, index):
    from .moe import moe_unpermute

    return moe_unpermute(y, weights, index)


def expert_parallel(x, weights, ids, num_experts, local_experts, group=None, combine=None):
    """(T, H_out) = sum_j weights[t, j] expert_{ids[t, j]}(x[t]) with the experts sharded over the
    group's ranks (module docstring). Differentiable in x, weights and what local_experts uses."""
    world = dist.get_world_size(group)
    if num_experts % world:
        raise ValueError(f"num_experts ({num_experts}) must be a multiple of the group's {world} ranks")
    if ids.shape != weights.shape or ids.dim() != 2 or x.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"x {tuple(x.shape)}, weights {tuple(weights.shape)} and ids {tuple(ids.shape)}: "
                         "expected (T, H), (T, k), (T, k)")
    tokens, k = ids.shape
    per_rank = num_experts // world
    order, send_counts = dispatch_order(ids, num_experts, world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()  # the splits: host integers
    rows_in = _exchange(x[order // k], sum(recv), recv, send, group)
    local_ids = (ids.reshape(-1).long()[order] % per_rank).contiguous()
    ids_in = local_ids.new_empty(sum(recv))
    dist.all_to_all_single(ids_in, local_ids, recv, send, group=group)
    y_back = _exchange(local_experts(rows_in, ids_in), sum(send), send, recv, group)
    index = torch.empty(tokens * k, dtype=torch.int32, device=x.device)
    index[order] = torch.arange(tokens * k, dtype=torch.int32, device=x.device)
    return (combine or _unpermute)(y_back, weights, index.reshape(tokens, k))


def local_moe_experts(w_gate_up, w_down):
    """local_experts for expert_parallel: Qwen3-MoE's SwiGLU experts on rawops, w_gate_up (E_local,
    2 I, H) and w_down (E_local, H, I) this rank's (sm_90: the grouped GEMM)."""
    from .glu import swiglu_fused
    from .moe import MOE_TILE_ROWS, moe_grouped_mm, moe_permute, moe_unpermute

    def run(rows, local_ids):
        if rows.shape[0] == 0:
            return rows.new_zeros((0, w_down.shape[1]))
        permuted, offsets, counts, index = moe_permute(rows, local_ids.view(-1, 1).int(), w_gate_up.shape[0],
                                                       MOE_TILE_ROWS)
        h = swiglu_fused(moe_grouped_mm(permuted, w_gate_up, offsets, True))
        return moe_unpermute(moe_grouped_mm(h, w_down, offsets, True), None, index, offsets, counts)
    return run
