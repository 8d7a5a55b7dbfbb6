// The installed C++ header from a CMake project: the library's version and
// ABI are the header's, a model is created and owned by fsdp2_c::ModelPtr,
// and a failing call throws fsdp2_c::Error with the library's message.
#include <cstdio>
#include <cstring>
#include <string>

#include <fsdp2/fsdp2_cpp.h>

int main() {
  const std::string version = fsdp2_version_string();
  if (version.rfind(std::string("fsdp2 ") + FSDP2_VERSION + " ", 0) != 0 ||
      fsdp2_abi_version() != FSDP2_ABI_VERSION) {
    std::fprintf(stderr, "FAIL: library %s (ABI %d), header %s (ABI %d)\n", version.c_str(),
                 static_cast<int>(fsdp2_abi_version()), FSDP2_VERSION, FSDP2_ABI_VERSION);
    return 1;
  }
  fsdp2_model_t* raw = nullptr;
  fsdp2_c::Check(fsdp2_model_create(
      "{\"family\": \"mlp\", \"in_features\": 4, \"hidden\": 8, \"out_features\": 2}", &raw));
  fsdp2_c::ModelPtr model(raw);
  int64_t tensors = 0, params = 0;
  fsdp2_c::Check(fsdp2_model_num_parameters(model.get(), &tensors, &params));
  try {
    fsdp2_c::Check(fsdp2_model_create("{\"family\": \"no such model\"}", &raw));
    std::fprintf(stderr, "FAIL: a bad model kind was accepted\n");
    return 1;
  } catch (const fsdp2_c::Error& e) {
    std::printf("version_cpp: %s; MLP of %lld parameters; bad kind: %s\n", version.c_str(),
                static_cast<long long>(params), e.what());
  }
  return 0;
}
