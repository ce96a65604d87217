"""The matrix family: matmul and linear_gelu (Linear + bias + GELU in one kernel), forward
and backward. Kernels: kernels/gemm.cu (the general kernels and the split-K reduction) and
kernels/gemm_small.cu (small batches), each its own fatbin (`family_of`); TF32 and Hopper in
rawops/_gemm_tf32.py and rawops/_gemm_sm90.py. Shapes shared with the kernels come from
rawops/_constants.py.

matmul(a, b)                       a (M, K) @ b (K, N)
linear_gelu(x, weight, bias)       gelu(x @ weight.T + bias), weight in torch.nn.Linear layout
linear_gelu_backward(dy, x, ...)   (dx, dweight, dbias)

float32 runs at float32's accuracy: on sm_90, products of >= 2^30 FLOP as 3xTF32 with promoted sums
(rawops/_gemm_tf32.py split3_plan; rawops.config.f32_3xtf32 = False: FFMA), the rest exact float32
math (FFMA, no tensor cores), unless matmul's `tf32=True` asks for
TF32 tensor cores (rawops/_gemm_tf32.py: kernels/gemm_tf32.cu, or kernels/gemm_sm90.cu on
sm_90), or rawops.config.linear_tf32 = True lets float32 linear_gelu's forward at <= SMALL_MAX_M
rows on sm_90+ run 3xTF32 (three TF32 products per term: near float32's error, up to ~3x torch's
at one row); float16 / bfloat16 run tensor cores
with float32 accumulation where the operands allow 16-byte loads (on sm_90 the WGMMA + TMA
kernel of rawops/_gemm_sm90.py, whose tile width and K split follow the output's size; x @ W^T
at <= 32 rows the small-batch kernel; else mma.sync, sm_80+), else the same FFMA kernel. Every
launch goes through `launch_gemm` on raw pointers, which picks the kernel (`plan`, a pure
function tested without a GPU); the torch adapter calls it too.
"""
from ._launch import (FLOAT_SUFFIXES, NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, require_str,
                      sm_count, stream_pointer, wait_for_producer)
from . import _constants as C
from . import _gemm_sm90, _gemm_tf32, _modules, _rows, config
from ._gemm_reduce import THREADS as REDUCE_THREADS, function_and_grid as reduce_function_and_grid

FAMILY = "gemm"  # kernels/gemm.cu: gemm_simt*, gemm_mma*, gemm_reduce*
SMALL_FAMILY = "gemm_small"  # kernels/gemm_small.cu: linear_small*, gemm_small_m_nn
LAYOUTS = ("nn", "nt", "tn")  # b (K, N) | b given as (N, K) | a given as (K, M)
MMA_SUFFIXES = ("f16", "bf16")
# Every entry point has the same parameters (RAWOPS_GEMM_ARGS, kernels/include/rawops/gemm_epilogue.cuh).
ARGS = ("a", "b", "c", "bias", "aux", "pre", "m", "n", "k", "flags")
KINDS = "ppppppqqqq"

SIMT_TILE, SIMT_THREADS = C.GEMM_SIMT_TILE, C.GEMM_SIMT_THREADS  # gemm_simt and gemm_simt_vec
SIMT_VEC_K = C.GEMM_SIMT_VEC_K  # gemm_simt_vec's K tile
# gemm_small_m_nn (float32 nn with <= SMALL_M_ROWS rows and whole float4 rows: linear_gelu's dx at
# small batch): blocks of SMALL_M_ROWS x SMALL_M_COLS outputs, SMALL_M_THREADS threads, split K
# into chunks of at least SMALL_M_MIN_K aiming at SMALL_M_SLOTS blocks an SM.
SMALL_M_ROWS, SMALL_M_COLS, SMALL_M_THREADS = C.GEMM_SMALL_M_ROWS, C.GEMM_SMALL_M_COLS, C.GEMM_SMALL_M_THREADS
SMALL_M_MIN_K, SMALL_M_SLOTS = 64, 3
MMA_TILE, MMA_K, MMA_STAGES, MMA_THREADS = C.GEMM_MMA_TILE, C.GEMM_MMA_K, C.GEMM_MMA_STAGES, C.GEMM_MMA_THREADS
KMAJOR_STRIDE = MMA_K + C.GEMM_MMA_PAD  # a K-major staged row; an M/N-major one is rows + GEMM_MMA_PAD
# linear_small: SMALL_FEATURES x SMALL_GROUPS threads, SMALL_ROWS rows per blockIdx.y, x staged
# SMALL_K columns at a time in dynamic shared memory (cp.async: sm_80+).
SMALL_FEATURES, SMALL_GROUPS, SMALL_ROWS, SMALL_K = (C.GEMM_SMALL_FEATURES, C.GEMM_SMALL_GROUPS, C.GEMM_SMALL_ROWS,
                                                     C.GEMM_SMALL_K)
