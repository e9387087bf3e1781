"""transformers must run its own pure-PyTorch code here, the reference semantics: hide the GPU kernel
packages it would otherwise pick up when installed (FLA for Qwen3-Next, mamba_ssm and causal_conv1d
for Mamba2). A ``None`` entry in ``sys.modules`` makes ``find_spec`` report the package missing."""

from __future__ import annotations

import sys

for _package in ("fla", "mamba_ssm", "causal_conv1d"):
    sys.modules.setdefault(_package, None)
