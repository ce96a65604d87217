"""Values that both the CUDA kernels and the Python launchers need, defined here once.

The build passes every upper-case name below to nvcc as `-DRAWOPS_<NAME>=<value>` (and the
NVRTC fallback and the development rebuild pass the same), so a kernel reads
`RAWOPS_MAP_UNROLL` where Python reads `_constants.MAP_UNROLL`; a kernel file that uses one
fails to compile without it. Standard library only: setup.py loads this file by path.
Grouped by family; each value's meaning is documented where the kernel uses it.
"""

# ------------------------------------------------------------------ elementwise (kernels/elementwise.cu)
# The map kernels: blocks of MAP_THREADS (their launch bound), MAP_UNROLL 16-byte vectors a thread
# per block step.
MAP_THREADS = 256
MAP_UNROLL = 1
# The strided map kernels: dims a layout holds once merged (the kernels' MapLayout), elements a
# thread handles per block step.
MAP_MAX_DIMS = 25
MAP_STRIDED_UNROLL = 4
# column_sum_final: blocks of COLUMNS x GROUPS threads (group g adds chunks g, g + GROUPS, ...).
COLUMN_SUM_FINAL_COLUMNS = 32
COLUMN_SUM_FINAL_GROUPS = 32
# bias_bwd_partial (the column walkers): blocks of BIAS_BWD_THREADS; per storage size the bytes a
# thread reads of each operand a row and the blocks an SM its launch bounds keep resident.
BIAS_BWD_THREADS = 256
BIAS_BWD_F32_BYTES = 16
BIAS_BWD_F32_BLOCKS = 3
BIAS_BWD_HALF_BYTES = 8
BIAS_BWD_HALF_BLOCKS = 6
# bias_bwd_tile (the short tiles), per type: threads a block, rows a tile, rows a thread; bfloat16's
# blocks an SM its launch bound keeps resident (the other types' tiles have none, ptxas's choice).
# float16 4 rows a thread (H200: 0.85 -> 0.94 of the copy ceiling, erf 0.78 -> 0.91; 1 before), bfloat16
# held to 3 blocks (40 registers; it took 55, 2 blocks): docs/performance.md.
BIAS_BWD_TILE_F32_THREADS = 1024
BIAS_BWD_TILE_F32_ROWS = 64
BIAS_BWD_TILE_F32_PER = 1
BIAS_BWD_TILE_F16_THREADS = 512
BIAS_BWD_TILE_F16_ROWS = 256
BIAS_BWD_TILE_F16_PER = 4
BIAS_BWD_TILE_BF16_THREADS = 512
BIAS_BWD_TILE_BF16_ROWS = 128
BIAS_BWD_TILE_BF16_BLOCKS = 3
BIAS_BWD_TILE_BF16_PER = 2
# fixed_sum_zero / fixed_sum_final_f16 (float16's exact dbias): their blocks and launch bound.
FIXED_SUM_THREADS = 256

# ----------------------------------------------- rows (kernels/include/rawops/rows.cuh: norm, softmaxes)
# The widest block (and every row kernel's launch bound) and the blocks of it an SM must hold
# (ROW_MIN_BLOCKS: at most 65536 / (ROW_MAX_THREADS * ROW_MIN_BLOCKS) registers a thread).
ROW_MAX_THREADS = 512
ROW_MIN_BLOCKS = 2
# log_softmax's backward: three such blocks (40 registers, none spilled). Its epilogue's exp leaves an
# SM's two rows idle on memory longer than softmax's multiply does (H200, 16384 x 4096 float32:
# 209.5 -> 186.9 us, 0.90 -> 1.01 of the copy ceiling; docs/performance.md).
ROW_LOG_SOFTMAX_BWD_MIN_BLOCKS = 3
# 16-byte vectors a thread holds of a row in registers: forward, backward (two operands).
ROW_FWD_VECTORS = 4
ROW_BWD_VECTORS = 2
# The softmax forwards' wide entries (<op>_fwd_wide): 8 vectors a thread, taken where a row then
# still spreads over 24 to 128 threads (rawops/softmaxes.py forward_plan).
ROW_FWD_WIDE_VECTORS = 8
# The norm backward's bulk path (sm_90): at most this many rows of its operands in flight ahead of
# the one computed (the launch asks for 1..ROW_BWD_MAX_STAGES, 0: the register path).
ROW_BWD_MAX_STAGES = 2
# add_rms_norm's 16-bit backward: registers a thread at most (80: three 256-thread blocks an SM;
# its bulk path's third operand took it to 96, two blocks).
ROW_BWD_MAX_REGISTERS = 80
# The mode argument of every row kernel.
ROW_MODE_WARP = 0
ROW_MODE_BLOCK = 1
ROW_MODE_STREAM = 2

