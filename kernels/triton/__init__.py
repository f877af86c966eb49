"""Triton versions of the kernels, used for CUDA tensors; each has its torch reference as oracle.

They also run on CPU under TRITON_INTERPRET=1 (the parity tests do that), slowly.
"""
