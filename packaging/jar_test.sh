#!/usr/bin/env bash
# Outside Bazel: compiles the Java example with javac against the packaged
# jar alone and trains it on 2 ranks with `java -cp fsdp2.jar:app.jar Train`
# (no -D flag, no library path: the jar loads its own native libraries); a
# libfsdp2 with another ABI is refused with a clear error.
set -uo pipefail
version="$1"; jar="$PWD/$2"; train_java="$PWD/$3"; abi_mismatch_c="$PWD/$4"
# The ABI these bindings were built for, as the header says.
abi=$(awk '/#define FSDP2_ABI_VERSION_MAJOR/ {a = $3} /#define FSDP2_ABI_VERSION_MINOR/ {b = $3}
           END {print a "." b}' "$5")
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/jar_test.XXXXXX")
fail() { echo "FAIL: $*"; exit 1; }
[[ $(basename "$jar") == "fsdp2-$version.jar" ]] || fail "jar named $(basename "$jar")"
cp "$jar" "$tmp/fsdp2.jar"
cd "$tmp" || fail "cd $tmp"
mkdir -p manifest && (cd manifest && jar xf ../fsdp2.jar META-INF/MANIFEST.MF) || fail "jar xf"
grep -q "^Implementation-Version: $version" manifest/META-INF/MANIFEST.MF \
  || fail "manifest: $(cat manifest/META-INF/MANIFEST.MF)"
listing=$(jar tf fsdp2.jar) || fail "jar tf"
for lib in libfsdp2.so.1 libfsdp2_jni.so; do
  grep -qx "org/fsdp2/native/linux-x86_64/$lib" <<<"$listing" || fail "$lib not in the jar"
done

mkdir -p src classes && cp "$train_java" src/Train.java
javac -Xlint:all -Werror --release 11 -cp fsdp2.jar -d classes src/Train.java || fail "javac failed"
jar cf app.jar -C classes . || fail "jar failed"
unset LD_LIBRARY_PATH
out=$(TMPDIR="$tmp" timeout 300 java -cp fsdp2.jar:app.jar Train --nproc 2 --steps 4 \
      --ckpt-dir "$tmp/ckpt" 2>&1) || { echo "$out"; fail "Train exited non-zero"; }
echo "$out"
losses=$(echo "$out" | grep -o 'step [0-9]* loss [0-9.]*' | awk '{print $4}')
[[ $(echo "$losses" | wc -l) -ge 4 ]] || fail "expected 4 step losses"
first=$(echo "$losses" | head -1); last=$(echo "$losses" | sed -n 4p)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall ($first -> $last)"
[[ $(ls "$tmp/ckpt" | grep -c safetensors) -ge 2 ]] || fail "expected a shard file per rank"
# The extracted copies are gone again.
[[ -z $(ls -d "$tmp"/fsdp2-* 2>/dev/null) ]] || fail "extracted libraries left in $tmp: $(ls -d "$tmp"/fsdp2-*)"

# Another ABI: a clear UnsatisfiedLinkError, no crash.
gcc -shared -fPIC -o "$tmp/libabi_mismatch.so" "$abi_mismatch_c" || fail "gcc"
err=$(LD_PRELOAD="$tmp/libabi_mismatch.so" TMPDIR="$tmp" timeout 120 java -cp fsdp2.jar:app.jar Train --nproc 1 --steps 1 2>&1) \
  && fail "ABI 2.0 was accepted"
[[ $abi =~ ^[0-9]+\.[0-9]+$ ]] || fail "no ABI version in fsdp2.h (got '$abi')"
grep -q "UnsatisfiedLinkError: fsdp2 $version: the loaded libfsdp2 has ABI 2.0, but these classes were built for ABI $abi" <<<"$err" \
  || { echo "$err"; fail "unclear ABI error"; }
echo PASS
