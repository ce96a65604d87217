"""Argument validation, without a GPU, through fake `__cuda_array_interface__` producers.

Every check in MapKernel.__call__ / column_sum runs before the driver is consulted
(resolve_device is the first call that needs CUDA). Here, with no GPU, anything that gets
past validation fails at that point with NoDeviceError (or, on a machine with a GPU, with
"does not point to GPU memory" for our fake pointers). So a test that gets its *own*
TypeError / ValueError message proves the check fired, and fired first; and the positive
controls (`assert_passes_validation`) prove the fakes are otherwise well formed, so each
negative test exercises the one check it is named after.
"""
import re

import numpy as np
import pytest

import rawops
from rawops import NoDeviceError, as_array
from rawops._launch import stream_pointer

# 256-byte aligned like a cudaMalloc pointer, far below where CUDA's allocations have been seen
# here: on the H100 machine 0x7F0000000000 fell inside a real pool block once, so a fake
# "valid" call passed the pointer check and launched instead of raising.
BASE = 0x100000000000
OTHER = 0x100000100000  # a second, disjoint allocation
FAR = 0x100000800000  # a third, past both
_ABSENT = object()


class FakeCAI:
    """A device-array producer that is nothing but its __cuda_array_interface__."""

    def __init__(self, shape, typestr="<f4", ptr=BASE, strides=None, readonly=False, version=3,
                 stream=_ABSENT, mask=_ABSENT):
        self.cai = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, readonly),
                    "strides": strides, "version": version}
        if stream is not _ABSENT:
            self.cai["stream"] = stream
        if mask is not _ABSENT:
            self.cai["mask"] = mask

    @property
    def __cuda_array_interface__(self):
        return self.cai

    def __repr__(self):
        return f"FakeCAI({self.cai})"


def f32(shape=(4, 8), ptr=BASE, **kw):
    return FakeCAI(shape, "<f4", ptr, **kw)


def f16(shape=(4, 8), ptr=BASE, **kw):
    return FakeCAI(shape, "<f2", ptr, **kw)


def _device_stage_error(error):
    """True for the errors raised once validation is over and CUDA is first needed."""
    try:
        from cupy.cuda.runtime import CUDARuntimeError
    except ImportError:  # pragma: no cover
        CUDARuntimeError = ()
    return (isinstance(error, (NoDeviceError, CUDARuntimeError))
            or (isinstance(error, ValueError) and "does not point to GPU memory" in str(error)))


def assert_passes_validation(fn, *args, **kwargs):
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    assert _device_stage_error(info.value), f"validation rejected a valid call: {info.value!r}"


# Every public op as (callable taking its arrays, names of those arrays); bias ops separately.
OPS = {
    "gelu": (lambda x, **kw: rawops.gelu(x, **kw), ("x",)),
    "gelu_none": (lambda x, **kw: rawops.gelu(x, "none", **kw), ("x",)),
    "gelu_backward": (lambda dy, x, **kw: rawops.gelu_backward(dy, x, **kw), ("dy", "x")),
    "relu": (lambda x, **kw: rawops.relu(x, **kw), ("x",)),
    "relu_backward": (lambda dy, x, **kw: rawops.relu_backward(dy, x, **kw), ("dy", "x")),
    "relu_scale": (lambda x, **kw: rawops.relu_scale(x, 0.5, **kw), ("x",)),
    "relu_scale_backward": (lambda dy, x, **kw: rawops.relu_scale_backward(dy, x, 0.5, **kw), ("dy", "x")),
    "relu_scale_add": (lambda x, y, **kw: rawops.relu_scale_add(x, 0.5, y, **kw), ("x", "y")),
    "add": (lambda a, b, **kw: rawops.add(a, b, **kw), ("a", "b")),
}
BIAS_OPS = {
    "bias_gelu": (lambda x, bias, **kw: rawops.bias_gelu(x, bias, **kw), ("x", "bias")),
    "bias_gelu_none": (lambda x, bias, **kw: rawops.bias_gelu(x, bias, "none", **kw), ("x", "bias")),
    "bias_gelu_backward": (lambda dy, x, bias, **kw: rawops.bias_gelu_backward(dy, x, bias, **kw),
                           ("dy", "x", "bias")),
}


def _valid_args(names, make=f32, shape=(4, 8)):
    return [make(shape[-1:] if n == "bias" else shape, ptr=OTHER + i * 0x10000) for i, n in enumerate(names)]


# ------------------------------------------------------------------------------ positive controls
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("make", [f32, f16], ids=["f32", "f16"])
def test_a_valid_call_gets_past_validation(op, make):
    fn, names = OPS[op]
    assert_passes_validation(fn, *_valid_args(names, make))
    assert_passes_validation(fn, *_valid_args(names, make), out=make((4, 8), ptr=BASE))


@pytest.mark.parametrize("op", sorted(BIAS_OPS))
def test_a_valid_bias_call_gets_past_validation(op):
    fn, names = BIAS_OPS[op]
    assert_passes_validation(fn, *_valid_args(names))
    assert_passes_validation(fn, *_valid_args(names), out=f32((4, 8), ptr=BASE))


def test_column_sum_valid_call_gets_past_validation():
    assert_passes_validation(rawops.column_sum, f32())


def test_in_place_out_equal_to_an_input_is_allowed():
    x = f32()
    assert_passes_validation(rawops.gelu, x, out=x)
    a, b = f32(ptr=BASE), f32(ptr=OTHER)
    assert_passes_validation(rawops.add, a, b, out=b)


def test_out_right_after_the_input_does_not_count_as_overlap():
    x = f32((4, 8), ptr=BASE)
    assert_passes_validation(rawops.gelu, x, out=f32((4, 8), ptr=BASE + 4 * 8 * 4))
    assert_passes_validation(rawops.gelu, f32((4, 8), ptr=BASE + 4 * 8 * 4), out=f32((4, 8), ptr=BASE))


def test_read_only_inputs_are_fine():
    assert_passes_validation(rawops.add, f32(readonly=True), f32(ptr=OTHER, readonly=True))


def test_operands_need_not_share_the_16_byte_phase():
    # Different phases only select the kernel's scalar path; the call itself is valid.
    assert_passes_validation(rawops.add, f32(ptr=BASE + 4), f32(ptr=OTHER + 8), out=f32(ptr=OTHER * 2 + 12))


