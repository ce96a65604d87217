"""The moe family for torch: moe_route, moe_permute and moe_unpermute with autograd, and their
`rawops::` custom ops for torch.compile (rawops/moe.py gives the semantics).

    weights, ids, counts = moe_route(router_logits, k)                # HF's softmax, top-k, renormalise
    permuted, offsets, counts, index = moe_permute(x, ids, num_experts, pad_to=1)
    y = experts(permuted, offsets)                                    # per-expert GEMMs (not here)
    out = moe_unpermute(y, weights, index)                           # the weighted combine

Gradients: moe_route's weights to the logits (ids and counts are integers); moe_permute's rows to x
(each token's k gradient rows summed); moe_unpermute's to y (the gradient rows scaled by the
weights, zero on padding rows) and to weights (dot products). Every output shape is a function of
the input shapes (permuted has T k + E (pad_to - 1) rows when pad_to > 1), so torch.compile traces
them with no data-dependent shapes.

Layouts and copies: logits, x, y and the incoming row gradients run as they are when their rows are
consecutive elements at one stride, else they are copied contiguous first; ids and index are made
contiguous (a copy of a strided one); weights not float32 are converted to float32 (a copy, through
autograd), as the kernels take float32 weights (the router's own dtype). Outputs are new tensors.
"""
import torch

from .. import _rows, moe as _moe
from .._launch import sm_count, tensor_code
from ._common import compiling, custom_op, fast_apply, needs_grad, on_device, raw_stream
from .norm import row_strided

_ID_TYPES = (torch.int32, torch.int64)


# ------------------------------------------------------------------- checks
def _float_rows(t, name, like=None, like_name="y"):
    """(t row-strided (or a contiguous copy), dtype code, row stride) of a 2-D CUDA float tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    t = row_strided(t)
    code = tensor_code(t, name, like, like_name, False)
    if t.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 2 dims")
    stride = t.shape[1] if t.is_contiguous() else _rows.collapsed_row_stride(tuple(t.shape), t.stride())
    return t, code, stride


def _ints(t, name, like, tokens=None, dtypes=_ID_TYPES, like_name="x"):
    """t contiguous, a 2-D (T, k) integer tensor of one of dtypes on like's GPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {' or '.join(str(d) for d in dtypes)}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, {like_name} on {like.device}; all arguments must be on one GPU")
    if t.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 2 dims, (T, k)")
    if tokens is not None and t.shape[0] != tokens:
        raise ValueError(f"{name} has {t.shape[0]} rows, expected {tokens}: one a token")
    return t.contiguous()


