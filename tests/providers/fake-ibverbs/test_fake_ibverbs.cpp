// SPDX-License-Identifier: Apache-2.0
// The libibverbs double's own test (ctest fake_ibverbs), linked against it
// and calling it as a verbs program would: what README.md promises about
// RC delivery, receiver-not-ready, rkey checks and a dead peer.
// (ibv_reg_mr) in parentheses calls the exported function: verbs.h's macro
// picks ibv_reg_mr_iova2 (IBVERBS_1.8, not in the double) when it cannot
// prove the access flags constant, as in an unoptimised build.
#include <doctest/doctest.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace {

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_gid gid{};

  Side() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    REQUIRE(n == 1);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    REQUIRE(ctx != nullptr);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = 16;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(pd, &sa);
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = cq;
    qa.srq = srq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 16;
    qp = ibv_create_qp(pd, &qa);
    REQUIRE(qp != nullptr);
    REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  }
  void connect(std::uint32_t qpn, const ibv_gid& to) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTR;
    at.dest_qp_num = qpn;
    at.ah_attr.is_global = 1;
    at.ah_attr.grh.dgid = to;
    REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN) == 0);
    at.qp_state = IBV_QPS_RTS;
    REQUIRE(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0);
  }
  ~Side() {
    ibv_destroy_qp(qp);
    ibv_destroy_srq(srq);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
};

// The next completion within 5 s (status IBV_WC_GENERAL_ERR if none came).
ibv_wc next_wc(ibv_cq* cq) {
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline)
    if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
  FAIL_CHECK("no completion within 5 s");
  return wc;
}

int post(ibv_qp* qp, ibv_wr_opcode op, void* buf, std::uint32_t len, ibv_mr* mr,
         std::uint64_t raddr = 0, std::uint32_t rkey = 0) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), len, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

void post_recv(ibv_srq* srq, void* buf, std::uint32_t len, ibv_mr* mr) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), len, mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = 9;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
}

}  // namespace

TEST_CASE("fake-ibverbs: a send waits for a receive (RNR), then lands; a bad rkey is refused") {
  Side a, b;
  a.connect(b.qp->qp_num, b.gid);
  b.connect(a.qp->qp_num, a.gid);
  std::vector<char> src(1000, 'x'), dst(4096, 0);
  ibv_mr* ms = (ibv_reg_mr)(a.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* md =
      (ibv_reg_mr)(b.pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(post(a.qp, IBV_WR_SEND, src.data(), 1000, ms) == 0);
  ibv_wc wc{};
  usleep(100000);  // no receive posted: nothing completes on either side
  CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
  CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
  post_recv(b.srq, dst.data(), dst.size(), md);
  wc = next_wc(b.cq);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RECV);
  CHECK(wc.byte_len == 1000);
  CHECK(wc.qp_num == b.qp->qp_num);
  CHECK(dst[999] == 'x');
  CHECK(next_wc(a.cq).status == IBV_WC_SUCCESS);
  // A write past the end of the target region: the requester's completion
  // says so and nothing is written.
  REQUIRE(post(a.qp, IBV_WR_RDMA_WRITE, src.data(), 1000, ms,
               reinterpret_cast<std::uintptr_t>(dst.data()) + 3500, md->rkey) == 0);
  CHECK(next_wc(a.cq).status == IBV_WC_REM_ACCESS_ERR);
  CHECK(dst[3500] == 0);
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
}

TEST_CASE("fake-ibverbs: after the peer process dies the next send is IBV_WC_RETRY_EXC_ERR") {
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(to_parent) == 0);
  struct Addr {
    std::uint32_t qpn;
    ibv_gid gid;
  };
  const pid_t child = fork();  // before either side opens the device (its thread)
  REQUIRE(child >= 0);
  if (child == 0) {
    Side s;
    Addr mine{s.qp->qp_num, s.gid}, peer{};
    if (write(to_parent[1], &mine, sizeof mine) != sizeof mine) _exit(2);
    if (read(to_child[0], &peer, sizeof peer) != sizeof peer) _exit(3);
    s.connect(peer.qpn, peer.gid);
    if (write(to_parent[1], &mine, 1) != 1) _exit(4);
    pause();  // until killed
    _exit(0);
  }
  Side s;
  Addr mine{s.qp->qp_num, s.gid}, peer{};
  REQUIRE(read(to_parent[0], &peer, sizeof peer) == sizeof peer);
  REQUIRE(write(to_child[1], &mine, sizeof mine) == sizeof mine);
  s.connect(peer.qpn, peer.gid);
  char ready = 0;
  REQUIRE(read(to_parent[0], &ready, 1) == 1);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  usleep(200000);  // the double's thread sees the sockets close
  std::vector<char> src(64, 'y');
  ibv_mr* m = (ibv_reg_mr)(s.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(post(s.qp, IBV_WR_SEND, src.data(), 64, m) == 0);
  const ibv_wc wc = next_wc(s.cq);
  CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(std::strcmp(ibv_wc_status_str(wc.status), "transport retry counter exceeded") == 0);
  // The QP is in error now: later sends are flushed.
  REQUIRE(post(s.qp, IBV_WR_SEND, src.data(), 64, m) == 0);
  CHECK(next_wc(s.cq).status == IBV_WC_WR_FLUSH_ERR);
  ibv_dereg_mr(m);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}
