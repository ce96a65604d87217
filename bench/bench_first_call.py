"""First-call latency (issue 29, item 7): rawops against Liger-Kernel, each op timed in a fresh Python
process from just before the library's import to the end of its first call, synchronised.

Ops, at small language-model shapes (bf16, 512 tokens): cross_entropy (512 x 32000 logits), rms_norm
(512 x 2048), swiglu (512 x 5632), rope (q 1 x 512 x 16 x 128, k 8 heads, "neox") and fused linear
cross-entropy (512 x 2048 hidden, 32000 x 2048 weight; rawops' only where it is in the tree). Each
child process: imports torch, creates the CUDA context and the inputs, runs one autograd backward
(torch's own first-use costs, the same for both libraries), then times, host clock, synchronising
after each: the library's import, its first forward call, the first backward through it, and a
second forward + backward. rawops ships its kernels compiled (fatbins loaded at first use); Liger
compiles its Triton kernels at their first call and caches them on disk: it runs twice per op, with
an empty TRITON_CACHE_DIR (cold: what a new machine or container sees) and again with the cache the
first run filled (warm). rawops runs twice too (the second with the OS file cache warm).

Bar: rawops' first call (after its import) in milliseconds, not seconds; its import time is listed
beside it (torch.library registrations and the CuPy import happen there).

    python bench/bench_first_call.py [--out bench/results] [--ops ...] [--libs rawops liger]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = ("cross_entropy", "rms_norm", "swiglu", "rope", "fused_linear_cross_entropy")
LIBS = ("rawops", "liger")
TOKENS, VOCAB, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 512, 32000, 2048, 5632, 16, 8, 128
CHILD_TIMEOUT_S = 240
FIRST_CALL_BAR_MS = 100.0


# ------------------------------------------------------------------- one measurement (child process)
def _inputs(torch, op):
    """(leaf tensors, the other arguments, the gradients of the op's outputs (None: a scalar loss))."""
    cuda, bf16 = "cuda", torch.bfloat16

    def leaf(*shape):
        return torch.randn(*shape, device=cuda, dtype=bf16).requires_grad_()

    if op == "cross_entropy":
        return (leaf(TOKENS, VOCAB),), (torch.randint(0, VOCAB, (TOKENS,), device=cuda),), None
    if op == "rms_norm":
        return (leaf(TOKENS, HIDDEN), leaf(HIDDEN)), (), (torch.randn(TOKENS, HIDDEN, device=cuda, dtype=bf16),)
    if op == "swiglu":
        return (leaf(TOKENS, FFN), leaf(TOKENS, FFN)), (), (torch.randn(TOKENS, FFN, device=cuda, dtype=bf16),)
    if op == "rope":
        angles = torch.randn(1, TOKENS, HEAD_DIM, device=cuda)
        grads = (torch.randn(1, TOKENS, HEADS, HEAD_DIM, device=cuda, dtype=bf16),
                 torch.randn(1, TOKENS, KV_HEADS, HEAD_DIM, device=cuda, dtype=bf16))
        return (leaf(1, TOKENS, HEADS, HEAD_DIM), leaf(1, TOKENS, KV_HEADS, HEAD_DIM)), (
            angles.cos().to(bf16), angles.sin().to(bf16)), grads
    if op == "fused_linear_cross_entropy":
        return (leaf(TOKENS, HIDDEN), leaf(VOCAB, HIDDEN)), (torch.randint(0, VOCAB, (TOKENS,), device=cuda),), None
    raise ValueError(op)


def _load(lib, op):
    """Import the library's op: a callable (leaves..., others...) -> the output(s) to backpropagate."""
    if lib == "rawops":
        if op == "fused_linear_cross_entropy":
            from rawops.torch_adapter._losses_linear import fused_linear_cross_entropy as f

            return lambda x, w, t: f(x, w, t)
        import rawops.torch_adapter as ta

        return {"cross_entropy": lambda x, t: ta.cross_entropy(x, t),
                "rms_norm": lambda x, w: ta.rms_norm(x, (HIDDEN,), w, 1e-6),
                "swiglu": lambda g, u: ta.swiglu(g, u),
                "rope": lambda q, k, cos, sin: ta.rope(q.clone(), k.clone(), cos, sin, "neox", "bshd")}[op]
    from liger_kernel.transformers import functional as lf

    # Liger's rope takes HF's (B, H, S, D) views of (B, S, H, D) memory, as LlamaAttention hands it
    return {"cross_entropy": lambda x, t: lf.liger_cross_entropy(x, t),
            "rms_norm": lambda x, w: lf.liger_rms_norm(x, w, 1e-6),
            "swiglu": lambda g, u: lf.liger_swiglu(g, u),
            "rope": lambda q, k, cos, sin: lf.liger_rope(q.clone().transpose(1, 2), k.clone().transpose(1, 2), cos,
                                                         sin),
            "fused_linear_cross_entropy": lambda x, w, t: lf.liger_fused_linear_cross_entropy(x, w, t)}[op]


def measure(lib, op):
    """The child's timings, ms (host clock, synchronised)."""
    t0 = time.perf_counter()
    import torch

    torch.cuda.init()
    leaves, others, grads = _inputs(torch, op)
    if lib == "liger" and op == "rope":
        grads = tuple(g.transpose(1, 2) for g in grads)
    warm = torch.ones(8, device="cuda", requires_grad=True)
    # autograd's engine and its device threads started, and torch.autograd.backward's first call with
    # explicit gradients (its _make_grads imports torch.fx's symbolic shapes, i.e. sympy: seconds
    # without a bytecode cache): torch's costs, not the op's
    (warm * 2).sum().backward()
    torch.autograd.backward(warm * 2, torch.ones_like(warm))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    fn = _load(lib, op)
    t2 = time.perf_counter()

    def forward():
        out = fn(*leaves, *others)
        return out if isinstance(out, tuple) else (out,)

    def backward(outs):
        torch.autograd.backward(outs, grads)

    outs = forward()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    backward(outs)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    for t in leaves:
        t.grad = None
    backward(forward())
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    ms = 1e3
    return {"setup ms": (t1 - t0) * ms, "import ms": (t2 - t1) * ms, "first call ms": (t3 - t2) * ms,
            "import + first call ms": (t3 - t1) * ms, "first backward ms": (t4 - t3) * ms,
            "second fwd+bwd ms": (t5 - t4) * ms}


# ------------------------------------------------------------------- the run (parent process)
def child(lib, op, env):
    command = [sys.executable, os.path.abspath(__file__), "--child", lib, op]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-2:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def runs(lib):
    """(process label, environment) of each fresh process a library gets, in order."""
    env = dict(os.environ)
    if lib == "rawops":
        return [("first process", env), ("second process", env)]
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    env["TRITON_CACHE_DIR"] = cache
    return [("cold Triton cache", env), ("warm Triton cache", env)]


HEADER = ["op", "library", "process", "import ms", "first call ms", "import + first call ms", "first backward ms",
          "second fwd+bwd ms", "setup ms", "meets target", "notes"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="results folder: <out>/<gpu>/first_call.md|json and <out>/history.csv")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--libs", nargs="+", choices=LIBS, default=list(LIBS))
    parser.add_argument("--child", nargs=2, metavar=("LIB", "OP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench: no CUDA GPU here; the benchmark needs one (the tests run without).", file=sys.stderr)
        return 1
    rows = []
    for op in args.ops:
        for lib in args.libs:
            for process, env in runs(lib):
                r = child(lib, op, env)
                row = {"op": f"first_call_{op} (host)", "dtype": "bf16", "shape": f"{TOKENS} tokens",
                       "library": lib, "process": process, "rawops us": None, "torch us": None,
                       "notes": r.get("error", ""), **{k: v for k, v in r.items() if k != "error"}}
                if lib == "rawops" and "first call ms" in r:
                    row["meets target"] = r["first call ms"] < FIRST_CALL_BAR_MS
                    if process == "first process":  # the history line: import + first call, host us
                        row["rawops us"] = r["import + first call ms"] * 1e3
                rows.append(row)
                if "error" in r:
                    print(f"{op:27s} {lib:7s} {process:18s} FAILED: {r['error']}", flush=True)
                else:
                    print(f"{op:27s} {lib:7s} {process:18s} import {r['import ms']:8.1f} ms  first call "
                          f"{r['first call ms']:8.1f} ms  first backward {r['first backward ms']:8.1f} ms  second "
                          f"{r['second fwd+bwd ms']:7.2f} ms", flush=True)
    sys.path.insert(0, HERE)
    from timing import write_results

    text = write_results(args.out, "first_call", "python bench/bench_first_call.py", [
        ("First-call latency, fresh process per row, host clock", HEADER, rows,
         {"shapes": f"{TOKENS} tokens, bf16: cross_entropy {TOKENS}x{VOCAB}; rms_norm {TOKENS}x{HIDDEN}; swiglu "
                    f"{TOKENS}x{FFN}; rope q {HEADS} / k {KV_HEADS} heads x {HEAD_DIM}; fused linear cross-entropy "
                    f"{TOKENS}x{HIDDEN} x {VOCAB}x{HIDDEN}",
          "import + first call": "from before the library's import to the end of its first forward, synchronised "
                                 "(torch imported and the CUDA context created before: 'setup ms')",
          "target": f"rawops' first call (after import) < {FIRST_CALL_BAR_MS:.0f} ms",
          "liger": "Triton compiles at the first call; cold = empty TRITON_CACHE_DIR, warm = the cache that run "
                   "filled"}),
    ])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
