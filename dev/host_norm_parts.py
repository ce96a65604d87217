"""Host time of each step of the norm adapter's forward and backward (issue 26 item 3): each piece in a
loop of 2000 calls, microseconds a call, the GPU kept busy so no launch waits.

    python dev/host_norm_parts.py
"""
import sys
import time

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("dev")]
import torch  # noqa: E402

from rawops import _modules, _rows, norm as _norm  # noqa: E402
from rawops._launch import sm_count  # noqa: E402
from rawops import torch_adapter as ta  # noqa: E402
from rawops.torch_adapter import _common, norm as tn  # noqa: E402


def per_call_us(fn, n=2000):
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def main():
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y, mean, rstd = tn.forward("rms_norm", x, w, None, 1e-6)
    dev = x.get_device()
    code = tn._rows_of(x)[0]
    strides = (4096, 4096, 4096)
    plan = _norm.backward_plan(16384, 4096, 2, sm_count(dev), dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                               y.data_ptr(), strides)
    partial = torch.empty((plan[3], 4096), dtype=torch.float32, device="cuda")
    dweight = torch.empty(4096, dtype=torch.bfloat16, device="cuda")
    dx = torch.empty_like(x)
    pieces = {
        "row_strided(x)": lambda: tn.row_strided(x),
        "_rows_of(x)": lambda: tn._rows_of(x),
        "dense(w)": lambda: _common.dense(w),
        "_row_vector(w)": lambda: tn._row_vector(w, "weight", x),
        "check_eps": lambda: _norm.check_eps(1e-6, code),
        "new_empty(x.shape)": lambda: x.new_empty(x.shape),
        "torch.empty(stats f32)": lambda: torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device),
        "x.get_device()": lambda: x.get_device(),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.device": lambda: x.device,
        "current_device()": lambda: torch.cuda.current_device(),
        "raw_stream(dev)": lambda: _common.raw_stream(dev),
        "_rows.vectors": lambda: _rows.vectors(4096, 2, x.data_ptr(), w.data_ptr(), 0, y.data_ptr(),
                                               strides=(4096, 4096)),
        "forward_plan": lambda: _norm.forward_plan(16384, 4096, 2, True),
        "function_pointer": lambda: _modules.function_pointer("norm", "rms_norm_fwd_bf16", dev),
        "sm_count(dev)": lambda: sm_count(dev),
        "launch_forward (1 launch)": lambda: _norm.launch_forward("rms_norm", dev, code, 2, x.data_ptr(), w.data_ptr(),
                                                                  0, y.data_ptr(), 0, rstd.data_ptr(), 16384, 4096,
                                                                  1e-6, _common.raw_stream(dev), 4096, 4096),
        "tn.forward (whole)": lambda: tn.forward("rms_norm", x, w, None, 1e-6),
        "backward_plan": lambda: _norm.backward_plan(16384, 4096, 2, sm_count(dev), dy.data_ptr(), x.data_ptr(),
                                                     w.data_ptr(), y.data_ptr(), strides),
        "_stats(rstd)": lambda: tn._stats(rstd, "rstd", x),
        "launch_backward (2 launches)": lambda: _norm.launch_backward(
            "rms_norm", dev, code, 2, dy.data_ptr(), x.data_ptr(), w.data_ptr(), 0, rstd.data_ptr(), dx.data_ptr(),
            partial.data_ptr(), 0, dweight.data_ptr(), 0, 16384, 4096, plan, _common.raw_stream(dev), strides),
        "tn.backward (whole)": lambda: tn.backward("rms_norm", dy, x, w, mean, rstd, True, False),
        "torch F.rms_norm (no grad)": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
        "ta.gelu (no grad, C-level entry)": lambda: ta.gelu(x),
        "ta.rms_norm (no grad)": lambda: ta.rms_norm(x, (4096,), w, 1e-6),
    }
    for name, fn in pieces.items():
        fn()
        print(f"{name:32s} {per_call_us(fn, 200 if 'launch' in name or 'whole' in name else 2000):8.2f} us",
              flush=True)


if __name__ == "__main__":
    main()
