"""The sorting family: sort and argsort along a dim, as torch.sort and torch.argsort (and topk,
re-exported from rawops._sorting_topk). Kernels: kernels/sorting.cu.

Keys: float32, float16, bfloat16, int32, int64. values have x's dtype, indices are int64
positions along dim (torch's dtype). Order: torch's, ascending or descending: NaN after +inf
ascending and first descending (every NaN, whatever its sign bit: torch's CPU order; torch's CUDA
sort places a NaN with its sign bit set first ascending on its radix path, pytorch/pytorch#190781),
-0.0 equal to +0.0. Every launch sorts stably (equal keys keep
their order), so stable=False gets the stable order too; values are gathered from x by the
sorted positions, so NaN payloads and the sign of zero come back as they were.

Launches (plan(), a pure function of the row length n and the key width): rows of up to 32 a
group of lanes each (a bitonic network in registers); 16- and 32-bit rows up to NETWORK_MAX one
warp each (a bitonic network over packed (key, position) words, registers and shuffles); rows up
to one block's tile (8192 keys, 4096 for int64) one block each (a block radix sort on cub's
ranking, the smallest tile that holds the row); longer rows in chunks of the largest tile,
sorted a block each, then merged pairwise, one launch a doubling of the run length (the last
writes the results): "block_merge" (a block a window of outputs, staged in shared memory) or
"merge" (a thread a few outputs, straight from global memory); or (16-bit keys past two chunks,
long_path_for()) cub's segmented radix sort machinery, one launch a 6-bit digit. The long rows
use scratch of 2 x (key bytes + 4) an element allocated on the launch's stream. Rows of 2**31
elements or more are refused.

Layouts: along the last dim, x may be a view whose last dim is contiguous and whose leading
dims collapse to one row stride (`x[:, :n]` of a wider matrix, `x[::2]`): read as it is; any
other layout there is a ValueError naming x (pass a contiguous copy), as in every family's
CuPy API. Another dim is first copied with dim last into a contiguous array (one extra read
and write of x) and the results copied back into x's shape (one more read and write of each).
Results are new contiguous arrays.
"""
import collections

import numpy

from . import _constants, _modules, _rows
from ._sorting_keys import KEY_TYPES, MAX_GRID, SUFFIXES, checked_bool, checked_dim, checked_rows, key_type
from ._launch import (allocating_on, as_array, hold_if_capturing, launch, resolve_device,
                      stream_pointer, wait_for_producer)

FAMILY = "sorting"

BITS_OF = {suffix: bits for suffix, _, bits in KEY_TYPES.values()}

WARP_MAX = 32  # rows up to this long: sort_warp (a group of lanes a row)
WARP_THREADS = _constants.SORT_WARP_THREADS
STREAM_THREADS = _constants.SORT_STREAM_THREADS
MERGE_ITEMS = _constants.SORT_MERGE_ITEMS
BMERGE_THREADS = _constants.SORT_BMERGE_THREADS
BMERGE_WINDOW = _constants.SORT_BMERGE_THREADS * _constants.SORT_BMERGE_ITEMS  # outputs a block merges
NET_THREADS = _constants.SORT_NET_THREADS
SEGMENT_THREADS = _constants.SORT_SEGMENT_THREADS
RADIX_BITS = _constants.SORT_SEGMENT_RADIX_BITS

# The one-block tiles (threads, keys a thread) kernels/sorting.cu compiles, each in two rankings:
# "match" (cub::BlockRadixRankMatch) and "early" (cub::BlockRadixRankMatchEarlyCounts), 8-bit
# digits. TILES (WIDE_TILES for 64-bit keys) takes one tile a size, smallest first, and RANKING
# (WIDE_RANKING) one ranking a tile: the fastest of the candidates the benchmark times
# (bench/results/<gpu>/sort.md, "block tiles").
TILE_CANDIDATES = ((32, 4), (32, 8), (32, 16), (64, 8), (64, 16), (128, 8), (128, 16), (256, 8), (256, 16),
                   (512, 8), (512, 16))
