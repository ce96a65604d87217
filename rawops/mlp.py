"""The MLP family: a whole multi-layer perceptron in one launch, forward and backward.

fused_mlp(x, weights, biases, activation, output_activation) computes, with weights in
torch.nn.Linear layout (weight [out, in], bias [out]),
    h = x; h = act(h W_l^T + b_l) for each hidden layer; y = output_act(h W_L^T + b_L)
in one kernel; the hidden activations never reach device memory (inference). Two regimes:
  * float32, the source network 100-128-64-10 with ReLU, at float32's accuracy (within torch's
    float32 error): up to SMALL_BATCH_MAX samples exact float32 FFMA kernels; beyond it on sm_80+
    (config.mlp_tf32, the default) 3xTF32 on the tensor pipe, every k8 slice's tensor-core sum
    added in float32 (promoted), forward and backward; else the FFMA kernels (a register-tiled
    forward, a chain and weight-gradient kernels backward; up to SMALL_BWD_ROWS samples the
    whole backward in one launch);
  * float16 / bfloat16, tiny-cuda-nn-style networks on tensor cores (float32 accumulation):
    n_in 1..128, 1..8 hidden layers of one width in (16, 32, 64, 128), n_out 1..128.
Anything else is a ValueError naming what is supported.

Training: fused_mlp_forward also returns what the backward needs (the source network keeps
its two post-ReLU activations; the tensor-core path keeps each hidden pre-activation), and
fused_mlp_backward returns dx, the weight and the bias gradients; weight and bias gradients
are summed over the batch deterministically (per-chunk partials, then a fixed-order sum; in
float32 no running sum spans more than a few hundred terms, so the sums keep float32's
accuracy at any batch).

Kernels, one fatbin each (FAMILY_OF names each kernel's): kernels/mlp_source.cu (the source
network on FFMA and at small batches), mlp_source_tc.cu (the source network on the tensor pipe),
mlp_tiles.cu (the WMMA tile kernels and the ordered weight-gradient reduce), mlp_fused_fwd.cu
(the register-resident forward), mlp_fused_bwd.cu (the fused backward). What
runs for a network, and every size and shape, is arithmetic in rawops/_mlp_plans.py; here the
device's limits pick among them and the launches go out.
"""
from ._launch import (NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, sm_count, stream_pointer,
                      wait_for_producer)
from . import _mlp_plans as plans
from . import _modules, _rows, config

# ------------------------------------------------------------------------------ the kernel tables
# The source network's float32 kernels (kernels/mlp_source.cu, the source_mlp_tc* entries
# mlp_source_tc.cu): base name -> argument names.
_SOURCE_FWD_ARGS = ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "h1s", "h2s", "batch", "flags")
KERNELS = {
    "source_mlp_fwd": _SOURCE_FWD_ARGS,
    "source_mlp_small_fwd": _SOURCE_FWD_ARGS,
    "source_mlp_tc32_fwd": _SOURCE_FWD_ARGS,
    "source_mlp_tc16_fwd": _SOURCE_FWD_ARGS,
    "source_mlp_small_bwd": ("dy", "ym", "w1", "w2", "w3", "x", "h1", "h2", "dx", "dw1", "db1", "dw2", "db2",
                             "dw3", "db3", "batch"),
    "mlp_dgrad_bwd": ("G", "Gm", "W", "H", "out", "batch", "N", "K"),
    "mlp_wgrad_bwd": ("G", "Gm", "A", "ws", "batch", "N", "K", "k_p", "db_offset", "stride", "a_act",
                      "rows_per_chunk"),
    # the backward on the tensor pipe (3xTF32, sm_80+, where the forward takes it): the chain, then
    # layer l's weight gradients (mlp_wgrad_bwd's arguments; Gm null, a_act 0)
    "source_mlp_tc_dgrad_bwd": ("dy", "ym", "w3", "w2", "h2s", "h1s", "g3s", "g2s", "g1s", "batch"),
    **{f"source_mlp_tc_wgrad{_l}_bwd": ("G", "Gm", "A", "ws", "batch", "N", "K", "k_p", "db_offset", "stride",
                                        "a_act", "rows_per_chunk") for _l in range(3)},
}
# Kernels in every float dtype (<name>_f32 / _f16 / _bf16), kernels/mlp_tiles.cu.
KERNELS_ALL_FLOATS = {
    "mlp_wgrad_reduce_bwd": ("ws", "chunks", "stride", "N", "K", "k_p", "db_offset", "dw", "db"),
}
# The WMMA tile kernels (kernels/mlp_tiles.cu), float16 and bfloat16 (<name>_f16 / _bf16), one
# per accumulator count NF in plans.TC_NFS.
_TC_POINTERS = tuple(f"w{i}" for i in range(plans.MAX_LAYERS))
_TC_FWD_ARGS = ("x", "y", "save", *_TC_POINTERS, *(f"b{i}" for i in range(plans.MAX_LAYERS)), "batch", "n_in",
                "width", "n_out", "hidden", "flags")
