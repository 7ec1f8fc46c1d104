"""Builds gnnio's torch extension (gnnio._C) against the torch that is installed.

CUDA kernels are built when torch has CUDA and nvcc is found (or GNNIO_FORCE_CUDA=1, e.g. to
compile them on a machine without a GPU); set GNNIO_FORCE_CPU=1 for a CPU-only build. The
architecture defaults to sm_90a (H100/H200); TORCH_CUDA_ARCH_LIST overrides it.

GNNIO_CUDA_OBJECTS=<dir> links the kernels' objects from <dir> instead of compiling the .cu files
(scripts/cuda_objects.py compiles them with torch's nvcc flags on any machine with nvcc, and
records the sources they came from): a GPU machine then compiles only the binding.
"""
import glob
import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from cuda_objects import NVCC_FLAGS, prebuilt_objects  # noqa: E402  (setup.py's nvcc flags, once)


def _want_cuda():
    if os.environ.get("GNNIO_FORCE_CPU") == "1":
        return False
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("GNNIO_FORCE_CUDA") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None and torch.cuda.is_available()


def _headers():
    """setuptools rebuilds an extension only when a listed file is newer than it: the headers and
    prebuilt objects (not sources) must be listed too, or a header's edit keeps the old .so."""
    return sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.cuh", recursive=True))


def _extension():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    cpu_sources = [
        "csrc/gnnio/graph/csr_cpu.cpp",
        "csrc/gnnio/graph/mtx.cpp",
        "csrc/gnnio/spmm/cpu.cpp",
        "csrc/gnnio/reduce/cpu.cpp",
        "csrc/gnnio/attention/cpu.cpp",
        "csrc/gnnio/attention/head_scores_cpu.cpp",
        "csrc/gnnio/wsb/build_cpu.cpp",
        "csrc/gnnio/wsb/cpu.cpp",
        "csrc/gnnio/wsb/attention_cpu.cpp",
        "csrc/gnnio/dense/column_sum_cpu.cpp",
        "csrc/gnnio/transformer/cpu.cpp",
        "csrc/torch/registration.cpp",
        "csrc/torch/graph_ops.cpp",
        "csrc/torch/spmm_ops.cpp",
        "csrc/torch/spmm_autograd.cpp",
        "csrc/torch/reduce_ops.cpp",
        "csrc/torch/reduce_autograd.cpp",
        "csrc/torch/attention_ops.cpp",
        "csrc/torch/attention_autograd.cpp",
        "csrc/torch/head_scores_ops.cpp",
        "csrc/torch/wsb_ops.cpp",
        "csrc/torch/wsb_autograd.cpp",
        "csrc/torch/wsb_attention_ops.cpp",
        "csrc/torch/column_sum_ops.cpp",
        "csrc/torch/transformer_ops.cpp",
    ]
    # No FMA contraction on the CPU either (GCC contracts by default where the target has FMA,
    # e.g. aarch64 hosts): the CPU kernels round each product on its own, as the CUDA kernels'
    # pinned arithmetic does, which the CPU-against-CUDA bit tests rely on.
    cxx = ["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    if not _want_cuda():
        return CppExtension(
            "gnnio._C", cpu_sources, include_dirs=include_dirs, depends=_headers(),
            extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    kernel_sources = sorted(glob.glob("csrc/gnnio/*/*.cu"))
    kernel_objects = []
    if os.environ.get("GNNIO_CUDA_OBJECTS"):
        kernel_objects = prebuilt_objects(os.environ["GNNIO_CUDA_OBJECTS"])
        kernel_sources = []
    binding_sources = sorted(glob.glob("csrc/torch/cuda/*.cpp"))
    return CUDAExtension(
        "gnnio._C", cpu_sources + kernel_sources + binding_sources, include_dirs=include_dirs,
        extra_objects=kernel_objects, depends=_headers() + kernel_objects,
        define_macros=[("GNNIO_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": NVCC_FLAGS},
        extra_link_args=["-fopenmp", "-lcusparse"])


def _build_ext():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=True)


setup(
    name="gnnio",
    version="0.1.0",
    description="IO-aware GPU kernels for graph neural network layers, drop-in for PyTorch Geometric",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"gnnio": ["data/*.mtx.gz"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": _build_ext()},
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy"],
    extras_require={"pyg": ["torch_geometric>=2.8"], "bench": ["torch_geometric>=2.8", "matplotlib", "tqdm"],
                    "test": ["pytest", "torch_geometric>=2.8", "matplotlib"]},
    # `gnnio bench ...` (= python -m gnnio.bench ...); gnnio-bench is the older name of it.
    entry_points={"console_scripts": ["gnnio=gnnio.cli:main", "gnnio-bench=gnnio.cli:bench"]},
)
