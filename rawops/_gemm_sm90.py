"""The Hopper GEMM (kernels/matmul_sm90.cu): WGMMA tensor cores fed by TMA, sm_90 only.

rawops.matmul routes a float16 / bfloat16 GEMM here when `plan` accepts it, else it runs the
portable kernels of kernels/matmul.cu; rawops/_gemm_tf32.py routes float32 with tf32=True here
(the nt layout only: WGMMA reads TF32 operands K-major). The kernel reads its operands through
TMA tensor maps (CUtensorMap, built by the driver on the host and passed by value), so each
operand's rows must be whole 16-byte units (a contiguous dim % 8 for 16-bit types, % 4 for
float32) and its pointer 16-byte aligned. Maps are cached per (pointer, shape): a repeated
call reuses them.
"""
import os

from ._launch import (TENSOR_MAP_BFLOAT16, TENSOR_MAP_FLOAT16, TENSOR_MAP_FLOAT32, TENSOR_MAP_SWIZZLE_128B,
                      TENSOR_MAP_TFLOAT32, encode_tensor_map_2d, launch)
from . import _modules

FAMILY = "matmul_sm90"
CC = 90
TILE_M, TILE_N, STAGES = 128, 256, 4  # kBM, kBN, kStages
SPAN = 128  # kSpanBytes: a stage's K and an output box's columns, in bytes (the 128-byte swizzle)
BOX = 64  # kBox: an M/N-major operand's TMA box edge (16-bit types only: 64 x 2 bytes, the span)
ITEMSIZE = {0: 4, 1: 2, 2: 2}  # rawops dtype code -> bytes an element
THREADS = 384  # kThreads: producer warpgroup + two consumer warpgroups
# Shared<E>: the stages of both operands, two 128 x 64 output staging buffers, the tile's bias
# (float32) and 2 x STAGES mbarriers, rounded up to 1024 bytes; + 1024 to align the dynamic
# shared memory base inside the kernel: 232448 bytes, all that sm_90 gives a block.
# (The same bytes for every type: a stage is 128 bytes of K.)
SHARED_BYTES = -(-(STAGES * (TILE_M + TILE_N) * SPAN + 2 * TILE_M * SPAN + TILE_N * 4 + 2 * STAGES * 8)
                 // 1024) * 1024 + 1024
# Below this many output tiles per SM the portable kernels' split-K spreads the work better
# (the Hopper kernel has no split-K yet: one block per tile).
MIN_TILES_PER_SM = 0.5
KINDS = "bbbbpqqqq"  # map_a, map_b, map_c, map_pre, bias, m, n, k, flags
FLAG_PRE = 8  # flags bit: a pre-activation is stored (through map_pre)
EPI_BIAS_GELU_GRAD = 2  # rawops.matmul.EPI_BIAS_GELU_GRAD
# rawops dtype code -> the CUtensorMap type of its operands. float32 operands are read as TF32
# (TF32_OPERANDS); c and the pre-activation are written as float32.
TF32_OPERANDS = TENSOR_MAP_TFLOAT32
MAP_TYPES = {0: TENSOR_MAP_FLOAT32, 1: TENSOR_MAP_FLOAT16, 2: TENSOR_MAP_BFLOAT16}
SUFFIXES = {0: "tf32", 1: "f16", 2: "bf16"}
TF32_LAYOUTS = ("nt",)
DISABLE_ENV = "RAWOPS_NO_SM90"  # set to 1: always use the portable kernels (comparisons, debugging)


def entry_points():
    names = [f"gemm_sm90_{layout}_{s}" for layout in ("nn", "nt", "tn") for s in ("f16", "bf16")]
    return sorted(names + [f"gemm_sm90_{layout}_tf32" for layout in TF32_LAYOUTS])


def tile_k(dtype):
    """K elements a stage (kBKOf<E>): 128 bytes of them."""
    return SPAN // ITEMSIZE[dtype]


def _ceil(a, b):
    return -(-a // b)


def operand_maps(layout, m, n, k, dtype=1):
    """Each operand's matrix as the copy engine sees it, (inner, outer, box_inner, box_outer):
    a K-major operand is one (rows x 128 bytes of K) box per stage, an M/N-major one (16-bit
    types only) 64 x 64 boxes."""
    bk = tile_k(dtype)
    a = (k, m, bk, TILE_M) if layout[0] == "n" else (m, k, BOX, BOX)
    b = (k, n, bk, TILE_N) if layout[1] == "t" else (n, k, BOX, BOX)
    return a, b


def plan(layout, dtype, m, n, k, cc, a_ptr, b_ptr, sms, built=True, flags=0, c_ptr=0, pre_ptr=0):
    """(kernel name, grid, block, shared bytes) of the Hopper GEMM, or None when it does not
    apply: not sm_90, not built, float32 in another layout than nt (dtype 0 means TF32: only
    rawops/_gemm_tf32.py asks for it), operands or outputs the copy engine cannot read or
    write (16-byte rows and pointers), k == 0, the GELU-gradient epilogue (not compiled
    there), or too few output tiles to fill the GPU."""
    if not built or cc != CC or dtype not in MAP_TYPES or m == 0 or n == 0 or k == 0:
        return None
    if flags & 3 == EPI_BIAS_GELU_GRAD or (dtype == 0 and layout not in TF32_LAYOUTS):
        return None
    (a_inner, *_), (b_inner, *_) = operand_maps(layout, m, n, k, dtype)
    per_row = 16 // ITEMSIZE[dtype]  # elements in 16 bytes
    if a_inner % per_row or b_inner % per_row or n % per_row or a_ptr % 16 or b_ptr % 16 or c_ptr % 16 or pre_ptr % 16:
        return None
    tiles = _ceil(m, TILE_M) * _ceil(n, TILE_N)
    if tiles < MIN_TILES_PER_SM * sms:
        return None
    return f"gemm_sm90_{layout}_{SUFFIXES[dtype]}", (min(tiles, sms),), THREADS, SHARED_BYTES


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


def tensor_map(pointer, dtype, inner, outer, box_inner, box_outer, map_type=None):
    map_type = MAP_TYPES[dtype] if map_type is None else map_type
    key = (pointer, map_type, inner, outer, box_inner, box_outer)
    found = _maps.get(key)
    if found is None:
        if len(_maps) > 1024:  # a long-running process sees many buffers: keep the cache bounded
            _maps.clear()
        found = _maps[key] = encode_tensor_map_2d(map_type, pointer, inner, outer, inner * ITEMSIZE[dtype], box_inner,
                                                  box_outer, TENSOR_MAP_SWIZZLE_128B)
    return found


def launch_gemm(function_pointer, grid, shared, device, layout, dtype, a, b, c, bias, pre, m, n, k, flags, stream):
    map_a, map_b = operand_maps(layout, m, n, k, dtype)
    operands = TF32_OPERANDS if dtype == 0 else None
    box_c = SPAN // ITEMSIZE[dtype]
    map_c = tensor_map(c, dtype, n, m, box_c, TILE_M)  # written in 128-row x 128-byte boxes
    map_pre = tensor_map(pre, dtype, n, m, box_c, TILE_M) if pre else map_c
    args = (tensor_map(a, dtype, *map_a, operands), tensor_map(b, dtype, *map_b, operands), map_c, map_pre, bias,
            m, n, k, flags | (FLAG_PRE if pre else 0))
    launch(function_pointer, grid, THREADS, shared, stream, args, KINDS, device)
