// SPDX-License-Identifier: Apache-2.0
// wia_torch._C: the creator torch.distributed calls for backend "wia", and
// the compressed all-reduce behind wia_torch.hooks.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "process_group_wia.hpp"

namespace py = pybind11;


PYBIND11_MODULE(_C, m) {
  m.doc() = "libwia's torch.distributed backend (docs/torch.md)";
  // ProcessGroup, Work and Store must be registered before we return them.
  py::module::import("torch.distributed");

  m.def("shutdown_all", &wia_torch::ProcessGroupWia::shutdown_all,
        "Shuts every live wia process group down (wia_torch registers it with atexit).");

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
        wia_compression_config_t config{};
        wia_torch::check(wia_compression_config_from_string(method.c_str(), &config),
                         "wia_compression_config_from_string", pg->getRank());
        config.error_feedback = error_feedback;
        py::gil_scoped_release release;
        return wia->allreduce_compressed(tensor, config, average);
      },
      py::arg("group"), py::arg("tensor"), py::arg("method"), py::arg("average") = false,
      py::arg("error_feedback") = true,
      "libwia's compressed all-reduce of tensor in place; returns a Work whose future "
      "yields [tensor].");
}
