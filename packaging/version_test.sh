#!/usr/bin/env bash
# The version in //:version.bzl (argument 1) is the FSDP2_VERSION of
# c_api/fsdp2.h (argument 3), and the soname's number (argument 2) is its
# FSDP2_ABI_VERSION_MAJOR.
set -euo pipefail
version="$1"; soversion="$2"; header="$3"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL: version '$version' is not x.y.z"; exit 1; }
in_header=$(sed -n 's/^#define FSDP2_VERSION "\(.*\)"$/\1/p' "$header")
[[ "$in_header" == "$version" ]] || {
  echo "FAIL: c_api/fsdp2.h says FSDP2_VERSION \"$in_header\", version.bzl says \"$version\""; exit 1; }
abi_major=$(sed -n 's/^#define FSDP2_ABI_VERSION_MAJOR \([0-9]*\)$/\1/p' "$header")
[[ "$abi_major" == "$soversion" ]] || {
  echo "FAIL: FSDP2_ABI_VERSION_MAJOR is $abi_major, version.bzl's FSDP2_SOVERSION is $soversion"; exit 1; }
echo PASS
