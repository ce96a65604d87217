"""Launch maths of the map kernels, without a GPU.

rawops._launch.map_launch_config(n, itemsize, out, a, b, resident) -> (blocks, head) is what the
launcher passes to every kernel in kernels/elementwise.cu. The simulation below replays the
kernel's `map` index arithmetic thread by thread and checks that every element is handled
exactly once and that every 16-byte access is 16-byte aligned.

The kernel: on the vector path work comes in chunks of UNROLL * 256 consecutive 16-byte
vectors, one chunk per block (or, where the kernel has the chunk loop, chunks blockIdx.x,
blockIdx.x + gridDim.x, ...), and block 0 also does the scalar head and tail; the launcher
sizes the grid at one block per chunk. On the scalar path (operands of different 16-byte
phases) a grid-stride loop runs over at most `resident` blocks: those the device holds at once
(rawops._modules.resident_blocks, the occupancy API), one wave.
"""
import itertools
import math
import os
import re

import numpy as np
import pytest

import rawops
from rawops import _constants, _modules
from rawops._launch import MAP_SHAPE, launch, map_launch_config, sm_count
from rawops._launch.launch import layout_overlaps_itself, map_layout, strided_launch_config
from rawops.elementwise import (BIAS_BWD_SHAPE, BIAS_BWD_THREADS, BIAS_BWD_TILE_SHAPE, bias_gelu_bwd_plan,
                                column_sum_plan)

THREADS = MAP_SHAPE["threads"]  # RAWOPS_MAP_THREADS: the kernels' launch bound
UNROLL = MAP_SHAPE["unroll"]  # RAWOPS_MAP_UNROLL in the kernel (the tripwire test checks)
CHUNK = THREADS * UNROLL  # vectors per block on the vector path, elements on the scalar path
BASE = 0x7F0000000000  # 256-byte aligned, like any cudaMalloc pointer


def _kernel_source():
    with open(os.path.join(_modules.kernel_source_dir(), "elementwise.cu")) as f:
        return re.sub(r"\s+", " ", f.read())


# Whether blocks loop over chunks (grid-stride by chunk) or own exactly one chunk each.
CHUNK_LOOP = "chunk += gridDim.x" in _kernel_source()


# ------------------------------------------------------------------------------ head
@pytest.mark.parametrize("itemsize, offset, head", [
    (4, 0, 0), (4, 4, 3), (4, 8, 2), (4, 12, 1), (4, 16, 0), (4, 20, 3),
    (2, 0, 0), (2, 2, 7), (2, 4, 6), (2, 8, 4), (2, 14, 1), (2, 18, 7),
])
def test_head_is_the_number_of_elements_before_16_byte_alignment(itemsize, offset, head):
    ptr = BASE + offset
    assert map_launch_config(1000, itemsize, ptr, ptr, ptr, 132)[1] == head
    assert map_launch_config(1000, itemsize, ptr, ptr, 0, 132)[1] == head


@pytest.mark.parametrize("itemsize, out_off, a_off, b_off", [
    (4, 0, 4, 0), (4, 4, 0, 4), (4, 4, 4, 8), (4, 0, 0, 16 + 4),
    (2, 2, 4, 2), (2, 0, 0, 2), (2, 6, 24, 6), (2, 6, 6, 24),
])
def test_head_is_minus_one_when_an_operand_has_another_16_byte_phase_than_out(itemsize, out_off, a_off, b_off):
    assert map_launch_config(1000, itemsize, BASE + out_off, BASE + a_off, BASE + b_off, 132)[1] == -1


def test_operands_with_the_same_phase_at_different_addresses_keep_the_vector_path():
    assert map_launch_config(1000, 4, BASE + 4, BASE + 0x1000 + 4, BASE + 0x20000 + 20, 132)[1] == 3


def test_b_pointer_zero_means_b_is_not_read_and_does_not_force_the_scalar_path():
    assert map_launch_config(1000, 4, BASE + 8, BASE + 8, 0, 132)[1] == 2
    # ...while any real b of another phase does:
    assert map_launch_config(1000, 4, BASE + 8, BASE + 8, BASE, 132)[1] == -1


@pytest.mark.parametrize("n", [0, 1, 2])
def test_head_is_capped_at_n(n):
    blocks, head = map_launch_config(n, 4, BASE + 4, BASE + 4, 0, 132)
    assert head == min(3, n)
    assert blocks == 1


