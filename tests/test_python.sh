#!/usr/bin/env bash
# tests/test_python.sh BUILD_DIR: the ctypes binding's tests (python/tests) with
# Debian's /usr/bin/python3 and NumPy against BUILD_DIR/libmeshtrain.so.
# Uses pytest when python3-pytest is installed, else unittest (the tests are plain
# unittest cases). Skipped (77) without /usr/bin/python3 + numpy.
set -u
build="${1:?usage: test_python.sh BUILD_DIR}"
src="$(cd "$(dirname "$0")/.." && pwd)"
py=/usr/bin/python3
lib="$build/libmeshtrain.so"
[ -f "$lib" ] || { echo "no $lib"; exit 1; }
"$py" -c "import numpy" 2>/dev/null || { echo "/usr/bin/python3 with numpy not found: skipped"; exit 77; }
export MESHTRAIN_LIB="$lib" PYTHONDONTWRITEBYTECODE=1
cd "$src/python"
if "$py" -c "import pytest" 2>/dev/null; then
    exec "$py" -m pytest -q -p no:cacheprovider tests
fi
exec "$py" -m unittest discover -s tests -v
