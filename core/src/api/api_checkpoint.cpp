// SPDX-License-Identifier: Apache-2.0
// Checkpoints (spec 6.9): the C entry points. They validate, turn the
// config's communicator into a checkpoint::Group and post the staging
// copies on the save stream; checkpoint/ does the files.
#include <fmt/format.h>
#include <wia/wia.h>

#include <cstring>
#include <limits>
#include <type_traits>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "checkpoint/checkpoint.hpp"
#include "comm/process_communicator.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/objects.hpp"

struct wia_checkpoint_s {
  std::unique_ptr<wia::checkpoint::Checkpoint> impl;
};

namespace wia::api {
namespace {

using checkpoint::Checkpoint;
using checkpoint::Kind;
using checkpoint::MetaValue;

HandleSet<wia_checkpoint_s>& checkpoints() {
  static auto* set = new HandleSet<wia_checkpoint_s>();
  return *set;
}

Checkpoint& live_checkpoint(const wia_checkpoint_t* c) {
  require_non_null(c, "ckpt");
  auto* h = const_cast<wia_checkpoint_t*>(c);
  if (!checkpoints().contains(h))
    throw Error(WIA_ERROR_INVALID_HANDLE,
                fmt::format("checkpoint {} is not live (freed, or never created)",
                            static_cast<const void*>(c)));
  return *h->impl;
}

wia_checkpoint_t* publish_checkpoint(std::unique_ptr<Checkpoint> impl) {
  auto h = std::make_unique<wia_checkpoint_s>();
  h->impl = std::move(impl);
  checkpoints().add(h.get());
  return h.release();
}

std::string checked_name(const char* name, const char* what) {
  require_non_null(name, what);
  const std::size_t n = strnlen(name, WIA_CHECKPOINT_NAME_MAX + 1);
  if (n == 0 || n > WIA_CHECKPOINT_NAME_MAX)
    throw Error(
        WIA_ERROR_INVALID_ARGUMENT,
        fmt::format("{} '{:.40}{}' is {} bytes (allowed: 1 to {})", what, name, n > 40 ? "..." : "",
                    n > WIA_CHECKPOINT_NAME_MAX ? "more than 255" : "0", WIA_CHECKPOINT_NAME_MAX));
  return std::string(name, n);
}

wia_datatype_t checked_dtype(const wia_datatype_t& d) {
  return checked_enum(d, WIA_DATATYPE_COUNT, "datatype");
}

// The ranks of config->comm: a process communicator's, else this process alone.
checkpoint::Group group_of(wia_communicator_t comm, wia_stream_t stream) {
  checkpoint::Group g;
  if (comm == nullptr) return g;
  auto* p = dynamic_cast<comm::ProcessCommunicator*>(&api::live(comm));
  if (p == nullptr) return g;  // a device communicator is one process
  g.rank = p->rank();
  g.nranks = p->size();
  g.agree_max = [comm, stream](std::uint64_t v) {
    std::int64_t x = static_cast<std::int64_t>(v);
    wia_collective_config_t cfg{};
    cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
    cfg.reduction_op = WIA_REDUCE_MAX;
    cfg.datatype = WIA_INT64;
    wia_status_t st = wia_all_reduce(comm, &x, &x, 1, &cfg, stream);
    if (st == WIA_SUCCESS) st = wia_stream_synchronize(stream);
    if (st != WIA_SUCCESS)
      throw Error(st, std::string("agreeing on the checkpoint number with the other ranks: ") +
                          wia_get_last_error());
    return static_cast<std::uint64_t>(x);
  };
  return g;
}

checkpoint::Settings settings_of(const wia_checkpoint_config_t* cfg, bool need_dir,
                                 wia_stream_t stream) {
  checkpoint::Settings s;
  if (cfg == nullptr) {
    if (need_dir) require_non_null(cfg, "config");
    return s;
  }
  if (need_dir) {
    require_non_null(cfg->checkpoint_dir, "config->checkpoint_dir");
    if (cfg->checkpoint_dir[0] == '\0')
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "config->checkpoint_dir is empty");
  }
  if (cfg->checkpoint_dir != nullptr) s.dir = cfg->checkpoint_dir;
  while (s.dir.size() > 1 && s.dir.back() == '/') s.dir.pop_back();
  s.async = cfg->async_checkpointing;
  s.compression = checked_enum(cfg->compression, 3, "config->compression");
  s.shard_mode = checked_enum(cfg->shard_mode, 2, "config->shard_mode");
  if (cfg->keep_last < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("config->keep_last is {} (0 keeps every checkpoint)", cfg->keep_last));
  s.keep_last = cfg->keep_last;
  const int max_level = s.compression == WIA_CKPT_COMPRESS_ZSTD ? 22 : 65537;
  if (cfg->compression_level < 0 || cfg->compression_level > max_level)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("config->compression_level {} is out of range [0, {}]",
                            cfg->compression_level, max_level));
  s.level = cfg->compression_level;
  if (cfg->timeout_ms != 0) s.timeout_ms = cfg->timeout_ms;
  s.group = group_of(cfg->comm, stream);
  return s;
}

