"""Builds torch_ascend_moe._C: every op schema and the CPU kernels (csrc/ops)."""

import glob
import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# The sources include <ATen/core/Tensor.h> and the per-operator headers they call (<ATen/ops/mm.h>, ...), not
# <ATen/ATen.h>: declaring every ATen operator was half of each file's compile time.
sources = sorted(glob.glob(os.path.join("csrc", "ops", "*.cpp")))
debug_flags = ["-g"] if os.environ.get("TORCH_ASCEND_MOE_DEBUG") == "1" else ["-g0"]

setup(
    ext_modules=[
        CppExtension(
            "torch_ascend_moe._C",
            sources,
            # -g0 overrides the -g that Python's own CFLAGS add: debug info for the ATen/torch headers every
            # file includes was ~3/4 of the build (90 s -> 20 s per file on 2 cores; the suite's CI installs
            # from source). TORCH_ASCEND_MOE_DEBUG=1 keeps it for a debugger.
            extra_compile_args={"cxx": ["-O3", "-std=c++20", "-fopenmp", *debug_flags]},
            # The shared C++ runtime named ahead of the driver's own: a compiler set up to link libstdc++
            # statically (the lent H200's /opt/gcc/bin/g++) gave the extension a second copy, whose streams
            # cannot use libtorch's locale facets: every argument error crashed there (or, here, lost its
            # numbers: "expected , got"). Symbols resolve from the first library that has them.
            extra_link_args=["-fopenmp", *(["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else [])],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
