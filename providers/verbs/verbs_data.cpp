// SPDX-License-Identifier: Apache-2.0
// Tagged messages over RC queue pairs: eager sends into the shared receive
// queue's slots, matched by the provider; rendezvous (RTS, CTS, RDMA write
// with immediate) for messages over kEagerMax; completions and failures.
#include <endian.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "verbs.hpp"

namespace wia::verbs {

namespace {

const char* wc_name(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_LOC_LEN_ERR:
      return "IBV_WC_LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR:
      return "IBV_WC_LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR:
      return "IBV_WC_LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR:
      return "IBV_WC_WR_FLUSH_ERR";
    case IBV_WC_LOC_ACCESS_ERR:
      return "IBV_WC_LOC_ACCESS_ERR";
    case IBV_WC_REM_INV_REQ_ERR:
      return "IBV_WC_REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR:
      return "IBV_WC_REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR:
      return "IBV_WC_REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR:
      return "IBV_WC_RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "IBV_WC_RNR_RETRY_EXC_ERR";
    case IBV_WC_FATAL_ERR:
      return "IBV_WC_FATAL_ERR";
    case IBV_WC_GENERAL_ERR:
      return "IBV_WC_GENERAL_ERR";
    default:
      return "IBV_WC status";
  }
}

// "transport retry counter exceeded (IBV_WC_RETRY_EXC_ERR 12, vendor error 0x81)"
std::string wc_text(const Lib& lib, const ibv_wc& wc) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (%s %d, vendor error 0x%x)", wc_name(wc.status),
                static_cast<int>(wc.status), wc.vendor_err);
  return std::string(lib.wc_status_str(wc.status)) + buf;
}

}  // namespace

void Ctx::finish(Request* r, wia_status_t status, std::string error) {
  if (r->state != Request::State::pending) return;
  r->state = status == WIA_SUCCESS ? Request::State::done : Request::State::failed;
  r->status = status;
  r->error = std::move(error);
  unreg(std::exchange(r->mr, nullptr));
  unreg(std::exchange(r->device_mr, nullptr));
}

void Ctx::release(Request* r) {
  if (!r->user_gone || r->in_flight > 0) return;
  if (r->conn != nullptr) r->conn->requests.erase(r);
  unreg(std::exchange(r->mr, nullptr));
  unreg(std::exchange(r->device_mr, nullptr));
  delete r;
}

wia_status_t Ctx::post_recv_slot(std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(recv_slab.get() + std::size_t{slot} * kSlotSize);
  sge.length = kSlotSize;
  sge.lkey = recv_mr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvBit | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_srq_recv(srq, &wr, &bad);
  if (rc != 0)
    return fail(WIA_ERROR_IO, "verbs: ibv_post_srq_recv on %s: %s", dev_name.c_str(),
                errno_text(rc).c_str());
  return WIA_SUCCESS;
}

// A failed connection fails everything the core still waits for on it,
// except messages that arrived before: those stay deliverable.
void Ctx::fail_conn(Conn* c, const std::string& why) {
  if (c->failed) return;
  c->failed = true;
  c->failure = "verbs: connection to peer " + c->peer + " on " + dev_name + " failed: " + why;
  // A peer that finished first and closed is no news unless the core
  // still waits for something on this connection.
  log(c->requests.empty() ? WIA_LOG_DEBUG : WIA_LOG_WARN, "%s", c->failure.c_str());
  for (Request* r : c->requests)
    if (!r->landing) finish(r, WIA_ERROR_REMOTE, c->failure);  // its data is here already
  c->out.clear();
  c->posted.clear();
  c->rndv_sends.clear();
  c->rndv_recvs.clear();
  // The QP flushes what it still holds, so its send slots come back; the
  // peer learns from the closed socket.
  if (c->qp != nullptr) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    lib.modify_qp(c->qp, &at, IBV_QP_STATE);
  }
  if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
}

std::uint32_t Ctx::alloc_op() {
  if (free_ops_.empty()) {
    ops_.emplace_back();
    return static_cast<std::uint32_t>(ops_.size() - 1);
  }
  const std::uint32_t i = free_ops_.back();
  free_ops_.pop_back();
  return i;
}

