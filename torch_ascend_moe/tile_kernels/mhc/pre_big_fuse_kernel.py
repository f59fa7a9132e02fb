"""Upstream's ``tile_kernels/mhc/pre_big_fuse_kernel.py`` holds only TileLang kernel builders private to
``modeling.mhc.ops``: the path imports, and the step is ``tile_kernels.modeling.mhc.ops.mhc_pre_big_fuse`` here."""
