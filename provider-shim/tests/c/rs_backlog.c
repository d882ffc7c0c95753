/* A listener's backlog, in one thread: librdmacm's rsockets accept each connection request in
 * a thread of their own (the listen service), so an rconnect completes before the server
 * calls raccept, as with TCP, and a thread may connect to its own listener. Each step prints
 * one line; the test compares them with those recorded with librdmacm on the kernel's rxe
 * (rs_backlog.rxe, made by this program in the VM with RS_BACKLOG_HOST its port's address).
 * Left out: a connection accepted and never taken when its listener closes, which librdmacm
 * leaves connected with no socket to end it (the emulator ends it: docs/rdma-cm.md). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static struct sockaddr_in to;

/* The line of a call: its return and errno. */
static void said(const char *what, int rc)
{
	printf("%-28s rc %d errno %d\n", what, rc < 0 ? -1 : rc, rc < 0 ? errno : 0);
}

static int client(void)
{
	int c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0);
	said("rconnect", rconnect(c, (struct sockaddr *)&to, sizeof to));
	return c;
}

/* Polls `fd` for POLLIN for up to `ms`: the count and the events. */
static void polled(const char *what, int fd, int ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int rc = rpoll(&p, 1, ms);
	printf("%-28s rc %d revents %#x\n", what, rc, p.revents);
}

/* Accepts, and reads what client `c` sent first (`sent`); the peer must be `c`. */
static int accepted(int l, int c, const char *sent)
{
	struct sockaddr_in peer, mine;
	socklen_t plen = sizeof peer, mlen = sizeof mine;
	char buf[16] = "";
	int s = raccept(l, (struct sockaddr *)&peer, &plen);
	said("raccept", s < 0 ? s : 0);
	CHECK(s >= 0);
	CHECK(rgetsockname(c, (struct sockaddr *)&mine, &mlen) == 0);
	size_t n = strlen(sent);
	ssize_t got = rrecv(s, buf, n, MSG_WAITALL);
	printf("%-28s %zd bytes, %s, its client's\n", "rrecv", got,
	       got == (ssize_t)n && !memcmp(buf, sent, n) ? "as sent" : "not as sent");
	CHECK(peer.sin_port == mine.sin_port);
	return s;
}

/* Across processes (RS_BACKLOG_ACROSS set; the emulator's processes then share a host
 * fabric): the server listens, then waits on a pipe, outside any rsocket call, until the
 * client connected and sent; only then it accepts. */
static void across(void)
{
	int ready[2], go[2], status = -1;
	char b = 0, buf[8] = "";
	CHECK(pipe(ready) == 0 && pipe(go) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int one = 1, l = rsocket(AF_INET, SOCK_STREAM, 0);
		rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		CHECK(l >= 0 && rbind(l, (struct sockaddr *)&to, sizeof to) == 0);
		CHECK(rlisten(l, 8) == 0 && write(ready[1], &b, 1) == 1);
		CHECK(read(go[0], &b, 1) == 1);
		int s = raccept(l, NULL, NULL);
		CHECK(s >= 0 && rrecv(s, buf, 6, MSG_WAITALL) == 6 && !memcmp(buf, "across", 6));
		CHECK(rsend(s, "ok", 2, 0) == 2 && rrecv(s, buf, 1, 0) == 0);
		CHECK(rclose(s) == 0 && rclose(l) == 0);
		_exit(0);
	}
	CHECK(read(ready[0], &b, 1) == 1);
	int c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0);
	said("across rconnect", rconnect(c, (struct sockaddr *)&to, sizeof to));
	said("across rsend before raccept", rsend(c, "across", 6, 0));
	CHECK(write(go[1], &b, 1) == 1);
	said("across rrecv", rrecv(c, buf, 2, MSG_WAITALL));
	said("across rclose", rclose(c));
	waitpid(pid, &status, 0);
	printf("%-28s %s\n", "across server", WIFEXITED(status) && !WEXITSTATUS(status) ? "ok" : "failed");
}

int main(void)
{
	const char *host = getenv("RS_BACKLOG_HOST") ? getenv("RS_BACKLOG_HOST") : "127.0.0.1";
	int one = 1, l, c1, c2, c3, s1, s2;
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(30);
	to = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(7696) };
	inet_pton(AF_INET, host, &to.sin_addr);
	/* First: librdmacm's child of a process that used a device cannot use it (EACCES). */
	if (getenv("RS_BACKLOG_ACROSS"))
		across();
	to.sin_port = htons(7695);

	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(rbind(l, (struct sockaddr *)&to, sizeof to) == 0);
	CHECK(rlisten(l, 8) == 0);

	/* Connected to a listener nobody accepts on: the service does. */
	c1 = client();
	said("rsend before raccept", rsend(c1, "early", 5, 0));
	polled("rpoll listener", l, 5000);
	s1 = accepted(l, c1, "early");
	said("rsend back", rsend(s1, "back", 4, 0));
	char buf[8];
	said("rrecv back", rrecv(c1, buf, 4, MSG_WAITALL));

	/* Nothing more waits. */
	CHECK(rfcntl(l, F_SETFL, rfcntl(l, F_GETFL) | O_NONBLOCK) == 0);
	said("raccept non-blocking", raccept(l, NULL, NULL));
	polled("rpoll listener, none", l, 0);

	/* Two more, taken in the order they came. */
	c2 = client();
	said("rsend c2", rsend(c2, "two", 3, 0));
	c3 = client();
	said("rsend c3", rsend(c3, "three", 5, 0));
	polled("rpoll listener, two", l, 5000);
	s2 = accepted(l, c2, "two");
	polled("rpoll listener, one", l, 0);
	int s3 = accepted(l, c3, "three");
	said("raccept non-blocking", raccept(l, NULL, NULL));

	said("rclose s1", rclose(s1));
	said("rrecv c1 end", rrecv(c1, buf, 4, 0));
	rclose(s2);
	rclose(s3);
	rclose(c1);
	rclose(c2);
	rclose(c3);

	said("rclose listener", rclose(l));
	printf("rs_backlog ok\n");
	return 0;
}
