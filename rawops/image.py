"""Image ops: rgb_to_gray, normalize_volume, to_tensor_normalize. Kernels: kernels/image.cu.

rgb_to_gray(img, out_dtype=None, *, channels_last=True)
    BT.601 luma, 0.299 R + 0.587 G + 0.114 B. img is uint8, float32 or float16, either
    channels-last, (H, W, 3) or (N, H, W, 3) (OpenCV's layout; the result is (H, W) or (N, H, W)),
    or with channels_last=False planar, (3, H, W) or (N, 3, H, W) (torch's layout; the result
    keeps a channel dim of one, (1, H, W) or (N, 1, H, W), as torchvision's rgb_to_grayscale).
    The layout is a keyword, never guessed from the shape ((3, 4, 3) reads either way). The
    channels are R, G, B in that order (OpenCV's COLOR_RGB2GRAY; for BGR data reverse the last
    dim first). out_dtype uint8, float32 or float16 (None: img's dtype). uint8 -> uint8 is
    OpenCV's 15-bit fixed point, bit-exact with cv2.cvtColor(img, cv2.COLOR_RGB2GRAY); any other
    pair computes (R * 0.299 + G * 0.587) + B * 0.114 in float32, each product and sum rounded
    once, as torch does for that expression in float32, keeping img's scale (uint8 in, float
    out: [0, 255], as OpenCV keeps the scale too), then rounds to out_dtype (uint8 from float:
    to nearest even, saturated to [0, 255], NaN to 0).
normalize_volume(vol, lo=None, hi=None, clip=True, out_dtype="float32")
    (vol - lo) / (hi - lo) of a uint8, uint16, float16 or float32 array of any shape, as
    float32, float16 or bfloat16, clipped to [0, 1] when clip. lo / hi not given are vol's
    min / max, found on the GPU in the same call: a min/max pass writes one partial a block,
    the map pass reduces them again in every block (fixed order: the same bits every run), no
    host round trip. lo and hi given: lo < hi (ValueError otherwise), one pass. hi <= lo from
    the data (a constant volume) gives 0 everywhere, not torch's 0 / 0 = NaN. NaN propagates:
    a NaN voxel makes min and max NaN, so every output is NaN, as in torch's
    (v - v.min()) / (v.max() - v.min()); with lo and hi given only NaN voxels are NaN
    (clipping keeps NaN). The bounds are taken as float32. out= may be vol itself (in place)
    where the dtypes match.
to_tensor_normalize(img, mean, std, out_dtype="float32", layout="NCHW")
    torchvision's ToTensor then Normalize in one pass: uint8 (N, H, W, C) (or (H, W, C)),
    C of 1 to 4, to (x / 255 - mean[c]) / std[c], computed as one FMA x * s[c] + t[c] with
    s = 1 / (255 std) and t = -mean / std (float64 on the host, passed to the kernel as float32
    by value: nothing is copied to the GPU per call). layout "NCHW" gives (N, C, H, W) (or
    (C, H, W)), "NHWC" keeps img's layout. out_dtype float32, float16 or bfloat16.

Layouts: every array must be C-contiguous (a view of any other layout is a ValueError naming
it: pass a contiguous copy, e.g. cupy.ascontiguousarray). Arrays whose pointers are not 16-byte
aligned (a view at an offset) run element by element, correct but slower. Results are new
C-contiguous arrays unless out= is given. Launches go on CuPy's current stream of the data's
device, or on `stream=`. Every check raises a TypeError / ValueError naming the argument before
anything is launched.
"""
import math
import numbers

import numpy

from ._launch import (DTYPE_NAMES, NUMPY_DTYPES, allocating_on, as_array, hold_if_capturing, launch, stream_pointer,
                      wait_for_producer)
from . import _constants, _modules, _rows, config

FAMILY = "image"

THREADS = _constants.IMAGE_THREADS
PIXELS = _constants.IMAGE_PIXELS
REDUCE_UNROLL = _constants.IMAGE_REDUCE_UNROLL
FLAG_LO, FLAG_HI, FLAG_CLIP = _constants.IMAGE_FLAG_LO, _constants.IMAGE_FLAG_HI, _constants.IMAGE_FLAG_CLIP

