/* Immediate data over the wire (docs/wire.md): an RC QP on the first device, addressed by the
 * RoCE v2 GID of an IP address (IPv4 or IPv6), connected to its peer through a TCP exchange
 * (over IPv4).
 *
 *   rxe_imm server 10.0.4.2 PORT             waits for the client on PORT; checks a SEND with
 *                                            immediate and a 3,000-byte WRITE with immediate
 *                                            (three packets at MTU 1024): prints "ok"
 *   rxe_imm client 10.0.4.1 10.0.4.2 PORT    sends them from the GID of the first address
 *                                            (fd77::1 for IPv6) to the server at the second
 *
 * Either side runs on rxe0 or on the emulator (rdma-emu run --wire ...). */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_qp *qp;
static char buf[8192];

/* What each side tells the other. */
struct side {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

enum { WRITE_AT = 1024, WRITE_LEN = 3000 };

static char pattern(int i)
{
	return (char)('a' + i % 26);
}

static void rc_qp(void)
{
	ctx = open_first_device();
	CHECK(pd = ibv_alloc_pd(ctx));
	CHECK(cq = ibv_create_cq(ctx, 8, NULL, NULL, 0));
	CHECK(mr = ibv_reg_mr(pd, buf, sizeof buf,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { 4, 4, 1, 1, 0 } };
	CHECK(qp = ibv_create_qp(pd, &ia));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

static void connect_to(const struct side *peer, int sgid_index, uint32_t psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qpn,
		.rq_psn = peer->psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = (uint8_t)sgid_index,
				      .hop_limit = 64 } },
	};
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC));
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 30;
	while (time(NULL) < end)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	printf("nothing completed\n");
	exit(1);
}

/* Sends ours and reads the peer's over the connected TCP socket `s`. */
static struct side exchange(int s, const struct side *mine)
{
	struct side peer;
	CHECK(write(s, mine, sizeof *mine) == (ssize_t)sizeof *mine);
	CHECK(read(s, &peer, sizeof peer) == (ssize_t)sizeof peer);
	return peer;
}

int main(int argc, char **argv)
{
	CHECK(argc >= 4);
	int server = strcmp(argv[1], "server") == 0;
	CHECK(server ? argc == 4 : argc == 5 && strcmp(argv[1], "client") == 0);
	rc_qp();
	struct side mine = { .qpn = qp->qp_num, .psn = server ? 0x100 : 0x200, .rkey = mr->rkey,
			     .addr = (uintptr_t)buf };
	int sgid_index = roce_v2_gid_index(ctx, argv[2], &mine.gid);
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)atoi(argv[server ? 3 : 4])) };
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	if (server) {
		int on = 1;
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
		CHECK(!bind(s, (struct sockaddr *)&sa, sizeof sa) && !listen(s, 1));
		int c = accept(s, NULL, NULL);
		CHECK(c >= 0);
		s = c;
	} else {
		CHECK(inet_pton(AF_INET, argv[3], &sa.sin_addr) == 1);
		CHECK(!connect(s, (struct sockaddr *)&sa, sizeof sa));
	}
	if (server) {
		/* Receives first, so that nothing meets an empty receive queue. */
		for (int i = 0; i < 2; i++) {
			struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
			struct ibv_recv_wr rw = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 },
					   *bad;
			CHECK(!ibv_post_recv(qp, &rw, &bad));
		}
	}
	struct side peer = exchange(s, &mine);
	connect_to(&peer, sgid_index, mine.psn);
	char go = 0;
	if (server) {
		CHECK(write(s, &go, 1) == 1); /* ready */
		struct ibv_wc a = wait_wc(), b = wait_wc();
		printf("received: status %d opcode %d flags %#x imm %#x len %u; status %d opcode %d "
		       "flags %#x imm %#x\n",
		       a.status, a.opcode, a.wc_flags, ntohl(a.imm_data), a.byte_len, b.status,
		       b.opcode, b.wc_flags, ntohl(b.imm_data));
		CHECK(a.status == IBV_WC_SUCCESS && a.opcode == IBV_WC_RECV &&
		      (a.wc_flags & IBV_WC_WITH_IMM) && ntohl(a.imm_data) == 0x11223344 &&
		      a.byte_len == 19 && !memcmp(buf, "send with immediate", 19));
		CHECK(b.status == IBV_WC_SUCCESS && b.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      ntohl(b.imm_data) == 0x55667788);
		for (int i = 0; i < WRITE_LEN; i++)
			CHECK(buf[WRITE_AT + i] == pattern(i));
		printf("ok: SEND with immediate 0x11223344, WRITE with immediate 0x55667788 of %d "
		       "bytes\n",
		       WRITE_LEN);
		return 0;
	}
	CHECK(read(s, &go, 1) == 1);
	strcpy(buf, "send with immediate");
	for (int i = 0; i < WRITE_LEN; i++)
		buf[WRITE_AT + i] = pattern(i);
	struct ibv_sge s1 = { (uintptr_t)buf, 19, mr->lkey };
	struct ibv_sge s2 = { (uintptr_t)buf + WRITE_AT, WRITE_LEN, mr->lkey };
	struct ibv_send_wr w2 = { .wr_id = 2, .sg_list = &s2, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x55667788) };
	w2.wr.rdma.remote_addr = peer.addr + WRITE_AT;
	w2.wr.rdma.rkey = peer.rkey;
	struct ibv_send_wr w1 = { .wr_id = 1, .sg_list = &s1, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htonl(0x11223344), .next = &w2 },
			   *bad;
	CHECK(!ibv_post_send(qp, &w1, &bad));
	struct ibv_wc a = wait_wc(), b = wait_wc();
	CHECK(a.status == IBV_WC_SUCCESS && b.status == IBV_WC_SUCCESS);
	printf("ok: sent\n");
	return 0;
}
