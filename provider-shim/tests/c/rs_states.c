/* Each rsocket call on a stream rsocket in each state it can be in: for each (state, call) a
 * child process brings a fresh socket to the state, makes the call and prints one line (its
 * return, errno, and what it reads: an address, an option, poll events). The test compares
 * the lines with those recorded with librdmacm on the kernel's rxe (rs_states.rxe, made by
 * this program in the VM with RS_STATES_HOST its port's address and RS_STATES_SETTLE_MS 200,
 * how long a peer's close or shutdown is given to arrive). Left out: a send or receive
 * on a socket not connected, which crashes librdmacm 44 (the emulator says ENOTCONN), and a
 * send after SHUT_WR or after the peer closed, which librdmacm's makes while it has credits
 * (the emulator's fails, EPIPE and ECONNRESET: docs/rdma-cm.md). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static struct sockaddr_in to, any;
static int lfd = -1, sfd = -1, settle_ms = 250;

enum { CREATED, BOUND, LISTENING, CONNECTED, ACCEPTED, SHUT_WR_, SHUT_RD_, PEER_CLOSED, PEER_SHUT_WR, NSTATES };
static const char *sname[] = { "created", "bound", "listening", "connected", "accepted", "shut-wr",
	"shut-rd", "peer-closed", "peer-shut-wr" };
enum { C_BIND, C_LISTEN, C_CONNECT, C_ACCEPT, C_SHUTDOWN, C_SEND, C_RECV, C_SOCKNAME, C_PEERNAME,
       C_SOERROR, C_NODELAY, C_POLL, C_CLOSE, C_GETFL, C_RCVBUF, C_KEEPALIVE, C_PEEK, NCALLS };
static const char *cname[] = { "bind", "listen", "connect", "accept", "shutdown", "send", "recv",
	"sockname", "peername", "so_error", "nodelay", "poll", "close", "getfl", "rcvbuf",
	"keepalive", "peek" };

static void *acceptor(void *arg)
{
	(void)arg;
	sfd = raccept(lfd, NULL, NULL);
	return NULL;
}

static int connected_pair(int *client)
{
	pthread_t t;
	lfd = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(lfd >= 0);
	int one = 1;
	rsetsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(rbind(lfd, (struct sockaddr *)&to, sizeof to) == 0);
	CHECK(rlisten(lfd, 4) == 0);
	CHECK(pthread_create(&t, NULL, acceptor, NULL) == 0);
	*client = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(*client >= 0);
	CHECK(rconnect(*client, (struct sockaddr *)&to, sizeof to) == 0);
	pthread_join(t, NULL);
	CHECK(sfd >= 0);
	return sfd;
}

static int make(int s)
{
	int fd, other;
	switch (s) {
	case CREATED: CHECK((fd = rsocket(AF_INET, SOCK_STREAM, 0)) >= 0); return fd;
	case BOUND:
		CHECK((fd = rsocket(AF_INET, SOCK_STREAM, 0)) >= 0);
		CHECK(rbind(fd, (struct sockaddr *)&any, sizeof any) == 0);
		return fd;
	case LISTENING: {
		struct sockaddr_in l = to;
		l.sin_port = htons(7690);
		CHECK((fd = rsocket(AF_INET, SOCK_STREAM, 0)) >= 0);
		CHECK(rbind(fd, (struct sockaddr *)&l, sizeof l) == 0);
		CHECK(rlisten(fd, 4) == 0);
		return fd;
	}
	default: break;
	}
	other = connected_pair(&fd);
	switch (s) {
	case CONNECTED: return fd;
	case ACCEPTED: return other;
	case SHUT_WR_: CHECK(rshutdown(fd, SHUT_WR) == 0); return fd;
	case SHUT_RD_: CHECK(rshutdown(fd, SHUT_RD) == 0); return fd;
	case PEER_CLOSED: CHECK(rclose(other) == 0); usleep(settle_ms * 1000); return fd;
	case PEER_SHUT_WR: CHECK(rshutdown(other, SHUT_WR) == 0); usleep(settle_ms * 1000); return fd;
	}
	return -1;
}

/* `get`'s answer for `fd` (rgetsockname's or rgetpeername's), what it wrote described in
 * `extra`. */
static int named(int fd, int (*get)(int, struct sockaddr *, socklen_t *), char *extra, size_t n)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	int rc;
	memset(&a, 0, sizeof a);
	rc = get(fd, (struct sockaddr *)&a, &len);
	snprintf(extra, n, " len %u fam %d port %d", len, a.sin_family, a.sin_port != 0);
	return rc;
}

