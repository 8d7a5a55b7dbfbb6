// The option table: every row well-formed, its default the C++ struct's own
// default, its value applied to the struct and read back, its check run on
// every path (JSON values, flags' text, the C++ constructor).
#include "core/strategy/option_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

using nlohmann::json;

std::string ErrorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

template <typename Target>
void ExpectWellFormed(const OptionTable<Target>& table, std::set<std::string>* flags) {
  std::set<std::string> names;
  for (const auto& row : table) {
    SCOPED_TRACE(row.name);
    EXPECT_FALSE(row.name.empty());
    EXPECT_TRUE(names.insert(row.name).second) << "a second row named " << row.name;
    EXPECT_FALSE(row.doc.empty());
    EXPECT_EQ(row.doc.find('\n'), std::string::npos) << "one line of documentation";
    ASSERT_TRUE(row.apply && row.get) << "a row must say how it reaches the C++ struct";
    // The default is canonical: parsing it gives it back.
    EXPECT_EQ(ParseOption(row, row.default_value), row.default_value);
    if (row.type == OptionType::kChoice) {
      EXPECT_FALSE(row.choices.empty());
    }
    // The main job has a flag for it, or says how it sets it instead.
    EXPECT_NE(row.flag.empty(), row.flag_note.empty()) << "a flag or a note, not both";
    if (!row.flag.empty()) {
      EXPECT_TRUE(flags->insert(row.flag).second) << "flag --" << row.flag << " twice";
      if (!row.flag_default.is_null()) ParseOption(row, row.flag_default);
    }
    if (row.type == OptionType::kInt || row.type == OptionType::kNumber ||
        row.type == OptionType::kSize) {
      EXPECT_FALSE(row.requirement.empty()) << "a range needs its words";
    }
  }
}

TEST(OptionTable, RowsAreWellFormed) {
  std::set<std::string> flags;
  ExpectWellFormed(StrategyOptionTable(), &flags);
  ExpectWellFormed(OptimizerOptionTable(), &flags);
  ExpectWellFormed(StepOptionTable(), &flags);
}

// The C++ structs' own defaults are the rows' defaults: a default
// written in a header and in the table cannot drift apart.
template <typename Target>
void ExpectDefaultsOf(const OptionTable<Target>& table) {
  const Target defaults{};
  for (const auto& row : table) {
    const std::optional<json> value = row.get(defaults);
    ASSERT_TRUE(value.has_value()) << row.name;
    EXPECT_EQ(*value, row.default_value) << row.name << ": the C++ default is " << value->dump();
  }
}

TEST(OptionTable, DefaultsAreTheCppStructsDefaults) {
  ExpectDefaultsOf(StrategyOptionTable());
  ExpectDefaultsOf(OptimizerOptionTable());
  ExpectDefaultsOf(StepOptionTable());
}

// Every row's value reaches the struct and reads back: its default and a
// value of its own kind that is not the default.
TEST(OptionTable, ApplyThenGetGivesTheValueBack) {
  const std::map<std::string, json> other = {
      {"data_parallel_size", 3},           {"tensor_parallel_size", 2},
      {"shuffle", false},                  {"drop_last", false},
      {"precision", "fp32"},               {"sharding_strategy", "hybrid_shard"},
      {"reshard_after_forward", 4},        {"shard_group_size", 2},
      {"cpu_offload", true},               {"device", "cuda:3"},
      {"pin_memory", false},               {"gpu_memory_limit_gib", 16.5},
      {"profile_steps", 3},                {"profile_wait_steps", 0},
      {"profile_path", "/tmp/steps.json"},
      {"backend", "nccl"},                 {"timeout_ms", 1234},
      {"checkpoint_format", "full"},       {"seed", 42},
      {"activation_checkpointing", "full"}, {"ac_every", 2},
      {"forward_prefetch", 0},             {"backward_prefetch", 3},
      {"gradient_divide_factor", 1.5},     {"gradient_accumulation", "sharded"},
      {"forward_prefetch_modules", ":blocks.1,blocks.0;blocks.0:"},
      {"backward_prefetch_modules", "blocks.1:blocks.0"},
      {"ignored_params", "wpe.weight,blocks.*.bias"},
      {"ignored_params_all_reduce", true}, {"frozen_params", "a.*"}};
  for (const auto& row : StrategyOptionTable()) {
    SCOPED_TRACE(row.name);
    ASSERT_TRUE(other.count(row.name)) << "give the new row a value in this test";
    for (const json& value : {row.default_value, ParseOption(row, other.at(row.name))}) {
      FSDP2StrategyOptions o;
      row.apply(o, value);
      EXPECT_EQ(row.get(o).value_or(json("no value")), value);
    }
  }
  FSDP2StrategyOptions o;
  FindOption(StrategyOptionTable(), "seed")->apply(o, 42);
  EXPECT_EQ(o.data_sampler.seed, 42u);
  FindOption(StrategyOptionTable(), "activation_checkpointing")->apply(o, "selective");
  FindOption(StrategyOptionTable(), "ac_every")->apply(o, 3);
  EXPECT_EQ(o.activation_checkpointing.ToString(), "selective(every 3)");
}

