"""Launch maths of the map kernels, without a GPU.

rawops._launch.map_launch_config(n, itemsize, out, a, b, sms) -> (blocks, head) is what the
launcher passes to every kernel in kernels/elementwise.cu. The simulation below replays the
kernel's `map` index arithmetic thread by thread and checks that every element is handled
exactly once and that every 16-byte access is 16-byte aligned.
"""
import math

import numpy as np
import pytest

from rawops._launch import launch, map_launch_config, sm_count

THREADS = 256  # MAP_THREADS in _launch.pyx, __launch_bounds__(256) in the kernel
UNROLL = 4  # MAP_UNROLL / kUnroll
BLOCKS_PER_SM = 8  # MAP_BLOCKS_PER_SM
BASE = 0x7F0000000000  # 256-byte aligned, like any cudaMalloc pointer


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
    (4, 0, 4, 0), (4, 4, 0, 4), (4, 4, 4, 8), (4, 0, 0, 16 + 4), (2, 2, 4, 2), (2, 0, 0, 2), (2, 6, 24, 6), (2, 6, 6, 24),
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
    (0, 4, 132), (1, 4, 132), (4096, 4, 132), (4097, 4, 132), (8192, 2, 132), (10 ** 6, 4, 132),
    (10 ** 6, 2, 1), (123457, 4, 2), (2 ** 31 + 5, 4, 132), (2 ** 31 + 5, 2, 10 ** 6), (3 * 2 ** 40, 4, 2 ** 30),
])
@pytest.mark.parametrize("offset", [0, 4, 8])
def test_blocks_are_ceil_vectors_over_1024_clamped_to_8_per_sm(n, itemsize, sms, offset):
    blocks, head = map_launch_config(n, itemsize, BASE + offset, BASE + offset, 0, sms)
    vector = 16 // itemsize
    assert head == min(((16 - offset) % 16) // itemsize, n)
    vectors = (n - head) // vector
    expected = math.ceil(vectors / (THREADS * UNROLL))
    assert blocks == max(1, min(expected, sms * BLOCKS_PER_SM))
    assert 1 <= blocks <= sms * BLOCKS_PER_SM


def test_scalar_path_sizes_the_grid_by_elements():
    blocks, head = map_launch_config(10 ** 6, 4, BASE, BASE + 4, 0, 10 ** 4)
    assert head == -1
    assert blocks == math.ceil(10 ** 6 / (THREADS * UNROLL))


def test_more_than_2_to_the_31_elements_use_64_bit_arithmetic():
    n = 2 ** 31 + 5
    blocks, head = map_launch_config(n, 4, BASE, BASE, BASE, 10 ** 6)
    assert head == 0
    assert blocks == math.ceil((n // 4) / 1024) == 524289
    blocks, head = map_launch_config(n, 2, BASE + 2, BASE + 2, 0, 10 ** 6)
    assert head == 7
    assert blocks == math.ceil(((n - 7) // 8) / 1024)
    # Clamped by the SM count, never wrapped to zero or a negative grid:
    assert map_launch_config(2 ** 40, 2, BASE, BASE, 0, 132) == (132 * 8, 0)


def test_zero_sms_still_launches_one_block():
    assert map_launch_config(10 ** 6, 4, BASE, BASE, 0, 0)[0] == 1


# ------------------------------------------------------------------------------ coverage
def simulate_map(n, itemsize, out_ptr, a_ptr, b_ptr, sms):
    """How many times kernels/elementwise.cu `map` touches each element, plus a check that
    every vector access (a, b, out) is 16-byte aligned. Mirrors the kernel line by line."""
    blocks, head = map_launch_config(n, itemsize, out_ptr, a_ptr, b_ptr, sms)
    nthreads = blocks * THREADS
    tid = np.arange(nthreads, dtype=np.int64)
    hits = np.zeros(n, dtype=np.int64)
    if head < 0:  # for (i = tid; i < n; i += nthreads)
        i = tid.copy()
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
    np.add.at(hits, tid[tid < head], 1)  # if (tid < head) scalar(tid)
    np.add.at(hits, tail + tid[tid < n - tail], 1)  # if (tid < n - tail) scalar(tail + tid)
    base = tid.copy()
    while True:  # for (base = tid; base < nvec; base += nthreads * kUnroll)
        active = base[base < nvec]
        if active.size == 0:
            break
        for k in range(UNROLL):
            j = active + k * nthreads
            j = j[j < nvec]
            first = head + j * V
            for ptr in (out_ptr, a_ptr) + ((b_ptr,) if b_ptr else ()):
                misaligned = (ptr + first * itemsize) % 16
                assert not misaligned.any(), f"unaligned 16-byte access at element {first[misaligned != 0][0]}"
            for e in range(V):
                np.add.at(hits, first + e, 1)
        base += nthreads * UNROLL
    return hits, blocks, head


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
    # A clamped grid (1 SM -> 8 blocks -> 2048 threads) forces several grid-stride rounds
    # and partial UNROLL groups; odd n leaves a scalar tail.
    (4, 0, 2048 * 4 * 4 * 3 + 13, 1),
    (4, 4, 2048 * 4 * 4 * 2 + 4 * 2048 + 3, 1),
    (2, 6, 2048 * 4 * 8 * 2 + 1000 * 8 + 7, 1),
    (2, 2, 50001, 1),
    (4, 12, 2048 * 16 + 1, 1),
    (4, 0, 300000, 2),
    (2, 0, 4096 * 8 + 5, 132),
])
def test_every_element_is_covered_exactly_once_with_a_clamped_grid(itemsize, phase, n, sms):
    hits, blocks, head = simulate_map(n, itemsize, BASE + phase, BASE + 0x100000 + phase, 0, sms)
    assert head >= 0
    assert (hits == 1).all(), f"{int((hits != 1).sum())} elements hit != once"


def test_every_element_is_covered_exactly_once_on_the_scalar_path_with_a_clamped_grid():
    n = 2048 * 7 + 11
    hits, blocks, head = simulate_map(n, 4, BASE, BASE + 4, 0, 1)
    assert (head, blocks) == (-1, 8)
    assert (hits == 1).all()


# ------------------------------------------------------------------------------ generic launcher
def test_generic_launch_wants_one_kind_per_argument():
    with pytest.raises(ValueError, match="one kind per argument"):
        launch(0, (1,), 256, 0, 0, (1, 2), "p", 0)


def test_generic_launch_takes_at_most_16_arguments():
    with pytest.raises(ValueError, match="at most 16 arguments"):
        launch(0, (1,), 256, 0, 0, tuple(range(17)), "q" * 17, 0)


@pytest.mark.parametrize("device", [-1, 64, 1000])
def test_sm_count_refuses_out_of_range_devices_before_asking_the_gpu(device):
    with pytest.raises(ValueError, match=f"device {device} is out of range"):
        sm_count(device)
