"""The image family's contract (rgb_to_gray, normalize_volume, to_tensor_normalize): argument
checks and launch plans without a GPU; on a GPU, against OpenCV (bit-exact uint8 gray),
torch in float32 / float64 and torchvision, through the CuPy API and the torch adapter."""
import math

import numpy as np
import pytest

import rawops.image as im
from rawops.image import normalize_volume, rgb_to_gray, to_tensor_normalize
from test_validation import BASE, FAR, FakeCAI, assert_passes_validation


def u8(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "|u1", ptr, **kw)


def u16(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<u2", ptr, **kw)


def f32(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f4", ptr, **kw)


def f16(shape, ptr=BASE, **kw):
    return FakeCAI(shape, "<f2", ptr, **kw)


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def raises(error, match, fn, *args, **kwargs):
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)


# ------------------------------------------------------------------------------ positive controls
@pytest.mark.parametrize("make", [u8, f32, f16])
def test_valid_rgb_to_gray_calls_get_past_validation(make):
    assert_passes_validation(rgb_to_gray, make((4, 5, 3)))
    assert_passes_validation(rgb_to_gray, make((2, 4, 5, 3)), "float32", out=f32((2, 4, 5), ptr=FAR))
    assert_passes_validation(rgb_to_gray, make((2, 3, 4, 5)), np.uint8, channels_last=False,
                             out=u8((2, 1, 4, 5), ptr=FAR))
    assert_passes_validation(rgb_to_gray, make((3, 4, 5)), channels_last=False)


@pytest.mark.parametrize("make", [u8, u16, f32, f16])
def test_valid_normalize_volume_calls_get_past_validation(make):
    assert_passes_validation(normalize_volume, make((4, 5, 6)))
    assert_passes_validation(normalize_volume, make((4, 5, 6)), 0, 1.5, False, "float16", out=f16((4, 5, 6), ptr=FAR))
    assert_passes_validation(normalize_volume, make((7,)), lo=2)
    assert_passes_validation(normalize_volume, make(()), hi=np.float32(3))


def test_normalize_volume_in_place_is_allowed_where_the_dtypes_match():
    v = f32((4, 5, 6))
    assert_passes_validation(normalize_volume, v, out=v)
    h = f16((4, 5, 6))
    assert_passes_validation(normalize_volume, h, out_dtype="float16", out=h)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_valid_to_tensor_normalize_calls_get_past_validation(channels):
    m, s = [0.5] * channels, [0.25] * channels
    assert_passes_validation(to_tensor_normalize, u8((2, 4, 5, channels)), m, s)
    assert_passes_validation(to_tensor_normalize, u8((4, 5, channels)), m, s, "bfloat16", "NHWC")
    assert_passes_validation(to_tensor_normalize, u8((2, 4, 5, channels)), np.array(m), tuple(s), np.float16,
                             out=f16((2, channels, 4, 5), ptr=FAR))


# ------------------------------------------------------------------------------ rgb_to_gray checks
def test_rgb_to_gray_refuses_wrong_channel_counts_and_ranks():
    raises(ValueError, r"img has 4 channels in its last dim", rgb_to_gray, u8((4, 5, 4)))
    raises(ValueError, r"img has 4 channels in dim 1", rgb_to_gray, u8((2, 4, 5, 5)), channels_last=False)
    raises(ValueError, r"img has shape \(4, 3\)", rgb_to_gray, u8((4, 3)))
    raises(ValueError, r"img has shape \(1, 2, 4, 5, 3\)", rgb_to_gray, u8((1, 2, 4, 5, 3)))
    # channels-last W == 3 is never read as planar unless told
    assert_passes_validation(rgb_to_gray, u8((3, 4, 3)))
    raises(ValueError, r"img has 4 channels in dim 0", rgb_to_gray, u8((4, 5, 3)), channels_last=False)


def test_rgb_to_gray_refuses_wrong_dtypes():
    raises(TypeError, r"img has dtype uint16; rgb_to_gray supports", rgb_to_gray, u16((4, 5, 3)))
    raises(TypeError, r"img has dtype <i4", rgb_to_gray, FakeCAI((4, 5, 3), "<i4"))
    raises(ValueError, r"out_dtype is 'int32'", rgb_to_gray, u8((4, 5, 3)), "int32")
    raises(ValueError, r"out_dtype is 'bfloat16'", rgb_to_gray, u8((4, 5, 3)), "bfloat16")
    raises(TypeError, r"out_dtype must be a dtype", rgb_to_gray, u8((4, 5, 3)), object())
    raises(TypeError, r"channels_last must be a bool", rgb_to_gray, u8((4, 5, 3)), channels_last="NHWC")


def test_rgb_to_gray_refuses_bad_out():
    raises(TypeError, r"out has dtype float32, expected uint8", rgb_to_gray, u8((4, 5, 3)), out=f32((4, 5), ptr=FAR))
    raises(ValueError, r"out has shape \(4, 5, 1\), expected \(4, 5\)", rgb_to_gray, u8((4, 5, 3)),
           out=u8((4, 5, 1), ptr=FAR))
    raises(ValueError, r"out has shape \(2, 4, 5\), expected \(2, 1, 4, 5\)", rgb_to_gray, u8((2, 3, 4, 5)),
           channels_last=False, out=u8((2, 4, 5), ptr=FAR))
    raises(ValueError, r"out overlaps img", rgb_to_gray, u8((4, 5, 3)), out=u8((4, 5), ptr=BASE + 8))
    raises(ValueError, r"out is read-only", rgb_to_gray, u8((4, 5, 3)), out=u8((4, 5), ptr=FAR, readonly=True))
    raises(ValueError, r"out is not C-contiguous", rgb_to_gray, u8((4, 5, 3)), out=u8((4, 5), ptr=FAR, strides=(1, 4)))


def test_rgb_to_gray_refuses_strided_and_misaligned_images():
    raises(ValueError, r"img is not C-contiguous", rgb_to_gray, u8((4, 5, 3), strides=(30, 6, 1)))
    raises(ValueError, r"img is misaligned", rgb_to_gray, f32((4, 5, 3), ptr=BASE + 2))


def test_host_arrays_are_refused_naming_the_argument():
    raises(TypeError, r"img is (a host array|in host memory)", rgb_to_gray, np.zeros((4, 5, 3), np.uint8))
    raises(TypeError, r"vol is (a host array|in host memory)", normalize_volume, np.zeros(5, np.float32))
    raises(TypeError, r"img is (a host array|in host memory)", to_tensor_normalize, np.zeros((4, 5, 3), np.uint8),
           MEAN, STD)


# ------------------------------------------------------------------------------ normalize_volume checks
def test_normalize_volume_refuses_bad_bounds():
    v = f32((4, 5))
    raises(ValueError, r"lo \(2.0\) must be below hi \(2.0\)", normalize_volume, v, 2, 2)
    raises(ValueError, r"lo \(3.0\) must be below hi \(1.0\)", normalize_volume, v, 3.0, 1.0)
    raises(ValueError, r"lo must be finite", normalize_volume, v, float("nan"))
    raises(ValueError, r"hi must be finite", normalize_volume, v, None, float("inf"))
    raises(TypeError, r"lo must be a real number or None, got str", normalize_volume, v, "0")
    raises(TypeError, r"hi must be a real number or None, got bool", normalize_volume, v, 0, True)
    raises(TypeError, r"clip must be a bool, got int", normalize_volume, v, clip=1)


def test_normalize_volume_refuses_wrong_dtypes_and_out():
    raises(TypeError, r"vol has dtype <i4", normalize_volume, FakeCAI((4,), "<i4"))
    raises(ValueError, r"out_dtype is 'uint8'", normalize_volume, f32((4,)), out_dtype="uint8")
    raises(TypeError, r"out has dtype float16, expected float32", normalize_volume, u8((4, 5)),
           out=f16((4, 5), ptr=FAR))
    raises(ValueError, r"out has shape \(20,\), expected \(4, 5\)", normalize_volume, u8((4, 5)),
           out=f32((20,), ptr=FAR))
    raises(ValueError, r"out overlaps vol; pass out=vol exactly", normalize_volume, f32((4, 5)),
           out=f32((4, 5), ptr=BASE + 16))
    raises(TypeError, r"out has dtype uint8, expected float32", normalize_volume, u8((4, 5)), out=u8((4, 5)))
    raises(ValueError, r"out overlaps vol; pass a separate array", normalize_volume, u16((4, 8)),
           out_dtype="float16", out=f16((4, 8), ptr=BASE + 2))
    raises(ValueError, r"vol is not C-contiguous", normalize_volume, f32((4, 5), strides=(4, 16)))


# ------------------------------------------------------------------------------ to_tensor_normalize checks
def test_to_tensor_normalize_refuses_bad_images():
    raises(ValueError, r"img has 5 channels", to_tensor_normalize, u8((4, 5, 5)), [0] * 5, [1] * 5)
    raises(ValueError, r"img has 0 channels", to_tensor_normalize, u8((4, 5, 0)), [], [])
    raises(TypeError, r"img has dtype float32; to_tensor_normalize takes uint8", to_tensor_normalize,
           f32((4, 5, 3)), MEAN, STD)
    raises(ValueError, r"img has shape \(5, 3\)", to_tensor_normalize, u8((5, 3)), MEAN, STD)


def test_to_tensor_normalize_refuses_bad_mean_and_std():
    img = u8((2, 4, 5, 3))
    raises(ValueError, r"mean has 2 values; img has 3 channels", to_tensor_normalize, img, MEAN[:2], STD)
    raises(ValueError, r"std has 4 values; img has 3 channels", to_tensor_normalize, img, MEAN, STD + (1,))
    raises(ValueError, r"std must be nonzero", to_tensor_normalize, img, MEAN, (0.2, 0.0, 0.2))
    raises(ValueError, r"mean must be finite", to_tensor_normalize, img, (0.1, float("nan"), 0.1), STD)
    raises(TypeError, r"mean must be a sequence of 3 numbers, got float", to_tensor_normalize, img, 0.5, STD)
    raises(TypeError, r"std must be a sequence of 3 numbers, got str", to_tensor_normalize, img, MEAN, "abc")
    raises(TypeError, r"std must hold real numbers, got str", to_tensor_normalize, img, MEAN, ("a", 1, 1))


def test_to_tensor_normalize_refuses_bad_layout_dtype_and_out():
    img = u8((2, 4, 5, 3))
    raises(ValueError, r"layout is 'CHW'", to_tensor_normalize, img, MEAN, STD, layout="CHW")
    raises(TypeError, r"layout must be a string", to_tensor_normalize, img, MEAN, STD, layout=1)
    raises(ValueError, r"out_dtype is 'uint8'", to_tensor_normalize, img, MEAN, STD, "uint8")
    raises(ValueError, r"out has shape \(2, 4, 5, 3\), expected \(2, 3, 4, 5\)", to_tensor_normalize, img, MEAN, STD,
           out=f32((2, 4, 5, 3), ptr=FAR))
    raises(TypeError, r"out has dtype float16, expected float32", to_tensor_normalize, img, MEAN, STD,
           out=f16((2, 3, 4, 5), ptr=FAR))
    raises(ValueError, r"out overlaps img", to_tensor_normalize, img, MEAN, STD, out=f32((2, 3, 4, 5), ptr=BASE))


# ------------------------------------------------------------------------------ plans and constants
def test_opencv_weights_are_bt601_in_15_bits():
    scale = 1 << im._constants.IMAGE_GRAY_SHIFT
    weights = (im._constants.IMAGE_GRAY_R, im._constants.IMAGE_GRAY_G, im._constants.IMAGE_GRAY_B)
    assert sum(weights) == scale
    # R and G rounded; B the remainder (3735, where rounding gives 3736): the sum is exactly 2^15,
    # so white stays 255
    assert weights[:2] == (round(0.299 * scale), round(0.587 * scale))
    assert abs(weights[2] - 0.114 * scale) < 1


def test_grid_is_one_wave_of_the_resident_blocks():
    # resident: the blocks of the kernel the device holds at once (6 an SM of 132 for a
    # 40-register kernel of 256 threads on an H100; the occupancy API gives it at launch)
    assert im.grid(1, 132 * 6) == 1
    assert im.grid(im.THREADS * 5 + 1, 132 * 6) == 6
    assert im.grid(10**9, 132 * 6) == 132 * 6
    assert im.grid(10**9, 80 * 8) == 80 * 8
    assert im.grid(10**9, 0) == 1


def test_the_maps_grid_covers_every_chunk_once():
    assert im.covering(1) == 1
    assert im.covering(im.THREADS * 5 + 1) == 6
    assert im.covering(10**9) == -(-10**9 // im.THREADS)
    assert im.covering(im.THREADS << 32) == (1 << 31) - 1  # gridDim.x's limit: the kernels walk on


def test_a_thread_moves_16_bytes_of_the_wider_type():
    assert im.per_step("uint8", "uint8") == 16
    assert im.per_step("uint8", "float32") == im.per_step("float32", "uint8") == 4
    assert im.per_step("float16", "float16") == im.per_step("uint8", "bfloat16") == 8


def test_chunks_are_pixels_of_one_image():
    assert im.chunks(1, 2160 * 3840, 16) == 2160 * 3840 // 16
    assert im.chunks(3, 17, 16) == 3 * 2  # 16 + 1 pixels an image
    assert im.chunks(3, 17, 4) == 3 * 5
    assert im.chunks(5, 0, 4) == 0


def test_vector_paths_need_alignment_and_whole_chunks_a_plane():
    assert im.gray_vec(False, 91, 16, 256, 512) == 1  # interleaved: the tail chunk goes scalar in the kernel
    assert im.gray_vec(False, 96, 16, 257, 512) == 0
    assert im.gray_vec(True, 96, 16, 256, 512) == 1
    assert im.gray_vec(True, 91, 16, 256, 512) == 0  # the G and B planes would start off alignment
    assert im.gray_vec(True, 20, 4, 256, 512) == 1 and im.gray_vec(True, 20, 8, 256, 512) == 0
    assert im.to_tensor_vec(True, 4, 224 * 224, 3, 4, 0, 256) == 1
    assert im.to_tensor_vec(True, 4, 7 * 13, 3, 4, 0, 256) == 0
    assert im.to_tensor_vec(True, 1, 7 * 13, 1, 4, 0, 256) == 1  # one plane only
    assert im.to_tensor_vec(False, 4, 7 * 13, 3, 4, 0, 256) == 1
    assert im.to_tensor_vec(False, 4, 7 * 13, 3, 4, 0, 260) == 0


def test_volume_plan():
    reduce_blocks, map_blocks = im.volume_plan(512 ** 3, "uint16", "float32", 132 * 6, 132 * 8)
    assert (reduce_blocks, map_blocks) == (132 * 6, 132 * 8)
    # 100 uint8 voxels: one min/max block; one map block (4 voxels a thread: a word of float32)
    assert im.volume_plan(100, "uint8", "float32", 132 * 6, 132 * 8) == (1, 1)
    per = 4 * im.THREADS  # float32 -> float16: 4 elements a step (16 bytes of float32)
    assert im.volume_plan(3 * per, "float32", "float16", 132 * 6, 132 * 8)[1] == 3
    assert im.volume_plan(3 * per, "uint8", "float16", 132 * 6, 132 * 8)[1] == 2  # 8 a step (16 bytes of float16)


def test_shapes():
    assert im.gray_shapes((4, 5, 3), "uint8", True) == ((4, 5), 1, 20, False)
    assert im.gray_shapes((2, 4, 5, 3), "float16", True) == ((2, 4, 5), 1, 40, False)
    assert im.gray_shapes((2, 3, 4, 5), "float32", False) == ((2, 1, 4, 5), 2, 20, True)
    assert im.gray_shapes((3, 4, 5), "uint8", False) == ((1, 4, 5), 1, 20, True)
    assert im.to_tensor_shapes((2, 4, 5, 3), "uint8", "NCHW") == ((2, 3, 4, 5), 2, 20, 3, True)
    assert im.to_tensor_shapes((4, 5, 1), "uint8", "NCHW") == ((1, 4, 5), 1, 20, 1, True)
    assert im.to_tensor_shapes((4, 5, 4), "uint8", "NHWC") == ((4, 5, 4), 1, 20, 4, False)


def test_normalize_constants_are_one_fma_of_torchvision_arithmetic():
    scale, shift = im.normalize_constants(MEAN, STD, 3)
    assert len(scale) == len(shift) == im.MAX_CHANNELS and scale[3] == shift[3] == 0
    for c in range(3):
        for x in (0, 1, 128, 255):
            assert math.isclose(x * scale[c] + shift[c], (x / 255 - MEAN[c]) / STD[c], rel_tol=1e-12, abs_tol=1e-12)


def test_every_entry_point_is_in_the_family_table():
    assert len(im.ENTRY_POINTS) == 2 * 9 + 2 * 4 * 3 + 4 + 4 * 3
    assert set(im.FAMILY_OF) == im.ENTRY_POINTS and set(im.FAMILY_OF.values()) == {"image"}
    for name in im.ENTRY_POINTS:
        assert any(name.startswith(base) for base in im.KERNELS), name
    assert "rgb_to_gray_fwd_hwc_u8_u8" in im.ENTRY_POINTS and "normalize_volume_fwd_u16_bf16" in im.ENTRY_POINTS
    for base, args in im.KERNELS.items():
        assert len(im.KINDS[base]) == len(args)


def test_the_kernel_source_defines_every_entry_point():
    import os
    import re

    from rawops import _modules

    with open(os.path.join(_modules.kernel_source_dir(), "image.cu")) as f:
        source = f.read()
    gray = {f"rgb_to_gray_fwd_{layout}_{a}_{b}" for layout in ("hwc", "chw") for a in ("u8", "f32", "f16")
            for b in ("u8", "f32", "f16")}
    to_tensor = {f"to_tensor_normalize_fwd_{layout}_c{c}_{b}" for layout in ("nchw", "nhwc") for c in (1, 2, 3, 4)
                 for b in ("f32", "f16", "bf16")}
    volumes = re.findall(r"^RAWOPS_VOLUME\(\w+, (\w+)\)", source, flags=re.M)
    volume = {f"volume_minmax_{s}" for s in volumes} | {f"normalize_volume_fwd_{s}_{b}" for s in volumes
                                                         for b in ("f32", "f16", "bf16")}
    assert gray | to_tensor | volume == im.ENTRY_POINTS


def test_adapter_refuses_non_tensors_and_host_tensors():
    torch = pytest.importorskip("torch")
    import rawops.torch_adapter.image as ta

    raises(TypeError, r"img must be a torch.Tensor, got ndarray", ta.rgb_to_gray, np.zeros((4, 5, 3), np.uint8))
    raises(ValueError, r"img is on cpu", ta.rgb_to_gray, torch.zeros((4, 5, 3), dtype=torch.uint8))
    raises(ValueError, r"vol is on cpu", ta.normalize_volume, torch.zeros(5))
    raises(ValueError, r"img is on cpu", ta.to_tensor_normalize, torch.zeros((4, 5, 3), dtype=torch.uint8), MEAN, STD)


# ====================================================================================== GPU
# Everything below runs on a GPU (marker `gpu`; skipped without one).


def _cv2():
    return pytest.importorskip("cv2")


def _all_colours():
    """Every 24-bit RGB triple once, as a (4096, 4096, 3) uint8 image (numpy)."""
    v = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([(v >> 16) & 255, (v >> 8) & 255, v & 255], axis=-1).astype(np.uint8).reshape(4096, 4096, 3)


def _cv_gray(img):
    """cv2's gray of an (..., H, W, 3) uint8 numpy image, image by image."""
    cv2 = _cv2()
    flat = img.reshape(-1, *img.shape[-3:])
    return np.stack([cv2.cvtColor(np.ascontiguousarray(a), cv2.COLOR_RGB2GRAY) for a in flat]).reshape(img.shape[:-1])


@pytest.mark.gpu
def test_gray_uint8_is_bit_exact_with_opencv_on_every_colour():
    import cupy

    from gpu_reference import poison_pool

    host = _all_colours()
    expected = _cv_gray(host)
    poison_pool(host.size // 3)
    got = rgb_to_gray(cupy.asarray(host)).get()
    mismatches = int((got != expected).sum())
    assert mismatches == 0, f"{mismatches} of 2^24 colours differ from cv2.cvtColor(COLOR_RGB2GRAY)"


EDGE_IMAGES = {
    "zeros": lambda h, w: np.zeros((h, w, 3), np.uint8),
    "ones255": lambda h, w: np.full((h, w, 3), 255, np.uint8),
    "gradient": lambda h, w: (np.arange(h * w * 3) % 256).astype(np.uint8).reshape(h, w, 3),
    "channels": lambda h, w: np.broadcast_to(np.array([255, 0, 128], np.uint8), (h, w, 3)).copy(),
}
ODD_SIZES = [(1, 1), (7, 13), (5, 16), (3, 17), (33, 1001), (480, 640)]


@pytest.mark.gpu
@pytest.mark.parametrize("h,w", ODD_SIZES)
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("channels_last", [True, False])
def test_gray_uint8_matches_opencv_on_random_and_edge_images(h, w, batch, channels_last):
    import cupy

    from gpu_reference import poison_pool

    rng = np.random.default_rng(h * w)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8)] + [make(h, w) for make in EDGE_IMAGES.values()]
    for host in images:
        if batch:
            host = np.stack([host] + [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(batch - 1)])
        expected = _cv_gray(host)
        x = np.moveaxis(host, -1, -3) if not channels_last else host
        poison_pool(expected.size)
        got = rgb_to_gray(cupy.asarray(np.ascontiguousarray(x)), channels_last=channels_last).get()
        if not channels_last:
            assert got.shape == expected.shape[:-2] + (1,) + expected.shape[-2:]
            got = got.reshape(expected.shape)
        assert got.dtype == np.uint8 and np.array_equal(got, expected)


def _gray_reference32(x, channels_last):
    """(R * 0.299 + G * 0.587) + B * 0.114 in torch float32, unfused (rawops' float contract)."""
    import torch

    x = x.float()
    r, g, b = (x[..., i] for i in range(3)) if channels_last else (x[..., i, :, :] for i in range(3))
    c = [torch.tensor(v, dtype=torch.float32, device=x.device) for v in (0.299, 0.587, 0.114)]
    y = (r * c[0] + g * c[1]) + b * c[2]
    return y if channels_last else y.unsqueeze(-3)


def _ulps(a, b):
    """Largest distance in float32 units in the last place between float32 tensors a and b
    (NaN positions must agree)."""
    import torch

    assert torch.equal(torch.isnan(a), torch.isnan(b)), "NaN positions differ"
    keep = ~torch.isnan(a)
    ia, ib = a[keep].view(torch.int32).long(), b[keep].view(torch.int32).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max()) if ia.numel() else 0