WIDE_CANDIDATES = TILE_CANDIDATES[:-1]  # 64-bit keys: an 8192-key tile would not fit 48 KB of shared memory
TILES = ((32, 4), (32, 8), (64, 8), (128, 8), (256, 8), (256, 16), (512, 16))
WIDE_TILES = ((32, 4), (32, 8), (64, 8), (64, 16), (256, 8), (256, 16))
RANKINGS = ("match", "early")
RANKING = {**{tile: "match" for tile in TILE_CANDIDATES}, (256, 16): "early", (512, 8): "early"}
WIDE_RANKING = {tile: "match" for tile in WIDE_CANDIDATES}
# Rows longer than the largest tile: "block_merge" or "merge" (chunks of the largest tile sorted a
# block each, then merged pairwise, one launch a doubling: a block a window of BMERGE_WINDOW
# outputs staged in shared memory, or a thread MERGE_ITEMS outputs read from global memory) or
# "segmented" (cub's segmented radix sort machinery, one launch a 6-bit digit). MERGE_PATH is the
# merge the plan takes; 16-bit keys need only three digit passes, so those take the segmented path
# once the merge needs SEGMENTED_FROM_ROUNDS rounds.
LONG_PATHS = ("block_merge", "merge", "segmented")
MERGE_PATH = "block_merge"
SEGMENTED_FROM_ROUNDS = {16: 2, 32: None, 64: None}  # key bits -> merge rounds from which segmented runs
# The merge networks (sort_net_<exchange>_<items>_<dt>, 16- and 32-bit keys): one warp a row of up
# to 32 x items keys, the smallest that holds the row; slots exchanged through shuffles only
# ("shfl") or by switching layouts through shared memory ("smem"), NETWORK_EXCHANGE the plan's.
# NETWORK_MAX: key bits -> the longest row the plan sorts by a network rather than a block tile
# (0: never; dev/time_sort_paths.py times them against each other).
NETWORK_ITEMS = (4, 8, 16, 32)
NETWORK_EXCHANGES = ("shfl", "smem")
NETWORK_EXCHANGE = "smem"
NETWORK_MAX = {16: 0, 32: 0, 64: 0}


def tile_kernel(tile, ranking=None, chunks=False, bits=32):
    threads, items = tile
    ranking = ranking or (WIDE_RANKING if bits == 64 else RANKING)[tile]
    return f"sort_{'chunks' if chunks else 'rows'}_{threads}x{items}_{ranking}"


def chunk_tile(bits):
    """The tile whose chunks the merge path sorts: the largest."""
    return (WIDE_TILES if bits == 64 else TILES)[-1]


def network_items(n, bits):
    """Keys a lane of the merge network that holds a row of n keys `bits` wide, or None (none
    does: 64-bit keys, or n past 32 x the largest)."""
    if bits == 64:
        return None
    for items in NETWORK_ITEMS:
        if 32 * items >= n:
            return items
    return None


def _entry_points():
    names = []
    for suffix in SUFFIXES:
        wide = BITS_OF[suffix] == 64
        names += [f"sort_warp_{suffix}", f"sort_keys_{suffix}", f"sort_gather_{suffix}", f"sort_merge_final_{suffix}",
                  f"sort_bmerge_final_{suffix}"]
        if not wide:
            names += [f"sort_net_{ex}_{items}_{suffix}" for ex in NETWORK_EXCHANGES for items in NETWORK_ITEMS]
        for tile in (WIDE_CANDIDATES if wide else TILE_CANDIDATES):
            names += [f"{tile_kernel(tile, ranking)}_{suffix}" for ranking in RANKINGS]
        names += [f"{tile_kernel(chunk_tile(BITS_OF[suffix]), ranking, chunks=True)}_{suffix}" for ranking in RANKINGS]
    return names + [f"sort_{kind}_k{bits}" for kind in ("pass", "merge", "bmerge") for bits in (16, 32, 64)]


