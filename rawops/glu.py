"""Gated linear units: swiglu and geglu, forward and backward, split or packed. Kernels: kernels/glu.cu.

swiglu(gate, up)                      silu(gate) * up           (Llama, Mistral, Qwen: LlamaMLP's
                                                                  act_fn(gate_proj(x)) * up_proj(x))
geglu(gate, up, approximate="tanh")   gelu(gate) * up           (Gemma's gelu_pytorch_tanh; "none":
                                                                  the exact erf GELU)
swiglu_backward(dy, gate, up) -> (d_gate, d_up), geglu_backward likewise:
    d_gate = dy * up * act'(gate), d_up = dy * act(gate); the activation is recomputed from gate,
    so a training step saves nothing but gate and up.
The packed forms take one (..., 2F) tensor x, as a fused `gate_up_proj` Linear writes it (HF's
Phi3MLP: `gate, up = x.chunk(2, dim=-1)`): gate = x[..., :F], the FIRST half, up = x[..., F:], the
second. (torch.nn.functional.glu splits the same way but gates the other half: a * sigmoid(b), b the
second; an MLP whose weights put up first needs its halves swapped, or the split form on views.)
swiglu_fused(x) / geglu_fused(x, approximate) -> (..., F); swiglu_fused_backward(dy, x) /
geglu_fused_backward(dy, x, approximate) -> dx (..., 2F): d_gate in its first half, d_up in its second.

float32, float16 or bfloat16 (math in float32, one rounding to the storage type), any shape with at
least one dim, the op over the last one, 0 elements included. approximate defaults to "tanh", as
Liger-Kernel's geglu and Gemma's activation: note that torch.nn.functional.gelu defaults to "none".

Layouts: every operand (gate, up, x, dy, out=) may be a row-strided view (its last dim contiguous,
its leading dims collapsing to one row stride: `x[:, :F]` of a wider matrix, `x[::2]`), launched as
it is, no copy. 16-byte vectors where every pointer is 16-byte aligned and every row stride a whole
number of vectors (a dense call is one flat row); otherwise element by element (correct, slower: a
packed x with F not a multiple of 8 half-type elements, 4 float32 ones, runs so). Any other layout is
a ValueError naming the argument. Results are new contiguous arrays unless out= is given: the
forward's out= (..., F); the split backward's out=(d_gate, d_up); the packed backward's out=dx. An
out may be exactly an input (the same pointer and row stride: in place, as Liger writes its gradients
into a and b), never partly overlap one. Launches go on CuPy's current stream of the data's device,
or on `stream=`; every check raises a TypeError / ValueError naming the argument before any launch.
"""
from ._launch import (NUMPY_DTYPES, allocating_on, as_array, launch, map_shape, stream_pointer,
                      wait_for_producer)
from . import _constants, _modules, _rows

FAMILY = "glu"

_FWD_ARGS = ("gate", "up", "out", "rows", "cols", "gate_stride", "up_stride", "out_stride", "vec")
_BWD_ARGS = ("dy", "gate", "up", "dgate", "dup", "rows", "cols", "dy_stride", "gate_stride", "up_stride",
             "dgate_stride", "dup_stride", "vec")
FWD_KINDS = "pppqqqqqq"
BWD_KINDS = "pppppqqqqqqqq"
ACTIVATIONS = ("swiglu", "geglu_tanh", "geglu_erf")
# The family's table: kernel base name -> argument names; each exists once per dtype.
KERNELS = {f"{act}_{direction}": (_FWD_ARGS if direction == "fwd" else _BWD_ARGS)
           for act in ACTIVATIONS for direction in ("fwd", "bwd")}
GELU_KERNELS = {"tanh": "geglu_tanh", "none": "geglu_erf"}

THREADS = _constants.MAP_THREADS  # the kernels' launch bound (the map kernels' block)
UNROLL = _constants.MAP_UNROLL  # 16-byte vectors a thread, each operand
MAX_GRID = (1 << 31) - 1
# Launched in the map kernels' capped shape on sm_90 (_launch.map_shape: 128 threads, 13 blocks an
# SM; uncapped on a device with fast memory), as elementwise launches its light ops; the erf
# forward does the most math per byte, as elementwise's gelu_erf_fwd, which runs faster uncapped.
CAPPED = {"swiglu_fwd", "swiglu_bwd", "geglu_tanh_fwd", "geglu_tanh_bwd", "geglu_erf_bwd"}


