"""The image family for torch: rgb_to_gray, normalize_volume and to_tensor_normalize on CUDA
tensors (rawops.image's docstring gives the arithmetic), launched from data_ptr() on torch's
current stream, outputs (and normalize_volume's min/max scratch) from torch's allocator, and
`rawops::` custom ops so that torch.compile(fullgraph=True) traces them.

No autograd: the results never require grad (uint8 images have no gradient; normalize_volume on
a float volume that requires grad returns a constant result, as .detach() would: the map is
not differentiated).

What is copied first (one extra read and write of the input): a tensor that is not contiguous,
except rgb_to_gray's planar (N, 3, H, W) input in torch.channels_last memory format, which is
read as it lies (its memory is channels-last RGB). to_tensor_normalize's mean and std may be
sequences or tensors (a CUDA tensor is read back to the host: a synchronization).
"""
import torch

from .. import image as _im
from ._common import compiling, custom_op, on_device, raw_stream

_NAMES = {torch.uint8: "uint8", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
if hasattr(torch, "uint16"):
    _NAMES[torch.uint16] = "uint16"
_TORCH = {name: dtype for dtype, name in _NAMES.items()}


def _tensor(t, name):
    """t's dtype name after the checks every operand gets (a CUDA tensor of a dtype rawops
    knows), TypeError / ValueError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; rawops needs a CUDA tensor")
    if t.dtype not in _NAMES:
        raise TypeError(f"{name} has dtype {t.dtype}, which rawops' image ops do not take")
    return _NAMES[t.dtype]


def _dtype_name(value, name, allowed):
    """A dtype argument (torch.dtype, NumPy dtype or name) as rawops' dtype name."""
    if isinstance(value, torch.dtype):
        if value not in _NAMES or _NAMES[value] not in allowed:
            raise ValueError(f"{name} is {value}; expected one of {', '.join(allowed)}")
        return _NAMES[value]
    return _im.dtype_arg(value, name, allowed)


def _torch_dtype(value, default):
    """out_dtype as a torch.dtype for a custom op's ScalarType argument (checked again inside)."""
    if value is None:
        return default
    if isinstance(value, torch.dtype):
        return value
    return getattr(torch, value) if isinstance(value, str) and isinstance(getattr(torch, value, None),
                                                                        torch.dtype) else value


def _opt_float(value):
    """A bound for the custom op's `float?` (an int given in Python becomes a float; anything
    else is passed on for the op's own checks to name)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _launch(t, fn, *args):
    device = t.get_device()
    on_device(device, fn, device, raw_stream(device), *args)


# ------------------------------------------------------------------------------ the launches
def _rgb_to_gray(img, out_dtype, channels_last):
    in_dtype = _tensor(img, "img")
    out_shape, images, pixels, planar = _im.gray_shapes(tuple(img.shape), in_dtype, channels_last)
    out_dtype = in_dtype if out_dtype is None else _dtype_name(out_dtype, "out_dtype", _im.GRAY_DTYPES)
    if planar and img.dim() == 4 and not img.is_contiguous() and img.is_contiguous(memory_format=torch.channels_last):
        planar, images, pixels = False, 1, images * pixels  # its memory is (N, H, W, 3)
    else:
        img = img.contiguous()
    y = torch.empty(out_shape, dtype=_TORCH[out_dtype], device=img.device)
    if y.numel():
        _launch(img, _im.launch_rgb_to_gray, img.data_ptr(), y.data_ptr(), in_dtype, out_dtype, images, pixels, planar)
    return y


def _normalize_volume(vol, lo, hi, clip, out_dtype):
    in_dtype = _tensor(vol, "vol")
    if in_dtype not in _im.VOLUME_DTYPES:
        raise TypeError(f"vol has dtype {vol.dtype}; normalize_volume supports {', '.join(_im.VOLUME_DTYPES)}")
    lo, hi, flags = _im.volume_bounds(lo, hi, clip)
    out_dtype = _dtype_name(out_dtype, "out_dtype", _im.FLOAT_OUT)
    vol = vol.detach().contiguous()
    y = torch.empty(vol.shape, dtype=_TORCH[out_dtype], device=vol.device)
    n = vol.numel()
    if n:
        partials = None
        if flags & (_im.FLAG_LO | _im.FLAG_HI):
            size = _im.partials_size(n, in_dtype, out_dtype, vol.get_device())
            partials = torch.empty(size, dtype=torch.float32, device=vol.device)
        _launch(vol, _im.launch_normalize_volume, vol.data_ptr(), y.data_ptr(), n, in_dtype, out_dtype, lo, hi, flags,
                partials.data_ptr() if partials is not None else 0)
    return y


def _as_list(values):
    return values.tolist() if isinstance(values, torch.Tensor) else values


def _to_tensor_normalize(img, mean, std, out_dtype, layout):
    in_dtype = _tensor(img, "img")
    out_shape, images, pixels, channels, planar = _im.to_tensor_shapes(tuple(img.shape), in_dtype, layout)
    scale, shift = _im.normalize_constants(_as_list(mean), _as_list(std), channels)
    out_dtype = _dtype_name(out_dtype, "out_dtype", _im.FLOAT_OUT)
    img = img.contiguous()
    y = torch.empty(out_shape, dtype=_TORCH[out_dtype], device=img.device)
    if y.numel():
        _launch(img, _im.launch_to_tensor, img.data_ptr(), y.data_ptr(), out_dtype, images, pixels, channels, planar,
                scale, shift)
    return y


# ------------------------------------------------------------------------------ custom ops (compile)
def _gray_fake(img, out_dtype, channels_last):
    shape = _im.gray_shapes(tuple(img.shape), _tensor(img, "img"), channels_last)[0]
    return img.new_empty(shape, dtype=out_dtype)


def _volume_fake(vol, lo, hi, clip, out_dtype):
    return vol.new_empty(vol.shape, dtype=out_dtype)


def _to_tensor_fake(img, mean, std, out_dtype, layout):
    shape = _im.to_tensor_shapes(tuple(img.shape), _tensor(img, "img"), layout)[0]
    return img.new_empty(shape, dtype=out_dtype)


_GRAY_OP = custom_op("rgb_to_gray", "(Tensor img, ScalarType out_dtype, bool channels_last) -> Tensor",
                     _rgb_to_gray, _gray_fake)
_VOLUME_OP = custom_op("normalize_volume",
                       "(Tensor vol, float? lo, float? hi, bool clip, ScalarType out_dtype) -> Tensor",
                       _normalize_volume, _volume_fake)
_TO_TENSOR_OP = custom_op("to_tensor_normalize",
                          "(Tensor img, float[] mean, float[] std, ScalarType out_dtype, str layout) -> Tensor",
                          _to_tensor_normalize, _to_tensor_fake)


# ------------------------------------------------------------------------------ public functions
def rgb_to_gray(img, out_dtype=None, *, channels_last=True):
    """BT.601 gray of an RGB tensor: (..., H, W, 3) -> (..., H, W), or with channels_last=False
    (..., 3, H, W) -> (..., 1, H, W); uint8 -> uint8 bit-exact with OpenCV's cvtColor
    (COLOR_RGB2GRAY). out_dtype: torch.uint8, float32 or float16 (None: img's)."""
    if compiling():
        return _GRAY_OP(img, _torch_dtype(out_dtype, img.dtype), channels_last)
    return _rgb_to_gray(img, out_dtype, channels_last)


def normalize_volume(vol, lo=None, hi=None, clip=True, out_dtype=torch.float32):
    """(vol - lo) / (hi - lo) clipped to [0, 1] (clip=True); lo / hi not given: vol's min / max,
    found on the GPU in the same call. Constant volume: 0; NaN propagates. No gradient."""
    if compiling():
        return _VOLUME_OP(vol, _opt_float(lo), _opt_float(hi), clip, _torch_dtype(out_dtype, torch.float32))
    return _normalize_volume(vol, lo, hi, clip, out_dtype)


def to_tensor_normalize(img, mean, std, out_dtype=torch.float32, layout="NCHW"):
    """torchvision's ToTensor + Normalize of a uint8 (N, H, W, C) tensor in one pass:
    (x / 255 - mean[c]) / std[c] as (N, C, H, W) (layout="NHWC": (N, H, W, C))."""
    if compiling():
        return _TO_TENSOR_OP(img, [float(m) for m in mean], [float(s) for s in std],
                             _torch_dtype(out_dtype, torch.float32), layout)
    return _to_tensor_normalize(img, mean, std, out_dtype, layout)
