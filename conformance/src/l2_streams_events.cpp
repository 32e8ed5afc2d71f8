// SPDX-License-Identifier: Apache-2.0
// Level 2: streams, events, host functions and on-device reductions.
#include <time.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {
namespace {

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

// A host function that holds its stream until the test releases it, so the
// test can observe "work pending". Bounded so a lost release cannot hang.
// Gates (and everything else a host function touches) are function-local
// statics: each test runs in its own process, and the data must outlive
// the stream, which the harness destroys after the test body returns.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> ran{false};
  static void wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    g->ran = true;
    for (int i = 0; i < 60000 && !g->open.load(); ++i) sleep_ms(1);
  }
};

void sleep_fn(void* ms) { sleep_ms(static_cast<int>(reinterpret_cast<std::intptr_t>(ms))); }

void stream_query(Context& c) {
  const auto& o = c.dev_ops();
  auto s = c.stream();
  c.step("stream_query on a new stream");
  wia_status_t st = o.stream_query(c.ctx(), s);
  c.expect(st == WIA_SUCCESS, "stream_query of an idle stream == WIA_SUCCESS", status_text(st));
  if (c.has_cap(WIA_DEVICE_CAP_HOST_FUNC)) {
    static Gate gate;
    c.ok(o.launch_host_func(c.ctx(), s, Gate::wait, &gate), "launch_host_func");
    c.step("stream_query with a blocked host function pending");
    st = o.stream_query(c.ctx(), s);
    gate.open = true;
    c.expect(st == WIA_IN_PROGRESS, "stream_query == WIA_IN_PROGRESS while work is pending",
             status_text(st));
  }
  c.sync(s);
  c.step("stream_query after stream_synchronize");
  st = o.stream_query(c.ctx(), s);
  c.expect(st == WIA_SUCCESS, "stream_query == WIA_SUCCESS after stream_synchronize",
           status_text(st));
}

void stream_order(Context& c) {
  // 1000 (memset tmp, copy tmp -> slot i) pairs through one scratch
  // buffer: every slot holds its own value only if each pair ran in order
  // and before the next pair's memset.
  const auto& o = c.dev_ops();
  const int dev = c.device();
  constexpr int kPairs = 1000;
  constexpr std::uint64_t kSlot = 64;
  auto* tmp = static_cast<std::uint8_t*>(c.alloc(kSlot, dev));
  auto* out = static_cast<std::uint8_t*>(c.alloc(kPairs * kSlot, dev));
  auto* copy = static_cast<std::uint8_t*>(c.alloc(kPairs * kSlot, dev));
  c.ok(o.memset(c.ctx(), dev, out, 0, kPairs * kSlot), "memset(0)");
  auto s = c.stream(dev);
  c.step("enqueue 2000 dependent operations");
  for (int i = 0; i < kPairs; ++i) {
    c.ok(o.memset_async(c.ctx(), s, tmp, (i * 7 + 1) & 0xFF, kSlot), "memset_async");
    c.ok(o.memcpy_async(c.ctx(), s, out + i * kSlot, tmp, kSlot), "memcpy_async");
  }
  // And a final copy that must see all of the above.
  c.ok(o.memcpy_async(c.ctx(), s, copy, out, kPairs * kSlot), "memcpy_async(final)");
  c.sync(s);
  std::vector<std::uint8_t> h(kPairs * kSlot);
  c.to_host(h.data(), copy, h.size(), dev);
  for (int i = 0; i < kPairs; ++i) {
    const std::string bad =
        check_fill(h.data() + i * kSlot, kSlot, static_cast<std::uint8_t>((i * 7 + 1) & 0xFF));
    c.expect(bad.empty(),
             "slot " + std::to_string(i) + " to hold the value of pair " + std::to_string(i) +
                 " (work on one stream runs in enqueue order)",
             bad);
  }
}

void memcpy_async_directions(Context& c) {
  const auto& o = c.dev_ops();
  const int dev = c.device();
  const std::uint64_t size = 2 * (1ull << 20) + 5;
  std::vector<std::uint8_t> src(size), back(size, 0);
  fill_pattern(src.data(), size, 51);
  void* a = c.alloc(size, dev);
  void* b = c.alloc(size, dev);
  auto s = c.stream(dev);
  c.ok(o.memcpy_async(c.ctx(), s, a, src.data(), size), "memcpy_async(host -> device)");
  c.ok(o.memcpy_async(c.ctx(), s, b, a, size), "memcpy_async(device -> device)");
  c.ok(o.memcpy_async(c.ctx(), s, back.data(), b, size), "memcpy_async(device -> host)");
  c.sync(s);
  const std::string bad = check_pattern(back.data(), size, 51);
  c.expect(bad.empty(), "async h2d, d2d, d2h chain of " + size_text(size) + " intact", bad);
}

