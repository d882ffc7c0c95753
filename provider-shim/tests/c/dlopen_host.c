/* A program that does not link libibverbs but loads, with dlopen, a library that does (as UCX
 * and Open MPI load their components, and Python its extension modules): the verbs library
 * comes in with it, its thread-local storage placed then (in the static TLS block's reserve if
 * it has room, else reached through the loader's dynamic descriptor). The library's entry
 * point runs in a thread that was started before the dlopen, whose TLS the loader sets up for
 * the library only at its first use there.
 *
 * Usage: dlopen_host LIBRARY SYMBOL, SYMBOL an `int (void)`; exits with what it returns. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

static pthread_barrier_t loaded;
static int (*entry)(void);

static void *run(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&loaded);
	return (void *)(intptr_t)(entry ? entry() : 3);
}

int main(int argc, char **argv)
{
	pthread_t thread;
	void *lib, *ret;

	if (argc != 3) {
		fprintf(stderr, "usage: %s LIBRARY SYMBOL\n", argv[0]);
		return 2;
	}
	if (dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
		fprintf(stderr, "libibverbs.so.1 is loaded before the dlopen\n");
		return 2;
	}
	pthread_barrier_init(&loaded, NULL, 2);
	if (pthread_create(&thread, NULL, run, NULL))
		return 2;
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		fprintf(stderr, "dlopen: %s\n", dlerror());
	else if (!(*(void **)&entry = dlsym(lib, argv[2])))
		fprintf(stderr, "dlsym: %s\n", dlerror());
	pthread_barrier_wait(&loaded);
	pthread_join(thread, &ret);
	printf("dlopen_host: %s returned %d\n", argv[2], (int)(intptr_t)ret);
	return (int)(intptr_t)ret;
}
