"""The mlp family for torch: fused_mlp (a whole MLP in one launch) with autograd and
`rawops::fused_mlp*` custom ops, and the module FusedMLP (from sizes, or from an nn.Sequential
of Linear and activation layers, whose weights it copies once).

The launches of rawops.mlp on data_ptr(), on torch's current stream; outputs, kept activations
and backward temporaries from torch's allocator (CUDA-graph safe). No gradient needed: the
inference kernels, nothing kept; a gradient needed: the training forward keeps what the backward
reads; torch.compile: the custom ops. The source network's (100-128-64-10, float32) FusedMLP
call is one C call (rawops._launch.torch_fast) when nothing needs nn.Module.__call__: inference
its launch; trained, the autograd Function _SourceMLP, whose forward and (up to SMALL_BWD_ROWS
rows) backward are one typed call each.
"""
import importlib

import torch

from .. import _mlp_plans
from .. import mlp as _mlp
from .._launch import (register_torch_modules, torch_source_forward, torch_source_module_call,
                       torch_source_train_backward, torch_source_train_forward)
from ._common import checked, compiling, current_device, custom_op, dense, fast_apply, grad_enabled, on_device
from ._common import raw_stream, substitute_in_graph


def _no_typed_module_call(module, args, kwargs):
    return None  # what dynamo sees of torch_source_module_call: FusedMLP goes through nn.Module.__call__


substitute_in_graph(torch_source_module_call, _no_typed_module_call)

_MLP_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _mlp_plan(x, weights, biases, activation, output_activation):
    _mlp_plans.check_activations(activation, output_activation)
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError("weights must be a non-empty list of [out, in] tensors (torch.nn.Linear layout)")
    if biases is not None and (not isinstance(biases, (list, tuple)) or len(biases) != len(weights)):
        raise ValueError(f"biases must be None or a list of {len(weights)} tensors, one per weight")
    code = checked(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}, expected (batch, n_in)")
    sizes = [x.shape[1]]
    for i, w in enumerate(weights):
        checked(w, f"weights[{i}]", like=x)
        if w.dim() != 2 or w.shape[1] != sizes[-1]:
            raise ValueError(f"weights[{i}] has shape {tuple(w.shape)}, expected (out, {sizes[-1]}) "
                             "(torch.nn.Linear layout)")
        sizes.append(w.shape[0])
        if biases is not None:
            b = biases[i]
            checked(b, f"biases[{i}]", like=x)
            if tuple(b.shape) != (w.shape[0],):
                raise ValueError(f"biases[{i}] has shape {tuple(b.shape)}, expected ({w.shape[0]},)")
    return _mlp_plans.make_plan(code, sizes, activation, output_activation, biases is not None)


def _mlp_empty(device):
    def empty(shape, dtype_name):
        t = torch.empty(shape, dtype=_MLP_TORCH_DTYPES[dtype_name], device=device)
        return t, t.data_ptr()
    return empty


def _mlp_forward(x, weights, biases, plan, training):
    """(y, saved): saved is [] in inference, else the buffers of _mlp_plans.saved_shapes."""
    batch = x.shape[0]
    y = torch.empty((batch, plan.n_out), dtype=x.dtype, device=x.device)
    saved = [torch.empty(shape, dtype=_MLP_TORCH_DTYPES[dt], device=x.device)
             for shape, dt in _mlp_plans.saved_shapes(plan, batch)] if training else []
    device = x.get_device()
    if device == current_device():
        _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device)
    else:
        with torch.cuda.device(device):
            _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device)
    return y, saved


def _mlp_launch_forward(x, weights, biases, plan, y, saved, training, batch, device):
    if plan.regime == "tc":
        _mlp.prepare(plan, device)
    if batch:
        _mlp.launch_forward(plan, device, x.data_ptr(), [w.data_ptr() for w in weights],
                            [b.data_ptr() for b in biases] if biases is not None else None, y.data_ptr(), batch,
                            raw_stream(device), saved=[t.data_ptr() for t in saved] if training else None)


