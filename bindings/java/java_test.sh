#!/usr/bin/env bash
# Runs the JUnit 5 tests of the Java bindings. The JVM forms a world of one
# rank through a FileStore; the multi-JVM test starts its ranks with the
# classpath and JNI library given here; the status test reads the C header;
# the TorchScript test runs tests/script/script_models.py with the venv's PyTorch,
# the Hugging Face test tests/hf/hf_reference.py with its transformers.
set -euo pipefail
jar="$PWD/$1"; tests="$PWD/$2"; jni="$PWD/$3"; header="$PWD/$4"; script_models="$PWD/$5"
hf_reference="$PWD/$6"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export FSDP2_STORE_PATH="$tmp/junit_store" OMP_NUM_THREADS=1
exec timeout 600 java -Dfsdp2.jni="$jni" -Dfsdp2.classpath="$jar:$tests" \
  -Dfsdp2.header="$header" -Dfsdp2.script_models="$script_models" -Dfsdp2.python="$FSDP2_PYTHON" \
  -Dfsdp2.hf_reference="$hf_reference" \
  -Djava.io.tmpdir="$tmp" \
  -jar /usr/share/java/junit-platform-console-standalone.jar \
  --class-path "$jar:$tests" --select-package org.fsdp2 --fail-if-no-tests \
  --disable-banner --details=tree
