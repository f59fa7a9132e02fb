"""The compat package's mutable settings, in one module imported by its canonical name: code that imports the package
under upstream's name (``sys.modules["tile_kernels"] = torch_ascend_moe.tile_kernels``, then ``tile_kernels.config``)
gets a second copy of ``config``, and both copies must read and write the same settings."""

NUM_SMS: list[int] = []
# The Ascend-era API's token alignment: the psum layout's expert blocks start at multiples of it.
TOKEN_ALIGNMENT: list[int] = [128]
# The Ascend era's runtime switches (programmatic dependent launch, deterministic reductions): kept; our results are
# deterministic and never depend on them.
PDL: list[bool] = [False]
DETERMINISTIC: list[bool] = [False]
