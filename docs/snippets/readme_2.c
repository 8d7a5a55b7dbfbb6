/* generated from README.md by docs/snippets/extract.py; edit the page, not this file */
#include <stdio.h>
#include <fsdp2/fsdp2.h>

#define CHECK(call) if ((call) != FSDP2_OK) { \
    fprintf(stderr, "%s: %s\n", #call, fsdp2_last_error()); return 1; }

int main(void) {
  fsdp2_strategy_options_t so; fsdp2_strategy_t* s; fsdp2_model_t* m;
  fsdp2_step_result_t r; double first = 0; int64_t x[4][16], y[4][16]; int i, t;
  fsdp2_strategy_options_init(&so);
  CHECK(fsdp2_strategy_options_from_json("{\"precision\": \"fp32\"}", &so));
  CHECK(fsdp2_strategy_create(&so, &s));
  CHECK(fsdp2_strategy_setup_environment(s)); /* torchrun/srun/mpirun, or alone */
  CHECK(fsdp2_model_create("{\"family\": \"gpt\", \"vocab_size\": 64, \"block_size\": 16,"
                           " \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32}", &m));
  CHECK(fsdp2_strategy_connect(s, m, NULL));  /* AdamW defaults */
  CHECK(fsdp2_strategy_parallelize(s));
  for (i = 0; i < 4; ++i)
    for (t = 0; t < 16; ++t) x[i][t] = 3 * (16 * i + t) % 64, y[i][t] = (x[i][t] + 3) % 64;
  fsdp2_tensor_t batch[2] = {{x, FSDP2_DTYPE_INT64, 2, {4, 16}},  /* this rank's rows */
                             {y, FSDP2_DTYPE_INT64, 2, {4, 16}}};
  for (i = 0; i < 20; ++i) {
    CHECK(fsdp2_strategy_training_step(s, batch, 2, i, NULL, &r));
    if (i == 0) first = r.loss;
  }
  CHECK(fsdp2_strategy_save_checkpoint(s, "ckpt"));  /* each rank its shards */
  printf("loss %.3f -> %.3f\n", first, r.loss);
  fsdp2_model_destroy(m); fsdp2_strategy_destroy(s);
  return r.loss < first ? 0 : 1;
}
