// SPDX-License-Identifier: Apache-2.0
// wia-conformance: checks one provider shared object against the provider
// ABI, level by level, each test in its own child process so that a crash
// or a hang is a reported failure and the suite always finishes.
#include <dlfcn.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {
namespace {

constexpr int kExitPass = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kMaxLevel = 5;

enum class Verdict { kPass, kFail, kSkip };

struct Result {
  const TestCase* test = nullptr;
  Verdict verdict = Verdict::kSkip;
  double ms = 0;
  std::string message;  // failure: expected / got; skip: why
};

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "wia-conformance: %s\n", message.c_str());
  std::fprintf(stderr, "usage: wia-conformance --provider FILE [options]; see --help\n");
  std::exit(kExitUsage);
}

// Exit status 2 with exactly one line: the file cannot be tested at all.
[[noreturn]] void untestable(const std::string& path, const std::string& why) {
  std::fprintf(stderr, "wia-conformance: %s: %s\n", path.c_str(), why.c_str());
  std::exit(kExitUsage);
}

void print_help() {
  std::printf(
      "usage: wia-conformance --provider FILE [options]\n"
      "Checks a libwia provider shared object against the provider ABI v1.\n\n"
      "  --provider FILE     the provider to test (libwia-provider-NAME.so)\n"
      "  --level N           run levels 0..N only (default: all)\n"
      "  --filter GLOB       run tests whose id matches GLOB (e.g. 'L1.memcpy.*')\n"
      "  --device N          device index for device tests (default 0)\n"
      "  --endpoint N        transport endpoint for L4 tests (default 0)\n"
      "  --list              list the tests that would run, do not run them\n"
      "  --junit FILE        also write a JUnit XML report to FILE\n"
      "  --timeout-scale X   multiply every test timeout by X (slow machines, sanitizers)\n"
      "  --param KEY=VALUE   value of a parameter the provider declares (repeatable)\n"
      "  --log-level LEVEL   provider log lines shown: trace|debug|info|warn|error|off\n"
      "                      (default warn)\n\n"
      "exit status: 0 all run tests passed, 1 a test failed, 2 bad usage or a file that\n"
      "cannot be tested at all (not a shared object, no wia_provider_v1 symbol, newer ABI)\n");
}

Options parse_args(int argc, char** argv, bool* list, std::string* junit) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto integer = [&](const std::string& flag, const std::string& text) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || v < 0 || v > 1000000)
      usage_error(flag + " '" + text + "': expected a non-negative integer");
    return static_cast<int>(v);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--provider") {
      o.provider_path = value(i);
    } else if (a == "--level") {
      o.max_level = integer(a, value(i));
    } else if (a == "--filter") {
      o.filter = value(i);
    } else if (a == "--device") {
      o.device = integer(a, value(i));
    } else if (a == "--endpoint") {
      o.endpoint = integer(a, value(i));
    } else if (a == "--list") {
      *list = true;
    } else if (a == "--junit") {
      *junit = value(i);
    } else if (a == "--timeout-scale") {
      const std::string t = value(i);
      char* end = nullptr;
      o.timeout_scale = std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0' || !(o.timeout_scale > 0) || o.timeout_scale > 1000)
        usage_error("--timeout-scale '" + t + "': expected a number in (0, 1000]");
    } else if (a == "--param") {
      const std::string kv = value(i);
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        usage_error("--param '" + kv + "': expected KEY=VALUE");
      o.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (a == "--log-level") {
      static const char* const kNames[] = {"trace", "debug", "info", "warn", "error", "off"};
      const std::string l = value(i);
      int found = -1;
      for (int k = 0; k < 6; ++k)
        if (l == kNames[k]) found = k;
      if (found < 0)
        usage_error("--log-level '" + l + "': expected trace|debug|info|warn|error|off");
      o.log_level = static_cast<wia_log_level_t>(found);
    } else if (a == "--help" || a == "-h") {
      print_help();
      std::exit(kExitPass);
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (o.provider_path.empty()) usage_error("--provider FILE is required");
  return o;
}

// Loads the file and returns the descriptor, or exits 2 with one line.
const wia_provider_v1_t* load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    untestable(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) untestable(path, "not a regular file");
  // dlopen searches the library path for names without a slash; the user
  // named a file, so make it one.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    std::string why = err != nullptr ? err : "unknown dlopen error";
    // dlerror repeats the path; the line already starts with it.
    const std::string prefix = file + ": ";
    if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
    const bool not_elf = why.find("invalid ELF header") != std::string::npos ||
                         why.find("file too short") != std::string::npos;
    untestable(path, (not_elf ? "not a shared object: " : "cannot be loaded: ") + why);
  }
  // Never dlclose: children inherit the mapping, and a provider's
  // destructors must not run under a test that is still reading it.
  const auto* desc = static_cast<const wia_provider_v1_t*>(dlsym(handle, WIA_PROVIDER_SYMBOL_V1));
  if (desc == nullptr) untestable(path, "not a libwia provider: no wia_provider_v1 symbol");
  if (desc->abi_version > WIA_PROVIDER_ABI_VERSION)
    untestable(path, "provider built for a newer ABI: abi_version " +
                         std::to_string(desc->abi_version) + ", wia-conformance knows up to " +
                         std::to_string(WIA_PROVIDER_ABI_VERSION));
  return desc;
}

