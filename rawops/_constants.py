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
# bias_bwd_tile (the short tiles), per type: threads a block, rows a tile, rows a thread.
BIAS_BWD_TILE_F32_THREADS = 1024
BIAS_BWD_TILE_F32_ROWS = 64
BIAS_BWD_TILE_F32_PER = 1
BIAS_BWD_TILE_F16_THREADS = 512
BIAS_BWD_TILE_F16_ROWS = 64
BIAS_BWD_TILE_F16_PER = 1
BIAS_BWD_TILE_BF16_THREADS = 512
BIAS_BWD_TILE_BF16_ROWS = 128
BIAS_BWD_TILE_BF16_PER = 2
# fixed_sum_zero / fixed_sum_final_f16 (float16's exact dbias): their blocks and launch bound.
FIXED_SUM_THREADS = 256

# ------------------------------------------------------------------ rows (kernels/include/rawops/rows.cuh: norm, softmaxes)
# The widest block (and every row kernel's launch bound) and the blocks of it an SM must hold
# (ROW_MIN_BLOCKS: at most 65536 / (ROW_MAX_THREADS * ROW_MIN_BLOCKS) registers a thread).
ROW_MAX_THREADS = 512
ROW_MIN_BLOCKS = 2
# 16-byte vectors a thread holds of a row in registers: forward, backward (two operands).
ROW_FWD_VECTORS = 4
ROW_BWD_VECTORS = 2
# The mode argument of every row kernel.
ROW_MODE_WARP = 0
ROW_MODE_BLOCK = 1
ROW_MODE_STREAM = 2

# ------------------------------------------------------------------ norm (kernels/norm.cu)
# Bits of the kernels' `vec` argument: 16-byte rows, weight given, bias given.
NORM_FLAG_VECTORS = 1
NORM_FLAG_WEIGHT = 2
NORM_FLAG_BIAS = 4
# norm_param_grad: blocks of COLUMNS columns x LANES lanes over the partial rows.
NORM_PARAM_GRAD_COLUMNS = 32
NORM_PARAM_GRAD_LANES = 16


def defines():
    """The -D flags of every constant, sorted by name (part of the fatbin cache key)."""
    return [f"-DRAWOPS_{name}={value}" for name, value in sorted(globals().items())
            if name.isupper() and isinstance(value, int) and not isinstance(value, bool)]