def _mlp_backward(dy, x, y, saved, weights, plan, need_dx):
    """(dx or None, dws, dbs or None); the biases' gradients shaped (out,) by their weights."""
    dy = dense(dy)
    batch = x.shape[0]
    dx = torch.empty_like(x) if need_dx else None
    dws = [torch.empty_like(w) for w in weights]
    dbs = [w.new_empty(w.shape[0]) for w in weights] if plan.has_bias else None
    device = x.get_device()
    on_device(device, lambda: _mlp.launch_backward(
        plan, device, dy.data_ptr(), x.data_ptr(), y.data_ptr(), [t.data_ptr() for t in saved],
        [w.data_ptr() for w in weights], dx.data_ptr() if dx is not None and batch else 0,
        [t.data_ptr() for t in dws], [t.data_ptr() for t in dbs] if dbs is not None else None, batch,
        raw_stream(device), _mlp_empty(x.device)))
    return dx, dws, dbs


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan, n, *params):
        weights, biases = list(params[:n]), (list(params[n:]) if plan.has_bias else None)
        y, saved = _mlp_forward(x, weights, biases, plan, True)
        ctx.plan, ctx.n_saved = plan, len(saved)
        ctx.save_for_backward(x, y, *saved, *weights)  # the biases' values are not read backward
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y, *rest = ctx.saved_tensors
        saved, weights = rest[:ctx.n_saved], rest[ctx.n_saved:]
        dx, dws, dbs = _mlp_backward(dy, x, y, saved, weights, ctx.plan, ctx.needs_input_grad[0])
        return (dx, None, None, *dws, *(dbs or ()))


class _SourceMLP(torch.autograd.Function):
    """FusedMLP's training of the source network (100-128-64-10, float32, biases): the forward
    and, up to SMALL_BWD_ROWS rows, the backward each one typed call (allocations and launch;
    _launch.torch_source_train_*) on the parameters the module validated (`state`: their launch
    state; checked again by FusedMLP.__call__'s typed call or _validated_plan just before); past
    that batch the general backward. A small batch's step is host time: this is _FusedMLP with
    its per-call Python taken out. h: the kept activations h1 and h2 in one buffer (batch * 192
    floats), one allocation and one saved tensor."""
    @staticmethod
    def forward(ctx, x, state, plan, w1, b1, w2, b2, w3, b3):
        y, h = torch_source_train_forward(x, state)
        ctx.state, ctx.plan = state, plan
        ctx.save_for_backward(x, y, h, w1, w2, w3)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y, h, w1, w2, w3 = ctx.saved_tensors
        need_dx = ctx.needs_input_grad[0]
        grads = torch_source_train_backward(dy, x, y, h, w1, w2, w3, need_dx, ctx.state)
        if grads is None:  # past the one-launch kernel's rows, or dy strided: the general backward
            batch = x.shape[0]
            h1, h2 = h[:batch * 128].view(batch, 128), h[batch * 128:].view(batch, 64)
            dx, (dw1, dw2, dw3), (db1, db2, db3) = _mlp_backward(dy, x, y, (h1, h2), (w1, w2, w3), ctx.plan, need_dx)
        else:
            dx, dw1, db1, dw2, db2, dw3, db3 = grads
        return dx, None, None, dw1, db1, dw2, db2, dw3, db3


def _mlp_op_plan(x, weights, biases, activation, output_activation):
    """The plan of a rawops::fused_mlp* op call: every check of the eager path (the ops can be
    reached under torch.compile or called directly)."""
    return _mlp_plan(x, weights, biases, activation, output_activation)


def _mlp_backward_operands(dy, x, y, saved, plan):
    """dy (made contiguous, as autograd may hand it strided), after checking dy, y and the kept
    activations against the plan: the backward kernel reads them by shape alone."""
    dy = dense(dy)
    batch = x.shape[0]
    expected = [("dy", dy, (batch, plan.n_out)), ("y", y, (batch, plan.n_out))]
    kept = _mlp_plans.saved_shapes(plan, batch)
    expected += [(f"saved[{i}]", t, shape) for i, (t, (shape, _)) in enumerate(zip(saved, kept, strict=True))]
    for name, t, shape in expected:
        checked(t, name, like=x)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return dy


def _mlp_saved_pair(x, saved):
    """The train op returns exactly two kept tensors: the tensor-core path keeps one."""
    return (saved[0], saved[1]) if len(saved) == 2 else (saved[0], x.new_empty(0))


def _fused_mlp_impl(x, weights, biases, activation, output_activation):
    return _mlp_forward(x, weights, biases, _mlp_op_plan(x, weights, biases, activation, output_activation), False)[0]


