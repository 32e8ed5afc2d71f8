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

TEST_CASE("the host provider passes L0-L3 and L5 with two devices, with a JUnit report") {
  const std::string junit = std::string(WIA_TEST_BINARY_DIR) + "/conformance-host.xml";
  const Run r = run("--provider " + host_provider() + " --param devices=2 --junit " + junit);
  INFO(r.output);
  CHECK(r.rc == 0);
  // L4 does not apply to a device provider; L5 runs through the core.
  CHECK(r.output.find("highest level fully passed: L5") != std::string::npos);
  for (const char* id :
       {"L0.symbol", "L1.memcpy.d2h_pattern", "L2.stream.order", "L2.reduce.float16",
        "L3.peer.memcpy", "L3.ipc.roundtrip", "L5.coll.all_reduce.sum_f32",
        "L5.coll.all_reduce.max_i32", "L5.coll.broadcast", "L5.coll.reduce", "L5.coll.all_gather",
        "L5.coll.reduce_scatter", "L5.coll.all_to_all"})
    expect_verdict(r, id, "PASS");
  CHECK(r.verdict.count("L5.transport.collectives") == 0);
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

TEST_CASE("L5 through the core catches a provider whose copies do not copy") {
  const Run r = run("--provider " + faulty("testdev_nocopy") + " --filter 'L5.coll.*'");
  CHECK(r.rc == 1);
  expect_verdict(r, "L5.coll.broadcast", "FAIL", "expected: broadcast(int32) of");
  expect_verdict(r, "L5.coll.all_reduce.sum_f32", "FAIL", "rank 0 element");
}

TEST_CASE("L5 is SKIP, with the core's reason, when the core cannot build a communicator") {
  const Run r = run("--provider " + faulty("acme") + " --param devices=2 --filter 'L5.*'");
  CHECK(r.rc == 0);
  expect_verdict(r, "L5.coll.all_to_all", "SKIP");
  CHECK(r.output.find("cannot run host functions") != std::string::npos);
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
  CHECK(r.output.find("L4") == std::string::npos);  // no transport: no L4 lines
  CHECK(r.output.find("L5.coll.all_to_all") != std::string::npos);
  r = run("--provider " + host_provider() + " --filter 'L1.memcpy.*'");
  CHECK(r.rc == 0);
  CHECK(r.verdict.size() == 5);
  for (const auto& [id, v] : r.verdict) CHECK(id.rfind("L1.memcpy.", 0) == 0);
}

TEST_CASE("a transport without endpoints skips L4; L5 over a transport is listed, never passed") {
  Run r = run("--provider " + faulty("testdev_transport") + " --list");
  CHECK(r.rc == 0);
  CHECK(r.output.find("L4.send_recv.tag_order") != std::string::npos);
  CHECK(r.output.find("L5.transport.collectives") != std::string::npos);
  r = run("--provider " + faulty("testdev_transport") + " --filter 'L[04]*'");
  CHECK(r.rc == 0);
  expect_verdict(r, "L0.required_entries", "PASS");
  expect_verdict(r, "L4.endpoint.props", "SKIP");
  expect_verdict(r, "L4.send_recv.basic", "SKIP");
  CHECK(r.output.find("highest level fully passed: L0") != std::string::npos);
  // No endpoint here: the core cannot build links over it, which is not a
  // conformance failure.
  r = run("--provider " + faulty("testdev_transport") + " --filter 'L5.transport.*'");
  expect_verdict(r, "L5.transport.collectives", "SKIP");
  CHECK(r.output.find("the core cannot build links over this transport") != std::string::npos);
}

// --- transports ----------------------------------------------------------------

const char* const kL4Ids[] = {"L4.endpoint.props",
                              "L4.connect.cookie",
                              "L4.connect.abandon",
                              "L4.send_recv.basic",
                              "L4.send_recv.sizes",
                              "L4.send_recv.tag_order",
                              "L4.send_recv.many_outstanding",
                              "L4.send_recv.truncate",
                              "L4.mr.register",
                              "L4.rma.put_get",
                              "L4.inline.order",
                              "L4.inline.truncate",
                              "L4.wait_fd.wakes",
                              "L4.close.pending",
                              "L4.close.delivers",
                              "L4.peer.exit",
                              "L4.peer.killed"};

TEST_CASE("the reference transport passes every L4 test, and L5 through the core") {
  const std::string junit = std::string(WIA_TEST_BINARY_DIR) + "/conformance-testnet.xml";
  const Run r = run("--provider " + faulty("testnet_ok") + " --junit " + junit);
  CHECK(r.rc == 0);
  for (const char* id : kL4Ids) expect_verdict(r, id, "PASS");
  // Collectives of three processes whose links the core built over it.
  expect_verdict(r, "L5.transport.collectives", "PASS");
  // Device levels do not apply to a transport-only provider.
  CHECK(r.output.find("highest level fully passed: L5") != std::string::npos);
  std::ifstream f(junit);
  std::stringstream xml;
  xml << f.rdbuf();
  CHECK(xml.str().find("<testsuite name=\"L4\" tests=\"17\" failures=\"0\"") != std::string::npos);
}

TEST_CASE("a transport that often answers \"retry\" passes, its peer never stalled by its reports") {
  // A connection's first send is taken only at its 3001st post. The pair's peer process
  // reports its steps through a pipe its parent reads only after the body:
  // a step written per post would fill it and block the peer, and the test
  // would time out instead of passing. Halved deadlines: under the
  // sanitizers and load the slowest (many_outstanding, every retry testing
  // its 300 receives) took 1.6 of its 14 s.
  const Run r = run("--provider " + faulty("testnet_busy") +
                    " --filter 'L4.send_recv.*' --timeout-scale 0.5");
  CHECK(r.rc == 0);
  for (const char* id : {"L4.send_recv.basic", "L4.send_recv.sizes", "L4.send_recv.tag_order",
                         "L4.send_recv.many_outstanding", "L4.send_recv.truncate"})
    expect_verdict(r, id, "PASS");
}

TEST_CASE("a transport that drops payloads fails every data check, not the others") {
  const Run r = run("--provider " + faulty("testnet_nodata") + " --filter 'L4.*'");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  for (const char* id : {"L4.send_recv.basic", "L4.send_recv.sizes", "L4.send_recv.tag_order",
                         "L4.send_recv.many_outstanding", "L4.connect.cookie"})
    expect_verdict(r, id, "FAIL");
  expect_verdict(r, "L4.send_recv.basic", "FAIL", "the sender's bytes");
  for (const char* id : {"L4.endpoint.props", "L4.rma.put_get", "L4.peer.exit"})
    expect_verdict(r, id, "PASS");
  // Collectives through the core over it go wrong too (or fail to finish).
  const Run l5 = run("--provider " + faulty("testnet_nodata") + " --filter 'L5.*'");
  expect_verdict(l5, "L5.transport.collectives", "FAIL");
}

TEST_CASE("a transport that reorders messages of one tag fails the ordering tests") {
  const Run r = run("--provider " + faulty("testnet_reorder") + " --filter 'L4.send_recv.*'");
  CHECK(r.rc == 1);
  expect_verdict(r, "L4.send_recv.tag_order", "FAIL", "to get message #0 of that tag");
  expect_verdict(r, "L4.send_recv.many_outstanding", "FAIL", "receive #0 of 300");
  expect_verdict(r, "L4.send_recv.basic", "PASS");
  expect_verdict(r, "L4.send_recv.sizes", "PASS");  // one message per tag
}

TEST_CASE("a transport that corrupts the tail of large messages fails L4.send_recv.sizes") {
  const Run r = run("--provider " + faulty("testnet_tail") + " --filter 'L4.send_recv.*'");
  CHECK(r.rc == 1);
  expect_verdict(r, "L4.send_recv.sizes", "FAIL", "wrong bytes");
  expect_verdict(r, "L4.send_recv.basic", "PASS");
  expect_verdict(r, "L4.send_recv.tag_order", "PASS");
}

TEST_CASE("a transport whose wait_fds never asks for incoming data fails L4.wait_fd.wakes") {
  // 30 s scaled to 6 s: the receiver sleeps through the messages until then.
  const Run r = run("--provider " + faulty("testnet_deaf") +
                    " --filter 'L4.wait_fd.*' --timeout-scale 0.2");
  CHECK(r.rc == 1);
  expect_verdict(r, "L4.wait_fd.wakes", "FAIL", "no descriptor of wait_fds became ready");
}

TEST_CASE("a transport whose test() hangs times out, with both processes killed") {
  // 20 s scaled to 4 s.
  const Run r = run("--provider " + faulty("testnet_hang") +
                    " --filter 'L4.send_recv.basic' --timeout-scale 0.2");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  expect_verdict(r, "L4.send_recv.basic", "FAIL", "timed out after 4000 ms");
}

TEST_CASE("a transport that ignores the receive size fails L4.send_recv.truncate") {
  const Run r = run("--provider " + faulty("testnet_overflow") + " --filter 'L4.send_recv.*'");
  CHECK(r.rc == 1);
  expect_verdict(r, "L4.send_recv.truncate", "FAIL", "WIA_ERROR_REMOTE");
  expect_verdict(r, "L4.send_recv.basic", "PASS");
  expect_verdict(r, "L4.send_recv.sizes", "PASS");
}

TEST_CASE("a transport that keeps requests pending after the peer died fails the peer tests") {
  // 20 s scaled to 5 s: the pending requests are reported before that.
  const Run r =
      run("--provider " + faulty("testnet_nodeath") + " --filter 'L4.[pc]*' --timeout-scale 0.25");
  CHECK(r.rc == 1);
  CHECK(finished(r));
  expect_verdict(r, "L4.peer.exit", "FAIL", "still pending");
  expect_verdict(r, "L4.peer.killed", "FAIL", "still pending");
  expect_verdict(r, "L4.close.pending", "FAIL", "still pending");
  expect_verdict(r, "L4.connect.cookie", "PASS");
}
