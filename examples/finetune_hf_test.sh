#!/usr/bin/env bash
# The fine-tuning example (examples/finetune_hf.py) on a checkpoint made by
# transformers (tests/hf/hf_reference.py: a tiny Llama in nine shards): 2
# local ranks, the embedding frozen, a token file of one window repeated
# (every batch is that window, whatever the sampler draws); the loss falls,
# and what it saves passes transformers' layout check, keeps the frozen
# tensors bit for bit, and is what transformers' own fine-tune of the
# checkpoint gives (the same step losses, the same logits through
# from_pretrained) and what the example had in memory (its validation
# loss). A --model without config.json stops with one line naming it.
set -uo pipefail
example="$1"; reference="$2"
tmp="${TEST_TMPDIR:-/tmp}"
"$FSDP2_PYTHON" "$reference" prepare "$tmp/hf" >"$tmp/prepare.log" 2>&1 || {
  echo "FAIL: hf_reference.py prepare"; cat "$tmp/prepare.log"; exit 1; }
"$FSDP2_PYTHON" -c "import numpy as np; np.tile(np.random.default_rng(0).integers(96, size=17).astype(np.uint16), 300).tofile('$tmp/tokens.bin')"
out=$(timeout 300 "$example" --nproc 2 --model "$tmp/hf/llama" --data "$tmp/tokens.bin" \
  --token-dtype uint16 --steps 10 --block-size 16 --lr 3e-3 --precision fp32 \
  --frozen 'model.embed_tokens.*' --save "$tmp/tuned" --max-shard-size 100KB 2>&1) || {
  echo "FAIL: the example exited non-zero"; echo "$out"; exit 1; }
echo "$out"
losses=$(grep -o 'step [0-9]* loss [0-9.]*' <<<"$out" | awk '{print $4}')
[[ $(echo "$losses" | wc -l) -eq 10 ]] || { echo "FAIL: expected 10 step losses"; exit 1; }
first=$(echo "$losses" | head -1); last=$(echo "$losses" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || {
  echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }
grep -q "frozen model.embed_tokens" <<<"$out" || { echo "FAIL: no frozen line"; exit 1; }
[[ -f "$tmp/tuned/model.safetensors.index.json" ]] || { echo "FAIL: no sharded save"; exit 1; }
val=$(grep -o 'validation loss [0-9.]*' <<<"$out" | awk '{print $3}')
[[ -n "$val" ]] || { echo "FAIL: no validation loss"; exit 1; }
"$FSDP2_PYTHON" "$reference" tuned "$tmp/hf/llama" "$tmp/tuned" --data "$tmp/hf/data.safetensors" \
  --tokens "$tmp/tokens.bin" --token-dtype uint16 --block-size 16 --rows 8 \
  --frozen 'model.embed_tokens.*' --lr 3e-3 --clip 1.0 --losses $losses --val-loss "$val" || {
  echo "FAIL: the save is not the fine-tuned model (or transformers does not load it)"; exit 1; }
mkdir -p "$tmp/not_a_model"
if timeout 120 "$example" --nproc 1 --model "$tmp/not_a_model" --data "$tmp/tokens.bin" \
    >"$tmp/err" 2>&1; then
  echo "FAIL: a directory without config.json trained"; exit 1; fi
grep -q "has no config.json" "$tmp/err" || { echo "FAIL: unclear error:"; cat "$tmp/err"; exit 1; }
echo PASS
