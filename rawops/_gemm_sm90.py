"""The Hopper GEMM (kernels/gemm_sm90.cu): WGMMA tensor cores fed by TMA, sm_90 only.

rawops.matmul routes a float16 / bfloat16 GEMM here when `plan` accepts it, else it runs the
portable kernels of kernels/gemm.cu; rawops/_gemm_tf32.py routes float32 with tf32=True here
(the nt layout only: WGMMA reads TF32 operands K-major). The kernel reads its operands through
TMA tensor maps (CUtensorMap, built by the driver on the host and passed by value), so each
operand's rows must be whole 16-byte units (a contiguous dim % 8 for 16-bit types, % 4 for
float32) and its pointer 16-byte aligned. Maps are cached per (pointer, shape): a repeated
call reuses them.
"""

from ._launch import (TENSOR_MAP_BFLOAT16, TENSOR_MAP_FLOAT16, TENSOR_MAP_FLOAT32, TENSOR_MAP_SWIZZLE_128B,
                      TENSOR_MAP_TFLOAT32, encode_tensor_map_2d, launch)
from . import _constants as C
from . import _gemm_reduce, _modules, config

FAMILY = "gemm_sm90"
CC = 90
TILE_M = C.GEMM_SM90_TILE_M
# Output tile widths (BN) of the entry points, the widest first: gemm_sm90_<layout>_<suffix>
# is 256 wide, the narrower ones end in _n128 / _n64. Each has the stages that the 227 KB of
# shared memory hold. The widest never splits K (the kernel forces 1).
TILE_WIDTHS = (256, 128, 64)
STAGES_OF = {256: C.GEMM_SM90_STAGES_N256, 128: C.GEMM_SM90_STAGES_N128, 64: C.GEMM_SM90_STAGES_N64}
TILE_N = TILE_WIDTHS[0]
STAGES = STAGES_OF[TILE_N]
SPAN = C.GEMM_SM90_SPAN_BYTES  # a stage's K and an output box's columns, in bytes (the 128-byte swizzle)
BOX = C.GEMM_SM90_BOX  # an M/N-major operand's TMA box edge (16-bit types only: 64 x 2 bytes, the span)
ITEMSIZE = {0: 4, 1: 2, 2: 2}  # rawops dtype code -> bytes an element
THREADS = C.GEMM_SM90_THREADS  # producer warpgroup + two consumer warpgroups


