"""Policies of the multi-process tests that are about workers only (importable there by module name).

The probe policies (``WeightProbe``, ``TwoPartProbe``) live in :mod:`acollect.testing`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def report_threads(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict policy that acts 0 and writes the worker's torch thread count as ``"threads"``."""
    n = td.batch_size[0]
    td.set("action", torch.zeros(n, dtype=torch.int64))
    td.set("threads", torch.full((n,), torch.get_num_threads(), dtype=torch.int64))
    return td