# ------------------------------------------------------------------ norm (kernels/norm.cu)
# Bits of the kernels' `vec` argument: 16-byte rows, weight given, bias given, add_rms_norm's
# backward given d_residual_out; then the backward's bulk-path stages (sm_90, block mode: rawops/norm.py).
NORM_FLAG_VECTORS = 1
NORM_FLAG_WEIGHT = 2
NORM_FLAG_BIAS = 4
NORM_FLAG_ADD = 8
NORM_STAGES_SHIFT = 4  # bits 4-5 of `vec`: the bulk path's stages (0: none)
# norm_param_grad: blocks of COLUMNS columns x LANES lanes over the partial rows.
NORM_PARAM_GRAD_COLUMNS = 32
NORM_PARAM_GRAD_LANES = 16

# gemm: kernels/gemm.cu, gemm_small.cu, gemm_tf32.cu, gemm_sm90.cu (rawops/gemm.py, _gemm_*.py)
# The epilogue's flags (kernels/include/rawops/gemm_epilogue.cuh): the mode in bits 0-1, then flag bits.
GEMM_EPI_NONE = 0
GEMM_EPI_BIAS_GELU = 1  # bias + GELU, the pre-activation also stored where `pre` is given
GEMM_EPI_BIAS_GELU_GRAD = 2  # bias + GELU gradient: out = aux * gelu'(acc + bias)
GEMM_EPI_BIAS = 3
GEMM_EPI_ERF = 4  # exact-erf GELU, else the tanh approximation
GEMM_EPI_PRE = 8  # the Hopper kernel's flags: a pre-activation is stored (through its own tensor map)
# gemm_simt, gemm_simt_vec (exact FFMA): square block tiles and threads; gemm_simt_vec's K a tile
GEMM_SIMT_TILE = 128
GEMM_SIMT_THREADS = 256
GEMM_SIMT_VEC_K = 16
# gemm_mma (mma.sync, half types): square block tiles, K a stage, stages, threads; each staged
# row padded by GEMM_MMA_PAD elements (ldmatrix conflict-free)
GEMM_MMA_TILE = 128
GEMM_MMA_K = 32
GEMM_MMA_STAGES = 3
GEMM_MMA_THREADS = 256
GEMM_MMA_PAD = 8
GEMM_REDUCE_THREADS = 256  # gemm_reduce's block
# gemm_small_m_nn: a block's rows (all of M) and columns, its threads
GEMM_SMALL_M_ROWS = 32
GEMM_SMALL_M_COLS = 64
GEMM_SMALL_M_THREADS = 128
# linear_small (x @ W^T at small batch): rows a blockIdx.y (linear_small_tc too), output features
# a block, threads sharing a feature along K, K a staged chunk of x
GEMM_SMALL_ROWS = 32
GEMM_SMALL_FEATURES = 24
GEMM_SMALL_GROUPS = 16
GEMM_SMALL_K = 768
# linear_small_tc's shipped shapes: float32 in 3xTF32 (a cluster of CLUSTER CTAs, TILES n8 tiles
# of features a CTA, WARPS warps splitting K), and the 16-bit types (MMA_TILES, MMA_WARPS)
GEMM_SMALL_TF32_CLUSTER = 1
GEMM_SMALL_TF32_TILES = 3
GEMM_SMALL_TF32_WARPS = 16
GEMM_SMALL_MMA_TILES = 2
GEMM_SMALL_MMA_WARPS = 8
# gemm_tf32 (mma.sync TF32): square block tiles, K a stage, stages, threads; a K-major staged row
# padded by KMAJOR_PAD floats, an M/N-major one by MNMAJOR_PAD; gemm_tf32_wide's tile width and
# stages; transpose_tf32_f32's square tile and threads
GEMM_TF32_TILE = 128
GEMM_TF32_K = 16
GEMM_TF32_STAGES = 4
GEMM_TF32_THREADS = 256
GEMM_TF32_KMAJOR_PAD = 4
GEMM_TF32_MNMAJOR_PAD = 8
GEMM_TF32_WIDE_N = 256
GEMM_TF32_WIDE_STAGES = 4
GEMM_TF32_TRANSPOSE_TILE = 64
GEMM_TF32_TRANSPOSE_THREADS = 256
# gemm_sm90 (WGMMA + TMA): output tile rows, bytes of a stage's K (the 128-byte swizzle span), an
# M/N-major operand's TMA box edge, threads (three warpgroups), stages of the ring per tile width
GEMM_SM90_TILE_M = 128
GEMM_SM90_SPAN_BYTES = 128
GEMM_SM90_BOX = 64
GEMM_SM90_THREADS = 384
GEMM_SM90_STAGES_N256 = 4
GEMM_SM90_STAGES_N128 = 6
GEMM_SM90_STAGES_N64 = 8

