#!/usr/bin/env bash
# tests/test_pkgconfig.sh BUILD_DIR: the installed meshtrain.pc names its static
# dependencies without absolute file paths, and a fully static link of libmeshtrain.a
# works from pkg-config alone.
#  - Libs.private holds only -l<name>, -L${<var>} (a variable of the .pc) and flags:
#    no absolute path (a /usr/local/cuda/lib/libcudart.so of the build machine);
#  - Requires.private names the modules pkg-config knows (yaml-0.1, libcjson);
#  - every archive member of libmeshtrain.a is linked (--whole-archive, so every
#    backend's dependency must be in `pkg-config --static --libs meshtrain`) into a
#    program that plans a tiny model (mt_memory_from_config), and it runs.
# Skipped (77) without pkg-config.
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_pkgconfig.sh BUILD_DIR}"
src="$(cd "$(dirname "$0")/.." && pwd)"
command -v pkg-config >/dev/null || { echo "pkg-config not found: skipped"; exit 77; }

mt_tmp
prefix="$tmp/prefix"

if ! cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1
fi
pc="$prefix/lib/pkgconfig/meshtrain.pc"
[ -f "$pc" ] || { echo "FAIL: no $pc"; exit 1; }
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"

# The raw field, as written in the file (before pkg-config expands variables).
raw=$(sed -n 's/^Libs.private:[[:space:]]*//p' "$pc")
echo "Libs.private: $raw"
for tok in $raw; do
    case "$tok" in
        -l*|-fopenmp|-pthread) ;;
        '-L${'*'}') ;;
        *) fail "Libs.private token '$tok' is not -l<name>, -L\${variable} or a flag" ;;
    esac
done
grep -q '^Requires.private:.*yaml-0.1' "$pc" || fail "Requires.private lacks yaml-0.1: $(grep Requires "$pc")"
grep -q '^Requires.private:.*libcjson' "$pc" || fail "Requires.private lacks libcjson"
# No absolute path to a library file anywhere in the .pc.
grep -E '/[^ ]*\.(so|a)([. ]|$)' "$pc" && fail "the .pc names a library file by path"

libs=$(pkg-config --static --libs meshtrain) || { echo "FAIL: pkg-config --static --libs meshtrain"; exit 1; }
cflags=$(pkg-config --cflags meshtrain) || fail "pkg-config --cflags meshtrain"
libdir=$(pkg-config --variable=libdir meshtrain)
echo "pkg-config --static --libs: $libs"
# libmeshtrain.a whole, in place of -lmeshtrain (which would pick the .so).
static_libs=$(printf '%s\n' "$libs" | sed 's/-lmeshtrain\b/-Wl,--whole-archive -l:libmeshtrain.a -Wl,--no-whole-archive/')
cat > "$tmp/s.c" <<'C'
#include <meshtrain.h>
#include <stdio.h>
/* The memory plan of a config (YAML parsing, the model, the CPU backend): runs the
 * statically linked library, not only links it. */
int main(int argc, char **argv) {
    mt_memory_info m;
    if (argc < 2 || mt_memory_from_config(argv[1], 0, NULL, &m) != 0) {
        fprintf(stderr, "plan: %s\n", argc < 2 ? "no config" : mt_last_error());
        return 1;
    }
    printf("meshtrain %s static: plan of %lld params, peak %zu bytes\n", mt_version(), (long long)m.num_params,
           m.peak_bytes);
    return m.num_params > 0 && m.peak_bytes > 0 ? 0 : 1;
}
C
if cc -std=c11 -Wall -Wextra $cflags -o "$tmp/s" "$tmp/s.c" $static_libs > "$tmp/cc.log" 2>&1; then
    ldd "$tmp/s" | grep -q libmeshtrain && fail "the static program loads libmeshtrain.so"
    # the -L directories of shared dependencies (CUDA runtime) for the loader
    ldp=$(printf '%s\n' $libs | sed -n 's/^-L//p' | grep -v "^$libdir\$" | tr '\n' ':')
    if LD_LIBRARY_PATH="$ldp${LD_LIBRARY_PATH:-}" "$tmp/s" "$src/configs/models/llama3-tiny.yml" > "$tmp/run.out" 2>&1; then
        cat "$tmp/run.out"
        grep -q "static" "$tmp/run.out" || fail "static program printed: $(cat "$tmp/run.out")"
    else
        fail "static program failed: $(cat "$tmp/run.out")"
    fi
else
    fail "static pkg-config link failed: $(tail -n 20 "$tmp/cc.log")"
fi

mt_finish "pkg-config static link: ok"
