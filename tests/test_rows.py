"""Row families (norm, softmax) without a GPU: launch plans, and argument checks that fire
before any launch (fake __cuda_array_interface__ producers, as in test_validation.py)."""

import itertools

import pytest

import rawops
from rawops import _modules, _rows
from test_validation import BASE, OTHER, FakeCAI, assert_passes_validation, f16, f32

import rawops.norm as norm  # noqa: E402
import rawops.softmaxes as softmax_module  # noqa: E402


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


@pytest.mark.parametrize("n, itemsize, strides, vec", [
    (8, 4, (8, 8), 1), (8, 4, (12, 8), 1), (8, 4, (16, 0), 1), (8, 4, (-8, 8), 1),  # 32 / 48 / 0 / -32 bytes
    (8, 4, (10, 8), 0), (8, 4, (8, 9), 0), (8, 2, (24, 8), 1), (8, 2, (12, 8), 0), (8, 2, (4100, 8), 0),
])
def test_vector_flag_needs_every_row_stride_on_16_bytes(n, itemsize, strides, vec):
    # Rows of a row-strided view start stride * itemsize bytes apart: the 16-byte path needs that a
    # whole number of vectors too (x[:, :n] of a wider matrix keeps it when the width does).
    assert _rows.vectors(n, itemsize, BASE, BASE + 64, strides=strides) == vec


@pytest.mark.parametrize("shape, strides, stride", [
    ((4, 8), (8, 1), 8), ((4, 8), (16, 1), 16), ((4, 8), (0, 1), 0), ((4, 8), (-8, 1), -8),
    ((2, 3, 8), (48, 16, 1), 16), ((2, 1, 3, 8), (48, 999, 16, 1), 16), ((1, 8), (5, 1), 8), ((8,), (1,), 8),
    ((4, 1), (3, 7), 3), ((4, 8), (1, 4), None), ((2, 3, 8), (16, 32, 1), None), ((4, 8), (16, 2), None),
])
def test_leading_dims_collapse_to_one_row_stride_or_the_layout_is_not_row_strided(shape, strides, stride):
    assert _rows.collapsed_row_stride(shape, strides) == stride


ROW_STRIDED = {  # (shape, strides in bytes) of float32 views the row kernels take as they are
    "padded_rows": ((4, 8), (64, 4)),  # x[:, :8] of a (4, 16) matrix
    "every_other_row": ((4, 8), (64, 4)),
    "broadcast_rows": ((4, 8), (0, 4)),  # one row read four times (an input only)
    "reversed_rows": ((4, 8), (-32, 4)),
    "three_dims": ((2, 3, 8), (192, 64, 4)),
}


@pytest.mark.parametrize("layout", sorted(ROW_STRIDED))
@pytest.mark.parametrize("fn", [rawops.layer_norm, rawops.rms_norm, rawops.softmax, rawops.log_softmax])
def test_row_strided_views_get_past_validation(fn, layout):
    shape, strides = ROW_STRIDED[layout]
    x = f32(shape, ptr=BASE + 0x1000, strides=strides)
    assert_passes_validation(fn, x)
    if layout != "broadcast_rows":
        assert_passes_validation(fn, x, out=x)  # in place on the view
    assert_passes_validation(fn, f32(shape), out=f32(shape, ptr=OTHER, strides=(64,) * (len(shape) - 1) + (4,))
                             if len(shape) == 2 else None)


def test_row_strided_backward_operands_get_past_validation():
    padded = dict(strides=(64, 4))
    assert_passes_validation(rawops.softmax_backward, f32((4, 8), **padded), f32((4, 8), ptr=OTHER, **padded),
                             out=f32((4, 8), ptr=OTHER * 2, **padded))
    assert_passes_validation(rawops.layer_norm_backward, f32((4, 8), strides=(0, 4)), f32((4, 8), ptr=OTHER, **padded),
                             w32(ptr=OTHER + 0x1000), f32((4,), ptr=OTHER + 0x2000), f32((4,), ptr=OTHER + 0x3000))
    assert_passes_validation(rawops.rms_norm_backward, f32((4, 8), **padded), f32((4, 8), ptr=OTHER, strides=(-32, 4)),
                             None, f32((4,), ptr=OTHER + 0x2000))


