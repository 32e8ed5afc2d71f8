// SPDX-License-Identifier: Apache-2.0
// Runs wia-conformance as a vendor would (a separate process) against
// providers with known behaviour, and checks the verdicts test by test.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Run {
  int rc = -1;
  std::string output;
  std::map<std::string, std::string> verdict;  // id -> PASS/FAIL/SKIP
  std::map<std::string, std::string> message;  // id -> failure text
  std::vector<std::string> lines;
};

std::string faulty(const std::string& name) {
  return std::string(WIA_FAULTY_PROVIDER_DIR) + "/libwia-provider-" + name + ".so";
}
std::string host_provider() {
  return std::string(WIA_TEST_PROVIDER_DIR) + "/libwia-provider-host.so";
}
std::string test_provider(const std::string& name) {
  return std::string(WIA_TEST_BROKEN_PROVIDER_DIR) + "/libwia-provider-" + name + ".so";
}

Run run(const std::string& args) {
  Run r;
  const std::string cmd = std::string(WIA_CONFORMANCE_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
  const int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::istringstream in(r.output);
  std::string line, last_id;
  while (std::getline(in, line)) {
    r.lines.push_back(line);
    if (line.size() > 6 &&
        (line.compare(0, 6, "PASS  ") == 0 || line.compare(0, 6, "FAIL  ") == 0 ||
         line.compare(0, 6, "SKIP  ") == 0)) {
      std::istringstream words(line.substr(6));
      words >> last_id;
      r.verdict[last_id] = line.substr(0, 4);
    } else if (line.compare(0, 6, "      ") == 0 && !last_id.empty()) {
      r.message[last_id] += line.substr(6) + "\n";
    }
  }
  INFO("command: " << cmd << "\noutput:\n" << r.output);
  return r;
}

bool finished(const Run& r) {
  return r.output.find("highest level fully passed") != std::string::npos;
}

void expect_verdict(const Run& r, const std::string& id, const std::string& want,
                    const std::string& text = "") {
  INFO("output:\n" << r.output);
  const auto it = r.verdict.find(id);
  REQUIRE_MESSAGE(it != r.verdict.end(), id << " was not reported");
  CHECK_MESSAGE(it->second == want, id << " is " << it->second << ", expected " << want);
  if (!text.empty()) {
    const auto m = r.message.find(id);
    CHECK_MESSAGE((m != r.message.end() && m->second.find(text) != std::string::npos),
                  id << "'s message lacks '" << text << "'");
  }
}

// Every test of `level` passed.
void expect_level_clean(const Run& r, const std::string& level) {
  for (const auto& [id, v] : r.verdict)
    if (id.compare(0, level.size() + 1, level + ".") == 0) {
      INFO(id << "\n" << r.output);
      CHECK(v != "FAIL");
    }
}

}  // namespace

TEST_CASE("the host provider passes L0-L3 with two devices, with a JUnit report") {
  const std::string junit = std::string(WIA_TEST_BINARY_DIR) + "/conformance-host.xml";
  const Run r = run("--provider " + host_provider() + " --param devices=2 --junit " + junit);
  INFO(r.output);
  CHECK(r.rc == 0);
  CHECK(r.output.find("highest level fully passed: L3") != std::string::npos);
  for (const char* id : {"L0.symbol", "L1.memcpy.d2h_pattern", "L2.stream.order",
                         "L2.reduce.float16", "L3.peer.memcpy", "L3.ipc.roundtrip"})
    expect_verdict(r, id, "PASS");
  std::ifstream f(junit);
  std::stringstream xml;
  xml << f.rdbuf();
  CHECK(xml.str().find("<testsuite name=\"L3\"") != std::string::npos);
  CHECK(xml.str().find("name=\"L2.event.wait\"") != std::string::npos);
  CHECK(xml.str().find("<failure") == std::string::npos);
}

TEST_CASE("the defect-free testdev and the acme example pass L0-L2") {
  for (const char* name : {"testdev_ok", "acme"}) {
    const Run r = run("--provider " + faulty(name) + " --level 2");
    INFO(name << "\n" << r.output);
    CHECK(r.rc == 0);
    CHECK(r.output.find("highest level fully passed: L2") != std::string::npos);
    CHECK(r.verdict.count("L3.peer.query") == 0);  // --level 2
  }
}

TEST_CASE("memcpy that does not copy fails the L1 copy tests") {
  const Run r = run("--provider " + faulty("testdev_nocopy") + " --level 2");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  expect_level_clean(r, "L0");
  for (const char* id : {"L1.memcpy.h2d", "L1.memcpy.d2h_pattern", "L1.memcpy.d2d",
                         "L1.memcpy.unaligned", "L1.memcpy.large"})
    expect_verdict(r, id, "FAIL", "expected:");
  expect_verdict(r, "L1.alloc.sizes", "PASS");
}

