"""Softmax ops over the last dim: softmax and log_softmax, forward and backward.

float32, float16 or bfloat16 arrays of any shape with at least one dimension, any row
width, any number of rows including 0; math in float32, the row max subtracted first (no
overflow at any magnitude). Kernels: kernels/softmaxes.cu.

Layouts: every operand (x, y, dy, out=) may be a view whose last dim is contiguous and whose
leading dims collapse to one row stride (`x[:, :n]` of a wider matrix, `x[::2]`, a broadcast
of one row): launched as it is, no copy; the 16-byte path is kept wherever every row starts
16-byte aligned. Any other layout (a transpose, a step in the last dim) is a ValueError naming
the argument. The result is a new contiguous array unless out= is given.
"""
from ._launch import NUMPY_DTYPES, allocating_on, launch, stream_pointer, wait_for_producer
from . import _constants, _modules, _rows

FAMILY = "softmaxes"

# The family's table: kernel base name -> argument names; each exists once per dtype.
_FWD_ARGS = ("x", "y", "rows", "n", "x_stride", "y_stride", "mode", "vec")
_BWD_ARGS = ("dy", "y", "dx", "rows", "n", "dy_stride", "y_stride", "dx_stride", "mode", "vec")
KERNELS = {
    "softmax_fwd": _FWD_ARGS,
    "softmax_fwd_wide": _FWD_ARGS,
    "softmax_bwd": _BWD_ARGS,
    "log_softmax_fwd": _FWD_ARGS,
    "log_softmax_fwd_wide": _FWD_ARGS,
    "log_softmax_bwd": _BWD_ARGS,
}
FWD_KINDS = "ppqqqqqq"
BWD_KINDS = "pppqqqqqqq"


# The wide forward entries (8 vectors a thread, not 4), on a device with fast memory an SM
# (_modules.fast_memory: the H200), where a row then still spreads over WIDE_MIN_THREADS..
# WIDE_MAX_THREADS threads (dev/time_row_fwd_variants.py, H200: f32 at 768 columns 148.8 -> 131.7
# us, a warp a row; bf16 at 4096 81.3 -> 77.2, 64 threads; f32 at 4096 136.6 -> 134.2; 16-bit rows
# at 768 would keep 12 lanes of a warp busy: 86.9 -> 114.0, so not taken; rows wider than 128
# threads' worth not measured, not taken). On the H100 the wide entries were 0-2% slower (bf16 at
# 4096 96.1 against 94.2 us): not taken there.
WIDE_BYTES = 16 * _constants.ROW_FWD_WIDE_VECTORS
WIDE_MIN_THREADS, WIDE_MAX_THREADS = 24, 128
fast_memory = _modules.fast_memory  # module-level: tests replace it here


def forward_plan(rows, n, itemsize, aligned, fast=False):
    """(mode, blocks, threads, wide): _rows.row_plan's, and whether the wide entries run it (only
    with fast: the device's fast_memory)."""
    plan = _rows.row_plan(rows, n, _rows.FWD_BYTES // itemsize, itemsize, aligned)
    need = -(-n * itemsize // WIDE_BYTES)  # threads holding the row 8 vectors each
    if fast and aligned and plan[0] != _rows.STREAM_ROW and WIDE_MIN_THREADS <= need <= WIDE_MAX_THREADS:
        return (*_rows.row_plan(rows, n, WIDE_BYTES // itemsize, itemsize, aligned), True)
    return (*plan, False)


def backward_plan(rows, n, itemsize, aligned):
    return _rows.row_plan(rows, n, _rows.BWD_BYTES // itemsize, itemsize, aligned)


def launch_forward(op, device, dtype, itemsize, x, y, rows, n, stream, strides=None):
    """One forward launch (op: 'softmax' or 'log_softmax') on pointers checked by the
    caller; strides: the row strides of x and y in elements (None: n, dense rows); rows > 0
    and n > 0."""
    strides = (n, n) if strides is None else tuple(strides)
    aligned = _rows.vectors(n, itemsize, x, y, strides=strides)
    mode, blocks, threads, wide = forward_plan(rows, n, itemsize, aligned, fast_memory(device))
    name = _rows.kernel_name(f"{op}_fwd_wide" if wide else f"{op}_fwd", dtype)
    launch(_modules.function_pointer(FAMILY, name, device), (blocks,), threads, 0, stream,
           (x, y, rows, n, *strides, mode, aligned), FWD_KINDS, device)


def launch_backward(op, device, dtype, itemsize, dy, y, dx, rows, n, stream, strides=None):
    """One backward launch; strides: the row strides of dy, y and dx (None: n each)."""
    strides = (n, n, n) if strides is None else tuple(strides)
    aligned = _rows.vectors(n, itemsize, dy, y, dx, strides=strides)
    mode, blocks, threads = backward_plan(rows, n, itemsize, aligned)
    launch(_modules.function_pointer(FAMILY, _rows.kernel_name(f"{op}_bwd", dtype), device), (blocks,), threads,
           0, stream, (dy, y, dx, rows, n, *strides, mode, aligned), BWD_KINDS, device)


# ------------------------------------------------------------------------------ CuPy API
def _run(op, direction, arrays, out, stream):
    """arrays: the inputs as (object, name); the first sets dtype and shape."""
    import cupy

    first = _rows.rows_array(arrays[0][0], arrays[0][1], op)
    inputs = [first] + [_rows.rows_array(obj, name, op, like=first) for obj, name in arrays[1:]]
    O = _rows.out_array(out, first, inputs[1:]) if out is not None else None
    device = _rows.one_device(*inputs, O)
    n = first.shape[-1]
    rows = first.size // n if n else 0
    s = stream_pointer(stream, device)  # another GPU's stream is refused before any CuPy call
    with cupy.cuda.Device(device), allocating_on(stream, s):
        for a in inputs:
            wait_for_producer(a, s)
        result = O.obj if O is not None else cupy.ndarray(first.shape, NUMPY_DTYPES[first.dtype])
        out_ptr = O.ptr if O is not None else result.data.ptr
        if rows and n:
            strides = [_rows.row_stride(a) for a in inputs] + [_rows.row_stride(O) if O is not None else n]
            if direction == "fwd":
                launch_forward(op, device, first.dtype, first.itemsize, first.ptr, out_ptr, rows, n, s, strides)
            else:
                launch_backward(op, device, first.dtype, first.itemsize, inputs[0].ptr, inputs[1].ptr, out_ptr,
                                rows, n, s, strides)
    return result


def softmax(x, *, out=None, stream=None):
    """exp(x - max) / sum(exp(x - max)) over the last dim; x and out=
    may be row-strided views (module docstring)."""
    return _run("softmax", "fwd", [(x, "x")], out, stream)


def log_softmax(x, *, out=None, stream=None):
    """x - max - log(sum(exp(x - max))) over the last dim; x and out=
    may be row-strided views (module docstring)."""
    return _run("log_softmax", "fwd", [(x, "x")], out, stream)


def softmax_backward(dy, y, *, out=None, stream=None):
    """dx = y * (dy - sum(dy * y)), y being softmax's output; dy, y and out= may be
    row-strided views (module docstring)."""
    return _run("softmax", "bwd", [(dy, "dy"), (y, "y")], out, stream)


def log_softmax_backward(dy, y, *, out=None, stream=None):
    """dx = dy - exp(y) * sum(dy), y being log_softmax's output; dy, y and out= may be
    row-strided views (module docstring)."""
    return _run("log_softmax", "bwd", [(dy, "dy"), (y, "y")], out, stream)