# ------------------------------------------------------------------------------ dtype
@pytest.mark.parametrize("typestr", ["<i4", "<f8", ">f4", "|b1", "<u2", "|u1", "<c8"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_first_argument_of_unsupported_dtype_is_a_type_error_naming_it(op, typestr):
    fn, names = OPS[op]
    args = _valid_args(names)
    args[0] = FakeCAI((4, 8), typestr)
    text = {"<u2": "uint16", "|u1": "uint8"}.get(typestr, typestr)
    with pytest.raises(TypeError, match=rf"^{names[0]} has dtype {re.escape(text)};.*float32, float16, bfloat16"):
        fn(*args)


@pytest.mark.parametrize("op", sorted(BIAS_OPS))
def test_bias_op_first_argument_of_unsupported_dtype_is_a_type_error(op):
    fn, names = BIAS_OPS[op]
    args = _valid_args(names)
    args[0] = FakeCAI((4, 8), "<i4")
    with pytest.raises(TypeError, match=rf"^{names[0]} has dtype <i4.*float32"):
        fn(*args)


def test_gelu_of_int32_names_x_and_the_supported_dtypes():
    with pytest.raises(TypeError, match=r"^x has dtype <i4; .*supports float32, float16, bfloat16"):
        rawops.gelu(FakeCAI((16,), "<i4"), approximate="tanh")


def test_an_array_that_refuses_to_export_is_a_type_error_naming_it():
    class RequiresGrad:  # what a torch tensor that requires grad does
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")

    with pytest.raises(TypeError, match=r"^x cannot be read through __cuda_array_interface__: Can't get"):
        rawops.gelu(RequiresGrad(), approximate="tanh")


def test_v2_typestr_is_a_type_error_that_explains_bfloat16():
    with pytest.raises(TypeError, match=r"^x has dtype '<V2'.*bfloat16.*CuPy.*DLPack"):
        rawops.gelu(FakeCAI((16,), "<V2"), approximate="tanh")


@pytest.mark.parametrize("op", [o for o in sorted(OPS) if len(OPS[o][1]) == 2])
def test_second_operand_of_another_dtype_is_a_type_error_naming_it(op):
    fn, names = OPS[op]
    with pytest.raises(TypeError, match=rf"^{names[1]} has dtype float16, expected float32 like {names[0]}"):
        fn(f32(), f16(ptr=OTHER))


def test_relu_scale_add_with_float16_y_for_float32_x_names_y():
    with pytest.raises(TypeError, match=r"^y has dtype float16, expected float32 like x"):
        rawops.relu_scale_add(f32(), 2.0, f16(ptr=OTHER))


def test_out_of_another_dtype_is_a_type_error_naming_out():
    with pytest.raises(TypeError, match=r"^out has dtype float16, expected float32 like x"):
        rawops.gelu(f32(), out=f16(ptr=OTHER), approximate="tanh")


# ------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize("op", [o for o in sorted(OPS) if len(OPS[o][1]) == 2])
@pytest.mark.parametrize("other_shape", [(8, 4), (32,), (4, 8, 1), (4, 7)])
def test_second_operand_of_another_shape_is_a_value_error_naming_it(op, other_shape):
    fn, names = OPS[op]
    with pytest.raises(ValueError, match=rf"^{names[1]} has shape {re.escape(str(other_shape))}, expected \(4, 8\)"):
        fn(f32((4, 8)), f32(other_shape, ptr=OTHER))


def test_add_with_different_shapes_names_b():
    with pytest.raises(ValueError, match=r"^b has shape \(3,\), expected \(4,\) like a"):
        rawops.add(f32((4,)), f32((3,), ptr=OTHER))


def test_out_of_another_shape_is_a_value_error_naming_out():
    with pytest.raises(ValueError, match=r"^out has shape \(32,\), expected \(4, 8\)"):
        rawops.relu(f32((4, 8)), out=f32((32,), ptr=OTHER))


# ------------------------------------------------------------------------------ layout
# Strided views (in bytes, as __cuda_array_interface__ gives them): every elementwise op takes
# them through its strided kernel, so a valid call with any of them gets past validation.
STRIDED = {
    "fortran_order": ((4, 8), (4, 16)),
    "padded_rows": ((4, 8), (64, 4)),
    "every_other_element": ((16,), (8,)),
    "broadcast_zero_stride": ((4, 8), (0, 4)),
    "reversed": ((16,), (-4,)),
}


@pytest.mark.parametrize("layout", sorted(STRIDED))
@pytest.mark.parametrize("op", sorted(OPS))
def test_strided_first_argument_gets_past_validation(op, layout):
    fn, names = OPS[op]
    shape, strides = STRIDED[layout]
    args = [f32(shape, ptr=OTHER + i * 0x10000) for i in range(len(names))]
    args[0] = f32(shape, strides=strides)  # float32, so the dtype check passes
    assert_passes_validation(fn, *args)
    assert_passes_validation(fn, *args, out=f32(shape, ptr=FAR))


@pytest.mark.parametrize("layout", sorted(STRIDED))
def test_strided_second_operand_and_out_get_past_validation_but_an_out_sharing_memory_is_refused(layout):
    shape, strides = STRIDED[layout]
    assert_passes_validation(rawops.add, f32(shape), f32(shape, ptr=OTHER, strides=strides))
    out = f32(shape, ptr=OTHER, strides=strides)
    if 0 in strides:  # two elements of out at one address: the result would depend on the schedule
        with pytest.raises(ValueError, match=r"^out has elements that share memory"):
            rawops.gelu(f32(shape), out=out, approximate="tanh")
    else:
        assert_passes_validation(rawops.gelu, f32(shape), out=out, approximate="tanh")


@pytest.mark.parametrize("strides", [(4, 4), (32, 0), (8, 4), (4, 2)], ids=["overlapping", "zero", "rows",
                                                                                  "half"])
def test_an_out_whose_elements_overlap_is_refused_before_any_launch(strides):
    # (4, 8) float32 with strides (4, 4) bytes: element (1, 0) is element (0, 1); (8, 4): rows 2
    # elements apart, 8 wide. (4, 2) is not even whole elements.
    pattern = r"^out has strides that are not a whole number" if strides == (4, 2) else \
        r"^out has elements that share memory"
    with pytest.raises(ValueError, match=pattern):
        rawops.relu(f32((4, 8)), out=f32((4, 8), ptr=OTHER, strides=strides))


@pytest.mark.parametrize("which", ["x", "y", "out"])
def test_strides_that_are_not_whole_elements_name_the_argument(which):
    bad = f32((4, 8), ptr=BASE + 0x10000 * "xyo".index(which[0]), strides=(32, 6))
    args = {"x": f32((4, 8)), "y": f32((4, 8), ptr=OTHER), "out": None}
    args[which] = bad
    with pytest.raises(ValueError, match=rf"^{which} has strides that are not a whole number of its 4-byte elements"):
        rawops.relu_scale_add(args["x"], 0.5, args["y"], out=args["out"])


def test_strided_out_partially_overlapping_an_input_is_refused_and_out_equal_to_it_is_in_place():
    # x = rows of 8 at a stride of 16 elements; out its other half (interleaved, no element
    # shared) still spans x's memory: refused by span. The same view is an in-place update.
    x = f32((4, 8), ptr=BASE, strides=(64, 4))
    with pytest.raises(ValueError, match=r"^out partially overlaps x"):
        rawops.gelu(x, out=f32((4, 8), ptr=BASE + 32, strides=(64, 4)), approximate="tanh")
    with pytest.raises(ValueError, match=r"^out partially overlaps y"):
        rawops.relu_scale_add(f32((4, 8), ptr=OTHER), 2.0, x, out=f32((4, 8), ptr=BASE + 4, strides=(4, 16)))
    assert_passes_validation(rawops.gelu, x, out=f32((4, 8), ptr=BASE, strides=(64, 4)), approximate="tanh")
    # a strided out beside the input's span is separate memory
    assert_passes_validation(rawops.gelu, x, out=f32((4, 8), ptr=BASE + 64 * 4, strides=(4, 16)), approximate="tanh")


def test_strided_bias_and_an_out_of_the_bias_are_checked():
    x = f32((4, 8), ptr=BASE)
    assert_passes_validation(rawops.bias_gelu, x, f32((8,), ptr=OTHER, strides=(8,)), approximate="tanh")
    assert_passes_validation(rawops.bias_gelu_backward, x, f32((4, 8), ptr=OTHER, strides=(4, 16)),
                             f32((8,), ptr=OTHER * 2, strides=(-4,)), approximate="tanh")
    with pytest.raises(ValueError, match=r"^out partially overlaps bias"):
        rawops.bias_gelu(x, f32((8,), ptr=OTHER, strides=(8,)), out=f32((4, 8), ptr=OTHER + 4, strides=(4, 16)),
                         approximate="tanh")


def test_a_layout_of_more_dims_than_the_strided_kernels_take_is_refused_naming_x():
    # 26 dims of two elements, each stride twice the one before it doubled: nothing merges.
    dims = 26
    shape = (2,) * dims
    strides = tuple(4 * 4 ** (dims - 1 - i) for i in range(dims))
    with pytest.raises(ValueError, match=r"^x and the other operands have more than 25 dims .*pass contiguous"):
        rawops.relu(f32(shape, strides=strides))
    # the same dims merge into one where contiguous, however many there are
    assert_passes_validation(rawops.relu, f32(shape, strides=tuple(4 * 2 ** (dims - 1 - i) for i in range(dims))))


@pytest.mark.parametrize("out_strides, ok", [((64, 4), True), ((4, 16), True), ((0, 4), False)],
                         ids=["row-strided", "transposed", "broadcast"])
def test_bias_gelu_backward_takes_a_strided_out_whose_rows_have_one_stride(out_strides, ok):
    args = (f32((4, 8)), f32((4, 8), ptr=OTHER), f32((8,), ptr=OTHER * 2))
    out = f32((4, 8), ptr=FAR, strides=out_strides)
    if ok:
        assert_passes_validation(rawops.bias_gelu_backward, *args, out=out, approximate="tanh")
    else:
        with pytest.raises(ValueError, match=r"^out has elements that share memory"):
            rawops.bias_gelu_backward(*args, out=out, approximate="tanh")
    # (2, 2, 8) with its leading dims swapped: rows at no single stride
    with pytest.raises(ValueError, match=r"^out has leading dims \(2, 2\) .* do not collapse to one row stride"):
        rawops.bias_gelu_backward(*(f32((2, 2, 8), ptr=p) for p in (BASE, OTHER)), f32((8,), ptr=OTHER * 2),
                                  out=f32((2, 2, 8), ptr=FAR, strides=(32, 64, 4)), approximate="tanh")


# ------------------------------------------------------------------------------ alignment
@pytest.mark.parametrize("make, offset", [(f32, 2), (f32, 1), (f32, 6), (f16, 1), (f16, 3)])
def test_out_not_aligned_to_its_element_size_is_a_value_error_naming_out(make, offset):
    with pytest.raises(ValueError, match=rf"^out is misaligned: address 0x{OTHER + offset:x} is not a multiple"):
        rawops.gelu(make(), out=make(ptr=OTHER + offset), approximate="tanh")


def test_second_operand_not_aligned_to_its_element_size_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"^y is misaligned"):
        rawops.relu_scale_add(f32(), 1.0, f32(ptr=OTHER + 2))


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("make, offset", [(f32, 2), (f16, 1)])
def test_first_argument_not_aligned_to_its_element_size_is_a_value_error_naming_it(op, make, offset):
    # The kernel would fault on a misaligned T* (scalar path) before any result came back.
    fn, names = OPS[op]
    args = _valid_args(names, make)
    args[0] = make(ptr=BASE + offset)
    with pytest.raises(ValueError, match=rf"^{names[0]} is misaligned"):
        fn(*args)


def test_column_sum_of_a_misaligned_array_is_a_value_error():
    with pytest.raises(ValueError, match=r"^x is misaligned"):
        rawops.column_sum(f32(ptr=BASE + 2))


# ------------------------------------------------------------------------------ out
def test_read_only_out_is_a_value_error():
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.gelu(f32(), out=f32(ptr=OTHER, readonly=True), approximate="tanh")


def test_read_only_out_equal_to_x_is_still_refused():
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.gelu(f32(readonly=True), out=f32(readonly=True), approximate="tanh")


@pytest.mark.parametrize("shift", [4, 16, 4 * 8 * 4 - 4, -4, -(4 * 8 * 4 - 4)])
def test_out_partially_overlapping_x_is_a_value_error(shift):
    with pytest.raises(ValueError, match=r"^out partially overlaps x"):
        rawops.gelu(f32(ptr=BASE + 0x1000), out=f32(ptr=BASE + 0x1000 + shift), approximate="tanh")


def test_out_partially_overlapping_the_second_operand_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"^out partially overlaps b"):
        rawops.add(f32(ptr=BASE), f32(ptr=OTHER), out=f32(ptr=OTHER + 8))


