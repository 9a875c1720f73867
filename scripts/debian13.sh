#!/usr/bin/env bash
# The second tested platform: a Debian 13 (trixie) root made by debootstrap, with torch 2.6,
# Open MPI 5, GCC 14 and Python 3.13, in which gradcomp is built and tested as on Debian 12.
#
#   bash scripts/debian13.sh make          # make the root (or reuse it): minutes, the first time
#   bash scripts/debian13.sh run CMD ...   # run CMD in the project's clone inside the root
#   bash scripts/debian13.sh test          # what CI runs there (see test_in_root below)
#
# The root lives outside the clone, in $GRADCOMP_DEBIAN13_ROOT (default
# /var/cache/gradcomp/debian13), and is made again when it is missing or when the package list
# (scripts/install_deps.sh, which runs inside it) has changed since it was made. `run` binds this
# clone onto /gradcomp in the root, ../shared (when there is one) onto /shared, and the root's own
# build folder (build-debian13/ here) onto /gradcomp/build, so both platforms build from the same
# working tree without sharing build outputs. Everything is mounted inside a mount namespace of
# its own (unshare), so nothing stays mounted when the command ends, however it ends. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
CLONE=$(pwd)
ROOTFS=${GRADCOMP_DEBIAN13_ROOT:-/var/cache/gradcomp/debian13}
MIRROR=${GRADCOMP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
stamp_file="$ROOTFS/.gradcomp-packages"
# The root is what debootstrap and install_deps.sh make of it: both scripts' texts are its key.
wanted_stamp=$( (sed -n '/^make_root()/,/^}/p' "$0"; cat scripts/install_deps.sh) | sha256sum | cut -d' ' -f1)

die() { echo "debian13: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"

# Runs the command "$@" in /gradcomp inside the root, with the project bound in: this script again,
# as `__mounted`, in a mount namespace of its own.
in_root() {
  mkdir -p "$CLONE/build-debian13"
  unshare --mount --propagation private -- bash "$CLONE/scripts/debian13.sh" __mounted "$@"
}

# The part of in_root that runs inside the new mount namespace.
mounted() {
  local shared=""
  [ -d "$CLONE/../shared" ] && shared=$(cd "$CLONE/../shared" && pwd -P)
  # ip netns exec (the emulated-cluster tests) needs / to be a mount point inside the root.
  mount --bind "$ROOTFS" "$ROOTFS"
  mount --rbind /proc "$ROOTFS/proc"
  mount --rbind /sys "$ROOTFS/sys"
  mount --rbind /dev "$ROOTFS/dev"
  mkdir -p "$ROOTFS/gradcomp" "$ROOTFS/shared"
  mount --bind "$CLONE" "$ROOTFS/gradcomp"
  mkdir -p "$ROOTFS/gradcomp/build"
  mount --bind "$CLONE/build-debian13" "$ROOTFS/gradcomp/build"
  [ -z "$shared" ] || mount --bind "$shared" "$ROOTFS/shared"
  cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
  exec chroot "$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive \
    bash -c 'cd /gradcomp && exec "$@"' bash "$@"
}

make_root() {
  local tmp="$ROOTFS.new"
  rm -rf "$tmp"
  mkdir -p "$(dirname "$ROOTFS")"
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
  }
  debootstrap --variant=minbase trixie "$tmp" "$MIRROR"
  # apt's sandbox user cannot always read the bind-mounted clone; the root is a build root.
  echo 'APT::Sandbox::User "root";' > "$tmp/etc/apt/apt.conf.d/01gradcomp-sandbox"
  rm -rf "$ROOTFS"
  mv "$tmp" "$ROOTFS"
  in_root bash scripts/install_deps.sh
  in_root apt-get clean
}

# CI's Debian 13 stage: what differs here is GCC 14, Open MPI 5 and Python 3.13 (the C++ suites run
# on Debian 12, under the sanitizers too; every Python suite runs on pip's torch 2.13 there). So:
# the library and the Python package built once, by `pip install .` into a venv, and every product
# header, with GCC 14 under warnings as errors (no C++ test binaries); the Python suites that meet
# Open MPI 5's launcher and transports (each once: -np 2, or the forced two nodes for the
# hierarchy), on torch 2.6, and one started by the
# env:// variables alone (a world without MPI: POSIX shared memory, TCP; Debian's torchrun does not
# start, its store lacking libuv); the fault matrix (test_faults.py: what a user sees from Open MPI 5's
# launcher when a rank dies, stops, mismatches or its link goes silent) and Horovod's own suite,
# all against that installed package; the venv's digits job runs the example through gcrun (the
# examples' suite runs on pip's torch 2.13). The simulation suite (SimGrid 4.0 here, 3.32 on Debian 12) is
# not in this stage for CI's time: it needs a second build of the data plane against SMPI. It
# passes here (GRADCOMP_SIM_BUILD_DIR=build/sim python3 -m pytest test/python/test_simulation.py)
# since simulate.py puts its fat tree inside a zone of its own (SimGrid 4.0 crashes on a root one).
debian13_suites="^pytest_(codec|torch_versions|numpy_np2|torch_np2|torch_parity_np2|ddp_hook_np2|process_sets_np4_two_nodes|adasum_np4_two_nodes|torch_compile_np2|fsdp_np2_compressed|fsdp_np4_two_nodes|gcrun|envrun_process_sets_np4_two_nodes|envrun_numpy_without_torch_np3|faults)$"
test_in_root() {
  [ -f "$CLONE/../shared/horovod-conformance/run.sh" ] || die "Horovod's suite is not in ../shared/horovod-conformance"
  local venv=/tmp/gradcomp-venv/venv
  # Every product header compiled alone (only those units: the header check needs no library).
  in_root cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_WERROR=ON -DGRADCOMP_BUILD_TESTS=ON \
    -DGRADCOMP_BUILD_BENCHMARKS=OFF
  in_root cmake --build build -j "$(nproc)" --target gradcomp_header_check
  # The stage's one build of gradcomp: `pip install .` with warnings as errors, as a user installs
  # it (scripts/check_pip_install.sh, which then runs its digits job); the suites and Horovod's
  # then import that package (GRADCOMP_TEST_INSTALLED, as the pip-torch stage's do).
  in_root env GRADCOMP_CMAKE_ARGS=-DGRADCOMP_WERROR=ON bash scripts/check_pip_install.sh "$venv"
  local tests=/tmp/gradcomp-venv/tests
  in_root rm -rf "$tests"
  in_root cmake -S . -B "$tests" -G Ninja -DGRADCOMP_TEST_INSTALLED=ON -DGRADCOMP_PYTHON="$venv/bin/python"
  in_root bash -c 'cd "$1" && exec ctest --output-on-failure -j "$(($(nproc) + 1))" --timeout 900 -R "$0"' \
    "$debian13_suites" "$tests"
  in_root bash scripts/check_horovod.sh build/horovod-conformance.log "$venv/bin/python"  # build-debian13/ here
}

case "${1:-}" in
  test)
    bash "$0" make
    test_in_root
    ;;
  make)
    if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$wanted_stamp" ]; then
      echo "debian13: root $ROOTFS is up to date"
    else
      echo "debian13: making the Debian 13 root in $ROOTFS"
      make_root
      echo "$wanted_stamp" > "$stamp_file"
      echo "debian13: root ready ($(du -sh "$ROOTFS" | cut -f1))"
    fi
    ;;
  run)
    shift
    [ $# -gt 0 ] || die "run needs a command"
    [ -f "$stamp_file" ] || die "no root in $ROOTFS: run 'bash scripts/debian13.sh make' first"
    in_root "$@"
    ;;
  __mounted) shift; mounted "$@" ;;
  *) die "usage: bash scripts/debian13.sh make | run CMD ... | test" ;;
esac