// Reads "<tag><len>:<text>" records out of `buf`, leaving a partial tail.
void parse_records(std::string* buf, std::string* last_step, char* verdict, std::string* message) {
  for (;;) {
    const auto colon = buf->find(':');
    if (buf->empty() || colon == std::string::npos) return;
    const std::size_t len = std::strtoull(buf->c_str() + 1, nullptr, 10);
    if (buf->size() < colon + 1 + len) return;
    const char tag = (*buf)[0];
    std::string text = buf->substr(colon + 1, len);
    buf->erase(0, colon + 1 + len);
    if (tag == 'P') {
      *last_step = std::move(text);
    } else {
      *verdict = tag;
      *message = std::move(text);
    }
  }
}

[[noreturn]] void run_child(const TestCase& t, const Options& opts, const wia_provider_v1_t* desc,
                            int fd, int timeout_ms) {
  // Own process group, so a timeout also kills helpers the test forked.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A crash must reach the parent as the signal itself, even where a
  // sanitizer runtime installed handlers that would turn it into an exit.
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, SIG_DFL);
  char verdict = 'F';
  std::string message;
  // Never destroyed: after a failure or skip the stack of the test body is
  // gone while its streams may still hold work pointing into it, and a
  // provider that just failed may crash or hang in cleanup, which would
  // hide the real verdict. The process ends right after the report.
  auto* ctx = new Context(opts, desc, fd);
  ctx->set_timeout_ms(timeout_ms);
  try {
    t.body(*ctx);
    ctx->finish();  // a passing test also releases cleanly
    verdict = 'S';
  } catch (const Skip& s) {
    verdict = 'K';
    message = s.what();
  } catch (const Failure& f) {
    message = f.what();
  } catch (const std::exception& e) {
    message = std::string("the test threw: ") + e.what();
  }
  ctx->report(verdict, message);
  std::fflush(nullptr);
  _exit(0);
}