# mlp: kernels/mlp_source.cu, mlp_source_tc.cu, mlp_tiles.cu, mlp_fused_fwd.cu, mlp_fused_bwd.cu, include/rawops/mlp.cuh
# (rawops/mlp.py, _mlp_plans.py)
# Activation codes; the tensor-core kernels' flags hold the hidden one in bits 0-1, the output one
# shifted by MLP_OUTPUT_ACT_SHIFT, and MLP_TC_RESIDENT; the source network's flags are its output
# activation code (none or ReLU).
MLP_ACT_NONE = 0
MLP_ACT_RELU = 1
MLP_ACT_GELU = 2  # exact erf GELU
MLP_OUTPUT_ACT_SHIFT = 2
MLP_TC_RESIDENT = 16  # the tile kernels: every layer's weights resident, persistent warps
MLP_MAX_LAYERS = 9  # weight and bias pointers a tensor-core entry takes: up to 8 hidden layers
MLP_MAX_WIDTH = 128  # the widest n_in, width, n_out of the tensor-core kernels: a layer's bias row
# The source network 100-128-64-10: its sizes; source_mlp_fwd's samples a block and threads;
# source_mlp_small_fwd's; the 3xTF32 forwards' warps a block (32- and 16-row warp tiles) and the
# row strides (floats) of their resident W1, W2, W3 and staged x rows
MLP_SOURCE_IN = 100
MLP_SOURCE_H1 = 128
MLP_SOURCE_H2 = 64
MLP_SOURCE_OUT = 10
MLP_SOURCE_TILE = 64
MLP_SOURCE_THREADS = 128
MLP_SOURCE_SMALL_TILE = 2
MLP_SOURCE_SMALL_THREADS = 256
MLP_SOURCE_TC32_WARPS = 8
MLP_SOURCE_TC16_WARPS = 16
MLP_SOURCE_TC_LD1 = 104
MLP_SOURCE_TC_LD2 = 136
MLP_SOURCE_TC_LD3 = 72
MLP_SOURCE_TC_LDX = 104
# The source network's backward: threads of mlp_dgrad_bwd / mlp_wgrad_bwd, rows a dgrad block,
# rows a wgrad step; mlp_wgrad_reduce_bwd's block
MLP_GRAD_THREADS = 256
MLP_DGRAD_ROWS = 64
MLP_WGRAD_ROWS = 32
# ... in one launch at small batches (source_mlp_small_bwd): the most rows (its shared memory
# holds every row's layer-2 gradient), layer 1's units a weight block owns, dx's rows a dx block
MLP_SOURCE_SMALL_BWD_ROWS = 128
MLP_SOURCE_SMALL_BWD_UNITS = 8
MLP_SOURCE_SMALL_BWD_DX_ROWS = 8
MLP_REDUCE_THREADS = 256
# ... on the tensor pipe (3xTF32): source_mlp_tc_dgrad_bwd's warps a block (16 rows each);
# source_mlp_tc_wgrad<l>_bwd's threads
MLP_SOURCE_TC_DGRAD_WARPS = 8
MLP_WGRAD_TC_THREADS = 256
# The WMMA tile kernels: warps a block (16 rows each), rows a tc_mlp_wgrad step
MLP_TC_WARPS = 8
MLP_WGRAD_TC_ROWS = 64
# The register-resident forward's and the fused backward's most warps a block (one block an SM),
# the fused backward's rows a warp; mlp_wgrad_reduce_layers_bwd's outputs a block and runs an output
MLP_FAST_MAX_WARPS = 16
MLP_FAST_BWD_MAX_WARPS = 8
MLP_FAST_BWD_ROWS = 32
MLP_REDUCE_LAYERS_OUTPUTS = 32
MLP_REDUCE_LAYERS_RUNS = 8


