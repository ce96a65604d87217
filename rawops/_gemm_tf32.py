"""The TF32 tensor-core GEMM (kernels/gemm_tf32.cu): float32 operands rounded to TF32
(10 mantissa bits) and multiplied on mma.sync m16n8k8 tensor cores, float32 accumulation,
sm_80+. The opt-in behind rawops.matmul(..., tf32=True) and the torch adapter's
matmul(..., tf32=True).

`plan` (pure, tested without a GPU) picks gemm_tf32_wide (128 x 256 tiles) for outputs that
fill the GPU with them on sm_80/90/100, else gemm_tf32 (128 x 128, split K when the tiles are
few), and takes what the kernels can: float32 on sm_80+, every
operand's contiguous dim % 4 == 0 (16-byte cp.async rows), N % 4 == 0 where b is N-major
(nn, tn: float4 stores of c), a, b and c 16-byte aligned. Everything else (odd sizes,
misaligned views, pre-sm_80 GPUs) gets None and its caller runs the exact FFMA kernels of
kernels/gemm.cu: more precise than asked, never wrong. Small outputs split K like the
half-type tensor-core GEMM, the partials summed in order by kernels/gemm.cu's gemm_reduce_f32.

On sm_90 every output the Hopper GEMM can take goes there instead (`hopper_plan`:
kernels/gemm_sm90.cu, WGMMA fed by TMA, ~3x mma.sync's rate; small outputs on its narrow
tiles and K splits). WGMMA reads TF32 operands
K-major only: nt (x @ W^T) runs as is, reading its operands as TF32 through the tensor maps;
an M/N-major operand (b in nn, a and b in tn) is first written transposed and rounded to TF32
(transpose_tf32_f32) into scratch from the caller's workspace (K x N floats for b, M x K for
a), then nt runs on the copies.

float32 without tf32 on sm_90 (config.f32_3xtf32, `split3_plan`): 3xTF32 at float32's accuracy.
Each operand v = big + small (both TF32, split_tf32_*: (rows, 2 kp) of scratch, K-major whatever
the layout), then gemm_sm90_nt_3xtf32_* sums small_a big_b + big_a small_b + big_a big_b over each
32-column stage and adds every stage's sums to its accumulators by FADD: summed inside the tensor
core over all of K, 3xTF32 measured 4-16x torch's float32 error on the H200 (the error linear in
K); promoted, 0.2-1.3x (docs/performance.md). Scratch: (M + N) x 2 kp floats and 1 + M + N flags.
An inf or NaN input: the splits mark its row of A or B, and split3_fixup_f32 sums every output of
a marked row or column again in exact float32 (a split's inf x 0 would give NaN where torch gives inf).
"""
from . import _constants as C
from ._launch import launch, sm_count
from . import _gemm_reduce, _gemm_sm90, _modules, config

