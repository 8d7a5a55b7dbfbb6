// fsdp2/c_api/options.cc
//
// The option structs' JSON readers (*_from_json) and the option table as
// JSON (fsdp2_options_schema): one loop over the rows of
// core/strategy/option_table.h each, which parse and check every value;
// internal/options.cc says where each option sits in its struct. A new
// option is a row there (see c_api/README.md), not code here.
#include <string>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/options.h"
#include "core/strategy/option_table.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C
namespace strategy = fsdp2::strategy;

extern "C" {

fsdp2_status_t fsdp2_strategy_options_from_json(const char* json,
                                                fsdp2_strategy_options_t* options) {
  FSDP2_API_BEGIN
  NotNull(options, "options");
  const nlohmann::json config = ParseObject(json, "strategy options");
  fsdp2_strategy_options_t o;
  fsdp2_strategy_options_init(&o);
  CopyGrown(&o, options);
  ReadJsonOptions(strategy::StrategyOptionTable(), StrategyOptionFields(), config, &o);
  CopyBack(o, options);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_optimizer_options_from_json(const char* json,
                                                 fsdp2_optimizer_options_t* options) {
  FSDP2_API_BEGIN
  NotNull(options, "options");
  const nlohmann::json config = ParseObject(json, "optimizer options");
  fsdp2_optimizer_options_t o;
  fsdp2_optimizer_options_init(&o);
  CopyGrown(&o, options);
  ReadJsonOptions(strategy::OptimizerOptionTable(), OptimizerOptionFields(), config, &o);
  CopyBack(o, options);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_step_options_from_json(const char* json, fsdp2_step_options_t* options) {
  FSDP2_API_BEGIN
  NotNull(options, "options");
  const nlohmann::json config = ParseObject(json, "step options");
  fsdp2_step_options_t o;
  fsdp2_step_options_init(&o);
  CopyGrown(&o, options);
  ReadJsonOptions(strategy::StepOptionTable(), StepOptionFields(), config, &o);
  CopyBack(o, options);
  FSDP2_API_END
}

const char* fsdp2_options_schema(void) {
  // Built once; a failure here would be a bug in the table, and there is
  // no status to return it with.
  static const std::string* schema = [] {
    try {
      return new std::string(strategy::OptionSchema().dump());
    } catch (...) {
      return new std::string("{}");
    }
  }();
  return schema->c_str();
}

}  // extern "C"