# ------------------------------------------------------------------------------ bias
@pytest.mark.parametrize("bias_shape", [(7,), (9,), (1, 8), (4, 8), ()])
@pytest.mark.parametrize("op", sorted(BIAS_OPS))
def test_bias_of_the_wrong_shape_is_a_value_error_naming_bias(op, bias_shape):
    fn, names = BIAS_OPS[op]
    args = _valid_args(names)
    args[-1] = f32(bias_shape, ptr=BASE)
    pattern = rf"^bias has shape .*expected one value per element of {names[0]}'s last dim \(8,\)"
    with pytest.raises(ValueError, match=pattern):
        fn(*args)


def test_bias_of_another_dtype_is_a_type_error_naming_bias():
    with pytest.raises(TypeError, match=r"^bias has dtype float16, expected float32 like x"):
        rawops.bias_gelu(f32((4, 8)), f16((8,), ptr=OTHER), approximate="tanh")


def test_missing_bias_is_a_type_error_naming_bias():
    with pytest.raises(TypeError, match=r"needs bias$"):
        rawops.bias_gelu(f32((4, 8)), None, approximate="tanh")


def test_bias_with_a_zero_dimensional_x_is_a_value_error():
    with pytest.raises(ValueError, match=r"^bias has shape \(1,\), expected one value per element of x's last dim"):
        rawops.bias_gelu(f32(()), f32((1,), ptr=OTHER), approximate="tanh")