SMALL_THREADS = SMALL_FEATURES * SMALL_GROUPS
SMALL_MIN_CC = 80
SMALL_MAX_M = 128  # linear_small re-reads W (from L2) once per 32 rows: worth it up to here
# linear_small_tf32 (sm_90+, float32 linear_gelu forward only, 3xTF32 on the tensor pipe): a
# CTA (a cluster of SMALL_TF32_CLUSTER CTAs; 1 ships) owns SMALL_TF32_FEATURES features, its
# SMALL_TF32_WARPS warps splitting K.
SMALL_TF32_CLUSTER, SMALL_TF32_TILES, SMALL_TF32_WARPS = (C.GEMM_SMALL_TF32_CLUSTER, C.GEMM_SMALL_TF32_TILES,
                                                          C.GEMM_SMALL_TF32_WARPS)
SMALL_TF32_FEATURES = SMALL_TF32_TILES * 8
SMALL_TF32_THREADS = 32 * SMALL_TF32_WARPS
SMALL_TF32_MIN_CC = 90  # thread-block clusters
# linear_small_mma (sm_90+, float16 / bfloat16 x @ W^T at <= SMALL_MAX_M rows): linear_small_tf32's
# kernel with one m16n8k16 mma a product, SMALL_MMA_TILES n8 tiles (features / 8) a CTA and
# SMALL_MMA_WARPS warps splitting K.
SMALL_MMA_TILES, SMALL_MMA_WARPS = C.GEMM_SMALL_MMA_TILES, C.GEMM_SMALL_MMA_WARPS
SMALL_MMA_FEATURES = SMALL_MMA_TILES * 8
# On sm_90 x @ W^T of at most this many rows takes linear_small_mma before the Hopper GEMM: one
# 32-row block reads W once, where a 128-row WGMMA tile computes 3/4 padding; from 64 rows the
# Hopper GEMM is the faster (docs/performance.md).
SMALL_MMA_BEFORE_HOPPER_M = 32
SMALL_MMA_THREADS = 32 * SMALL_MMA_WARPS
# config.linear_tf32 lets float32 linear_gelu at <= SMALL_MAX_M rows run linear_small_tf32 (3xTF32,
# float32-level error); off, exact FFMA everywhere. matmul (and every other GEMM) never takes it.
MAX_GRID_Y = 65535
MMA_MIN_CC = 80
# Split K (+ gemm_reduce) when the output has too few tiles to fill the GPU. FFMA: at least
# SPLIT_MIN_K of K per split, at most MAX_SPLITS, about 2 blocks per SM. Tensor cores: only
# for K >= MMA_SPLIT_MIN_K (the linear backward's dW = dpre^T x at 8192 tokens: 144 tiles of
# 128 x 128 would fill half of the H100's 264 block slots), aiming at ~3 waves.
SPLIT_MIN_K, MAX_SPLITS = 128, 64
# float32 FFMA: no thread sums more than FFMA_CHAIN_K products in one register chain (K split
# further, while the float32 partials fit CHAIN_SPLIT_BYTES): a sequential float32 sum over K =
# 3072 or 4096 had 2.4-2.6x torch's error (H200, tests/test_float32_accuracy.py), at K <= 1024
# within it.
FFMA_CHAIN_K, CHAIN_SPLIT_BYTES = 1024, 256 << 20
MMA_SPLIT_MIN_K, MMA_SPLIT_CHUNK, MMA_MAX_SPLITS = 1024, 256, 16

