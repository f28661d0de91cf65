#!/usr/bin/env bash
# tests/test_install.sh BUILD_DIR: the installed package, as research code sees it.
#  - `cmake --install BUILD_DIR --prefix TMP` puts meshtrain.h, libmeshtrain.{a,so},
#    the CMake package and meshtrain.pc there, and no internal header;
#  - meshtrain.h compiles on its own as C11 with -Wall -Wextra -pedantic -Werror;
#  - examples/ is configured as a separate CMake project with
#    CMAKE_PREFIX_PATH=TMP (find_package(meshtrain)), built, and its programs load
#    the INSTALLED libmeshtrain.so (not the build tree's);
#  - both examples run on tiny synthetic shards: custom_loop's own loss must fall
#    (its exit status), probe_activations must print finite probes of its layer;
#  - the static-library build of custom_loop runs; the pkg-config Makefile builds.
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_install.sh BUILD_DIR}"
src="$(cd "$(dirname "$0")/.." && pwd)"
mt_need_python3

mt_tmp
prefix="$tmp/prefix"

if ! cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1
fi
for f in include/meshtrain.h lib/libmeshtrain.a lib/libmeshtrain.so lib/pkgconfig/meshtrain.pc \
         lib/cmake/meshtrain/meshtrainConfig.cmake lib/cmake/meshtrain/meshtrainConfigVersion.cmake \
         bin/meshtrain share/meshtrain/configs/base.yml; do
    [ -f "$prefix/$f" ] || fail "not installed: $f"
done
n_headers=$(find "$prefix/include" -name '*.h' | wc -l)
[ "$n_headers" -eq 1 ] || fail "expected only meshtrain.h under include/, found $n_headers headers"

# The public header alone, strictly.
printf '#include <meshtrain.h>\nint main(void) { return mt_version()[0] == 0; }\n' > "$tmp/h.c"
gcc -std=c11 -Wall -Wextra -pedantic -Werror -I"$prefix/include" -c "$tmp/h.c" -o "$tmp/h.o" \
    || fail "meshtrain.h does not compile on its own"

# Examples against the installed package.
if ! { cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
       && cmake --build "$tmp/ex" -j2; } > "$tmp/ex.log" 2>&1; then
    cat "$tmp/ex.log"; echo "FAIL: building examples against the installed package"; exit 1
fi
lib_used=$(ldd "$tmp/ex/custom_loop" | awk '/libmeshtrain/ {print $3}')
case "$lib_used" in
    "$prefix"/*) ;;
    *) fail "custom_loop loads libmeshtrain from '$lib_used', not from the install prefix" ;;
esac

# A tiny llama and synthetic shards (a noisy repeating pattern: learnable).
mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
mt_run_yml <<YML
per_device_batch_size: 4
max_target_length: 32
steps: 20
learning_rate: 0.01
seed: 1
YML
mt_shards "$tmp/data" 3 train_000.bin=6000 val_000.bin=1000

if "$tmp/ex/custom_loop" "$tmp/cfg/run.yml" > "$tmp/cl.out" 2>&1; then
    grep -q "^step  20" "$tmp/cl.out" || fail "custom_loop did not print 20 steps: $(cat "$tmp/cl.out")"
    grep -q "^eval batch" "$tmp/cl.out" || fail "custom_loop printed no evaluation"
else
    fail "custom_loop exited $? (1 = its loss did not fall): $(cat "$tmp/cl.out")"
fi
tail -n 3 "$tmp/cl.out"

if PROBE_LAYER=1 PROBE_EVERY=5 "$tmp/ex/probe_activations" "$tmp/cfg/run.yml" steps=10 > "$tmp/pr.out" 2>&1; then
    n=$(grep -c "^probe step .* layer 1 " "$tmp/pr.out")
    [ "$n" -eq 3 ] || fail "probe_activations printed $n probes of layer 1, expected 3 (steps 0, 5, 10)"
    grep "^probe step" "$tmp/pr.out" | grep -qi "nan" && fail "probe printed NaN"
else
    fail "probe_activations exited $?: $(cat "$tmp/pr.out")"
fi
grep "^probe step" "$tmp/pr.out"

"$tmp/ex/custom_loop_static" "$tmp/cfg/run.yml" steps=3 > "$tmp/cls.out" 2>&1
rc=$?
[ $rc -le 1 ] || fail "static custom_loop exited $rc: $(cat "$tmp/cls.out")"
grep -q "^step   3" "$tmp/cls.out" || fail "static custom_loop did not run 3 steps"

# pkg-config variant.
if command -v pkg-config >/dev/null; then
    mkdir -p "$tmp/pc" && cp "$src/examples/"*.c "$src/examples/Makefile" "$tmp/pc/"
    if PKG_CONFIG_PATH="$prefix/lib/pkgconfig" make -s -C "$tmp/pc" > "$tmp/pc.log" 2>&1; then
        "$tmp/pc/custom_loop" "$tmp/cfg/run.yml" steps=2 > "$tmp/pcr.out" 2>&1
        [ $? -le 1 ] || fail "pkg-config custom_loop failed: $(cat "$tmp/pcr.out")"
    else
        fail "pkg-config build failed: $(cat "$tmp/pc.log")"
    fi
fi

mt_finish "install and examples: ok"
