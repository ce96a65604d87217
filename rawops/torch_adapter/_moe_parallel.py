"""Expert parallelism for the moe family: the experts sharded over the ranks of a torch.distributed
group, each token sent once to each rank holding any of its experts, that rank's weighted sum of
its experts' outputs sent back and the ranks' sums added, through torch's own all_to_all_single
(NCCL between GPUs), with autograd through it.

    out = expert_parallel(x, weights, ids, num_experts, local_experts, group=None)

Rank r holds experts [r E/W, (r + 1) E/W) of the E = num_experts (W ranks; E a multiple of W).
x (T, H) are this rank's tokens, weights (T, k) and ids (T, k) their routing (moe_route's).

Dispatch: a token goes to each rank holding at least one of its k experts, once (not once an
expert: with Qwen3's top-8 over 2 ranks that is 2 rows a token on the wire instead of 8), with its
k slots: the local expert id where the slot's expert is on that rank, else -1, and the slot's
weight (0 where -1). The rows go sorted by destination rank, token order within a rank. The
counts are exchanged first (one small all_to_all and one read on the host: the splits of the
exchanges are host integers). `local_experts(rows, ids, weights, entries)` returns, for each
received row, sum_j weights[r, j] expert_{ids[r, j]}(rows[r]) over its slots with ids >= 0
(entries: how many such slots there are in all, a host integer). Those sums go back and each
token's (at most W) are added in rank order, in float32: no atomics contend, the same bits every
run; the gradients take the same paths back.

Where every rank holds the same T (exchange="gather", or "auto" after one all_gather of the T's):
an all_gather of x, the weights and ids, each rank's experts over all W T rows (the slots of other
ranks' experts -1), and a reduce_scatter of the weighted sums (16-bit sums added in float32 past two
ranks). No splits, no count exchange, no gathers or adds by rank, one host read (the local slot
count): at Qwen3's top-8 over 2 ranks nearly every token has an expert on both ranks, so the
all_to_all moved about all T rows each way anyway. Measured (two H200, Qwen3 layer, 16384 tokens a
GPU, forward + backward): 13,779 us a step through all_to_all, 11,451 through the gather
(dev/moe_parallel_gather.py); the outputs bit for bit equal.

micro_batches=N (the gather): the tokens in N slices whose exchanges run while another slice's
experts do: every slice's all_gathers started (async) before the first slice's experts, each
slice's reduce_scatter before the next slice's experts; in the backward both output gradients'
all_gathers before any experts' backward and each slice's input-gradient reduce_scatters before the
slice before it (_Issue / _Wait below). The one host read then waits for the ids' gather alone.

local_moe_experts(w_gate_up, w_down) is the GPU local_experts of Qwen3-MoE's SwiGLU experts on
rawops (moe_permute with 128-row groups, the grouped GEMMs, swiglu, the weighted sum back).
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


def _slices(splits):
    start = 0
    for n in splits:
        yield start, start + n
        start += n


def _sum_rows_by_rank(rows, token, splits, tokens):
    """(tokens, H): rows[i] added into row token[i] (16-bit rows in float32), the rows in runs of
    `splits` each with distinct tokens, the runs added one after another (no two adds meet:
    deterministic)."""
    dtype = torch.float32 if rows.dtype in (torch.float16, torch.bfloat16) else rows.dtype
    out = rows.new_zeros((tokens, rows.shape[1]), dtype=dtype)
    for a, b in _slices(splits):
        if b > a:
            out.index_add_(0, token[a:b], rows[a:b].to(dtype))
    return out


class _GatherByRank(torch.autograd.Function):
    """x[token] whose backward adds each run's rows back (runs of distinct tokens: deterministic)."""

    @staticmethod
    def forward(ctx, x, token, splits):
        ctx.save_for_backward(token)
        ctx.splits, ctx.tokens = splits, x.shape[0]
        return x.index_select(0, token)

    @staticmethod
    def backward(ctx, grad):
        (token,) = ctx.saved_tensors
        return _sum_rows_by_rank(grad, token, ctx.splits, ctx.tokens).to(grad.dtype), None, None


