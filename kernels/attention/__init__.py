"""Attention over the paged KV cache, as one object per kind: the interface every backend implements
(backend.py: its step metadata, KV store, attend), the torch reference (torch_backend.py), FlashAttention's
(flash.py), the choice among them (select.py), and a picture's tokens attended both ways (pictures.py). The C++
and Triton backends live beside their kernels: kernels/cpu/attention.py, kernels/triton/attention.py."""
