"""Kernel-test set-up: every uninitialised buffer (torch.empty) is filled with NaN.

With deterministic algorithms on, PyTorch fills uninitialised memory with NaN, so a kernel that
reads an output element it never wrote fails loudly instead of passing by luck.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def poison_uninitialised_memory():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.manual_seed(0)
    yield
    torch.use_deterministic_algorithms(previous)