def _fused_mlp_fake(x, weights, biases, activation, output_activation):
    return x.new_empty((x.shape[0], weights[-1].shape[0]))


def _fused_mlp_train_impl(x, weights, biases, activation, output_activation):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    y, saved = _mlp_forward(x, weights, biases, plan, True)
    return (y, *_mlp_saved_pair(x, saved))


def _fused_mlp_train_fake(x, weights, biases, activation, output_activation):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    saved = [x.new_empty(shape, dtype=_MLP_TORCH_DTYPES[dt]) for shape, dt in _mlp_plans.saved_shapes(plan, x.shape[0])]
    return (x.new_empty((x.shape[0], plan.n_out)), *_mlp_saved_pair(x, saved))


def _fused_mlp_backward_impl(dy, x, y, s1, s2, weights, biases, activation, output_activation, need_dx):
    plan = _mlp_op_plan(x, weights, biases, activation, output_activation)
    saved = [s1, s2] if plan.regime == "source" else [s1]
    dy = _mlp_backward_operands(dy, x, y, saved, plan)
    dx, dws, dbs = _mlp_backward(dy, x, y, saved, weights, plan, need_dx)
    return [dx if dx is not None else x.new_empty(0), *dws, *(dbs or ())]


def _fused_mlp_backward_fake(dy, x, y, s1, s2, weights, biases, activation, output_activation, need_dx):
    return [torch.empty_like(x) if need_dx else x.new_empty(0), *(torch.empty_like(w) for w in weights),
            *(torch.empty_like(b) for b in (biases or ()))]


_fused_mlp_backward_op = custom_op(
    "fused_mlp_backward",
    "(Tensor dy, Tensor x, Tensor y, Tensor s1, Tensor s2, Tensor[] weights, Tensor[]? biases, str activation, "
    "str output_activation, bool need_dx) -> Tensor[]", _fused_mlp_backward_impl, _fused_mlp_backward_fake)
_fused_mlp_op = custom_op(
    "fused_mlp", "(Tensor x, Tensor[] weights, Tensor[]? biases, str activation, str output_activation) -> Tensor",
    _fused_mlp_impl, _fused_mlp_fake)


def _fused_mlp_train_setup(ctx, inputs, output):
    x, weights, biases, activation, output_activation = inputs
    y, s1, s2 = output
    ctx.save_for_backward(x, y, s1, s2, *weights, *(biases or ()))
    ctx.n, ctx.has_bias, ctx.scalars = len(weights), biases is not None, (activation, output_activation)


def _fused_mlp_train_backward(ctx, dy, _ds1, _ds2):
    x, y, s1, s2, *params = ctx.saved_tensors
    weights, biases = params[:ctx.n], (params[ctx.n:] if ctx.has_bias else None)
    grads = _fused_mlp_backward_op(dy, x, y, s1, s2, weights, biases, *ctx.scalars, ctx.needs_input_grad[0])
    dx, dws, dbs = grads[0], grads[1:1 + ctx.n], grads[1 + ctx.n:]
    return (dx if ctx.needs_input_grad[0] else None, list(dws), list(dbs) if ctx.has_bias else None, None, None)


_fused_mlp_train_op = custom_op(
    "fused_mlp_train",
    "(Tensor x, Tensor[] weights, Tensor[]? biases, str activation, str output_activation) -> (Tensor, Tensor, Tensor)",
    _fused_mlp_train_impl, _fused_mlp_train_fake, _fused_mlp_train_backward, _fused_mlp_train_setup)
_fused_mlp_apply = fast_apply(_FusedMLP)
_source_mlp_apply = fast_apply(_SourceMLP)
_module_globals = importlib.import_module("torch.nn.modules.module")
# torch's global module-hook dicts (mutated in place), which the typed module call must find empty
_GLOBAL_MODULE_HOOKS = tuple(getattr(_module_globals, name, {None: None}) for name in (
    "_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks", "_global_forward_pre_hooks"))
register_torch_modules(_GLOBAL_MODULE_HOOKS, torch._C._get_tracing_state, _source_mlp_apply)


