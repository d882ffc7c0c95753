/* Blocking waits and signals, as libibverbs and librdmacm read their channels: a signal whose
 * handler does not ask for restarts ends ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event with -1 and EINTR (qperf ends its tests with SIGALRM that way); with
 * SA_RESTART the wait goes on and takes the event that comes. A signal sent to the process
 * reaches the program's own threads, never the emulator's: blocked in the program, it waits for
 * its signalfd (tgtd reads its disk threads' SIGUSR2 so). Prints "signals ok". */
#include <dirent.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/time.h>
#include <unistd.h>

#include "common.h"

static volatile sig_atomic_t rang;

static void on_alarm(int sig)
{
	(void)sig;
	rang++;
}

/* SIGALRM in 50 ms, its handler restarting interrupted calls or not. */
static void alarm_soon(int restart)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = restart ? SA_RESTART : 0 };
	struct itimerval t = { .it_value = { .tv_usec = 50000 } };
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	CHECK(setitimer(ITIMER_REAL, &t, NULL) == 0);
}

/* After the alarm has rung (and been restarted through), makes the CQ's event. */
static void *complete_later(void *arg)
{
	struct side *s = arg;
	while (!rang)
		usleep(1000);
	usleep(20000);
	struct ibv_sge sge = { (uintptr_t)s->buf, 0, s->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(s->qp, &rwr, &rbad) == 0);
	/* A flush completes the receive: the QP to the error state. */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE) == 0);
	return NULL;
}

/* The threads of this process (the emulator's among them). */
static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;
	CHECK(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* SIGUSR2 blocked here and read from a signalfd, as tgtd does: every one sent to the process
 * waits there. Taken by a thread of the emulator's (where it is not blocked), its default
 * action would end the process. */
static void process_signals_reach_the_program(void)
{
	sigset_t set, old;
	struct signalfd_siginfo si;

	/* The emulator's threads run beside this one (the host fabric's reader at least). */
	CHECK(threads() > 1);
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	CHECK(pthread_sigmask(SIG_BLOCK, &set, &old) == 0);
	int fd = signalfd(-1, &set, SFD_CLOEXEC);
	CHECK(fd >= 0);
	for (int i = 0; i < 50; i++) {
		CHECK(kill(getpid(), SIGUSR2) == 0);
		CHECK(read(fd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo == SIGUSR2);
	}
	close(fd);
	CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct side s = { 0 };
	struct ibv_cq *cq;
	void *cq_ctx;
	struct ibv_async_event aev;

	CHECK(list && n >= 1);
	setup(&s, list[0]);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(s.ctx);
	CHECK(ch);
	struct ibv_cq *ecq = ibv_create_cq(s.ctx, 4, NULL, ch, 0);
	CHECK(ecq && ibv_req_notify_cq(ecq, 0) == 0);

	/* No restart: EINTR. */
	rang = 0;
	alarm_soon(0);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &cq, &cq_ctx) == -1 && errno == EINTR && rang == 1);
	alarm_soon(0);
	errno = 0;
	CHECK(ibv_get_async_event(s.ctx, &aev) == -1 && errno == EINTR && rang == 2);

	struct rdma_event_channel *cm = rdma_create_event_channel();
	struct rdma_cm_event *ev;
	CHECK(cm);
	alarm_soon(0);
	errno = 0;
	CHECK(rdma_get_cm_event(cm, &ev) == -1 && errno == EINTR && rang == 3);
	rdma_destroy_event_channel(cm);

	/* SA_RESTART: the wait goes on through the signal and takes the event made after it. */
	struct ibv_qp_init_attr init = { .send_cq = ecq, .recv_cq = ecq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(s.pd, &init);
	CHECK(qp);
	struct ibv_qp *old = s.qp;
	s.qp = qp;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == 0);
	rang = 0;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, complete_later, &s) == 0);
	alarm_soon(1);
	CHECK(ibv_get_cq_event(ch, &cq, &cq_ctx) == 0 && cq == ecq && rang == 1);
	CHECK(pthread_join(t, NULL) == 0);
	ibv_ack_cq_events(ecq, 1);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(ecq, 1, &wc) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR);

	CHECK(ibv_destroy_qp(qp) == 0);
	s.qp = old;
	CHECK(ibv_destroy_cq(ecq) == 0 && ibv_destroy_comp_channel(ch) == 0);
	process_signals_reach_the_program();
	printf("signals ok\n");
	return 0;
}
