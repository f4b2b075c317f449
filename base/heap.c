#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include "base/heap.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Fault injection state: calls left before failing, failures left. */
static atomic_int fault_delay;
static atomic_int fault_repeat;

void ida_heap_fault_set(int delay, int repeat)
{
    atomic_store(&fault_delay, delay);
    atomic_store(&fault_repeat, repeat);
}

/* True when this allocation must fail. */
static int should_fail(void)
{
    if (atomic_load_explicit(&fault_repeat, memory_order_relaxed) == 0) {
        return 0;
    }
    if (atomic_fetch_sub(&fault_delay, 1) > 0) {
        return 0;
    }
    atomic_store(&fault_delay, 0);
    int r = atomic_load(&fault_repeat);
    if (r > 0) {
        atomic_fetch_sub(&fault_repeat, 1);
    }
    return r != 0;
}

void *ida_malloc(size_t size)
{
    return should_fail() ? NULL : malloc(size);
}

void *ida_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count, size);
}

void *ida_malloc_aligned(size_t align, size_t size)
{
    void *p = NULL;
    return should_fail() || posix_memalign(&p, align, size) != 0 ? NULL : p;
}

void *ida_realloc(void *ptr, size_t size)
{
    return should_fail() ? NULL : realloc(ptr, size);
}

void ida_free(void *ptr)
{
    free(ptr);
}

/* madvise(@advice) on the whole @unit-aligned blocks inside the @size
 * bytes at @p (@unit a power of two); nothing when there are none. */
static void advise_inside(void *p, size_t size, uintptr_t unit, int advice)
{
    uintptr_t lo = ((uintptr_t)p + unit - 1) & ~(unit - 1);
    uintptr_t hi = ((uintptr_t)p + size) & ~(unit - 1);
    if (p != NULL && hi > lo) {
        (void)madvise((void *)lo, hi - lo, advice);
    }
}

void ida_heap_hint_huge(void *p, size_t size)
{
#ifdef MADV_HUGEPAGE
    advise_inside(p, size, IDA_HUGE_PAGE, MADV_HUGEPAGE);
#else
    (void)p;
    (void)size;
#endif
}

void ida_heap_release_zeroed(void *p, size_t size)
{
    advise_inside(p, size, (uintptr_t)sysconf(_SC_PAGESIZE), MADV_DONTNEED);
}

void *ida_malloc_huge(size_t size)
{
    void *p = ida_malloc(size);
    ida_heap_hint_huge(p, size); /* nothing for NULL or a small block */
    return p;
}

char *ida_strndup(const char *src, size_t len)
{
    char *s = ida_malloc(len + 1);
    if (s == NULL) {
        return NULL;
    }
    memcpy(s, src, len);
    s[len] = '\0';
    return s;
}

static void write_all(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) {
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

_Noreturn void ida_oom(const char *what)
{
    write_all("fatal: out of memory (");
    write_all(what);
    write_all("); exiting: acknowledged state is on disk, restart the node\n");
    _exit(IDA_OOM_EXIT);
}