Result run_test(const TestCase& t, const Options& opts, const wia_provider_v1_t* desc) {
  Result r;
  r.test = &t;
  if (!t.not_implemented.empty()) {
    r.message = t.not_implemented;
    return r;
  }
  const int timeout_ms = std::max(1, static_cast<int>(t.timeout_ms * opts.timeout_scale));
  int fds[2];
  if (pipe(fds) != 0) {
    r.verdict = Verdict::kFail;
    r.message = std::string("harness: pipe: ") + std::strerror(errno);
    return r;
  }
  std::fflush(nullptr);
  const double start = now_ms();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    r.verdict = Verdict::kFail;
    r.message = std::string("harness: fork: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    close(fds[0]);
    run_child(t, opts, desc, fds[1], timeout_ms);
  }
  setpgid(pid, pid);  // also here: no race with the child's own call
  close(fds[1]);

  std::string buf, last_step, message;
  char verdict = 0;
  int wstatus = 0;
  bool reaped = false, timed_out = false, eof = false;
  const double deadline = start + timeout_ms;
  while (!reaped) {
    const double left = deadline - now_ms();
    if (left <= 0) {
      timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int wait = eof ? 0 : std::min(20, static_cast<int>(left) + 1);
    if (!eof && poll(&pfd, 1, wait) > 0) {
      char chunk[4096];
      const ssize_t n = read(fds[0], chunk, sizeof(chunk));
      if (n > 0)
        buf.append(chunk, static_cast<std::size_t>(n));
      else if (n == 0)
        eof = true;
      parse_records(&buf, &last_step, &verdict, &message);
    }
    const pid_t w = waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) reaped = true;
    if (eof && !reaped) usleep(1000);
  }
  // Drain what the child wrote just before it ended.
  for (;;) {
    char chunk[4096];
    pollfd pfd{fds[0], POLLIN, 0};
    if (poll(&pfd, 1, 0) <= 0) break;
    const ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n <= 0) break;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
  parse_records(&buf, &last_step, &verdict, &message);
  close(fds[0]);
  kill(-pid, SIGKILL);  // helpers the test left behind
  r.ms = now_ms() - start;

  const std::string where = last_step.empty() ? "" : " (last step: " + last_step + ")";
  if (timed_out) {
    r.verdict = Verdict::kFail;
    r.message = "timed out after " + std::to_string(timeout_ms) + " ms" + where;
  } else if (verdict == 'S') {
    r.verdict = Verdict::kPass;
  } else if (verdict == 'K') {
    r.verdict = Verdict::kSkip;
    r.message = message;
  } else if (verdict == 'F') {
    r.verdict = Verdict::kFail;
    r.message = message;
  } else if (WIFSIGNALED(wstatus)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(wstatus));
    r.verdict = Verdict::kFail;
    r.message = std::string("crashed: SIG") + (abbrev != nullptr ? abbrev : "?") + where;
  } else {
    r.verdict = Verdict::kFail;
    r.message = "exited with status " + std::to_string(WEXITSTATUS(wstatus)) +
                " without reporting a result" + where;
  }
  return r;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // XML 1.0 forbids most control characters, even escaped.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t')
          out += '?';
        else
          out += c;
    }
  }
  return out;
}

bool write_junit(const std::string& path, const std::vector<Result>& results,
                 const wia_provider_v1_t* desc) {
  std::ofstream f(path);
  if (!f) return false;
  const std::string name = desc->name != nullptr ? desc->name : "?";
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  f << "<testsuites name=\"wia-conformance." << xml_escape(name) << "\">\n";
  for (int level = 0; level <= kMaxLevel; ++level) {
    int tests = 0, failures = 0, skipped = 0;
    double ms = 0;
    for (const auto& r : results) {
      if (r.test->level != level) continue;
      ++tests;
      failures += r.verdict == Verdict::kFail;
      skipped += r.verdict == Verdict::kSkip;
      ms += r.ms;
    }
    if (tests == 0) continue;
    char time[32];
    std::snprintf(time, sizeof(time), "%.3f", ms / 1e3);
    f << "  <testsuite name=\"L" << level << "\" tests=\"" << tests << "\" failures=\"" << failures
      << "\" errors=\"0\" skipped=\"" << skipped << "\" time=\"" << time << "\">\n";
    for (const auto& r : results) {
      if (r.test->level != level) continue;
      std::snprintf(time, sizeof(time), "%.3f", r.ms / 1e3);
      f << "    <testcase classname=\"" << xml_escape(name) << ".L" << level << "\" name=\""
        << xml_escape(r.test->id) << "\" time=\"" << time << "\"";
      if (r.verdict == Verdict::kPass) {
        f << "/>\n";
        continue;
      }
      f << ">\n";
      const std::string first = r.message.substr(0, r.message.find('\n'));
      if (r.verdict == Verdict::kFail)
        f << "      <failure message=\"" << xml_escape(first) << "\">" << xml_escape(r.message)
          << "</failure>\n";
      else
        f << "      <skipped message=\"" << xml_escape(first) << "\"/>\n";
      f << "    </testcase>\n";
    }
    f << "  </testsuite>\n";
  }
  f << "</testsuites>\n";
  return static_cast<bool>(f);
}

