"""Timing and reporting shared by the benchmarks: CUDA events, warm-up, medians, the copy
ceiling, and results written as markdown + JSON (+ PNG) under bench/results/."""
import json
import os
import statistics
import time

import torch


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


def graph_per_call_us(fn, calls=20, reps=50):
    """Device time per call of fn in a CUDA graph of `calls` calls (no host time)."""
    def burst():
        for _ in range(calls):
            fn()
    return device_time_us(graphed(burst), reps=reps) / calls


def switched(module, name, value, fn):
    """fn with module.<name> set to value around each call (restored after, also on an error):
    a library switch (a routing flag, a kernel choice) timed beside the default in one run."""
    def call():
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, saved)
    return call


def event_pairs(reps, stream):
    """reps (start, end) timing events, each recorded once on `stream` already: torch creates a
    CUDA event at its first record(), and record() without a stream asks for the current one,
    so a fresh pair timed `record(); fn(); record()` counts an event creation and a stream
    query of the host inside the interval (an empty pair measured 12-35 us on lent H100 hosts,
    bench/results/explore_linear_call.md). Record the returned pairs on the same stream."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        start.record(stream)
        end.record(stream)
    torch.cuda.synchronize()
    return pairs


def device_time_us(fn, warmup=10, reps=50):
    """Median device time of fn() in microseconds, one event pair around each call."""
    for _ in range(warmup):
        fn()
    stream = torch.cuda.current_stream()
    pairs = event_pairs(reps, stream)
    for start, end in pairs:
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)


def device_times_us(fns, warmup=10, reps=20, rounds=5):
    """{name: median device time in us} of each callable (one event pair around each call),
    measured in interleaved rounds (A, B, A, B, ...) so that drift in the host's or the GPU's
    speed during the run falls on every candidate alike: timed one after the other, a small
    call's row moved by 30% between runs on the same machine (bench/NOTES.md)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            events = event_pairs(reps, stream)
            fn()  # once more after the other candidates' calls
            for start, end in events:
                start.record(stream)
                fn()
                end.record(stream)
            torch.cuda.synchronize()
            samples[name] += [s.elapsed_time(e) * 1e3 for s, e in events]
    return {name: statistics.median(values) for name, values in samples.items()}


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
    interleaved rounds (A, B, C, A, B, C, ...) so that drift in the host's speed, which is
    large on a shared VM, falls on every candidate alike. The GPU keeps up with tiny launches."""
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


def copy_ceiling_tbps(nbytes=1 << 30):
    """Device-to-device copy bandwidth, bytes read + written, TB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = device_time_us(lambda: dst.copy_(src), reps=30)
    return 2 * nbytes / us / 1e6


def start(description):
    """The common start of a benchmark script: (--out folder, copy ceiling), or None with a
    one-line message when there is no GPU."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU here; the benchmark needs one (the tests run without).", file=sys.stderr)
        return None
    ceiling = copy_ceiling_tbps()
    print(f"copy ceiling: {ceiling:.3f} TB/s", flush=True)
    return args.out, ceiling


def device_name():
    props = torch.cuda.get_device_properties(0)
    return f"{props.name} ({props.multi_processor_count} SMs, torch {torch.__version__})"


def write_results(out_dir, stem, command, sections):
    """sections: [(title, header, rows, notes)], rows being dicts keyed by the header.
    Writes <stem>.md and <stem>.json under out_dir and returns the markdown."""
    os.makedirs(out_dir, exist_ok=True)
    meta = {"device": device_name(), "command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    lines = [f"- {k}: {v}" for k, v in meta.items()]
    for title, header, rows, notes in sections:
        lines += ["", f"## {title}", "", *[f"- {k}: {v}" for k, v in notes.items()], "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_fmt(row[h]) for h in header) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump({"meta": meta, "sections": [{"title": t, "notes": n, "rows": r} for t, _, r, n in sections]}, f,
                  indent=1)
    return text


def _fmt(value):
    if isinstance(value, float):
        # tenths of the hundreds: the ~1% effects the elementwise rows are judged on show
        return f"{value:.3g}" if value < 100 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)