void event_query(Context& c) {
  const auto& o = c.dev_ops();
  auto e = c.event();
  c.step("event_query on a never-recorded event");
  wia_status_t st = o.event_query(c.ctx(), e);
  c.expect(st == WIA_SUCCESS, "event_query of a never-recorded event == WIA_SUCCESS",
           status_text(st));
  auto s = c.stream();
  static Gate gate;
  const bool gated = c.has_cap(WIA_DEVICE_CAP_HOST_FUNC);
  if (gated) c.ok(o.launch_host_func(c.ctx(), s, Gate::wait, &gate), "launch_host_func");
  c.ok(o.event_record(c.ctx(), e, s), "event_record");
  if (gated) {
    c.step("event_query with the captured work blocked");
    st = o.event_query(c.ctx(), e);
    gate.open = true;
    c.expect(st == WIA_IN_PROGRESS, "event_query == WIA_IN_PROGRESS before the work completes",
             status_text(st));
  }
  c.step("event_synchronize");
  c.ok(o.event_synchronize(c.ctx(), e), "event_synchronize");
  c.step("event_query after event_synchronize");
  st = o.event_query(c.ctx(), e);
  c.expect(st == WIA_SUCCESS, "event_query == WIA_SUCCESS after event_synchronize",
           status_text(st));
}

void event_wait(Context& c) {
  // Stream B must not copy before stream A's (slow) memset, although B is
  // only joined to A by stream_wait_event.
  const auto& o = c.dev_ops();
  const int dev = c.device();
  const std::uint64_t size = 1ull << 20;
  auto* buf = c.alloc(size, dev);
  auto* out = c.alloc(size, dev);
  c.step("memset(0x11)");
  c.ok(o.memset(c.ctx(), dev, buf, 0x11, size), "memset(0x11)");
  c.step("memset(0x22)");
  c.ok(o.memset(c.ctx(), dev, out, 0x22, size), "memset(0x22)");
  auto sa = c.stream(dev);
  auto sb = c.stream(dev);
  auto e = c.event(dev);
  if (c.has_cap(WIA_DEVICE_CAP_HOST_FUNC))
    c.ok(o.launch_host_func(c.ctx(), sa, sleep_fn, reinterpret_cast<void*>(std::intptr_t{50})),
         "launch_host_func(sleep 50 ms)");
  c.ok(o.memset_async(c.ctx(), sa, buf, 0x5A, size), "memset_async(0x5A) on stream A");
  c.ok(o.event_record(c.ctx(), e, sa), "event_record on stream A");
  c.ok(o.stream_wait_event(c.ctx(), sb, e), "stream_wait_event(stream B, event of A)");
  c.ok(o.memcpy_async(c.ctx(), sb, out, buf, size), "memcpy_async on stream B");
  c.sync(sb);
  std::vector<std::uint8_t> h(size);
  c.to_host(h.data(), out, size, dev);
  const std::string bad = check_fill(h.data(), size, 0x5A);
  c.expect(bad.empty(), "stream B's copy to see stream A's memset(0x5A) it waited for", bad);
  c.sync(sa);
}

void event_elapsed(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_EVENT_TIMING, "WIA_DEVICE_CAP_EVENT_TIMING");
  c.require_cap(WIA_DEVICE_CAP_HOST_FUNC, "WIA_DEVICE_CAP_HOST_FUNC (to make a known delay)");
  const auto& o = c.dev_ops();
  auto s = c.stream();
  auto e0 = c.event();
  auto e1 = c.event();
  constexpr int kSleep = 30;
  c.ok(o.event_record(c.ctx(), e0, s), "event_record(start)");
  c.ok(o.launch_host_func(c.ctx(), s, sleep_fn, reinterpret_cast<void*>(std::intptr_t{kSleep})),
       "launch_host_func(sleep)");
  c.ok(o.event_record(c.ctx(), e1, s), "event_record(end)");
  c.sync(s);
  float ms = -1;
  c.step("event_elapsed_ms");
  c.ok(o.event_elapsed_ms(c.ctx(), e0, e1, &ms), "event_elapsed_ms");
  // 0.5 ms of slack for clock granularity; the upper bound only catches
  // wrong units.
  c.expect(ms >= kSleep - 0.5f && ms < 60000.0f,
           "event_elapsed_ms >= the " + std::to_string(kSleep) + " ms host function between them",
           std::to_string(ms) + " ms");
}

