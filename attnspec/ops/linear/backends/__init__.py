"""Backends of gated linear attention's chunk mode besides the graph path (plain torch, in
:mod:`attnspec.ops.linear.chunk`): :mod:`.native`, a C++ CPU kernel for inference (compiled on first
use from ``csrc/``), and :mod:`.triton`, Triton kernels for CUDA, forward and backward, registered as
the traceable op ``attnspec::triton_chunk``. Each computes what :mod:`attnspec.ops.linear.naive` does."""