def test_an_out_whose_rows_overlap_is_refused_and_strides_must_be_whole_elements():
    x = f32((4, 8))
    with pytest.raises(ValueError, match=r"^out has rows 0 elements apart, 8 wide: its rows overlap each other"):
        rawops.softmax(x, out=f32((4, 8), ptr=OTHER, strides=(0, 4)))
    with pytest.raises(ValueError, match=r"^out has rows 4 elements apart, 8 wide"):
        rawops.layer_norm(x, out=f32((4, 8), ptr=OTHER, strides=(16, 4)))
    with pytest.raises(ValueError, match=r"^x has strides that are not a whole number of its 4-byte elements"):
        rawops.rms_norm(f32((4, 8), strides=(34, 4)))
    with pytest.raises(ValueError, match=r"^dy is not row-strided"):
        rawops.softmax_backward(f32((4, 8), strides=(4, 16)), f32((4, 8), ptr=OTHER))
    # a strided out over x's memory that is not x itself overlaps it
    with pytest.raises(ValueError, match=r"^out overlaps x; pass out=x exactly"):
        rawops.softmax(f32((4, 8), strides=(64, 4)), out=f32((4, 8), ptr=BASE + 32, strides=(64, 4)))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_launches_pass_each_operands_row_stride_and_keep_16_byte_rows(monkeypatch, op):
    # x[:, :768] of a (rows, 1024) float16 matrix: rows 2048 bytes apart, the 16-byte path kept;
    # a stride of 770 elements (1540 bytes) puts rows off 16 bytes: the element path.
    calls = []
    monkeypatch.setattr(norm, "launch", lambda *args: calls.append(args))
    monkeypatch.setattr(norm._modules, "function_pointer", lambda family, name, device: name)
    monkeypatch.setattr(norm, "resident", lambda name, device, threads, smem: 10 ** 6)
    monkeypatch.setattr(norm, "_allow_smem", lambda name, device, smem: True)
    monkeypatch.setattr(norm, "fast_memory", lambda device: False)  # the H100 SXM's
    for (stride, vec), cc in itertools.product(((1024, 1), (770, 0)), (80, 90, 120)):
        monkeypatch.setattr(norm, "compute_capability", lambda device, cc=cc: cc)
        for cache in ("_forward_configs", "_backward_configs", "_bulk_plans"):  # a device of each capability
            monkeypatch.setattr(norm, cache, {})
        calls.clear()
        norm.launch_forward(op, 0, 1, 2, BASE, OTHER, 0, OTHER * 2, 0, OTHER * 3, 64, 768, 1e-5, 0, stride, 768)
        (name, grid, block, smem, stream, args, kinds, device), = calls
        assert name == f"{op}_fwd_f16" and len(args) == len(kinds) == len(norm.KERNELS[f"{op}_fwd"])
        assert args[8:10] == (stride, 768) and args[11] & norm.FLAG_VECTORS == vec
        assert args[11] & norm.FLAG_WEIGHT and not args[11] & norm.FLAG_BIAS
        strides = (0, stride, 768)  # dy broadcast over the rows, x row-strided, dx dense
        plan = norm.backward_plan(64, 768, 2, 132, BASE, OTHER, 0, OTHER * 2, strides)
        assert plan[4] == vec
        calls.clear()
        norm.launch_backward(op, 0, 1, 2, BASE, OTHER, 0, OTHER * 3, OTHER * 4, OTHER * 2, OTHER * 5, 0, OTHER * 6, 0,
                             64, 768, plan, 0, strides)
        args, smem = calls[0][5], calls[0][3]
        assert len(args) == len(norm.BWD_KINDS) and args[10:13] == strides and args[14] & norm.FLAG_VECTORS == vec
        # the bulk path's stages: rms_norm's on sm_90 in block mode (the 16-byte rows: 64 threads a
        # row), each a row of x and of dy in shared memory; the register path elsewhere
        stages = norm.STAGES["rms_norm"][0] if op == "rms_norm" and vec and cc == 90 else 0
        partials = norm.column_smem(_rows.BLOCK_PER_ROW, 64, 2, 1) if vec else 0  # dweight's, no weight
        assert args[14] >> norm.STAGES_SHIFT == stages and smem == partials + stages * 2 * 768 * 2


