"""The benchmarks' shared harness: CUDA-event timing (warm-up, interleaved rounds, medians), the
copy ceiling, and the results every bench writes.

A bench run on one GPU writes
  <out>/<gpu>/<family>.md and .json   the latest run on that GPU model (replaced by the next one);
                                      <gpu> is gpu_key(): h100, h200, else a slug of the name;
  <out>/history.csv                   one line appended per measured row, every family alike:
      gpu,commit,date,op,dtype,shape,us,torch_us,ratio_vs_torch
    gpu      gpu_key()
    commit   $RAWOPS_COMMIT if set (a device machine may hold the tree without its git history),
             else `git rev-parse --short HEAD`, else "unknown"
    date     UTC, "YYYY-MM-DD HH:MM"
    us       the library's time for the row (device time; host time where the op says "host")
    torch_us the torch baseline's time in the same run (empty where the row has none)
    ratio_vs_torch  torch_us / us (above 1: the library is faster)
Every row a bench reports is a dict with at least the keys of HISTORY_KEYS: "op", "dtype",
"shape", "rawops us" and "torch us" (None where there is no torch counterpart). A row whose
"rawops us" is None is a reference (torch alone, a bare launch): it is in the tables, not in the
history.
"""
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results")
HISTORY = "history.csv"
HISTORY_COLUMNS = ["gpu", "commit", "date", "op", "dtype", "shape", "us", "torch_us", "ratio_vs_torch"]
HISTORY_KEYS = ("op", "dtype", "shape", "rawops us", "torch us")
GPU_KEYS = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# ---------------------------------------------------------------------------------- timing

def graphed(fn):
    """fn captured once in a CUDA graph; the returned callable replays it (device time
    without the host's per-call cost)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def event_pairs(reps, stream):
    """reps (start, end) timing events, each recorded once on `stream` already. torch creates a
    CUDA event at its first record(), and record() without a stream asks for the current one:
    a pair made inside the timed interval would count an event creation and a stream query of
    the host. Record the returned pairs on the same stream."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        start.record(stream)
        end.record(stream)
    torch.cuda.synchronize()
    return pairs


WARMUP_SECONDS = 0.25  # at least this long of calls before timing: clocks ramp up after idle


