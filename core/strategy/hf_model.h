// fsdp2/core/strategy/hf_model.h
//
// A TrainingModule whose model is a Hugging Face checkpoint's (the Llama
// family's LlamaModule in core/models) also implements HfModel: then
// FSDP2Strategy::parallelize() loads its weights row by row once the model
// is sharded (so a model built under tensor_init_context() never exists
// whole on any rank), and save_hf_checkpoint() writes it back in
// transformers' layout with its config.json.
#ifndef FSDP2_CORE_STRATEGY_HF_MODEL_H_
#define FSDP2_CORE_STRATEGY_HF_MODEL_H_

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace fsdp2 {
namespace strategy {

// A model's LoRA adapters, as PEFT's adapter_config.json describes them.
struct HfLora {
  int64_t rank = 0;    // 0: the model has no adapters
  double alpha = 0;    // the update is scaled by alpha / rank
  double dropout = 0;  // on the adapters' input while training
  std::vector<std::string> target_modules;  // the projections adapted (q_proj, ...)
};

// The interface a Hugging Face-backed TrainingModule also implements (see
// the file comment); FSDP2Strategy finds it with dynamic_cast.
class HfModel {
 public:
  virtual ~HfModel() = default;
  // The checkpoint parallelize() loads (a directory, an index or a
  // .safetensors file; checkpoint::LoadHfWeights), or "" for none.
  virtual std::string hf_weights_path() const = 0;
  // config.json's text for weights saved in `dtype`.
  virtual std::string hf_config_json(at::ScalarType dtype) const = 0;
  // The adapters whose parameters are named <projection>.lora_A.weight and
  // .lora_B.weight (save_hf_checkpoint writes them in PEFT's layout, and
  // merges them into a full save); rank 0 for none.
  virtual HfLora hf_lora() const { return {}; }
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_HF_MODEL_H_
