#!/usr/bin/env bash
# Install the Debian packages meshtrain needs to build, test and run the demo.
# Idempotent: asks dpkg which packages are missing and installs only those
# (running `apt-get update` once first). As root it installs; otherwise it prints
# the sudo command to run and exits 1. Prints one summary line.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
    build-essential cmake pkg-config   # C11 toolchain and build
    libomp-dev                         # OpenMP (gcc uses its own libgomp; clang needs this)
    libopenblas-dev libopenblas-openmp-dev  # CBLAS for the CPU kernels; the OpenMP
                                       # build shares our thread pool (CMakeLists.txt)
    libdnnl-dev                        # oneDNN: fp32 GEMMs on AVX-512, bf16 on AMX
                                       # (kernels/cpu/gemm.c dlopens it; docs/cpu_gemm.md)
    libyaml-dev libcjson-dev           # config files, metrics / HF config.json
    libcriterion-dev                   # tests
    openmpi-bin libopenmpi-dev         # multi-process runs and the MPI tests
    python3 python3-numpy python3-torch  # reference tests (/usr/bin/python3)
    python3-venv python3-pip           # .venv-hf for the transformers parity test
    sentencepiece python3-sentencepiece  # tokenizer training and corpus encoding
    bible-kjv bible-kjv-text           # the corpus source (`bible` and its text)
    python3-matplotlib                 # bench/plot (loss curves, scenario comparison)
)

command -v dpkg-query >/dev/null || {
    echo "install-deps: dpkg-query not found; this script supports Debian 12 and derivatives" >&2
    exit 1
}

missing=()
for p in "${packages[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)"
    [[ "$status" == ii* ]] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${#missing[@]} package(s); run:" >&2
    echo "sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
        >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "install-deps: apt-get failed installing: ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: installed ${#missing[@]} package(s): ${missing[*]}"
