/* Socket reads and writes through recv(2) and send(2) instead of read(2) and write(2).

Loaded into the gateway's process with LD_PRELOAD (gateway/sockio.py re-executes `python -m
gateway` with it); never imported for its socket work. It defines `read`, `write` and `close`,
which take the place of libc's for every library in the process, uvloop's libuv included.

Why: at a real decode pace the gateway makes two socket syscalls per streamed event (the upstream's
read, the client's write), ~130 per request, and libuv makes them with read and write. On a socket
those go through the VFS layer (vfs_read/vfs_write: file position lock, permission and fsnotify
hooks) before reaching the socket; recv and send go to the socket directly. perf put vfs_read and
vfs_write at ~4% of the gateway's samples, where nginx and vllm-router (recvfrom, writev) have
none; the paired benchmark measured 2-3% less CPU per request with this file (docs/benchmarks.md).

Semantics: with flags 0, recv on a stream socket is read; send is write, but for SIGPIPE, which
MSG_NOSIGNAL suppresses (Python ignores SIGPIPE anyway: EPIPE either way). Anything that is not a
socket answers recv/send with ENOTSOCK, doing nothing, and then gets libc's own call. Which fds are
sockets is cached per fd number and forgotten on close (libuv closes its own fds with a raw
syscall, which this file does not see). The cache is only a hint: a wrong guess costs one failed
syscall or one plain read/write, never a wrong answer, so races between threads are harmless.
*/
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define KNOWN_FDS 65536
enum { UNKNOWN = 0, SOCKET = 1, OTHER = 2 };
static unsigned char kind[KNOWN_FDS];
/* Calls answered by recv/send, and by libc's own (for the tests and the start-up log). */
static atomic_ulong via_socket, via_libc;

static ssize_t (*libc_read)(int, void *, size_t);
static ssize_t (*libc_write)(int, const void *, size_t);
static int (*libc_close)(int);

/* At load, and again from a call that comes first: another library's constructor may read or
   write before this one's has run. */
__attribute__((constructor)) static void resolve(void)
{
    libc_read = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    libc_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    libc_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
}

ssize_t read(int fd, void *buf, size_t n)
{
    if (__builtin_expect(libc_read == NULL, 0)) resolve();
    if (fd >= 0 && fd < KNOWN_FDS && kind[fd] != OTHER) {
        ssize_t r = recv(fd, buf, n, 0);
        if (r >= 0 || errno != ENOTSOCK) {
            kind[fd] = SOCKET;
            atomic_fetch_add_explicit(&via_socket, 1, memory_order_relaxed);
            return r;
        }
        kind[fd] = OTHER;
    }
    atomic_fetch_add_explicit(&via_libc, 1, memory_order_relaxed);
    return libc_read(fd, buf, n);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    if (__builtin_expect(libc_write == NULL, 0)) resolve();
    if (fd >= 0 && fd < KNOWN_FDS && kind[fd] != OTHER) {
        ssize_t r = send(fd, buf, n, MSG_NOSIGNAL);
        if (r >= 0 || errno != ENOTSOCK) {
            kind[fd] = SOCKET;
            atomic_fetch_add_explicit(&via_socket, 1, memory_order_relaxed);
            return r;
        }
        kind[fd] = OTHER;
    }
    atomic_fetch_add_explicit(&via_libc, 1, memory_order_relaxed);
    return libc_write(fd, buf, n);
}

int close(int fd)
{
    if (__builtin_expect(libc_close == NULL, 0)) resolve();
    if (fd >= 0 && fd < KNOWN_FDS) kind[fd] = UNKNOWN; /* the number may next be a socket */
    return libc_close(fd);
}

/* ---- the module: only to ask whether the preload took ---------------------------------------- */

static PyObject *sockio_active(PyObject *self, PyObject *unused)
{
    /* Ours only if the process resolves `read` into this file, i.e. it was preloaded: a plain
       import (dlopen) comes after libc in the lookup order and changes nothing. (Not `== read`:
       in this file that name, too, resolves to whichever comes first.) */
    Dl_info resolved, here;
    void *fn = dlsym(RTLD_DEFAULT, "read");
    if (fn == NULL || !dladdr(fn, &resolved) || !dladdr((void *)sockio_active, &here))
        Py_RETURN_FALSE;
    return PyBool_FromLong(resolved.dli_fbase == here.dli_fbase);
}

static PyObject *sockio_counts(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(kk)", atomic_load(&via_socket), atomic_load(&via_libc));
}

static PyMethodDef sockio_methods[] = {
    {"active", sockio_active, METH_NOARGS,
     "active(): whether this process's read/write/close are this module's (it was preloaded)."},
    {"counts", sockio_counts, METH_NOARGS,
     "counts(): (calls answered by recv/send, calls passed to libc's read/write)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sockio_module = {
    PyModuleDef_HEAD_INIT, "gateway._sockio",
    "Socket reads and writes through recv/send, when preloaded (see gateway/_sockio.c).", -1,
    sockio_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sockio(void)
{
    return PyModule_Create(&sockio_module);
}