// Posts queued sends while the QP has room and slots are free.
void Ctx::flush_out(Conn* c) {
  while (!c->out.empty() && !c->failed && c->qp != nullptr && c->sq_used < kMaxSendWr) {
    OutItem& it = c->out.front();
    const bool inline_ok =
        !it.write &&
        sizeof(MsgHeader) + (it.hdr.kind == Kind::eager ? it.hdr.size : 0) <= max_inline;
    int slot = -1;
    if (!it.write && !inline_ok) {
      if (free_send_slots.empty()) return;
      slot = free_send_slots.back();
      free_send_slots.pop_back();
    }
    const std::uint32_t op_index = alloc_op();
    ibv_sge sge{};
    ibv_send_wr wr{};
    char inline_buf[kMaxInline + sizeof(MsgHeader)];
    if (it.write) {
      sge.addr = reinterpret_cast<std::uintptr_t>(it.req->buf);
      sge.length = static_cast<std::uint32_t>(it.req->size);
      sge.lkey = it.req->mr->mr->lkey;
      wr.opcode = it.opcode;
      if (it.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htobe32(it.imm);
      wr.wr.rdma.remote_addr = it.remote_addr;
      wr.wr.rdma.rkey = it.rkey;
    } else {
      const std::uint64_t n = it.hdr.kind == Kind::eager ? it.hdr.size : 0;
      char* to = slot >= 0
                     ? send_slab.get() + std::size_t{static_cast<std::uint32_t>(slot)} * kSlotSize
                     : inline_buf;
      std::memcpy(to, &it.hdr, sizeof(MsgHeader));
      if (n > 0) std::memcpy(to + sizeof(MsgHeader), it.payload, n);
      sge.addr = reinterpret_cast<std::uintptr_t>(to);
      sge.length = static_cast<std::uint32_t>(sizeof(MsgHeader) + n);
      sge.lkey = send_mr->lkey;
      wr.opcode = IBV_WR_SEND;
      if (slot < 0) wr.send_flags |= IBV_SEND_INLINE;
    }
    wr.wr_id = op_index;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags |= IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(c->qp, &wr, &bad);
    if (rc != 0) {
      if (slot >= 0) free_send_slots.push_back(slot);
      free_ops_.push_back(op_index);
      fail_conn(c, "ibv_post_send: " + errno_text(rc));
      return;
    }
    const bool completes = it.write || it.hdr.kind == Kind::eager;
    const char* what = !it.write                       ? "send"
                       : it.opcode == IBV_WR_RDMA_READ ? "RDMA read"
                                                       : "RDMA write";
    ops_[op_index] = SendOp{c, it.req, slot, completes, what};
    if (it.req != nullptr) ++it.req->in_flight;
    ++c->sq_used;
    c->out.pop_front();
  }
}

wia_status_t Ctx::isend(Conn* c, const char* buf, std::uint64_t size, std::uint64_t tag,
                        MrHandle* mr, wia_request_t* out) {
  if (c->failed) return fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  if (size > port_attr.max_msg_sz)
    return fail(WIA_ERROR_INVALID_ARGUMENT,
                "verbs: isend of %s to peer %s: larger than %s, the largest message of %s",
                size_text(size).c_str(), c->peer.c_str(), size_text(port_attr.max_msg_sz).c_str(),
                dev_name.c_str());
  // Device memory (a dma-buf registration) is never read by the CPU: every
  // non-empty message from it goes by rendezvous, the NIC reading it.
  const bool device = mr != nullptr && mr->entry->device && size > 0;
  if (device && !mr->entry->covers(buf, size))
    return fail(WIA_ERROR_INVALID_ARGUMENT,
                "verbs: isend of %s at %p to peer %s: the device-memory region passed "
                "(0x%" PRIxPTR " + %s) does not cover it",
                size_text(size).c_str(), static_cast<const void*>(buf), c->peer.c_str(),
                mr->entry->base, size_text(mr->entry->len).c_str());
  auto* r = new Request;
  r->is_send = true;
  r->conn = c;
  r->buf = const_cast<char*>(buf);
  r->size = size;
  r->tag = tag;
  c->requests.insert(r);
  OutItem it;
  it.req = r;
  it.hdr.magic = kMsgMagic;
  it.hdr.tag = tag;
  it.hdr.size = size;
  if (size <= kEagerMax && !device) {
    it.hdr.kind = Kind::eager;
    it.payload = buf;
  } else {
    it.hdr.kind = Kind::rts;
    r->id = c->next_send_id++;
    it.hdr.sender_id = r->id;
    c->rndv_sends[r->id] = r;
    // The source must be registered by the time the CTS comes back; a
    // region the core registered covers it when its range does.
    if (mr != nullptr && mr->entry->covers(buf, size)) {
      ++mr->entry->refs;
      r->mr = mr->entry;
    }
  }
  c->out.push_back(it);
  flush_out(c);
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

// put/get: one RDMA write or read between a local buffer (the region the
// caller names when it covers the buffer, else a cached registration) and
// a range of the peer's region. Completes on its own completion; RC order
// makes a completed put visible before any later message on the connection.
wia_status_t Ctx::rma(Conn* c, bool put, char* local, std::uint64_t size, MrHandle* mr,
                      std::uint64_t remote_addr, const void* rkey, wia_request_t* out) {
  const char* what = put ? "put" : "get";
  if (c->failed) return fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  WireRkey k;
  std::memcpy(&k, rkey, sizeof k);
  if (k.magic != kRkeyMagic)
    return fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: %s: the rkey is not a verbs mr_rkey's", what);
  if (remote_addr < k.base || size > k.len || remote_addr - k.base > k.len - size)
    return fail(WIA_ERROR_INVALID_ARGUMENT,
                "verbs: %s of %s at 0x%" PRIx64
                " to peer %s: outside the remote region "
                "0x%" PRIx64 " + %s",
                what, size_text(size).c_str(), remote_addr, c->peer.c_str(), k.base,
                size_text(k.len).c_str());
  if (size > port_attr.max_msg_sz)
    return fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: %s of %s: larger than %s, the largest on %s",
                what, size_text(size).c_str(), size_text(port_attr.max_msg_sz).c_str(),
                dev_name.c_str());
  auto* r = new Request;
  r->is_send = put;
  r->conn = c;
  r->buf = local;
  r->size = size;
  c->requests.insert(r);
  *out = reinterpret_cast<wia_request_t>(r);
  if (size == 0) {
    finish(r, WIA_SUCCESS);
    return WIA_SUCCESS;
  }
  if (mr != nullptr && mr->entry->covers(local, size)) {
    ++mr->entry->refs;
    r->mr = mr->entry;
  } else {
    MrEntry* e = nullptr;
    const wia_status_t st = reg(local, size, &e);
    if (st != WIA_SUCCESS) {
      r->user_gone = true;
      release(r);
      *out = nullptr;
      return st;
    }
    r->mr = e;
  }
  OutItem it;
  it.write = true;
  it.opcode = put ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  it.req = r;
  it.remote_addr = remote_addr;
  it.rkey = k.rkey;
  c->out.push_back(it);
  flush_out(c);
  return WIA_SUCCESS;
}

// A matched large message: tell the sender where to write, or that the
// receive is too small (then nothing is written and the receive fails).
void Ctx::deliver(Request* r, Unexpected& u) {
  if (!u.rts) {
    if (u.size > r->capacity) {
      char tag_text[40];  // the tag in hex, as "0x" promises (it was printed in decimal)
      std::snprintf(tag_text, sizeof tag_text, " (tag 0x%" PRIx64 ")", u.tag);
      finish(r, WIA_ERROR_REMOTE,
             "verbs: message of " + size_text(u.size) + tag_text + " from peer " + r->conn->peer +
                 " does not fit the " + size_text(r->capacity) + " receive");
      return;
    }
    r->size = u.size;
    if (r->device_mr != nullptr && u.size > 0) {  // the NIC copies it in (loopback write)
      LoopItem w;
      w.data = std::move(u.data);
      w.len = u.size;
      land(r, std::move(w));
      return;
    }
    if (u.size > 0) std::memcpy(r->buf, u.data.data(), u.size);
    finish(r, WIA_SUCCESS);
    return;
  }
  Conn* c = r->conn;
  OutItem it;
  it.hdr.magic = kMsgMagic;
  it.hdr.sender_id = u.sender_id;
  it.hdr.size = u.size;
  if (u.size > r->capacity) {
    it.hdr.kind = Kind::cts_truncated;
    finish(r, WIA_ERROR_REMOTE,
           "verbs: message of " + size_text(u.size) + " from peer " + c->peer +
               " does not fit the " + size_text(r->capacity) + " receive");
  } else {
    // Device memory: the caller's dma-buf registration; host: the cache.
    MrEntry* e = r->device_mr;
    wia_status_t st = WIA_SUCCESS;
    if (e != nullptr)
      ++e->refs;
    else
      st = reg(r->buf, u.size, &e);
    if (st != WIA_SUCCESS) {
      it.hdr.kind = Kind::cts_truncated;
      finish(r, st,
             "verbs: cannot register the receive of a " + size_text(u.size) +
                 " message from peer " + c->peer + ": " + reg_error);
    } else {
      r->mr = e;
      r->size = u.size;
      it.hdr.kind = Kind::cts;
      it.hdr.addr = reinterpret_cast<std::uintptr_t>(r->buf);
      it.hdr.rkey = e->mr->rkey;
      it.hdr.recv_id = c->next_recv_id++;
      if (c->next_recv_id == 0) c->next_recv_id = 1;
      c->rndv_recvs[it.hdr.recv_id] = r;
    }
  }
  c->out.push_back(it);
  flush_out(c);
}

wia_status_t Ctx::irecv(Conn* c, char* buf, std::uint64_t size, std::uint64_t tag, MrHandle* mr,
                        wia_request_t* out) {
  MrEntry* device = mr != nullptr && mr->entry->device && size > 0 ? mr->entry : nullptr;
  if (device != nullptr && !device->covers(buf, size))
    return fail(WIA_ERROR_INVALID_ARGUMENT,
                "verbs: irecv of %s at %p from peer %s: the device-memory region passed "
                "(0x%" PRIxPTR " + %s) does not cover it",
                size_text(size).c_str(), static_cast<void*>(buf), c->peer.c_str(), device->base,
                size_text(device->len).c_str());
  // Device memory is filled only by the NIC: an eager message is written
  // into it on the loopback QP, and every receive is flushed on it.
  if (device != nullptr) {
    const wia_status_t st = open_loopback();
    if (st != WIA_SUCCESS) return st;
  }
  progress();
  auto make = [&] {
    auto* r = new Request;
    r->conn = c;
    r->buf = buf;
    r->capacity = size;
    r->tag = tag;
    if (device != nullptr) {
      ++device->refs;
      r->device_mr = device;
    }
    c->requests.insert(r);
    return r;
  };
  for (auto it = c->unexpected.begin(); it != c->unexpected.end(); ++it) {
    if (it->tag != tag) continue;
    Request* r = make();
    Unexpected u = std::move(*it);
    c->unexpected.erase(it);
    if (c->failed && u.rts)
      finish(r, WIA_ERROR_REMOTE, c->failure);
    else
      deliver(r, u);
    *out = reinterpret_cast<wia_request_t>(r);
    return WIA_SUCCESS;
  }
  if (c->failed) return fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  Request* r = make();
  c->posted.push_back(r);
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

// Returns true when it keeps the SRQ slot `slot` that holds `payload` (an
// eager message being written into device memory from it); the loopback
// write's completion reposts it.
bool Ctx::on_message(Conn* c, const MsgHeader& h, const char* payload, std::uint32_t slot) {
  switch (h.kind) {
    case Kind::eager:
    case Kind::rts: {
      Unexpected u;
      u.tag = h.tag;
      u.rts = h.kind == Kind::rts;
      u.size = h.size;
      u.sender_id = h.sender_id;
      for (auto it = c->posted.begin(); it != c->posted.end(); ++it) {
        if ((*it)->tag != h.tag) continue;
        Request* r = *it;
        c->posted.erase(it);
        if (!u.rts && h.size <= r->capacity) {  // straight from the slot
          r->size = h.size;
          if (r->device_mr != nullptr && h.size > 0) {  // by the NIC: loopback write
            LoopItem w;
            w.src = payload;
            w.len = h.size;
            w.recv_slot = static_cast<int>(slot);
            land(r, std::move(w));
            return true;
          }
          if (h.size > 0) std::memcpy(r->buf, payload, h.size);
          finish(r, WIA_SUCCESS);
        } else {
          deliver(r, u);
        }
        return false;
      }
      if (!u.rts) u.data.assign(payload, payload + h.size);
      c->unexpected.push_back(std::move(u));
      return false;
    }
    case Kind::cts:
    case Kind::cts_truncated: {
      auto it = c->rndv_sends.find(h.sender_id);
      if (it == c->rndv_sends.end()) return false;
      Request* r = it->second;
      c->rndv_sends.erase(it);
      if (h.kind == Kind::cts_truncated) {  // the receiver dropped it: the send is over
        finish(r, WIA_SUCCESS);
        return false;
      }
      if (r->mr == nullptr) {
        MrEntry* e = nullptr;
        if (reg(r->buf, r->size, &e) != WIA_SUCCESS) {
          fail_conn(c, "cannot register the source of a large send: " + reg_error);
          return false;
        }
        r->mr = e;
      }
      OutItem w;
      w.write = true;
      w.req = r;
      w.remote_addr = h.addr;
      w.rkey = h.rkey;
      w.imm = h.recv_id;
      c->out.push_back(w);
      flush_out(c);
      return false;
    }
  }
  fail_conn(c, "a message of unknown kind " + std::to_string(static_cast<int>(h.kind)));
  return false;
}

void Ctx::on_recv(const ibv_wc& wc) {
  const auto slot = static_cast<std::uint32_t>(wc.wr_id & ~kRecvBit);
  bool kept = false;  // by a loopback write into device memory
  auto found = by_qpn.find(wc.qp_num);
  Conn* c = found != by_qpn.end() ? found->second : nullptr;
  if (wc.status != IBV_WC_SUCCESS) {
    if (c != nullptr) fail_conn(c, "receive completion error: " + wc_text(lib, wc));
  } else if (c != nullptr && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    auto it = c->rndv_recvs.find(be32toh(wc.imm_data));
    if (it != c->rndv_recvs.end()) {
      Request* r = it->second;
      c->rndv_recvs.erase(it);
      if (r->device_mr != nullptr && r->size > 0)
        land(r, LoopItem{});  // flushed before it completes (verbs.gdr_flush)
      else
        finish(r, WIA_SUCCESS);
    }
  } else if (c != nullptr && wc.opcode == IBV_WC_RECV) {
    const char* p = recv_slab.get() + std::size_t{slot} * kSlotSize;
    MsgHeader h;
    std::memcpy(&h, p, sizeof h);
    if (wc.byte_len < sizeof h || h.magic != kMsgMagic ||
        (h.kind == Kind::eager && h.size != wc.byte_len - sizeof h))
      fail_conn(c, "a malformed message of " + std::to_string(wc.byte_len) + " bytes");
    else
      kept = on_message(c, h, p + sizeof h, slot);
  }
  if (slot < kRecvSlots && !kept) post_recv_slot(slot);
}

void Ctx::on_send(const ibv_wc& wc) {
  if (wc.wr_id >= ops_.size()) return;
  const auto index = static_cast<std::uint32_t>(wc.wr_id);
  const SendOp op = ops_[index];
  if (op.conn == nullptr) return;
  ops_[index] = SendOp{};
  free_ops_.push_back(index);
  if (op.slot >= 0) free_send_slots.push_back(op.slot);
  if (op.loopback) {
    on_loop_done(op, wc);
    return;
  }
  Conn* c = op.conn;
  if (c->sq_used > 0) --c->sq_used;
  if (op.req != nullptr) --op.req->in_flight;
  if (wc.status != IBV_WC_SUCCESS) {
    // The first error names the cause; the flushes after it only repeat it.
    if (!c->failed) fail_conn(c, std::string(op.what) + " completion error: " + wc_text(lib, wc));
  } else if (op.completes_req && op.req != nullptr) {
    finish(op.req, WIA_SUCCESS);
  }
  if (op.req != nullptr) release(op.req);
  if (!c->failed) flush_out(c);
  if (op.slot >= 0 && !loop_out.empty()) flush_loop();  // a send slot came back
}

// --- the loopback QP: eager messages into device memory, and flushes -------------------

// A receive into device memory whose data is here (an eager payload in host
// memory) or has been written (a rendezvous write's immediate arrived): the
// NIC writes the payload in and then reads one byte back (the flush), and
// the receive completes on that read's completion; with verbs.gdr_flush
// false, on the write's. The CPU never touches device memory. Queued items
// count in the request's in_flight, so it outlives them.
void Ctx::land(Request* r, LoopItem item) {
  r->landing = true;
  const bool flush = params.gdr_flush;
  if (item.len > 0) {
    item.req = r;
    item.flush = false;
    item.completes = !flush;
    ++r->in_flight;
    loop_out.push_back(std::move(item));
  } else if (!flush) {
    finish(r, WIA_SUCCESS);  // a rendezvous write: it is in already
    return;
  }
  if (flush) {
    LoopItem read;
    read.req = r;
    read.flush = true;
    read.completes = true;
    ++r->in_flight;
    loop_out.push_back(std::move(read));
  }
  flush_loop();
}

void Ctx::fail_loop_items(const std::string& why) {
  while (!loop_out.empty()) {
    LoopItem it = std::move(loop_out.front());
    loop_out.pop_front();
    if (it.recv_slot >= 0) post_recv_slot(static_cast<std::uint32_t>(it.recv_slot));
    finish(it.req, WIA_ERROR_IO, why);
    --it.req->in_flight;
    release(it.req);
  }
}

namespace {

std::string landing_text(const Ctx& ctx, const Request* r) {
  return "verbs: a message of " + size_text(r->size) + " from peer " +
         (r->conn != nullptr ? r->conn->peer : std::string("(connection closed)")) +
         " could not be placed in device memory on " + ctx.dev_name + ": ";
}

}  // namespace

// Posts queued loopback work in order while its send queue has room (and,
// for an unexpected message's payload, a send slot is free). A loopback QP
// that failed is remade once its outstanding WRs have completed.
void Ctx::flush_loop() {
  while (!loop_out.empty()) {
    if (loop == nullptr || loop->failed) {
      if (loop != nullptr && loop->sq_used > 0) return;  // on_loop_done comes back here
      const std::string before = loop != nullptr ? loop->failure : std::string();
      if (open_loopback() != WIA_SUCCESS) {
        fail_loop_items("verbs: the loopback QP on " + dev_name +
                        " (which places eager messages in device memory and flushes receives "
                        "into it) could not be made" +
                        (before.empty() ? std::string() : " again after " + before));
        return;
      }
    }
    if (loop->sq_used >= kMaxSendWr) return;
    LoopItem& it = loop_out.front();
    Request* r = it.req;
    if (r->state != Request::State::pending || r->device_mr == nullptr) {  // failed meanwhile
      if (it.recv_slot >= 0) post_recv_slot(static_cast<std::uint32_t>(it.recv_slot));
      loop_out.pop_front();
      --r->in_flight;
      release(r);
      continue;
    }
    int slot = -1;
    ibv_sge sge{};
    ibv_send_wr wr{};
    if (it.flush) {
      sge.addr = reinterpret_cast<std::uintptr_t>(flush_byte);
      sge.length = 1;
      sge.lkey = flush_mr->lkey;
      wr.opcode = IBV_WR_RDMA_READ;
    } else if (it.recv_slot >= 0) {  // straight from the SRQ slot it arrived in
      sge.addr = reinterpret_cast<std::uintptr_t>(it.src);
      sge.length = static_cast<std::uint32_t>(it.len);
      sge.lkey = recv_mr->lkey;
      wr.opcode = IBV_WR_RDMA_WRITE;
    } else {  // an unexpected message's payload: into a registered send slot first
      if (free_send_slots.empty()) return;  // on_send comes back here
      slot = free_send_slots.back();
      free_send_slots.pop_back();
      char* to = send_slab.get() + std::size_t{static_cast<std::uint32_t>(slot)} * kSlotSize;
      std::memcpy(to, it.data.data(), it.len);
      sge.addr = reinterpret_cast<std::uintptr_t>(to);
      sge.length = static_cast<std::uint32_t>(it.len);
      sge.lkey = send_mr->lkey;
      wr.opcode = IBV_WR_RDMA_WRITE;
    }
    // The receive's own registration: iova = the device pointer.
    wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(r->buf);
    wr.wr.rdma.rkey = r->device_mr->mr->rkey;
    const std::uint32_t op_index = alloc_op();
    wr.wr_id = op_index;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(loop->qp, &wr, &bad);
    if (rc != 0) {
      if (slot >= 0) free_send_slots.push_back(slot);
      free_ops_.push_back(op_index);
      loop->failed = true;
      loop->failure = "ibv_post_send on the loopback QP: " + errno_text(rc);
      if (it.recv_slot >= 0) post_recv_slot(static_cast<std::uint32_t>(it.recv_slot));
      finish(r, WIA_ERROR_IO, landing_text(*this, r) + loop->failure);
      loop_out.pop_front();
      --r->in_flight;
      release(r);
      continue;
    }
    SendOp op;
    op.conn = loop.get();
    op.req = r;
    op.slot = slot;
    op.completes_req = it.completes;
    op.what = it.flush ? "flush (RDMA read)" : "RDMA write";
    op.loopback = true;
    op.recv_slot = it.recv_slot;
    ops_[op_index] = op;
    ++loop->sq_used;
    loop_out.pop_front();
  }
}

// A loopback WR completed (its send slot is already back): the SRQ slot the
// payload came from is reposted; the flush's completion ends the receive.
void Ctx::on_loop_done(const SendOp& op, const ibv_wc& wc) {
  Conn* lc = op.conn;
  if (lc->sq_used > 0) --lc->sq_used;
  if (op.recv_slot >= 0) post_recv_slot(static_cast<std::uint32_t>(op.recv_slot));
  Request* r = op.req;
  --r->in_flight;
  if (wc.status != IBV_WC_SUCCESS) {
    if (!lc->failed) {
      lc->failed = true;
      lc->failure = std::string(op.what) + " completion error: " + wc_text(lib, wc);
      log(WIA_LOG_WARN, "verbs: the loopback QP on %s failed: %s", dev_name.c_str(),
          lc->failure.c_str());
    }
    finish(r, WIA_ERROR_IO,
           landing_text(*this, r) + "the loopback QP's " + op.what +
               " completion error: " + wc_text(lib, wc));
  } else if (op.completes_req) {
    finish(r, WIA_SUCCESS);
  }
  release(r);
  if (lc->failed && lc->sq_used == 0) close_loopback();  // remade by the next need
  flush_loop();
}

bool Ctx::progress() {
  ibv_wc wcs[32];
  bool any = false;
  for (;;) {
    const int n = ibv_poll_cq(cq, 32, wcs);
    if (n <= 0) break;
    any = true;
    for (int i = 0; i < n; ++i) {
      // Error completions carry no valid opcode: receives are told apart by
      // the bit their wr_id carries (SRQ slot numbers), sends are ops_ indexes.
      const ibv_wc& wc = wcs[i];
      const bool is_recv = (wc.wr_id & kRecvBit) != 0;
      if (is_recv)
        on_recv(wc);
      else
        on_send(wc);
    }
  }
  return any;
}

wia_status_t Ctx::test(Request* r, int32_t* done, std::uint64_t* size) {
  if (r->state == Request::State::pending) {
    progress();
    check_liveness();
    if (r->conn != nullptr && !r->conn->failed) flush_out(r->conn);
  }
  if (r->state == Request::State::pending) {
    *done = 0;
    return WIA_SUCCESS;
  }
  *done = 1;
  if (size != nullptr) *size = r->size;
  const wia_status_t st = r->status;
  if (st != WIA_SUCCESS) fail(st, "%s", r->error.c_str());
  r->user_gone = true;
  release(r);
  return st;
}

// The completion channel's fd (shared by every connection of the device)
// and the connection's handshake socket (the peer going away).
wia_status_t Ctx::wait_fds(Conn* c, pollfd* fds, std::uint32_t capacity, std::uint32_t* count) {
  *count = 0;
  if (!c->established || c->failed || capacity < 2) return WIA_IN_PROGRESS;
  // Take the events that woke the caller, then arm and look once more: a
  // completion queued before arming raises no event.
  for (;;) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (lib.get_cq_event(channel, &ev_cq, &ev_ctx) != 0) break;
    ++unarmed_events;
  }
  if (unarmed_events > 0) {
    lib.ack_cq_events(cq, unarmed_events);
    unarmed_events = 0;
  }
  if (ibv_req_notify_cq(cq, 0) != 0) return WIA_IN_PROGRESS;
  if (progress() || !c->out.empty()) return WIA_IN_PROGRESS;
  fds[0] = {channel->fd, POLLIN, 0};
  fds[1] = {c->fd, POLLIN, 0};
  *count = 2;
  return WIA_SUCCESS;
}

}  // namespace wia::verbs