def defines():
    """The -D flags of every constant, sorted by name (part of the fatbin cache key)."""
    return [f"-DRAWOPS_{name}={value}" for name, value in sorted(globals().items())
            if name.isupper() and isinstance(value, int) and not isinstance(value, bool)]

# image: kernels/image.cu (rawops/image.py): rgb_to_gray, normalize_volume, to_tensor_normalize
# Every image kernel's block (its launch bound; a grid-stride grid is the blocks of it the device
# holds at once, from the occupancy API at launch); pixels a thread converts per step (rgb_to_gray,
# to_tensor_normalize: 16 bytes of uint8 a plane); 16-byte vectors a thread has in flight per step
# of normalize_volume's min/max pass.
IMAGE_THREADS = 256
IMAGE_PIXELS = 16
IMAGE_REDUCE_UNROLL = 4
# OpenCV's uint8 RGB -> gray (imgproc color_rgb.simd.hpp RGB2Gray<uchar>: RY15, GY15, BY15, gray_shift):
# gray = (R * IMAGE_GRAY_R + G * IMAGE_GRAY_G + B * IMAGE_GRAY_B + 2^(SHIFT - 1)) >> SHIFT, the weights
# summing to 2^SHIFT.
IMAGE_GRAY_SHIFT = 15
IMAGE_GRAY_R = 9798
IMAGE_GRAY_G = 19235
IMAGE_GRAY_B = 3735
# normalize_volume's map kernel flags: lo from the min/max pass, hi from it, clip to [0, 1].
IMAGE_FLAG_LO = 1
IMAGE_FLAG_HI = 2
IMAGE_FLAG_CLIP = 4

# sorting: kernels/sorting.cu (rawops/sorting.py)
# sort_warp_*'s block (rows of up to 32 sorted by groups of lanes); the blocks of the long-row
# kernels that stream (sort_keys_*, sort_gather_*, sort_merge_*) and the outputs a merge thread
# writes; the segmented digit passes (sort_pass_k*): threads, keys a thread (nominal, for 4-byte
# keys: cub scales it down for 8-byte ones) and digit bits per pass
SORT_WARP_THREADS = 256
SORT_STREAM_THREADS = 256
SORT_MERGE_ITEMS = 8
SORT_SEGMENT_THREADS = 192
SORT_SEGMENT_ITEMS = 39
SORT_SEGMENT_RADIX_BITS = 6
# The block merge (sort_bmerge_*): threads a block and outputs a thread, so one block merges a
# window of SORT_BMERGE_THREADS * SORT_BMERGE_ITEMS outputs (a power of two dividing every run
# pair: <= 8192); the merge-network kernels' block (sort_net_*: one warp a row)
SORT_BMERGE_THREADS = 256
SORT_BMERGE_ITEMS = 8
SORT_NET_THREADS = 128