class _AddByRank(torch.autograd.Function):
    """Each token's rows (one a rank, in runs of `splits`) added in rank order, in float32."""

    @staticmethod
    def forward(ctx, rows, token, splits, tokens):
        ctx.save_for_backward(token)
        return _sum_rows_by_rank(rows, token, splits, tokens).to(rows.dtype)

    @staticmethod
    def backward(ctx, grad):
        (token,) = ctx.saved_tensors
        return grad.index_select(0, token), None, None, None


def dispatch_plan(ids, experts, world):
    """(mask (T, W) bool: token t has an expert on rank r, entries (W,) int64: its slots a rank)."""
    dest = ids.long() // (experts // world)
    mask = torch.zeros((ids.shape[0], world), dtype=torch.bool, device=ids.device)
    mask.scatter_(1, dest, True)
    return mask, torch.bincount(dest.reshape(-1), minlength=world)


EXCHANGES = ("auto", "gather", "all_to_all")


def expert_parallel(x, weights, ids, num_experts, local_experts, group=None, exchange="auto", micro_batches=1):
    """(T, H_out) = sum_j weights[t, j] expert_{ids[t, j]}(x[t]) with the experts sharded over the
    group's ranks (module docstring). Differentiable in x, weights and what local_experts uses.
    exchange: "gather" (every rank must hold the same T), "all_to_all", or "auto": the gather where
    the ranks' T are equal (one all_gather of them and a host read), else all_to_all. micro_batches:
    the gather's tokens in that many slices, each slice's exchanges in flight while another slice's
    experts run, forward and backward (1: one exchange each way; the all_to_all path takes 1 only)."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an int >= 1, got {micro_batches!r}")
    if micro_batches > 1 and exchange == "all_to_all":
        raise ValueError("micro_batches > 1 overlaps the gather exchange; exchange='all_to_all' takes 1")
    world = dist.get_world_size(group)
    if num_experts % world:
        raise ValueError(f"num_experts ({num_experts}) must be a multiple of the group's {world} ranks")
    if ids.shape != weights.shape or ids.dim() != 2 or x.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"x {tuple(x.shape)}, weights {tuple(weights.shape)} and ids {tuple(ids.shape)}: "
                         "expected (T, H), (T, k), (T, k)")
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if exchange == "auto":
        mine = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
        every = mine.new_empty(world)
        dist.all_gather_into_tensor(every, mine, group=group)
        exchange = "gather" if len(set(every.tolist())) == 1 else "all_to_all"
    if exchange == "gather":
        if micro_batches > 1 and x.shape[0] > 1:
            return _gathered_overlapped(x, weights, ids, num_experts, local_experts, group, micro_batches)
        return _gathered(x, weights, ids, num_experts, local_experts, group)
    tokens, k = ids.shape
    per_rank = num_experts // world
    mask, entries = dispatch_plan(ids, num_experts, world)
    counts = torch.stack([mask.sum(0), entries], 1)  # (W, 2): rows and slots to each rank
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    both = torch.cat([counts, received]).tolist()  # the splits: host integers (one read)
    send, recv = [c[0] for c in both[:world]], [c[0] for c in both[world:]]
    recv_entries = sum(c[1] for c in both[world:])
    # (rank, token) pairs, rank-major, tokens ascending within a rank (the size known: no second read)
    pairs = torch.nonzero_static(mask.t(), size=sum(send))
    dest_rank, token = pairs[:, 0], pairs[:, 1]
    token_ids = ids.long().index_select(0, token)
    here = token_ids // per_rank == dest_rank[:, None]  # (rows, k): the slots whose expert is on that rank
    slot_ids = torch.where(here, token_ids % per_rank, -1).to(torch.int32)
    slot_weights = weights.index_select(0, token) * here  # (its backward adds exact zeros: same bits)
    rows_in = _exchange(_GatherByRank.apply(x, token, send), sum(recv), recv, send, group)
    weights_in = _exchange(slot_weights, sum(recv), recv, send, group)
    ids_in = slot_ids.new_empty((sum(recv), k))
    dist.all_to_all_single(ids_in, slot_ids, recv, send, group=group)
    partial = local_experts(rows_in, ids_in, weights_in, recv_entries)
    back = _exchange(partial, sum(send), send, recv, group)
    return _AddByRank.apply(back, token, send, tokens)


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


def _local_slots(ids_all, rank, per_rank):
    """(here, slot ids) of gathered routing ids (rows, k): which slots' experts this rank holds, and
    their local expert ids (-1 for the others' slots, int32)."""
    local = ids_all.long() - rank * per_rank
    here = (local >= 0) & (local < per_rank)
    return here, torch.where(here, local, -1).to(torch.int32)


def _gathered(x, weights, ids, num_experts, local_experts, group):
    """expert_parallel through all_gather / reduce_scatter (module docstring): the same T a rank."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank = num_experts // world
    rows = _AllGather.apply(x, group)
    weights_all = _AllGather.apply(weights, group)
    ids_all = ids.new_empty((world * ids.shape[0], ids.shape[1]))
    dist.all_gather_into_tensor(ids_all, ids.contiguous(), group=group)
    here, slot_ids = _local_slots(ids_all, rank, per_rank)
    partial = local_experts(rows, slot_ids, weights_all * here, int(here.sum()))
    if partial.dtype in (torch.float16, torch.bfloat16) and world > 2:  # two ranks: one add, one rounding
        return _ReduceScatter.apply(partial.float(), group).to(partial.dtype)
    return _ReduceScatter.apply(partial, group)


# ------------------------------------------------------------------- the gather, overlapped
# Each collective is two autograd nodes: _Issue starts it (async_op) and hands on an empty token,
# _Wait waits for it (on NCCL: the current stream waits, the host goes on) and returns its result.
# In the backward _Wait's node starts the reverse collective on the gradient and _Issue's waits for
# it. The engine runs the ready node created last first, so creating the nodes in the order
# _gathered_overlapped does makes every slice's reverse exchanges start before the experts' backward
# of the slice before it, as its forward started each slice's gathers before the first experts ran.
class _Pending:
    """A collective in flight: its output and Work, and the reverse collective's in the backward."""

    __slots__ = ("out", "work", "back_out", "back_work")


def _all_gather_async(x, group):
    out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
    return out, dist.all_gather_into_tensor(out, x.contiguous(), group=group, async_op=True)


def _reduce_scatter_async(x, group):
    out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
    return out, dist.reduce_scatter_tensor(out, x.contiguous(), group=group, async_op=True)


_COLLECTIVES = {"gather": (_all_gather_async, _reduce_scatter_async),  # kind: (forward, its reverse)
                "scatter": (_reduce_scatter_async, _all_gather_async)}


class _Issue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pending, kind, group):
        pending.out, pending.work = _COLLECTIVES[kind][0](x, group)
        ctx.pending = pending
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _token):
        pending, ctx.pending = ctx.pending, None
        pending.back_work.wait()
        grad, pending.back_out, pending.back_work = pending.back_out, None, None
        return grad, None, None, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, pending, kind, group):
        pending.work.wait()
        out, pending.out, pending.work = pending.out, None, None
        ctx.pending, ctx.kind, ctx.group = pending, kind, group
        return out

    @staticmethod
    def backward(ctx, grad):
        pending, ctx.pending = ctx.pending, None
        pending.back_out, pending.back_work = _COLLECTIVES[ctx.kind][1](grad, ctx.group)
        return grad.new_zeros(0), None, None, None


