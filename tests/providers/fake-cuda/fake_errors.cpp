// SPDX-License-Identifier: Apache-2.0
// cuGetErrorName and cuGetErrorString: every CUresult the provider's header
// names, plus those the double itself returns. An unknown value gets what
// the real driver gives: CUDA_ERROR_INVALID_VALUE and a NULL text, so a
// provider that prints the text unchecked crashes here, not in the field.
#include "fake_cuda.hpp"

namespace {

struct ErrorText {
  wia_CUresult code;
  const char* name;
  const char* text;
};

const ErrorText kErrors[] = {
    {WIA_CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {WIA_CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {WIA_CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {WIA_CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {WIA_CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {WIA_CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {WIA_CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {WIA_CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {WIA_CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {WIA_CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {WIA_CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {WIA_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {WIA_CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {WIA_CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {WIA_CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {WIA_CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {WIA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {wia::fake_cuda::kErrorPeerAccessNotEnabled, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
     "peer access has not been enabled"},
    {WIA_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {wia::fake_cuda::kErrorHostMemoryNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {WIA_CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {wia::fake_cuda::kErrorNotPermitted, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {WIA_CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {WIA_CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* find_error(wia_CUresult code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

}  // namespace

wia_CUresult fake_cuGetErrorName(wia_CUresult error, const char** name) {
  if (name == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *name = e != nullptr ? e->name : nullptr;
  return e != nullptr ? WIA_CUDA_SUCCESS : WIA_CUDA_ERROR_INVALID_VALUE;
}

wia_CUresult fake_cuGetErrorString(wia_CUresult error, const char** text) {
  if (text == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *text = e != nullptr ? e->text : nullptr;
  return e != nullptr ? WIA_CUDA_SUCCESS : WIA_CUDA_ERROR_INVALID_VALUE;
}