def test_misaligned_bias_is_a_value_error_naming_bias():
    with pytest.raises(ValueError, match=r"^bias is misaligned"):
        rawops.bias_gelu(f32((4, 8)), f32((8,), ptr=OTHER + 2), approximate="tanh")


def test_out_partially_overlapping_bias_is_a_value_error():
    with pytest.raises(ValueError, match=r"^out partially overlaps bias"):
        rawops.bias_gelu(f32((4, 8), ptr=BASE), f32((8,), ptr=OTHER + 16), out=f32((4, 8), ptr=OTHER),
                         approximate="tanh")


def test_out_starting_at_bias_of_a_2d_x_is_refused():
    # out == bias exactly is not an in-place update here: row 0 of out overwrites the bias
    # that the other rows still read, so the result depends on thread scheduling.
    with pytest.raises(ValueError, match=r"^out .*overlaps bias"):
        rawops.bias_gelu(f32((4, 8), ptr=BASE), f32((8,), ptr=OTHER), out=f32((4, 8), ptr=OTHER), approximate="tanh")


def test_out_equal_to_bias_of_a_1d_x_is_an_elementwise_in_place_update():
    assert_passes_validation(rawops.bias_gelu, f32((8,), ptr=BASE), f32((8,), ptr=OTHER), out=f32((8,), ptr=OTHER))


# ------------------------------------------------------------------------------ not device arrays
def test_numpy_array_is_a_type_error_about_host_memory():
    with pytest.raises(TypeError, match=r"^x is in host memory.*GPU"):
        rawops.gelu(np.zeros(16, np.float32), approximate="tanh")


def test_object_with_only_array_interface_is_a_type_error_about_host_memory():
    class HostOnly:
        __array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(TypeError, match=r"^x is a host array \(HostOnly\)"):
        rawops.gelu(HostOnly(), approximate="tanh")


def test_torch_cpu_tensor_is_a_type_error_about_host_memory():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"^x is in host memory"):
        rawops.gelu(torch.zeros(4), approximate="tanh")
    with pytest.raises(TypeError, match=r"^y is in host memory"):
        rawops.relu_scale_add(f32((4,)), 1.0, torch.zeros(4))


@pytest.mark.parametrize("value", [[1.0, 2.0], 3, 2.5, None, "x", {"shape": (4,)}])
def test_plain_python_values_are_type_errors(value):
    with pytest.raises(TypeError, match=r"^x must be a GPU array \(CuPy, or anything with __cuda_array_interface__"):
        rawops.gelu(value, approximate="tanh")


def test_a_list_as_second_operand_or_out_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"^b must be a GPU array"):
        rawops.add(f32(), [1.0])
    with pytest.raises(TypeError, match=r"^out must be a GPU array"):
        rawops.gelu(f32(), out=[1.0], approximate="tanh")


def test_missing_second_operand_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"needs b$"):
        rawops.add(f32(), None)


# ------------------------------------------------------------------------------ CAI protocol
def test_cai_stream_zero_is_a_value_error():
    with pytest.raises(ValueError, match=r"^x: __cuda_array_interface__ stream 0 is forbidden"):
        rawops.gelu(f32(stream=0), approximate="tanh")


def test_cai_stream_zero_on_out_names_out():
    with pytest.raises(ValueError, match=r"^out: __cuda_array_interface__ stream 0"):
        rawops.gelu(f32(), out=f32(ptr=OTHER, stream=0), approximate="tanh")


def test_masked_cai_is_a_value_error():
    with pytest.raises(ValueError, match=r"^x is a masked array"):
        rawops.gelu(f32(mask=f32(ptr=OTHER)), approximate="tanh")


CUPY_ENTRIES = ["gelu", "gelu_backward", "bias_gelu", "relu", "relu_backward", "relu_scale", "relu_scale_backward",
                "relu_scale_add", "add"]


def test_cupy_api_functions_are_c_entries_and_a_str_subclass_mode_takes_the_python_function():
    """The CuPy API's elementwise functions are builtins (no Python frame a call). A mode that is
    not exactly a str goes to the Python function, which accepts a str subclass as its value:
    both calls reach the launcher's check of x."""
    from rawops import elementwise

    assert all(type(getattr(rawops, name)).__name__ == "builtin_function_or_method" for name in CUPY_ENTRIES)
    assert rawops.gelu.__self__.fallback is elementwise._gelu_python

    class Mode(str):
        pass

    masked = f32(mask=f32(ptr=OTHER))
    for mode in ("tanh", Mode("tanh"), Mode("none")):
        with pytest.raises(ValueError, match=r"^x is a masked array"):
            rawops.gelu(masked, mode)
        with pytest.raises(ValueError, match=r"^x is a masked array"):
            rawops.bias_gelu(masked, f32((8,), ptr=OTHER), mode)
        with pytest.raises(ValueError, match=r"^dy is a masked array"):
            rawops.gelu_backward(masked, f32(ptr=OTHER), mode)
    with pytest.raises(ValueError, match=r"^approximate must be 'tanh' or 'none', got 'fast'"):
        rawops.gelu(masked, Mode("fast"))