GRAY_PAIRS = [(a, b) for a in im.GRAY_DTYPES for b in im.GRAY_DTYPES]


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype,out_dtype", GRAY_PAIRS, ids=[f"{a}-{b}" for a, b in GRAY_PAIRS])
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (2, 37, 91), (4, 64, 96)], ids=str)
@pytest.mark.parametrize("channels_last", [True, False])
def test_gray_every_dtype_pair_matches_torch_float32(in_dtype, out_dtype, shape, channels_last):
    import cupy
    import torch

    from gpu_reference import poison_pool, to_cupy, to_torch

    full = shape + (3,) if channels_last else shape[:-2] + (3,) + shape[-2:]
    if in_dtype == "uint8":
        x = torch.randint(0, 256, full, dtype=torch.uint8, device="cuda")
    else:  # past [0, 255] on both sides (the uint8 output saturates), NaN in a few pixels
        x = (torch.randn(full, device="cuda") * 160 + 128).to(getattr(torch, in_dtype))
        x.view(-1)[:: 7] = float("nan")
    ref = _gray_reference32(x, channels_last)
    poison_pool(ref.numel() * 4)
    got = to_torch(rgb_to_gray(to_cupy(x), out_dtype, channels_last=channels_last))
    assert got.dtype == getattr(torch, out_dtype) and got.shape == ref.shape
    if out_dtype == "float32":
        assert _ulps(got, ref) <= 1
    elif out_dtype == "float16":
        assert _ulps(got.float(), ref.half().float()) == 0
    elif in_dtype == "uint8":  # the fixed-point path; its exactness is OpenCV's test, here within one
        assert (got.int() - ref.round().int()).abs().max() <= 1
    else:  # to nearest even, saturated, NaN to 0
        expected = torch.nan_to_num(ref, nan=0.0).clamp(0, 255).round().to(torch.uint8)
        assert torch.equal(got, expected)
    assert isinstance(rgb_to_gray(to_cupy(x), out_dtype, channels_last=channels_last), cupy.ndarray)