SUFFIX = {"uint8": "u8", "uint16": "u16", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}
ITEMSIZE = {"uint8": 1, "uint16": 2, "float32": 4, "float16": 2, "bfloat16": 2}
GRAY_DTYPES = ("uint8", "float32", "float16")
VOLUME_DTYPES = ("uint8", "uint16", "float16", "float32")
FLOAT_OUT = ("float32", "float16", "bfloat16")
LAYOUTS = ("NCHW", "NHWC")
MAX_CHANNELS = 4

# The family's table: kernel base name -> argument names. Each base exists once per dtype
# suffix listed in ENTRY_POINTS below.
GRAY_ARGS = ("x", "y", "images", "pixels", "vec")
KERNELS = {
    "rgb_to_gray_fwd_hwc": GRAY_ARGS,
    "rgb_to_gray_fwd_chw": GRAY_ARGS,
    "to_tensor_normalize_fwd_nchw": GRAY_ARGS + ("s0", "s1", "s2", "s3", "t0", "t1", "t2", "t3"),
    "to_tensor_normalize_fwd_nhwc": GRAY_ARGS + ("s0", "s1", "s2", "s3", "t0", "t1", "t2", "t3"),
    "volume_minmax": ("x", "partials", "n", "vec"),
    "normalize_volume_fwd": ("x", "y", "n", "partials", "count", "lo", "hi", "flags", "vec"),
}
KINDS = {"rgb_to_gray_fwd_hwc": "ppqqq", "rgb_to_gray_fwd_chw": "ppqqq",
         "to_tensor_normalize_fwd_nchw": "ppqqq" + "f" * 8, "to_tensor_normalize_fwd_nhwc": "ppqqq" + "f" * 8,
         "volume_minmax": "ppqq", "normalize_volume_fwd": "ppqpqffqq"}


def _entry_points():
    names = []
    for layout in ("hwc", "chw"):
        names += [f"rgb_to_gray_fwd_{layout}_{SUFFIX[a]}_{SUFFIX[b]}" for a in GRAY_DTYPES for b in GRAY_DTYPES]
    for layout in ("nchw", "nhwc"):
        names += [f"to_tensor_normalize_fwd_{layout}_c{c}_{SUFFIX[b]}" for c in range(1, MAX_CHANNELS + 1)
                  for b in FLOAT_OUT]
    names += [f"volume_minmax_{SUFFIX[a]}" for a in VOLUME_DTYPES]
    names += [f"normalize_volume_fwd_{SUFFIX[a]}_{SUFFIX[b]}" for a in VOLUME_DTYPES for b in FLOAT_OUT]
    return frozenset(names)


ENTRY_POINTS = _entry_points()
# Every entry point -> the fatbin holding it (tests/test_build.py and `python -m rawops info` read it).
FAMILY_OF = {name: FAMILY for name in sorted(ENTRY_POINTS)}