_TC_BWD_ARGS = ("dy", "y", "save", "gws", "dx", *_TC_POINTERS, "batch", "n_in", "width", "n_out", "hidden", "flags")
_TC_WGRAD_ARGS = ("G", "Gm", "A", "ws", "batch", "N", "K", "db_offset", "stride", "a_act", "rows_per_chunk")
TC_KERNELS = {}
for _nf in plans.TC_NFS:
    TC_KERNELS[f"tc_mlp_nf{_nf}_fwd"] = _TC_FWD_ARGS
    TC_KERNELS[f"tc_mlp_nf{_nf}_bwd"] = _TC_BWD_ARGS
    TC_KERNELS[f"tc_mlp_wgrad_nf{_nf}_bwd"] = _TC_WGRAD_ARGS
# The register-resident forward (kernels/mlp_fused_fwd.cu, sm_80+), one entry per hidden width
# and activation: used wherever fast_fit finds room for every layer's weights and
# >= FAST_MIN_WARPS warps' staging rows; the tile kernels run the rest.
TC_FAST_KERNELS = {f"tc_mlp_w{_w}_{_a}_fwd": _TC_FWD_ARGS for _w in plans.TC_WIDTHS for _a in plans.FAST_ACTIVATIONS}
# The fused backward (kernels/mlp_fused_bwd.cu: chain, weight and bias gradients in one kernel,
# sm_80+), one entry per hidden width in FAST_BWD_WIDTHS and activation; per-block float32
# partials in ws, summed by mlp_wgrad_reduce_layers_bwd. Where fast_bwd_fit finds no room, the
# tile kernels run instead.
_TC_FAST_BWD_ARGS = ("dy", "y", "x", "save", "dx", "ws", *_TC_POINTERS, "batch", "n_in", "n_out", "hidden", "flags",
                     "ws_stride")
TC_FAST_BWD_KERNELS = {f"tc_mlp_w{_w}_{_a}_bwd": _TC_FAST_BWD_ARGS for _w in plans.FAST_BWD_WIDTHS
                       for _a in plans.FAST_ACTIVATIONS}

_HALF = ("f16", "bf16")
# Every extern "C" entry point -> the fatbin (kernels/<family>.cu) that holds it; tests/test_build.py
# checks each fatbin against it.
FAMILY_OF = {
    **{f"{base}_f32": "mlp_source_tc" if base.startswith("source_mlp_tc") else "mlp_source" for base in KERNELS},
    **{f"{base}_{s}": "mlp_tiles" for base in KERNELS_ALL_FLOATS for s in ("f32", *_HALF)},
    **{f"{base}_{s}": "mlp_tiles" for base in TC_KERNELS for s in _HALF},
    **{f"{base}_{s}": "mlp_fused_fwd" for base in TC_FAST_KERNELS for s in _HALF},
    **{f"{base}_{s}": "mlp_fused_bwd" for base in (*TC_FAST_BWD_KERNELS, "mlp_wgrad_reduce_layers_bwd")
       for s in _HALF},
}
ENTRY_POINTS = frozenset(FAMILY_OF)
SOURCE_FWD_KINDS = "pppppppppp" + "qq"
SMALL_BWD_KINDS = "p" * 15 + "q"
DGRAD_KINDS = "ppppp" + "qqq"
TC_DGRAD_KINDS = "ppppppppp" + "q"
WGRAD_KINDS = "pppp" + "q" * 8
REDUCE_KINDS = "p" + "q" * 6 + "pp"
TC_FWD_KINDS = "ppp" + "p" * 2 * plans.MAX_LAYERS + "q" * 6
TC_BWD_KINDS = "ppppp" + "p" * plans.MAX_LAYERS + "q" * 6
TC_WGRAD_KINDS = "pppp" + "q" * 7
TC_FAST_BWD_KINDS = "pppppp" + "p" * plans.MAX_LAYERS + "q" * 6
REDUCE_LAYERS_KINDS = "p" + "q" * 6 + "p" * 2 * plans.MAX_LAYERS


def _get_function(name, device):
    return _modules.get_function(FAMILY_OF[name], name, device)


def _function_pointer(name, device):
    return _modules.function_pointer(FAMILY_OF[name], name, device)


def _padded(pointers):
    """Per-layer pointers padded with nulls to the entries' MAX_LAYERS (None: all null)."""
    pointers = list(pointers) if pointers is not None else []
    return pointers + [0] * (plans.MAX_LAYERS - len(pointers))


