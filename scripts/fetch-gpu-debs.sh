#!/usr/bin/env bash
# scripts/fetch-gpu-debs.sh: download (not install) the Debian packages that the GPU
# build needs beyond the CUDA toolkit into gpu-debs/ (git-ignored), so they can travel
# to a GPU machine that reaches no package registry. bench/gpu_check.sh unpacks them
# with `dpkg -x` into a private prefix; nothing is installed on either machine.
#
# What: Criterion (tests) and its shared-library closure, libyaml and cJSON (config,
# metrics), OpenBLAS's OpenMP build with its Fortran runtime (the CPU reference backend),
# and pkgconf (CMake's pkg_check_modules). Not: libc, libgcc, libstdc++, libgomp (the
# GPU machine's compiler brings its own), Open MPI (optional in the build).
# Usage: scripts/fetch-gpu-debs.sh [DIR]   (default: <repo>/gpu-debs). Needs apt-get
# and the Debian 12 package lists (`apt-get update`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/gpu-debs}
mkdir -p "$dir"
pkgs=(
  # development packages: headers, .so links, .pc files
  libcriterion-dev libboxfort-dev libyaml-dev libcjson-dev libopenblas-openmp-dev
  # their runtime libraries
  libcriterion3 libyaml-0-2 libcjson1 libopenblas0-openmp libgfortran5 libquadmath0
  # Criterion's own dependencies (libgit2, nanomsg and their closure)
  libffi8 libgit2-1.5 libnanomsg5 libhttp-parser2.9 libmbedtls14 libmbedx509-1 libmbedcrypto7
  libssh2-1 libpcre2-8-0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2
  libkeyutils1 libssl3 zlib1g
  # pkg-config, in case the GPU machine has none
  pkgconf pkgconf-bin libpkgconf3
)
cd "$dir"
rm -f ./*.deb
apt-get download "${pkgs[@]}"
echo "fetch-gpu-debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dir"
