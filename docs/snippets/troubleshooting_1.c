/* generated from docs/troubleshooting.md by docs/snippets/extract.py; edit the page, not this file */
#include <fsdp2/fsdp2.h>
#include <stdio.h>

int main(void) {
  fsdp2_strategy_options_t so;
  fsdp2_strategy_options_init(&so);
  /* A misspelt key: INVALID_ARGUMENT, `so` left unchanged. */
  fsdp2_status_t st = fsdp2_strategy_options_from_json("{\"data_paralel_size\": 2}", &so);
  printf("%s: %s\n", fsdp2_status_name(st), fsdp2_last_error());
  if (st != FSDP2_ERROR_INVALID_ARGUMENT) return 1;
  fsdp2_strategy_t* s = NULL;
  if (fsdp2_strategy_create(&so, &s) != FSDP2_OK) return 1;
  st = fsdp2_strategy_parallelize(s); /* before setup_environment */
  printf("%s: %s\n", fsdp2_status_name(st), fsdp2_last_error());
  fsdp2_strategy_destroy(s);
  return st == FSDP2_ERROR_WRONG_ORDER ? 0 : 1;
}
