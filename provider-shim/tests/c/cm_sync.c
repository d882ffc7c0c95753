/* librdmacm's synchronous mode as on the kernel's rxe (the same program passes there, with
 * CM_SYNC_HOST the address of its port): rdma_getaddrinfo's results and errors, endpoints
 * from rdma_create_ep, a request taken with rdma_get_request on another thread (its QP ready
 * in INIT with the access the connection gives), and rdma_disconnect, which waits until the
 * other side answers and leaves DISCONNECTED as id->event. Prints "cm_sync ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <signal.h>
#include <unistd.h>

#include "cm_common.h"

static struct rdma_cm_id *listen_id;
static int server_answers;

static void *server(void *arg)
{
	struct rdma_cm_id *id;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	struct ibv_wc wc;
	char buf[16] = { 0 };
	(void)arg;
	CHECK(rdma_get_request(listen_id, &id) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST && id->qp);
	CHECK(ibv_query_qp(id->qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS, &ia) == 0);
	/* The client reads (its initiator depth is the device's): reads and atomics let in. */
	CHECK(a.qp_state == IBV_QPS_INIT &&
	      a.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				    IBV_ACCESS_REMOTE_ATOMIC));
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof buf);
	CHECK(mr && rdma_post_recv(id, NULL, buf, sizeof buf, mr) == 0);
	CHECK(rdma_accept(id, NULL) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED);
	CHECK(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(wc.byte_len == 6 && strcmp(buf, "hello") == 0);
	/* The client disconnects meanwhile, and waits for this answer. */
	usleep(300 * 1000);
	__atomic_store_n(&server_answers, 1, __ATOMIC_SEQ_CST);
	CHECK(rdma_disconnect(id) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED);
	CHECK(rdma_dereg_mr(mr) == 0);
	rdma_destroy_ep(id);
	return NULL;
}

int main(void)
{
	const char *host = getenv("CM_SYNC_HOST") ? getenv("CM_SYNC_HOST") : "127.0.0.1";
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	struct rdma_cm_id *id;
	struct ibv_wc wc;
	pthread_t t;
	char msg[16] = "hello";

	fail_if_hung(30);
	/* Results say only whether they are passive; errors are getaddrinfo's own codes. */
	hints.ai_flags = RAI_NUMERICHOST;
	CHECK(rdma_getaddrinfo(host, "7487", &hints, &res) == 0);
	CHECK(res->ai_flags == 0 && res->ai_qp_type == IBV_QPT_RC && res->ai_dst_len == 16);
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo("not-a-number", "7487", &hints, &res) == EAI_NONAME);
	hints.ai_flags = RAI_PASSIVE;
	CHECK(rdma_getaddrinfo(host, "7487", &hints, &res) == 0);
	CHECK(res->ai_flags == RAI_PASSIVE && res->ai_src_len == 16 && res->ai_dst_len == 0);

	CHECK(rdma_create_ep(&listen_id, res, NULL, &attr) == 0 && listen_id->qp == NULL);
	rdma_freeaddrinfo(res);
	CHECK(rdma_listen(listen_id, 2) == 0);
	CHECK(pthread_create(&t, NULL, server, NULL) == 0);

	hints.ai_flags = 0;
	CHECK(rdma_getaddrinfo(host, "7487", &hints, &res) == 0);
	CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0 && id->qp);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
	rdma_freeaddrinfo(res);
	CHECK(rdma_connect(id, NULL) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED);
	struct ibv_mr *mr = rdma_reg_msgs(id, msg, sizeof msg);
	CHECK(mr && rdma_post_send(id, NULL, msg, 6, mr, 0) == 0);
	CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	/* Returns once the server answers, with the event that says so. */
	CHECK(rdma_disconnect(id) == 0);
	CHECK(__atomic_load_n(&server_answers, __ATOMIC_SEQ_CST) == 1);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(rdma_dereg_mr(mr) == 0);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	printf("cm_sync ok\n");
	return 0;
}
