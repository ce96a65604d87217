"""topk for torch, part of the sort family: torch.topk's signature. Work in progress."""


def topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk: a namedtuple (values, indices)."""
    raise NotImplementedError("rawops.torch_adapter.sort.topk is being written")
