"""GPU tests carry the `gpu` marker and skip cleanly where no CUDA device is usable."""
import pytest


def _gpu_available():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device, or a driver older than the runtime
        return False


GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none usable here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
