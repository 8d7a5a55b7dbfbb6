#!/usr/bin/env bash
# The version in //:version.bzl (argument 1) is the FSDP2_VERSION of
# c_api/fsdp2.h (argument 3), and the soname's number (argument 2) is its
# FSDP2_ABI_VERSION_MAJOR; the version's major.minor is the C ABI's
# major.minor (the wheel, the jar and the ABI share one number), and
# CHANGELOG.md (argument 4) has a section for it.
set -euo pipefail
version="$1"; soversion="$2"; header="$3"; changelog="$4"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL: version '$version' is not x.y.z"; exit 1; }
in_header=$(sed -n 's/^#define FSDP2_VERSION "\(.*\)"$/\1/p' "$header")
[[ "$in_header" == "$version" ]] || {
  echo "FAIL: c_api/fsdp2.h says FSDP2_VERSION \"$in_header\", version.bzl says \"$version\""; exit 1; }
abi_major=$(sed -n 's/^#define FSDP2_ABI_VERSION_MAJOR \([0-9]*\)$/\1/p' "$header")
[[ "$abi_major" == "$soversion" ]] || {
  echo "FAIL: FSDP2_ABI_VERSION_MAJOR is $abi_major, version.bzl's FSDP2_SOVERSION is $soversion"; exit 1; }
abi_minor=$(sed -n 's/^#define FSDP2_ABI_VERSION_MINOR \([0-9]*\).*$/\1/p' "$header")
[[ "${version%.*}" == "$abi_major.$abi_minor" ]] || {
  echo "FAIL: version $version is not C ABI $abi_major.$abi_minor's: set version.bzl and"
  echo "      FSDP2_VERSION to $abi_major.$abi_minor.0 when the ABI's minor number moves"; exit 1; }
grep -q "^## $version " "$changelog" || {
  echo "FAIL: CHANGELOG.md has no section '## $version ...'"; exit 1; }
echo PASS