def test_norm_launch_configs_are_cached_by_shape_not_by_row_count(monkeypatch):
    # A model's varying batch sizes must not grow the caches: one entry a (width, type, flags), the
    # grid of each call its own rows' (the plan's, capped by the resident blocks in the backward).
    monkeypatch.setattr(norm._modules, "function_pointer", lambda family, name, device: name)
    monkeypatch.setattr(norm, "resident", lambda name, device, threads, smem: 528)
    monkeypatch.setattr(norm, "_allow_smem", lambda name, device, smem: True)
    monkeypatch.setattr(norm, "compute_capability", lambda device: 80)
    monkeypatch.setattr(norm, "fast_memory", lambda device: False)
    for cache in ("_forward_configs", "_backward_configs", "_bulk_plans"):
        monkeypatch.setattr(norm, cache, {})
    for rows in (1, 7, 64, 1000, 16384, 100003):
        for n in (768, 4096):
            function, mode, blocks, threads = norm.forward_config("layer_norm", 0, 1, 2, rows, n, 1, 7)
            assert (mode, blocks, threads) == norm.forward_plan(rows, n, 2, 1) and function == "layer_norm_fwd_f16"
            plan = norm.backward_plan(rows, n, 2, 132, BASE, OTHER, OTHER * 2, OTHER * 3)
            _, bmode, bblocks, bthreads, _, chunks, _ = norm.backward_config("layer_norm", 0, 1, 2, plan, n, True, 2)
            assert (bmode, bthreads) == (plan[0], plan[2]) and bblocks == min(plan[1], 528)
            assert chunks == _rows.chunks(bmode, bblocks, bthreads)
    assert len(norm._forward_configs) == 2 and len(norm._backward_configs) == 2


def test_layer_norm_backward_takes_the_full_rows_entry_only_where_rows_fill_the_block(monkeypatch):
    # layer_norm_bwd_full_<dtype> (kernels/norm.cu) assumes block mode, 16-byte rows, every thread's
    # vectors inside the row and a multiple of 4 warps; every other launch keeps layer_norm_bwd_<dtype>.
    # By default (norm_full_rows None) only where the memory is fast an SM (the H200's; on the H100 a
    # block a row ran 158 us against full rows' 163, bench_norm at 5ddb83b).
    monkeypatch.setattr(norm, "fast_memory", lambda device: True)
    monkeypatch.setattr(norm._modules, "function_pointer", lambda family, name, device: name)
    monkeypatch.setattr(norm, "resident", lambda name, device, threads, smem: 528)
    monkeypatch.setattr(norm, "_allow_smem", lambda name, device, smem: True)
    monkeypatch.setattr(norm, "compute_capability", lambda device: 90)
    monkeypatch.setattr(norm, "stage_count", lambda op, itemsize, device: 1)  # rms_norm's bulk path
    for cache in ("_backward_configs", "_bulk_plans"):
        monkeypatch.setattr(norm, cache, {})

    def kernel(op, code, itemsize, n, aligned=True):
        plan = norm.backward_plan(16384, n, itemsize, 132, *((BASE, OTHER, OTHER * 2, OTHER * 3) if aligned
                                                            else (BASE + 2, OTHER, OTHER * 2, OTHER * 3)))
        return norm.backward_config(op, 0, code, itemsize, plan, n, True, 2)[0]

    for n in (2048, 4096, 8192):
        assert kernel("layer_norm", 1, 2, n) == "layer_norm_bwd_full_f16"
        assert kernel("layer_norm", 2, 2, n) == "layer_norm_bwd_full_bf16"
        assert kernel("layer_norm", 1, 2, n, aligned=False) == "layer_norm_bwd_f16"
        assert kernel("rms_norm", 1, 2, n) == "rms_norm_bwd_f16"
    for n in (768, 1000, 1024, 4097, 65536):  # partial slices, 2 warps, streamed
        assert kernel("layer_norm", 2, 2, n) == "layer_norm_bwd_bf16"
    assert kernel("layer_norm", 0, 4, 4096) == "layer_norm_bwd_f32"
    with rawops.config.override(norm_full_rows=False):  # the switch: the block-a-row entry, a launch cached apart
        assert kernel("layer_norm", 2, 2, 4096) == "layer_norm_bwd_bf16"
    assert kernel("layer_norm", 2, 2, 4096) == "layer_norm_bwd_full_bf16"
    monkeypatch.setattr(norm, "fast_memory", lambda device: False)  # the H100 SXM's memory an SM
    monkeypatch.setattr(norm, "_backward_configs", {})
    assert kernel("layer_norm", 2, 2, 4096) == "layer_norm_bwd_bf16"
    with rawops.config.override(norm_full_rows=True):  # forced: the full-rows entry on any device
        assert kernel("layer_norm", 2, 2, 4096) == "layer_norm_bwd_full_bf16"


