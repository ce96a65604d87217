"""The MLP family, first slice: the source network 100-128-64-10 forward in one launch.

seed_mlp(x, w1, b1, w2, b2, w3, b3) = relu(relu(x W1^T + b1) W2^T + b2) W3^T + b3 for x of
shape (batch, 100), float32, any batch including 0; weights in torch.nn.Linear layout
(weight [out, in], bias [out]). Float32 math, no tensor cores. The hidden activations never
reach device memory. Kernels: kernels/mlp.cu.
"""
from ._launch import as_array, launch, stream_pointer, wait_for_producer
from . import _modules, _rows

FAMILY = "mlp"
SUFFIXES = ("f32",)  # the dtypes each table kernel exists in (<name>_<suffix>)

# The family's table: kernel base name -> argument names.
KERNELS = {
    "seed_mlp_fwd": ("x", "w1", "b1", "w2", "b2", "w3", "b3", "y", "batch", "flags"),
}
SEED_FWD_KINDS = "ppppppppqq"

SEED_SIZES = (100, 128, 64, 10)  # input, hidden, hidden, output
SEED_TILE = 64  # kTile: samples per block
SEED_THREADS = 128  # kThreads
OUTPUT_RELU = 1  # flags bit 0
OUTPUT_ACTIVATIONS = {"none": 0, "relu": OUTPUT_RELU}


# ------------------------------------------------------------------------------ launches on raw pointers
def seed_blocks(batch):
    """Blocks of a seed_mlp launch: one per tile of SEED_TILE samples. batch > 0."""
    blocks = -(-batch // SEED_TILE)
    if blocks > _rows.MAX_GRID:
        raise ValueError(f"seed_mlp: a batch of {batch} exceeds one launch's grid")
    return blocks


def launch_seed_forward(device, x, w1, b1, w2, b2, w3, b3, y, batch, flags, stream):
    """One launch on pointers checked by the caller (float32, contiguous, one device);
    batch > 0."""
    launch(_modules.function_pointer(FAMILY, "seed_mlp_fwd_f32", device), (seed_blocks(batch),), SEED_THREADS, 0, stream,
           (x, w1, b1, w2, b2, w3, b3, y, batch, flags), SEED_FWD_KINDS, device)


# ------------------------------------------------------------------------------ CuPy API
def _shape_text(shape):
    return "(" + ", ".join("B" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _float32(obj, name, shape):
    """A float32, C-contiguous, element-aligned array of `shape` (None: any length)."""
    a = as_array(obj, name)
    if a.dtype != 0:
        raise TypeError(f"{name} has dtype {a.dtype_text}; seed_mlp supports float32")
    if len(a.shape) != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        raise ValueError(f"{name} has shape {a.shape}, expected {_shape_text(shape)}")
    _rows._dense(a)
    return a


def _seed_parameters(w1, b1, w2, b2, w3, b3):
    n_in, h1, h2, n_out = SEED_SIZES
    return [_float32(w1, "w1", (h1, n_in)), _float32(b1, "b1", (h1,)),
            _float32(w2, "w2", (h2, h1)), _float32(b2, "b2", (h2,)),
            _float32(w3, "w3", (n_out, h2)), _float32(b3, "b3", (n_out,))]


def seed_mlp(x, w1, b1, w2, b2, w3, b3, *, output_activation="none", out=None, stream=None):
    """The 100-128-64-10 ReLU network, as torch.nn.Sequential(Linear(100, 128), ReLU(),
    Linear(128, 64), ReLU(), Linear(64, 10)) with those weights and biases computes it;
    output_activation="relu" adds a ReLU after the last layer. x: (batch, 100) float32;
    returns (batch, 10) float32 (into `out` when given)."""
    import cupy

    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {sorted(OUTPUT_ACTIVATIONS)}, got {output_activation!r}")
    X = _float32(x, "x", (None, SEED_SIZES[0]))
    params = _seed_parameters(w1, b1, w2, b2, w3, b3)
    batch = X.shape[0]
    O = None
    if out is not None:
        O = _float32(out, "out", (batch, SEED_SIZES[3]))
        if O.readonly:
            raise ValueError("out is read-only")
        for a in (X, *params):  # blocks write y while others still read their inputs
            if O.nbytes and a.nbytes and O.ptr < a.ptr + a.nbytes and a.ptr < O.ptr + O.nbytes:
                raise ValueError(f"out overlaps {a.name}; pass a separate array")
    device = _rows.one_device(X, *params, O)
    with cupy.cuda.Device(device):
        s = stream_pointer(stream, device)
        for a in (X, *params):
            wait_for_producer(a, s)
        y = O.obj if O is not None else cupy.ndarray((batch, SEED_SIZES[3]), cupy.float32)
        if batch:
            launch_seed_forward(device, X.ptr, *(p.ptr for p in params), O.ptr if O is not None else y.data.ptr,
                                batch, OUTPUT_ACTIVATIONS[output_activation], s)
    return y