struct OrderLog {
  std::mutex mu;
  std::vector<int> seen;
};
struct OrderItem {
  OrderLog* log;
  int index;
};
void order_fn(void* p) {
  auto* it = static_cast<OrderItem*>(p);
  std::lock_guard<std::mutex> lock(it->log->mu);
  it->log->seen.push_back(it->index);
}

void host_func_order(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_HOST_FUNC, "WIA_DEVICE_CAP_HOST_FUNC");
  const auto& o = c.dev_ops();
  const int dev = c.device();
  auto s = c.stream(dev);
  void* d = c.alloc(4096, dev);
  static OrderLog log;
  static std::vector<OrderItem> items(200);
  for (int i = 0; i < 200; ++i) {
    items[i] = {&log, i};
    c.ok(o.launch_host_func(c.ctx(), s, order_fn, &items[i]), "launch_host_func");
    if (i % 10 == 0) c.ok(o.memset_async(c.ctx(), s, d, i & 0xFF, 4096), "memset_async");
  }
  c.sync(s);
  std::lock_guard<std::mutex> lock(log.mu);
  c.expect(log.seen.size() == 200, "200 host functions run by stream_synchronize",
           std::to_string(log.seen.size()) + " ran");
  for (int i = 0; i < 200; ++i)
    c.expect(log.seen[i] == i, "host functions run in enqueue order",
             "position " + std::to_string(i) + " ran function " + std::to_string(log.seen[i]));
}

// ---- reductions ----------------------------------------------------------

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {  // round to nearest even
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mant = x & 0x7FFFFF;
  const int exp = static_cast<int>((x >> 23) & 0xFF);
  if (exp == 0xFF) return static_cast<std::uint16_t>(sign | 0x7C00u | (mant != 0 ? 0x200u : 0));
  const int e = exp - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = static_cast<std::uint32_t>(e) << 10 | mant >> 13;
  const std::uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40);
  return static_cast<std::uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

struct Dtype {
  wia_datatype_t dt;
  const char* name;
  std::size_t size;
  bool is_float;
  bool is_signed;
};
const Dtype kDtypes[] = {
    {WIA_INT8, "int8", 1, false, true},      {WIA_UINT8, "uint8", 1, false, false},
    {WIA_INT32, "int32", 4, false, true},    {WIA_UINT32, "uint32", 4, false, false},
    {WIA_INT64, "int64", 8, false, true},    {WIA_UINT64, "uint64", 8, false, false},
    {WIA_FLOAT16, "float16", 2, true, true}, {WIA_BFLOAT16, "bfloat16", 2, true, true},
    {WIA_FLOAT32, "float32", 4, true, true}, {WIA_FLOAT64, "float64", 8, true, true},
};
const char* const kOpNames[] = {"sum", "prod", "min", "max", "avg"};

std::uint64_t load_raw(const Dtype& t, const std::uint8_t* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, t.size);  // little endian
  return v;
}
void store_raw(const Dtype& t, std::uint8_t* p, std::uint64_t v) { std::memcpy(p, &v, t.size); }