def test_mask_none_is_not_a_mask():
    assert_passes_validation(rawops.gelu, f32(mask=None))


# ------------------------------------------------------------------------------ approximate
@pytest.mark.parametrize("approximate", ["exact", "erf", "Tanh", "", None, True, ["tanh"], ("none",)])
def test_bad_approximate_names_it_value_error_for_a_string_type_error_otherwise(approximate):
    x = f32()
    error, pattern = ((ValueError, r"^approximate must be 'tanh' or 'none', got ") if isinstance(approximate, str)
                      else (TypeError, rf"^approximate must be a string, got {type(approximate).__name__}"))
    with pytest.raises(error, match=pattern):
        rawops.gelu(x, approximate)
    with pytest.raises(error, match=pattern):
        rawops.gelu_backward(x, f32(ptr=OTHER), approximate)
    with pytest.raises(error, match=pattern):
        rawops.bias_gelu(x, f32((8,), ptr=OTHER), approximate)
    with pytest.raises(error, match=pattern):
        rawops.bias_gelu_backward(x, x, f32((8,), ptr=OTHER), approximate)
    with pytest.raises(error, match=pattern):
        rawops.linear_gelu(x, f32((16, 8), ptr=OTHER), None, approximate)


@pytest.mark.parametrize("kwargs, name", [({"activation": ["relu"]}, "activation"),
                                          ({"output_activation": None}, "output_activation")])
def test_an_activation_that_is_not_a_string_is_a_type_error_naming_it(kwargs, name):
    weights = [f16((16, 8), ptr=OTHER), f16((4, 16), ptr=OTHER + 0x10000)]
    with pytest.raises(TypeError, match=rf"^{name} must be a string, got "):
        rawops.fused_mlp(f16(), weights, **kwargs)
    if name == "output_activation":
        with pytest.raises(TypeError, match=rf"^{name} must be a string, got "):
            rawops.fused_mlp(f32((4, 100)), [f32((128, 100), ptr=OTHER), f32((64, 128), ptr=OTHER * 2),
                                             f32((10, 64), ptr=OTHER * 3)], None, output_activation=None)


# ------------------------------------------------------------------------------ scalars
@pytest.mark.parametrize("alpha", ["2", None, b"1", [0.5]])
def test_alpha_that_is_not_a_real_number_is_a_type_error_naming_alpha(alpha):
    pattern = rf"^alpha must be a real number, got {type(alpha).__name__}"
    with pytest.raises(TypeError, match=pattern):
        rawops.relu_scale(f32(), alpha)
    with pytest.raises(TypeError, match=pattern):
        rawops.relu_scale_backward(f32(), f32(ptr=OTHER), alpha)
    with pytest.raises(TypeError, match=pattern):
        rawops.relu_scale_add(f32(), alpha, f32(ptr=OTHER))


def test_alpha_of_a_numpy_or_int_type_is_accepted():
    assert_passes_validation(rawops.relu_scale, f32(), np.float32(0.5))
    assert_passes_validation(rawops.relu_scale, f32(), 2)


@pytest.mark.parametrize("eps, error, pattern", [("abc", TypeError, r"^eps must be a real number, got str"),
                                                 ([1e-5], TypeError, r"^eps must be a real number, got list"),
                                                 (-1.0, ValueError, r"^eps must be >= 0, got -1.0"),
                                                 (float("nan"), ValueError, r"^eps must be >= 0, got nan")])
def test_bad_eps_names_eps(eps, error, pattern):
    with pytest.raises(error, match=pattern):
        rawops.layer_norm(f32(), eps=eps)
    with pytest.raises(error, match=pattern):
        rawops.rms_norm(f32(), eps=eps)


def test_negative_stream_handle_is_a_value_error():
    with pytest.raises(ValueError, match=r"^stream must be a non-negative handle, got -1"):
        stream_pointer(-1, 0)


# ------------------------------------------------------------------------------ malformed interfaces
# The launcher indexes shape and strides with bounds checks off: these crashed the interpreter
# (a strides tuple shorter than the shape was read past its end).
@pytest.mark.parametrize("shape, strides", [((4, 8), (4,)), ((8,), ()), ((4, 8), (32, 4, 123456)),
                                            ((4, 8), ("a", 4))])
def test_strides_that_do_not_match_the_shape_are_a_value_error_naming_the_array(shape, strides):
    with pytest.raises(ValueError, match=r"^x has __cuda_array_interface__ strides .* expected None or one int per"):
        rawops.gelu(f32(shape, strides=strides), approximate="tanh")
    with pytest.raises(ValueError, match=r"^a has __cuda_array_interface__ strides"):
        rawops.matmul(f32(shape, strides=strides), f32((8, 4), ptr=OTHER))
    with pytest.raises(ValueError, match=r"^x has __cuda_array_interface__ strides"):
        rawops.softmax(f32(shape, strides=strides))


@pytest.mark.parametrize("drop", ["data", "shape", "typestr"])
def test_an_interface_missing_a_required_key_is_a_type_error_naming_the_array(drop):
    x = f32()
    del x.cai[drop]
    with pytest.raises(TypeError, match=r"^x has a malformed __cuda_array_interface__"):
        rawops.gelu(x, approximate="tanh")


@pytest.mark.parametrize("shape", [(4, -1), (4, 8.0), "48"])
def test_an_interface_with_a_bad_shape_is_a_type_error(shape):
    x = f32()
    x.cai["shape"] = shape
    with pytest.raises(TypeError, match=r"^x has a malformed __cuda_array_interface__"):
        rawops.gelu(x, approximate="tanh")


@pytest.mark.parametrize("stream", ["7", -3, 1.0])
def test_an_interface_stream_that_is_not_a_handle_is_a_type_error(stream):
    with pytest.raises(TypeError, match=r"^x: __cuda_array_interface__ stream must be None or a non-negative int"):
        as_array(f32(stream=stream), "x")