def test_norm_full_rows_is_none_true_or_false(monkeypatch):
    assert rawops.config.norm_full_rows is None
    for value in (None, True, False):
        with rawops.config.override(norm_full_rows=value):
            assert rawops.config.norm_full_rows is value
    with pytest.raises(TypeError, match=r"^rawops.config.norm_full_rows must be None, True or False"):
        rawops.config.norm_full_rows = 1
    from rawops import config as config_module
    for text, value in (("auto", None), ("1", True), ("off", False)):
        monkeypatch.setenv("RAWOPS_NORM_FULL_ROWS", text)
        assert config_module._from_environment("norm_full_rows", None) is value
    monkeypatch.setenv("RAWOPS_NORM_FULL_ROWS", "maybe")
    with pytest.raises(ValueError, match="or auto"):
        config_module._from_environment("norm_full_rows", None)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_softmax_launches_pass_each_operands_row_stride_and_keep_16_byte_rows(monkeypatch, direction):
    calls = []
    monkeypatch.setattr(softmax_module, "launch", lambda *args: calls.append(args))
    monkeypatch.setattr(softmax_module._modules, "function_pointer", lambda family, name, device: name)
    for (strides, vec), fast in itertools.product((((4096, 1000), 1), ((1001, 1000), 0)), (False, True)):
        monkeypatch.setattr(softmax_module, "fast_memory", lambda device, v=fast: v)  # float32: 1001 * 4 is off 16
        calls.clear()
        if direction == "fwd":
            softmax_module.launch_forward("softmax", 0, 0, 4, BASE, OTHER, 7, 1000, 0, strides)
        else:
            strides = (0,) + strides
            softmax_module.launch_backward("log_softmax", 0, 0, 4, BASE, OTHER, OTHER * 2, 7, 1000, 0, strides)
        (name, grid, block, smem, stream, args, kinds, device), = calls
        kinds_expected = softmax_module.FWD_KINDS if direction == "fwd" else softmax_module.BWD_KINDS
        assert kinds == kinds_expected and len(args) == len(kinds)
        first = 4 if direction == "fwd" else 5
        assert args[first:first + len(strides)] == strides and args[-1] == vec
        assert (args[-2] == _rows.STREAM_ROW) == (not vec)
        if direction == "fwd":  # 1000 float32: the wide entry (32 threads of 8 vectors), fast memory, 16-byte rows
            assert name == ("softmax_fwd_wide_f32" if vec and fast else "softmax_fwd_f32")