@pytest.mark.gpu
def test_gray_uint8_to_float_keeps_the_0_255_scale():
    import cupy

    white = cupy.full((2, 3, 3), 255, cupy.uint8)
    got = rgb_to_gray(white, "float32")
    assert float(got.max()) == pytest.approx(255.0, rel=1e-6)


@pytest.mark.gpu
def test_gray_misaligned_view_out_param_and_empty_images():
    import cupy

    host = np.random.default_rng(1).integers(0, 256, (64 * 48 * 3 + 3,), dtype=np.uint8)
    flat = cupy.asarray(host)
    view = flat[3:].reshape(64, 48, 3)  # contiguous, 3 bytes past 16-byte alignment: the scalar path
    expected = _cv_gray(host[3:].reshape(64, 48, 3))
    out = cupy.full((64, 48), 7, cupy.uint8)
    assert rgb_to_gray(view, out=out) is out
    assert np.array_equal(out.get(), expected)
    for shape, channels_last, out_shape in (((0, 5, 3), True, (0, 5)), ((0, 4, 4, 3), True, (0, 4, 4)),
                                            ((2, 3, 0, 5), False, (2, 1, 0, 5))):
        got = rgb_to_gray(cupy.zeros(shape, cupy.uint8), "float32", channels_last=channels_last)
        assert got.shape == out_shape and got.dtype == np.float32


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2160, 3840), (4, 224, 224)], ids=str)
def test_gray_large_frames_match_opencv(shape):
    import cupy

    host = np.random.default_rng(7).integers(0, 256, shape + (3,), dtype=np.uint8)
    got = rgb_to_gray(cupy.asarray(host)).get()
    assert np.array_equal(got, _cv_gray(host))


