// SPDX-License-Identifier: Apache-2.0
// wia_torch._C: the creator torch.distributed calls for backend "wia", and
// the compressed all-reduce behind wia_torch.hooks.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "process_group_wia.hpp"

namespace py = pybind11;

namespace {

// "topk:0.01", "randomk:0.1", "int8", "int4", "onebit", "lowrank:4",
// "fp16", "bf16", "none": the spellings of wia-bench --compress.
wia_compression_config_t parse_method(const std::string& spec, bool error_feedback) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto number = [&](double fallback) {
    if (arg.empty()) return fallback;
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(arg, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used == arg.size(), "wia_torch: compression '", spec, "': '", arg,
                "' is not a number");
    return v;
  };
  wia_compression_config_t c{};
  c.error_feedback = error_feedback;
  if (name == "none") {
    c.method = WIA_COMPRESS_NONE;
  } else if (name == "topk") {
    c.method = WIA_COMPRESS_TOPK;
    c.parameters.topk.k_ratio = number(0.01);
    c.parameters.topk.use_magnitude = true;
  } else if (name == "randomk") {
    c.method = WIA_COMPRESS_RANDOMK;
    c.parameters.randomk.k_ratio = number(0.1);
    c.parameters.randomk.seed = 0x5eed;
  } else if (name == "int8" || name == "int4") {
    c.method = WIA_COMPRESS_QUANTIZE;
    c.parameters.quantize.num_bits = name == "int8" ? 8 : 4;
    c.parameters.quantize.use_dynamic_range = true;
  } else if (name == "onebit") {
    c.method = WIA_COMPRESS_ONEBIT;
    c.parameters.onebit.use_error_feedback = true;
  } else if (name == "lowrank") {
    c.method = WIA_COMPRESS_LOWRANK;
    c.parameters.lowrank.rank = static_cast<int>(number(4));
  } else if (name == "fp16") {
    c.method = WIA_COMPRESS_FP16;
  } else if (name == "bf16") {
    c.method = WIA_COMPRESS_BF16;
  } else {
    TORCH_CHECK(false, "wia_torch: unknown compression '", spec,
                "' (none, topk:R, randomk:R, int8, int4, onebit, lowrank:R, fp16, bf16)");
  }
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "libwia's torch.distributed backend (docs/torch.md)";
  // ProcessGroup, Work and Store must be registered before we return them.
  py::module::import("torch.distributed");

  m.def("create_process_group", &wia_torch::ProcessGroupWia::create, py::arg("store"),
        py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>(),
        "The creator torch.distributed.Backend.register_backend('wia', ...) is given.");

  m.def(
      "allreduce_compressed",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor tensor,
         const std::string& method, bool average, bool error_feedback) {
        auto* wia = dynamic_cast<wia_torch::ProcessGroupWia*>(pg.get());
        TORCH_CHECK(wia != nullptr, "wia_torch: allreduce_compressed needs a process group of "
                                    "backend 'wia', got '",
                    pg->getBackendName(), "'");
        const wia_compression_config_t config = parse_method(method, error_feedback);
        py::gil_scoped_release release;
        return wia->allreduce_compressed(tensor, config, average);
      },
      py::arg("group"), py::arg("tensor"), py::arg("method"), py::arg("average") = false,
      py::arg("error_feedback") = true,
      "libwia's compressed all-reduce of tensor in place; returns a Work whose future "
      "yields [tensor].");
}