def test_softmax_forward_takes_the_wide_entries_on_fast_memory_where_a_row_spreads_over_24_to_128_threads():
    def plan(*args):
        assert softmax_module.forward_plan(*args)[3] is False, "only on a device with fast memory"
        return softmax_module.forward_plan(*args, True)
    # (rows, n, itemsize) -> wide, with fast memory: f32 at 768 (24 threads: a warp a row), 1000, 4096 (128); 16-bit at
    # 4096 (64 threads); not 16-bit at 768 (12 threads), f32 at 8192 (256), 16-bit at 65536 (streamed)
    cases = {(64, 768, 4): True, (64, 1000, 4): True, (64, 4096, 4): True, (64, 4096, 2): True,
             (64, 768, 2): False, (64, 8192, 4): False, (64, 65536, 2): False, (64, 31, 4): False}
    for (rows, n, itemsize), wide in cases.items():
        mode, blocks, threads, got = plan(rows, n, itemsize, 1)
        assert got == wide, (rows, n, itemsize)
        if wide:  # the plan of 8 vectors a thread; rows off 16 bytes never take it
            assert (mode, blocks, threads) == _rows.row_plan(rows, n, softmax_module.WIDE_BYTES // itemsize,
                                                             itemsize, 1)
            assert plan(rows, n, itemsize, 0)[3] is False
    assert plan(64, 768, 4, 1)[:3] == (_rows.WARP_PER_ROW, 8, 256)
    assert plan(64, 4096, 2, 1)[:3] == (_rows.BLOCK_PER_ROW, 64, 64)


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
    # a transpose has no contiguous rows: refused, naming x (the adapter copies it instead)
    with pytest.raises(ValueError, match=r"^x is not row-strided: shape \(4, 8\) with strides \(1, 4\)"):
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

    with pytest.raises(ValueError, match=r"^input is on cpu"):
        ta.layer_norm(torch.ones(4, 8), (8,))
    with pytest.raises(TypeError, match=r"^input has dtype torch.int32"):
        ta.softmax(torch.ones(4, dtype=torch.int32), -1)
    with pytest.raises(IndexError, match=r"^softmax: dim 2 is out of range for a tensor of 2 dims"):
        ta.softmax(torch.ones(4, 8), dim=2)
    with pytest.raises(ValueError, match=r"^layer_norm: normalized_shape=\[9\] expects input of shape \[\*, 9\], "
                                         r"got \[4, 8\]"):
        ta.layer_norm(torch.ones(4, 8), (9,))
    with pytest.raises(ValueError, match=r"^normalized_shape must be a non-empty sequence of ints"):
        ta.LayerNorm(())


def test_adapter_takes_row_strided_tensors_as_they_are_and_copies_other_layouts(monkeypatch):
    # CPU tensors that report GPU 0 stand in for CUDA tensors, and the launches are recorded
    # instead of made: which pointer and row stride each kernel would get, and which layouts
    # are copied first (row_strided).
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta
    from rawops.torch_adapter import norm as ta_norm, softmaxes as ta_softmaxes
    from rawops.torch_adapter.norm import row_strided

    class OnGPU0(torch.Tensor):
        def get_device(self):
            return 0

    launches = []
    for module in (ta_norm, ta_softmaxes):
        monkeypatch.setattr(module, "on_device", lambda device, launch, *args: launches.append((launch, args)))
        monkeypatch.setattr(module, "raw_stream", lambda device: 0)
    wide = torch.randn(4, 16).as_subclass(OnGPU0)
    sliced, every_other = wide[:, :8], wide[::2]
    broadcast = torch.randn(8).expand(4, 8).as_subclass(OnGPU0)
    transposed = torch.randn(8, 4).t().as_subclass(OnGPU0)
    for t in (sliced, every_other, broadcast):
        assert row_strided(t) is t
    copy = row_strided(transposed)
    assert copy is not transposed and copy.is_contiguous() and torch.equal(copy, transposed)
    # layer_norm: (op, device, code, itemsize, x, w, b, y, mean, rstd, rows, n, eps, stream, x_stride, y_stride)
    for x, n, pointer, stride in ((sliced, 8, wide.data_ptr(), 16), (every_other, 16, wide.data_ptr(), 32),
                                  (transposed, 8, None, 8)):
        launches.clear()
        ta.layer_norm(x, (n,), torch.randn(2 * n)[::2].as_subclass(OnGPU0))  # a strided weight is copied
        (launch, args), = launches
        assert launch is ta_norm._norm.launch_forward
        assert (args[4] == pointer) == (pointer is not None) and args[14:] == (stride, n)
        assert args[5] != 0 and args[6] == 0
    # softmax: (op, device, code, itemsize, x, y, rows, n, stream, (x_stride, y_stride))
    for x, pointer, stride in ((sliced, wide.data_ptr(), 16), (transposed, None, 8)):
        launches.clear()
        ta.softmax(x, -1)
        (launch, args), = launches
        n = x.shape[-1]
        assert (args[4] == pointer) == (pointer is not None) and args[-1] == (stride, n)
    # a backward's gradient broadcast over the rows is read at row stride 0
    launches.clear()
    ta_softmaxes.backward("softmax", broadcast, torch.randn(4, 8).as_subclass(OnGPU0))
    (launch, args), = launches
    assert args[4] == broadcast.data_ptr() and args[-1] == (0, 8, 8)
    with pytest.raises(TypeError, match=r"^weight has dtype torch.float16, expected torch.float32 like input"):
        ta.layer_norm(sliced, (8,), torch.randn(16, dtype=torch.float16)[::2].as_subclass(OnGPU0))


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