# ------------------------------------------------------------------------------ normalize_volume (GPU)
VOLUME_SHAPES = [(), (1,), (7, 13), (3, 5, 7), (33, 64, 65), (4099, 1031)]


def _volume(shape, dtype, edit=None):
    """A random volume of dtype (a name); edit(t) may change it before the cast (torch's uint16
    has few kernels: it is made in int32 and converted)."""
    import torch

    if dtype in ("uint8", "uint16"):
        t = torch.randint(0, 256 if dtype == "uint8" else 65536, shape, dtype=torch.int32, device="cuda")
    else:
        t = torch.randn(shape, device="cuda") * 100 + 30
    if edit is not None:
        edit(t)
    return t.to(getattr(torch, dtype))


def _volume_reference(v, lo, hi, clip):
    import torch

    x = v.to(torch.float64) if v.dtype != getattr(torch, "uint16", None) else v.to(torch.int32).double()
    lo = x.min() if lo is None else torch.tensor(float(np.float32(lo)), dtype=torch.float64, device=x.device)
    hi = x.max() if hi is None else torch.tensor(float(np.float32(hi)), dtype=torch.float64, device=x.device)
    y = (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)
    return y.clamp(0, 1) if clip else y


def _as_cupy(t):
    import cupy
    import torch

    if t.dtype == getattr(torch, "uint16", None):  # DLPack of uint16: through a same-size view
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def _check_volume(got, ref, out_dtype, what):
    import torch

    from gpu_reference import assert_close, to_torch

    dt = getattr(torch, out_dtype)
    got = to_torch(got)
    assert got.dtype == dt, what
    assert_close(got, ref, dt, what)
    # elementwise too: a few bad voxels hide in a norm
    bound = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dt]
    assert (got.double() - ref).abs().max().item() <= bound * max(1.0, ref.abs().max().item()), what


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", im.FLOAT_OUT)
@pytest.mark.parametrize("in_dtype", im.VOLUME_DTYPES)
@pytest.mark.parametrize("shape", VOLUME_SHAPES, ids=str)
def test_normalize_volume_matches_torch_float64(shape, in_dtype, out_dtype):
    from gpu_reference import poison_pool

    v = _volume(shape, in_dtype)
    n = max(1, v.numel())
    for lo, hi, clip in ((None, None, True), (None, None, False), (10, 200, True), (10, 200, False), (5, None, True),
                         (None, 90, False)):
        poison_pool(n * 4, n * 2)
        got = normalize_volume(_as_cupy(v), lo, hi, clip, out_dtype)
        _check_volume(got, _volume_reference(v, lo, hi, clip), out_dtype, f"{in_dtype} {shape} {lo} {hi} {clip}")


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", ["uint8", "uint16"])
def test_normalize_volume_integer_voxels_give_torch_float32_bits(in_dtype):
    # Integer voxels take a reciprocal and one FMA correction instead of a division (kernels/image.cu
    # map_int): every voxel value, against torch's float32 (v - lo) / (hi - lo) bit for bit, with bounds
    # from the data, given integers and fractions, and ranges at and past the fast path's limits
    # (2^-32, 2^32: past them the division itself).
    import torch

    top = 255 if in_dtype == "uint8" else 65535
    values = torch.arange(top + 1, dtype=torch.int32, device="cuda")
    v = values.repeat(3)[torch.randperm(3 * (top + 1), device="cuda")].to(getattr(torch, in_dtype))
    f = v.to(torch.int32).float()
    for lo, hi in ((None, None), (0, top), (17, 200), (0.3, 200.7), (-1000.5, 3.25), (1e-3, 7.0), (0.0, 2.0**-31),
                   (0.0, 2.0**-34), (0.0, 2.0**33), (-(2.0**31), 2.0**31), (2.0**-33, 1.0), (2.0, 2.0 + 2**-30),
                   (None, 100.5), (40, None)):
        for clip in (True, False):
            lo32 = f.min() if lo is None else torch.tensor(lo, dtype=torch.float32, device="cuda")
            hi32 = f.max() if hi is None else torch.tensor(hi, dtype=torch.float32, device="cuda")
            if hi32 > lo32:
                ref = (f - lo32) / (hi32 - lo32)
                ref = ref.clamp(0, 1) if clip else ref
            else:
                ref = torch.zeros_like(f)
            got = torch.from_dlpack(normalize_volume(_as_cupy(v), lo, hi, clip))
            bad = (got.view(torch.int32) != ref.view(torch.int32)).sum().item()
            assert bad == 0, f"{in_dtype} lo={lo} hi={hi} clip={clip}: {bad} voxels differ from torch's bits"
            half = torch.from_dlpack(normalize_volume(_as_cupy(v), lo, hi, clip, "float16"))
            assert torch.equal(half, ref.half()), f"{in_dtype} lo={lo} hi={hi} clip={clip} float16"


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", im.VOLUME_DTYPES)
def test_normalize_volume_extremes_anywhere_and_large(in_dtype):
    # 2^25 + 5 voxels (many min/max blocks, a scalar tail): the min in the tail, the max first
    top = {"uint8": 255, "uint16": 65535, "float16": 60000.0, "float32": 1e30}[in_dtype]
    bottom = {"uint8": 0, "uint16": 0, "float16": -60000.0, "float32": -1e30}[in_dtype]

    def extremes(t):
        t[0], t[-1] = top, bottom
    v = _volume(((1 << 25) + 5,), in_dtype, extremes)
    got = normalize_volume(_as_cupy(v))
    _check_volume(got, _volume_reference(v, None, None, True), "float32", f"{in_dtype} large")
    assert float(got[0]) == 1.0 and float(got[-1]) == 0.0
    # deterministic: the same bits every run
    again = normalize_volume(_as_cupy(v))
    assert bool((got == again).all())


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", ["float16", "float32"])
def test_normalize_volume_nan_propagates(in_dtype):
    import torch

    v = _volume((1000, 37), in_dtype, lambda t: t.__setitem__((500, 3), float("nan")))
    got = torch.from_dlpack(normalize_volume(_as_cupy(v)))
    assert torch.isnan(got).all(), "a NaN voxel makes min and max NaN: every output NaN, as torch's composite"
    given = torch.from_dlpack(normalize_volume(_as_cupy(v), -50, 50))
    assert torch.isnan(given[500, 3]) and torch.isnan(given).sum() == 1, "with lo, hi given only the NaN voxel"
    torch_composite = (v.float() - v.float().min()) / (v.float().max() - v.float().min())
    assert torch.isnan(torch_composite).all()


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", im.VOLUME_DTYPES)
def test_normalize_volume_constant_volume_gives_zeros(in_dtype):
    import torch

    v = torch.full((17, 33), 7, device="cuda").to(getattr(torch, in_dtype))
    got = torch.from_dlpack(normalize_volume(_as_cupy(v)))
    assert torch.equal(got, torch.zeros_like(got))


