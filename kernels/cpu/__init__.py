"""C++ versions of the kernels for CPU tensors, compiled on first use for the machine they run on.

Each has its torch reference as oracle; where no compiler is found, the torch reference runs instead.
"""
