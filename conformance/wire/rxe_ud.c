/* rxe's side of the wire checks (docs/wire.md), with a UD QP on rxe0 (qkey 0x11111111):
 *
 *   rxe_ud receive 10.0.4.1         waits up to 10 s for a datagram to its QP at that address:
 *                                   prints "qpn N", then the receive's completion and bytes
 *   rxe_ud send 10.0.4.1 10.0.4.2   sends "sent by rxe" from that address to QPN 0x77 there */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_qp *qp;
static char buf[4096];

static void ud_qp(void)
{
	ctx = open_first_device();
	CHECK(pd = ibv_alloc_pd(ctx));
	CHECK(cq = ibv_create_cq(ctx, 4, NULL, NULL, 0));
	CHECK(mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE));
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 4, 4, 1, 1, 0 } };
	CHECK(qp = ibv_create_qp(pd, &ia));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x300;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	while (time(NULL) < end)
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	printf("nothing completed\n");
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "receive") == 0) {
		ud_qp();
		roce_v2_gid_index(ctx, argv[2], NULL);
		struct ibv_sge sge = { (uintptr_t)buf, sizeof buf, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_recv(qp, &rw, &bad));
		printf("qpn %u\n", qp->qp_num);
		fflush(stdout);
		struct ibv_wc wc = wait_wc();
		printf("wc status %d byte_len %u src_qp %#x payload %.*s\n", wc.status, wc.byte_len,
		       wc.src_qp, (int)wc.byte_len - 40, buf + 40);
		return wc.status;
	}
	CHECK(argc == 4 && strcmp(argv[1], "send") == 0);
	ud_qp();
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .sgid_index = (uint8_t)roce_v2_gid_index(ctx, argv[2], NULL),
					   .hop_limit = 64 } };
	struct in_addr peer;
	CHECK(inet_pton(AF_INET, argv[3], &peer) == 1);
	aa.grh.dgid.raw[10] = aa.grh.dgid.raw[11] = 0xff;
	memcpy(aa.grh.dgid.raw + 12, &peer, 4);
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah);
	strcpy(buf, "sent by rxe");
	struct ibv_sge sge = { (uintptr_t)buf, 11, mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = 0x77;
	w.wr.ud.remote_qkey = 0x11111111;
	CHECK(!ibv_post_send(qp, &w, &bad));
	struct ibv_wc wc = wait_wc();
	printf("rxe sent: status %d from qpn %#x\n", wc.status, qp->qp_num);
	return wc.status;
}