def warm_up(fn, calls=10, seconds=WARMUP_SECONDS):
    """fn() `calls` times, then until `seconds` have passed since the first call: after an idle
    stretch (a torch.compile, an allocation) the GPU's clocks take a while to come back up, and a
    fixed few calls of a short kernel end before they do."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    while time.perf_counter() - start < seconds:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()


def device_time_us(fn, warmup=10, reps=50):
    """Median device time of fn() in microseconds, one event pair around each call."""
    warm_up(fn, warmup)
    stream = torch.cuda.current_stream()
    pairs = event_pairs(reps, stream)
    for start, end in pairs:
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)


QUEUE_SLEEP_CYCLES = 2_000_000  # ~1 ms of GPU clock cycles: longer than any call's host work


def device_times_us(fns, warmup=10, reps=20, rounds=5, queued=False):
    """{name: median device time in us} of each callable (one event pair around each call),
    measured in interleaved rounds (A, B, A, B, ...): drift in the host's or the GPU's speed
    during the run then falls on every candidate alike. queued: the GPU kept busy
    (torch.cuda._sleep) while the host enqueues each call (queued_device_times_us)."""
    for fn in fns.values():
        warm_up(fn, warmup)
    stream = torch.cuda.current_stream()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            events = event_pairs(reps, stream)
            fn()  # once more after the other candidates' calls
            for start, end in events:
                if queued:
                    torch.cuda._sleep(QUEUE_SLEEP_CYCLES)
                start.record(stream)
                fn()
                end.record(stream)
            torch.cuda.synchronize()
            samples[name] += [s.elapsed_time(e) * 1e3 for s, e in events]
    return {name: statistics.median(values) for name, values in samples.items()}


def replayed(fn, leaves, grad):
    """A callable of `leaves` doing what fn's forward + backward launch, with nothing of fn's Python:
    each direction captured into a CUDA graph (rawops' kernels exactly) and replayed from a bare
    autograd.Function. Its call time is the least any autograd Function defined in Python that
    launches those kernels can take on this host (limit us)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (allocator, lazy loads)
        for _ in range(2):
            torch.autograd.grad(fn(*leaves), leaves, grad, allow_unused=True)
    torch.cuda.current_stream().wait_stream(side)
    fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    with torch.cuda.graph(fwd, pool=pool):
        out = fn(*leaves)
    with torch.cuda.graph(bwd, pool=pool):
        grads = torch.autograd.grad(out, leaves, grad, allow_unused=True)  # None for a leaf the op ignores
    static_out = out.detach()

    class Replay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            fwd.replay()
            return static_out

        @staticmethod
        def backward(ctx, dy):  # dy is `grad`, the gradient the graph was captured with
            bwd.replay()
            return grads

    return lambda *inputs: Replay.apply(*inputs)


def ranked_step_us(step, reps=10):
    """Median time in us of step() on this rank of a torch.distributed group (events around each
    call, the ranks lined up by a barrier and a synchronize before it): a multi-GPU step's time,
    the slowest rank's being the step's."""
    import torch.distributed as dist

    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def queued_device_times_us(fns, warmup=10, reps=20, rounds=5):
    """device_times_us with the GPU kept busy (torch.cuda._sleep) while the host enqueues each call:
    the call's device time without its host launch overhead, as inside a step whose GPU work runs
    ahead of the host. For calls whose kernels are shorter than their host work (device_times_us
    then measures the host); report both."""
    return device_times_us(fns, warmup, reps, rounds, queued=True)


def loop_times_us(fns, calls=20, reps=10, rounds=5):
    """{name: median us per call} of `calls` back-to-back calls between one event pair (made
    beforehand), in interleaved rounds: a loop's cost per call, where the host and the GPU overlap
    from one call to the next (the per-call pair of device_times_us sees one call alone)."""
    stream = torch.cuda.current_stream()
    samples = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(calls):  # warm-up
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            pairs = event_pairs(reps, stream)
            for s, e in pairs:
                s.record(stream)
                for _ in range(calls):
                    fn()
                e.record(stream)
            torch.cuda.synchronize()
            samples[name] += [s.elapsed_time(e) * 1e3 / calls for s, e in pairs]
    return {name: statistics.median(v) for name, v in samples.items()}


def host_times_us(fns, calls=1000, rounds=15):
    """{name: median host time per call in us} for a dict of callables, measured in
    interleaved rounds (A, B, C, A, B, C, ...) so that drift in the host's speed falls on every
    candidate alike. The GPU keeps up with tiny launches."""
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in samples.items()}


# The columns of a memory-bound row bench (norm, softmaxes): see row_result.
ROW_HEADER = ["op", "dtype", "shape", "rawops us", "torch us", "torch.compile us", "liger us", "rawops TB/s",
              "torch TB/s", "of copy ceiling", "x torch", "meets target"]


def row_result(op, dtype_name, shape, nbytes, us_ours, us_torch, others, ceiling, meets):
    """One ROW_HEADER row (printed as it is measured): `nbytes` moved in us_ours / us_torch;
    `others` {column: us} for torch.compile / Liger where timed."""
    tbps, speedup = nbytes / us_ours / 1e6, us_torch / us_ours
    print(f"{op:16s} {shape:>12s} {dtype_name:5s} rawops {us_ours:8.1f} us {tbps:5.2f} TB/s | "
          f"torch {us_torch:8.1f} us | {speedup:4.2f}x", flush=True)
    return {"op": op, "dtype": dtype_name, "shape": shape, "rawops us": us_ours, "torch us": us_torch,
            "torch.compile us": others.get("torch.compile", float("nan")),
            "liger us": others.get("liger", float("nan")),
            "rawops TB/s": tbps, "torch TB/s": nbytes / us_torch / 1e6, "of copy ceiling": tbps / ceiling,
            "x torch": speedup, "meets target": meets}


