/* The machinery the C ABI's fuzzers share: programs of weighted random calls drawn from a
 * seed, the objects a running program holds (live, destroyed, of another kind, junk: the
 * hostile handles), each program run in a forked child so that a crash, a hang (10 s) or a
 * Rust panic is caught, and a failing program minimised (calls dropped while it still fails
 * the same way) and printed call by call. A verb given a hostile handle that succeeds fails
 * the program too (`accepted`).
 *
 * A fuzzer defines, before including this file: FUZZ_ENV (the prefix of its variables:
 * FUZZ_ENV_FIRST=N starts at case N, FUZZ_ENV_SELF_TEST=1 crashes every program with a call
 * that self_test_crashes names, to test the fuzzer itself), `enum op` ending in OP_COUNT with
 * `weight` and `op_name`, and `enum kind` ending in K_COUNT; and after it: shape (the
 * program's start, after the random draw), setup and teardown (in the child, around the
 * calls; teardown exits 4 if closing what is left fails), run_call and self_test_crashes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_CALLS 64
#define SLOTS 6
#define BUF_LEN (64 * 1024)

struct call {
	enum op op;
	uint64_t r[8]; /* the call's random words: which handles, which values */
	int sane;      /* live handles and sensible values only, so that programs get deep */
};

struct program {
	int n;
	struct call calls[MAX_CALLS];
	int profile_full; /* the full profile, else rxe */
};

static uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void shape(struct program *p, uint64_t seed);
static void setup(void);
static void teardown(void);
static void run_call(struct call *c);
static int self_test_crashes(const struct call *c);

static void generate(struct program *p, uint64_t seed)
{
	uint64_t s = seed, total = 0;
	for (int i = 0; i < OP_COUNT; i++)
		total += weight[i];
	p->n = 8 + (int)(mix(&s) % (MAX_CALLS - 8));
	p->profile_full = mix(&s) & 1;
	for (int i = 0; i < p->n; i++) {
		uint64_t w = mix(&s) % total;
		int op = 0;
		while (w >= (uint64_t)weight[op])
			w -= weight[op++];
		p->calls[i].op = op;
		for (int j = 0; j < 8; j++)
			p->calls[i].r[j] = mix(&s);
		p->calls[i].sane = mix(&s) % 3 == 0;
	}
	shape(p, seed);
}

struct obj {
	void *p;
	int live;
	int ctx; /* the slot of the object it belongs to (the verbs fuzzer: its context) */
	int ex;  /* the fuzzer's own mark (the verbs fuzzer: a QP the ibv_wr_* functions work on) */
};

static struct obj pool[K_COUNT][SLOTS];
static char *buf;            /* registrable memory, BUF_LEN bytes */
static char *readonly_page;  /* one page mapped PROT_READ */
static char *unmapped_page;  /* an address with nothing mapped */
static char junk[1024];      /* a "handle" that is no object */
static int verbose;
static const char *current;  /* the call being made, for messages */
static int sane;             /* the call's `sane` */

#define LOG(...)                                                     \
	do {                                                         \
		if (verbose) {                                       \
			fprintf(stderr, __VA_ARGS__);                \
			fflush(stderr);                              \
		}                                                    \
	} while (0)

/* A verb that was given a hostile handle succeeded. */
static void accepted(const char *what)
{
	fprintf(stderr, "ACCEPTED: %s succeeded with %s\n", current, what);
	fflush(stderr);
	_exit(3);
}

static int add(enum kind k, void *p, int ctx)
{
	if (!p)
		return -1;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < SLOTS; i++) {
			struct obj *o = &pool[k][i];
			if ((pass == 0 && !o->p) || (pass == 1 && !o->live)) {
				*o = (struct obj){ p, 1, ctx, 0 };
				return i;
			}
		}
	return -1; /* full: the object stays, unused */
}

