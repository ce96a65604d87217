"""What the MLP tests share: the source network through the public API, the torch networks they
are checked against, and float64 references of their outputs and gradients."""

import rawops


def source_mlp(x, w1, b1, w2, b2, w3, b3, **kwargs):
    """The source network through the public API: fused_mlp with its three layers and ReLU."""
    return rawops.fused_mlp(x, [w1, w2, w3], [b1, b2, b3], "relu", **kwargs)


def kernel_source(family):
    from rawops import _modules

    with open(__import__("os").path.join(_modules.kernel_source_dir(), f"{family}.cu")) as f:
        return f.read()


def source_network(torch, output_relu=False):
    layers = [torch.nn.Linear(100, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
              torch.nn.Linear(64, 10)]
    if output_relu:
        layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


RELU_MARGIN = 1e-3  # pre-activations of ReLU layers kept this far from 0 (float64) by away_from_relu_kinks


def away_from_relu_kinks(torch, net, batch):
    """x (batch, n_in), fresh normal float32 rows, redrawn where the pre-activation of any Linear
    that a ReLU follows (the output's too, where the network ends in one) is within RELU_MARGIN of
    0 in float64 (on the float32 weights). There no float32 forward, rawops' or torch's, can flip a
    ReLU mask: a flipped mask moves a whole term of a gradient sum (~1e-4 of the first layer's
    weight gradient at 3000 rows, for either library), which is chance, not precision."""
    from gpu_reference import random

    modules = list(net)
    n_in = next(m for m in modules if isinstance(m, torch.nn.Linear)).in_features
    x = random((batch, n_in), torch.float32)
    for _ in range(100):
        h = x.double()
        near = torch.zeros(batch, dtype=torch.bool, device=x.device)
        for i, m in enumerate(modules):
            if isinstance(m, torch.nn.Linear):
                h = h @ m.weight.detach().double().T + (m.bias.detach().double() if m.bias is not None else 0)
                if i + 1 < len(modules) and isinstance(modules[i + 1], torch.nn.ReLU):
                    near |= (h.abs() < RELU_MARGIN).any(1)
            elif isinstance(m, torch.nn.ReLU):
                h = torch.relu(h)
            else:
                raise TypeError(f"away_from_relu_kinks takes Linear and ReLU layers, got {type(m).__name__}")
        count = int(near.sum())
        if count == 0:
            return x
        x[near] = random((count, n_in), torch.float32)
    raise AssertionError("could not draw rows away from the ReLU kinks")


def source_weights(net):
    linears = [m for m in net if m.__class__.__name__ == "Linear"]
    return [t.detach() for m in linears for t in (m.weight, m.bias)]


def offset_weight_views(torch, net):
    """The network's weights and biases as views into one flat buffer, one float past its
    start: 4-byte aligned, off 16-byte alignment."""
    flat = torch.cat([torch.zeros(1, device="cuda")] + [t.reshape(-1) for t in source_weights(net)])
    views, offset = [], 1
    for t in source_weights(net):
        views.append(flat[offset: offset + t.numel()].view(t.shape))
        offset += t.numel()
    return views


def reference(net, x):
    """float64 on the same float32 numbers."""
    import copy

    return copy.deepcopy(net).double()(x.double()).detach()


def sequential(torch, sizes, activation, output_activation, dtype, bias=True):
    act = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "none": torch.nn.Identity}[activation]
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2:
            layers.append(act())
    if output_activation == "relu":
        layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers).cuda().to(dtype)
    with torch.no_grad():  # weights of a trained-scale network: keep activations O(1) in depth
        for m in net:
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_((torch.randn_like(m.weight.float()) * (2.0 / m.in_features) ** 0.5).to(dtype))
                if m.bias is not None:
                    m.bias.copy_((torch.randn_like(m.bias.float()) * 0.1).to(dtype))
    return net


def net_params(net):
    linears = [m for m in net if m.__class__.__name__ == "Linear"]
    weights = [m.weight.detach() for m in linears]
    biases = [m.bias.detach() for m in linears] if linears[0].bias is not None else None
    return weights, biases


def grads64(net, x, dy):
    """y, dx, dW, db in float64 from the same (rounded) numbers."""
    import copy

    ref = copy.deepcopy(net).double()
    x64 = x.detach().double().requires_grad_(True)
    y = ref(x64)
    y.backward(dy.double())
    linears = [m for m in ref if m.__class__.__name__ == "Linear"]
    return (y.detach(), x64.grad, [m.weight.grad for m in linears],
            [m.bias.grad for m in linears] if linears[0].bias is not None else None)
