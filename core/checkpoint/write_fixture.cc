// Writes a small safetensors file with known values, for the Python interop
// test: write_fixture PATH.
#include <ATen/ATen.h>

#include <iostream>

#include "core/checkpoint/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: write_fixture PATH\n";
    return 2;
  }
  fsdp2::checkpoint::WriteSafetensors(
      argv[1],
      {{"blocks.0.fc.weight", at::arange(12, at::kFloat).view({3, 4}) / 4},
       {"ln_f.bias", at::tensor({1.5, -2.5}, at::kDouble)},
       {"step", at::tensor({7, 8, 9}, at::kLong)}},
      {{"global_step", "7"}});
  return 0;
}