# ------------------------------------------------------------------ rotary (kernels/rotary.cu)
# rope's blocks (and launch bound), the heads a thread rotates per unit (their loads in flight at
# once, cos and sin loaded once for them), and the bits of its `flags` argument: 16-byte units,
# interleaved pairs (else half split). Its grid-stride grid is the blocks the device holds at once
# (the occupancy API at launch).
ROPE_THREADS = 256
ROPE_HEADS = 4
ROPE_FLAG_VECTORS = 1
ROPE_FLAG_INTERLEAVED = 2

# losses: kernels/losses.cu (rawops/losses.py): cross_entropy
# The row kernels' widest block (their launch bound), the warp-per-row block (CE_WARP_THREADS / 32
# rows a block) and the rows a warp-per-row launch covers up to (rows of at most CE_WARP_VECTORS
# 16-byte vectors); the 16-byte vectors a thread loads at once per pass (memory-level parallelism);
# the one-block kernels' block (the target count, the loss reduction).
CE_MAX_THREADS = 1024
CE_WARP_THREADS = 256
CE_WARP_VECTORS = 64
CE_UNROLL = 4
CE_SMALL_THREADS = 1024
# Percent of the device's L2 (cudaDevAttrL2CacheSize) a re-reading block-per-row grid keeps in flight
# (the rows resident at once, each read twice by its block: the second read finds the row still in
# L2 while they fit; see rawops/losses.py's plan): 24 MiB of the H100's and H200's 50 MiB.
CE_RESIDENT_L2_PERCENT = 48
# Bits of the kernels' flags argument.
CE_FLAG_VECTORS = 1
CE_FLAG_TARGET_I32 = 2
CE_FLAG_MEAN = 4
CE_FLAG_GRAD_OUTPUT = 8
CE_FLAG_PER_ROW_GRAD_OUTPUT = 16
CE_FLAG_WARP = 32

# ------------------------------------------------------------------ moe (kernels/moe.cu, rawops/moe.py)
# The most experts a router row or a permutation holds (a warp's lanes hold MOE_MAX_EXPERTS / 32
# scores each; the index kernels' shared tables hold one int an expert), and the most experts a
# token picks (a lane a choice).
MOE_MAX_EXPERTS = 1024
MOE_MAX_K = 32
# Blocks (and launch bounds): the router's and the row kernels' (a warp a token), the index
# kernels' (count and place: a chunk of entries a block, MOE_INDEX_THREADS of them a step) and the
# padding kernel's (MOE_SCAN_THREADS: its table is scanned in every block).
MOE_ROUTE_THREADS = 256
MOE_ROWS_THREADS = 256
MOE_INDEX_THREADS = 256
MOE_SCAN_THREADS = 512
# 16-byte loads a lane of the permute holds in flight before its stores (dev/moe_permute_limits.py,
# bf16, 2 / 4 / 8: H100 Qwen3 257.2 / 254.6 / 253.6 us, Mixtral 173.7 / 169.6 / 166.8; H200 Qwen3
# 204.4 / 196.5 / 196.7, Mixtral 137.8 / 129.3 / 127.7).
MOE_PERMUTE_PIECES = 8
# The most blocks the index kernels take (every moe_place block reads each block's counts: E + 1 a
# block); rawops/moe.py's index_plan sizes the chunks to fit.
MOE_INDEX_MAX_BLOCKS = 1024
# Bits of the kernels' flags argument.
MOE_FLAG_SIGMOID = 1
MOE_FLAG_NORMALIZE = 2
MOE_FLAG_IDS_I64 = 4
MOE_FLAG_VECTORS = 8