def fused_mlp(x, weights, biases=None, activation="relu", output_activation="none"):
    """A whole MLP in one launch (rawops.fused_mlp on torch tensors), with autograd and a
    torch.compile custom op: weights [W_0, ..., W_L] in nn.Linear layout, biases [b_0, ...] or
    None; hidden `activation` 'relu' | 'gelu' (exact erf) | 'none', `output_activation` 'none' |
    'relu'. Supported networks: rawops.mlp.SUPPORTED_TEXT (ValueError otherwise). Tensors that
    are not contiguous are copied first."""
    if isinstance(x, torch.Tensor):
        x = dense(x)
    if isinstance(weights, (list, tuple)):
        weights = [dense(w) if isinstance(w, torch.Tensor) else w for w in weights]
    if isinstance(biases, (list, tuple)):
        biases = [dense(b) if isinstance(b, torch.Tensor) else b for b in biases]
    if compiling():
        weights, biases = list(weights), (list(biases) if biases is not None else None)
        if grad_enabled() and any(t.requires_grad for t in (x, *weights, *(biases or ()))):
            return _fused_mlp_train_op(x, weights, biases, activation, output_activation)[0]
        return _fused_mlp_op(x, weights, biases, activation, output_activation)
    plan = _mlp_plan(x, weights, biases, activation, output_activation)
    if grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)
                            or (biases is not None and any(b.requires_grad for b in biases))):
        return _fused_mlp_apply(x, plan, len(weights), *weights, *(biases or ()))
    return _mlp_forward(x, weights, biases, plan, False)[0]


_MLP_ACTIVATION_MODULES = {torch.nn.ReLU: "relu", torch.nn.Identity: "none"}


def _activation_name(module):
    if isinstance(module, torch.nn.GELU):
        if module.approximate != "none":
            raise ValueError("FusedMLP supports nn.GELU(approximate='none') (exact erf), got approximate='tanh'")
        return "gelu"
    for kind, name in _MLP_ACTIVATION_MODULES.items():
        if isinstance(module, kind):
            return name
    raise ValueError(f"FusedMLP takes nn.Linear, nn.ReLU, nn.GELU and nn.Identity layers, got {type(module).__name__}")


