/* librdmacm on the emulator, in one process: an RC connection through an event channel, the
 * contexts ids get being rdma_get_devices', and bad input answered with librdmacm's -1 and
 * errno, never a crash. Prints "cm ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cm_common.h"

/* A client id on `ch` whose route to 127.0.0.1:port is resolved. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, int port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in dst = addr("127.0.0.1", port);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	return id;
}

static struct ibv_qp_init_attr qp_attr(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return a;
}

int main(void)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen, *client, *conn, *other, *bogus = (struct rdma_cm_id *)&main;
	struct rdma_cm_event *ev;
	struct sockaddr_in any = addr("127.0.0.1", 7471), nowhere = addr("192.0.2.1", 1);
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7 };
	struct ibv_context **devs;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp_init_attr init;
	char big[64] = { 0 };
	int n, flags;

	CHECK(ch = rdma_create_event_channel());
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);

	/* Bad handles and arguments. */
	errno = 0;
	CHECK(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);
	CHECK(rdma_create_id(ch, &other, NULL, 12345) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(NULL) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(bogus) == -1 && errno == EINVAL);
	CHECK(rdma_listen(bogus, 1) == -1 && errno == EINVAL);
	CHECK(rdma_get_cm_event(ch, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_ack_cm_event(NULL) == -1 && errno == EINVAL);
	flags = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);
	CHECK(fcntl(ch->fd, F_SETFL, flags) == 0);

	/* Ports and states. */
	/* Not bound: rdma_listen binds the wildcard and a port of the system's choosing (rxe). */
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_listen(listen, 1) == 0 && rdma_get_src_port(listen) != 0);
	CHECK(rdma_destroy_id(listen) == 0);
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&nowhere) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&any) == 0);
	CHECK(ntohs(rdma_get_src_port(listen)) == 7471);
	CHECK(rdma_create_id(ch, &other, NULL, RDMA_PS_TCP) == 0);
	/* A wildcard twice: EADDRNOTAVAIL, as Linux answers (EADDRINUSE is for one address twice). */
	CHECK(rdma_bind_addr(other, (struct sockaddr *)&any) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_resolve_route(other, 100) == -1 && errno == EINVAL);
	CHECK(rdma_connect(other, &p) == -1 && errno == EINVAL);
	{
		/* Options: sizes checked, reuse only before the bind, unknown ones ENOSYS. */
		uint8_t tos = 32, timeout = 18;
		int on = 1;
		CHECK(rdma_set_option(other, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0);
		CHECK(rdma_set_option(other, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4) == -1 &&
		      errno == EINVAL);
		CHECK(rdma_set_option(other, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout,
				      1) == 0);
		CHECK(rdma_set_option(listen, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on,
				      sizeof on) == -1 && errno == EINVAL);
		CHECK(rdma_set_option(other, RDMA_OPTION_ID, 99, &on, sizeof on) == -1 &&
		      errno == ENOSYS);
		CHECK(rdma_set_option(other, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, NULL, 1) == -1 &&
		      errno == EINVAL);
	}
	CHECK(rdma_listen(listen, 4) == 0);
	CHECK(rdma_listen(listen, 4) == -1 && errno == EINVAL);
	CHECK(rdma_accept(listen, &p) == -1 && errno == EINVAL);
	CHECK(rdma_reject(listen, NULL, 0) == -1 && errno == EINVAL);
	/* A listener on a device takes a disconnection it has nothing to end (as on rxe). */
	CHECK(rdma_disconnect(listen) == 0);
	CHECK(rdma_resolve_addr(other, NULL, (struct sockaddr *)&nowhere, 100) == 0);
	ev = next(ch, RDMA_CM_EVENT_ADDR_ERROR);
	CHECK(ev->status < 0 && ev->id == other);
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(other) == 0);

	/* rdma_migrate_id: a synchronous id (made without a channel) keeps its last event as
	 * id->event; moved to a channel, it lets go of it (as librdmacm), and an event it had not
	 * read goes along. */
	{
		struct rdma_cm_id *sync;
		struct rdma_event_channel *own;
		struct sockaddr_in dst = addr("127.0.0.1", 7471);
		CHECK(rdma_create_id(NULL, &sync, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(sync, NULL, (struct sockaddr *)&dst, 2000) == 0);
		CHECK(sync->event && sync->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
		/* Synchronous already: librdmacm refuses to make it so again. */
		CHECK(rdma_migrate_id(sync, NULL) == -1 && errno == EINVAL);
		CHECK(sync->event && sync->channel);
		CHECK(own = rdma_create_event_channel());
		CHECK(rdma_migrate_id(sync, ch) == 0);
		CHECK(sync->event == NULL && sync->channel == ch);
		CHECK(rdma_resolve_route(sync, 2000) == 0);
		CHECK(rdma_migrate_id(sync, own) == 0 && sync->channel == own);
		ev = next(own, RDMA_CM_EVENT_ROUTE_RESOLVED);
		CHECK(ev->id == sync);
		rdma_ack_cm_event(ev);
		CHECK(rdma_migrate_id(bogus, own) == -1 && errno == EINVAL);
		CHECK(rdma_destroy_id(sync) == 0);
		rdma_destroy_event_channel(own);
	}

	/* Multicast: datagram ids only, complete attributes, groups joined before leaving. */
	struct sockaddr_in grp = addr("239.9.9.9", 0);
	CHECK(rdma_join_multicast(listen, (struct sockaddr *)&grp, NULL) == -1 && errno == EINVAL);
	struct rdma_cm_id *ud;
	CHECK(rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_resolve_addr(ud, NULL, (struct sockaddr *)&grp, 100) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	struct rdma_cm_join_mc_attr_ex mx = { .comp_mask = 1 << 5, .addr = (struct sockaddr *)&grp };
	CHECK(rdma_join_multicast_ex(ud, &mx, NULL) == -1 && errno == ENOTSUP);
	mx.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
	CHECK(rdma_join_multicast_ex(ud, &mx, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_leave_multicast(ud, (struct sockaddr *)&grp) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_join_multicast(ud, (struct sockaddr *)&grp, &grp) == 0);
	ev = next(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
	CHECK(ev->id == ud && ev->param.ud.private_data == &grp && ev->param.ud.qp_num == 0xffffff);
	rdma_ack_cm_event(ev);
	CHECK(rdma_leave_multicast(ud, (struct sockaddr *)&grp) == 0);
	CHECK(rdma_destroy_id(ud) == 0);

	/* A join attaches the id's UD QP under the group's GID and LID (an InfiniBand MLID on
	 * the full profile), which keeps the QP from being destroyed; the leave detaches that
	 * very pair. */
	{
		struct rdma_cm_id *uq;
		CHECK(rdma_create_id(ch, &uq, NULL, RDMA_PS_UDP) == 0);
		CHECK(rdma_resolve_addr(uq, NULL, (struct sockaddr *)&grp, 100) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		struct ibv_pd *upd = ibv_alloc_pd(uq->verbs);
		struct ibv_cq *ucq = ibv_create_cq(uq->verbs, 8, NULL, NULL, 0);
		struct ibv_qp_init_attr qa = { .send_cq = ucq, .recv_cq = ucq, .qp_type = IBV_QPT_UD,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
		CHECK(upd && ucq && rdma_create_qp(uq, upd, &qa) == 0);
		CHECK(rdma_join_multicast(uq, (struct sockaddr *)&grp, NULL) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_MULTICAST_JOIN));
		struct ibv_qp *q = uq->qp;
		CHECK(ibv_destroy_qp(q) == EBUSY);
		CHECK(rdma_leave_multicast(uq, (struct sockaddr *)&grp) == 0);
		CHECK(ibv_destroy_qp(q) == 0);
		uq->qp = NULL;
		CHECK(rdma_destroy_id(uq) == 0);
		CHECK(ibv_destroy_cq(ucq) == 0 && ibv_dealloc_pd(upd) == 0);
	}

	/* The ids' contexts are rdma_get_devices'. */
	CHECK(devs = rdma_get_devices(&n));
	CHECK(n == 2 && devs[0] && devs[1] && !devs[2]);
	CHECK(listen->verbs == devs[0]);

	/* A connection, both ends in this process. */
	client = resolved(ch, 7471);
	CHECK(client->verbs == devs[0] && client->port_num == 1);
	/* The route's path, as librdmacm reads it from the kernel's CM; the listener has none. */
	CHECK(client->route.num_paths == 1 && client->route.path_rec && listen->route.num_paths == 0);
	CHECK(client->route.path_rec->packet_life_time == 18 && client->route.path_rec->mtu_selector == 2);
	CHECK(client->route.path_rec->pkey == htobe16(0xffff) && client->route.path_rec->numb_path == 1);
	CHECK(memcmp(&client->route.addr.addr.ibaddr.dgid, &client->route.path_rec->dgid, 16) == 0);
	CHECK(pd = ibv_alloc_pd(client->verbs));
	CHECK(cq = ibv_create_cq(client->verbs, 16, NULL, NULL, 0));
	init = qp_attr(cq);
	/* A PD that is no PD (here the channel) is refused, not read through. */
	errno = 0;
	CHECK(rdma_create_qp(client, (struct ibv_pd *)ch, &init) == -1 && errno == EINVAL);
	CHECK(rdma_create_qp(client, (struct ibv_pd *)(uintptr_t)8, &init) == -1 && errno == EINVAL);
	CHECK(!client->qp);
	CHECK(rdma_create_qp(client, pd, &init) == 0 && client->qp);
	p.private_data = big;
	p.private_data_len = 57;
	CHECK(rdma_connect(client, &p) == -1 && errno == EINVAL);
	p.private_data = "hello";
	p.private_data_len = 6;
	CHECK(rdma_connect(client, &p) == 0);
	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == listen && ev->id != listen);
	CHECK(ev->param.conn.private_data_len == 56 && strcmp(ev->param.conn.private_data, "hello") == 0);
	CHECK(ev->param.conn.qp_num == client->qp->qp_num);
	conn = ev->id;
	rdma_ack_cm_event(ev);
	CHECK(conn->verbs == devs[0] && conn->route.num_paths == 1);
	/* rdma_init_qp_attr: what the connection will give the QP. */
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	int qmask = 0;
	CHECK(rdma_init_qp_attr(conn, &qa, &qmask) == 0);
	CHECK(qa.dest_qp_num == client->qp->qp_num && (qmask & IBV_QP_DEST_QPN) && (qmask & IBV_QP_AV));
	qa.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(conn, &qa, &qmask) == 0 && qa.port_num == 1);
	CHECK(qmask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
	qa.qp_state = IBV_QPS_SQD;
	CHECK(rdma_init_qp_attr(conn, &qa, &qmask) == -1 && errno == EINVAL);
	CHECK(rdma_init_qp_attr(conn, NULL, &qmask) == -1 && errno == EINVAL);
	CHECK(rdma_init_qp_attr(bogus, &qa, &qmask) == -1 && errno == EINVAL);
	CHECK(rdma_connect(conn, &p) == -1 && errno == EINVAL);
	/* The server's QP through rdma_create_qp_ex: the PD in the extended attributes. */
	init = qp_attr(cq);
	struct ibv_qp_init_attr_ex ax = { .send_cq = cq, .recv_cq = cq, .cap = init.cap,
					  .qp_type = IBV_QPT_RC, .comp_mask = IBV_QP_INIT_ATTR_PD,
					  .pd = pd };
	CHECK(rdma_create_qp_ex(conn, &ax) == 0 && conn->qp && conn->qp->pd == pd);
	CHECK(conn->qp->state == IBV_QPS_INIT);
	CHECK(rdma_create_qp_ex(conn, &ax) == -1 && errno == EINVAL); /* it has one */
	CHECK(rdma_create_qp_ex(conn, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_notify(conn, IBV_EVENT_COMM_EST) == -1 && errno == EINVAL); /* not accepted */
	CHECK(rdma_accept(conn, NULL) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
	CHECK(rdma_notify(conn, IBV_EVENT_COMM_EST) == -1 && errno == EISCONN);
	CHECK(rdma_notify(conn, IBV_EVENT_PATH_MIG) == -1 && errno == EINVAL);
	CHECK(client->qp->state == IBV_QPS_RTS);
	/* The server hears the client's DREQ; the client hears once the server answers. Again
	 * is no error. */
	CHECK(rdma_disconnect(client) == 0);
	CHECK(rdma_disconnect(client) == 0);
	ev = next(ch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(ev->id == conn);
	rdma_ack_cm_event(ev);
	CHECK(rdma_disconnect(conn) == 0);
	ev = next(ch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(ev->id == client);
	rdma_ack_cm_event(ev);
	CHECK(rdma_disconnect(conn) == 0);

	/* Nobody listens there: the CM's "invalid service ID". */
	other = resolved(ch, 9);
	CHECK(rdma_connect(other, NULL) == 0);
	ev = next(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(ev->status == 8);
	rdma_ack_cm_event(ev);

	/* An SRQ through the CM: the QP rdma_create_qp makes next takes the id's SRQ, and a
	 * receive posted there takes the client's SEND. ECE: what the REQ offered. */
	{
		int full = strcmp(getenv("RDMA_EMU_PROFILE"), "full") == 0;
		struct rdma_cm_id *c2 = resolved(ch, 7471), *s2;
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
		struct ibv_srq_init_attr_ex sx = { .attr = sa.attr };
		struct ibv_ece ece = { .vendor_id = 0xffffff, .options = 1 };
		char buf[64] = "through the srq";
		struct ibv_mr *mr;
		struct ibv_wc wc;
		CHECK(mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE));
		init = qp_attr(cq);
		CHECK(rdma_create_qp(c2, pd, &init) == 0);
		CHECK(rdma_set_local_ece(c2, &ece) == -1 && errno == EINVAL); /* its QP's */
		CHECK(rdma_get_remote_ece(c2, &ece) == -1 && errno == EINVAL);
		CHECK(rdma_set_local_ece(NULL, &ece) == -1 && errno == EINVAL);
		CHECK(rdma_connect(c2, NULL) == 0);
		ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		s2 = ev->id;
		rdma_ack_cm_event(ev);
		CHECK(rdma_get_remote_ece(s2, &ece) == 0 && ece.comp_mask == 0);
		CHECK(full ? ece.vendor_id == 0xffffff && ece.options == 3 : ece.vendor_id == 0);
		CHECK(rdma_create_srq_ex(s2, &sx) == -1 && errno == EINVAL); /* no type */
		CHECK(rdma_create_srq(s2, pd, &sa) == 0 && s2->srq);
		CHECK(rdma_create_qp(s2, pd, &init) == 0 && s2->qp->srq == s2->srq);
		struct ibv_sge sge = { .addr = (uintptr_t)buf + 32, .length = 32, .lkey = mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad_r;
		CHECK(ibv_post_srq_recv(s2->srq, &rwr, &bad_r) == 0);
		CHECK(rdma_accept(s2, NULL) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
		struct ibv_sge ssge = { .addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 8, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad_s;
		CHECK(ibv_post_send(c2->qp, &swr, &bad_s) == 0);
		for (int got = 0; got < 2;) {
			int k = ibv_poll_cq(cq, 1, &wc);
			CHECK(k >= 0);
			if (k == 0)
				continue;
			CHECK(wc.status == IBV_WC_SUCCESS);
			if (wc.wr_id == 7)
				CHECK(wc.byte_len == 16 && wc.qp_num == s2->qp->qp_num);
			got++;
		}
		CHECK(strcmp(buf + 32, "through the srq") == 0);
		CHECK(rdma_disconnect(c2) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED));
		CHECK(rdma_disconnect(s2) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED));
		rdma_destroy_qp(s2);
		rdma_destroy_srq(s2);
		CHECK(s2->srq == NULL);
		CHECK(rdma_destroy_id(s2) == 0);
		rdma_destroy_qp(c2);
		CHECK(rdma_destroy_id(c2) == 0);

		/* Refusing the options: the client sees reason 35 (vendor option not supported). */
		c2 = resolved(ch, 7471);
		ece = (struct ibv_ece){ .vendor_id = 0x02c9, .options = 1 };
		CHECK(rdma_set_local_ece(c2, &ece) == 0); /* no QP: any vendor's */
		CHECK(rdma_connect(c2, &(struct rdma_conn_param){ .qp_num = 0x99 }) == 0);
		ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		s2 = ev->id;
		rdma_ack_cm_event(ev);
		CHECK(rdma_reject_ece(s2, "ece", 4) == 0);
		ev = next(ch, RDMA_CM_EVENT_REJECTED);
		CHECK(ev->id == c2 && ev->status == 35 && strcmp(ev->param.conn.private_data, "ece") == 0);
		rdma_ack_cm_event(ev);
		CHECK(rdma_destroy_id(s2) == 0 && rdma_destroy_id(c2) == 0);
		CHECK(ibv_dereg_mr(mr) == 0);
	}

	/* A QP moved to another id by writing id->qp, as DAPL accepts: the server makes its QP
	 * on an id of its own on the listener's device, gives it to the request's id, destroys
	 * the first, and accepts: rdma_accept takes that QP to RTS, connected to the client's,
	 * and rdma_disconnect to the error state, as librdmacm reads id->qp at each call. */
	{
		struct rdma_cm_id *c3 = resolved(ch, 7471), *s3, *ep;
		struct sockaddr_in local = addr("127.0.0.1", 0);
		struct ibv_qp_attr qa3;
		struct ibv_qp_init_attr qi3;
		init = qp_attr(cq);
		CHECK(rdma_create_qp(c3, pd, &init) == 0);
		CHECK(rdma_create_id(ch, &ep, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_bind_addr(ep, (struct sockaddr *)&local) == 0);
		CHECK(rdma_create_qp(ep, pd, &init) == 0);
		struct ibv_qp *moved = ep->qp;
		CHECK(rdma_connect(c3, NULL) == 0);
		ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		s3 = ev->id;
		rdma_ack_cm_event(ev);
		CHECK(s3->verbs == ep->verbs && s3->port_num == ep->port_num);
		s3->qp = moved;
		ep->qp = NULL;
		CHECK(rdma_destroy_id(ep) == 0);
		CHECK(rdma_accept(s3, NULL) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
		CHECK(ibv_query_qp(moved, &qa3, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi3) == 0);
		CHECK(qa3.qp_state == IBV_QPS_RTS && qa3.dest_qp_num == c3->qp->qp_num);
		CHECK(moved->state == IBV_QPS_RTS && c3->qp->state == IBV_QPS_RTS);
		CHECK(ibv_query_qp(c3->qp, &qa3, IBV_QP_DEST_QPN, &qi3) == 0);
		CHECK(qa3.dest_qp_num == moved->qp_num);
		CHECK(rdma_disconnect(s3) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED));
		CHECK(ibv_query_qp(moved, &qa3, IBV_QP_STATE, &qi3) == 0);
		CHECK(qa3.qp_state == IBV_QPS_ERR);
		CHECK(rdma_disconnect(c3) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED));
		rdma_destroy_qp(s3);
		rdma_destroy_qp(c3);
		CHECK(rdma_destroy_id(s3) == 0 && rdma_destroy_id(c3) == 0);
	}

	/* What a rejection leaves (as on rxe): the client's QP in the error state (cached too)
	 * and its id in its connect state, where connecting or resolving again is EINVAL; each
	 * id takes a disconnection with nothing to end (0, no event), its QP to the error state.
	 * An id that never connected refuses one, its QP still moved (librdmacm moves it first). */
	{
		struct rdma_cm_id *c4 = resolved(ch, 7471), *s4, *c5;
		struct sockaddr_in to = addr("127.0.0.1", 7471);
		init = qp_attr(cq);
		CHECK(rdma_create_qp(c4, pd, &init) == 0);
		CHECK(rdma_connect(c4, &p) == 0);
		ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		s4 = ev->id;
		rdma_ack_cm_event(ev);
		CHECK(rdma_create_qp(s4, pd, &init) == 0);
		CHECK(rdma_reject(s4, NULL, 0) == 0);
		CHECK(s4->qp->state == IBV_QPS_INIT);
		CHECK(rdma_disconnect(s4) == 0 && s4->qp->state == IBV_QPS_ERR);
		CHECK(rdma_reject(s4, NULL, 0) == -1 && errno == EINVAL);
		ev = next(ch, RDMA_CM_EVENT_REJECTED);
		CHECK(ev->id == c4 && ev->status == 28 && c4->qp->state == IBV_QPS_ERR);
		rdma_ack_cm_event(ev);
		CHECK(rdma_resolve_route(c4, 2000) == -1 && errno == EINVAL);
		CHECK(rdma_resolve_addr(c4, NULL, (struct sockaddr *)&to, 2000) == -1 && errno == EINVAL);
		CHECK(rdma_connect(c4, &p) == -1 && errno == EINVAL);
		CHECK(rdma_disconnect(c4) == 0 && rdma_disconnect(c4) == 0);
		c5 = resolved(ch, 7471);
		CHECK(rdma_create_qp(c5, pd, &init) == 0);
		CHECK(rdma_disconnect(c5) == -1 && errno == EINVAL && c5->qp->state == IBV_QPS_ERR);
		flags = fcntl(ch->fd, F_GETFL);
		CHECK(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
		CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);
		CHECK(fcntl(ch->fd, F_SETFL, flags) == 0);
		rdma_destroy_qp(s4);
		rdma_destroy_qp(c4);
		rdma_destroy_qp(c5);
		CHECK(rdma_destroy_id(s4) == 0 && rdma_destroy_id(c4) == 0 && rdma_destroy_id(c5) == 0);
	}

	/* The device hot-unplugged (the emulator's device-removal fault): each id on it hears
	 * DEVICE_REMOVAL, once; a removed id can only be destroyed. */
	{
		int (*set_faults)(struct ibv_context *, const char *) =
			dlsym(RTLD_DEFAULT, "rdma_emu_set_faults");
		struct rdma_cm_id *on_emu0[] = { listen, client, conn, other };
		int heard[4] = { 0 };
		CHECK(set_faults && set_faults(client->verbs, "device-removal:dev=emu0") == 0);
		for (int i = 0; i < 4; i++) {
			ev = next(ch, RDMA_CM_EVENT_DEVICE_REMOVAL);
			CHECK(ev->status == 0);
			for (int k = 0; k < 4; k++)
				heard[k] += ev->id == on_emu0[k];
			rdma_ack_cm_event(ev);
		}
		CHECK(heard[0] == 1 && heard[1] == 1 && heard[2] == 1 && heard[3] == 1);
		CHECK(rdma_disconnect(conn) == -1 && errno == EINVAL);
		CHECK(rdma_connect(other, NULL) == -1 && errno == EINVAL);
		CHECK(client->qp->state == IBV_QPS_ERR);
		CHECK(set_faults(client->verbs, NULL) == 0);
	}

	rdma_destroy_qp(client);
	rdma_destroy_qp(conn);
	CHECK(rdma_destroy_id(other) == 0 && rdma_destroy_id(client) == 0);
	CHECK(rdma_destroy_id(conn) == 0 && rdma_destroy_id(listen) == 0);
	CHECK(rdma_destroy_id(listen) == -1 && errno == EINVAL);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0);
	rdma_free_devices(devs);
	rdma_destroy_event_channel(ch);
	printf("cm ok\n");
	return 0;
}