# Every entry point of kernels/sorting.cu -> its fatbin (tests/test_build.py checks the fatbin
# holds exactly these on every architecture).
FAMILY_OF = {name: FAMILY for name in _entry_points()}
ROWS_KINDS = "pppqqqq"  # x, values, indices, rows, n, x_stride, descending (warp, tile and chunk kernels)
KEYS_KINDS = "pppqqqq"  # x, keys, order, rows, n, x_stride, descending
PASS_KINDS = "ppppqqqq"  # keys_in, order_in, keys_out, order_out, rows, n, bit, pass_bits
GATHER_KINDS = "ppppqqq"  # x, order, values, indices, rows, n, x_stride
MERGE_KINDS = "ppppqqq"  # keys_in, pos_in, keys_out, pos_out, rows, n, run
MERGE_FINAL_KINDS = "pppppqqqq"  # keys, pos, x, values, indices, rows, n, x_stride, run
BMERGE_FINAL_KINDS = "pppppqqqqq"  # keys, pos, x, values, indices, rows, n, x_stride, run, descending

Plan = collections.namedtuple("Plan", "kind kernel blocks threads passes")
Plan.__doc__ = """A launch plan: kind ("warp", "network", "tile", "block_merge", "merge" or
"segmented"), the first kernel's base name (without the dtype suffix; for "segmented" the
digit-pass kernel, suffix included), its grid and block, and the launches after it: merge
rounds, or digit passes."""


def _pow2_at_least(k):
    return 1 << max(0, k - 1).bit_length()


