/* A server and a client on librpma (Debian's librpma0, on librdmacm and libibverbs), whose
 * every result is checked: the server exposes 1 MiB of patterned memory through the
 * connection's private data; the client reads it all, writes into it and flushes (visibility),
 * writes one word atomically, writes 4 KiB with immediate data, reads the whole back, and
 * sends a message the server answers after checking its own memory. The server's receives
 * complete on a CQ of their own, which shares one completion channel with its send CQ.
 *
 *   rpma server ADDR PORT      rpma client ADDR PORT
 *
 * Each side prints "ok" as its last line when all its checks passed. */
#include <librpma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1 << 20)
#define WRITE_AT (128 << 10)
#define WRITE_LEN (64 << 10)
#define WORD_AT (512 << 10)
#define IMM_AT (768 << 10)
#define IMM_LEN 4096
#define IMM 0x5a5a5a5au /* the same in either byte order */
#define MSG 64

#define CHECK(call)                                                                      \
	do {                                                                             \
		int ret_ = (call);                                                       \
		if (ret_) {                                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
				rpma_err_2str(ret_));                                    \
			exit(1);                                                         \
		}                                                                        \
	} while (0)

#define FAIL(...)                                                                        \
	do {                                                                             \
		fprintf(stderr, __VA_ARGS__);                                            \
		fputc('\n', stderr);                                                     \
		exit(1);                                                                 \
	} while (0)

static uint8_t served(size_t i)
{
	return (uint8_t)(i * 7 + i / 251);
}

static uint8_t written(size_t i)
{
	return (uint8_t)(i * 13 + 5);
}

static const char word[8] = { 'a', 't', 'o', 'm', 'i', 'c', '!', '\n' };

/* What the server's memory holds once the client is done with it. */
static uint8_t expected(size_t i)
{
	if (i >= WRITE_AT && i < WRITE_AT + WRITE_LEN)
		return written(i - WRITE_AT);
	if (i >= WORD_AT && i < WORD_AT + 8)
		return (uint8_t)word[i - WORD_AT];
	if (i >= IMM_AT && i < IMM_AT + IMM_LEN)
		return written(i - IMM_AT + 1);
	return served(i);
}

static void *buffer(size_t len)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, len))
		FAIL("no memory");
	memset(p, 0, len);
	return p;
}

static void wait_event(struct rpma_conn *conn, enum rpma_conn_event want)
{
	enum rpma_conn_event ev;
	CHECK(rpma_conn_next_event(conn, &ev));
	if (ev != want)
		FAIL("event %s, expected %s", rpma_utils_conn_event_2str(ev),
		     rpma_utils_conn_event_2str(want));
}

/* Waits for the next completion on the connection's CQ and checks it is `op` for `ctx`. */
static void completed(struct rpma_conn *conn, enum ibv_wc_opcode op, const void *ctx)
{
	struct rpma_cq *cq;
	struct ibv_wc wc;
	int got = 0;
	CHECK(rpma_conn_get_cq(conn, &cq));
	for (;;) {
		int ret = rpma_cq_get_wc(cq, 1, &wc, &got);
		if (ret == RPMA_E_NO_COMPLETION) {
			CHECK(rpma_cq_wait(cq));
			continue;
		}
		CHECK(ret);
		break;
	}
	if (wc.status != IBV_WC_SUCCESS)
		FAIL("completion %s for %p", ibv_wc_status_str(wc.status), (void *)wc.wr_id);
	if (wc.opcode != op || (void *)(uintptr_t)wc.wr_id != ctx)
		FAIL("completion opcode %d for %p, expected %d for %p", wc.opcode,
		     (void *)(uintptr_t)wc.wr_id, op, ctx);
}

/* The next completion on the connection's receive CQ (`rcq`) or its CQ, waiting on the
 * completion channel the two share. */
static struct ibv_wc next_shared(struct rpma_conn *conn, int rcq)
{
	struct rpma_cq *cq;
	struct ibv_wc wc;
	int got = 0;
	CHECK(rcq ? rpma_conn_get_rcq(conn, &cq) : rpma_conn_get_cq(conn, &cq));
	for (;;) {
		int ret = rpma_cq_get_wc(cq, 1, &wc, &got);
		if (ret == RPMA_E_NO_COMPLETION) {
			struct rpma_cq *woke;
			bool is_rcq;
			CHECK(rpma_conn_wait(conn, 0, &woke, &is_rcq));
			continue;
		}
		CHECK(ret);
		if (wc.status != IBV_WC_SUCCESS)
			FAIL("completion %s", ibv_wc_status_str(wc.status));
		return wc;
	}
}