FAMILY = "gemm_tf32"
LAYOUTS = ("nn", "nt", "tn")  # as rawops.matmul: b (K, N) | b given as (N, K) | a given as (K, M)
MIN_CC = 80  # mma.sync .tf32, cp.async
TILE, TILE_K, STAGES, THREADS = C.GEMM_TF32_TILE, C.GEMM_TF32_K, C.GEMM_TF32_STAGES, C.GEMM_TF32_THREADS
KMAJOR_STRIDE = TILE_K + C.GEMM_TF32_KMAJOR_PAD  # a K-major staged row; an M/N-major one is rows + MNMAJOR_PAD
MNMAJOR_PAD = C.GEMM_TF32_MNMAJOR_PAD
# gemm_tf32_wide: 128 x 256 tiles (warps of 64 x 64, one block per SM), WIDE_STAGES stages,
# 120 KB of shared memory: only where a block may have that much (sm_80, sm_90, sm_100), only
# for outputs of at least one 128 x 256 tile per SM (else the 128 x 128 kernel, split K), and
# only in nn (matmul's forward), the layout it runs faster (docs/performance.md).
WIDE_LAYOUTS = ("nn",)
WIDE_N, WIDE_STAGES = C.GEMM_TF32_WIDE_N, C.GEMM_TF32_WIDE_STAGES
WIDE_MIN_TILES_PER_SM = 1.0
WIDE_CCS = (80, 90, 100)
# Split K as rawops.matmul's tensor-core GEMM (mma_split_count): only for K >= SPLIT_MIN_K when
# the tiles would leave block slots (2 per SM) idle, aiming at ~3 waves.
SPLIT_MIN_K, SPLIT_CHUNK, MAX_SPLITS = 1024, 256, 16
MAX_BLOCKS, MAX_GRID_Y = 1 << 31, 65535
KINDS = "ppppppqqqq"  # (a, b, c, bias, aux, pre, m, n, k, flags): rawops.gemm.KINDS
HOPPER_LAYOUTS = ("nt", "nn", "tn")  # nn, tn through transposed copies of their M/N-major operands
# On sm_90 every size takes the Hopper kernel, on its narrow tiles and K splits where the output
# is small, operand copies included: all but tiny outputs run faster there than on mma.sync, and
# those lose little (docs/performance.md).
TRANSPOSE_KERNEL = "transpose_tf32_f32"
TRANSPOSE_THREADS, TRANSPOSE_TILE = C.GEMM_TF32_TRANSPOSE_THREADS, C.GEMM_TF32_TRANSPOSE_TILE
# float32 at float32's accuracy on sm_90 (config.f32_3xtf32; split3_plan): every operand split into
# TF32 parts (split_tf32_f32 for a K-major operand, split_tf32_transposed_f32 for an M/N-major one),
# K padded to SPLIT3_K (the Hopper kernel's float32 stage), then gemm_sm90_nt_3xtf32_* over K = 3 kp.
# Only for products of at least SPLIT3_MIN_FLOP (below, the exact kernels take a few microseconds:
# the split launches would not pay).
# Non-finite inputs: the splits mark the rows of A and B holding one (flags zeroed by FILL_KERNEL first)
# and FIXUP_KERNEL, queued behind the GEMM, sums the outputs they reach again in exact float32 (inf
# and NaN as torch's); without one its blocks return at once.
SPLIT_KERNELS = ("split_tf32_f32", "split_tf32_transposed_f32")
FILL_KERNEL, FIXUP_KERNEL = "fill_zero_u32", "split3_fixup_f32"
SPLIT_THREADS, SPLIT_MAX_ROWS_GRID = 256, 65535
FILL_MAX_BLOCKS, FIXUP_BLOCKS_PER_SM = 1024, 2
SPLIT3_K = 32
SPLIT3_MIN_FLOP = 1 << 30


def entry_points():
    """Every extern "C" kernel the fatbin must hold, on every architecture."""
    return sorted([f"gemm_tf32_{kind}{layout}_f32" for kind in ("", "wide_") for layout in LAYOUTS]
                  + [TRANSPOSE_KERNEL, *SPLIT_KERNELS, FILL_KERNEL, FIXUP_KERNEL])