long double load_float(const Dtype& t, const std::uint8_t* p) {
  switch (t.dt) {
    case WIA_FLOAT16:
      return half_to_float(static_cast<std::uint16_t>(load_raw(t, p)));
    case WIA_BFLOAT16:
      return bf16_to_float(static_cast<std::uint16_t>(load_raw(t, p)));
    case WIA_FLOAT32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}
void store_float(const Dtype& t, std::uint8_t* p, long double v) {
  switch (t.dt) {
    case WIA_FLOAT16:
      store_raw(t, p, float_to_half(static_cast<float>(v)));
      break;
    case WIA_BFLOAT16:
      store_raw(t, p, float_to_bf16(static_cast<float>(v)));
      break;
    case WIA_FLOAT32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    default: {
      const double d = static_cast<double>(v);
      std::memcpy(p, &d, 8);
    }
  }
}

std::int64_t sign_extend(std::uint64_t v, int bits) {
  if (bits == 64) return static_cast<std::int64_t>(v);
  const std::uint64_t m = 1ull << (bits - 1);
  return static_cast<std::int64_t>((v ^ m) - m);
}

// Reference for element i: ints exactly (wrapping modulo 2^bits); floats in
// the precision the ABI promises or better (float16/bfloat16 accumulate in
// float32; float32 in double; float64 in long double).
long double ref_float(const Dtype& t, wia_reduce_op_t op,
                      const std::vector<const std::uint8_t*>& srcs, std::size_t i,
                      std::uint64_t divisor) {
  const bool narrow = t.dt == WIA_FLOAT16 || t.dt == WIA_BFLOAT16;
  auto round = [&](long double v) {
    if (narrow) return static_cast<long double>(static_cast<float>(v));
    if (t.dt == WIA_FLOAT32) return static_cast<long double>(static_cast<double>(v));
    return v;
  };
  long double acc = load_float(t, srcs[0] + i * t.size);
  for (std::size_t s = 1; s < srcs.size(); ++s) {
    const long double v = load_float(t, srcs[s] + i * t.size);
    switch (op) {
      case WIA_REDUCE_SUM:
      case WIA_REDUCE_AVG:
        acc = round(acc + v);
        break;
      case WIA_REDUCE_PROD:
        acc = round(acc * v);
        break;
      case WIA_REDUCE_MIN:
        acc = std::isnan(acc) || std::isnan(v) ? NAN : std::min(acc, v);
        break;
      default:
        acc = std::isnan(acc) || std::isnan(v) ? NAN : std::max(acc, v);
        break;
    }
  }
  if (divisor > 1) acc = round(acc / static_cast<long double>(divisor));
  return acc;
}

std::uint64_t ref_int(const Dtype& t, wia_reduce_op_t op,
                      const std::vector<const std::uint8_t*>& srcs, std::size_t i,
                      std::uint64_t divisor) {
  const int bits = static_cast<int>(t.size * 8);
  const std::uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
  std::uint64_t acc = load_raw(t, srcs[0] + i * t.size);
  auto less = [&](std::uint64_t a, std::uint64_t b) {
    return t.is_signed ? sign_extend(a, bits) < sign_extend(b, bits) : a < b;
  };
  for (std::size_t s = 1; s < srcs.size(); ++s) {
    const std::uint64_t v = load_raw(t, srcs[s] + i * t.size);
    switch (op) {
      case WIA_REDUCE_SUM:
      case WIA_REDUCE_AVG:
        acc = (acc + v) & mask;
        break;
      case WIA_REDUCE_PROD:
        acc = (acc * v) & mask;
        break;
      case WIA_REDUCE_MIN:
        acc = less(v, acc) ? v : acc;
        break;
      default:
        acc = less(acc, v) ? v : acc;
        break;
    }
  }
  if (divisor > 1) {
    if (t.is_signed)
      acc =
          static_cast<std::uint64_t>(sign_extend(acc, bits) / static_cast<std::int64_t>(divisor)) &
          mask;
    else
      acc /= divisor;
  }
  return acc;
}

void reduce_dtype(Context& c, const Dtype& t) {
  c.require_cap(WIA_DEVICE_CAP_REDUCE, "WIA_DEVICE_CAP_REDUCE");
  const auto& o = c.dev_ops();
  const int dev = c.device();
  constexpr std::size_t kCount = 1031, kSrcs = 3;
  const std::size_t bytes = kCount * t.size;
  // Inputs: small values so float results are mostly exact, integers that
  // wrap (int8 sums and products), and a NaN in float inputs.
  std::vector<std::vector<std::uint8_t>> host(kSrcs, std::vector<std::uint8_t>(bytes));
  for (std::size_t s = 0; s < kSrcs; ++s) {
    for (std::size_t i = 0; i < kCount; ++i) {
      const std::uint8_t r = pattern_byte(i, static_cast<std::uint32_t>(s * 7 + t.dt));
      std::uint8_t* p = host[s].data() + i * t.size;
      if (t.is_float)
        store_float(t, p, i == 5 && s == 1 ? NAN : (static_cast<int>(r % 33) - 16) / 4.0L);
      else
        store_raw(t, p,
                  t.is_signed ? static_cast<std::uint64_t>(static_cast<std::int64_t>(r) - 100)
                              : r + (t.size > 1 ? (static_cast<std::uint64_t>(r) << 9) : 0));
    }
  }
  std::vector<void*> dsrc(kSrcs);
  for (std::size_t s = 0; s < kSrcs; ++s) {
    dsrc[s] = c.alloc(bytes, dev);
    c.to_device(dsrc[s], host[s].data(), bytes, dev);
  }
  void* dst = c.alloc(bytes, dev);
  auto stream = c.stream(dev);
  std::vector<const std::uint8_t*> hsrc;
  for (auto& h : host) hsrc.push_back(h.data());
  int supported = 0;
  std::vector<std::uint8_t> got(bytes);
  for (int op = 0; op < WIA_REDUCE_OP_COUNT; ++op) {
    // AVG with divisor 0 means "divide by nsrcs"; SUM also with an explicit
    // divisor; the in-place form (dst == srcs[0]) for PROD.
    struct Variant {
      std::uint64_t divisor;
      bool in_place;
    };
    std::vector<Variant> variants = {{0, false}};
    if (op == WIA_REDUCE_SUM) variants.push_back({2, false});
    if (op == WIA_REDUCE_PROD) variants.push_back({0, true});
    for (const Variant v : variants) {
      const std::string what = std::string(t.name) + " " + kOpNames[op] +
                               (v.divisor > 1 ? " divisor " + std::to_string(v.divisor) : "") +
                               (v.in_place ? " in place" : "");
      void* out = dst;
      if (v.in_place) {
        out = c.alloc(bytes, dev);
        c.to_device(out, host[0].data(), bytes, dev);
      }
      const void* ptrs[kSrcs] = {v.in_place ? out : dsrc[0], dsrc[1], dsrc[2]};
      wia_reduce_args_v1_t a{};
      a.struct_size = sizeof(a);
      a.dtype = t.dt;
      a.op = static_cast<wia_reduce_op_t>(op);
      a.nsrcs = kSrcs;
      a.count = kCount;
      a.divisor = v.divisor;
      a.dst = out;
      a.srcs = ptrs;
      c.step("reduce_async " + what);
      const wia_status_t st = o.reduce_async(c.ctx(), stream, &a);
      if (st == WIA_ERROR_NOT_SUPPORTED) {
        c.take_error();
        continue;
      }
      c.ok(st, "reduce_async(" + what + ")");
      ++supported;
      c.sync(stream);
      c.to_host(got.data(), out, bytes, dev);
      const std::uint64_t divisor = op == WIA_REDUCE_AVG && v.divisor == 0 ? kSrcs : v.divisor;
      for (std::size_t i = 0; i < kCount; ++i) {
        const std::uint8_t* g = got.data() + i * t.size;
        if (t.is_float) {
          const long double want = ref_float(t, static_cast<wia_reduce_op_t>(op), hsrc, i, divisor);
          const long double have = load_float(t, g);
          const long double tol = (t.dt == WIA_FLOAT16    ? 1e-3L
                                   : t.dt == WIA_BFLOAT16 ? 8e-3L
                                   : t.dt == WIA_FLOAT32  ? 1e-6L
                                                          : 1e-14L) *
                                  std::max(1.0L, std::fabs(want));
          const bool good = std::isnan(want) ? std::isnan(have) : std::fabs(have - want) <= tol;
          c.expect(good,
                   what + " element " + std::to_string(i) + " = " +
                       std::to_string(static_cast<double>(want)),
                   std::to_string(static_cast<double>(have)));
        } else {
          const std::uint64_t want = ref_int(t, static_cast<wia_reduce_op_t>(op), hsrc, i, divisor);
          const std::uint64_t have = load_raw(t, g);
          const int bits = static_cast<int>(t.size * 8);
          auto text = [&](std::uint64_t x) {
            return t.is_signed ? std::to_string(sign_extend(x, bits)) : std::to_string(x);
          };
          c.expect(have == want, what + " element " + std::to_string(i) + " = " + text(want),
                   text(have));
        }
      }
    }
  }
  if (supported == 0) throw Skip(std::string("reduce_async supports no op for ") + t.name);
}

}  // namespace

