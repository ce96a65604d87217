"""rawops.torch_adapter: the same kernels for torch tensors, with autograd, torch.compile,
CUDA graphs and modules; checked against torch in float64."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from rawops import torch_adapter as ta  # noqa: E402
from gpu_reference import DTYPES, assert_close, poison_torch_pool, random, written_late  # noqa: E402

ALPHA = 1.7

# name -> (rawops adapter call, torch reference, shapes of the inputs from x's shape)
OPS = {
    "gelu_tanh": (lambda x: ta.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), 1),
    "gelu_erf": (lambda x: ta.gelu(x, "none"), F.gelu, 1),
    "relu": (ta.relu, F.relu, 1),
    "relu_scale": (lambda x: ta.relu_scale(x, ALPHA), lambda x: F.relu(x) * ALPHA, 1),
    "relu_scale_add": (lambda x, y: ta.relu_scale_add(x, ALPHA, y), lambda x, y: F.relu(x) * ALPHA + y, 2),
    "add": (ta.add, torch.add, 2),
    "bias_gelu_tanh": (lambda x, b: ta.bias_gelu(x, b, "tanh"), lambda x, b: F.gelu(x + b, approximate="tanh"), "bias"),
    "bias_gelu_erf": (lambda x, b: ta.bias_gelu(x, b, "none"), lambda x, b: F.gelu(x + b), "bias"),
}


def _inputs(kind, shape, dtype):
    if kind == "bias":
        return [random(shape, dtype), random(shape[-1:], dtype)]
    return [random(shape, dtype) for _ in range(kind)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape", [(67, 129), (3, 67, 128)])  # bias_gelu's backward: unfused, fused
def test_forward_and_backward_match_torch_float64(name, dtype, shape):
    call, reference, kind = OPS[name]
    inputs = [t.requires_grad_() for t in _inputs(kind, shape, DTYPES[dtype])]
    nbytes = inputs[0].numel() * inputs[0].element_size()
    poison_torch_pool(nbytes)  # the output comes from torch's allocator: unwritten elements are NaN
    out = call(*inputs)
    dy = random(out.shape, DTYPES[dtype])
    poison_torch_pool(nbytes, shape[-1] * inputs[0].element_size())  # dx, and dbias where there is one
    grads = torch.autograd.grad(out, inputs, dy)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    expected = reference(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, dy.double())
    assert out.dtype == DTYPES[dtype] and out.is_cuda
    assert_close(out.detach(), expected.detach(), DTYPES[dtype], f"{name} forward")
    for i, (g, e) in enumerate(zip(grads, expected_grads, strict=True)):
        assert_close(g, e, DTYPES[dtype], f"{name} grad of input {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(OPS))
def test_no_grad_fast_path_equals_autograd_path(name):
    call, _, kind = OPS[name]
    inputs = _inputs(kind, (31, 65), torch.float32)
    with torch.no_grad():
        fast = call(*inputs)
    slow = call(*[t.clone().requires_grad_() for t in inputs])
    assert fast.grad_fn is None and slow.grad_fn is not None
    assert torch.equal(fast, slow.detach())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_erf", "relu_scale_add", "bias_gelu_tanh"])
def test_gradcheck(name):
    call, _, kind = OPS[name]
    # float32 kernels: finite differences with a float32-sized step, inputs away from relu's kink.
    inputs = []
    for t in _inputs(kind, (5, 7), torch.float32):
        t = t + torch.sign(t) * 0.2
        inputs.append(t.requires_grad_())
    assert torch.autograd.gradcheck(call, inputs, eps=1e-2, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_torch_compile_fullgraph_forward_and_backward():
    def block(x, bias, y):
        return ta.relu_scale_add(ta.bias_gelu(x, bias, "tanh"), 0.5, y)

    compiled = torch.compile(block, fullgraph=True)
    x, bias, y = random((64, 96), torch.float32), random((96,), torch.float32), random((64, 96), torch.float32)
    leaves = [t.clone().requires_grad_() for t in (x, bias, y)]
    out = compiled(*leaves)
    out.sum().backward()
    ref_leaves = [t.double().requires_grad_() for t in (x, bias, y)]
    ref = F.relu(F.gelu(ref_leaves[0] + ref_leaves[1], approximate="tanh")) * 0.5 + ref_leaves[2]
    ref.sum().backward()
    assert_close(out.detach(), ref.detach(), torch.float32, "compiled forward")
    for got, want in zip(leaves, ref_leaves):
        assert_close(got.grad, want.grad, torch.float32, "compiled backward")


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    x = random((1 << 16,), torch.float16)
    bias_x = random((256, 256), torch.float16)
    bias = random((256,), torch.float16)
    # warm-up: load modules outside capture
    ta.gelu(x, approximate="tanh"), ta.bias_gelu(bias_x, bias, approximate="tanh")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ta.gelu(x, approximate="tanh")
        z = ta.bias_gelu(bias_x, bias, approximate="tanh")
    for _ in range(2):
        x.copy_(random(x.shape, torch.float16))
        bias_x.copy_(random(bias_x.shape, torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(y, F.gelu(x.double(), approximate="tanh"), torch.float16, "graph replay gelu")
        assert_close(z, F.gelu(bias_x.double() + bias.double(), approximate="tanh"), torch.float16, "replay bias")


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k, n", [(32, 768, 3072), (256, 768, 3072), (64, 3072, 768)])
def test_linear_gelu_capture_and_replay_on_every_route(rows, k, n):
    """No-grad linear_gelu captured in a CUDA graph: the small-batch kernel (32 rows), the
    Hopper GEMM's narrow tiles through the typed path (256 rows on sm_90) and a K-split plan
    through the full path (64 x 3072 -> 768 on sm_90: scratch from torch's graph pool)."""
    x = random((rows, k), torch.bfloat16)
    w, b = random((n, k), torch.bfloat16, k ** -0.5), random((n,), torch.bfloat16)
    ta.linear_gelu(x, w, b, approximate="tanh")  # warm-up: load modules and build tensor maps outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y = ta.linear_gelu(x, w, b, approximate="tanh")
    for _ in range(2):
        x.copy_(random(x.shape, torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = F.gelu(F.linear(x.double(), w.double(), b.double()), approximate="tanh")
        assert_close(y, ref, torch.bfloat16, f"graph replay linear_gelu {rows}x{k}->{n}")


@pytest.mark.gpu
def test_launches_on_torch_current_stream():
    source = random((1 << 22,), torch.bfloat16)
    side = torch.cuda.Stream()
    x = written_late(source, side)  # NaN unless the launch waits behind `side`'s work
    with torch.cuda.stream(side):
        y = ta.relu_scale(x, 3.0)
    side.synchronize()
    assert_close(y, F.relu(source.double()) * 3.0, torch.bfloat16, "side stream")


@pytest.mark.gpu
def test_fast_paths_from_a_thread_that_never_touched_cuda():
    # The no-grad paths ask the driver which GPU the thread's context is on; a new thread has no
    # context until something makes one current (the device guard, or _launch's retry).
    import threading

    x, w, b = random((32, 256), torch.float32), random((384, 256), torch.float32), random((384,), torch.float32)
    results, errors = [], []

    def calls():
        try:
            results.extend([ta.gelu(x, "tanh"), ta.linear_gelu(x, w, b, approximate="tanh"), ta.gelu(x, "none")])
        except Exception as error:  # reported below: a thread's exception would vanish
            errors.append(error)

    thread = threading.Thread(target=calls)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert not errors, errors
    x64 = x.double()
    assert_close(results[0], F.gelu(x64, approximate="tanh"), torch.float32, "thread gelu")
    assert_close(results[1], F.gelu(F.linear(x64, w.double(), b.double()), approximate="tanh"), torch.float32,
                 "thread linear_gelu")
    assert_close(results[2], F.gelu(x64), torch.float32, "thread gelu erf")


@pytest.mark.gpu
def test_modules_are_drop_in():
    x = random((8, 300), torch.float32)
    assert_close(ta.GELU()(x), torch.nn.GELU()(x.double()), torch.float32, "GELU")
    assert_close(ta.GELU("tanh")(x), torch.nn.GELU("tanh")(x.double()), torch.float32, "GELU tanh")
    assert_close(ta.ReLU()(x), torch.nn.ReLU()(x.double()), torch.float32, "ReLU")
    layer = ta.BiasGELU(300, device="cuda", approximate="tanh")
    with torch.no_grad():
        layer.bias.copy_(random((300,), torch.float32))
    assert_close(layer(x), F.gelu(x.double() + layer.bias.double(), approximate="tanh"), torch.float32, "BiasGELU")


@pytest.mark.gpu
def test_adapter_checks_arguments_on_the_gpu_and_takes_any_layout():
    x = random((10, 10), torch.float32)
    with pytest.raises(TypeError, match=r"^other has dtype torch.float16, expected torch.float32 like input"):
        ta.add(x, random((10, 10), torch.float16))
    with pytest.raises(ValueError, match=r"^other has shape \(10, 11\), expected \(10, 10\) like input"):
        ta.add(x, random((10, 11), torch.float32))
    assert_close(ta.gelu(x.t()), F.gelu(x.t().double()), torch.float32, "gelu of a transposed view")
    inplace = x.t().clone().t()  # a transposed layout, relu'd in place
    assert ta.relu(inplace, inplace=True) is inplace
    assert_close(inplace, F.relu(x.double()), torch.float32, "relu in place on a strided tensor")
    with pytest.raises(ValueError, match=r"^bias has shape \(9,\)"):
        ta.bias_gelu(x, random((9,), torch.float32), approximate="tanh")
    assert ta.gelu(random((0, 5), torch.float32), approximate="tanh").shape == (0, 5)


def test_adapter_refuses_cpu_and_integer_tensors():
    """Runs without a GPU too: the checks come before any launch."""
    with pytest.raises(ValueError, match="^input is on cpu"):
        ta.gelu(torch.ones(4))
    with pytest.raises(TypeError, match="^input has dtype torch.int32"):
        ta.relu(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="^input must be a torch.Tensor"):
        ta.relu([1.0, 2.0])
    with pytest.raises(TypeError, match="^inplace must be a bool"):
        ta.relu(torch.ones(4), inplace=1)
    with pytest.raises(ValueError, match="approximate"):
        ta.GELU("fast")


def test_entries_are_builtins_that_dynamo_traces_into_the_custom_ops_in_one_graph():
    """The public elementwise functions, linear_gelu and matmul are C-level entries (no Python frame on
    the eager path); torch.compile must still see the custom ops, in one graph, with torch._dynamo
    imported after the adapter (the polyfills register on that import). Runs in a fresh
    interpreter; the compiled graph is recorded, not run, so no GPU is needed."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, types, torch
        import rawops.torch_adapter as ta
        assert "torch._dynamo" not in sys.modules, "importing the adapter imported dynamo"
        from rawops.torch_adapter import _common
        assert len(_common._SUBSTITUTES) == 9  # six elementwise entries, linear_gelu, matmul, FusedMLP's call
        assert all(isinstance(entry, types.BuiltinFunctionType) for entry, _ in _common._SUBSTITUTES)
        graphs = []

        def backend(gm, inputs):
            graphs.append(gm)
            return lambda *args: (torch.zeros(4),)

        def fn(x, b, y, w):
            return (ta.gelu(x, "none") + ta.gelu(x) + ta.relu(x) + ta.relu_scale(x, 2.0)
                    + ta.relu_scale_add(x, 0.5, y) + ta.add(x, y) + ta.bias_gelu(x, b, "tanh")
                    + ta.linear_gelu(x[None], w, b, approximate="tanh")[0] + ta.matmul(x[None], w)[0])

        x, b, y, w = torch.randn(4), torch.randn(4), torch.randn(4), torch.randn(4, 4)
        torch.compile(fn, backend=backend, fullgraph=True)(x, b, y, w)
        ops = sorted(str(n.target) for n in graphs[0].graph.nodes if "rawops" in str(n.target))
        print(len(graphs), ops)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == ("1 ['rawops.add.default', 'rawops.bias_gelu.default', 'rawops.gelu.default', "
                                     "'rawops.gelu.default', 'rawops.linear_gelu.default', 'rawops.matmul.default', "
                                     "'rawops.relu.default', "
                                     "'rawops.relu_scale.default', 'rawops.relu_scale_add.default']"), result.stdout


def test_entries_send_grad_and_bad_modes_to_the_python_path(monkeypatch):
    """No GPU: a tensor that needs a gradient goes to the autograd path, a bad mode to the
    Python function's error, a CPU tensor to the launcher's check; each names its problem."""
    x = torch.randn(4)
    with pytest.raises(ValueError, match="approximate"):
        ta.gelu(x, "fast")
    with pytest.raises(ValueError, match="CUDA"):
        ta.gelu(x)
    with pytest.raises(ValueError, match="CUDA"):
        ta.relu_scale_add(x, 2.0, x)
    seen = []
    monkeypatch.setattr(ta.elementwise, "_gelu_c_apply", lambda *args: seen.append(args) or "autograd")
    assert ta.gelu(x.requires_grad_(), "tanh") == "autograd" and len(seen) == 1
    with torch.no_grad():
        with pytest.raises(ValueError, match="CUDA"):  # no grad needed: the launch path again
            ta.gelu(x)
    # linear_gelu's entry: the same routing to _linear_gelu_python
    w = torch.randn(3, 4)
    monkeypatch.setattr(ta.gemm, "_linear_gelu_apply", lambda *args: seen.append(args) or "autograd")
    assert ta.linear_gelu(x[None], w, None, "tanh") == "autograd" and len(seen) == 2
    with torch.no_grad():
        with pytest.raises(ValueError, match="CUDA"):
            ta.linear_gelu(x[None], w)
        with pytest.raises(ValueError, match="approximate"):
            ta.linear_gelu(x[None], w, None, "fast")


# ------------------------------------------------------------------------------ torch's signatures
F_COUNTERPARTS = ["gelu", "relu", "layer_norm", "rms_norm", "softmax", "log_softmax"]


def _torch_signature(function):
    """inspect.signature of a torch.nn.functional function; for a builtin without one, the
    signature its docstring opens with (`gelu(input, approximate = 'none') -> Tensor`)."""
    import ast
    import inspect

    try:
        return inspect.signature(function)
    except ValueError:
        first = next(line for line in function.__doc__.splitlines() if line.strip())
        parameters = first.strip().split("->")[0].strip()
        parameters = parameters[parameters.index("("):]
        namespace = {}
        exec(compile(ast.parse(f"def f{parameters}: pass"), "<signature>", "exec"), namespace)
        return inspect.signature(namespace["f"])


def _shape_of(signature):
    """(name, kind, default) of each parameter: annotations aside, what a caller can write."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize("name", F_COUNTERPARTS)
def test_functions_take_torch_nn_functional_signatures(name):
    """Replacing F.<name> by ta.<name> is a one-word change: same parameter names, kinds and
    defaults (torch's own annotations aside)."""
    import inspect

    ours = inspect.signature(getattr(ta, name))
    assert _shape_of(ours) == _shape_of(_torch_signature(getattr(F, name))), f"{name}{ours}"


def test_every_public_callable_has_an_inspectable_signature():
    """help() and editors show every function: the C-level entries carry text signatures."""
    import inspect

    import rawops

    for module in (ta, rawops):
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value) and not (isinstance(value, type) and issubclass(value, BaseException)):
                assert inspect.signature(value) is not None, f"{module.__name__}.{name}"
    assert list(inspect.signature(ta.matmul).parameters) == ["input", "other", "tf32"]
    assert list(inspect.signature(rawops.gelu).parameters) == ["x", "approximate", "out", "stream"]


def test_softmax_without_dim_warns_and_picks_torch_dim():
    """dim=None: torch's legacy choice (0 for 0-, 1- and 3-D inputs, else 1), with its warning;
    the check of the tensor comes after (a CPU tensor is still refused)."""
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        with pytest.raises(ValueError, match="^input is on cpu"):
            ta.softmax(torch.ones(2, 3))


# ------------------------------------------------------------------------------ any dim, any layout
def _layouts(shape, dtype):
    """The same values as a contiguous tensor, a transposed view, a stepped slice and an offset
    view: (name, tensor) pairs, each a fresh draw."""
    base = random(shape, dtype)
    wide = random((shape[0], shape[1] * 2 + 1), dtype)
    return [("contiguous", base), ("transposed", random(shape[::-1], dtype).t()),
            ("stepped", random((shape[0] * 2, shape[1]), dtype)[::2]), ("sliced columns", wide[:, 1:shape[1] + 1]),
            ("offset", random((shape[0] * shape[1] + 1,), dtype)[1:].view(shape))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_ops_give_torch_answer_on_every_layout(dtype):
    dt = DTYPES[dtype]
    for layout, x in _layouts((67, 130), dt):
        y = random(x.shape, dt)
        bias = random((130,), dt)
        assert_close(ta.gelu(x), F.gelu(x.double()), dt, f"gelu {layout}")
        assert_close(ta.relu(x), F.relu(x.double()), dt, f"relu {layout}")
        assert_close(ta.add(x, y), x.double() + y.double(), dt, f"add {layout}")
        assert_close(ta.bias_gelu(x, bias, "tanh"), F.gelu(x.double() + bias.double(), approximate="tanh"), dt,
                     f"bias_gelu {layout}")
        leaf = x.detach().clone().requires_grad_()
        ta.gelu(leaf, "tanh").sum().backward()  # sum's gradient is a broadcast (stride-0) tensor
        reference = x.detach().double().requires_grad_()
        F.gelu(reference, approximate="tanh").sum().backward()
        assert_close(leaf.grad, reference.grad, dt, f"gelu gradient {layout}")
        inplace = x.clone() if layout == "contiguous" else x.detach().clone().t().contiguous().t()
        expected = F.relu(inplace.double())
        assert ta.relu(inplace, inplace=True) is inplace
        assert_close(inplace, expected, dt, f"relu in place {layout}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_give_torch_answer_on_every_layout_and_normalized_shape(dtype):
    dt = DTYPES[dtype]
    for layout, x in _layouts((67, 130), dt):
        w, b = random((130,), dt), random((130,), dt)
        assert_close(ta.layer_norm(x, (130,), w, b), F.layer_norm(x.double(), (130,), w.double(), b.double()), dt,
                     f"layer_norm {layout}", factor=4)
        assert_close(ta.rms_norm(x, (130,), w, 1e-5), F.rms_norm(x.double(), (130,), w.double(), 1e-5), dt,
                     f"rms_norm {layout}", factor=4)
    # Several trailing dims normalised together, with autograd through the folded rows.
    x, dy = random((5, 7, 3, 40), dt), random((5, 7, 3, 40), dt)
    w, b = random((3, 40), dt), random((3, 40), dt)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = ta.layer_norm(leaves[0], (3, 40), leaves[1], leaves[2])
    y.backward(dy)
    reference = [t.double().requires_grad_() for t in (x, w, b)]
    expected = F.layer_norm(reference[0], (3, 40), reference[1], reference[2])
    expected.backward(dy.double())
    assert_close(y, expected.detach(), dt, "layer_norm over (3, 40)", factor=4)
    for got, want, what in zip(leaves, reference, ("dx", "dweight", "dbias")):
        assert_close(got.grad, want.grad, dt, f"layer_norm over (3, 40) {what}", factor=16)
    assert_close(ta.rms_norm(x, [3, 40]), F.rms_norm(x.double(), [3, 40]), dt, "rms_norm over [3, 40]", factor=4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmaxes_give_torch_answer_over_any_dim(dtype):
    dt = DTYPES[dtype]
    x = random((6, 33, 70), dt)
    for op in ("softmax", "log_softmax"):
        ours, theirs = getattr(ta, op), getattr(F, op)
        for dim in (0, 1, 2, -1, -3):
            got = ours(x, dim)
            assert got.stride() == x.stride(), f"{op} dim {dim}: torch's layout"
            assert_close(got, theirs(x.double(), dim), dt, f"{op} dim {dim}", factor=4)
        assert_close(ours(x.transpose(0, 2), 1), theirs(x.transpose(0, 2).double(), 1), dt, f"{op} transposed",
                     factor=4)
        with pytest.warns(UserWarning, match="Implicit dimension choice"):  # a 3-D input: torch picks dim 0
            assert_close(ours(x), theirs(x.double(), 0), dt, f"{op} dim=None", factor=4)
        assert ours(x, -1, dtype=torch.float32).dtype == torch.float32
        scalar = torch.tensor(3.0, device="cuda")
        assert_close(ours(scalar, 0), theirs(scalar.double(), 0), torch.float32, f"{op} of a scalar")
        leaf = x.clone().requires_grad_()
        dy = random(x.shape, dt)
        ours(leaf, 0).backward(dy)
        reference = x.double().requires_grad_()
        theirs(reference, 0).backward(dy.double())
        assert_close(leaf.grad, reference.grad, dt, f"{op} dim 0 gradient", factor=4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_takes_torch_matmul_shapes_and_layouts(dtype):
    dt = DTYPES[dtype]
    b = random((48, 40), dt, 48 ** -0.5)
    for what, a in [("3-D", random((2, 5, 48), dt)), ("1-D", random((48,), dt)),
                    ("transposed", random((48, 9), dt).t())]:
        assert_close(ta.matmul(a, b), torch.matmul(a.double(), b.double()), dt, f"matmul {what} @ 2-D", factor=4)
    a, v = random((7, 48), dt), random((48,), dt, 48 ** -0.5)
    assert_close(ta.matmul(a, v), torch.matmul(a.double(), v.double()), dt, "matmul 2-D @ 1-D", factor=4)
    dot = ta.matmul(a[0], v)
    assert dot.shape == () and dot.dtype == dt
    assert_close(dot, torch.dot(a[0].double(), v.double()), dt, "matmul 1-D @ 1-D", factor=4)
    with pytest.raises(ValueError, match="batched other"):
        ta.matmul(random((2, 5, 48), dt), random((2, 48, 40), dt))