def shared_bytes(bn=TILE_N):
    """Shared<E, BN>: the stages of both operands, two 128 x 128-byte output staging buffers,
    the tile's bias (float32) and 2 x stages mbarriers, rounded up to 1024 bytes; + 1024 to
    align the dynamic shared memory base inside the kernel (at most 232448, all that sm_90
    gives a block). The same bytes for every type: a stage is 128 bytes of K."""
    stages = STAGES_OF[bn]
    return -(-(stages * (TILE_M + bn) * SPAN + 2 * TILE_M * SPAN + bn * 4 + 2 * stages * 8) // 1024) * 1024 + 1024


SHARED_BYTES = shared_bytes()
# From this many 128 x 256 output tiles per SM the widest tiles, unsplit, run; below it
# `narrow_shape` picks a narrower tile and a K split. (Between half a wave and one the model
# would pick 64-wide tiles for linear_gelu's dW at 8192 tokens, slower than the widest:
# docs/performance.md.)
MIN_TILES_PER_SM = 0.5
# Outputs of MIN_TILES_PER_SM or more take 256-wide tiles, or WIDE_ALTERNATIVE-wide ones where
# estimate_us puts those at least 1 - WIDE_MARGIN ahead: at many waves the 128-wide tile's per-FLOP
# cost is 2-8% over 256's (the swept 1024 <-> 4096 shapes), within the model's error. 64-wide tiles,
# which the model rates too fast at large K (768-wide wgrads: modelled 90 us, measured 115.5, the
# 256-wide tile 81.9; H100, dev/time_gemm_layouts.py --sweep), take only the narrow outputs.
WIDE_ALTERNATIVE = 128
WIDE_MARGIN = 0.95
MAX_SPLITS = 16
# K is split only for outputs of fewer 128 x 64 tiles an SM than this: the partials' round trip
# and gemm_reduce cost a few microseconds (REDUCE_US below), which only a GPU left mostly idle
# wins back (a 32 x 768 dx over K = 3072: 12 tiles).
SPLIT_BELOW_TILES_PER_SM = 0.25
KINDS = "bbbbbpqqqqpq"  # map_a, map_b, map_c, map_pre, map_a_tail, bias, m, n, k, flags, partial, splits
FLAG_PRE = C.GEMM_EPI_PRE  # flags bit: a pre-activation is stored (through map_pre)
EPI_BIAS_GELU_GRAD = C.GEMM_EPI_BIAS_GELU_GRAD
# rawops dtype code -> the CUtensorMap type of its operands. float32 operands are read as TF32
# (TF32_OPERANDS); c and the pre-activation are written as float32.
TF32_OPERANDS = TENSOR_MAP_TFLOAT32
MAP_TYPES = {0: TENSOR_MAP_FLOAT32, 1: TENSOR_MAP_FLOAT16, 2: TENSOR_MAP_BFLOAT16}
SUFFIXES = {0: "tf32", 1: "f16", 2: "bf16"}
TF32_LAYOUTS = ("nt",)


def entry_name(layout, dtype, bn=TILE_N):
    return f"gemm_sm90_{layout}_{SUFFIXES[dtype]}" + ("" if bn == TILE_N else f"_n{bn}")


# float32 at float32's accuracy (3xTF32: rawops/_gemm_tf32.py split3_plan): nt over the operands'
# split TF32 parts, K three times theirs, each stage's sums added by FADD; 128 and 64 wide (the
# promoted sums need the registers of a second accumulator).
SPLIT3_WIDTHS = (128, 64)


def split3_entry_name(bn):
    return f"gemm_sm90_nt_3xtf32_n{bn}"


GROUPED_LAYOUTS = ("nn", "nt")
GROUPED_KINDS = "bbbbpqqqqq"  # map_a, map_b, map_c, map_a_tail, offsets, groups, b_group_rows, m, n, k
GROUPED_TN_KINDS = "bbbpqqq"  # map_a, map_b, map_c, offsets, groups, m, n (the experts' weight gradients)


def grouped_entry_name(layout, dtype):
    return f"gemm_sm90_grouped_{layout}_{SUFFIXES[dtype]}"


def entry_points():
    kinds = [(layout, dtype) for layout in ("nn", "nt", "tn") for dtype in (1, 2)]
    kinds += [(layout, 0) for layout in TF32_LAYOUTS]
    names = [entry_name(layout, dtype, bn) for layout, dtype in kinds for bn in TILE_WIDTHS]
    names += [split3_entry_name(bn) for bn in SPLIT3_WIDTHS]
    names += [grouped_entry_name(layout, dtype) for layout in GROUPED_LAYOUTS + ("tn",) for dtype in (1, 2)]
    return sorted(names)


def tile_k(dtype):
    """K elements a stage (kBKOf<E>): 128 bytes of them."""
    return SPAN // ITEMSIZE[dtype]


def _ceil(a, b):
    return -(-a // b)


def a_tail_rows(m):
    """Rows of a K-major A's last tile-row box: those left of M, rounded up to 8 (the kernel's
    tail_rows)."""
    return _ceil(m - (_ceil(m, TILE_M) - 1) * TILE_M, 8) * 8


def operand_maps(layout, m, n, k, dtype=1, bn=TILE_N):
    """Each operand's matrix as the copy engine sees it, (inner, outer, box_inner, box_outer):
    a K-major operand is one (rows x 128 bytes of K) box per stage, an M/N-major one (16-bit
    types only) 64 x 64 boxes. (A K-major A's last tile-row has its own box: a_tail_rows.)"""
    bk = tile_k(dtype)
    a = (k, m, bk, TILE_M) if layout[0] == "n" else (m, k, BOX, BOX)
    b = (k, n, bk, bn) if layout[1] == "t" else (n, k, BOX, BOX)
    return a, b


# The cost model of narrow_shape (us), fitted to H100 timings of forced tile widths and splits
# (docs/performance.md): with one block an SM a work unit is bound by that SM's tensor pipe,
# UNIT_US + US_PER_MFLOP x its 128-row tile's MFLOP (TF32 at half the 16-bit rate), per wave of
# units; a K split adds gemm_reduce's launch and the partials' round trip.
UNIT_US, US_PER_MFLOP = 3.41, 0.198
REDUCE_US, REDUCE_US_PER_KB = 2.67, 0.00053


def estimate_us(m, n, k, dtype, bn, splits, sms):
    units = _ceil(m, TILE_M) * _ceil(n, bn) * splits
    mflop = 2 * TILE_M * bn * _ceil(k, splits) * (2 if dtype == 0 else 1) / 1e6
    us = _ceil(units, sms) * (UNIT_US + US_PER_MFLOP * mflop)
    if splits > 1:
        us += REDUCE_US + REDUCE_US_PER_KB * splits * m * n * 4 / 1e3
    return us


def narrow_shape(m, n, k, dtype, sms, widths=TILE_WIDTHS):
    """(BN, K splits) for an output of too few 128 x 256 tiles: the tile width (of `widths`) and
    split count with the least estimated time. K is split only below SPLIT_BELOW_TILES_PER_SM; every
    split gets at least one K stage, and split units fill at most one wave."""
    k_tiles = _ceil(k, tile_k(dtype))
    may_split = _ceil(m, TILE_M) * _ceil(n, TILE_WIDTHS[-1]) < SPLIT_BELOW_TILES_PER_SM * sms
    best = None
    for bn in widths:
        tiles = _ceil(m, TILE_M) * _ceil(n, bn)
        for splits in range(1, MAX_SPLITS + 1 if may_split and bn != TILE_N else 2):
            if splits > 1 and tiles * splits > sms:
                break
            if _ceil(k_tiles, _ceil(k_tiles, splits)) < splits:  # a split would be empty
                continue
            us = estimate_us(m, n, k, dtype, bn, splits, sms)
            if best is None or us < best[0]:
                best = (us, bn, splits)
    return best[1], best[2]


def plan(layout, dtype, m, n, k, cc, a_ptr, b_ptr, sms, built=True, flags=0, c_ptr=0, pre_ptr=0, split3=False):
    """(kernel name, grid, shared bytes, BN, K splits) of the Hopper GEMM, or None when it does
    not apply: not sm_90, not built, float32 in another layout than nt (dtype 0 means TF32:
    only rawops/_gemm_tf32.py asks for it), operands or outputs the copy engine cannot read or
    write (16-byte rows and pointers), k == 0, or the GELU-gradient epilogue (not compiled
    there). Outputs of at least MIN_TILES_PER_SM 128 x 256 tiles an SM take those tiles or 128-wide
    ones (where estimate_us puts them WIDE_MARGIN ahead), persistently, unsplit; fewer take narrow_shape's
    tile and split. split3: the 3xTF32 entries (float32
    nt, k = 3 x the parts' padded K), on SPLIT3_WIDTHS tiles only (128 where the rule above says
    256)."""
    if split3 and (dtype != 0 or layout != "nt"):
        return None
    if not built or cc != CC or dtype not in MAP_TYPES or m == 0 or n == 0 or k == 0:
        return None
    if flags & 3 == EPI_BIAS_GELU_GRAD or (dtype == 0 and layout not in TF32_LAYOUTS):
        return None
    (a_inner, *_), (b_inner, *_) = operand_maps(layout, m, n, k, dtype)
    per_row = 16 // ITEMSIZE[dtype]  # elements in 16 bytes
    if a_inner % per_row or b_inner % per_row or n % per_row or a_ptr % 16 or b_ptr % 16 or c_ptr % 16 or pre_ptr % 16:
        return None
    widths = SPLIT3_WIDTHS if split3 else TILE_WIDTHS
    if config.gemm_sm90_shape is not None:
        bn, splits = config.gemm_sm90_shape
        bn = min(bn, widths[0])
        k_tiles = _ceil(k, tile_k(dtype))
        splits = 1 if bn == TILE_N else _ceil(k_tiles, _ceil(k_tiles, min(splits, k_tiles)))  # none empty
    elif _ceil(m, TILE_M) * _ceil(n, TILE_N) >= MIN_TILES_PER_SM * sms:
        # Enough 256-wide tiles, but a last wave that leaves SMs idle (3 tiles across a 768-wide output:
        # 192 units on 132 SMs) can lose to 128-wide ones: those where the model says so by WIDE_MARGIN.
        bn, splits = widths[0], 1
        if not split3 and config.gemm_sm90_narrow:
            if estimate_us(m, n, k, dtype, WIDE_ALTERNATIVE, 1, sms) < WIDE_MARGIN * estimate_us(
                    m, n, k, dtype, TILE_N, 1, sms):
                bn = WIDE_ALTERNATIVE
    elif not config.gemm_sm90_narrow:
        return None
    else:
        bn, splits = narrow_shape(m, n, k, dtype, sms, widths)
    units = _ceil(m, TILE_M) * _ceil(n, bn) * splits
    name = split3_entry_name(bn) if split3 else entry_name(layout, dtype, bn)
    return name, (min(units, sms),), shared_bytes(bn), bn, splits


_built = {}


def built(device):
    """Whether this installation holds the Hopper kernels for `device` (checked once) and
    config.gemm_sm90 lets them run."""
    ok = _built.get(device)
    if ok is None:
        try:
            _modules.get_function(FAMILY, entry_points()[0], device)
            ok = True
        except _modules.FamilyUnavailable:
            ok = False
        _built[device] = ok
    return ok and config.gemm_sm90


def function(name, device, shared=SHARED_BYTES):
    return _modules.function_with_shared(FAMILY, name, device, shared)


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


_launch_maps = {}  # (layout, dtype, a, b, c, pre, m, n, k, BN, k_inner) -> the five maps of a launch


def launch_maps(layout, dtype, a, b, c, pre, m, n, k, bn, k_inner=None):
    """(map_a, map_b, map_c, map_pre, map_a_tail) of a launch: a repeated call finds them by one
    key (the eager torch path's host time; each map is also cached on its own). k_inner: the
    operands' K extent when it is not the kernel's k (the 3xTF32 parts: 2 kp beside k = 3 kp)."""
    if len(_launch_maps) > 1024:  # a long-running process sees many buffers: keep the cache bounded
        _launch_maps.clear()
    map_a, map_b = operand_maps(layout, m, n, k if k_inner is None else k_inner, dtype, bn)
    operands = TF32_OPERANDS if dtype == 0 else None
    box_c = SPAN // ITEMSIZE[dtype]
    map_c = tensor_map(c, dtype, n, m, box_c, TILE_M)  # written in 128-row x 128-byte boxes
    map_pre = tensor_map(pre, dtype, n, m, box_c, TILE_M) if pre else map_c
    a_full = tensor_map(a, dtype, *map_a, operands)
    a_tail = tensor_map(a, dtype, *map_a[:3], a_tail_rows(m), operands) if layout[0] == "n" else a_full
    return a_full, tensor_map(b, dtype, *map_b, operands), map_c, map_pre, a_tail


def launch_gemm(function_pointer, grid, shared, device, layout, dtype, a, b, c, bias, pre, m, n, k, flags, stream,
                bn=TILE_N, splits=1, workspace=None, k_inner=None):
    """c = epilogue(A B) by the Hopper kernel of `plan`. With splits > 1 the kernel writes
    float32 partials into `workspace(nbytes)` -> (pointer, owner) scratch and gemm_reduce adds
    them in order and applies the epilogue; the owner is returned (keep it until the launches
    are queued), else None. k_inner: as launch_maps."""
    key = (layout, dtype, a, b, c, pre, m, n, k, bn, k_inner)
    maps = _launch_maps.get(key)
    if maps is None:
        maps = _launch_maps[key] = launch_maps(layout, dtype, a, b, c, pre, m, n, k, bn, k_inner)
    if splits == 1:
        launch(function_pointer, grid, THREADS, shared, stream,
               maps + (bias, m, n, k, flags | (FLAG_PRE if pre else 0), 0, 1), KINDS, device)
        return None
    partial, owner = workspace(splits * m * n * 4)
    launch(function_pointer, grid, THREADS, shared, stream, maps + (0, m, n, k, 0, partial, splits), KINDS, device)
    reduce, reduce_grid = _gemm_reduce.function_and_grid(dtype, m, n, device)
    launch(reduce, reduce_grid, _gemm_reduce.THREADS, 0, stream,
           (partial, 0, c, bias, 0, pre, m, n, splits, flags), _gemm_reduce.KINDS, device)
    return owner


# ------------------------------------------------------------------------------ grouped (mixture of experts)
def grouped_maps(layout, dtype, a, b, c, groups, m, n, k):
    """(map_a, map_b, map_c, map_a_tail, b_group_rows) of a grouped launch: A (m, k) K-major, its
    rows the experts' groups padded to TILE_M rows; B the experts' matrices stacked, (groups n, k)
    K-major for nt (each expert's nn.Linear weight), (groups k, n) for nn; C (m, n)."""
    bk = tile_k(dtype)
    a_map = tensor_map(a, dtype, k, m, bk, TILE_M)
    if layout == "nt":
        b_map, rows = tensor_map(b, dtype, k, groups * n, bk, TILE_N), n
    else:
        b_map, rows = tensor_map(b, dtype, n, groups * k, BOX, BOX), k
    c_map = tensor_map(c, dtype, n, m, SPAN // ITEMSIZE[dtype], TILE_M)
    # the last tile-row's box as the kernel's tail_rows expects (its transaction bytes), as the dense path's
    a_tail = tensor_map(a, dtype, k, m, bk, a_tail_rows(m))
    return a_map, b_map, c_map, a_tail, rows


def grouped_check(layout, dtype, m, n, k, a, b, c, offsets):
    """None where the grouped kernel applies, else why not: 16-bit, nt or nn, 16-byte rows and pointers,
    m a whole number of tiles (the permuted rows padded to TILE_M: moe_permute(pad_to=TILE_M) with T k
    a multiple of TILE_M, or rows beyond offsets[E] counted in), k whole stages for nn (an expert's last
    stage must not read the next expert's rows)."""
    if dtype not in (1, 2) or layout not in GROUPED_LAYOUTS:
        return "float16 / bfloat16, layouts nt and nn only"
    if k % 8 or n % 8 or any(p % 16 for p in (a, b, c, offsets)):
        return "rows of whole 16-byte vectors and 16-byte aligned pointers"
    if layout == "nn" and k % tile_k(dtype):
        return f"nn: K a multiple of {tile_k(dtype)}"
    return None


def launch_grouped(function_pointer, sms, device, layout, dtype, a, b, c, offsets, groups, m, n, k, stream):
    """C[rows of expert e] = A[those rows] (op B_e), e over `groups` experts, by the grouped Hopper
    kernel (pointers; offsets int32 (groups + 1,) on the device, every group a multiple of TILE_M
    rows). One persistent block an SM over the (m / TILE_M) x (n / TILE_N) tiles."""
    map_a, map_b, map_c, map_tail, rows = grouped_maps(layout, dtype, a, b, c, groups, m, n, k)
    tiles = _ceil(m, TILE_M) * _ceil(n, TILE_N)
    launch(function_pointer, (max(1, min(tiles, sms)),), THREADS, SHARED_BYTES, stream,
           (map_a, map_b, map_c, map_tail, offsets, groups, rows, m, n, k), GROUPED_KINDS, device)


def grouped_wgrad_check(dtype, m, n, a, b, c, offsets):
    """None where the experts' weight-gradient kernel applies, else why not: 16-bit, m a multiple of
    TILE_M (an expert's matrix a whole number of tile-rows: its stores must not cross into the next),
    n whole 16-byte vectors, 16-byte aligned pointers."""
    if dtype not in (1, 2):
        return "float16 / bfloat16 only"
    if m % TILE_M:
        return f"the weight's rows a multiple of {TILE_M}"
    if n % 8 or any(p % 16 for p in (a, b, c, offsets)):
        return "rows of whole 16-byte vectors and 16-byte aligned pointers"
    return None


def launch_grouped_wgrad(function_pointer, sms, device, dtype, a, b, c, offsets, groups, rows, m, n, stream):
    """C_e (m, n) = A_e^T B_e for each expert e over its rows [offsets[e], offsets[e + 1]) of A (rows, m)
    and B (rows, n), C the experts' matrices stacked (groups m, n): one persistent block an SM over
    the (m / TILE_M) x (n / TILE_N) tiles of every expert."""
    map_a = tensor_map(a, dtype, m, rows, BOX, BOX)
    map_b = tensor_map(b, dtype, n, rows, BOX, BOX)
    map_c = tensor_map(c, dtype, n, groups * m, SPAN // ITEMSIZE[dtype], TILE_M)
    units = _ceil(m, TILE_M) * _ceil(n, TILE_N) * groups
    launch(function_pointer, (max(1, min(units, sms)),), THREADS, SHARED_BYTES, stream,
           (map_a, map_b, map_c, offsets, groups, m, n), GROUPED_TN_KINDS, device)