void register_l2_tests() {
  auto add = [](const std::string& id, int timeout_ms, const std::string& what,
                std::function<void(Context&)> fn) {
    registry().push_back({id, 2, timeout_ms, what, std::move(fn), {}});
  };
  add("L2.stream.query", 10000, "stream_query: idle SUCCESS, pending IN_PROGRESS", stream_query);
  add("L2.stream.order", 20000, "1000 memset+memcpy pairs on one stream keep enqueue order",
      stream_order);
  add("L2.memcpy_async.directions", 10000, "async h2d, d2d, d2h chain on one stream",
      memcpy_async_directions);
  add("L2.event.query", 10000, "event_query before record, while pending, after completion",
      event_query);
  add("L2.event.wait", 10000, "stream_wait_event orders a copy on B after a slow memset on A",
      event_wait);
  add("L2.event.elapsed", 10000, "event_elapsed_ms >= a 30 ms host function (CAP_EVENT_TIMING)",
      event_elapsed);
  add("L2.host_func.order", 10000, "host functions run in enqueue order (CAP_HOST_FUNC)",
      host_func_order);
  for (const Dtype& t : kDtypes)
    add(std::string("L2.reduce.") + t.name, 20000,
        std::string("reduce_async of ") + t.name +
            ": sum, prod, min, max, avg, divisor, in place vs a host reference (CAP_REDUCE)",
        [&t](Context& c) { reduce_dtype(c, t); });
}

}  // namespace wia::conformance
