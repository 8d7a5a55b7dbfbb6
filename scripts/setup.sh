#!/usr/bin/env bash
# Installs everything fsdp2 needs on a fresh Debian 12 machine. Idempotent and
# non-interactive: packages already present are skipped, and a second run is a
# no-op apart from the `apt-get` check.
set -euo pipefail

PACKAGES=(
  # Build system (offline Bazel 4.2.3 and the local rule sets it loads).
  bazel-bootstrap bazel-platforms bazel-rules-java
  # Compiler and the C++ libraries the core links.
  g++ libtorch-dev libgloo-dev libabsl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Fast BLAS: LibTorch takes GEMM from libblas.so.3, and the reference BLAS
  # is ~40x slower here (see shared/notes/build-environment.md).
  libopenblas0-openmp
  # Bindings and their tests.
  swig python3-dev python3-numpy python3-pytest default-jdk-headless junit5
  # Tools the scripts use; iproute2 (ip netns, veth) makes the hosts of
  # //tests:multihost_test.
  python3 procps iproute2
  # Outside launchers //tests:launchers_test runs the main job under.
  openmpi-bin slurm-wlm munge
  # Packaging tests (//packaging): a fresh virtual environment for the
  # wheel, and the C/C++ install built with pkg-config and CMake.
  python3-venv pkg-config cmake
  # The allocator every rank runs with (core/launch/allocator.h): glibc's
  # malloc faults large buffers in afresh every step, 2x slower here.
  libtcmalloc-minimal4
)

# PyTorch (Debian's python3-torch) is the tests' reference: models are
# written in PyTorch, scripted and trained by it at test time, and the
# benchmarks run PyTorch's own DDP beside the engine. (--with-python-torch,
# which used to add it, is still accepted.)
PACKAGES+=(python3-torch)

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

# Some virtual CPUs are not recognised by OpenBLAS, which then falls back to
# generic kernels; the launcher and test harness pick OPENBLAS_CORETYPE from
# the CPU's vector units themselves (on the 2-core AMD EPYC here, auto-detected,
# Haswell and Zen kernels measured alike). This line only reports which BLAS
# libblas.so.3 resolves to.
echo "setup: libblas.so.3 -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')" >&2
