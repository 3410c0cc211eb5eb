#!/bin/sh
# Checks that the runtime stays MLIR-free: no LLVM/MLIR library among its (transitive) dependencies, no LLVM/MLIR include in its sources.
# usage: check_no_mlir.sh LIBRARY RUNTIME_SOURCE_DIR
set -u

lib=$1
src=$2
status=0

for tool in readelf ldd grep; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "FAIL: '$tool' is not installed; this check needs it" >&2
    exit 1
  fi
done
if [ ! -f "$lib" ] || [ ! -d "$src" ]; then
  echo "FAIL: usage: $0 LIBRARY RUNTIME_SOURCE_DIR (got '$lib', '$src')" >&2
  exit 1
fi

# Direct dependencies, as recorded in the library.
needed=$(readelf -d "$lib") || { echo "FAIL: readelf could not read $lib" >&2; exit 1; }
bad=$(printf '%s\n' "$needed" | grep NEEDED | grep -iE 'llvm|mlir')
if [ -n "$bad" ]; then
  echo "FAIL: $lib directly needs an LLVM/MLIR library:" >&2
  printf '%s\n' "$bad" >&2
  status=1
fi

# Transitive dependencies (LibTorch's included), with the paths they resolve to.
deps=$(ldd "$lib") || { echo "FAIL: ldd could not read $lib" >&2; exit 1; }
bad=$(printf '%s\n' "$deps" | grep -iE 'llvm|mlir')
if [ -n "$bad" ]; then
  echo "FAIL: $lib pulls in an LLVM/MLIR library:" >&2
  printf '%s\n' "$bad" >&2
  status=1
fi

# Sources: any #include of an mlir/, mlir-c/, llvm/ or llvm-c/ header.
bad=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](mlir|llvm)(-c)?/' "$src")
if [ -n "$bad" ]; then
  echo "FAIL: the runtime includes LLVM/MLIR headers:" >&2
  printf '%s\n' "$bad" >&2
  status=1
fi

if [ "$status" -eq 0 ]; then
  echo "ok: $lib and $src are free of LLVM/MLIR ($(printf '%s\n' "$deps" | wc -l) libraries checked)"
fi
exit "$status"