void add_tensors(Checkpoint& c, Kind kind, const wia_tensor_ref_t* tensors, std::size_t n) {
  if (n > 0) require_non_null(tensors, "tensors");
  for (std::size_t i = 0; i < n; ++i) {
    const auto& t = tensors[i];
    c.add({kind, checked_name(t.name, "tensor name"), t.data, checked_dtype(t.datatype), t.count});
  }
}

wia_status_t save(wia_checkpoint_t* ckpt, const wia_checkpoint_config_t* config,
                  wia_stream_t stream, bool async) {
  Checkpoint& c = live_checkpoint(ckpt);
  const checkpoint::Settings s = settings_of(config, true, stream);
  if (c.save_pending())
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "a save of this checkpoint is still pending: wia_checkpoint_wait first");
  const std::uint64_t seq = Checkpoint::next_seq(s);  // collective over config->comm

  checkpoint::Staging staging;
  try {
    if (s.writes_shard()) {
      for (const auto& src : c.sources()) {
        const std::uint64_t bytes = src.bytes();
        auto buf = checkpoint::StagingBuffer::take(bytes);
        if (bytes > 0) {
          const wia_status_t st = wia_memcpy_async(buf.data(), src.data, bytes, stream);
          if (st != WIA_SUCCESS)
            throw Error(
                st, fmt::format("staging copy of {} tensor '{}': {}",
                                checkpoint::kind_name(src.kind), src.name, wia_get_last_error()));
        }
        staging.buffers.push_back(std::move(buf));
      }
    }
    // The call returns once the copies have run (as torch's async_save stages
    // before returning): the caller may then change the tensors at once.
    const wia_status_t st = wia_stream_synchronize(stream);
    if (st != WIA_SUCCESS)
      throw Error(st, std::string("staging copies on the save stream: ") + wia_get_last_error());
    c.start_save(s, seq, std::move(staging));
  } catch (const Error& e) {
    // The other ranks agreed on `seq` and are saving: tell them.
    Checkpoint::report_failed_save(s, seq, e.what());
    throw;
  }
  if (async) return WIA_SUCCESS;
  const wia_status_t done = c.wait();
  if (done != WIA_SUCCESS) throw Error(done, c.wait_message());
  return WIA_SUCCESS;
}

wia_checkpoint_t* load(const char* path, const wia_checkpoint_config_t* config) {
  const checkpoint::Settings s = settings_of(config, path == nullptr, nullptr);
  return publish_checkpoint(
      Checkpoint::load(path == nullptr ? std::string() : std::string(path), s));
}

// Checks every tensor first, then copies, so a mismatch writes nothing.
void restore(Kind kind, const wia_tensor_ref_t* tensors, std::size_t n, const Checkpoint& c) {
  if (n > 0) require_non_null(tensors, "tensors");
  if (!c.loaded())
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "this checkpoint was created, not loaded: restore from wia_load_*checkpoint");
  std::vector<const Checkpoint::Loaded*> found(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& t = tensors[i];
    const std::string name = checked_name(t.name, "tensor name");
    const wia_datatype_t dtype = checked_dtype(t.datatype);
    const auto* l = c.find(kind, name);
    if (l == nullptr)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("{} tensor '{}' is not in checkpoint {}", checkpoint::kind_name(kind),
                              name, c.path()));
    if (l->record.dtype != dtype || l->record.count != t.count)
      throw Error(
          WIA_ERROR_INVALID_ARGUMENT,
          fmt::format("{} tensor '{}': the buffer is {} x {}, checkpoint {} holds {} x {}",
                      checkpoint::kind_name(kind), name, t.count, kernels::dtype_name(dtype),
                      c.path(), l->record.count, kernels::dtype_name(l->record.dtype)));
    if (t.count > 0) require_non_null(t.data, "tensor data");
    found[i] = l;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i]->data.empty()) continue;
    const wia_status_t st =
        wia_memcpy(tensors[i].data, found[i]->data.data(), found[i]->data.size());
    if (st != WIA_SUCCESS)
      throw Error(st, fmt::format("restoring tensor '{}': {}", found[i]->record.name,
                                  wia_get_last_error()));
  }
}

