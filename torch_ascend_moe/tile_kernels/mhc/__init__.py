"""``tile_kernels.mhc``: upstream's kernel-level package (empty there too; callers probe ``import tile_kernels.mhc``
for an mHC backend and use ``tile_kernels.modeling.mhc``)."""
