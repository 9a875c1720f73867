#!/usr/bin/env bash
# Here, on the Debian 12 development machine: downloads the Debian packages that a GPU machine
# without MPI, spdlog, fmt or GoogleTest needs to build and run gradcomp (Open MPI with the
# libraries its components load, spdlog, fmt, GoogleTest, pybind11's CMake files) into
# .device/debs (git-ignored, ~9 MB). A device `run` carries them (carry [".device"]) and
# scripts/device/check.sh unpacks them there into a prefix of their own (dpkg -x), nothing
# installed into the machine's /usr.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
  ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 libnuma1 libpsm-infinipath1 libpsm2-2
  libmunge2 libltdl7
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev pybind11-dev
)
if ! apt-cache show libopenmpi3 >/dev/null 2>&1; then apt-get update -qq; fi
rm -rf .device/debs
mkdir -p .device/debs
(cd .device/debs && apt-get download -qq "${PACKAGES[@]}" 2>&1 | grep -v "unsandboxed" || true)
count=$(ls .device/debs/*.deb | wc -l)
if [ "$count" -ne "${#PACKAGES[@]}" ]; then
  echo "fetch_deps: got $count of ${#PACKAGES[@]} packages in .device/debs" >&2
  exit 1
fi
echo "fetch_deps: $count packages, $(du -sh .device/debs | cut -f1), in .device/debs: carry .device"