def long_path_for(n, bits):
    """The long-row path of rows of n keys `bits` wide (n past the largest tile)."""
    chunk = chunk_tile(bits)
    rounds = (-(-n // (chunk[0] * chunk[1])) - 1).bit_length()
    start = SEGMENTED_FROM_ROUNDS[bits]
    return "segmented" if start is not None and rounds >= start else MERGE_PATH


def tile_for(n, bits):
    """The smallest tile of keys `bits` wide that holds a row of n, or None (the row goes long)."""
    for tile in (WIDE_TILES if bits == 64 else TILES):
        if tile[0] * tile[1] >= n:
            return tile
    return None


def plan(rows, n, bits, ranking=None, tile=None, long_path=None, network=None):
    """How rows (> 0) rows of n (> 0) keys `bits` wide are sorted. ranking, tile, long_path,
    network: another choice than the tables' (the benchmark's and the tests' comparisons); a tile
    given must hold the row; network=True (or an exchange of NETWORK_EXCHANGES) takes the merge
    network for rows of up to 1024 16- or 32-bit keys (ValueError for others), network=False
    never."""
    if n <= WARP_MAX and tile is None and not network:
        rows_per_block = (WARP_THREADS // 32) * (32 // _pow2_at_least(n))
        return Plan("warp", "sort_warp", min(-(-rows // rows_per_block), MAX_GRID), WARP_THREADS, 0)
    if long_path is not None and long_path not in LONG_PATHS:
        raise ValueError(f"long_path must be one of {LONG_PATHS}, got {long_path!r}")
    items = network_items(n, bits)
    if network is None:
        network = tile is None and n <= NETWORK_MAX[bits] and items is not None
    elif network and items is None:
        raise ValueError(f"no merge network sorts rows of {n} keys {bits} bits wide")
    if network:
        exchange = NETWORK_EXCHANGE if network is True else network
        if exchange not in NETWORK_EXCHANGES:
            raise ValueError(f"network must be a bool or one of {NETWORK_EXCHANGES}, got {network!r}")
        rows_per_block = NET_THREADS // 32
        return Plan("network", f"sort_net_{exchange}_{items}", min(-(-rows // rows_per_block), MAX_GRID), NET_THREADS,
                    0)
    tile = tile or tile_for(n, bits)
    if tile is not None:
        return Plan("tile", tile_kernel(tile, ranking, bits=bits), min(rows, MAX_GRID), tile[0], 0)
    if (long_path or long_path_for(n, bits)) == "segmented":
        return Plan("segmented", f"sort_pass_k{bits}", min(rows, MAX_GRID), SEGMENT_THREADS, -(-bits // RADIX_BITS))
    chunk = chunk_tile(bits)
    chunks = -(-n // (chunk[0] * chunk[1]))
    return Plan(long_path or long_path_for(n, bits), tile_kernel(chunk, ranking, chunks=True, bits=bits),
                min(rows * chunks, MAX_GRID), chunk[0], (chunks - 1).bit_length())


def scratch_bytes(rows, n, bits, long_path=None):
    """Bytes of scratch a sort of rows x n keys needs: two (key, int32 position) buffers on the
    long-row paths, none on the others."""
    p = plan(rows, n, bits, long_path=long_path)
    return 2 * rows * n * (bits // 8 + 4) if p.kind in LONG_PATHS else 0


# ------------------------------------------------------------------------------ launches
def merge_rounds(kind, rows, n, bits, passes):
    """The launches of a merge path's rounds: (kernel base name, grid, block, run) a round, the
    last writing the results (its kernel takes the dtype suffix)."""
    block_merge = kind == "block_merge"
    if block_merge:
        grid, threads, names = min(rows * -(-n // BMERGE_WINDOW), MAX_GRID), BMERGE_THREADS, ("bmerge", "bmerge_final")
    else:
        grid, threads = min(-(-rows * -(-n // MERGE_ITEMS) // STREAM_THREADS), MAX_GRID), STREAM_THREADS
        names = ("merge", "merge_final")
    run = chunk_tile(bits)[0] * chunk_tile(bits)[1]
    rounds = []
    for i in range(passes):
        final = i == passes - 1
        rounds.append((f"sort_{names[final]}" + ("" if final else f"_k{bits}"), grid, threads, run << i))
    return rounds


def launch_sort(device, suffix, x_ptr, values_ptr, indices_ptr, rows, n, x_stride, descending, stream, scratch,
                ranking=None, tile=None, long_path=None, network=None):
    """The launches of a sort on checked pointers (rows > 0, 0 < n <= MAX_ROW; values_ptr 0 for
    indices only): values and indices dense rows of n. scratch(nbytes) -> a device pointer
    valid, on `stream`, until the launches are done (called only on the long-row paths).
    ranking, tile, long_path, network: as plan() takes them."""
    bits = BITS_OF[suffix]
    p = plan(rows, n, bits, ranking, tile, long_path, network)
    desc = int(bool(descending))
    if p.kind in ("warp", "network", "tile"):
        function = _modules.function_pointer(FAMILY, f"{p.kernel}_{suffix}", device)
        launch(function, (p.blocks,), p.threads, 0, stream,
               (x_ptr, values_ptr, indices_ptr, rows, n, x_stride, desc), ROWS_KINDS, device)
        return
    elements = rows * n
    key_bytes = bits // 8
    block = scratch(2 * elements * (key_bytes + 4))
    keys = (block, block + elements * key_bytes)
    order_base = block + 2 * elements * key_bytes
    order = (order_base, order_base + elements * 4)
    if p.kind in ("merge", "block_merge"):
        launch(_modules.function_pointer(FAMILY, f"{p.kernel}_{suffix}", device), (p.blocks,), p.threads, 0, stream,
               (x_ptr, keys[0], order[0], rows, n, x_stride, desc), ROWS_KINDS, device)
        for i, (name, grid, threads, run) in enumerate(merge_rounds(p.kind, rows, n, bits, p.passes)):
            src, dst = i % 2, 1 - i % 2
            if i < p.passes - 1:
                launch(_modules.function_pointer(FAMILY, name, device), (grid,), threads, 0, stream,
                       (keys[src], order[src], keys[dst], order[dst], rows, n, run), MERGE_KINDS, device)
            elif p.kind == "block_merge":
                launch(_modules.function_pointer(FAMILY, f"{name}_{suffix}", device), (grid,), threads, 0, stream,
                       (keys[src], order[src], x_ptr, values_ptr, indices_ptr, rows, n, x_stride, run, desc),
                       BMERGE_FINAL_KINDS, device)
            else:
                launch(_modules.function_pointer(FAMILY, f"{name}_{suffix}", device), (grid,), threads, 0, stream,
                       (keys[src], order[src], x_ptr, values_ptr, indices_ptr, rows, n, x_stride, run),
                       MERGE_FINAL_KINDS, device)
        return
    grid = (min(rows, MAX_GRID),)
    launch(_modules.function_pointer(FAMILY, f"sort_keys_{suffix}", device), grid, STREAM_THREADS, 0, stream,
           (x_ptr, keys[0], order[0], rows, n, x_stride, desc), KEYS_KINDS, device)
    digit_pass = _modules.function_pointer(FAMILY, p.kernel, device)
    for i in range(p.passes):
        bit, src, dst = i * RADIX_BITS, i % 2, 1 - i % 2
        launch(digit_pass, grid, p.threads, 0, stream,
               (keys[src], order[src], keys[dst], order[dst], rows, n, bit, min(RADIX_BITS, bits - bit)),
               PASS_KINDS, device)
    launch(_modules.function_pointer(FAMILY, f"sort_gather_{suffix}", device), grid, STREAM_THREADS, 0, stream,
           (x_ptr, order[p.passes % 2], values_ptr, indices_ptr, rows, n, x_stride), GATHER_KINDS, device)


def _sort(x, dim, descending, stable, stream, op, with_values):
    import cupy

    a = as_array(x, "x")
    dtype = key_type(a, op)
    dim = checked_dim(dim, len(a.shape))
    descending = checked_bool(descending, "descending")
    checked_bool(stable, "stable")  # every launch is stable
    suffix, np_dtype, bits = KEY_TYPES[dtype]
    shape = a.shape
    n = shape[dim] if shape else 1
    checked_rows(a, n, np_dtype.itemsize, op)
    last = dim == len(shape) - 1 or not shape
    # along the last dim, a row-strided view or a ValueError naming x (no hidden copy)
    x_stride = (_rows.row_stride(a) if shape else 1) if last else None
    device = resolve_device(a)
    s = stream_pointer(stream, device)
    with cupy.cuda.Device(device), allocating_on(stream, s):
        wait_for_producer(a, s)
        source_ptr, held = a.ptr, []
        moved_shape = shape if last else shape[:dim] + shape[dim + 1:] + (n,)
        if not last:  # the documented copy with dim last, on the launch's stream
            view = a.obj if a.is_cupy else cupy.asarray(a.obj)
            moved = cupy.ascontiguousarray(cupy.moveaxis(view, dim, -1))
            source_ptr, x_stride = moved.data.ptr, n
            held.append(moved)
        values = cupy.empty(moved_shape, np_dtype) if with_values else None
        indices = cupy.empty(moved_shape, numpy.int64)
        rows = a.size // n if n else 0
        if rows and n:
            launch_sort(device, suffix, source_ptr, values.data.ptr if with_values else 0, indices.data.ptr, rows, n,
                        x_stride, descending, s, lambda nbytes: _scratch(nbytes, held))
            hold_if_capturing(s, *held)
        if not last:
            indices = cupy.ascontiguousarray(cupy.moveaxis(indices, -1, dim))
            if with_values:
                values = cupy.ascontiguousarray(cupy.moveaxis(values, -1, dim))
    return values, indices


def _scratch(nbytes, held):
    import cupy

    block = cupy.empty(nbytes, dtype=numpy.uint8)
    held.append(block)
    return block.data.ptr


def sort(x, dim=-1, descending=False, stable=False, *, stream=None):
    """(values, indices) of x sorted along dim, as torch.sort: values in x's dtype, indices
    int64 positions along dim; stable whatever `stable` says (module docstring for the order,
    layouts and what another dim costs)."""
    return _sort(x, dim, descending, stable, stream, "sort", True)


def argsort(x, dim=-1, descending=False, stable=False, *, stream=None):
    """The int64 indices that sort x along dim, as torch.argsort (sort's indices; no values are
    written)."""
    return _sort(x, dim, descending, stable, stream, "argsort", False)[1]


from ._sorting_topk import topk  # noqa: E402,F401  (kernels/sorting_topk.cu)