const MetaValue& meta(const wia_checkpoint_t* ckpt, const char* name, void* out) {
  const Checkpoint& c = live_checkpoint(ckpt);
  const std::string key = checked_name(name, "metadata name");
  require_non_null(out, "value");
  const MetaValue* v = c.metadata(key);
  if (v == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("checkpoint {} has no metadata '{}'", c.path(), key));
  return *v;
}

const char* type_name(MetaValue::Type t) {
  switch (t) {
    case MetaValue::Type::kInt:
      return "an integer";
    case MetaValue::Type::kDouble:
      return "a double";
    case MetaValue::Type::kString:
      return "a string";
    default:
      return "bytes";
  }
}

const MetaValue& meta_of_type(const wia_checkpoint_t* ckpt, const char* name, void* out,
                              MetaValue::Type type) {
  const MetaValue& v = meta(ckpt, name, out);
  if (v.type != type)
    throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("metadata '{}' is {}, not {}", name,
                                                        type_name(v.type), type_name(type)));
  return v;
}

void set_meta(wia_checkpoint_t* ckpt, const char* name, const void* value, MetaValue v) {
  Checkpoint& c = live_checkpoint(ckpt);
  const std::string key = checked_name(name, "metadata name");
  require_non_null(value, "value");
  c.set_metadata(key, std::move(v));
}

// The typed forms: *value (or the string) as a MetaValue of `type`.
template <typename T>
void set_meta(wia_checkpoint_t* ckpt, const char* name, const T* value, MetaValue::Type type) {
  MetaValue v;
  v.type = type;
  if (value != nullptr) {
    if constexpr (std::is_same_v<T, char>)
      v.bytes = value;
    else if constexpr (std::is_floating_point_v<T>)
      v.d = *value;
    else
      v.i = *value;
  }
  set_meta(ckpt, name, static_cast<const void*>(value), std::move(v));
}

}  // namespace
}  // namespace wia::api

using namespace wia;
using wia::api::guard;
using wia::checkpoint::Kind;
using wia::checkpoint::MetaValue;

namespace wia::api {
void wait_for_pending_checkpoints() noexcept { checkpoint::wait_for_pending_saves(); }
}  // namespace wia::api

WIA_API wia_checkpoint_t* wia_create_checkpoint(void) {
  wia_checkpoint_t* c = nullptr;
  guard(__func__, [&] { c = api::publish_checkpoint(std::make_unique<checkpoint::Checkpoint>()); });
  return c;
}

WIA_API wia_status_t wia_free_checkpoint(wia_checkpoint_t* ckpt) {
  return guard(__func__, [&]() -> wia_status_t {
    if (ckpt == nullptr) return WIA_SUCCESS;
    checkpoint::Checkpoint& c = api::live_checkpoint(ckpt);
    const wia_status_t st = c.wait();
    const std::string why = c.wait_message();
    api::checkpoints().remove(ckpt);
    delete ckpt;
    if (st != WIA_SUCCESS) throw Error(st, why);
    return WIA_SUCCESS;
  });
}

WIA_API wia_status_t wia_checkpoint_add_model(wia_checkpoint_t* ckpt, const wia_model_t* model) {
  return guard(__func__, [&] {
    api::require_non_null(model, "model");
    api::add_tensors(api::live_checkpoint(ckpt), Kind::kModel, model->tensors, model->num_tensors);
  });
}

WIA_API wia_status_t wia_checkpoint_add_optimizer(wia_checkpoint_t* ckpt,
                                                  const wia_optimizer_t* optimizer) {
  return guard(__func__, [&] {
    api::require_non_null(optimizer, "optimizer");
    api::add_tensors(api::live_checkpoint(ckpt), Kind::kOptimizer, optimizer->tensors,
                     optimizer->num_tensors);
  });
}