# ------------------------------------------------------------------------------ add_rms_norm
def test_add_rms_norm_valid_calls_get_past_validation():
    x, r = f32((4, 8)), f32((4, 8), ptr=OTHER)
    assert_passes_validation(rawops.add_rms_norm, x, r, w32(ptr=OTHER + 0x1000))
    assert_passes_validation(rawops.add_rms_norm, x, r)
    assert_passes_validation(rawops.add_rms_norm, x, r, residual_out=r)  # in place on the residual stream
    assert_passes_validation(rawops.add_rms_norm, x, r, residual_out=x)  # or on x
    assert_passes_validation(rawops.add_rms_norm, x, r, out=x, residual_out=r)
    assert_passes_validation(rawops.add_rms_norm_forward, f16((4, 8)), f16((4, 8), ptr=OTHER), eps=1e-6)
    stats = f32((4,), ptr=OTHER + 0x2000)
    assert_passes_validation(rawops.add_rms_norm_backward, x, r, f32((4, 8), ptr=OTHER + 0x1000), None, stats)
    assert_passes_validation(rawops.add_rms_norm_backward, x, None, f32((4, 8), ptr=OTHER + 0x1000),
                             w32(ptr=OTHER + 0x3000), stats)
    # row-strided views: x and residual halves of one wider matrix
    assert_passes_validation(rawops.add_rms_norm, f32((4, 8), strides=(64, 4)), f32((4, 8), ptr=BASE + 32,
                                                                                    strides=(64, 4)))


def test_add_rms_norm_operands_are_checked_naming_them():
    x = f32((4, 8))
    with pytest.raises(TypeError, match=r"^x has dtype <f8; add_rms_norm supports float32"):
        rawops.add_rms_norm(FakeCAI((4, 8), "<f8"), f32((4, 8), ptr=OTHER))
    with pytest.raises(TypeError, match=r"^residual has dtype float16, expected float32 like x"):
        rawops.add_rms_norm(x, f16((4, 8), ptr=OTHER))
    with pytest.raises(ValueError, match=r"^residual has shape \(4, 9\), expected \(4, 8\) like x"):
        rawops.add_rms_norm(x, f32((4, 9), ptr=OTHER))
    with pytest.raises(ValueError, match=r"^residual is not row-strided"):
        rawops.add_rms_norm(x, f32((4, 8), ptr=OTHER, strides=(4, 16)))
    with pytest.raises(ValueError, match=r"^weight has shape \(7,\), expected \(8,\)"):
        rawops.add_rms_norm(x, f32((4, 8), ptr=OTHER), f32((7,), ptr=OTHER + 0x1000))
    with pytest.raises(ValueError, match=r"^eps must be >= 0"):
        rawops.add_rms_norm(x, f32((4, 8), ptr=OTHER), eps=-1.0)