static int server(const char *addr, const char *port)
{
	struct ibv_context *ctx;
	struct rpma_peer *peer;
	struct rpma_mr_local *mr, *msg_mr;
	struct rpma_ep *ep;
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	uint8_t *mem = buffer(SIZE), *msg = buffer(2 * MSG);
	for (size_t i = 0; i < SIZE; i++)
		mem[i] = served(i);

	CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx));
	CHECK(rpma_peer_new(ctx, &peer));
	CHECK(rpma_mr_reg(peer, mem, SIZE,
			  RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST |
				  RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY,
			  &mr));
	CHECK(rpma_mr_reg(peer, msg, 2 * MSG, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &msg_mr));
	size_t desc_size;
	CHECK(rpma_mr_get_descriptor_size(mr, &desc_size));
	char desc[256];
	if (desc_size > sizeof(desc))
		FAIL("descriptor of %zu bytes", desc_size);
	CHECK(rpma_mr_get_descriptor(mr, desc));

	CHECK(rpma_ep_listen(peer, addr, port, &ep));
	printf("listening\n");
	fflush(stdout);
	struct rpma_conn_cfg *cfg;
	CHECK(rpma_conn_cfg_new(&cfg));
	CHECK(rpma_conn_cfg_set_rcq_size(cfg, 8));
	CHECK(rpma_conn_cfg_set_compl_channel(cfg, true));
	CHECK(rpma_ep_next_conn_req(ep, cfg, &req));
	/* The first receive is taken by the WRITE with immediate, the second by the message. */
	CHECK(rpma_conn_req_recv(req, msg_mr, 0, MSG, msg + 1));
	struct rpma_conn_private_data pdata = { desc, (uint8_t)desc_size };
	CHECK(rpma_conn_req_connect(&req, &pdata, &conn));
	CHECK(rpma_recv(conn, msg_mr, 0, MSG, msg));
	wait_event(conn, RPMA_CONN_ESTABLISHED);

	struct ibv_wc wc = next_shared(conn, 1);
	if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
	    wc.imm_data != IMM || wc.byte_len != IMM_LEN || wc.wr_id != (uintptr_t)(msg + 1))
		FAIL("WRITE with immediate: opcode %d flags %x imm %x len %u", wc.opcode,
		     wc.wc_flags, wc.imm_data, wc.byte_len);
	/* The client's message says it is done: the memory must hold what it wrote. */
	wc = next_shared(conn, 1);
	if (wc.opcode != IBV_WC_RECV || wc.wr_id != (uintptr_t)msg || wc.byte_len != MSG)
		FAIL("message: opcode %d len %u", wc.opcode, wc.byte_len);
	if (strcmp((char *)msg, "check"))
		FAIL("message \"%.*s\"", MSG, msg);
	for (size_t i = 0; i < SIZE; i++)
		if (mem[i] != expected(i))
			FAIL("server memory at %zu: %u, expected %u", i, mem[i], expected(i));
	strcpy((char *)msg + MSG, "checked");
	CHECK(rpma_send(conn, msg_mr, MSG, MSG, RPMA_F_COMPLETION_ALWAYS, msg + MSG));
	wc = next_shared(conn, 0);
	if (wc.opcode != IBV_WC_SEND || wc.wr_id != (uintptr_t)(msg + MSG))
		FAIL("answer: opcode %d", wc.opcode);

	wait_event(conn, RPMA_CONN_CLOSED);
	CHECK(rpma_conn_disconnect(conn));
	CHECK(rpma_conn_delete(&conn));
	CHECK(rpma_conn_cfg_delete(&cfg));
	CHECK(rpma_ep_shutdown(&ep));
	CHECK(rpma_mr_dereg(&msg_mr));
	CHECK(rpma_mr_dereg(&mr));
	CHECK(rpma_peer_delete(&peer));
	printf("ok\n");
	return 0;
}

