#!/usr/bin/env bash
# Installs fsdp2 into a fresh PREFIX (as `bazel run //:install -- PREFIX`
# does), checks the layout and the soname, then, outside the workspace,
# builds the C example with plain gcc and pkg-config and a CMake project with
# find_package(fsdp2), and trains each on 2 ranks.
set -uo pipefail
install_sh="$PWD/$1"; train_c="$PWD/$2"; cmake_lists="$PWD/$3"; shift 3
install_args=()
for a in "$@"; do
  if [[ -e "$a" ]]; then install_args+=("$PWD/$a"); else install_args+=("$a"); fi
done
version="$1"; soversion="$2"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/install_test.XXXXXX")
prefix="$tmp/prefix"
fail() { echo "FAIL: $*"; exit 1; }

# Installing.
(cd "$tmp" && bash "$install_sh" "${install_args[@]}" "$prefix") || fail "install.sh failed"
for f in include/fsdp2/fsdp2.h include/fsdp2/fsdp2_cpp.h "lib/libfsdp2.so.$version" \
         lib/pkgconfig/fsdp2.pc lib/cmake/fsdp2/fsdp2Config.cmake \
         lib/cmake/fsdp2/fsdp2ConfigVersion.cmake; do
  [[ -f "$prefix/$f" ]] || fail "not installed: $f"
done
[[ $(readlink "$prefix/lib/libfsdp2.so") == "libfsdp2.so.$soversion" ]] || fail "libfsdp2.so link"
[[ $(readlink "$prefix/lib/libfsdp2.so.$soversion") == "libfsdp2.so.$version" ]] || fail "soname link"
soname=$(readelf -d "$prefix/lib/libfsdp2.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" == "libfsdp2.so.$soversion" ]] || fail "soname is '$soname'"
# A second install over the first works (links replaced, not nested).
(cd "$tmp" && bash "$install_sh" "${install_args[@]}" "$prefix" >/dev/null) || fail "reinstall failed"
[[ ! -e "$prefix/lib/libfsdp2.so.$version/libfsdp2.so.$version" ]] || fail "nested link"
if bash "$install_sh" >/dev/null 2>&1; then fail "install.sh without PREFIX succeeded"; fi

# Trains on 2 ranks (argument: the program); its loss falls; both ranks
# write their checkpoint shards.
train() {
  local program="$1" ckpt="$2" out
  out=$(cd "$tmp" && timeout 300 "$program" --nproc 2 --steps 4 --ckpt-dir "$ckpt" 2>&1) || {
    echo "$out"; fail "$program exited non-zero"; }
  echo "$out"
  grep -q "fsdp2 $version " <<<"$out" || fail "$program: no 'fsdp2 $version' in its output"
  local losses first last
  losses=$(echo "$out" | grep -o 'loss [0-9.]*' | grep -v validation | awk '{print $2}')
  [[ $(echo "$losses" | wc -l) -ge 4 ]] || fail "$program: expected 4 step losses"
  first=$(echo "$losses" | head -1); last=$(echo "$losses" | sed -n 4p)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall ($first -> $last)"
  [[ $(ls "$ckpt" | grep -c safetensors) -ge 2 ]] || fail "$program: expected a shard file per rank"
}

# gcc and pkg-config.
mkdir -p "$tmp/c" && cp "$train_c" "$tmp/c/train_c.c"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ $(pkg-config --modversion fsdp2) == "$version" ]] || fail "pkg-config --modversion: $(pkg-config --modversion fsdp2)"
echo "pkg-config: $(pkg-config --cflags --libs fsdp2)"
# shellcheck disable=SC2046
gcc -std=c99 -Wall -Wextra -Werror -pedantic -o "$tmp/c/train_c" "$tmp/c/train_c.c" \
    $(pkg-config --cflags --libs fsdp2) -Wl,-rpath,"$prefix/lib" || fail "gcc failed"
grep -q "NEEDED.*\[libfsdp2.so.$soversion\]" <<<"$(readelf -d "$tmp/c/train_c")" || fail "train_c does not need libfsdp2.so.$soversion"
train "$tmp/c/train_c" "$tmp/ckpt_c"

# CMake and find_package(fsdp2).
mkdir -p "$tmp/cmake" && cp "$cmake_lists" "$(dirname "$cmake_lists")/version_cpp.cc" "$tmp/cmake/"
cmake -S "$tmp/cmake" -B "$tmp/cmake/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DTRAIN_C="$tmp/c/train_c.c" >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "cmake configure failed"; }
cmake --build "$tmp/cmake/build" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "cmake build failed"; }
"$tmp/cmake/build/version_cpp" || fail "version_cpp failed"
train "$tmp/cmake/build/train_c" "$tmp/ckpt_cmake"
# A version the package cannot satisfy is refused.
sed 's/find_package(fsdp2 1.8 REQUIRED)/find_package(fsdp2 99 REQUIRED)/' "$cmake_lists" > "$tmp/cmake/CMakeLists.txt"
if cmake -S "$tmp/cmake" -B "$tmp/cmake/build99" -DCMAKE_PREFIX_PATH="$prefix" \
     -DTRAIN_C="$tmp/c/train_c.c" >/dev/null 2>&1; then fail "find_package(fsdp2 99) succeeded"; fi
echo PASS