@pytest.mark.gpu
def test_normalize_volume_captured_in_a_cuda_graph():
    # On sm_90 the map is a programmatic dependent launch of the min/max pass: captured, the graph
    # keeps that edge; a volume written before each replay (by torch, just ahead) is what it reads.
    import torch

    from rawops import torch_adapter as ta

    v = torch.randint(0, 256, (64, 4096), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ta.normalize_volume(v)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = ta.normalize_volume(v, out_dtype=torch.float16)
    for top in (255, 17):
        v.copy_(torch.randint(3, top + 1, v.shape, dtype=torch.uint8, device="cuda"))
        graph.replay()
        f = v.float()
        ref = ((f - f.min()) / (f.max() - f.min())).half()
        assert torch.equal(got, ref), f"replay with voxels up to {top}"


@pytest.mark.gpu
def test_normalize_volume_in_place_misaligned_and_empty():
    import cupy

    v = _volume((64, 1001), "float32")
    ref = _volume_reference(v, None, None, True)
    x = _as_cupy(v)
    assert normalize_volume(x, out=x) is x
    _check_volume(x, ref, "float32", "in place")
    base = _volume((4 * 4097 + 1,), "uint16")
    view = _as_cupy(base)[1:]  # 2 bytes past alignment: the scalar paths of both passes
    got = normalize_volume(view, out_dtype="bfloat16")
    _check_volume(got, _volume_reference(base[1:], None, None, True), "bfloat16", "misaligned")
    empty = normalize_volume(cupy.zeros((0, 5), cupy.uint8))
    assert empty.shape == (0, 5) and empty.dtype == np.float32


# ------------------------------------------------------------------------------ to_tensor_normalize (GPU)
def _to_tensor_reference(img, mean, std, layout):
    """torch float64 of torchvision's arithmetic: (x / 255 - mean[c]) / std[c]."""
    import torch

    x = img.double() / 255
    m = torch.tensor(mean, dtype=torch.float64, device=img.device)
    s = torch.tensor(std, dtype=torch.float64, device=img.device)
    y = (x - m) / s
    return y.movedim(-1, -3) if layout == "NCHW" else y


TT_SHAPES = [(1, 1), (7, 13), (5, 16), (224, 224), (2, 7, 13), (3, 64, 48)]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", im.FLOAT_OUT)
@pytest.mark.parametrize("layout", im.LAYOUTS)
@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", TT_SHAPES, ids=str)
def test_to_tensor_normalize_matches_torch_float64(shape, channels, layout, out_dtype):
    import torch

    from gpu_reference import assert_close, poison_pool, to_cupy, to_torch

    img = torch.randint(0, 256, shape + (channels,), dtype=torch.uint8, device="cuda")
    mean = [0.485, 0.456, 0.406, 0.5][:channels]
    std = [0.229, 0.224, 0.225, 0.25][:channels]
    ref = _to_tensor_reference(img, mean, std, layout)
    poison_pool(img.numel() * 4, img.numel() * 2)
    got = to_torch(to_tensor_normalize(to_cupy(img), mean, std, out_dtype, layout))
    dt = getattr(torch, out_dtype)
    assert got.dtype == dt and got.shape == ref.shape
    # relative to the norm of x / 255 / std, the larger term: (x / 255 - mean) cancels to near 0 for
    # pixels near 255 mean (a single pixel of 124 gives 0.0056, where float32's own rounding of x / 255
    # alone is a relative 2e-5)
    terms = _to_tensor_reference(img, [0.0] * channels, std, layout).norm().item()
    assert_close(got, ref, dt, f"{shape} C={channels} {layout}", floor=terms)
    bound = {torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dt]
    assert (got.double() - ref).abs().max().item() <= bound


@pytest.mark.gpu
def test_to_tensor_normalize_matches_torchvision():
    torchvision = pytest.importorskip("torchvision")
    import torch

    from gpu_reference import to_cupy, to_torch
    from torchvision.transforms.v2 import functional as TF

    img = torch.randint(0, 256, (8, 224, 224, 3), dtype=torch.uint8, device="cuda")
    reference = TF.normalize(TF.to_dtype(img.permute(0, 3, 1, 2), torch.float32, scale=True), list(MEAN), list(STD))
    got = to_torch(to_tensor_normalize(to_cupy(img), MEAN, STD))
    assert (got - reference).abs().max().item() <= 2e-6
    assert torchvision.__version__


@pytest.mark.gpu
def test_to_tensor_normalize_out_param_misaligned_and_empty():
    import cupy
    import torch

    from gpu_reference import assert_close, to_torch

    base = torch.randint(0, 256, (5 * 16 * 16 * 3 + 1,), dtype=torch.uint8, device="cuda")
    img = base[1:].view(5, 16, 16, 3)
    out = cupy.full((5, 3, 16, 16), np.nan, cupy.float32)
    assert to_tensor_normalize(cupy.from_dlpack(img), MEAN, STD, out=out) is out
    assert_close(to_torch(out), _to_tensor_reference(img, MEAN, STD, "NCHW"), torch.float32, "misaligned, out=")
    empty = to_tensor_normalize(cupy.zeros((0, 4, 4, 3), cupy.uint8), MEAN, STD)
    assert empty.shape == (0, 3, 4, 4)


# ------------------------------------------------------------------------------ torch adapter (GPU)
@pytest.mark.gpu
def test_adapter_matches_the_cupy_api_and_torch_composites():
    import torch

    import rawops.torch_adapter.image as ta
    from gpu_reference import poison_torch_pool, to_cupy, to_torch

    img = torch.randint(0, 256, (4, 67, 45, 3), dtype=torch.uint8, device="cuda")
    poison_torch_pool(img.numel() // 3)
    gray = ta.rgb_to_gray(img)
    assert torch.equal(gray, to_torch(rgb_to_gray(to_cupy(img))))
    planar = img.permute(0, 3, 1, 2)  # (N, 3, H, W) in channels_last memory: read as it lies
    assert planar.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(ta.rgb_to_gray(planar, channels_last=False), gray.unsqueeze(1))
    assert torch.equal(ta.rgb_to_gray(planar.contiguous(), channels_last=False), gray.unsqueeze(1))
    f = ta.rgb_to_gray(img, torch.float32)
    assert _ulps(f, _gray_reference32(img, True)) <= 1
    vol = _volume((33, 64, 65), "uint16")
    got = ta.normalize_volume(vol, out_dtype=torch.float16)
    assert torch.equal(got, to_torch(normalize_volume(_as_cupy(vol), out_dtype="float16")))
    x = torch.randn(100, 101, device="cuda", requires_grad=True)
    y = ta.normalize_volume(x, clip=False)
    assert not y.requires_grad
    torch.testing.assert_close(y, ((x - x.min()) / (x.max() - x.min())).detach(), rtol=2e-6, atol=2e-6)
    t = ta.to_tensor_normalize(img, torch.tensor(MEAN), STD, torch.bfloat16)
    assert torch.equal(t, to_torch(to_tensor_normalize(to_cupy(img), MEAN, STD, "bfloat16")))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # launched on torch's current stream
        g2 = ta.rgb_to_gray(img)
    s.synchronize()
    assert torch.equal(g2, gray)


@pytest.mark.gpu
def test_adapter_torch_compile_fullgraph():
    import torch

    import rawops.torch_adapter.image as ta

    def pipeline(img, vol):
        gray = ta.rgb_to_gray(img, torch.float32)
        x = ta.to_tensor_normalize(img, MEAN, STD, torch.float16)
        v = ta.normalize_volume(vol, 0, 1000, True)
        return gray * 2, x.float() + 1, v * 3

    img = torch.randint(0, 256, (2, 32, 48, 3), dtype=torch.uint8, device="cuda")
    vol = torch.randint(0, 2000, (8, 9, 10), dtype=torch.int32, device="cuda").float()
    compiled = torch.compile(pipeline, fullgraph=True)
    for a, b in zip(compiled(img, vol), pipeline(img, vol)):
        assert torch.equal(a, b)
    auto = torch.compile(lambda v: ta.normalize_volume(v), fullgraph=True)
    assert torch.equal(auto(vol), ta.normalize_volume(vol))
