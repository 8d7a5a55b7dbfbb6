#!/usr/bin/env bash
# FSDP2_REQUIRE_GPU=1, which the GPU check sets: where no CUDA device is
# visible, gpu_test and nccl_transport_test fail (non-zero exit, a message
# naming the variable) instead of saying SKIPPED and exiting 0; where one
# is, the variable changes nothing. Each binary runs with no case selected
# (--gtest_filter=-*): what is checked is what it decides before its cases.
set -uo pipefail
fail=0
for bin in "$@"; do
  name=$(basename "$bin")
  plain=$(env -u FSDP2_REQUIRE_GPU -u FSDP2_GPU_TEST_DRY_RUN timeout 120 "$bin" --gtest_filter=-* 2>&1)
  plain_status=$?
  if [[ $plain_status != 0 ]]; then
    echo "FAIL: $name without FSDP2_REQUIRE_GPU exited $plain_status:"; echo "$plain"; fail=1
    continue
  fi
  for dry in 0 1; do  # the dry run's variable does not lift the requirement
    required=$(env -u FSDP2_GPU_TEST_DRY_RUN FSDP2_REQUIRE_GPU=1 \
                 $( [[ $dry == 1 ]] && echo FSDP2_GPU_TEST_DRY_RUN=1 ) \
                 timeout 120 "$bin" --gtest_filter=-* 2>&1)
    status=$?
    if grep -q '^SKIPPED:' <<<"$plain"; then  # no GPU here
      if [[ $status == 0 ]]; then
        echo "FAIL: $name with FSDP2_REQUIRE_GPU=1 (dry run $dry) and no GPU exited 0:"
        echo "$required"; fail=1
      elif ! grep -q 'FSDP2_REQUIRE_GPU=1.*no CUDA device\|FSDP2_REQUIRE_GPU=1.*no CUDA' <<<"$required" ||
           grep -q '^SKIPPED:' <<<"$required"; then
        echo "FAIL: $name with FSDP2_REQUIRE_GPU=1 (dry run $dry) gave no clear message:"
        echo "$required"; fail=1
      else
        echo "$name, no GPU, FSDP2_REQUIRE_GPU=1 (dry run $dry): exit $status: $required"
      fi
    elif [[ $status != 0 ]]; then  # a GPU here: nothing changes
      echo "FAIL: $name with a GPU and FSDP2_REQUIRE_GPU=1 exited $status:"; echo "$required"
      fail=1
    else
      echo "$name: a GPU is visible; FSDP2_REQUIRE_GPU=1 changes nothing"
    fi
  done
done
[[ $fail == 0 ]] && echo "require_gpu_test: passed"
exit $fail
