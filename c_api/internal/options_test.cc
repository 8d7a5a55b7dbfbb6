// The C option structs over the option table: every row has its C field,
// *_init writes the rows' defaults, JSON goes through the rows' checks, the
// C enumerations' codes are the rows' choices, and the schema the bindings
// read lists every row.
#include "c_api/internal/options.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "c_api/fsdp2.h"

namespace fsdp2 {
namespace c_api {
namespace {

using nlohmann::json;

// Every row has a field and every field a row: an option added to the
// table without its C field (or the reverse) fails here.
template <typename CStruct, typename Target>
void ExpectOneFieldPerRow(const strategy::OptionTable<Target>& table,
                          const OptionFields<CStruct>& fields) {
  std::set<std::string> rows;
  for (const auto& row : table) {
    rows.insert(row.name);
    EXPECT_TRUE(fields.count(row.name)) << row.name << " has no field in its C struct";
  }
  for (const auto& [name, field] : fields) {
    EXPECT_TRUE(rows.count(name)) << "the C field " << name << " has no row";
  }
}

TEST(CApiOptions, EveryRowHasItsField) {
  ExpectOneFieldPerRow(strategy::StrategyOptionTable(), StrategyOptionFields());
  ExpectOneFieldPerRow(strategy::OptimizerOptionTable(), OptimizerOptionFields());
  ExpectOneFieldPerRow(strategy::StepOptionTable(), StepOptionFields());
}

// What *_init writes is each row's default, read back through its field.
template <typename CStruct, typename Target>
void ExpectInitDefaults(const strategy::OptionTable<Target>& table,
                        const OptionFields<CStruct>& fields, const CStruct& o) {
  for (const auto& row : table) {
    EXPECT_EQ(strategy::ParseOption(row, fields.at(row.name).read(o)), row.default_value)
        << row.name;
  }
}

TEST(CApiOptions, InitWritesTheRowsDefaults) {
  fsdp2_strategy_options_t so;
  fsdp2_strategy_options_init(&so);
  ExpectInitDefaults(strategy::StrategyOptionTable(), StrategyOptionFields(), so);
  fsdp2_optimizer_options_t oo;
  fsdp2_optimizer_options_init(&oo);
  ExpectInitDefaults(strategy::OptimizerOptionTable(), OptimizerOptionFields(), oo);
  fsdp2_step_options_t st;
  fsdp2_step_options_init(&st);
  ExpectInitDefaults(strategy::StepOptionTable(), StepOptionFields(), st);
  // And the core gets the C++ structs' defaults from them.
  const strategy::FSDP2StrategyOptions cpp = ToStrategyOptions(nullptr);
  for (const auto& row : strategy::StrategyOptionTable()) {
    EXPECT_EQ(row.get(cpp).value_or(json("none")), row.default_value) << row.name;
  }
}

// The C header's enumeration constants are the rows' choices, by position.
TEST(CApiOptions, EnumCodesAreTheChoicesPositions) {
  const std::map<std::string, std::vector<std::pair<std::string, int32_t>>> codes = {
      {"sharding_strategy",
       {{"full_shard", FSDP2_FULL_SHARD}, {"shard_grad_op", FSDP2_SHARD_GRAD_OP},
        {"no_shard", FSDP2_NO_SHARD}, {"hybrid_shard", FSDP2_HYBRID_SHARD}}},
      {"precision", {{"fp32", FSDP2_PRECISION_FP32}, {"bf16", FSDP2_PRECISION_BF16}}},
      {"backend", {{"gloo", FSDP2_BACKEND_GLOO}, {"nccl", FSDP2_BACKEND_NCCL}}},
      {"checkpoint_format",
       {{"sharded", FSDP2_CHECKPOINT_SHARDED}, {"full", FSDP2_CHECKPOINT_FULL}}},
      {"activation_checkpointing",
       {{"none", FSDP2_AC_NONE}, {"full", FSDP2_AC_FULL}, {"selective", FSDP2_AC_SELECTIVE}}},
      {"gradient_accumulation",
       {{"local", FSDP2_ACCUMULATE_LOCAL}, {"sharded", FSDP2_ACCUMULATE_SHARDED}}},
  };
  for (const auto& row : strategy::StrategyOptionTable()) {
    if (row.type != strategy::OptionType::kChoice) continue;
    ASSERT_TRUE(codes.count(row.name)) << row.name << ": list its C constants here";
    ASSERT_EQ(codes.at(row.name).size(), row.choices.size()) << row.name;
    for (const auto& [name, code] : codes.at(row.name)) {
      fsdp2_strategy_options_t o;
      fsdp2_strategy_options_init(&o);
      const std::string text = json{{row.name, name}}.dump();
      ASSERT_EQ(fsdp2_strategy_options_from_json(text.c_str(), &o), FSDP2_OK) << text;
      EXPECT_EQ(StrategyOptionFields().at(row.name).read(o), name);
      EXPECT_EQ(json(row.choices.at(static_cast<size_t>(code))), name) << row.name;
    }
  }
  const auto& kinds = strategy::FindOption(strategy::OptimizerOptionTable(), "kind")->choices;
  EXPECT_EQ(kinds.at(FSDP2_OPTIMIZER_ADAMW), "adamw");
  EXPECT_EQ(kinds.at(FSDP2_OPTIMIZER_ADAM), "adam");
  EXPECT_EQ(kinds.at(FSDP2_OPTIMIZER_SGD), "sgd");
}

// Every option through JSON: its default given explicitly changes nothing,
// and a value out of range is refused before fsdp2_strategy_create.
TEST(CApiOptions, JsonGoesThroughTheRows) {
  json defaults = json::object();
  for (const auto& row : strategy::StrategyOptionTable()) defaults[row.name] = row.default_value;
  fsdp2_strategy_options_t given, init;
  fsdp2_strategy_options_init(&init);
  fsdp2_strategy_options_init(&given);
  ASSERT_EQ(fsdp2_strategy_options_from_json(defaults.dump().c_str(), &given), FSDP2_OK)
      << fsdp2_last_error();
  for (const auto& [name, field] : StrategyOptionFields()) {
    EXPECT_EQ(field.read(given), field.read(init)) << name;
  }
  EXPECT_EQ(fsdp2_strategy_options_from_json("{\"forward_prefetch\": -7}", &given),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fsdp2_last_error()).find("forward_prefetch must be 0 or more"),
            std::string::npos)
      << fsdp2_last_error();
  EXPECT_EQ(given.forward_prefetch, 1) << "a failed call leaves the options as they were";
  fsdp2_step_options_t step;
  fsdp2_step_options_init(&step);
  ASSERT_EQ(fsdp2_step_options_from_json("{\"accumulate_grad_batches\": 4}", &step), FSDP2_OK);
  EXPECT_EQ(step.accumulate_grad_batches, 4);
  EXPECT_EQ(fsdp2_step_options_from_json("{\"gradient_clip_val\": -1}", &step),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fsdp2_step_options_from_json("{\"clip\": 1}", &step), FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fsdp2_last_error()).find("unknown option \"clip\""), std::string::npos);
}

TEST(CApiOptions, SchemaIsTheTable) {
  const json schema = json::parse(fsdp2_options_schema());
  EXPECT_EQ(schema, strategy::OptionSchema());
  std::set<std::string> names;
  for (const json& row : schema.at("strategy")) names.insert(row.at("name").get<std::string>());
  for (const auto& [name, field] : StrategyOptionFields()) EXPECT_TRUE(names.count(name)) << name;
}

}  // namespace
}  // namespace c_api
}  // namespace fsdp2
