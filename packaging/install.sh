#!/usr/bin/env bash
# Installs the C/C++ library under PREFIX:
#   include/fsdp2/fsdp2.h, include/fsdp2/fsdp2_cpp.h,
#   lib/libfsdp2.so.VERSION (soname libfsdp2.so.SOVERSION) with the links
#   libfsdp2.so.SOVERSION and libfsdp2.so,
#   lib/pkgconfig/fsdp2.pc, lib/cmake/fsdp2/fsdp2Config{,Version}.cmake.
# Usage: bazel run //:install -- PREFIX   (a relative PREFIX is taken from
# the directory bazel was run in). The arguments before PREFIX come from
# packaging/BUILD.
set -euo pipefail
if [[ $# -ne 9 ]]; then
  echo "usage: bazel run //:install -- PREFIX" >&2
  exit 2
fi
version="$1"; soversion="$2"; lib="$3"; header="$4"; header_cpp="$5"
pc="$6"; config="$7"; config_version="$8"; prefix="$9"
if [[ "$prefix" != /* ]]; then
  prefix=$(realpath -m "${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix")
fi
install -d "$prefix/include/fsdp2" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/fsdp2"
install -m 0644 "$header" "$header_cpp" "$prefix/include/fsdp2/"
install -m 0755 "$lib" "$prefix/lib/libfsdp2.so.$version"
ln -sfn "libfsdp2.so.$version" "$prefix/lib/libfsdp2.so.$soversion"
ln -sfn "libfsdp2.so.$soversion" "$prefix/lib/libfsdp2.so"
install -m 0644 "$pc" "$prefix/lib/pkgconfig/fsdp2.pc"
install -m 0644 "$config" "$config_version" "$prefix/lib/cmake/fsdp2/"
echo "fsdp2 $version installed in $prefix"
