"""A Wan2.1-T2V-1.3B-architecture pipeline with random weights on CUDA devices: in process,
through the whole stack, out of memory, several GPUs; the worker's GPU metrics."""
