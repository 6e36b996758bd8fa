/*
 * pause: the first process of every pod sandbox in kpr's test cluster.
 *
 * containerd starts it (the sandbox image) to create and hold a pod's
 * namespaces; the pod's containers join them. It does nothing but wait:
 * it sleeps in pause(), reaps any child that gets re-parented to it (it is
 * PID 1 when the pod shares one PID namespace), and exits cleanly on
 * SIGINT or SIGTERM. As PID 1 the kernel delivers it no signal it has no
 * handler for, which is why the stop signals get explicit handlers.
 *
 * Built static by hack/cluster-tools.sh so that the image holds this one
 * file and nothing else.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAUSE_VERSION "kpr-1"

/* Stop: _exit is async-signal-safe, and exiting from the handler leaves no
 * window between a flag check and pause() in which a signal could be lost. */
static void on_stop(int sig)
{
	(void)sig;
	_exit(0);
}

/* Reap every child that has exited; several SIGCHLDs may arrive as one. */
static void on_child(int sig)
{
	int saved_errno = errno;

	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved_errno;
}

static int handle(int sig, void (*fn)(int), int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
	if (argc == 2 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
		printf("pause %s\n", PAUSE_VERSION);
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "usage: %s [--version]\n", argv[0]);
		return 2;
	}

	if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
	    handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART)) {
		perror("pause: sigaction");
		return 1;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: not PID 1; only this process's own children are reaped\n");

	for (;;)
		pause();
}