static int client(const char *addr, const char *port)
{
	struct ibv_context *ctx;
	struct rpma_peer *peer;
	struct rpma_mr_local *mr, *msg_mr;
	struct rpma_mr_remote *remote;
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	uint8_t *mem = buffer(SIZE), *msg = buffer(2 * MSG);

	CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &ctx));
	CHECK(rpma_peer_new(ctx, &peer));
	CHECK(rpma_mr_reg(peer, mem, SIZE, RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC, &mr));
	CHECK(rpma_mr_reg(peer, msg, 2 * MSG, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &msg_mr));
	CHECK(rpma_conn_req_new(peer, addr, port, NULL, &req));
	CHECK(rpma_conn_req_recv(req, msg_mr, MSG, MSG, msg + MSG));
	CHECK(rpma_conn_req_connect(&req, NULL, &conn));
	wait_event(conn, RPMA_CONN_ESTABLISHED);

	struct rpma_conn_private_data pdata;
	CHECK(rpma_conn_get_private_data(conn, &pdata));
	CHECK(rpma_mr_remote_from_descriptor(pdata.ptr, pdata.len, &remote));
	size_t remote_size;
	CHECK(rpma_mr_remote_get_size(remote, &remote_size));
	if (remote_size != SIZE)
		FAIL("remote MR of %zu bytes", remote_size);

	/* The whole of the server's memory, in four READs, the last one completing. */
	for (size_t off = 0; off < SIZE; off += SIZE / 4) {
		int last = off + SIZE / 4 == SIZE;
		CHECK(rpma_read(conn, mr, off, remote, off, SIZE / 4,
				last ? RPMA_F_COMPLETION_ALWAYS : RPMA_F_COMPLETION_ON_ERROR, mem));
	}
	completed(conn, IBV_WC_RDMA_READ, mem);
	for (size_t i = 0; i < SIZE; i++)
		if (mem[i] != served(i))
			FAIL("read at %zu: %u, expected %u", i, mem[i], served(i));

	/* A WRITE made visible by a flush, then one atomic word. */
	for (size_t i = 0; i < WRITE_LEN; i++)
		mem[i] = written(i);
	CHECK(rpma_write(conn, remote, WRITE_AT, mr, 0, WRITE_LEN, RPMA_F_COMPLETION_ON_ERROR,
			 NULL));
	CHECK(rpma_flush(conn, remote, WRITE_AT, WRITE_LEN, RPMA_FLUSH_TYPE_VISIBILITY,
			 RPMA_F_COMPLETION_ALWAYS, mem + 1));
	completed(conn, IBV_WC_RDMA_READ, mem + 1); /* a flush without native FLUSH is a READ */
	CHECK(rpma_atomic_write(conn, remote, WORD_AT, word, RPMA_F_COMPLETION_ALWAYS, mem + 2));
	completed(conn, IBV_WC_RDMA_WRITE, mem + 2);
	for (size_t i = 0; i < IMM_LEN; i++)
		mem[i] = written(i + 1);
	CHECK(rpma_write_with_imm(conn, remote, IMM_AT, mr, 0, IMM_LEN, RPMA_F_COMPLETION_ALWAYS,
				  IMM, mem + 4));
	completed(conn, IBV_WC_RDMA_WRITE, mem + 4);

	memset(mem, 0, SIZE);
	CHECK(rpma_read(conn, mr, 0, remote, 0, SIZE, RPMA_F_COMPLETION_ALWAYS, mem + 3));
	completed(conn, IBV_WC_RDMA_READ, mem + 3);
	for (size_t i = 0; i < SIZE; i++)
		if (mem[i] != expected(i))
			FAIL("read back at %zu: %u, expected %u", i, mem[i], expected(i));

	strcpy((char *)msg, "check");
	CHECK(rpma_send(conn, msg_mr, 0, MSG, RPMA_F_COMPLETION_ALWAYS, msg));
	/* The SEND's completion and the answer's receive, in either order. */
	struct rpma_cq *cq;
	CHECK(rpma_conn_get_cq(conn, &cq));
	int sent = 0, answered = 0;
	while (!sent || !answered) {
		struct ibv_wc wc;
		int got = 0, ret = rpma_cq_get_wc(cq, 1, &wc, &got);
		if (ret == RPMA_E_NO_COMPLETION) {
			CHECK(rpma_cq_wait(cq));
			continue;
		}
		CHECK(ret);
		if (wc.status != IBV_WC_SUCCESS)
			FAIL("completion %s", ibv_wc_status_str(wc.status));
		if (wc.opcode == IBV_WC_SEND && (void *)(uintptr_t)wc.wr_id == msg)
			sent = 1;
		else if (wc.opcode == IBV_WC_RECV && (void *)(uintptr_t)wc.wr_id == msg + MSG)
			answered = 1;
		else
			FAIL("completion opcode %d", wc.opcode);
	}
	if (strcmp((char *)msg + MSG, "checked"))
		FAIL("answer \"%.*s\"", MSG, msg + MSG);

	CHECK(rpma_conn_disconnect(conn));
	wait_event(conn, RPMA_CONN_CLOSED);
	CHECK(rpma_conn_delete(&conn));
	CHECK(rpma_mr_remote_delete(&remote));
	CHECK(rpma_mr_dereg(&msg_mr));
	CHECK(rpma_mr_dereg(&mr));
	CHECK(rpma_peer_delete(&peer));
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		FAIL("usage: %s server|client ADDR PORT", argv[0]);
	if (!strcmp(argv[1], "server"))
		return server(argv[2], argv[3]);
	if (!strcmp(argv[1], "client"))
		return client(argv[2], argv[3]);
	FAIL("usage: %s server|client ADDR PORT", argv[0]);
}
