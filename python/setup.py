"""Builds mlakit._C, the CUDA extension behind torch.ops.mlakit.decode.

    pip install --no-build-isolation ./python          # from the repository root
    python python/setup.py build_ext --inplace         # or in place, for development

Environment:
    MLAKIT_CUDA_ARCHS    CUDA architectures, ';' or ',' separated (default "90a": sm_90a)
    MLAKIT_INCLUDE_DIR   the library headers (default: ../include next to this file)
    MLAKIT_NO_EXTENSION  1: install the pure-Python package only (schema, fake impl, checks,
                         CPU reference); torch.ops.mlakit.decode then runs on CPU tensors only
    MAX_JOBS             parallel compile jobs (PyTorch's variable)

The extension's translation units: csrc/kernels.cu (nvcc; the library's host API, no PyTorch
header), csrc/dispatch_part0.cu to dispatch_part3.cu (nvcc; decode()'s dispatch table in four
parts that compile in parallel) and csrc/binding.cpp (host compiler; PyTorch, no device code).
"""
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # sources and packages are named relative to this folder


def _archs():
    spec = os.environ.get("MLAKIT_CUDA_ARCHS", "90a")
    flags = []
    for arch in spec.replace(",", ";").split(";"):
        arch = arch.strip()
        if arch:
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    if not flags:
        sys.exit("MLAKIT_CUDA_ARCHS is empty: name at least one architecture, e.g. 90a")
    return flags


def _extensions():
    if os.environ.get("MLAKIT_NO_EXTENSION", "") not in ("", "0"):
        return [], {}
    import torch.utils.cpp_extension as ext

    include = os.path.abspath(os.environ.get("MLAKIT_INCLUDE_DIR", os.path.join(HERE, "..", "include")))
    if not os.path.isfile(os.path.join(include, "mlakit", "mlakit.hpp")):
        sys.exit(f"mlakit headers not found in {include}: build from the repository (python/ next to "
                 "include/) or set MLAKIT_INCLUDE_DIR")

    # nvcc and the CUDA version PyTorch was built with may differ in their major version (CUDA
    # 13 toolkit, CUDA 12 PyTorch): PyTorch refuses that, but this extension's CUDA translation
    # unit includes no PyTorch header and shares only a stream handle with PyTorch, which the
    # driver accepts from either runtime. Turn the refusal into a warning.
    check = ext._check_cuda_version

    def lenient_check(*args, **kwargs):
        try:
            check(*args, **kwargs)
        except RuntimeError as e:
            print(f"mlakit setup.py: warning: {e}; building anyway", file=sys.stderr)

    ext._check_cuda_version = lenient_check

    nvcc = [
        "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo",
        # PyTorch adds these for its own headers; the kernel TU includes none of them, and
        # the library's device code uses the CUDA half/bfloat16 headers as they are.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    ] + _archs()
    module = ext.CUDAExtension(
        name="mlakit._C",
        sources=["csrc/kernels.cu", "csrc/binding.cpp"]
        + [f"csrc/dispatch_part{k}.cu" for k in range(4)],
        include_dirs=[include, os.path.join(HERE, "csrc")],
        # No -std for the host compiler: PyTorch adds the standard its headers need.
        extra_compile_args={"cxx": ["-O2"], "nvcc": nvcc},
    )
    return [module], {"build_ext": ext.BuildExtension}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
