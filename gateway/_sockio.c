/* Socket reads and writes through recv(2) and send(2) instead of read(2) and write(2).

Preloaded into the gateway's process (LD_PRELOAD: gateway/sockio.py re-executes `python -m
gateway` with it). It defines `read`, `write` and `close`, which take the place of libc's for every
library in the process, uvloop's libuv included, and `socket`, `socketpair`, `accept` and
`accept4`, only to note which fds are sockets. Plain C with no Python in it: a program the gateway
starts before it takes the shim out of the environment (a kubeconfig credential plugin) loads it
too, and must run as before. gateway/sockio.py reads `llmserve_sockio_counts` through ctypes.

Why: at a real decode pace the gateway makes two socket syscalls per streamed event (the upstream's
read, the client's write), ~130 per request, and libuv makes them with read and write. On a socket
those go through the VFS layer (vfs_read/vfs_write: file position lock, permission and fsnotify
hooks) before reaching the socket; recv and send go to the socket directly. perf put vfs_read and
vfs_write at ~4% of the gateway's samples, where nginx and vllm-router (recvfrom, writev) have
none; the paired benchmark measured 1-3% less CPU per request with this file (docs/benchmarks.md).

Semantics: with flags 0, recv on a stream socket is read; send is write, but for SIGPIPE, which
MSG_NOSIGNAL suppresses (Python ignores SIGPIPE anyway: EPIPE either way). A zero-length read goes
to libc (recv would wait for data, or eat a datagram). Anything that is not a socket answers
recv/send with ENOTSOCK, doing nothing, and then gets libc's own call with errno as it was. Which
fds are sockets is a per-fd-number hint: set when a socket is made or accepted, learnt on first
use, forgotten on close (libuv closes its own fds with a raw syscall, which this file does not see).
A wrong hint costs one failed syscall or one plain read/write, never a wrong answer, so races
between threads are harmless.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define KNOWN_FDS 65536
enum { UNKNOWN = 0, SOCKET = 1, OTHER = 2 };
static unsigned char kind[KNOWN_FDS];
/* Calls answered by recv/send, and by libc's own read/write (tests, start-up log). */
static atomic_ulong via_socket, via_libc;

static ssize_t (*libc_read)(int, void *, size_t);
static ssize_t (*libc_write)(int, const void *, size_t);
static int (*libc_close)(int);
static int (*libc_socket)(int, int, int);
static int (*libc_socketpair)(int, int, int, int[2]);
static int (*libc_accept)(int, struct sockaddr *, socklen_t *);
static int (*libc_accept4)(int, struct sockaddr *, socklen_t *, int);

/* At load, and again from a call that comes first: another library's constructor may read or
   write before this one's has run. */
__attribute__((constructor)) static void resolve(void)
{
    libc_read = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    libc_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    libc_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    libc_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    libc_socketpair = (int (*)(int, int, int, int[2]))dlsym(RTLD_NEXT, "socketpair");
    libc_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    libc_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
}

#define RESOLVED(fn) \
    do { \
        if (__builtin_expect(fn == NULL, 0)) resolve(); \
    } while (0)

static inline void mark(int fd, unsigned char k)
{
    if (fd >= 0 && fd < KNOWN_FDS) kind[fd] = k;
}

static inline int maybe_socket(int fd)
{
    return fd >= 0 && fd < KNOWN_FDS && kind[fd] != OTHER;
}

/* After recv/send on a maybe-socket: 1 if the socket answered (r, errno as it left them), else
   0 with the fd marked OTHER and errno as it was before, for libc's own call to follow. */
static inline int socket_answered(int fd, ssize_t r, int saved)
{
    if (r >= 0 || errno != ENOTSOCK) {
        kind[fd] = SOCKET;
        atomic_fetch_add_explicit(&via_socket, 1, memory_order_relaxed);
        return 1;
    }
    kind[fd] = OTHER;
    errno = saved;
    return 0;
}

ssize_t read(int fd, void *buf, size_t n)
{
    RESOLVED(libc_read);
    if (n > 0 && maybe_socket(fd)) {
        int saved = errno;
        ssize_t r = recv(fd, buf, n, 0);
        if (socket_answered(fd, r, saved)) return r;
    }
    atomic_fetch_add_explicit(&via_libc, 1, memory_order_relaxed);
    return libc_read(fd, buf, n);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    RESOLVED(libc_write);
    if (maybe_socket(fd)) {
        int saved = errno;
        ssize_t r = send(fd, buf, n, MSG_NOSIGNAL);
        if (socket_answered(fd, r, saved)) return r;
    }
    atomic_fetch_add_explicit(&via_libc, 1, memory_order_relaxed);
    return libc_write(fd, buf, n);
}

int close(int fd)
{
    RESOLVED(libc_close);
    mark(fd, UNKNOWN); /* the number may next be a socket */
    return libc_close(fd);
}

/* New sockets are marked, whatever their number was before: libuv closes fds with a raw syscall,
   so a number once marked OTHER would otherwise keep a later socket on plain read/write. */

int socket(int domain, int type, int protocol)
{
    RESOLVED(libc_socket);
    int fd = libc_socket(domain, type, protocol);
    mark(fd, SOCKET);
    return fd;
}

int socketpair(int domain, int type, int protocol, int sv[2])
{
    RESOLVED(libc_socketpair);
    int rc = libc_socketpair(domain, type, protocol, sv);
    if (rc == 0) {
        mark(sv[0], SOCKET);
        mark(sv[1], SOCKET);
    }
    return rc;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    RESOLVED(libc_accept);
    int s = libc_accept(fd, addr, len);
    mark(s, SOCKET);
    return s;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    RESOLVED(libc_accept4);
    int s = libc_accept4(fd, addr, len, flags);
    mark(s, SOCKET);
    return s;
}

/* For gateway/sockio.py (ctypes): calls answered by recv/send, and passed to libc's read/write. */
void llmserve_sockio_counts(unsigned long *by_socket, unsigned long *by_libc)
{
    *by_socket = atomic_load(&via_socket);
    *by_libc = atomic_load(&via_libc);
}
