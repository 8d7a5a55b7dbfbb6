#!/usr/bin/env bash
# The main job fine-tunes as users run it (issue #46): chats prepared by
# fsdp2.prepare_data (packed), --hf-model with --data DIR, 2 local ranks.
# With --lora-rank the adapters alone train and --save-hf writes only them,
# in PEFT's layout, naming only the targeted projections; --save-hf-merged
# changes exactly the targeted weights; without LoRA every weight trains.
# Bad LoRA flags and a directory that is no dataset stop with one line.
set -uo pipefail
train="$1"; sft_reference="$2"; prepare_data="$3"
tmp="${TEST_TMPDIR:-/tmp}"
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE  # as on users' machines
run() { timeout 300 "$train" "$@" 2>&1; }
losses() { grep 'step [0-9]*/' | grep -o ' loss [0-9][0-9.]*' | awk '{print $2}'; }

"$FSDP2_PYTHON" "$sft_reference" fixture "$tmp/sft" >"$tmp/fixture.log" 2>&1 || {
  echo "FAIL: sft_reference.py fixture"; cat "$tmp/fixture.log"; exit 1; }
"$FSDP2_PYTHON" "$prepare_data" --tokenizer "$tmp/sft/base" --input "$tmp/sft/chat.jsonl" \
  --output "$tmp/prepared" --seq-len 32 --pack || { echo "FAIL: prepare_data"; exit 1; }

common=(--nproc 2 --hf-model "$tmp/sft/base" --data "$tmp/prepared" --steps 3 --batch-size 2
        --mixed-precision fp32 --threads 1 --val-every 0)
lora=$(run "${common[@]}" --out-dir "$tmp/o_lora" --lora-rank 4 --lora-alpha 8 \
       --lora-target-modules q_proj,v_proj --save-hf "$tmp/adapter" \
       --save-hf-merged "$tmp/merged") || { echo "FAIL: the LoRA run"; echo "$lora"; exit 1; }
echo "$lora"
[[ $(echo "$lora" | losses | wc -l) -eq 3 ]] || { echo "FAIL: expected 3 step losses"; exit 1; }
grep -q "training rows (prepared: masked targets, packed documents) of 32 tokens" <<<"$lora" || {
  echo "FAIL: no data line for the prepared dataset"; exit 1; }
full=$(run "${common[@]}" --out-dir "$tmp/o_full" --save-hf "$tmp/full") || {
  echo "FAIL: the full run"; echo "$full"; exit 1; }
[[ $(echo "$full" | losses | wc -l) -eq 3 ]] || { echo "FAIL: expected 3 full losses"; exit 1; }

"$FSDP2_PYTHON" - "$tmp" <<'PY' || exit 1
import json, os, sys
from safetensors.torch import load_file
tmp = sys.argv[1]
base = load_file(f"{tmp}/sft/base/model.safetensors")
names = sorted(os.listdir(f"{tmp}/adapter"))
assert "adapter_model.safetensors" in names and "adapter_config.json" in names, names
assert "model.safetensors" not in names and "tokenizer.json" in names, names
adapter = load_file(f"{tmp}/adapter/adapter_model.safetensors")
projections = {k.split(".")[-3] for k in adapter}
assert projections == {"q_proj", "v_proj"}, projections
assert all(k.startswith("base_model.model.model.layers.") for k in adapter), sorted(adapter)
config = json.load(open(f"{tmp}/adapter/adapter_config.json"))
assert config["r"] == 4 and config["lora_alpha"] == 8, config
merged = load_file(f"{tmp}/merged/model.safetensors")
assert sorted(merged) == sorted(base), "the merged save holds the base's tensors, no adapters"
for k in base:
    changed = not merged[k].equal(base[k])
    assert changed == (".q_proj." in k or ".v_proj." in k), (k, changed)
full = load_file(f"{tmp}/full/model.safetensors")
assert all(not full[k].equal(base[k]) for k in base if k.endswith("proj.weight")), "full fine-tune"
for save in ("adapter", "merged", "full"):
    assert os.path.isfile(f"{tmp}/{save}/generation_config.json"), save
print("saves ok: adapters of q_proj and v_proj only; merged changes exactly those")
PY

expect_error() {  # expect_error MESSAGE ARGS...
  local message="$1"; shift
  local out; out=$(run "$@") && { echo "FAIL: $* succeeded"; exit 1; }
  grep -qF -- "$message" <<<"$out" || { echo "FAIL: no '$message' in:"; echo "$out"; exit 1; }
}
expect_error 'names "qkv_proj"' "${common[@]}" --lora-rank 4 --lora-target-modules q_proj,qkv_proj
expect_error "lora_alpha (-1.000000) positive" "${common[@]}" --lora-rank 4 --lora-alpha -1
expect_error "--lora-rank needs --hf-model" --lora-rank 4
expect_error "training and validation need a global batch of 16 rows each" \
  "${common[@]}" --batch-size 8
mkdir -p "$tmp/empty_dir"
expect_error "is a directory without meta.json" --hf-model "$tmp/sft/base" --data "$tmp/empty_dir"
echo PASS