# ------------------------------------------------------------------------------ blocks
@pytest.mark.parametrize("n, itemsize, sms", [
    (0, 4, 132), (1, 4, 132), (4096, 4, 132), (4097, 4, 132), (4096 + 4, 4, 132), (8192, 2, 132),
    (10 ** 6, 4, 132), (10 ** 6, 2, 1), (123457, 4, 2), (2 ** 31 + 5, 4, 132), (2 ** 31 + 5, 2, 1),
])
@pytest.mark.parametrize("offset", [0, 4, 8])
def test_vector_path_grid_is_one_block_per_chunk_of_vectors_whatever_the_sm_count(n, itemsize, sms, offset):
    blocks, head = map_launch_config(n, itemsize, BASE + offset, BASE + offset, 0, sms)
    vector = 16 // itemsize
    assert head == min(((16 - offset) % 16) // itemsize, n)
    vectors = (n - head) // vector
    assert blocks == max(1, math.ceil(vectors / (THREADS * UNROLL)))


@pytest.mark.parametrize("n, resident", [
    (0, 132 * 8), (1, 132 * 8), (1024, 132 * 8), (1025, 132 * 8), (10 ** 6, 132 * 8), (10 ** 6, 2 * 5),
    (10 ** 6, 132 * 5), (2 ** 31 + 5, 132 * 8), (2 ** 40, 1), (2 ** 40, 2 ** 40),
])
def test_scalar_path_grid_is_ceil_n_over_chunk_capped_at_the_resident_blocks(n, resident):
    blocks, head = map_launch_config(n, 4, BASE, BASE + 4, 0, resident)
    assert head == -1
    assert blocks == max(1, min(math.ceil(n / (THREADS * UNROLL)), resident))
    assert 1 <= blocks <= max(1, resident)


def test_more_than_2_to_the_31_elements_use_64_bit_arithmetic():
    n = 2 ** 31 + 5
    blocks, head = map_launch_config(n, 4, BASE, BASE, BASE, 132)
    assert head == 0
    assert blocks == math.ceil((n // 4) / CHUNK)
    blocks, head = map_launch_config(n, 2, BASE + 2, BASE + 2, 0, 132)
    assert head == 7
    assert blocks == math.ceil(((n - 7) // 8) / CHUNK)
    # Far past 2**31 blocks: still exact (the launcher refuses grids over 2**31 - 1 itself).
    assert map_launch_config(2 ** 45, 2, BASE, BASE, 0, 132) == (2 ** 45 // 8 // CHUNK, 0)


def test_zero_resident_blocks_still_launch_one_block_on_the_scalar_path():
    assert map_launch_config(10 ** 6, 4, BASE, BASE + 4, 0, 0) == (1, -1)


# ------------------------------------------------------------------------------ coverage
def simulate_map(n, itemsize, out_ptr, a_ptr, b_ptr, resident):
    """How many times kernels/elementwise.cu `map` touches each element, plus a check that
    every vector access (a, b, out) is 16-byte aligned. Mirrors the kernel line by line."""
    blocks, head = map_launch_config(n, itemsize, out_ptr, a_ptr, b_ptr, resident)
    nthreads = blocks * THREADS
    hits = np.zeros(n, dtype=np.int64)
    if head < 0:  # for (i = tid; i < n; i += nthreads)
        i = np.arange(nthreads, dtype=np.int64)
        while True:
            live = i[i < n]
            if live.size == 0:
                break
            np.add.at(hits, live, 1)
            i += nthreads
        return hits, blocks, head
    V = 16 // itemsize
    nvec = (n - head) // V
    tail = head + nvec * V
    thread = np.arange(THREADS, dtype=np.int64)  # threadIdx.x of block 0
    np.add.at(hits, thread[thread < head], 1)  # if (threadIdx.x < head) scalar(threadIdx.x)
    np.add.at(hits, tail + thread[thread < n - tail], 1)  # if (threadIdx.x < n - tail) scalar(tail + ...)
    chunk_size = THREADS * UNROLL
    chunk = np.arange(blocks, dtype=np.int64)  # chunk = blockIdx.x
    while True:
        if CHUNK_LOOP:  # for (chunk = blockIdx.x; chunk * chunk_size < nvec; chunk += gridDim.x)
            chunk = chunk[chunk * chunk_size < nvec]
            if chunk.size == 0:
                break
        first_vec = (np.repeat(chunk, THREADS) * chunk_size + np.tile(thread, chunk.size))
        for k in range(UNROLL):
            j = first_vec + k * THREADS  # j = first_vec + k * blockDim.x
            j = j[j < nvec]
            first = head + j * V
            for ptr in (out_ptr, a_ptr) + ((b_ptr,) if b_ptr else ()):
                misaligned = (ptr + first * itemsize) % 16
                assert not misaligned.any(), f"unaligned 16-byte access at element {first[misaligned != 0][0]}"
            for e in range(V):
                np.add.at(hits, first + e, 1)
        if not CHUNK_LOOP:
            break
        chunk = chunk + blocks
    return hits, blocks, head


def test_simulation_mirrors_the_kernel_source():
    # Tripwire: if the kernel's indexing changes, simulate_map must change with it.
    source = _kernel_source()
    lines = [
        "for (int64_t i = tid; i < n; i += nthreads) map_scalar<Op>(a, b, c, out, i, inner, alpha);",
        "const int64_t nvec = (n - head) / V;",
        "const int64_t tail = head + nvec * V;",
        "if (blockIdx.x == 0) {",
        "if (threadIdx.x < head) map_scalar<Op>(a, b, c, out, threadIdx.x, inner, alpha);",
        "if (threadIdx.x < n - tail) map_scalar<Op>(a, b, c, out, tail + threadIdx.x, inner, alpha);",
        "const int64_t j = first_vec + k * blockDim.x;",
        "const int64_t first = head + j * V;",
        "__launch_bounds__(RAWOPS_MAP_THREADS)",
        "constexpr int kUnroll = RAWOPS_MAP_UNROLL;",
    ]
    if CHUNK_LOOP:
        lines += [
            "template <class Op, typename T, int UNROLL = kUnroll>",  # the _x<U> entries set UNROLL
            "const int64_t chunk_size = int64_t(blockDim.x) * UNROLL;",
            "for (int64_t chunk = blockIdx.x; chunk * chunk_size < nvec; chunk += gridDim.x) {",
            "const int64_t first_vec = chunk * chunk_size + threadIdx.x;",
        ]
    else:
        lines += ["const int64_t first_vec = int64_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;"]
    for line in lines:
        assert line in source, f"kernels/elementwise.cu no longer has: {line}"
    # the launcher reads the values the kernels are compiled with (rawops/_constants.py)
    assert (UNROLL, THREADS) == (_constants.MAP_UNROLL, _constants.MAP_THREADS)
    assert (MAP_SHAPE["strided_unroll"], MAP_SHAPE["max_dims"]) == (_constants.MAP_STRIDED_UNROLL,
                                                                    _constants.MAP_MAX_DIMS)
    assert "#define RAWOPS_MAP" not in source.replace("#define RAWOPS_MAP(", ""), "a constant defined in the kernel"


def _phases(itemsize):
    return range(0, 16, itemsize)


@pytest.mark.parametrize("itemsize", [4, 2])
def test_every_element_is_covered_exactly_once_for_small_n_and_every_common_phase(itemsize):
    for n in range(0, 71):
        for phase in _phases(itemsize):
            for b_ptr in (0, BASE + 0x10000 + phase):
                hits, _, head = simulate_map(n, itemsize, BASE + phase, BASE + 0x1000 + phase, b_ptr, 132)
                assert head >= 0
                assert (hits == 1).all(), (
                    f"n={n} itemsize={itemsize} phase={phase} b={'yes' if b_ptr else 'no'}: "
                    f"elements hit {hits.tolist()}")


@pytest.mark.parametrize("itemsize", [4, 2])
def test_every_element_is_covered_exactly_once_on_the_scalar_path(itemsize):
    for n in range(0, 71):
        for a_phase in _phases(itemsize):
            if a_phase == 0:
                continue
            hits, _, head = simulate_map(n, itemsize, BASE, BASE + a_phase, 0, 132)
            assert head == -1
            assert (hits == 1).all(), f"n={n} itemsize={itemsize} a_phase={a_phase}: {hits.tolist()}"
        hits, _, head = simulate_map(n, itemsize, BASE, BASE, BASE + itemsize, 132)
        assert head == -1 and (hits == 1).all()


@pytest.mark.parametrize("itemsize, phase, n, sms", [
    # Many blocks, a partial last block (not every UNROLL slot used), odd tails; the SM
    # count must not matter on the vector path.
    (4, 0, 1024 * 4 * 3 + 13, 1),
    (4, 4, 1024 * 4 * 7 + 4 * 300 + 3, 1),
    (2, 6, 1024 * 8 * 5 + 1000 * 8 + 7, 1),
    (2, 2, 50001, 1),
    (4, 12, 1024 * 16 + 1, 2),
    (4, 0, 300000, 2),
    (2, 0, 4096 * 8 + 5, 132),
    (4, 0, 1024 * 4 * 20 + 5, 1),  # 20 blocks on a 1-SM GPU: a grid capped per SM would miss some
    (2, 8, 1024 * 8 * 40 + 3, 1),
])
def test_every_element_is_covered_exactly_once_with_many_blocks(itemsize, phase, n, sms):
    hits, blocks, head = simulate_map(n, itemsize, BASE + phase, BASE + 0x100000 + phase, 0, sms)
    assert head >= 0 and blocks > 1
    assert (hits == 1).all(), f"{int((hits != 1).sum())} elements hit != once"


@pytest.mark.parametrize("n, resident", [(2048 * 7 + 11, 1), (10 ** 5 + 3, 2 * 5), (10 ** 5 + 3, 7),
                                         (5000, 132 * 8)])
def test_every_element_is_covered_exactly_once_on_the_scalar_path_with_a_capped_grid(n, resident):
    hits, blocks, head = simulate_map(n, 4, BASE, BASE + 4, 0, resident)
    assert head == -1 and blocks == min(math.ceil(n / CHUNK), resident)
    assert (hits == 1).all()


# ------------------------------------------------------------------------------ strided layouts
# The strided kernels (kernels/elementwise.cu map_strided) walk the planned layout (plan_layout in
# rawops/_launch/launch.pyx: size-1 dims dropped, dims ordered by out's strides, contiguous dims
# merged): element i's offsets are its coordinates in the planned shape times each operand's
# strides. The plan must give every element the offsets its original strides give.
def _offsets(shape, strides):
    """Each element's offset (C order over `shape`) for element `strides`."""
    if not shape:
        return np.zeros(1, dtype=np.int64)
    index = np.indices(shape).reshape(len(shape), -1)
    return (np.array(strides, dtype=np.int64)[:, None] * index).sum(0)


def _planned_offsets(layout):
    """Element i's offsets of each operand as strided_offsets computes them: coordinates from the
    innermost dim out (a division and a remainder each), the outermost one what remains."""
    shape, strides = layout
    n = int(np.prod(shape))
    rest = np.arange(n, dtype=np.int64)
    offsets = [np.zeros(n, dtype=np.int64) for _ in strides]
    for d in range(len(shape) - 1, 0, -1):
        coord = rest % shape[d]
        rest = rest // shape[d]
        for k, operand in enumerate(strides):
            offsets[k] += coord * operand[d]
    for k, operand in enumerate(strides):
        offsets[k] += rest * operand[0]
    return offsets


def _strides_of(view, itemsize):
    return tuple(s // itemsize for s in view.strides)


LAYOUTS = {  # name -> (shape, a strides, b strides or None, out strides or None (C order))
    "transposed": ((6, 5), (1, 6), None, None),
    "step_3": ((11,), (3,), None, None),
    "reversed": ((7,), (-1,), (1,), None),
    "broadcast_b": ((4, 5), (5, 1), (0, 1), None),
    "broadcast_scalar": ((3, 4, 5), (20, 5, 1), (0, 0, 0), None),
    "sliced_columns": ((4, 3), (8, 1), (3, 1), None),
    "size_1_dims": ((1, 4, 1, 3), (99, 3, 7, 1), None, None),
    "3d_permuted": ((2, 3, 4), (1, 8, 2), (12, 4, 1), None),
    "strided_out": ((6, 5), (5, 1), None, (1, 6)),
    "all_transposed": ((6, 5), (1, 6), (1, 6), (1, 6)),  # one dense order: merges to one dim
    "out_reversed": ((3, 4), (4, 1), None, (-4, -1)),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("bias", [False, True])
def test_planned_layout_gives_every_element_its_own_offsets(name, bias):
    shape, a, b, out = LAYOUTS[name]
    c = (2,) if bias else None  # a row vector of shape[-1] values, every other element
    layout = map_layout(shape, a, b, c, out)
    assert layout is not None and 1 <= len(layout[0]) <= len(shape) and np.prod(layout[0]) == np.prod(shape)
    expected = [_offsets(shape, a), _offsets(shape, b) if b else None,
                _offsets(shape, (0,) * (len(shape) - 1) + c) if bias else None,
                _offsets(shape, out if out else _c_order(shape))]
    got = _planned_offsets(layout)
    # The plan may visit elements in another order (out's): match them by out's offset, one each.
    order, planned = np.argsort(expected[3], kind="stable"), np.argsort(got[3], kind="stable")
    assert np.array_equal(expected[3][order], got[3][planned]), "out's elements, each once"
    for k in (0, 1, 2):
        if expected[k] is None:
            assert not any(got[k]), "an absent operand has strides 0"
        else:
            assert np.array_equal(expected[k][order], got[k][planned]), f"operand {'abco'[k]} of {name}"


def _c_order(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def test_planned_layouts_merge_contiguous_dims_and_order_by_out():
    # all operands in one dense (transposed) order: one dim, stride 1 everywhere (the launcher then
    # takes the contiguous kernel)
    assert map_layout((6, 5), (1, 6), (1, 6), None, (1, 6)) == ((30,), ((1,), (1,), (0,), (1,)))
    # rows of a wider matrix: the rows cannot merge; a broadcast row merges with nothing either
    assert map_layout((4, 3), (8, 1)) == ((4, 3), ((8, 1), (0, 0), (0, 0), (3, 1)))
    # a strided out is walked in its own order (its fastest dim innermost)
    assert map_layout((6, 5), (5, 1), None, None, (1, 6)) == ((5, 6), ((1, 5), (0, 0), (0, 0), (6, 1)))
    # the bias stops its column dim merging with the rows, but leading dims still merge
    assert map_layout((2, 3, 4), (24, 8, 1), None, (1,)) == ((6, 4), ((8, 1), (0, 0), (0, 1), (4, 1)))
    # one element, or none but size-1 dims: a dense dim of one
    assert map_layout((1, 1), (5, 9)) == ((1,), ((1,), (1,), (1,), (1,)))


def test_planned_layouts_of_more_dims_than_the_kernels_take_are_declined():
    dims = _constants.MAP_MAX_DIMS + 1
    shape = (2,) * dims
    spread = tuple(4 ** (dims - 1 - i) for i in range(dims))  # no two neighbours merge
    assert map_layout(shape, spread) is None
    assert map_layout(shape[:-1], spread[:-1]) is not None
    assert map_layout(shape, _c_order(shape)) == ((2 ** dims,), ((1,), (0,), (0,), (1,)))


@pytest.mark.parametrize("shape, strides, overlaps", [
    ((4, 8), (8, 1), False), ((4, 8), (1, 4), False), ((4, 8), (16, 1), False), ((4, 8), (-8, -1), False),
    ((4, 8), (0, 1), True), ((4, 8), (1, 1), True), ((4, 8), (4, 1), True), ((4, 8), (8, 0), True),
    ((1, 8), (0, 1), False), ((4, 1), (1, 0), False), ((3, 2), (1, 3), False), ((2, 3), (6, 2), False),
])
def test_an_out_layout_overlaps_itself_where_two_elements_share_an_offset(shape, strides, overlaps):
    assert layout_overlaps_itself(shape, strides) is overlaps
    offsets = _offsets(shape, strides)
    assert (len(np.unique(offsets)) < offsets.size) is overlaps


def test_the_overlap_test_is_sufficient_not_exact():
    # Offsets {0, 2, 4} and {3, 5, 7} interleave without sharing one: refused all the same (the
    # launcher's test compares each stride with what the smaller dims reach).
    assert len(np.unique(_offsets((2, 3), (3, 2)))) == 6
    assert layout_overlaps_itself((2, 3), (3, 2))


def simulate_map_strided(n, resident):
    """How many times the strided kernel's chunk loop visits each element index: chunks of
    STRIDED_UNROLL x THREADS, a thread's elements THREADS apart, blocks taking chunks blockIdx.x,
    blockIdx.x + gridDim.x, ... over the grid strided_launch_config gives."""
    blocks, threads = strided_launch_config(n, resident)
    unroll = MAP_SHAPE["strided_unroll"]
    chunk_size = threads * unroll
    hits = np.zeros(n, dtype=np.int64)
    thread = np.arange(threads, dtype=np.int64)
    first = (np.arange(blocks, dtype=np.int64)[:, None] * chunk_size + thread).ravel()
    while True:
        first = first[first < n]
        if first.size == 0:
            break
        for k in range(unroll):
            i = first + k * threads
            np.add.at(hits, i[i < n], 1)
        first = first + blocks * chunk_size
    return hits, blocks


@pytest.mark.parametrize("n, resident", [(1, 132 * 5), (1023, 132 * 5), (1025, 1), (4096 * 33 + 5, 1),
                                         (10 ** 6 + 3, 2 * 5), (10 ** 6 + 3, 7), (70001, 132 * 5)])
def test_strided_kernel_visits_every_element_once(n, resident):
    hits, blocks = simulate_map_strided(n, resident)
    assert (hits == 1).all()
    per_block = THREADS * MAP_SHAPE["strided_unroll"]
    assert blocks == max(1, min(-(-n // per_block), resident))


def test_strided_simulation_mirrors_the_kernel_source():
    source = _kernel_source()
    for line in [
        "const int64_t chunk_size = int64_t(blockDim.x) * kStridedUnroll;",
        "for (int64_t first = int64_t(blockIdx.x) * chunk_size + threadIdx.x; first < n; "
        "first += int64_t(gridDim.x) * chunk_size) {",
        "const int64_t i = first + int64_t(k) * blockDim.x;",
        "for (int d = int(layout.ndim) - 1; d > 0; --d) {",
        "const Index q = i / size;",
        "const int64_t coord = int64_t(i - q * size);",
        "const int64_t coord = int64_t(i); // the outermost dim's: no division",
        "constexpr int kStridedUnroll = RAWOPS_MAP_STRIDED_UNROLL;",
        "int64_t shape[RAWOPS_MAP_MAX_DIMS];",
        "int64_t stride[4][RAWOPS_MAP_MAX_DIMS];",
    ]:
        assert line in source, f"kernels/elementwise.cu no longer has: {line}"


# ------------------------------------------------------------------------------ column sum plan
@pytest.mark.parametrize("rows, cols, sms", [
    (1, 1, 132), (1, 8, 132), (7, 3, 1), (1000, 1, 132), (1000, 768, 132), (100003, 17, 2),
    (5, 100000, 132), (2 ** 20, 1024, 132), (3, 5, 0), (70000, 1, 132), (2 ** 20, 3, 132),
])
@pytest.mark.parametrize("threads_per_sm", [2048, 1536, 1024])
def test_column_sum_plan_splits_the_rows_into_non_empty_chunks_that_cover_them_once(rows, cols, sms, threads_per_sm):
    chunks, rows_per_chunk = column_sum_plan(rows, cols, sms * threads_per_sm)
    assert chunks >= 1 and rows_per_chunk >= 1
    covered = np.zeros(rows, dtype=np.int64)
    for chunk in range(chunks):  # column_sum_part: r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rpc)
        r0 = chunk * rows_per_chunk
        r1 = min(rows, r0 + rows_per_chunk)
        assert r1 > r0, f"chunk {chunk} is empty"
        covered[r0:r1] += 1
    assert (covered == 1).all()
    assert chunks <= max(1, (sms * threads_per_sm) // cols) or chunks == 1
    assert chunks <= 65535, "chunks is column_sum_part's gridDim.y"


# ------------------------------------------------------------------------------ fused bias_gelu backward plan
@pytest.mark.parametrize("rows, cols, itemsize, sms", [
    (1, 8, 2, 132), (16384, 4096, 2, 132), (16384, 4096, 4, 132), (4096, 768, 2, 132), (1000, 64, 2, 132),
    (70000, 8, 2, 132), (5, 1 << 17, 2, 132), (3, 4, 4, 1), (10 ** 6, 24, 4, 132), (2, 2 ** 31 // 4, 4, 132),
    (7, 2048, 4, 132),
])
@pytest.mark.parametrize("threads_per_sm", [2048, 1536, 1024])
def test_bias_gelu_bwd_plan_covers_every_column_vector_and_row_once(monkeypatch, rows, cols, itemsize, sms,
                                                                    threads_per_sm):
    # the walkers (bias_bwd_partial): where the short tiles do not apply, or switched off as here

    monkeypatch.setattr(rawops.config, "bias_gelu_backward_tiles", False)
    grid, chunks, threads, strip = bias_gelu_bwd_plan(rows, cols, 0 if itemsize == 4 else 1, (0, 256, 512), sms,
                                                      threads_per_sm)
    strips = grid[0]
    assert grid == (strips, chunks) and strip > 0
    vector_bytes, blocks_per_sm = BIAS_BWD_SHAPE[itemsize]
    blocks_per_sm = min(blocks_per_sm, threads_per_sm // BIAS_BWD_THREADS)  # sm_75 holds 4 of 256, not 6
    vectors = cols // (vector_bytes // itemsize)
    by = threads // strip
    assert strips * chunks <= max(blocks_per_sm * sms, strips), "more than one wave of resident blocks"
    assert threads == strip * by and 1 <= by and threads <= BIAS_BWD_THREADS
    assert strips * strip >= vectors > (strips - 1) * strip, "strips cover the row's vectors, none wholly idle"
    assert 1 <= chunks <= 65535 and chunks * by <= rows + by - 1, "every chunk has rows"
    # Thread (tx, ty) of chunk c takes rows (i * chunks + c) * by + ty (kernels/elementwise.cu).
    seen = np.zeros(min(rows, 200000), dtype=np.int64)
    for chunk in range(chunks):
        for ty in range(by):
            take = np.arange(chunk * by + ty, seen.size, chunks * by)
            seen[take] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("rows, cols, itemsize, pointers", [
    (0, 8, 2, (0, 0, 0)), (8, 0, 2, (0, 0, 0)),  # nothing to do
    (8, 6, 2, (0, 0, 0)), (8, 6, 4, (0, 0, 0)), (8, 257, 2, (0, 0, 0)),  # rows not whole vectors
    (8, 8, 2, (2, 0, 0)), (8, 8, 2, (0, 4, 0)), (8, 8, 4, (0, 0, 8)), (8, 8, 4, (0, 0, 0, 1032)),  # misaligned
])
def test_bias_gelu_bwd_plan_declines_what_the_fused_kernel_cannot_take(rows, cols, itemsize, pointers):
    assert bias_gelu_bwd_plan(rows, cols, 0 if itemsize == 4 else 1, pointers, 132) is None


@pytest.mark.parametrize("dtype", [0, 1, 2])
@pytest.mark.parametrize("rows, cols", [(1, 64), (16384, 4096), (4096, 768), (1000, 64), (70001, 128), (5, 1 << 17),
                                        (3, 192), (129, 2112), (2, 2 ** 31 // 4)])
def test_tile_backward_plan_covers_every_row_and_column_vector_once(rows, cols, dtype):
    # bias_bwd_tile (kernels/elementwise.cu): block b is row tile b // col_tiles, column tile
    # b % col_tiles; thread t is vector t % vecs of the tile, rows t // vecs + k * rows / per.
    from rawops.elementwise import EXACT_MIN_ELEMENTS, EXACT_WORKSPACE_ROWS, TILES, TILES_EXACT

    threads, tile_rows, per = BIAS_BWD_TILE_SHAPE[dtype]
    vector = 4 if dtype == 0 else 8
    grid, chunks, block, strip = bias_gelu_bwd_plan(rows, cols, dtype, (0, 256, 512, 1024), 132)
    exact = dtype == 1 and rows * cols >= EXACT_MIN_ELEMENTS
    assert strip == (TILES_EXACT if exact else TILES) and block == threads and len(grid) == 1
    vecs = threads * per // tile_rows
    assert cols % (vecs * vector) == 0
    col_tiles = cols // (vecs * vector)
    assert grid[0] == -(-rows // tile_rows) * col_tiles
    # a partial row per row tile, or float16's fixed-point accumulators (int64 + float a column)
    assert chunks == (EXACT_WORKSPACE_ROWS if exact else -(-rows // tile_rows))
    if rows * cols > 1 << 26:
        return  # the arithmetic above is what scales; the cover below is checked on the small ones
    seen = np.zeros((rows, cols // vector), dtype=np.int64)
    for b in range(grid[0]):
        row_tile, col_tile = divmod(b, col_tiles)
        for t in range(threads):
            vec = col_tile * vecs + t % vecs
            for k in range(per):
                row = row_tile * tile_rows + t // vecs + k * (tile_rows // per)
                if row < rows:
                    seen[row, vec] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("dtype, pointers, tiles", [
    (1, (0, 256, 512), True), (1, (0, 264, 512), False), (2, (8, 256, 512), False),  # 8-byte aligned: the walkers
    (0, (0, 256, 512), True), (1, (0, 256, 0), True),  # no bias (linear_gelu's backward): pointer 0
])
def test_tile_backward_needs_16_byte_vectors_and_the_walkers_take_8_byte_ones(dtype, pointers, tiles):
    plan = bias_gelu_bwd_plan(64, 4096, dtype, pointers, 132)
    assert (plan[3] <= 0) == tiles  # TILES or TILES_EXACT; the walkers' strip is positive
    # the tiles take whole 64-column tiles only (the kernel has no guard); the walkers the rest
    for cols in (4100, 4160 - 8, 72):
        assert bias_gelu_bwd_plan(64, cols, dtype, (0, 256, 512), 132)[3] > 0


@pytest.mark.parametrize("cc, switch, dependent", [(90, True, True), (100, True, True), (89, True, False),
                                                  (80, True, False), (90, False, False)])
def test_final_column_sum_is_a_dependent_launch_on_sm_90_only(monkeypatch, cc, switch, dependent):
    # column_sum_final waits with griddepcontrol.wait, which exists from sm_90; below, a plain launch.
    from rawops import elementwise

    calls = []
    monkeypatch.setattr(elementwise, "launch", lambda *args: calls.append(args))
    monkeypatch.setattr(elementwise._modules, "function_pointer", lambda family, name, device: 0x1000)
    monkeypatch.setattr(elementwise._modules, "compute_capability", lambda device: cc)
    monkeypatch.setattr(rawops.config, "dependent_launch", switch)
    elementwise._launch_column_sum_final(0, "f16", 0x2000, 0x3000, 198, 4096, 0)
    (function, grid, block, shared, stream, args, kinds, device, is_dependent), = calls
    assert (function, grid, block, args, kinds) == (0x1000, (4096 // 32,), 1024, (0x2000, 0x3000, 198, 4096), "ppqq")
    assert is_dependent is dependent


@pytest.mark.parametrize("dtype, rows, cols", [
    (0, 32, 3072), (1, 8192, 3072), (2, 16384, 4096), (1, 32, 3072), (2, 8192, 3072),
])
def test_every_type_and_size_takes_the_tiles(dtype, rows, cols):
    # the unguarded tile kernel measured faster than the walkers at every shape and type tried;
    # float16's with dbias summed exactly from 2^24 elements
    from rawops.elementwise import TILES, TILES_EXACT

    exact = dtype == 1 and rows * cols >= 1 << 24
    assert bias_gelu_bwd_plan(rows, cols, dtype, (0, 256, 512), 132)[3] == (TILES_EXACT if exact else TILES)


def test_exact_half_sums_stop_where_the_int64_total_could_overflow(monkeypatch):
    # every float16 is below 2^40 in units of 2^-24: at most 2^23 rows a column, in whole row tiles
    from rawops.elementwise import BIAS_BWD_TILE_SHAPE, EXACT_MAX_ROW_TILES, EXACT_MAX_ROWS, TILES, TILES_EXACT

    tile_rows = BIAS_BWD_TILE_SHAPE[1][1]
    assert EXACT_MAX_ROWS * 65504 * 2 ** 24 < 2 ** 63 and EXACT_MAX_ROW_TILES * tile_rows <= EXACT_MAX_ROWS
    assert bias_gelu_bwd_plan(tile_rows * EXACT_MAX_ROW_TILES, 64, 1, (0, 256, 512), 132)[3] == TILES_EXACT
    grid, chunks, _, strip = bias_gelu_bwd_plan(tile_rows * EXACT_MAX_ROW_TILES + 1, 64, 1, (0, 256, 512), 132)
    assert strip == TILES and chunks == EXACT_MAX_ROW_TILES + 1
    assert bias_gelu_bwd_plan(4096, 4096, 1, (0, 256, 512), 132)[3] == TILES_EXACT  # 2^24 elements
    assert bias_gelu_bwd_plan(4095, 4096, 1, (0, 256, 512), 132)[3] == TILES  # the third launch costs more
    monkeypatch.setattr(rawops.config, "exact_half_dbias", False)
    assert bias_gelu_bwd_plan(8192, 3072, 1, (0, 256, 512), 132)[1:] == (8192 // tile_rows, 512, TILES)


@pytest.mark.parametrize("cc, dependent", [(90, True), (100, True), (89, False), (80, False)])
@pytest.mark.parametrize("bias_ptr, name", [(0x4000, "bias_gelu_erf_bwd_tile_exact_f16"),
                                            (0, "gelu_erf_bwd_tile_exact_f16")])
def test_exact_half_sums_zero_the_workspace_then_tiles_then_round(monkeypatch, cc, dependent, bias_ptr, name):
    # Three launches on the caller's stream: the accumulators zeroed (3 x cols words, a plain
    # launch), the tiles and the final rounding, both dependent on sm_90+ (they wait for the
    # launch before them with griddepcontrol.wait, which exists from sm_90).
    from rawops import elementwise

    calls, names = [], []
    monkeypatch.setattr(elementwise, "launch", lambda *args: calls.append(args))
    monkeypatch.setattr(elementwise._modules, "function_pointer", lambda family, kernel, device: names.append(kernel)
                        or 0x100 * len(names))
    monkeypatch.setattr(elementwise._modules, "compute_capability", lambda device: cc)
    rows, cols = 8000, 3072  # 2^24 elements and more, row tiles the last part-filled
    plan = bias_gelu_bwd_plan(rows, cols, 1, (0, 256, bias_ptr), 132)
    elementwise.launch_bias_gelu_backward(0, 1, "none", plan, 0x1000, 0x2000, bias_ptr, 0x3000, 0x5000, 0x6000,
                                          rows, cols, 0x77)
    assert names == ["fixed_sum_zero", name, "fixed_sum_final_f16"]
    zero, tiles, final = calls
    assert zero[:8] == (0x100, (-(-3 * cols // 256),), 256, 0, 0x77, (0x5000, 3 * cols), "pq", 0)
    assert len(zero) == 8 or zero[8] is False
    tile_rows = elementwise.BIAS_BWD_TILE_SHAPE[1][1]
    assert tiles == (0x200, ((-(-rows // tile_rows)) * (cols // 64),), 512, 0, 0x77,
                     (0x1000, 0x2000, bias_ptr, 0x3000, 0x5000, rows, cols), "pppppqq", 0, dependent)
    assert final == (0x300, (cols // 256,), 256, 0, 0x77, (0x5000, 0x6000, cols), "ppq", 0, dependent)


@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("bias_ptr, kernel", [(0x4000, "bias_gelu_tanh_bwd_{}_f16"), (0, "gelu_tanh_bwd_{}_f16")])
def test_fused_gelu_backward_takes_the_kernel_without_bias_for_a_null_bias(monkeypatch, bias_ptr, kernel, tiles):
    # linear_gelu's backward passes no bias (dpre = dy * gelu'(pre)): the kernel must not read one.
    from rawops import elementwise

    monkeypatch.setattr(rawops.config, "bias_gelu_backward_tiles", tiles)
    monkeypatch.setattr(rawops.config, "exact_half_dbias", False)  # its launches: the test above
    kernel = kernel.format("tile" if tiles else "partial")
    calls, names = [], []
    monkeypatch.setattr(elementwise, "launch", lambda *args: calls.append(args))
    monkeypatch.setattr(elementwise._modules, "function_pointer", lambda family, name, device: names.append(name) or 1)
    monkeypatch.setattr(elementwise._modules, "compute_capability", lambda device: 90)
    plan = bias_gelu_bwd_plan(64, 4096, 1, (0, 256, bias_ptr), 132)
    elementwise.launch_bias_gelu_backward(0, 1, "tanh", plan, 0x1000, 0x2000, bias_ptr, 0x3000, 0x5000, 0x6000,
                                          64, 4096, 0)
    assert names == [kernel, "column_sum_final_f16"]
    assert calls[0][5][:5] == (0x1000, 0x2000, bias_ptr, 0x3000, 0x5000)


# ------------------------------------------------------------------------------ generic launcher
def test_generic_launch_wants_one_kind_per_argument():
    with pytest.raises(ValueError, match="one kind per argument"):
        launch(0, (1,), 256, 0, 0, (1, 2), "p", 0)


def test_generic_launch_takes_at_most_32_arguments():
    with pytest.raises(ValueError, match="at most 32 arguments"):
        launch(0, (1,), 256, 0, 0, tuple(range(33)), "q" * 33, 0)


@pytest.mark.parametrize("device", [-1, 64, 1000])
def test_sm_count_refuses_out_of_range_devices_before_asking_the_gpu(device):
    with pytest.raises(ValueError, match=f"device {device} is out of range"):
        sm_count(device)


# ------------------------------------------------------------------------------ capped shape (sm_90)
def test_light_ops_take_the_capped_shape_on_sm90_only():
    from rawops._launch import MAP_CAPPED_SHAPE, map_shape

    capped = (MAP_CAPPED_SHAPE["threads"], MAP_CAPPED_SHAPE["shared"])
    assert map_shape(True, 90) == capped == (128, 16384)
    for cc in (75, 80, 86, 89, 100, 120):
        assert map_shape(True, cc) == (THREADS, 0)
    assert map_shape(False, 90) == (THREADS, 0)
    # on a device with fast memory an SM (the H200): every op in 128-thread blocks, uncapped
    for cc, capped in itertools.product((80, 90, 100), (True, False)):
        assert map_shape(capped, cc, True) == (128, 0)
    # 16 KB needs no opt-in attribute (the default dynamic limit is 48 KB), and the block fits
    # the kernels' launch bounds
    assert MAP_CAPPED_SHAPE["shared"] <= 48 * 1024 and MAP_CAPPED_SHAPE["threads"] <= THREADS


def test_which_ops_are_capped():
    from rawops import elementwise

    capped = {name for name, kernel in elementwise.MAP.items() if kernel.capped}
    assert capped == {"gelu_tanh_fwd", "gelu_tanh_bwd", "gelu_erf_bwd", "relu_fwd", "relu_bwd", "relu_scale_fwd",
                      "relu_scale_bwd", "relu_scale_add_fwd", "add_fwd"}  # erf GELU fwd, bias_gelu: slower capped


@pytest.mark.parametrize("n", [1, 1023, 1 << 20, (1 << 26) + 5])
def test_capped_blocks_cover_the_vectors_with_128_threads(n):
    blocks, head = map_launch_config(n, 2, BASE, BASE, 0, 132, 128)
    assert head == 0 and blocks == max(1, math.ceil((n // 8) / 128))
    assert blocks * 128 * 8 >= n - n % 8


def test_the_heavier_16_bit_forwards_unroll_on_fast_memory_only():
    from rawops import elementwise
    from rawops._launch import map_unroll

    assert elementwise.FAST_UNROLL == {"gelu_erf_fwd": (2, 2), "bias_gelu_tanh_fwd": (1, 2),
                                       "bias_gelu_erf_fwd": (4, 4)}  # (float32, 16-bit)
    for name, kernel in elementwise.MAP.items():
        assert (kernel.fast_unroll_f32, kernel.fast_unroll) == elementwise.FAST_UNROLL.get(name, (1, 1))
    for dtype, fast in itertools.product((0, 1, 2), (False, True)):  # f32, f16, bf16
        want = (3 if dtype == 0 else 4) if fast else UNROLL
        assert map_unroll(4, 3, dtype, fast) == want
        assert map_unroll(1, 1, dtype, fast) == UNROLL
        assert map_unroll(4, 1, 0, fast) == UNROLL and map_unroll(1, 4, 1, fast) == UNROLL


@pytest.mark.parametrize("unroll", [2, 4])
@pytest.mark.parametrize("n", [1, 1023, 1 << 20, (1 << 26) + 5])
def test_unrolled_blocks_cover_the_vectors_once(n, unroll):
    # a block of an _x<U> entry owns 128 * U consecutive vectors (kernels/elementwise.cu map)
    blocks, head = map_launch_config(n, 2, BASE, BASE, 0, 132, 128, unroll)
    assert head == 0 and blocks == max(1, math.ceil((n // 8) / (128 * unroll)))
    assert blocks * 128 * unroll * 8 >= n - n % 8


@pytest.mark.gpu
def test_a_capped_op_launches_in_the_shape_its_device_gets():
    from rawops import elementwise
    from rawops._launch import map_shape

    cc = _modules.compute_capability(0)
    fast = _modules.fast_memory(0)
    assert elementwise.MAP["relu_fwd"].launch_shape(0) == map_shape(True, cc, fast)
    assert elementwise.MAP["gelu_erf_fwd"].launch_shape(0) == ((128, 0) if fast else (THREADS, 0))


# ------------------------------------------------------------------------------ the device's resident blocks
def test_resident_blocks_asks_the_occupancy_api_once_per_function_shape_and_device(monkeypatch):
    from cupy_backends.cuda.api import driver

    calls = []

    def occupancy(function, threads, smem):
        calls.append((function, threads, smem))
        return {256: 6, 128: 0}[threads]

    monkeypatch.setattr(driver, "occupancyMaxActiveBlocksPerMultiprocessor", occupancy)
    monkeypatch.setattr(_modules, "_per_sm", {})
    monkeypatch.setattr(_modules, "_attributes", {(7, _modules.ATTR_MULTIPROCESSORS): 132})
    assert _modules.resident_blocks(0x1234, 256, 0, 7) == 6 * 132
    assert _modules.resident_blocks(0x1234, 256, 0, 7) == 6 * 132
    assert calls == [(0x1234, 256, 0)]
    assert _modules.resident_blocks(0x1234, 128, 16384, 7) == 132  # never fewer than one block an SM
    assert _modules.blocks_per_sm(0x1234, 256, 0, 7) == 6
    assert calls == [(0x1234, 256, 0), (0x1234, 128, 16384)]


@pytest.mark.gpu
def test_map_kernels_bound_their_grid_stride_grids_by_the_occupancy_api():
    from rawops import elementwise

    device = 0
    kernel = elementwise.MAP["gelu_erf_fwd"]
    threads, shared = kernel.launch_shape(device)
    for dtype, suffix in enumerate(("f32", "f16", "bf16")):
        contiguous = _modules.function_pointer(kernel.family, f"{kernel.name}_{suffix}", device)
        strided = _modules.function_pointer(kernel.family, f"{kernel.name}_strided_{suffix}", device)
        assert kernel.resident(device, dtype) == _modules.resident_blocks(contiguous, threads, shared, device)
        assert kernel.resident(device, dtype, True) == _modules.resident_blocks(strided, THREADS, 0, device)
        per_sm = _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM) // THREADS
        assert sm_count(device) <= kernel.resident(device, dtype, True) <= sm_count(device) * per_sm


@pytest.mark.gpu
def test_the_occupancy_api_answers_what_the_threads_and_registers_allow():
    import cupy

    from rawops import image

    device = 0
    kernel = _modules.get_function(image.FAMILY, "volume_minmax_f32", device)
    pointer = _modules.function_pointer(image.FAMILY, "volume_minmax_f32", device)
    per_sm = _modules.blocks_per_sm(pointer, image.THREADS, 0, device)
    threads_per_sm = _modules.device_attribute(device, _modules.ATTR_THREADS_PER_SM)
    assert threads_per_sm == cupy.cuda.Device(device).attributes["MaxThreadsPerMultiProcessor"]
    by_registers = cupy.cuda.runtime.deviceGetAttribute(82, device) // (kernel.num_regs * image.THREADS)
    assert 1 <= per_sm <= min(threads_per_sm // image.THREADS, max(1, by_registers) + 1)
    assert _modules.resident_blocks(pointer, image.THREADS, 0, device) == per_sm * sm_count(device)
    assert _modules.l2_bytes(device) == cupy.cuda.Device(device).attributes["L2CacheSize"] > 0