def _offsets(t, experts, like):
    """The grouped GEMM's group offsets: a 1-D int32 tensor of experts + 1 on like's GPU, contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"offsets must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"offsets has dtype {t.dtype}; expected torch.int32 (moe_permute's)")
    if t.device != like.device:
        raise ValueError(f"offsets is on {t.device}, x on {like.device}; all arguments must be on one GPU")
    if tuple(t.shape) != (experts + 1,):
        raise ValueError(f"offsets has shape {tuple(t.shape)}, expected ({experts + 1},): one a group and the end")
    return t.contiguous()


def _weights(w, tokens, k, device):
    if w is None:
        return None
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor, got {type(w).__name__}")
    if tuple(w.shape) != (tokens, k):
        raise ValueError(f"weights has shape {tuple(w.shape)}, expected ({tokens}, {k}) like index")
    if w.device != device:
        raise ValueError(f"weights is on {w.device}, y on {device}; all arguments must be on one GPU")
    return w.float().contiguous()


# ------------------------------------------------------------------- raw launches (no autograd)
def route(logits, k, flags):
    """(weights float32, ids int32, counts int32) of 2-D router logits."""
    x, code, stride = _float_rows(logits, "logits")
    tokens, experts = x.shape
    _moe.checked_experts(experts, "logits' experts (its last dim)")
    k = _moe.checked_k(k, experts)
    weights = torch.empty((tokens, k), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, k), dtype=torch.int32, device=x.device)
    counts = torch.zeros(experts, dtype=torch.int32, device=x.device)
    if tokens:
        device = x.get_device()
        on_device(device, _moe.launch_route, device, code, x.data_ptr(), weights.data_ptr(), ids.data_ptr(),
                  counts.data_ptr(), tokens, experts, stride, k, flags, raw_stream(device))
    return weights, ids, counts


def route_backward(logits, ids, grad_weights, flags):
    x, code, stride = _float_rows(logits, "logits")
    tokens, experts = x.shape
    ids = _ints(ids, "ids", x, tokens, (torch.int32,), "logits")
    k = _moe.checked_k(ids.shape[1], experts)
    g = grad_weights.float().contiguous()
    out = torch.empty((tokens, experts), dtype=x.dtype, device=x.device)
    if tokens:
        device = x.get_device()
        on_device(device, _moe.launch_route_bwd, device, code, x.data_ptr(), ids.data_ptr(), g.data_ptr(),
                  out.data_ptr(), tokens, experts, stride, k, flags, raw_stream(device))
    return out


def permute(x, ids, num_experts, pad_to):
    """(permuted, offsets, counts, index) of 2-D x and (T, k) ids."""
    experts = _moe.checked_experts(num_experts)
    pad_to = _moe.checked_pad_to(pad_to)
    x, code, x_stride = _float_rows(x, "x")
    tokens, hidden = x.shape
    ids = _ints(ids, "ids", x, tokens)
    k = _moe.checked_int(ids.shape[1], "ids' k (its columns)", 1, _moe.MAX_K, f" (MAX_K = {_moe.MAX_K})")
    rows = _moe.check_rows_fit(tokens, k, experts, pad_to)
    n = tokens * k
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    index = torch.empty((tokens, k), dtype=torch.int32, device=x.device)
    if n == 0:
        zeros = torch.zeros(experts + 1, dtype=torch.int32, device=x.device)
        return out, zeros, zeros[:experts].clone(), index
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=x.device)
    counts = torch.empty(experts, dtype=torch.int32, device=x.device)
    scratch = torch.empty(_moe.index_scratch_ints(n, experts, sm_count(x.get_device())), dtype=torch.int32,
                          device=x.device)
    # each output row's entry (-1: a padding row, zeroed by the permute)
    entry_of_row = (torch.full((rows,), -1, dtype=torch.int32, device=x.device) if pad_to > 1
                    else torch.empty(rows, dtype=torch.int32, device=x.device))
    device = x.get_device()
    on_device(device, _launch_permute, device, code, x, ids, scratch, offsets, counts, index, entry_of_row, out,
              hidden, k, x_stride, experts, pad_to, rows)
    return out, offsets, counts, index


def _launch_permute(device, code, x, ids, scratch, offsets, counts, index, entry_of_row, out, hidden, k, x_stride,
                    experts, pad_to, rows):
    s = raw_stream(device)
    n = index.numel()
    _moe.launch_index(device, ids.data_ptr(), ids.dtype == torch.int64, scratch.data_ptr(), offsets.data_ptr(),
                      counts.data_ptr(), index.data_ptr(), n, experts, pad_to, s,
                      entry_of_row.data_ptr() if hidden else 0)
    if hidden:
        _moe.launch_permute(device, code, x.element_size(), x.data_ptr(), entry_of_row.data_ptr(), offsets.data_ptr(),
                            out.data_ptr(), rows, hidden, k, x_stride, experts, s)


def _index_of(y, index, shared_rows=False):
    index = _ints(index, "index", y, None, (torch.int32,), "y")
    tokens, k = index.shape
    _moe.checked_int(k, "index's k (its columns)", 1, _moe.MAX_K, f" (MAX_K = {_moe.MAX_K})")
    if y.shape[0] < tokens * k and not shared_rows:
        raise ValueError(f"y has {y.shape[0]} rows; the index of {tokens} tokens x k = {k} needs at least {tokens * k}")
    return index, tokens, k


def unpermute(y, weights, index, shared_rows=False):
    """(T, H) = sum_j weights[t, j] y[index[t, j]] (weights None: the plain sum). shared_rows: index
    is not moe_permute's (entries may share a row of y; the expert-parallel slots' table)."""
    y, code, y_stride = _float_rows(y, "y")
    index, tokens, k = _index_of(y, index, shared_rows)
    w = _weights(weights, tokens, k, y.device)
    hidden = y.shape[1]
    out = torch.empty((tokens, hidden), dtype=y.dtype, device=y.device)
    if tokens and hidden:
        device = y.get_device()
        on_device(device, _moe.launch_unpermute, device, code, y.element_size(), y.data_ptr(),
                  w.data_ptr() if w is not None else 0, index.data_ptr(), out.data_ptr(), tokens, hidden, k, y_stride,
                  y.shape[0], raw_stream(device))
    return out


def unpermute_backward(grad_out, y, weights, index, offsets=None, counts=None, shared_rows=False):
    """(d y, d weights float32) of unpermute; weights None: ones (the plain sum's). shared_rows (the
    index not moe_permute's, entries sharing a row each writing its w d out there): d y zero-filled
    first, and every entry sharing a row must have weight 0 but one (the expert-parallel zero row:
    all 0)."""
    y, code, y_stride = _float_rows(y, "y")
    index, tokens, k = _index_of(y, index, shared_rows)
    g, _, g_stride = _float_rows(grad_out, "grad_out", like=y)
    hidden, y_rows = y.shape[1], y.shape[0]
    if tuple(g.shape) != (tokens, hidden):
        raise ValueError(f"grad_out has shape {tuple(g.shape)}, expected ({tokens}, {hidden})")
    w = _weights(weights, tokens, k, y.device)
    if w is None:
        w = torch.ones((tokens, k), dtype=torch.float32, device=y.device)
    n = tokens * k
    padded = y_rows > n or shared_rows
    have_table = offsets is not None and counts is not None and not shared_rows
    dy = (torch.zeros if padded and not have_table else torch.empty)((y_rows, hidden), dtype=y.dtype, device=y.device)
    dw = torch.zeros((tokens, k), dtype=torch.float32, device=y.device)
    if tokens and hidden or (padded and have_table):
        device = y.get_device()
        on_device(device, _launch_unpermute_bwd, device, code, g, y, w, index, dy, dw, tokens, hidden, k, g_stride,
                  y_stride, offsets if padded and have_table else None, counts)
    return dy, dw


def _launch_unpermute_bwd(device, code, g, y, w, index, dy, dw, tokens, hidden, k, g_stride, y_stride, offsets,
                          counts):
    s = raw_stream(device)
    if tokens and hidden:
        _moe.launch_unpermute_bwd(device, code, y.element_size(), g.data_ptr(), y.data_ptr(), w.data_ptr(),
                                  index.data_ptr(), dy.data_ptr(), dw.data_ptr(), tokens, hidden, k, g_stride,
                                  y_stride, y.shape[0], s)
    if offsets is not None and hidden:
        offsets, counts = offsets.to(torch.int32).contiguous(), counts.to(torch.int32).contiguous()
        _moe.launch_pad_zero(device, dy.data_ptr(), offsets.data_ptr(), counts.data_ptr(), tokens * k,
                             offsets.shape[0] - 1, y.shape[0], hidden * y.element_size(), s)


# ------------------------------------------------------------------- autograd (eager)
class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, k, flags):
        weights, ids, counts = route(logits, k, flags)
        ctx.mark_non_differentiable(ids, counts)
        ctx.save_for_backward(logits, ids)
        ctx.flags = flags
        return weights, ids, counts

    @staticmethod
    def backward(ctx, grad_weights, grad_ids, grad_counts):
        if grad_weights is None:  # only the ids were used
            return None, None, None
        logits, ids = ctx.saved_tensors
        return route_backward(logits, ids, grad_weights, ctx.flags), None, None


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, num_experts, pad_to):
        out, offsets, counts, index = permute(x, ids, num_experts, pad_to)
        ctx.mark_non_differentiable(offsets, counts, index)
        ctx.save_for_backward(index)
        return out, offsets, counts, index

    @staticmethod
    def backward(ctx, grad_out, *unused):
        if grad_out is None:
            return None, None, None, None
        (index,) = ctx.saved_tensors
        return unpermute(grad_out, None, index), None, None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, weights, index, offsets, counts):
        out = unpermute(y, weights, index)
        ctx.save_for_backward(y, weights, index, offsets, counts)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        y, weights, index, offsets, counts = ctx.saved_tensors
        dy, dw = unpermute_backward(grad_out, y, weights, index, offsets, counts)
        return dy, (dw if weights is not None and ctx.needs_input_grad[1] else None), None, None, None


_route_apply = fast_apply(_Route)
_permute_apply = fast_apply(_Permute)
_unpermute_apply = fast_apply(_Unpermute)


# ------------------------------------------------------------------- custom ops (torch.compile)
def _route_fake(logits, k, flags):
    t, e = logits.shape
    return (logits.new_empty((t, k), dtype=torch.float32), logits.new_empty((t, k), dtype=torch.int32),
            logits.new_empty((e,), dtype=torch.int32))


_route_backward_op = custom_op("moe_route_backward", "(Tensor logits, Tensor ids, Tensor grad_weights, int flags) -> "
                               "Tensor", route_backward, lambda logits, ids, g, flags: torch.empty_like(logits))


def _route_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[1])
    ctx.flags = inputs[2]


def _route_formula(ctx, grad_weights, grad_ids, grad_counts):
    logits, ids = ctx.saved_tensors
    return _route_backward_op(logits, ids, grad_weights, ctx.flags), None, None


_route_op = custom_op("moe_route", "(Tensor logits, int k, int flags) -> (Tensor, Tensor, Tensor)", route,
                      _route_fake, _route_formula, _route_setup)


def _unpermute_fake(y, weights, index, offsets, counts):
    return y.new_empty((index.shape[0], y.shape[1]))


_unpermute_backward_op = custom_op(
    "moe_unpermute_backward", "(Tensor grad_out, Tensor y, Tensor? weights, Tensor index, Tensor? offsets, "
    "Tensor? counts) -> (Tensor, Tensor)", unpermute_backward,
    lambda g, y, w, index, offsets, counts: (torch.empty_like(y), index.new_empty(index.shape, dtype=torch.float32)))


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)
    ctx.has_weights = inputs[1] is not None


def _unpermute_formula(ctx, grad_out):
    y, weights, index, offsets, counts = ctx.saved_tensors
    dy, dw = _unpermute_backward_op(grad_out, y, weights, index, offsets, counts)
    return dy, (dw if ctx.has_weights else None), None, None, None


_unpermute_op = custom_op("moe_unpermute", "(Tensor y, Tensor? weights, Tensor index, Tensor? offsets, "
                          "Tensor? counts) -> Tensor", lambda y, w, index, offsets, counts: unpermute(y, w, index),
                          _unpermute_fake, _unpermute_formula, _unpermute_setup)


def _permute_fake(x, ids, num_experts, pad_to):
    t, h = x.shape
    k = ids.shape[1]
    rows = _moe.permuted_rows(t, k, num_experts, pad_to)
    return (x.new_empty((rows, h)), x.new_empty((num_experts + 1,), dtype=torch.int32),
            x.new_empty((num_experts,), dtype=torch.int32), x.new_empty((t, k), dtype=torch.int32))


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[3])


def _permute_formula(ctx, grad_out, *unused):
    (index,) = ctx.saved_tensors
    return _unpermute_op(grad_out, None, index, None, None), None, None, None


_permute_op = custom_op("moe_permute", "(Tensor x, Tensor ids, int num_experts, int pad_to) -> (Tensor, Tensor, "
                        "Tensor, Tensor)", permute, _permute_fake, _permute_formula, _permute_setup)


# ------------------------------------------------------------------- public functions
def moe_route(logits, k, score="softmax", normalize=True):
    """(weights (T, k) float32, ids (T, k) int32, counts (E,) int32) of router logits (T, E):
    softmax (or sigmoid) scores, the top k (equal scores to the lower id), renormalised to sum 1 when
    normalize (HF's Qwen3-MoE / Mixtral router). Differentiable in logits through weights."""
    flags = _moe.score_flags(score, normalize)
    if compiling():
        return _route_op(logits, k, flags)
    if needs_grad(logits):
        return _route_apply(logits, k, flags)
    return route(logits, k, flags)


def moe_permute(x, ids, num_experts, pad_to=1):
    """(permuted, offsets (E + 1,), counts (E,), index (T, k)), int32 tables: x's rows copied to
    their experts' groups, token order within a group, each group padded with zero rows to a
    multiple of pad_to. Differentiable in x."""
    if compiling():
        return _permute_op(x, ids, num_experts, pad_to)
    if needs_grad(x):
        return _permute_apply(x, ids, num_experts, pad_to)
    return permute(x, ids, num_experts, pad_to)


def moe_unpermute(y, weights, index, offsets=None, counts=None):
    """(T, H) = sum_j weights[t, j] y[index[t, j]] (weights None: the plain sum). offsets and
    counts (moe_permute's) let the backward zero only y's padding rows of d y (else d y is
    zero-filled first when y has padding rows). Differentiable in y and weights."""
    if weights is not None and isinstance(weights, torch.Tensor) and weights.dtype != torch.float32:
        weights = weights.float()
    if compiling():
        return _unpermute_op(y, weights, index, offsets, counts)
    if needs_grad(y, weights):
        return _unpermute_apply(y, weights, index, offsets, counts)
    return unpermute(y, weights, index)


# ------------------------------------------------------------------- grouped GEMM and the layer (sm_90)
def _grouped_launch(kind, a, b, out, offsets, experts, rows, m, n, k, transpose):
    from .. import _gemm_sm90, _modules

    device = a.get_device()
    if _modules.compute_capability(device) != _gemm_sm90.CC or not _gemm_sm90.built(device):
        raise NotImplementedError("the grouped expert GEMM runs the Hopper kernel (sm_90) only, for now")
    code = tensor_code(a, "x", None, None, False)
    if kind == "mm":
        layout = "nt" if transpose else "nn"
        why = _gemm_sm90.grouped_check(layout, code, rows, n, k, a.data_ptr(), b.data_ptr(), out.data_ptr(),
                                       offsets.data_ptr())
        name, launch = _gemm_sm90.grouped_entry_name(layout, code), _gemm_sm90.launch_grouped
        args = (layout, code, a.data_ptr(), b.data_ptr(), out.data_ptr(), offsets.data_ptr(), experts, rows, n, k)
    else:
        why = _gemm_sm90.grouped_wgrad_check(code, m, n, a.data_ptr(), b.data_ptr(), out.data_ptr(),
                                             offsets.data_ptr())
        name, launch = _gemm_sm90.grouped_entry_name("tn", code), _gemm_sm90.launch_grouped_wgrad
        args = (code, a.data_ptr(), b.data_ptr(), out.data_ptr(), offsets.data_ptr(), experts, rows, m, n)
    if why is not None:
        raise ValueError(f"grouped expert GEMM: {why}")
    function = _gemm_sm90.function(name, device)
    on_device(device, launch, function, sm_count(device), device, *args, raw_stream(device))


def grouped_mm(x, weight, offsets, transpose=True):
    """y (N, out): each expert's rows of x (N, K; moe_permute(pad_to=128)'s) times weight[e].T
    (transpose: weight (E, out, K)) or weight[e] ((E, K, out)); rows past offsets[E] zero. No autograd."""
    x, _, _ = _float_rows(x, "x")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    tensor_code(weight, "weight", x, "x", False)
    if weight.dim() != 3:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected 3 dims, (E, out, K) or (E, K, out)")
    experts = weight.shape[0]
    offsets = _offsets(offsets, experts, x)
    x, w = x.contiguous(), weight.contiguous()
    k = x.shape[1]
    if (w.shape[2] if transpose else w.shape[1]) != k:
        raise ValueError(f"weight has shape {tuple(w.shape)}; its K must match x's last dim {k}")
    n = w.shape[1] if transpose else w.shape[2]
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _grouped_launch("mm", x, w, out, offsets, experts, x.shape[0], 0, n, k, transpose)
    return out


def grouped_mm_weight_grad(x, grad_y, offsets, experts, transpose=True):
    """d weight of grouped_mm(x, weight, offsets, transpose): (E, out, K) or (E, K, out)."""
    x, _, _ = _float_rows(x, "x")
    grad_y, _, _ = _float_rows(grad_y, "grad_y", like=x, like_name="x")
    if grad_y.shape[0] != x.shape[0]:
        raise ValueError(f"grad_y has {grad_y.shape[0]} rows, expected {x.shape[0]} like x")
    offsets = _offsets(offsets, experts, x)
    x, g = x.contiguous(), grad_y.contiguous()
    (first, m), (second, cols) = ((g, g.shape[1]), (x, x.shape[1])) if transpose else ((x, x.shape[1]),
                                                                                      (g, g.shape[1]))
    out = torch.empty((experts, m, cols), dtype=x.dtype, device=x.device)
    _grouped_launch("wgrad", first, second, out, offsets, experts, x.shape[0], m, cols, 0, transpose)
    return out


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, offsets, transpose):
        ctx.save_for_backward(x, weight, offsets)
        ctx.transpose = transpose
        return grouped_mm(x, weight, offsets, transpose)

    @staticmethod
    def backward(ctx, grad_y):
        return _grouped_mm_grads(ctx, grad_y, grouped_mm, grouped_mm_weight_grad)


def _grouped_mm_grads(ctx, grad_y, mm, weight_grad):
    """(dx, dweight, None, None) of y = grouped_mm(x, weight, offsets, transpose): dx the other layout
    on the same weight (y = x W^T -> dx = dy W), dweight the experts' weight-gradient launch."""
    x, weight, offsets = ctx.saved_tensors
    dx = mm(grad_y, weight, offsets, not ctx.transpose) if ctx.needs_input_grad[0] else None
    dw = weight_grad(x, grad_y, offsets, weight.shape[0], ctx.transpose) if ctx.needs_input_grad[1] else None
    return dx, dw, None, None


def _grouped_mm_fake(x, weight, offsets, transpose):
    return x.new_empty((x.shape[0], weight.shape[1] if transpose else weight.shape[2]))


def _grouped_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.transpose = inputs[3]


_grouped_weight_grad_op = custom_op(
    "moe_grouped_mm_weight_grad", "(Tensor x, Tensor grad_y, Tensor offsets, int experts, bool transpose) -> Tensor",
    grouped_mm_weight_grad,
    lambda x, g, offsets, experts, transpose: x.new_empty(
        (experts, g.shape[1], x.shape[1]) if transpose else (experts, x.shape[1], g.shape[1])))
_grouped_mm_op = custom_op(
    "moe_grouped_mm", "(Tensor x, Tensor weight, Tensor offsets, bool transpose) -> Tensor", grouped_mm,
    _grouped_mm_fake, lambda ctx, grad_y: _grouped_mm_grads(ctx, grad_y, _grouped_mm_op, _grouped_weight_grad_op),
    _grouped_setup)


def moe_grouped_mm(x, weight, offsets, transpose=True):
    """y (N, out): each expert e's rows y[offsets[e]:offsets[e + 1]] = x[those rows] @ weight[e].T
    (transpose: weight (E, out, K), nn.Linear's layout) or @ weight[e] (weight (E, K, out)), x
    moe_permute's rows with pad_to=128, offsets its (E + 1,) int32. Differentiable in x and weight
    (the experts' weight gradients in one launch); torch.compile traces it (a custom op). sm_90."""
    if compiling():
        return _grouped_mm_op(x, weight, offsets, transpose)
    if needs_grad(x, weight):
        return _GroupedMM.apply(x, weight, offsets, transpose)
    return grouped_mm(x, weight, offsets, transpose)


MOE_TILE_ROWS = 128  # the grouped GEMM's tile rows: every expert's group padded to it


def moe_mlp(x, router_weight, w_gate_up, w_down, k, normalize=True):
    """A mixture-of-experts SwiGLU MLP, Qwen3-MoE's: the router (x @ router_weight.T, softmax, top-k,
    renormalise), each token's rows to its k experts, per expert down(silu(gate) * up) with
    gate_up = x @ w_gate_up[e].T split in halves (gate first), the weighted combine. x (T, H);
    router_weight (E, H); w_gate_up (E, 2 I, H); w_down (E, H, I) (transformers' fused experts'
    layouts). Returns (T, H) and the router logits. sm_90 (the grouped GEMM)."""
    experts = router_weight.shape[0]
    logits = torch.nn.functional.linear(x, router_weight)
    weights, ids, _ = moe_route(logits, k, "softmax", normalize)
    permuted, offsets, counts, index = moe_permute(x, ids, experts, MOE_TILE_ROWS)
    from .glu import swiglu_fused

    h = swiglu_fused(moe_grouped_mm(permuted, w_gate_up, offsets, True))
    y = moe_grouped_mm(h, w_down, offsets, True)
    return moe_unpermute(y, weights, index, offsets, counts), logits


class _Router(torch.nn.Module):
    """The router's parameter under HF's name (`gate.weight`, (E, H))."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight


class _Experts(torch.nn.Module):
    """The experts' parameters under HF's names and layouts: gate_up_proj (E, 2 I, H), down_proj (E, H, I)."""

    def __init__(self, gate_up_proj, down_proj):
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj


class MoE(torch.nn.Module):
    """A mixture-of-experts SwiGLU block on rawops (moe_mlp), with transformers'
    Qwen3MoeSparseMoeBlock's parameters and state_dict keys (gate.weight, experts.gate_up_proj,
    experts.down_proj): MoE(hidden, intermediate, experts, k) builds one, MoE.from_qwen3(block) shares a
    block's Parameters (an optimizer built before keeps working). forward(hidden_states (..., H)) ->
    (..., H), as the block's. sm_90 (the grouped GEMM)."""

    def __init__(self, hidden, intermediate, experts, k, normalize=True, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.top_k, self.normalize = int(k), bool(normalize)
        self.gate = _Router(torch.nn.Parameter(torch.empty(experts, hidden, **kw)))
        self.experts = _Experts(torch.nn.Parameter(torch.empty(experts, 2 * intermediate, hidden, **kw)),
                                torch.nn.Parameter(torch.empty(experts, hidden, intermediate, **kw)))
        for p in self.parameters():
            torch.nn.init.normal_(p, std=hidden ** -0.5)

    @classmethod
    def from_qwen3(cls, block):
        """A MoE holding a transformers Qwen3MoeSparseMoeBlock's own Parameters (its act must be silu)."""
        gate, experts = block.gate, block.experts
        act = getattr(experts, "act_fn", None)
        if act is not None and type(act).__name__ not in ("SiLU", "SiLUActivation"):
            raise ValueError(f"the block's experts use {type(act).__name__}; MoE computes silu(gate) * up")
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.top_k, new.normalize = int(gate.top_k), bool(getattr(gate, "norm_topk_prob", True))
        new.gate = _Router(gate.weight)
        new.experts = _Experts(experts.gate_up_proj, experts.down_proj)
        return new.train(block.training)

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        out, _ = moe_mlp(x, self.gate.weight, self.experts.gate_up_proj, self.experts.down_proj, self.top_k,
                         self.normalize)
        return out.reshape(shape)
