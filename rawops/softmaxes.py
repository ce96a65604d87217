"""Softmax ops over the last dim: softmax and log_softmax, forward and backward.

float32, float16 or bfloat16 arrays of any shape with at least one dimension, any row
width, any number of rows including 0; math in float32, the row max subtracted first (no
overflow at any magnitude). Kernels: kernels/softmaxes.cu.
"""
from ._launch import NUMPY_DTYPES, allocating_on, launch, stream_pointer, wait_for_producer
from . import _modules, _rows

FAMILY = "softmaxes"

# The family's table: kernel base name -> argument names; each exists once per dtype.
KERNELS = {
    "softmax_fwd": ("x", "y", "rows", "n", "mode", "vec"),
    "softmax_bwd": ("dy", "y", "dx", "rows", "n", "mode", "vec"),
    "log_softmax_fwd": ("x", "y", "rows", "n", "mode", "vec"),
    "log_softmax_bwd": ("dy", "y", "dx", "rows", "n", "mode", "vec"),
}
FWD_KINDS = "ppqqqq"
BWD_KINDS = "pppqqqq"


def forward_plan(rows, n, itemsize, aligned):
    return _rows.row_plan(rows, n, _rows.FWD_BYTES // itemsize, itemsize, aligned)


def backward_plan(rows, n, itemsize, aligned):
    return _rows.row_plan(rows, n, _rows.BWD_BYTES // itemsize, itemsize, aligned)


def launch_forward(op, device, dtype, itemsize, x, y, rows, n, stream):
    """One forward launch (op: 'softmax' or 'log_softmax') on pointers checked by the
    caller; rows > 0 and n > 0."""
    aligned = _rows.vectors(n, itemsize, x, y)
    mode, blocks, threads = forward_plan(rows, n, itemsize, aligned)
    launch(_modules.function_pointer(FAMILY, _rows.kernel_name(f"{op}_fwd", dtype), device), (blocks,), threads,
           0, stream, (x, y, rows, n, mode, aligned), FWD_KINDS, device)


def launch_backward(op, device, dtype, itemsize, dy, y, dx, rows, n, stream):
    aligned = _rows.vectors(n, itemsize, dy, y, dx)
    mode, blocks, threads = backward_plan(rows, n, itemsize, aligned)
    launch(_modules.function_pointer(FAMILY, _rows.kernel_name(f"{op}_bwd", dtype), device), (blocks,), threads,
           0, stream, (dy, y, dx, rows, n, mode, aligned), BWD_KINDS, device)


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
            if direction == "fwd":
                launch_forward(op, device, first.dtype, first.itemsize, first.ptr, out_ptr, rows, n, s)
            else:
                launch_backward(op, device, first.dtype, first.itemsize, inputs[0].ptr, inputs[1].ptr, out_ptr,
                                rows, n, s)
    return result


def softmax(x, *, out=None, stream=None):
    """exp(x - max) / sum(exp(x - max)) over the last dim."""
    return _run("softmax", "fwd", [(x, "x")], out, stream)


def log_softmax(x, *, out=None, stream=None):
    """x - max - log(sum(exp(x - max))) over the last dim."""
    return _run("log_softmax", "fwd", [(x, "x")], out, stream)


def softmax_backward(dy, y, *, out=None, stream=None):
    """dx = y * (dy - sum(dy * y)), y being softmax's output."""
    return _run("softmax", "bwd", [(dy, "dy"), (y, "y")], out, stream)


def log_softmax_backward(dy, y, *, out=None, stream=None):
    """dx = dy - exp(y) * sum(dy), y being log_softmax's output."""
    return _run("log_softmax", "bwd", [(dy, "dy"), (y, "y")], out, stream)
