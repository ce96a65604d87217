"""What the MLP family (rawops/mlp.py) runs for a network, as arithmetic on its sizes: the Plan of
a network, the kernel and grid of the source network's forward by batch, and the shared memory,
warp tiles and row chunks of every kernel. Pure Python (no GPU, no CuPy): rawops/mlp.py asks
the device what fits and launches.

Kernels: kernels/mlp_source.cu and mlp_source_tc.cu (the float32 source network 100-128-64-10),
mlp_tiles.cu (the WMMA tile kernels), mlp_fused_fwd.cu and mlp_fused_bwd.cu (the register-resident
forward and the fused backward of the half-type networks); the values both sides need come from
rawops/_constants.py.
"""
from . import _constants as C
from ._launch import require_str
from ._rows import MAX_GRID

MAX_LAYERS = C.MLP_MAX_LAYERS  # pointers a tensor-core entry takes per weights and biases
ACTIVATIONS = {"none": C.MLP_ACT_NONE, "relu": C.MLP_ACT_RELU, "gelu": C.MLP_ACT_GELU}  # GELU: exact erf
OUTPUT_ACTIVATIONS = {"none": C.MLP_ACT_NONE, "relu": C.MLP_ACT_RELU}
OUTPUT_RELU = OUTPUT_ACTIVATIONS["relu"]
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}

# ------------------------------------------------------------------------------ the source network
SOURCE_SIZES = (C.MLP_SOURCE_IN, C.MLP_SOURCE_H1, C.MLP_SOURCE_H2, C.MLP_SOURCE_OUT)  # 100, 128, 64, 10
SOURCE_TILE, SOURCE_THREADS = C.MLP_SOURCE_TILE, C.MLP_SOURCE_THREADS  # source_mlp_fwd: samples, threads a block
SMALL_BATCH_MAX = 4096  # up to here source_mlp_small_fwd, beyond it the 3xTF32 (or the FFMA tiled) kernel
SMALL_TILE, SMALL_THREADS = C.MLP_SOURCE_SMALL_TILE, C.MLP_SOURCE_SMALL_THREADS  # source_mlp_small_fwd
# Beyond SMALL_BATCH_MAX on sm_80+ (config.mlp_tf32, the default), 3xTF32 with promoted sums: mma.sync
# (source_mlp_tc*_fwd), persistent blocks holding the weights; variant -> (rows a warp owns,
# most warps a block).
SOURCE_TC_VARIANTS = {"source_mlp_tc32_fwd": (32, C.MLP_SOURCE_TC32_WARPS),
                      "source_mlp_tc16_fwd": (16, C.MLP_SOURCE_TC16_WARPS)}
SOURCE_TC = "source_mlp_tc32_fwd"  # the variant launched (docs/performance.md compares the two)
# Its resident weights and biases, floats: W1 [128][LD1], W2 [64][LD2], W3 [16][LD3] (10 rows
# zero-padded to 16), then 128 + 64 + 16 biases; then each warp's x rows [rows][LDX].
SOURCE_TC_WEIGHT_BYTES = 4 * (C.MLP_SOURCE_H1 * C.MLP_SOURCE_TC_LD1 + C.MLP_SOURCE_H2 * C.MLP_SOURCE_TC_LD2
                              + 16 * C.MLP_SOURCE_TC_LD3 + C.MLP_SOURCE_H1 + C.MLP_SOURCE_H2 + 16)
SOURCE_TC_LDX = C.MLP_SOURCE_TC_LDX
SOURCE_TC_MIN_WARPS = 4  # fewer fit beside the weights (sm_86/89/120's ~100 KB): the FFMA kernel
# Warps a block come in multiples of this: each SM quarter has its own tensor core, and an uneven
# count leaves the SM waiting on its busiest quarter.
SOURCE_TC_WARP_STEP = 4
# The source network's backward
GRAD_THREADS, DGRAD_ROWS, WGRAD_ROWS = C.MLP_GRAD_THREADS, C.MLP_DGRAD_ROWS, C.MLP_WGRAD_ROWS
SOURCE_TC_DGRAD_WARPS = C.MLP_SOURCE_TC_DGRAD_WARPS  # source_mlp_tc_dgrad_bwd: 16 rows a warp
WGRAD_TC_THREADS = C.MLP_WGRAD_TC_THREADS  # source_mlp_tc_wgrad<l>_bwd's block
REDUCE_THREADS = C.MLP_REDUCE_THREADS  # mlp_wgrad_reduce_bwd: a thread an output
# source_mlp_small_bwd: the whole backward in one launch up to SMALL_BWD_ROWS rows (FFMA, no partials)
SMALL_BWD_ROWS, SMALL_BWD_DX_ROWS = C.MLP_SOURCE_SMALL_BWD_ROWS, C.MLP_SOURCE_SMALL_BWD_DX_ROWS
SMALL_BWD_WEIGHT_BLOCKS = C.MLP_SOURCE_H1 // C.MLP_SOURCE_SMALL_BWD_UNITS

