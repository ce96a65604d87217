"""The Hopper GEMM (kernels/matmul_sm90.cu): WGMMA tensor cores fed by TMA, sm_90 only.

rawops.matmul routes a float16 / bfloat16 GEMM here when `plan` accepts it, else it runs the
portable kernels of kernels/matmul.cu. The kernel reads its operands through TMA tensor maps
(CUtensorMap, built by the driver on the host and passed by value), so each operand's
contiguous dim must be a multiple of 8 elements (16-byte rows) and its pointer 16-byte
aligned. Maps are cached per (pointer, shape): a repeated call reuses them.
"""
import os

from ._launch import (TENSOR_MAP_BFLOAT16, TENSOR_MAP_FLOAT16, TENSOR_MAP_SWIZZLE_128B, encode_tensor_map_2d,
                      launch)
from . import _modules

FAMILY = "matmul_sm90"
CC = 90
TILE_M, TILE_N, TILE_K, STAGES = 128, 256, 64, 4  # kBM, kBN, kBK, kStages
BOX = 64  # kBox: a TMA box's edge along an operand's contiguous dim (64 x 2 bytes: the swizzle span)
THREADS = 384  # kThreads: producer warpgroup + two consumer warpgroups
# Shared<E>: the stages of both operands, two 128 x 64 output staging buffers, the tile's bias
# (float32) and 2 x STAGES mbarriers, rounded up to 1024 bytes; + 1024 to align the dynamic
# shared memory base inside the kernel: 232448 bytes, all that sm_90 gives a block.
SHARED_BYTES = -(-(STAGES * (TILE_M + TILE_N) * TILE_K * 2 + 2 * TILE_M * BOX * 2 + TILE_N * 4 + 2 * STAGES * 8)
                 // 1024) * 1024 + 1024
# Below this many output tiles per SM the portable kernels' split-K spreads the work better
# (the Hopper kernel has no split-K yet: one block per tile).
MIN_TILES_PER_SM = 0.5
KINDS = "bbbbpqqqq"  # map_a, map_b, map_c, map_pre, bias, m, n, k, flags
FLAG_PRE = 8  # flags bit: a pre-activation is stored (through map_pre)
EPI_BIAS_GELU_GRAD = 2  # rawops.matmul.EPI_BIAS_GELU_GRAD
MAP_TYPES = {1: TENSOR_MAP_FLOAT16, 2: TENSOR_MAP_BFLOAT16}  # rawops dtype code -> CUtensorMap type
DISABLE_ENV = "RAWOPS_NO_SM90"  # set to 1: always use the portable kernels (comparisons, debugging)


def entry_points():
    return sorted(f"gemm_sm90_{layout}_{s}" for layout in ("nn", "nt", "tn") for s in ("f16", "bf16"))


def _ceil(a, b):
    return -(-a // b)


def operand_maps(layout, m, n, k):
    """Each operand's matrix as the copy engine sees it, (inner, outer, box_inner, box_outer):
    a K-major operand is one (rows x 64) box per stage, an M/N-major one 64 x 64 boxes."""
    a = (k, m, BOX, TILE_M) if layout[0] == "n" else (m, k, BOX, BOX)
    b = (k, n, BOX, TILE_N) if layout[1] == "t" else (n, k, BOX, BOX)
    return a, b


def plan(layout, dtype, m, n, k, cc, a_ptr, b_ptr, sms, built=True, flags=0, c_ptr=0, pre_ptr=0):
    """(kernel name, grid, block, shared bytes) of the Hopper GEMM, or None when it does not
    apply: not sm_90, float32, not built, operands or outputs the copy engine cannot read or
    write (16-byte rows and pointers), k == 0, the GELU-gradient epilogue (not compiled
    there), or too few output tiles to fill the GPU."""
    if not built or cc != CC or dtype not in MAP_TYPES or m == 0 or n == 0 or k == 0:
        return None
    if flags & 3 == EPI_BIAS_GELU_GRAD:
        return None
    (a_inner, *_), (b_inner, *_) = operand_maps(layout, m, n, k)
    if a_inner % 8 or b_inner % 8 or n % 8 or a_ptr % 16 or b_ptr % 16 or c_ptr % 16 or pre_ptr % 16:
        return None
    tiles = _ceil(m, TILE_M) * _ceil(n, TILE_N)
    if tiles < MIN_TILES_PER_SM * sms:
        return None
    suffix = "f16" if dtype == 1 else "bf16"
    return f"gemm_sm90_{layout}_{suffix}", (min(tiles, sms),), THREADS, SHARED_BYTES


_built = {}


def built(device):
    """Whether this installation holds the Hopper kernels for `device` (checked once)."""
    ok = _built.get(device)
    if ok is None:
        ok = os.environ.get(DISABLE_ENV) != "1"
        if ok:
            try:
                _modules.get_function(FAMILY, entry_points()[0], device)
            except _modules.FamilyUnavailable:
                ok = False
        _built[device] = ok
    return ok


def function(name, device):
    return _modules.function_with_shared(FAMILY, name, device, SHARED_BYTES)


_maps = {}  # (pointer, dtype, inner, outer, box) -> CUtensorMap bytes


def tensor_map(pointer, dtype, inner, outer, box_inner, box_outer):
    key = (pointer, dtype, inner, outer, box_inner, box_outer)
    found = _maps.get(key)
    if found is None:
        if len(_maps) > 1024:  # a long-running process sees many buffers: keep the cache bounded
            _maps.clear()
        found = _maps[key] = encode_tensor_map_2d(MAP_TYPES[dtype], pointer, inner, outer, inner * 2, box_inner,
                                                  box_outer, TENSOR_MAP_SWIZZLE_128B)
    return found


def launch_gemm(function_pointer, grid, shared, device, layout, dtype, a, b, c, bias, pre, m, n, k, flags, stream):
    map_a, map_b = operand_maps(layout, m, n, k)
    map_c = tensor_map(c, dtype, n, m, BOX, TILE_M)  # written in 128 x 64 boxes
    map_pre = tensor_map(pre, dtype, n, m, BOX, TILE_M) if pre else map_c
    args = (tensor_map(a, dtype, *map_a), tensor_map(b, dtype, *map_b), map_c, map_pre, bias, m, n, k,
            flags | (FLAG_PRE if pre else 0))
    launch(function_pointer, grid, THREADS, shared, stream, args, KINDS, device)
