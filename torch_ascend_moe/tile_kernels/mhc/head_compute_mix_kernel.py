"""Upstream's ``tile_kernels/mhc/head_compute_mix_kernel.py`` holds only TileLang kernel builders private to
``modeling.mhc.ops``: the path imports, and the step is ``tile_kernels.modeling.mhc.ops.mhc_head_compute_mix`` here."""
