/* Captures the RoCE v2 frames the kernel's rxe sends, as test data for the emulator's own
 * encoder and ICRC (emu/src/fabric/testdata/rxe-frames.txt). Runs in the rxe VM, as root:
 *
 *   ../shared/rxe-vm/run.sh 'conformance/wire/rxe_frames > emu/src/fabric/testdata/rxe-frames.txt'
 *
 * (built on the host first: cc -O1 -o conformance/wire/rxe_frames conformance/wire/rxe_frames.c
 * -libverbs). An RC QP on rxe0 connected to a peer that does not exist (10.0.2.2, QPN 0x123456)
 * sends one of each request (SEND, SEND with immediate, a WRITE of three MTU-sized packets,
 * WRITE with immediate, READ, CMP_SWP, FETCH_ADD), and a UD QP one datagram; no retry, so each
 * leaves once. Every UDP datagram to port 4791 that leaves is printed as one line:
 * `frame <what> <hex of the IP packet onwards>`. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char buf[8192];
static union ibv_gid peer;

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	CHECK(ibv_modify_qp(qp, a, mask) == 0);
}

static struct ibv_qp *rc_qp(void)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { 16, 16, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x123456;
	a.rq_psn = 0x10;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x100;
	a.timeout = 14;
	a.retry_cnt = 0;
	a.rnr_retry = 0;
	a.max_rd_atomic = 4;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	return qp;
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, mr->lkey };
	struct ibv_send_wr *bad;
	wr->sg_list = &sge;
	wr->num_sge = 1;
	wr->send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(qp, wr, &bad) == 0);
}

int main(void)
{
	int cap = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
	CHECK(cap >= 0);
	struct utsname u;
	CHECK(uname(&u) == 0);
	printf("# RoCE v2 frames sent by rxe0 on Linux %s (conformance/wire/rxe_frames.c): each is\n"
	       "# the IPv4 packet onwards (IP, UDP, BTH and extensions, payload, pad, ICRC)\n",
	       u.release);
	ctx = open_first_device();
	CHECK(pd = ibv_alloc_pd(ctx));
	CHECK(cq = ibv_create_cq(ctx, 64, NULL, NULL, 0));
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (char)('a' + i % 26);
	CHECK(mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE));
	peer.raw[10] = peer.raw[11] = 0xff;
	peer.raw[12] = 10, peer.raw[13] = 0, peer.raw[14] = 2, peer.raw[15] = 2;

	struct ibv_qp *qp = rc_qp();
	struct ibv_send_wr w;
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_SEND;
	post(qp, &w, 16);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_SEND_WITH_IMM;
	w.imm_data = htonl(0x01020304);
	post(qp, &w, 8);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = 0x10000;
	w.wr.rdma.rkey = 0x55;
	post(qp, &w, 2500);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	w.imm_data = htonl(0x0a0b0c0d);
	w.wr.rdma.remote_addr = 0x20000;
	w.wr.rdma.rkey = 0x55;
	post(qp, &w, 5);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = 0x30000;
	w.wr.rdma.rkey = 0x66;
	post(qp, &w, 3000);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	w.wr.atomic.remote_addr = 0x40000;
	w.wr.atomic.rkey = 0x77;
	w.wr.atomic.compare_add = 0x1111222233334444ull;
	w.wr.atomic.swap = 0x5555666677778888ull;
	post(qp, &w, 8);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	w.wr.atomic.remote_addr = 0x40008;
	w.wr.atomic.rkey = 0x77;
	w.wr.atomic.compare_add = 3;
	post(qp, &w, 8);

	struct ibv_qp_init_attr ua = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 4, 4, 1, 1, 0 } };
	struct ibv_qp *ud = ibv_create_qp(pd, &ua);
	CHECK(ud);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	modify(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	a.qp_state = IBV_QPS_RTR;
	modify(ud, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x200;
	modify(ud, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = peer, .sgid_index = 1, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah);
	memset(&w, 0, sizeof w);
	w.opcode = IBV_WR_SEND;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = 0x654321;
	w.wr.ud.remote_qkey = 0x11111111;
	post(ud, &w, 32);

	/* Everything that leaves within 2 s (the RC requests go once: retry_cnt 0). */
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (ms > 2000)
			break;
		struct pollfd p = { cap, POLLIN, 0 };
		if (poll(&p, 1, 100) <= 0)
			continue;
		unsigned char f[9000];
		struct sockaddr_ll from;
		socklen_t fl = sizeof from;
		ssize_t len = recvfrom(cap, f, sizeof f, 0, (struct sockaddr *)&from, &fl);
		if (len < 14 + 20 + 8 || from.sll_pkttype != PACKET_OUTGOING)
			continue;
		unsigned char *ip = f + 14;
		if (ntohs(*(uint16_t *)(f + 12)) != ETH_P_IP || ip[9] != 17)
			continue;
		unsigned char *udp = ip + (ip[0] & 0xf) * 4;
		if (ntohs(*(uint16_t *)(udp + 2)) != 4791)
			continue;
		printf("frame op%02x ", udp[8]);
		for (unsigned char *b = ip; b < f + len; b++)
			printf("%02x", *b);
		printf("\n");
	}
	return 0;
}