def compiled(fn):
    """torch.compile(fn) with static shapes: what a torch user gets from the compiler. Its first
    calls (the benches' warm-up) compile it."""
    return torch.compile(fn, dynamic=False)


def liger():
    """Liger-Kernel's functional API (liger_kernel.transformers.functional), or None where it is
    not installed: its columns then read nan."""
    try:
        from liger_kernel.transformers import functional
    except Exception:  # not installed, or its Triton does not import here
        return None
    return functional


def copy_ceiling_tbps(nbytes=1 << 30):
    """Device-to-device copy bandwidth, bytes read + written, TB/s: the bar of every
    memory-bound row is a fraction of it, measured in the same run."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = device_time_us(lambda: dst.copy_(src), reps=30)
    return 2 * nbytes / us / 1e6


def start(description):
    """The common start of a benchmark script: (--out folder, copy ceiling), or None with a
    one-line message when there is no GPU."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="results folder: <out>/<gpu>/<family>.md|json and <out>/history.csv")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU here; the benchmark needs one (the tests run without).", file=sys.stderr)
        return None
    ceiling = copy_ceiling_tbps()
    print(f"copy ceiling: {ceiling:.3f} TB/s", flush=True)
    return args.out, ceiling


# ---------------------------------------------------------------------------------- one process a configuration

