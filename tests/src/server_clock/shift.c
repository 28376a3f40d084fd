/* A server's wall clock, shifted by the whole seconds written in the file named by
 * LOCK_TESTS_CLOCK_FILE ("+3600", "-3600", "0"), read at every call: preloaded into a server
 * (LD_PRELOAD), it moves CLOCK_REALTIME, gettimeofday and time, and nothing else (monotonic
 * clocks, sleeps and timers stay true: an NTP step, a VM restored).
 *
 * libfaketime cannot run Debian's redis-server (jemalloc reads the clock while libfaketime
 * initialises, and it gives up); this shim allocates nothing and resolves no symbol: it reads
 * the clock and the file with raw system calls. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long offset_seconds(void) {
    const char *path = getenv("LOCK_TESTS_CLOCK_FILE");
    if (path == NULL) return 0;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[32];
    long n = syscall(SYS_read, fd, text, sizeof text - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    text[n] = 0;
    long sign = 1, value = 0;
    const char *c = text;
    if (*c == '+') c++;
    else if (*c == '-') { sign = -1; c++; }
    for (; *c >= '0' && *c <= '9'; c++) value = value * 10 + (*c - '0');
    return sign * value;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long result = syscall(SYS_clock_gettime, clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset_seconds();
    return (int)result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
