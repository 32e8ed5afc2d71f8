// SPDX-License-Identifier: Apache-2.0
// The provider loader. Loading never aborts the process: every candidate
// file ends in a recorded state, and only a provider the operator demanded
// (providers.enable) that did not load is an error. Everything else is
// logged at debug or info, because a warning about a harmless absent
// driver is what users of other runtimes mistake for the cause of an
// unrelated failure.
#include "provider/registry.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "config/schema.hpp"
#include "provider/abi.hpp"
#include "provider/host_services.hpp"

// Given to core sources by core/CMakeLists.txt; the defaults keep a test
// build that compiles this file on its own working.
#ifndef WIA_PROVIDER_SUBDIR
#define WIA_PROVIDER_SUBDIR "wia/providers"
#endif
// Where libraries live relative to the install prefix when the core is
// linked into a program under <prefix>/bin. The build tree mirrors it.
#ifndef WIA_INSTALL_LIBDIR
#define WIA_INSTALL_LIBDIR "lib"
#endif

namespace wia {

namespace fs = std::filesystem;

const char* provider_state_name(ProviderState state) {
  switch (state) {
    case ProviderState::loaded:
      return "loaded";
    case ProviderState::absent:
      return "absent";
    case ProviderState::disabled:
      return "disabled";
    case ProviderState::refused:
      return "refused";
  }
  return "unknown";
}

namespace {

constexpr std::string_view kTag = "loader";
constexpr std::string_view kFilePrefix = "libwia-provider-";
constexpr std::string_view kFileSuffix = ".so";

struct DlCloser {
  void operator()(void* handle) const noexcept {
    if (handle != nullptr && dlclose(handle) != 0) {
      const char* why = dlerror();
      log::debug(kTag, "dlclose failed: {}", why != nullptr ? why : "unknown error");
    }
  }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

std::string dl_error() {
  const char* why = dlerror();
  return why != nullptr ? why : "unknown dynamic loader error";
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

// "libwia-provider-NAME.so" -> "NAME"; nullopt for any other file name.
std::optional<std::string> name_from_file(const std::string& file_name) {
  if (file_name.size() < kFilePrefix.size() + kFileSuffix.size() ||
      !file_name.starts_with(kFilePrefix) || !file_name.ends_with(kFileSuffix))
    return std::nullopt;
  return file_name.substr(kFilePrefix.size(),
                          file_name.size() - kFilePrefix.size() - kFileSuffix.size());
}

// The address dladdr() resolves to find the file the core was loaded from.
void core_anchor() {}

// The shared object (libwia.so) or program the core lives in.
std::optional<fs::path> core_file() {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<const void*>(&core_anchor), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) == 0)
    return std::nullopt;
  std::error_code ec;
  fs::path file;
  // The main program's link map has an empty name, and dladdr() then
  // reports argv[0], which may be relative or a bare command name.
  if (map == nullptr || map->l_name == nullptr || map->l_name[0] == '\0')
    file = fs::read_symlink("/proc/self/exe", ec);
  else
    file = map->l_name;
  if (ec || file.empty()) return std::nullopt;
  fs::path canonical = fs::canonical(file, ec);
  return ec ? file : canonical;
}

// <dir>/wia/providers next to libwia.so; <dir>/../lib/wia/providers when
// the core is linked statically into a tool in <prefix>/bin, so installed
// tools and the build tree (which mirrors the install tree) find the same
// providers as libwia.so does.
std::optional<fs::path> default_provider_dir() {
  const std::optional<fs::path> file = core_file();
  if (!file) return std::nullopt;
  const fs::path dir = file->parent_path();
  if (dir.filename() == "bin") {
    const fs::path libdir = WIA_INSTALL_LIBDIR;
    const fs::path base = libdir.is_absolute() ? libdir : dir.parent_path() / libdir;
    return (base / WIA_PROVIDER_SUBDIR).lexically_normal();
  }
  return (dir / WIA_PROVIDER_SUBDIR).lexically_normal();
}

// Identity of a file or directory for de-duplication: the same directory
// reached twice (WIA_PROVIDER_PATH naming the default directory, a symlink)
// is searched once rather than reporting every provider in it as a
// duplicate of itself.
std::string identity(const fs::path& path) {
  std::error_code ec;
  fs::path canonical = fs::canonical(path, ec);
  if (!ec) return canonical.string();
  // Not there (yet): compare spellings, without a trailing separator.
  fs::path normal = path.lexically_normal();
  if (!normal.has_filename() && normal.has_relative_path()) normal = normal.parent_path();
  return normal.string();
}

// One loaded provider: the shared object, its adapted descriptor and the
// host services handed to it. Not copyable or movable: the provider holds
// pointers to host_ and host_context_.
class LoadedProvider final : public Provider {
 public:
  LoadedProvider(std::string path, DlHandle handle, provider_abi::Descriptor descriptor,
                 const Config* config)
      : handle_(std::move(handle)), path_(std::move(path)), descriptor_(std::move(descriptor)) {
    host_context_.name = descriptor_.name;
    host_context_.config = config;
    host_ = provider_host::make_host_services(&host_context_);
  }
  LoadedProvider(const LoadedProvider&) = delete;
  LoadedProvider& operator=(const LoadedProvider&) = delete;