WIA_API wia_status_t wia_checkpoint_add_tensor(wia_checkpoint_t* ckpt, const char* name,
                                               const void* data, size_t count,
                                               wia_datatype_t datatype) {
  return guard(__func__, [&] {
    api::live_checkpoint(ckpt).add({Kind::kTensor, api::checked_name(name, "tensor name"), data,
                                    api::checked_dtype(datatype), count});
  });
}

WIA_API wia_status_t wia_checkpoint_add_compression_residual(wia_checkpoint_t* ckpt,
                                                             wia_communicator_t comm,
                                                             const char* name, const void* buffer,
                                                             size_t count) {
  return guard(__func__, [&] {
    checkpoint::Checkpoint& c = api::live_checkpoint(ckpt);
    std::string key = api::checked_name(name, "residual name");
    std::vector<float> values(count);
    const wia_status_t st = wia_compression_get_residual(comm, buffer, values.data(), count);
    if (st != WIA_SUCCESS)
      throw Error(st, fmt::format("residual '{}': {}", key, wia_get_last_error()));
    c.add_copy(Kind::kResidual, std::move(key), std::move(values));
  });
}

WIA_API wia_status_t wia_restore_compression_residual(const wia_checkpoint_t* ckpt,
                                                      wia_communicator_t comm, const char* name,
                                                      const void* buffer, size_t count) {
  return guard(__func__, [&] {
    std::vector<float> values(count);
    const wia_tensor_ref_t t{name, values.data(), count, WIA_FLOAT32};
    api::restore(Kind::kResidual, &t, 1, api::live_checkpoint(ckpt));
    const wia_status_t st = wia_compression_set_residual(comm, buffer, values.data(), count);
    if (st != WIA_SUCCESS)
      throw Error(st, fmt::format("residual '{}': {}", name, wia_get_last_error()));
  });
}

WIA_API wia_status_t wia_checkpoint_add_metadata_int(wia_checkpoint_t* ckpt, const char* name,
                                                     const int* value) {
  return guard(__func__, [&] { api::set_meta(ckpt, name, value, MetaValue::Type::kInt); });
}

WIA_API wia_status_t wia_checkpoint_add_metadata_int64(wia_checkpoint_t* ckpt, const char* name,
                                                       const int64_t* value) {
  return guard(__func__, [&] { api::set_meta(ckpt, name, value, MetaValue::Type::kInt); });
}

WIA_API wia_status_t wia_checkpoint_add_metadata_double(wia_checkpoint_t* ckpt, const char* name,
                                                        const double* value) {
  return guard(__func__, [&] { api::set_meta(ckpt, name, value, MetaValue::Type::kDouble); });
}

WIA_API wia_status_t wia_checkpoint_add_metadata_string(wia_checkpoint_t* ckpt, const char* name,
                                                        const char* value) {
  return guard(__func__, [&] { api::set_meta(ckpt, name, value, MetaValue::Type::kString); });
}

WIA_API wia_status_t wia_checkpoint_add_metadata_bytes(wia_checkpoint_t* ckpt, const char* name,
                                                       const void* data, size_t size) {
  return guard(__func__, [&] {
    MetaValue v;
    v.type = MetaValue::Type::kBytes;
    if (size > 0) {
      api::require_non_null(data, "data");
      v.bytes.assign(static_cast<const char*>(data), size);
    }
    api::set_meta(ckpt, name, size > 0 ? data : "", v);
  });
}

WIA_API wia_status_t wia_save_checkpoint(wia_checkpoint_t* ckpt,
                                         const wia_checkpoint_config_t* config) {
  return guard(__func__, [&] { return api::save(ckpt, config, nullptr, false); });
}

WIA_API wia_status_t wia_save_checkpoint_async(wia_checkpoint_t* ckpt,
                                               const wia_checkpoint_config_t* config,
                                               wia_stream_t save_stream) {
  return guard(__func__, [&] {
    const bool async = config == nullptr || config->async_checkpointing;
    return api::save(ckpt, config, save_stream, async);
  });
}

WIA_API wia_status_t wia_checkpoint_wait(wia_checkpoint_t* ckpt) {
  return guard(__func__, [&]() -> wia_status_t {
    checkpoint::Checkpoint& c = api::live_checkpoint(ckpt);
    const wia_status_t st = c.wait();
    if (st != WIA_SUCCESS) throw Error(st, c.wait_message());
    return WIA_SUCCESS;
  });
}

