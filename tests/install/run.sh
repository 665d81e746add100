#!/usr/bin/env bash
# tests/install/run.sh : `cmake --install` of a built tree into a temporary prefix,
# then consumer.c built against the installed tree as a user would and run:
#   CMake, find_package(flashc) (CMakeLists.txt here): flashc::flashc, flashc::flashc_static
#   pkg-config: `cc $(pkg-config --cflags --libs flashc)`, and with --static and
#   libflashc.a named to the linker
# It checks the installed files, the shared library's SONAME and symlinks, that
# the shared programs need that SONAME and the static ones no libflashc.so, and
# that flashc.pc, `flashc --version` and the consumers report the header's
# version. It builds nothing of the library (test.sh runs it on the Release build).
#
#   bash tests/install/run.sh [BUILD_DIR]    (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() { echo "install test: $*" >&2; exit 1; }
# run a command, showing its output only when it fails
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "failed: $*"; }; }

quiet cmake --install "$build" --prefix "$prefix"
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
export PKG_CONFIG_PATH=$libdir/pkgconfig
# the version of the header this test sits beside: MAJOR.MINOR.PATCH
version=$(sed -n 's/^#define FLASHC_VERSION_[A-Z]* \([0-9]*\)$/\1/p' "$here/../../include/flashc.h" |
  paste -sd.)
soname=libflashc.so.${version%.*}

# ---- the installed files ----
for f in "$prefix/include/flashc.h" "$prefix/bin/flashc" "$libdir/libflashc.a" \
         "$libdir/libflashc.so.$version" "$libdir/cmake/flashc/flashcConfig.cmake" \
         "$libdir/cmake/flashc/flashcConfigVersion.cmake" \
         "$libdir/cmake/flashc/flashcTargets.cmake" "$libdir/pkgconfig/flashc.pc"; do
  [ -f "$f" ] || fail "not installed: ${f#$prefix/}"
done
[ "$(readlink "$libdir/libflashc.so")" = "$soname" ] || fail "libflashc.so does not link to $soname"
[ "$(readlink "$libdir/$soname")" = "libflashc.so.$version" ] ||
  fail "$soname does not link to libflashc.so.$version"
readelf -d "$libdir/libflashc.so.$version" | grep -q "SONAME.*\[$soname\]" ||
  fail "libflashc.so.$version has no SONAME $soname"
[ "$(pkg-config --modversion flashc)" = "$version" ] ||
  fail "flashc.pc says version '$(pkg-config --modversion flashc)', not $version"
[ "$("$prefix/bin/flashc" --version)" = "flashc $version" ] ||
  fail "flashc --version says '$("$prefix/bin/flashc" --version)', not 'flashc $version'"

# ---- consumers ----
# check PROGRAM shared|static: it runs and prints the version; a shared one needs
# the SONAME, a static one no libflashc.so
check() {
  local needed out
  needed=$(readelf -d "$1" | grep NEEDED || true)
  case $2 in
    shared) grep -q "\[$soname\]" <<<"$needed" || fail "$(basename "$1") does not need $soname" ;;
    static) ! grep -q libflashc <<<"$needed" || fail "$(basename "$1") needs libflashc.so" ;;
  esac
  out=$(LD_LIBRARY_PATH=$libdir "$1") || fail "$(basename "$1") failed: $out"
  [ "$out" = "consumer: flashc $version ok" ] || fail "$(basename "$1") said: $out"
  echo "  $(basename "$1"): $out"
}

quiet cmake -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DFLASHC_VERSION="$version"
quiet cmake --build "$work/cmake" -j2
check "$work/cmake/consumer_shared" shared
check "$work/cmake/consumer_static" static

# shellcheck disable=SC2046  # pkg-config's flags are words
cc "$here/consumer.c" -o "$work/pkgconfig_shared" $(pkg-config --cflags --libs flashc)
check "$work/pkgconfig_shared" shared
# -lflashc would pick libflashc.so, installed beside libflashc.a: name the archive
libs=$(pkg-config --static --libs flashc)
# shellcheck disable=SC2046,SC2086
cc "$here/consumer.c" -o "$work/pkgconfig_static" $(pkg-config --cflags flashc) ${libs/-lflashc /-l:libflashc.a }
check "$work/pkgconfig_static" static
echo "install test: ok (flashc $version, $(grep -q -- -lcudart_static "$libdir/pkgconfig/flashc.pc" && echo "with" || echo "without") CUDA)"
