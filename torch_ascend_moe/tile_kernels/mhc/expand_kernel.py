"""Upstream's ``tile_kernels/mhc/expand_kernel.py`` holds only TileLang kernel builders private to
``modeling.mhc.ops``: the path imports, and the step is ``tile_kernels.modeling.mhc.ops.expand_to_mhc`` here."""