class FusedMLP(torch.nn.Module):
    """A whole MLP as one rawops launch: FusedMLP(sizes, activation, output_activation, bias,
    device, dtype) with sizes = (n_in, hidden..., n_out), initialised like nn.Linear; or
    FusedMLP.from_sequential(nn.Sequential(Linear, act, Linear, act, ..., Linear[, ReLU])),
    which copies the weights once (same numbers). Parameters: `weights`, `biases`
    (ParameterLists, nn.Linear layout)."""

    def __init__(self, sizes, activation="relu", output_activation="none", bias=True, device=None, dtype=None):
        super().__init__()
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2:
            raise ValueError(f"sizes must list at least n_in and n_out, got {sizes}")
        code = {None: 0, torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}.get(dtype)
        if code is None:
            raise TypeError(f"dtype {dtype}; FusedMLP supports float32, float16, bfloat16")
        _mlp_plans.make_plan(code, sizes, activation, output_activation, bias)  # ValueError before allocating
        self.sizes, self.activation, self.output_activation = sizes, activation, output_activation
        linears = [torch.nn.Linear(a, b, bias=bias, device=device, dtype=dtype) for a, b in zip(sizes, sizes[1:])]
        self.weights = torch.nn.ParameterList([m.weight for m in linears])
        self.biases = torch.nn.ParameterList([m.bias for m in linears]) if bias else None

    @classmethod
    def from_sequential(cls, sequential):
        layers = list(sequential)
        linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
        if not linears or not isinstance(layers[0], torch.nn.Linear):
            raise ValueError("from_sequential wants nn.Sequential(Linear, activation, Linear, ..., Linear[, ReLU])")
        acts, out_act, i = set(), "none", 1
        while i < len(layers):
            if isinstance(layers[i], torch.nn.Linear):
                raise ValueError("from_sequential wants one activation between consecutive Linear layers")
            name = _activation_name(layers[i])
            if i + 1 == len(layers):
                if name not in _mlp_plans.OUTPUT_ACTIVATIONS:
                    raise ValueError(f"output activation {name!r}: FusedMLP supports "
                                     f"{sorted(_mlp_plans.OUTPUT_ACTIVATIONS)}")
                out_act = name
                i += 1
                continue
            if not isinstance(layers[i + 1], torch.nn.Linear):
                raise ValueError("from_sequential wants one activation between consecutive Linear layers")
            acts.add(name)
            i += 2
        if len(acts) > 1:
            raise ValueError(f"FusedMLP uses one hidden activation, the Sequential has {sorted(acts)}")
        has_bias = {m.bias is not None for m in linears}
        if len(has_bias) != 1:
            raise ValueError("FusedMLP wants every Linear with a bias or every one without")
        first = linears[0].weight
        sizes = (linears[0].in_features, *(m.out_features for m in linears))
        module = cls(sizes, acts.pop() if acts else "relu", out_act, has_bias.pop(), first.device, first.dtype)
        with torch.no_grad():
            for i, m in enumerate(linears):
                module.weights[i].copy_(m.weight)
                if m.bias is not None:
                    module.biases[i].copy_(m.bias)
        return module

    _fast_key = None  # the parameters last validated (dtype, device, pointers, shapes, strides)
    _fast_plan = None
    _source_state = None  # the source network's typed paths (_launch.torch_source_*)

    def __call__(self, *args, **kwargs):
        # The source network, when nothing needs nn.Module.__call__ (no hooks, not tracing or
        # compiling: the C call checks), is one C call: its inference launch, or with a gradient
        # needed _SourceMLP's apply; everything else goes through nn.Module.__call__ and forward.
        y = torch_source_module_call(self, args, kwargs)
        if y is not None:
            return y
        return super().__call__(*args, **kwargs)

    def forward(self, x):
        # ParameterList's own iteration and Module.__getattr__ are Python calls a small batch
        # feels: the lists are read from _modules and their dicts directly.
        lists = self._modules
        weights = list(lists["weights"]._parameters.values())
        bias_list = lists.get("biases")  # absent when built without biases (a plain None attribute)
        biases = list(bias_list._parameters.values()) if bias_list is not None else None
        if compiling():
            return fused_mlp(x, weights, biases, self.activation, self.output_activation)
        if grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)
                               or (biases is not None and any(b.requires_grad for b in biases))):
            # training: the same once-validated plan as inference, then the autograd Function
            # (operands not contiguous copied first, as fused_mlp does)
            x, weights = dense(x), [dense(w) for w in weights]
            biases = [dense(b) for b in biases] if biases is not None else None
            plan = self._validated_plan(x, weights, biases)
            state = self._source_state
            if state is not None and x.shape[0]:  # the source network, validated: typed calls
                return _source_mlp_apply(x, state, plan, weights[0], biases[0], weights[1], biases[1], weights[2],
                                         biases[2])
            return _fused_mlp_apply(x, plan, len(weights), *weights, *(biases or ()))
        if self._source_state is not None:  # the source network, validated before: one typed call
            y = torch_source_forward(x, [weights[0], biases[0], weights[1], biases[1], weights[2], biases[2]],
                                     self._source_state)
            if y is not None:
                return y
        return _mlp_forward(x, weights, biases, self._validated_plan(x, weights, biases), False)[0]

    def _validated_plan(self, x, weights, biases):
        # The parameters are validated once per (dtype, device, pointers, shapes, strides), then only
        # x is checked per call (its dtype and device against the weights', its width): a parameter
        # replaced by a reshaped or strided view of the same storage is validated again.
        first = weights[0]
        key = (first.dtype, first.get_device(),
               *((t.data_ptr(), t.shape, t.stride()) for t in (*weights, *(biases or ()))))
        if key == self._fast_key:
            checked(x, "x", like=first, like_name="weights[0]")
            plan = self._fast_plan
            if x.dim() != 2 or x.shape[1] != plan.n_in:
                raise ValueError(f"x has shape {tuple(x.shape)}, expected (batch, {plan.n_in})")
            return plan
        plan = _mlp_plan(x, weights, biases, self.activation, self.output_activation)
        self._fast_key, self._fast_plan = key, plan
        self._source_state = None
        if plan.regime == "source" and biases is not None:
            device = first.get_device()
            pointers = (weights[0].data_ptr(), biases[0].data_ptr(), weights[1].data_ptr(), biases[1].data_ptr(),
                        weights[2].data_ptr(), biases[2].data_ptr())
            self._source_state = (first.dtype, device, pointers, plan.out_act, {},
                                  lambda batch: _mlp.source_launch(batch, device), {},
                                  lambda batch, need_dx: _mlp.source_small_backward_launch(batch, need_dx, device),
                                  plan)
        return plan

    def extra_repr(self):
        return f"sizes={self.sizes}, activation={self.activation!r}, output_activation={self.output_activation!r}"


