"""The MLP family: a whole multi-layer perceptron in one launch, forward and backward.

fused_mlp(x, weights, biases, activation, output_activation) computes, with weights in
torch.nn.Linear layout (weight [out, in], bias [out]),
    h = x; h = act(h W_l^T + b_l) for each hidden layer; y = output_act(h W_L^T + b_L)
in one kernel; the hidden activations never reach device memory (inference). Two regimes:
  * float32, the source network 100-128-64-10 with ReLU: exact float32 FFMA kernels (a
    small-batch kernel up to SMALL_BATCH_MAX samples, a register-tiled one beyond); beyond
    SMALL_BATCH_MAX on sm_80+ the inference forward runs 3xTF32 on tensor cores instead
    (float32-level error, ~1e-6 relative; USE_SEED_TC = False forces the exact FFMA kernel);
  * float16 / bfloat16, tiny-cuda-nn-style networks on tensor cores (float32 accumulation):
    n_in 1..128, 1..8 hidden layers of one width in (16, 32, 64, 128), n_out 1..128.
Anything else is a ValueError naming what is supported. seed_mlp(x, w1, b1, ...) is the
first slice's spelling of the source network and stays.

Training: fused_mlp_forward also returns what the backward needs (the source network keeps
its two post-ReLU activations; the tensor-core path keeps each hidden pre-activation), and
fused_mlp_backward returns dx, the weight and the bias gradients; weight and bias gradients
are summed over the batch deterministically (per-chunk partials, then a fixed-order sum).
Kernels: kernels/mlp.cu.
"""
from ._launch import (NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, require_str, sm_count,
                      stream_pointer, wait_for_producer)
from . import _modules, _rows, config

FAMILY = "mlp"
SUFFIXES = ("f32",)  # the dtypes each table kernel exists in (<name>_<suffix>)

# The family's table: kernel base name -> argument names.
KERNELS = {
    "seed_mlp_fwd": ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "h1s", "h2s", "batch", "flags"),
    "seed_mlp_small_fwd": ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "h1s", "h2s", "batch", "flags"),
    "seed_mlp_tc32_fwd": ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "h1s", "h2s", "batch", "flags"),
    "seed_mlp_tc16_fwd": ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "h1s", "h2s", "batch", "flags"),
    "mlp_dgrad_bwd": ("G", "Gm", "W", "H", "out", "batch", "N", "K"),
    "mlp_wgrad_bwd": ("G", "Gm", "A", "ws", "batch", "N", "K", "k_p", "db_offset", "stride", "a_act",
                      "rows_per_chunk"),
}
# Kernels in every float dtype (<name>_f32 / _f16 / _bf16).
KERNELS_ALL_FLOATS = {
    "mlp_wgrad_reduce_bwd": ("ws", "chunks", "stride", "N", "K", "k_p", "db_offset", "dw", "db"),
}
# Tensor-core kernels, float16 and bfloat16 (<name>_f16 / _bf16), one per accumulator count
# NF in TC_NFS (fragments of 16 columns per warp: the widest layer / 16 for the tile kernels,
# the weight gradient's fragments / 8 warps for wgrad), rounded up.
TC_NFS = (4, 8)
_TC_FWD_ARGS = ("x", "y", "save", *(f"w{i}" for i in range(9)), *(f"b{i}" for i in range(9)), "batch", "n_in",
                "width", "n_out", "hidden", "flags")
_TC_BWD_ARGS = ("dy", "y", "save", "gws", "dx", *(f"w{i}" for i in range(9)), "batch", "n_in", "width", "n_out",
                "hidden", "flags")
_TC_WGRAD_ARGS = ("G", "Gm", "A", "ws", "batch", "N", "K", "db_offset", "stride", "a_act", "rows_per_chunk")
TC_KERNELS = {}
for _nf in TC_NFS:
    TC_KERNELS[f"tc_mlp_nf{_nf}_fwd"] = _TC_FWD_ARGS
    TC_KERNELS[f"tc_mlp_nf{_nf}_bwd"] = _TC_BWD_ARGS
    TC_KERNELS[f"tc_mlp_wgrad_nf{_nf}_bwd"] = _TC_WGRAD_ARGS


# The forward with register-resident activations (mma.sync, sm_80+), one entry per hidden
# width W: used wherever fast_fit finds room for every layer's weights and >= FAST_MIN_WARPS
# warps' staging rows; the tile kernels above run the rest (and every backward).
# One entry per width and hidden activation (each its own register allocation).
FAST_ACTIVATIONS = ("none", "relu", "gelu")  # by activation code (ACTIVATIONS)
TC_FAST_KERNELS = {f"tc_mlp_w{_w}_{_a}_fwd": _TC_FWD_ARGS for _w in (16, 32, 64, 128) for _a in FAST_ACTIVATIONS}
# The fused backward (chain, weight and bias gradients in one kernel, sm_80+): one entry per
# hidden width in FAST_BWD_WIDTHS and activation; per-block float32 partials in ws, summed by
# mlp_wgrad_reduce_bwd. Where fast_bwd_fit finds no room, the tile kernels above run instead.
FAST_BWD_WIDTHS = (16, 32, 64)
_TC_FAST_BWD_ARGS = ("dy", "y", "x", "save", "dx", "ws", *(f"w{i}" for i in range(9)), "batch", "n_in", "n_out",
                     "hidden", "flags", "ws_stride")