  ~LoadedProvider() override {
    // fini() before dlclose() (handle_ is destroyed after this body), and
    // host services stay valid until fini() returns.
    if (!initialised_) return;
    clear_provider_error();
    wia_status_t status = WIA_ERROR_INTERNAL;
    try {
      status = descriptor_.fini(ctx_);
    } catch (...) {
      // Cannot happen through a C function pointer; a destructor must not
      // throw anyway.
    }
    std::string detail = provider_host::take_error();
    if (status < 0)
      log::warn(kTag, "provider {}: fini failed: {}: {}", name(), status_name(status),
                detail.empty() ? status_description(status) : detail);
  }

  // Calls the provider's init(). Returns the final state and, unless
  // loaded, the reason.
  std::pair<ProviderState, std::string> init() {
    clear_provider_error();
    wia_status_t status = WIA_ERROR_INTERNAL;
    try {
      status = descriptor_.init(&host_, &ctx_);
    } catch (const std::exception& e) {
      provider_host::take_error();
      return {ProviderState::refused,
              fmt::format("init threw a C++ exception across the C ABI: {}", e.what())};
    } catch (...) {
      provider_host::take_error();
      return {ProviderState::refused, "init threw a C++ exception across the C ABI"};
    }
    std::string detail = provider_host::take_error();
    if (status == WIA_SUCCESS) {
      initialised_ = true;
      return {ProviderState::loaded, {}};
    }
    if (status == WIA_ERROR_UNAVAILABLE)
      return {ProviderState::absent,
              detail.empty() ? "init reported WIA_ERROR_UNAVAILABLE without a message" : detail};
    if (status > 0) {
      // init is synchronous by contract; whatever it started must be torn
      // down before the library is unloaded.
      descriptor_.fini(ctx_);
      provider_host::take_error();
      return {ProviderState::refused,
              fmt::format("init returned {} ({}); init must complete before returning",
                          status_name(status), status)};
    }
    return {ProviderState::refused,
            fmt::format("init failed: {}: {}", status_name(status),
                        detail.empty() ? status_description(status) : detail)};
  }

  const std::string& name() const override { return descriptor_.name; }
  const std::string& path() const override { return path_; }
  void* ctx() const override { return ctx_; }
  const wia_device_ops_v1_t* device() const override {
    return descriptor_.device ? &*descriptor_.device : nullptr;
  }
  const wia_transport_ops_v1_t* transport() const override {
    return descriptor_.transport ? &*descriptor_.transport : nullptr;
  }