# ------------------------------------------------------------------------------ what the device fits
_optin = {}
_fits = {}
compute_capability = _modules.compute_capability  # module-level: tests replace it here


def optin_smem(device):
    """Shared memory one block may opt in to on `device` (cudaDevAttrMaxSharedMemoryPerBlockOptin)."""
    limit = _optin.get(device)
    if limit is None:
        import cupy

        limit = _optin[device] = cupy.cuda.runtime.deviceGetAttribute(97, device)
    return limit


_source_tc_fits = {}


def source_tc_fit(device, variant=None):
    """(warps, shared memory bytes) of the 3xTF32 forward `variant` (default plans.SOURCE_TC) on
    `device`, or None where it does not run: before sm_80, or where fewer than
    SOURCE_TC_MIN_WARPS warps fit beside the weights; the most warps in steps of
    SOURCE_TC_WARP_STEP. Sets the kernel's shared-memory limit once."""
    variant = variant or plans.SOURCE_TC
    key = (variant, device)
    if key not in _source_tc_fits:
        rows, most = plans.SOURCE_TC_VARIANTS[variant]
        fit = None
        if compute_capability(device) >= 80:
            fit = plans.most_warps(lambda warps: plans.source_tc_smem(rows, warps), most, plans.SOURCE_TC_MIN_WARPS,
                                   optin_smem(device), plans.SOURCE_TC_WARP_STEP)
        if fit is not None:
            _get_function(f"{variant}_f32", device).max_dynamic_shared_size_bytes = fit[1]
        _source_tc_fits[key] = fit
    return _source_tc_fits[key]


_fast_fits = {}


def fast_fit(plan, device):
    """(warps, shared memory bytes) of the register-resident forward on `device`, or None where
    it does not run: before sm_80, or when fewer than FAST_MIN_WARPS warps fit beside the weights."""
    key = (plan, device)
    if key not in _fast_fits:
        fit = None
        if plan.regime == "tc" and compute_capability(device) >= 80:
            fit = plans.most_warps(
                lambda warps: plans.fast_smem_bytes(plan.n_in, plan.width, plan.n_out, plan.hidden, warps),
                plans.FAST_MAX_WARPS, plans.FAST_MIN_WARPS, optin_smem(device))
        _fast_fits[key] = fit
    return _fast_fits[key]


_fast_bwd_fits = {}


def fast_bwd_fit(plan, device):
    """(warps, shared memory bytes) of the fused backward on `device`, or None where it does
    not run: before sm_80, widths outside FAST_BWD_WIDTHS, or fewer than FAST_BWD_MIN_WARPS
    warps' rows fitting beside the accumulators and weights."""
    key = (plan, device)
    if key not in _fast_bwd_fits:
        fit = None
        if plan.regime == "tc" and plan.width in plans.FAST_BWD_WIDTHS and compute_capability(device) >= 80:
            fit = plans.most_warps(
                lambda warps: plans.fast_bwd_smem_bytes(plan.n_in, plan.width, plan.n_out, plan.hidden, warps),
                plans.FAST_BWD_MAX_WARPS, plans.FAST_BWD_MIN_WARPS, optin_smem(device))
        _fast_bwd_fits[key] = fit
    return _fast_bwd_fits[key]


def tc_fit(plan, device):
    """(resident, shared memory bytes) of the tile kernels on `device`: weights resident when
    the plan allows it and the device's per-block opt-in holds them (not on sm_75's 64 KB for
    a 64-wide network, say), else streamed; ValueError when even streaming does not fit."""
    key = (plan, device)  # plans are cached: one object per network
    fit = _fits.get(key)
    if fit is None:
        limit = optin_smem(device)
        resident = plan.resident and plan.smem <= limit
        smem = plan.smem if resident else plan.smem_stream
        if smem > limit:
            raise ValueError(f"fused_mlp network of sizes {plan.sizes} needs {smem} bytes of shared memory per block; "
                             f"device {device} allows {limit} (use a narrower network)")
        fit = _fits[key] = (resident, smem)
    return fit


_ready = {}  # (name, device, smem) -> True once the kernel may use that much dynamic shared memory
_smem_set = {}  # (name, device) -> the kernel's dynamic shared-memory limit set so far (never lowered)