TC_FAST_BWD_KERNELS = {f"tc_mlp_w{_w}_{_a}_bwd": _TC_FAST_BWD_ARGS for _w in FAST_BWD_WIDTHS
                       for _a in FAST_ACTIVATIONS}


def tc_nf(fragments):
    """The smallest NF in TC_NFS holding `fragments` accumulator fragments per warp."""
    return next(v for v in TC_NFS if v >= fragments)


# Every extern "C" entry point of kernels/mlp.cu (tests/test_build.py checks the fatbin).
ENTRY_POINTS = frozenset([f"{base}_f32" for base in KERNELS] + [f"{base}_{s}" for base in KERNELS_ALL_FLOATS
                                                                for s in ("f32", "f16", "bf16")]
                         + [f"{base}_{s}" for base in {**TC_KERNELS, **TC_FAST_KERNELS, **TC_FAST_BWD_KERNELS,
                                                       "mlp_wgrad_reduce_layers_bwd": None}
                            for s in ("f16", "bf16")])
SEED_FWD_KINDS = "pppppppppp" + "qq"
DGRAD_KINDS = "ppppp" + "qqq"
WGRAD_KINDS = "pppp" + "q" * 8
REDUCE_KINDS = "p" + "q" * 6 + "pp"
TC_FWD_KINDS = "ppp" + "p" * 18 + "q" * 6
TC_BWD_KINDS = "ppppp" + "p" * 9 + "q" * 6
TC_WGRAD_KINDS = "pppp" + "q" * 7
TC_FAST_BWD_KINDS = "pppppp" + "p" * 9 + "q" * 6
REDUCE_LAYERS_KINDS = "p" + "q" * 6 + "p" * 18

SEED_SIZES = (100, 128, 64, 10)  # input, hidden, hidden, output
SEED_TILE = 64  # kTile: samples per block
SEED_THREADS = 128  # kThreads
OUTPUT_RELU = 1  # flags bit 0
OUTPUT_ACTIVATIONS = {"none": 0, "relu": OUTPUT_RELU}
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2}  # kActNone / kActRelu / kActGelu (exact erf GELU)
SMALL_BATCH_MAX = 4096  # up to here seed_mlp_small_fwd (2 samples per block), beyond it the tiled kernel
SMALL_TILE = 2  # kSmallTile
# Beyond SMALL_BATCH_MAX on sm_80+, inference: 3xTF32 on mma.sync (seed_mlp_tc*_fwd), persistent
# blocks holding the weights; variant -> (rows a warp owns, most warps a block: __launch_bounds__).
# Warps a block in multiples of 4: each SM quarter has its own tensor core, and an uneven
# count leaves the SM waiting on its busiest quarter (10 warps ran slower than 8).
SEED_TC_VARIANTS = {"seed_mlp_tc32_fwd": (32, 8), "seed_mlp_tc16_fwd": (16, 16)}
SEED_TC = "seed_mlp_tc32_fwd"  # the variant launched: 675 vs 731 us at 2^20 on the H100 (bench/NOTES.md)
SEED_TC_WEIGHT_BYTES = 4 * (128 * 104 + 64 * 136 + 16 * 72 + 128 + 64 + 16)  # kStX floats: 93,504 bytes
SEED_TC_LDX = 104  # kStLdx: floats per staged x row
SEED_TC_MIN_WARPS = 4  # fewer fit beside the weights (sm_86/89/120's ~100 KB): the FFMA kernel
SEED_TC_WARP_STEP = 4  # warps a block come in multiples of this (the SM's four schedulers)
SMALL_THREADS = 256  # kSmallThreads
GRAD_THREADS = 256  # kGradThreads
DGRAD_ROWS = 64  # kDgradRows
WGRAD_ROWS = 32  # kWgradRows (float32), rows staged per step
WGRAD_TC_ROWS = 64  # kWgradTcRows
TC_THREADS = 256  # kTcThreads: 8 warps
TC_ROWS = 128  # kTcRows: samples per block
TC_WIDTHS = (16, 32, 64, 128)
TC_MAX_HIDDEN = 8
TC_MAX_IO = 128
TC_DTYPES = {1: "f16", 2: "bf16"}
TC_RESIDENT = 16  # flags bit (kResident): every layer's weights resident in shared memory, persistent warps
# Weights resident when the whole kernel's shared memory stays under this (two forward blocks
# per SM on an H100's 228 KB); beyond it the layers stream through one buffer.
RESIDENT_MAX_SMEM = 112 * 1024
FAST_MAX_WARPS = 16  # the fast forward's block: __launch_bounds__(512, 1), one block per SM
FAST_MIN_WARPS = 4  # fewer warps' staging rows fit beside the weights: the tile kernels instead
FAST_BWD_MAX_WARPS = 8  # the fused backward's block: __launch_bounds__(256, 1)
FAST_BWD_MIN_WARPS = 2
FAST_BWD_ROWS = 32  # kBwdRows: rows a warp owns in a tile
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}
SUPPORTED_TEXT = ("fused_mlp supports: float32 with sizes (100, 128, 64, 10), activation 'relu' and biases "
                  "(the source network); float16/bfloat16 with n_in 1..128, 1..8 hidden layers of one width in "
                  "(16, 32, 64, 128), n_out 1..128, activation 'relu'|'gelu'|'none'")