TEST_CASE("out-of-order streams fail L2.stream.order only") {
  const Run r = run("--provider " + faulty("testdev_lifo") + " --level 2 --filter 'L[12].*'");
  CHECK(r.rc == 1);
  expect_level_clean(r, "L1");
  expect_verdict(r, "L2.stream.order", "FAIL", "enqueue order");
}

TEST_CASE("a corrupted tail of large copies fails the large-copy tests") {
  const Run r = run("--provider " + faulty("testdev_tail") + " --level 1");
  CHECK(r.rc == 1);
  expect_verdict(r, "L1.memcpy.large", "FAIL", "wrong bytes");
  expect_verdict(r, "L1.memcpy.d2d", "FAIL");
  expect_verdict(r, "L1.memcpy.h2d", "PASS");
  expect_verdict(r, "L1.memcpy.unaligned", "PASS");
}

TEST_CASE("mem_free that leaks fails L1.alloc.free_reuse against the memory cap") {
  const Run r = run("--provider " + faulty("testdev_leak") + " --level 1");
  CHECK(r.rc == 1);
  expect_verdict(r, "L1.alloc.free_reuse", "FAIL", "WIA_ERROR_OUT_OF_MEMORY");
  expect_verdict(r, "L1.alloc.sizes", "PASS");
}

TEST_CASE("a hanging event_query times out and the suite goes on") {
  // Timeouts scaled down to keep the self-test short: 10 s -> 2 s.
  const Run r = run("--provider " + faulty("testdev_hang") +
                    " --level 2 --filter 'L2.*' "
                    "--timeout-scale 0.2");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  expect_verdict(r, "L2.event.query", "FAIL", "timed out after 2000 ms");
  expect_verdict(r, "L2.host_func.order", "PASS");  // after the hang
}

TEST_CASE("a SIGSEGV in memset is reported as a crash and the suite goes on") {
  const Run r = run("--provider " + faulty("testdev_crash") + " --level 2");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  expect_verdict(r, "L1.memset.pattern", "FAIL", "crashed: SIGSEGV");
  expect_verdict(r, "L2.host_func.order", "PASS");
  expect_level_clean(r, "L0");
}

TEST_CASE("files that cannot be tested give exit status 2 and one line") {
  const std::string text = std::string(WIA_TEST_BINARY_DIR) + "/libwia-provider-text.so";
  std::ofstream(text) << "just text\n";
  struct Case {
    std::string file, says;
  };
  for (const Case& c :
       {Case{text, "not a shared object"},
        Case{test_provider("broken_nosym"), "not a libwia provider: no wia_provider_v1 symbol"},
        Case{test_provider("broken_abi"), "provider built for a newer ABI"},
        Case{std::string(WIA_TEST_BINARY_DIR) + "/nonexistent.so", "cannot open"}}) {
    const Run r = run("--provider " + c.file);
    INFO(r.output);
    CHECK(r.rc == 2);
    CHECK(r.lines.size() == 1);
    CHECK(r.output.find("wia-conformance: " + c.file + ": " + c.says) == 0);
  }
  CHECK(run("").rc == 2);
  CHECK(run("--provider " + host_provider() + " --level x").rc == 2);
  CHECK(run("--provider " + host_provider() + " --bogus").rc == 2);
}

TEST_CASE("--list and --filter select tests by id") {
  Run r = run("--provider " + host_provider() + " --list");
  CHECK(r.rc == 0);
  CHECK(r.output.find("L0.symbol") != std::string::npos);
  CHECK(r.output.find("L3.ipc.roundtrip") != std::string::npos);
  CHECK(r.output.find("L4") == std::string::npos);  // no transport: no L4/L5 lines
  r = run("--provider " + host_provider() + " --filter 'L1.memcpy.*'");
  CHECK(r.rc == 0);
  CHECK(r.verdict.size() == 5);
  for (const auto& [id, v] : r.verdict) CHECK(id.rfind("L1.memcpy.", 0) == 0);
}

TEST_CASE("a transport provider gets L4 and L5 listed as not implemented, never passed") {
  Run r = run("--provider " + faulty("testdev_transport") + " --list");
  CHECK(r.rc == 0);
  CHECK(r.output.find("L4.transport") != std::string::npos);
  CHECK(r.output.find("L5.collectives") != std::string::npos);
  CHECK(r.output.find("SKIP: not implemented in this release") != std::string::npos);
  r = run("--provider " + faulty("testdev_transport") + " --filter 'L[045]*'");
  CHECK(r.rc == 0);
  expect_verdict(r, "L0.required_entries", "PASS");
  expect_verdict(r, "L4.transport", "SKIP");
  expect_verdict(r, "L5.collectives", "SKIP");
  CHECK(r.output.find("highest level fully passed: L0") != std::string::npos);
}