def _ceil(a, b):
    return -(-a // b)


def shared_bytes(layout, bn=TILE, stages=STAGES):
    """Dynamic shared memory: `stages` stages of an A tile (128 rows of M, 16 of K) and a B tile
    (bn rows of N), each stored [rows][16 + 4] when K-contiguous, else [16][rows + 8]; 4-byte
    elements."""
    tile = lambda kmajor, rows: rows * KMAJOR_STRIDE if kmajor else TILE_K * (rows + MNMAJOR_PAD)  # noqa: E731
    return stages * (tile(layout[0] == "n", TILE) + tile(layout[1] == "t", bn)) * 4


def contiguous_dims(layout, m, n, k):
    """The length of the contiguous (innermost) dim of a and of b in this layout."""
    return (k if layout[0] == "n" else m), (k if layout[1] == "t" else n)


def split_count(blocks, k, sms):
    slots = 2 * sms
    if blocks >= slots or k < SPLIT_MIN_K:
        return 1
    return max(1, min(_ceil(3 * slots, blocks), k // SPLIT_CHUNK, MAX_SPLITS))


def plan(layout, m, n, k, cc, a_ptr, b_ptr, c_ptr, sms=132):
    """(kernel name, grid, block, dynamic shared bytes, K splits) of the TF32 GEMM for a float32
    C (m, n) = A B in `layout`, or None where it does not apply (the caller then runs the exact
    kernels): below sm_80, a contiguous dim % 4, N % 4 with b N-major, a pointer off 16 bytes,
    an empty output, or k == 0 (nothing to multiply)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if cc < MIN_CC or m <= 0 or n <= 0 or k <= 0:
        return None
    a_dim, b_dim = contiguous_dims(layout, m, n, k)
    # b_dim is N where b is N-major (nn, tn): then c's rows are whole float4 too (float4 stores).
    if a_dim % 4 or b_dim % 4 or a_ptr % 16 or b_ptr % 16 or c_ptr % 16:
        return None
    if _ceil(m, TILE) > MAX_GRID_Y or _ceil(n, TILE) * _ceil(m, TILE) >= MAX_BLOCKS:  # 32-bit tile order
        return None
    wide_tiles = _ceil(n, WIDE_N) * _ceil(m, TILE)
    if config.tf32_wide and layout in WIDE_LAYOUTS and cc in WIDE_CCS and wide_tiles >= WIDE_MIN_TILES_PER_SM * sms:
        return (f"gemm_tf32_wide_{layout}_f32", (_ceil(n, WIDE_N), _ceil(m, TILE)), THREADS,
                shared_bytes(layout, WIDE_N, WIDE_STAGES), 1)
    grid = (_ceil(n, TILE), _ceil(m, TILE))
    splits = split_count(grid[0] * grid[1], k, sms)
    if splits > 1:
        grid = grid + (splits,)
    return f"gemm_tf32_{layout}_f32", grid, THREADS, shared_bytes(layout), splits


def hopper_plan(layout, m, n, k, cc, a_ptr, b_ptr, c_ptr, sms=132, built=True, flags=0, pre_ptr=0):
    """(kernel name, grid, shared bytes, BN, K splits, (transpose a, transpose b)) of the Hopper
    TF32 GEMM, or None: nt as _gemm_sm90.plan takes it; in nn and tn the M/N-major operands are
    transposed into fresh scratch first (their own alignment then does not matter; K % 4 and
    N % 4 still do). K past 65535 x 64 with a transpose stays on mma.sync (its grid.y)."""
    if not config.tf32_sm90 or layout not in HOPPER_LAYOUTS:
        return None
    transpose = (layout[0] == "t", layout[1] == "n")
    if any(transpose) and _ceil(k, TRANSPOSE_TILE) > MAX_GRID_Y:  # both copies have K / 64 block rows
        return None
    found = _gemm_sm90.plan("nt", 0, m, n, k, cc, 0 if transpose[0] else a_ptr, 0 if transpose[1] else b_ptr, sms,
                            built, flags, c_ptr, pre_ptr)
    return None if found is None else (*found, transpose)


def transpose_grid(rows, cols):
    return (_ceil(cols, TRANSPOSE_TILE), _ceil(rows, TRANSPOSE_TILE))


def split3_plan(layout, m, n, k, cc, c_ptr, pre_ptr, sms=132, built=True, flags=0):
    """(kernel name, grid, shared bytes, BN, K splits, kp) of float32 C = A B at float32's accuracy on
    the Hopper tensor cores (3xTF32, each stage's sums promoted), or None (the caller runs the exact
    kernels): config.f32_3xtf32 off, not sm_90, fewer than SPLIT3_MIN_FLOP, N % 4 or c / pre off 16
    bytes (the TMA store), or what _gemm_sm90.plan refuses (the GELU-gradient epilogue). The operands'
    layout and alignment do not matter: the split kernels read them as they are."""
    if not config.f32_3xtf32 or layout not in LAYOUTS or cc != _gemm_sm90.CC or 2 * m * n * k < SPLIT3_MIN_FLOP:
        return None
    kp = _ceil(k, SPLIT3_K) * SPLIT3_K
    if _ceil(kp, TRANSPOSE_TILE) > MAX_GRID_Y:
        return None
    found = _gemm_sm90.plan("nt", 0, m, n, 3 * kp, cc, 0, 0, sms, built, flags, c_ptr, pre_ptr, split3=True)
    return None if found is None else (*found, kp)


def split_launch(layout_char_kmajor, rows, k, kp):
    """(kernel index in SPLIT_KERNELS, grid) of one operand's split: rows x k (K-major: in (rows, k))
    or, M/N-major, in (k, rows)."""
    if layout_char_kmajor:
        return 0, (_ceil(kp, SPLIT_THREADS), min(rows, SPLIT_MAX_ROWS_GRID))
    return 1, (_ceil(rows, TRANSPOSE_TILE), _ceil(kp, TRANSPOSE_TILE))


# ------------------------------------------------------------------------------ launches on raw pointers
_plans = {}  # (layout, m, n, k, a, b, c 16-byte aligned, device, ..., config generation) -> launch, or None
compute_capability = _modules.compute_capability  # module-level: tests replace it here


def _function(name, device, shared):
    return _modules.function_with_shared(FAMILY, name, device, shared)


def _launch_plan(layout, m, n, k, a, b, c, device, flags=0, pre=0):
    key = (layout, m, n, k, a % 16 == 0, b % 16 == 0, c % 16 == 0, device, flags & 3, pre % 16 == 0,
           config._generation)
    if key in _plans:
        return _plans[key]
    sms = sm_count(device)
    cc = compute_capability(device)
    hopper = hopper_plan(layout, m, n, k, cc, a, b, c, sms, _gemm_sm90.built(device), flags, pre)
    if hopper is not None:
        name, grid, shared, bn, splits, transpose = hopper
        found = None
        cached = ("hopper", _gemm_sm90.function(name, device, shared), grid, shared, transpose,
                  _modules.function_pointer(FAMILY, TRANSPOSE_KERNEL, device) if any(transpose) else 0, (bn, splits))
    else:
        found = plan(layout, m, n, k, cc, a, b, c, sms)
        cached = None
    if found is not None:
        name, grid, block, shared, splits = found
        reduce = None
        if splits > 1:
            reduce = _gemm_reduce.function_and_grid(0, m, n, device)
        cached = ("mma", _function(name, device, shared), grid, block, shared, splits, reduce)
    if len(_plans) > 4096:  # shapes of a long-running process: keep the cache bounded
        _plans.clear()
    _plans[key] = cached
    return cached


_split3_plans = {}  # (layout, m, n, k, c, pre 16-byte aligned, device, epilogue, generation) -> launch, or None


def split3_launch_plan(layout, m, n, k, c, device, cc, sms, flags=0, pre=0):
    """split3_plan's launch (functions and grids) on `device` (compute capability cc, sms SMs),
    cached per shape, or None."""
    if not config.f32_3xtf32 or cc != _gemm_sm90.CC or 2 * m * n * k < SPLIT3_MIN_FLOP:
        return None  # small products never load the Hopper module to ask
    key = (layout, m, n, k, c % 16 == 0, pre % 16 == 0, device, flags & 3, config._generation)
    if key in _split3_plans:
        return _split3_plans[key]
    found = split3_plan(layout, m, n, k, cc, c, pre, sms, _gemm_sm90.built(device), flags)
    cached = None
    if found is not None:
        name, grid, shared, bn, splits, kp = found
        helpers = tuple(_modules.function_pointer(FAMILY, kernel, device)
                        for kernel in (*SPLIT_KERNELS, FILL_KERNEL, FIXUP_KERNEL))
        cached = (_gemm_sm90.function(name, device, shared), grid, shared, bn, splits, kp, helpers, sms)
    if len(_split3_plans) > 4096:
        _split3_plans.clear()
    _split3_plans[key] = cached
    return cached


def launch_split3(device, layout, a, b, c, bias, pre, m, n, k, flags, stream, workspace, found):
    """c (m, n) = epilogue(A B) at float32's accuracy by split3_launch_plan's `found`: the flags
    zeroed, A and B split into TF32 parts in one scratch from `workspace` ((m + n) x 2 kp floats and
    1 + m + n flags), the 3xTF32 Hopper GEMM, then the fixup of outputs that non-finite inputs reach.
    Returns the scratch's owners (keep them until the launches are queued)."""
    function, grid, shared, bn, splits, kp, (*splitters, fill, fixup), sms = found
    # One scratch: A's parts, B's parts (rows of 2 kp floats: whole 256 bytes, so B's stay aligned
    # for the tensor maps), then the flags: any, A's rows, B's rows.
    a2, owner = workspace((m + n) * 2 * kp * 4 + (1 + m + n) * 4)
    b2 = a2 + m * 2 * kp * 4
    marks = b2 + n * 2 * kp * 4
    count = 1 + m + n
    launch(fill, (min(_ceil(count, SPLIT_THREADS), FILL_MAX_BLOCKS),), SPLIT_THREADS, 0, stream, (marks, count), "pq",
           device)
    for source, part, rows, kmajor, row_marks in ((a, a2, m, layout[0] == "n", marks + 4),
                                                  (b, b2, n, layout[1] == "t", marks + 4 + 4 * m)):
        which, split_grid = split_launch(kmajor, rows, k, kp)
        launch(splitters[which], split_grid, SPLIT_THREADS if which == 0 else TRANSPOSE_THREADS, 0, stream,
               (source, part, rows, k, kp, row_marks, marks), "ppqqqpp", device)
    owner_c = _gemm_sm90.launch_gemm(function, grid, shared, device, "nt", 0, a2, b2, c, bias, pre, m, n, 3 * kp,
                                     flags, stream, bn, splits, workspace, k_inner=2 * kp)
    kmajor_bits = (layout[0] == "n") | (layout[1] == "t") << 1
    launch(fixup, (FIXUP_BLOCKS_PER_SM * sms,), SPLIT_THREADS, 0, stream,
           (a, b, c, bias, pre, m, n, k, flags, kmajor_bits, marks + 4, marks + 4 + 4 * m, marks), "pppppqqqqqppp",
           device)
    return owner, owner_c


def _copy_transposed(function, source, rows, cols, stream, device, workspace):
    """(pointer, owner) of source (rows x cols floats) transposed and rounded to TF32 in scratch."""
    copy, owner = workspace(rows * cols * 4)
    launch(function, transpose_grid(rows, cols), TRANSPOSE_THREADS, 0, stream, (source, copy, rows, cols), "ppqq",
           device)
    return copy, owner


def launch_gemm(device, layout, a, b, c, bias, aux, pre, m, n, k, flags, stream, workspace):
    """c (m, n) = epilogue(tf32(A) tf32(B)) for float32 pointers checked by the caller, as
    rawops.gemm.launch_gemm. Returns (taken, owner): taken False when `plan` refuses the
    shape (nothing launched: the caller runs the exact kernel); owner keeps split-K scratch
    from `workspace(nbytes)` alive until the launches are queued."""
    found = _launch_plan(layout, m, n, k, a, b, c, device, flags, pre)
    if found is None:
        return False, None
    if found[0] == "hopper":
        _, function, grid, shared, (transpose_a, transpose_b), transpose_function, (bn, splits) = found
        owner_a = owner_b = None
        # WGMMA reads TF32 operands K-major only: a (K x M) -> (M x K), b (K x N) -> (N x K).
        if transpose_a:
            a, owner_a = _copy_transposed(transpose_function, a, k, m, stream, device, workspace)
        if transpose_b:
            b, owner_b = _copy_transposed(transpose_function, b, k, n, stream, device, workspace)
        owner_c = _gemm_sm90.launch_gemm(function, grid, shared, device, "nt", 0, a, b, c, bias, pre, m, n, k, flags,
                                         stream, bn, splits, workspace)
        return True, (owner_a, owner_b, owner_c)
    _, function, grid, block, shared, splits, reduce = found
    if splits == 1:
        launch(function, grid, block, shared, stream, (a, b, c, bias, aux, pre, m, n, k, flags), KINDS, device)
        return True, None
    partial, owner = workspace(splits * m * n * 4)
    launch(function, grid, block, shared, stream, (a, b, partial, 0, 0, 0, m, n, k, 0), KINDS, device)
    launch(reduce[0], reduce[1], _gemm_reduce.THREADS, 0, stream, (partial, 0, c, bias, aux, pre, m, n, splits, flags),
           _gemm_reduce.KINDS, device)
    return True, owner
