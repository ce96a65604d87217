"""topk, part of the sort family (kernels/sort_topk.cu): the k largest (or smallest) elements
of each row and their indices, as torch.topk. Work in progress."""

FAMILY = "sort_topk"
KERNELS = {}


def topk(x, k, dim=-1, largest=True, sorted=True, *, stream=None):
    """(values, indices) of the k largest (largest=False: smallest) elements along dim."""
    raise NotImplementedError("rawops.sort.topk is being written")