static int left_out(int s, int k)
{
	return ((s == CREATED || s == BOUND || s == LISTENING) &&
		(k == C_SEND || k == C_RECV || k == C_PEEK)) ||
	       ((s == SHUT_WR_ || s == PEER_CLOSED) && k == C_SEND);
}

static void one(int s, int k)
{
	int fd = make(s), rc, e, v = 0;
	socklen_t len;
	char buf[8] = "abcd", extra[96] = "";
	struct pollfd p;
	struct sockaddr_in to2 = to;
	to2.sin_port = htons(7691);
	errno = 0;
	switch (k) {
	case C_BIND: rc = rbind(fd, (struct sockaddr *)&any, sizeof any); break;
	case C_LISTEN: rc = rlisten(fd, 1); break;
	case C_CONNECT: {
		/* To a listener of its own (which accepts in a thread of its own, librdmacm's as
		 * the emulator's: rs_backlog.c; the thread that calls raccept is not needed). */
		pthread_t t;
		lfd = rsocket(AF_INET, SOCK_STREAM, 0);
		CHECK(lfd >= 0 && rbind(lfd, (struct sockaddr *)&to2, sizeof to2) == 0);
		CHECK(rlisten(lfd, 4) == 0 && pthread_create(&t, NULL, acceptor, NULL) == 0);
		rc = rconnect(fd, (struct sockaddr *)&to2, sizeof to2);
		(void)t; /* (left to wait: a socket connected already connects nothing) */
		break;
	}
	case C_ACCEPT:
		rfcntl(fd, F_SETFL, rfcntl(fd, F_GETFL) | O_NONBLOCK);
		rc = raccept(fd, NULL, NULL);
		break;
	case C_SHUTDOWN: rc = rshutdown(fd, SHUT_RDWR); break;
	case C_SEND: rc = rsend(fd, buf, 4, MSG_DONTWAIT); break;
	case C_RECV: rc = rrecv(fd, buf, 8, MSG_DONTWAIT); break;
	case C_SOCKNAME: rc = named(fd, rgetsockname, extra, sizeof extra); break;
	case C_PEERNAME: rc = named(fd, rgetpeername, extra, sizeof extra); break;
	case C_SOERROR:
		len = sizeof v;
		rc = rgetsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &len);
		snprintf(extra, sizeof extra, " value %d", v);
		break;
	case C_NODELAY: v = 1; rc = rsetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v); break;
	case C_POLL:
		p = (struct pollfd){ fd, POLLIN | POLLOUT, 0 };
		rc = rpoll(&p, 1, 0);
		snprintf(extra, sizeof extra, " revents %#x", p.revents);
		break;
	case C_CLOSE: rc = rclose(fd); break;
	case C_GETFL:
		rc = rfcntl(fd, F_GETFL);
		break;
	case C_RCVBUF:
		len = sizeof v;
		rc = rgetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &len);
		snprintf(extra, sizeof extra, " value %d len %u", v, len);
		break;
	case C_KEEPALIVE: v = 1; rc = rsetsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v); break;
	case C_PEEK: rc = rrecv(fd, buf, 8, MSG_PEEK | MSG_DONTWAIT); break;
	default: rc = -3;
	}
	e = rc < 0 ? errno : 0;
	printf("%-12s %-9s rc %d errno %d%s\n", sname[s], cname[k], rc, e, extra);
	fflush(stdout);
	_exit(0);
}

int main(int argc, char **argv)
{
	const char *host = getenv("RS_STATES_HOST") ? getenv("RS_STATES_HOST") : "127.0.0.1";
	if (getenv("RS_STATES_SETTLE_MS"))
		settle_ms = atoi(getenv("RS_STATES_SETTLE_MS"));
	setvbuf(stdout, NULL, _IONBF, 0);
	to = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(7689) };
	inet_pton(AF_INET, host, &to.sin_addr);
	any = to;
	any.sin_port = 0;
	for (int s = 0; s < NSTATES; s++) {
		if (argc > 1 && atoi(argv[1]) != s)
			continue;
		for (int k = 0; k < NCALLS; k++) {
			if (left_out(s, k))
				continue;
			pid_t pid = fork();
			int st;
			if (pid == 0) {
				alarm(10);
				one(s, k);
			}
			waitpid(pid, &st, 0);
			if (WIFSIGNALED(st))
				printf("%-12s %-9s %s\n", sname[s], cname[k],
				       WTERMSIG(st) == SIGALRM ? "hung" : strsignal(WTERMSIG(st)));
			else if (WEXITSTATUS(st))
				printf("%-12s %-9s exit %d\n", sname[s], cname[k], WEXITSTATUS(st));
		}
	}
	printf("rs_states ok\n");
	return 0;
}
