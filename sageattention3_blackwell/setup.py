"""Build of sageattn3. Metadata lives in pyproject.toml; this file adds the CUDA extension and the run
requirements, whose torch floor depends on the extension's build.

SAGE_BUILD_CUDA=1 builds it or fails, =0 skips it; unset, it is built when torch with CUDA and nvcc are present
(pip install --no-build-isolation .), else the reason is printed. TORCH_CUDA_ARCH_LIST picks the archs (default:
every arch of sageattn3/archs.py that nvcc can target), MAX_JOBS the parallel compile jobs. Against torch >= 2.10
it is the stable-ABI build (sageattn3/_C.abi3.so, for every torch >= 2.10 and CPython >= 3.10), else the
version-specific one; SAGE_STABLE_ABI=0/1 chooses (docs/building.md). Neither a GPU nor the network is needed.
The rules are in build_rules.py; build_support.py and cuda_setup.py are what sageattention's build shares.
"""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_rules  # noqa: E402
import cuda_setup  # noqa: E402


def plan(ask_nvcc):
    return build_rules.plan(os.environ.get("TORCH_CUDA_ARCH_LIST"), ask_nvcc("--version"),
                            ask_nvcc("--list-gpu-arch"))


setup(**cuda_setup.setup_args("sageattn3", plan, build_rules.TORCH_FLOOR, build_rules.REQUIREMENTS))
