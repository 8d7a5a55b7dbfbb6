#!/usr/bin/env bash
# A Java snippet as two JVM ranks: run_java.sh FSDP2_JAR SNIPPET_JAR JNI_LIB CLASS
set -uo pipefail
jar="$PWD/$1"; app="$PWD/$2"; jni="$PWD/$3"; class="$4"
exec docs/snippets/run_ranks.sh java -Dfsdp2.jni="$jni" -cp "$jar:$app" "$class"
