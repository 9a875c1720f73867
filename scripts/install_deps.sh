#!/usr/bin/env bash
# Installs every Debian package gradcomp needs to build, test and run its examples.
# Idempotent: packages already present are not downloaded again, and `apt-get update`
# runs only when something is missing. Used by the README, .ci/run and the Dockerfile.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev pybind11-dev python3-pybind11
  python3-numpy python3-pytest
  python3-torch libtorch-dev
  python3-sklearn python3-matplotlib python3-cloudpickle
  python3-venv python3-pip python3-setuptools python3-wheel
  python3-mock python3-packaging python3-psutil
  iproute2 iputils-ping procps
  libsimgrid-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
