"""What runs a scheduled batch on a device: the model runner, the sampler, CUDA graphs, and the tensor-parallel
ranks beyond the first."""
