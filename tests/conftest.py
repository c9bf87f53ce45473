"""Test setup: on machines without CUDA, Triton kernels run in the interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is imported (kernel modules are imported lazily, on
first use), so it is set here, before any test runs.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Every cached kernel launch in the tests is checked against Triton's own lookup (GPU runs; under the
# interpreter nothing is cached). Imported after TRITON_INTERPRET is set above.
from ringsoftmax.kernels import launcher  # noqa: E402

launcher.VERIFY = True
