#!/usr/bin/env bash
# gpu_test's dry run (FSDP2_GPU_TEST_DRY_RUN=1: "cuda" is the CPU, "nccl"
# gloo): the GPU tests' own logic, on every machine. Every case must run
# and pass: a SKIPPED: line, a skipped case or no case at all is a failure,
# so a dry run that quietly stopped running anything cannot pass.
set -uo pipefail
gpu_test="$1"
log="${TEST_TMPDIR:-/tmp}/gpu_test_dry_run.log"
env -u FSDP2_REQUIRE_GPU FSDP2_GPU_TEST_DRY_RUN=1 timeout 870 "$gpu_test" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
fail=0
if [[ $status != 0 ]]; then echo "FAIL: gpu_test's dry run exited $status"; fail=1; fi
if grep -q '^SKIPPED:' "$log"; then echo "FAIL: gpu_test's dry run was skipped"; fail=1; fi
if grep -q '^\[  SKIPPED \]' "$log"; then echo "FAIL: cases of the dry run were skipped"; fail=1; fi
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log")
if [[ -z "$passed" || "$passed" == 0 ]]; then echo "FAIL: no case of the dry run passed"; fail=1; fi
[[ $fail == 0 ]] && echo "gpu_test's dry run: $passed cases passed"
exit $fail
