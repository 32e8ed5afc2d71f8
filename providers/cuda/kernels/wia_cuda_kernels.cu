// SPDX-License-Identifier: Apache-2.0
// Every kernel of the cuda provider in one translation unit: nvcc writes
// one fatbin (or one PTX file) per unit, and the provider embeds exactly
// one image, loaded with one cuModuleLoadData per device.
#include "reduce.cu"
#include "scale.cu"