EPI_NONE, EPI_BIAS_GELU, EPI_BIAS_GELU_GRAD, EPI_BIAS = (C.GEMM_EPI_NONE, C.GEMM_EPI_BIAS_GELU,
                                                     C.GEMM_EPI_BIAS_GELU_GRAD, C.GEMM_EPI_BIAS)
EPI_ERF = C.GEMM_EPI_ERF
GELU_FLAGS = {"tanh": 0, "none": EPI_ERF}


def entry_points(family=FAMILY):
    """Every extern "C" kernel the fatbin of `family` (FAMILY or SMALL_FAMILY) must hold, on
    every architecture."""
    if family == SMALL_FAMILY:
        names = [f"linear_small_nt_{s}" for s in FLOAT_SUFFIXES] + ["linear_small_tf32_nt_f32", "gemm_small_m_nn_f32"]
        names += [f"linear_small_mma_nt_{s}" for s in MMA_SUFFIXES]
        return sorted(names)
    names = [f"gemm_simt_{layout}_{s}" for layout in LAYOUTS for s in FLOAT_SUFFIXES]
    names += [f"gemm_simt_vec_{layout}_f32" for layout in LAYOUTS]
    names += [f"gemm_reduce_{s}" for s in FLOAT_SUFFIXES]
    names += [f"gemm_mma_{layout}_{s}" for layout in LAYOUTS for s in MMA_SUFFIXES]
    return sorted(names)


def family_of(name):
    """The fatbin holding kernel `name`: SMALL_FAMILY for the small-batch kernels, else FAMILY."""
    return SMALL_FAMILY if name.startswith(("linear_small", "gemm_small")) else FAMILY


def gelu_flags(approximate):
    require_str(approximate, "approximate")
    flags = GELU_FLAGS.get(approximate)
    if flags is None:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return flags