 private:
  DlHandle handle_;  // first member: destroyed last
  std::string path_;
  provider_abi::Descriptor descriptor_;
  provider_host::HostContext host_context_;
  wia_host_services_v1_t host_{};
  void* ctx_ = nullptr;
  bool initialised_ = false;
};

class Registry final : public ProviderRegistry {
 public:
  ~Registry() override {
    // Reverse load order: a provider loaded later may rely on one loaded
    // earlier (e.g. a transport using a device provider's memory).
    while (!loaded_.empty()) loaded_.pop_back();
  }
  const std::vector<std::string>& search_path() const override { return search_path_; }
  const std::vector<ProviderRecord>& records() const override { return records_; }
  const std::vector<std::unique_ptr<Provider>>& loaded() const override { return loaded_; }
  const Provider* find(const std::string& name) const override {
    for (const auto& provider : loaded_)
      if (provider->name() == name) return provider.get();
    return nullptr;
  }

  std::vector<std::string> search_path_;
  std::vector<ProviderRecord> records_;
  std::vector<std::unique_ptr<Provider>> loaded_;
};

// The symbol a provider exports, found and sized.
struct FoundSymbol {
  const provider_abi::AbiVersion* abi = nullptr;
  provider_abi::SymbolInfo info;
};

// One run of the loader: walks the search path and fills a Registry.
class Loader {
 public:
  Loader(Config& config, const EnvLookup& env, Registry& registry)
      : config_(config), env_(env), registry_(registry) {
    enable_ = config_.get_list("providers.enable");
    disable_ = config_.get_list("providers.disable");
  }

  void run() {
    for (const SearchEntry& entry : search_entries()) search(entry);
    check_unused_sections();
    log_summary();
    require_enabled();
  }

 private:
  struct SearchEntry {
    fs::path path;
    std::string origin;   // "WIA_PROVIDER_PATH", "providers.search_path (file:1:2)", ...
    bool explicit_entry;  // named by the operator, not the built-in default
  };

