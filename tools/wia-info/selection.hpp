// SPDX-License-Identifier: Apache-2.0
// wia-info's transport-selection and topology-comparison views.
#pragma once

#include <string>

namespace wia_info {

struct SelectionOptions {
  const char* topology_file = nullptr;  // nullptr = discover
  const char* rules_file = nullptr;     // nullptr = the runtime's configuration (WIA_CONFIG)
  bool summary = false;                 // counts per class/transport, not every link
  bool assume_all = false;              // every transport loaded (planning another machine)
};

// --explain: for every link, the transport, the rule, and why each earlier
// preference was passed over. Returns the exit status (2 when the rules
// were rejected and the defaults were used, or a link has no transport).
int explain(const SelectionOptions& o);
// --lint: findings; 0 none, 1 warnings, 2 errors (malformed rules, links
// without a transport).
int lint(const SelectionOptions& o);
// --topology-diff FILE: declared FILE against the detected topology (or
// --topology-file). 0 same, 1 different, 2 error.
int topology_diff(const char* declared_file, const char* detected_file, double tolerance);

// --place MODEL.yaml: parts of a model file on the topology's devices.
// strategy: "bandwidth" (default), "latency", "sequential".
int place(const char* model_file, const char* topology_file, const char* strategy,
          bool cross_node_first);

}  // namespace wia_info