TEST(OptionTable, ChecksNameTheOptionAndWhatItMustBe) {
  const auto& t = StrategyOptionTable();
  auto parse = [&](const char* name, const json& v) {
    return ErrorOf([&] { ParseOption(*FindOption(t, name), v); });
  };
  EXPECT_NE(parse("forward_prefetch", -7).find("forward_prefetch must be 0 or more"),
            std::string::npos) << parse("forward_prefetch", -7);
  EXPECT_NE(parse("backward_prefetch", -1).find("backward_prefetch must be 0 or more"),
            std::string::npos);
  EXPECT_NE(parse("gradient_divide_factor", -1.0).find("gradient_divide_factor must be"),
            std::string::npos);
  EXPECT_NE(parse("ac_every", 0).find("ac_every must be at least 1"), std::string::npos);
  EXPECT_NE(parse("timeout_ms", 0).find("timeout_ms must be positive"), std::string::npos);
  EXPECT_NE(parse("reshard_after_forward", -2).find("a group size"), std::string::npos);
  EXPECT_NE(parse("data_parallel_size", -2).find("\"auto\" or a positive integer"),
            std::string::npos);
  EXPECT_NE(parse("sharding_strategy", "zero3").find("unknown sharding strategy \"zero3\""),
            std::string::npos) << parse("sharding_strategy", "zero3");
  EXPECT_NE(parse("gradient_accumulation", "never").find("local, sharded"), std::string::npos);
  EXPECT_NE(parse("backend", "mpi").find("unknown backend \"mpi\""), std::string::npos);
  EXPECT_NE(parse("device", "tpu").find("\"cuda:K\""), std::string::npos);
  EXPECT_EQ(parse("cpu_offload", true), "") << "cpu_offload is accepted (issue #45)";
  EXPECT_NE(parse("gpu_memory_limit_gib", -1.0).find("gpu_memory_limit_gib must be 0 (the whole "
                                                     "GPU) or a positive number of GiB"),
            std::string::npos) << parse("gpu_memory_limit_gib", -1.0);
  EXPECT_NE(parse("profile_steps", -1).find("profile_steps must be 0 (no trace) or more"),
            std::string::npos) << parse("profile_steps", -1);
  EXPECT_NE(parse("profile_wait_steps", -1).find("profile_wait_steps must be 0 or more"),
            std::string::npos) << parse("profile_wait_steps", -1);
  EXPECT_NE(parse("ac_every", "two").find("\"ac_every\" must be a number"), std::string::npos);
  EXPECT_NE(parse("ignored_params_all_reduce", 2).find("true or false"), std::string::npos);
  EXPECT_NE(parse("ignored_params", json::array({"a,b"})).find("contains one of"),
            std::string::npos);
  EXPECT_NE(parse("forward_prefetch_modules", "blocks.1").find("has no ':'"), std::string::npos);
  EXPECT_NE(parse("forward_prefetch_modules", json{{"a", "b"}}).find("list of module names"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ParseOption(*FindOption(OptimizerOptionTable(), "beta2"), 1.0); })
                .find("beta2 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ParseOption(*FindOption(OptimizerOptionTable(), "lr"), 0.0); })
                .find("lr must be positive"),
            std::string::npos);
  // Other forms, made canonical.
  EXPECT_EQ(ParseOption(*FindOption(t, "reshard_after_forward"), true), 1);
  EXPECT_EQ(ParseOption(*FindOption(t, "reshard_after_forward"), nullptr), -1);
  EXPECT_EQ(ParseOption(*FindOption(t, "activation_checkpointing"), true), "full");
  EXPECT_EQ(ParseOption(*FindOption(t, "ignored_params"), json::array({"a", "b.*"})), "a,b.*");
  EXPECT_EQ(ParseOption(*FindOption(t, "forward_prefetch_modules"),
                        json{{"", json::array({"blocks.1"})}, {"blocks.0", json::array()}}),
            ":blocks.1;blocks.0:");
  EXPECT_EQ(ParseOption(*FindOption(t, "shuffle"), 0), false);
}

