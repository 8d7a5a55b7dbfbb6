/* generated from docs/languages.md by docs/snippets/extract.py; edit the page, not this file */
#include <math.h>
#include <stdio.h>
#include <fsdp2/fsdp2.h>
#define CHECK(call) do { if ((call) != FSDP2_OK) { \
    fprintf(stderr, "%s: %s\n", #call, fsdp2_last_error()); return 1; } } while (0)

int main(void) {
  int64_t tokens[4 * 16], targets[4 * 16], epoch = 0, steps = 0;
  fsdp2_tensor_t batch[2] = {
      {.data = tokens, .dtype = FSDP2_DTYPE_INT64, .ndim = 2, .shape = {4, 16}},
      {.data = targets, .dtype = FSDP2_DTYPE_INT64, .ndim = 2, .shape = {4, 16}}};
  fsdp2_strategy_options_t so;
  fsdp2_strategy_t* s = NULL;
  fsdp2_model_t* m = NULL;
  fsdp2_step_result_t r;
  int32_t rank = 0, step, i;
  fsdp2_strategy_options_init(&so);
  so.precision = FSDP2_PRECISION_FP32;
  CHECK(fsdp2_strategy_create(&so, &s));
  CHECK(fsdp2_strategy_setup_environment(s)); /* RANK, WORLD_SIZE, MASTER_ADDR, ... */
  CHECK(fsdp2_strategy_rank_info(s, &rank, NULL, NULL, NULL));
  CHECK(fsdp2_model_create("{\"family\": \"gpt\", \"vocab_size\": 64, \"block_size\": 16, "
                           "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32}", &m));
  CHECK(fsdp2_strategy_connect(s, m, NULL)); /* AdamW with its defaults */
  CHECK(fsdp2_strategy_parallelize(s));
  for (step = 0; step < 3; ++step) {
    for (i = 0; i < 4 * 16; ++i) { /* deterministic random tokens, this rank's own */
      tokens[i] = ((uint32_t)(i + 64 * step + 4096 * rank) * 2654435761u) >> 26;
      targets[i] = (tokens[i] * 5 + 1) % 64; /* a mapping the model can learn */
    }
    CHECK(fsdp2_strategy_training_step(s, batch, 2, step, NULL, &r));
    if (!isfinite(r.loss)) return 1;
  }
  CHECK(fsdp2_strategy_save_checkpoint(s, "ckpt")); /* a relative directory */
  CHECK(fsdp2_strategy_load_checkpoint(s, "ckpt"));
  CHECK(fsdp2_strategy_current_epoch_step(s, &epoch, &steps));
  fsdp2_model_destroy(m);
  fsdp2_strategy_destroy(s);
  return steps == 3 ? 0 : 1;
}