def _gathered_overlapped(x, weights, ids, num_experts, local_experts, group, parts):
    """_gathered over `parts` slices of the tokens: every slice's gathers started before the first
    slice's experts run, each slice's reduce_scatter started before the next slice's experts, and in
    the backward the same overlap the other way round (the node order above). Per token the same
    arithmetic as _gathered: the same output bits wherever local_experts treats rows independently."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank, tokens = num_experts // world, x.shape[0]
    parts = min(parts, tokens)
    bounds = [tokens * i // parts for i in range(parts + 1)]
    slices = list(zip(bounds, bounds[1:]))
    # the routing first (small; ids carry no gradient), and the one host read of every slice's slots
    ids_all = ids.new_empty((world * tokens, ids.shape[1]))
    dist.all_gather_into_tensor(ids_all, ids.contiguous(), group=group)
    ids_all = ids_all.view(world, tokens, -1)
    heres, slot_ids = zip(*(_local_slots(ids_all[:, a:b].reshape(world * (b - a), -1), rank, per_rank)
                            for a, b in slices))
    entries = torch.stack([here.sum() for here in heres]).tolist()
    gathers = []
    for a, b in slices:  # every slice's rows and weights on the wire before any experts run
        px, pw = _Pending(), _Pending()
        gathers.append((_Issue.apply(x[a:b], px, "gather", group), px,
                        _Issue.apply(weights[a:b], pw, "gather", group), pw))
    scatters, dtype = [], None
    for (tx, px, tw, pw), here, ids_c, n in zip(gathers, heres, slot_ids, entries):
        rows, weights_c = _Wait.apply(tx, px, "gather", group), _Wait.apply(tw, pw, "gather", group)
        partial = local_experts(rows, ids_c, weights_c * here, n)
        dtype = partial.dtype
        if dtype in (torch.float16, torch.bfloat16) and world > 2:  # as _gathered: 16-bit sums in float32
            partial = partial.float()
        pp = _Pending()
        scatters.append((_Issue.apply(partial, pp, "scatter", group), pp))
    out = torch.cat([_Wait.apply(tp, pp, "scatter", group) for tp, pp in scatters])
    return out.to(dtype)


class _GatherWithZeroRow(torch.autograd.Function):
    """rows[row] with one zero row after them (index len(row)); the backward adds each entry's
    gradient to its row through torch's sorted index_put (deterministic)."""

    @staticmethod
    def forward(ctx, rows, row):
        ctx.save_for_backward(row)
        ctx.rows = rows.shape[0]
        out = rows.new_empty((row.shape[0] + 1, rows.shape[1]))
        torch.index_select(rows, 0, row, out=out[:-1])
        out[-1].zero_()
        return out

    @staticmethod
    def backward(ctx, grad):
        (row,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows, grad.shape[1]))
        return out.index_put_((row,), grad[:-1], accumulate=True), None