# ------------------------------------------------------------------------------ launch plans (pure)
def grid(work, resident):
    """Blocks of a grid-stride launch over `work` items a thread each: enough for every item, at
    most `resident` (the blocks of the kernel the device holds at once: one wave). normalize_volume's
    map, whose every block re-reduces the min/max partials first (a covering grid: 461.6 vs 392.5 us
    at 512^3 u16, H100)."""
    return max(1, min(-(-work // THREADS), resident))


def covering(work):
    """Blocks of a grid covering `work` items a thread once (rgb_to_gray, to_tensor_normalize):
    short blocks handed out in order balance the SMs; a resident grid walking the items
    grid-stride was 4-9% slower (to_tensor f32 8K 191.8 vs 177.1 us, H100: docs/performance.md)."""
    return max(1, min(-(-work // THREADS), _rows.MAX_GRID))  # past gridDim.x's limit the kernels walk on


def per_step(in_dtype, out_dtype):
    """Pixels (elements) a thread moves per step (kernels/image.cu pixels_per_step): PIXELS bytes
    of the wider of the two types, so that every plane's stores are a word a thread."""
    return PIXELS // max(ITEMSIZE[in_dtype], ITEMSIZE[out_dtype])


def chunks(images, pixels, per):
    """Work items of rgb_to_gray / to_tensor_normalize: `per` pixels of one image each."""
    return images * -(-pixels // per)


def gray_vec(planar, pixels, per, x_ptr, y_ptr):
    """1 when every full chunk starts word-aligned in x and y: both pointers 16-byte aligned and,
    planar, a plane a whole number of chunks (so every plane and image starts aligned)."""
    return int(x_ptr % 16 == 0 and y_ptr % 16 == 0 and (not planar or pixels % per == 0))


def to_tensor_vec(planar, images, pixels, channels, per, x_ptr, y_ptr):
    """gray_vec for to_tensor_normalize: planar output needs whole chunks a plane unless there is
    only one plane (one image, one channel); the interleaved map only aligned pointers."""
    whole = not planar or pixels % per == 0 or (images == 1 and channels == 1)
    return int(x_ptr % 16 == 0 and y_ptr % 16 == 0 and whole)


def volume_plan(n, in_name, out_name, reduce_resident, map_resident):
    """(min/max blocks, map blocks) of normalize_volume over n elements: the min/max pass reads
    REDUCE_UNROLL 16-byte vectors a thread per step, the map pass 16 bytes of the wider type
    (and the same elements of the narrower); each grid at most the blocks of its kernel the
    device holds at once (reduce_resident, map_resident)."""
    per_vector = 16 // ITEMSIZE[in_name]
    reduce_blocks = max(1, min(-(-n // (per_vector * THREADS * REDUCE_UNROLL)), reduce_resident))
    per_chunk = 16 // max(ITEMSIZE[in_name], ITEMSIZE[out_name])
    return reduce_blocks, grid(-(-n // per_chunk), map_resident)


# ------------------------------------------------------------------------------ argument checks (pure)
def dtype_arg(value, name, allowed):
    """The dtype name ('uint8', 'float32', ...) of a dtype argument: a NumPy / CuPy dtype, a
    scalar type (numpy.uint8) or its name; TypeError / ValueError naming `name`."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = numpy.dtype(value).name
        except TypeError:
            raise TypeError(f"{name} must be a dtype or its name (one of {', '.join(allowed)}), "
                            f"got {value!r}") from None
    if text not in allowed:
        raise ValueError(f"{name} is {text!r}; expected one of {', '.join(allowed)}")
    return text


def gray_shapes(shape, dtype, channels_last, name="img"):
    """(output shape, images, pixels, planar) of rgb_to_gray on an image of `shape` and dtype
    name `dtype`; TypeError / ValueError naming `name`."""
    if dtype not in GRAY_DTYPES:
        raise TypeError(f"{name} has dtype {dtype}; rgb_to_gray supports {', '.join(GRAY_DTYPES)}")
    if not isinstance(channels_last, (bool, numpy.bool_)):
        raise TypeError(f"channels_last must be a bool, got {type(channels_last).__name__}")
    if len(shape) not in (3, 4):
        expected = "(H, W, 3) or (N, H, W, 3)" if channels_last else "(3, H, W) or (N, 3, H, W)"
        raise ValueError(f"{name} has shape {tuple(shape)}; expected {expected}")
    if channels_last:
        if shape[-1] != 3:
            raise ValueError(f"{name} has {shape[-1]} channels in its last dim (shape {tuple(shape)}); rgb_to_gray "
                             "needs 3 (R, G, B); a planar image takes channels_last=False")
        images, pixels = 1, math.prod(shape[:-1])
        return tuple(shape[:-1]), images, pixels, False
    if shape[-3] != 3:
        raise ValueError(f"{name} has {shape[-3]} channels in dim {len(shape) - 3} (shape {tuple(shape)}); "
                         "rgb_to_gray needs 3 planes (R, G, B); a channels-last image takes channels_last=True")
    images = shape[0] if len(shape) == 4 else 1
    return tuple(shape[:-3]) + (1,) + tuple(shape[-2:]), images, shape[-2] * shape[-1], True


def volume_bounds(lo, hi, clip):
    """(lo, hi, flags) for the map kernel: a bound not given (None) comes from the min/max pass;
    given ones are finite reals with lo < hi. TypeError / ValueError naming the argument."""
    flags = FLAG_CLIP if _bool(clip, "clip") else 0
    values = []
    for value, name, flag in ((lo, "lo", FLAG_LO), (hi, "hi", FLAG_HI)):
        if value is None:
            flags |= flag
            values.append(0.0)
            continue
        if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, (numbers.Real, numpy.floating,
                                                                            numpy.integer)):
            raise TypeError(f"{name} must be a real number or None, got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        values.append(value)
    if lo is not None and hi is not None and not values[0] < values[1]:
        raise ValueError(f"lo ({values[0]}) must be below hi ({values[1]})")
    return values[0], values[1], flags


def _bool(value, name):
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def to_tensor_shapes(shape, dtype, layout, name="img"):
    """(output shape, images, pixels, channels, planar) of to_tensor_normalize."""
    if dtype != "uint8":
        raise TypeError(f"{name} has dtype {dtype}; to_tensor_normalize takes uint8 images")
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a string ('NCHW' or 'NHWC'), got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout is {layout!r}; expected 'NCHW' or 'NHWC'")
    if len(shape) not in (3, 4):
        raise ValueError(f"{name} has shape {tuple(shape)}; expected (H, W, C) or (N, H, W, C)")
    channels = shape[-1]
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"{name} has {channels} channels (shape {tuple(shape)}); to_tensor_normalize takes 1 to "
                         f"{MAX_CHANNELS} in the last dim")
    images = shape[0] if len(shape) == 4 else 1
    pixels = shape[-3] * shape[-2]
    planar = layout == "NCHW"
    if planar:
        out_shape = tuple(shape[:-3]) + (channels,) + tuple(shape[-3:-1])
    else:
        out_shape = tuple(shape)
    return out_shape, images, pixels, channels, planar


def normalize_constants(mean, std, channels):
    """(scale, shift) of C floats each, padded to MAX_CHANNELS: scale = 1 / (255 std),
    shift = -mean / std; mean and std are sequences of `channels` finite reals, std nonzero."""
    values = {}
    for seq, name in ((mean, "mean"), (std, "std")):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__"):
            raise TypeError(f"{name} must be a sequence of {channels} numbers, got {type(seq).__name__}")
        items = list(seq.tolist() if hasattr(seq, "tolist") else seq)
        if len(items) != channels:
            raise ValueError(f"{name} has {len(items)} values; img has {channels} channels")
        out = []
        for v in items:
            if isinstance(v, (bool, numpy.bool_)) or not isinstance(v, (numbers.Real, numpy.floating, numpy.integer)):
                raise TypeError(f"{name} must hold real numbers, got {type(v).__name__}")
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
            out.append(v)
        values[name] = out
    if any(s == 0 for s in values["std"]):
        raise ValueError(f"std must be nonzero, got {values['std']}")
    scale = [1.0 / (255.0 * s) for s in values["std"]]
    shift = [-m / s for m, s in zip(values["mean"], values["std"])]
    pad = [0.0] * (MAX_CHANNELS - channels)
    return scale + pad, shift + pad


# ------------------------------------------------------------------------------ launches (pointers)
def _function(name, device):
    return _modules.function_pointer(FAMILY, name, device)


def _resident(function, device):
    """Blocks of an image kernel (IMAGE_THREADS, no dynamic shared memory) the device holds at once."""
    return _modules.resident_blocks(function, THREADS, 0, device)


def launch_rgb_to_gray(device, stream, x, y, in_dtype, out_dtype, images, pixels, planar):
    """One launch on pointers checked by the caller; images * pixels > 0."""
    base = "rgb_to_gray_fwd_chw" if planar else "rgb_to_gray_fwd_hwc"
    per = per_step(in_dtype, out_dtype)
    vec = gray_vec(planar, pixels, per, x, y)
    function = _function(f"{base}_{SUFFIX[in_dtype]}_{SUFFIX[out_dtype]}", device)
    launch(function, (covering(chunks(images, pixels, per)),), THREADS, 0, stream, (x, y, images, pixels, vec),
           KINDS[base], device)


def launch_to_tensor(device, stream, x, y, out_dtype, images, pixels, channels, planar, scale, shift):
    base = "to_tensor_normalize_fwd_nchw" if planar else "to_tensor_normalize_fwd_nhwc"
    per = per_step("uint8", out_dtype)
    vec = to_tensor_vec(planar, images, pixels, channels, per, x, y)
    # planar: chunks of `per` pixels of one image; interleaved: of `per` of all the elements
    work = chunks(images, pixels, per) if planar else -(-(images * pixels * channels) // per)
    function = _function(f"{base}_c{channels}_{SUFFIX[out_dtype]}", device)
    launch(function, (covering(work),), THREADS, 0, stream,
           (x, y, images, pixels, vec, *scale, *shift), KINDS[base], device)


def _volume_plan(n, in_dtype, out_dtype, device):
    """volume_plan on `device`, with (min/max, map) kernel pointers."""
    minmax = _function(f"volume_minmax_{SUFFIX[in_dtype]}", device)
    normalize = _function(f"normalize_volume_fwd_{SUFFIX[in_dtype]}_{SUFFIX[out_dtype]}", device)
    plan = volume_plan(n, in_dtype, out_dtype, _resident(minmax, device), _resident(normalize, device))
    return plan, minmax, normalize


def partials_size(n, in_dtype, out_dtype, device):
    """float32 values of the min/max scratch (two a min/max block)."""
    return 2 * _volume_plan(n, in_dtype, out_dtype, device)[0][0]


def launch_normalize_volume(device, stream, x, y, n, in_dtype, out_dtype, lo, hi, flags, partials):
    """The min/max pass (where flags take a bound from it; partials: float32 scratch of
    partials_size values, else 0) and the map pass; n > 0."""
    (reduce_blocks, map_blocks), minmax, normalize = _volume_plan(n, in_dtype, out_dtype, device)
    count, dependent = 0, False
    if flags & (FLAG_LO | FLAG_HI):
        launch(minmax, (reduce_blocks,), THREADS, 0, stream, (x, partials, n, int(x % 16 == 0)), KINDS["volume_minmax"],
               device)
        count = reduce_blocks
        # The map waits for the min/max grid before its first read of the partials (kernels/image.cu),
        # so on sm_90+ it is launched programmatically dependent: its launch overlaps that grid's end.
        dependent = config.dependent_launch and _modules.compute_capability(device) >= 90
    launch(normalize, (map_blocks,), THREADS, 0, stream,
           (x, y, n, partials, count, lo, hi, flags, int(x % 16 == 0 and y % 16 == 0)), KINDS["normalize_volume_fwd"],
           device, dependent)


# ------------------------------------------------------------------------------ CuPy API
def _input(obj, name):
    a = as_array(obj, name)
    if a.dtype < 0:
        raise TypeError(f"{name} has dtype {a.dtype_text}, which rawops' image ops do not take")
    _rows._dense(a)
    return a


def _out(obj, shape, dtype, source, in_place_ok=False):
    """out=: `shape` and dtype name `dtype`, C-contiguous, writable, disjoint from source (or
    exactly it, where in_place_ok)."""
    o = as_array(obj, "out")
    if o.dtype < 0 or DTYPE_NAMES[o.dtype] != dtype:
        raise TypeError(f"out has dtype {o.dtype_text}, expected {dtype}")
    if tuple(o.shape) != tuple(shape):
        raise ValueError(f"out has shape {o.shape}, expected {tuple(shape)}")
    _rows._dense(o)
    if o.readonly:
        raise ValueError("out is read-only")
    a, b = _rows.extent(o), _rows.extent(source)
    if _rows._overlap(a, b) and not (in_place_ok and a == b):
        hint = f"pass out={source.name} exactly, or a separate array" if in_place_ok else "pass a separate array"
        raise ValueError(f"out overlaps {source.name}; {hint}")
    return o


def _result(shape, dtype, O):
    """(the array returned, its pointer): out= itself, else a new C-contiguous CuPy array."""
    import cupy

    if O is not None:
        return O.obj, O.ptr
    result = cupy.empty(shape, NUMPY_DTYPES[DTYPE_NAMES.index(dtype)])
    return result, result.data.ptr


def rgb_to_gray(img, out_dtype=None, *, channels_last=True, out=None, stream=None):
    """BT.601 gray of an RGB image (module docstring): uint8 -> uint8 bit-exact with OpenCV's
    cvtColor(COLOR_RGB2GRAY); channels_last=False for planar (N, 3, H, W) images."""
    import cupy

    x = _input(img, "img")
    in_dtype = DTYPE_NAMES[x.dtype]
    out_shape, images, pixels, planar = gray_shapes(x.shape, in_dtype, channels_last)
    out_dtype = in_dtype if out_dtype is None else dtype_arg(out_dtype, "out_dtype", GRAY_DTYPES)
    O = _out(out, out_shape, out_dtype, x) if out is not None else None
    device = _rows.one_device(x, O)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(x, s)
        result, y = _result(out_shape, out_dtype, O)
        if images * pixels:
            launch_rgb_to_gray(device, s, x.ptr, y, in_dtype, out_dtype, images, pixels, planar)
    return result


def normalize_volume(vol, lo=None, hi=None, clip=True, out_dtype="float32", *, out=None, stream=None):
    """(vol - lo) / (hi - lo), clipped to [0, 1] when clip; lo / hi not given: vol's min / max,
    found on the GPU in the same call (module docstring)."""
    import cupy

    x = _input(vol, "vol")
    in_dtype = DTYPE_NAMES[x.dtype]
    if in_dtype not in VOLUME_DTYPES:
        raise TypeError(f"vol has dtype {in_dtype}; normalize_volume supports {', '.join(VOLUME_DTYPES)}")
    lo, hi, flags = volume_bounds(lo, hi, clip)
    out_dtype = dtype_arg(out_dtype, "out_dtype", FLOAT_OUT)
    O = _out(out, x.shape, out_dtype, x, in_place_ok=out_dtype == in_dtype) if out is not None else None
    device = _rows.one_device(x, O)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(x, s)
        result, y = _result(x.shape, out_dtype, O)
        if x.size:
            partials = None
            if flags & (FLAG_LO | FLAG_HI):
                partials = cupy.empty(partials_size(x.size, in_dtype, out_dtype, device), numpy.float32)
            launch_normalize_volume(device, s, x.ptr, y, x.size, in_dtype, out_dtype, lo, hi, flags,
                                    partials.data.ptr if partials is not None else 0)
            hold_if_capturing(s, partials)
    return result


def to_tensor_normalize(img, mean, std, out_dtype="float32", layout="NCHW", *, out=None, stream=None):
    """torchvision's ToTensor + Normalize in one pass: uint8 (N, H, W, C) to (x / 255 - mean[c]) /
    std[c] in (N, C, H, W) (layout="NHWC": (N, H, W, C)); (H, W, C) gives (C, H, W)."""
    import cupy

    x = _input(img, "img")
    out_shape, images, pixels, channels, planar = to_tensor_shapes(x.shape, DTYPE_NAMES[x.dtype], layout)
    scale, shift = normalize_constants(mean, std, channels)
    out_dtype = dtype_arg(out_dtype, "out_dtype", FLOAT_OUT)
    O = _out(out, out_shape, out_dtype, x) if out is not None else None
    device = _rows.one_device(x, O)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(x, s)
        result, y = _result(out_shape, out_dtype, O)
        if images * pixels:
            launch_to_tensor(device, s, x.ptr, y, out_dtype, images, pixels, channels, planar, scale,
                             shift)
    return result