WIA_API const char* wia_checkpoint_path(const wia_checkpoint_t* ckpt) {
  const char* p = "";
  guard(__func__, [&] { p = api::live_checkpoint(ckpt).path().c_str(); });
  return p;
}

WIA_API wia_status_t wia_load_checkpoint_ex(const char* path, const wia_checkpoint_config_t* config,
                                            wia_checkpoint_t** ckpt) {
  if (ckpt != nullptr) *ckpt = nullptr;
  return guard(__func__, [&] {
    api::require_non_null(ckpt, "ckpt");
    if (path == nullptr) api::require_non_null(config, "config (path is NULL: the latest)");
    *ckpt = api::load(path, config);
  });
}

WIA_API wia_checkpoint_t* wia_load_latest_checkpoint(const wia_checkpoint_config_t* config) {
  wia_checkpoint_t* c = nullptr;
  guard(__func__, [&] {
    api::require_non_null(config, "config");
    c = api::load(nullptr, config);
  });
  return c;
}

WIA_API wia_checkpoint_t* wia_load_checkpoint(const char* path) {
  wia_checkpoint_t* c = nullptr;
  guard(__func__, [&] {
    api::require_non_null(path, "path");
    c = api::load(path, nullptr);
  });
  return c;
}

WIA_API wia_status_t wia_restore_model(const wia_model_t* model, const wia_checkpoint_t* ckpt) {
  return guard(__func__, [&] {
    api::require_non_null(model, "model");
    api::restore(Kind::kModel, model->tensors, model->num_tensors, api::live_checkpoint(ckpt));
  });
}

WIA_API wia_status_t wia_restore_optimizer(const wia_optimizer_t* optimizer,
                                           const wia_checkpoint_t* ckpt) {
  return guard(__func__, [&] {
    api::require_non_null(optimizer, "optimizer");
    api::restore(Kind::kOptimizer, optimizer->tensors, optimizer->num_tensors,
                 api::live_checkpoint(ckpt));
  });
}

WIA_API wia_status_t wia_restore_tensor(const wia_checkpoint_t* ckpt, const char* name, void* data,
                                        size_t count, wia_datatype_t datatype) {
  return guard(__func__, [&] {
    const wia_tensor_ref_t t{name, data, count, datatype};
    api::restore(Kind::kTensor, &t, 1, api::live_checkpoint(ckpt));
  });
}

WIA_API wia_status_t wia_get_checkpoint_metadata_int64(const wia_checkpoint_t* ckpt,
                                                       const char* name, int64_t* value) {
  return guard(__func__,
               [&] { *value = api::meta_of_type(ckpt, name, value, MetaValue::Type::kInt).i; });
}

WIA_API wia_status_t wia_get_checkpoint_metadata_int(const wia_checkpoint_t* ckpt, const char* name,
                                                     int* value) {
  return guard(__func__, [&] {
    const std::int64_t v = api::meta_of_type(ckpt, name, value, MetaValue::Type::kInt).i;
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      throw Error(
          WIA_ERROR_INVALID_ARGUMENT,
          fmt::format("metadata '{}' is {}, which does not fit an int: read it as int64", name, v));
    *value = static_cast<int>(v);
  });
}

WIA_API wia_status_t wia_get_checkpoint_metadata_double(const wia_checkpoint_t* ckpt,
                                                        const char* name, double* value) {
  return guard(__func__,
               [&] { *value = api::meta_of_type(ckpt, name, value, MetaValue::Type::kDouble).d; });
}

WIA_API wia_status_t wia_get_checkpoint_metadata_string(const wia_checkpoint_t* ckpt,
                                                        const char* name, const char** value) {
  return guard(__func__, [&] {
    *value = api::meta_of_type(ckpt, name, value, MetaValue::Type::kString).bytes.c_str();
  });
}

WIA_API wia_status_t wia_get_checkpoint_metadata_bytes(const wia_checkpoint_t* ckpt,
                                                       const char* name, const void** data,
                                                       size_t* size) {
  return guard(__func__, [&] {
    api::require_non_null(size, "size");
    const MetaValue& v = api::meta_of_type(ckpt, name, data, MetaValue::Type::kBytes);
    *data = v.bytes.data();
    *size = v.bytes.size();
  });
}
