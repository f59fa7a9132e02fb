"""Device-generic kernels written with torch ops: what the CUDA and NPU backends register.

They run on CPU too, which is how CI checks them against the C++ kernels and the fp64 references.
"""