# ------------------------------------------------------------------------------ launches on raw pointers
def seed_blocks(batch):
    """Blocks of a seed_mlp launch: one per tile of SEED_TILE samples. batch > 0."""
    blocks = -(-batch // SEED_TILE)
    if blocks > _rows.MAX_GRID:
        raise ValueError(f"seed_mlp: a batch of {batch} exceeds one launch's grid")
    return blocks


def small_blocks(batch):
    """Blocks of a seed_mlp_small_fwd launch: one per SMALL_TILE samples. batch > 0."""
    return -(-batch // SMALL_TILE)


def seed_tc_smem(rows, warps):
    """Dynamic shared memory of seed_mlp_tc*_fwd: the resident weights and biases, then each
    warp's staged x rows [rows][SEED_TC_LDX] (float32)."""
    return SEED_TC_WEIGHT_BYTES + 4 * warps * rows * SEED_TC_LDX


_seed_tc_fits = {}


def seed_tc_fit(device, variant=None):
    """(warps, shared memory bytes) of the 3xTF32 forward `variant` (default SEED_TC) on
    `device`, or None where it does not run: before sm_80, or where fewer than
    SEED_TC_MIN_WARPS warps fit beside the weights; the most warps in steps of
    SEED_TC_WARP_STEP. Sets the kernel's shared-memory limit once."""
    variant = variant or SEED_TC
    key = (variant, device)
    if key not in _seed_tc_fits:
        rows, most = SEED_TC_VARIANTS[variant]
        fit = None
        if compute_capability(device) >= 80:
            fit = _most_warps(lambda warps: seed_tc_smem(rows, warps), most, SEED_TC_MIN_WARPS, optin_smem(device),
                              SEED_TC_WARP_STEP)
        if fit is not None:
            _modules.get_function(FAMILY, f"{variant}_f32", device).max_dynamic_shared_size_bytes = fit[1]
        _seed_tc_fits[key] = fit
    return _seed_tc_fits[key]


def seed_kernel(batch, tc=None):
    """(kernel, grid, block, dynamic shared memory) of the source network's forward: the
    small-batch kernel up to SMALL_BATCH_MAX; beyond it the 3xTF32 kernel when `tc` =
    (variant, warps, shared bytes, SM count) is given (persistent: at most one block per
    SM, never more than its warps' tiles need), else the FFMA tiled kernel."""
    if batch <= SMALL_BATCH_MAX:
        return "seed_mlp_small_fwd_f32", small_blocks(batch), SMALL_THREADS, 0
    if tc is not None:
        variant, warps, smem, sms = tc
        tiles = -(-batch // SEED_TC_VARIANTS[variant][0])
        return f"{variant}_f32", min(-(-tiles // warps), sms), 32 * warps, smem
    return "seed_mlp_fwd_f32", seed_blocks(batch), SEED_THREADS, 0


def seed_launch(batch, device, training=False):
    """(function pointer, grid, block, shared bytes) of the source network's forward. The
    training forward (which keeps h1, h2) always takes the exact FFMA kernels."""
    tc = None
    if batch > SMALL_BATCH_MAX and config.mlp_tf32 and not training:
        fit = seed_tc_fit(device)
        if fit is not None:
            tc = (SEED_TC, *fit, sm_count(device))
    function, grid, block, smem = seed_kernel(batch, tc)
    return _modules.function_pointer(FAMILY, function, device), grid, block, smem


def launch_seed_forward(device, x, w1, b1, w2, b2, w3, b3, y, batch, flags, stream, h1s=0, h2s=0):
    """One launch on pointers checked by the caller (float32, contiguous, one device);
    batch > 0. h1s / h2s (training): [batch, 128] and [batch, 64] float32 buffers that get
    the post-ReLU activations the backward needs; 0 in inference."""
    function, grid, block, smem = seed_launch(batch, device, training=bool(h1s))
    launch(function, (grid,), block, smem, stream, (x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags),
           SEED_FWD_KINDS, device)


# ------------------------------------------------------------------------------ CuPy API
def _shape_text(shape):
    return "(" + ", ".join("B" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _float32(obj, name, shape):
    """A float32, C-contiguous, element-aligned array of `shape` (None: any length)."""
    a = as_array(obj, name)
    if a.dtype != 0:
        raise TypeError(f"{name} has dtype {a.dtype_text}; seed_mlp supports float32")
    if len(a.shape) != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        raise ValueError(f"{name} has shape {a.shape}, expected {_shape_text(shape)}")
    _rows._dense(a)
    return a


def _seed_parameters(w1, b1, w2, b2, w3, b3):
    n_in, h1, h2, n_out = SEED_SIZES
    return [_float32(w1, "w1", (h1, n_in)), _float32(b1, "b1", (h1,)),
            _float32(w2, "w2", (h2, h1)), _float32(b2, "b2", (h2,)),
            _float32(w3, "w3", (n_out, h2)), _float32(b3, "b3", (n_out,))]


def seed_mlp(x, w1, b1, w2, b2, w3, b3, *, output_activation="none", out=None, stream=None):
    """The 100-128-64-10 ReLU network, as torch.nn.Sequential(Linear(100, 128), ReLU(),
    Linear(128, 64), ReLU(), Linear(64, 10)) with those weights and biases computes it;
    output_activation="relu" adds a ReLU after the last layer. x: (batch, 100) float32;
    returns (batch, 10) float32 (into `out` when given)."""
    import cupy

    require_str(output_activation, "output_activation")
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {sorted(OUTPUT_ACTIVATIONS)}, got {output_activation!r}")
    X = _float32(x, "x", (None, SEED_SIZES[0]))
    params = _seed_parameters(w1, b1, w2, b2, w3, b3)
    batch = X.shape[0]
    O = None
    if out is not None:
        O = _float32(out, "out", (batch, SEED_SIZES[3]))
        if O.readonly:
            raise ValueError("out is read-only")
        for a in (X, *params):  # blocks write y while others still read their inputs
            if O.nbytes and a.nbytes and O.ptr < a.ptr + a.nbytes and a.ptr < O.ptr + O.nbytes:
                raise ValueError(f"out overlaps {a.name}; pass a separate array")
    device = _rows.one_device(X, *params, O)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in (X, *params):
            wait_for_producer(a, s)
        y = O.obj if O is not None else cupy.ndarray((batch, SEED_SIZES[3]), cupy.float32)
        if batch:
            launch_seed_forward(device, X.ptr, *(p.ptr for p in params), O.ptr if O is not None else y.data.ptr,
                                batch, OUTPUT_ACTIVATIONS[output_activation], s)
    return y


# ------------------------------------------------------------------------------ the general network: plans
def round16(n):
    return -(-n // 16) * 16


def tc_smem_bytes(n_in, width, n_out, hidden=None):
    """Dynamic shared memory of tc_mlp_fwd / tc_mlp_bwd (kernels/mlp.cu, TcSmem): float
    scratch 256 per warp, 128 float biases per layer held, the activation tile [128][act_ld]
    and the weights, 2-byte elements. Streaming (hidden None): one layer's weights
    [max(width, out_p)][w_ld]; resident (hidden layers given): every layer's, stacked."""
    in_p, out_p = round16(n_in), round16(n_out)
    act_ld = max(in_p, width, out_p) + 8
    w_ld = max(in_p, width) + 8
    if hidden is None:
        bias_layers, w_rows = 1, max(width, out_p)
    else:
        bias_layers, w_rows = hidden + 1, width * hidden + out_p
    return (TC_THREADS // 32) * 256 * 4 + 128 * 4 * bias_layers + 2 * (TC_ROWS * act_ld + w_rows * w_ld)


def fast_rows(width):
    """Rows a warp of tc_mlp_w<width>_<act>_fwd owns (kRows = 16 * kMT)."""
    return 16 if width == 128 else 32


def fast_smem_bytes(n_in, width, n_out, hidden, warps):
    """Dynamic shared memory of tc_mlp_w<width>_<act>_fwd (kernels/mlp.cu, fast_fwd): float biases
    [hidden + 1][128], every layer's weights with rows padded by 8 elements ([width][in_p + 8],
    hidden - 1 x [width][width + 8], [out_p][width + 8]), and per warp its x rows
    [rows][in_p + 8] and y rows [rows][out_p + 8], 2-byte elements."""
    in_p, out_p = round16(n_in), round16(n_out)
    weights = width * (in_p + 8) + (hidden - 1) * width * (width + 8) + out_p * (width + 8)
    return 4 * 128 * (hidden + 1) + 2 * weights + 2 * warps * fast_rows(width) * (in_p + 8 + out_p + 8)


def _most_warps(smem_of, most, least, limit, step=1):
    """(warps, shared memory bytes) for the most warps in most..least (every `step`-th from
    most) whose smem_of(warps) fits in `limit`, or None."""
    for warps in range(most, least - 1, -step):
        smem = smem_of(warps)
        if smem <= limit:
            return warps, smem
    return None


_fast_fits = {}


def fast_fit(plan, device):
    """(warps, shared memory bytes) of the fast forward on `device`, or None where it does not
    run: before sm_80, or when fewer than FAST_MIN_WARPS warps fit beside the weights."""
    key = (plan, device)
    if key not in _fast_fits:
        fit = None
        if plan.regime == "tc" and compute_capability(device) >= 80:
            fit = _most_warps(lambda warps: fast_smem_bytes(plan.n_in, plan.width, plan.n_out, plan.hidden, warps),
                              FAST_MAX_WARPS, FAST_MIN_WARPS, optin_smem(device))
        _fast_fits[key] = fit
    return _fast_fits[key]


def fast_bwd_layer_shapes(n_in, width, n_out, hidden):
    """(out_p, in_p) of each layer's padded weight gradient in the fused backward."""
    return [(width if l < hidden else round16(n_out), round16(n_in) if l == 0 else width) for l in range(hidden + 1)]


def fast_bwd_smem_bytes(n_in, width, n_out, hidden, warps):
    """Dynamic shared memory of tc_mlp_w<width>_<act>_bwd (kernels/mlp.cu, fast_bwd): float
    accumulators per layer ([out_p][in_p] and 8 db floats a row per 32 inputs), the
    weights as the fast forward keeps them, and per warp 32 rows of G ([max(out_p, width) + 8])
    and of A ([max(in_p, width) + 8]), 2-byte elements."""
    in_p, out_p = round16(n_in), round16(n_out)
    accumulators = sum(o * (i + 8 * -(-i // 32)) for o, i in fast_bwd_layer_shapes(n_in, width, n_out, hidden))
    weights = width * (in_p + 8) + (hidden - 1) * width * (width + 8) + out_p * (width + 8)
    staging = FAST_BWD_ROWS * (max(out_p, width) + 8 + max(in_p, width) + 8)
    return 4 * accumulators + 2 * weights + 2 * warps * staging


_fast_bwd_fits = {}


def fast_bwd_fit(plan, device):
    """(warps, shared memory bytes) of the fused backward on `device`, or None where it does
    not run: before sm_80, widths outside FAST_BWD_WIDTHS, or fewer than FAST_BWD_MIN_WARPS
    warps' rows fitting beside the accumulators and weights."""
    key = (plan, device)
    if key not in _fast_bwd_fits:
        fit = None
        if plan.regime == "tc" and plan.width in FAST_BWD_WIDTHS and compute_capability(device) >= 80:
            fit = _most_warps(lambda warps: fast_bwd_smem_bytes(plan.n_in, plan.width, plan.n_out, plan.hidden, warps),
                              FAST_BWD_MAX_WARPS, FAST_BWD_MIN_WARPS, optin_smem(device))
        _fast_bwd_fits[key] = fit
    return _fast_bwd_fits[key]


def fast_bwd_partials(plan):
    """Per layer (offset, n, k, n_p, k_p) of its [n_p][k_p] + [n_p] floats in a block's
    partials, and the floats per block (the stride)."""
    layout, offset = [], 0
    for l, (n_p, k_p) in enumerate(fast_bwd_layer_shapes(plan.n_in, plan.width, plan.n_out, plan.hidden)):
        layout.append((offset, plan.sizes[l + 1], plan.sizes[l], n_p, k_p))
        offset += n_p * k_p + n_p
    return layout, offset


def tc_wgrad_smem_bytes(n, k):
    """Dynamic shared memory of tc_mlp_wgrad_bwd: two staged [64][x_p + 8] 2-byte tiles."""
    return 2 * WGRAD_TC_ROWS * (round16(n) + 8 + round16(k) + 8)


def wgrad_plan(batch, chunks_max, unit):
    """(chunks, rows per chunk) of the weight-gradient partial sums: at most chunks_max
    chunks of a multiple of `unit` rows, covering the batch; (0, unit) for batch 0."""
    if batch <= 0:
        return 0, unit
    chunks = min(-(-batch // unit), chunks_max)
    rows = -(-(-(-batch // chunks)) // unit) * unit
    return -(-batch // rows), rows


class Plan:
    """What runs for one network: regime 'seed' (float32 source network) or 'tc'."""

    __slots__ = ("regime", "dtype", "suffix", "sizes", "n_in", "width", "n_out", "hidden", "act", "out_act",
                 "has_bias", "smem", "layers", "resident", "nf", "smem_stream")

    def __repr__(self):
        return f"Plan({self.regime}, {self.suffix}, sizes={self.sizes}, act={self.act}, out_act={self.out_act})"


def make_plan(dtype, sizes, activation, output_activation, has_bias):
    """The Plan for a network of layer `sizes` (n_in, hidden..., n_out) in dtype code `dtype`
    (0 float32, 1 float16, 2 bfloat16); ValueError naming what is supported otherwise.
    Plans are cached (a call's host time matters at small batches)."""
    key = (dtype, tuple(sizes), activation, output_activation, bool(has_bias))
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable activation: _make_plan names it
        plan = None
    if plan is None:
        plan = _plans[key] = _make_plan(*key)
    return plan


_plans = {}


def _make_plan(dtype, sizes, activation, output_activation, has_bias):
    require_str(activation, "activation")
    require_str(output_activation, "output_activation")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {sorted(OUTPUT_ACTIVATIONS)}, got {output_activation!r}")
    sizes = tuple(int(v) for v in sizes)
    p = Plan()
    p.dtype, p.sizes, p.has_bias = dtype, sizes, bool(has_bias)
    p.act, p.out_act = ACTIVATIONS[activation], OUTPUT_ACTIVATIONS[output_activation]
    p.n_in, p.n_out, p.layers = sizes[0], sizes[-1], len(sizes) - 1
    p.hidden = len(sizes) - 2
    p.width = sizes[1] if len(sizes) > 2 else 0
    if dtype == 0:
        if sizes != SEED_SIZES or activation != "relu" or not has_bias:
            what = (f"float32 network of sizes {sizes} with activation {activation!r}"
                    + ("" if has_bias else ", no biases"))
            raise ValueError(f"{what} is not supported; {SUPPORTED_TEXT}")
        p.regime, p.suffix, p.smem, p.resident, p.nf, p.smem_stream = "seed", "f32", 0, False, 0, 0
        return p
    if dtype not in TC_DTYPES:
        raise TypeError(f"fused_mlp supports float32, float16, bfloat16, got dtype code {dtype}")
    problems = []
    if not 1 <= p.n_in <= TC_MAX_IO:
        problems.append(f"n_in {p.n_in} is not in 1..{TC_MAX_IO}")
    if not 1 <= p.n_out <= TC_MAX_IO:
        problems.append(f"n_out {p.n_out} is not in 1..{TC_MAX_IO}")
    hidden = sizes[1:-1]
    if not 1 <= len(hidden) <= TC_MAX_HIDDEN:
        problems.append(f"{len(hidden)} hidden layers (1..{TC_MAX_HIDDEN} supported)")
    elif len(set(hidden)) != 1 or hidden[0] not in TC_WIDTHS:
        problems.append(f"hidden widths {hidden} (all one width in {TC_WIDTHS})")
    if problems:
        raise ValueError(f"{DTYPE_NAMES[dtype]} network of sizes {sizes}: {'; '.join(problems)}. {SUPPORTED_TEXT}")
    p.regime, p.suffix = "tc", TC_DTYPES[dtype]
    resident = tc_smem_bytes(p.n_in, p.width, p.n_out, p.hidden)
    p.resident = resident <= RESIDENT_MAX_SMEM
    p.smem_stream = tc_smem_bytes(p.n_in, p.width, p.n_out)
    p.smem = resident if p.resident else p.smem_stream
    p.nf = tc_nf(max(round16(p.n_in), p.width, round16(p.n_out)) // 16)
    return p


def saved_shapes(plan, batch):
    """Shapes and dtype names of what the forward keeps for the backward."""
    if plan.regime == "seed":
        return [((batch, SEED_SIZES[1]), "float32"), ((batch, SEED_SIZES[2]), "float32")]
    return [((plan.hidden, batch, plan.width), DTYPE_NAMES[plan.dtype])]


_ready = {}  # (name, device, smem) -> True once the kernel may use that much dynamic shared memory
_smem_set = {}  # (name, device) -> the kernel's dynamic shared-memory limit set so far (never lowered)
compute_capability = _modules.compute_capability  # module-level: tests replace it here


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
            kernel = _modules.get_function(FAMILY, full, device)
            kernel.max_dynamic_shared_size_bytes = smem
            _smem_set[(full, device)] = smem
            try:
                kernel.preferred_shared_memory_carveout = 100  # shared memory over L1: two blocks per SM
            except (AttributeError, ValueError):
                pass
        _ready[key] = True
    return _modules.function_pointer(FAMILY, full, device)


_optin = {}
_fits = {}


def optin_smem(device):
    """Shared memory one block may opt in to on `device` (cudaDevAttrMaxSharedMemoryPerBlockOptin)."""
    limit = _optin.get(device)
    if limit is None:
        import cupy

        limit = _optin[device] = cupy.cuda.runtime.deviceGetAttribute(97, device)
    return limit


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


_per_sm = {}


def tc_grid(name, plan, device, batch, resident, smem, threads=TC_THREADS, rows=16):
    """Blocks of a tile-kernel launch: one per 128 rows when streaming; when resident (and
    for the fast forward: `threads` a block, `rows` a warp tile), the blocks that fit on the
    GPU at once (persistent warps loop over their tiles), from the kernel's registers and
    shared memory, never more than the tiles need."""
    if not resident:
        return -(-batch // TC_ROWS)
    key = (name, plan.suffix, device, smem, threads)
    per_sm = _per_sm.get(key)
    if per_sm is None:
        import cupy

        kernel = _modules.get_function(FAMILY, f"{name}_{plan.suffix}", device)
        try:
            regs = kernel.num_regs
        except AttributeError:  # older CuPy: assume the worst, one block per SM
            regs = 255
        regs_per_warp = -(-regs * 32 // 256) * 256
        by_regs = cupy.cuda.runtime.deviceGetAttribute(82, device) // (regs_per_warp * (threads // 32))
        by_smem = cupy.cuda.runtime.deviceGetAttribute(81, device) // (smem + 1024)
        per_sm = _per_sm[key] = max(1, min(by_regs, by_smem, 2048 // threads))
    tiles = -(-batch // rows)
    return max(1, min(-(-tiles // (threads // 32)), per_sm * sm_count(device)))


def prepare(plan, device):
    """Raise before any launch what this device cannot run (bfloat16 before sm_80, shared memory)."""
    if plan.regime == "tc":
        if plan.dtype == 2 and compute_capability(device) < 80:  # before tc_fit asks the device anything else
            _tc_function(f"tc_mlp_nf{plan.nf}_fwd", plan, device, 0)
        _tc_function(f"tc_mlp_nf{plan.nf}_fwd", plan, device, tc_fit(plan, device)[1])


# ------------------------------------------------------------------------------ launches on raw pointers
def launch_forward(plan, device, x, weights, biases, y, batch, stream, saved=None):
    """The whole network on pointers checked by the caller; batch > 0. weights / biases:
    pointers per layer (biases None: no biases); saved: None (inference) or the pointers of
    the buffers of saved_shapes(plan, batch) (training)."""
    if plan.regime == "seed":
        (w1, w2, w3), (b1, b2, b3) = weights, biases
        h1s, h2s = saved if saved is not None else (0, 0)
        launch_seed_forward(device, x, w1, b1, w2, b2, w3, b3, y, batch, plan.out_act, stream, h1s, h2s)
        return
    ws = list(weights) + [0] * (9 - len(weights))
    bs = (list(biases) if biases is not None else []) + [0] * (9 - (len(biases) if biases is not None else 0))
    args = (x, y, saved[0] if saved is not None else 0, *ws, *bs, batch, plan.n_in, plan.width, plan.n_out,
            plan.hidden, plan.act | (plan.out_act << 2))
    fast = fast_fit(plan, device) if config.mlp_fast_forward else None
    if fast is not None:
        warps, smem = fast
        name = f"tc_mlp_w{plan.width}_{FAST_ACTIVATIONS[plan.act]}_fwd"
        grid = tc_grid(name, plan, device, batch, True, smem, 32 * warps, fast_rows(plan.width))
        launch(_tc_function(name, plan, device, smem), (grid,), 32 * warps, smem, stream, args, TC_FWD_KINDS, device)
        return
    resident, smem = tc_fit(plan, device)
    name = f"tc_mlp_nf{plan.nf}_fwd"
    launch(_tc_function(name, plan, device, smem), (tc_grid(name, plan, device, batch, resident, smem),),
           TC_THREADS, smem, stream, args[:-1] + (args[-1] | (TC_RESIDENT if resident else 0),), TC_FWD_KINDS,
           device)


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
    gm = y if plan.out_act == OUTPUT_RELU else 0
    if plan.regime == "seed":
        h1, h2 = saved
        g2 = tmp((batch, SEED_SIZES[2]), "float32")
        g1 = tmp((batch, SEED_SIZES[1]), "float32")
        if batch:
            dgrad = _modules.function_pointer(FAMILY, "mlp_dgrad_bwd_f32", device)
            grid = (-(-batch // DGRAD_ROWS),)
            steps = [(dy, gm, weights[2], h2, g2), (g2, 0, weights[1], h1, g1)]
            if dx:
                steps.append((g1, 0, weights[0], 0, dx))
            for l, (G, Gm, W, H, out) in zip((2, 1, 0), steps):
                launch(dgrad, grid, GRAD_THREADS, 0, stream, (G, Gm, W, H, out, batch, sizes[l + 1], sizes[l]),
                       DGRAD_KINDS, device)
        grads = [(g1, 0, x, 0), (g2, 0, h1, 0), (dy, gm, h2, 0)]
        chunks, rows = wgrad_plan(batch, 2 * sm_count(device), WGRAD_ROWS)
        partial = _modules.function_pointer(FAMILY, "mlp_wgrad_bwd_f32", device)
    elif batch and config.mlp_fast_backward and fast_bwd_fit(plan, device) is not None:
        _launch_fast_backward(plan, device, dy, x, y, saved[0], weights, dx, dweights, dbiases, batch, stream, tmp)
        return keep
    else:
        save = saved[0]
        width = plan.width
        layer_bytes = batch * width * item
        gws = tmp((max(plan.hidden, 1), batch, width), DTYPE_NAMES[plan.dtype])
        if batch:
            ws9 = list(weights) + [0] * (9 - L)
            resident, smem = tc_fit(plan, device)
            flags = plan.act | (plan.out_act << 2) | (TC_RESIDENT if resident else 0)
            name = f"tc_mlp_nf{plan.nf}_bwd"
            launch(_tc_function(name, plan, device, smem), (tc_grid(name, plan, device, batch, resident, smem),),
                   TC_THREADS, smem, stream, (dy, gm, save, gws, dx or 0, *ws9, batch, plan.n_in, width,
                                                   plan.n_out, plan.hidden, flags), TC_BWD_KINDS, device)
        grads = []
        for l in range(L):
            G = dy if l == L - 1 else gws + l * layer_bytes
            A = x if l == 0 else save + (l - 1) * layer_bytes
            grads.append((G, gm if l == L - 1 else 0, A, 0 if l == 0 else plan.act))
        chunks, rows = wgrad_plan(batch, sm_count(device), WGRAD_TC_ROWS)
        partial = None
    layouts = []
    for l in range(L):
        n, k = sizes[l + 1], sizes[l]
        n_p, k_p = (n, k) if plan.regime == "seed" else (round16(n), round16(k))
        layouts.append((n, k, n_p, k_p, n_p * k_p, n_p * k_p + n_p))
    ws = tmp((max(chunks, 1), max(lay[5] for lay in layouts)), "float32")
    reduce = _modules.function_pointer(FAMILY, f"mlp_wgrad_reduce_bwd_{plan.suffix}", device)
    for l, ((G, Gm, A, a_act), (n, k, n_p, k_p, db_offset, stride)) in enumerate(zip(grads, layouts)):
        if chunks:
            if plan.regime == "seed":
                launch(partial, (chunks,), GRAD_THREADS, 0, stream,
                       (G, Gm, A, ws, batch, n, k, k_p, db_offset, stride, a_act, rows), WGRAD_KINDS, device)
            else:
                smem = tc_wgrad_smem_bytes(n, k)
                fpw = tc_nf(-(-(n_p // 16) * (k_p // 16) // (TC_THREADS // 32)))
                launch(_tc_function(f"tc_mlp_wgrad_nf{fpw}_bwd", plan, device, smem), (chunks,), TC_THREADS, smem,
                       stream,
                       (G, Gm, A, ws, batch, n, k, db_offset, stride, a_act, rows), TC_WGRAD_KINDS, device)
        db = dbiases[l] if dbiases is not None else 0
        total = n * k + (n if db else 0)
        launch(reduce, (-(-total // 256),), 256, 0, stream,
               (ws, chunks, stride, n, k, k_p, db_offset, dweights[l], db), REDUCE_KINDS, device)
    return keep


# The layers' reduce waits for the fused backward (kernels/include/rawops/dependent_launch.cuh), so
# on sm_90+ it is launched programmatically dependent (config.dependent_launch): its launch overlaps
# the backward's end.


def _launch_fast_backward(plan, device, dy, x, y, save, weights, dx, dweights, dbiases, batch, stream, tmp):
    """The fused backward (one block per SM, its partial weight and bias gradients in ws),
    then one ordered reduce per layer; batch > 0."""
    warps, smem = fast_bwd_fit(plan, device)
    name = f"tc_mlp_w{plan.width}_{FAST_ACTIVATIONS[plan.act]}_bwd"
    grid = tc_grid(name, plan, device, batch, True, smem, 32 * warps, FAST_BWD_ROWS)
    layout, stride = fast_bwd_partials(plan)
    ws = tmp((grid, stride), "float32")
    ws9 = list(weights) + [0] * (9 - len(weights))
    launch(_tc_function(name, plan, device, smem), (grid,), 32 * warps, smem, stream,
           (dy, y if plan.out_act == OUTPUT_RELU else 0, x, save, dx or 0, ws, *ws9, batch, plan.n_in, plan.n_out,
            plan.hidden, plan.act | (plan.out_act << 2), stride), TC_FAST_BWD_KINDS, device)
    # every layer's sum in one launch (blockIdx.y = layer), partials added in block order
    reduce = _modules.function_pointer(FAMILY, f"mlp_wgrad_reduce_layers_bwd_{plan.suffix}", device)
    largest = max(n * k + n for _, n, k, _, _ in layout)  # outputs of the largest layer, 32 a block
    dws = list(dweights) + [0] * (9 - len(dweights))
    dbs = (list(dbiases) if dbiases is not None else []) + [0] * (9 - (len(dbiases) if dbiases is not None else 0))
    launch(reduce, (-(-largest // 32), len(layout)), 256, 0, stream,
           (ws, grid, stride, plan.n_in, plan.width, plan.n_out, plan.hidden, *dws, *dbs), REDUCE_LAYERS_KINDS,
           device, config.dependent_launch and compute_capability(device) >= 90)


# ------------------------------------------------------------------------------ CuPy API: the general network
def _network(x, weights, biases, activation, output_activation, x_name="x"):
    """Checked arrays and the plan: (X, [W], [B] or None, plan)."""
    X = as_array(x, x_name)
    if X.dtype not in DTYPE_NAMES:
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
    plan = make_plan(X.dtype, sizes, activation, output_activation, biases is not None)
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
    Supported networks: see SUPPORTED_TEXT (ValueError otherwise)."""
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
        saved = tuple(_cupy_empty(shape, dt)[0] for shape, dt in saved_shapes(plan, batch))
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
    shapes = saved_shapes(plan, batch)
    if not isinstance(saved, (list, tuple)) or len(saved) != len(shapes):
        raise ValueError(f"saved must be the {len(shapes)} array(s) fused_mlp_forward returned")
    S = []
    for i, ((shape, dt), a) in enumerate(zip(shapes, saved)):
        A = as_array(a, f"saved[{i}]")
        if A.shape != shape or DTYPE_NAMES.get(A.dtype) != dt:
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