# ------------------------------------------------------------------------------ launch plans (pure)
def launch_plan(rows, cols, itemsize, pointers, strides, resident, threads=THREADS):
    """(blocks, rows, cols, strides, vec) of one launch over a (rows x cols) problem whose operands
    sit at `pointers` with row `strides` (elements): rows of dense operands (every stride == cols)
    merge into one flat row; vec 1 when every pointer is 16-byte aligned, every row stride (of more
    than one row) a whole number of 16-byte vectors and a row at least one vector (kernels/glu.cu),
    one block per `threads` x UNROLL vectors; vec 0 a grid-stride loop of at most `resident` blocks
    (those of the kernel the device holds at once: one wave)."""
    strides = tuple(strides)
    if rows > 1 and all(s == cols for s in strides):
        rows, cols, strides = 1, rows * cols, tuple(rows * cols for _ in strides)
    per_vector = 16 // itemsize
    vec = int(cols >= per_vector and all(p % 16 == 0 for p in pointers)
              and (rows == 1 or all((s * itemsize) % 16 == 0 for s in strides)))
    per_block = threads * UNROLL
    if vec:
        blocks = -(-(rows * (cols // per_vector)) // per_block)
    else:
        blocks = min(-(-(rows * cols) // threads), resident)
    return max(1, min(blocks, MAX_GRID)), rows, cols, strides, vec


def kernel_base(activation, approximate=None):
    """The kernels' base name of an op: 'swiglu', or 'geglu' with approximate 'tanh' / 'none'."""
    if activation == "swiglu":
        return "swiglu"
    if not isinstance(approximate, str):  # plain Python: the torch adapter calls it inside torch.compile
        raise TypeError(f"approximate must be a string, got {type(approximate).__name__}")
    base = GELU_KERNELS.get(approximate)
    if base is None:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return base


def launch_forward(base, device, dtype, itemsize, gate, up, out, rows, cols, strides, stream):
    """out = act(gate) * up on raw pointers checked by the caller; strides: the row strides of
    gate, up and out in elements; rows, cols > 0."""
    name = f"{base}_fwd"
    threads, shared = map_shape(name in CAPPED, _modules.compute_capability(device), _modules.fast_memory(device))
    function = _modules.function_pointer(FAMILY, _rows.kernel_name(name, dtype), device)
    blocks, rows, cols, strides, vec = launch_plan(rows, cols, itemsize, (gate, up, out), strides,
                                                   _modules.resident_blocks(function, threads, shared, device), threads)
    launch(function, (blocks,), threads, shared, stream, (gate, up, out, rows, cols, *strides, vec), FWD_KINDS, device)


def launch_backward(base, device, dtype, itemsize, dy, gate, up, dgate, dup, rows, cols, strides, stream):
    """d_gate, d_up on raw pointers checked by the caller; strides: the row strides of dy, gate, up,
    dgate and dup in elements; rows, cols > 0."""
    name = f"{base}_bwd"
    threads, shared = map_shape(name in CAPPED, _modules.compute_capability(device), _modules.fast_memory(device))
    function = _modules.function_pointer(FAMILY, _rows.kernel_name(name, dtype), device)
    blocks, rows, cols, strides, vec = launch_plan(rows, cols, itemsize, (dy, gate, up, dgate, dup), strides,
                                                   _modules.resident_blocks(function, threads, shared, device), threads)
    launch(function, (blocks,), threads, shared, stream, (dy, gate, up, dgate, dup, rows, cols, *strides, vec),
           BWD_KINDS, device)


# ------------------------------------------------------------------------------ argument checks
def packed_width(x):
    """F of a packed (..., 2F) operand; ValueError naming it where the last dim is odd."""
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"{x.name} has {width} columns in its last dim; a packed gate/up tensor has 2F: gate "
                         "the first F, up the last F")
    return width // 2


def _out_operand(obj, name, like, shape, inputs):
    """An out= operand: like's dtype, `shape`, writable, row-strided with rows apart; exactly one of
    `inputs` ((array, row stride, byte offset) with the same shape: in place) or none of their memory."""
    o = as_array(obj, name)
    if o.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {o.dtype_text}, expected {like.dtype_text} like {like.name}")
    if o.shape != tuple(shape):
        raise ValueError(f"{name} has shape {o.shape}, expected {tuple(shape)}")
    stride = _rows.row_stride(o)
    _rows._aligned(o)
    if o.readonly:
        raise ValueError(f"{name} is read-only")
    n = o.shape[-1] if o.shape else 0
    rows = o.size // n if n else 0
    if rows > 1 and abs(stride) < n:
        raise ValueError(f"{name} has rows {stride} elements apart, {n} wide: its rows overlap each other; every "
                         "element needs memory of its own")
    span = _rows.extent(o, stride)
    for x, x_stride in inputs:
        exact = o.ptr == x.ptr and stride == x_stride and o.shape == x.shape
        if not exact and _rows._overlap(span, _rows.extent(x, x_stride)):
            raise ValueError(f"{name} overlaps {x.name}; pass {name}={x.name} exactly (in place), or a separate array")
    return o, stride


def _check_outs(outs):
    """Two out= operands of a backward must not overlap each other."""
    (a, sa), (b, sb) = outs
    if _rows._overlap(_rows.extent(a, sa), _rows.extent(b, sb)):
        raise ValueError(f"{a.name} and {b.name} overlap; the two gradients need memory of their own")


def _out_pair(out, names):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a pair ({names[0]}, {names[1]}), got {type(out).__name__}")
    return out


# ------------------------------------------------------------------------------ CuPy API
def _forward(base, gate, up, out, stream, op, packed_x=None):
    import cupy

    if packed_x is not None:
        x = _rows.rows_array(packed_x, "x", op)
        f = packed_width(x)
        x_stride = _rows.row_stride(x)
        shape = x.shape[:-1] + (f,)
        gate_ptr, up_ptr, strides_in = x.ptr, x.ptr + f * x.itemsize, (x_stride, x_stride)
        first, inputs = x, [(x, x_stride)]
    else:
        first = _rows.rows_array(gate, "gate", op)
        second = _rows.rows_array(up, "up", op, like=first)
        shape = first.shape
        f = shape[-1]
        strides_in = (_rows.row_stride(first), _rows.row_stride(second))
        gate_ptr, up_ptr = first.ptr, second.ptr
        inputs = [(first, strides_in[0]), (second, strides_in[1])]
    o = _out_operand(out, "out", first, shape, inputs) if out is not None else None
    device = _rows.one_device(first, *(a for a, _ in inputs[1:]), o[0] if o else None)
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a, _ in inputs:
            wait_for_producer(a, s)
        result = o[0].obj if o else cupy.ndarray(shape, NUMPY_DTYPES[first.dtype])
        out_ptr, out_stride = (o[0].ptr, o[1]) if o else (result.data.ptr, f)
        rows = _product(shape[:-1])
        if rows and f:
            launch_forward(base, device, first.dtype, first.itemsize, gate_ptr, up_ptr, out_ptr, rows, f,
                           (*strides_in, out_stride), s)
    return result


def _backward(base, dy, gate, up, out, stream, op, packed_x=None):
    import cupy

    if packed_x is not None:
        x = _rows.rows_array(packed_x, "x", op)
        f = packed_width(x)
        x_stride = _rows.row_stride(x)
        d = _rows.rows_array(dy, "dy", op)
        if d.dtype != x.dtype:
            raise TypeError(f"dy has dtype {d.dtype_text}, expected {x.dtype_text} like x")
        if d.shape != x.shape[:-1] + (f,):
            raise ValueError(f"dy has shape {d.shape}, expected {x.shape[:-1] + (f,)}: x's with its last dim halved")
        gate_ptr, up_ptr, strides_in = x.ptr, x.ptr + f * x.itemsize, (x_stride, x_stride)
        first, inputs = x, [(d, _rows.row_stride(d)), (x, x_stride)]
        o = _out_operand(out, "out", x, x.shape, inputs) if out is not None else None
        outs = [o[0]] if o else []
    else:
        first = _rows.rows_array(gate, "gate", op)
        second = _rows.rows_array(up, "up", op, like=first)
        d = _rows.rows_array(dy, "dy", op, like=first)
        f = first.shape[-1]
        strides_in = (_rows.row_stride(first), _rows.row_stride(second))
        gate_ptr, up_ptr = first.ptr, second.ptr
        inputs = [(d, _rows.row_stride(d)), (first, strides_in[0]), (second, strides_in[1])]
        o = None
        if out is not None:
            pair = _out_pair(out, ("d_gate", "d_up"))
            o = [_out_operand(obj, name, first, first.shape, inputs) for obj, name in zip(pair, ("d_gate", "d_up"))]
            _check_outs(o)
        outs = [a for a, _ in o] if o else []
    device = _rows.one_device(first, *(a for a, _ in inputs), *outs)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a, _ in inputs:
            wait_for_producer(a, s)
        dtype = NUMPY_DTYPES[first.dtype]
        rows = _product(d.shape[:-1])
        if packed_x is not None:
            result = o[0].obj if o else cupy.ndarray(first.shape, dtype)
            dx_ptr, dx_stride = (o[0].ptr, o[1]) if o else (result.data.ptr, 2 * f)
            pointers = (dx_ptr, dx_ptr + f * first.itemsize)
            out_strides = (dx_stride, dx_stride)
        else:
            result = (o[0][0].obj, o[1][0].obj) if o else (cupy.ndarray(first.shape, dtype),
                                                           cupy.ndarray(first.shape, dtype))
            pointers = (o[0][0].ptr, o[1][0].ptr) if o else (result[0].data.ptr, result[1].data.ptr)
            out_strides = (o[0][1], o[1][1]) if o else (f, f)
        if rows and f:
            launch_backward(base, device, first.dtype, first.itemsize, d.ptr, gate_ptr, up_ptr, *pointers, rows, f,
                            (inputs[0][1], *strides_in, *out_strides), s)
    return result


def _product(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def swiglu(gate, up, *, out=None, stream=None):
    """silu(gate) * up, elementwise; gate and up of one shape (module docstring: layouts, out=)."""
    return _forward("swiglu", gate, up, out, stream, "swiglu")


def swiglu_backward(dy, gate, up, *, out=None, stream=None):
    """(d_gate, d_up) = (dy * up * silu'(gate), dy * silu(gate)); out=(d_gate, d_up) optional."""
    return _backward("swiglu", dy, gate, up, out, stream, "swiglu_backward")


def geglu(gate, up, approximate="tanh", *, out=None, stream=None):
    """gelu(gate, approximate) * up, elementwise (approximate 'tanh', the default, or 'none')."""
    return _forward(kernel_base("geglu", approximate), gate, up, out, stream, "geglu")


def geglu_backward(dy, gate, up, approximate="tanh", *, out=None, stream=None):
    """(d_gate, d_up) = (dy * up * gelu'(gate), dy * gelu(gate)); out=(d_gate, d_up) optional."""
    return _backward(kernel_base("geglu", approximate), dy, gate, up, out, stream, "geglu_backward")


def swiglu_fused(x, *, out=None, stream=None):
    """silu(x[..., :F]) * x[..., F:] of a packed (..., 2F) gate/up tensor -> (..., F)."""
    return _forward("swiglu", None, None, out, stream, "swiglu_fused", packed_x=x)


def swiglu_fused_backward(dy, x, *, out=None, stream=None):
    """dx (..., 2F) of swiglu_fused: d_gate in its first F columns, d_up in its last F; out=x is in place."""
    return _backward("swiglu", dy, None, None, out, stream, "swiglu_fused_backward", packed_x=x)


def geglu_fused(x, approximate="tanh", *, out=None, stream=None):
    """gelu(x[..., :F], approximate) * x[..., F:] of a packed (..., 2F) tensor -> (..., F)."""
    return _forward(kernel_base("geglu", approximate), None, None, out, stream, "geglu_fused", packed_x=x)


def geglu_fused_backward(dy, x, approximate="tanh", *, out=None, stream=None):
    """dx (..., 2F) of geglu_fused: d_gate in its first F columns, d_up in its last F."""
    return _backward(kernel_base("geglu", approximate), dy, None, None, out, stream, "geglu_fused_backward",
                     packed_x=x)
