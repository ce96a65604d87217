import sys, torch, cupy, rawops
from rawops import _gemm_tf32 as tf
torch.backends.cuda.matmul.allow_tf32 = True
def t(fn, n=20):
    for _ in range(3): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); out.append(s.elapsed_time(e) * 1e3)
    out.sort(); return out[len(out) // 2]
for m, k, n in [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 768, 3072)]:
    a = torch.randn(m, k, device="cuda"); b = torch.randn(k, n, device="cuda")
    ca, cb = cupy.from_dlpack(a), cupy.from_dlpack(b)
    ref = a.double() @ b.double()
    res = {}
    for hop in (True, False):
        tf.HOPPER = hop; tf._plans.clear()
        c = rawops.matmul(ca, cb, tf32=True); torch.cuda.synchronize()
        err = ((torch.from_dlpack(c).double() - ref).norm() / ref.norm()).item()
        us = t(lambda: rawops.matmul(ca, cb, tf32=True))
        res[hop] = (us, err)
    tus = t(lambda: a @ b)
    terr = (((a @ b).double() - ref).norm() / ref.norm()).item()
    fl = 2 * m * n * k
    print(f"{m}x{k}x{n} nn: hopper {res[True][0]:.0f} us {fl/res[True][0]/1e6:.0f} TFLOP/s err {res[True][1]:.2e} | "
          f"mma.sync {res[False][0]:.0f} us err {res[False][1]:.2e} | torch {tus:.0f} us {fl/tus/1e6:.0f} TFLOP/s err {terr:.2e}"
          f" | x torch {tus/res[True][0]:.3f}", flush=True)