static int is_live_anywhere(void *p)
{
	for (int k = 0; k < K_COUNT; k++)
		for (int i = 0; i < SLOTS; i++)
			if (pool[k][i].live && pool[k][i].p == p)
				return 1;
	return 0;
}

/* A live object of kind k (chosen by r), or -1. */
static int live_slot(enum kind k, uint64_t r)
{
	int n = 0, slots[SLOTS];
	for (int i = 0; i < SLOTS; i++)
		if (pool[k][i].live)
			slots[n++] = i;
	return n ? slots[r % n] : -1;
}

static void *live(enum kind k, uint64_t r)
{
	int i = live_slot(k, r);
	return i < 0 ? NULL : pool[k][i].p;
}

/* A handle of kind k for an exported verb: usually live, else NULL, destroyed, of another
 * kind, or junk. *bad says whether it is hostile (an object of kind k it is not). */
static void *handle(enum kind k, uint64_t r, int *bad, const char **what)
{
	void *p = NULL;
	*bad = 1;
	switch (sane ? 15 : r % 24) {
	case 0:
		*what = "NULL";
		return NULL;
	case 1:
		for (int i = 0; i < SLOTS; i++) {
			struct obj *o = &pool[k][(i + (r >> 8)) % SLOTS];
			/* A freed struct's address may hold a new object already: not hostile. */
			if (o->p && !o->live && !is_live_anywhere(o->p)) {
				*what = "a destroyed handle";
				return o->p;
			}
		}
		break;
	case 2:
		p = live((k + 1 + (r >> 8) % (K_COUNT - 1)) % K_COUNT, r >> 16);
		if (p) {
			*what = "a handle of another kind";
			return p;
		}
		break;
	case 3:
		*what = "a pointer to junk";
		return junk + 64 * ((r >> 8) % 8);
	}
	p = live(k, r >> 4);
	*bad = p == NULL;
	*what = p ? "a live handle" : "NULL";
	return p;
}

/* A live handle of kind k or NULL (for NULL-able arguments), never hostile otherwise. */
__attribute__((unused)) static void *optional(enum kind k, uint64_t r)
{
	return r % 3 == 0 ? NULL : live(k, r >> 2);
}

__attribute__((unused)) static int ctx_of(enum kind k, void *p)
{
	for (int i = 0; i < SLOTS; i++)
		if (pool[k][i].live && pool[k][i].p == p)
			return pool[k][i].ctx;
	return -1;
}

static void kill_obj(enum kind k, void *p)
{
	for (int i = 0; i < SLOTS; i++)
		if (pool[k][i].live && pool[k][i].p == p)
			pool[k][i].live = 0;
}

/* ---- values ---- */

static uint64_t pick64(uint64_t r, const uint64_t *v, int n)
{
	return v[r % n];
}
#define PICK(r, ...)                                                                     \
	pick64((r), (const uint64_t[]){ __VA_ARGS__ },                                   \
	       sizeof((const uint64_t[]){ __VA_ARGS__ }) / sizeof(uint64_t))

static int counts(uint64_t r)
{
	if (sane)
		return (int)PICK(r, 4, 16, 64);
	return (int)PICK(r, 0, 1, 2, 4, 16, 64, 1000, 65536, 0x7fffffff, (uint64_t)-1);
}

__attribute__((unused)) static char *address(uint64_t r)
{
	switch (sane ? 7 : r % 8) {
	case 0:
		return NULL;
	case 1:
		return readonly_page;
	case 2:
		return unmapped_page;
	default:
		return buf + (r >> 8) % (BUF_LEN / 2);
	}
}

__attribute__((unused)) static size_t length(uint64_t r)
{
	if (sane)
		return PICK(r, 64, 4096);
	return PICK(r, 0, 1, 8, 64, 4096, BUF_LEN / 2, 1ull << 31, (uint64_t)-1);
}

/* ---- running and minimising ---- */

enum outcome { PASSED, CRASHED, HUNG, PANICKED, ACCEPTED_BAD, FAILED };
static const char *const outcome_name[] = { "passed", "crashed", "hung", "panicked",
					    "accepted a hostile handle", "failed" };