def test_interface_with_list_shape_and_numpy_int_strides_is_read():
    x = f32()
    x.cai["shape"], x.cai["strides"] = [4, 8], (np.int64(32), np.int64(4))
    a = as_array(x, "x")
    assert a.shape == (4, 8) and a.contiguous


# ------------------------------------------------------------------------------ column_sum
def test_column_sum_of_int32_is_a_type_error():
    with pytest.raises(TypeError, match=r"^x has dtype <i4; column_sum supports float32"):
        rawops.column_sum(FakeCAI((4, 8), "<i4"))


@pytest.mark.parametrize("x", [f32(()), f32((4, 8), strides=(4, 16))], ids=["0-d", "fortran"])
def test_column_sum_needs_a_contiguous_array_with_a_dimension(x):
    with pytest.raises(ValueError, match=r"^x must be a C-contiguous array with at least one dimension"):
        rawops.column_sum(x)


def test_column_sum_of_host_memory_is_a_type_error():
    with pytest.raises(TypeError, match=r"^x is in host memory"):
        rawops.column_sum(np.zeros((4, 8), np.float32))


# ------------------------------------------------------------------------------ as_array
@pytest.mark.parametrize("typestr, code, text, itemsize", [
    ("<f4", 0, "float32", 4), ("<f2", 1, "float16", 2), ("|u1", 3, "uint8", 1), ("<u1", 3, "uint8", 1),
    ("<u2", 4, "uint16", 2), ("<i4", -1, "<i4", 4), ("<f8", -1, "<f8", 8),
])
def test_as_array_reads_dtype_from_typestr(typestr, code, text, itemsize):
    a = as_array(FakeCAI((3, 5), typestr), "x")
    assert (a.dtype, a.dtype_text, a.itemsize) == (code, text, itemsize)
    assert a.nbytes == 15 * itemsize


def test_as_array_reads_every_field_of_a_v3_interface():
    obj = FakeCAI([2, 3, 4], "<f2", ptr=BASE + 64, readonly=True, stream=7)
    a = as_array(obj, "weights")
    assert a.name == "weights"
    assert a.obj is obj
    assert a.ptr == BASE + 64
    assert a.shape == (2, 3, 4) and isinstance(a.shape, tuple)
    assert a.size == 24
    assert a.dtype == 1 and a.dtype_text == "float16" and a.itemsize == 2
    assert a.nbytes == 48
    assert a.contiguous
    assert a.readonly
    assert a.device == -1  # resolved later, by the driver
    assert a.stream == 7
    assert not a.is_cupy


def test_as_array_writable_and_without_stream_key():
    a = as_array(f32((4,)), "x")
    assert not a.readonly
    assert a.stream is None


@pytest.mark.parametrize("stream", [1, 2, 0x55AA00001234])
def test_as_array_keeps_a_v3_stream(stream):
    assert as_array(f32((4,), stream=stream), "x").stream == stream


def test_as_array_keeps_an_explicit_none_stream():
    assert as_array(f32((4,), stream=None), "x").stream is None


@pytest.mark.parametrize("stream", [0, 7])
def test_as_array_ignores_the_stream_key_of_a_v2_interface(stream):
    a = as_array(f32((4,), version=2, stream=stream), "x")
    assert a.stream is None


def test_as_array_rejects_stream_zero_naming_the_argument():
    with pytest.raises(ValueError, match=r"^dy: __cuda_array_interface__ stream 0"):
        as_array(f32((4,), stream=0), "dy")


def test_as_array_rejects_a_mask():
    with pytest.raises(ValueError, match=r"^x is a masked array"):
        as_array(f32((4,), mask=f32((4,), ptr=OTHER)), "x")


def test_as_array_reads_a_null_pointer_of_an_empty_array():
    a = as_array(FakeCAI((0, 8), "<f4", ptr=0), "x")
    assert (a.ptr, a.size, a.nbytes, a.contiguous) == (0, 0, 0, True)


def test_as_array_of_a_zero_dimensional_array_has_one_element():
    a = as_array(f32(()), "x")
    assert (a.shape, a.size, a.contiguous) == ((), 1, True)


@pytest.mark.parametrize("shape, strides, contiguous", [
    ((4, 8), None, True),
    ((4, 8), (32, 4), True),
    ((2, 3, 4), (48, 16, 4), True),
    ((1, 8), (12345, 4), True),  # size-1 dims may have any stride
    ((4, 1), (4, 999), True),
    ((1, 1, 5), (0, 7, 4), True),
    ((1,), (-4,), True),
    ((0, 8), (4, 16), True),  # no elements: any layout is contiguous
    ((4, 8), (4, 16), False),  # Fortran order
    ((4, 8), (64, 4), False),  # padded rows
    ((16,), (8,), False),
    ((4, 8), (0, 4), False),  # broadcast
    ((2, 2), (2, 4), False),
    ((8,), (2,), False),  # stride smaller than the item
])
def test_as_array_contiguity_from_strides(shape, strides, contiguous):
    assert as_array(f32(shape, strides=strides), "x").contiguous is contiguous


def test_as_array_contiguity_uses_the_element_size_of_the_dtype():
    assert as_array(f16((4, 8), strides=(16, 2)), "x").contiguous
    assert not as_array(f16((4, 8), strides=(32, 4)), "x").contiguous


def test_as_array_of_a_list_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"^bias must be a GPU array"):
        as_array([1, 2], "bias")


# ------------------------------------------------------------------------------ streams
def test_the_legacy_streams_hold_no_scratch_and_release_counts_what_was_held():
    from rawops._launch import hold_if_capturing, release_captured_scratch

    release_captured_scratch()
    hold_if_capturing(0, object())  # the legacy streams cannot be captured: no CUDA call, nothing held
    hold_if_capturing(1, object())
    assert release_captured_scratch() == 0


def test_stream_pointer_accepts_int_handles_and_stream_objects():
    class CupyLike:
        ptr = 0x1234

    class TorchLike:
        cuda_stream = 0x5678

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x9ABC)

    assert stream_pointer(0x42, 0) == 0x42
    assert stream_pointer(CupyLike(), 0) == 0x1234
    assert stream_pointer(TorchLike(), 0) == 0x5678
    assert stream_pointer(Protocol(), 0) == 0x9ABC


@pytest.mark.parametrize("stream", ["default", 1.5, object()])
def test_stream_pointer_refuses_anything_else(stream):
    with pytest.raises(TypeError, match=r"^stream must be None, an int handle or a CUDA stream object"):
        stream_pointer(stream, 0)


