"""Row families (norm, softmax) without a GPU: launch plans, and argument checks that fire
before any launch (fake __cuda_array_interface__ producers, as in test_validation.py)."""

import pytest

import rawops
from rawops import _rows
from test_validation import BASE, OTHER, FakeCAI, assert_passes_validation, f16, f32

import rawops.norm as norm  # noqa: E402


# ------------------------------------------------------------------------------ launch plans
@pytest.mark.parametrize("n, elems, mode, threads", [
    (1, 16, _rows.WARP_PER_ROW, 256), (512, 16, _rows.WARP_PER_ROW, 256), (513, 16, _rows.BLOCK_PER_ROW, 64),
    (768, 16, _rows.BLOCK_PER_ROW, 64), (1024, 16, _rows.BLOCK_PER_ROW, 64), (1025, 16, _rows.BLOCK_PER_ROW, 128),
    (4096, 16, _rows.BLOCK_PER_ROW, 256), (4097, 16, _rows.BLOCK_PER_ROW, 512), (8192, 16, _rows.BLOCK_PER_ROW, 512),
    (8193, 16, _rows.STREAM_ROW, 512), (65536, 16, _rows.STREAM_ROW, 512),
    (4096, 32, _rows.BLOCK_PER_ROW, 128), (256, 8, _rows.WARP_PER_ROW, 256), (257, 8, _rows.BLOCK_PER_ROW, 64),
    (4096, 8, _rows.BLOCK_PER_ROW, 512), (4097, 8, _rows.STREAM_ROW, 512),
])
def test_aligned_rows_get_the_smallest_block_that_holds_them(n, elems, mode, threads):
    # A warp holds 32 x elems elements, a block `threads` x elems (kernels/include/rawops/rows.cuh).
    got_mode, _, got_threads = _rows.row_plan(100, n, elems, 4, aligned=1)
    assert (got_mode, got_threads) == (mode, threads)
    if mode != _rows.STREAM_ROW:
        width = 32 if mode == _rows.WARP_PER_ROW else threads
        assert width * elems >= n and (width == 32 or width == _rows.MIN_ROW_THREADS or width // 2 * elems < n)
    assert threads % 32 == 0 and threads <= _rows.MAX_ROW_THREADS


@pytest.mark.parametrize("n, itemsize, threads", [(1, 4, 32), (31, 4, 32), (4097, 4, 512), (1000, 2, 128),
                                                  (4097, 2, 512), (65537, 2, 512)])
def test_rows_off_16_byte_boundaries_stream_in_a_block_sized_to_the_row(n, itemsize, threads):
    # The register modes are compiled for 16-byte vectors only (rows.cuh).
    assert _rows.row_plan(7, n, 64 // itemsize, itemsize, aligned=0) == (_rows.STREAM_ROW, 7, threads)


@pytest.mark.parametrize("rows, n, blocks", [(0, 8, 1), (1, 8, 1), (8, 8, 1), (9, 8, 2), (16384, 768, 16384),
                                             (16384, 256, 2048), (3, 4096, 3), (16384, 65536, 16384)])
def test_row_plan_grid_covers_every_row_once(rows, n, blocks):
    mode, got, threads = _rows.row_plan(rows, n, 16, 4, aligned=1)
    assert got == blocks
    per_block = threads // 32 if mode == _rows.WARP_PER_ROW else 1
    assert got * per_block >= rows and (got - 1) * per_block < max(rows, 1)


def test_row_plan_caps_the_grid_and_never_exceeds_a_launchable_one():
    assert _rows.row_plan(10 ** 6, 4096, 8, 4, 1) == (_rows.BLOCK_PER_ROW, 10 ** 6, 512)
    # The backward's 64-register bound fits 1024 of its threads an SM: two 512-thread blocks.
    assert norm.backward_plan(10 ** 6, 4096, 4, 66, BASE, BASE, 0, BASE)[:3] == (_rows.BLOCK_PER_ROW, 132, 512)
    assert _rows.row_plan(1 << 40, 8, 16, 4, 1)[1] == _rows.MAX_GRID  # the kernels loop over the rest


@pytest.mark.parametrize("n, itemsize, threads, chunks", [
    (4096, 4, 512, 132 * 2), (768, 4, 128, 132 * 8), (100, 4, 256, 132 * 4 * 8), (4096, 2, 256, 132 * 4)])
def test_norm_backward_fills_each_sm_once_with_one_partial_row_per_block_or_warp(n, itemsize, threads, chunks):
    # Resident by registers: 1024 threads of a 64-register kernel an SM (norm.BWD_THREADS_PER_SM).
    mode, blocks, got_threads, got_chunks, aligned = norm.backward_plan(16384 * 8, n, itemsize, 132, BASE, BASE, 0,
                                                                        BASE)
    assert got_threads == threads and blocks == 132 * (1024 // threads) and got_chunks == chunks and aligned
    assert got_chunks == (blocks * threads // 32 if mode == _rows.WARP_PER_ROW else blocks)


def test_norm_backward_plan_of_few_rows_has_a_block_or_warp_per_row_at_most():
    assert norm.backward_plan(3, 4096, 4, 132, BASE, BASE, BASE, BASE)[:4] == (_rows.BLOCK_PER_ROW, 3, 512, 3)
    assert norm.backward_plan(3, 64, 4, 132, BASE, BASE, 0, BASE)[:4] == (_rows.WARP_PER_ROW, 1, 256, 8)


@pytest.mark.parametrize("mode, threads, itemsize, partials, smem", [
    (_rows.BLOCK_PER_ROW, 256, 2, 2, 256 * 16 * 4 * 2), (_rows.BLOCK_PER_ROW, 512, 4, 1, 512 * 8 * 4),
    (_rows.WARP_PER_ROW, 256, 2, 2, 256 * 16 * 4 * 2), (_rows.BLOCK_PER_ROW, 256, 2, 0, 0),
    (_rows.STREAM_ROW, 512, 2, 2, 0)])
def test_norm_backward_register_modes_keep_a_float32_sum_per_held_column_in_shared_memory(
        mode, threads, itemsize, partials, smem):
    # A thread holds BWD_BYTES of each row: 16 elements of a 16-bit type, 8 of float32.
    assert norm.column_smem(mode, threads, itemsize, partials) == smem
    # Widest register-mode block: 64 KB for 16-bit types, over the 48 KB default (opt-in).
    assert norm.column_smem(_rows.BLOCK_PER_ROW, _rows.MAX_ROW_THREADS, 2, 2) == 64 * 1024


def test_norm_backward_streams_when_an_operand_is_off_16_bytes():
    mode, blocks, threads, chunks, aligned = norm.backward_plan(16384, 4096, 2, 132, BASE, BASE + 2, 0, BASE)
    assert (mode, aligned, chunks) == (_rows.STREAM_ROW, 0, blocks)


@pytest.mark.parametrize("n, itemsize, pointers, vec", [
    (8, 4, (BASE, BASE + 64), 1), (8, 2, (BASE,), 1), (6, 4, (BASE,), 0), (12, 2, (BASE,), 0),
    (8, 4, (BASE, BASE + 4), 0), (8, 4, (BASE, 0), 1), (1000, 2, (BASE + 16,), 1), (1, 4, (BASE,), 0),
])
def test_vector_flag_needs_every_row_start_on_16_bytes(n, itemsize, pointers, vec):
    assert _rows.vectors(n, itemsize, *pointers) == vec


# ------------------------------------------------------------------------------ validation
def w32(n=8, ptr=OTHER, **kw):
    return f32((n,), ptr=ptr, **kw)


def test_valid_norm_and_softmax_calls_get_past_validation():
    x = f32((4, 8))
    assert_passes_validation(rawops.layer_norm, x, w32(), w32(ptr=OTHER + 64))
    assert_passes_validation(rawops.layer_norm, x)
    assert_passes_validation(rawops.rms_norm, f16((4, 8)), f16((8,), ptr=OTHER))
    assert_passes_validation(rawops.softmax, x)
    assert_passes_validation(rawops.log_softmax, x, out=x)  # in place
    assert_passes_validation(rawops.softmax_backward, x, f32((4, 8), ptr=OTHER))
    assert_passes_validation(rawops.layer_norm_backward, x, f32((4, 8), ptr=OTHER), w32(ptr=OTHER + 0x1000),
                             f32((4,), ptr=OTHER + 0x2000), f32((4,), ptr=OTHER + 0x3000))
    assert_passes_validation(rawops.rms_norm_backward, x, f32((4, 8), ptr=OTHER), None, f32((4,), ptr=OTHER + 0x2000))


@pytest.mark.parametrize("fn", [rawops.layer_norm, rawops.rms_norm])
@pytest.mark.parametrize("shape", [(7,), (9,), (1, 8), (4, 8), ()])
def test_weight_of_the_wrong_shape_is_a_value_error_naming_weight(fn, shape):
    with pytest.raises(ValueError, match=r"^weight has shape .*expected \(8,\): one value per element of x's last dim"):
        fn(f32((4, 8)), f32(shape, ptr=OTHER))


def test_bias_of_the_wrong_shape_or_dtype_is_an_error_naming_bias():
    with pytest.raises(ValueError, match=r"^bias has shape \(4,\), expected \(8,\)"):
        rawops.layer_norm(f32((4, 8)), w32(), f32((4,), ptr=OTHER + 64))
    with pytest.raises(TypeError, match=r"^bias has dtype float16, expected float32 like x"):
        rawops.layer_norm(f32((4, 8)), None, f16((8,), ptr=OTHER))


def test_weight_of_another_dtype_is_a_type_error():
    with pytest.raises(TypeError, match=r"^weight has dtype float16, expected float32 like x"):
        rawops.rms_norm(f32((4, 8)), f16((8,), ptr=OTHER))


@pytest.mark.parametrize("fn", [rawops.layer_norm, rawops.rms_norm, rawops.softmax, rawops.log_softmax])
def test_unsupported_dtype_zero_dim_and_non_contiguous_x_are_refused(fn):
    with pytest.raises(TypeError, match=r"^x has dtype <f8; \w+ supports float32, float16, bfloat16"):
        fn(FakeCAI((4, 8), "<f8"))
    with pytest.raises(ValueError, match=r"^x must have at least one dimension"):
        fn(f32(()))
    with pytest.raises(ValueError, match=r"^x is not C-contiguous"):
        fn(f32((4, 8), strides=(4, 16)))
    with pytest.raises(ValueError, match=r"^x is misaligned"):
        fn(f32((4, 8), ptr=BASE + 2))


def test_non_contiguous_weight_is_a_value_error():
    with pytest.raises(ValueError, match=r"^weight is not C-contiguous"):
        rawops.layer_norm(f32((4, 8)), f32((8,), ptr=OTHER, strides=(8,)))


@pytest.mark.parametrize("fn", [rawops.softmax_backward, rawops.log_softmax_backward])
def test_softmax_backward_operands_must_match(fn):
    with pytest.raises(ValueError, match=r"^y has shape \(4, 9\), expected \(4, 8\) like dy"):
        fn(f32((4, 8)), f32((4, 9), ptr=OTHER))
    with pytest.raises(TypeError, match=r"^y has dtype float16, expected float32 like dy"):
        fn(f32((4, 8)), f16((4, 8), ptr=OTHER))


def test_norm_backward_statistics_are_checked():
    dy, x = f32((4, 8)), f32((4, 8), ptr=OTHER)
    with pytest.raises(ValueError, match=r"^rstd has 3 values, expected one per row of x \(4\)"):
        rawops.rms_norm_backward(dy, x, None, f32((3,), ptr=OTHER + 0x1000))
    with pytest.raises(TypeError, match=r"^mean has dtype float16, expected float32"):
        rawops.layer_norm_backward(dy, x, None, f16((4,), ptr=OTHER + 0x1000), f32((4,), ptr=OTHER + 0x2000))
    with pytest.raises(ValueError, match=r"^dy has shape \(4, 7\), expected \(4, 8\) like x"):
        rawops.layer_norm_backward(f32((4, 7)), x, None, f32((4,), ptr=OTHER + 0x1000), f32((4,), ptr=OTHER + 0x2000))


def test_out_must_match_and_not_partially_overlap():
    x = f32((4, 8))
    with pytest.raises(ValueError, match=r"^out has shape \(4, 9\), expected \(4, 8\) like x"):
        rawops.softmax(x, out=f32((4, 9), ptr=OTHER))
    with pytest.raises(ValueError, match=r"^out overlaps x; pass out=x exactly"):
        rawops.layer_norm(x, out=f32((4, 8), ptr=BASE + 16))
    with pytest.raises(ValueError, match=r"^out overlaps weight"):
        rawops.layer_norm(x, w32(ptr=OTHER + 16), out=f32((4, 8), ptr=OTHER))
    with pytest.raises(ValueError, match=r"^out is read-only"):
        rawops.softmax(x, out=f32((4, 8), ptr=OTHER, readonly=True))


@pytest.mark.parametrize("eps", [-1.0, float("nan")])
def test_negative_or_nan_eps_is_a_value_error(eps):
    with pytest.raises(ValueError, match=r"^eps must be >= 0"):
        rawops.layer_norm(f32((4, 8)), eps=eps)


# ------------------------------------------------------------------------------ torch adapter, no GPU needed
def test_adapter_refuses_bad_arguments_before_any_launch():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    with pytest.raises(ValueError, match=r"^x is on cpu"):
        ta.layer_norm(torch.ones(4, 8))
    with pytest.raises(TypeError, match=r"^x has dtype torch.int32"):
        ta.softmax(torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^dim must be the last dim"):
        ta.softmax(torch.ones(4, 8), dim=0)
    with pytest.raises(ValueError, match=r"^normalized_shape must be one dim"):
        ta.LayerNorm((4, 8))


def test_adapter_modules_have_torch_parameter_names():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    for ours, theirs in [(ta.LayerNorm(8), torch.nn.LayerNorm(8)), (ta.LayerNorm(8, bias=False),
                                                                  torch.nn.LayerNorm(8, bias=False)),
                         (ta.LayerNorm(8, elementwise_affine=False), torch.nn.LayerNorm(8, elementwise_affine=False)),
                         (ta.RMSNorm(8), torch.nn.RMSNorm(8)),
                         (ta.RMSNorm(8, 1e-5, False), torch.nn.RMSNorm(8, 1e-5, False))]:
        state = {k: torch.randn_like(v) for k, v in theirs.state_dict().items()}
        theirs.load_state_dict(state)
        ours.load_state_dict(theirs.state_dict())  # strict: same names and shapes
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        for k in state:
            assert torch.equal(ours.state_dict()[k], state[k])
