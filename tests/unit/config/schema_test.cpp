// SPDX-License-Identifier: Apache-2.0
// The schema table's own consistency and the value rules behind it.
#include "config/schema.hpp"

#include <doctest/doctest.h>

#include <set>

namespace wia::cfg {
namespace {

TEST_CASE("schema: every core row is well formed and its default is valid") {
  std::set<std::string> keys, env_names;
  for (const auto& row : core_schema()) {
    std::string key(row.key);
    CAPTURE(key);
    CHECK(keys.insert(key).second);
    CHECK(env_names.insert(env_var_name(key)).second);
    CHECK(key.find('.') != std::string::npos);  // every core key lives in a section
    CHECK_FALSE(row.description.empty());
    CHECK((row.type == ValueType::kEnum) == !row.allowed.empty());
    CHECK(row.min_value <= row.max_value);
    Spec spec = Spec::from(row);
    Value value;
    std::string why;
    CHECK_MESSAGE(parse_value(spec, spec.default_value, &value, &why), why);
    CHECK(value.text == row.default_value);  // defaults are written canonically
  }
  CHECK(keys == std::set<std::string>{"log.level", "log.file", "providers.search_path",
                                      "providers.enable", "providers.disable",
                                      "bootstrap.timeout_ms", "bootstrap.port", "bootstrap.ifname", "collectives.timeout_ms", "collectives.heartbeat_ms", "collectives.heartbeat_timeout_ms", "collectives.post_progress_us", "collectives.post_progress_max_bytes", "collectives.one_shot_max_bytes", "collectives.node_window_chunk_bytes", "collectives.node_window_max_bytes",
             "collectives.node_window_one_shot_peer_bytes", "collectives.node_window_zero_copy_min_bytes", "collectives.engine", "collectives.algorithm", "selector.transport", "tuner.link_file", "compression.pipeline_segment_bytes", "compression.across_hosts", "compression.link_codec", "compression.link_codec_min_bytes", "flight_recorder.entries", "flight_recorder.dir", "profiling.sample_every"});
}

TEST_CASE("schema: integers") {
  std::int64_t v = 0;
  CHECK((parse_int("42", &v) && v == 42));
  CHECK((parse_int("+7", &v) && v == 7));
  CHECK((parse_int(" -3 ", &v) && v == -3));
  CHECK((parse_int("9223372036854775807", &v) && v == INT64_MAX));
  for (const char* bad :
       {"", " ", "+", "-", "+-1", "0x10", "1e3", "1.0", "12abc", "4K", "9223372036854775808"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_int(bad, &v));
  }
}

TEST_CASE("schema: sizes use binary suffixes") {
  std::int64_t v = 0;
  for (auto [text, bytes] : {std::pair<const char*, std::int64_t>{"0", 0},
                             {"4096", 4096},
                             {"64K", 64 << 10},
                             {"64k", 64 << 10},
                             {"4M", 4 << 20},
                             {"1G", 1 << 30},
                             {"2T", std::int64_t{2} << 40},
                             {"1KiB", 1024},
                             {"1kb", 1024},
                             {"512B", 512},
                             {" 8M ", 8 << 20},
                             {"8388607T", std::int64_t{8388607} << 40}}) {
    CAPTURE(text);
    CHECK((parse_size(text, &v) && v == bytes));
  }
  for (const char* bad : {"", "K", "-1", "+1", "1.5M", "4X", "4 K", "4Ki", "4iB", "4MBB",
                          "8388608T", "9223372036854775808", "18446744073709551616"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_size(bad, &v));
  }
  CHECK(format_size(0) == "0");
  CHECK(format_size(1000) == "1000");
  CHECK(format_size(4096) == "4K");
  CHECK(format_size(3 << 20) == "3M");
  CHECK(format_size(std::int64_t{5} << 40) == "5T");
  CHECK(format_size(INT64_MAX) == "9223372036854775807");
}

TEST_CASE("schema: booleans") {
  bool b = false;
  for (const char* yes : {"true", "True", "YES", "1", " yes "}) CHECK((parse_bool(yes, &b) && b));
  for (const char* no : {"false", "FALSE", "no", "0"}) CHECK((parse_bool(no, &b) && !b));
  for (const char* bad : {"", "y", "n", "on", "off", "2", "truee"})
    CHECK_FALSE(parse_bool(bad, &b));
}

TEST_CASE("schema: lists split on commas and colons and drop empty items") {
  Spec spec;
  spec.type = ValueType::kList;
  Value value;
  std::string why;
  REQUIRE(parse_value(spec, " host , tcp:shm,,:", &value, &why));
  CHECK(value.items == std::vector<std::string>{"host", "tcp", "shm"});
  CHECK(value.text == "host,tcp,shm");
  REQUIRE(parse_value(spec, "", &value, &why));
  CHECK(value.items.empty());
  CHECK(value.text.empty());
}

TEST_CASE("schema: range messages name the bound that applies") {
  Spec spec;
  spec.key = "k";
  spec.type = ValueType::kInt;
  Value value;
  std::string why;
  spec.min_value = 1;
  CHECK_FALSE(parse_value(spec, "0", &value, &why));
  CHECK(why == "out of range: must be at least 1");
  spec.min_value = kNoMin;
  spec.max_value = 9;
  CHECK_FALSE(parse_value(spec, "10", &value, &why));
  CHECK(why == "out of range: must be at most 9");
  spec.min_value = 4096;
  spec.max_value = std::int64_t{1} << 30;
  spec.type = ValueType::kSize;
  CHECK_FALSE(parse_value(spec, "1K", &value, &why));
  CHECK(why == "out of range: must be between 4K and 1G");
}

TEST_CASE("schema: environment variable names") {
  CHECK(env_var_name("log.level") == "WIA_LOG_LEVEL");
  CHECK(env_var_name("host.devices") == "WIA_HOST_DEVICES");
  CHECK(env_var_name("providers.search_path") == "WIA_PROVIDERS_SEARCH_PATH");
  CHECK(env_var_name("tcp.socket.n-threads") == "WIA_TCP_SOCKET_N_THREADS");
}

TEST_CASE("schema: edit distance counts adjacent transpositions as one edit") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("log.level", "log.level") == 0);
  CHECK(edit_distance("log.levle", "log.level") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("ca", "abc") == 3);  // restricted: no edit of a transposed pair
}

TEST_CASE("schema: closest_match suggests only plausible typos") {
  const std::vector<std::string> keys = {"log.level", "log.file", "providers.enable"};
  CHECK(closest_match("log.levle", keys) == "log.level");
  CHECK(closest_match("log.lvl", keys) == "log.level");
  CHECK(closest_match("log.fil", keys) == "log.file");
  CHECK(closest_match("providers.enabled", keys) == "providers.enable");
  CHECK(closest_match("log.colour", keys).empty());
  CHECK(closest_match("x", keys).empty());
  CHECK(closest_match("log.level", keys).empty());  // an exact match is not a suggestion
  CHECK(closest_match("anything", {}).empty());
}

}  // namespace
}  // namespace wia::cfg
