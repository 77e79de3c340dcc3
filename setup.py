"""Build of sageattention. Metadata lives in pyproject.toml; this file only adds the compiled CUDA extensions.

SAGE_BUILD_CUDA=1 builds them or fails, =0 gives a pure-Python package (Triton kernels only); unset, they are
built when torch with CUDA and nvcc are present (pip install --no-build-isolation .), else the reason is printed.
TORCH_CUDA_ARCH_LIST picks the archs (default: every supported arch nvcc can target), MAX_JOBS the parallel
compile jobs, SAGE_BUILD_FAMILIES (e.g. "sm90") only some of the modules. Against torch >= 2.10 they are
stable-ABI modules (_C_<family>.abi3.so, for every torch >= 2.10 and CPython >= 3.10), else version-specific ones;
SAGE_STABLE_ABI=0/1 chooses. Neither a GPU nor its driver is needed.
The rules are in build_rules.py; what sageattn3's build shares, in sageattention3_blackwell/build_support.py and
cuda_setup.py; docs/building.md.
"""
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "sageattention3_blackwell")]  # the build support both packages share
import build_rules  # noqa: E402
import cuda_setup  # noqa: E402


def plan(ask_nvcc):
    return build_rules.plan(os.environ.get("TORCH_CUDA_ARCH_LIST"), ask_nvcc("--version"),
                            ask_nvcc("--list-gpu-arch"), families=os.environ.get("SAGE_BUILD_FAMILIES"))


setup(**cuda_setup.setup_args("sageattention", plan, build_rules.TORCH_FLOOR, build_rules.REQUIREMENTS))
