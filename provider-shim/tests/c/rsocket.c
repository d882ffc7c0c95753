/* rsockets on the emulator, in one process: a non-blocking connect finished by rpoll, data
 * through the read/write/vector calls, rselect, names, options, an I/O mapping the peer writes,
 * the end of the stream, and bad input answered with -1 and the socket calls' errno. Prints
 * "rsocket ok". */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <unistd.h>

#include "common.h"

#define FAILS_WITH(call, err)                                                                 \
	do {                                                                                  \
		errno = 0;                                                                    \
		long r_ = (long)(call);                                                       \
		if (r_ != -1 || errno != (err)) {                                             \
			fprintf(stderr, "%s:%d: %s gave %ld, errno %d (%s), want errno %d\n", \
				__FILE__, __LINE__, #call, r_, errno, strerror(errno), (err)); \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

static struct sockaddr_in addr(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, "127.0.0.1", &a.sin_addr) == 1);
	return a;
}

static void wait_for(int s, short events)
{
	struct pollfd p = { .fd = s, .events = events };
	CHECK(rpoll(&p, 1, 5000) == 1);
	CHECK(p.revents & events);
}

int main(void)
{
	struct sockaddr_in at = addr(7790);
	int one = 1, v;
	socklen_t len;

	/* Bad input first: nothing here is a socket yet. */
	FAILS_WITH(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), EOPNOTSUPP);
	FAILS_WITH(rsocket(AF_UNIX, SOCK_STREAM, 0), EOPNOTSUPP);
	FAILS_WITH(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP), EOPNOTSUPP);
	FAILS_WITH(rclose(-1), EBADF);
	FAILS_WITH(rsend(12345, "x", 1, 0), EBADF);
	FAILS_WITH(rpoll(NULL, 1, 0), EFAULT);

	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	FAILS_WITH(rbind(l, (struct sockaddr *)&at, sizeof at - 4), EINVAL);
	struct sockaddr un = { .sa_family = AF_UNIX };
	FAILS_WITH(rbind(l, &un, sizeof un), EAFNOSUPPORT);
	{
		/* A socket neither bound nor connected, as librdmacm's (measured on rxe): no
		 * address of any family, no poll events, nothing to shut down, EBADF for an
		 * accept (TCP's are ENOTCONN, POLLOUT | POLLHUP, ENOTCONN and EINVAL). */
		struct sockaddr_in6 none6;
		struct pollfd p = { .fd = l, .events = POLLIN | POLLOUT };
		memset(&none6, 0xff, sizeof none6);
		len = sizeof none6;
		CHECK(rgetpeername(l, (struct sockaddr *)&none6, &len) == 0);
		CHECK(len == sizeof none6 && none6.sin6_family == 0 && none6.sin6_port == 0);
		CHECK(rpoll(&p, 1, 0) == 0 && p.revents == 0);
		CHECK(rshutdown(l, SHUT_RDWR) == 0);
		FAILS_WITH(raccept(l, NULL, NULL), EBADF); /* not listening */
	}
	CHECK(rbind(l, (struct sockaddr *)&at, sizeof at) == 0);
	/* Flags the accepted socket does not take over (sizes it does), as librdmacm's. */
	CHECK(rsetsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
	CHECK(rlisten(l, 4) == 0);
	{
		/* A listener has no peer: the unspecified address (librdmacm, measured on rxe). */
		struct sockaddr_in none = { .sin_family = 99 };
		len = sizeof none;
		CHECK(rgetpeername(l, (struct sockaddr *)&none, &len) == 0);
		CHECK(none.sin_addr.s_addr == 0 && none.sin_port == 0);
	}

	/* Nobody on 7791: refused. */
	int lone = rsocket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in nobody = addr(7791);
	FAILS_WITH(rconnect(lone, (struct sockaddr *)&nobody, sizeof nobody), ECONNREFUSED);
	CHECK(rclose(lone) == 0);
	/* Refused without waiting: SO_ERROR says so once; the socket then reads as ended,
	 * writes as reset, shuts down quietly and polls readable, writable and in error, as
	 * librdmacm's (measured on rxe). */
	{
		int r = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		char b[4];
		FAILS_WITH(rconnect(r, (struct sockaddr *)&nobody, sizeof nobody), EINPROGRESS);
		struct pollfd p = { .fd = r, .events = POLLIN | POLLOUT };
		CHECK(rpoll(&p, 1, 5000) == 1 && p.revents == (POLLIN | POLLOUT | POLLERR));
		len = sizeof v;
		CHECK(rgetsockopt(r, SOL_SOCKET, SO_ERROR, &v, &len) == 0 && v == ECONNREFUSED);
		CHECK(rgetsockopt(r, SOL_SOCKET, SO_ERROR, &v, &len) == 0 && v == 0);
		CHECK(rrecv(r, b, sizeof b, 0) == 0);
		FAILS_WITH(rsend(r, "x", 1, 0), ECONNRESET);
		CHECK(rshutdown(r, SHUT_RDWR) == 0);
		FAILS_WITH(rconnect(r, (struct sockaddr *)&nobody, sizeof nobody), ENOTCONN);
		CHECK(rclose(r) == 0);
	}
	/* librdmacm's defaults: lingering on (no time), no keepalive time, 1 for the keepalive
	 * counts it does not keep; queues at most 65534. */
	{
		struct linger lg;
		int r = rsocket(AF_INET, SOCK_STREAM, 0), big = 1 << 20;
		len = sizeof lg;
		CHECK(rgetsockopt(r, SOL_SOCKET, SO_LINGER, &lg, &len) == 0);
		CHECK(lg.l_onoff == 1 && lg.l_linger == 0);
		len = sizeof v;
		CHECK(rgetsockopt(r, IPPROTO_TCP, TCP_KEEPIDLE, &v, &len) == 0 && v == 0);
		CHECK(rgetsockopt(r, IPPROTO_TCP, TCP_KEEPCNT, &v, &len) == 0 && v == 1);
		CHECK(rsetsockopt(r, SOL_RDMA, RDMA_SQSIZE, &big, sizeof big) == 0);
		CHECK(rgetsockopt(r, SOL_RDMA, RDMA_SQSIZE, &v, &len) == 0 && v == 65534);
		CHECK(rclose(r) == 0);
	}

	/* Datagrams in one thread: nothing to read before the socket has an address (EINVAL, as
	 * librdmacm's); the first datagram's lookup answered though its receiver is in no call
	 * (it was dropped after a wait); SO_TYPE the socket's own type. */
	{
		int d = rsocket(AF_INET, SOCK_DGRAM, 0), e = rsocket(AF_INET, SOCK_DGRAM, 0);
		struct sockaddr_in to = addr(7792);
		char b[16] = { 0 };
		len = sizeof v;
		CHECK(rgetsockopt(d, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_DGRAM);
		FAILS_WITH(rrecv(d, b, sizeof b, MSG_DONTWAIT), EINVAL);
		CHECK(rbind(d, (struct sockaddr *)&to, sizeof to) == 0);
		FAILS_WITH(rrecv(d, b, sizeof b, MSG_DONTWAIT), EAGAIN);
		CHECK(rsendto(e, "first", 5, 0, (struct sockaddr *)&to, sizeof to) == 5);
		wait_for(d, POLLIN);
		CHECK(rrecv(d, b, sizeof b, 0) == 5 && memcmp(b, "first", 5) == 0);
		CHECK(rclose(e) == 0 && rclose(d) == 0);
	}

	int c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(c >= 0);
	len = sizeof v;
	CHECK(rgetsockopt(c, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_STREAM);
	CHECK(rfcntl(c, F_GETFL) & O_NONBLOCK);
	FAILS_WITH(rfcntl(c, F_DUPFD, 0), ENOTSUP);
	FAILS_WITH(riomap(c, &v, sizeof v, PROT_WRITE, 0, 0), EINVAL); /* not connected */
	/* The client keeps a table for one of the server's mappings. */
	CHECK(rsetsockopt(c, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one) == 0);
	{
		/* A listener polls writable, as librdmacm's (measured on rxe), readable only once
		 * a connection waits. */
		struct pollfd p = { .fd = l, .events = POLLIN | POLLOUT };
		CHECK(rpoll(&p, 1, 0) == 1 && p.revents == POLLOUT);
	}
	FAILS_WITH(rconnect(c, (struct sockaddr *)&at, sizeof at), EINPROGRESS);
	wait_for(l, POLLIN);
	{
		struct pollfd p = { .fd = l, .events = POLLIN | POLLOUT };
		CHECK(rpoll(&p, 1, 0) == 1 && p.revents == (POLLIN | POLLOUT));
	}
	struct sockaddr_in peer;
	len = sizeof peer;
	/* Accepted by the listen service already, the socket is numbered as raccept takes it:
	 * above a descriptor opened just before, as librspreload's accept opens one (its select
	 * of rdma-core 44 takes a socket numbered below it for another descriptor). */
	int before = open("/dev/null", O_RDONLY);
	int s = raccept(l, (struct sockaddr *)&peer, &len);
	CHECK(s >= 0 && len == sizeof peer && peer.sin_family == AF_INET);
	CHECK(before >= 0 && s > before && close(before) == 0);
	wait_for(c, POLLOUT);
	len = sizeof v;
	CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &v, &len) == 0 && v == 0);
	/* Connected already: 0. */
	CHECK(rconnect(c, (struct sockaddr *)&at, sizeof at) == 0);
	CHECK(rfcntl(c, F_SETFL, 0) == 0 && !(rfcntl(c, F_GETFL) & O_NONBLOCK));
	len = sizeof v;
	CHECK(rgetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v == 0);
	/* The segment size is the path's MTU (a connection has a path); setting it is taken and
	 * let be; SO_LINGER reads the first word whatever the length, as librdmacm. */
	len = sizeof v;
	CHECK(rgetsockopt(c, IPPROTO_TCP, TCP_MAXSEG, &v, &len) == 0 && v >= 256 && v <= 4096);
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_MAXSEG, &one, sizeof one) == 0);
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_LINGER, &one, sizeof one) == 0);
	/* The connection's sizes are fixed; its path reads as one struct ibv_path_data. */
	FAILS_WITH(rsetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &one, sizeof one), EINVAL);
	{
		unsigned char route[256];
		len = 4;
		FAILS_WITH(rgetsockopt(c, SOL_RDMA, RDMA_ROUTE, route, &len), EINVAL);
		len = sizeof route;
		CHECK(rgetsockopt(c, SOL_RDMA, RDMA_ROUTE, route, &len) == 0 && len == 72);
	}
	{
		struct linger lg;
		len = sizeof lg;
		CHECK(rgetsockopt(c, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff == 1);
		lg.l_onoff = 0;
		CHECK(rsetsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
	}

	/* Names. */
	struct sockaddr_in name;
	len = sizeof name;
	CHECK(rgetpeername(c, (struct sockaddr *)&name, &len) == 0);
	CHECK(name.sin_port == htons(7790) && len == sizeof name);
	len = sizeof name;
	CHECK(rgetsockname(s, (struct sockaddr *)&name, &len) == 0 && name.sin_port == htons(7790));
	len = sizeof name;
	CHECK(rgetpeername(s, (struct sockaddr *)&name, &len) == 0 && name.sin_port == peer.sin_port);

	/* Options. */
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
	len = sizeof v;
	CHECK(rgetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v == 1);
	FAILS_WITH(rsetsockopt(c, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one), ENOTSUP);
	FAILS_WITH(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, 2), EINVAL);
	FAILS_WITH(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, NULL, sizeof one), EFAULT);

	/* Data, plain and vectored; rselect sees it coming. */
	CHECK(rsend(c, "hello", 5, 0) == 5);
	fd_set rd;
	FD_ZERO(&rd);
	FD_SET(s, &rd);
	struct timeval tv = { .tv_sec = 5 };
	CHECK(rselect(s + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(s, &rd));
	char buf[64] = { 0 };
	CHECK(rrecv(s, buf, sizeof buf, 0) == 5 && memcmp(buf, "hello", 5) == 0);
	FAILS_WITH(rrecv(s, NULL, 8, 0), EFAULT);
	FAILS_WITH(rrecv(s, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
	struct iovec out[2] = { { "ab", 2 }, { "cdef", 4 } };
	CHECK(rwritev(c, out, 2) == 6);
	char x[3], y[3];
	struct iovec in[2] = { { x, 3 }, { y, 3 } };
	CHECK(rreadv(s, in, 2) == 6 && memcmp(x, "abc", 3) == 0 && memcmp(y, "def", 3) == 0);
	FAILS_WITH(rsendto(c, "x", 1, 0, (struct sockaddr *)&at, sizeof at), EISCONN);
	FAILS_WITH(rshutdown(c, 7), EINVAL);

	/* The server maps a buffer; the client writes it, with no call on the server's side. */
	static char mapped[8192];
	CHECK(riomap(s, mapped, sizeof mapped, PROT_WRITE, 0, 0) == 0);
	FAILS_WITH(riomap(c, buf, sizeof buf, PROT_WRITE, 0, 0), ENOMEM); /* server keeps none */
	CHECK(rsend(s, "m", 1, 0) == 1); /* after the mapping, in order */
	CHECK(rrecv(c, buf, 1, 0) == 1 && buf[0] == 'm');
	static char pattern[8192];
	for (size_t i = 0; i < sizeof pattern; i++)
		pattern[i] = (char)(i * 7 + 1);
	CHECK(riowrite(c, pattern, sizeof pattern, 0, 0) == sizeof pattern);
	FAILS_WITH(riowrite(c, pattern, 1, sizeof mapped, 0), EINVAL); /* past the mapping */
	double t0 = now_s();
	for (long i = 0; waiting(t0, i) && ((volatile char *)mapped)[sizeof mapped - 1] !=
					     pattern[sizeof pattern - 1]; i++)
		;
	CHECK(memcmp(mapped, pattern, sizeof mapped) == 0);
	CHECK(riounmap(s, mapped, sizeof mapped) == 0);
	FAILS_WITH(riounmap(s, mapped, sizeof mapped), EINVAL);

	/* The end of the stream, then the other direction still works. */
	CHECK(rshutdown(c, SHUT_WR) == 0);
	FAILS_WITH(rsend(c, "x", 1, 0), EPIPE);
	CHECK(rrecv(s, buf, sizeof buf, 0) == 0);
	CHECK(rsend(s, "back", 4, 0) == 4);
	CHECK(rrecv(c, buf, 4, MSG_WAITALL) == 4 && memcmp(buf, "back", 4) == 0);
	CHECK(rclose(s) == 0);
	CHECK(rrecv(c, buf, sizeof buf, 0) == 0);
	FAILS_WITH(rsend(c, "x", 1, 0), EPIPE);
	CHECK(rclose(c) == 0);
	FAILS_WITH(rclose(c), EBADF);
	CHECK(rclose(l) == 0);
	printf("rsocket ok\n");
	return 0;
}