  std::vector<SearchEntry> search_entries() {
    std::vector<SearchEntry> entries;
    if (const char* env_path = env_ ? env_("WIA_PROVIDER_PATH") : nullptr) {
      std::string_view rest = env_path;
      while (!rest.empty()) {
        const std::size_t colon = rest.find(':');
        const std::string_view item = rest.substr(0, colon);
        if (!item.empty()) entries.push_back({fs::path(item), "WIA_PROVIDER_PATH", true});
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    }
    const std::string yaml_origin =
        fmt::format("providers.search_path ({})", config_.get("providers.search_path").source);
    for (const std::string& item : config_.get_list("providers.search_path"))
      entries.push_back({fs::path(item), yaml_origin, true});
    if (std::optional<fs::path> dir = default_provider_dir())
      entries.push_back({*dir, "next to libwia", false});
    else
      log::debug(kTag, "cannot locate the libwia binary; no default provider directory");

    std::set<std::string> seen;
    std::vector<SearchEntry> unique;
    for (SearchEntry& entry : entries) {
      if (!seen.insert(identity(entry.path)).second) {
        log::debug(kTag, "search path: {} ({}) already searched", entry.path.string(),
                   entry.origin);
        continue;
      }
      registry_.search_path_.push_back(entry.path.string());
      unique.push_back(std::move(entry));
    }
    return unique;
  }

  void search(const SearchEntry& entry) {
    std::error_code ec;
    const fs::file_status status = fs::status(entry.path, ec);
    if (ec || !fs::exists(status)) {
      // An operator's typo deserves a line at info; a build without any
      // installed provider directory is normal.
      log::at(entry.explicit_entry ? log::Level::info : log::Level::debug, kTag,
              "search path: {} ({}) does not exist", entry.path.string(), entry.origin);
      return;
    }
    if (fs::is_regular_file(status)) {
      log::debug(kTag, "search path: file {} ({})", entry.path.string(), entry.origin);
      consider_once(entry.path);
      return;
    }
    if (!fs::is_directory(status)) {
      log::info(kTag, "search path: {} ({}) is neither a directory nor a file", entry.path.string(),
                entry.origin);
      return;
    }
    std::vector<fs::path> files;
    for (fs::directory_iterator it(entry.path, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string file_name = it->path().filename().string();
      if (!name_from_file(file_name)) continue;
      std::error_code type_ec;
      if (it->is_regular_file(type_ec)) files.push_back(it->path());
    }
    if (ec) {
      log::info(kTag, "search path: cannot list {} ({}): {}", entry.path.string(), entry.origin,
                ec.message());
      return;
    }
    // Directory order is arbitrary; sorting makes load order, and with it
    // device numbering, the same on every node.
    std::sort(files.begin(), files.end());
    log::debug(kTag, "search path: {} ({}): {} candidate(s)", entry.path.string(), entry.origin,
               files.size());
    for (const fs::path& file : files) consider_once(file);
  }

  void consider_once(const fs::path& file) {
    if (!seen_files_.insert(identity(file)).second) {
      log::debug(kTag, "{} was already considered under another path", file.string());
      return;
    }
    ProviderRecord record;
    std::error_code ec;
    const fs::path absolute = fs::absolute(file, ec);
    record.path = (ec ? file : absolute).lexically_normal().string();
    try {
      consider(file, record);
    } catch (const std::exception& e) {
      // A bug of the loader must not take the other providers down with it.
      finish(std::move(record), ProviderState::refused,
             fmt::format("internal error while loading: {}", e.what()), log::Level::error);
    }
  }

  // Why `name` must not load (providers.enable/disable), or nullopt.
  std::optional<std::string> exclusion(const std::string& name) const {
    if (std::find(disable_.begin(), disable_.end(), name) != disable_.end())
      return fmt::format("listed in providers.disable ({})",
                         config_.get("providers.disable").source);
    if (!enable_.empty() && std::find(enable_.begin(), enable_.end(), name) == enable_.end())
      return fmt::format("not listed in providers.enable ({})",
                         config_.get("providers.enable").source);
    return std::nullopt;
  }

  // Claims `name` for `path`; returns the earlier path if already claimed.
  std::optional<std::string> claim(const std::string& name, const std::string& path) {
    auto [it, inserted] = claimed_.emplace(name, path);
    if (inserted) return std::nullopt;
    return it->second;
  }

  void consider(const fs::path& file, ProviderRecord& record) {
    const std::optional<std::string> file_name_provider = name_from_file(file.filename().string());
    record.name = file_name_provider.value_or(file.stem().string());

    // Decide on the file name alone when possible: a disabled or shadowed
    // provider is never dlopen()ed, so its constructors never run. That is
    // what lets an operator switch off a provider that crashes on load.
    if (file_name_provider) {
      if (!provider_abi::valid_provider_name(*file_name_provider))
        return finish(std::move(record), ProviderState::refused,
                      fmt::format("file name does not give a valid provider name "
                                  "(libwia-provider-NAME.so, NAME = [a-z0-9_]+)"),
                      log::Level::info);
      if (std::optional<std::string> why = exclusion(record.name))
        return finish(std::move(record), ProviderState::disabled, *why, log::Level::debug);
      // First of a name wins even if it then fails: like PATH, an earlier
      // copy shadows later ones, and a broken one is reported rather than
      // silently replaced by another version.
      if (std::optional<std::string> first = claim(record.name, record.path))
        return finish(std::move(record), ProviderState::refused,
                      fmt::format("duplicate of {}", *first), log::Level::debug);
    }

    dlerror();
    // RTLD_NODELETE: a provider's code stays mapped after finalize. Threads
    // or thread-local storage a provider leaves behind (drivers do) must
    // never point into unmapped code, and leak checkers walk TLS at exit.
    DlHandle handle(dlopen(record.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE));
    if (!handle) {
      // dlerror() starts with the file's own path, which the record shows
      // already; a dependency's name (missing library) stays.
      std::string why = dl_error();
      if (why.starts_with(record.path + ": ")) why.erase(0, record.path.size() + 2);
      return finish(std::move(record), ProviderState::refused, why, log::Level::info);
    }

    FoundSymbol symbol;
    std::string why = probe(handle.get(), &symbol);
    if (!why.empty())
      return finish(std::move(record), ProviderState::refused, why, log::Level::info);

    provider_abi::Descriptor descriptor;
    why = symbol.abi->adapt(symbol.info, &descriptor);
    record.abi_version = descriptor.abi_version;
    record.version = descriptor.version;
    record.caps = descriptor.caps;
    if (!descriptor.name.empty() && !file_name_provider) record.name = descriptor.name;
    if (!why.empty())
      return finish(std::move(record), ProviderState::refused, why, log::Level::info);

    if (file_name_provider && descriptor.name != *file_name_provider)
      return finish(std::move(record), ProviderState::refused,
                    fmt::format("descriptor name '{}' does not match the file name (expected '{}')",
                                descriptor.name, *file_name_provider),
                    log::Level::info);
    if (!file_name_provider) {
      // A file named directly on the search path: its name is known only
      // now, so apply the same rules as above.
      if (std::optional<std::string> exclusion_reason = exclusion(record.name))
        return finish(std::move(record), ProviderState::disabled, *exclusion_reason,
                      log::Level::debug);
      if (std::optional<std::string> first = claim(record.name, record.path))
        return finish(std::move(record), ProviderState::refused,
                      fmt::format("duplicate of {}", *first), log::Level::debug);
    }

    // The provider's YAML section and WIA_<NAME>_* variables are checked
    // before init(), so a provider only ever reads valid values. A mistake
    // there (WIA_ERROR_CONFIG) is the operator's to fix: say so at error
    // level. Anything else is a bad declaration, a defect of the provider.
    try {
      config_.declare_provider(descriptor.name, descriptor.params);
    } catch (const Error& e) {
      return finish(std::move(record), ProviderState::refused, e.what(),
                    e.status() == WIA_ERROR_CONFIG ? log::Level::error : log::Level::info);
    }

    auto provider = std::make_unique<LoadedProvider>(record.path, std::move(handle),
                                                     std::move(descriptor), &config_);
    auto [state, reason] = provider->init();
    if (state != ProviderState::loaded)
      // Absent is the normal answer of a driver-less machine: debug only.
      return finish(std::move(record), state, std::move(reason),
                    state == ProviderState::absent ? log::Level::debug : log::Level::info);
    log::info(kTag, "provider {} {} loaded from {} (ABI v{}{}{})", record.name,
              record.version.empty() ? "(no version)" : record.version, record.path,
              record.abi_version, provider->device() ? ", device" : "",
              provider->transport() ? ", transport" : "");
    registry_.loaded_.push_back(std::move(provider));
    finish(std::move(record), ProviderState::loaded, {}, log::Level::off);
  }

  // Finds the newest descriptor symbol the library exports. Returns the
  // refusal reason or "".
  static std::string probe(void* handle, FoundSymbol* found) {
    std::vector<std::string> tried;
    void* address = nullptr;
    for (const provider_abi::AbiVersion& abi : provider_abi::abi_versions()) {
      dlerror();
      address = dlsym(handle, abi.symbol);
      if (address != nullptr) {
        found->abi = &abi;
        break;
      }
      tried.push_back(abi.symbol);
    }
    if (found->abi == nullptr)
      return fmt::format("no {} symbol (not a libwia provider?)", join(tried, " or "));

    // dlsym() also searches the library's dependencies; a descriptor that
    // resolves into another object is not this file's.
    link_map* own_map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &own_map) != 0) own_map = nullptr;
    Dl_info info{};
    link_map* symbol_map = nullptr;
    if (dladdr1(address, &info, reinterpret_cast<void**>(&symbol_map), RTLD_DL_LINKMAP) != 0 &&
        own_map != nullptr && symbol_map != nullptr && symbol_map != own_map)
      return fmt::format("{} resolves into {}, not into this file", found->abi->symbol,
                         symbol_map->l_name);

    ElfW(Sym)* elf_symbol = nullptr;
    if (dladdr1(address, &info, reinterpret_cast<void**>(&elf_symbol), RTLD_DL_SYMENT) != 0 &&
        elf_symbol != nullptr) {
      if (ELF64_ST_TYPE(elf_symbol->st_info) == STT_FUNC)
        return fmt::format("{} is a function; it must be the provider descriptor object",
                           found->abi->symbol);
      found->info.size = elf_symbol->st_size;
    }
    found->info.address = address;
    return {};
  }

