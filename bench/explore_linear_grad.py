"""Where a small linear_gelu training step's host time goes (32x768->3072, float32, x, weight
and bias requiring grad): the forward under autograd, forward + backward, and the pieces of
rawops' autograd path, each timed alone on the host, beside torch eager's; then forward +
backward by event pair (bench_matmul's row), both sides interleaved.

    python bench/explore_linear_grad.py [--out bench/results]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from timing import device_times_us, host_times_us, start, write_results  # noqa: E402

F = torch.nn.functional
M, K, N = 32, 768, 3072


def main():
    started = start(__doc__.splitlines()[0])
    if started is None:
        return 1
    out_dir, _ = started
    import importlib

    from rawops import torch_adapter as ta
    mm = importlib.import_module("rawops.matmul")  # rawops.matmul is also the op's name

    x = torch.randn(M, K, device="cuda").requires_grad_()
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).requires_grad_()
    b = torch.randn(N, device="cuda").requires_grad_()
    dy = torch.randn(M, N, device="cuda")
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    with torch.no_grad():
        pre = F.linear(xd, wd, bd)
    dpre = torch.randn(M, N, device="cuda")
    dx, dweight = torch.empty_like(xd), torch.empty_like(wd)
    code = 0  # float32
    c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, ta._LinearGELU)

    def step(fn):
        def run():
            fn().backward(dy)
        return run

    whole = {"rawops fwd (grad)": lambda: ta.linear_gelu(x, w, b),
             "torch eager fwd (grad)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
             "rawops fwd+bwd": step(lambda: ta.linear_gelu(x, w, b)),
             "torch eager fwd+bwd": step(lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
             "rawops fwd (grad), C++ apply": lambda: c_apply(x, w, b, "tanh"),
             "rawops fwd+bwd, C++ apply": step(lambda: c_apply(x, w, b, "tanh"))}
    parts = {"_linear_gelu_fwd (y and pre, no autograd)": lambda: ta._linear_gelu_fwd(xd, wd, bd, "tanh", True),
             "_linear_gelu_bwd (dx, dW, db)": lambda: ta._linear_gelu_bwd(dy, xd, wd, bd, pre, "tanh"),
             "_bias_gelu_bwd_fused (dpre, db)": lambda: ta._bias_gelu_bwd_fused(dy, pre, None, "tanh"),
             "_gemm nn (dx)": lambda: ta._gemm(0, "nn", code, dpre.data_ptr(), wd.data_ptr(), dx.data_ptr(), M, K, N),
             "_gemm tn (dW)": lambda: ta._gemm(0, "tn", code, dpre.data_ptr(), xd.data_ptr(), dweight.data_ptr(),
                                               N, K, M),
             "_linear_operands": lambda: ta._linear_operands(xd, wd, bd),
             "torch.empty(shape, dtype, device)": lambda: torch.empty((M, N), dtype=xd.dtype, device=xd.device),
             "x.new_empty(shape)": lambda: xd.new_empty((M, N)),
             "torch.empty_like(x)": lambda: torch.empty_like(xd),
             "torch eager: gelu_backward": lambda: torch.ops.aten.gelu_backward(dy, pre, approximate="tanh"),
             "torch eager: dpre @ w": lambda: dpre @ wd, "torch eager: dpre.t() @ x": lambda: dpre.t() @ xd,
             "torch eager: dpre.sum(0)": lambda: dpre.sum(0)}
    def device_block():
        with torch.cuda.device(0):
            pass
    parts["with torch.cuda.device(0): pass"] = device_block
    host = host_times_us({**whole}, calls=300, rounds=7)
    with torch.no_grad():
        host.update(host_times_us(parts, calls=300, rounds=7))
    plan = mm._launch_plan("nn", code, M, K, N, dpre.data_ptr(), wd.data_ptr(), 0, 0, dx.data_ptr(), 0)
    plan_tn = mm._launch_plan("tn", code, N, K, M, dpre.data_ptr(), xd.data_ptr(), 0, 0, dweight.data_ptr(), 0)
    rows = [{"call": label, "host us": us} for label, us in host.items()]
    for row in rows:
        print(row, flush=True)
    pairs = device_times_us({key: whole[key] for key in ("rawops fwd+bwd", "torch eager fwd+bwd",
                                                          "rawops fwd+bwd, C++ apply")})
    pair_rows = [{"call": label, "event pair a call us": us} for label, us in pairs.items()]
    for row in pair_rows:
        print(row, flush=True)
    write_results(out_dir, "explore_linear_grad", "python bench/explore_linear_grad.py", [
        (f"linear_gelu {M}x{K}->{N} float32 with grad: host time per call", ["call", "host us"], rows,
         {"plans": f"dx: splits {plan[4]}, grid {plan[1]}; dW: splits {plan_tn[4]}, grid {plan_tn[1]}"}),
        ("forward + backward by event pair (made beforehand), interleaved", ["call", "event pair a call us"],
         pair_rows, {})])
    return 0


if __name__ == "__main__":
    sys.exit(main())