static void child(const struct program *p, const uint8_t *skip)
{
	setenv("RDMA_EMU_PROFILE", p->profile_full ? "full" : "rxe", 1);
	alarm(10);
	buf = aligned_alloc(4096, BUF_LEN);
	memset(buf, 0, BUF_LEN);
	readonly_page = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unmapped_page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(unmapped_page, 4096);
	memset(junk, 0xa5, sizeof junk);
	setup();
	for (int i = 0; i < p->n; i++)
		if (!skip[i])
			run_call((struct call *)&p->calls[i]);
	if (getenv(FUZZ_ENV "_SELF_TEST"))
		for (int i = 0; i < p->n; i++)
			if (!skip[i] && self_test_crashes(&p->calls[i]))
				raise(SIGSEGV);
	teardown();
	_exit(0);
}

/* Runs the program without the calls in skip; its outcome, and its output in out. */
static enum outcome run(const struct program *p, const uint8_t *skip, char *out, size_t cap)
{
	int fds[2];
	if (pipe(fds))
		abort();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		abort();
	if (pid == 0) {
		close(fds[0]);
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		child(p, skip);
	}
	close(fds[1]);
	size_t len = 0;
	for (;;) {
		char tmp[4096];
		ssize_t n = read(fds[0], tmp, sizeof tmp);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		size_t take = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
		memcpy(out + len, tmp, take);
		len += take;
	}
	out[len] = 0;
	close(fds[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status))
		return WTERMSIG(status) == SIGALRM ? HUNG : CRASHED;
	if (strstr(out, "panicked"))
		return PANICKED;
	if (WEXITSTATUS(status) == 3)
		return ACCEPTED_BAD;
	return WEXITSTATUS(status) ? FAILED : PASSED;
}

static char output[1 << 20];

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s SEED CASES [-v]\n", argv[0]);
		return 2;
	}
	uint64_t seed = strtoull(argv[1], NULL, 0);
	long cases = strtol(argv[2], NULL, 0);
	int show_all = argc > 3 && strcmp(argv[3], "-v") == 0;
	long failures = 0, calls = 0;
	static struct program p;
	uint8_t skip[MAX_CALLS];

	const char *first = getenv(FUZZ_ENV "_FIRST");
	for (long i = first ? strtol(first, NULL, 0) : 0; i < cases; i++) {
		uint64_t s = seed ^ (0x5851f42d4c957f2dull * (uint64_t)(i + 1));
		generate(&p, s);
		calls += p.n;
		memset(skip, 0, sizeof skip);
		verbose = show_all;
		enum outcome o = run(&p, skip, output, sizeof output);
		if (show_all)
			printf("case %ld (%s): %s\n%s", i, p.profile_full ? "full" : "rxe",
			       outcome_name[o], output);
		if (o == PASSED)
			continue;
		failures++;
		/* Minimise: drop each call in turn while the program still fails the same way. */
		verbose = 0;
		for (int pass = 0, changed = 1; changed && pass < 3; pass++) {
			changed = 0;
			for (int j = 0; j < p.n; j++) {
				if (skip[j])
					continue;
				skip[j] = 1;
				if (run(&p, skip, output, sizeof output) == o)
					changed = 1;
				else
					skip[j] = 0;
			}
		}
		verbose = 1;
		enum outcome again = run(&p, skip, output, sizeof output);
		int left = 0;
		for (int j = 0; j < p.n; j++)
			left += !skip[j];
		printf("FAILED case %ld (seed %#llx, profile %s): %s; minimised to %d of %d calls "
		       "(%s when rerun):\n%s\n",
		       i, (unsigned long long)seed, p.profile_full ? "full" : "rxe",
		       outcome_name[o], left, p.n, outcome_name[again], output);
	}
	printf("%ld programs, %ld calls, %ld failed\n", cases, calls, failures);
	return failures ? 1 : 0;
}

