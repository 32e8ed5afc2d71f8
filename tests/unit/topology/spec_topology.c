/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.2 (topology discovery), 6.2.1 (analysis and placement) and 6.2.2
 * (bandwidth benchmark) written as the chapter writes them, compiled as C11
 * against the public headers, run on two host devices (WIA_HOST_DEVICES=2).
 * Changes from the text: declarations of what the chapter leaves open
 * (`model`, `devices`, `num_devices`), status checks, and
 * wia_free_topology at the end. */
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

  /* --- spec 6.2.1 (placement) --- */
  /* The chapter leaves `model` open: here two pipeline stages that
   * exchange 64 MB per step, one per device. */
  double traffic[4] = {0.0, 64e6, 64e6, 0.0};
  int device_of_part[2] = {-1, -1};
  wia_model_t two_stages = {2, NULL, traffic, device_of_part, NULL, 0};
  wia_model_t* model = &two_stages;

  // Use topology info for placement
  wia_placement_config_t placement = {
      .strategy = WIA_PLACEMENT_BANDWIDTH_OPTIMAL,
      .topology = &topology,
      .minimize_cross_node_traffic = true
  };

  wia_place_model(model, &placement);

  /* --- spec 6.2.2 (bandwidth benchmark) --- */
  int num_devices = 0;
  wia_get_device_count(&num_devices);
  wia_device_t devices[2] = {0, 1};
  double first_uni = 0.0, first_small = 0.0, first_large = 0.0;

  // Benchmark inter-device bandwidth
  for (int i = 0; i < num_devices; i++) {
      for (int j = 0; j < num_devices; j++) {
          if (i == j) continue;

          wia_bandwidth_benchmark_t bench;
          wia_benchmark_bandwidth(devices[i], devices[j], &bench);

          printf("Bandwidth %d->%d:\n", i, j);
          printf("  Unidirectional: %.2f GB/s\n", bench.unidirectional_gbps);
          printf("  Bidirectional: %.2f GB/s\n", bench.bidirectional_gbps);
          printf("  Latency (4KB): %.2f μs\n", bench.latency_small);
          printf("  Latency (1MB): %.2f μs\n", bench.latency_large);
          if (i == 0) {
            first_uni = bench.unidirectional_gbps;
            first_small = bench.latency_small;
            first_large = bench.latency_large;
          }
      }
  }

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
  if (device_of_part[0] < 0 || device_of_part[1] < 0 || device_of_part[0] == device_of_part[1] ||
      placement.cross_node_bytes != 0.0) {
    fprintf(stderr, "placement: parts on devices %d and %d (%s)\n", device_of_part[0],
            device_of_part[1], wia_get_last_error());
    failed = 1;
  }
  if (num_devices != 2 || !(first_uni > 0.0) || !(first_small > 0.0) ||
      !(first_large > 0.0)) {
    fprintf(stderr, "benchmark: implausible figures (%s)\n", wia_get_last_error());
    failed = 1;
  }
  if (wia_free_topology(&topology) != WIA_SUCCESS || topology.num_devices != 0) failed = 1;
  wia_finalize();
  return failed;
}