# ------------------------------------------------------------------------------ the tensor-core networks
TC_WIDTHS = (16, 32, 64, 128)
TC_MAX_HIDDEN = MAX_LAYERS - 1
TC_MAX_IO = C.MLP_MAX_WIDTH
TC_DTYPES = {1: "f16", 2: "bf16"}
TC_THREADS = 32 * C.MLP_TC_WARPS  # the tile kernels: 8 warps of 16 rows
TC_ROWS = 16 * C.MLP_TC_WARPS  # samples a streaming block
TC_RESIDENT = C.MLP_TC_RESIDENT  # flags bit: every layer's weights resident in shared memory, persistent warps
WGRAD_TC_ROWS = C.MLP_WGRAD_TC_ROWS
# The tile kernels' accumulator counts NF (fragments of 16 columns per warp: the widest layer / 16,
# the weight gradient's fragments / 8 warps), each an entry, rounded up.
TC_NFS = (4, 8)
# Weights resident when the whole kernel's shared memory stays under this (two forward blocks
# per SM on an H100's 228 KB); beyond it the layers stream through one buffer.
RESIDENT_MAX_SMEM = 112 * 1024
FAST_ACTIVATIONS = tuple(sorted(ACTIVATIONS, key=ACTIVATIONS.get))  # by activation code: an entry each
FAST_MAX_WARPS = C.MLP_FAST_MAX_WARPS  # the register-resident forward's block: one block per SM
FAST_MIN_WARPS = 4  # fewer warps' staging rows fit beside the weights: the tile kernels instead
FAST_BWD_WIDTHS = (16, 32, 64)  # hidden widths of the fused backward's entries
FAST_BWD_MAX_WARPS = C.MLP_FAST_BWD_MAX_WARPS  # the fused backward's block: one block per SM
FAST_BWD_MIN_WARPS = 2
FAST_BWD_ROWS = C.MLP_FAST_BWD_ROWS  # rows a warp owns in a tile
# mlp_wgrad_reduce_layers_bwd: outputs a block, threads a block (runs an output x outputs)
REDUCE_LAYERS_OUTPUTS = C.MLP_REDUCE_LAYERS_OUTPUTS
REDUCE_LAYERS_THREADS = C.MLP_REDUCE_LAYERS_RUNS * C.MLP_REDUCE_LAYERS_OUTPUTS
SUPPORTED_TEXT = ("fused_mlp supports: float32 with sizes (100, 128, 64, 10), activation 'relu' and biases "
                  "(the source network); float16/bfloat16 with n_in 1..128, 1..8 hidden layers of one width in "
                  "(16, 32, 64, 128), n_out 1..128, activation 'relu'|'gelu'|'none'")


def tc_nf(fragments):
    """The smallest NF in TC_NFS holding `fragments` accumulator fragments per warp."""
    return next(v for v in TC_NFS if v >= fragments)


def tc_flags(plan):
    """The tensor-core kernels' flags: the hidden activation code, the output one above it."""
    return plan.act | (plan.out_act << C.MLP_OUTPUT_ACT_SHIFT)


