"""Builds torch_ascend_moe._C: every op schema and the CPU kernels (csrc/ops)."""

import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

sources = sorted(glob.glob(os.path.join("csrc", "ops", "*.cpp")))

setup(
    ext_modules=[
        CppExtension(
            "torch_ascend_moe._C",
            sources,
            extra_compile_args={"cxx": ["-O3", "-std=c++20", "-fopenmp"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
