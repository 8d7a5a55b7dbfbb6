#!/usr/bin/env bash
# libfsdp2.so must export the C ABI's fsdp2_* functions and nothing else
# (no C++ symbols of the core or of LibTorch leak out).
set -euo pipefail
lib="$1"
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}')
others=$(echo "$exported" | grep -v '^fsdp2_' || true)
if [[ -n "$others" ]]; then
  echo "FAIL: libfsdp2.so exports symbols outside the C ABI:"; echo "$others" | head -20; exit 1
fi
for f in fsdp2_strategy_create fsdp2_strategy_training_step fsdp2_strategy_save_checkpoint \
         fsdp2_last_error fsdp2_model_create fsdp2_dataloader_create_from_token_file \
         fsdp2_allocator fsdp2_restart_with_rank_environment \
         fsdp2_strategy_load_model_state_dict_file fsdp2_strategy_save_hf_checkpoint \
         fsdp2_strategy_save_checkpoint_ex fsdp2_strategy_wait_for_checkpoint \
         fsdp2_launch_local_with_restarts fsdp2_restart_count \
         fsdp2_memory_stats_init fsdp2_strategy_memory_stats \
         fsdp2_strategy_reset_peak_memory_stats \
         fsdp2_strategy_unshard fsdp2_unshard_handle_wait fsdp2_unshard_handle_destroy \
         fsdp2_strategy_reshard; do
  echo "$exported" | grep -qx "$f" || { echo "FAIL: $f is not exported"; exit 1; }
done
echo "PASS: $(echo "$exported" | wc -l) symbols, all fsdp2_*"
