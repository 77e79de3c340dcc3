#!/usr/bin/env bash
# Fetches into .whl/ (git-ignored) the engines that multigpu/run_engines.py runs and the packages their attention paths
# import that a CUDA torch image (torch, triton, numpy and torch's own dependencies) lacks: ~17 MB, for CPython 3.12
# on x86-64 Linux. Run it on a machine with network access; the GPU machine gets .whl/ with the working tree.
# para-attn publishes only a source archive: it is built here into its (pure-Python) wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pip_download() { python3 -m pip download --no-deps --only-binary=:all: -d .whl "$@"; }
# the engines
pip_download xfuser==0.7.0 yunchang==0.6.4
python3 -m pip wheel --no-deps -w .whl para-attn==0.3.38
# what xDiT's attention path imports (diffusers and its imports); not huggingface_hub: the image's own serves
# diffusers, and a carried 2.x breaks the image's transformers (it asks for < 2.0)
pip_download diffusers==0.42.1 tqdm==4.70.1 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 h11==0.16.0 einops==0.8.2 packaging==26.4 requests==2.34.2 urllib3==2.8.0 idna==3.20 \
  certifi==2026.10.19.post1
pip_download --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 pillow==13.0.0 pyyaml==6.0.4 safetensors==0.8.0
ls -l .whl
