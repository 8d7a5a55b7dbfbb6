// fsdp2/examples/flags/flags.h
//
// Command-line flags for the example programs and the benchmarks:
// `--key value` or `--key=value`, read as an integer, a number or a string
// with a default, and a --help text made from the flags the program reads.
//
//   flags::Flags flags(argc, argv, "usage: train [--flag value ...]");
//   const int steps = flags.Int("steps", 30, "optimizer steps");
//   const std::string data = flags.String("data", "pystdlib", "the text");
//   flags.Finish();  // --help: prints the help and exits 0;
//                    // a flag nothing read: throws FlagError
//
// Errors are FlagError exceptions whose message is one line saying what
// was wrong ("unknown flag --bogus (see --help)", "--steps expects an
// integer, got 'x'"); the program prints it and exits non-zero.
#ifndef FSDP2_EXAMPLES_FLAGS_FLAGS_H_
#define FSDP2_EXAMPLES_FLAGS_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace fsdp2 {
namespace flags {

// A command line that cannot be read; what() is one line.
class FlagError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Not thread-safe; one per program, read from main().
class Flags {
 public:
  // Reads argv[1..argc): `--key value` or `--key=value`; a key given twice
  // keeps its last value. `--help` or `-h` asks for the help (the
  // arguments after it are not read). `usage` opens the help text. Throws
  // FlagError for an argument that is not a flag or a flag without a value.
  Flags(int argc, const char* const* argv, std::string usage);

  // The value of --name, or `default_value` when it was not given. Each
  // call registers the flag for Help() and marks it read. Throws FlagError
  // when the value is not a whole number (Int) or a number (Double). After
  // --help each returns its default.
  int64_t Int(const std::string& name, int64_t default_value, const std::string& help);
  double Double(const std::string& name, double default_value, const std::string& help);
  std::string String(const std::string& name, const std::string& default_value,
                     const std::string& help);
  // Comma-separated non-empty words ("fp32,bf16"); FlagError for an empty
  // item.
  std::vector<std::string> StringList(const std::string& name,
                                      const std::vector<std::string>& default_value,
                                      const std::string& help);
  // Comma-separated whole numbers ("2,4"); FlagError for anything else.
  std::vector<int64_t> IntList(const std::string& name,
                               const std::vector<int64_t>& default_value,
                               const std::string& help);

  // Call once every flag has been read. After --help: prints Help() to
  // stdout and exits with status 0. Otherwise throws FlagError naming the
  // first given flag that no call read ("unknown flag --x (see --help)").
  void Finish() const;

  // The usage, then one line per registered flag: its name, the kind of
  // value, its help and its default.
  std::string Help() const;
  bool help_requested() const { return help_requested_; }

 private:
  struct Registered {
    std::string name, value_kind, help, default_value;
  };
  // The given value of --name, or nullptr; registers and marks it read.
  const std::string* Read(const std::string& name, const std::string& value_kind,
                          const std::string& help, const std::string& default_value);

  std::string usage_;
  bool help_requested_ = false;
  std::map<std::string, std::string> given_;
  std::set<std::string> read_;
  std::vector<Registered> registered_;
};

}  // namespace flags
}  // namespace fsdp2

#endif  // FSDP2_EXAMPLES_FLAGS_FLAGS_H_