  void finish(ProviderRecord&& record, ProviderState state, std::string reason, log::Level level) {
    record.state = state;
    record.reason = std::move(reason);
    if (state != ProviderState::loaded)
      log::at(level, kTag, "provider {} ({}) {}: {}", record.name, record.path,
              provider_state_name(state), record.reason);
    registry_.records_.push_back(std::move(record));
  }

  const ProviderRecord* record_named(const std::string& name) const {
    const ProviderRecord* best = nullptr;
    for (const ProviderRecord& record : registry_.records_) {
      if (record.name != name) continue;
      if (record.state == ProviderState::loaded) return &record;
      // Prefer the copy that claimed the name over its shadowed duplicates.
      if (best == nullptr) best = &record;
    }
    return best;
  }

  // A section for a provider that did not declare itself (absent from the
  // search path, or refused before its declaration) is not an error: the
  // same file serves machines with and without that hardware.
  void check_unused_sections() const {
    if (!log::enabled(log::Level::debug)) return;
    std::vector<std::string> names;
    for (const ProviderRecord& record : registry_.records_) names.push_back(record.name);
    for (const auto& [section, source] : config_.undeclared_sections()) {
      if (const ProviderRecord* record = record_named(section)) {
        log::debug(kTag, "configuration section '{}' ({}) is unused: provider {} is {}: {}",
                   section, source, section, provider_state_name(record->state), record->reason);
        continue;
      }
      const std::string guess = cfg::closest_match(section, names);
      log::debug(kTag, "configuration section '{}' ({}) matches no provider found{}", section,
                 source, guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess));
    }
  }