def per_process_main(description, script, family, configs, run_config, sections, timeout_s):
    """The main of a bench that runs each configuration in a fresh Python process (its own peak
    memory; nothing one configuration patches or compiles leaks into the next). Parses --out and
    --configs (and the child's hidden --config / --result); a child runs run_config(config) and
    writes its dict; the parent runs `script` once a configuration (printing each one's
    training_steps line or error), then writes sections({config: result dict, or {"config",
    "error"}}) as <family>'s results. Returns the exit code: 1 without a GPU or where a
    configuration failed."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="results folder: <out>/<gpu>/<family>.md|json and <out>/history.csv")
    parser.add_argument("--configs", nargs="+", choices=configs, default=list(configs))
    parser.add_argument("--config", choices=configs, help=argparse.SUPPRESS)  # one configuration, in a child
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU here; the benchmark needs one (the tests run without).", file=sys.stderr)
        return 1
    if args.config:
        result = run_config(args.config)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for config in args.configs:
            r = results[config] = _child(script, config, folder, timeout_s)
            print(f"{config:16s} " + (f"FAILED: {r['error']}" if "error" in r else step_line(r)), flush=True)
    print(write_results(args.out, family, f"python bench/{os.path.basename(script)}", sections(results)))
    return 1 if any("error" in r for r in results.values()) else 0


def training_steps(loss_fn, optimizer, warmup, steps, tokens):
    """A training run's timings: `warmup` then `steps` steps of loss_fn() (the loss), backward,
    optimizer.step(), zero_grad; each timed step between CUDA events and synchronised after (a
    loop that logs its loss does so). Returns {"step ms" (median), "step ms all", "tokens/s"
    (`tokens` a step), "peak GiB" (torch.cuda.max_memory_allocated over the timed steps, reset
    after the warm-up), "warm-up s", "losses" (every step's)}."""
    def step():
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    losses, times_ms = [], []
    first = time.perf_counter()
    for _ in range(warmup):
        losses.append(step().item())
    warmup_s = time.perf_counter() - first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        start.record()
        loss = step()
        end.record()
        torch.cuda.synchronize()
        times_ms.append(start.elapsed_time(end))
        losses.append(loss.item())
    median = statistics.median(times_ms)
    return {"step ms": median, "step ms all": times_ms, "tokens/s": tokens / (median / 1e3),
            "peak GiB": torch.cuda.max_memory_allocated() / 2**30, "warm-up s": warmup_s, "losses": losses}


def step_line(r):
    """One printed line of a training_steps result."""
    return (f"step {r['step ms']:8.2f} ms  {r['tokens/s']:9.0f} tok/s  peak {r['peak GiB']:6.2f} GiB  losses "
            + " ".join(f"{x:.4f}" for x in r["losses"]))


def _child(script, config, folder, timeout_s):
    """Run one configuration of `script` in a fresh process; its result dict, or {"config", "error"}."""
    path = os.path.join(folder, f"{config}.json")
    command = [sys.executable, os.path.abspath(script), "--config", config, "--result", path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"config": config, "error": f"timed out after {timeout_s} s"}
    if done.returncode != 0 or not os.path.exists(path):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"config": config, "error": f"exit {done.returncode}: " + " | ".join(tail)}
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------- results

def gpu_key(name=None):
    """The results folder of a GPU model: h100, h200, else the lower-cased name as a slug."""
    name = name or torch.cuda.get_device_name()
    return GPU_KEYS.get(name) or re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def device_name():
    props = torch.cuda.get_device_properties(0)
    return f"{props.name} ({props.multi_processor_count} SMs, torch {torch.__version__})"


def commit():
    """$RAWOPS_COMMIT, else the checkout's short HEAD, else "unknown"."""
    if os.environ.get("RAWOPS_COMMIT"):
        return os.environ["RAWOPS_COMMIT"]
    try:
        done = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def results_dir(out_dir, gpu=None):
    """<out>/<gpu>, created."""
    path = os.path.join(out_dir, gpu or gpu_key())
    os.makedirs(path, exist_ok=True)
    return path


def write_results(out_dir, family, command, sections):
    """sections: [(title, header, rows, notes)], rows being dicts keyed by (at least) the header
    and HISTORY_KEYS. Writes <out>/<gpu>/<family>.md and .json, appends the rows to
    <out>/history.csv, and returns the markdown."""
    meta = {"device": device_name(), "gpu": gpu_key(), "commit": commit(), "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return write_meta_results(out_dir, family, meta, sections)


def write_meta_results(out_dir, family, meta, sections):
    """write_results with the run's meta given (device, gpu, commit, command, date ...)."""
    folder = results_dir(out_dir, meta["gpu"])
    text = render(meta, sections)
    with open(os.path.join(folder, f"{family}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, f"{family}.json"), "w") as f:
        json.dump({"meta": meta, "sections": [{"title": t, "notes": n, "rows": r} for t, _, r, n in sections]}, f,
                  indent=1)
    append_history(out_dir, meta, [row for _, _, rows, _ in sections for row in rows])
    return text


def render(meta, sections):
    """The markdown of a results file: the meta as a list, then one table per section."""
    lines = [f"- {k}: {v}" for k, v in meta.items()]
    for title, header, rows, notes in sections:
        lines += ["", f"## {title}", "", *[f"- {k}: {v}" for k, v in notes.items()], "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_fmt(row.get(h)) for h in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def history_rows(meta, rows):
    """The history.csv lines (dicts keyed by HISTORY_COLUMNS) of a run's rows."""
    date = meta["date"].replace(" UTC", "")
    lines = []
    for row in rows:
        missing = [k for k in HISTORY_KEYS if k not in row]
        if missing:
            print(f"bench: row {row.get('op', row)!r} lacks {missing}: not in {HISTORY}", file=sys.stderr)
            continue
        us, torch_us = _number(row["rawops us"]), _number(row["torch us"])
        if us is None:
            continue
        lines.append({"gpu": meta["gpu"], "commit": meta["commit"], "date": date, "op": row["op"],
                      "dtype": row["dtype"], "shape": row["shape"], "us": f"{us:.3f}",
                      "torch_us": "" if torch_us is None else f"{torch_us:.3f}",
                      "ratio_vs_torch": "" if torch_us is None else f"{torch_us / us:.4f}"})
    return lines


def append_history(out_dir, meta, rows):
    """Append a run's rows to <out>/history.csv (its header written first if the file is new)."""
    path = os.path.join(out_dir, HISTORY)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path, newline="") as f:
            header = next(csv.reader(f), None)
        if header != HISTORY_COLUMNS:
            raise ValueError(f"{path}: columns {header}, expected {HISTORY_COLUMNS}")
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, HISTORY_COLUMNS, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(history_rows(meta, rows))


def _number(value):
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        # tenths of the hundreds: the ~1% effects the elementwise rows are judged on show
        return f"{value:.3g}" if value < 100 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)