def test_add_rms_norm_outputs_must_not_partly_overlap():
    x, r = f32((4, 8)), f32((4, 8), ptr=OTHER)
    with pytest.raises(ValueError, match=r"^residual_out overlaps residual; pass residual_out=residual exactly"):
        rawops.add_rms_norm(x, r, residual_out=f32((4, 8), ptr=OTHER + 16))
    with pytest.raises(ValueError, match=r"^residual_out has shape \(4, 9\)"):
        rawops.add_rms_norm(x, r, residual_out=f32((4, 9), ptr=OTHER + 0x1000))
    with pytest.raises(TypeError, match=r"^residual_out has dtype float16"):
        rawops.add_rms_norm(x, r, residual_out=f16((4, 8), ptr=OTHER + 0x1000))
    with pytest.raises(ValueError, match=r"^out overlaps residual"):  # y into the residual stream being written
        rawops.add_rms_norm(x, r, out=r, residual_out=r)
    with pytest.raises(ValueError, match=r"^out overlaps residual"):
        rawops.add_rms_norm(x, r, out=f32((4, 8), ptr=OTHER + 4))


def test_add_rms_norm_backward_operands_are_checked_naming_them():
    dy, h, stats = f32((4, 8)), f32((4, 8), ptr=OTHER), f32((4,), ptr=OTHER + 0x2000)
    with pytest.raises(ValueError, match=r"^dy has shape \(4, 7\), expected \(4, 8\) like new_residual"):
        rawops.add_rms_norm_backward(f32((4, 7)), None, h, None, stats)
    with pytest.raises(TypeError, match=r"^d_new_residual has dtype float16, expected float32 like new_residual"):
        rawops.add_rms_norm_backward(dy, f16((4, 8), ptr=OTHER + 0x3000), h, None, stats)
    with pytest.raises(ValueError, match=r"^rstd has 3 values, expected one per row of new_residual \(4\)"):
        rawops.add_rms_norm_backward(dy, None, h, None, f32((3,), ptr=OTHER + 0x2000))


def test_add_rms_norm_backward_plan_counts_the_added_gradient_in_the_vector_check():
    # dy, h, dx aligned; d_new_residual off 16 bytes: the whole launch streams element by element
    aligned = norm.backward_plan(64, 4096, 2, 132, 0, 0, 0, 0, (4096, 4096, 4096), extra=((0x1000, 4096),))
    misaligned = norm.backward_plan(64, 4096, 2, 132, 0, 0, 0, 0, (4096, 4096, 4096), extra=((0x1002, 4096),))
    assert aligned[4] == 1 and misaligned[4] == 0 and misaligned[0] == _rows.STREAM_ROW
    absent = norm.backward_plan(64, 4096, 2, 132, 0, 0, 0, 0, (4096, 4096, 4096), extra=((0, 4095),))
    assert absent[4] == 1, "an absent operand's stride does not count"


def test_add_rms_norm_adapter_refuses_bad_arguments():
    torch = pytest.importorskip("torch")
    from rawops import torch_adapter as ta

    with pytest.raises(TypeError, match=r"^residual must be a torch.Tensor"):
        ta.add_rms_norm(torch.ones(2, 4), [1.0])
    with pytest.raises(ValueError, match=r"^residual has shape \(2, 3\), expected \(2, 4\) like x"):
        ta.add_rms_norm(torch.ones(2, 4), torch.ones(2, 3))
    with pytest.raises((TypeError, ValueError), match=r"^x"):  # a CPU tensor
        ta.add_rms_norm(torch.ones(2, 4), torch.ones(2, 4))
    assert sorted(ta.AddRMSNorm(16).state_dict()) == ["weight"]