class _SlotSum(torch.autograd.Function):
    """(R, H) = sum_j weights[r, j] y[table[r, j]]: moe_unpermute's kernels over a table whose empty
    slots share one zero row of y (weight 0); the backward zero-fills d y first."""

    @staticmethod
    def forward(ctx, y, weights, table):
        from .moe import unpermute

        ctx.save_for_backward(y, weights, table)
        return unpermute(y, weights, table, shared_rows=True)

    @staticmethod
    def backward(ctx, grad):
        from .moe import unpermute_backward

        y, weights, table = ctx.saved_tensors
        dy, dw = unpermute_backward(grad, y, weights, table, shared_rows=True)
        return dy, dw, None


def local_moe_experts(w_gate_up, w_down):
    """local_experts for expert_parallel: Qwen3-MoE's SwiGLU experts on rawops, w_gate_up (E_local,
    2 I, H) and w_down (E_local, H, I) this rank's (sm_90: the grouped GEMM). Each slot's row is
    gathered (one row an entry, plus a zero row that every empty slot points at: expert 0 of a
    zero row is a zero row, bias-free SwiGLU), grouped by expert, and the weighted sum of each
    received row's slots taken by moe_unpermute over an (R, k) table into the experts' output."""
    from .glu import swiglu_fused
    from .moe import MOE_TILE_ROWS, moe_grouped_mm, moe_permute, moe_unpermute

    def run(rows, ids, weights, entries):
        if rows.shape[0] == 0:
            return rows.new_zeros((0, w_down.shape[1]))
        slots = torch.nonzero_static(ids >= 0, size=entries)  # (entries, 2): (row, slot), row-major
        row, slot = slots[:, 0], slots[:, 1]
        empty_slots = entries < ids.numel()  # (a zero row only where some slot points at it)
        if empty_slots:
            entry_rows = _GatherWithZeroRow.apply(rows, row)  # (entries + 1, H)
            entry_ids = torch.cat([ids[row, slot], ids.new_zeros(1)]).view(-1, 1)
        else:
            entry_rows, entry_ids = rows[row], ids[row, slot].view(-1, 1)
        permuted, offsets, counts, index = moe_permute(entry_rows, entry_ids, w_gate_up.shape[0], MOE_TILE_ROWS)
        h = swiglu_fused(moe_grouped_mm(permuted, w_gate_up, offsets, True))
        y = moe_grouped_mm(h, w_down, offsets, True)
        if not empty_slots:
            return moe_unpermute(y, weights, index.view(ids.shape), offsets, counts)
        table = index[-1].expand(ids.shape).clone()  # empty slots: the zero row's output, weight 0
        table[row, slot] = index[:-1, 0]
        return _SlotSum.apply(y, weights, table)
    return run