# ------------------------------------------------------------------------------ the source network's launches
def source_blocks(batch):
    """Blocks of a source_mlp_fwd launch: one per tile of SOURCE_TILE samples. batch > 0."""
    blocks = -(-batch // SOURCE_TILE)
    if blocks > MAX_GRID:
        raise ValueError(f"fused_mlp: a batch of {batch} exceeds one launch's grid")
    return blocks


def small_blocks(batch):
    """Blocks of a source_mlp_small_fwd launch: one per SMALL_TILE samples. batch > 0."""
    return -(-batch // SMALL_TILE)


def source_tc_smem(rows, warps):
    """Dynamic shared memory of source_mlp_tc*_fwd: the resident weights and biases, then each
    warp's staged x rows [rows][SOURCE_TC_LDX] (float32)."""
    return SOURCE_TC_WEIGHT_BYTES + 4 * warps * rows * SOURCE_TC_LDX


def source_kernel(batch, tc=None):
    """(kernel, grid, block, dynamic shared memory) of the source network's forward: the
    small-batch kernel up to SMALL_BATCH_MAX; beyond it the 3xTF32 kernel when `tc` =
    (variant, warps, shared bytes, SM count) is given (persistent: at most one block per
    SM, never more than its warps' tiles need), else the FFMA tiled kernel."""
    if batch <= SMALL_BATCH_MAX:
        return "source_mlp_small_fwd_f32", small_blocks(batch), SMALL_THREADS, 0
    if tc is not None:
        variant, warps, smem, sms = tc
        tiles = -(-batch // SOURCE_TC_VARIANTS[variant][0])
        return f"{variant}_f32", min(-(-tiles // warps), sms), 32 * warps, smem
    return "source_mlp_fwd_f32", source_blocks(batch), SOURCE_THREADS, 0


def small_bwd_blocks(batch, dx):
    """Blocks of a source_mlp_small_bwd launch (1 <= batch <= SMALL_BWD_ROWS): the weight
    blocks (a slice of layer 1's units each), then, where dx is wanted, one per SMALL_BWD_DX_ROWS rows."""
    return SMALL_BWD_WEIGHT_BLOCKS + (-(-batch // SMALL_BWD_DX_ROWS) if dx else 0)


# ------------------------------------------------------------------------------ shared memory and tiles
def round16(n):
    return -(-n // 16) * 16


def tc_smem_bytes(n_in, width, n_out, hidden=None):
    """Dynamic shared memory of tc_mlp_fwd / tc_mlp_bwd (kernels/mlp_tiles.cu, TcSmem): float
    scratch 256 per warp, MAX_WIDTH float biases per layer held, the activation tile
    [128][act_ld] and the weights, 2-byte elements. Streaming (hidden None): one layer's weights
    [max(width, out_p)][w_ld]; resident (hidden layers given): every layer's, stacked."""
    in_p, out_p = round16(n_in), round16(n_out)
    act_ld = max(in_p, width, out_p) + 8
    w_ld = max(in_p, width) + 8
    if hidden is None:
        bias_layers, w_rows = 1, max(width, out_p)
    else:
        bias_layers, w_rows = hidden + 1, width * hidden + out_p
    return (TC_THREADS // 32) * 256 * 4 + C.MLP_MAX_WIDTH * 4 * bias_layers + 2 * (TC_ROWS * act_ld + w_rows * w_ld)


def fast_rows(width):
    """Rows a warp of tc_mlp_w<width>_<act>_fwd owns (kRows = 16 * kMT)."""
    return 16 if width == 128 else 32


def fast_smem_bytes(n_in, width, n_out, hidden, warps):
    """Dynamic shared memory of tc_mlp_w<width>_<act>_fwd (kernels/mlp_fused_fwd.cu, fast_fwd):
    float biases [hidden + 1][MAX_WIDTH], every layer's weights with rows padded by 8 elements
    ([width][in_p + 8], hidden - 1 x [width][width + 8], [out_p][width + 8]), and per warp its x
    rows [rows][in_p + 8] and y rows [rows][out_p + 8], 2-byte elements."""
    in_p, out_p = round16(n_in), round16(n_out)
    weights = width * (in_p + 8) + (hidden - 1) * width * (width + 8) + out_p * (width + 8)
    return 4 * C.MLP_MAX_WIDTH * (hidden + 1) + 2 * weights + 2 * warps * fast_rows(width) * (in_p + 8 + out_p + 8)


def most_warps(smem_of, most, least, limit, step=1):
    """(warps, shared memory bytes) for the most warps in most..least (every `step`-th from
    most) whose smem_of(warps) fits in `limit`, or None."""
    for warps in range(most, least - 1, -step):
        smem = smem_of(warps)
        if smem <= limit:
            return warps, smem
    return None


def fast_bwd_layer_shapes(n_in, width, n_out, hidden):
    """(out_p, in_p) of each layer's padded weight gradient in the fused backward."""
    return [(width if l < hidden else round16(n_out), round16(n_in) if l == 0 else width) for l in range(hidden + 1)]


def fast_bwd_smem_bytes(n_in, width, n_out, hidden, warps):
    """Dynamic shared memory of tc_mlp_w<width>_<act>_bwd (kernels/mlp_fused_bwd.cu, fast_bwd):
    float accumulators per layer ([out_p][in_p] and 8 db floats a row per 32 inputs), the
    weights as the register-resident forward keeps them, and per warp FAST_BWD_ROWS rows of G
    ([max(out_p, width) + 8]) and of A ([max(in_p, width) + 8]), 2-byte elements."""
    in_p, out_p = round16(n_in), round16(n_out)
    accumulators = sum(o * (i + 8 * -(-i // 32)) for o, i in fast_bwd_layer_shapes(n_in, width, n_out, hidden))
    weights = width * (in_p + 8) + (hidden - 1) * width * (width + 8) + out_p * (width + 8)
    staging = FAST_BWD_ROWS * (max(out_p, width) + 8 + max(in_p, width) + 8)
    return 4 * accumulators + 2 * weights + 2 * warps * staging


def fast_bwd_partials(plan):
    """Per layer (offset, n, k, n_p, k_p) of its [n_p][k_p] + [n_p] floats in a block's
    partials, and the floats per block (the stride)."""
    layout, offset = [], 0
    for l, (n_p, k_p) in enumerate(fast_bwd_layer_shapes(plan.n_in, plan.width, plan.n_out, plan.hidden)):
        layout.append((offset, plan.sizes[l + 1], plan.sizes[l], n_p, k_p))
        offset += n_p * k_p + n_p
    return layout, offset


def tc_wgrad_smem_bytes(n, k):
    """Dynamic shared memory of tc_mlp_wgrad_bwd: two staged [WGRAD_TC_ROWS][x_p + 8] 2-byte tiles."""
    return 2 * WGRAD_TC_ROWS * (round16(n) + 8 + round16(k) + 8)


def wgrad_plan(batch, chunks_max, unit):
    """(chunks, rows per chunk) of the weight-gradient partial sums: at most chunks_max
    chunks of a multiple of `unit` rows, covering the batch; (0, unit) for batch 0."""
    if batch <= 0:
        return 0, unit
    chunks = min(-(-batch // unit), chunks_max)
    rows = -(-(-(-batch // chunks)) // unit) * unit
    return -(-batch // rows), rows


# ------------------------------------------------------------------------------ plans
class Plan:
    """What runs for one network: regime 'source' (the float32 source network) or 'tc'."""

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


def check_activations(activation, output_activation):
    """TypeError / ValueError naming a hidden or output activation that is not supported."""
    require_str(activation, "activation")
    require_str(output_activation, "output_activation")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {sorted(OUTPUT_ACTIVATIONS)}, got {output_activation!r}")


def _make_plan(dtype, sizes, activation, output_activation, has_bias):
    check_activations(activation, output_activation)
    sizes = tuple(int(v) for v in sizes)
    p = Plan()
    p.dtype, p.sizes, p.has_bias = dtype, sizes, bool(has_bias)
    p.act, p.out_act = ACTIVATIONS[activation], OUTPUT_ACTIVATIONS[output_activation]
    p.n_in, p.n_out, p.layers = sizes[0], sizes[-1], len(sizes) - 1
    p.hidden = len(sizes) - 2
    p.width = sizes[1] if len(sizes) > 2 else 0
    if dtype == 0:
        if sizes != SOURCE_SIZES or activation != "relu" or not has_bias:
            what = (f"float32 network of sizes {sizes} with activation {activation!r}"
                    + ("" if has_bias else ", no biases"))
            raise ValueError(f"{what} is not supported; {SUPPORTED_TEXT}")
        p.regime, p.suffix, p.smem, p.resident, p.nf, p.smem_stream = "source", "f32", 0, False, 0, 0
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
    if plan.regime == "source":
        return [((batch, SOURCE_SIZES[1]), "float32"), ((batch, SOURCE_SIZES[2]), "float32")]
    return [((plan.hidden, batch, plan.width), DTYPE_NAMES[plan.dtype])]
