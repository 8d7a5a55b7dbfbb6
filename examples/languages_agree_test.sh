#!/usr/bin/env bash
# C, Python and Java train the same GPT on 2 ranks through the same C ABI:
# every step's loss and gradient norm must print identically.
set -uo pipefail
c="$PWD/$1"; py="$PWD/$2"; jar="$PWD/$3"; app="$PWD/$4"; jni="$PWD/$5"
steps() { grep -o 'step [0-9]* loss [0-9.]* grad_norm [0-9.]*'; }
out_c=$(timeout 300 "$c" --nproc 2 --steps 4 2>&1 | steps)
out_py=$(timeout 300 "$py" --nproc 2 --steps 4 2>&1 | steps)
out_java=$(timeout 300 java -Dfsdp2.jni="$jni" -cp "$jar:$app" Train --nproc 2 --steps 4 2>&1 | steps)
echo "C:";      echo "$out_c"
echo "Python:"; echo "$out_py"
echo "Java:";   echo "$out_java"
[[ $(echo "$out_c" | wc -l) -eq 4 ]] || { echo "FAIL: the C example printed no 4 steps"; exit 1; }
[[ "$out_c" == "$out_py" ]] || { echo "FAIL: Python differs from C"; exit 1; }
[[ "$out_c" == "$out_java" ]] || { echo "FAIL: Java differs from C"; exit 1; }
echo PASS
