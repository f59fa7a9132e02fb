"""Upstream's ``tile_kernels/mhc/sinkhorn_kernel.py`` holds only TileLang kernel builders private to
``modeling.mhc.ops``: the path imports, and the step is ``tile_kernels.modeling.mhc.ops.sinkhorn_normalize`` here."""