# ------------------------------------------------------------------------------ torch tensor path
@pytest.fixture(scope="module")
def torch_path():
    torch = pytest.importorskip("torch")
    import rawops.torch_adapter  # noqa: F401 - registers torch's types with the launcher

    return torch, rawops.elementwise.MAP


def _map_call(kernel, *args, **kwargs):
    from rawops._launch import map_call

    return map_call(kernel, *args, **kwargs)


def test_torch_path_refuses_a_cpu_tensor_before_touching_cuda(torch_path):
    torch, kernels = torch_path
    with pytest.raises(ValueError, match=r"^x is on cpu; rawops runs on CUDA tensors"):
        _map_call(kernels["gelu_tanh_fwd"], torch.zeros(4))
    with pytest.raises(ValueError, match=r"^a is on cpu"):
        _map_call(kernels["add_fwd"], torch.zeros(4), torch.zeros(4))


@pytest.mark.parametrize("dtype", ["int32", "float64", "complex64"])
def test_torch_path_refuses_unsupported_dtypes_naming_the_argument(torch_path, dtype):
    torch, kernels = torch_path
    with pytest.raises(TypeError, match=rf"^x has dtype torch.{dtype}; rawops supports float32, float16, bfloat16"):
        _map_call(kernels["relu_fwd"], torch.zeros(4, dtype=getattr(torch, dtype)))


def test_torch_path_checks_strided_operands_as_it_checks_contiguous_ones(torch_path):
    # Strided tensors run the strided kernels: every check still fires first, naming the operand.
    # CPU tensors that report GPU 0 stand in for CUDA tensors (only calls that fail a check: one
    # that passed would launch on their host pointers where a GPU is).
    torch, kernels = torch_path

    class OnGPU0(torch.Tensor):
        def get_device(self):
            return 0

    def gpu(t):
        return t.as_subclass(OnGPU0)

    a, transposed = gpu(torch.randn(4, 8)), gpu(torch.randn(8, 4).t())
    with pytest.raises(TypeError, match=r"^b has dtype torch.float16, expected torch.float32 like a"):
        _map_call(kernels["add_fwd"], a, gpu(torch.randn(8, 4, dtype=torch.float16).t()))
    with pytest.raises(ValueError, match=r"^b has shape \(8, 4\), expected \(4, 8\) like a"):
        _map_call(kernels["add_fwd"], a, gpu(torch.randn(4, 8).t()))
    with pytest.raises(ValueError, match=r"^out has elements that share memory"):
        _map_call(kernels["relu_fwd"], transposed, out=gpu(torch.randn(8).expand(4, 8)))
    base = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"^out partially overlaps x"):
        _map_call(kernels["relu_fwd"], gpu(base[:, ::2]), out=gpu(base[:, 1::2]))
    with pytest.raises(ValueError, match=r"^out has shape \(8, 4\), expected \(4, 8\)"):
        _map_call(kernels["relu_fwd"], transposed, out=gpu(torch.empty(8, 4)))
    with pytest.raises(ValueError, match=r"^bias has shape \(4,\), expected one value per element"):
        _map_call(kernels["bias_gelu_tanh_fwd"], transposed, c=gpu(torch.randn(8)[::2]))


def test_torch_path_refuses_non_tensors(torch_path):
    _, kernels = torch_path
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, got FakeCAI"):
        _map_call(kernels["relu_fwd"], f32())


# ------------------------------------------------------------------------------ arrays on two GPUs
def _cupy_array_claiming_device(ptr, n, device):
    """A CuPy array over memory CuPy believes is on `device`: no GPU is touched to make it."""
    import cupy

    memory = cupy.cuda.UnownedMemory(ptr, n * 4, None, device)
    return cupy.ndarray((n,), dtype=np.float32, memptr=cupy.cuda.MemoryPointer(memory, 0))


@pytest.mark.parametrize("which", ["b", "out"])
def test_operand_on_another_gpu_is_a_value_error_naming_it(which):
    a = _cupy_array_claiming_device(BASE, 16, 0)
    other = _cupy_array_claiming_device(BASE + 0x100000, 16, 1)
    b = other if which == "b" else _cupy_array_claiming_device(BASE + 0x200000, 16, 0)
    out = other if which == "out" else None
    with pytest.raises(ValueError, match=rf"^{which} is on device 1, a on device 0"):
        rawops.add(a, b, out=out)


class _StreamOf:
    """A stream object as CuPy's (ptr, device_id) or torch's (cuda_stream, device_index) are."""

    def __init__(self, device, torch_like=False):
        if torch_like:
            self.cuda_stream, self.device_index = 0x1234, device
        else:
            self.ptr, self.device_id = 0x1234, device


@pytest.mark.parametrize("torch_like", [False, True], ids=["cupy-like", "torch-like"])
@pytest.mark.parametrize("op", ["add", "matmul", "layer_norm"])
def test_stream_of_another_gpu_is_a_value_error_naming_stream(op, torch_like):
    a = _cupy_array_claiming_device(BASE, 16, 0)
    b = _cupy_array_claiming_device(BASE + 0x100000, 16, 0)
    stream = _StreamOf(1, torch_like)
    calls = {
        "add": lambda: rawops.add(a, b, stream=stream),
        "matmul": lambda: rawops.matmul(a.reshape(4, 4), b.reshape(4, 4), stream=stream),
        "layer_norm": lambda: rawops.layer_norm(a.reshape(4, 4), stream=stream),
    }
    with pytest.raises(ValueError, match=r"^stream is on device 1, the arrays on device 0"):
        calls[op]()


# ------------------------------------------------------------------------------ torch ops called directly
# The rawops::* custom ops run under torch.compile (or from torch.ops) without the eager
# wrappers' checks; they must make the same ones. CPU tensors that report GPU 0 stand in for
# CUDA tensors: every check passes or fails before any pointer is used.
@pytest.fixture(scope="module")
def on_gpu0(torch_path):
    torch, _ = torch_path

    class OnGPU0(torch.Tensor):
        def get_device(self):
            return 0

    return lambda t: t.as_subclass(OnGPU0)