def _tc_function(name, plan, device, smem):
    """The CUfunction of a tensor-core kernel, allowed `smem` bytes of dynamic shared memory."""
    full = f"{name}_{plan.suffix}"
    key = (full, device, smem)
    if key not in _ready:
        if plan.dtype == 2 and compute_capability(device) < 80:
            raise RuntimeError(f"fused_mlp in bfloat16 needs sm_80+ (tensor-core bfloat16); device {device} is "
                               f"sm_{compute_capability(device)}: use float16")
        if smem > max(48 * 1024, _smem_set.get((full, device), 0)):
            # Raised only: one kernel serves networks of different sizes, and lowering the
            # limit for a smaller one would make the next launch of a larger one fail.
            kernel = _get_function(full, device)
            kernel.max_dynamic_shared_size_bytes = smem
            _smem_set[(full, device)] = smem
            try:
                kernel.preferred_shared_memory_carveout = 100  # shared memory over L1: two blocks per SM
            except (AttributeError, ValueError):
                pass
        _ready[key] = True
    return _function_pointer(full, device)


_per_sm = {}


def tc_grid(name, plan, device, batch, resident, smem, threads=plans.TC_THREADS, rows=16):
    """Blocks of a tile-kernel launch: one per TC_ROWS rows when streaming; when resident (and
    for the register-resident kernels: `threads` a block, `rows` a warp tile), the blocks that
    fit on the GPU at once (persistent warps loop over their tiles), from the kernel's registers
    and shared memory, never more than the tiles need."""
    if not resident:
        return -(-batch // plans.TC_ROWS)
    key = (name, plan.suffix, device, smem, threads)
    per_sm = _per_sm.get(key)
    if per_sm is None:
        import cupy

        kernel = _get_function(f"{name}_{plan.suffix}", device)
        try:
            regs = kernel.num_regs
        except AttributeError:  # older CuPy: assume the worst, one block per SM
            regs = 255
        regs_per_warp = -(-regs * 32 // 256) * 256
        by_regs = cupy.cuda.runtime.deviceGetAttribute(82, device) // (regs_per_warp * (threads // 32))
        by_smem = cupy.cuda.runtime.deviceGetAttribute(81, device) // (smem + 1024)
        by_threads = _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM) // threads
        per_sm = _per_sm[key] = max(1, min(by_regs, by_smem, by_threads))
    tiles = -(-batch // rows)
    return max(1, min(-(-tiles // (threads // 32)), per_sm * sm_count(device)))


def prepare(plan, device):
    """Raise before any launch what this device cannot run (bfloat16 before sm_80, shared memory)."""
    if plan.regime == "tc":
        if plan.dtype == 2 and compute_capability(device) < 80:  # before tc_fit asks the device anything else
            _tc_function(f"tc_mlp_nf{plan.nf}_fwd", plan, device, 0)
        _tc_function(f"tc_mlp_nf{plan.nf}_fwd", plan, device, tc_fit(plan, device)[1])


# ------------------------------------------------------------------------------ launches on raw pointers
def source_on_tensor_cores(batch, device):
    """Whether the source network's batch runs on the tensor pipe (3xTF32 with promoted sums,
    forward and backward): beyond SMALL_BATCH_MAX on sm_80+ with config.mlp_tf32 (the default)."""
    return batch > plans.SMALL_BATCH_MAX and config.mlp_tf32 and compute_capability(device) >= 80


def source_launch(batch, device):
    """(function pointer, grid, block, shared bytes) of the source network's forward (inference,
    or training: the same kernels keep h1, h2): the 3xTF32 kernel where source_on_tensor_cores
    and the device fits its weights, else the exact FFMA kernels."""
    tc = None
    if source_on_tensor_cores(batch, device):
        fit = source_tc_fit(device)
        if fit is not None:
            tc = (plans.SOURCE_TC, *fit, sm_count(device))
    function, grid, block, smem = plans.source_kernel(batch, tc)
    return _function_pointer(function, device), grid, block, smem


def source_small_backward_launch(batch, need_dx, device):
    """(function pointer, grid, block) of the source network's one-launch backward for `batch`
    rows (dx blocks where need_dx), or None past SMALL_BWD_ROWS (launch_backward's other kernels
    then run): what the torch adapter's typed training path launches."""
    if not 0 < batch <= plans.SMALL_BWD_ROWS:
        return None
    return (_function_pointer("source_mlp_small_bwd_f32", device), plans.small_bwd_blocks(batch, need_dx),
            plans.GRAD_THREADS)


def launch_source_forward(device, x, w1, b1, w2, b2, w3, b3, y, batch, flags, stream, h1s=0, h2s=0):
    """One launch on pointers checked by the caller (float32, contiguous, one device);
    batch > 0; flags: the output activation's code. h1s / h2s (training): [batch, 128] and
    [batch, 64] float32 buffers that get the post-ReLU activations the backward needs; 0 in
    inference."""
    function, grid, block, smem = source_launch(batch, device)
    launch(function, (grid,), block, smem, stream, (x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags),
           SOURCE_FWD_KINDS, device)


def launch_forward(plan, device, x, weights, biases, y, batch, stream, saved=None):
    """The whole network on pointers checked by the caller; batch > 0. weights / biases:
    pointers per layer (biases None: no biases); saved: None (inference) or the pointers of
    the buffers of plans.saved_shapes(plan, batch) (training)."""
    if plan.regime == "source":
        (w1, w2, w3), (b1, b2, b3) = weights, biases
        h1s, h2s = saved if saved is not None else (0, 0)
        launch_source_forward(device, x, w1, b1, w2, b2, w3, b3, y, batch, plan.out_act, stream, h1s, h2s)
        return
    args = (x, y, saved[0] if saved is not None else 0, *_padded(weights), *_padded(biases), batch, plan.n_in,
            plan.width, plan.n_out, plan.hidden, plans.tc_flags(plan))
    fast = fast_fit(plan, device) if config.mlp_fast_forward else None
    if fast is not None:
        warps, smem = fast
        name = f"tc_mlp_w{plan.width}_{plans.FAST_ACTIVATIONS[plan.act]}_fwd"
        grid = tc_grid(name, plan, device, batch, True, smem, 32 * warps, plans.fast_rows(plan.width))
        launch(_tc_function(name, plan, device, smem), (grid,), 32 * warps, smem, stream, args, TC_FWD_KINDS, device)
        return
    resident, smem = tc_fit(plan, device)
    name = f"tc_mlp_nf{plan.nf}_fwd"
    launch(_tc_function(name, plan, device, smem), (tc_grid(name, plan, device, batch, resident, smem),),
           plans.TC_THREADS, smem, stream, args[:-1] + (args[-1] | (plans.TC_RESIDENT if resident else 0),),
           TC_FWD_KINDS, device)


def launch_backward(plan, device, dy, x, y, saved, weights, dx, dweights, dbiases, batch, stream, empty):
    """Gradients of the whole network on pointers checked by the caller (any batch, 0 too):
    dx (0: not wanted), dweights / dbiases (pointers per layer; dbiases None: no biases).
    empty(shape, dtype_name) -> (owner, pointer) allocates the temporaries on the stream's
    allocator; they are kept until this returns (later work on the stream may reuse them)."""
    keep = []

    def tmp(shape, dtype_name):
        owner, pointer = empty(shape, dtype_name)
        keep.append(owner)
        return pointer

    sizes, L = plan.sizes, plan.layers
    item = 4 if plan.dtype == 0 else 2
    gm = y if plan.out_act == plans.OUTPUT_RELU else 0
    small = source_small_backward_launch(batch, bool(dx), device) if plan.regime == "source" else None
    if small is not None:  # everything in one launch
        function, grid, block = small
        db1, db2, db3 = dbiases if dbiases is not None else (0, 0, 0)
        launch(function, (grid,), block, 0, stream, (dy, gm, *weights, x, *saved, dx, dweights[0], db1, dweights[1],
                                                     db2, dweights[2], db3, batch), SMALL_BWD_KINDS, device)
        return keep
    if plan.regime == "source":
        h1, h2 = saved
        g2 = tmp((batch, plans.SOURCE_SIZES[2]), "float32")
        g1 = tmp((batch, plans.SOURCE_SIZES[1]), "float32")
        tc = bool(batch) and source_on_tensor_cores(batch, device)
        g3 = dy  # the last layer's G: dy, or (tensor pipe, output ReLU) dy * (y > 0) written by the chain
        if tc:  # g2 and g1 in one launch (and g3 = dy * (y > 0) under the output ReLU); dx (rare: x
            # requires grad) by the FFMA chain's last step
            g3 = tmp((batch, plans.SOURCE_SIZES[3]), "float32") if gm else dy
            warps = plans.SOURCE_TC_DGRAD_WARPS
            grid = (max(1, min(-(-batch // (16 * warps)), sm_count(device))),)
            launch(_function_pointer("source_mlp_tc_dgrad_bwd_f32", device), grid, 32 * warps, 0, stream,
                   (dy, gm, weights[2], weights[1], h2, h1, g3 if gm else 0, g2, g1, batch), TC_DGRAD_KINDS, device)
            if dx:
                launch(_function_pointer("mlp_dgrad_bwd_f32", device), (-(-batch // plans.DGRAD_ROWS),),
                       plans.GRAD_THREADS, 0, stream, (g1, 0, weights[0], 0, dx, batch, sizes[1], sizes[0]),
                       DGRAD_KINDS, device)
        elif batch:
            dgrad = _function_pointer("mlp_dgrad_bwd_f32", device)
            grid = (-(-batch // plans.DGRAD_ROWS),)
            steps = [(dy, gm, weights[2], h2, g2), (g2, 0, weights[1], h1, g1)]
            if dx:
                steps.append((g1, 0, weights[0], 0, dx))
            for l, (G, Gm, W, H, out) in zip((2, 1, 0), steps):
                launch(dgrad, grid, plans.GRAD_THREADS, 0, stream, (G, Gm, W, H, out, batch, sizes[l + 1], sizes[l]),
                       DGRAD_KINDS, device)
        grads = [(g1, 0, x, 0), (g2, 0, h1, 0), (g3, 0, h2, 0) if tc else (dy, gm, h2, 0)]
        chunks, rows = plans.wgrad_plan(batch, 2 * sm_count(device), plans.WGRAD_ROWS)
        partials = [_function_pointer(f"source_mlp_tc_wgrad{l}_bwd_f32" if tc else "mlp_wgrad_bwd_f32", device)
                    for l in range(3)]
    elif batch and config.mlp_fast_backward and fast_bwd_fit(plan, device) is not None:
        _launch_fast_backward(plan, device, dy, x, y, saved[0], weights, dx, dweights, dbiases, batch, stream, tmp)
        return keep
    else:
        save = saved[0]
        width = plan.width
        layer_bytes = batch * width * item
        gws = tmp((max(plan.hidden, 1), batch, width), plans.DTYPE_NAMES[plan.dtype])
        if batch:
            resident, smem = tc_fit(plan, device)
            flags = plans.tc_flags(plan) | (plans.TC_RESIDENT if resident else 0)
            name = f"tc_mlp_nf{plan.nf}_bwd"
            launch(_tc_function(name, plan, device, smem), (tc_grid(name, plan, device, batch, resident, smem),),
                   plans.TC_THREADS, smem, stream, (dy, gm, save, gws, dx or 0, *_padded(weights), batch, plan.n_in,
                                                    width, plan.n_out, plan.hidden, flags), TC_BWD_KINDS, device)
        grads = []
        for l in range(L):
            G = dy if l == L - 1 else gws + l * layer_bytes
            A = x if l == 0 else save + (l - 1) * layer_bytes
            grads.append((G, gm if l == L - 1 else 0, A, 0 if l == 0 else plan.act))
        chunks, rows = plans.wgrad_plan(batch, sm_count(device), plans.WGRAD_TC_ROWS)
        partials = None
    layouts = []
    for l in range(L):
        n, k = sizes[l + 1], sizes[l]
        n_p, k_p = (n, k) if plan.regime == "source" else (plans.round16(n), plans.round16(k))
        layouts.append((n, k, n_p, k_p, n_p * k_p, n_p * k_p + n_p))
    ws = tmp((max(chunks, 1), max(lay[5] for lay in layouts)), "float32")
    reduce = _function_pointer(f"mlp_wgrad_reduce_bwd_{plan.suffix}", device)
    for l, ((G, Gm, A, a_act), (n, k, n_p, k_p, db_offset, stride)) in enumerate(zip(grads, layouts)):
        if chunks:
            if plan.regime == "source":
                launch(partials[l], (chunks,), plans.WGRAD_TC_THREADS if tc else plans.GRAD_THREADS, 0, stream,
                       (G, Gm, A, ws, batch, n, k, k_p, db_offset, stride, a_act, rows), WGRAD_KINDS, device)
            else:
                smem = plans.tc_wgrad_smem_bytes(n, k)
                fpw = plans.tc_nf(-(-(n_p // 16) * (k_p // 16) // (plans.TC_THREADS // 32)))
                launch(_tc_function(f"tc_mlp_wgrad_nf{fpw}_bwd", plan, device, smem), (chunks,), plans.TC_THREADS,
                       smem, stream, (G, Gm, A, ws, batch, n, k, db_offset, stride, a_act, rows), TC_WGRAD_KINDS,
                       device)
        db = dbiases[l] if dbiases is not None else 0
        total = n * k + (n if db else 0)
        launch(reduce, (-(-total // plans.REDUCE_THREADS),), plans.REDUCE_THREADS, 0, stream,
               (ws, chunks, stride, n, k, k_p, db_offset, dweights[l], db), REDUCE_KINDS, device)
    return keep


def _launch_fast_backward(plan, device, dy, x, y, save, weights, dx, dweights, dbiases, batch, stream, tmp):
    """The fused backward (one block per SM, its partial weight and bias gradients in ws),
    then every layer's ordered reduce in one launch; batch > 0. The reduce waits for the
    backward's partials (kernels/include/rawops/dependent_launch.cuh), so on sm_90+ it is
    launched programmatically dependent (config.dependent_launch): its launch overlaps the
    backward's end."""
    warps, smem = fast_bwd_fit(plan, device)
    name = f"tc_mlp_w{plan.width}_{plans.FAST_ACTIVATIONS[plan.act]}_bwd"
    grid = tc_grid(name, plan, device, batch, True, smem, 32 * warps, plans.FAST_BWD_ROWS)
    layout, stride = plans.fast_bwd_partials(plan)
    ws = tmp((grid, stride), "float32")
    launch(_tc_function(name, plan, device, smem), (grid,), 32 * warps, smem, stream,
           (dy, y if plan.out_act == plans.OUTPUT_RELU else 0, x, save, dx or 0, ws, *_padded(weights), batch,
            plan.n_in, plan.n_out, plan.hidden, plans.tc_flags(plan), stride), TC_FAST_BWD_KINDS, device)
    # every layer's sum in one launch (blockIdx.y = layer), partials added in block order
    reduce = _function_pointer(f"mlp_wgrad_reduce_layers_bwd_{plan.suffix}", device)
    largest = max(n * k + n for _, n, k, _, _ in layout)  # outputs of the largest layer
    launch(reduce, (-(-largest // plans.REDUCE_LAYERS_OUTPUTS), len(layout)), plans.REDUCE_LAYERS_THREADS, 0, stream,
           (ws, grid, stride, plan.n_in, plan.width, plan.n_out, plan.hidden, *_padded(dweights), *_padded(dbiases)),
           REDUCE_LAYERS_KINDS, device, config.dependent_launch and compute_capability(device) >= 90)


# ------------------------------------------------------------------------------ CuPy API: the general network
def _network(x, weights, biases, activation, output_activation, x_name="x"):
    """Checked arrays and the plan: (X, [W], [B] or None, plan)."""
    X = as_array(x, x_name)
    if X.dtype not in plans.DTYPE_NAMES:
        raise TypeError(f"{x_name} has dtype {X.dtype_text}; fused_mlp supports float32, float16, bfloat16")
    if len(X.shape) != 2:
        raise ValueError(f"{x_name} has shape {X.shape}, expected (batch, n_in)")
    _rows._dense(X)
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError("weights must be a non-empty list of [out, in] arrays (torch.nn.Linear layout)")
    if biases is not None and (not isinstance(biases, (list, tuple)) or len(biases) != len(weights)):
        raise ValueError(f"biases must be None or a list of {len(weights)} arrays, one per weight")
    sizes = [X.shape[1]]
    Ws, Bs = [], [] if biases is not None else None
    for i, w in enumerate(weights):
        name = f"weights[{i}]"
        W = as_array(w, name)
        if W.dtype != X.dtype:
            raise TypeError(f"{name} has dtype {W.dtype_text}, expected {X.dtype_text} like {x_name}")
        if len(W.shape) != 2 or W.shape[1] != sizes[-1]:
            raise ValueError(f"{name} has shape {W.shape}, expected (out, {sizes[-1]}) (torch.nn.Linear layout)")
        _rows._dense(W)
        sizes.append(W.shape[0])
        Ws.append(W)
        if biases is not None:
            bname = f"biases[{i}]"
            B = as_array(biases[i], bname)
            if B.dtype != X.dtype:
                raise TypeError(f"{bname} has dtype {B.dtype_text}, expected {X.dtype_text} like {x_name}")
            if B.shape != (W.shape[0],):
                raise ValueError(f"{bname} has shape {B.shape}, expected ({W.shape[0]},)")
            _rows._dense(B)
            Bs.append(B)
    plan = plans.make_plan(X.dtype, sizes, activation, output_activation, biases is not None)
    return X, Ws, Bs, plan


def _other(obj, name, shape, like):
    a = as_array(obj, name)
    if a.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {a.dtype_text}, expected {like.dtype_text} like {like.name}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {a.shape}, expected {tuple(shape)}")
    _rows._dense(a)
    return a


def _cupy_empty(shape, dtype_name):
    import cupy

    a = cupy.empty(shape, dtype=NUMPY_DTYPES[{"float32": 0, "float16": 1, "bfloat16": 2}[dtype_name]])
    return a, a.data.ptr


def _cupy_scratch(shape, dtype_name):
    """_cupy_empty for the backward's temporaries, on the launches' stream (the callers allocate
    on it), held while that stream is being captured."""
    import cupy

    a, pointer = _cupy_empty(shape, dtype_name)
    hold_if_capturing(cupy.cuda.get_current_stream().ptr, a)
    return a, pointer


def fused_mlp(x, weights, biases=None, activation="relu", output_activation="none", *, out=None, stream=None):
    """The whole MLP in one launch: y = output_act(... act(x W_0^T + b_0) ... W_L^T + b_L)
    with weights [W_0, ..., W_L] in torch.nn.Linear layout ([out, in]) and biases [b_0, ...]
    (or None). x: (batch, n_in); returns (batch, n_out) of x's dtype (into `out` when given).
    Supported networks: see plans.SUPPORTED_TEXT (ValueError otherwise)."""
    import cupy

    X, Ws, Bs, plan = _network(x, weights, biases, activation, output_activation)
    batch = X.shape[0]
    O = None
    if out is not None:
        O = _other(out, "out", (batch, plan.n_out), X)
        if O.readonly:
            raise ValueError("out is read-only")
        for a in (X, *Ws, *(Bs or ())):
            if O.nbytes and a.nbytes and O.ptr < a.ptr + a.nbytes and a.ptr < O.ptr + O.nbytes:
                raise ValueError(f"out overlaps {a.name}; pass a separate array")
    device = _rows.one_device(X, *Ws, *(Bs or ()), O)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    prepare(plan, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, *Ws, *(Bs or ())):
            wait_for_producer(a, s)
        y = O.obj if O is not None else cupy.ndarray((batch, plan.n_out), NUMPY_DTYPES[X.dtype])
        if batch:
            launch_forward(plan, device, X.ptr, [w.ptr for w in Ws], [b.ptr for b in Bs] if Bs is not None else None,
                           O.ptr if O is not None else y.data.ptr, batch, s)
    return y


def fused_mlp_forward(x, weights, biases=None, activation="relu", output_activation="none", *, stream=None):
    """Training forward: (y, saved), saved being what fused_mlp_backward needs (a tuple of
    arrays: the source network's two post-ReLU activations, or the tensor-core path's hidden
    pre-activations [hidden, batch, width])."""
    import cupy

    X, Ws, Bs, plan = _network(x, weights, biases, activation, output_activation)
    batch = X.shape[0]
    device = _rows.one_device(X, *Ws, *(Bs or ()))
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    prepare(plan, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, *Ws, *(Bs or ())):
            wait_for_producer(a, s)
        y = cupy.ndarray((batch, plan.n_out), NUMPY_DTYPES[X.dtype])
        saved = tuple(_cupy_empty(shape, dt)[0] for shape, dt in plans.saved_shapes(plan, batch))
        if batch:
            launch_forward(plan, device, X.ptr, [w.ptr for w in Ws], [b.ptr for b in Bs] if Bs is not None else None,
                           y.data.ptr, batch, s, saved=[a.data.ptr for a in saved])
    return y, saved


def fused_mlp_backward(dy, x, y, saved, weights, biases=None, activation="relu", output_activation="none", *,
                       need_dx=True, stream=None):
    """Gradients of fused_mlp: (dx or None, [dW_l], [db_l] or None), given dy (batch, n_out),
    the forward's x, y and saved (from fused_mlp_forward) and the same weights. Weight and
    bias gradients are sums over the batch, deterministic (no atomics)."""
    import cupy

    X, Ws, Bs, plan = _network(x, weights, biases, activation, output_activation)
    batch = X.shape[0]
    DY = _other(dy, "dy", (batch, plan.n_out), X)
    Y = _other(y, "y", (batch, plan.n_out), X)
    shapes = plans.saved_shapes(plan, batch)
    if not isinstance(saved, (list, tuple)) or len(saved) != len(shapes):
        raise ValueError(f"saved must be the {len(shapes)} array(s) fused_mlp_forward returned")
    S = []
    for i, ((shape, dt), a) in enumerate(zip(shapes, saved)):
        A = as_array(a, f"saved[{i}]")
        if A.shape != shape or plans.DTYPE_NAMES.get(A.dtype) != dt:
            raise ValueError(f"saved[{i}] has shape {A.shape} and dtype {A.dtype_text}, expected {shape} {dt}")
        _rows._dense(A)
        S.append(A)
    device = _rows.one_device(X, DY, Y, *S, *Ws, *(Bs or ()))
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    prepare(plan, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, DY, Y, *S, *Ws, *(Bs or ())):
            wait_for_producer(a, s)
        dtype = NUMPY_DTYPES[X.dtype]
        dx = cupy.ndarray(X.shape, dtype) if need_dx else None
        dws = [cupy.ndarray(w.shape, dtype) for w in Ws]
        dbs = [cupy.ndarray(b.shape, dtype) for b in Bs] if Bs is not None else None
        launch_backward(plan, device, DY.ptr, X.ptr, Y.ptr, [a.ptr for a in S], [w.ptr for w in Ws],
                        dx.data.ptr if dx is not None and batch else 0, [a.data.ptr for a in dws],
                        [a.data.ptr for a in dbs] if dbs is not None else None, batch, s, _cupy_scratch)
    return dx, dws, dbs