std::string caps_text(const wia_provider_v1_t* d) {
  std::string s;
  if (d->caps & WIA_PROVIDER_CAP_DEVICE) s += " device";
  if (d->caps & WIA_PROVIDER_CAP_TRANSPORT) s += " transport";
  if ((d->caps & WIA_PROVIDER_CAP_DEVICE) && d->device != nullptr) {
    // Bit b of WIA_DEVICE_CAP_* (provider.h), appended ones included.
    static const char* const kNames[] = {"host_func",   "event_timing", "peer",
                                         "ipc",         "reduce",       "pinned_host",
                                         "scale",       "kernel",       "dmabuf"};
    s += " (device caps:";
    for (int b = 0; b < static_cast<int>(std::size(kNames)); ++b)
      if (d->device->caps & (1ull << b)) s += std::string(" ") + kNames[b];
    s += ")";
  }
  if ((d->caps & WIA_PROVIDER_CAP_TRANSPORT) && d->transport != nullptr) {
    s += " (transport caps:";
    const std::uint64_t tc = d->transport->caps;
    if (tc & WIA_TRANSPORT_CAP_RMA) s += " rma";
    if (tc & WIA_TRANSPORT_CAP_INLINE) s += " inline";
    if (tc & WIA_TRANSPORT_CAP_WAIT_FD) s += " wait_fd";
    if ((tc & (WIA_TRANSPORT_CAP_RMA | WIA_TRANSPORT_CAP_INLINE | WIA_TRANSPORT_CAP_WAIT_FD)) == 0)
      s += " none";
    if (d->transport->must_understand & WIA_TRANSPORT_REQ_ORDERED_RECV) s += ", ordered_recv";
    s += ")";
  }
  return s.empty() ? " none" : s;
}

