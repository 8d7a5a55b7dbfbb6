/* fsdp2/examples/train_c.c
 *
 * Trains the GPT-style model with FSDP2 from plain C, through the C ABI:
 *
 *   bazel run //examples:train_c -- --nproc 2 --steps 20 --ckpt-dir /tmp/ckpt
 *
 * Against an installed fsdp2 (docs/install.md):
 *
 *   gcc train_c.c -o train_c $(pkg-config --cflags --libs fsdp2)
 *
 * Started by hand it re-launches itself as --nproc local ranks
 * (fsdp2_launch_local); under torchrun, srun or mpirun each process is one
 * rank. The text is a file's bytes (default: the GPL-3 text that every
 * Debian machine ships in /usr/share/common-licenses), read natively by the
 * token-file loader: 90% for training, 10% for validation. At the end every
 * rank writes its shards of a checkpoint.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

/* Prints the failed call and the library's message, and exits. */
#define CHECK(call)                                                        \
  do {                                                                     \
    fsdp2_status_t status_ = (call);                                       \
    if (status_ != FSDP2_OK) {                                             \
      fprintf(stderr, "train_c: %s failed: %s: %s\n", #call,               \
              fsdp2_status_name(status_), fsdp2_last_error());             \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static void Usage(void) {
  fprintf(stderr,
          "usage: train_c [--nproc N] [--steps N] [--data FILE] [--ckpt-dir DIR]\n"
          "               [--batch-size N (per rank)] [--precision fp32|bf16]\n");
  exit(2);
}

int main(int argc, char** argv) {
  int nproc = 2, steps = 20, batch_size = 4, i;
  const char* data = "/usr/share/common-licenses/GPL-3";
  const char* ckpt_dir = NULL;
  const char* precision = "fp32";
  int32_t is_rank = 0, rank = 0, world = 1;
  char json[256];
  fsdp2_strategy_options_t options;
  fsdp2_optimizer_options_t optimizer;
  fsdp2_token_loader_options_t loader_options;
  fsdp2_strategy_t* strategy = NULL;
  fsdp2_model_t* model = NULL;
  fsdp2_dataloader_t *train = NULL, *val = NULL;
  int64_t batches = 0, epoch = 0, params = 0;
  double val_loss = 0;

  for (i = 1; i < argc; ++i) {
    const char* value = i + 1 < argc ? argv[i + 1] : NULL;
    if (value == NULL) Usage();
    if (strcmp(argv[i], "--nproc") == 0) nproc = atoi(value);
    else if (strcmp(argv[i], "--steps") == 0) steps = atoi(value);
    else if (strcmp(argv[i], "--data") == 0) data = value;
    else if (strcmp(argv[i], "--ckpt-dir") == 0) ckpt_dir = value;
    else if (strcmp(argv[i], "--batch-size") == 0) batch_size = atoi(value);
    else if (strcmp(argv[i], "--precision") == 0) precision = value;
    else Usage();
    ++i;
  }
  if (nproc < 1 || steps < 1 || batch_size < 1) Usage();

  /* Not started as a rank: run this program as nproc local ranks. */
  CHECK(fsdp2_is_rank_process(&is_rank));
  if (!is_rank) {
    int32_t exit_code = 1;
    CHECK(fsdp2_launch_local(nproc, 0, argc, argv, &exit_code));
    return exit_code;
  }
  /* A rank of torchrun, srun or mpirun: restart once with the allocator and
   * the OpenBLAS core type that fsdp2_launch_local gives its ranks. */
  CHECK(fsdp2_restart_with_rank_environment(argc, argv));

  fsdp2_strategy_options_init(&options);
  snprintf(json, sizeof(json), "{\"precision\": \"%s\", \"seed\": 1337}", precision);
  CHECK(fsdp2_strategy_options_from_json(json, &options));
  CHECK(fsdp2_strategy_create(&options, &strategy));
  CHECK(fsdp2_strategy_setup_environment(strategy));
  CHECK(fsdp2_strategy_rank_info(strategy, &rank, &world, NULL, NULL));

  /* Built after setup_environment, which seeds every rank alike. */
  CHECK(fsdp2_model_create(
      "{\"family\": \"gpt\", \"vocab_size\": 256, \"block_size\": 64, "
      "\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64}",
      &model));
  fsdp2_optimizer_options_init(&optimizer);
  optimizer.lr = 3e-3;
  optimizer.beta2 = 0.95;
  optimizer.weight_decay = 0.1;
  CHECK(fsdp2_strategy_connect(strategy, model, &optimizer));
  CHECK(fsdp2_strategy_parallelize(strategy));
  CHECK(fsdp2_model_num_parameters(model, NULL, &params));

  fsdp2_token_loader_options_init(&loader_options);
  loader_options.token_dtype = FSDP2_DTYPE_UINT8; /* a text file's bytes */
  loader_options.block_size = 64;
  loader_options.global_batch_size = (int64_t)batch_size * world;
  loader_options.end_fraction = 0.9;
  CHECK(fsdp2_dataloader_create_from_token_file(strategy, data, &loader_options, &train));
  loader_options.begin_fraction = 0.9;
  loader_options.end_fraction = 1.0;
  CHECK(fsdp2_dataloader_create_from_token_file(strategy, data, &loader_options, &val));
  CHECK(fsdp2_dataloader_num_batches(train, &batches));
  printf("train_c: rank %d of %d, allocator %s\n", (int)rank, (int)world,
         fsdp2_allocator());
  if (rank == 0) {
    printf("train_c: %s; GPT of %lld parameters on %d ranks, %lld batches per epoch\n",
           fsdp2_version_string(), (long long)params, (int)world, (long long)batches);
  }

  for (i = 0; i < steps; ++i) {
    fsdp2_step_options_t step_options;
    fsdp2_step_result_t result;
    if (i > 0 && i % batches == 0) CHECK(fsdp2_dataloader_set_epoch(train, ++epoch));
    fsdp2_step_options_init(&step_options);
    step_options.gradient_clip_val = 1.0;
    CHECK(fsdp2_strategy_training_step_loader(strategy, train, i % batches, &step_options,
                                              &result));
    if (rank == 0) {
      printf("step %lld loss %.4f grad_norm %.3f\n", (long long)result.step, result.loss,
             result.grad_norm);
      fflush(stdout);
    }
  }
  CHECK(fsdp2_strategy_validation_step_loader(strategy, val, 0, &val_loss));
  if (rank == 0) printf("validation loss %.4f\n", val_loss);

  if (ckpt_dir != NULL) {
    CHECK(fsdp2_strategy_save_checkpoint(strategy, ckpt_dir));
    if (rank == 0) printf("checkpoint saved to %s\n", ckpt_dir);
  }
  fsdp2_dataloader_destroy(train);
  fsdp2_dataloader_destroy(val);
  fsdp2_model_destroy(model);
  fsdp2_strategy_destroy(strategy);
  return 0;
}