def test_fused_mlp_op_checks_x_and_weights_like_the_eager_call(torch_path, on_gpu0):
    torch, _ = torch_path
    w0, w1 = on_gpu0(torch.randn(16, 8, dtype=torch.float16)), on_gpu0(torch.randn(4, 16, dtype=torch.float16))
    x = on_gpu0(torch.randn(4, 8, dtype=torch.float16))
    strided = on_gpu0(torch.randn(8, 4, dtype=torch.float16).t())
    with pytest.raises(ValueError, match=r"^x is not contiguous"):
        torch.ops.rawops.fused_mlp(strided, [w0, w1], None, "relu", "none")
    with pytest.raises(TypeError, match=r"^weights\[1\] has dtype torch.float32, expected torch.float16 like x"):
        torch.ops.rawops.fused_mlp(x, [w0, w1.float()], None, "relu", "none")
    with pytest.raises(ValueError, match=r"^weights\[1\] has shape \(4, 999\), expected \(out, 16\)"):
        torch.ops.rawops.fused_mlp(x, [w0, on_gpu0(torch.randn(4, 999, dtype=torch.float16))], None, "relu", "none")
    with pytest.raises(ValueError, match=r"^x is not contiguous"):
        torch.ops.rawops.fused_mlp_train(strided, [w0, w1], None, "relu", "none")


def test_fused_mlp_backward_op_checks_dy_y_and_the_kept_activations(torch_path, on_gpu0):
    torch, _ = torch_path
    half = torch.float16
    x, w0, w1 = (on_gpu0(torch.randn(*s, dtype=half)) for s in ((4, 8), (16, 8), (4, 16)))
    y, saved = on_gpu0(torch.randn(4, 4, dtype=half)), on_gpu0(torch.randn(1, 4, 16, dtype=half))
    empty = on_gpu0(torch.empty(0, dtype=half))
    good_dy = on_gpu0(torch.randn(4, 4, dtype=half))

    def backward(dy=good_dy, y=y, s1=saved):
        torch.ops.rawops.fused_mlp_backward(dy, x, y, s1, empty, [w0, w1], None, "relu", "none", True)

    with pytest.raises(ValueError, match=r"^dy has shape \(4, 5\), expected \(4, 4\)"):
        backward(dy=on_gpu0(torch.randn(4, 5, dtype=half)))
    with pytest.raises(TypeError, match=r"^y has dtype torch.float32, expected torch.float16 like x"):
        backward(y=on_gpu0(torch.randn(4, 4)))
    with pytest.raises(ValueError, match=r"^saved\[0\] has shape \(1, 3, 16\), expected \(1, 4, 16\)"):
        backward(s1=on_gpu0(torch.randn(1, 3, 16, dtype=half)))


def test_norm_backward_op_checks_mean_and_rstd(torch_path, on_gpu0):
    torch, _ = torch_path
    x, dy = on_gpu0(torch.randn(64, 8)), on_gpu0(torch.randn(64, 8))
    mean, rstd = on_gpu0(torch.randn(64)), on_gpu0(torch.rand(64) + 1)
    op = torch.ops.rawops.layer_norm_backward
    with pytest.raises(TypeError, match=r"^mean has dtype torch.float16, expected torch.float32"):
        op(dy, x, None, on_gpu0(torch.zeros(64, dtype=torch.float16)), rstd, False, True)
    with pytest.raises(ValueError, match=r"^mean has shape \(1,\), expected \(64,\) \(one per row of x\)"):
        op(dy, x, None, on_gpu0(torch.zeros(1)), rstd, False, True)
    with pytest.raises(ValueError, match=r"^rstd is not contiguous"):
        op(dy, x, None, mean, on_gpu0(torch.zeros(64, 2)[:, 0]), False, True)
    with pytest.raises(ValueError, match=r"^rstd has shape \(2,\)"):
        torch.ops.rawops.rms_norm_backward(dy, x, None, on_gpu0(torch.empty(0)), on_gpu0(torch.ones(2)), False, False)


@pytest.mark.parametrize("eps, error, pattern", [(-1.0, ValueError, r"^eps must be >= 0, got -1.0"),
                                                 ("abc", TypeError, r"^eps must be a real number, got str")])
def test_torch_adapter_norms_check_eps(torch_path, on_gpu0, eps, error, pattern):
    torch, _ = torch_path
    from rawops import torch_adapter as ta

    x = on_gpu0(torch.randn(4, 8))
    with pytest.raises(error, match=pattern):
        ta.layer_norm(x, (8,), eps=eps)
    with pytest.raises(error, match=pattern):
        ta.rms_norm(x, (8,), eps=eps)


def test_torch_adapter_approximate_that_is_not_a_string_is_a_type_error(torch_path, on_gpu0):
    torch, _ = torch_path
    from rawops import torch_adapter as ta

    x = on_gpu0(torch.randn(4, 8))
    for call in (lambda: ta.gelu(x, ["tanh"]), lambda: ta.bias_gelu(x, x[0], ["tanh"]), lambda: ta.GELU(None),
                 lambda: ta.LinearGELU(4, 4, approximate=["tanh"])):
        with pytest.raises(TypeError, match=r"^approximate must be a string, got "):
            call()


def test_torch_adapter_alpha_must_be_a_real_number(torch_path, on_gpu0):
    torch, _ = torch_path
    from rawops import torch_adapter as ta

    x = on_gpu0(torch.randn(4, 8))
    for alpha in ("2", "abc", None):
        with pytest.raises(TypeError, match=r"^alpha must be a real number, got "):
            ta.relu_scale(x, alpha)
        with pytest.raises(TypeError, match=r"^alpha must be a real number, got "):
            ta.relu_scale_add(x, alpha, x)


def test_torch_fused_mlp_needs_lists_of_weights_and_biases_and_biases_on_the_source_network(torch_path, on_gpu0):
    torch, _ = torch_path
    from rawops import torch_adapter as ta

    x = on_gpu0(torch.zeros(4, 100))
    weights = [on_gpu0(torch.zeros(s)) for s in ((128, 100), (64, 128), (10, 64))]
    with pytest.raises(ValueError, match=r"^float32 network of sizes \(100, 128, 64, 10\) with activation 'relu', "
                                         r"no biases is not supported"):
        ta.fused_mlp(x, weights, None)
    with pytest.raises(ValueError, match=r"^weights must be a non-empty list of \[out, in\] tensors"):
        ta.fused_mlp(x, on_gpu0(torch.zeros(3, 1)), [torch.zeros(1)] * 3)
    with pytest.raises(ValueError, match=r"^biases must be None or a list of 2 tensors, one per weight"):
        ta.fused_mlp(x, weights[:2], [on_gpu0(torch.zeros(1))] * 3)