int run_main(int argc, char** argv) {
  bool list = false;
  std::string junit;
  Options opts = parse_args(argc, argv, &list, &junit);
  const wia_provider_v1_t* desc = load(opts.provider_path);

  register_l0_tests();
  register_l1_tests();
  register_l2_tests();
  register_l3_tests();
  register_l4_tests(desc);
  register_l5_tests(desc);

  std::vector<const TestCase*> selected;
  for (const auto& t : registry())
    if (t.level <= opts.max_level && fnmatch(opts.filter.c_str(), t.id.c_str(), 0) == 0)
      selected.push_back(&t);

  if (list) {
    for (const auto* t : selected) {
      if (!t->not_implemented.empty())
        std::printf("%-34s L%d  SKIP: %s\n", t->id.c_str(), t->level, t->not_implemented.c_str());
      else
        std::printf("%-34s L%d  %s\n", t->id.c_str(), t->level, t->what.c_str());
    }
    return kExitPass;
  }

  for (const auto& [key, v] : opts.params) {
    bool declared = false;
    if (desc->params != nullptr && desc->num_params > 0 && desc->params[0].struct_size > 0) {
      const auto* base = reinterpret_cast<const unsigned char*>(desc->params);
      for (std::uint32_t i = 0; i < desc->num_params; ++i) {
        const auto* d =
            reinterpret_cast<const wia_param_decl_v1_t*>(base + i * desc->params[0].struct_size);
        declared |= d->key != nullptr && key == d->key;
      }
    }
    if (!declared)
      std::fprintf(stderr,
                   "wia-conformance: warning: --param %s: the provider declares no such key; "
                   "get_param will answer NULL for it\n",
                   key.c_str());
  }

  std::printf("wia-conformance: provider '%s' %s (%s), ABI v%u, caps:%s\n",
              desc->name != nullptr ? desc->name : "?",
              desc->version != nullptr ? desc->version : "?", opts.provider_path.c_str(),
              desc->abi_version, caps_text(desc).c_str());
  const double t0 = now_ms();
  std::vector<Result> results;
  int passed = 0, failed = 0, skipped = 0;
  for (const auto* t : selected) {
    Result r = run_test(*t, opts, desc);
    const char* v = r.verdict == Verdict::kPass   ? "PASS"
                    : r.verdict == Verdict::kFail ? "FAIL"
                                                  : "SKIP";
    std::printf("%s  %-34s L%d %9.1f ms", v, t->id.c_str(), t->level, r.ms);
    if (r.verdict == Verdict::kSkip) std::printf("  %s", r.message.c_str());
    std::printf("\n");
    if (r.verdict == Verdict::kFail) {
      std::string indented = "      " + r.message;
      for (std::size_t p = 0; (p = indented.find('\n', p)) != std::string::npos; p += 7)
        indented.replace(p, 1, "\n      ");
      std::printf("%s\n", indented.c_str());
    }
    std::fflush(stdout);
    passed += r.verdict == Verdict::kPass;
    failed += r.verdict == Verdict::kFail;
    skipped += r.verdict == Verdict::kSkip;
    results.push_back(std::move(r));
  }

  // The highest level L such that every level 0..L that applies to this
  // provider ran at least one test and none failed. Skips (a capability not
  // claimed) do not lower it; levels of an interface the provider does not
  // have (L1-L3 for a transport-only provider, L4 for a device provider)
  // do not apply.
  auto applies = [desc](int level) {
    const bool device = (desc->caps & WIA_PROVIDER_CAP_DEVICE) != 0;
    const bool transport = (desc->caps & WIA_PROVIDER_CAP_TRANSPORT) != 0;
    if (level >= 1 && level <= 3) return device;
    if (level == 4) return transport;
    return true;
  };
  int highest = -1;
  std::string stopped;  // why the next level does not count
  for (int level = 0; level <= std::min(opts.max_level, kMaxLevel); ++level) {
    if (!applies(level)) continue;
    int level_pass = 0, level_fail = 0;
    for (const auto& r : results) {
      if (r.test->level != level) continue;
      level_pass += r.verdict == Verdict::kPass;
      level_fail += r.verdict == Verdict::kFail;
    }
    if (level_pass + level_fail == 0 &&
        std::none_of(results.begin(), results.end(),
                     [level](const Result& r) { return r.test->level == level; }))
      break;  // nothing of this level was selected or exists for this provider
    if (level_fail > 0 || level_pass == 0) {
      stopped =
          "L" + std::to_string(level) +
          (level_fail > 0 ? ": " + std::to_string(level_fail) + " failed" : ": no test passed");
      break;
    }
    highest = level;
  }
  std::printf("\n%d passed, %d failed, %d skipped in %.2f s\n", passed, failed, skipped,
              (now_ms() - t0) / 1e3);
  const bool filtered = opts.filter != "*";
  std::string verdict = highest >= 0 ? "L" + std::to_string(highest) : "none";
  if (!stopped.empty()) verdict += " (" + stopped + ")";
  if (filtered) verdict += " among the tests selected by --filter";
  std::printf("highest level fully passed: %s\n", verdict.c_str());

  if (!junit.empty() && !write_junit(junit, results, desc)) {
    std::fprintf(stderr, "wia-conformance: %s: cannot write the JUnit report\n", junit.c_str());
    return kExitUsage;
  }
  return failed > 0 ? kExitFail : kExitPass;
}

}  // namespace
}  // namespace wia::conformance

int main(int argc, char** argv) { return wia::conformance::run_main(argc, argv); }