TEST(OptionTable, FlagsTextReadsBackAsTheValue) {
  const auto& t = StrategyOptionTable();
  for (const auto& row : t) {
    EXPECT_EQ(ParseOptionText(row, OptionText(row.default_value)), row.default_value) << row.name;
  }
  EXPECT_EQ(ParseOptionText(*FindOption(t, "ignored_params_all_reduce"), "1"), true);
  EXPECT_EQ(ParseOptionText(*FindOption(t, "tensor_parallel_size"), "2"), 2);
  EXPECT_EQ(ParseOptionText(*FindOption(t, "gradient_divide_factor"), "0.5"), 0.5);
  EXPECT_EQ(ParseOptionText(*FindOption(t, "seed"), "18446744073709551615"),
            json(uint64_t{18446744073709551615ull}));
  EXPECT_NE(ErrorOf([&] { ParseOptionText(*FindOption(t, "forward_prefetch"), "two"); })
                .find("must be an integer, got 'two'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ParseOptionText(*FindOption(t, "forward_prefetch"), "-7"); })
                .find("forward_prefetch must be 0 or more"),
            std::string::npos);
}

// C++ callers get every row's check from the constructor, before any
// communication: a negative prefetch depth waited for parallelize().
TEST(OptionTable, TheConstructorRunsEveryCheck) {
  FSDP2StrategyOptions o;
  o.forward_prefetch = -7;
  EXPECT_NE(ErrorOf([&] { FSDP2Strategy s(o); }).find("FSDP2Strategy: forward_prefetch must be"),
            std::string::npos);
  o = {};
  o.gradient_divide_factor = -1;
  EXPECT_NE(ErrorOf([&] { FSDP2Strategy s(o); }).find("gradient_divide_factor"),
            std::string::npos);
  o = {};
  o.mp_policy.param_dtype = at::kHalf;  // a policy only C++ can give: not the table's to check
  FSDP2Strategy ok(o);
}

TEST(OptionTable, SchemaListsEveryRow) {
  const json& schema = OptionSchema();
  ASSERT_EQ(schema.at("strategy").size(), StrategyOptionTable().size());
  ASSERT_EQ(schema.at("optimizer").size(), OptimizerOptionTable().size());
  ASSERT_EQ(schema.at("step").size(), StepOptionTable().size());
  auto row = [&](const char* name) {
    for (const json& r : schema.at("strategy")) {
      if (r.at("name") == name) return r;
    }
    return json();
  };
  EXPECT_EQ(row("seed").at("default"), 0);
  EXPECT_EQ(row("seed").at("flag_default"), 1337);
  EXPECT_EQ(row("sharding_strategy").at("choices"),
            json::array({"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}));
  EXPECT_EQ(row("backend").at("flag_note"), "the FSDP2_BACKEND variable");
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
