#include "core/launch/local_launcher.h"
#include "core/common/error.h"

#include "core/launch/allocator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace fsdp2 {
namespace launch {
namespace {

// Set in the environment of a process ReexecWithRankEnvironment restarted.
constexpr char kRankEnvExecMarker[] = "FSDP2_RANK_ENV_EXEC";

}  // namespace

bool IsRankProcess() {
  const char* rank = std::getenv("RANK");
  return rank != nullptr && *rank != '\0';
}

namespace {

// The value of the first /proc/cpuinfo line whose key is `key`, or "".
std::string CpuinfoValue(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.rfind(key, 0) != 0) continue;
    if (line.find_first_not_of(" \t", key.size()) != colon) continue;
    const size_t start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace

std::string CpuFlags() {
  const std::string flags = CpuinfoValue("flags");
  return flags.empty() ? " " : " " + flags + " ";
}

bool HasCpuFlag(const std::string& flags, const std::string& flag) {
  return (" " + flags + " ").find(" " + flag + " ") != std::string::npos;
}

std::string CpuVendor() { return CpuinfoValue("vendor_id"); }

std::map<std::string, std::string> CpuPerformanceEnv() {
  std::map<std::string, std::string> env;
  // OpenMP threads that spin while waiting for work steal the core from the
  // other ranks and from the comm threads: with 2 threads per process on a
  // loaded 2-core machine a GPT step took 1.1 s spinning and 0.16 s passive.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    env["OMP_WAIT_POLICY"] = "PASSIVE";
  }
  // The allocator (see allocator.h): glibc's malloc returns large freed
  // blocks to the kernel and faults them in again every step.
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string current = preload != nullptr ? preload : "";
  const std::string wanted = RankPreload(current);
  if (wanted != current && ActiveAllocator() != RequestedAllocator()) {
    env["LD_PRELOAD"] = wanted;
  }
  return env;
}

void ReexecWithRankEnvironment(char** argv) {
  const bool second_run = std::getenv(kRankEnvExecMarker) != nullptr;
  unsetenv(kRankEnvExecMarker);  // not inherited by what this process starts
  if (second_run) {
    // Restarted with the allocator preloaded (never under AddressSanitizer,
    // where the restart was for the other variables), yet it is not there.
    const std::string wanted = RequestedAllocator();
    const std::string library = AllocatorLibrary(wanted);
    const char* preload = std::getenv("LD_PRELOAD");
    if (!library.empty() && preload != nullptr &&
        std::string(preload).find(library) != std::string::npos &&
        ActiveAllocator() != wanted) {
      std::cerr << "fsdp2: " << wanted << " was preloaded but is not active; "
                << "training with the " << ActiveAllocator() << " allocator\n";
    }
    return;
  }
  const auto env = CpuPerformanceEnv();
  if (env.empty()) return;
  std::map<std::string, std::optional<std::string>> before;
  for (const auto& [name, value] : env) {
    const char* old = std::getenv(name.c_str());
    before[name] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
    setenv(name.c_str(), value.c_str(), 1);
  }
  setenv(kRankEnvExecMarker, "1", 1);
  // The binary's own path, not /proc/self/exe: the kernel names a process
  // after the file it executes, and `ps`, `top` and `pgrep train` should
  // still find the rank by its name after the restart.
  char exe[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  execv(len > 0 ? std::string(exe, static_cast<size_t>(len)).c_str() : "/proc/self/exe",
        argv);
  // Still here: exec failed. Train on, with what we have.
  const int error = errno;
  std::cerr << "fsdp2: could not restart with the rank environment ("
            << std::strerror(error) << "); training without it\n";
  unsetenv(kRankEnvExecMarker);
  for (const auto& [name, value] : before) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
}

int FindFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("could not find a free port");
  }
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

int SpawnSelf(const std::vector<std::string>& argv_in,
              const std::map<std::string, std::string>& env, int output_fd) {
  // Everything the child needs is built before fork(): after it, only
  // async-signal-safe calls.
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  exe[len] = '\0';
  std::vector<std::string> env_strings, args = argv_in;
  if (args.empty()) args.push_back(exe);
  for (const auto& kv : env) env_strings.push_back(kv.first + "=" + kv.second);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork() failed");
  if (pid == 0) {
    dup2(output_fd, 1);
    dup2(output_fd, 2);
    if (output_fd > 2) close(output_fd);
    execve(exe, argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

namespace {

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  }
  return "unknown status";
}

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int RunRanksOnce(int n, const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& base);

}  // namespace

int RestartCount() {
  const char* count = std::getenv(kRestartCountEnv);
  return count ? std::atoi(count) : 0;
}

int LaunchLocal(const LocalLaunchOptions& options) {
  const int n = options.nproc;
  if (n < 1) {
    throw InvalidArgumentError("--nproc must be at least 1 (got " +
                                std::to_string(n) + ")");
  }
  int threads = options.threads_per_rank;
  if (threads <= 0) {
    threads = std::max(1u, std::thread::hardware_concurrency() / n);
  }
  std::map<std::string, std::string> base = CurrentEnvironment();
  for (const auto& kv : CpuPerformanceEnv()) base[kv.first] = kv.second;
  base["OMP_NUM_THREADS"] = std::to_string(threads);
  base["FSDP2_THREADS"] = std::to_string(threads);
  base["MASTER_ADDR"] = "127.0.0.1";
  base["WORLD_SIZE"] = std::to_string(n);
  base["LOCAL_WORLD_SIZE"] = std::to_string(n);
  for (const auto& kv : options.env) base[kv.first] = kv.second;
  if (options.max_restarts < 0) {
    throw InvalidArgumentError("--max-restarts must be 0 or more (got " +
                               std::to_string(options.max_restarts) + ")");
  }
  for (int restart = 0;; ++restart) {
    base["MASTER_PORT"] = std::to_string(FindFreePort());
    base[kRestartCountEnv] = std::to_string(restart);
    const int code = RunRanksOnce(n, options.argv, base);
    if (code == 0 || restart >= options.max_restarts) return code;
    std::cerr << "fsdp2 launcher: restarting all " << n << " ranks (restart " << restart + 1
              << " of at most " << options.max_restarts << ")\n";
  }
}

namespace {

// One run of every rank; see LaunchLocal.
int RunRanksOnce(int n, const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& base) {

  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int rank = 0; rank < n; ++rank) {
    auto env = base;
    env["RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(rank);
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe() failed");
    fcntl(pipe_fds[0], F_SETFD, FD_CLOEXEC);
    pids[rank] = SpawnSelf(argv, env, pipe_fds[1]);
    close(pipe_fds[1]);
    fds[rank] = pipe_fds[0];
  }

  // Forward output line by line until every pipe closes.
  std::vector<std::string> partial(n);
  std::vector<bool> open(n, true);
  int open_count = n;
  int first_failure = 0;
  std::vector<bool> reaped(n, false);
  auto emit = [&](int rank, const std::string& line) {
    std::ostream& out = std::cout;
    out << (n > 1 ? "[rank " + std::to_string(rank) + "] " : std::string())
        << line << "\n";
    out.flush();
  };
  auto reap = [&](bool block) {
    for (int rank = 0; rank < n; ++rank) {
      if (reaped[rank]) continue;
      int status = 0;
      pid_t got = waitpid(pids[rank], &status, block ? 0 : WNOHANG);
      if (got != pids[rank]) continue;
      reaped[rank] = true;
      if (ExitCode(status) != 0 && first_failure == 0) {
        first_failure = ExitCode(status);
        std::cerr << "fsdp2 launcher: rank " << rank << " failed ("
                  << Describe(status) << "); stopping the other ranks\n";
        for (int other = 0; other < n; ++other) {
          if (!reaped[other]) kill(pids[other], SIGTERM);
        }
      }
    }
  };
  while (open_count > 0) {
    std::vector<pollfd> polls;
    std::vector<int> ranks;
    for (int rank = 0; rank < n; ++rank) {
      if (open[rank]) {
        polls.push_back({fds[rank], POLLIN, 0});
        ranks.push_back(rank);
      }
    }
    int ready = poll(polls.data(), polls.size(), 200);
    if (ready < 0 && errno != EINTR) break;
    for (size_t i = 0; i < polls.size(); ++i) {
      if (!(polls[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int rank = ranks[i];
      char buf[4096];
      ssize_t got = read(fds[rank], buf, sizeof(buf));
      if (got <= 0) {
        if (!partial[rank].empty()) emit(rank, partial[rank]);
        partial[rank].clear();
        close(fds[rank]);
        open[rank] = false;
        --open_count;
        continue;
      }
      partial[rank].append(buf, got);
      size_t pos;
      while ((pos = partial[rank].find('\n')) != std::string::npos) {
        emit(rank, partial[rank].substr(0, pos));
        partial[rank].erase(0, pos + 1);
      }
    }
    reap(/*block=*/false);
  }
  reap(/*block=*/true);
  return first_failure;
}

}  // namespace

}  // namespace launch
}  // namespace fsdp2
