// SPDX-License-Identifier: Apache-2.0
// The core configuration keys. Adding a key is adding one row here: the
// loader, the WIA_* environment override, validation, `wia-info --config`
// and the default-file test all follow from the row. Remember to state the
// key in config/default.yaml and docs/config.md (the unit tests fail when
// default.yaml lacks a core key or disagrees with its default).
//
// A new top-level section (e.g. "collectives") needs no other change: a
// section is core as soon as one key of the table starts with its name.
#include "config/schema.hpp"

namespace wia::cfg {

namespace {

constexpr KeySpec kCoreSchema[] = {
    {.key = "log.level",
     .type = ValueType::kEnum,
     .default_value = "warn",
     .description = "Lowest severity written to the log",
     .allowed = "error|warn|info|debug|trace|off"},
    {.key = "log.file",
     .type = ValueType::kString,
     .default_value = "",
     .description = "File the log is appended to; empty means standard error"},
    {.key = "providers.search_path",
     .type = ValueType::kList,
     .default_value = "",
     .description = "Directories searched for libwia-provider-*.so before the one next to libwia"},
    {.key = "providers.enable",
     .type = ValueType::kList,
     .default_value = "",
     .description = "If non-empty, only these providers load, and each must load"},
    {.key = "providers.disable",
     .type = ValueType::kList,
     .default_value = "",
     .description = "Providers that are never loaded"},
    {.key = "bootstrap.timeout_ms",
     .type = ValueType::kInt,
     .default_value = "300000",
     .description = "Longest any bootstrap wait (rendezvous, all-gather, recv, get) lasts before "
                    "WIA_ERROR_TIMEOUT names the missing ranks",
     .min_value = 1,
     .max_value = 86400000},
    {.key = "bootstrap.port",
     .type = ValueType::kInt,
     .default_value = "0",
     .description = "torchrun-style launch: port of rank 0's bootstrap root; 0 = MASTER_PORT + 1",
     .min_value = 0,
     .max_value = 65535},
    {.key = "bootstrap.ifname",
     .type = ValueType::kString,
     .default_value = "",
     .description = "Interfaces a unique id may advertise (NCCL_SOCKET_IFNAME syntax: prefixes, "
                    "^ excludes, = exact); WIA_SOCKET_IFNAME overrides"},
    {.key = "collectives.timeout_ms",
     .type = ValueType::kInt,
     .default_value = "120000",
     .description = "Longest a rank waits inside one collective before it fails with a timeout",
     .min_value = 1,
     .max_value = 86400000},
    {.key = "collectives.heartbeat_ms",
     .type = ValueType::kInt,
     .default_value = "500",
     .description = "Process communicators: each rank sends a heartbeat to its two ring neighbours "
                    "this often, from a thread of its own; 0 = no heartbeats",
     .min_value = 0,
     .max_value = 3600000},
    {.key = "collectives.heartbeat_timeout_ms",
     .type = ValueType::kInt,
     .default_value = "1500",
     .description = "Process communicators: a neighbour silent this long has failed (at least 2 "
                    "heartbeat periods)",
     .min_value = 1,
     .max_value = 86400000},
    {.key = "collectives.post_progress_us",
     .type = ValueType::kInt,
     .default_value = "200",
     .description = "Process communicators: how long the posting thread itself drives a small "
                    "collective or send/receive posted on an idle stream before handing it to "
                    "the stream (0 = always hand it over; docs/processes.md)",
     .min_value = 0,
     .max_value = 1000000},
    {.key = "collectives.post_progress_max_bytes",
     .type = ValueType::kInt,
     .default_value = "262144",
     .description = "Process communicators: the largest collective (bytes of one rank's input) "
                    "or send/receive the posting thread starts itself",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "collectives.one_shot_max_bytes",
     .type = ValueType::kInt,
     .default_value = "8192",
     .description = "Process communicators: all-reduces of at most this many bytes (one rank's "
                    "input) among at most 8 ranks, whose algorithm the cost model would choose, "
                    "run the one-shot algorithm on the fast path that carries the descriptor "
                    "with the data (0 = never; docs/processes.md)",
     .min_value = 0,
     .max_value = 1048576},
    {.key = "collectives.node_window_chunk_bytes",
     .type = ValueType::kInt,
     .default_value = "524288",
     .description = "Process communicators whose ranks share one node: each rank maps every "
                    "rank's window of about 4x this many bytes and runs all-reduces through them "
                    "with loads and stores, this many bytes per step (0 = never; "
                    "docs/processes.md)",
     .min_value = 0,
     .max_value = 268435456},
    {.key = "collectives.node_window_max_bytes",
     .type = ValueType::kInt,
     .default_value = "1099511627776",
     .description = "Process communicators with node-shared windows: all-reduces of at most this "
                    "many bytes whose algorithm the cost model would choose run the direct "
                    "algorithm (one-shot with 2 ranks) through the windows",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "collectives.node_window_one_shot_peer_bytes",
     .type = ValueType::kInt,
     .default_value = "4194304",
     .description = "Process communicators with node-shared windows and 3 to 8 ranks: "
                    "all-reduces whose algorithm the cost model would choose run one-shot "
                    "instead of direct while each rank reads at most this many bytes of its "
                    "peers' inputs, (ranks - 1) x the vector (0 = direct always; "
                    "docs/processes.md)",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "collectives.node_window_zero_copy_min_bytes",
     .type = ValueType::kInt,
     .default_value = "16384",
     .description = "Process communicators with node-shared windows: an all-reduce input of at "
                    "least this many bytes in a libwia allocation of the communicator's device "
                    "is read by the peers in place (exported once, mapped by each peer once) "
                    "instead of copied into the rank's window; an in-place call's input in the "
                    "one-shot schedule is still copied (docs/processes.md)",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "collectives.engine",
     .type = ValueType::kEnum,
     .default_value = "auto",
     .description = "Who moves collective data: 'inline' (core threads, host-addressable memory "
                    "only), 'device' (provider copies and reductions on device streams), 'auto' "
                    "(inline when every device's memory is host-addressable)",
     .allowed = "auto|inline|device"},
    {.key = "collectives.algorithm",
     .type = ValueType::kList,
     .default_value = "",
     .description = "Algorithm rules 'collective:algorithm[:min-max bytes]', first match wins; "
                    "empty = cost model"},
    {.key = "selector.transport",
     .type = ValueType::kList,
     .default_value = "",
     .description = "Forced transport: 'tcp' for every inter-process link, or per link class "
                    "'same_node=shm,different_nodes=tcp'; overrides selector.rules"},
    {.key = "tuner.link_file",
     .type = ValueType::kString,
     .default_value = "",
     .description = "Measured links (wia-bw --output) that communicators' cost models and "
                    "wia_discover_topology use instead of the default figures; empty = defaults"},
    {.key = "compression.pipeline_segment_bytes",
     .type = ValueType::kInt,
     .default_value = "8388608",
     .description = "Compressed all-reduces of more input than this run in segments of this "
                    "many bytes, so that with a compression_stream the encode of one overlaps "
                    "the exchange of the ones before (0 = never split; docs/compression.md)",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "compression.across_hosts",
     .type = ValueType::kBool,
     .default_value = "true",
     .description = "Quantized and cast all-reduces without error feedback on process "
                    "communicators of several hosts with equally many ranks: dense inside each "
                    "host, compressed only between hosts (docs/compression.md)"},
    {.key = "compression.link_codec",
     .type = ValueType::kEnum,
     .default_value = "none",
     .description = "Plain float32 all-reduces on process communicators of several hosts: "
                    "'int8' or 'bf16' between hosts (lossy), 'auto' where the cost model says it "
                    "pays, 'none' (docs/compression.md, \"Compression between hosts\")",
     .allowed = "none|auto|int8|bf16"},
    {.key = "compression.link_codec_min_bytes",
     .type = ValueType::kInt,
     .default_value = "1048576",
     .description = "The smallest all-reduce (one rank's input) compression.link_codec applies to",
     .min_value = 0,
     .max_value = 1099511627776},
    {.key = "flight_recorder.entries",
     .type = ValueType::kInt,
     .default_value = "2000",
     .description = "Process communicators: operations each rank remembers for a dump on "
                    "failure (0 = off; docs/flight-recorder.md)",
     .min_value = 0,
     .max_value = 1000000},
    {.key = "flight_recorder.dir",
     .type = ValueType::kString,
     .default_value = "",
     .description = "Where each rank writes its flight recorder when a communicator fails "
                    "(wia-flight-comm<k>-rank<r>.yaml; wia-info --analyse reads them); "
                    "empty = no dump"},
    {.key = "profiling.sample_every",
     .type = ValueType::kInt,
     .default_value = "128",
     .description = "Communication profiling counts every operation but times the first 16 "
                    "of each kind in a window, then about one in this many (1 = every one; "
                    "docs/profiling.md, \"Sampling\")",
     .min_value = 1,
     .max_value = 1048576},
};

}  // namespace

std::span<const KeySpec> core_schema() { return kCoreSchema; }

namespace {

constexpr StructuredKeySpec kStructuredSchema[] = {
    {.key = "selector.rules",
     .description = "Transport selection rules, first match wins (docs/selector.md)"},
    {.key = "selector.groups",
     .description = "Named groups of nodes or devices that selector rules can match"},
};

}  // namespace

std::span<const StructuredKeySpec> structured_schema() { return kStructuredSchema; }

}  // namespace wia::cfg
