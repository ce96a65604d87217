"""The sorting family's key types and argument checks, shared by sort / argsort
(rawops/sorting.py) and topk (rawops/_sorting_topk.py), CuPy API and torch adapter alike. The
kernels' side of the key types is kernels/include/rawops/sort_keys.cuh."""
import numpy

from ._launch import NUMPY_DTYPES

# key dtype name -> (kernel suffix, numpy dtype, key bits); by CuPy's dtype name, the interface's
# typestr (TYPESTRS) or torch's dtype without its "torch." prefix
KEY_TYPES = {
    "float32": ("f32", NUMPY_DTYPES[0], 32),
    "float16": ("f16", NUMPY_DTYPES[1], 16),
    "bfloat16": ("bf16", NUMPY_DTYPES[2], 16),
    "int32": ("i32", numpy.dtype("int32"), 32),
    "int64": ("i64", numpy.dtype("int64"), 64),
}
TYPESTRS = {"<f4": "float32", "<f2": "float16", "<i4": "int32", "<i8": "int64"}
SUFFIXES = tuple(suffix for suffix, _, _ in KEY_TYPES.values())
MAX_ROW = (1 << 31) - 1  # positions in a row are 32-bit in the kernels
MAX_GRID = (1 << 31) - 1  # gridDim.x; every kernel loops over rows past it
_SUPPORTED = "float32, float16, bfloat16, int32, int64"


def key_type(a, op):
    """The key dtype name of a DeviceArray, TypeError naming it for any other."""
    text = a.dtype_text
    name = TYPESTRS.get(text, text)
    if name not in KEY_TYPES:
        kind = f" (bool has no order {op} supports)" if name in ("bool", "|b1") else ""
        raise TypeError(f"{a.name} has dtype {text}{kind}; {op} supports {_SUPPORTED}")
    return name


_TORCH_NAMES = {}  # torch dtype -> its name without "torch.", filled at first sight (one dict lookup a call)


def tensor_key_type(input, op):
    """The key dtype name of a torch tensor (its dtype without "torch."), TypeError naming input."""
    dtype = input.dtype
    name = _TORCH_NAMES.get(dtype)
    if name is None:
        name = _TORCH_NAMES[dtype] = str(dtype).removeprefix("torch.")
    if name not in KEY_TYPES:
        raise TypeError(f"input has dtype {dtype}; {op} supports {_SUPPORTED}")
    return name


def checked_dim(dim, ndim):
    """dim as an index in [0, max(ndim, 1)) (a 0-d array is one element along dim 0 or -1)."""
    if isinstance(dim, bool) or not isinstance(dim, (int, numpy.integer)):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    span = max(ndim, 1)
    if not -span <= dim < span:
        raise ValueError(f"dim {dim} is out of range for an array of {ndim} dims")
    return int(dim) % span


def checked_bool(value, name):
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def checked_rows(a, n, itemsize, op):
    """ValueError naming x where its pointer is not aligned to its `itemsize`-byte element or its
    rows (n along the dim) are 2**31 elements or longer."""
    if a.ptr % itemsize:
        raise ValueError(f"x is misaligned: address 0x{a.ptr:x} is not a multiple of its {itemsize}-byte element")
    if n > MAX_ROW:
        raise ValueError(f"x has {n} elements along dim; {op} takes rows of fewer than 2**31")