def test_norm_bulk_stages_only_where_they_cost_no_blocks_and_asked_once_a_shape(monkeypatch):
    asked = []

    def resident(name, device, threads, smem):
        asked.append(smem)
        return 4 if smem <= 24 * 1024 else 3  # stages past 24 KB cost a block an SM
    monkeypatch.setattr(norm, "resident", resident)
    monkeypatch.setattr(norm, "_allow_smem", lambda name, device, smem: True)
    monkeypatch.setattr(norm, "compute_capability", lambda device: 90)
    monkeypatch.setattr(norm, "fast_memory", lambda device: False)  # the H100 SXM's
    monkeypatch.setattr(norm, "_bulk_plans", {})
    row = 4096 * 2  # one bf16 row of 4096
    args = ("rms_norm_bwd_bf16", 0, _rows.BLOCK_PER_ROW, 256)
    assert norm.bulk_stages("rms_norm", *args, 8 * 1024, 4096, 2, 2) == (1, 8 * 1024 + 2 * row)
    assert norm.bulk_stages("rms_norm", *args, 16 * 1024, 4096, 2, 2) == (0, 16 * 1024)
    queries = len(asked)
    assert norm.bulk_stages("rms_norm", *args, 8 * 1024, 4096, 2, 2) == (1, 8 * 1024 + 2 * row)
    assert len(asked) == queries, "the occupancy asked again for a shape already planned"
    # off Hopper, outside block mode, or not asked for: the register path, no query
    monkeypatch.setattr(norm, "compute_capability", lambda device: 120)
    assert norm.bulk_stages("rms_norm", *args, 8 * 1024, 4096, 2, 2) == (0, 8 * 1024)
    monkeypatch.setattr(norm, "compute_capability", lambda device: 90)
    assert norm.bulk_stages("rms_norm", "rms_norm_bwd_bf16", 0, _rows.WARP_PER_ROW, 256, 512, 64, 2, 2) == (0, 512)
    assert norm.bulk_stages("layer_norm", *args, 8 * 1024, 4096, 2, 2) == (0, 8 * 1024)
    assert len(asked) == queries


def test_norm_stages_grow_with_the_memory_bandwidth_an_sm(monkeypatch):
    # more rows in flight for 16-bit rms_norm rows where the memory is fast (the H200's 37 GB/s an
    # SM); float32 rows and add_rms_norm keep one; layer_norm has no bulk path
    for fast, want in ((False, {("rms_norm", 2): 1, ("rms_norm", 4): 1, ("add_rms_norm", 2): 1}),
                       (True, {("rms_norm", 2): 2, ("rms_norm", 4): 1, ("add_rms_norm", 2): 1})):
        monkeypatch.setattr(norm, "fast_memory", lambda device, v=fast: v)
        assert {key: norm.stage_count(*key, 0) for key in want} == want
    assert norm.STAGES.keys() == {"rms_norm", "add_rms_norm"}


def test_memory_bandwidth_per_sm_is_the_double_data_rate_over_the_sms(monkeypatch):
    values = {_modules.ATTR_MEMORY_CLOCK_KHZ: 3_201_000, _modules.ATTR_MEMORY_BUS_BITS: 6144,
              _modules.ATTR_MULTIPROCESSORS: 132}  # the H200's
    monkeypatch.setattr(_modules, "device_attribute", lambda device, attribute: values[attribute])
    monkeypatch.setattr(_modules, "_fast", {})  # fast_memory's answers, one a device
    assert _modules.memory_bandwidth_per_sm(0) == pytest.approx(2 * 3.201e9 * 768 / 132)
    assert 37e9 < _modules.memory_bandwidth_per_sm(0) < 38e9 and _modules.fast_memory(0)
    values.update({_modules.ATTR_MEMORY_CLOCK_KHZ: 2_619_000, _modules.ATTR_MEMORY_BUS_BITS: 5120})  # the H100 SXM's
    assert 25e9 < _modules.memory_bandwidth_per_sm(0) < 26e9 and not _modules.fast_memory(1)
    assert _modules.fast_memory(0), "asked once a device"
    values[_modules.ATTR_MEMORY_CLOCK_KHZ] = 0  # a device that does not say: the usual shapes
    assert not _modules.fast_memory(2)