  void log_summary() const {
    if (!log::enabled(log::Level::info)) return;
    std::map<ProviderState, std::vector<std::string>> by_state;
    for (const ProviderRecord& record : registry_.records_)
      by_state[record.state].push_back(record.name);
    std::vector<std::string> parts;
    for (const auto& [state, names] : by_state)
      parts.push_back(fmt::format("{} {}", provider_state_name(state), join(names, ", ")));
    const bool all_loaded = by_state.size() == 1 && by_state.count(ProviderState::loaded) == 1;
    log::info(kTag, "providers: {}{}",
              parts.empty() ? std::string("none found") : join(parts, "; "),
              parts.empty() || all_loaded ? "" : " (`wia-info` shows why)");
  }

  void require_enabled() {
    std::vector<std::string> missing;
    for (const std::string& name : enable_) {
      const ProviderRecord* record = record_named(name);
      if (record != nullptr && record->state == ProviderState::loaded) continue;
      if (record != nullptr) {
        missing.push_back(fmt::format("{} ({}: {}: {})", name, record->path,
                                      provider_state_name(record->state), record->reason));
        continue;
      }
      ProviderRecord not_found;
      not_found.name = name;
      not_found.reason = fmt::format("libwia-provider-{}.so not found in the search path", name);
      missing.push_back(fmt::format("{} ({})", name, not_found.reason));
      registry_.records_.push_back(std::move(not_found));
    }
    if (missing.empty()) return;
    const std::string message = fmt::format(
        "providers.enable ({}) requires provider(s) that did not load: {}; search "
        "path: {}",
        config_.get("providers.enable").source, join(missing, "; "),
        registry_.search_path_.empty() ? std::string("(empty)")
                                       : join(registry_.search_path_, ":"));
    log::error(kTag, "{}", message);
    throw Error(WIA_ERROR_UNAVAILABLE, message);
  }

  Config& config_;
  const EnvLookup& env_;
  Registry& registry_;
  std::vector<std::string> enable_;
  std::vector<std::string> disable_;
  std::set<std::string> seen_files_;
  std::map<std::string, std::string> claimed_;  // provider name -> path of first file
};

}  // namespace

std::unique_ptr<ProviderRegistry> ProviderRegistry::load(Config& config) {
  return load(config, process_env());
}

std::unique_ptr<ProviderRegistry> ProviderRegistry::load(Config& config, const EnvLookup& env) {
  auto registry = std::make_unique<Registry>();
  Loader(config, env, *registry).run();
  return registry;
}

}  // namespace wia