# ------------------------------------------------------------------------------ launch plan (pure)
def _ceil(a, b):
    return -(-a // b)


def mma_shared_bytes(layout, bn=MMA_TILE):
    """Dynamic shared memory of gemm_mma in `layout`: MMA_STAGES stages of an A tile (128
    rows) and a B tile (bn rows), each stored [rows][32 + 8] when K-contiguous, else
    [32][rows + 8]; 2-byte elements."""
    a_kmajor, b_kmajor = layout[0] == "n", layout[1] == "t"
    tile = lambda kmajor, rows: rows * KMAJOR_STRIDE if kmajor else MMA_K * (rows + C.GEMM_MMA_PAD)  # noqa: E731
    return MMA_STAGES * (tile(a_kmajor, MMA_TILE) + tile(b_kmajor, bn)) * 2


def small_shared_bytes(itemsize):
    """linear_small's dynamic shared memory: one chunk of x, SMALL_ROWS x SMALL_K elements
    (also holds the SMALL_GROUPS x SMALL_ROWS x SMALL_FEATURES float32 partial sums)."""
    return SMALL_ROWS * SMALL_K * itemsize


def small_tf32_shared_bytes(warps=SMALL_TF32_WARPS, f=SMALL_TF32_FEATURES):
    """linear_small_tf32's (and linear_small_mma's) dynamic shared memory: a float32 partial
    tile of SMALL_ROWS rows x f features per warp along K, rows padded to a 32-bank-clean
    stride (kernels/gemm_small.cu: SmallTf32::kStride)."""
    stride = f + 16 if f % 32 == 24 else f + 8
    return warps * SMALL_ROWS * stride * 4


def contiguous_dims(layout, m, n, k):
    """The length of the contiguous (innermost) dim of a and of b in this layout."""
    return (k if layout[0] == "n" else m), (k if layout[1] == "t" else n)


def split_count(blocks, k, sms):
    """K splits for an FFMA launch of `blocks` tiles: 1 unless the tiles leave the GPU idle."""
    if blocks >= sms or k < 2 * SPLIT_MIN_K:
        return 1
    return max(1, min(_ceil(2 * sms, blocks), k // SPLIT_MIN_K, MAX_SPLITS))


def chain_split_count(m, n, k):
    """float32 FFMA K splits so that no register chain sums more than FFMA_CHAIN_K of K, at most
    MAX_SPLITS and as many as keep the partials (splits x m x n float32) within CHAIN_SPLIT_BYTES."""
    return max(1, min(_ceil(k, FFMA_CHAIN_K), MAX_SPLITS, CHAIN_SPLIT_BYTES // max(1, 4 * m * n)))


def small_m_split_count(blocks, k, sms):
    """K splits for gemm_small_m_nn's `blocks` column blocks: about SMALL_M_SLOTS blocks an SM."""
    return max(1, min(_ceil(SMALL_M_SLOTS * sms, blocks), k // SMALL_M_MIN_K, MAX_SPLITS))


def mma_split_count(blocks, k, sms):
    """K splits for a tensor-core launch of `blocks` tiles (2 resident per SM)."""
    slots = 2 * sms
    if blocks >= slots or k < MMA_SPLIT_MIN_K:
        return 1
    return max(1, min(_ceil(3 * slots, blocks), k // MMA_SPLIT_CHUNK, MMA_MAX_SPLITS))


def vector_ffma(layout, dtype, m, n, k, a_ptr, b_ptr, c_ptr):
    """Whether gemm_simt_vec may run: float32 with every row of a, b and c a whole number of
    16-byte vectors (contiguous dims and N % 4 == 0, pointers 16-byte aligned)."""
    a_dim, b_dim = contiguous_dims(layout, m, n, k)
    return (dtype == 0 and a_dim % 4 == 0 and b_dim % 4 == 0 and n % 4 == 0
            and a_ptr % 16 == 0 and b_ptr % 16 == 0 and c_ptr % 16 == 0)


def plan(layout, dtype, m, n, k, cc, a_ptr, b_ptr, sms=132, c_ptr=0, tf32_linear=False):
    """(kernel name, grid, block, dynamic shared bytes, K splits) of C (m, n) = A B in `layout`.

    `tf32_linear`: the caller is float32 linear_gelu's forward with config.linear_tf32 on; then x @ W^T
    with at most SMALL_MAX_M rows and 16-byte rows on sm_90+ runs linear_small_tf32 (3xTF32).
    Half types there run linear_small_mma (the same kernel, one mma a product) on sm_90+.
    Else linear_small for x @ W^T with at most SMALL_MAX_M rows and 16-byte rows on sm_80+; tensor cores
    for half types on sm_80+ when both operands allow 16-byte loads; float32 with 16-byte
    rows everywhere gemm_simt_vec (float4 loads, BK = 16), or gemm_small_m_nn for nn with at most
    SMALL_M_ROWS rows; else the FFMA kernel gemm_simt.
    Either GEMM is split along K (then gemm_reduce applies the epilogue) when its tiles
    would leave SMs idle; float32 FFMA also where K is longer than FFMA_CHAIN_K
    (chain_split_count)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    suffix = FLOAT_SUFFIXES[dtype]
    itemsize = 4 if dtype == 0 else 2
    vector = 16 // itemsize
    splits = 1
    small = (layout == "nt" and m <= SMALL_MAX_M and cc >= SMALL_MIN_CC and k % vector == 0 and a_ptr % 16 == 0
             and b_ptr % 16 == 0)
    if small and tf32_linear and dtype == 0 and cc >= SMALL_TF32_MIN_CC:
        name, grid, block, shared = ("linear_small_tf32_nt_f32",
                                     (SMALL_TF32_CLUSTER * _ceil(n, SMALL_TF32_FEATURES), _ceil(m, SMALL_ROWS)),
                                     SMALL_TF32_THREADS, small_tf32_shared_bytes())
    elif small and dtype != 0 and cc >= SMALL_TF32_MIN_CC:
        name, grid, block, shared = (f"linear_small_mma_nt_{suffix}",
                                     (_ceil(n, SMALL_MMA_FEATURES), _ceil(m, SMALL_ROWS)),
                                     SMALL_MMA_THREADS, small_tf32_shared_bytes(SMALL_MMA_WARPS, SMALL_MMA_FEATURES))
    elif small:
        name, grid, block, shared = (f"linear_small_nt_{suffix}", (_ceil(n, SMALL_FEATURES), _ceil(m, SMALL_ROWS)),
                                     SMALL_THREADS, small_shared_bytes(itemsize))
    else:
        a_dim, b_dim = contiguous_dims(layout, m, n, k)
        if (dtype != 0 and cc >= MMA_MIN_CC and a_dim % 8 == 0 and b_dim % 8 == 0
                and a_ptr % 16 == 0 and b_ptr % 16 == 0):
            name, block, shared = f"gemm_mma_{layout}_{suffix}", MMA_THREADS, mma_shared_bytes(layout)
            grid = (_ceil(n, MMA_TILE), _ceil(m, MMA_TILE))
            splits = mma_split_count(grid[0] * grid[1], k, sms)
        elif layout == "nn" and m <= SMALL_M_ROWS and vector_ffma(layout, dtype, m, n, k, a_ptr, b_ptr, c_ptr):
            name, block, shared = "gemm_small_m_nn_f32", SMALL_M_THREADS, 0
            grid = (_ceil(n, SMALL_M_COLS), 1)
            splits = small_m_split_count(grid[0], k, sms)
        else:
            vec = vector_ffma(layout, dtype, m, n, k, a_ptr, b_ptr, c_ptr)
            name, block, shared = f"gemm_simt_{'vec_' if vec else ''}{layout}_{suffix}", SIMT_THREADS, 0
            grid = (_ceil(n, SIMT_TILE), _ceil(m, SIMT_TILE))
            splits = split_count(grid[0] * grid[1], k, sms)
            if dtype == 0:
                splits = max(splits, chain_split_count(m, n, k))
        if splits > 1:
            grid = grid + (splits,)
    if grid[1] > MAX_GRID_Y or grid[0] > _rows.MAX_GRID:
        raise ValueError(f"a {m} x {n} output exceeds one launch's grid")
    return name, grid, block, shared, splits


# ------------------------------------------------------------------------------ launches on raw pointers
compute_capability = _modules.compute_capability  # module-level: tests replace it here


def _function(name, device, shared):
    return _modules.function_with_shared(family_of(name), name, device, shared)


# (layout, dtype, m, n, k, a, b, c 16-byte aligned, device, gelu-gradient, pre aligned, tf32_linear,
#  config generation) -> launch
_plans = {}


def _launch_plan(layout, dtype, m, n, k, a, b, device, flags=EPI_NONE, c=0, pre=0):
    tf32_linear = flags & 3 == EPI_BIAS_GELU and config.linear_tf32
    key = (layout, dtype, m, n, k, a % 16 == 0, b % 16 == 0, c % 16 == 0, device,
           flags & 3 == EPI_BIAS_GELU_GRAD, pre % 16 == 0, tf32_linear, config._generation)
    cached = _plans.get(key)
    if cached is None:
        sms = sm_count(device)
        cc = compute_capability(device)
        if dtype == 0 and not (tf32_linear and m <= SMALL_MAX_M):
            found = _gemm_tf32.split3_launch_plan(layout, m, n, k, c, device, cc, sms, flags, pre)
            if found is not None:  # splits -1 marks the 3xTF32 Hopper GEMM, extra its launch
                cached = _plans[key] = (0, (0, 0, 0), 0, 0, -1, found)
                return cached
        if dtype != 0 and cc == _gemm_sm90.CC and not (layout == "nt" and m <= SMALL_MMA_BEFORE_HOPPER_M):
            hopper = _gemm_sm90.plan(layout, dtype, m, n, k, cc, a, b, sms, _gemm_sm90.built(device), flags, c, pre)
            if hopper is not None:  # splits == 0 marks the Hopper kernel (other arguments), then (BN, splits)
                name, grid, shared, bn, splits = hopper
                cached = _plans[key] = (_gemm_sm90.function(name, device, shared), grid, _gemm_sm90.THREADS, shared,
                                        0, (bn, splits))
                return cached
        name, grid, block, shared, splits = plan(layout, dtype, m, n, k, cc, a, b, sms, c, tf32_linear)
        reduce = None
        if splits > 1:
            reduce = reduce_function_and_grid(dtype, m, n, device)
        if len(_plans) > 4096:  # shapes of a long-running process: keep the cache bounded
            _plans.clear()
        cached = _plans[key] = (_function(name, device, shared), grid, block, shared, splits, reduce)
    return cached


def linear_launch_plan(layout, dtype, m, n, k, a, b, c, device, flags):
    """(function pointer, grid, block, shared, splits, extra) of a launch with epilogue `flags`
    (linear_gelu's bias + GELU: config.linear_tf32 applies), cached per shape: the torch adapter's
    Cython fast path (_launch.torch_linear) asks for it on a cache miss. splits 0 is the Hopper
    GEMM, extra then its (BN, K splits); -1 float32 as 3xTF32 there (extra: its launch, which only
    launch_gemm makes); else extra is the split-K reduce launch or None."""
    return _launch_plan(layout, dtype, m, n, k, a, b, device, flags, c)


def launch_gemm(device, layout, dtype, a, b, c, bias, aux, pre, m, n, k, flags, stream, workspace):
    """c (m, n) = epilogue(A B) on pointers checked by the caller (one dtype, C-contiguous,
    one device; bias/aux/pre 0 when absent). Nothing to do when m or n is 0; k == 0 gives
    epilogue(0). `workspace(nbytes)` -> (pointer, owner) allocates stream-ordered scratch
    for split-K partials; the owner is returned (keep it until the launches are queued).
    The plan is cached per shape: a repeated call costs a dict lookup and the launch."""
    if m == 0 or n == 0:
        return None
    function, grid, block, shared, splits, reduce = _launch_plan(layout, dtype, m, n, k, a, b, device, flags, c, pre)
    if splits == -1:  # float32 as 3xTF32 on the Hopper kernel: reduce holds its launch
        return _gemm_tf32.launch_split3(device, layout, a, b, c, bias, pre, m, n, k, flags, stream, workspace, reduce)
    if splits == 0:  # the Hopper kernel: reduce holds its (BN, K splits)
        return _gemm_sm90.launch_gemm(function, grid, shared, device, layout, dtype, a, b, c, bias, pre, m, n, k,
                                      flags, stream, *reduce, workspace)
    if splits == 1:
        launch(function, grid, block, shared, stream, (a, b, c, bias, aux, pre, m, n, k, flags), KINDS, device)
        return None
    partial, owner = workspace(splits * m * n * 4)
    launch(function, grid, block, shared, stream, (a, b, partial, 0, 0, 0, m, n, k, 0), KINDS, device)
    launch(reduce[0], reduce[1], REDUCE_THREADS, 0, stream, (partial, 0, c, bias, aux, pre, m, n, splits, flags),
           KINDS, device)
    return owner


def _cupy_workspace(nbytes):
    import cupy

    memory = cupy.cuda.alloc(nbytes)  # on the launches' stream: the callers allocate on it (allocating_on)
    hold_if_capturing(cupy.cuda.get_current_stream().ptr, memory)
    return memory.ptr, memory


# ------------------------------------------------------------------------------ CuPy API
def _float_array(obj, name, op, ndim=None, like=None):
    x = as_array(obj, name)
    if like is not None:
        if x.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {x.dtype_text}, expected {like.dtype_text} like {like.name}")
    elif x.dtype < 0 or x.dtype >= len(FLOAT_SUFFIXES):
        raise TypeError(f"{name} has dtype {x.dtype_text}; {op} supports float32, float16, bfloat16")
    if ndim is not None and len(x.shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    _rows._dense(x)
    return x


def _out_array(obj, shape, like, inputs):
    o = as_array(obj, "out")
    if o.dtype != like.dtype:
        raise TypeError(f"out has dtype {o.dtype_text}, expected {like.dtype_text} like {like.name}")
    if o.shape != shape:
        raise ValueError(f"out has shape {o.shape}, expected {shape}")
    _rows._dense(o)
    if o.readonly:
        raise ValueError("out is read-only")
    for x in inputs:  # blocks write out while others still read every input
        if x is not None and o.nbytes and x.nbytes and o.ptr < x.ptr + x.nbytes and x.ptr < o.ptr + o.nbytes:
            raise ValueError(f"out overlaps {x.name}; pass a separate array")
    return o


def _wait_for_producers(s, arrays):
    for x in arrays:
        if x is not None:
            wait_for_producer(x, s)


def matmul(a, b, *, tf32=False, out=None, stream=None):
    """a (M, K) @ b (K, N) -> (M, N), C-contiguous float32 / float16 / bfloat16 arrays of one
    dtype; float32 accumulation. float32 runs at float32's accuracy: exact float32 math (FFMA),
    or on sm_90 for products of >= 2^30 FLOP 3xTF32 with promoted sums (rawops.config.f32_3xtf32,
    on by default); `tf32=True` lets float32 run on TF32 tensor cores (operands rounded to 10
    mantissa bits, ~1e-3 relative error; rawops/_gemm_tf32.py) on sm_80+ where K and N are
    multiples of 4 and the arrays 16-byte aligned, else the exact kernel; on sm_90 it runs on WGMMA after b is copied,
    transposed, into K x N floats of scratch from CuPy's pool.
    Half types ignore it."""
    import cupy

    if not isinstance(tf32, bool):
        raise TypeError(f"tf32 must be a bool, got {type(tf32).__name__}")
    A = _float_array(a, "a", "matmul", 2)
    B = _float_array(b, "b", "matmul", 2, like=A)
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k:
        raise ValueError(f"b has shape {B.shape}, expected ({k}, N): its rows must match a's columns (a is {A.shape})")
    O = _out_array(out, (m, n), A, (A, B)) if out is not None else None
    device = _rows.one_device(A, B, O)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device):
        _wait_for_producers(s, (A, B))
        with allocating_on(stream, s):
            c = O.obj if O is not None else cupy.ndarray((m, n), NUMPY_DTYPES[A.dtype])
            c_ptr = O.ptr if O is not None else c.data.ptr
            if not (tf32 and A.dtype == 0 and _gemm_tf32.launch_gemm(
                    device, "nn", A.ptr, B.ptr, c_ptr, 0, 0, 0, m, n, k, EPI_NONE, s, _cupy_workspace)[0]):
                launch_gemm(device, "nn", A.dtype, A.ptr, B.ptr, c_ptr, 0, 0, 0, m, n, k, EPI_NONE, s,
                            _cupy_workspace)
    return c


def _linear_operands(x, weight, bias):
    X = _float_array(x, "x", "linear_gelu")
    if len(X.shape) == 0:
        raise ValueError("x must have at least one dimension (its last is in_features)")
    W = _float_array(weight, "weight", "linear_gelu", 2, like=X)
    k = X.shape[-1]
    if W.shape[1] != k:
        raise ValueError(f"weight has shape {W.shape}, expected (out_features, {k}): torch.nn.Linear layout, "
                         f"in_features = x's last dim")
    n = W.shape[0]
    Bv = None
    if bias is not None:
        Bv = _float_array(bias, "bias", "linear_gelu", like=X)
        if Bv.shape != (n,):
            raise ValueError(f"bias has shape {Bv.shape}, expected ({n},): one value per output feature")
    m = X.size // k if k else _prod(X.shape[:-1])
    return X, W, Bv, m, n, k


def _prod(shape):
    p = 1
    for d in shape:
        p *= d
    return p


def linear_gelu(x, weight, bias=None, approximate="none", *, save_preactivation=False, out=None, stream=None):
    """gelu(x @ weight.T + bias) in one kernel, as
    torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias), approximate=...).

    x (..., in_features), weight (out_features, in_features), bias (out_features,) or None,
    one dtype. Returns y (..., out_features); with save_preactivation=True, (y, pre) where
    pre = x @ weight.T + bias is written by the same kernel for the backward.

    float32 is exact FFMA, or 3xTF32 at float32's accuracy where rawops.config.f32_3xtf32 (on
    by default) takes it, as matmul. rawops.config.linear_tf32 = True (opt-in) runs float32 at <= 128
    rows (in_features % 4 == 0, 16-byte aligned x and weight) on sm_90+ as 3xTF32 tensor-core
    math: faster, near float32's error (up to ~3x torch's float32 at one row). (3xTF32 splits
    each value into two TF32 parts: an infinite input gives NaN there.)"""
    import cupy

    flags = gelu_flags(approximate) | EPI_BIAS_GELU
    X, W, Bv, m, n, k = _linear_operands(x, weight, bias)
    shape = X.shape[:-1] + (n,)
    O = _out_array(out, shape, X, (X, W, Bv)) if out is not None else None
    device = _rows.one_device(X, W, Bv, O)
    dtype = NUMPY_DTYPES[X.dtype]
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device):
        _wait_for_producers(s, (X, W, Bv))
        with allocating_on(stream, s):
            y = O.obj if O is not None else cupy.ndarray(shape, dtype)
            pre = cupy.ndarray(shape, dtype) if save_preactivation else None
            launch_gemm(device, "nt", X.dtype, X.ptr, W.ptr, O.ptr if O is not None else y.data.ptr,
                        Bv.ptr if Bv is not None else 0, 0, pre.data.ptr if pre is not None else 0, m, n, k, flags, s,
                        _cupy_workspace)
    return (y, pre) if save_preactivation else y


def linear_gelu_backward(dy, x, weight, bias=None, approximate="none", *, preactivation=None, stream=None):
    """(dx, dweight, dbias) of linear_gelu; dbias is None when bias is None.

    With `preactivation` (from save_preactivation=True) dpre = dy * gelu'(pre) is one
    elementwise pass; without it, pre is recomputed by a GEMM whose epilogue produces dpre
    directly (no pre ever stored). Then dx = dpre @ W, dW = dpre^T @ x (two GEMMs) and
    dbias = dpre summed over rows (deterministic column sum)."""
    import cupy

    from . import elementwise

    flags = gelu_flags(approximate)
    X, W, Bv, m, n, k = _linear_operands(x, weight, bias)
    shape = X.shape[:-1] + (n,)
    DY = _float_array(dy, "dy", "linear_gelu_backward", like=X)
    if DY.shape != shape:
        raise ValueError(f"dy has shape {DY.shape}, expected {shape}")
    P = None
    if preactivation is not None:
        P = _float_array(preactivation, "preactivation", "linear_gelu_backward", like=X)
        if P.shape != shape:
            raise ValueError(f"preactivation has shape {P.shape}, expected {shape}")
    device = _rows.one_device(X, W, Bv, DY, P)
    dtype = NUMPY_DTYPES[X.dtype]
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device):
        _wait_for_producers(s, (X, W, Bv, DY, P))
        with allocating_on(stream, s):
            db = None
            # With a bias, dpre and its column sums (db) in one pass where the fused kernel applies.
            fused = None
            if P is not None and Bv is not None:
                fused = elementwise.bias_gelu_bwd_plan(m, n, X.dtype, (DY.ptr, P.ptr), sm_count(device),
                                                       _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM))
            if fused is not None:
                dpre = cupy.ndarray(shape, dtype)
                db = cupy.ndarray((n,), dtype)
                partial = cupy.empty((fused[1], n), dtype="float32")
                elementwise.launch_bias_gelu_backward(device, X.dtype, approximate, fused, DY.ptr, P.ptr, 0,
                                                      dpre.data.ptr, partial.data.ptr, db.data.ptr, m, n, s)
            elif P is not None:
                dpre = elementwise.gelu_backward(DY.obj, P.obj, approximate, stream=s)
            else:
                dpre = cupy.ndarray((m, n), dtype)
                launch_gemm(device, "nt", X.dtype, X.ptr, W.ptr, dpre.data.ptr, Bv.ptr if Bv is not None else 0,
                            DY.ptr, 0, m, n, k, flags | EPI_BIAS_GELU_GRAD, s, _cupy_workspace)
            dx = cupy.ndarray(X.shape, dtype)
            dw = cupy.ndarray((n, k), dtype)
            dpre_ptr = dpre.data.ptr
            launch_gemm(device, "nn", X.dtype, dpre_ptr, W.ptr, dx.data.ptr, 0, 0, 0, m, k, n, EPI_NONE, s,
                        _cupy_workspace)
            launch_gemm(device, "tn", X.dtype, dpre_ptr, X.ptr, dw.data.ptr, 0, 0, 0, n, k, m, EPI_NONE, s,
                        _cupy_workspace)
            if db is None and Bv is not None:
                db = elementwise.column_sum(dpre.reshape(m, n), stream=s)
            hold_if_capturing(s, dpre, partial if fused is not None else None)
    return dx, dw, db
