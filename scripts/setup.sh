#!/usr/bin/env bash
# Installs everything fsdp2 needs on a fresh Debian 12 machine. Idempotent and
# non-interactive: packages already present are skipped, and a second run is a
# no-op apart from the `apt-get` check.
#
# Two parts: Debian's packages (the build, the bindings, the launchers), and
# one Python environment per machine, outside the clone (FSDP2_VENV, default
# /opt/fsdp2/venv), holding PyTorch 2.11.0 from PyPI: its torch/ folder is
# the LibTorch the build links (CPU, CUDA and NCCL), and its interpreter runs
# the Python bindings' tests and every PyTorch reference.
set -euo pipefail

PACKAGES=(
  # Build system (offline Bazel 4.2.3 and the local rule sets it loads).
  bazel-bootstrap bazel-platforms bazel-rules-java
  # Compiler and the C++ libraries the core links.
  g++ libabsl-dev nlohmann-json3-dev
  # The checksums of checkpoint files (libdeflate's CRC-32, linked in).
  libdeflate-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Declarations only: PyTorch's wheel installs no gloo headers, while
  # ProcessGroupGloo.hpp includes them (third_party/libtorch/libtorch.bzl
  # says why the version cannot matter, and //core/comm:gloo_headers_test
  # proves it).
  libgloo-dev
  # Bindings and their tests (the venv below is made from this python3;
  # //packaging:wheel_test installs the wheel into a fresh environment that
  # sees Debian's numpy).
  swig python3-dev python3-venv python3-numpy default-jdk-headless junit5
  # Tools the scripts use; iproute2 (ip netns, veth) makes the hosts of
  # //tests:multihost_test.
  python3 procps iproute2
  # Outside launchers //tests:launchers_test runs the main job under.
  openmpi-bin slurm-wlm munge
  # The API reference (//docs:api, //docs:api_reference_test).
  doxygen
  # Packaging tests (//packaging): the C/C++ install built with pkg-config
  # and CMake.
  pkg-config cmake
  # The allocator every rank runs with (core/launch/allocator.h): glibc's
  # malloc faults large buffers in afresh every step, 2x slower here.
  libtcmalloc-minimal4
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python environment. torch is pinned to 2.11.0, the version of the GPU
# machine's PyTorch (2.11.0+cu130), so that binaries built here run there; the
# PyPI wheel is the CUDA 13.0 build and brings its CUDA, cuDNN and NCCL
# 2.28.9 libraries and headers as nvidia-* wheels (about 3 GB, once per
# machine). The marker file records what was installed: a second run with the
# same requirements does nothing. transformers (5.24.0, with huggingface-hub
# and tokenizers, about 20 MB) is what the Hugging Face checkpoint tests
# compare fsdp2 with (tests/hf/hf_reference.py); the training processes never
# import it. peft (0.21.2, pure Python) is what the LoRA tests compare with
# and load fsdp2's adapters in (tests/hf/sft_reference.py).
VENV=${FSDP2_VENV:-/opt/fsdp2/venv}
REQUIREMENTS=(torch==2.11.0 numpy pytest safetensors transformers==5.24.0 peft==0.21.2)
marker="$VENV/.fsdp2-requirements"
if [[ ! -x "$VENV/bin/python3" || "$(cat "$marker" 2>/dev/null)" != "${REQUIREMENTS[*]}" ]]; then
  echo "setup: making $VENV with ${REQUIREMENTS[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 && ! -w "$(dirname "$VENV")" ]]; then SUDO="sudo"; fi
  $SUDO mkdir -p "$VENV"
  if [[ ! -x "$VENV/bin/python3" ]]; then $SUDO /usr/bin/python3 -m venv "$VENV"; fi
  $SUDO "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}"
  echo "${REQUIREMENTS[*]}" | $SUDO tee "$marker" >/dev/null
fi
echo "setup: $("$VENV/bin/python3" -c 'import torch; print("torch", torch.__version__, "in", torch.__path__[0])')" >&2
