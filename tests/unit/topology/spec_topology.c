/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.2 (topology discovery) and the analysis half of 6.2.1 written as
 * the chapter writes them, compiled as C11 against the public headers, run
 * on two host devices (WIA_HOST_DEVICES=2). Changes from the text: status
 * checks, and wia_free_topology at the end. */
#include <stdio.h>

#include <wia/topology.h>
#include <wia/wia.h>

int main(void) {
  /* --- spec 6.2 --- */
  wia_topology_t topology;
  wia_discover_topology(&topology);

  printf("Discovered %d devices in topology\n", topology.num_devices);
  printf("Interconnect type: %s\n", topology.interconnect_name);

  for (int i = 0; i < topology.num_devices; i++) {
      for (int j = 0; j < topology.num_devices; j++) {
          if (i == j) continue;

          printf("Device %d -> Device %d:\n", i, j);
          printf("  Bandwidth: %.2f GB/s\n", topology.bandwidth_gbps[i][j]);
          printf("  Latency: %.2f μs\n", topology.latency_us[i][j]);
          printf("  Hops: %d\n", topology.hop_count[i][j]);
          printf("  Link type: %s\n", topology.link_type[i][j]);
          printf("  P2P capable: %s\n", topology.p2p_capable[i][j] ? "Yes" : "No");
      }
  }

  /* --- spec 6.2.1 (analysis) --- */
  // Example topology analysis
  wia_topology_analysis_t analysis;
  wia_analyze_topology(&topology, &analysis);

  printf("Topology Summary:\n");
  printf("  Type: %s\n", analysis.topology_type);  // "single_node", "multi_node"
  printf("  Diameter: %d hops\n", analysis.diameter);
  printf("  Bisection bandwidth: %.2f GB/s\n", analysis.bisection_bandwidth);
  printf("  Recommended parallelism strategy: %s\n",
         analysis.recommended_strategy);  // "data_parallel", "pipeline_parallel"

  /* --- checks --- */
  int failed = 0;
  if (topology.num_devices != 2) {
    fprintf(stderr, "expected 2 devices, got %d (%s)\n", topology.num_devices,
            wia_get_last_error());
    failed = 1;
  } else if (topology.hop_count[0][1] < 1 || topology.bandwidth_gbps[0][1] <= 0.0 ||
             analysis.diameter < 1 || analysis.bisection_bandwidth <= 0.0) {
    fprintf(stderr, "implausible topology or analysis\n");
    failed = 1;
  }
  if (wia_free_topology(&topology) != WIA_SUCCESS || topology.num_devices != 0) failed = 1;
  wia_finalize();
  return failed;
}
